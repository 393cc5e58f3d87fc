//! The software backend as a [`LiveBackend`]: the [`SoftRecorder`] single-steps the process,
//! encodes Intel PT packets into its ToPA ring (drained into the store by its own thread) and,
//! with its state log on, keeps every instruction's register changes and overwritten memory.
//!
//! GDB's breakpoints are never written into the process while recording: the recorder stops
//! after every instruction and the PC is compared with the breakpoint set. With recording off
//! the process runs at full speed through the ptrace target (its INT3 breakpoints), untraced.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::state_log::WriteHit;
use super::{Exit, RecordError, SoftRecorder, StateLog, StepEvent};
use crate::capture::backend::{
    ExecBoundary, LiveBackend, PastWrite, RecordedState, ptrace_present_state,
};
use crate::store::live::TraceStore;
use crate::target::{
    Gprs, HeldChildReply, HeldChildRequest, PtraceTarget, RegMask, Resume, StopEvent, Target,
    TargetError, TargetResult, X86Registers,
};

/// How long one non-blocking wait keeps recording before it reports "still running" (so the
/// server can notice an interrupt from GDB).
const WAIT_SLICE: Duration = Duration::from_millis(50);

fn record_err(e: RecordError) -> TargetError {
    match e {
        // One error type for every ptrace operation: the target's own error goes up as it is.
        RecordError::Target(t) => t,
        other => TargetError::Unexpected {
            pid: 0,
            what: format!("recorder: {other}"),
        },
    }
}

/// What a forward run of the software backend is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// Stopped.
    Idle,
    /// Through the recorder (`step`: one instruction of that thread; the others may run
    /// meanwhile, in their turns).
    Recorded {
        step: Option<i32>,
        executed_any: bool,
    },
    /// Untraced: the ptrace target runs by itself.
    Untraced,
}

/// The software backend of a live recording.
pub struct SoftCapture {
    rec: SoftRecorder<PtraceTarget>,
    pid: i32,
    /// The thread of the last stop.
    stop_tid: i32,
    run: Run,
    /// Watched `[addr, addr + len)` ranges (write watchpoints).
    watches: Vec<(u64, u64)>,
    /// The watched ranges' bytes when the run started (read lazily): a step whose writes the
    /// state log does not know is a watch stop only if it changed them.
    watched_bytes: Option<Vec<Option<Vec<u8>>>>,
}

impl std::fmt::Debug for SoftCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftCapture")
            .field("run", &self.run)
            .finish_non_exhaustive()
    }
}

impl SoftCapture {
    /// Wraps a recorder whose process is stopped. With its state log on, registers and memory
    /// are rebuilt at every past position; without, the past is served PC-only (like the
    /// hardware backend).
    pub fn new(mut rec: SoftRecorder<PtraceTarget>) -> Self {
        let pid = Target::pid(rec.target());
        SoftCapture {
            rec,
            pid,
            stop_tid: pid,
            run: Run::Idle,
            watches: Vec::new(),
            watched_bytes: None,
        }
    }

    /// Whether the end of the program is a place in the history: when the process exits or
    /// dies it stays stopped at its exit event, still alive ([`StopEvent::Exiting`]), so the
    /// past stays readable from there; the next resume lets it exit.
    pub fn stop_at_exit(mut self, on: bool) -> Self {
        self.rec.target().set_stop_at_exit(on);
        self.rec.set_stop_at_exit(on);
        self
    }

    /// Whether the recorder is recording now.
    pub fn is_recording(&self) -> bool {
        self.rec.is_recording()
    }

    /// The present bytes of every watched range (`None` where unreadable).
    fn read_watched(&mut self) -> Vec<Option<Vec<u8>>> {
        let ranges = self.watches.clone();
        ranges
            .iter()
            .map(|&(addr, len)| {
                // Bounded: a huge range must not allocate without limit (only a step with
                // unknown writes compares these bytes).
                let mut buf = vec![0u8; len.min(1 << 20) as usize];
                match Target::read_memory(self.rec.target(), addr, &mut buf) {
                    Ok(n) => {
                        buf.truncate(n);
                        Some(buf)
                    }
                    Err(_) => None,
                }
            })
            .collect()
    }

