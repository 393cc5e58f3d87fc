//! `qXfer:libraries-svr4:read`: the dynamic loader's list of loaded objects, read from the
//! target's memory (auxv `AT_PHDR` → `PT_DYNAMIC` → `DT_DEBUG` → `r_debug.r_map` →
//! `link_map` chain), in the XML format gdbserver produces.

use crate::target::Target;
use std::collections::HashSet;

const AT_PHDR: u64 = 3;
const AT_PHENT: u64 = 4;
const AT_PHNUM: u64 = 5;
const PT_DYNAMIC: u32 = 2;
const PT_PHDR: u32 = 6;
const DT_NULL: u64 = 0;
const DT_DEBUG: u64 = 21;
/// Upper bounds that keep a corrupt target from making us loop or allocate without end.
const MAX_DYN_ENTRIES: usize = 4096;
const MAX_LIBRARIES: usize = 4096;
const MAX_NAME: usize = 4096;

/// One loaded object from the `link_map` chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedObject {
    /// Address of the `link_map` entry.
    pub lm: u64,
    /// Load bias (`l_addr`).
    pub l_addr: u64,
    /// Address of the object's dynamic section (`l_ld`).
    pub l_ld: u64,
    /// File name (`l_name`).
    pub name: String,
}

/// The library list: the main program's `link_map` entry and the other objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LibraryList {
    /// The first `link_map` entry (the executable), 0 if the loader has not run yet.
    pub main_lm: u64,
    /// Every other object with a non-empty name, in chain order.
    pub objects: Vec<LoadedObject>,
}

fn read_u64(t: &dyn Target, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    (t.read_memory(addr, &mut b).ok()? == 8).then(|| u64::from_le_bytes(b))
}

fn read_u32(t: &dyn Target, addr: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    (t.read_memory(addr, &mut b).ok()? == 4).then(|| u32::from_le_bytes(b))
}

fn read_cstr(t: &dyn Target, addr: u64) -> Option<String> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 256];
    while out.len() < MAX_NAME {
        let n = t
            .read_memory(addr.wrapping_add(out.len() as u64), &mut chunk)
            .ok()?;
        if let Some(nul) = chunk[..n].iter().position(|&b| b == 0) {
            out.extend_from_slice(&chunk[..nul]);
            return Some(String::from_utf8_lossy(&out).into_owned());
        }
        out.extend_from_slice(&chunk[..n]);
    }
    None
}

/// Finds the address of the executable's `DT_DEBUG` value (the `d_ptr` the dynamic loader
/// fills with the address of `r_debug`), from the program headers named by auxv `AT_PHDR`.
/// `None` for a static executable or unreadable headers.
fn find_dt_debug_slot(t: &dyn Target, auxv: &[u8]) -> Option<u64> {
    let mut phdr = None;
    let mut phent = 56u64;
    let mut phnum = None;
    for pair in auxv.chunks_exact(16) {
        let key = u64::from_le_bytes(pair[..8].try_into().ok()?);
        let val = u64::from_le_bytes(pair[8..].try_into().ok()?);
        match key {
            AT_PHDR => phdr = Some(val),
            AT_PHENT => phent = val,
            AT_PHNUM => phnum = Some(val),
            _ => {}
        }
    }
    let (phdr, phnum) = (phdr?, phnum?.min(256));
    if phent < 56 {
        return None;
    }
    let mut bias = None;
    let mut dynamic = None;
    for i in 0..phnum {
        let at = phdr.wrapping_add(i * phent);
        let p_type = read_u32(t, at)?;
        let p_vaddr = read_u64(t, at + 16)?;
        match p_type {
            PT_PHDR => bias = Some(phdr.wrapping_sub(p_vaddr)),
            PT_DYNAMIC => dynamic = Some(p_vaddr),
            _ => {}
        }
    }
    let dynamic = dynamic?.wrapping_add(bias.unwrap_or(0));
    for i in 0..MAX_DYN_ENTRIES as u64 {
        let entry = dynamic.wrapping_add(16 * i);
        let tag = read_u64(t, entry)?;
        if tag == DT_NULL {
            return None;
        }
        if tag == DT_DEBUG {
            return Some(entry.wrapping_add(8));
        }
    }
    None
}

