//! Process images: the traced program's code at its run-time addresses, plus symbols and lines.
//!
//! An [`Image`] is a set of non-overlapping [`Section`]s, each a run of bytes at a virtual address.
//! The flow decoder asks it for the bytes at an IP ([`Image::slice_at`]) on every instruction it has
//! not seen before, so lookups are a binary search over sorted ranges behind a last-hit cache.
//! Sections share their bytes (`Arc`), so a library mapped several times costs its bytes once.
//!
//! Where images come from:
//! - [`elf`]: an ELF executable or shared object at its load address (`--elf FILE[:BASE]`);
//! - [`raw`]: a raw binary at an address, in ptxed's syntax (`--raw FILE[:FROM[-TO]]:BASE`);
//! - [`procfs`]: the executable mappings of a live process (`/proc/PID/maps` + `/proc/PID/mem`);
//! - [`perf_maps`]: perf `MMAP`/`MMAP2` sideband records, with a `--symfs`-like file search;
//! - [`symbols`]: symbol names and source lines for addresses (ELF symbol tables and DWARF).
//!
//! Files are read into memory rather than memory-mapped wherever an image is kept for a session:
//! a mapped file that is truncated or rewritten while we decode would crash the process with
//! `SIGBUS`, and code images are small next to the traces they explain. The one-shot
//! `ptrewind decode` maps its files instead (`--raw`, `--elf`, and those a perf.data or QEMU
//! recording names: [`map_file`], [`FileCache::mapping`], [`MmapOptions::map_files`]), as
//! libipt's ptxed does: a run touches a few hundred pages of a
//! libc-sized image, and reading it whole was a measurable part of the command's time.
//! [`FileCache`] makes every section of one file share one buffer ([`SectionBytes`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod elf;
pub mod immutable;
pub mod perf_maps;
pub mod procfs;
pub mod raw;
pub mod symbols;

pub use elf::{ElfKind, ElfSpec, LoadedElf, LoadedSegment, Segments};
pub use immutable::ImmutableCode;

pub use perf_maps::{MissingImage, MmapImage, MmapOptions, MmapRecord, RemapFn};
pub use procfs::{MapEntry, ProcessImage, ProcessSnapshot, UnreadableMapping};
pub use raw::RawSpec;
pub use symbols::{SymbolInfo, Symbolizer};

/// Bytes of one section, shared (cloning is cheap) with other sections and images: a buffer in
/// memory (a file read whole, or bytes made in memory), or a file mapped read-only (see
/// [`map_file`]).
#[derive(Clone)]
pub struct SectionBytes(Backing);

#[derive(Clone)]
enum Backing {
    Heap(Arc<[u8]>),
    Mapped(Arc<memmap2::Mmap>),
}

impl SectionBytes {
    /// Whether `a` and `b` are the same bytes (not merely equal ones).
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        match (&a.0, &b.0) {
            (Backing::Heap(x), Backing::Heap(y)) => Arc::ptr_eq(x, y),
            (Backing::Mapped(x), Backing::Mapped(y)) => Arc::ptr_eq(x, y),
            _ => false,
        }
    }

    /// Whether the bytes are a mapping of a file (see [`map_file`]).
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Backing::Mapped(_))
    }
}

impl std::ops::Deref for SectionBytes {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Backing::Heap(b) => b,
            Backing::Mapped(m) => m,
        }
    }
}

impl AsRef<[u8]> for SectionBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for SectionBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "heap" };
        write!(f, "SectionBytes({kind}, {} bytes)", self.len())
    }
}

impl From<Arc<[u8]>> for SectionBytes {
    fn from(b: Arc<[u8]>) -> Self {
        SectionBytes(Backing::Heap(b))
    }
}

impl From<Vec<u8>> for SectionBytes {
    fn from(b: Vec<u8>) -> Self {
        SectionBytes(Backing::Heap(b.into()))
    }
}

impl From<&[u8]> for SectionBytes {
    fn from(b: &[u8]) -> Self {
        SectionBytes(Backing::Heap(b.into()))
    }
}

