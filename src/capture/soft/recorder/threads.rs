//! Every thread of the process: one lane (encoder, ring, stream) per thread, the round-robin
//! between them, steps left in flight in the kernel, and the end of each thread.

use super::*;

impl<T: StepTarget> SoftRecorder<T> {
    /// [`step`](Self::step) with several threads.
    pub(super) fn step_threads(&mut self) -> Result<StepEvent, RecordError> {
        // A blocked step that came back, in any thread, first (looked at every few steps, and
        // at once when nothing else can run).
        let nothing_runnable =
            self.lane.in_flight.is_some() && self.parked.iter().all(|l| l.in_flight.is_some());
        if (nothing_runnable || self.stats.single_steps % 16 == 0)
            && let Some(ev) = self.collect_in_flight()?
        {
            return Ok(ev);
        }
        if (self.lane.in_flight.is_some() || self.slice_used >= self.config.time_slice)
            && !self.rotate()?
        {
            if self.lane.in_flight.is_some() {
                // Every thread waits in a system call: give them a moment.
                std::thread::sleep(Duration::from_micros(100));
                return Ok(StepEvent::Idle);
            }
            // Only the current thread can run: it keeps running.
            self.slice_used = 0;
        }
        self.slice_used += 1;
        self.step_lane()
    }

    /// Starts recording thread `tid` (created by the program): its own stream, from its first
    /// instruction.
    pub(super) fn add_lane(&mut self, tid: i32) -> Result<(), RecordError> {
        let lane = Lane::new(tid, &self.config)?;
        if let Ok(mut v) = self.streams.lock() {
            v.push((lane.ring.clone(), lane.store.clone()));
        }
        self.parked.push(lane);
        self.stats.threads += 1;
        // Threads share the code: a temporary INT3 of block stepping could trap another one.
        self.block_stepping_allowed = false;
        Ok(())
    }

    pub(super) fn adopt_new_threads(&mut self) -> Result<(), RecordError> {
        for tid in self.target.take_new_threads() {
            if tid != self.lane.tid && !self.parked.iter().any(|l| l.tid == tid) {
                self.add_lane(tid)?;
            }
        }
        Ok(())
    }

