//! [`RecordingTarget`]: a live process recorded by the software backend, with reverse execution
//! over its history.
//!
//! ## Live (the cursor is at the present)
//!
//! Forward `continue`/`stepi` run the process through the [`SoftRecorder`] with its
//! [`StateLog`](crate::capture::soft::StateLog) on, so every executed instruction is encoded as
//! Intel PT packets and its register/memory effects are kept for undo. GDB's breakpoints are
//! never written into the process while recording: the recorder stops after every instruction
//! and the PC is compared with the breakpoint set. At every stop the trace is closed at the PC
//! (FUP + TIP.PGD, reopened with PSB+ / TIP.PGE on the next resume), so the trace is exact up to
//! the PC.
//!
//! ## The background pipeline
//!
//! Three threads move the trace: the recorder (this server's thread) encodes packets into the
//! ToPA ring; the recorder's drainer thread moves them into the [`TraceStore`]; a
//! [`HistoryWorker`] thread, woken by every append that adds bytes (a mutex and a condition
//! variable, nothing more), decodes what arrived and indexes the [`History`](crate::history::History) (sync points at
//! PSBs with instruction counts) while the target runs. At a stop the trace is closed and
//! drained, the worker is asked to finish the index (count the instructions after the last PSB)
//! and the stop is reported at once: nothing waits for decoding. A request that needs the
//! history (`bs`, `bc`, replaying forward, `monitor goto|history|calls|save|stats`) waits until
//! the index covers the trace as it was at the stop ([`Recorder::ensure_indexed`]) — at most
//! [`INDEX_WAIT`] for a reverse resume, [`MONITOR_INDEX_WAIT`] for a monitor command — and
//! otherwise fails with a message giving the decode lag, never hangs. Until then the present's
//! position is the recorder's instruction count.
//!
//! When the index is complete, the history length is checked against the recorder's instruction
//! count and the state log's; a mismatch is kept and shown by `monitor stats` (it is never
//! silently ignored), with the worker's counters (decode lag, updates, sync points, index size)
//! and every loss (ring bytes overwritten before they were drained, overflows, decode errors).
//!
//! With recording off (`monitor record off`) forward execution runs at full speed through the
//! ptrace target (its INT3 breakpoints), untraced. Such a run changes registers and memory
//! without a record, so the state before it cannot be rebuilt: reverse execution then stops at
//! the first instruction recorded after it (the *floor*, shown by `monitor stats`), reporting
//! `replaylog:begin`; `monitor history`/`calls` still show the older control flow.
//!
//! ## Replay (the cursor `n` is before the present)
//!
//! * The PC is the history's instruction `n`; all general-purpose registers are rebuilt from the
//!   state log by undoing from the present (vector/x87 registers show their present values: the
//!   state log does not record them).
//! * Memory reads are the live memory with the old values of every write after `n` put back.
//!   The live process's breakpoints are never visible (the ptrace target shows original code
//!   bytes while stopped). Writes to memory or registers in the past are refused.
//! * `bs` moves to `n - 1` (at 0 or the floor: `replaylog:begin`); `bc` to the last earlier instruction at a
//!   breakpoint address ([`History::rfind_with`](crate::history::History::rfind_with)), or to 0 with `replaylog:begin`.
//! * Forward step/continue replay forward ([`History::find_with`](crate::history::History::find_with)); reaching the present by a
//!   continue reports `replaylog:end` (GDB: "No more reverse-execution history") and leaves the
//!   cursor at the present, so the next resume runs the process live again. A forward single
//!   step onto the present is an ordinary step.
//!
//! ## A hardware (perf `intel_pt`) backend
//!
//! Not implemented here. With a hardware trace only the PC is known at every position: the
//! registers would be served as unavailable (`xx` in the `g` reply) except RIP, memory reads
//! would be refused in the past, and source-level reverse stepping (which needs SP and the stack,
//! see the protocol notes §1.4) would not work; reverse-stepi and reverse-continue would.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::capture::soft::{
    Exit, RecordError, RecorderStats, Regs, SoftRecorder, StepEvent, procmaps::capture_image,
};
use crate::flow::FlowConfig;
use crate::history::{Breakpoints as BpSet, HistoryWorker};
use crate::image::{ElfSpec, Image, Symbolizer};
use crate::server::MonitorRegistry;
use crate::store::live::TraceStore;
use crate::target::{
    Breakpoints, Notice, PtraceTarget, RegMask, Resume, ReverseExecution, ReverseResume, StopEvent,
    Target, TargetError, TargetResult, X86Registers,
};

/// How long one non-blocking [`Target::wait`] keeps recording before it reports "still
/// running" (so the server can notice an interrupt from GDB).
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// How long a reverse resume waits for the background index to cover the stop. GDB waits for a
/// stop reply without a timeout, so this only bounds a worker that cannot keep up.
pub const INDEX_WAIT: Duration = Duration::from_secs(60);

/// How long a monitor command waits for the index: GDB gives up on a reply after its
/// `remotetimeout` (2 s by default).
pub const MONITOR_INDEX_WAIT: Duration = Duration::from_millis(1500);

/// Trace bytes the worker decodes per step while the target runs. The store is locked for the
/// step (the drainer waits meanwhile), so it is kept well below the worker's default.
const LIVE_WINDOW: usize = 64 * 1024;

fn record_err(e: RecordError) -> TargetError {
    match e {
        RecordError::Target(t) => TargetError::Unexpected {
            pid: 0,
            what: format!("recorder: {t}"),
        },
        other => TargetError::Unexpected {
            pid: 0,
            what: format!("recorder: {other}"),
        },
    }
}

