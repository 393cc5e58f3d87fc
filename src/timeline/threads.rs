//! Every thread of a recording: one [`Timeline`] per thread, tied together by a
//! [`GlobalOrder`] of their instructions (see [`crate::history::threads`]).
//!
//! A multi-thread timeline is the selected thread's `Timeline` holding a `ThreadGroup`: the
//! other threads' timelines (parked), the global order, and the *global position* `P` — every
//! instruction of every thread before `P` in the global order has executed. Each thread's
//! cursor is its number of instructions before `P` (clamped to its own end), so every thread
//! has a PC at every global position. Selecting a thread swaps its timeline into place, so
//! everything that works on one thread (registers, memory, `monitor history|calls|where`,
//! btrace, LLDB's trace) works on the selected one unchanged.
//!
//! * **Stepping** moves the selected thread by one of its own instructions both ways; `P`
//!   becomes that instruction's global position and the other threads follow.
//! * **reverse-continue** searches every thread backwards from `P` for a breakpoint and stops
//!   at the hit latest in global order, in its thread (which becomes the selected one: the
//!   stop reply names it); **continue** forwards the earliest. GDB's thread-specific
//!   breakpoints work on top of this: GDB resumes again when the stop is in another thread.
//! * **The end**: when a thread was stopped by a fault or a fatal signal (its stream ends with
//!   an asynchronous disable at the faulting instruction), its end position shows that
//!   instruction's PC, the replay starts with that thread selected, and a forward continue
//!   that reaches the end reports the signal in that thread.
//!
//! The past is PC-only for every thread (as for one offline thread): RIP at every position,
//! every other register unavailable.

use super::save::SAVE_FORMAT;
use super::{OfflineInfo, OfflineRecording, Timeline, load_saved, unknown_registers};
use crate::flow::FlowConfig;
use crate::history::{BreakpointSet, GlobalOrder, ThreadClock};
use crate::image::Image;
use crate::store::dirfile::RecordingDir;
use crate::target::{Resume, ReverseResume, StopEvent, TargetError, TargetResult, X86Registers};
use std::sync::Arc;

/// One thread of a recording to replay.
#[derive(Debug)]
pub struct ThreadRecording {
    /// The thread id.
    pub tid: i32,
    /// Its trace, code and what is known about it (`info.tid` is set from `tid`).
    pub recording: OfflineRecording,
}

/// Where one thread stands, for `monitor threads` ([`Timeline::thread_positions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadPosition {
    /// The thread id.
    pub tid: i32,
    /// Instructions the thread executed before the cursor, and its recorded length; `None`
    /// where nothing counted them (the other threads of a live process at its present).
    pub position: Option<(u64, u64)>,
    /// Its PC at the cursor, where known.
    pub pc: Option<u64>,
    /// The thread has exited (at the present of a live process; its past is recorded).
    pub exited: bool,
}

/// The other threads of a multi-thread [`Timeline`] and their global order.
pub(super) struct ThreadGroup {
    pub(super) order: GlobalOrder,
    pub(super) tids: Vec<i32>,
    /// Every thread's timeline but the selected one's (which is the `Timeline` holding this).
    pub(super) parked: Vec<Option<Timeline>>,
    pub(super) selected: usize,
    /// The global position.
    pub(super) pos: u64,
    /// The thread the recording ended in (offline: selected at the start; kept by `monitor
    /// save`).
    pub(super) ended_in: Option<usize>,
    /// The signal that ended the process (in thread `ended_in`), if a fatal one did.
    pub(super) fatal_signal: Option<i32>,
    /// Recorded threads that could not be served, and why.
    pub(super) skipped: Vec<String>,
    /// A live process's past (see `live_threads`): per thread, the PC its stream stopped at
    /// (the next instruction it runs at the present), `None` for a thread that ended.
    pub(super) live_ends: Option<Vec<Option<u64>>>,
    /// A live process's past: per thread, whether it existed before the recording's first
    /// instruction (attached to, or created before recording began), so it is listed from
    /// the start of the history rather than from its own first instruction.
    pub(super) from_start: Vec<bool>,
}

impl ThreadGroup {
    /// Whether thread `k` exists at the global position. In a live process's past a thread
    /// exists from its first instruction (from the start, if it existed before recording
    /// began) until it has ended (its stream ends without a stop there); offline, every
    /// recorded thread is listed throughout.
    fn exists(&self, k: usize) -> bool {
        let Some(ends) = &self.live_ends else {
            return true;
        };
        let n = self.order.executed_before(k, self.pos);
        let ended = ends.get(k).is_some_and(Option::is_none) && n >= self.order.thread_len(k);
        let begun = n > 0 || self.from_start.get(k).copied().unwrap_or(false);
        begun && !ended
    }
}

/// How a process recording ended, when a signal killed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatalSignal {
    /// The Linux signal number.
    pub signal: i32,
    /// The thread it was raised in, when the recording says (otherwise the thread whose
    /// stream ends at an instruction that did not execute, else the last to run).
    pub tid: Option<i32>,
}

/// The threads of a saved multi-thread recording, how it ended (the fatal signal) and the
/// thread it ended in.
pub type SavedThreads = (Vec<ThreadRecording>, Option<FatalSignal>, Option<i32>);

