//! Symbol names and source lines for run-time addresses.
//!
//! A [`Symbolizer`] holds one or more ELF objects, each at its load bias (as placed by
//! [`LoadedElf`]). Symbols come from `.symtab` and `.dynsym`: defined functions (`STT_FUNC`,
//! `STT_GNU_IFUNC`) plus untyped labels in executable sections (hand-written `_start` and the like),
//! sorted by address. An address inside a sized function gets that function; otherwise the nearest
//! preceding symbol of the same ELF section (with its offset) — the fallback gdb and perf use for
//! stripped-size or assembly symbols. Rust and C++ names are demangled (through addr2line's
//! `rustc-demangle`/`cpp_demangle` support, which Cargo.toml already pulls in).
//!
//! Source lines come from DWARF (`addr2line` over `gimli`), parsed on the first [`Symbolizer::line`]
//! query for that object. A separate debug file is found by build id
//! (`/usr/lib/debug/.build-id/xx/rest.debug`, as GDB does); `.gnu_debuglink` is not searched.
//!
//! The symbolizer is `Send + Sync` and cheap to clone (objects are behind `Arc`), so a GDB server
//! thread can share it with the decoder.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind, SymbolSection};

use super::{ElfSpec, LoadError, LoadedElf, SectionBytes};

type DwarfReader = gimli::EndianArcSlice<gimli::RunTimeEndian>;
type DwarfContext = addr2line::Context<DwarfReader>;

/// One symbol, at its link-time address.
#[derive(Debug, Clone)]
struct Sym {
    vaddr: u64,
    size: u64,
    /// End of the ELF section holding the symbol: the nearest-preceding fallback stops there.
    limit: u64,
    /// Lower is preferred among symbols at the same address.
    rank: u8,
    name: Box<str>,
}

/// Where a mapping put a file: its byte at `offset` at `addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    path: PathBuf,
    addr: u64,
    offset: u64,
}

/// The symbols and (lazily) the DWARF of one ELF object.
struct SymObject {
    path: PathBuf,
    /// The mapping [`Symbolizer::add_mapped_file`] placed it by (`None` otherwise): the key
    /// under which a later symbolizer takes it over.
    mapping: Option<Mapping>,
    bias: u64,
    /// Run-time range covered by its loadable segments.
    lo: u64,
    hi: u64,
    syms: Vec<Sym>,
    bytes: SectionBytes,
    dwarf: OnceLock<Result<Mutex<DwarfContext>, String>>,
}

impl std::fmt::Debug for SymObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymObject")
            .field("path", &self.path)
            .field("bias", &self.bias)
            .field("range", &(self.lo..self.hi))
            .field("symbols", &self.syms.len())
            .finish()
    }
}

/// A symbol found for an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymbolInfo<'a> {
    /// Name (demangled when it was mangled).
    pub name: &'a str,
    /// Run-time address of the symbol's first byte.
    pub addr: u64,
    /// Size from the symbol table (0 if unknown).
    pub size: u64,
    /// The ELF object the symbol belongs to.
    pub object: &'a Path,
}

/// Maps run-time addresses to symbols and source lines over a set of ELF objects.
#[derive(Debug, Clone, Default)]
pub struct Symbolizer {
    objects: Vec<Arc<SymObject>>,
}

fn demangle(name: &str) -> Box<str> {
    // Only mangled names: the C++ demangler also reads a bare type encoding, so a C function
    // `f` or `i` would show as `float` or `int` (GDB demangles only `_Z`, Rust `_R`/`_ZN`).
    if name.starts_with("_Z") || name.starts_with("_R") {
        addr2line::demangle_auto(Cow::Borrowed(name), None).into()
    } else {
        name.into()
    }
}

impl Symbolizer {
    /// An empty symbolizer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the ELF file of `spec`, placed as [`LoadedElf::open`] places it, and adds its symbols.
    pub fn add_file(&mut self, spec: &ElfSpec) -> Result<LoadedElf, LoadError> {
        let elf = LoadedElf::open(spec)?;
        self.add_elf(&elf)?;
        Ok(elf)
    }

