//! ELF executables and shared objects at their run-time addresses (`--elf FILE[:BASE]`).
//!
//! # Load address
//! An ELF file's `PT_LOAD` segments are placed at `p_vaddr + bias`:
//! - without `BASE`, the bias is 0: an `ET_EXEC` executable lands at its link address (the only
//!   place it can run), and a PIE or shared object (`ET_DYN`) lands at its link-time addresses too,
//!   usually starting near 0 — give `BASE` to place it where it was really mapped;
//! - with `BASE`, the bias is `BASE - page_floor(lowest PT_LOAD p_vaddr)`: `BASE` is the address at
//!   which the page holding the lowest loadable segment is mapped, i.e. the start address of the
//!   file's first line in `/proc/PID/maps` (pages are 4 KiB on x86).
//!
//! Differences from ptxed's `--elf` (libipt `load_elf.c`): ptxed subtracts the *unrounded* lowest
//! `p_vaddr` (the two agree whenever the first segment starts on a page boundary, as in every
//! default GNU ld/gold/lld/mold layout), and it treats a base of 0 as "no base"; here `FILE:0` really
//! means base 0. ptxed maps every `PT_LOAD`; here that is [`Segments::AllLoadable`].
//!
//! Only the file-backed part of a segment (`p_filesz`) is mapped, as in ptxed: the zero-filled rest
//! (`.bss`) is never code. By default only executable segments are mapped
//! ([`Segments::Executable`]), which is all the flow decoder needs. 32-bit and 64-bit files are
//! accepted; the machine must be x86 or x86-64 because nothing else produces Intel PT.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use object::{Object, ObjectKind, ObjectSegment};

use super::{FileCache, Image, LoadError, Section, SectionBytes, SpecError, parse_number};

/// x86 page size: mappings start on page boundaries.
const PAGE_SIZE: u64 = 0x1000;

/// An `--elf FILE[:BASE]` argument.
///
/// `BASE` is the number after the last `:` (`0x` hex, leading-`0` octal or decimal, as ptxed's
/// `strtoull(.., 0)`); if that part does not parse as a number, the `:` belongs to the file name
/// (so `a:b` is the file `a:b` at its default address, and `a:b:0x1000` is `a:b` at `0x1000`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfSpec {
    /// The ELF file.
    pub path: PathBuf,
    /// Where the lowest loadable page is mapped; `None` for the link-time address.
    pub base: Option<u64>,
}

impl ElfSpec {
    /// A spec for `path` at `base`.
    pub fn new(path: impl Into<PathBuf>, base: Option<u64>) -> Self {
        ElfSpec {
            path: path.into(),
            base,
        }
    }
}

impl FromStr for ElfSpec {
    type Err = SpecError;

    fn from_str(arg: &str) -> Result<Self, SpecError> {
        let (path, base) = match arg.rsplit_once(':') {
            Some((path, num)) => match parse_number(num) {
                Some(base) => (path, Some(base)),
                None => (arg, None),
            },
            None => (arg, None),
        };
        if path.is_empty() {
            return Err(SpecError::MissingPath {
                arg: arg.to_string(),
            });
        }
        Ok(ElfSpec {
            path: PathBuf::from(path),
            base,
        })
    }
}

impl fmt::Display for ElfSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.base {
            Some(base) => write!(f, "{}:{base:#x}", self.path.display()),
            None => write!(f, "{}", self.path.display()),
        }
    }
}

/// Which `PT_LOAD` segments to map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Segments {
    /// Only segments with execute permission (`PF_X`): the code the flow decoder reads.
    #[default]
    Executable,
    /// Every loadable segment (code, read-only data, initialised data).
    AllLoadable,
}

/// The kind of ELF file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElfKind {
    /// `ET_EXEC`: a position-dependent executable.
    Executable,
    /// `ET_DYN`: a position-independent executable or a shared object.
    Dynamic,
    /// Anything else (`ET_REL`, `ET_CORE`): loaded at its segment addresses as-is.
    Other,
}

/// One `PT_LOAD` segment of a [`LoadedElf`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedSegment {
    /// Link-time address (`p_vaddr`).
    pub vaddr: u64,
    /// Run-time address (`p_vaddr + bias`).
    pub addr: u64,
    /// File offset of the segment's bytes (`p_offset`).
    pub file_offset: u64,
    /// Bytes backed by the file (`p_filesz`).
    pub file_size: u64,
    /// Size in memory (`p_memsz`); the part beyond `file_size` is zero-filled.
    pub mem_size: u64,
    /// `PF_X`.
    pub executable: bool,
    /// `PF_W`.
    pub writable: bool,
}