    /// The watch stop for the entries the state log closed since `mark`, if any: a known write
    /// to a watched range, or a step with unknown writes that changed a watched range (the
    /// live memory says; the ranges had their start-of-run bytes until then, since any known
    /// write to them would have stopped the run).
    fn watch_hit(&mut self, mark: usize) -> Option<StopEvent> {
        if self.watches.is_empty() {
            return None;
        }
        let hit = self
            .rec
            .state_log()?
            .find_write_since(mark, &self.watches)?;
        if let Some(addr) = hit.addr {
            return Some(StopEvent::Watch {
                addr,
                kind: crate::target::WatchKind::Write,
            });
        }
        let before = self.watched_bytes.take().unwrap_or_default();
        let now = self.read_watched();
        let changed = self
            .watches
            .iter()
            .zip(before.iter().zip(now.iter()))
            .find(|(_, (b, n))| b != n)
            .map(|(&(addr, _), _)| addr);
        self.watched_bytes = Some(now);
        changed.map(|addr| StopEvent::Watch {
            addr,
            kind: crate::target::WatchKind::Write,
        })
    }

    fn target(&mut self) -> &mut PtraceTarget {
        self.rec.target()
    }

    /// The general-purpose registers at the present (the recorder's, cached between steps).
    fn present_gprs(&mut self) -> TargetResult<Gprs> {
        self.rec.current_regs().map_err(record_err)
    }

    /// A recorded run stops with `ev`: every thread is brought to a stop first (threads
    /// waiting in system calls are interrupted, see [`SoftRecorder::quiesce`]); if the process
    /// ended meanwhile, that is the stop.
    fn recorded_stop(&mut self, ev: StopEvent) -> TargetResult<Option<StopEvent>> {
        self.run = Run::Idle;
        let ev = match self.rec.quiesce().map_err(record_err)? {
            Some(StepEvent::Exited(Exit::Code(c))) => StopEvent::Exited(c),
            Some(StepEvent::Exited(Exit::Signal(s))) => StopEvent::Killed(s as i32),
            Some(StepEvent::Exiting) => StopEvent::Exiting {
                signal: self.rec.target_ref().exit_signal(),
            },
            _ => ev,
        };
        self.stop_tid = self.rec.current_thread();
        // The process may be another one now (a followed fork child).
        self.pid = Target::pid(self.rec.target_ref());
        Ok(Some(ev))
    }
}

/// Where stream offset `at` lies in the stored bytes (lost bytes are not stored): a position
/// inside a gap is where the gap sits, so the next PSB stored after it counts as after `at`.
fn data_offset(gaps: &[crate::store::live::Gap], at: u64) -> u64 {
    let mut lost = 0;
    for g in gaps {
        if g.stream_offset >= at {
            break;
        }
        if g.stream_offset + g.lost > at {
            return g.data_offset as u64;
        }
        lost += g.lost;
    }
    at - lost
}

impl LiveBackend for SoftCapture {
    ptrace_present_state!(target);

    fn pc(&mut self) -> TargetResult<u64> {
        // The recorder's copy of the stepped thread's registers: no XSAVE read per step.
        self.present_gprs().map(|g| g.rip)
    }

    fn pid(&self) -> i32 {
        self.pid
    }

    fn tid(&self) -> i32 {
        self.stop_tid
    }

    fn threads(&self) -> Vec<i32> {
        let t = self.rec.target_ref().threads();
        if t.is_empty() { vec![self.stop_tid] } else { t }
    }

    fn select_thread(&mut self, tid: i32) -> TargetResult<()> {
        self.rec.target().select_thread(tid)
    }

    fn history_thread(&self) -> i32 {
        self.pid
    }

    fn selected_thread(&self) -> i32 {
        self.rec.target_ref().current_thread()
    }

    fn thread_stores(&self) -> Vec<(i32, TraceStore)> {
        self.rec.thread_stores()
    }

    fn stop_siginfo(&self, tid: i32) -> Option<Vec<u8>> {
        self.rec.stop_siginfo(tid).map(|b| b.to_vec())
    }

    fn threads_at_start(&self) -> Vec<i32> {
        self.rec.threads_at_start().to_vec()
    }

    fn exited_thread_registers(&self, tid: i32) -> Option<X86Registers> {
        self.rec.exited_registers(tid).cloned()
    }