/// What a resumed [`RecordingTarget`] is doing until [`Target::wait`] reports the stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Running {
    /// Stopped.
    Idle,
    /// Forward, live, through the recorder (`step`: one instruction).
    Recorded { step: bool, executed_any: bool },
    /// Forward, live, untraced (recording off): the ptrace target runs by itself.
    Untraced,
    /// A stop that is already known (replay moves are computed at resume time).
    Ready(StopEvent),
}

/// Consistency problems found when the index of a stop completes; shown by `monitor stats`.
#[derive(Debug, Default, Clone)]
pub struct Checks {
    /// Stops at which the history length differed from the recorded instruction count.
    pub length_mismatches: u64,
    /// The last mismatch, described.
    pub last_mismatch: Option<String>,
    /// Replay positions where the state log's RIP differed from the history's instruction.
    pub pc_mismatches: u64,
}

/// The shared state of a recording session: the recorder (which owns the ptrace target), the
/// history and the replay cursor. [`RecordingTarget`] and the monitor commands share it.
pub struct Recorder {
    rec: SoftRecorder<PtraceTarget>,
    /// Indexes the history from the store on its own thread.
    worker: HistoryWorker<TraceStore>,
    /// The history length, once the index covers the last stop (checked); `None` until then.
    index: Option<u64>,
    /// Instructions the worker had indexed when the target last stopped: what was indexed in
    /// the background while it ran.
    indexed_at_stop: u64,
    image: Arc<Image>,
    /// `/proc/PID/maps` lines of executable mappings when `image` was captured.
    image_maps: String,
    /// Replay position; `None` at the present.
    cursor: Option<u64>,
    /// Breakpoint addresses GDB set (also kept by the ptrace target for untraced runs).
    bps: BTreeSet<u64>,
    running: Running,
    interrupt: Arc<AtomicBool>,
    /// Whether the user wants recording (`monitor record on|off`).
    record_wanted: bool,
    exited: Option<StopEvent>,
    checks: Checks,
    /// Cache of the registers at the cursor.
    regs_at: Option<(u64, Regs)>,
    notices: Vec<Notice>,
    /// Resumptions run untraced (recording off).
    untraced_runs: u64,
    /// The oldest position the state can be rebuilt for: an untraced run changed registers
    /// and memory without a record, so nothing before it can be undone to. Reverse execution
    /// stops here (`replaylog:begin`).
    floor: u64,
    symbols: Option<Symbolizer>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("cursor", &self.cursor)
            .field("history_len", &self.index)
            .field("running", &self.running)
            .finish_non_exhaustive()
    }
}

