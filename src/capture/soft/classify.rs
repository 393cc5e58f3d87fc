//! Decoding and classifying the instructions the recorder steps over, with a per-address cache
//! (code is read from the live process once per address, not once per step).

use std::collections::HashMap;

use iced_x86::{Decoder, DecoderOptions, Instruction};

pub use crate::flow::InsnClass;

use super::encoder::Cofi;
use super::target::StepTarget;
use crate::target::TargetError;

/// The longest x86 instruction.
pub const MAX_INSN_LEN: usize = 15;

/// The change-of-flow category of one execution of an instruction of class `class` that went on
/// at `next_ip` (`nlip` is the address after it). The classes are the flow decoder's, so the
/// encoder and the decoder agree on which instructions report what. Instructions that only
/// fault in user mode (SYSRET, VMLAUNCH, ...) never reach the encoder: the fault stops the step
/// before it counts as executed.
pub fn cofi(class: InsnClass, nlip: u64, next_ip: u64) -> Cofi {
    match class {
        InsnClass::Other | InsnClass::Ptwrite | InsnClass::Special => Cofi::None,
        InsnClass::CondBranch => Cofi::Conditional {
            taken: next_ip != nlip,
        },
        InsnClass::DirectJump => Cofi::DirectJump,
        InsnClass::DirectCall => Cofi::DirectCall,
        InsnClass::IndirectJump => Cofi::IndirectJump,
        InsnClass::IndirectCall => Cofi::IndirectCall,
        InsnClass::Return => Cofi::Return,
        InsnClass::FarCall | InsnClass::FarJump | InsnClass::FarReturn => Cofi::FarTransfer,
        InsnClass::SysCall => Cofi::KernelEntry,
        InsnClass::SoftInt => Cofi::SoftwareInterrupt,
    }
}

/// A decoded instruction.
#[derive(Debug, Clone, Copy)]
pub struct CachedInsn {
    /// The instruction (with its IP set).
    pub insn: Instruction,
    /// Its class.
    pub class: InsnClass,
    /// A REP/REPNE-prefixed string instruction: a single step may run only one iteration and
    /// leave RIP unchanged.
    pub rep_string: bool,
}

impl CachedInsn {
    /// Length in bytes.
    #[allow(clippy::len_without_is_empty)] // an instruction is never empty
    pub fn len(&self) -> u8 {
        self.insn.len() as u8
    }

    /// Address of the next instruction.
    pub fn nlip(&self) -> u64 {
        self.insn.next_ip()
    }
}

/// Why an instruction could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeInsnError {
    /// The code could not be read.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The bytes at `ip` are not a valid instruction (the CPU will raise #UD there).
    #[error("invalid instruction at {ip:#x}: {bytes:02x?}")]
    Invalid {
        /// Address.
        ip: u64,
        /// The bytes read.
        bytes: Vec<u8>,
    },
}

/// Decoded instructions by address. Entries are read from the live process on first use.
///
/// The cache assumes code does not change under it; [`InsnCache::invalidate_all`] (the recorder
/// calls it after `mmap`, `munmap`, `mprotect`, `mremap` and `execve`) and
/// [`InsnCache::invalidate_range`] (after memory writes it knows of) keep it honest.
#[derive(Debug, Default)]
pub struct InsnCache {
    map: HashMap<u64, CachedInsn>,
    misses: u64,
}

