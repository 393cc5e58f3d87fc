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
//! query for that object. Separate debug files (`.gnu_debuglink`, build-id directories) are not
//! searched yet.
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

/// The symbols and (lazily) the DWARF of one ELF object.
struct SymObject {
    path: PathBuf,
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
    addr2line::demangle_auto(Cow::Borrowed(name), None).into()
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

    /// Adds the symbols of an ELF object at its bias. Objects added later win where ranges overlap.
    pub fn add_elf(&mut self, elf: &LoadedElf) -> Result<(), LoadError> {
        let bad = |reason: String| LoadError::Elf {
            path: elf.path.clone(),
            reason,
        };
        let file = object::File::parse(&*elf.bytes).map_err(|e| bad(e.to_string()))?;
        let mut syms = Vec::new();
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
            let is_code = section.kind() == object::SectionKind::Text;
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
                limit: section.address().saturating_add(section.size()),
                rank,
                name: demangle(name),
            });
        }
        // One symbol per address: the best-ranked, then the first seen (.symtab before .dynsym).
        syms.sort_by(|a, b| a.vaddr.cmp(&b.vaddr).then(a.rank.cmp(&b.rank)));
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
            bias: elf.bias,
            lo,
            hi,
            syms,
            bytes: elf.bytes.clone(),
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

    /// The symbol containing `addr` (or the nearest preceding one in the same section) and the
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
                let s = &obj.syms[preceding];
                if vaddr >= s.limit {
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