fn exec_maps(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|t| {
            t.lines()
                .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

impl Recorder {
    /// Wraps a recorder (built with the state log on) whose process is stopped.
    pub fn new(mut rec: SoftRecorder<PtraceTarget>) -> TargetResult<Self> {
        let pid = Target::pid(rec.target());
        let image_maps = exec_maps(pid);
        let (image, _) = capture_image(rec.target()).map_err(|e| TargetError::Unexpected {
            pid,
            what: format!("cannot snapshot the code: {e}"),
        })?;
        let record_wanted = rec.is_recording();
        let image = Arc::new(image);
        let worker = spawn_worker(&rec.store(), &image).map_err(|e| TargetError::Unexpected {
            pid,
            what: format!("cannot start the history worker: {e}"),
        })?;
        Ok(Recorder {
            rec,
            worker,
            index: None,
            indexed_at_stop: 0,
            image,
            image_maps,
            cursor: None,
            bps: BTreeSet::new(),
            running: Running::Idle,
            interrupt: Arc::new(AtomicBool::new(false)),
            record_wanted,
            exited: None,
            checks: Checks::default(),
            regs_at: None,
            notices: Vec::new(),
            untraced_runs: 0,
            floor: 0,
            symbols: None,
        })
    }

    /// A handle on the recorded trace (the same bytes the history is decoded from). At every
    /// stop the trace ends at the stop PC (FUP + TIP.PGD), so a debugger can decode it as is
    /// (LLDB's `thread trace dump` through `jLLDBTrace*`).
    pub fn trace_store(&self) -> crate::store::live::TraceStore {
        self.rec.store()
    }

    fn ptrace(&mut self) -> &mut PtraceTarget {
        self.rec.target()
    }

    /// Number of instructions in the history (the present's position): the checked history
    /// length once the index covers the last stop, the recorder's count before (the two agree
    /// unless the history check fails).
    pub fn len(&self) -> u64 {
        self.index.unwrap_or_else(|| self.rec.stats().recorded)
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
                Ok(n)
            }
            Err(e) => Err(format!(
                "the recorded history is not indexed yet: {e}; nothing is lost, retry \
                 (monitor stats shows the decode lag)"
            )),
        }
    }

    /// Compares a complete history's length with the recorder's and the state log's counts.
    fn check_length(&mut self, history: u64) {
        let recorded = self.rec.stats().recorded;
        let logged = self.rec.state_log().map(|l| l.len() as u64);
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

    /// Address of history instruction `n`.
    pub fn insn_ip(&mut self, n: u64) -> Option<u64> {
        self.worker
            .with_history(|h, b, img| h.insn(b, img, n))
            .map(|(ip, _)| ip)
    }

    /// Calls `f(n, ip)` for the instructions `from..to` in order (a decode of that range).
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

    /// Moves the cursor (`n >= len()` means the present). Positions before
    /// [`floor`](Self::floor) cannot be reconstructed and are refused.
    pub fn goto(&mut self, n: u64) -> Result<(), String> {
        if n < self.floor {
            return Err(format!(
                "instruction {n} is before an untraced run (recording was off): the state \
                 there cannot be rebuilt; the oldest reachable instruction is {}",
                self.floor
            ));
        }
        self.cursor = (n < self.len()).then_some(n);
        self.regs_at = None;
        Ok(())
    }

    /// The oldest instruction whose state can be rebuilt (after the last untraced run).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Recorder counters.
    pub fn recorder_stats(&self) -> RecorderStats {
        self.rec.stats()
    }

    /// The consistency checks so far.
    pub fn checks(&self) -> &Checks {
        &self.checks
    }

    /// Turns recording on or off (`monitor record on|off`).
    pub fn set_recording(&mut self, on: bool) -> Result<(), String> {
        if self.exited.is_some() {
            return Err("the process has exited".into());
        }
        self.record_wanted = on;
        Ok(())
    }

    /// Whether recording is wanted.
    pub fn recording_wanted(&self) -> bool {
        self.record_wanted
    }

    /// The `monitor stats` text.
    pub fn stats_text(&mut self) -> String {
        // The check needs the complete index; the counters are shown either way.
        let indexed = self.ensure_indexed(MONITOR_INDEX_WAIT);
        let r = self.rec.stats();
        let store = self.rec.store();
        let h = self.worker.stats();
        let log = self.rec.state_log().map(|l| l.stats());
        let log_len = self.rec.state_log().map_or(0, |l| l.len() as u64);
        let mut out = String::new();
        let line = |out: &mut String, k: &str, v: String| {
            out.push_str(&format!("{k:<24} {v}\n"));
        };
        line(
            &mut out,
            "backend",
            "soft (ptrace single-step encoder)".into(),
        );
        line(
            &mut out,
            "recording",
            if self.record_wanted { "on" } else { "off" }.into(),
        );
        line(&mut out, "trace bytes", store.len().to_string());
        line(&mut out, "lost bytes", store.lost().to_string());
        line(&mut out, "gaps", store.gaps().len().to_string());
        line(&mut out, "recorder lost bytes", r.lost_bytes.to_string());
        line(&mut out, "ring PMIs", r.pmis.to_string());
        line(&mut out, "ring inline drains", r.inline_drains.to_string());
        line(&mut out, "recorded instructions", r.recorded.to_string());
        line(&mut out, "history instructions", h.insns.to_string());
        line(&mut out, "state-log instructions", log_len.to_string());
        line(&mut out, "sync points (PSB)", h.sync_points.to_string());
        line(&mut out, "decode lag (bytes)", h.decode_lag.to_string());
        line(&mut out, "indexed trace bytes", h.indexed_bytes.to_string());
        line(
            &mut out,
            "index bytes",
            format!(
                "{} ({:.4} per trace byte)",
                h.index_bytes,
                h.index_bytes as f64 / h.trace_bytes.max(1) as f64
            ),
        );
        line(&mut out, "index updates", h.updates.to_string());
        line(
            &mut out,
            "indexed at last stop",
            format!("{} instructions (in the background)", self.indexed_at_stop),
        );
        line(
            &mut out,
            "index complete",
            if h.complete { "yes" } else { "no" }.into(),
        );
        line(&mut out, "decode errors", h.errors.to_string());
        line(&mut out, "overflows", h.overflows.to_string());
        line(&mut out, "unrecorded steps", r.unrecorded.to_string());
        line(&mut out, "untraced runs", self.untraced_runs.to_string());
        line(&mut out, "reverse floor", self.floor.to_string());
        line(&mut out, "single steps", r.single_steps.to_string());
        line(&mut out, "signal stops", r.signal_stops.to_string());
        line(&mut out, "recorder anomalies", r.anomalies.to_string());
        line(&mut out, "syscall restarts", r.syscall_restarts.to_string());
        if let Some(l) = log {
            line(&mut out, "state-log bytes", l.total_bytes.to_string());
            let per = if l.instructions == 0 {
                0.0
            } else {
                l.total_bytes as f64 / l.instructions as f64
            };
            line(&mut out, "state-log bytes/insn", format!("{per:.2}"));
            line(
                &mut out,
                "state-log unknown writes",
                l.unknown_writes.to_string(),
            );
            line(
                &mut out,
                "state-log unknown syscalls",
                l.unknown_syscalls.to_string(),
            );
            line(
                &mut out,
                "state-log vector snaps",
                format!(
                    "{} ({} bytes, {} unknown)",
                    l.vector_snapshots, l.vector_bytes, l.vector_unknown
                ),
            );
        }
        line(
            &mut out,
            "cursor",
            match self.cursor {
                Some(n) => format!("{n} (replaying)"),
                None => format!("{} (present)", self.len()),
            },
        );
        let consistent = h.insns == r.recorded && (log.is_none() || log_len == r.recorded);
        line(
            &mut out,
            "history check",
            if let Err(e) = indexed {
                format!("pending: {e}")
            } else if consistent && self.checks.length_mismatches == 0 {
                "ok: history length == recorded instructions".into()
            } else {
                format!(
                    "ERROR: history {} vs recorded {} vs state log {}; {} mismatching stop(s){}",
                    h.insns,
                    r.recorded,
                    log_len,
                    self.checks.length_mismatches,
                    self.checks
                        .last_mismatch
                        .as_ref()
                        .map(|m| format!(" (last: {m})"))
                        .unwrap_or_default()
                )
            },
        );
        if self.checks.pc_mismatches > 0 {
            line(
                &mut out,
                "replay PC check",
                format!(
                    "ERROR: {} position(s) where the state log's RIP differs from the trace",
                    self.checks.pc_mismatches
                ),
            );
        }
        out
    }

    /// Brings the trace up to the current stop and asks for the index without waiting for it:
    /// closes the trace at the PC, re-snapshots the code if mappings changed, drains the ring and
    /// asks the worker to complete the index (checked by [`ensure_indexed`](Self::ensure_indexed)).
    fn sync_history(&mut self) {
        if self.exited.is_none() {
            if self.rec.is_recording() {
                // FUP + TIP.PGD at the PC: the trace now ends exactly here.
                if let Err(e) = self.rec.record_off() {
                    self.checks.last_mismatch = Some(format!("closing the trace: {e}"));
                }
            }
            let pid = Target::pid(self.ptrace());
            let maps = exec_maps(pid);
            if maps != self.image_maps
                && let Ok((image, _)) = capture_image(self.rec.target())
            {
                self.image = Arc::new(image);
                self.image_maps = maps;
                // The worker may have decoded code of the new mapping against the old image
                // while the target ran: index again from the start against the new one.
                match spawn_worker(&self.rec.store(), &self.image) {
                    Ok(w) => self.worker = w,
                    Err(_) => self.worker.set_image(Arc::clone(&self.image)),
                }
            }
        }
        self.rec.sync_store();
        self.indexed_at_stop = self.worker.stats().insns;
        self.worker.request_complete();
        self.index = None;
        self.regs_at = None;
    }

    fn present_regs(&mut self) -> TargetResult<Regs> {
        self.rec.current_regs().map_err(record_err)
    }

    /// General-purpose registers at the cursor.
    fn past_regs(&mut self, n: u64) -> TargetResult<Regs> {
        if let Some((at, r)) = self.regs_at
            && at == n
        {
            return Ok(r);
        }
        let present = self.present_regs()?;
        let log = self.rec.state_log().ok_or(TargetError::Unsupported(
            "registers in the past without a state log",
        ))?;
        let mut r = log
            .registers_at(n as usize, &present)
            .ok_or(TargetError::Unsupported("position beyond the state log"))?;
        if let Some(ip) = self.insn_ip(n)
            && ip != r.rip
        {
            self.checks.pc_mismatches += 1;
            // The trace is authoritative for the PC.
            r.rip = ip;
        }
        self.regs_at = Some((n, r));
        Ok(r)
    }

    fn bp_set(&self) -> BpSet {
        BpSet::new(self.bps.iter().copied())
    }

    fn reverse(&mut self, how: ReverseResume) -> TargetResult<()> {
        if self.exited.is_some() {
            return Err(TargetError::Unsupported(
                "reverse execution after the process exited",
            ));
        }
        self.ensure_indexed(INDEX_WAIT)
            .map_err(|what| TargetError::Unexpected { pid: 0, what })?;
        let c = self.position();
        let ev = match how {
            ReverseResume::Step => {
                if c <= self.floor {
                    StopEvent::HistoryEnd { at_begin: true }
                } else {
                    self.cursor = Some(c - 1);
                    StopEvent::Step
                }
            }
            ReverseResume::Continue => {
                let mut m = self.bp_set();
                let hit = self
                    .worker
                    .with_history(|h, b, img| h.rfind_with(b, img, c, &mut m));
                match hit {
                    Some(k) if k >= self.floor => {
                        self.cursor = Some(k);
                        let pc = self.insn_ip(k).unwrap_or(0);
                        StopEvent::Breakpoint { pc }
                    }
                    _ => {
                        self.cursor = (self.floor < self.len()).then_some(self.floor);
                        StopEvent::HistoryEnd { at_begin: true }
                    }
                }
            }
        };
        self.running = Running::Ready(ev);
        Ok(())
    }

    fn resume_replay(&mut self, how: Resume, c: u64) {
        let len = self.len();
        let ev = match how {
            Resume::Step { .. } => {
                self.cursor = (c + 1 < len).then_some(c + 1);
                StopEvent::Step
            }
            Resume::Continue { .. } => {
                let mut m = self.bp_set();
                let hit = self
                    .worker
                    .with_history(|h, b, img| h.find_with(b, img, c + 1, &mut m));
                match hit {
                    Some(k) if k < len => {
                        self.cursor = Some(k);
                        let pc = self.insn_ip(k).unwrap_or(0);
                        StopEvent::Breakpoint { pc }
                    }
                    _ => {
                        self.cursor = None;
                        StopEvent::HistoryEnd { at_begin: false }
                    }
                }
            }
        };
        self.running = Running::Ready(ev);
    }

    fn resume(&mut self, how: Resume) -> TargetResult<()> {
        if let Some(ev) = self.exited {
            let pid = Target::pid(self.ptrace());
            let _ = ev;
            return Err(TargetError::Exited { pid });
        }
        self.interrupt.store(false, Ordering::Release);
        self.regs_at = None;
        if let Some(c) = self.cursor {
            self.resume_replay(how, c);
            return Ok(());
        }
        let signal = match how {
            Resume::Continue { signal } | Resume::Step { signal } => signal,
        };
        let signal = signal.and_then(|s| Signal::try_from(s).ok());
        if self.record_wanted {
            // GDB decides what is delivered: the signal that stopped the program, none, or
            // another one.
            self.rec.set_pending_signal(signal);
            self.rec.record_on();
            self.running = Running::Recorded {
                step: matches!(how, Resume::Step { .. }),
                executed_any: false,
            };
        } else {
            self.rec.set_pending_signal(None);
            self.untraced_runs += 1;
            self.floor = self.len();
            let how = match how {
                Resume::Continue { .. } => Resume::Continue {
                    signal: signal.map(|s| s as i32),
                },
                Resume::Step { .. } => Resume::Step {
                    signal: signal.map(|s| s as i32),
                },
            };
            self.ptrace().resume(how)?;
            self.running = Running::Untraced;
        }
        Ok(())
    }

    fn stopped(&mut self, ev: StopEvent) -> StopEvent {
        self.running = Running::Idle;
        if matches!(ev, StopEvent::Exited(_) | StopEvent::Killed(_)) {
            self.exited = Some(ev);
        }
        self.sync_history();
        ev
    }

    fn wait(&mut self, block: bool) -> TargetResult<Option<StopEvent>> {
        match self.running {
            Running::Idle => Err(TargetError::Unexpected {
                pid: 0,
                what: "wait on a stopped target".into(),
            }),
            Running::Ready(ev) => {
                self.running = Running::Idle;
                Ok(Some(ev))
            }
            Running::Untraced => match self.ptrace().wait(block)? {
                Some(ev) => Ok(Some(self.stopped(ev))),
                None => Ok(None),
            },
            Running::Recorded { step, executed_any } => {
                let start = Instant::now();
                let mut executed_any = executed_any;
                loop {
                    if self.interrupt.swap(false, Ordering::AcqRel) && executed_any {
                        return Ok(Some(self.stopped(StopEvent::Signal(libc::SIGINT))));
                    }
                    let ev = self.rec.step().map_err(record_err)?;
                    match ev {
                        StepEvent::Executed { .. } | StepEvent::Iteration { .. } => {
                            executed_any = true;
                            if step {
                                return Ok(Some(self.stopped(StopEvent::Step)));
                            }
                            let pc = self.present_regs()?.rip;
                            if self.bps.contains(&pc) {
                                return Ok(Some(self.stopped(StopEvent::Breakpoint { pc })));
                            }
                        }
                        StepEvent::HandlerEntered { handler, .. } => {
                            executed_any = true;
                            if step {
                                return Ok(Some(self.stopped(StopEvent::Step)));
                            }
                            if self.bps.contains(&handler) {
                                return Ok(Some(
                                    self.stopped(StopEvent::Breakpoint { pc: handler }),
                                ));
                            }
                        }
                        StepEvent::Signal { signal, .. } => {
                            return Ok(Some(self.stopped(StopEvent::Signal(signal as i32))));
                        }
                        StepEvent::Exited(Exit::Code(c)) => {
                            return Ok(Some(self.stopped(StopEvent::Exited(c))));
                        }
                        StepEvent::Exited(Exit::Signal(s)) => {
                            return Ok(Some(self.stopped(StopEvent::Killed(s as i32))));
                        }
                    }
                    if !block && start.elapsed() >= WAIT_SLICE {
                        self.running = Running::Recorded { step, executed_any };
                        return Ok(None);
                    }
                }
            }
        }
    }
}

/// A live process recorded by the software backend, with reverse execution (see the module
/// docs). Cheap handle on shared state: [`RecordingTarget::shared`] gives the state to monitor
/// commands.
#[derive(Debug, Clone)]
pub struct RecordingTarget {
    inner: Rc<RefCell<Recorder>>,
    pid: i32,
    exe: Option<PathBuf>,
    interrupt: Arc<AtomicBool>,
}

impl RecordingTarget {
    /// Wraps a recorder over a ptrace target (the recorder must have its state log on for
    /// registers and memory in the past).
    pub fn new(mut rec: SoftRecorder<PtraceTarget>) -> TargetResult<Self> {
        let pid = Target::pid(rec.target());
        let exe = rec.target().exec_path();
        let mut r = Recorder::new(rec)?;
        // Index what was recorded before GDB connects (nothing when recording starts at main).
        r.sync_history();
        let interrupt = Arc::clone(&r.interrupt);
        Ok(RecordingTarget {
            inner: Rc::new(RefCell::new(r)),
            pid,
            exe,
            interrupt,
        })
    }

    /// The shared recording state (for monitor commands).
    pub fn shared(&self) -> Rc<RefCell<Recorder>> {
        Rc::clone(&self.inner)
    }
}

impl Target for RecordingTarget {
    fn pid(&self) -> i32 {
        self.pid
    }

    fn exec_path(&self) -> Option<PathBuf> {
        self.exe.clone()
    }

    fn read_registers(&mut self) -> TargetResult<X86Registers> {
        let mut r = self.inner.borrow_mut();
        if r.exited.is_some() {
            return Err(TargetError::Exited { pid: self.pid });
        }
        let live = r.ptrace().read_registers()?;
        match r.cursor {
            None => Ok(live),
            Some(n) => {
                let past = r.past_regs(n)?;
                // Vector/x87 state: the log's snapshot, or unavailable — never the present
                // values, which may differ.
                let mut xsave = live.xsave;
                let known = r
                    .rec
                    .state_log()
                    .is_some_and(|log| log.xstate_at(n as usize, &mut xsave));
                let mut regs = X86Registers::from_parts(&past, xsave);
                if !known {
                    regs.unavailable = RegMask::VECTOR;
                }
                Ok(regs)
            }
        }
    }

    fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()> {
        let mut r = self.inner.borrow_mut();
        if r.cursor.is_some() {
            return Err(TargetError::Unsupported(
                "changing registers in the past (go to the present first: monitor goto end)",
            ));
        }
        r.ptrace().write_registers(regs)
    }

    fn read_memory(&self, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        let mut r = self.inner.borrow_mut();
        let n = Target::read_memory(r.ptrace(), addr, buf)?;
        if let Some(pos) = r.cursor
            && let Some(log) = r.rec.state_log()
        {
            log.memory_at(pos as usize, addr, &mut buf[..n]);
        }
        Ok(n)
    }

    fn write_memory(&mut self, addr: u64, data: &[u8]) -> TargetResult<()> {
        let mut r = self.inner.borrow_mut();
        if r.cursor.is_some() {
            return Err(TargetError::Unsupported(
                "changing memory in the past (go to the present first: monitor goto end)",
            ));
        }
        r.ptrace().write_memory(addr, data)
    }

    fn resume(&mut self, how: Resume) -> TargetResult<()> {
        self.inner.borrow_mut().resume(how)
    }

    fn wait(&mut self, block: bool) -> TargetResult<Option<StopEvent>> {
        self.inner.borrow_mut().wait(block)
    }

    fn interrupt(&mut self) -> TargetResult<()> {
        self.interrupt.store(true, Ordering::Release);
        let mut r = self.inner.borrow_mut();
        if r.running == Running::Untraced {
            r.ptrace().interrupt()?;
        }
        Ok(())
    }

    fn kill(&mut self) -> TargetResult<()> {
        let mut r = self.inner.borrow_mut();
        r.running = Running::Idle;
        r.ptrace().kill()
    }

    fn detach(&mut self) -> TargetResult<()> {
        self.inner.borrow_mut().ptrace().detach()
    }

    fn has_exited(&self) -> bool {
        let mut r = self.inner.borrow_mut();
        r.exited.is_some() || r.ptrace().has_exited()
    }

    fn take_notices(&mut self) -> Vec<Notice> {
        let mut r = self.inner.borrow_mut();
        let mut n = std::mem::take(&mut r.notices);
        n.extend(r.ptrace().take_notices());
        n
    }

    fn support_breakpoints(&mut self) -> Option<&mut dyn Breakpoints> {
        Some(self)
    }

    fn support_reverse(&mut self) -> Option<&mut dyn ReverseExecution> {
        Some(self)
    }
}

impl Breakpoints for RecordingTarget {
    fn add_breakpoint(&mut self, addr: u64) -> TargetResult<()> {
        let mut r = self.inner.borrow_mut();
        if let Some(bp) = r.ptrace().support_breakpoints() {
            bp.add_breakpoint(addr)?;
        }
        r.bps.insert(addr);
        Ok(())
    }

    fn remove_breakpoint(&mut self, addr: u64) -> TargetResult<bool> {
        let mut r = self.inner.borrow_mut();
        if let Some(bp) = r.ptrace().support_breakpoints() {
            bp.remove_breakpoint(addr)?;
        }
        Ok(r.bps.remove(&addr))
    }

    fn breakpoint_addrs(&self) -> Vec<u64> {
        self.inner.borrow().bps.iter().copied().collect()
    }
}

impl ReverseExecution for RecordingTarget {
    fn resume_reverse(&mut self, how: ReverseResume) -> TargetResult<()> {
        self.inner.borrow_mut().reverse(how)
    }
}

/// Starts indexing `store` against `image` in the background, woken by every append.
fn spawn_worker(
    store: &TraceStore,
    image: &Arc<Image>,
) -> std::io::Result<HistoryWorker<TraceStore>> {
    let w = HistoryWorker::spawn_with_window(
        Arc::new(store.clone()),
        Arc::clone(image),
        FlowConfig::default(),
        LIVE_WINDOW,
    )?;
    store.set_listener(Some(w.notifier()));
    Ok(w)
}

fn symbolizer_for(pid: i32) -> Symbolizer {
    let mut sym = Symbolizer::new();
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return sym;
    };
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[5].starts_with('/') || f[2] != "00000000" {
            continue;
        }
        let Some(start) = f[0]
            .split('-')
            .next()
            .and_then(|a| u64::from_str_radix(a, 16).ok())
        else {
            continue;
        };
        if seen.insert(f[5].to_string()) {
            // An object that cannot be read just has no symbols.
            let _ = sym.add_file(&ElfSpec::new(f[5], Some(start)));
        }
    }
    sym
}

