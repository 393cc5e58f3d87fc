//! Per-thread output of the QEMU capture: the encoder's bytes go through a ToPA output ring
//! (the same model the other software capture writes through) and are drained into one file per
//! guest thread in the recording directory, with loss counted.
//!
//! Files of a recording directory (`PID` = guest process, `TID` = guest thread):
//!
//! * `PID-TID.pt` — the thread's Intel PT stream (raw packets, starting with PSB+);
//! * `PID-TID.json` — [`ThreadMeta`], written when the thread's stream ends;
//! * `PID-TID.insns` — test mode only: every instruction address QEMU started executing on the
//!   thread, little-endian `u64`s;
//! * `PID.maps` — the process's memory map when it started (`/proc/self/maps` of the QEMU
//!   process after a `# snapshot start guest_base=B` line), then one `# mmap ADDR LEN OFFSET PATH`
//!   line per executable file mapping the guest made;
//! * `clock` — the global instruction clock the TSC packets come from (a shared `u64`);
//! * `exit`, `pause`, `watch` — a live session's shared gates ([`EXIT_FILE`], [`PAUSE_FILE`],
//!   [`WATCH_FILE`]);
//! * `plugin.json` — [`PluginMeta`]; `launch.json` — what ptrewind ran.
//!
//! Files are created with `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0600: nothing is written
//! through a file or link someone else put there.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::tracer::TracerStats;
use crate::ring::{BuildError, Capabilities, IntOn, Topa, TraceSink, TraceSource};

/// The exit gate (`exit_stop=on`): the plugin holds the traced process's `exit_group` here
/// until ptrewind lets it go, so the end of the program is a place in its history while the
/// process is still alive. Native-endian `u64` words: [`exit_gate`].
pub const EXIT_FILE: &str = "exit";

/// Words of the [`EXIT_FILE`].
pub mod exit_gate {
    /// [`WAITING`] or [`RELEASED`] (0: nobody exited yet).
    pub const STATE: usize = 0;
    /// The thread that called `exit_group`.
    pub const TID: usize = 1;
    /// The system call number.
    pub const NUM: usize = 2;
    /// Its six arguments (`rdi rsi rdx r10 r8 r9`).
    pub const ARGS: usize = 3;
    /// Size of the file in bytes.
    pub const SIZE: u64 = 16 * 8;
    /// A thread waits at its `exit_group`.
    pub const WAITING: u64 = 1;
    /// ptrewind lets it exit (set before any exit, after a detach: no exit is held).
    pub const RELEASED: u64 = 2;
}

/// The pause gate (`pause=on`, the live backend): while the debugger has the program stopped,
/// the other guest threads wait at their next block start (QEMU 7.2's user-mode gdbstub stops
/// only the thread that reports, and two threads inside the stub at once garble the protocol).
/// Native-endian `u64` words: [`pause_gate`].
pub const PAUSE_FILE: &str = "pause";

/// Words of the [`PAUSE_FILE`].
pub mod pause_gate {
    /// Set by ptrewind: 0, every thread runs; otherwise every thread waits except the one
    /// [`encode`] names.
    pub const GATE: usize = 0;
    /// Set by the plugin: the thread (0: none) about to run a block after which it may reach a
    /// breakpoint; the others wait until it has passed (so that two threads do not reach the
    /// gdbstub at once). Waits for a claim are bounded (QEMU's exclusive sections need every
    /// thread to leave its block).
    pub const CLAIM: usize = 1;
    /// The number of breakpoint addresses that follow (set by ptrewind).
    pub const NBPS: usize = 2;
    /// The breakpoint addresses.
    pub const BPS: usize = 3;
    /// Room for breakpoint addresses.
    pub const MAX_BPS: usize = 64;
    /// A counter ptrewind increments to let every held thread run the one block it waits at
    /// (QEMU's exclusive work during a single step needs every thread out of its block; a
    /// thread then waits again at its next block start).
    pub const PULSE: usize = BPS + MAX_BPS;
    /// Non-zero while ptrewind rewrites the breakpoint list: a thread held right before a
    /// breakpoint of the list stays held meanwhile (the list is briefly incomplete).
    pub const BPS_BUSY: usize = PULSE + 1;
    /// Then two words per vCPU index: the id of the thread waiting there (0: none) and the
    /// guest PC it waits at (the start of the block it has not run yet, or a breakpoint inside
    /// a block, see [`BPS`]; 0: at the return of a system call, where QEMU's own PC is right).
    pub const SLOTS: usize = BPS_BUSY + 1;
    /// vCPU indexes with a slot.
    pub const MAX_SLOTS: usize = 4096;
    /// Size of the file in bytes.
    pub const SIZE: u64 = ((SLOTS + 2 * MAX_SLOTS) * 8) as u64;
    /// The gate word: `None` opens it; `Some(tid)` holds every thread but `tid` (0: all).
    pub fn encode(run: Option<u32>) -> u64 {
        run.map_or(0, |tid| 1 | (u64::from(tid) << 1))
    }
}