/// A run of code bytes at a virtual address.
#[derive(Debug, Clone)]
pub struct Section {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// The backing bytes (the whole file or mapping; `offset`/`len` select the part used).
    pub bytes: SectionBytes,
    /// Offset into `bytes` of the byte at `addr`.
    pub offset: usize,
    /// Number of bytes mapped.
    pub len: usize,
    /// Where the bytes came from (file path, `[vdso]`, `page-list` ...), for messages.
    pub origin: Arc<str>,
}

impl Section {
    /// A section over all of `bytes` at `addr`.
    pub fn new(addr: u64, bytes: impl Into<SectionBytes>, origin: &str) -> Self {
        let bytes = bytes.into();
        let len = bytes.len();
        Section {
            addr,
            bytes,
            offset: 0,
            len,
            origin: Arc::from(origin),
        }
    }

    /// One past the last mapped address.
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.len as u64)
    }

    /// The mapped bytes.
    pub fn data(&self) -> &[u8] {
        &self.bytes[self.offset..self.offset + self.len]
    }
}

/// Why a section could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// The section's byte range lies outside its backing bytes or wraps the address space.
    #[error(
        "section {origin} at {addr:#x}: bad range (offset {offset}, len {len}, backing {backing})"
    )]
    BadRange {
        /// Section origin.
        origin: String,
        /// Section address.
        addr: u64,
        /// Offset into the backing bytes.
        offset: usize,
        /// Length.
        len: usize,
        /// Backing length.
        backing: usize,
    },
}

/// Why an image (or its symbols) could not be loaded. Every variant names the file or process.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not an ELF file we can load.
    #[error("{}: not a loadable ELF file: {reason}", path.display())]
    Elf {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A requested file range lies outside the file.
    #[error("{}: range {from:#x}..{to:#x} is outside the file ({file_len:#x} bytes)", path.display())]
    FileRange {
        /// The file.
        path: PathBuf,
        /// First offset requested.
        from: u64,
        /// One past the last offset requested.
        to: u64,
        /// The file's size.
        file_len: u64,
    },
    /// Reading a live process failed.
    #[error("process {pid}: cannot read {}: {source}{hint}", path.display())]
    Process {
        /// The process id.
        pid: i32,
        /// The procfs file that failed (`/proc/PID/maps` or `/proc/PID/mem`).
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
        /// A hint on the likely cause (permissions, ptrace scope), possibly empty.
        hint: &'static str,
    },
    /// A line of `/proc/PID/maps` could not be parsed.
    #[error("{}: line {line}: cannot parse {text:?}", path.display())]
    Maps {
        /// The maps file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The offending line.
        text: String,
    },
    /// A section did not fit into the image.
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// Why an `--elf`/`--raw` argument could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// No file name.
    #[error("{arg:?}: missing file name")]
    MissingPath {
        /// The argument.
        arg: String,
    },
    /// `--raw` needs a base address after the last `:`.
    #[error("{arg:?}: missing or malformed base address (expected FILE[:FROM[-TO]]:BASE)")]
    MissingBase {
        /// The argument.
        arg: String,
    },
    /// `FROM-TO` with `TO <= FROM`.
    #[error("{arg:?}: empty file range {from:#x}-{to:#x} (TO is exclusive and must exceed FROM)")]
    EmptyRange {
        /// The argument.
        arg: String,
        /// Range start.
        from: u64,
        /// Range end (exclusive).
        to: u64,
    },
}