    fn name(&self) -> &'static str {
        if self.rec.state_log().is_some() {
            "soft (ptrace single-step encoder, state log on)"
        } else {
            "soft (ptrace single-step encoder, state log off: PC-only past)"
        }
    }

    fn store(&self) -> TraceStore {
        self.rec.store()
    }

    fn exec_boundaries(&self) -> Vec<ExecBoundary> {
        let gaps = self.rec.store().gaps();
        let thread_gaps: std::collections::BTreeMap<i32, Vec<crate::store::live::Gap>> = self
            .rec
            .thread_stores()
            .into_iter()
            .map(|(tid, store)| (tid, store.gaps()))
            .collect();
        self.rec
            .exec_periods()
            .iter()
            .map(|p| ExecBoundary {
                cause: p.cause.clone(),
                image: Arc::clone(&p.image),
                maps: p.maps.clone(),
                exe: p.exe.clone(),
                next_insn: p.next_insn,
                next_offset: data_offset(&gaps, p.next_stream_offset),
                thread_offsets: p
                    .thread_offsets
                    .iter()
                    .map(|&(tid, off)| {
                        let gaps = thread_gaps.get(&tid).map(Vec::as_slice).unwrap_or(&[]);
                        (tid, data_offset(gaps, off))
                    })
                    .collect(),
            })
            .collect()
    }

    fn recorded(&self) -> Option<u64> {
        // The history is the main thread's stream.
        Some(self.rec.thread_recorded(self.pid))
    }

    fn step_counter(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicU64>> {
        Some(self.rec.step_counter())
    }

    fn recorded_state(&self) -> Option<&dyn RecordedState> {
        self.rec.state_log().map(|_| self as &dyn RecordedState)
    }

    fn set_watches(&mut self, ranges: &[(u64, u64)]) -> bool {
        if self.rec.state_log().is_none() {
            return false;
        }
        self.watches = ranges.to_vec();
        true
    }

    fn resume(&mut self, how: Resume, record: bool) -> TargetResult<()> {
        self.watched_bytes = None;
        let signal = match how {
            Resume::Continue { signal } | Resume::Step { signal, .. } => signal,
        };
        let signal = signal.and_then(|s| Signal::try_from(s).ok());
        if record {
            // The thread the debugger steps (its `Hc`/`vCont` thread), even if it waits in a
            // system call and another one becomes current.
            let selected = self.rec.target_ref().current_thread();
            self.rec.follow_selection().map_err(record_err)?;
            // GDB decides what is delivered: the signal that stopped the program, none, or
            // another one.
            self.rec.set_pending_signal(signal);
            self.rec.record_on();
            let step = matches!(how, Resume::Step { .. });
            if matches!(how, Resume::Step { others: false, .. }) {
                // The others stay where they are: their turn does not come during this step
                // (a stop of another thread during GDB's step over a breakpoint is one GDB does
                // not expect: under QEMU it failed an assertion on one).
                self.rec.restart_slice();
            }
            self.run = Run::Recorded {
                step: step.then_some(selected),
                executed_any: false,
            };
        } else {
            self.rec.set_pending_signal(None);
            // The untraced run goes on from the thread the recorder stands in.
            self.rec.reselect().map_err(record_err)?;
            let how = match how {
                Resume::Continue { .. } => Resume::Continue {
                    signal: signal.map(|s| s as i32),
                },
                Resume::Step { others, .. } => Resume::Step {
                    signal: signal.map(|s| s as i32),
                    others,
                },
            };
            self.rec.target().resume(how)?;
            self.run = Run::Untraced;
        }
        Ok(())
    }

    fn wait(
        &mut self,
        block: bool,
        bps: &BTreeSet<u64>,
        interrupt: &AtomicBool,
    ) -> TargetResult<Option<StopEvent>> {
        let stop = |me: &mut Self, ev: StopEvent| {
            me.run = Run::Idle;
            Ok(Some(ev))
        };
        match self.run {
            Run::Idle => Err(TargetError::Unexpected {
                pid: 0,
                what: "wait on a stopped target".into(),
            }),
            Run::Untraced => match self.rec.target().wait(block)? {
                Some(ev) => {
                    self.stop_tid = self.rec.target().current_thread();
                    self.pid = Target::pid(self.rec.target_ref());
                    stop(self, ev)
                }
                None => Ok(None),
            },
            Run::Recorded { step, executed_any } => {
                let start = Instant::now();
                let mut executed_any = executed_any;
                if !self.watches.is_empty() && self.watched_bytes.is_none() {
                    let bytes = self.read_watched();
                    self.watched_bytes = Some(bytes);
                }
                loop {
                    if interrupt.swap(false, Ordering::AcqRel)
                        && (executed_any || self.rec.is_idle())
                    {
                        return self.recorded_stop(StopEvent::Signal(libc::SIGINT));
                    }
                    let mark = self.rec.state_log().map_or(0, |l| l.entry_count());
                    let ev = self.rec.step().map_err(record_err)?;
                    if let Some(child) = self.rec.target().take_fork_report() {
                        // The `fork` executed (recorded); its child waits for the debugger.
                        let vfork = self.rec.target_ref().held_fork_is_vfork();
                        return self.recorded_stop(StopEvent::Forked { child, vfork });
                    }
                    if self.rec.target().take_vfork_done_report() {
                        return self.recorded_stop(StopEvent::VForkDone);
                    }
                    if self.rec.target().take_exec_report() {
                        // The exec executed (recorded); the debugger loads the new program.
                        return self.recorded_stop(StopEvent::Exec);
                    }
                    if matches!(
                        ev,
                        StepEvent::Executed { .. }
                            | StepEvent::Iteration { .. }
                            | StepEvent::HandlerEntered { .. }
                    ) && let Some(w) = self.watch_hit(mark)
                    {
                        return self.recorded_stop(w);
                    }
                    match ev {
                        StepEvent::Executed { .. } | StepEvent::Iteration { .. } => {
                            executed_any = true;
                            if step == Some(self.rec.current_thread()) {
                                return self.recorded_stop(StopEvent::Step);
                            }
                            // A continue, or another thread's instruction during a step (its
                            // turn came, or the stepped one waits in a system call): as
                            // natively, the others run meanwhile and their breakpoints stop
                            // them (before, such an instruction ended the step as a SIGTRAP in
                            // that thread).
                            // (After a thread's end the next current thread may be waiting in
                            // a system call: no PC to compare until it comes back.)
                            if !self.rec.current_in_flight() {
                                match self.present_gprs() {
                                    Ok(r) if bps.contains(&r.rip) => {
                                        return self
                                            .recorded_stop(StopEvent::Breakpoint { pc: r.rip });
                                    }
                                    Ok(_) => {}
                                    // Killed from outside since the step stopped: the next
                                    // step collects how it ended (the recording is kept).
                                    Err(TargetError::Sys {
                                        source: nix::Error::ESRCH,
                                        ..
                                    }) => {}
                                    Err(e) => return Err(e),
                                }
                            }
                        }
                        StepEvent::HandlerEntered { handler, .. } => {
                            executed_any = true;
                            if step == Some(self.rec.current_thread()) {
                                return self.recorded_stop(StopEvent::Step);
                            }
                            if bps.contains(&handler) {
                                return self.recorded_stop(StopEvent::Breakpoint { pc: handler });
                            }
                        }
                        StepEvent::Idle => {}
                        StepEvent::Signal { signal, .. } => {
                            return self.recorded_stop(StopEvent::Signal(signal as i32));
                        }
                        StepEvent::Exiting => {
                            let signal = self.rec.target_ref().exit_signal();
                            return self.recorded_stop(StopEvent::Exiting { signal });
                        }
                        StepEvent::Exited(Exit::Code(c)) => {
                            return stop(self, StopEvent::Exited(c));
                        }
                        StepEvent::Exited(Exit::Signal(s)) => {
                            return stop(self, StopEvent::Killed(s as i32));
                        }
                    }
                    if !block && start.elapsed() >= WAIT_SLICE {
                        self.run = Run::Recorded { step, executed_any };
                        return Ok(None);
                    }
                }
            }
        }
    }

    fn report_forks(&mut self, client_wants: bool, vforks: bool) -> bool {
        Target::report_forks(self.rec.target(), client_wants, vforks)
    }

    fn report_execs(&mut self, client_wants: bool) -> bool {
        Target::report_execs(self.rec.target(), client_wants)
    }

    fn resolve_fork(&mut self, detach: i32) -> TargetResult<Option<i32>> {
        let now = self.rec.resolve_fork(detach).map_err(record_err)?;
        self.pid = Target::pid(self.rec.target_ref());
        self.stop_tid = self.rec.current_thread();
        Ok(now)
    }

    fn held_fork_child(&self) -> Option<i32> {
        self.rec.target_ref().held_fork_child()
    }

    fn held_child(&mut self, request: HeldChildRequest) -> TargetResult<HeldChildReply> {
        Target::held_child(self.rec.target(), request)
    }

    fn interrupt(&mut self) -> TargetResult<()> {
        if self.run == Run::Untraced {
            self.rec.target().interrupt()?;
        }
        Ok(())
    }

    fn sync_at_stop(&mut self, exited: bool) -> Result<(), String> {
        let mut result = Ok(());
        if !exited && self.rec.is_recording() {
            // FUP + TIP.PGD at the PC: the trace now ends exactly here.
            if let Err(e) = self.rec.record_off() {
                result = Err(format!("closing the trace: {e}"));
            }
        }
        self.rec.sync_store();
        result
    }

    fn stats(&self, line: &mut dyn FnMut(&str, String)) {
        let r = self.rec.stats();
        line("recorder lost bytes", r.lost_bytes.to_string());
        line("ring PMIs", r.pmis.to_string());
        line("ring inline drains", r.inline_drains.to_string());
        line("recorded instructions", r.recorded.to_string());
        let log_len = self.rec.state_log().map_or(0, |l| l.len() as u64);
        line("state-log instructions", log_len.to_string());
        line("unrecorded steps", r.unrecorded.to_string());
        line("single steps", r.single_steps.to_string());
        line("signal stops", r.signal_stops.to_string());
        line("recorder anomalies", r.anomalies.to_string());
        line("syscall restarts", r.syscall_restarts.to_string());
        line(
            "execs / forks followed",
            format!("{} / {}", r.execs, r.forks_followed),
        );
        // Each period of code ended by an exec or a munmap/mmap over code, decoded against
        // the code read before it (see `ExecPeriod`).
        let periods = self.rec.exec_periods();
        let by_exec = periods.iter().filter(|p| p.cause == "exec").count();
        line(
            "code periods ended",
            format!(
                "{} (exec {by_exec}, code unmapped or mapped over {})",
                periods.len(),
                periods.len() - by_exec
            ),
        );
        // Threads: recorded besides the main thread (each its own stream), ended while the
        // process went on, vanished unseen (killed while stopped: their streams end at their
        // last recorded instruction).
        line("threads recorded", r.threads.to_string());
        line("threads ended", r.threads_ended.to_string());
        let t = self.rec.target_ref().thread_stats();
        line(
            "threads lost",
            format!("{} ({} vanished under ptrace)", r.threads_lost, t.vanished),
        );
        line("thread switches", r.switches.to_string());
        line("steps blocked in syscall", r.blocked_steps.to_string());
        line("killed between steps", r.killed_between_steps.to_string());
        if let Some(l) = self.rec.state_log().map(|l| l.stats()) {
            line("state-log bytes", l.total_bytes.to_string());
            let per = if l.instructions == 0 {
                0.0
            } else {
                l.total_bytes as f64 / l.instructions as f64
            };
            line("state-log bytes/insn", format!("{per:.2}"));
            line("state-log unknown writes", l.unknown_writes.to_string());
            line("syscalls not modelled", l.unknown_syscalls.to_string());
            line(
                "state-log vector snaps",
                format!(
                    "{} ({} bytes, {} unknown)",
                    l.vector_snapshots, l.vector_bytes, l.vector_unknown
                ),
            );
        }
    }
}