/// `function+off (file:line)` for an address.
fn describe(sym: &Symbolizer, addr: u64) -> String {
    let mut s = match sym.symbol(addr) {
        Some((name, 0)) => name.to_string(),
        Some((name, off)) => format!("{name}+{off}"),
        None => "??".to_string(),
    };
    if let Some((file, line)) = sym.line(addr) {
        let short = file.rsplit('/').next().unwrap_or(&file).to_string();
        s.push_str(&format!(" at {short}:{line}"));
    }
    s
}

fn parse_count(args: &str, default: u64) -> Result<u64, String> {
    let a = args.trim();
    if a.is_empty() {
        return Ok(default);
    }
    a.parse::<u64>()
        .map_err(|_| format!("expected a number, got '{a}'"))
}

/// How far back `monitor history`/`calls` decode at most.
const SCAN_WINDOW: u64 = 200_000;

impl Recorder {
    fn symbolizer(&mut self) -> &Symbolizer {
        let pid = self.pid();
        self.symbols.get_or_insert_with(|| symbolizer_for(pid))
    }

    fn pid(&mut self) -> i32 {
        Target::pid(self.ptrace())
    }

    /// The `monitor where` text.
    pub fn where_text(&mut self) -> String {
        let len = self.len();
        let pos = self.position();
        let pc = if pos < len {
            self.insn_ip(pos)
        } else if self.exited.is_none() {
            self.present_regs().ok().map(|r| r.rip)
        } else {
            None
        };
        let place = pc.map_or_else(String::new, |pc| {
            format!(", pc {pc:#x} in {}", describe(self.symbolizer(), pc))
        });
        if pos < len {
            format!("replaying: instruction {pos} of {len}{place}\n")
        } else {
            format!("at the present: instruction {pos} of {len} (live){place}\n")
        }
    }

