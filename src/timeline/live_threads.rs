//! The past of a live multi-thread process: the same [`ThreadGroup`] as an offline multi-thread
//! recording (see [`threads`](super::threads)), built from the capture backend's per-thread
//! streams when the cursor leaves the present, and dissolved when it comes back.
//!
//! The backend's streams carry TSC packets from one global instruction clock (the software
//! backend: the number of instructions the whole process recorded before), so the
//! [`GlobalOrder`] of their runs *is* the recorded order, and a global position is also a
//! position of the backend's recorded state ([`RecordedState::global`](crate::capture::RecordedState::global)): every thread's
//! registers at a global position are rebuilt exactly from that thread's present registers,
//! and memory from the present with every later write undone. A thread that has exited has
//! no present registers: the backend keeps the register file it ended with (the ptrace
//! backend reads it as the thread steps its own `exit`), and its registers are rebuilt from
//! that the same way; a backend that keeps none shows such a thread PC-only.
//!
//! While the group exists the main thread's `Timeline` (the one whose store and worker the
//! backend feeds) is parked like any other when another thread is selected, but the backend and
//! everything about the session (notices, watchpoints, the exit state) stay in place
//! ([`keep_session`](super::threads::keep_session)). Each time the cursor enters the past from the present the group is built
//! again (each thread's stream is decoded once for its clock and indexed by its own worker):
//! the streams grew while the process ran.

use std::sync::Arc;

use super::threads::{ThreadGroup, thread_of};
use super::{INDEX_WAIT, Timeline, spawn_worker, unknown_registers};
use crate::history::{GlobalOrder, ThreadClock};
use crate::target::{Notice, StopEvent, TargetError, TargetResult, X86Registers};

