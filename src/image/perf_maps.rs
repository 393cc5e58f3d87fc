//! Images from perf `MMAP`/`MMAP2` sideband records.
//!
//! Each record says "the file `filename`, from byte `pgoff`, is mapped at `[addr, addr+len)`". The
//! image maps exactly those file bytes there, in record order (a later mapping replaces what it
//! overlaps, as `mmap(MAP_FIXED)` does), which is what perf and libipt's sideband decoder do. This
//! gives the layout after the last record; a decoder that must follow `exec`/`dlopen`/`munmap` over
//! time rebuilds its image at each record instead.
//!
//! Finding files: a [`MmapOptions::remap`] function is asked first (it may also supply files for
//! pseudo mappings such as `[vdso]`); then each [`MmapOptions::symfs`] root joined with the
//! recorded absolute path (like `perf --symfs`); then the recorded path itself. A record whose file
//! is not found, or whose offset lies past the file's end, is returned in
//! [`MmapImage::missing`] — never skipped silently. Kernel records (`[kernel.kallsyms]…`, kernel
//! modules, pid -1) are ignored and counted. If the file is shorter than `pgoff + len` only the
//! bytes that exist are mapped: the rest of such a mapping faults on access and so is never code.

use std::path::{Path, PathBuf};

use super::{FileCache, Image, LoadError, Section};

/// A perf `PERF_RECORD_MMAP` or `PERF_RECORD_MMAP2` record, reduced to what an image needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmapRecord {
    /// Process id (`u32::MAX`, i.e. -1, for kernel mappings).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Start address of the mapping.
    pub addr: u64,
    /// Length of the mapping.
    pub len: u64,
    /// File offset mapped at `addr`.
    pub pgoff: u64,
    /// The mapped file's path as recorded (or a pseudo name: `[vdso]`, `//anon`, …).
    pub filename: String,
    /// The mapping is executable: `prot & PROT_EXEC` for `MMAP2`, no `PERF_RECORD_MISC_MMAP_DATA`
    /// flag for `MMAP`.
    pub exec: bool,
}

/// A mapping whose bytes could not be found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingImage {
    /// The recorded file name.
    pub filename: String,
    /// Start address of the mapping.
    pub addr: u64,
    /// Length of the mapping.
    pub len: u64,
    /// File offset mapped at `addr`.
    pub pgoff: u64,
    /// Why: the paths tried and the last error, or what is wrong with the record.
    pub reason: String,
}

/// A function that maps a recorded file name to a local file, or `None` to use the default search.
pub type RemapFn<'a> = &'a dyn Fn(&str) -> Option<PathBuf>;

/// How to select records and find their files.
#[derive(Default, Clone)]
pub struct MmapOptions<'a> {
    /// Only records of this process (`None`: all user-space records).
    pub pid: Option<u32>,
    /// Roots to search, each joined with the recorded absolute path (like `perf --symfs`).
    pub symfs: Vec<PathBuf>,
    /// Asked first for every record's file name.
    pub remap: Option<RemapFn<'a>>,
    /// Also map non-executable records (data), e.g. for memory reads.
    pub include_data: bool,
}

impl std::fmt::Debug for MmapOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmapOptions")
            .field("pid", &self.pid)
            .field("symfs", &self.symfs)
            .field("remap", &self.remap.map(|_| "fn"))
            .field("include_data", &self.include_data)
            .finish()
    }
}

/// The image built from sideband records, with everything that did not make it in.
#[derive(Debug, Clone, Default)]
pub struct MmapImage {
    /// The mapped bytes.
    pub image: Image,
    /// Records whose files were not found (or are unusable), in record order.
    pub missing: Vec<MissingImage>,
    /// Kernel records ignored.
    pub ignored_kernel: usize,
    /// Non-executable records skipped (when `include_data` is off).
    pub ignored_data: usize,
    /// Records of other processes skipped by the pid filter.
    pub ignored_other_pid: usize,
}

fn is_kernel(r: &MmapRecord) -> bool {
    r.pid == u32::MAX
        || r.filename.starts_with("[kernel.kallsyms]")
        || r.filename.starts_with("[guest.kernel")
}

/// Candidate local paths for a recorded name.
fn candidates(name: &str, opts: &MmapOptions<'_>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(remap) = opts.remap {
        if let Some(p) = remap(name) {
            out.push(p);
        }
    }
    // perf records unlinked files as "/path (deleted)"; the file may exist again at its path.
    let plain = name.strip_suffix(" (deleted)").unwrap_or(name);
    if plain.starts_with('/') {
        for root in &opts.symfs {
            out.push(root.join(plain.trim_start_matches('/')));
        }
        out.push(PathBuf::from(plain));
    }
    out
}

impl Image {
    /// Builds an image from `MMAP`/`MMAP2` records (see the module docs for the search rules).
    pub fn from_mmaps<'r>(
        records: impl IntoIterator<Item = &'r MmapRecord>,
        opts: &MmapOptions<'_>,
    ) -> MmapImage {
        let mut out = MmapImage::default();
        let mut files = FileCache::new();
        for r in records {
            if is_kernel(r) {
                out.ignored_kernel += 1;
                continue;
            }
            if opts.pid.is_some_and(|pid| pid != r.pid) {
                out.ignored_other_pid += 1;
                continue;
            }
            if !r.exec && !opts.include_data {
                out.ignored_data += 1;
                continue;
            }
            let missing = |reason: String| MissingImage {
                filename: r.filename.clone(),
                addr: r.addr,
                len: r.len,
                pgoff: r.pgoff,
                reason,
            };
            if r.len == 0 {
                continue;
            }
            let paths = candidates(&r.filename, opts);
            if paths.is_empty() {
                out.missing.push(missing(
                    "no file for this pseudo or anonymous mapping".to_string(),
                ));
                continue;
            }
            let mut errors = Vec::new();
            let mut found = None;
            for p in &paths {
                match files.get(p) {
                    Ok(bytes) => {
                        found = Some((p, bytes));
                        break;
                    }
                    Err(LoadError::Io { source, .. }) => {
                        errors.push(format!("{}: {source}", p.display()))
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
            let Some((path, bytes)) = found else {
                out.missing.push(missing(errors.join("; ")));
                continue;
            };
            let file_len = bytes.len() as u64;
            if r.pgoff >= file_len {
                out.missing.push(missing(format!(
                    "{}: offset {:#x} is past the end of the file ({file_len:#x} bytes)",
                    path.display(),
                    r.pgoff
                )));
                continue;
            }
            let len = r.len.min(file_len - r.pgoff);
            let section = Section {
                addr: r.addr,
                bytes,
                offset: r.pgoff as usize,
                len: len as usize,
                origin: std::sync::Arc::from(display_path(path).as_str()),
            };
            if let Err(e) = out.image.add(section) {
                out.missing.push(missing(e.to_string()));
            }
        }
        out
    }
}

fn display_path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}
