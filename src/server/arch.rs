//! The gdbstub architecture: x86-64 Linux with GDB's `amd64-linux` register set (core, sse,
//! linux `orig_rax`, segments `fs_base`/`gs_base`, avx), and its target description XML.

use crate::target::X86Registers;
use crate::target::regs::{GDB_REGS, GDB_REGS_NO_AVX};
use std::num::NonZeroUsize;
use std::sync::OnceLock;

/// gdbstub `Arch` for x86-64 Linux processes.
#[derive(Debug)]
pub enum X86_64Linux {}

/// Registers as exchanged with gdbstub.
///
/// Reading (`g`) serialises a full [`X86Registers`]. Writing (`G`) cannot be applied
/// without the current XSAVE image, so the raw bytes are kept in `written` and merged into
/// the live registers by the session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GdbRegisters {
    /// The register file (for `g`).
    pub regs: X86Registers,
    /// Raw `G` packet bytes, in [`GDB_REGS`] order, not yet applied.
    pub written: Vec<u8>,
}

impl gdbstub::arch::Registers for GdbRegisters {
    type ProgramCounter = u64;

    fn pc(&self) -> u64 {
        self.regs.pc()
    }

    fn gdb_serialize(&self, mut write_byte: impl FnMut(Option<u8>)) {
        let unavailable = self.regs.unavailable;
        self.regs.gdb_layout(|num, bytes| {
            // `xx` bytes: GDB marks the register `<unavailable>` rather than showing a value
            // that is not known (e.g. vector state in the past that no log covers).
            let known = !unavailable.contains(num);
            for &b in bytes {
                write_byte(known.then_some(b));
            }
        });
    }

    fn gdb_deserialize(&mut self, bytes: &[u8]) -> Result<(), ()> {
        // Never fail here: gdbstub treats a failure as fatal for the whole session. The size
        // is checked when the bytes are applied, which yields a normal `E` reply.
        self.written = bytes.to_vec();
        Ok(())
    }
}

/// A register number in GDB's numbering ([`GDB_REGS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdbRegId(pub usize);

impl gdbstub::arch::RegId for GdbRegId {
    fn from_raw_id(id: usize) -> Option<(Self, Option<NonZeroUsize>)> {
        let reg = GDB_REGS.get(id)?;
        Some((GdbRegId(id), NonZeroUsize::new(reg.size)))
    }

    fn to_raw_id(&self) -> Option<usize> {
        Some(self.0)
    }
}

impl gdbstub::arch::Arch for X86_64Linux {
    type Usize = u64;
    type Registers = GdbRegisters;
    type BreakpointKind = usize;
    type RegId = GdbRegId;

    fn target_description_xml() -> Option<&'static str> {
        // The real description depends on whether the CPU has AVX; it is served through
        // `TargetDescriptionXmlOverride`. Returning something here enables qXfer:features.
        Some(target_xml(true))
    }
}

/// The complete target description, with or without the AVX feature.
pub fn target_xml(avx: bool) -> &'static str {
    static WITH: OnceLock<String> = OnceLock::new();
    static WITHOUT: OnceLock<String> = OnceLock::new();
    if avx {
        WITH.get_or_init(|| build_xml(true))
    } else {
        WITHOUT.get_or_init(|| build_xml(false))
    }
}

fn reg_type(name: &str) -> (&'static str, Option<&'static str>) {
    match name {
        "rbp" | "rsp" => ("data_ptr", None),
        "rip" => ("code_ptr", None),
        "eflags" => ("i386_eflags", None),
        "cs" | "ss" | "ds" | "es" | "fs" | "gs" => ("int32", None),
        "mxcsr" => ("i386_mxcsr", Some("vector")),
        "orig_rax" | "fs_base" | "gs_base" => ("int", None),
        n if n.starts_with("st") => ("i387_ext", None),
        n if n.starts_with('f') => ("int", Some("float")),
        n if n.starts_with("xmm") => ("vec128", None),
        n if n.starts_with("ymm") => ("uint128", None),
        _ => ("int64", None),
    }
}