/// The watchpoints of a live session (mapped by the plugin with `pause=on`): the ranges
/// ptrewind watches and, per vCPU, the access that hit one. While the list is empty no block is
/// translated with memory callbacks (programs without watchpoints pay nothing); ptrewind makes
/// QEMU flush its translations when the list changes. Native-endian `u64` words:
/// [`watch_gate`].
pub const WATCH_FILE: &str = "watch";

/// Words of the [`WATCH_FILE`].
pub mod watch_gate {
    /// The number of watchpoints that follow (set by ptrewind, after them).
    pub const COUNT: usize = 0;
    /// Three words per watchpoint: address, length, kind ([`WRITE`] | [`READ`]).
    pub const WATCHES: usize = 1;
    /// Room for watchpoints.
    pub const MAX_WATCHES: usize = 32;
    /// Set by ptrewind: the thread a single step runs (0: none). While it is set, another
    /// thread's hit waits (the held threads are let out of their blocks in short pulses during a
    /// step; a second thread in the stub would read the debugger's packets too).
    pub const STEP: usize = WATCHES + 3 * MAX_WATCHES;
    /// Then four words per vCPU index (a hit slot): the thread that hit (0: none; set last by
    /// the plugin, cleared by ptrewind when it reports the hit), the lowest watched address
    /// accessed, the access ([`WRITE`] or [`READ`]) and the address of the accessing
    /// instruction.
    pub const HITS: usize = STEP + 1;
    /// Words per hit slot.
    pub const HIT_WORDS: usize = 4;
    /// vCPU indexes with a hit slot.
    pub const MAX_SLOTS: usize = 4096;
    /// Size of the file in bytes.
    pub const SIZE: u64 = ((HITS + HIT_WORDS * MAX_SLOTS) * 8) as u64;
    /// Kind bit: stores.
    pub const WRITE: u64 = 1;
    /// Kind bit: loads.
    pub const READ: u64 = 2;
}

/// The shared global instruction clock (8 bytes, native-endian `u64`).
pub const CLOCK_FILE: &str = "clock";
/// [`PluginMeta`].
pub const PLUGIN_FILE: &str = "plugin.json";
/// What ptrewind launched ([`super::recording::LaunchMeta`]).
pub const LAUNCH_FILE: &str = "launch.json";

/// Creates `path` for writing, refusing to follow or reuse an existing file or link.
pub fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// The stream file of thread `tid` of process `pid` in `dir`.
pub fn stream_path(dir: &Path, pid: u32, tid: u32, ext: &str) -> PathBuf {
    dir.join(format!("{pid}-{tid}.{ext}"))
}

/// A gap in a stream file: bytes the ring lost before they were drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// Offset in the file where the bytes after the gap start.
    pub file_offset: u64,
    /// Stream bytes lost there.
    pub lost: u64,
}

/// Written beside each thread's stream when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadMeta {
    /// Guest process id.
    pub pid: u32,
    /// Guest thread id.
    pub tid: u32,
    /// QEMU's vCPU index of the thread.
    pub vcpu: u32,
    /// Bytes in the stream file.
    pub bytes: u64,
    /// Bytes lost by the ring (never drained in time).
    pub lost: u64,
    /// Where in the file the losses are.
    pub gaps: Vec<Gap>,
    /// How the stream ended: `exit` (the thread exited), `exec`, `process-exit` (still running when the process ended).
    pub end: String,
    /// This thread ended the process (QEMU ran the plugin's `atexit` on it: its `exit_group`,
    /// or the fatal signal it took). False in recordings made before the field existed.
    #[serde(default)]
    pub ended_process: bool,
    /// What the tracer saw.
    pub tracer: TracerStats,
    /// The first error writing the stream, if any (the stream stops there).
    pub error: Option<String>,
}

