//! One step of the current thread: what the stop says happened, and what the encoder and the
//! state log are told (see the module docs of [`super`]).

use super::*;

/// True if `insn` is a system call instruction about to run `exit` (60) or `exit_group` (231)
/// with the registers `before` it.
pub(super) fn is_exit_syscall(insn: Option<&CachedInsn>, before: &Gprs) -> bool {
    insn.is_some_and(|i| i.class == InsnClass::SysCall) && matches!(before.rax, 60 | 231)
}

/// `__NR_restart_syscall` on x86-64.
const NR_RESTART_SYSCALL: u64 = 219;

/// The registers the kernel resumes with from a stop inside an interrupted system call when no
/// signal handler runs (`arch_do_signal_or_restart`): the `syscall` 2 bytes back with RAX = the
/// call to restart and no system call in progress; `None` at any other stop.
pub(super) fn restart_point(regs: &Gprs) -> Option<Gprs> {
    const ERESTARTSYS: i64 = -512;
    const ERESTARTNOINTR: i64 = -513;
    const ERESTARTNOHAND: i64 = -514;
    const ERESTART_RESTARTBLOCK: i64 = -516;
    if (regs.orig_rax as i64) < 0 {
        return None;
    }
    let nr = match regs.rax as i64 {
        ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND => regs.orig_rax,
        ERESTART_RESTARTBLOCK => NR_RESTART_SYSCALL,
        _ => return None,
    };
    let mut restarted = *regs;
    restarted.rip = regs.rip.wrapping_sub(2);
    restarted.rax = nr;
    restarted.orig_rax = u64::MAX;
    Some(restarted)
}