/// The register's DWARF number (x86-64 psABI; `.eh_frame` uses the same numbers) and its
/// LLDB generic role. GDB ignores these attributes; LLDB reads `dwarf_regnum`,
/// `ehframe_regnum` and `generic` from the target description, and without them it cannot map
/// CFI register numbers to our registers nor find the pc/sp/fp/argument registers (lldb-server
/// sends the same attributes).
fn lldb_numbers(name: &str) -> (Option<u32>, Option<&'static str>) {
    const GPRS: [&str; 17] = [
        "rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12",
        "r13", "r14", "r15", "rip",
    ];
    let generic = match name {
        "rip" => Some("pc"),
        "rsp" => Some("sp"),
        "rbp" => Some("fp"),
        "eflags" => Some("flags"),
        "rdi" => Some("arg1"),
        "rsi" => Some("arg2"),
        "rdx" => Some("arg3"),
        "rcx" => Some("arg4"),
        "r8" => Some("arg5"),
        "r9" => Some("arg6"),
        _ => None,
    };
    let indexed = |prefix: &str, base: u32, count: u32| {
        name.strip_prefix(prefix)
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|&n| n < count)
            .map(|n| base + n)
    };
    let dwarf = GPRS
        .iter()
        .position(|&r| r == name)
        .map(|i| i as u32)
        .or_else(|| indexed("xmm", 17, 16))
        .or_else(|| indexed("st", 33, 8))
        .or(match name {
            "eflags" => Some(49),
            "es" => Some(50),
            "cs" => Some(51),
            "ss" => Some(52),
            "ds" => Some(53),
            "fs" => Some(54),
            "gs" => Some(55),
            "fs_base" => Some(58),
            "gs_base" => Some(59),
            "mxcsr" => Some(64),
            "fctrl" => Some(65),
            "fstat" => Some(66),
            _ => None,
        });
    (dwarf, generic)
}

fn build_xml(avx: bool) -> String {
    const EFLAGS: &str = r#"<flags id="i386_eflags" size="4"><field name="CF" start="0" end="0"/><field name="" start="1" end="1"/><field name="PF" start="2" end="2"/><field name="AF" start="4" end="4"/><field name="ZF" start="6" end="6"/><field name="SF" start="7" end="7"/><field name="TF" start="8" end="8"/><field name="IF" start="9" end="9"/><field name="DF" start="10" end="10"/><field name="OF" start="11" end="11"/><field name="NT" start="14" end="14"/><field name="RF" start="16" end="16"/><field name="VM" start="17" end="17"/><field name="AC" start="18" end="18"/><field name="VIF" start="19" end="19"/><field name="VIP" start="20" end="20"/><field name="ID" start="21" end="21"/></flags>"#;
    const SSE_TYPES: &str = r#"<vector id="v4f" type="ieee_single" count="4"/><vector id="v2d" type="ieee_double" count="2"/><vector id="v16i8" type="int8" count="16"/><vector id="v8i16" type="int16" count="8"/><vector id="v4i32" type="int32" count="4"/><vector id="v2i64" type="int64" count="2"/><union id="vec128"><field name="v4_float" type="v4f"/><field name="v2_double" type="v2d"/><field name="v16_int8" type="v16i8"/><field name="v8_int16" type="v8i16"/><field name="v4_int32" type="v4i32"/><field name="v2_int64" type="v2i64"/><field name="uint128" type="uint128"/></union><flags id="i386_mxcsr" size="4"><field name="IE" start="0" end="0"/><field name="DE" start="1" end="1"/><field name="ZE" start="2" end="2"/><field name="OE" start="3" end="3"/><field name="UE" start="4" end="4"/><field name="PE" start="5" end="5"/><field name="DAZ" start="6" end="6"/><field name="IM" start="7" end="7"/><field name="DM" start="8" end="8"/><field name="ZM" start="9" end="9"/><field name="OM" start="10" end="10"/><field name="UM" start="11" end="11"/><field name="PM" start="12" end="12"/><field name="FZ" start="15" end="15"/></flags>"#;
    // (feature name, first register, one past the last register, extra type definitions)
    let mut features: Vec<(&str, usize, usize, &str)> = vec![
        ("org.gnu.gdb.i386.core", 0, 40, EFLAGS),
        ("org.gnu.gdb.i386.sse", 40, 57, SSE_TYPES),
        ("org.gnu.gdb.i386.linux", 57, 58, ""),
        ("org.gnu.gdb.i386.segments", 58, GDB_REGS_NO_AVX, ""),
    ];
    if avx {
        features.push(("org.gnu.gdb.i386.avx", GDB_REGS_NO_AVX, GDB_REGS.len(), ""));
    }
    let mut xml = String::from(
        "<?xml version=\"1.0\"?><!DOCTYPE target SYSTEM \"gdb-target.dtd\"><target version=\"1.0\">\
         <architecture>i386:x86-64</architecture><osabi>GNU/Linux</osabi>",
    );
    for (name, first, end, types) in features {
        xml.push_str(&format!("<feature name=\"{name}\">{types}"));
        for (num, reg) in GDB_REGS.iter().enumerate().take(end).skip(first) {
            let (ty, group) = reg_type(reg.name);
            let (dwarf, generic) = lldb_numbers(reg.name);
            xml.push_str(&format!(
                "<reg name=\"{}\" bitsize=\"{}\" type=\"{ty}\" regnum=\"{num}\"{}{}{}/>",
                reg.name,
                reg.size * 8,
                group.map_or(String::new(), |g| format!(" group=\"{g}\"")),
                dwarf.map_or(String::new(), |d| format!(
                    " dwarf_regnum=\"{d}\" ehframe_regnum=\"{d}\""
                )),
                generic.map_or(String::new(), |g| format!(" generic=\"{g}\""))
            ));
        }
        xml.push_str("</feature>");
    }
    xml.push_str("</target>");
    xml
}

