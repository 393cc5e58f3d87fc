//! The timeline: reverse execution over an indexed history, for a live process recorded by a
//! capture backend ([`LiveBackend`]) or for a recording replayed with no process at all (rr's
//! `ReplayTimeline` is the model). It knows no debugger protocol and no concrete backend: stops
//! are [`StopEvent`]s, state is [`X86Registers`] and bytes, and the server adapts them to GDB's
//! and LLDB's packets.
//!
//! The module is split by concern:
//!
//! * this file — [`Timeline`]: the history worker, the cursor (positions), stepping in both
//!   directions, breakpoint and watchpoint search, replaying forward, the hand-over to the live
//!   process at the present;
//! * `past` — what registers and memory the past shows, and the write searches of watchpoints;
//! * [`regfiles`] — the register files known at positions (start, stops);
//! * [`offline`] — `ptrewind replay`: a saved recording or a trace file, no process;
//! * [`save`] — the saved-recording format (`monitor save`), read back by [`offline`];
//! * [`files`] — the program's files as a debugger reads them (`/proc/PID/maps`, the
//!   executable and libraries a saved recording keeps);
//! * [`inspect`] — branches, function segments and symbols before the cursor (what
//!   `monitor history|calls|where` print) and the statistics `monitor stats` prints;
//! * [`threads`] — every thread of a recording in one global order (a selected thread);
//! * `live_threads` — the same for a live process's past, built from the backend's per-thread
//!   streams when the cursor leaves the present;
//! * `source_step` — where reverse-finish and reverse-next go from the decoded calls and
//!   returns (a past without a stack pointer);
//! * `diversion` — function calls the debugger makes at the present, run unrecorded.
//!
//! ## Live (the cursor is at the present)
//!
//! Forward `continue`/`stepi` run the process through the capture backend ([`LiveBackend`]). The software backend
//! single-steps and encodes every instruction as Intel PT packets (GDB's breakpoints are compared
//! with the PC after each instruction and never written into the process); the hardware backend
//! lets the process run at full speed with ordinary INT3 breakpoints while the CPU traces it. At
//! every stop the backend makes the trace complete up to the PC (the software backend closes it
//! with FUP + TIP.PGD; the hardware backend drains the AUX area, the stop waiting for the drain),
//! and the registers of the stop are kept: they are exact for that history position forever.
//!
//! ## The background pipeline
//!
//! The trace moves from the backend's buffer into the [`TraceStore`]; a [`HistoryWorker`]
//! thread, woken by every append that adds bytes, decodes what arrived and indexes the
//! [`History`](crate::history::History) (sync points at PSBs with instruction counts) while the
//! target runs. At a stop the worker is asked to finish the index and the stop is reported at
//! once: nothing waits for decoding. A request that needs the history (reverse steps and continues, replaying
//! forward, `monitor goto|history|calls|save|stats`) waits until the index covers the trace as
//! it was at the stop ([`Timeline::ensure_indexed`]) — at most [`INDEX_WAIT`] for a reverse
//! resume, [`MONITOR_INDEX_WAIT`] for a monitor command — and otherwise fails with a message
//! giving the decode lag, never hangs. When the index is complete, the history length is checked
//! against the instructions the backend counted (software backend) and the state log's; a
//! mismatch is kept and shown by `monitor stats`.
//!
//! With recording off (`monitor record off`) forward execution runs untraced. With a state log,
//! the state before such a run cannot be rebuilt: reverse execution then stops at the first
//! instruction recorded after it (the *floor*, shown by `monitor stats`), reporting
//! [`StopEvent::HistoryEnd`] at the beginning; PC-only replay has no floor.
//!
//! Stops are protocol-neutral [`StopEvent`]s: the server reports `HistoryEnd` as GDB's
//! `replaylog:begin`/`replaylog:end`, `Watch` as `watch:ADDR`, and so on.
//!
//! ## Replay (the cursor `n` is before the present)
//!
//! * The PC is always the history's instruction `n`.
//! * **With a state log** (software backend, `--state-log on`): all general-purpose registers are
//!   rebuilt by undoing from the present, vector/x87 registers from the log's snapshots or
//!   unavailable; memory is the live memory with the old value of every later write put back.
//! * **PC-only** (hardware backend, `ptrewind replay`, `--state-log off`): at a position where
//!   the registers were captured (the start of the recording, every stop of the live process, a
//!   saved recording's start, stops and end) the full register file is served (general-purpose
//!   registers only for a saved recording); at any other position
//!   RIP is the history's PC and every other register is unavailable ([`RegMask::ALL_BUT_PC`](crate::target::RegMask::ALL_BUT_PC);
//!   GDB prints `<unavailable>`). Memory reads are served only inside read-only, file-backed code
//!   mappings (which cannot have changed), from the code image; any other read is refused
//!   ([`TargetError::Memory`]). A present value is never shown as a past one. GDB cannot unwind
//!   there (no stack pointer): reverse-stepi and reverse-continue work as everywhere, and
//!   reverse-finish/reverse-next are done by the timeline from the decoded calls and returns
//!   (`source_step`; `monitor reverse-finish|reverse-next`, which ptrewind's GDB script runs
//!   for GDB's own commands).
//! * The live process's breakpoints are never visible (the ptrace target shows original code
//!   bytes while stopped). Writes to memory or registers in the past are refused.
//! * A reverse step moves to `n - 1` (at 0 or the floor: `HistoryEnd` at the beginning); a
//!   reverse continue to the last earlier instruction at a breakpoint address
//!   ([`History::rfind_with`](crate::history::History::rfind_with)), or to the floor with
//!   `HistoryEnd` at the beginning.
//! * Forward step/continue replay forward ([`History::find_with`](crate::history::History::find_with));
//!   reaching the present by a continue reports `HistoryEnd` at the end (GDB: "No more
//!   reverse-execution history") and leaves the cursor at the present, so the next resume runs the live process
//!   again. A forward single step onto the present is an ordinary step. With no live process
//!   ([`offline`]) the end of the history is as far as forward execution goes: a continue or a
//!   step there reports `HistoryEnd` at the end again.
//!
//! ## Write watchpoints
//!
//! Served only with a state log (which records what every instruction wrote); refused
//! otherwise, and for read/access watchpoints. A reverse continue stops at the nearer of the last breakpoint
//! hit and the last write to a watched range
//! ([`RecordedState::rfind_write`](crate::capture::RecordedState::rfind_write)), the cursor *before*
//! the write (GDB shows the writing instruction and the old value); a reverse step over a write reports
//! it too. Forward replay stops *after* the next write
//! ([`RecordedState::find_write`](crate::capture::RecordedState::find_write)); a live run stops
//! after the instruction that wrote (the software backend checks each step). A search never
//! passes an entry whose writes the log does not know: in the past it stops there with a plain
//! trap and a [`Notice::WatchUncertain`] (the log shows no change there, so GDB could not tell).