/// An ELF file placed at a load address: its bytes (shared) and its loadable segments.
#[derive(Debug, Clone)]
pub struct LoadedElf {
    /// The file.
    pub path: PathBuf,
    /// The whole file's bytes, shared by every [`Section`] made from it.
    pub bytes: SectionBytes,
    /// Run-time address minus link-time address (wrapping).
    pub bias: u64,
    /// 32 or 64.
    pub bits: u8,
    /// Executable, PIE/shared object, or other.
    pub kind: ElfKind,
    /// Run-time entry point.
    pub entry: u64,
    /// The `PT_LOAD` segments, in file order.
    pub segments: Vec<LoadedSegment>,
}

impl LoadedElf {
    /// Reads and parses `spec.path` and places it per `spec.base` (see the module docs).
    pub fn open(spec: &ElfSpec) -> Result<Self, LoadError> {
        let bytes = super::read_file(&spec.path)?;
        Self::from_bytes(&spec.path, bytes, spec.base)
    }

    /// The same file placed so that its byte at file offset `pgoff` is at `addr` (a mapping's
    /// start and file offset, as `/proc/PID/maps` and perf's MMAP records give them). `None`
    /// when no loadable segment holds `pgoff`.
    pub fn placed_at(mut self, addr: u64, pgoff: u64) -> Option<Self> {
        let seg = self.segments.iter().find(|s| {
            let start = s.file_offset & !0xfff;
            pgoff >= start && pgoff < s.file_offset.saturating_add(s.file_size.max(1))
        })?;
        // The link-time address of the byte at file offset `pgoff`.
        let vaddr = seg.vaddr.wrapping_sub(seg.file_offset).wrapping_add(pgoff);
        let bias = addr.wrapping_sub(vaddr);
        self.entry = self.entry.wrapping_sub(self.bias).wrapping_add(bias);
        self.bias = bias;
        for s in &mut self.segments {
            s.addr = s.vaddr.wrapping_add(bias);
        }
        Some(self)
    }

    /// Like [`LoadedElf::open`], sharing the file's bytes through `cache`.
    pub fn open_cached(spec: &ElfSpec, cache: &mut FileCache) -> Result<Self, LoadError> {
        let bytes = cache.get(&spec.path)?;
        Self::from_bytes(&spec.path, bytes, spec.base)
    }

    /// Parses an ELF file already in memory; `path` only names it in messages and sections.
    pub fn from_bytes(
        path: &Path,
        bytes: SectionBytes,
        base: Option<u64>,
    ) -> Result<Self, LoadError> {
        let bad = |reason: String| LoadError::Elf {
            path: path.to_path_buf(),
            reason,
        };
        let file = object::File::parse(&*bytes).map_err(|e| bad(e.to_string()))?;
        if file.format() != object::BinaryFormat::Elf {
            return Err(bad(format!("{:?} file, not ELF", file.format())));
        }
        let arch = file.architecture();
        if !matches!(
            arch,
            object::Architecture::X86_64
                | object::Architecture::X86_64_X32
                | object::Architecture::I386
        ) {
            return Err(bad(format!(
                "machine {arch:?}: Intel PT traces only x86 code"
            )));
        }
        let kind = match file.kind() {
            ObjectKind::Executable => ElfKind::Executable,
            ObjectKind::Dynamic => ElfKind::Dynamic,
            _ => ElfKind::Other,
        };
        let file_len = bytes.len() as u64;
        let mut raw = Vec::new();
        for seg in file.segments() {
            let (file_offset, file_size) = seg.file_range();
            let in_file = file_offset
                .checked_add(file_size)
                .is_some_and(|end| end <= file_len);
            if !in_file {
                return Err(bad(format!(
                    "PT_LOAD at {:#x}: file range {file_offset:#x}+{file_size:#x} exceeds the file ({file_len:#x} bytes)",
                    seg.address()
                )));
            }
            let perms = seg.permissions();
            raw.push((
                seg.address(),
                file_offset,
                file_size,
                seg.size(),
                perms.executable(),
                perms.writable(),
            ));
        }
        if raw.is_empty() {
            return Err(bad("no PT_LOAD segment".to_string()));
        }
        let lowest = raw.iter().map(|r| r.0).min().unwrap_or(0);
        let bias = match base {
            Some(base) => base.wrapping_sub(lowest & !(PAGE_SIZE - 1)),
            None => 0,
        };
        let segments = raw
            .into_iter()
            .map(
                |(vaddr, file_offset, file_size, mem_size, executable, writable)| LoadedSegment {
                    vaddr,
                    addr: vaddr.wrapping_add(bias),
                    file_offset,
                    file_size,
                    mem_size,
                    executable,
                    writable,
                },
            )
            .collect();
        Ok(LoadedElf {
            path: path.to_path_buf(),
            bits: if file.is_64() { 64 } else { 32 },
            kind,
            entry: file.entry().wrapping_add(bias),
            bias,
            bytes,
            segments,
        })
    }