    /// Makes the next runnable parked thread the current one; `false` if there is none.
    pub(super) fn rotate(&mut self) -> Result<bool, RecordError> {
        while let Some(j) = self.parked.iter().position(|l| l.in_flight.is_none()) {
            let next = self.parked.remove(j);
            if self.target.select_thread(next.tid).is_err() {
                // Gone without our seeing its end (killed while stopped, or an exec).
                self.stats.threads_lost += 1;
                self.ended_lanes.push(next);
                let _ = self.target.select_thread(self.lane.tid);
                continue;
            }
            self.switch_to(next)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Parks the current thread and makes `next` current. Unless its step is in flight, the
    /// parked thread's stream pauses before its next instruction (FUP + TIP.PGD, as for a
    /// thread scheduled out); `next` gets a TSC packet from the global clock before its next
    /// instruction.
    pub(super) fn switch_to(&mut self, next: Lane) -> Result<(), RecordError> {
        if self.lane.in_flight.is_none()
            && self.recording
            && self.lane.encoder.is_tracing()
            && let Ok(r) = self.current_regs()
        {
            self.lane.encoder.async_transfer(r.rip);
        }
        self.write_out(true);
        let old = std::mem::replace(&mut self.lane, next);
        self.parked.push(old);
        self.enter_lane()
    }

    /// Bookkeeping after `self.lane` changed.
    pub(super) fn enter_lane(&mut self) -> Result<(), RecordError> {
        self.lane.stamp_due = true;
        self.lane.regs = None;
        self.slice_used = 0;
        self.stats.switches += 1;
        self.target.select_thread(self.lane.tid)?;
        if let Some(log) = self.state_log.as_mut() {
            log.set_thread(self.lane.tid);
        }
        Ok(())
    }

    /// Makes thread `tid` current (a parked one), if it is not.
    pub(super) fn switch_to_tid(&mut self, tid: i32) -> Result<(), RecordError> {
        if self.lane.tid == tid {
            return Ok(());
        }
        if let Some(j) = self.parked.iter().position(|l| l.tid == tid) {
            let next = self.parked.remove(j);
            self.switch_to(next)?;
        }
        Ok(())
    }

    /// Collects one step in flight that came back (any thread), recording it.
    pub(super) fn collect_in_flight(&mut self) -> Result<Option<StepEvent>, RecordError> {
        let tids: Vec<i32> = std::iter::once(&self.lane)
            .chain(self.parked.iter())
            .filter(|l| l.in_flight.is_some())
            .map(|l| l.tid)
            .collect();
        for tid in tids {
            if let Some(stop) = self.target.step_poll(tid, false)? {
                return self.complete_in_flight(tid, stop).map(Some);
            }
        }
        Ok(None)
    }

    pub(super) fn complete_in_flight(
        &mut self,
        tid: i32,
        stop: StepStop,
    ) -> Result<StepEvent, RecordError> {
        self.switch_to_tid(tid)?;
        let Some(f) = self.lane.in_flight.take() else {
            return Ok(StepEvent::Idle);
        };
        if let (Some(log), Some(s)) = (self.state_log.as_mut(), f.log) {
            log.resume_step(s);
        }
        self.lane.regs = None;
        self.finish_step(f.ip, f.insn, f.before, f.signal, stop)
    }

    /// Whether the current thread's step is in flight (it waits in a system call: its
    /// registers cannot be read until it is collected or [`quiesce`](Self::quiesce)d).
    pub fn current_in_flight(&self) -> bool {
        self.lane.in_flight.is_some()
    }

    /// Whether every thread waits in a system call (nothing can be stepped).
    pub fn is_idle(&self) -> bool {
        self.lane.in_flight.is_some() && self.parked.iter().all(|l| l.in_flight.is_some())
    }

    /// Brings every thread to a stop: steps in flight (threads waiting in system calls) are
    /// interrupted (`SIGSTOP`, which is not passed to the program; the call restarts when the
    /// thread runs again) and recorded. Afterwards the thread that was current is current
    /// again. Returns the end of the process if it ended meanwhile.
    pub fn quiesce(&mut self) -> Result<Option<StepEvent>, RecordError> {
        if self.at_exit || self.exit.is_some() {
            // The process is ending: threads still in a system call never come back; their
            // streams end before that call.
            let recording = self.recording;
            let batch = self.config.write_batch;
            for lane in std::iter::once(&mut self.lane).chain(self.parked.iter_mut()) {
                if let Some(f) = lane.in_flight.take() {
                    end_lane_stream(lane, Some(f.ip), recording, batch, &mut self.stats);
                    self.stats.threads_lost += 1;
                }
            }
            return Ok(None);
        }
        let current = self.lane.tid;
        let waiting: Vec<i32> = std::iter::once(&mut self.lane)
            .chain(self.parked.iter_mut())
            .filter(|l| l.in_flight.is_some())
            .map(|l| {
                l.sigstop_sent = true;
                l.tid
            })
            .collect();
        for &tid in &waiting {
            self.target.interrupt_thread(tid);
        }
        for tid in waiting {
            let stop = match self.target.step_poll(tid, true)? {
                Some(stop) => stop,
                None => continue,
            };
            let ev = self.complete_in_flight(tid, stop)?;
            if matches!(ev, StepEvent::Exited(_) | StepEvent::Exiting) {
                return Ok(Some(ev));
            }
        }
        self.switch_to_tid(current)?;
        Ok(None)
    }

    /// The thread being stepped (the one a stop happened in).
    pub fn current_thread(&self) -> i32 {
        self.lane.tid
    }

    /// Makes the thread the target has selected (a debugger's choice, e.g. the thread to step)
    /// the current one, so the next step runs it; forgets the registers read at this stop.
    pub fn follow_selection(&mut self) -> Result<(), RecordError> {
        self.adopt_new_threads()?;
        let sel = self.target.current_thread();
        if sel != self.lane.tid
            && self
                .parked
                .iter()
                .any(|l| l.tid == sel && l.in_flight.is_none())
        {
            return self.switch_to_tid(sel);
        }
        self.reselect()
    }

    /// Starts the current thread's time slice again: a step with the other threads held (GDB's
    /// `vCont;s:T` alone, for a step over a breakpoint or with `scheduler-locking`) runs the
    /// thread it selected, not the next one in turn.
    pub fn restart_slice(&mut self) {
        self.slice_used = 0;
    }

    /// Gives the target back its current thread (a debugger may have selected another one to
    /// read its registers) and forgets the registers read at this stop.
    pub fn reselect(&mut self) -> Result<(), RecordError> {
        self.lane.regs = None;
        if !self.parked.is_empty() || self.lane.tid != self.target.pid() {
            self.target.select_thread(self.lane.tid)?;
        }
        Ok(())
    }

    /// The threads besides the main one that existed when the recorder was made — all of a
    /// process attached to, or those created before recording began — in the order found.
    pub fn threads_at_start(&self) -> &[i32] {
        &self.threads_at_start
    }

    /// Every recorded thread, the main thread first, with its stream (ended threads too).
    pub fn thread_stores(&self) -> Vec<(i32, TraceStore)> {
        let mut v: Vec<(i32, TraceStore)> = std::iter::once(&self.lane)
            .chain(self.parked.iter())
            .chain(self.ended_lanes.iter())
            .map(|l| (l.tid, l.store.clone()))
            .collect();
        let main = self.target.pid();
        v.sort_by_key(|(t, _)| (*t != main, *t));
        v
    }

    /// Instructions recorded in thread `tid` (0 for a thread never recorded).
    pub fn thread_recorded(&self, tid: i32) -> u64 {
        std::iter::once(&self.lane)
            .chain(self.parked.iter())
            .chain(self.ended_lanes.iter())
            .filter(|l| l.tid == tid)
            .map(|l| l.recorded)
            .sum()
    }

    /// Threads alive and recorded now, the main thread first.
    pub fn live_threads(&self) -> Vec<i32> {
        let mut v: Vec<i32> = std::iter::once(&self.lane)
            .chain(self.parked.iter())
            .map(|l| l.tid)
            .collect();
        let main = self.target.pid();
        v.sort_by_key(|t| (*t != main, *t));
        v
    }

    /// The process ended: every other thread's stream ends where it stood (a thread inside a
    /// system call that never came back: before that call).
    pub(super) fn end_parked(&mut self) {
        let batch = self.config.write_batch;
        for lane in self.parked.iter_mut() {
            let at = if self.recording {
                lane.in_flight.take().map(|f| f.ip)
            } else {
                None
            };
            end_lane_stream(lane, at, self.recording, batch, &mut self.stats);
        }
        self.ended_lanes.append(&mut self.parked);
    }

    /// The current thread ended while the process goes on: its stream ends and the next
    /// thread becomes current.
    pub(super) fn lane_ended(&mut self) -> Result<(), RecordError> {
        self.lane.encoder.flush();
        self.write_out(true);
        self.stats.threads_ended += 1;
        if self.parked.is_empty() {
            return Ok(());
        }
        // A runnable thread if there is one, else one waiting in a system call.
        let j = self
            .parked
            .iter()
            .position(|l| l.in_flight.is_none())
            .unwrap_or(0);
        let next = self.parked.remove(j);
        let old = std::mem::replace(&mut self.lane, next);
        self.ended_lanes.push(old);
        self.enter_lane()
    }
}