/// Parses an unsigned number the way C's `strtoull(s, &end, 0)` does when the whole string must
/// be consumed (the rule ptxed applies to `--raw`/`--elf` arguments): `0x`/`0X` prefix → hex,
/// other leading `0` → octal, otherwise decimal. No sign, no whitespace; overflow is an error.
pub fn parse_number(s: &str) -> Option<u64> {
    let (digits, radix) = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (hex, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// Reads whole files once and hands out shared buffers, so that every section (and every image)
/// taken from one file shares its bytes.
#[derive(Debug, Default, Clone)]
pub struct FileCache {
    files: HashMap<PathBuf, SectionBytes>,
    map: bool,
}

impl FileCache {
    /// An empty cache that reads files.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache that maps files instead of reading them ([`map_file`]): for a one-shot
    /// decode, where only the pages the decoder touches are ever read.
    pub fn mapping() -> Self {
        FileCache {
            files: HashMap::new(),
            map: true,
        }
    }

    /// The contents of `path`, read (or mapped) on first use.
    pub fn get(&mut self, path: &Path) -> Result<SectionBytes, LoadError> {
        if let Some(bytes) = self.files.get(path) {
            return Ok(bytes.clone());
        }
        let bytes = if self.map {
            map_file(path)?
        } else {
            read_file(path)?
        };
        self.files.insert(path.to_path_buf(), bytes.clone());
        Ok(bytes)
    }
}

/// Reads a whole regular file into a shared buffer. Anything else (`/dev/zero`, a FIFO, a
/// directory) is refused before reading: a code image is a file, and a device could be read
/// until memory runs out.
///
/// The bytes are read straight into the shared buffer: going through a `Vec` and `Arc::from`
/// would copy (and page-fault) every byte twice, which for a libc-sized image is most of
/// `ptrewind decode`'s start-up.
pub fn read_file(path: &Path) -> Result<SectionBytes, LoadError> {
    use std::io::{Read as _, Seek as _};
    let io = |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let (mut file, meta) = open_regular(path)?;
    if let Ok(len) = usize::try_from(meta.len()) {
        if let Some(bytes) = read_exactly(&mut file, len) {
            let mut probe = [0u8; 1];
            // The file must still end where its metadata said.
            if matches!(file.read(&mut probe), Ok(0)) {
                return Ok(bytes);
            }
        }
    }
    // The file changed size while it was read: read it again, up to the size it has now.
    file.rewind().map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(len).read_to_end(&mut bytes).map_err(io)?;
    Ok(SectionBytes::from(bytes))
}

/// Opens a code image for reading: a regular file, or an error naming `path` (a FIFO, device or
/// directory is refused, without waiting for a FIFO's writer).
fn open_regular(path: &Path) -> Result<(std::fs::File, std::fs::Metadata), LoadError> {
    let io = |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
    let file = std::os::unix::fs::OpenOptionsExt::custom_flags(
        std::fs::OpenOptions::new().read(true),
        libc::O_NONBLOCK,
    )
    .open(path)
    .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(io(std::io::Error::other(
            "not a regular file (a code image must be a file)",
        )));
    }
    Ok((file, meta))
}

/// Maps a whole regular file read-only (`MAP_PRIVATE`), refusing anything else as
/// [`read_file`] does; an empty file gives empty bytes.
///
/// Nothing is read up front: the pages the decoder touches come from the page cache when it
/// first touches them, and none is copied or zero-filled. On a libc-sized image of which a run
/// executes a few hundred pages that is most of the image's cost (reading it whole faults in,
/// zero-fills and copies every page, then unmaps them at exit; docs/benchmarks.md). The price is
/// the one every mapping reader pays (libipt's ptxed included): a file truncated while it is
/// mapped makes the next access to a page past its new end raise `SIGBUS`. So only the
/// short-lived `ptrewind decode` maps; everything that keeps an image for a session reads it
/// ([`read_file`]).
pub fn map_file(path: &Path) -> Result<SectionBytes, LoadError> {
    let io = |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let (file, meta) = open_regular(path)?;
    if meta.len() == 0 {
        return Ok(SectionBytes::from(Vec::new()));
    }
    // SAFETY: a private read-only mapping of a regular file; the bytes are only read, through
    // shared borrows of the `Mmap`, which keeps the mapping alive as long as any section uses
    // it. A change of the file by another process while mapped is the documented caveat above
    // (it can change the bytes or raise SIGBUS), the same that `TraceFile` accepts for traces.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(SectionBytes(Backing::Mapped(Arc::new(map))))
}

/// Images at least this large get transparent huge pages (see [`read_exactly`]).
const HUGE_PAGE_IMAGE: usize = 2 << 20;

/// Reads exactly `len` bytes from `file` into a new shared buffer, or `None` if the file ends
/// sooner or a read fails.
///
/// The buffer is not zero-filled first (that was a full extra pass over a libc-sized image,
/// and the page faults happened there), and for a large image the kernel is asked for
/// transparent huge pages, so that reading a 17 MB page-snapshot image costs a handful of
/// faults instead of one per 4 KiB page: with 4 KiB pages the faults, the zero-fill and the
/// copy were about 40 % of `ptrewind decode`'s CPU time on such a trace (docs/benchmarks.md).
fn read_exactly(file: &mut std::fs::File, len: usize) -> Option<SectionBytes> {
    use std::os::fd::AsRawFd as _;
    let mut bytes: Arc<[std::mem::MaybeUninit<u8>]> = Arc::new_uninit_slice(len);
    let buf = Arc::get_mut(&mut bytes)?;
    let base = buf.as_mut_ptr() as usize;
    if len >= HUGE_PAGE_IMAGE {
        const HUGE: usize = 2 << 20;
        let from = base.next_multiple_of(HUGE);
        let to = (base + len) & !(HUGE - 1);
        if to > from {
            // SAFETY: FFI; [from, to) lies inside `buf`, memory this function owns alone.
            // MADV_HUGEPAGE is advice about how to back it and never changes its contents; an
            // error (no THP support) leaves the 4 KiB pages.
            unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE) };
        }
    }
    let mut done = 0;
    while done < len {
        // SAFETY: FFI; the kernel writes at most `len - done` bytes at `buf[done..]`, which is
        // inside `buf` (MaybeUninit bytes, so any value is allowed).
        let n = unsafe {
            libc::read(
                file.as_raw_fd(),
                buf.as_mut_ptr().add(done).cast(),
                len - done,
            )
        };
        match n {
            0 => return None,
            n if n > 0 => done += n as usize,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return None,
        }
    }
    // SAFETY: the loop above wrote all `len` bytes.
    Some(SectionBytes::from(unsafe { bytes.assume_init() }))
}

