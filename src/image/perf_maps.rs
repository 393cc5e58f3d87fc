//! Images from perf `MMAP`/`MMAP2` sideband records.
//!
//! Each record says "the file `filename`, from byte `pgoff`, is mapped at `[addr, addr+len)`". The
//! image maps exactly those file bytes there, in record order (a later mapping replaces what it
//! overlaps, as `mmap(MAP_FIXED)` does), which is what perf and libipt's sideband decoder do.
//!
//! # Over time
//! An image is one layout: [`PerfSideband::mmaps`] gives the one after the last record. What is
//! followed: a later mapping replaces the overlapped part of an earlier one (re-`mmap`,
//! `dlclose` then `dlopen` at the same address), and an `exec` (a `PERF_RECORD_COMM` with the
//! exec flag, see [`PerfSideband::read`]) drops every earlier mapping of that process. A trace
//! that crosses an `exec` gets one image per address space: [`PerfSideband::execs`] and
//! [`PerfSideband::space_mmaps`] give each program's records (by sample time), and
//! `store::exec_cut` places the exec in the thread's trace (the CLI joins them, see
//! `ptrewind decode`). What is not followed:
//! `munmap` (perf records none), and code that changes *during* the trace (a library unloaded and
//! another loaded at the same address while tracing): both generations cannot be in one image, so
//! the trace before the change is decoded against the later code. A decoder that must follow that
//! would rebuild its image at each record's timestamp.
//!
//! # Finding files
//! A [`MmapOptions::remap`] function is asked first (it may also supply files for pseudo
//! mappings such as `[vdso]`); then each [`MmapOptions::symfs`] root joined with the recorded
//! absolute path (like `perf --symfs`); then the recorded path itself; then the recorded file's
//! base name in each of [`MmapOptions::search_dirs`] (a flat directory of binaries). When the
//! recording names a build id for the file ([`MmapOptions::build_ids`]: perf's `HEADER_BUILD_ID`
//! table, or an `MMAP2` that carries one) and a candidate has a `.note.gnu.build-id`, the two must
//! match; a mismatching candidate is skipped (the next one is tried) and named in the reason if
//! none fits, so a wrong binary is never used silently.
//!
//! A record whose file is not found, or whose offset lies past the file's end, is returned in
//! [`MmapImage::missing`] — never skipped silently. Kernel records (`[kernel.kallsyms]…`, kernel
//! modules, pid -1) are ignored and counted. If the file is shorter than `pgoff + len` only the
//! bytes that exist are mapped: the rest of such a mapping faults on access and so is never code.
//! Every ELF file found is also returned, placed where it was mapped ([`MmapImage::elfs`]), for
//! symbols.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{FileCache, Image, LoadError, LoadedElf, Section, SectionBytes};
use crate::perf::data::{PerfData, Record, RecordData};

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
    /// Directories searched for the recorded file's base name, after the paths above.
    pub search_dirs: Vec<PathBuf>,
    /// Build ids the recording gives for file names (as recorded); a found file with a different
    /// `.note.gnu.build-id` is not used.
    pub build_ids: HashMap<String, Vec<u8>>,
    /// Map the files instead of reading them ([`super::FileCache::mapping`]): for one-shot
    /// decoding only (`ptrewind decode`), see [`super::map_file`].
    pub map_files: bool,
}

impl std::fmt::Debug for MmapOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmapOptions")
            .field("pid", &self.pid)
            .field("symfs", &self.symfs)
            .field("remap", &self.remap.map(|_| "fn"))
            .field("include_data", &self.include_data)
            .field("search_dirs", &self.search_dirs)
            .field("build_ids", &self.build_ids.len())
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
    /// The ELF files found, each placed where its first executable mapping puts it (one per
    /// file), for symbols. Files that are not ELF (raw dumps, `[vdso]` supplied as bytes) are
    /// mapped but not listed.
    pub elfs: Vec<LoadedElf>,
}

fn is_kernel(r: &MmapRecord) -> bool {
    r.pid == u32::MAX
        || r.filename.starts_with("[kernel.kallsyms]")
        || r.filename.starts_with("[guest.kernel")
}

/// Whether a recorded name is not a file: `[vdso]`, `[stack]`, `[heap]`, `//anon`, ...
fn is_pseudo(name: &str) -> bool {
    name.starts_with('[') || name.starts_with("//")
}