/// Reads a directory written by `monitor save DIR` from a multi-thread recording (see
/// [`Timeline::save_threads`]); `Ok(None)` if it is a single-thread recording.
pub fn load_saved_threads(dir: &std::path::Path) -> Result<Option<SavedThreads>, String> {
    let files = RecordingDir::open(dir).map_err(|e| e.to_string())?;
    let manifest: serde_json::Value = serde_json::from_slice(
        &files
            .read("manifest.json", 1 << 20)
            .map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", dir.join("manifest.json").display()))?;
    let Some(list) = manifest["threads"].as_array() else {
        return Ok(None);
    };
    if manifest["format"].as_str() != Some(SAVE_FORMAT) {
        return Err(format!(
            "{}: not a {SAVE_FORMAT} manifest",
            dir.join("manifest.json").display()
        ));
    }
    let mut threads = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let bad = |what: &str| format!("manifest.json: thread {i}: {what}");
        let tid = t["tid"]
            .as_i64()
            .and_then(|t| i32::try_from(t).ok())
            .filter(|&t| t > 0)
            .ok_or_else(|| bad("no tid"))?;
        // A plain name inside the directory (never `..` or a path elsewhere).
        let name = t["dir"].as_str().ok_or_else(|| bad("no dir"))?;
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(bad("its dir is not a name in the recording directory"));
        }
        let recording = load_saved(&dir.join(name)).map_err(|e| bad(&e))?;
        threads.push(ThreadRecording { tid, recording });
    }
    let fatal = manifest["fatal_signal"]
        .as_i64()
        .and_then(|s| i32::try_from(s).ok())
        .map(|signal| FatalSignal {
            signal,
            tid: manifest["fatal_tid"]
                .as_i64()
                .and_then(|t| i32::try_from(t).ok()),
        });
    let ended_by = manifest["ended_tid"]
        .as_i64()
        .and_then(|t| i32::try_from(t).ok());
    Ok(Some((threads, fatal, ended_by)))
}

/// Whether the instruction at `ip` of 64-bit code is a system call (`syscall`, `sysenter`,
/// `int 0x80`; not `int3` and the like, which a program can die on).
fn enters_kernel(image: &Image, ip: u64) -> bool {
    use crate::flow::{InsnClass, ild};
    let mut bytes = [0u8; 16];
    let n = image.read(ip, &mut bytes);
    let code = &bytes[..n];
    let class = ild::decode(code, 64).map(|d| d.class).or_else(|| {
        let i = iced_x86::Decoder::with_ip(64, code, ip, iced_x86::DecoderOptions::NONE).decode();
        (!i.is_invalid()).then(|| InsnClass::of(&i))
    });
    match class {
        Some(InsnClass::SysCall) => true,
        Some(InsnClass::SoftInt) => code.starts_with(&[0xcd, 0x80]),
        _ => false,
    }
}

pub(super) fn thread_of<'a>(
    me: &'a mut Timeline,
    g: &'a mut ThreadGroup,
    k: usize,
) -> Option<&'a mut Timeline> {
    if k == g.selected {
        Some(me)
    } else {
        g.parked.get_mut(k)?.as_mut()
    }
}