    /// The sections for the selected segments, sharing [`LoadedElf::bytes`].
    pub fn sections(&self, which: Segments) -> Vec<Section> {
        let origin: std::sync::Arc<str> =
            std::sync::Arc::from(self.path.to_string_lossy().as_ref());
        self.segments
            .iter()
            .filter(|s| which == Segments::AllLoadable || s.executable)
            .filter(|s| s.file_size > 0)
            .map(|s| Section {
                addr: s.addr,
                bytes: self.bytes.clone(),
                // Checked against the file length in `from_bytes`, so these fit in usize.
                offset: s.file_offset as usize,
                len: s.file_size as usize,
                origin: origin.clone(),
            })
            .collect()
    }

    /// Link-time address of the run-time address `addr`.
    pub fn to_vaddr(&self, addr: u64) -> u64 {
        addr.wrapping_sub(self.bias)
    }

    /// Run-time address of the link-time address `vaddr`.
    pub fn to_addr(&self, vaddr: u64) -> u64 {
        vaddr.wrapping_add(self.bias)
    }
}

impl Image {
    /// Loads the executable segments of the ELF file named by `spec` (see the module docs for the
    /// load address) and returns the parsed file (for symbols, or to add more segments).
    pub fn load_elf(&mut self, spec: &ElfSpec) -> Result<LoadedElf, LoadError> {
        self.load_elf_with(spec, Segments::Executable)
    }

    /// Like [`Image::load_elf`], choosing which segments to map.
    pub fn load_elf_with(
        &mut self,
        spec: &ElfSpec,
        which: Segments,
    ) -> Result<LoadedElf, LoadError> {
        let elf = LoadedElf::open(spec)?;
        self.add_elf(&elf, which)?;
        Ok(elf)
    }

    /// Maps the selected segments of an already parsed ELF file.
    pub fn add_elf(&mut self, elf: &LoadedElf, which: Segments) -> Result<(), LoadError> {
        self.extend(elf.sections(which))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parsing() {
        let s: ElfSpec = "a.out".parse().unwrap();
        assert_eq!(s, ElfSpec::new("a.out", None));
        let s: ElfSpec = "a.out:0x400000".parse().unwrap();
        assert_eq!(s, ElfSpec::new("a.out", Some(0x400000)));
        let s: ElfSpec = "a.out:4096".parse().unwrap();
        assert_eq!(s, ElfSpec::new("a.out", Some(4096)));
        let s: ElfSpec = "dir:x/a.out".parse().unwrap();
        assert_eq!(s, ElfSpec::new("dir:x/a.out", None));
        let s: ElfSpec = "dir:x/a.out:0x10".parse().unwrap();
        assert_eq!(s, ElfSpec::new("dir:x/a.out", Some(0x10)));
        let s: ElfSpec = "a.out:".parse().unwrap();
        assert_eq!(s, ElfSpec::new("a.out:", None));
        assert!(":0x1000".parse::<ElfSpec>().is_err());
        assert!("".parse::<ElfSpec>().is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let err = LoadedElf::from_bytes(
            Path::new("junk"),
            SectionBytes::from(&b"\x7fELF\x02\x01"[..]),
            None,
        );
        assert!(matches!(err, Err(LoadError::Elf { .. })));
        let err =
            LoadedElf::from_bytes(Path::new("junk"), SectionBytes::from(&[0u8; 100][..]), None);
        assert!(matches!(err, Err(LoadError::Elf { .. })));
    }
}