/// The code of a traced process: sorted, non-overlapping sections.
///
/// An image is one address space. A trace that crosses an `execve` ran two programs, often at
/// the same addresses (two non-PIE executables, or PIE at the same base with ASLR off): its
/// image is the first program's sections plus one [`ImagePeriod`] per later address space,
/// each starting at the trace offset of the PSB that opens it ([`Image::push_period`]). The
/// flow decoder decodes everything after such a PSB against that period's image (libipt's
/// model of an image per address space, with the sideband saying where each one starts).
///
/// `Image` is `Sync`: the last-hit cache is a relaxed atomic (a stale hint only costs a search).
#[derive(Debug, Default)]
pub struct Image {
    sections: Vec<Section>,
    last_hit: AtomicUsize,
    /// The later address spaces, sorted by start offset (empty for a trace of one program).
    periods: Vec<ImagePeriod>,
}

/// A later address space of a trace: from the PSB at trace offset `start` on, the code is
/// `image` (the program an `execve` loaded).
#[derive(Debug, Clone)]
pub struct ImagePeriod {
    /// Trace offset of the PSB that opens the period (the first PSB after the `execve`).
    pub start: u64,
    /// The code of that address space.
    pub image: Arc<Image>,
}

impl Clone for Image {
    fn clone(&self) -> Self {
        Image {
            sections: self.sections.clone(),
            last_hit: AtomicUsize::new(0),
            periods: self.periods.clone(),
        }
    }
}