    /// Adds the ELF file `path` placed by one of its mappings: its byte at file offset
    /// `offset` is at `addr` (a `/proc/PID/maps` line's start and offset; any segment will do,
    /// as QEMU lists only a library's executable one). An object `previous` placed by the same
    /// mapping is shared (its symbols, and its DWARF if parsed) instead of read again.
    pub fn add_mapped_file(
        &mut self,
        path: &Path,
        addr: u64,
        offset: u64,
        previous: Option<&Symbolizer>,
    ) -> Result<(), LoadError> {
        let mapping = Mapping {
            path: path.to_path_buf(),
            addr,
            offset,
        };
        let known = previous.and_then(|p| {
            p.objects
                .iter()
                .find(|o| o.mapping.as_ref() == Some(&mapping))
        });
        if let Some(o) = known {
            self.objects.push(Arc::clone(o));
            return Ok(());
        }
        let elf = LoadedElf::open(&ElfSpec::new(path, None))?
            .placed_at(addr, offset)
            .ok_or_else(|| LoadError::Elf {
                path: path.to_path_buf(),
                reason: format!("no loadable segment holds file offset {offset:#x}"),
            })?;
        self.add_object(&elf, Some(mapping))
    }

    /// Adds the symbols of an ELF object at its bias. Objects added later win where ranges overlap.
    pub fn add_elf(&mut self, elf: &LoadedElf) -> Result<(), LoadError> {
        self.add_object(elf, None)
    }

    fn add_object(&mut self, elf: &LoadedElf, mapping: Option<Mapping>) -> Result<(), LoadError> {
        let bad = |reason: String| LoadError::Elf {
            path: elf.path.clone(),
            reason,
        };
        let file = object::File::parse(&*elf.bytes).map_err(|e| bad(e.to_string()))?;
        let mut syms = Vec::new();
        collect_symbols(&file, &mut syms);
        plt_symbols(&file, &mut syms);
        // A stripped file (Debian's libc) keeps only its dynamic symbols: the code of local
        // functions (`__vfprintf_internal`) then lies past the end of an exported neighbour.
        // Its separate debug file (found by build id, as GDB does) has the full symbol table
        // at the same link-time addresses, and the DWARF.
        let debug = separate_debug_file(&file);
        if let Some(bytes) = &debug
            && let Ok(dfile) = object::File::parse(&**bytes)
        {
            collect_symbols(&dfile, &mut syms);
        }
        let dwarf_bytes = match &debug {
            Some(bytes) if file.section_by_name(".debug_info").is_none() => bytes.clone(),
            _ => elf.bytes.clone(),
        };
        // Among symbols at one address the name GDB shows wins (`info symbol`): a sized
        // global one before a local alias (`_IO_setb`, not `__GI__IO_setb`), and of those the
        // last by name (GDB sorts minimal symbols by address, then name, and takes the last:
        // `free`, not `__libc_free`).
        syms.sort_by(|a, b| {
            a.vaddr
                .cmp(&b.vaddr)
                .then(a.rank.cmp(&b.rank))
                .then(b.name.as_bytes().cmp(a.name.as_bytes()))
        });
        syms.dedup_by(|later, first| later.vaddr == first.vaddr);
        let lo = elf.segments.iter().map(|s| s.addr).min().unwrap_or(0);
        let hi = elf
            .segments
            .iter()
            .map(|s| s.addr.saturating_add(s.mem_size))
            .max()
            .unwrap_or(0);
        self.objects.push(Arc::new(SymObject {
            path: elf.path.clone(),
            mapping,
            bias: elf.bias,
            lo,
            hi,
            syms,
            bytes: dwarf_bytes,
            dwarf: OnceLock::new(),
        }));
        Ok(())
    }

    fn object_at(&self, addr: u64) -> Option<&SymObject> {
        self.objects
            .iter()
            .rev()
            .find(|o| addr >= o.lo && addr < o.hi)
            .map(|o| &**o)
    }

    /// The symbol containing `addr` (or the nearest preceding zero-sized one in the same
    /// section; none past the end of a sized symbol, as in GDB) and the
    /// offset of `addr` from its start.
    pub fn symbol(&self, addr: u64) -> Option<(&str, u64)> {
        self.symbol_info(addr)
            .map(|s| (s.name, addr.wrapping_sub(s.addr)))
    }