impl Timeline {
    /// A timeline over several threads of one recording, replayed with no process: each
    /// thread's trace is indexed (as [`Timeline::offline`]) and timed, the threads are put in
    /// one global order, and the cursor starts at the end of everything, the thread the
    /// recording ended in selected (`fatal`: the signal that killed the process; `ended_by`:
    /// the thread that ended the process, when the recording says, e.g. the one QEMU took the
    /// fatal signal or the `exit_group` on).
    pub fn offline_threads(
        threads: Vec<ThreadRecording>,
        fatal: Option<FatalSignal>,
        ended_by: Option<i32>,
    ) -> Result<Self, String> {
        if threads.is_empty() {
            return Err("no thread recorded".into());
        }
        // The timing passes (one decode of each stream) run on other threads while the
        // threads' histories are indexed here.
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, threads.len());
        let inputs: Vec<(Vec<u8>, Image, FlowConfig)> = threads
            .iter()
            .map(|t| {
                let r = &t.recording;
                // Decoded against every program it ran (its exec periods), as its history is.
                let present = Arc::new(r.image.clone());
                let image = super::periods::compose(&r.exec_boundaries, &present);
                (r.trace.clone(), (*image).clone(), r.flow.clone())
            })
            .collect();
        let (all_clocks, built) = std::thread::scope(|s| {
            let inputs = &inputs;
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    s.spawn(move || {
                        (w..inputs.len())
                            .step_by(workers)
                            .map(|k| {
                                let (trace, image, flow) = &inputs[k];
                                (k, ThreadClock::from_trace(trace, image, flow))
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            let built: Vec<(i32, Result<Timeline, String>)> = threads
                .into_iter()
                .map(|ThreadRecording { tid, mut recording }| {
                    recording.info.tid = Some(tid);
                    (tid, Timeline::offline(recording))
                })
                .collect();
            let mut clocks: Vec<Option<ThreadClock>> = (0..inputs.len()).map(|_| None).collect();
            for h in handles {
                // A timing pass that panicked leaves its threads without a clock (skipped).
                for (k, c) in h.join().unwrap_or_default() {
                    clocks[k] = Some(c);
                }
            }
            (clocks, built)
        });
        // A thread whose stream ends at a system call was blocked in the kernel when the
        // process ended (QEMU marks every thread's end alike): not the one that faulted.
        let kernel_stops: Vec<bool> = all_clocks
            .iter()
            .zip(&inputs)
            .map(|(c, (_, image, _))| {
                c.as_ref()
                    .and_then(ThreadClock::stop_ip)
                    .is_some_and(|ip| enters_kernel(image, ip))
            })
            .collect();
        drop(inputs);
        let mut clocks = Vec::with_capacity(built.len());
        let mut in_kernel = Vec::with_capacity(built.len());
        let mut timelines = Vec::with_capacity(built.len());
        let mut tids = Vec::with_capacity(built.len());
        let mut skipped = Vec::new();
        for (((tid, timeline), clock), kernel_stop) in
            built.into_iter().zip(all_clocks).zip(kernel_stops)
        {
            let Some(clock) = clock else {
                skipped.push(format!("thread {tid}: its timing pass failed"));
                continue;
            };
            // A thread that cannot be served (no instruction decodes, a decode that does not
            // agree with itself) is left out and said so, not the whole recording.
            let mut t = match timeline {
                Ok(t) => t,
                Err(e) => {
                    skipped.push(format!("thread {tid}: {e}"));
                    continue;
                }
            };
            let len = t.len();
            if clock.len() != len {
                skipped.push(format!(
                    "thread {tid}: its history has {len} instructions, its timing pass {}",
                    clock.len()
                ));
                continue;
            }
            if let Some(ip) = clock.stop_ip() {
                // The thread stopped at an instruction that did not execute (a fault): that is
                // its PC at its end.
                let regs = unknown_registers(&t.template, ip);
                t.snapshots.insert(len, regs);
                t.cursor = Some(t.end());
            }
            clocks.push(clock);
            in_kernel.push(kernel_stop);
            timelines.push(t);
            tids.push(tid);
        }
        if timelines.is_empty() {
            return Err(format!("no thread can be replayed: {}", skipped.join("; ")));
        }
        let order = GlobalOrder::new(&clocks);
        let total = order.len();
        // The thread the recording ended in: the one the signal or the recording names, else,
        // of the threads stopped at an instruction that did not execute (a fault; a thread
        // stopped part-way through a block when the process died looks the same, hence the
        // names first), the one that ran last, those stopped at a system call (blocked in the
        // kernel: they can run later than the faulting thread, while QEMU handles the fault)
        // only if no other; else the last to run at all.
        let last_run = order.local(total.saturating_sub(1)).map_or(0, |(t, _)| t);
        let stopped = (0..clocks.len())
            .filter(|&k| clocks[k].stop_ip().is_some())
            .max_by_key(|&k| (!in_kernel[k], order.global(k, clocks[k].len()).unwrap_or(0)));
        let ended_in = fatal
            .and_then(|f| f.tid)
            .or(ended_by)
            .and_then(|tid| tids.iter().position(|&t| t == tid))
            .or(stopped)
            .unwrap_or(last_run);
        let mut me: Option<Timeline> = None;
        let mut parked = Vec::with_capacity(timelines.len());
        for (k, t) in timelines.into_iter().enumerate() {
            if k == 0 {
                me = Some(t);
                parked.push(None);
            } else {
                parked.push(Some(t));
            }
        }
        let mut me = me.ok_or("no thread recorded")?;
        me.group = Some(Box::new(ThreadGroup {
            order,
            tids,
            parked,
            selected: 0,
            pos: total,
            ended_in: Some(ended_in),
            fatal_signal: fatal.map(|f| f.signal),
            skipped,
            live_ends: None,
            from_start: Vec::new(),
        }));
        me.set_global_position(total);
        me.select_index(ended_in);
        Ok(me)
    }

    /// Recorded threads left out of a multi-thread timeline (their traces could not be
    /// replayed), each with the reason.
    pub fn skipped_threads(&self) -> &[String] {
        self.group.as_ref().map_or(&[], |g| g.skipped.as_slice())
    }

    /// Whether this timeline serves several threads.
    pub fn is_multi_thread(&self) -> bool {
        self.group.is_some()
    }

    /// The thread ids, the selected thread first.
    pub fn thread_ids(&self) -> Vec<i32> {
        match &self.group {
            None => match &self.live {
                // A live process: every thread the backend follows, the selected one first.
                Some(l) if self.exited.is_none() => {
                    let sel = self.tid();
                    let mut v = l.threads();
                    if let Some(i) = v.iter().position(|&t| t == sel) {
                        v.remove(i);
                        v.insert(0, sel);
                    }
                    v
                }
                _ => vec![self.tid()],
            },
            Some(g) => {
                let mut v = vec![g.tids[g.selected]];
                v.extend(
                    g.tids
                        .iter()
                        .enumerate()
                        .filter(|&(k, _)| k != g.selected && g.exists(k))
                        .map(|(_, &t)| t),
                );
                v
            }
        }
    }

    /// The global position (instructions of all threads before the cursor) and the total;
    /// `None` for a single-thread timeline.
    pub fn global_position(&self) -> Option<(u64, u64)> {
        self.group.as_ref().map(|g| (g.pos, g.order.len()))
    }

    /// At the end of a recording that a fatal signal ended: the signal and the thread it
    /// killed (what GDB's `?` is answered with).
    pub fn fatal_stop(&self) -> Option<(i32, i32)> {
        let g = self.group.as_ref()?;
        let (sig, k) = (g.fatal_signal?, g.ended_in?);
        (g.pos >= g.order.len()).then(|| (sig, g.tids[k]))
    }

    /// A live process's thread `tid` (at the cursor: the present, or the main thread's
    /// position in the past), the selection left as it was; the selected thread's for an id
    /// the backend does not know (gdbstub's default thread before any `Hg`).
    fn live_thread_registers(&mut self, tid: i32) -> TargetResult<X86Registers> {
        let pc_only_past = self.cursor.is_some() && !self.has_state_log();
        let Some(l) = self.live.as_mut().filter(|_| self.exited.is_none()) else {
            return self.read_registers();
        };
        if pc_only_past && tid != l.history_thread() {
            // A PC-only past is the history thread's alone: another thread's registers there
            // are unknown (its present values are not its past ones).
            return Err(TargetError::Unsupported(
                "another thread's registers in a PC-only past (only the main thread's history is served live)",
            ));
        }
        let prev = l.selected_thread();
        if tid == prev || l.select_thread(tid).is_err() {
            return self.read_registers();
        }
        self.regs_at = None;
        let r = self.read_registers();
        self.regs_at = None;
        if let Some(l) = self.live.as_mut() {
            let _ = l.select_thread(prev);
        }
        r
    }

    /// Makes thread `tid` the selected one (stepping, registers, `monitor` commands); `false`
    /// if there is no such thread. The global position does not change.
    pub fn select_thread(&mut self, tid: i32) -> bool {
        let Some(g) = &self.group else {
            if tid == self.tid() {
                return true;
            }
            self.regs_at = None;
            return match self.live.as_mut() {
                Some(l) if self.exited.is_none() => l.select_thread(tid).is_ok(),
                _ => false,
            };
        };
        match g.tids.iter().position(|&t| t == tid) {
            Some(k) => {
                self.select_index(k);
                true
            }
            None => false,
        }
    }

    /// The registers of thread `tid` at the current global position.
    pub fn thread_registers(&mut self, tid: i32) -> TargetResult<X86Registers> {
        if self.is_live_group() {
            return self.live_group_registers(tid);
        }
        let Some(mut g) = self.group.take() else {
            return self.live_thread_registers(tid);
        };
        let r = match g.tids.iter().position(|&t| t == tid) {
            Some(k) => match thread_of(self, &mut g, k) {
                Some(t) => t.read_registers(),
                None => Err(TargetError::Unsupported("a thread that is not recorded")),
            },
            None => Err(TargetError::Unsupported("a thread that is not recorded")),
        };
        self.group = Some(g);
        r
    }

    /// Per thread: its id, its position and length, and its PC at the cursor (see
    /// [`ThreadPosition`]), the selected thread first at the present of a live process.
    pub fn thread_positions(&mut self) -> Vec<ThreadPosition> {
        let Some(mut g) = self.group.take() else {
            return self.present_thread_positions();
        };
        let mut out = Vec::new();
        for k in 0..g.tids.len() {
            let tid = g.tids[k];
            if let Some(t) = thread_of(self, &mut g, k) {
                let (n, len) = (t.position(), t.len());
                out.push(ThreadPosition {
                    tid,
                    position: Some((n, len)),
                    pc: t.read_registers().ok().map(|r| r.pc()),
                    exited: false,
                });
            }
        }
        let live = g.live_ends.is_some();
        self.group = Some(g);
        if live {
            // Exact registers come from the backend, which only the timeline in place holds.
            for e in out.iter_mut() {
                e.pc = self.live_group_registers(e.tid).ok().map(|r| r.pc());
            }
        }
        out
    }

    /// [`Self::thread_positions`] without a thread group: a single-thread timeline, or a live
    /// process at its present, whose other threads have present registers but no position
    /// counted until the past is entered, and whose ended threads only a recording.
    fn present_thread_positions(&mut self) -> Vec<ThreadPosition> {
        let (sel, n, len) = (self.tid(), self.position(), self.len());
        // At the present the next instruction is not in the history yet: its PC is the
        // registers'.
        let pc = match self.insn_ip(n) {
            Some(pc) => Some(pc),
            None => self.read_registers().ok().map(|r| r.pc()),
        };
        let mut out = vec![ThreadPosition {
            tid: sel,
            position: Some((n, len)),
            pc,
            exited: false,
        }];
        let Some(l) = self.live.as_ref().filter(|_| self.exited.is_none()) else {
            return out;
        };
        let running = l.threads();
        let ended: Vec<(i32, Option<u64>)> = l
            .thread_stores()
            .into_iter()
            .map(|(tid, _)| tid)
            .filter(|tid| *tid != sel && !running.contains(tid))
            .map(|tid| (tid, l.exited_thread_registers(tid).map(|r| r.pc())))
            .collect();
        for tid in running.into_iter().filter(|&t| t != sel) {
            let pc = self.live_thread_registers(tid).ok().map(|r| r.pc());
            out.push(ThreadPosition {
                tid,
                position: None,
                pc,
                exited: false,
            });
        }
        out.extend(ended.into_iter().map(|(tid, pc)| ThreadPosition {
            tid,
            position: None,
            pc,
            exited: true,
        }));
        out
    }

    /// Every thread's trace (the selected thread's first), as `(tid, store)`: what btrace and
    /// LLDB's trace packets serve per thread.
    pub fn thread_stores(&self) -> Vec<(i32, crate::store::live::TraceStore)> {
        let mut v = vec![(self.tid(), self.trace_store())];
        if let Some(g) = &self.group {
            // By the group's thread ids: a parked thread of a live process has no backend
            // and no saved identity to say its own.
            v.extend(
                g.tids
                    .iter()
                    .zip(&g.parked)
                    .filter_map(|(&tid, t)| Some((tid, t.as_ref()?.trace_store()))),
            );
        }
        v
    }

    /// Thread `tid`'s trace: in a multi-thread past its timeline's, at the present of a live
    /// process the backend's stream of that thread; `None` if it is not recorded.
    pub fn thread_store(&self, tid: i32) -> Option<crate::store::live::TraceStore> {
        if self.group.is_some() {
            return self
                .thread_stores()
                .into_iter()
                .find_map(|(t, s)| (t == tid).then_some(s));
        }
        match &self.live {
            Some(l) => l
                .thread_stores()
                .into_iter()
                .find_map(|(t, s)| (t == tid).then_some(s)),
            None => (tid == self.tid()).then(|| self.trace_store()),
        }
    }

    /// `monitor save DIR` for every thread: each thread's recording in `DIR/thread-TID` (the
    /// single-thread format) and a `manifest.json` naming them, the thread the recording ended
    /// in and its signal; read back by [`load_saved_threads`]. `None` for a single-thread
    /// timeline (and for a live process whose threads' past cannot be put in one order: its
    /// main thread's recording is saved, and the summary says what was left out).
    pub fn save_threads(
        &mut self,
        dir: &std::path::Path,
        libraries_xml: Option<&str>,
    ) -> Option<Result<String, String>> {
        if self.live.is_some() {
            return self.save_live_threads(dir, libraries_xml);
        }
        self.group.as_ref()?;
        Some(self.save_threads_into(dir, libraries_xml))
    }

    /// [`Timeline::save_threads`] of a live process: the group of its threads (built for the
    /// save when the cursor is at the present, dissolved after), the main thread first, every
    /// thread with the process's identity and program files (the other threads' timelines
    /// have no backend to ask).
    fn save_live_threads(
        &mut self,
        dir: &std::path::Path,
        libraries_xml: Option<&str>,
    ) -> Option<Result<String, String>> {
        let live = self.live.as_mut()?;
        let main = live.history_thread();
        let threads = live.thread_stores().len();
        let backend_selected = live.selected_thread();
        // The registers saved at the end are the main thread's, whichever thread the debugger
        // stopped in.
        let _ = live.select_thread(main);
        let built_here = !self.is_live_group();
        if built_here {
            self.enter_live_threads();
        }
        let result = if self.is_live_group() {
            let selected = self.group.as_ref().map_or(0, |g| g.selected);
            self.select_index(0);
            let r = self.save_threads_into(dir, libraries_xml);
            self.select_index(selected);
            Some(r)
        } else if threads > 1 {
            // The group could not be built (the reason is in `monitor stats`): the main
            // thread alone, said so.
            Some(self.save(dir, libraries_xml).map(|text| {
                format!(
                    "{text}only the main thread's history was saved: the other {} threads' \
                     streams could not be put in one order with it ({})\n",
                    threads - 1,
                    self.checks
                        .last_mismatch
                        .as_deref()
                        .unwrap_or("see monitor stats")
                )
            }))
        } else {
            None
        };
        if built_here {
            self.leave_live_threads();
        }
        if let Some(live) = self.live.as_mut() {
            let _ = live.select_thread(backend_selected);
        }
        result
    }

    fn save_threads_into(
        &mut self,
        dir: &std::path::Path,
        libraries_xml: Option<&str>,
    ) -> Result<String, String> {
        let out = RecordingDir::create(dir).map_err(|e| e.to_string())?;
        out.remove("manifest.json").map_err(|e| e.to_string())?;
        let pid = self.pid();
        let Some(mut g) = self.group.take() else {
            return Err("not a multi-thread recording".into());
        };
        let mut entries = Vec::new();
        let mut text = String::new();
        let mut result = Ok(());
        // In a live process only the selected timeline (thread 0, saved first) has the backend:
        // the others take the process's identity and program files from its saved copy.
        let live_group = g.live_ends.is_some();
        let mut process: Option<OfflineInfo> = None;
        for k in 0..g.tids.len() {
            let tid = g.tids[k];
            let name = format!("thread-{tid}");
            let Some(t) = thread_of(self, &mut g, k) else {
                continue;
            };
            let lent = live_group && t.live.is_none() && t.offline.is_none();
            if lent {
                t.offline = process.clone().map(|p| OfflineInfo {
                    tid: Some(tid),
                    memory_at_end: Vec::new(),
                    ..p
                });
            }
            let saved = t.save(&out.path().join(&name), libraries_xml);
            if lent {
                t.offline = None;
            }
            match saved {
                Ok(s) => text.push_str(&s),
                Err(e) => {
                    result = Err(format!("thread {tid}: {e}"));
                    break;
                }
            }
            if live_group && process.is_none() {
                match load_saved(&out.path().join(&name)) {
                    Ok(rec) => process = Some(rec.info),
                    Err(e) => {
                        result = Err(format!("thread {tid}: reading back what was saved: {e}"));
                        break;
                    }
                }
            }
            entries.push(serde_json::json!({"tid": tid, "dir": name}));
        }
        let ended_tid = g.ended_in.and_then(|k| g.tids.get(k).copied());
        let fatal_signal = g.fatal_signal;
        self.group = Some(g);
        result?;
        let manifest = serde_json::json!({
            "format": SAVE_FORMAT,
            "pid": pid,
            "threads": entries,
            "fatal_signal": fatal_signal,
            "fatal_tid": fatal_signal.and(ended_tid),
            "ended_tid": ended_tid,
        });
        out.write(
            "manifest.json",
            serde_json::to_string_pretty(&manifest)
                .unwrap_or_default()
                .as_bytes(),
        )
        .map_err(|e| e.to_string())?;
        text.push_str(&format!(
            "saved {} threads to {} (replay every thread with: ptrewind replay {})\n",
            entries.len(),
            dir.display(),
            dir.display()
        ));
        Ok(text)
    }

    /// Swaps thread `k`'s timeline into place.
    pub(super) fn select_index(&mut self, k: usize) {
        let Some(mut g) = self.group.take() else {
            return;
        };
        if k != g.selected
            && let Some(mut other) = g.parked.get_mut(k).and_then(Option::take)
        {
            std::mem::swap(self, &mut other);
            keep_session(self, &mut other);
            let old = g.selected;
            g.parked[old] = Some(other);
            g.selected = k;
        }
        self.group = Some(g);
    }

    /// Moves every thread to global position `p`.
    pub(super) fn set_global_position(&mut self, p: u64) {
        let Some(mut g) = self.group.take() else {
            return;
        };
        g.pos = p.min(g.order.len());
        for k in 0..g.tids.len() {
            let n = g.order.executed_before(k, g.pos);
            if let Some(t) = thread_of(self, &mut g, k) {
                t.cursor = Some(n.min(t.end()));
                t.regs_at = None;
            }
        }
        self.group = Some(g);
    }

    /// After the selected thread's cursor moved by itself (`monitor goto`): the global
    /// position follows it.
    pub(super) fn follow_selected(&mut self) {
        let Some(g) = &self.group else {
            return;
        };
        let n = self.position();
        if let Some(p) = g.order.global(g.selected, n) {
            self.set_global_position(p);
            // The selected thread keeps exactly its own position (an end past its last
            // instruction included).
            self.cursor = Some(n.min(self.end()));
        }
    }

    /// A reverse step or continue over every thread; `None` for a single-thread timeline.
    pub(super) fn reverse_threads(&mut self, how: ReverseResume) -> Option<TargetResult<()>> {
        self.group.as_ref()?;
        let ev = match how {
            ReverseResume::Step => {
                let c = self.position();
                let g = self.group.as_ref()?;
                match c.checked_sub(1).and_then(|n| g.order.global(g.selected, n)) {
                    Some(p) => {
                        self.set_global_position(p);
                        StopEvent::Step
                    }
                    None => StopEvent::HistoryEnd { at_begin: true },
                }
            }
            ReverseResume::Continue => {
                match (self.live_group_watch(false), self.search_threads(false)) {
                    // The nearer of the last write to a watched range and the last breakpoint
                    // hit (a write at a breakpoint's instruction is reported as the watchpoint).
                    (Some((k, at, ev)), bp) if bp.is_none_or(|(_, _, p)| at >= p) => {
                        self.set_global_position(at);
                        self.select_index(k);
                        ev
                    }
                    (_, Some((k, n, p))) => {
                        self.set_global_position(p);
                        self.select_index(k);
                        self.cursor = Some(n);
                        StopEvent::Breakpoint {
                            pc: self.insn_ip(n).unwrap_or(0),
                        }
                    }
                    _ => {
                        self.set_global_position(0);
                        if self.is_live_group() {
                            // Only the main thread exists at the start of a live recording.
                            self.select_index(0);
                        }
                        StopEvent::HistoryEnd { at_begin: true }
                    }
                }
            }
        };
        self.regs_at = None;
        self.running = super::Running::Ready(ev);
        Some(Ok(()))
    }

    /// A forward step or continue (replayed) over every thread; `None` for a single-thread
    /// timeline.
    pub(super) fn resume_threads(&mut self, how: Resume) -> Option<TargetResult<()>> {
        let (pos, total) = self.global_position()?;
        let ev = match how {
            Resume::Step { .. } => {
                let c = self.position();
                let g = self.group.as_ref()?;
                match (c < self.end())
                    .then(|| g.order.global(g.selected, c + 1))
                    .flatten()
                {
                    Some(p) if p >= total && self.is_live_group() => {
                        // Onto the present: an ordinary step.
                        self.leave_live_threads();
                        StopEvent::Step
                    }
                    Some(p) => {
                        self.set_global_position(p);
                        self.cursor = Some((c + 1).min(self.end()));
                        StopEvent::Step
                    }
                    None => {
                        if self.is_live_group() {
                            self.leave_live_threads();
                        }
                        StopEvent::HistoryEnd { at_begin: false }
                    }
                }
            }
            Resume::Continue { .. } => {
                match (self.live_group_watch(true), self.search_threads(true)) {
                    // The nearer of the first write to a watched range (stopping after it) and
                    // the first breakpoint hit.
                    (Some((k, at, ev)), bp) if bp.is_none_or(|(_, _, p)| at <= p) => {
                        self.set_global_position(at);
                        self.select_index(k);
                        if at >= total {
                            self.leave_live_threads();
                        }
                        ev
                    }
                    (_, Some((k, n, p))) => {
                        self.set_global_position(p);
                        self.select_index(k);
                        self.cursor = Some(n);
                        StopEvent::Breakpoint {
                            pc: self.insn_ip(n).unwrap_or(0),
                        }
                    }
                    _ if self.is_live_group() => {
                        // The end of the past is the present (the process runs again from there).
                        self.leave_live_threads();
                        StopEvent::HistoryEnd { at_begin: false }
                    }
                    _ => {
                        self.set_global_position(total);
                        let ended = self
                            .group
                            .as_ref()
                            .and_then(|g| Some((g.ended_in?, g.fatal_signal?)));
                        match ended {
                            Some((k, sig)) if pos < total => {
                                self.select_index(k);
                                StopEvent::Signal(sig)
                            }
                            _ => StopEvent::HistoryEnd { at_begin: false },
                        }
                    }
                }
            }
        };
        self.regs_at = None;
        self.running = super::Running::Ready(ev);
        Some(Ok(()))
    }

    /// The breakpoint hit nearest the global position in every thread: the latest before it
    /// (`forward` false) or the earliest after it; `(thread, its instruction, global
    /// position)`.
    fn search_threads(&mut self, forward: bool) -> Option<(usize, u64, u64)> {
        if self.bps.is_empty() {
            return None;
        }
        let bps: Vec<u64> = self.bps.iter().copied().collect();
        let mut g = self.group.take()?;
        let pos = g.pos;
        let mut best: Option<(usize, u64, u64)> = None;
        for k in 0..g.tids.len() {
            // Unclamped: a thread that ended before `pos` searches from after its last
            // instruction.
            let before = g.order.executed_before(k, pos);
            let selected = k == g.selected;
            let Some(t) = thread_of(self, &mut g, k) else {
                continue;
            };
            let mut m = BreakpointSet::new(bps.iter().copied());
            let hit = if forward {
                // The selected thread steps off its current instruction first.
                let from = if selected { t.position() + 1 } else { before };
                t.worker
                    .with_history(|h, b, img| h.find_with(b, img, from, &mut m))
            } else {
                let from = if selected { t.position() } else { before };
                t.worker
                    .with_history(|h, b, img| h.rfind_with(b, img, from, &mut m))
            };
            let Some(n) = hit else { continue };
            let Some(p) = g.order.global(k, n) else {
                continue;
            };
            let better = match best {
                None => true,
                Some((_, _, bp)) => {
                    if forward {
                        p < bp
                    } else {
                        p > bp
                    }
                }
            };
            let side_ok = if forward { p > pos } else { p < pos };
            if side_ok && better {
                best = Some((k, n, p));
            }
        }
        self.group = Some(g);
        best
    }

    /// Adds or removes a breakpoint in the other threads' timelines too.
    pub(super) fn group_breakpoint(&mut self, addr: u64, add: bool) {
        if let Some(g) = self.group.as_mut() {
            for t in g.parked.iter_mut().flatten() {
                if add {
                    t.bps.insert(addr);
                } else {
                    t.bps.remove(&addr);
                }
            }
        }
    }
}

/// Keeps what belongs to the session rather than to one thread in the timeline in place after
/// two threads' timelines were swapped (`into` is now in place, `from` parked).
pub(super) fn keep_session(into: &mut Timeline, from: &mut Timeline) {
    std::mem::swap(&mut into.live, &mut from.live);
    std::mem::swap(&mut into.exited, &mut from.exited);
    std::mem::swap(&mut into.at_exit, &mut from.at_exit);
    std::mem::swap(&mut into.interrupt, &mut from.interrupt);
    std::mem::swap(&mut into.record_wanted, &mut from.record_wanted);
    std::mem::swap(&mut into.checks, &mut from.checks);
    std::mem::swap(&mut into.notices, &mut from.notices);
    std::mem::swap(&mut into.untraced_runs, &mut from.untraced_runs);
    std::mem::swap(&mut into.floor, &mut from.floor);
    std::mem::swap(&mut into.stop_errors, &mut from.stop_errors);
    std::mem::swap(&mut into.regs_before_write, &mut from.regs_before_write);
    std::mem::swap(&mut into.diversion, &mut from.diversion);
    std::mem::swap(&mut into.diversions, &mut from.diversions);
    std::mem::swap(&mut into.watches, &mut from.watches);
    std::mem::swap(&mut into.live_watches, &mut from.live_watches);
    std::mem::swap(&mut into.live_watches_noted, &mut from.live_watches_noted);
}

/// Synthetic per-thread streams, shared with the integration tests (`tests/replay.rs`); it
/// names the packet layer `super::packet`.
#[cfg(test)]
#[path = "../../tests/support/synth.rs"]
mod synth;
#[cfg(test)]
use crate::packet;

#[cfg(test)]
mod tests {
    //! Per-thread streams as a CPU tracing each thread into its own AUX area would write them
    //! (PSB+, TIP.PGE, TNT, TSC, TIP.PGD), built by the encoder: the history merges them by
    //! their TSC packets and the timeline stops in the right thread.

    use super::*;
    use crate::flow::FlowConfig;
    use crate::history::GlobalOrder;
    use crate::image::{Image, Section, Symbolizer};
    use crate::packet::Encoder;
    use crate::timeline::OfflineInfo;

    /// `jne .` at `base` taken `runs[k].1` times after a TSC of `runs[k].0`, then not taken
    /// once: the builder `tests/replay.rs` uses too (one copy).
    use super::synth::tsc_stream as stream;

    fn image() -> Image {
        let mut img = Image::new();
        // jne . ; ret
        img.add(Section::new(0x1000, vec![0x75, 0xfe, 0xc3], "x"))
            .unwrap();
        img.add(Section::new(0x2000, vec![0x75, 0xfe, 0xc3], "y"))
            .unwrap();
        // jne . ; syscall
        img.add(Section::new(0x3000, vec![0x75, 0xfe, 0x0f, 0x05], "z"))
            .unwrap();
        // jne . ; mov [rdi], eax
        img.add(Section::new(0x4000, vec![0x75, 0xfe, 0x89, 0x07], "w"))
            .unwrap();
        img
    }

    /// A crashed process: the faulting thread stopped at a `mov` (TSC 100), another stopped
    /// later at a `syscall` (TSC 200: blocked in the kernel, running on while QEMU handled the
    /// fault). The replay starts in the faulting thread, or in the one the recording names.
    #[test]
    fn the_end_is_the_faulting_thread_not_one_blocked_in_a_system_call() {
        use super::synth::stopped_stream;
        // (tid, jne at, TSC, taken): each thread stops at the instruction after its `jne`.
        let threads = |spec: &[(i32, u64, u64, usize)]| -> Vec<ThreadRecording> {
            spec.iter()
                .map(|&(tid, base, tsc, taken)| ThreadRecording {
                    tid,
                    recording: recording(stopped_stream(base, tsc, taken)),
                })
                .collect()
        };
        let crashed = [(20, 0x4000, 100, 3), (21, 0x3000, 200, 2)];
        let fatal = Some(FatalSignal {
            signal: 11,
            tid: None,
        });
        let t = Timeline::offline_threads(threads(&crashed), fatal, None).unwrap();
        assert_eq!(t.tid(), 20);
        assert_eq!(t.thread_ids(), vec![20, 21]);
        let named = Timeline::offline_threads(threads(&crashed), fatal, Some(21)).unwrap();
        assert_eq!(named.tid(), 21);
        // Both stopped at a system call: the one that ran last.
        let blocked = [(30, 0x3000, 300, 1), (31, 0x3000, 100, 4)];
        let t = Timeline::offline_threads(threads(&blocked), fatal, None).unwrap();
        assert_eq!(t.tid(), 30);
        // `monitor save` keeps the thread the recording ended in, with no fatal signal too.
        let mut named = Timeline::offline_threads(threads(&crashed), None, Some(21)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let saved = dir.path().join("saved");
        named.save_threads(&saved, None).unwrap().unwrap();
        let (back, fatal_back, ended_by) = load_saved_threads(&saved).unwrap().unwrap();
        assert_eq!((fatal_back, ended_by), (None, Some(21)));
        let t = Timeline::offline_threads(back, fatal_back, ended_by).unwrap();
        assert_eq!(t.tid(), 21);
    }

    fn recording(trace: Vec<u8>) -> OfflineRecording {
        OfflineRecording {
            trace,
            image: image(),
            exec_boundaries: Vec::new(),
            immutable: None,
            symbols: Symbolizer::default(),
            registers_at_start: None,
            registers_at_end: None,
            registers_at: Vec::new(),
            instructions: None,
            info: OfflineInfo {
                pid: 7,
                ..OfflineInfo::default()
            },
            flow: FlowConfig::default(),
        }
    }

    /// Thread X: 5 `jne` at TSC 100, then 5 more at TSC 300; thread Y: 4 `jne` at TSC 200.
    /// Global order: X0..4, Y0..3, X5..9.
    fn streams() -> (Vec<u8>, Vec<u8>) {
        (
            stream(0x1000, &[(100, 5), (300, 4)]),
            stream(0x2000, &[(200, 3)]),
        )
    }

    /// A saved multi-thread manifest names thread directories inside the recording only, and
    /// every thread needs its id; a single-thread manifest is not one.
    #[test]
    fn saved_thread_lists_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let load = |m: serde_json::Value| {
            std::fs::write(dir.path().join("manifest.json"), m.to_string()).unwrap();
            load_saved_threads(dir.path())
        };
        let one = load(serde_json::json!({"format": SAVE_FORMAT, "trace": "trace.pt"}));
        assert!(matches!(one, Ok(None)));
        for (entry, want) in [
            (serde_json::json!({"tid": 5, "dir": "../x"}), "not a name"),
            (serde_json::json!({"tid": 5, "dir": "a/b"}), "not a name"),
            (serde_json::json!({"tid": 5, "dir": ".."}), "not a name"),
            (serde_json::json!({"dir": "thread-5"}), "no tid"),
            (serde_json::json!({"tid": -1, "dir": "thread-5"}), "no tid"),
            (serde_json::json!({"tid": 5}), "no dir"),
        ] {
            let m = serde_json::json!({"format": SAVE_FORMAT, "threads": [entry]});
            match load(m) {
                Err(e) => assert!(e.contains(want), "{e}"),
                Ok(_) => panic!("{entry} accepted"),
            }
        }
        let wrong = load(serde_json::json!({"format": "other", "threads": []}));
        assert!(wrong.is_err());
        // A listed thread whose directory is missing: an error naming it, not a panic.
        let m = serde_json::json!({"format": SAVE_FORMAT, "threads": [{"tid": 5, "dir": "t5"}]});
        assert!(load(m).err().is_some_and(|e| e.contains("thread 0")));
    }

    #[test]
    fn clocks_from_tsc_packets_order_the_threads() {
        let (x, y) = streams();
        let img = image();
        let cx = ThreadClock::from_trace(&x, &img, &FlowConfig::default());
        let cy = ThreadClock::from_trace(&y, &img, &FlowConfig::default());
        assert_eq!(cx.len(), 10);
        assert_eq!(cy.len(), 4);
        assert_eq!(cx.runs(), &[(0, 100), (5, 300)]);
        assert_eq!(cy.runs(), &[(0, 200)]);
        let o = GlobalOrder::new(&[cx, cy]);
        assert_eq!(o.local(4), Some((0, 4)));
        assert_eq!(o.local(5), Some((1, 0)));
        assert_eq!(o.local(8), Some((1, 3)));
        assert_eq!(o.local(9), Some((0, 5)));
        assert_eq!(o.global(0, 9), Some(13));
        assert_eq!(o.global(0, 10), Some(14));
    }

    /// X traced throughout from TSC 100 to 300 (its 5 instructions then took that long), Y's
    /// run beginning at 200: Y comes after X's first two instructions, whichever is listed first.
    #[test]
    fn a_thread_traced_throughout_interleaves_with_what_ran_meanwhile() {
        use super::synth::continuous_tsc_stream;
        let img = image();
        let x = continuous_tsc_stream(0x1000, &[(100, 5), (300, 4)]);
        let cx = ThreadClock::from_trace(&x, &img, &FlowConfig::default());
        let cy = ThreadClock::from_trace(&streams().1, &img, &FlowConfig::default());
        assert_eq!(cx.runs(), &[(0, 100), (5, 300)]);
        assert_eq!(cx.run_until(0), Some(300));
        // Its last run ends at a TIP.PGD with no later stamp: only its start is known.
        assert_eq!((cx.run_until(1), cy.run_until(0)), (None, None));
        for (clocks, tx, ty) in [([cx.clone(), cy.clone()], 0, 1), ([cy, cx], 1, 0)] {
            let o = GlobalOrder::new(&clocks);
            assert_eq!(o.local(1), Some((tx, 1)));
            assert_eq!(o.local(2), Some((ty, 0)));
            assert_eq!(o.local(5), Some((ty, 3)));
            assert_eq!(o.local(6), Some((tx, 2)));
            assert_eq!(o.local(9), Some((tx, 5)));
        }
    }

    #[test]
    fn reverse_and_forward_continue_stop_in_the_thread_nearest_in_global_order() {
        let (x, y) = streams();
        let threads = vec![
            ThreadRecording {
                tid: 10,
                recording: recording(x),
            },
            ThreadRecording {
                tid: 11,
                recording: recording(y),
            },
        ];
        let mut threads = threads;
        // A thread whose trace decodes to nothing is left out, and said so.
        let mut empty = Vec::new();
        Encoder::new().psb(&mut empty);
        threads.push(ThreadRecording {
            tid: 12,
            recording: recording(empty),
        });
        let mut t = Timeline::offline_threads(threads, None, None).unwrap();
        assert_eq!(t.skipped_threads().len(), 1);
        assert!(t.skipped_threads()[0].starts_with("thread 12: "));
        // The end: X ran last.
        assert_eq!(t.tid(), 10);
        assert_eq!(t.thread_ids(), vec![10, 11]);
        assert_eq!(t.global_position(), Some((14, 14)));
        let stop = |t: &mut Timeline, r: Result<(), TargetError>| {
            r.unwrap();
            t.wait(true).unwrap().unwrap()
        };
        // Only Y's loop: Y's last `jne` (its instruction 3), though X is selected.
        t.add_breakpoint(0x2000).unwrap();
        let r = t.reverse(ReverseResume::Continue);
        assert_eq!(stop(&mut t, r), StopEvent::Breakpoint { pc: 0x2000 });
        assert_eq!((t.tid(), t.position()), (11, 3));
        assert_eq!(t.global_position(), Some((8, 14)));
        // X at that moment: its first run done, at its instruction 5.
        let x_regs = t.thread_registers(10).unwrap();
        assert_eq!(x_regs.pc(), 0x1000);
        assert!(
            t.thread_positions()
                .iter()
                .any(|p| p.tid == 10 && p.position.is_some_and(|(n, _)| n == 5))
        );
        // Both loops: back from there, Y's instruction 2, then 1, 0, then X's 4.
        t.add_breakpoint(0x1000).unwrap();
        for want in [(11, 2), (11, 1), (11, 0), (10, 4)] {
            let r = t.reverse(ReverseResume::Continue);
            assert_eq!(
                stop(&mut t, r),
                StopEvent::Breakpoint {
                    pc: 0x1000 + 0x1000 * (want.0 as u64 - 10)
                }
            );
            assert_eq!((t.tid(), t.position()), want);
        }
        // Forward from X's 4: Y's first `jne`.
        let r = t.resume(Resume::Continue { signal: None });
        assert_eq!(stop(&mut t, r), StopEvent::Breakpoint { pc: 0x2000 });
        assert_eq!((t.tid(), t.position()), (11, 0));
        // Stepping Y backwards: before its first instruction is the beginning of Y.
        let r = t.reverse(ReverseResume::Step);
        assert_eq!(stop(&mut t, r), StopEvent::HistoryEnd { at_begin: true });
        // Selecting X and stepping it forward moves the global position past Y's run.
        assert!(t.select_thread(10));
        assert_eq!(t.position(), 5);
        let r = t.resume(Resume::Step {
            signal: None,
            others: false,
        });
        assert_eq!(stop(&mut t, r), StopEvent::Step);
        assert_eq!(t.position(), 6);
        assert_eq!(t.global_position(), Some((10, 14)));
        assert!(!t.select_thread(99));
        // Forward to the end (no fatal signal): the end of the history.
        t.remove_breakpoint(0x1000).unwrap();
        t.remove_breakpoint(0x2000).unwrap();
        let r = t.resume(Resume::Continue { signal: None });
        assert_eq!(stop(&mut t, r), StopEvent::HistoryEnd { at_begin: false });
    }
}
