//! Shared by the fuzz targets: a tiny, valid x86-64 ELF executable built in memory.

/// A 64-bit little-endian `ET_EXEC` x86-64 ELF with one `PT_LOAD` (R+X) segment at
/// `0x400000` holding the whole file (headers plus `code`), entry at the code.
pub fn tiny_elf(code: &[u8]) -> Vec<u8> {
    const EHDR: usize = 64;
    const PHDR: usize = 56;
    let vaddr = 0x400000u64;
    let entry = vaddr + (EHDR + PHDR) as u64;
    let total = (EHDR + PHDR + code.len()) as u64;
    let mut f = Vec::with_capacity(total as usize);
    f.extend_from_slice(b"\x7fELF\x02\x01\x01\x00");
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&2u16.to_le_bytes()); // e_type ET_EXEC
    f.extend_from_slice(&62u16.to_le_bytes()); // e_machine x86-64
    f.extend_from_slice(&1u32.to_le_bytes()); // e_version
    f.extend_from_slice(&entry.to_le_bytes());
    f.extend_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
    f.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    f.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    f.extend_from_slice(&(EHDR as u16).to_le_bytes());
    f.extend_from_slice(&(PHDR as u16).to_le_bytes());
    f.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    f.extend_from_slice(&64u16.to_le_bytes()); // e_shentsize
    f.extend_from_slice(&0u16.to_le_bytes()); // e_shnum
    f.extend_from_slice(&0u16.to_le_bytes()); // e_shstrndx
    f.extend_from_slice(&1u32.to_le_bytes()); // p_type PT_LOAD
    f.extend_from_slice(&5u32.to_le_bytes()); // p_flags R+X
    f.extend_from_slice(&0u64.to_le_bytes()); // p_offset
    f.extend_from_slice(&vaddr.to_le_bytes());
    f.extend_from_slice(&vaddr.to_le_bytes());
    f.extend_from_slice(&total.to_le_bytes());
    f.extend_from_slice(&total.to_le_bytes());
    f.extend_from_slice(&0x1000u64.to_le_bytes());
    f.extend_from_slice(code);
    f
}