    /// Branches (from, to) among the instructions before the cursor, oldest first, at most `max`.
    fn branches(&mut self, max: u64) -> Vec<(u64, u64, u64)> {
        let end = self.position();
        let start = end.saturating_sub(SCAN_WINDOW);
        let mut out: std::collections::VecDeque<(u64, u64, u64)> = Default::default();
        let mut prev: Option<(u64, u64, u8)> = None;
        // Include the cursor's instruction, so the last branch into it counts.
        let upto = (end + 1).min(self.len());
        self.for_each_insn(start, upto, |n, ip, len| {
            if let Some((pn, pip, plen)) = prev
                && pip.wrapping_add(u64::from(plen)) != ip
            {
                out.push_back((pn, pip, ip));
                if out.len() as u64 > max {
                    out.pop_front();
                }
            }
            prev = Some((n, ip, len));
        });
        out.into_iter().collect()
    }

    /// The `monitor history [N]` text.
    pub fn history_text(&mut self, max: u64) -> String {
        let branches = self.branches(max);
        if branches.is_empty() {
            return "no branches recorded before the cursor\n".into();
        }
        let mut out = String::new();
        for (n, from, to) in branches {
            let sym = self.symbolizer();
            out.push_str(&format!(
                "{n:>10}  {from:#014x} {}\n            -> {to:#014x} {}\n",
                describe(sym, from),
                describe(sym, to)
            ));
        }
        out
    }

