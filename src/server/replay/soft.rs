//! The software backend as a [`LiveCapture`]: the [`SoftRecorder`] single-steps the process,
//! encodes Intel PT packets into its ToPA ring (drained into the store by its own thread) and,
//! with its state log on, keeps every instruction's register changes and overwritten memory.
//!
//! GDB's breakpoints are never written into the process while recording: the recorder stops
//! after every instruction and the PC is compared with the breakpoint set. With recording off
//! the process runs at full speed through the ptrace target (its INT3 breakpoints), untraced.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::capture::LiveCapture;
use crate::capture::soft::{Exit, RecordError, Regs, SoftRecorder, StateLog, StepEvent};
use crate::store::live::TraceStore;
use crate::target::{PtraceTarget, Resume, StopEvent, Target, TargetError, TargetResult};

/// How long one non-blocking wait keeps recording before it reports "still running" (so the
/// server can notice an interrupt from GDB).
const WAIT_SLICE: Duration = Duration::from_millis(50);

pub(super) fn record_err(e: RecordError) -> TargetError {
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

/// What a forward run of the software backend is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// Stopped.
    Idle,
    /// Through the recorder (`step`: one instruction).
    Recorded { step: bool, executed_any: bool },
    /// Untraced: the ptrace target runs by itself.
    Untraced,
}

/// The software backend of a live recording.
pub struct SoftCapture {
    rec: SoftRecorder<PtraceTarget>,
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
    pub fn new(rec: SoftRecorder<PtraceTarget>) -> Self {
        SoftCapture {
            rec,
            run: Run::Idle,
            watches: Vec::new(),
            watched_bytes: None,
        }
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
            return Some(StopEvent::Watch { addr });
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
        changed.map(|addr| StopEvent::Watch { addr })
    }
}

impl LiveCapture for SoftCapture {
    fn backend(&self) -> &'static str {
        if self.rec.state_log().is_some() {
            "soft (ptrace single-step encoder, state log on)"
        } else {
            "soft (ptrace single-step encoder, state log off: PC-only past)"
        }
    }

    fn ptrace(&mut self) -> &mut PtraceTarget {
        self.rec.target()
    }

    fn store(&self) -> TraceStore {
        self.rec.store()
    }

    fn recorded(&self) -> Option<u64> {
        Some(self.rec.stats().recorded)
    }

    fn state_log(&self) -> Option<&StateLog> {
        self.rec.state_log()
    }

    fn present_gprs(&mut self) -> TargetResult<Regs> {
        self.rec.current_regs().map_err(record_err)
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
            Resume::Continue { signal } | Resume::Step { signal } => signal,
        };
        let signal = signal.and_then(|s| Signal::try_from(s).ok());
        if record {
            // GDB decides what is delivered: the signal that stopped the program, none, or
            // another one.
            self.rec.set_pending_signal(signal);
            self.rec.record_on();
            self.run = Run::Recorded {
                step: matches!(how, Resume::Step { .. }),
                executed_any: false,
            };
        } else {
            self.rec.set_pending_signal(None);
            let how = match how {
                Resume::Continue { .. } => Resume::Continue {
                    signal: signal.map(|s| s as i32),
                },
                Resume::Step { .. } => Resume::Step {
                    signal: signal.map(|s| s as i32),
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
                Some(ev) => stop(self, ev),
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
                    if interrupt.swap(false, Ordering::AcqRel) && executed_any {
                        return stop(self, StopEvent::Signal(libc::SIGINT));
                    }
                    let mark = self.rec.state_log().map_or(0, |l| l.entry_count());
                    let ev = self.rec.step().map_err(record_err)?;
                    if matches!(
                        ev,
                        StepEvent::Executed { .. }
                            | StepEvent::Iteration { .. }
                            | StepEvent::HandlerEntered { .. }
                    ) && let Some(w) = self.watch_hit(mark)
                    {
                        return stop(self, w);
                    }
                    match ev {
                        StepEvent::Executed { .. } | StepEvent::Iteration { .. } => {
                            executed_any = true;
                            if step {
                                return stop(self, StopEvent::Step);
                            }
                            let pc = self.present_gprs()?.rip;
                            if bps.contains(&pc) {
                                return stop(self, StopEvent::Breakpoint { pc });
                            }
                        }
                        StepEvent::HandlerEntered { handler, .. } => {
                            executed_any = true;
                            if step {
                                return stop(self, StopEvent::Step);
                            }
                            if bps.contains(&handler) {
                                return stop(self, StopEvent::Breakpoint { pc: handler });
                            }
                        }
                        StepEvent::Signal { signal, .. } => {
                            return stop(self, StopEvent::Signal(signal as i32));
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
        if let Some(l) = self.rec.state_log().map(|l| l.stats()) {
            line("state-log bytes", l.total_bytes.to_string());
            let per = if l.instructions == 0 {
                0.0
            } else {
                l.total_bytes as f64 / l.instructions as f64
            };
            line("state-log bytes/insn", format!("{per:.2}"));
            line("state-log unknown writes", l.unknown_writes.to_string());
            line("state-log unknown syscalls", l.unknown_syscalls.to_string());
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