/// Written once per recording directory by the plugin when it loads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginMeta {
    /// The plugin API version the plugin was built for.
    pub api_version: i32,
    /// The oldest and newest API versions this QEMU supports.
    pub qemu_api: (i32, i32),
    /// The guest architecture QEMU reported.
    pub target: String,
    /// Precise mode (reached-instruction counters) on.
    pub precise: bool,
    /// Test mode (per-instruction log) on.
    pub log_insns: bool,
}

/// Output ring sizes: 8 regions of 64 KiB, PMI on each; drained at half full, so nothing is lost
/// unless a write is larger than the ring.
pub const REGION_SIZE: u64 = 64 * 1024;
/// Number of ToPA regions.
pub const REGIONS: usize = 8;

/// One thread's ToPA ring and stream file.
#[derive(Debug)]
pub struct ThreadOutput {
    ring: Topa,
    file: File,
    path: PathBuf,
    bytes: u64,
    lost: u64,
    gaps: Vec<Gap>,
    error: Option<String>,
}

impl ThreadOutput {
    /// Creates the stream file `path` (see [`create_private`]) and its ring.
    pub fn create(path: PathBuf) -> io::Result<ThreadOutput> {
        let file = create_private(&path)?;
        let ring = Topa::circular(
            Capabilities::default(),
            &[REGION_SIZE; REGIONS],
            IntOn::Every,
        )
        .map_err(|e: BuildError| io::Error::other(e.to_string()))?;
        Ok(ThreadOutput {
            ring,
            file,
            path,
            bytes: 0,
            lost: 0,
            gaps: Vec::new(),
            error: None,
        })
    }

    /// Writes encoder output through the ring, draining it to the file first when it would not
    /// fit and after it when half full.
    pub fn write(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let room = self.ring.capacity().saturating_sub(self.ring.pending());
        if bytes.len() as u64 > room {
            self.drain();
        }
        self.ring.write(bytes);
        if self.ring.pending() >= self.ring.capacity() / 2 {
            self.drain();
        }
    }

    /// Moves everything in the ring into the file.
    pub fn drain(&mut self) {
        let file = &mut self.file;
        let mut written = 0u64;
        let mut err = None;
        let mut first_gap = None;
        let report = self.ring.drain_with(&mut |chunk| {
            if err.is_some() {
                return;
            }
            if first_gap.is_none() {
                first_gap = Some(chunk.stream_offset);
            }
            match file.write_all(chunk.bytes) {
                Ok(()) => written += chunk.bytes.len() as u64,
                Err(e) => err = Some(e),
            }
        });
        if report.lost() > 0 {
            self.gaps.push(Gap {
                file_offset: self.bytes,
                lost: report.lost(),
            });
            self.lost += report.lost();
        }
        self.bytes += written;
        if let Some(e) = err
            && self.error.is_none()
        {
            self.error = Some(format!("writing {}: {e}", self.path.display()));
        }
    }

    /// Bytes written to the file so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes lost so far.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Gaps so far.
    pub fn gaps(&self) -> &[Gap] {
        &self.gaps
    }

    /// The first write error, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

/// Writes `value` as JSON to the private file `path`, replacing an earlier version (never
/// following a link).
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    // Written beside and renamed over: ptrewind reads these files at every stop while the
    // program runs, and a thread ending then must not be seen as an empty or half-written file.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let text = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    f.write_all(&text)?;
    drop(f);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JSON file is replaced whole (a reader never sees it empty or half-written), nothing is
    /// left beside it, and a link planted at its name is replaced, not written through.
    #[test]
    fn json_files_are_replaced_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("1-2.json");
        write_json(&path, &vec![1u32; 100]).expect("first");
        write_json(&path, &vec![2u32; 3]).expect("second");
        let back: Vec<u32> =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
        assert_eq!(back, vec![2; 3]);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("1-2.json")]);
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"keep").expect("write");
        let link = dir.path().join("3-4.json");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        write_json(&link, &1u32).expect("over the link");
        assert_eq!(std::fs::read(&target).expect("read"), b"keep");
        assert!(!std::fs::symlink_metadata(&link).expect("meta").is_symlink());
    }

    #[test]
    fn output_drains_everything_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("1-1.pt");
        let mut out = ThreadOutput::create(path.clone()).expect("create");
        let mut expected = Vec::new();
        for i in 0..5000u32 {
            let chunk: Vec<u8> = (0..(i % 700)).map(|j| (i + j) as u8).collect();
            out.write(&chunk);
            expected.extend_from_slice(&chunk);
        }
        out.drain();
        assert_eq!(out.lost(), 0);
        assert_eq!(out.bytes(), expected.len() as u64);
        assert_eq!(std::fs::read(&path).expect("read"), expected);
        // The file is never reused.
        assert!(ThreadOutput::create(path).is_err());
    }

    #[test]
    fn tail_reads_back_what_was_mirrored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("1-1.tail");
        let mut t = Tail::create(&path).expect("create");
        let b = super::super::BlockInfo::new(&[0x1000, 0x1002], &[0x90]).expect("block");
        t.reset(4096);
        t.mirror(&[1, 2, 3]);
        t.mirror(&[1, 2, 3, 4, 5]);
        t.set_state(true, Some((&b, 7)), (0b101, 3));
        let read = |p: &Path| TailState::read(&std::fs::read(p).expect("read")).expect("tail");
        assert_eq!(
            read(&path),
            TailState {
                file_offset: 4096,
                bytes: vec![1, 2, 3, 4, 5],
                tracing: true,
                in_flight: Some((0x1000, 2, u64::MAX, 7)),
                tnt: (0b101, 3),
            }
        );
        t.reset(4101);
        t.set_state(false, None, (0, 0));
        let r = read(&path);
        assert_eq!((r.file_offset, r.bytes.len(), r.tracing), (4101, 0, false));
        assert_eq!(r.in_flight, None);
        assert!(TailState::read(&[0u8; 200]).is_none(), "no magic, no tail");
    }
}