/// Candidate local paths for a recorded name.
fn candidates(name: &str, opts: &MmapOptions<'_>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(remap) = opts.remap {
        if let Some(p) = remap(name) {
            out.push(p);
        }
    }
    if is_pseudo(name) {
        return out;
    }
    // perf records unlinked files as "/path (deleted)"; the file may exist again at its path.
    let plain = name.strip_suffix(" (deleted)").unwrap_or(name);
    if plain.starts_with('/') {
        for root in &opts.symfs {
            out.push(root.join(plain.trim_start_matches('/')));
        }
        out.push(PathBuf::from(plain));
        if let Some(base) = Path::new(plain).file_name() {
            for dir in &opts.search_dirs {
                out.push(dir.join(base));
            }
        }
    }
    out
}

/// The `.note.gnu.build-id` of an ELF file, if it has one.
pub fn elf_build_id(bytes: &[u8]) -> Option<Vec<u8>> {
    use object::Object;
    let file = object::File::parse(bytes).ok()?;
    file.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// Whether a build id from perf (a 20-byte field, zero-padded when the id is shorter and the
/// record does not give its size) names the same file as the id in the file.
fn same_build_id(recorded: &[u8], file: &[u8]) -> bool {
    recorded == file
        || (recorded.len() > file.len()
            && recorded.starts_with(file)
            && recorded[file.len()..].iter().all(|&b| b == 0))
}

/// Lowercase hex of a build id, as perf prints it.
pub fn hex_id(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Finds the local file for a recorded name: the first candidate that can be read and whose build
/// id (when both sides have one) matches. `Err` lists every candidate tried and why it failed.
fn find_file(
    name: &str,
    opts: &MmapOptions<'_>,
    files: &mut FileCache,
) -> Result<(PathBuf, SectionBytes), String> {
    let paths = candidates(name, opts);
    if paths.is_empty() {
        return Err(match name {
            "[vdso]" | "[vsyscall]" => format!(
                "{name} of the recording machine is not in perf.data (dump it there and give it \
                 with --raw FILE:ADDR)"
            ),
            _ if is_pseudo(name) => {
                "anonymous memory (stack, heap or generated code): its contents are not in \
                 perf.data"
                    .to_string()
            }
            _ => "not an absolute path: nothing to search for".to_string(),
        });
    }
    let wanted = opts.build_ids.get(name);
    let mut errors = Vec::new();
    for p in paths {
        // A device or FIFO named by a record (shared anonymous memory is recorded as
        // "/dev/zero (deleted)") would be read forever: only regular files hold code.
        match std::fs::metadata(&p) {
            Ok(m) if !m.is_file() => {
                errors.push(format!("{}: not a regular file", p.display()));
                continue;
            }
            _ => {}
        }
        match files.get(&p) {
            Ok(bytes) => {
                if let (Some(want), Some(have)) = (wanted, elf_build_id(&bytes)) {
                    if !same_build_id(want, &have) {
                        errors.push(format!(
                            "{}: build id {} differs from the recorded {}",
                            p.display(),
                            hex_id(&have),
                            hex_id(want)
                        ));
                        continue;
                    }
                }
                return Ok((p, bytes));
            }
            Err(LoadError::Io { source, .. }) => errors.push(format!("{}: {source}", p.display())),
            Err(e) => errors.push(e.to_string()),
        }
    }
    Err(errors.join("; "))
}

impl Image {
    /// Builds an image from `MMAP`/`MMAP2` records (see the module docs for the search rules).
    pub fn from_mmaps<'r>(
        records: impl IntoIterator<Item = &'r MmapRecord>,
        opts: &MmapOptions<'_>,
    ) -> MmapImage {
        let mut out = MmapImage::default();
        let mut files = if opts.map_files {
            FileCache::mapping()
        } else {
            FileCache::new()
        };
        let mut resolved: HashMap<String, Result<(PathBuf, SectionBytes), String>> = HashMap::new();
        let mut placed: HashMap<PathBuf, usize> = HashMap::new();
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
            let found = match resolved.get(&r.filename) {
                Some(f) => f.clone(),
                None => {
                    let f = find_file(&r.filename, opts, &mut files);
                    resolved.insert(r.filename.clone(), f.clone());
                    f
                }
            };
            let (path, bytes) = match found {
                Ok(f) => f,
                Err(reason) => {
                    out.missing.push(missing(reason));
                    continue;
                }
            };
            if r.exec && !placed.contains_key(&path) {
                let elf = LoadedElf::from_bytes(&path, bytes.clone(), None)
                    .ok()
                    .and_then(|elf| elf.placed_at(r.addr, r.pgoff));
                if let Some(elf) = elf {
                    placed.insert(path.clone(), out.elfs.len());
                    out.elfs.push(elf);
                }
            }
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
                origin: std::sync::Arc::from(display_path(&path).as_str()),
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

/// `PERF_RECORD_MISC_MMAP_DATA`: an `MMAP` record of a non-executable mapping.
const MISC_MMAP_DATA: u16 = 1 << 13;
/// `PROT_EXEC` in an `MMAP2` record's `prot`.
const PROT_EXEC: u32 = 4;

/// What the sideband records of a perf.data file say about the traced processes' code.
#[derive(Debug, Clone, Default)]
pub struct PerfSideband {
    /// The `MMAP`/`MMAP2` records in file order, without those an `exec` of their process
    /// superseded (see the [module docs](self)).
    pub mmaps: Vec<MmapRecord>,
    /// Build ids by recorded file name: the `HEADER_BUILD_ID` table (or its pipe-mode records)
    /// and `MMAP2` records that carry one.
    pub build_ids: HashMap<String, Vec<u8>>,
    /// Threads tracing started for (`PERF_RECORD_ITRACE_START`): pid, tid and, when the record
    /// says, the CPU.
    pub traced: Vec<(u32, u32, Option<u32>)>,
    /// Mappings dropped because their process called `exec` after them.
    pub superseded_by_exec: usize,
    /// Every `MMAP`/`MMAP2` record in file order with its sample time, none dropped: the
    /// mappings of each address space a process had ([`PerfSideband::space_mmaps`]).
    pub all_mmaps: Vec<(Option<u64>, MmapRecord)>,
    /// The `exec`s (`PERF_RECORD_COMM` with the exec flag), in file order.
    pub execs: Vec<ExecRecord>,
    /// Records that could not be decoded (skipped; counted so that nothing is lost silently).
    pub malformed: usize,
}

/// An `execve` the sideband recorded (`PERF_RECORD_COMM` with `PERF_RECORD_MISC_COMM_EXEC`):
/// from its time on, process `pid` runs another program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRecord {
    /// The process.
    pub pid: u32,
    /// The thread that called `execve` (after it, the process's only thread).
    pub tid: u32,
    /// The new program's name (`comm`, at most 15 bytes).
    pub comm: String,
    /// perf time of the record (its `sample_id`), if the recording has one.
    pub time: Option<u64>,
    /// How many `MMAP`/`MMAP2` records precede it in the file (index into
    /// [`PerfSideband::all_mmaps`]).
    pub mmaps_before: usize,
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl PerfSideband {
    /// Collects the sideband of `perf` in one pass over its records.
    ///
    /// A `PERF_RECORD_COMM` with the exec flag for process P drops P's earlier mappings: the
    /// kernel writes it after `exec` replaced the address space and before the new program's
    /// mappings, so what follows is the program that runs from then on.
    pub fn read(perf: &PerfData<'_>) -> Self {
        let mut out = PerfSideband::default();
        if let Ok(ids) = perf.build_ids() {
            for b in ids {
                out.build_ids.insert(lossy(b.filename), b.build_id.to_vec());
            }
        }
        for r in perf.records() {
            let Ok(Record {
                misc,
                data,
                sample_id,
                ..
            }) = r
            else {
                out.malformed += 1;
                continue;
            };
            match data {
                RecordData::Mmap {
                    pid,
                    tid,
                    addr,
                    len,
                    pgoff,
                    filename,
                } => {
                    let m = MmapRecord {
                        pid,
                        tid,
                        addr,
                        len,
                        pgoff,
                        filename: lossy(filename),
                        exec: misc & MISC_MMAP_DATA == 0,
                    };
                    out.all_mmaps.push((sample_id.time, m.clone()));
                    out.mmaps.push(m);
                }
                RecordData::Mmap2 {
                    pid,
                    tid,
                    addr,
                    len,
                    pgoff,
                    build_id,
                    prot,
                    filename,
                    ..
                } => {
                    let filename = lossy(filename);
                    if let Some(id) = build_id.filter(|id| !id.is_empty()) {
                        out.build_ids.insert(filename.clone(), id.to_vec());
                    }
                    let m = MmapRecord {
                        pid,
                        tid,
                        addr,
                        len,
                        pgoff,
                        filename,
                        exec: prot & PROT_EXEC != 0,
                    };
                    out.all_mmaps.push((sample_id.time, m.clone()));
                    out.mmaps.push(m);
                }
                RecordData::Comm {
                    pid,
                    tid,
                    comm,
                    exec: true,
                } => {
                    out.execs.push(ExecRecord {
                        pid,
                        tid,
                        comm: lossy(comm),
                        time: sample_id.time,
                        mmaps_before: out.all_mmaps.len(),
                    });
                    let before = out.mmaps.len();
                    out.mmaps.retain(|m| m.pid != pid);
                    out.superseded_by_exec += before - out.mmaps.len();
                }
                RecordData::ItraceStart { pid, tid } => {
                    out.traced.push((pid, tid, sample_id.cpu));
                }
                RecordData::BuildId(b) => {
                    out.build_ids.insert(lossy(b.filename), b.build_id.to_vec());
                }
                _ => {}
            }
        }
        out
    }

    /// The process whose code a trace stream shows, when the sideband tells: the pid of the
    /// traced thread `tid` (per-thread recording), else the one process tracing started for on
    /// `cpu` (or in the whole file). `None` when several processes qualify or none is known:
    /// then every process's mappings make up the image.
    pub fn pid_for_stream(&self, cpu: Option<u32>, tid: Option<u32>) -> Option<u32> {
        let user = |pid: u32| pid != 0 && pid != u32::MAX;
        if let Some(tid) = tid {
            let by_tid = self
                .traced
                .iter()
                .find(|t| t.1 == tid)
                .map(|t| t.0)
                .or_else(|| self.mmaps.iter().find(|m| m.tid == tid).map(|m| m.pid));
            if let Some(pid) = by_tid.filter(|&p| user(p)) {
                return Some(pid);
            }
        }
        let only = |it: &mut dyn Iterator<Item = u32>| {
            let mut pids: Vec<u32> = it.filter(|&p| user(p)).collect();
            pids.sort_unstable();
            pids.dedup();
            (pids.len() == 1).then(|| pids[0])
        };
        if let Some(cpu) = cpu {
            let on_cpu = self.traced.iter().filter(|t| t.2 == Some(cpu)).map(|t| t.0);
            if let Some(pid) = only(&mut on_cpu.clone()) {
                return Some(pid);
            }
        }
        only(&mut self.traced.iter().map(|t| t.0))
    }

    /// The `exec`s of process `pid`, in time order (file order where a time is missing).
    pub fn execs_of(&self, pid: u32) -> Vec<&ExecRecord> {
        let mut out: Vec<&ExecRecord> = self.execs.iter().filter(|e| e.pid == pid).collect();
        if out.iter().all(|e| e.time.is_some()) {
            out.sort_by_key(|e| e.time);
        }
        out
    }

    /// The mappings of process `pid`'s address space `k`: before its first `exec` (`k` = 0)
    /// or after its `k`-th ([`PerfSideband::execs_of`] order) and before the next. A record
    /// belongs to the space of the execs before it: by sample time when the record and every
    /// exec have one (perf writes each CPU's buffer in turn, so file order is not time order
    /// across CPUs), else by file order.
    pub fn space_mmaps(&self, pid: u32, k: usize) -> Vec<MmapRecord> {
        let execs = self.execs_of(pid);
        let timed = execs.iter().all(|e| e.time.is_some());
        self.all_mmaps
            .iter()
            .enumerate()
            .filter(|(_, (_, m))| m.pid == pid)
            .filter(|(index, (time, _))| {
                let space = match time {
                    Some(t) if timed => execs.iter().filter(|e| e.time <= Some(*t)).count(),
                    _ => execs.iter().filter(|e| e.mmaps_before <= *index).count(),
                };
                space == k
            })
            .map(|(_, (_, m))| m.clone())
            .collect()
    }

    /// [`MmapOptions::build_ids`] from this sideband (a copy: options outlive the file).
    pub fn build_id_map(&self) -> HashMap<String, Vec<u8>> {
        self.build_ids.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A record naming a device (shared anonymous memory appears as `/dev/zero (deleted)`)
    /// must be reported as missing, not read: reading `/dev/zero` never ends.
    #[test]
    fn device_files_are_not_read() {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let records = ["/dev/zero (deleted)", "/dev/null"].map(|name| MmapRecord {
                pid: 1,
                tid: 1,
                addr: 0x7000_0000,
                len: 0x1000,
                pgoff: 0,
                filename: name.to_string(),
                exec: true,
            });
            let opts = MmapOptions {
                include_data: true,
                ..MmapOptions::default()
            };
            let _ = tx.send(Image::from_mmaps(&records, &opts));
        });
        let out = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("from_mmaps did not return: it reads a device file");
        assert!(out.image.sections().is_empty());
        assert_eq!(out.missing.len(), 2);
        for (m, path) in out.missing.iter().zip(["/dev/zero", "/dev/null"]) {
            assert!(
                m.reason.contains(path) && m.reason.contains("not a regular file"),
                "{m:?}"
            );
        }
    }
}