/// The recorded state as the timeline indexes it: positions are the main thread's instructions
/// (the history is the main thread's stream), the log's are every thread's in global order.
/// Position `n` is the moment before the main thread's instruction `n`: every thread's
/// registers and all memory are rebuilt as they were then; a write found by a search (by any
/// thread) is placed between the main thread's positions around it.
impl RecordedState for SoftCapture {
    fn len(&self) -> u64 {
        self.rec.state_log().map_or(0, |l| l.thread_len(self.pid))
    }

    fn registers_at(&self, n: u64, present: &X86Registers) -> Option<X86Registers> {
        self.registers_at_thread(self.pid, n, present)
    }

    fn registers_at_thread(
        &self,
        tid: i32,
        n: u64,
        present: &X86Registers,
    ) -> Option<X86Registers> {
        let log = self.rec.state_log()?;
        let g = log.global_position(self.pid, n)?;
        RecordedState::registers_at_thread(log, tid, g, present)
    }

    fn thread_at(&self, n: u64) -> Option<i32> {
        let log = self.rec.state_log()?;
        log.thread_at(log.global_position(self.pid, n)? as usize)
    }

    fn global(&self) -> Option<&dyn RecordedState> {
        self.rec.state_log().map(|l| l as &dyn RecordedState)
    }