    /// Like [`Symbolizer::symbol`], with the symbol's address, size and object.
    pub fn symbol_info(&self, addr: u64) -> Option<SymbolInfo<'_>> {
        let obj = self.object_at(addr)?;
        let vaddr = addr.wrapping_sub(obj.bias);
        let idx = obj.syms.partition_point(|s| s.vaddr <= vaddr);
        let preceding = idx.checked_sub(1)?;
        // A sized symbol containing the address wins; nested or overlapping symbols are rare, so a
        // short look back suffices.
        let containing = obj.syms[..=preceding]
            .iter()
            .rev()
            .take(16)
            .find(|s| s.size > 0 && vaddr - s.vaddr < s.size);
        let sym = match containing {
            Some(s) => s,
            None => {
                // Past the end of the nearest sized symbol: no name, as in GDB (`info symbol`
                // says "No symbol matches"), rather than that symbol with an offset beyond
                // its size; a zero-sized symbol (an assembly label) covers what follows it.
                let s = &obj.syms[preceding];
                if s.size > 0 || vaddr >= s.limit {
                    return None;
                }
                s
            }
        };
        Some(SymbolInfo {
            name: &sym.name,
            addr: sym.vaddr.wrapping_add(obj.bias),
            size: sym.size,
            object: &obj.path,
        })
    }

    /// The run-time address of the first symbol called `name` (demangled name), if any.
    pub fn lookup(&self, name: &str) -> Option<u64> {
        self.objects.iter().find_map(|o| {
            o.syms
                .iter()
                .find(|s| &*s.name == name)
                .map(|s| s.vaddr.wrapping_add(o.bias))
        })
    }

    /// The source file and line of `addr`, from the DWARF line table (parsed on first use).
    pub fn line(&self, addr: u64) -> Option<(String, u32)> {
        let obj = self.object_at(addr)?;
        let ctx = obj
            .dwarf
            .get_or_init(|| load_dwarf(&obj.bytes).map(Mutex::new))
            .as_ref()
            .ok()?;
        let ctx = ctx.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let loc = ctx.find_location(addr.wrapping_sub(obj.bias)).ok()??;
        Some((loc.file?.to_string(), loc.line?))
    }

    /// Why DWARF line information is unavailable for the object at `addr` (after a `line` query).
    pub fn dwarf_error(&self, addr: u64) -> Option<&str> {
        let obj = self.object_at(addr)?;
        obj.dwarf.get()?.as_ref().err().map(String::as_str)
    }
}

/// Adds the function symbols of `file` (static and dynamic tables) to `syms`.
fn collect_symbols(file: &object::File<'_>, syms: &mut Vec<Sym>) {
    for s in file.symbols().chain(file.dynamic_symbols()) {
        if !s.is_definition() && s.kind() != SymbolKind::Unknown {
            continue;
        }
        let SymbolSection::Section(index) = s.section() else {
            continue;
        };
        let Ok(section) = file.section_by_index(index) else {
            continue;
        };
        // A debug file's code sections are NOBITS (object calls them uninitialized data);
        // their flags still say executable. Labels there (ld.so's `_start`, NOTYPE) are what
        // GDB names the code by, as it does in the file itself.
        let is_code = section.kind() == object::SectionKind::Text
            || matches!(section.flags(), object::SectionFlags::Elf { sh_flags, .. }
                if sh_flags.0 & object::elf::SHF_EXECINSTR.0 != 0);
        let rank = match s.kind() {
            SymbolKind::Text if s.is_global() && s.size() > 0 => 0,
            SymbolKind::Text if s.size() > 0 => 1,
            SymbolKind::Text => 2,
            SymbolKind::Unknown if is_code => 3,
            _ => continue,
        };
        let Ok(name) = s.name() else { continue };
        if name.is_empty() {
            continue;
        }
        syms.push(Sym {
            vaddr: s.address(),
            size: s.size(),
            // A debug file's sections are NOBITS copies: their addresses and sizes still
            // describe the code.
            limit: section.address().saturating_add(section.size()),
            rank,
            // `name@@VERSION` (a default version, as glibc's own symbol table spells it)
            // is the plain name to GDB and to the user.
            name: demangle(name.split_once("@@").map_or(name, |(plain, _)| plain)),
        });
    }
}