impl<T: StepTarget> SoftRecorder<T> {
    /// Before the current thread's system call `before.rax`: if it may replace code — execve
    /// or execveat of the main thread (the whole address space), munmap or mmap(MAP_FIXED)
    /// over an executable mapping by any thread (the threads share it) — the code as it is now
    /// (see [`ExecPeriod`]), read while it still exists.
    fn period_may_end(&mut self, before: &Gprs) -> Option<PendingPeriod> {
        if !matches!(before.rax, 9 | 11 | 59 | 322) {
            return None;
        }
        let pid = self.target.pid();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let cause = match before.rax {
            59 | 322 => "exec".to_string(),
            9 | 11 => {
                const MAP_FIXED: u64 = 0x10;
                if before.rax == 9 && before.r10 & MAP_FIXED == 0 {
                    return None;
                }
                let (start, end) = (before.rdi, before.rdi.saturating_add(before.rsi));
                let over_code = crate::capture::soft::procmaps::parse_maps(&maps)
                    .iter()
                    .any(|m| m.exec && m.start < end && start < m.end);
                if !over_code {
                    return None;
                }
                let call = if before.rax == 9 { "mmap" } else { "munmap" };
                format!("{call} {start:#x}-{end:#x}")
            }
            _ => return None,
        };
        let mut image = crate::capture::soft::procmaps::capture_image(&mut self.target)
            .map(|(image, _skipped)| image)
            .unwrap_or_default();
        // A program that maps and unmaps code often (a JIT) keeps one copy of what did not
        // change (its libraries, its executable) across all its periods.
        if let Some(prev) = self.exec_periods.last() {
            image.share_bytes_with(&prev.image);
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        Some(PendingPeriod {
            nr: before.rax,
            cause,
            image: Arc::new(image),
            maps,
            exe,
        })
    }

    /// The current thread's system call `nr` succeeded: if its code was read before it (see
    /// [`Self::period_may_end`]), the period ends here and the main thread's encoder opens the
    /// next one (the history is the main thread's stream; the other threads are stopped while
    /// one steps, so the main thread's next instruction runs after the change).
    fn end_period(&mut self, nr: u64) {
        if self.exec_image.as_ref().is_none_or(|p| p.nr != nr) {
            return;
        }
        let Some(p) = self.exec_image.take() else {
            return;
        };
        let pid = self.target.pid();
        // Every thread's stream gets the boundary (each is decoded against its own periods).
        let mut main_offset = None;
        let mut thread_offsets = Vec::new();
        let current = self.lane.encoder.new_address_space();
        if self.lane.tid == pid {
            main_offset = Some(current);
        } else {
            thread_offsets.push((self.lane.tid, current));
        }
        for i in 0..self.parked.len() {
            let offset = self.parked_boundary(i);
            if self.parked[i].tid == pid {
                main_offset = Some(offset);
            } else {
                thread_offsets.push((self.parked[i].tid, offset));
            }
        }
        if !self.parked.is_empty() {
            let _ = self.target.select_thread(self.lane.tid);
        }
        for lane in &mut self.ended_lanes {
            // Ended: its whole stream lies before (its end; nothing is added).
            thread_offsets.push((lane.tid, lane.encoder.new_address_space()));
        }
        let Some(next_stream_offset) = main_offset else {
            return;
        };
        let next_insn = self.thread_recorded(pid);
        self.exec_periods.push(ExecPeriod {
            cause: p.cause,
            image: p.image,
            maps: p.maps,
            exe: p.exe,
            next_insn,
            next_stream_offset,
            thread_offsets,
        });
    }

    /// A period ends while parked thread `self.parked[i]` stands between two instructions (or
    /// waits in a system call whose `syscall` is not recorded yet): its trace is disabled
    /// before the next one (FUP + TIP.PGD) and its next period starts there. Returns the stream
    /// offset of the PSB that will open it. Leaves the target's selected thread changed.
    fn parked_boundary(&mut self, i: usize) -> u64 {
        let at = match &self.parked[i].in_flight {
            Some(f) => Some(f.ip),
            None => {
                let tid = self.parked[i].tid;
                self.target
                    .select_thread(tid)
                    .and_then(|()| self.target.regs())
                    .map(|r| r.rip)
                    .ok()
            }
        };
        let lane = &mut self.parked[i];
        if let Some(ip) = at {
            lane.encoder.disable(ip);
        }
        lane.encoder.new_address_space()
    }

    /// One step of the current thread.
    pub(super) fn step_lane(&mut self) -> Result<StepEvent, RecordError> {
        let mut before = self.current_regs()?;
        self.lane.step_origin = Some(before);
        // The call a `restart_syscall` continues (its arguments are still in the registers).
        let mut restarted_call = None;
        // Resumed without a signal, a stop inside an interrupted system call re-executes the
        // `syscall` before RIP (see the module docs): that is the instruction this step runs.
        if self.lane.pending_signal.is_none()
            && let Some(restarted) = restart_point(&before)
            && let Ok(insn) = self.cache.get(&mut self.target, restarted.rip)
            && insn.class == InsnClass::SysCall
            && insn.nlip() == before.rip
        {
            self.stats.syscall_restarts += 1;
            if restarted.rax == NR_RESTART_SYSCALL {
                restarted_call = Some(before.orig_rax);
            }
            before = restarted;
        }
        if let Some(log) = self.state_log.as_mut() {
            log.set_restarted_call(restarted_call);
        }
        let ip = before.rip;
        // An undecodable or unreadable instruction still gets stepped: the CPU raises #UD or
        // #PF (SIGILL, SIGSEGV), which the signal path handles.
        let insn = self.cache.get(&mut self.target, ip).ok();
        if insn.as_ref().is_some_and(|i| i.class == InsnClass::SysCall) {
            self.exec_image = self.period_may_end(&before);
        }
        if let (Some(log), Some(insn)) = (self.state_log.as_mut(), insn.as_ref())
            && self.recording
        {
            log.before_step(&mut self.target, &before, insn);
        }
        if self.state_log.is_some()
            && self.recording
            && before.rax == libc::SYS_exit as u64
            && insn.as_ref().is_some_and(|i| i.class == InsnClass::SysCall)
        {
            // The thread's own `exit` (if the call ends it, `finish_step` sees the thread
            // gone): afterwards nothing of it can be read, and its registers in the past are
            // rebuilt from those it ends with. The call does not touch the vector state.
            self.lane.exit_xstate = self.target.xstate();
        }
        let signal = self.lane.pending_signal.take();
        self.lane.stop_siginfo = None;
        if let (Some(log), Some(_)) = (self.state_log.as_mut(), signal)
            && self.recording
        {
            log.before_signal(&mut self.target, &before);
        }
        self.lane.regs = None;
        self.stats.single_steps += 1;
        self.steps.fetch_add(1, Ordering::Relaxed);
        let stop = if !self.parked.is_empty()
            && insn.is_none_or(|i| i.class == InsnClass::SysCall)
            && self.target.step_start(signal)?
        {
            // A system call may wait for another thread: if it does not come back at once,
            // it stays in flight and the other threads run.
            match self.poll_briefly()? {
                Some(stop) => stop,
                None => {
                    let log = self.state_log.as_mut().and_then(|l| l.suspend_step());
                    self.lane.in_flight = Some(InFlight {
                        ip,
                        insn,
                        before,
                        signal,
                        log,
                    });
                    self.stats.blocked_steps += 1;
                    return Ok(StepEvent::Idle);
                }
            }
        } else {
            self.target.single_step(signal)?
        };
        self.finish_step(ip, insn, before, signal, stop)
    }

    /// Waits a little for the current thread's step (begun with `step_start`).
    pub(super) fn poll_briefly(&mut self) -> Result<Option<StepStop>, RecordError> {
        let tid = self.lane.tid;
        for i in 0..40 {
            if let Some(stop) = self.target.step_poll(tid, false)? {
                return Ok(Some(stop));
            }
            if i < 20 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        Ok(None)
    }

    /// Records how the step of the instruction at `ip` (registers `before`) ended.
    pub(super) fn finish_step(
        &mut self,
        ip: u64,
        insn: Option<CachedInsn>,
        before: Gprs,
        signal: Option<Signal>,
        stop: StepStop,
    ) -> Result<StepEvent, RecordError> {
        if let StepStop::Signal(Signal::SIGSTOP) = stop
            && std::mem::take(&mut self.lane.sigstop_sent)
        {
            // Our own SIGSTOP (collecting a thread waiting in a system call): the program
            // does not get it.
            let after = self.current_regs()?;
            if self.lane.step_origin != Some(after)
                && let Some(insn) = insn
            {
                // The system call was interrupted after entering the kernel: it executed (and
                // restarts at the next step, see the module docs).
                return self.executed(ip, &insn, &after);
            }
            // It stopped before anything ran (the step came back first, then the SIGSTOP).
            self.discard_state_entry();
            return Ok(StepEvent::Idle);
        }
        let exec_trap_due = std::mem::take(&mut self.lane.exec_trap_due);
        match stop {
            StepStop::ThreadExited(_) => {
                // The thread's own `exit` executed and it is gone.
                let mut after = before;
                if let Some(insn) = insn {
                    after.rip = insn.nlip();
                    self.executed(ip, &insn, &after)?;
                }
                if self.state_log.is_some() && self.recording {
                    // What the state log has it end with: its past is rebuilt from these.
                    let xstate = self.lane.exit_xstate.take();
                    let known = xstate.is_some();
                    let mut end = X86Registers::from_parts(&after, xstate.unwrap_or_default());
                    if !known {
                        end.unavailable = RegMask::VECTOR;
                    }
                    // A reused thread id: two threads ended under it (see `exited_regs`).
                    self.exited_regs
                        .entry(self.lane.tid)
                        .and_modify(|e| *e = None)
                        .or_insert(Some(end));
                }
                self.lane_ended()?;
                Ok(StepEvent::Executed { ip })
            }
            // A breakpoint report for a single step means the step ended on a breakpoint
            // address: it is the step's trap.
            StepStop::Trap | StepStop::Breakpoint { .. } => {
                let code = if signal.is_some()
                    || insn
                        .is_none_or(|i| matches!(i.class, InsnClass::SoftInt | InsnClass::SysCall))
                {
                    self.target.siginfo()?.code
                } else {
                    TRAP_TRACE
                };
                if signal.is_some() && code == TRAP_SIGNAL_DELIVERED {
                    return self.handler_entered(ip);
                }
                let after = self.current_regs()?;
                if exec_trap_due && signal.is_none() && code == TRAP_TRACE && after.rip == ip {
                    // The execve's own step trap (see `Lane::exec_trap_due`): nothing ran.
                    self.discard_state_entry();
                    return Ok(StepEvent::Idle);
                }
                if code != TRAP_TRACE && code != TRAP_BRKPT {
                    // A SIGTRAP that is not the step trap: the program's own INT3/INT1 (after
                    // it executed), or a SIGTRAP sent to it. Either way the program gets it.
                    self.lane.pending_signal = Some(Signal::SIGTRAP);
                    let executed =
                        after.rip != ip || insn.is_some_and(|i| i.class == InsnClass::SoftInt);
                    if !executed {
                        self.stats.signal_stops += 1;
                        self.discard_state_entry();
                        return Ok(StepEvent::Signal {
                            signal: Signal::SIGTRAP,
                            ip,
                        });
                    }
                }
                match insn {
                    Some(insn) => self.executed(ip, &insn, &after),
                    None => {
                        // The bytes did not decode but the CPU executed them (an instruction
                        // iced does not know): nothing to encode, the flow is unknown.
                        self.stats.anomalies += 1;
                        Ok(StepEvent::Executed { ip })
                    }
                }
            }
            StepStop::Signal(sig) => {
                self.stats.signal_stops += 1;
                self.lane.pending_signal = Some(sig);
                self.lane.stop_siginfo = self.target.siginfo_bytes();
                let after = self.current_regs()?;
                if after.rip != ip {
                    // A system call interrupted by the signal entered the kernel and stopped
                    // after its `syscall` (it restarts on the next step, see the module docs);
                    // anything else is not expected: count it and follow RIP.
                    let interrupted_syscall = restart_point(&after).is_some()
                        && insn.is_some_and(|i| {
                            i.class == InsnClass::SysCall && i.nlip() == after.rip
                        });
                    if !interrupted_syscall {
                        self.stats.anomalies += 1;
                    }
                    if let Some(insn) = insn {
                        return self.executed(ip, &insn, &after);
                    }
                }
                self.discard_state_entry();
                Ok(StepEvent::Signal { signal: sig, ip })
            }
            StepStop::Exiting => {
                // Either the instruction was exit/exit_group (it executed), or a signal we
                // passed (or SIGKILL) ended the process: before the instruction ran, or after
                // (a SIGKILL from outside that lands once the step is done replaces its trap
                // by the exit event). The PC at the exit event says which.
                let mut executed = signal.is_none() && is_exit_syscall(insn.as_ref(), &before);
                if let (true, Some(insn)) = (executed, insn) {
                    let mut after = before;
                    after.rip = insn.nlip();
                    self.executed(ip, &insn, &after)?;
                } else if let (None, Some(insn)) = (signal, insn)
                    && let Ok(after) = self.current_regs()
                    && after.rip != ip
                {
                    self.executed(ip, &insn, &after)?;
                    executed = true;
                }
                self.at_exit_event((!executed).then_some(ip))
            }
            StepStop::FollowedFork { child } => {
                // The `fork` executed; the target now follows the child, which goes on from the
                // same place in an identical address space: the same stream and state log go
                // on, the past before the fork served as the child's.
                self.stats.forks_followed += 1;
                if let Some(log) = self.state_log.as_mut() {
                    log.rename_thread(self.lane.tid, child);
                }
                self.lane.tid = child;
                self.lane.regs = None;
                let after = self.current_regs()?;
                match insn {
                    Some(insn) => self.executed(ip, &insn, &after),
                    None => Ok(StepEvent::Executed { ip }),
                }
            }
            StepStop::VForkDone => {
                // The vfork's end, inside the call (its exit trap comes with the next step):
                // nothing ran.
                self.discard_state_entry();
                Ok(StepEvent::Idle)
            }
            StepStop::VForked => {
                // The vfork call executed as far as this thread can see (held for the
                // debugger; the target finishes it at the next step).
                let after = self.current_regs()?;
                match insn {
                    Some(insn) => self.executed(ip, &insn, &after),
                    None => Ok(StepEvent::Executed { ip }),
                }
            }
            StepStop::Exec => {
                // The execve system call executed and returned into a new program: its code is
                // all different (the image captured at exit is the new program's).
                self.stats.execs += 1;
                self.cache.invalidate_all();
                // Every other thread is gone (an exec from another thread than the leader goes
                // on under the leader's id): their streams end where they stood.
                let alive = self.target.threads();
                let pid = self.target.pid();
                if !alive.contains(&self.lane.tid) && self.parked.iter().any(|l| l.tid == pid) {
                    return self.exec_by_another_thread(ip, insn, pid);
                }
                if !alive.contains(&self.lane.tid)
                    && let Some(&tid) = alive.first()
                {
                    // (No main thread's lane to go on in: not a period of the history.)
                    self.exec_image = None;
                    if let Some(log) = self.state_log.as_mut() {
                        log.rename_thread(self.lane.tid, tid);
                    }
                    self.lane.tid = tid;
                }
                let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.parked)
                    .into_iter()
                    .partition(|l| !alive.contains(&l.tid) || l.tid == self.lane.tid);
                self.parked = kept;
                let others = std::mem::replace(&mut self.parked, gone);
                self.end_parked();
                self.parked = others;
                self.lane.regs = None;
                let after = self.current_regs()?;
                let event = match insn {
                    Some(insn) => self.executed(ip, &insn, &after),
                    None => Ok(StepEvent::Executed { ip }),
                };
                self.lane.exec_trap_due = true;
                // The main thread's history goes on in another address space: the encoder
                // opens it with a PSB+ where the decoder switches to the new code.
                let nr = self.exec_image.as_ref().map_or(59, |p| p.nr);
                if matches!(nr, 59 | 322) {
                    self.end_period(nr);
                }
                event
            }
            StepStop::Exited(_) | StepStop::Killed(_) => {
                // Without PTRACE_EVENT_EXIT (a target that does not report it), an exit seen
                // right after stepping exit/exit_group is that system call executing.
                let executed = matches!(stop, StepStop::Exited(_))
                    && signal.is_none()
                    && is_exit_syscall(insn.as_ref(), &before);
                if let (true, Some(insn)) = (executed, insn) {
                    let mut after = before;
                    after.rip = insn.nlip();
                    self.executed(ip, &insn, &after)?;
                }
                self.ended(stop, (!executed).then_some(ip))
            }
        }
    }

    /// Thread `self.lane` (not the main one) called `execve`, which succeeded: the kernel ended
    /// every other thread, the main one included, and the exec'ing thread goes on in the new
    /// program under the main thread's id (`pid`). Its own stream ends with the `execve`; the
    /// main thread's stream — the history — goes on with the new program: the main thread's
    /// old-program part ends where it stood (before the system call it waited in), the state
    /// log keeps the register jump from there to the new program's entry, and the new program
    /// is a new period of the history (its code read before the `execve`).
    fn exec_by_another_thread(
        &mut self,
        ip: u64,
        insn: Option<CachedInsn>,
        pid: i32,
    ) -> Result<StepEvent, RecordError> {
        self.lane.regs = None;
        self.target.select_thread(pid)?;
        let after = self.target.regs()?;
        let event = match insn {
            Some(insn) => self.executed(ip, &insn, &after)?,
            None => StepEvent::Executed { ip },
        };
        // The exec'ing thread's stream ends with its `execve`.
        self.lane.encoder.flush();
        self.write_out(true);
        self.stats.threads_ended += 1;
        let Some(j) = self.parked.iter().position(|l| l.tid == pid) else {
            return Ok(event);
        };
        let main = self.parked.remove(j);
        let exec_lane = std::mem::replace(&mut self.lane, main);
        self.ended_lanes.push(exec_lane);
        // The other threads are gone too: their streams end where they stood.
        self.end_parked();
        // The main thread was ended inside the system call it waited in (its step never comes
        // back), or between two instructions.
        let jump_from = match self.lane.in_flight.take() {
            Some(f) => {
                if self.recording {
                    self.lane.encoder.disable(f.ip);
                }
                Some(f.before)
            }
            None => {
                // Where it stood is not known any more (the thread is gone).
                self.stats.anomalies += 1;
                if self.recording {
                    self.lane.encoder.finish(None);
                }
                None
            }
        };
        self.enter_lane()?;
        if let (Some(log), Some(before)) = (self.state_log.as_mut(), jump_from)
            && self.recording
        {
            log.register_jump(&before, &after);
        }
        self.lane.regs = Some(after);
        // The kernel still reports the single step of the `execve` (see `Lane::exec_trap_due`).
        self.lane.exec_trap_due = true;
        let nr = self.exec_image.as_ref().map_or(59, |p| p.nr);
        if matches!(nr, 59 | 322) {
            self.end_period(nr);
        }
        Ok(event)
    }

    /// Settles a fork a step executed and the target holds for the debugger
    /// ([`StepTarget::take_fork_report`]): `detach` is the side let go. When it is the parent,
    /// the child becomes the process and the recording goes on in it exactly as at a followed
    /// fork (same stream and state log, the past before the fork served as the child's); the
    /// streams of the parent's other threads end at the fork.
    /// Returns the process from now on (`None`: no such fork).
    pub fn resolve_fork(&mut self, detach: i32) -> Result<Option<i32>, RecordError> {
        let parent = self.target.pid();
        if detach == parent
            && let Some(forking) = self.target.held_fork_parent()
        {
            // The child is the copy of the thread that forked: its lane goes on in the child;
            // the parent's other threads do not exist there, so their streams end here (their
            // past stays recorded).
            self.switch_to_tid(forking)?;
            self.end_parked();
        }
        let now = self.target.resolve_fork(detach)?;
        if let Some(child) = now.filter(|&p| p != parent) {
            self.stats.forks_followed += 1;
            if let Some(log) = self.state_log.as_mut() {
                log.rename_thread(self.lane.tid, child);
            }
            self.lane.tid = child;
            self.lane.regs = None;
        }
        Ok(now)
    }

    /// Before encoding the instruction at `ip`: the stream's time is the global clock (the
    /// instructions recorded so far, all threads together: the TSC of a PSB+ is the global
    /// index of the instruction after it), and a thread just switched in gets a TSC packet
    /// right after tracing is (re-)enabled at `ip`, so every run of a thread's instructions
    /// starts with its global index and the streams merge in exact order.
    /// Counts one recorded instruction of the current thread and encodes it (after the clock
    /// stamp it may need): the one place a single step and a block's straight-line
    /// instructions are recorded.
    pub(super) fn record_step(&mut self, step: Step) {
        self.clock_before(step.ip);
        self.stats.recorded += 1;
        self.lane.recorded += 1;
        self.lane.next_ip = Some(step.next_ip);
        if let Some(log) = self.lane.ip_log.as_mut() {
            log.push(step.ip);
        }
        self.lane.encoder.step(step);
    }

    pub(super) fn clock_before(&mut self, ip: u64) {
        let now = self.stats.recorded;
        let enc = &mut self.lane.encoder;
        enc.set_tsc(now);
        if std::mem::take(&mut self.lane.stamp_due) {
            enc.enter(ip);
            enc.tsc_now(now);
        }
    }

    pub(super) fn discard_state_entry(&mut self) {
        if let Some(log) = self.state_log.as_mut() {
            log.cancel_step();
        }
    }

    pub(super) fn handler_entered(&mut self, ip: u64) -> Result<StepEvent, RecordError> {
        self.stats.handlers_entered += 1;
        let regs = self.current_regs()?;
        if let Some(log) = self.state_log.as_mut() {
            if self.recording {
                log.signal_delivered(&regs);
            } else {
                log.cancel_step();
            }
        }
        if self.recording {
            self.lane.encoder.async_transfer(ip);
        }
        let handler = regs.rip;
        Ok(StepEvent::HandlerEntered { from: ip, handler })
    }

    pub(super) fn executed(
        &mut self,
        ip: u64,
        insn: &CachedInsn,
        after: &Gprs,
    ) -> Result<StepEvent, RecordError> {
        let next_ip = after.rip;
        if insn.rep_string && next_ip == ip {
            self.stats.rep_iterations += 1;
            if let Some(log) = self.state_log.as_mut() {
                log.after_step(after, false);
            }
            return Ok(StepEvent::Iteration { ip });
        }
        if insn.class == InsnClass::SysCall {
            // Code may have changed under the cache: mmap, mprotect, munmap, mremap, execve,
            // pkey_mprotect (orig_rax keeps the number after the call).
            if matches!(after.orig_rax, 9..=11 | 25 | 59 | 329) {
                self.cache.invalidate_all();
            }
            // clone/clone3 created a thread or process (the parent sees a positive id). A
            // thread shares the code: a temporary INT3 of block stepping could trap it, and it
            // is not traced, so from then on every instruction is single-stepped. A forked
            // child has its own copy of memory, and a vfork child has exec'd or exited by the
            // time the parent returns: both leave block stepping on.
            if matches!(after.orig_rax, 56 | 435) && (after.rax as i64) > 0 {
                self.stats.clones += 1;
                let flags = if after.orig_rax == 56 {
                    Some(after.rdi)
                } else {
                    // clone3: the flags are the first field of struct clone_args at RDI.
                    let mut b = [0u8; 8];
                    match self.target.read_memory(after.rdi, &mut b) {
                        Ok(8) => Some(u64::from_le_bytes(b)),
                        _ => None,
                    }
                };
                let shares_memory = flags.is_none_or(|f| {
                    f & libc::CLONE_VM as u64 != 0 && f & libc::CLONE_VFORK as u64 == 0
                });
                if shares_memory {
                    self.stats.thread_clones += 1;
                    self.block_stepping_allowed = false;
                }
            }
        }
        if !self.recording {
            self.stats.unrecorded += 1;
            return Ok(StepEvent::Executed { ip });
        }
        if let Some(log) = self.state_log.as_mut() {
            log.after_step(after, true);
        }
        self.record_step(Step {
            ip,
            len: insn.len(),
            cofi: cofi(insn.class, insn.nlip(), next_ip),
            next_ip,
        });
        // munmap / mmap(MAP_FIXED) over code that succeeded: the code there is gone.
        if insn.class == InsnClass::SysCall
            && matches!(after.orig_rax, 9 | 11)
            && !(-4095..0).contains(&(after.rax as i64))
        {
            self.end_period(after.orig_rax);
        }
        self.write_out(false);
        Ok(StepEvent::Executed { ip })
    }

    /// The process stands at its exit event (`PTRACE_EVENT_EXIT`, memory still readable):
    /// it stays there when the end is kept, else it is let go and its end recorded
    /// (`unexecuted`: the instruction it was killed before, as for [`ended`](Self::ended)).
    pub(super) fn at_exit_event(
        &mut self,
        unexecuted: Option<u64>,
    ) -> Result<StepEvent, RecordError> {
        if self.config.capture_image_at_exit {
            self.image = procmaps::capture_image(&mut self.target)
                .ok()
                .map(|(image, _)| image);
        }
        self.lane.regs = None;
        if self.stop_at_exit {
            // The process stays at its end; whoever drives it lets it go. The trace is
            // closed at the stop like at any other (FUP + TIP.PGD at the PC).
            self.at_exit = true;
            self.write_out(true);
            return Ok(StepEvent::Exiting);
        }
        let end = self.target.cont(None)?;
        self.ended(end, unexecuted)
    }

    pub(super) fn ended(
        &mut self,
        stop: StepStop,
        unexecuted: Option<u64>,
    ) -> Result<StepEvent, RecordError> {
        let exit = match stop {
            StepStop::Exited(code) => Exit::Code(code),
            StepStop::Killed(sig) => Exit::Signal(sig),
            other => {
                return Err(TargetError::Unexpected {
                    pid: self.target.pid(),
                    what: format!("after exit event: {other:?}"),
                }
                .into());
            }
        };
        self.exit = Some(exit);
        self.lane.regs = None;
        if self.recording {
            // Killed before `ip` executed: FUP(ip) + TIP.PGD. After exit_group the TIP.PGD was
            // already written and this adds nothing.
            self.lane.encoder.finish(unexecuted);
        }
        self.lane.encoder.flush();
        self.write_out(true);
        self.end_parked();
        Ok(StepEvent::Exited(exit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(rip: u64, rax: i64, orig_rax: i64) -> Gprs {
        let mut r = crate::target::regs::zeroed_gprs();
        r.rip = rip;
        r.rax = rax as u64;
        r.orig_rax = orig_rax as u64;
        r
    }

    #[test]
    fn restart_point_follows_the_kernel_restart_rules() {
        // clock_nanosleep (230) interrupted: restarted through restart_syscall (219).
        let r = restart_point(&regs(0x1002, -516, 230)).unwrap();
        assert_eq!((r.rip, r.rax, r.orig_rax as i64), (0x1000, 219, -1));
        // read (0) interrupted with -ERESTARTSYS / NOINTR / NOHAND: the call itself again.
        for code in [-512, -513, -514] {
            let r = restart_point(&regs(0x2002, code, 0)).unwrap();
            assert_eq!((r.rip, r.rax), (0x2000, 0));
        }
        // Not inside a system call, or a finished one (-EINTR, a result).
        assert!(restart_point(&regs(0x1002, -516, -1)).is_none());
        assert!(restart_point(&regs(0x1002, -4, 230)).is_none());
        assert!(restart_point(&regs(0x1002, 0, 230)).is_none());
    }
}