    /// The `monitor calls [N]` text: function segments before the cursor, indented by call
    /// depth (a transfer to a function's first byte is a call, any other change of function a
    /// return), like GDB's `record function-call-history`.
    pub fn calls_text(&mut self, max: u64) -> String {
        let end = (self.position() + 1).min(self.len());
        let start = end.saturating_sub(SCAN_WINDOW);
        let mut ips: Vec<(u64, u64)> = Vec::new();
        self.for_each_insn(start, end, |n, ip, _| ips.push((n, ip)));
        let sym = self.symbolizer().clone();
        // (first insn, last insn, depth, function name)
        let mut segs: Vec<(u64, u64, i64, String)> = Vec::new();
        let mut depth: i64 = 0;
        for (n, ip) in ips {
            let (name, off) = sym
                .symbol(ip)
                .map_or(("??".to_string(), u64::MAX), |(s, o)| (s.to_string(), o));
            match segs.last_mut() {
                Some(last) if last.3 == name && off != 0 => last.1 = n,
                Some(_) => {
                    depth += if off == 0 { 1 } else { -1 };
                    segs.push((n, n, depth, name));
                }
                None => segs.push((n, n, 0, name)),
            }
        }
        let min = segs.iter().map(|s| s.2).min().unwrap_or(0);
        let skip = segs.len().saturating_sub(max as usize);
        let mut out = String::new();
        for (i, (a, b, d, name)) in segs.iter().enumerate().skip(skip) {
            out.push_str(&format!(
                "{i:>6}\t{}{name}\tinst {a},{b}\n",
                "  ".repeat((d - min) as usize)
            ));
        }
        if out.is_empty() {
            out.push_str("no instructions recorded before the cursor\n");
        }
        out
    }
}