mod diversion;
pub mod files;
pub mod inspect;
mod live_threads;
pub mod offline;
mod past;
mod periods;
mod range_step;
pub mod regfiles;
pub mod save;
mod source_step;
pub mod threads;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::capture::{ExecBoundary, LiveBackend};
use crate::flow::FlowConfig;
use crate::history::{BreakpointSet, HistoryWorker};
use crate::image::{Image, ImmutableCode, Symbolizer};
use crate::store::live::TraceStore;
use crate::target::{
    HeldChildReply, HeldChildRequest, Notice, Resume, ReverseResume, StopEvent, TargetError,
    TargetResult, X86Registers,
};

use past::unknown_registers;

pub use inspect::{Branch, CallSegment};
pub use offline::{OfflineRecording, load_saved};
pub use periods::PeriodInfo;
pub use regfiles::RegisterFiles;
pub use save::SAVE_FORMAT;
pub use threads::{FatalSignal, ThreadPosition, ThreadRecording, load_saved_threads};

/// How long a reverse resume waits for the background index to cover the stop. GDB waits for a
/// stop reply without a timeout, so this only bounds a worker that cannot keep up.
pub const INDEX_WAIT: Duration = Duration::from_secs(60);

/// How long a monitor command waits for the index: GDB gives up on a reply after its
/// `remotetimeout` (2 s by default).
pub const MONITOR_INDEX_WAIT: Duration = Duration::from_millis(1500);

/// Trace bytes the worker decodes per step while the target runs. The store is locked for the
/// step (the drainer waits meanwhile), so it is kept well below the worker's default.
const LIVE_WINDOW: usize = 64 * 1024;

/// What a resumed [`Timeline`] is doing until [`Timeline::wait`] reports the stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Running {
    /// Stopped.
    Idle,
    /// Forward, live, through the capture backend.
    Live,
    /// A stop that is already known (replay moves are computed at resume time).
    Ready(StopEvent),
}

/// Consistency problems found when the index of a stop completes; shown by `monitor stats`.
#[derive(Debug, Default, Clone)]
pub struct Checks {
    /// Stops at which the history length differed from the recorded instruction count.
    pub length_mismatches: u64,
    /// The last mismatch (or trace problem at a stop), described.
    pub last_mismatch: Option<String>,
    /// Replay positions where the state log's RIP differed from the history's instruction.
    pub pc_mismatches: u64,
    /// Captured register files whose RIP differed from the history's instruction at their
    /// position (not served there).
    pub snapshot_mismatches: u64,
}

/// What a read of memory or registers in the past returns, for `monitor stats` and the
/// `monitor past` help.
pub const PAST_PC_ONLY: &str = "PC-only: RIP is the traced PC; all registers where they were \
    captured (recording start, every stop and every step of a range step, a saved recording's \
    start/stops/end); elsewhere every \
    other register is <unavailable>. Memory: read-only file-backed code from the image; any \
    other address is refused (Cannot access memory)";

/// The state-log counterpart of [`PAST_PC_ONLY`].
pub const PAST_STATE_LOG: &str = "state log: all general-purpose registers and memory rebuilt \
    exactly; vector/x87 registers from the log's snapshots or <unavailable>";

/// A reverse-execution session: the capture backend (live process, or none), the history and
/// the cursor. The server's debugger target and its monitor commands share one.
pub struct Timeline {
    /// The live process and its capture backend; `None` when replaying a recording offline.
    live: Option<Box<dyn LiveBackend>>,
    store: TraceStore,
    /// Indexes the history from the store on its own thread.
    worker: HistoryWorker<TraceStore>,
    /// The history length, once the index covers the last stop (checked); `None` until then.
    index: Option<u64>,
    /// Instructions the worker had indexed when the target last stopped: what was indexed in
    /// the background while it ran.
    indexed_at_stop: u64,
    /// The code the history is decoded against: `present`, or after execs the first program's
    /// code with one period per later program (see `periods.rs`).
    image: Arc<Image>,
    /// The code of the present address space.
    present: Arc<Image>,
    /// The address spaces the history left through `execve`, in order.
    exec_bounds: Vec<ExecBoundary>,
    /// Symbols of each earlier address space's program (read on first use).
    period_symbols: Vec<Option<Symbolizer>>,
    /// The address space (index, the present one = `exec_bounds.len()`) of the last stop the
    /// debugger was told about; `None` before the first.
    shown_period: Option<usize>,
    /// The last stop reported was at the present (see `periods::period_notice`).
    shown_at_present: bool,
    /// `/proc/PID/maps` lines of executable mappings when `image` was captured.
    image_maps: String,
    /// Where past memory reads are served from the image (PC-only replay).
    immutable: ImmutableCode,
    /// Replay position; `None` at the present (always `Some` offline).
    cursor: Option<u64>,
    /// Breakpoint addresses GDB set (also kept by the ptrace target for runs at full speed).
    bps: BTreeSet<u64>,
    /// Write watchpoints GDB set, `(addr, len)`, one element per `Z2` (only with a state log).
    watches: Vec<(u64, u64)>,
    /// Watchpoints the live backend checks itself in the running program (a PC-only past:
    /// [`LiveBackend::set_live_watches`]), one element per `Z2`–`Z4`.
    live_watches: Vec<(u64, u64, crate::target::WatchKind)>,
    /// The `live_watches` the last notice that they are not checked in the past was about.
    live_watches_noted: Vec<(u64, u64, crate::target::WatchKind)>,
    running: Running,
    interrupt: Arc<AtomicBool>,
    /// The debugger interrupted while the program was already stopped: it sent its Ctrl-C as
    /// the stop was being reported (e.g. between the stops of a watched location written over
    /// and over with the value it holds, which GDB resumes from by itself). Natively the
    /// `SIGINT` would be queued and stop the program at once when it resumes; so does the
    /// next resume here.
    interrupt_pending: bool,
    /// The last stop was a `SIGINT` (an interrupt, or the terminal's Ctrl-C reaching the
    /// program): a debugger's interrupt that comes after it is the same Ctrl-C (`ptrewind gdb`:
    /// the terminal sends it to the program and to GDB), not one to keep for the next resume.
    stopped_by_sigint: bool,
    /// Whether the user wants recording (`monitor record on|off`).
    record_wanted: bool,
    exited: Option<StopEvent>,
    /// The process is stopped at its exit event: the end of the recording, still readable; the
    /// next forward resume from the present lets it exit.
    at_exit: bool,
    checks: Checks,
    /// Cache of the recorded registers at the cursor.
    regs_at: Option<(u64, X86Registers)>,
    /// The thread the debugger resumed in the past (its stops are reported in it).
    past_thread: Option<i32>,
    notices: Vec<Notice>,
    /// Resumptions run untraced (recording off).
    untraced_runs: u64,
    /// The oldest position the state log can rebuild (after the last untraced run).
    floor: u64,
    symbols: Option<Symbolizer>,
    /// The symbols read before the program's code mappings last changed (a library loaded or
    /// unloaded since): the next [`Timeline::symbolizer`] reads the mappings again and takes
    /// from these the objects still mapped at the same place instead of reading them again.
    stale_symbols: Option<Symbolizer>,
    /// Complete register files known at history positions (recording start, stops, a saved
    /// recording's start, stops and end).
    snapshots: RegisterFiles,
    /// The registers of the last stop, keyed once the index says at which position it is.
    pending_snapshot: Option<X86Registers>,
    /// Register-file shape (XSAVE size, AVX) for PC-only replies.
    template: X86Registers,
    /// Offline: the process id the recording had (for GDB's display), its executable, and a
    /// description of the source.
    offline: Option<OfflineInfo>,
    /// Problems met at stops (trace closing or draining).
    stop_errors: u64,
    /// How the history is decoded (errata of the CPU that recorded a hardware trace).
    flow: FlowConfig,
    /// The registers before the debugger first changed them at this stop (the start of a
    /// debugger-made call, see [`diversion`]).
    regs_before_write: Option<X86Registers>,
    /// A debugger-made function call in progress.
    diversion: Option<diversion::Diversion>,
    /// Debugger-made calls run outside the recording.
    diversions: u64,
    /// The other threads of a multi-thread recording (see [`threads`]).
    group: Option<Box<threads::ThreadGroup>>,
    /// The range step in progress (see `range_step`).
    range_step: Option<range_step::RangeStep>,
    /// What the range steps did (`monitor stats`).
    range_stats: range_step::RangeStepStats,
    /// The register files read at the steps of the last live range step, by step, until the
    /// index says their positions (see `range_step`).
    step_regs: RegisterFiles,
    /// Whether the last live resume was recorded (a range step's later steps are too).
    last_run_recorded: bool,
}