impl Image {
    /// An empty image.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a section. A later section replaces the overlapped parts of earlier ones (like a later
    /// `mmap` over an older mapping), so adding never fails because of overlap.
    pub fn add(&mut self, section: Section) -> Result<(), ImageError> {
        let bad = section
            .offset
            .checked_add(section.len)
            .is_none_or(|end| end > section.bytes.len())
            || section.addr.checked_add(section.len as u64).is_none();
        if bad {
            return Err(ImageError::BadRange {
                origin: section.origin.to_string(),
                addr: section.addr,
                offset: section.offset,
                len: section.len,
                backing: section.bytes.len(),
            });
        }
        if section.len == 0 {
            return Ok(());
        }
        let (start, end) = (section.addr, section.end());
        let mut kept = Vec::with_capacity(self.sections.len() + 2);
        for s in self.sections.drain(..) {
            if s.end() <= start || s.addr >= end {
                kept.push(s);
                continue;
            }
            // Keep the parts of the older section that stick out on either side.
            if s.addr < start {
                let mut left = s.clone();
                left.len = (start - s.addr) as usize;
                kept.push(left);
            }
            if s.end() > end {
                let mut right = s.clone();
                let cut = (end - s.addr) as usize;
                right.addr = end;
                right.offset += cut;
                right.len -= cut;
                kept.push(right);
            }
        }
        kept.push(section);
        kept.sort_by_key(|s| s.addr);
        self.sections = kept;
        self.last_hit.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Adds every section of `sections` in order (later ones win on overlap).
    pub fn extend(
        &mut self,
        sections: impl IntoIterator<Item = Section>,
    ) -> Result<(), ImageError> {
        for s in sections {
            self.add(s)?;
        }
        Ok(())
    }

    /// Total number of mapped bytes.
    pub fn mapped_bytes(&self) -> u64 {
        self.sections.iter().map(|s| s.len as u64).sum()
    }

    /// The sections, sorted by address.
    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The section containing `addr`.
    #[inline]
    pub fn section_at(&self, addr: u64) -> Option<&Section> {
        let hit = self.last_hit.load(Ordering::Relaxed);
        if let Some(s) = self.sections.get(hit) {
            if addr >= s.addr && addr < s.end() {
                return Some(s);
            }
        }
        let idx = self.sections.partition_point(|s| s.end() <= addr);
        let s = self.sections.get(idx)?;
        if addr < s.addr {
            return None;
        }
        self.last_hit.store(idx, Ordering::Relaxed);
        Some(s)
    }

    /// The bytes from `addr` to the end of its section, or `None` if nothing is mapped there.
    #[inline]
    pub fn slice_at(&self, addr: u64) -> Option<&[u8]> {
        let s = self.section_at(addr)?;
        let off = (addr - s.addr) as usize;
        Some(&s.data()[off..])
    }

    /// Adds a later address space: from the PSB at trace offset `start` on, the code is `image`
    /// (its own later periods, if any, are ignored). Periods are kept sorted by start; one with
    /// the same start as an earlier one replaces it.
    pub fn push_period(&mut self, start: u64, image: Arc<Image>) {
        let at = self.periods.partition_point(|p| p.start < start);
        if self.periods.get(at).is_some_and(|p| p.start == start) {
            self.periods[at].image = image;
        } else {
            self.periods.insert(at, ImagePeriod { start, image });
        }
    }

    /// The later address spaces, sorted by start offset (empty: one address space).
    pub fn periods(&self) -> &[ImagePeriod] {
        &self.periods
    }

    /// The image of the address space that a PSB at trace offset `offset` belongs to: the
    /// period with the last start at or before it, or this image's own sections before the
    /// first period.
    pub fn at_offset(&self, offset: u64) -> &Image {
        match self.periods.partition_point(|p| p.start <= offset) {
            0 => self,
            n => &self.periods[n - 1].image,
        }
    }

    /// Makes every section whose bytes equal those of a section of `other` at the same address
    /// share `other`'s buffer (snapshots of a process taken one after another hold mostly the
    /// same code: each keeps only what changed).
    pub fn share_bytes_with(&mut self, other: &Image) {
        for s in &mut self.sections {
            if let Some(o) = other.section_at(s.addr)
                && o.addr == s.addr
                && o.len == s.len
                && o.data() == s.data()
            {
                s.bytes = o.bytes.clone();
                s.offset = o.offset;
            }
        }
    }

    /// This image's own sections without its later periods (the first address space).
    pub fn first_period(&self) -> Image {
        Image {
            sections: self.sections.clone(),
            last_hit: AtomicUsize::new(0),
            periods: Vec::new(),
        }
    }

    /// Copies up to `buf.len()` bytes starting at `addr` into `buf`, crossing into adjacent
    /// sections; returns how many bytes were copied (stops at the first unmapped byte).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let Some(a) = addr.checked_add(done as u64) else {
                break;
            };
            let Some(src) = self.slice_at(a) else { break };
            let n = src.len().min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&src[..n]);
            done += n;
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_section_replaces_overlap() {
        let mut img = Image::new();
        img.add(Section::new(0x1000, vec![1u8; 0x100], "a"))
            .unwrap();
        img.add(Section::new(0x1080, vec![2u8; 0x10], "b")).unwrap();
        assert_eq!(img.sections().len(), 3);
        assert_eq!(img.slice_at(0x107f).unwrap()[0], 1);
        assert_eq!(img.slice_at(0x1080).unwrap()[0], 2);
        assert_eq!(img.slice_at(0x108f).unwrap().len(), 1);
        assert_eq!(img.slice_at(0x1090).unwrap()[0], 1);
        assert!(img.slice_at(0x1100).is_none());
        assert!(img.slice_at(0xfff).is_none());
    }

    #[test]
    fn read_crosses_adjacent_sections() {
        let mut img = Image::new();
        img.add(Section::new(0x2000, vec![0xaa; 4], "a")).unwrap();
        img.add(Section::new(0x2004, vec![0xbb; 4], "b")).unwrap();
        let mut buf = [0u8; 10];
        assert_eq!(img.read(0x2002, &mut buf), 6);
        assert_eq!(&buf[..6], &[0xaa, 0xaa, 0xbb, 0xbb, 0xbb, 0xbb]);
    }

    /// Every byte arrives, whatever the size: empty, small, and large enough for huge pages
    /// (the read then goes into memory that was never zero-filled).
    #[test]
    fn read_file_reads_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        for len in [
            0usize,
            1,
            4095,
            4097,
            HUGE_PAGE_IMAGE + 12_345,
            (5 << 20) + 7,
        ] {
            let want: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
            let path = dir.path().join(format!("f{len}"));
            std::fs::write(&path, &want).unwrap();
            let got = read_file(&path).unwrap();
            assert_eq!(got.len(), len);
            assert!(got[..] == want[..], "{len} bytes differ");
        }
        assert!(read_file(dir.path()).is_err(), "a directory is refused");
    }

    #[test]
    fn periods_pick_the_address_space_by_trace_offset() {
        let mut first = Image::new();
        first
            .add(Section::new(0x1000, vec![1u8; 4], "old"))
            .unwrap();
        let mut second = Image::new();
        second
            .add(Section::new(0x1000, vec![2u8; 4], "new"))
            .unwrap();
        let mut third = Image::new();
        third
            .add(Section::new(0x1000, vec![3u8; 4], "newer"))
            .unwrap();
        let mut img = first.clone();
        img.push_period(500, Arc::new(third));
        img.push_period(100, Arc::new(second));
        let byte = |off: u64| img.at_offset(off).slice_at(0x1000).unwrap()[0];
        assert_eq!(
            (byte(0), byte(99), byte(100), byte(499), byte(500)),
            (1, 1, 2, 2, 3)
        );
        assert_eq!(byte(u64::MAX), 3);
        assert_eq!(img.periods().len(), 2);
        assert!(img.first_period().periods().is_empty());
        assert_eq!(img.clone().at_offset(100).slice_at(0x1000).unwrap()[0], 2);
    }

    #[test]
    fn snapshots_share_unchanged_bytes() {
        let mut a = Image::new();
        a.add(Section::new(0x1000, vec![1u8; 16], "lib")).unwrap();
        a.add(Section::new(0x2000, vec![2u8; 16], "jit")).unwrap();
        let mut b = Image::new();
        b.add(Section::new(0x1000, vec![1u8; 16], "lib")).unwrap();
        b.add(Section::new(0x2000, vec![3u8; 16], "jit")).unwrap();
        b.share_bytes_with(&a);
        assert!(SectionBytes::ptr_eq(
            &b.sections()[0].bytes,
            &a.sections()[0].bytes
        ));
        assert!(!SectionBytes::ptr_eq(
            &b.sections()[1].bytes,
            &a.sections()[1].bytes
        ));
        assert_eq!(b.slice_at(0x2000).unwrap()[0], 3);
    }

    #[test]
    fn bad_range_is_an_error() {
        let mut img = Image::new();
        let mut s = Section::new(0x1000, vec![0u8; 4], "x");
        s.len = 8;
        assert!(img.add(s).is_err());
    }
}