/// Adds `NAME@plt` for each entry of the `.plt`, `.plt.sec` and `.plt.got` sections (as BFD synthesizes
/// them for GDB): the entry's `jmp *GOT(%rip)` names a GOT slot, and the dynamic relocation
/// of that slot names the function (`*ABS*+0xADDEND` for an IFUNC resolved at load time).
fn plt_symbols(file: &object::File<'_>, syms: &mut Vec<Sym>) {
    use object::{ObjectSymbolTable, RelocationTarget};
    let Some(relocs) = file.dynamic_relocations() else {
        return;
    };
    let dynsyms = file.dynamic_symbol_table();
    let mut by_slot = std::collections::HashMap::new();
    for (slot, r) in relocs {
        let name = match r.target() {
            RelocationTarget::Symbol(idx) => dynsyms
                .as_ref()
                .and_then(|t| t.symbol_by_index(idx).ok())
                .and_then(|s| s.name().ok())
                .filter(|n| !n.is_empty())
                .map(str::to_string),
            _ => None,
        };
        let name = name.unwrap_or_else(|| format!("*ABS*+{:#x}", r.addend()));
        by_slot.insert(slot, name);
    }
    for section in file.sections() {
        let Ok(sname) = section.name() else { continue };
        let size = match sname {
            ".plt" | ".plt.sec" => 16,
            ".plt.got" => 8,
            _ => continue,
        };
        let Ok(data) = section.data() else { continue };
        let base = section.address();
        let limit = base.saturating_add(section.size());
        for (i, entry) in data.chunks_exact(size).enumerate() {
            // `jmp *disp32(%rip)` (ff 25), possibly after endbr64 and/or a bnd prefix.
            let Some(at) = (0..entry.len().saturating_sub(5))
                .find(|&j| entry[j] == 0xff && entry[j + 1] == 0x25)
            else {
                continue;
            };
            let Some(disp) = entry.get(at + 2..at + 6) else {
                continue;
            };
            let disp = i32::from_le_bytes([disp[0], disp[1], disp[2], disp[3]]);
            let addr = base + (i * size) as u64;
            let slot = (addr + at as u64 + 6).wrapping_add_signed(i64::from(disp));
            if let Some(name) = by_slot.get(&slot) {
                syms.push(Sym {
                    vaddr: addr,
                    size: size as u64,
                    limit,
                    rank: 1,
                    name: format!("{name}@plt").into(),
                });
            }
        }
    }
}

/// The bytes of `file`'s separate debug file, `/usr/lib/debug/.build-id/xx/rest.debug`, if it
/// is installed and is an ELF file with the same build id.
fn separate_debug_file(file: &object::File<'_>) -> Option<SectionBytes> {
    let id = file.build_id().ok()??;
    if id.len() < 2 {
        return None;
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let path = Path::new("/usr/lib/debug/.build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]));
    let bytes: SectionBytes = std::fs::read(&path).ok()?.into();
    let same = object::File::parse(&*bytes)
        .ok()
        .and_then(|d| d.build_id().ok().flatten().map(|d| d == id));
    (same == Some(true)).then_some(bytes)
}

fn load_dwarf(bytes: &SectionBytes) -> Result<DwarfContext, String> {
    let file = object::File::parse(&**bytes).map_err(|e| e.to_string())?;
    if file.section_by_name(".debug_info").is_none() {
        return Err("no .debug_info section".to_string());
    }
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<DwarfReader, String> {
        let data: Arc<[u8]> = match file.section_by_name(id.name()) {
            Some(section) => {
                let data = section
                    .uncompressed_data()
                    .map_err(|e| format!("{}: {e}", id.name()))?;
                Arc::from(&*data)
            }
            None => Arc::from(&[][..]),
        };
        Ok(gimli::EndianArcSlice::new(data, endian))
    };
    let dwarf = gimli::Dwarf::load(load)?;
    DwarfContext::from_dwarf(dwarf).map_err(|e| e.to_string())
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Symbolizer>();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A label in a separate debug file's code (ld.so's `_start`: NOTYPE, size 0) names the
    /// code as GDB names it, though the debug file's copy of `.text` is NOBITS; names are
    /// demangled only when mangled.
    #[test]
    fn labels_in_a_debug_files_code_are_symbols() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("l.s");
        std::fs::write(
            &src,
            ".text\n.globl f\n.type f,@function\nf: ret\n.size f,1\nentry_label: nop\nret\n\
             .globl _ZN2ns3fooEv\n_ZN2ns3fooEv: ret\n",
        )
        .expect("write");
        let obj = dir.path().join("l.o");
        let debug = dir.path().join("l.debug");
        let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
        if !ok(Command::new("cc").arg("-c").arg(&src).arg("-o").arg(&obj))
            || !ok(Command::new("objcopy")
                .arg("--only-keep-debug")
                .arg(&obj)
                .arg(&debug))
        {
            eprintln!("SKIPPED: cc or objcopy missing");
            return;
        }
        let bytes = std::fs::read(&debug).expect("read");
        let file = object::File::parse(&*bytes).expect("parse");
        let text = file.section_by_name(".text").expect(".text");
        assert_ne!(
            text.kind(),
            object::SectionKind::Text,
            "NOBITS in a debug file"
        );
        let mut syms = Vec::new();
        collect_symbols(&file, &mut syms);
        let names: Vec<&str> = syms.iter().map(|s| &*s.name).collect();
        assert!(names.contains(&"f"), "{names:?}");
        assert!(names.contains(&"entry_label"), "{names:?}");
        // A C name that reads as a C++ type encoding stays itself; a mangled one is demangled.
        assert!(!names.contains(&"float"), "{names:?}");
        assert!(names.contains(&"ns::foo()"), "{names:?}");
    }
}