/// Copies `data[offset..offset+length]` into `buf` (qXfer paging); returns the byte count.
pub(crate) fn copy_range(data: &[u8], offset: u64, length: usize, buf: &mut [u8]) -> usize {
    let Ok(start) = usize::try_from(offset) else {
        return 0;
    };
    if start >= data.len() {
        return 0;
    }
    let n = (data.len() - start).min(length).min(buf.len());
    buf[..n].copy_from_slice(&data[start..start + n]);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_lists_every_register_in_order() {
        let xml = target_xml(true);
        let mut last = 0;
        for (num, reg) in GDB_REGS.iter().enumerate() {
            let needle = format!("<reg name=\"{}\" ", reg.name);
            let pos = xml
                .find(&needle)
                .unwrap_or_else(|| panic!("{} missing", reg.name));
            assert!(pos >= last, "{} out of order", reg.name);
            assert!(xml[pos..].contains(&format!("regnum=\"{num}\"")));
            last = pos;
        }
        assert!(!target_xml(false).contains("ymm0h"));
        assert!(target_xml(false).contains("fs_base"));
    }

    #[test]
    fn xml_carries_lldb_register_numbers() {
        let xml = target_xml(false);
        // DWARF numbers from the x86-64 psABI (figure "DWARF Register Number Mapping").
        for (reg, dwarf, generic) in [
            ("rax", 0, None),
            ("rdx", 1, Some("arg3")),
            ("rbx", 3, None),
            ("rdi", 5, Some("arg1")),
            ("rbp", 6, Some("fp")),
            ("rsp", 7, Some("sp")),
            ("r9", 9, Some("arg6")),
            ("r15", 15, None),
            ("rip", 16, Some("pc")),
            ("xmm0", 17, None),
            ("xmm15", 32, None),
            ("st7", 40, None),
            ("eflags", 49, Some("flags")),
            ("fs_base", 58, None),
        ] {
            let start = xml.find(&format!("<reg name=\"{reg}\" ")).unwrap();
            let elem = &xml[start..start + xml[start..].find("/>").unwrap()];
            assert!(
                elem.contains(&format!(" dwarf_regnum=\"{dwarf}\"")),
                "{elem}"
            );
            assert!(
                elem.contains(&format!(" ehframe_regnum=\"{dwarf}\"")),
                "{elem}"
            );
            match generic {
                Some(g) => assert!(elem.contains(&format!(" generic=\"{g}\"")), "{elem}"),
                None => assert!(!elem.contains("generic="), "{elem}"),
            }
        }
        // Registers without a DWARF number get none (orig_rax, ftag).
        let start = xml.find("<reg name=\"orig_rax\" ").unwrap();
        assert!(
            !xml[start..start + 120]
                .split("/>")
                .next()
                .unwrap()
                .contains("dwarf")
        );
    }

    #[test]
    fn copy_range_pages() {
        let mut buf = [0u8; 4];
        assert_eq!(copy_range(b"abcdef", 4, 10, &mut buf), 2);
        assert_eq!(&buf[..2], b"ef");
        assert_eq!(copy_range(b"abcdef", 6, 10, &mut buf), 0);
        assert_eq!(copy_range(b"abcdef", u64::MAX, 10, &mut buf), 0);
    }
}