    fn memory_at(&self, n: u64, addr: u64, buf: &mut [u8]) {
        if let Some(log) = self.rec.state_log()
            && let Some(g) = log.global_position(self.pid, n)
        {
            StateLog::memory_at(log, g as usize, addr, buf);
        }
    }

    fn rfind_write(&self, before: u64, floor: u64, ranges: &[(u64, u64)]) -> Option<PastWrite> {
        let log = self.rec.state_log()?;
        let b = log.global_position(self.pid, before)?;
        let f = log.global_position(self.pid, floor)?;
        StateLog::rfind_write(log, b as usize, f as usize, ranges).map(|h| self.local_write(h))
    }

    fn find_write(&self, from: u64, to: u64, ranges: &[(u64, u64)]) -> Option<PastWrite> {
        let log = self.rec.state_log()?;
        let f = log.global_position(self.pid, from)?;
        let t = log.global_position(self.pid, to)?;
        StateLog::find_write(log, f as usize, t as usize, ranges).map(|h| self.local_write(h))
    }
}

impl SoftCapture {
    /// A write the log found (global positions), placed among the main thread's positions.
    fn local_write(&self, hit: WriteHit) -> PastWrite {
        let mut w = past_write(hit);
        if let Some(log) = self.rec.state_log() {
            let after = log.thread_position(self.pid, w.after);
            w.after = after;
            w.before = after.saturating_sub(1);
        }
        w
    }
}

