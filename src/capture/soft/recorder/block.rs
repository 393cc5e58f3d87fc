//! Block stepping: straight-line code run at full speed to a temporary INT3 on the next
//! change of flow (see "Block stepping" in the module docs of [`super`]).

use super::steps::restart_point;
use super::*;

impl<T: StepTarget> SoftRecorder<T> {
    /// Block stepping: runs the straight-line instructions before the next change of flow at
    /// full speed up to a temporary INT3 on that instruction, and records them as executed.
    /// Returns `None` (nothing done) when the current instruction is itself a change of flow
    /// (it is single-stepped) or the code cannot be decoded.
    pub(super) fn run_block(&mut self, max: u64) -> Result<Option<u64>, RecordError> {
        let start = self.current_regs()?;
        // Resuming re-executes an interrupted system call first: single-step it. After an
        // execve the single step collects the exec's pending step trap first.
        if restart_point(&start).is_some() || self.lane.exec_trap_due {
            return Ok(None);
        }
        let mut block: Vec<CachedInsn> = Vec::new();
        let mut ip = start.rip;
        let end = loop {
            let insn = match self.cache.get(&mut self.target, ip) {
                Ok(c) => c,
                // Undecodable or unreadable bytes ahead (data after a UD2, the end of a
                // mapping): single-step instead; the CPU decides what happens there.
                Err(_) => return Ok(None),
            };
            if insn.class.is_branch()
                || insn.insn.flow_control() == iced_x86::FlowControl::Exception
                || block.len() as u64 + 1 >= max
                || block.len() >= MAX_BLOCK
            {
                break insn;
            }
            block.push(insn);
            ip = insn.nlip();
        };
        // Short blocks are cheaper to single-step than to run to a breakpoint.
        if block.len() < MIN_BLOCK {
            return Ok(None);
        }
        let bp = end.insn.ip();
        let mut orig = [0u8; 1];
        if self.target.read_memory(bp, &mut orig)? != 1 {
            return Ok(None);
        }
        if self.target.write_memory(bp, &[0xcc]).is_err() {
            return Ok(None);
        }
        self.lane.regs = None;
        self.stats.blocks += 1;
        let stop = self.target.cont(None)?;
        if matches!(
            stop,
            StepStop::Trap | StepStop::Signal(_) | StepStop::Breakpoint { .. }
        ) {
            self.target.write_memory(bp, &orig)?;
        }
        match stop {
            StepStop::Breakpoint { pc } => {
                // A debugger's breakpoint inside the block: stop there, so the debugger can
                // report it; nothing is delivered to the program.
                self.breakpoint_hit = Some(pc);
                Ok(Some(self.executed_straight(&block, pc)))
            }
            StepStop::Trap => {
                let mut regs = self.current_regs()?;
                if regs.rip == bp + 1 {
                    regs.rip = bp;
                    self.target.set_regs(&regs)?;
                    self.lane.regs = Some(regs);
                    Ok(Some(self.executed_straight(&block, bp)))
                } else {
                    // A SIGTRAP of the program's own (sent to it): deliver it, like any signal.
                    self.stats.signal_stops += 1;
                    self.lane.pending_signal = Some(Signal::SIGTRAP);
                    Ok(Some(self.executed_straight(&block, regs.rip)))
                }
            }
            StepStop::Signal(sig) => {
                // A fault in the block, or an asynchronous signal: everything before the stop
                // IP executed, the instruction at it did not.
                self.stats.signal_stops += 1;
                self.lane.pending_signal = Some(sig);
                self.lane.stop_siginfo = self.target.siginfo_bytes();
                let at = self.current_regs()?.rip;
                Ok(Some(self.executed_straight(&block, at)))
            }
            StepStop::ThreadExited(_) => {
                // Not possible (a full-speed run reports the process, not a thread).
                self.stats.anomalies += 1;
                Ok(Some(0))
            }
            StepStop::FollowedFork { .. } | StepStop::VForked | StepStop::VForkDone => {
                // Not possible (system calls end blocks, and a continue reports no fork).
                self.stats.anomalies += 1;
                Ok(Some(0))
            }
            StepStop::Exec => {
                // Not possible (system calls end blocks); count it and go on single-stepping.
                self.stats.anomalies += 1;
                self.stats.execs += 1;
                self.cache.invalidate_all();
                Ok(Some(0))
            }
            StepStop::Exiting | StepStop::Exited(_) | StepStop::Killed(_) => {
                // Killed from outside while running the block (no instruction in it can exit):
                // where it stopped is unknown, so the trace ends at the block start.
                self.stats.anomalies += 1;
                if stop == StepStop::Exiting {
                    let end = self.target.cont(None)?;
                    self.ended(end, Some(start.rip))?;
                } else {
                    self.ended(stop, Some(start.rip))?;
                }
                Ok(Some(0))
            }
        }
    }