/// The shared counter file of precise mode: one `u64` per translated block.
pub const COUNTERS_FILE: &str = "counters";
/// Slots of the counter file (a sparse file: 128 MiB of address space, pages used on demand).
pub const COUNTER_SLOTS: u64 = 1 << 24;

/// Size of a tail file's header.
pub const TAIL_HEADER: usize = 128;
/// Bytes of encoder output a tail file holds (more than the plugin ever keeps unwritten).
pub const TAIL_CAPACITY: usize = 64 * 1024;
const TAIL_MAGIC: u64 = u64::from_le_bytes(*b"PTRWTAIL");

/// A thread's in-flight state, kept in a shared file mapping (`PID-TID.tail`) so that it
/// survives QEMU dying without any callback (QEMU 7.2 runs no plugin code when the guest dies of
/// a signal): the encoder output not yet in the stream file, the pending TNT bits, and the block
/// executing now with its counter. [`TailState::read`] reads it back.
#[derive(Debug)]
pub struct Tail {
    map: memmap2::MmapMut,
    /// The header words of `map` (written after every block: plain stores, no bounds checks).
    header: *mut u64,
    mirrored: usize,
}

/// Header words of a tail file.
mod word {
    pub const MAGIC: usize = 0;
    pub const FILE_OFFSET: usize = 1;
    pub const LEN: usize = 2;
    pub const FLAGS: usize = 3;
    pub const START: usize = 4;
    pub const INSNS: usize = 5;
    pub const COUNTER: usize = 6;
    pub const SNAPSHOT: usize = 7;
    pub const TNT_BITS: usize = 8;
    pub const TNT_COUNT: usize = 9;
}

const FLAG_IN_FLIGHT: u64 = 1;
const FLAG_TRACING: u64 = 2;

impl Tail {
    /// Creates and maps the tail file `path`.
    pub fn create(path: &Path) -> io::Result<Tail> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        f.set_len((TAIL_HEADER + TAIL_CAPACITY) as u64)?;
        // SAFETY: a shared mapping of a file this process just created privately (mode 0600,
        // O_EXCL); nobody else writes it while we run, and readers only read it after we are
        // gone.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&f)? };
        let header = map.as_mut_ptr().cast::<u64>();
        let mut t = Tail {
            map,
            header,
            mirrored: 0,
        };
        t.put(word::MAGIC, TAIL_MAGIC);
        Ok(t)
    }

    #[inline]
    fn put(&mut self, w: usize, v: u64) {
        debug_assert!(w < TAIL_HEADER / 8);
        // SAFETY: `header` points at the start of `map` (page-aligned, so aligned for `u64`),
        // which `self` owns and keeps mapped; `w` is a header word, inside the mapping.
        unsafe { self.header.add(w).write(v) }
    }

    /// Everything up to stream-file offset `file_offset` is in the stream file.
    pub fn reset(&mut self, file_offset: u64) {
        self.put(word::LEN, 0);
        self.put(word::FILE_OFFSET, file_offset);
        self.mirrored = 0;
    }

    /// Mirrors the encoder's unwritten output (the bytes after the last [`Tail::reset`]).
    #[inline]
    pub fn mirror(&mut self, pending: &[u8]) {
        let n = pending.len().min(TAIL_CAPACITY);
        if n > self.mirrored {
            self.map[TAIL_HEADER + self.mirrored..TAIL_HEADER + n]
                .copy_from_slice(&pending[self.mirrored..n]);
            self.mirrored = n;
            self.put(word::LEN, n as u64);
        }
    }

    /// Records the in-flight block and the encoder's state (after every block).
    #[inline]
    pub fn set_state(
        &mut self,
        tracing: bool,
        in_flight: Option<(&super::BlockInfo, u64)>,
        tnt: (u64, u8),
    ) {
        let mut flags = if tracing { FLAG_TRACING } else { 0 };
        if let Some((b, snapshot)) = in_flight {
            flags |= FLAG_IN_FLIGHT;
            self.put(word::START, b.start);
            self.put(word::INSNS, u64::from(b.insns));
            self.put(word::COUNTER, b.counter_index().unwrap_or(u64::MAX));
            self.put(word::SNAPSHOT, snapshot);
        }
        self.put(word::FLAGS, flags);
        self.put(word::TNT_BITS, tnt.0);
        self.put(word::TNT_COUNT, u64::from(tnt.1));
    }
}