/// Finds `r_debug` through the executable's `DT_DEBUG` entry. `None` before the dynamic
/// loader has filled it in, or for a static executable.
fn find_r_debug(t: &dyn Target, auxv: &[u8]) -> Option<u64> {
    let r_debug = read_u64(t, find_dt_debug_slot(t, auxv)?)?;
    (r_debug != 0).then_some(r_debug)
}

/// The answer to LLDB's `qShlibInfoAddr`: the address of the executable's `DT_DEBUG` value,
/// as lldb-server reports it. LLDB's POSIX dynamic-loader plug-in reads the `r_debug` pointer
/// from there to find the rendezvous structure; the value is still 0 before the dynamic
/// loader ran, which LLDB handles by asking again at the next loader event. Without this
/// packet LLDB falls back to the `main-lm` attribute of `qXfer:libraries-svr4`, which is a
/// `link_map` address rather than this slot, and then never sees a library load.
/// `None` for a static executable (no `DT_DEBUG`).
pub fn shlib_info_addr(t: &dyn Target) -> Option<u64> {
    find_dt_debug_slot(t, &t.auxv().ok()?)
}

/// Reads the list of loaded objects. Unreadable or inconsistent memory ends the walk early
/// (the list then holds what was read so far) rather than failing: GDB treats an empty list
/// as "no shared libraries yet".
pub fn read_library_list(t: &dyn Target) -> LibraryList {
    let mut list = LibraryList::default();
    let Ok(auxv) = t.auxv() else {
        return list;
    };
    let Some(r_debug) = find_r_debug(t, &auxv) else {
        return list;
    };
    let Some(mut lm) = read_u64(t, r_debug + 8) else {
        return list;
    };
    let mut seen = HashSet::new();
    let mut first = true;
    while lm != 0 && seen.insert(lm) && seen.len() <= MAX_LIBRARIES {
        let (Some(l_addr), Some(name_ptr), Some(l_ld), Some(next)) = (
            read_u64(t, lm),
            read_u64(t, lm + 8),
            read_u64(t, lm + 16),
            read_u64(t, lm + 24),
        ) else {
            break;
        };
        if first {
            // The first entry is the main executable (GDB knows it from the exec file).
            list.main_lm = lm;
            first = false;
        } else {
            let name = if name_ptr == 0 {
                String::new()
            } else {
                read_cstr(t, name_ptr).unwrap_or_default()
            };
            if !name.is_empty() {
                list.objects.push(LoadedObject {
                    lm,
                    l_addr,
                    l_ld,
                    name,
                });
            }
        }
        lm = next;
    }
    list
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

impl LibraryList {
    /// The `library-list-svr4` XML document.
    pub fn to_xml(&self) -> String {
        let mut xml = String::from("<library-list-svr4 version=\"1.0\"");
        if self.main_lm != 0 {
            xml.push_str(&format!(" main-lm=\"{:#x}\"", self.main_lm));
        }
        xml.push('>');
        for o in &self.objects {
            xml.push_str(&format!(
                "<library name=\"{}\" lm=\"{:#x}\" l_addr=\"{:#x}\" l_ld=\"{:#x}\" lmid=\"0x0\"/>",
                xml_escape(&o.name),
                o.lm,
                o.l_addr,
                o.l_ld
            ));
        }
        xml.push_str("</library-list-svr4>");
        xml
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_names() {
        let list = LibraryList {
            main_lm: 0x1000,
            objects: vec![LoadedObject {
                lm: 0x2000,
                l_addr: 0x7f00_0000_0000,
                l_ld: 0x7f00_0000_3e00,
                name: "/tmp/a&b<\"c\".so".into(),
            }],
        };
        assert_eq!(
            list.to_xml(),
            "<library-list-svr4 version=\"1.0\" main-lm=\"0x1000\"><library \
             name=\"/tmp/a&amp;b&lt;&quot;c&quot;.so\" lm=\"0x2000\" l_addr=\"0x7f0000000000\" \
             l_ld=\"0x7f0000003e00\" lmid=\"0x0\"/></library-list-svr4>"
        );
        assert_eq!(
            LibraryList::default().to_xml(),
            "<library-list-svr4 version=\"1.0\"></library-list-svr4>"
        );
    }
}