    /// Records the block's instructions up to (not including) `stop_ip` as executed.
    pub(super) fn executed_straight(&mut self, block: &[CachedInsn], stop_ip: u64) -> u64 {
        let n = self.record_block(block, stop_ip);
        self.write_out(false);
        n
    }

    pub(super) fn record_block(&mut self, block: &[CachedInsn], stop_ip: u64) -> u64 {
        let mut n = 0;
        for insn in block {
            let ip = insn.insn.ip();
            if ip == stop_ip {
                return n;
            }
            self.record_straight(ip, insn);
            n += 1;
        }
        let end = block.last().map(CachedInsn::nlip);
        if end != Some(stop_ip) {
            // The stop is not at an instruction boundary of the block: not expected.
            self.stats.anomalies += 1;
        }
        n
    }

    pub(super) fn record_straight(&mut self, ip: u64, insn: &CachedInsn) {
        if !self.recording {
            self.stats.unrecorded += 1;
            return;
        }
        self.record_step(Step {
            ip,
            len: insn.len(),
            cofi: crate::capture::soft::encoder::Cofi::None,
            next_ip: insn.nlip(),
        });
    }
}

/// Runs the target at full speed to `addr` with a temporary INT3 there, then restores the byte
/// and sets RIP back to `addr`. Signals that arrive meanwhile are passed on.
pub fn run_to_breakpoint<T: StepTarget + ?Sized>(
    target: &mut T,
    addr: u64,
) -> Result<(), RecordError> {
    let mut orig = [0u8; 1];
    if target.read_memory(addr, &mut orig)? != 1 {
        return Err(TargetError::Unexpected {
            pid: target.pid(),
            what: format!("cannot read breakpoint address {addr:#x}"),
        }
        .into());
    }
    target.write_memory(addr, &[0xcc])?;
    let mut signal = None;
    let result = loop {
        match target.cont(signal.take()) {
            Ok(StepStop::Trap) => {
                let mut regs = target.regs()?;
                if regs.rip == addr + 1 {
                    regs.rip = addr;
                    target.set_regs(&regs)?;
                    break Ok(());
                }
                // A SIGTRAP of the program's own: pass it on.
                signal = Some(Signal::SIGTRAP);
            }
            Ok(StepStop::Signal(sig)) => signal = Some(sig),
            // A debugger breakpoint on the way (the target steps over it when continuing).
            Ok(
                StepStop::Exiting
                | StepStop::Exec
                | StepStop::FollowedFork { .. }
                | StepStop::VForked
                | StepStop::VForkDone
                | StepStop::Breakpoint { .. }
                | StepStop::ThreadExited(_),
            ) => {}
            Ok(end @ (StepStop::Exited(_) | StepStop::Killed(_))) => {
                return Err(RecordError::ExitedEarly(end, addr));
            }
            Err(e) => break Err(e.into()),
        }
    };
    target.write_memory(addr, &orig)?;
    result
}