/// What a request for the process says in a replay.
const NO_LIVE_PROCESS: TargetError =
    TargetError::Unsupported("no live process: this is a replay of a recording");

/// What an offline replay knows about the recorded process.
#[derive(Debug, Clone, Default)]
pub struct OfflineInfo {
    /// The recorded process id, if known (otherwise 1).
    pub pid: i32,
    /// The thread the trace follows, if known (otherwise the process id).
    pub tid: Option<i32>,
    /// The recorded executable, if known.
    pub exe: Option<PathBuf>,
    /// Where the recording came from, for `monitor stats`.
    pub source: String,
    /// The process's auxiliary vector when the recording was saved (GDB finds the PIE load
    /// address and the loader's rendezvous through it).
    pub auxv: Option<Vec<u8>>,
    /// The dynamic loader's library list when saved (`qXfer:libraries-svr4` XML).
    pub libraries_xml: Option<String>,
    /// Memory saved with the recording (the stack from the stack pointer up), valid only at
    /// the end of the history: `(address, bytes)`.
    pub memory_at_end: Vec<(u64, Vec<u8>)>,
    /// `/proc/PID/maps` when saved (served as the process's maps file).
    pub maps: String,
    /// The executable and libraries saved with the recording (see [`files`]).
    pub files: files::SavedFiles,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline")
            .field("cursor", &self.cursor)
            .field("history_len", &self.index)
            .field("running", &self.running)
            .finish_non_exhaustive()
    }
}