/// Thread `tid`'s runs as the recorded state orders them (each run: its first instruction and
/// that instruction's global position), for the `len` instructions of `trace_clock` (its
/// stream's); `None` if the record does not know the thread or counts it differently. The
/// runs are found by binary search: `global(n) - n` never decreases, and is constant inside a run.
fn clock_from_state(
    state: &dyn crate::capture::RecordedState,
    tid: i32,
    trace_clock: &ThreadClock,
) -> Option<ThreadClock> {
    let len = trace_clock.len();
    let offset = |n: u64| state.global_of(tid, n).map(|g| g - n);
    // The record counts this thread's instructions as its stream does.
    state.global_of(tid, len)?;
    let mut runs = Vec::new();
    let mut first = 0u64;
    while first < len {
        let d = offset(first)?;
        runs.push((first, d + first));
        // The last instruction with the same offset.
        let (mut lo, mut hi) = (first, len - 1);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if offset(mid)? == d {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        first = lo + 1;
    }
    let mut c = ThreadClock::from_runs(runs, len);
    c.set_stop_ip(trace_clock.stop_ip());
    Some(c)
}

impl Timeline {
    /// Whether the cursor is in the past of a live multi-thread process (a group built from the
    /// backend's per-thread streams).
    pub(super) fn is_live_group(&self) -> bool {
        self.group.as_ref().is_some_and(|g| g.live_ends.is_some())
    }

    /// At the present of a live process with several recorded threads: builds the thread
    /// group (every thread at its present, the backend's selected thread selected). Nothing
    /// happens for one thread, after an untraced run (the recorded order has a hole), or when
    /// the streams' order does not agree with the recorded state (said in a notice and in
    /// `monitor stats`): the past is then the main thread's positions, every thread shown there.
    pub(super) fn enter_live_threads(&mut self) {
        if self.group.is_some() || self.cursor.is_some() || self.untraced_runs > 0 {
            return;
        }
        let Some(live) = self.live.as_ref() else {
            return;
        };
        let stores = live.thread_stores();
        let pid = live.pid();
        let selected_tid = live.selected_thread();
        let logged = live
            .recorded_state()
            .and_then(|s| s.global())
            .map(|s| s.len());
        if stores.len() < 2 || stores[0].0 != pid {
            return;
        }
        if let Err(e) = self.build_live_group(stores, logged) {
            self.checks.last_mismatch = Some(format!("every thread in the past: {e}"));
            self.notices.push(Notice::TraceIncomplete {
                what: format!(
                    "{e}; the past is served at the main thread's positions (every thread shown there)"
                ),
            });
            return;
        }
        if let Some(k) = self
            .group
            .as_ref()
            .and_then(|g| g.tids.iter().position(|&t| t == selected_tid))
        {
            self.select_index(k);
        }
    }

    fn build_live_group(
        &mut self,
        stores: Vec<(i32, crate::store::live::TraceStore)>,
        logged: Option<u64>,
    ) -> Result<(), String> {
        let main_len = self.ensure_indexed(INDEX_WAIT)?;
        // A thread the backend no longer lists has ended, wherever its stream stops.
        let alive = self.live.as_ref().map(|l| l.threads()).unwrap_or_default();
        let at_start = self
            .live
            .as_ref()
            .map(|l| l.threads_at_start())
            .unwrap_or_default();
        let mut clocks = Vec::with_capacity(stores.len());
        let mut tids = Vec::with_capacity(stores.len());
        let mut from_start = Vec::with_capacity(stores.len());
        let mut parked: Vec<Option<Timeline>> = Vec::with_capacity(stores.len());
        let mut ends = Vec::with_capacity(stores.len());
        let mut skipped = Vec::new();
        for (k, (tid, store)) in stores.into_iter().enumerate() {
            // The main thread's stream is the history's (its periods); the others have their
            // own offsets at each period's end.
            let image = if k == 0 {
                Arc::clone(&self.image)
            } else {
                super::periods::compose_for_thread(&self.exec_bounds, &self.present, tid)
            };
            let clock = store.with_bytes(|b| ThreadClock::from_trace(b, &image, &self.flow));
            if k == 0 {
                if clock.len() != main_len {
                    return Err(format!(
                        "the main thread's history has {main_len} instructions, its timing pass {}",
                        clock.len()
                    ));
                }
                ends.push(clock.stop_ip());
                clocks.push(clock);
                tids.push(tid);
                from_start.push(true);
                parked.push(None);
                continue;
            }
            let worker = spawn_worker(&store, &image, &self.flow)
                .map_err(|e| format!("cannot start the history worker of thread {tid}: {e}"))?;
            let mut t = Timeline::assemble(None, store, worker, image, self.template.clone());
            t.flow = self.flow.clone();
            t.immutable = self.immutable.clone();
            t.image_maps = self.image_maps.clone();
            t.record_wanted = false;
            t.bps = self.bps.clone();
            // The same process's symbols (read once, not again for every thread selected).
            t.symbols = self.symbols.clone();
            t.worker.request_complete();
            let len = t.ensure_indexed(INDEX_WAIT)?;
            if len != clock.len() {
                skipped.push(format!(
                    "thread {tid}: its history has {len} instructions, its timing pass {}",
                    clock.len()
                ));
                continue;
            }
            if len == 0 {
                // Created but never ran while recorded: nothing to show in the past.
                continue;
            }
            if let Some(ip) = clock.stop_ip() {
                // Paused at a stop: its end is the present, where it runs `ip` next.
                t.snapshots
                    .insert(len, unknown_registers(&self.template, ip));
            }
            ends.push(clock.stop_ip().filter(|_| alive.contains(&tid)));
            clocks.push(clock);
            tids.push(tid);
            from_start.push(at_start.contains(&tid));
            parked.push(Some(t));
        }
        if let Some(state) = self
            .live
            .as_ref()
            .and_then(|l| l.recorded_state())
            .and_then(|s| s.global())
        {
            // The recorded state's own order: positions are its positions, exactly.
            for (k, c) in clocks.iter_mut().enumerate() {
                *c = clock_from_state(state, tids[k], c)
                    .ok_or_else(|| format!("thread {} is not in the state log", tids[k]))?;
            }
        }
        let order = GlobalOrder::new(&clocks);
        let total = order.len();
        if let Some(l) = logged
            && l != total
        {
            let also = if skipped.is_empty() {
                String::new()
            } else {
                format!(" ({})", skipped.join("; "))
            };
            return Err(format!(
                "the threads' streams hold {total} instructions, the state log {l}{also}"
            ));
        }
        self.group = Some(Box::new(ThreadGroup {
            order,
            tids,
            parked,
            selected: 0,
            pos: total,
            ended_in: None,
            fatal_signal: None,
            skipped,
            live_ends: Some(ends),
            from_start,
        }));
        self.set_global_position(total);
        Ok(())
    }

    /// In a live process's past: the `monitor stats` history check over every thread (their
    /// histories together against the recorded state's instructions), the selected thread's
    /// history being one thread's; `None` otherwise.
    pub(super) fn live_group_check(&self) -> Option<String> {
        let g = self.group.as_ref().filter(|g| g.live_ends.is_some())?;
        let total = g.order.len();
        let threads = g.tids.len();
        let logged = self
            .live
            .as_ref()
            .and_then(|l| l.recorded_state())
            .and_then(|s| s.global())
            .map(|s| s.len());
        Some(match logged {
            Some(l) if l == total => format!(
                "ok: the {threads} threads' histories hold {total} instructions, as the state log"
            ),
            Some(l) => format!(
                "ERROR: the {threads} threads' histories hold {total} instructions, the state \
                 log {l}"
            ),
            None => format!(
                "{threads} threads, {total} instructions in their histories (no state log to \
                 check against)"
            ),
        })
    }

    /// Back to the present: the main thread's timeline in place again, the group dropped (the
    /// other threads' workers stop), the thread that was selected selected in the backend.
    pub(super) fn leave_live_threads(&mut self) {
        if !self.is_live_group() {
            return;
        }
        let tid = self.tid();
        self.select_index(0);
        if let Some(g) = self.group.take() {
            for t in g.parked.into_iter().flatten() {
                t.store.set_listener(None);
            }
        }
        self.cursor = None;
        self.regs_at = None;
        if let Some(l) = self.live.as_mut() {
            // A thread that has exited since cannot be selected: the stop's stays.
            let _ = l.select_thread(tid);
        }
    }

    /// Thread `tid`'s registers at the group's global position: rebuilt by the recorded state
    /// (exact) from its present registers, or for a thread that has exited from the registers
    /// it ended with (when the backend kept them); PC-only without a state log.
    pub(super) fn live_group_registers(&mut self, tid: i32) -> TargetResult<X86Registers> {
        let not_recorded = TargetError::Unsupported("a thread that is not recorded");
        let Some(mut g) = self.group.take() else {
            return Err(not_recorded);
        };
        let Some(k) = g.tids.iter().position(|&t| t == tid) else {
            self.group = Some(g);
            return Err(not_recorded);
        };
        let pos = g.pos;
        let stop_ip = g
            .live_ends
            .as_ref()
            .and_then(|e| e.get(k).copied().flatten());
        let (ip, at_end, captured) = thread_of(self, &mut g, k).map_or((None, false, None), |t| {
            let n = t.position();
            // At its end: where it was paused, or (it ended) its last instruction.
            let ip = t
                .insn_ip(n)
                .or(stop_ip.filter(|_| n >= t.len()))
                .or_else(|| n.checked_sub(1).and_then(|l| t.insn_ip(l)));
            // PC-only: a register file captured at this position (a stop of this thread).
            let captured = t.snapshots.get(n).filter(|r| Some(r.pc()) == ip);
            (ip, n >= t.len(), captured)
        });
        self.group = Some(g);
        let live = self.live.as_mut().ok_or(not_recorded)?;
        let prev = live.selected_thread();
        let present = if prev == tid || live.select_thread(tid).is_ok() {
            let r = live.read_registers().ok();
            let _ = live.select_thread(prev);
            r
        } else {
            None
        };
        // A thread that has exited: the registers it ended with stand for its present (the
        // state log has nothing of it after its end, so undoing its later writes from there
        // gives its registers at `pos` exactly).
        let present = present.or_else(|| live.exited_thread_registers(tid));
        let state = live.recorded_state().and_then(|s| s.global());
        let has_state = state.is_some();
        let rebuilt = match (state, &present) {
            (Some(state), Some(present)) => state.registers_at_thread(tid, pos, present),
            _ => None,
        };
        match (rebuilt, ip) {
            (Some(mut r), ip) => {
                if let Some(ip) = ip
                    && ip != r.pc()
                {
                    self.checks.pc_mismatches += 1;
                    // The trace is authoritative for the PC.
                    r.set_pc(ip);
                }
                Ok(r)
            }
            // PC-only, a thread paused at its end: it has not run since, so its present
            // registers are its registers there, exactly.
            (None, Some(ip))
                if !has_state
                    && at_end
                    && stop_ip == Some(ip)
                    && present.as_ref().is_some_and(|r| r.pc() == ip) =>
            {
                present.ok_or(TargetError::Unsupported("a thread that is not recorded"))
            }
            (None, Some(ip)) => {
                Ok(captured.unwrap_or_else(|| unknown_registers(&self.template, ip)))
            }
            (None, None) => Err(TargetError::Unsupported(
                "the registers of a thread that has exited",
            )),
        }
    }

    /// Memory at the group's global position: the present memory with every later write (by
    /// any thread) undone, or PC-only (immutable code) without a state log.
    pub(super) fn live_group_memory(&mut self, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        let Some(g) = self.group.as_ref() else {
            return Err(TargetError::Memory { addr });
        };
        let pos = g.pos;
        // The main thread's position: where the code mappings' positions are counted.
        let main = g.order.executed_before(0, pos);
        // Code replaced since (by any thread): the snapshot of the period the main thread's
        // position lies in.
        let mut len = buf.len();
        if let Some(i) = self.earlier_period(main) {
            match self.period_snapshot(i, addr, buf)? {
                super::periods::PeriodRead::Served(n) => return Ok(n),
                super::periods::PeriodRead::Elsewhere(next) => len = next,
            }
        }
        let buf = &mut buf[..len];
        if !self.has_state_log() {
            return self.pc_only_memory(main, addr, buf);
        }
        let live = self.live_mut()?;
        let n = live.read_memory(addr, buf)?;
        if let Some(state) = live.recorded_state().and_then(|s| s.global()) {
            state.memory_at(pos, addr, &mut buf[..n]);
        }
        Ok(n)
    }

    /// A write-watchpoint search over every thread from the group's global position: the last
    /// write before it (`forward` false) or the first after it; `(writer's thread index, the
    /// global position to stop at, the stop)`.
    pub(super) fn live_group_watch(&mut self, forward: bool) -> Option<(usize, u64, StopEvent)> {
        if self.watches.is_empty() || !self.is_live_group() {
            return None;
        }
        let g = self.group.as_ref()?;
        let (pos, total) = (g.pos, g.order.len());
        let state = self.live.as_ref()?.recorded_state()?.global()?;
        let hit = if forward {
            state.find_write(pos, total, &self.watches)?
        } else {
            state.rfind_write(pos, 0, &self.watches)?
        };
        // The writing instruction is the one at `before`: its thread is the one to show.
        let writer = state.thread_at(hit.before)?;
        let k = g.tids.iter().position(|&t| t == writer)?;
        let at = if forward { hit.after } else { hit.before };
        let ev = self.watch_stop(hit, at);
        Some((k, at, ev))
    }
}