impl InsnCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The instruction at `ip`, decoding it from the target's memory on a miss.
    pub fn get<T: StepTarget + ?Sized>(
        &mut self,
        target: &mut T,
        ip: u64,
    ) -> Result<CachedInsn, DecodeInsnError> {
        if let Some(c) = self.map.get(&ip) {
            return Ok(*c);
        }
        self.misses += 1;
        let mut bytes = [0u8; MAX_INSN_LEN];
        // A short read near the end of a mapping is fine as long as the instruction fits.
        let n = target.read_memory(ip, &mut bytes)?;
        let c = decode_insn(ip, &bytes[..n]).ok_or_else(|| DecodeInsnError::Invalid {
            ip,
            bytes: bytes[..n].to_vec(),
        })?;
        self.map.insert(ip, c);
        Ok(c)
    }

    /// Forgets every decoded instruction.
    pub fn invalidate_all(&mut self) {
        self.map.clear();
    }

    /// Forgets instructions that overlap `addr..addr + len`.
    pub fn invalidate_range(&mut self, addr: u64, len: u64) {
        let end = addr.saturating_add(len);
        let lo = addr.saturating_sub(MAX_INSN_LEN as u64 - 1);
        if len > 4096 {
            self.map
                .retain(|&ip, c| ip >= end || ip + u64::from(c.len()) <= addr);
            return;
        }
        for ip in lo..end {
            if let Some(c) = self.map.get(&ip)
                && ip + u64::from(c.len()) > addr
            {
                self.map.remove(&ip);
            }
        }
    }

    /// Number of distinct instructions decoded.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of cache misses (reads of code from the target).
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// The cached instructions, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &CachedInsn> {
        self.map.values()
    }
}

/// Decodes one 64-bit instruction at `ip` from `bytes`; `None` if invalid or cut short.
pub fn decode_insn(ip: u64, bytes: &[u8]) -> Option<CachedInsn> {
    let mut dec = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let insn = dec.decode();
    if insn.is_invalid() {
        return None;
    }
    Some(CachedInsn {
        class: InsnClass::of(&insn),
        rep_string: insn.is_string_instruction()
            && (insn.has_rep_prefix() || insn.has_repne_prefix()),
        insn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(bytes: &[u8]) -> InsnClass {
        decode_insn(0x1000, bytes).expect("valid").class
    }

    #[test]
    fn classes_of_common_instructions() {
        assert_eq!(class(&[0x90]), InsnClass::Other);
        assert_eq!(class(&[0x74, 0x05]), InsnClass::CondBranch);
        assert_eq!(class(&[0xe3, 0x05]), InsnClass::CondBranch); // jrcxz
        assert_eq!(class(&[0xe2, 0x05]), InsnClass::CondBranch); // loop
        assert_eq!(class(&[0xeb, 0x05]), InsnClass::DirectJump);
        assert_eq!(class(&[0xe8, 0, 0, 0, 0]), InsnClass::DirectCall);
        assert_eq!(class(&[0xff, 0xe0]), InsnClass::IndirectJump); // jmp rax
        assert_eq!(class(&[0xff, 0xd0]), InsnClass::IndirectCall); // call rax
        assert_eq!(class(&[0xff, 0x18]), InsnClass::FarCall); // call far [rax]
        assert_eq!(class(&[0xc3]), InsnClass::Return);
        assert_eq!(class(&[0xc2, 0x08, 0x00]), InsnClass::Return);
        assert_eq!(class(&[0xcb]), InsnClass::FarReturn); // retf
        assert_eq!(class(&[0x48, 0xcf]), InsnClass::FarReturn); // iretq
        assert_eq!(class(&[0x0f, 0x05]), InsnClass::SysCall);
        assert_eq!(class(&[0xcc]), InsnClass::SoftInt);
        assert_eq!(class(&[0xcd, 0x80]), InsnClass::SoftInt);
        assert_eq!(class(&[0xf1]), InsnClass::SoftInt);
        assert_eq!(class(&[0x0f, 0x0b]), InsnClass::Other); // ud2 faults
    }

    #[test]
    fn rep_string_detection() {
        assert!(decode_insn(0, &[0xf3, 0xa4]).expect("rep movsb").rep_string);
        assert!(!decode_insn(0, &[0xa4]).expect("movsb").rep_string);
        // `rep ret` (bnd-less AMD idiom) is a RET, not a string instruction.
        let r = decode_insn(0, &[0xf3, 0xc3]).expect("rep ret");
        assert!(!r.rep_string);
        assert_eq!(r.class, InsnClass::Return);
    }

    #[test]
    fn conditional_outcome_from_next_ip() {
        let c = decode_insn(0x1000, &[0x74, 0x05]).expect("je");
        assert_eq!(
            cofi(c.class, c.nlip(), 0x1007),
            Cofi::Conditional { taken: true }
        );
        assert_eq!(
            cofi(c.class, c.nlip(), 0x1002),
            Cofi::Conditional { taken: false }
        );
    }
}