/// A tail file read back (see [`Tail`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TailState {
    /// Stream-file offset the unwritten bytes follow.
    pub file_offset: u64,
    /// The encoder output that never reached the stream file.
    pub bytes: Vec<u8>,
    /// Packet generation was on.
    pub tracing: bool,
    /// The block executing when the thread stopped: (start, instructions, counter index or
    /// `u64::MAX`, counter value at its start).
    pub in_flight: Option<(u64, u32, u64, u64)>,
    /// TNT bits decided but not written: (bits, count).
    pub tnt: (u64, u8),
}

/// Appends a TSC packet of the global clock `now` (if known) to a stream being completed where
/// its thread stopped: how long the thread's last run lasted, at most (see
/// [`ThreadClock::run_until`](crate::history::ThreadClock::run_until)).
pub fn stamp_end(now: Option<u64>, out: &mut Vec<u8>) {
    use crate::packet::{Packet, encode_packet};
    if let Some(t) = now {
        let _ = encode_packet(
            &Packet::Tsc {
                tsc: t & ((1 << 56) - 1),
            },
            out,
        );
    }
}

/// A stream of the tests that complete streams: PSB+ (with a TSC of `tsc`, if given) and
/// TIP.PGE at 0x1000, and the tail of a thread running the block there (`insns` instructions,
/// its counter at index `counter` from 0), nothing of it written yet.
#[cfg(test)]
pub(crate) fn started_stream(tsc: Option<u64>, insns: u32, counter: u64) -> (Vec<u8>, TailState) {
    use crate::packet::{Encoder, IpKind, Packet, encode_packet};
    let mut enc = Encoder::new();
    let mut trace = Vec::new();
    enc.psb(&mut trace);
    if let Some(tsc) = tsc {
        let _ = encode_packet(&Packet::Tsc { tsc }, &mut trace);
    }
    let _ = encode_packet(&Packet::PsbEnd, &mut trace);
    let _ = enc.ip_packet(IpKind::TipPge, Some(0x1000), &mut trace);
    let tail = TailState {
        file_offset: trace.len() as u64,
        bytes: Vec::new(),
        tracing: true,
        in_flight: Some((0x1000, insns, counter, 0)),
        tnt: (0, 0),
    };
    (trace, tail)
}

impl TailState {
    /// Parses a tail file's contents; `None` if it is not one.
    pub fn read(data: &[u8]) -> Option<TailState> {
        let w = |i: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(
                data.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        if w(word::MAGIC)? != TAIL_MAGIC {
            return None;
        }
        let len = (w(word::LEN)? as usize).min(TAIL_CAPACITY);
        let flags = w(word::FLAGS)?;
        Some(TailState {
            file_offset: w(word::FILE_OFFSET)?,
            bytes: data.get(TAIL_HEADER..TAIL_HEADER + len)?.to_vec(),
            tracing: flags & FLAG_TRACING != 0,
            in_flight: if flags & FLAG_IN_FLIGHT != 0 {
                Some((
                    w(word::START)?,
                    w(word::INSNS)? as u32,
                    w(word::COUNTER)?,
                    w(word::SNAPSHOT)?,
                ))
            } else {
                None
            },
            tnt: (w(word::TNT_BITS)?, w(word::TNT_COUNT)?.min(6) as u8),
        })
    }
}