fn regs_json(r: &Regs) -> serde_json::Value {
    let names = crate::capture::soft::state_log::REG_NAMES;
    let vals = crate::capture::soft::state_log::regs_to_array(r);
    serde_json::Value::Object(
        names
            .iter()
            .zip(vals)
            .map(|(n, v)| (n.to_string(), serde_json::Value::String(format!("{v:#x}"))))
            .collect(),
    )
}

impl Recorder {
    /// Writes a self-contained recording into `dir` (`monitor save DIR`): `trace.pt`, the code
    /// as raw sections (`code-ADDR.bin`), `manifest.json` (sections, registers at the first
    /// recorded instruction and at the present, counters), `maps.json` and a `README` with the
    /// exact `ptrewind decode` command. Returns a summary.
    pub fn save(&mut self, dir: &std::path::Path) -> Result<String, String> {
        let insns = self.ensure_indexed(MONITOR_INDEX_WAIT)?;
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        std::fs::create_dir_all(dir).map_err(|e| io(&dir.display().to_string(), e))?;
        let trace = self.rec.store().to_vec();
        std::fs::write(dir.join("trace.pt"), &trace).map_err(|e| io("trace.pt", e))?;
        let mut sections = Vec::new();
        let mut raw_args = Vec::new();
        for sec in self.image.sections() {
            let name = format!("code-{:x}.bin", sec.addr);
            std::fs::write(dir.join(&name), sec.data()).map_err(|e| io(&name, e))?;
            raw_args.push(format!(
                "--raw {}:{:#x}",
                dir.join(&name).display(),
                sec.addr
            ));
            sections.push(serde_json::json!({
                "file": name,
                "addr": format!("{:#x}", sec.addr),
                "len": sec.data().len(),
                "origin": &*sec.origin,
            }));
        }
        let pid = self.pid();
        let maps: Vec<serde_json::Value> = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::Value::String(l.to_string()))
            .collect();
        std::fs::write(
            dir.join("maps.json"),
            serde_json::to_string_pretty(&maps).unwrap_or_default(),
        )
        .map_err(|e| io("maps.json", e))?;
        let present = if self.exited.is_none() {
            self.present_regs().ok()
        } else {
            None
        };
        let start = present.and_then(|p| self.rec.state_log().and_then(|l| l.registers_at(0, &p)));
        let r = self.rec.stats();
        let manifest = serde_json::json!({
            "format": "ptrewind-recording-1",
            "trace": "trace.pt",
            "trace_bytes": trace.len(),
            "lost_bytes": self.rec.store().lost(),
            "instructions": insns,
            "recorded_instructions": r.recorded,
            "sync_points": self.worker.stats().sync_points,
            "sections": sections,
            "registers_at_start": start.as_ref().map(regs_json),
            "registers_at_end": present.as_ref().map(regs_json),
        });
        std::fs::write(
            dir.join("manifest.json"),
            serde_json::to_string_pretty(&manifest).unwrap_or_default(),
        )
        .map_err(|e| io("manifest.json", e))?;
        let cmd = format!(
            "ptrewind decode --pt {} {}",
            dir.join("trace.pt").display(),
            raw_args.join(" ")
        );
        let readme = format!(
            "A ptrewind recording (software backend).\n\n\
             trace.pt       Intel PT packets of {} instructions\n\
             code-*.bin     the executable mappings' bytes (see manifest.json for addresses)\n\
             manifest.json  sections, registers at the first recorded instruction and at the end\n\
             maps.json      /proc/PID/maps when saved\n\n\
             Decode with:\n\n    {cmd}\n",
            insns
        );
        std::fs::write(dir.join("README"), readme).map_err(|e| io("README", e))?;
        Ok(format!(
            "saved {} trace bytes, {} instructions, {} code sections to {}\ndecode with: {cmd}\n",
            trace.len(),
            insns,
            self.image.sections().len(),
            dir.display()
        ))
    }
}