fn past_write(hit: WriteHit) -> PastWrite {
    PastWrite {
        before: hit.before() as u64,
        after: hit.after() as u64,
        addr: hit.addr,
        unknown: hit.unknown.map(|u| u.to_string()),
    }
}

/// The state log is the software backend's record of the past: every general-purpose register
/// rebuilt exactly by undoing from the present, vector/x87 state from its snapshots, memory
/// with every later write put back.
impl RecordedState for StateLog {
    fn len(&self) -> u64 {
        StateLog::len(self) as u64
    }

    fn registers_at(&self, n: u64, present: &X86Registers) -> Option<X86Registers> {
        let gprs = StateLog::registers_at(self, n as usize, &present.to_libc())?;
        let mut xsave = present.xsave.clone();
        // Vector/x87 state: the log's snapshot, or unavailable — never the present values,
        // which may differ.
        let known = self.xstate_at(n as usize, &mut xsave);
        let mut regs = X86Registers::from_parts(&gprs, xsave);
        if !known {
            regs.unavailable = RegMask::VECTOR;
        }
        Some(regs)
    }

    fn registers_at_thread(
        &self,
        tid: i32,
        n: u64,
        present: &X86Registers,
    ) -> Option<X86Registers> {
        let gprs = StateLog::registers_at_thread(self, tid, n as usize, &present.to_libc())?;
        let mut xsave = present.xsave.clone();
        let known = self.xstate_at_thread(Some(tid), n as usize, &mut xsave);
        let mut regs = X86Registers::from_parts(&gprs, xsave);
        if !known {
            regs.unavailable = RegMask::VECTOR;
        }
        Some(regs)
    }

    fn thread_at(&self, n: u64) -> Option<i32> {
        StateLog::thread_at(self, n as usize)
    }

    fn global_of(&self, tid: i32, n: u64) -> Option<u64> {
        self.global_position(tid, n)
    }

    fn memory_at(&self, n: u64, addr: u64, buf: &mut [u8]) {
        StateLog::memory_at(self, n as usize, addr, buf);
    }

    fn rfind_write(&self, before: u64, floor: u64, ranges: &[(u64, u64)]) -> Option<PastWrite> {
        StateLog::rfind_write(self, before as usize, floor as usize, ranges).map(past_write)
    }

    fn find_write(&self, from: u64, to: u64, ranges: &[(u64, u64)]) -> Option<PastWrite> {
        StateLog::find_write(self, from as usize, to as usize, ranges).map(past_write)
    }
}