/// The executable mappings of `/proc/PID/maps` text, one per line (what decides whether the
/// code image must be snapshotted again).
fn exec_lines(maps: &str) -> String {
    crate::image::procfs::parse_maps_lenient(maps)
        .filter(|m| m.exec)
        .map(|m| format!("{m:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Timeline {
    /// A timeline over a live capture whose process is stopped at the start of the recording
    /// (`record_wanted`: whether forward runs are traced). What was recorded before is indexed
    /// at once.
    pub fn live(live: Box<dyn LiveBackend>, record_wanted: bool) -> TargetResult<Self> {
        let mut t = Timeline::start(live, record_wanted)?;
        // Index what was recorded before the debugger connects (nothing when recording starts
        // at main).
        t.sync_history();
        Ok(t)
    }

    fn start(mut live: Box<dyn LiveBackend>, record_wanted: bool) -> TargetResult<Self> {
        let pid = live.pid();
        let maps = live.maps();
        let image_maps = exec_lines(&maps);
        let present = Arc::new(live.snapshot_image()?);
        let exec_bounds = live.exec_boundaries();
        let image = periods::compose(&exec_bounds, &present);
        let store = live.store();
        let flow = live.flow_config();
        let worker = spawn_worker(&store, &image, &flow).map_err(|e| TargetError::Unexpected {
            pid,
            what: format!("cannot start the history worker: {e}"),
        })?;
        // The register-file shape for PC-only replies (the values are not used).
        let template = live.read_registers()?;
        let immutable = ImmutableCode::from_maps(&maps);
        let mut r = Timeline::assemble(Some(live), store, worker, image, template);
        r.flow = flow;
        r.image_maps = image_maps;
        r.immutable = immutable;
        r.present = present;
        r.exec_bounds = exec_bounds;
        r.record_wanted = record_wanted;
        Ok(r)
    }

    fn assemble(
        live: Option<Box<dyn LiveBackend>>,
        store: TraceStore,
        worker: HistoryWorker<TraceStore>,
        image: Arc<Image>,
        template: X86Registers,
    ) -> Self {
        Timeline {
            live,
            store,
            worker,
            index: None,
            indexed_at_stop: 0,
            present: Arc::clone(&image),
            image,
            exec_bounds: Vec::new(),
            period_symbols: Vec::new(),
            shown_period: None,
            shown_at_present: false,
            image_maps: String::new(),
            immutable: ImmutableCode::default(),
            cursor: None,
            bps: BTreeSet::new(),
            watches: Vec::new(),
            live_watches: Vec::new(),
            live_watches_noted: Vec::new(),
            running: Running::Idle,
            interrupt: Arc::new(AtomicBool::new(false)),
            interrupt_pending: false,
            stopped_by_sigint: false,
            record_wanted: true,
            exited: None,
            at_exit: false,
            checks: Checks::default(),
            regs_at: None,
            past_thread: None,
            notices: Vec::new(),
            untraced_runs: 0,
            floor: 0,
            symbols: None,
            stale_symbols: None,
            snapshots: RegisterFiles::default(),
            pending_snapshot: None,
            template,
            offline: None,
            stop_errors: 0,
            flow: FlowConfig::default(),
            regs_before_write: None,
            diversion: None,
            diversions: 0,
            group: None,
            range_step: None,
            range_stats: Default::default(),
            step_regs: RegisterFiles::default(),
            last_run_recorded: false,
        }
    }

    /// A handle on the recorded trace (the same bytes the history is decoded from). At every
    /// stop the trace covers everything up to the stop PC, so a debugger can decode it as is
    /// (LLDB's `thread trace dump` through `jLLDBTrace*`).
    pub fn trace_store(&self) -> TraceStore {
        self.store.clone()
    }

    /// Runs one system call in the live process at the present, recording nothing (LLDB's
    /// memory allocation, `_M`/`_m`). Refused in the past and offline.
    pub fn inject_syscall(&mut self, nr: u64, args: [u64; 6]) -> TargetResult<u64> {
        if self.cursor.is_some() {
            return Err(TargetError::Unsupported(
                "running a system call in the past (go to the present first: monitor goto end)",
            ));
        }
        self.live_mut()?.inject_syscall(nr, args)
    }

    /// The live backend's count of executed instructions, readable from another thread while
    /// the process runs (progress displays); `None` offline or without one.
    pub fn step_counter(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicU64>> {
        self.live.as_ref()?.step_counter()
    }

    /// The history worker's counters, readable from another thread (progress displays).
    pub fn progress_probe(&self) -> crate::history::WorkerProbe<TraceStore> {
        self.worker.probe()
    }

    /// The code the history is decoded against.
    pub fn image(&self) -> &Image {
        &self.image
    }

    /// How the history is decoded (errata, timing).
    pub fn flow_config(&self) -> &FlowConfig {
        &self.flow
    }

    fn live_mut(&mut self) -> TargetResult<&mut Box<dyn LiveBackend>> {
        self.live.as_mut().ok_or(NO_LIVE_PROCESS)
    }

    /// Whether a live process is behind this recording (not an offline replay).
    pub fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// The live backend's name (`monitor stats`), if a live process is behind this recording.
    pub fn backend_name(&self) -> Option<&'static str> {
        self.live.as_ref().map(|l| l.name())
    }

    /// Whether the trace was recorded by the CPU (hardware backend).
    pub fn has_hardware_trace(&self) -> bool {
        self.live.as_ref().is_some_and(|l| l.is_hardware())
    }

    /// Whether registers and memory in the past are rebuilt from a state log (otherwise the
    /// past is served PC-only).
    pub fn has_state_log(&self) -> bool {
        self.live
            .as_ref()
            .is_some_and(|l| l.recorded_state().is_some())
    }

    /// The shape of the register files served (XSAVE length, AVX upper halves' offset), as the
    /// target description given to the debugger says.
    pub fn register_shape(&self) -> (usize, Option<usize>) {
        (self.template.xsave.len(), self.template.ymm_hi_offset)
    }

    /// Number of instructions in the history (the present's position): the checked history
    /// length once the index covers the last stop, the backend's count before (the two agree
    /// unless the history check fails), or what is indexed so far.
    pub fn len(&self) -> u64 {
        self.index.unwrap_or_else(|| {
            self.live
                .as_ref()
                .and_then(|l| l.recorded())
                .unwrap_or_else(|| self.worker.stats().insns)
        })
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The last position the cursor can take: the present (`len()`) for a live process; offline,
    /// `len()` when the registers after the last instruction are known, else the last
    /// instruction (`len() - 1`).
    pub fn end(&self) -> u64 {
        let len = self.len();
        if self.live.is_some() || self.snapshots.contains(len) {
            len
        } else {
            len.saturating_sub(1)
        }
    }

    /// Waits up to `timeout` until the background index covers the trace as it was at the last
    /// stop, then checks its length (once per stop). Returns the history length, or why it is
    /// not available yet.
    pub fn ensure_indexed(&mut self, timeout: Duration) -> Result<u64, String> {
        if let Some(n) = self.index {
            return Ok(n);
        }
        match self.worker.wait_indexed(timeout) {
            Ok(n) => {
                self.check_length(n);
                self.index = Some(n);
                if let Some(regs) = self.pending_snapshot.take() {
                    self.snapshots.insert(n, regs);
                }
                if !self.step_regs.is_empty() {
                    self.place_range_registers(n);
                }
                Ok(n)
            }
            Err(e) => Err(format!(
                "the recorded history is not indexed yet: {e}; nothing is lost, retry \
                 (monitor stats shows the decode lag)"
            )),
        }
    }

    /// Compares a complete history's length with the backend's and the state log's counts.
    fn check_length(&mut self, history: u64) {
        let Some(live) = self.live.as_ref() else {
            return;
        };
        let Some(recorded) = live.recorded() else {
            return;
        };
        let logged = live.recorded_state().map(|l| l.len());
        if history != recorded || logged.is_some_and(|l| l != recorded) {
            self.checks.length_mismatches += 1;
            self.checks.last_mismatch = Some(format!(
                "history {history} instructions, recorder {recorded}, state log {logged:?}"
            ));
        }
    }

    /// The replay position (`len()` at the present).
    pub fn position(&self) -> u64 {
        self.cursor.unwrap_or_else(|| self.len())
    }

    /// Whether the cursor is in the past.
    pub fn is_replaying(&self) -> bool {
        self.cursor.is_some()
    }

    /// The `siginfo_t` thread `tid` stopped with, at the present of a live process (see
    /// [`LiveBackend::stop_siginfo`]); `None` in the past, where no signal is pending.
    pub fn stop_siginfo(&self, tid: i32) -> Option<Vec<u8>> {
        if self.is_replaying() || self.group.is_some() {
            return None;
        }
        self.live.as_ref()?.stop_siginfo(tid)
    }

    /// Address of history instruction `n`.
    pub fn insn_ip(&mut self, n: u64) -> Option<u64> {
        self.worker
            .with_history(|h, b, img| h.insn(b, img, n))
            .map(|(ip, _)| ip)
    }

    /// Calls `f(n, ip, len)` for the instructions `from..to` in order (a decode of that range).
    pub fn for_each_insn(&mut self, from: u64, to: u64, mut f: impl FnMut(u64, u64, u8)) {
        self.worker.with_history(|h, b, img| {
            for n in from..to.min(h.len()) {
                match h.insn(b, img, n) {
                    Some((ip, len)) => f(n, ip, len),
                    None => break,
                }
            }
        });
    }

    /// Moves the cursor (`n >= len()` means the present; offline, the end). Positions before
    /// [`floor`](Self::floor) cannot be reconstructed and are refused.
    pub fn goto(&mut self, n: u64) -> Result<(), String> {
        if n < self.floor() {
            return Err(format!(
                "instruction {n} is before an untraced run (recording was off): the state \
                 there cannot be rebuilt; the oldest reachable instruction is {}",
                self.floor()
            ));
        }
        if self.live.is_some() && self.cursor.is_none() && n < self.len() {
            self.enter_live_threads();
        }
        self.cursor = if self.live.is_some() {
            (n < self.len()).then_some(n)
        } else {
            Some(n.min(self.end()))
        };
        self.regs_at = None;
        if self.cursor.is_none() && self.is_live_group() {
            self.leave_live_threads();
            return Ok(());
        }
        self.follow_selected();
        Ok(())
    }

    /// The oldest instruction the state log can rebuild (after the last untraced run); 0 when
    /// the past is served PC-only (the PC is known everywhere).
    pub fn floor(&self) -> u64 {
        if self.has_state_log() { self.floor } else { 0 }
    }

    /// The consistency checks so far.
    pub fn checks(&self) -> &Checks {
        &self.checks
    }

    /// Turns recording on or off (`monitor record on|off`).
    pub fn set_recording(&mut self, on: bool) -> Result<(), String> {
        if self.live.is_none() {
            return Err("no live process: this is a replay of a recording".into());
        }
        if self.exited.is_some() {
            return Err("the process has exited".into());
        }
        if !on && !self.watches.is_empty() {
            // GDB keeps them inserted (`breakpoint always-inserted on`): an untraced run would
            // pass their writes unseen.
            return Err("write watchpoints are inserted: delete them before recording off".into());
        }
        self.record_wanted = on;
        Ok(())
    }

    /// Whether recording is wanted.
    pub fn recording_wanted(&self) -> bool {
        self.record_wanted
    }

    /// What reads of registers and memory in the past return, in words.
    pub fn past_reads_text(&self) -> &'static str {
        if self.has_state_log() {
            PAST_STATE_LOG
        } else {
            PAST_PC_ONLY
        }
    }

    /// Brings the trace up to the current stop and asks for the index without waiting for it:
    /// the backend completes the trace up to the PC, the code is re-snapshotted if mappings
    /// changed, and the worker is asked to complete the index (checked by
    /// [`ensure_indexed`](Self::ensure_indexed)). The stop's registers are kept for its position.
    fn sync_history(&mut self) {
        let exited = self.exited.is_some();
        if let Some(live) = self.live.as_mut() {
            if let Err(e) = live.sync_at_stop(exited) {
                self.stop_errors += 1;
                self.notices
                    .push(Notice::TraceIncomplete { what: e.clone() });
                self.checks.last_mismatch = Some(e);
            }
            if live.trace_rewritten() {
                // The backend rewrote the trace (see `LiveBackend::trace_rewritten`): index it
                // again from the start.
                match spawn_worker(&self.store, &self.image, &self.flow) {
                    Ok(w) => self.worker = w,
                    Err(e) => {
                        self.stop_errors += 1;
                        self.checks.last_mismatch =
                            Some(format!("cannot restart the history worker: {e}"));
                    }
                }
            }
            if exited && live.exec_boundaries().len() != self.exec_bounds.len() {
                // The program replaced its code and ended before a stop (no stop at the exit):
                // the last period's code cannot be read any more. Decoding it against the
                // code of before would be silently wrong; with no code it shows as decode
                // errors ("no code"), counted in monitor stats.
                self.exec_bounds = live.exec_boundaries();
                self.present = Arc::new(Image::new());
                self.image = periods::compose(&self.exec_bounds, &self.present);
                if let Ok(w) = spawn_worker(&self.store, &self.image, &self.flow) {
                    self.worker = w;
                }
            }
            if !exited {
                let all_maps = live.maps();
                let maps = exec_lines(&all_maps);
                // An execve since the last stop: the history before it ran another program,
                // decoded against that program's code from now on (see `periods.rs`).
                let bounds = live.exec_boundaries();
                let exec_since = bounds.len() != self.exec_bounds.len();
                let remapped = maps != self.image_maps;
                if (remapped || exec_since)
                    && let Ok(image) = live.snapshot_image()
                {
                    self.present = Arc::new(image);
                    self.image_maps = maps;
                    if exec_since {
                        // Every mapping of the new program dates from its first instruction,
                        // whatever was mapped at the same addresses before.
                        let start = bounds.last().map_or(0, |b| b.next_insn);
                        self.exec_bounds = bounds;
                        // The present program changed: its symbols are read again.
                        self.symbols = None;
                        self.stale_symbols = None;
                        self.immutable = ImmutableCode::default()
                            .remapped(ImmutableCode::from_maps(&all_maps), start);
                    } else {
                        // Libraries loaded or unloaded since the symbols were read (the
                        // first query is often made before the dynamic loader maps libc).
                        if let Some(old) = self.symbols.take() {
                            self.stale_symbols = Some(old);
                        }
                        // Code mapped now is no answer for a read before this stop, whose
                        // position the index says when the backend does not count (if it
                        // cannot say in time, the new code is never served for the past).
                        let at = live.recorded().unwrap_or_else(|| {
                            self.worker.request_complete();
                            self.worker.wait_indexed(INDEX_WAIT).unwrap_or(u64::MAX)
                        });
                        self.immutable = self
                            .immutable
                            .remapped(ImmutableCode::from_maps(&all_maps), at);
                    }
                    self.image = periods::compose(&self.exec_bounds, &self.present);
                    // The worker may have decoded code of the new mapping against the old
                    // image while the target ran: index again from the start against the new one.
                    match spawn_worker(&self.store, &self.image, &self.flow) {
                        Ok(w) => self.worker = w,
                        Err(_) => self.worker.set_image(Arc::clone(&self.image)),
                    }
                }
            }
        }
        // The stop's registers belong to the position of the next instruction. A backend that
        // counts instructions knows it now; otherwise the index will say (it is asked before
        // the process runs again, see `resume`). Only this stop's registers may be keyed there.
        self.pending_snapshot = None;
        if let Some(live) = self.live.as_mut()
            && !exited
            && let Ok(regs) = history_thread_registers(live.as_mut())
        {
            match live.recorded() {
                Some(n) => {
                    self.snapshots.insert(n, regs);
                }
                None => self.pending_snapshot = Some(regs),
            }
        }
        self.indexed_at_stop = self.worker.stats().insns;
        self.worker.request_complete();
        self.index = None;
        self.regs_at = None;
    }

    fn bp_set(&self) -> BreakpointSet {
        BreakpointSet::new(self.bps.iter().copied())
    }

    /// Starts a reverse step or continue from the cursor; the stop is collected with
    /// [`wait`](Self::wait).
    pub fn reverse(&mut self, how: ReverseResume) -> TargetResult<()> {
        self.range_step = None;
        // A step moves the thread the debugger chose; a continue searches the history's thread.
        // (PC-only, the past is the history thread's alone: a step moves it.)
        self.past_thread = match how {
            ReverseResume::Step if self.has_state_log() => {
                self.live.as_ref().map(|l| l.selected_thread())
            }
            _ => None,
        };
        if self.exited.is_some() {
            return Err(TargetError::Unsupported(
                "reverse execution after the process exited",
            ));
        }
        self.ensure_indexed(INDEX_WAIT)
            .map_err(|what| TargetError::Unexpected { pid: 0, what })?;
        if how == ReverseResume::Continue {
            self.note_unchecked_watches();
        }
        if self.cursor.is_none() {
            // A live multi-thread process: every thread's past (see `live_threads`).
            self.enter_live_threads();
        }
        if let Some(r) = self.reverse_threads(how) {
            return r;
        }
        let c = self.position();
        let floor = self.floor();
        let ev = match how {
            ReverseResume::Step => {
                if c <= floor {
                    StopEvent::HistoryEnd { at_begin: true }
                } else {
                    self.cursor = Some(c - 1);
                    match self.watch_back(c, c - 1) {
                        Some(w) => self.watch_stop(w, c - 1),
                        None => StopEvent::Step,
                    }
                }
            }
            ReverseResume::Continue => {
                // The nearer of the last write to a watched range and the last breakpoint hit
                // (a write at a breakpoint's instruction is reported as the watchpoint).
                let watch = self.watch_back(c, floor);
                let hit = if self.bps.is_empty() {
                    None
                } else {
                    let mut m = self.bp_set();
                    self.worker
                        .with_history(|h, b, img| h.rfind_with(b, img, c, &mut m))
                };
                let bp = hit.filter(|&k| k >= floor);
                match (watch, bp) {
                    (Some(w), bp) if bp.is_none_or(|k| w.before >= k) => {
                        let at = w.before.max(floor);
                        self.cursor = Some(at);
                        self.watch_stop(w, at)
                    }
                    (_, Some(k)) => {
                        self.cursor = Some(k);
                        let pc = self.insn_ip(k).unwrap_or(0);
                        StopEvent::Breakpoint { pc }
                    }
                    _ => {
                        self.cursor = (floor < self.len() || self.live.is_none()).then_some(floor);
                        StopEvent::HistoryEnd { at_begin: true }
                    }
                }
            }
        };
        self.regs_at = None;
        self.running = Running::Ready(ev);
        Ok(())
    }

    fn resume_replay(&mut self, how: Resume, c: u64) -> TargetResult<()> {
        self.ensure_indexed(INDEX_WAIT)
            .map_err(|what| TargetError::Unexpected { pid: 0, what })?;
        let len = self.len();
        let end = self.end();
        let live = self.live.is_some();
        let ev = match how {
            Resume::Step { .. } if live => {
                self.cursor = (c + 1 < len).then_some(c + 1);
                match self.watch_forward(c, c + 1) {
                    Some(w) => self.watch_stop(w, c + 1),
                    None => StopEvent::Step,
                }
            }
            Resume::Step { .. } => {
                if c < end {
                    self.cursor = Some(c + 1);
                    StopEvent::Step
                } else {
                    StopEvent::HistoryEnd { at_begin: false }
                }
            }
            Resume::Continue { .. } => {
                self.note_unchecked_watches();
                // The nearer of the first write to a watched range (stopping after it) and
                // the first breakpoint hit.
                let watch = self.watch_forward(c, len);
                let hit = if self.bps.is_empty() {
                    None
                } else {
                    let mut m = self.bp_set();
                    self.worker
                        .with_history(|h, b, img| h.find_with(b, img, c + 1, &mut m))
                };
                match watch {
                    Some(w) if hit.is_none_or(|k| w.after <= k) => {
                        let at = w.after;
                        self.cursor = (at < len || !live).then_some(at);
                        self.watch_stop(w, at)
                    }
                    _ => match hit {
                        Some(k) if k < len && k <= end => {
                            self.cursor = Some(k);
                            let pc = self.insn_ip(k).unwrap_or(0);
                            StopEvent::Breakpoint { pc }
                        }
                        _ => {
                            self.cursor = if live { None } else { Some(end) };
                            StopEvent::HistoryEnd { at_begin: false }
                        }
                    },
                }
            }
        };
        self.running = Running::Ready(ev);
        Ok(())
    }

    /// Starts a forward step or continue: replayed from the history in the past, run by the
    /// backend at the present. The stop is collected with [`wait`](Self::wait).
    pub fn resume(&mut self, how: Resume) -> TargetResult<()> {
        self.range_step = None;
        self.past_thread = match how {
            Resume::Step { .. } if self.has_state_log() => {
                self.live.as_ref().map(|l| l.selected_thread())
            }
            _ => None,
        };
        if self.exited.is_some() {
            let pid = self.live.as_ref().map_or(0, |l| l.pid());
            return Err(TargetError::Exited { pid });
        }
        self.interrupt.store(false, Ordering::Release);
        if std::mem::take(&mut self.interrupt_pending) {
            // The debugger's Ctrl-C that came while the program was stopped: the stop it
            // asked for, where the program is (see `interrupt_pending`).
            self.running = Running::Ready(StopEvent::Signal(libc::SIGINT));
            return Ok(());
        }
        self.regs_at = None;
        if let Some(r) = self.resume_threads(how) {
            return r;
        }
        if let Some(c) = self.cursor {
            return self.resume_replay(how, c);
        }
        if self.pending_snapshot.is_some() || !self.step_regs.is_empty() {
            // Key the last stop's registers (hardware backend: only the index knows the stop's
            // position) and a range step's before the trace grows past them.
            if let Err(e) = self.ensure_indexed(INDEX_WAIT) {
                self.pending_snapshot = None;
                self.range_stats.unplaced += std::mem::take(&mut self.step_regs).len() as u64;
                self.stop_errors += 1;
                self.checks.last_mismatch = Some(format!("the registers of a stop are lost: {e}"));
            }
        }
        if self.at_exit {
            // Past the end there is nothing to record: let the process exit.
            self.at_exit = false;
            self.last_run_recorded = false;
            self.live_mut()?.resume(how, false)?;
            self.running = Running::Live;
            return Ok(());
        }
        let diverted = self.divert_if_called();
        let record = self.record_wanted && !diverted;
        if !record && !diverted {
            self.untraced_runs += 1;
            self.floor = self.len();
        }
        self.last_run_recorded = record;
        self.live_mut()?.resume(how, record)?;
        self.running = Running::Live;
        Ok(())
    }

    fn stopped(&mut self, ev: StopEvent) -> StopEvent {
        self.running = Running::Idle;
        self.stopped_by_sigint = ev == StopEvent::Signal(libc::SIGINT);
        if matches!(ev, StopEvent::Exited(_) | StopEvent::Killed(_)) {
            self.exited = Some(ev);
        }
        if let StopEvent::Exiting { signal } = ev {
            self.at_exit = true;
            self.notices.push(Notice::AtExit { signal });
        }
        self.sync_history();
        ev
    }

    /// Waits for the stop of the last resume (`Ok(None)`: still running, when `block` is
    /// false).
    pub fn wait(&mut self, block: bool) -> TargetResult<Option<StopEvent>> {
        let began = std::time::Instant::now();
        loop {
            let (ev, live) = match self.running {
                Running::Idle => {
                    return Err(TargetError::Unexpected {
                        pid: 0,
                        what: "wait on a stopped target".into(),
                    });
                }
                Running::Ready(ev) => {
                    self.running = Running::Idle;
                    (ev, false)
                }
                Running::Live => {
                    // (Not `live_mut`: the breakpoints and the flag are borrowed beside it.)
                    let live = self.live.as_mut().ok_or(NO_LIVE_PROCESS)?;
                    match live.wait(block, &self.bps, &self.interrupt)? {
                        Some(ev) => (ev, true),
                        None if self.range_step.is_some() => {
                            self.forward_range_interrupt()?;
                            if !block && began.elapsed() >= range_step::RANGE_SLICE {
                                return Ok(None);
                            }
                            continue;
                        }
                        None => return Ok(None),
                    }
                }
            };
            let Some(ev) = self.range_step_on(ev, live)? else {
                // Stepping on in the range.
                if !block && began.elapsed() >= range_step::RANGE_SLICE {
                    return Ok(None);
                }
                continue;
            };
            if live {
                return Ok(Some(self.stopped(ev)));
            }
            self.stopped_by_sigint = ev == StopEvent::Signal(libc::SIGINT);
            return Ok(Some(ev));
        }
    }

    /// The recorded process id (offline: the one the recording names, else 1).
    pub fn pid(&self) -> i32 {
        match (&self.live, &self.offline) {
            (Some(l), _) => l.pid(),
            (None, Some(o)) => o.pid,
            (None, None) => 1,
        }
    }

    /// The id of the thread of the last stop.
    pub fn tid(&self) -> i32 {
        if let Some(g) = &self.group {
            return g.tids[g.selected];
        }
        match (&self.live, &self.offline) {
            // In the past: the thread the debugger moved (the history is the main thread's;
            // every thread is shown at the main thread's positions).
            (Some(l), _) if self.cursor.is_some() => {
                self.past_thread.unwrap_or_else(|| l.history_thread())
            }
            (Some(l), _) => l.tid(),
            (None, Some(OfflineInfo { tid: Some(t), .. })) => *t,
            (None, _) => self.pid(),
        }
    }

    /// The recorded executable, if known.
    pub fn exec_path(&mut self) -> Option<PathBuf> {
        match self.live.as_mut() {
            Some(l) => l.exec_path(),
            None => self.offline.as_ref().and_then(|o| o.exe.clone()),
        }
    }

    /// The registers at the cursor: the live process's at the present, rebuilt or PC-only in
    /// the past (see the module docs).
    pub fn read_registers(&mut self) -> TargetResult<X86Registers> {
        if self.exited.is_some() {
            return Err(TargetError::Exited { pid: self.pid() });
        }
        match self.cursor {
            None => self.live_mut()?.read_registers(),
            Some(n) => self.past_registers(n),
        }
    }

    /// Writes the registers at the present; the past cannot be changed. Registers written
    /// back to what they were before a debugger-made call end its diversion.
    pub fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()> {
        if self.cursor.is_some() {
            return Err(TargetError::Unsupported(
                "changing registers in the past (go to the present first: monitor goto end)",
            ));
        }
        if self.regs_before_write.is_none() && self.diversion.is_none() {
            let before = self.live_mut()?.read_registers()?;
            self.regs_before_write = Some(before);
        }
        self.live_mut()?.write_registers(regs)?;
        if let Some(d) = &self.diversion
            && regs.gprs == d.saved.gprs
        {
            self.end_diversion();
        }
        Ok(())
    }

    /// Reads memory at the cursor: the live process's at the present; in the past, the live
    /// memory with every later write undone (recorded state) or immutable code only (PC-only).
    pub fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        let Some(pos) = self.cursor else {
            return self.live_mut()?.read_memory(addr, buf);
        };
        if self.is_live_group() {
            return self.live_group_memory(addr, buf);
        }
        if let Some(i) = self.earlier_period(pos) {
            return self.earlier_period_memory(i, pos, addr, buf);
        }
        self.memory_in_present_space(pos, addr, buf)
    }

    /// Memory at `pos` of the present address space (after the last exec; code replaced by a
    /// later munmap/mmap is served by the caller): the live process with the state log's later
    /// writes undone, or PC-only.
    fn memory_in_present_space(
        &mut self,
        pos: u64,
        addr: u64,
        buf: &mut [u8],
    ) -> TargetResult<usize> {
        if !self.has_state_log() {
            return self.pc_only_memory(pos, addr, buf);
        }
        let live = self.live_mut()?;
        let n = live.read_memory(addr, buf)?;
        if let Some(log) = live.recorded_state() {
            log.memory_at(pos, addr, &mut buf[..n]);
        }
        Ok(n)
    }

    /// Writes memory at the present; the past cannot be changed.
    pub fn write_memory(&mut self, addr: u64, data: &[u8]) -> TargetResult<()> {
        if self.cursor.is_some() {
            return Err(TargetError::Unsupported(
                "changing memory in the past (go to the present first: monitor goto end)",
            ));
        }
        self.live_mut()?.write_memory(addr, data)
    }

    /// Asks a running forward run to stop (reported as `Signal(SIGINT)`).
    pub fn interrupt(&mut self) -> TargetResult<()> {
        if self.interrupt_range_step() {
            return Ok(());
        }
        self.interrupt.store(true, Ordering::Release);
        match self.running {
            Running::Live => {
                if let Some(live) = self.live.as_mut() {
                    live.interrupt()?;
                }
            }
            Running::Idle => self.interrupt_pending = !self.stopped_by_sigint,
            Running::Ready(_) => {}
        }
        Ok(())
    }

    /// Kills the live process (nothing to do offline).
    pub fn kill(&mut self) -> TargetResult<()> {
        self.running = Running::Idle;
        match self.live.as_mut() {
            Some(live) => live.kill(),
            None => Ok(()),
        }
    }

    /// Lets the live process run on (nothing to do offline).
    pub fn detach(&mut self) -> TargetResult<()> {
        match self.live.as_mut() {
            Some(live) => live.detach(),
            None => Ok(()),
        }
    }

    /// Whether the live backend holds forks for the debugger (see
    /// [`LiveBackend::report_forks`]); never offline.
    pub fn report_forks(&mut self, client_wants: bool, vforks: bool) -> bool {
        self.live
            .as_mut()
            .is_some_and(|l| l.report_forks(client_wants, vforks))
    }

    /// Whether the live backend reports exec as a stop (see [`LiveBackend::report_execs`]);
    /// never offline.
    pub fn report_execs(&mut self, client_wants: bool) -> bool {
        self.live
            .as_mut()
            .is_some_and(|l| l.report_execs(client_wants))
    }

    /// Settles a held fork (see [`LiveBackend::resolve_fork`]): the process from now on.
    pub fn resolve_fork(&mut self, detach: i32) -> TargetResult<Option<i32>> {
        match self.live.as_mut() {
            Some(live) => live.resolve_fork(detach),
            None => Ok(None),
        }
    }

    /// The child of a held fork not settled yet.
    pub fn held_fork_child(&self) -> Option<i32> {
        self.live.as_ref().and_then(|l| l.held_fork_child())
    }

    /// Serves a request about the held fork child the debugger keeps (see
    /// [`LiveBackend::held_child`]).
    pub fn held_child(&mut self, request: HeldChildRequest) -> TargetResult<HeldChildReply> {
        match self.live.as_mut() {
            Some(live) => live.held_child(request),
            None => Err(TargetError::Unexpected {
                pid: 0,
                what: "a recording without a process holds no forked child".into(),
            }),
        }
    }

    /// True once the live process has exited or was killed.
    pub fn has_exited(&mut self) -> bool {
        if self.exited.is_some() {
            return true;
        }
        self.live.as_mut().is_some_and(|l| l.has_exited())
    }

    /// The auxiliary vector of the live process, or the one saved with a replayed recording.
    pub fn auxv(&mut self) -> TargetResult<Vec<u8>> {
        match self.live.as_mut() {
            Some(live) => live.auxv(),
            None => {
                self.offline
                    .as_ref()
                    .and_then(|o| o.auxv.clone())
                    .ok_or(TargetError::Unsupported(
                        "the auxiliary vector of a replayed recording saved without one",
                    ))
            }
        }
    }

    /// The library list saved with a replayed recording (`None` live: it is read from the
    /// process's memory).
    pub fn saved_library_list(&self) -> Option<&str> {
        self.offline.as_ref()?.libraries_xml.as_deref()
    }

    /// Takes the notices collected since the last call (the timeline's and the backend's).
    pub fn take_notices(&mut self) -> Vec<Notice> {
        let mut n = std::mem::take(&mut self.notices);
        if let Some(live) = self.live.as_mut() {
            n.extend(live.take_notices());
        }
        // A stop in another program's part of the history than the last one (a reverse step
        // over an exec): say whose code this is. An exec just made live says so itself.
        let exec_now = n.iter().any(|x| matches!(x, Notice::Exec { .. }));
        if let Some(notice) = self.period_notice(exec_now) {
            n.push(notice);
        }
        n
    }

    /// Adds a breakpoint: searched for in the history, and set in the live process for runs at
    /// full speed.
    pub fn add_breakpoint(&mut self, addr: u64) -> TargetResult<()> {
        if let Some(live) = self.live.as_mut() {
            live.add_breakpoint(addr)?;
        }
        self.bps.insert(addr);
        self.group_breakpoint(addr, true);
        Ok(())
    }

    /// Removes a breakpoint; `false` if none was at `addr`.
    pub fn remove_breakpoint(&mut self, addr: u64) -> TargetResult<bool> {
        if let Some(live) = self.live.as_mut() {
            live.remove_breakpoint(addr)?;
        }
        self.group_breakpoint(addr, false);
        Ok(self.bps.remove(&addr))
    }

    /// The breakpoint addresses, sorted.
    pub fn breakpoints(&self) -> Vec<u64> {
        self.bps.iter().copied().collect()
    }
}

/// Starts indexing `store` against `image` in the background, woken by every append.
fn spawn_worker(
    store: &TraceStore,
    image: &Arc<Image>,
    flow: &FlowConfig,
) -> std::io::Result<HistoryWorker<TraceStore>> {
    let w = HistoryWorker::spawn_with_window(
        Arc::new(store.clone()),
        Arc::clone(image),
        flow.clone(),
        LIVE_WINDOW,
    )?;
    store.set_listener(Some(w.notifier().into_listener()));
    Ok(w)
}

#[cfg(test)]
mod tests;

/// The registers of the thread whose instructions the history holds (the stop may be
/// another's: they are what a PC-only past shows at the stop's position), the selection left
/// as it was.
fn history_thread_registers(live: &mut dyn LiveBackend) -> TargetResult<X86Registers> {
    let (selected, history) = (live.selected_thread(), live.history_thread());
    // With a state log the stop's registers are not what the past shows: leave the selection.
    if selected == history
        || live.recorded_state().is_some()
        || live.select_thread(history).is_err()
    {
        return live.read_registers();
    }
    let r = live.read_registers();
    let _ = live.select_thread(selected);
    r
}