/// Registers the recording monitor commands (`stats`, `record`, `where`, `goto`, `history`,
/// `calls`) on `registry`, over the shared state of a [`RecordingTarget`].
pub fn register_monitors(registry: &mut MonitorRegistry, target: &RecordingTarget) {
    let s = target.shared();
    registry.register(
        "stats",
        "trace, history and state-log statistics, with the history consistency check",
        move |_, _| Ok(s.borrow_mut().stats_text()),
    );
    let s = target.shared();
    registry.register(
        "record",
        "record on|off: turn recording on or off",
        move |_, a| {
            let on = match a.trim() {
                "on" => true,
                "off" => false,
                "" => {
                    return Ok(format!(
                        "recording is {}\n",
                        if s.borrow().recording_wanted() {
                            "on"
                        } else {
                            "off"
                        }
                    ));
                }
                other => return Err(format!("expected 'on' or 'off', got '{other}'")),
            };
            s.borrow_mut().set_recording(on)?;
            Ok(format!("recording {}\n", if on { "on" } else { "off" }))
        },
    );
    let s = target.shared();
    registry.register(
        "where",
        "instruction number of the cursor and of the present",
        move |_, _| Ok(s.borrow_mut().where_text()),
    );
    let s = target.shared();
    registry.register(
        "goto",
        "goto N|begin|end: move the replay cursor (then 'maintenance flush register-cache')",
        move |_, a| {
            let mut r = s.borrow_mut();
            let len = r.ensure_indexed(MONITOR_INDEX_WAIT)?;
            let n = match a.trim() {
                "begin" | "start" => r.floor(),
                "end" | "present" => len,
                other => other
                    .parse::<u64>()
                    .map_err(|_| format!("expected N, begin or end, got '{other}'"))?,
            };
            if n > len {
                return Err(format!("instruction {n} is beyond the history ({len})"));
            }
            r.goto(n)?;
            Ok(r.where_text())
        },
    );
    let s = target.shared();
    registry.register(
        "save",
        "save DIR: write the recording (trace, code, registers, manifest) to DIR",
        move |_, a| {
            if a.trim().is_empty() {
                return Err("usage: monitor save DIR".into());
            }
            s.borrow_mut().save(std::path::Path::new(a.trim()))
        },
    );
    let s = target.shared();
    registry.register(
        "history",
        "history [N]: the last N branches before the cursor (default 10)",
        move |_, a| {
            let n = parse_count(a, 10)?;
            let mut r = s.borrow_mut();
            r.ensure_indexed(MONITOR_INDEX_WAIT)?;
            Ok(r.history_text(n))
        },
    );
    let s = target.shared();
    registry.register(
        "calls",
        "calls [N]: the last N function segments before the cursor, indented by call depth",
        move |_, a| {
            let n = parse_count(a, 20)?;
            let mut r = s.borrow_mut();
            r.ensure_indexed(MONITOR_INDEX_WAIT)?;
            Ok(r.calls_text(n))
        },
    );
    let s = target.shared();
    registry.register(
        "insns",
        "insns FROM TO|end: the address of each history instruction FROM..TO (at most 100000)",
        move |_, a| insns_text(&mut s.borrow_mut(), a),
    );
}

/// `monitor insns FROM TO`: one `N 0xADDR` line per history instruction in `FROM..TO`.
fn insns_text(r: &mut Recorder, args: &str) -> Result<String, String> {
    const MAX: u64 = 100_000;
    let usage = || format!("usage: monitor insns FROM TO|end (got '{args}')");
    let len = r.len();
    let mut it = args.split_whitespace().map(|w| match w {
        "end" | "present" => Ok(len),
        n => n.parse::<u64>(),
    });
    let (Some(Ok(from)), Some(Ok(to)), None) = (it.next(), it.next(), it.next()) else {
        return Err(usage());
    };
    if to < from || to - from > MAX {
        return Err(format!(
            "FROM..TO must be ascending and at most {MAX} instructions"
        ));
    }
    let len = r.len();
    if to > len {
        return Err(format!("instruction {to} is beyond the history ({len})"));
    }
    let mut out = String::new();
    r.for_each_insn(from, to, |n, ip, _| {
        use std::fmt::Write as _;
        let _ = writeln!(out, "{n} {ip:#x}");
    });
    Ok(out)
}
