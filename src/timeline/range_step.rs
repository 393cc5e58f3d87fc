//! Range stepping (GDB's `vCont;r`): a step repeated while the PC stays in the line being
//! stepped, with one stop reported at the end.
//!
//! Without it, `next` over a one-line loop is one debugger round trip per instruction, and at
//! the present one stop each: the backend makes the trace complete up to the PC (the ptrace
//! backend closes it, QEMU's streams are read to the stop), the code mappings are compared,
//! the debugger reads registers and memory. Here the intermediate steps are the backend's
//! steps alone; only the PC is read between them. In the past the steps are the history's.
//!
//! The repeat ends at the first step that is not an ordinary one (a breakpoint of another
//! thread, a signal, a watchpoint, an exit, the end of the history), when the PC leaves the
//! range or reaches a breakpoint (reported as a step there, as GDB counts a step onto a
//! breakpoint as its hit), or at the debugger's interrupt.
//!
//! A PC-only past (no state log) has complete register files only where the program stopped.
//! One stop per instruction left one at every instruction of a `next`; GDB's frame checks in a
//! later `reverse-next` over those lines depend on them (with the stack pointer
//! `<unavailable>` every frame looks new, and GDB takes each reverse step for a return into a
//! caller). So a live range step of the history's thread reads the whole register file at
//! each step instead of the PC alone (one round trip either way), and the files are placed at
//! their history positions once the index covers the stop, from the last step backwards while
//! each one's PC is the history's instruction there ([`Timeline::place_range_registers`]).

use super::{Running, Timeline};
use crate::target::{Resume, StepRange, StopEvent, TargetResult};
use std::time::Duration;

/// The register files a range step keeps at most, the latest (about 80 MB at the most; at
/// QEMU's ≈ 2 500 steps a second, the last 100 s of stepping).
const MAX_STEP_REGISTERS: usize = 1 << 18;

/// What the range steps did (`monitor stats`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RangeStepStats {
    /// Range steps ended.
    pub ended: u64,
    /// Steps they took in all.
    pub steps: u64,
    /// Register files read at their steps and placed in the history.
    pub placed: u64,
    /// Register files read but not placed: their PC was not the history's instruction where
    /// they belonged, or the index did not cover the stop in time, or more than
    /// [`MAX_STEP_REGISTERS`] in one range step.
    pub unplaced: u64,
}

/// How long one non-blocking [`Timeline::wait`] keeps stepping before it returns to the
/// server (which reads the debugger's Ctrl-C between waits).
pub(super) const RANGE_SLICE: Duration = Duration::from_millis(100);

/// A range step in progress.
#[derive(Clone, Copy, Debug)]
pub(super) struct RangeStep {
    /// The step that is repeated.
    pub how: Resume,
    pub range: StepRange,
    /// Whether the live steps are recorded (as the resume that began it decided).
    pub record: bool,
    /// The debugger interrupted: the range step ends at the next stop, as `SIGINT`.
    pub interrupted: bool,
    /// The interrupt was passed on to the backend (a step that did not end by itself, e.g.
    /// over a system call that blocks).
    pub forwarded: bool,
    /// Steps taken so far (`monitor stats`).
    pub steps: u64,
}

impl Timeline {
    /// A forward step (`how`) repeated while the PC stays in `range`; the stop is collected
    /// with [`wait`](Self::wait). Steps in the past move through the history, at the present
    /// they run the backend.
    pub fn resume_range(&mut self, how: Resume, range: StepRange) -> TargetResult<()> {
        self.resume(how)?;
        if matches!(how, Resume::Step { .. }) && range.start < range.end {
            self.range_step = Some(RangeStep {
                how,
                range,
                record: self.last_run_recorded,
                interrupted: false,
                forwarded: false,
                steps: 1,
            });
        }
        Ok(())
    }

    /// The stop `ev` of a range step's step (`live`: from the backend): `None` if the step was
    /// started again, else the stop to report (`ev`, or `SIGINT` after an interrupt): the
    /// range step is over.
    pub(super) fn range_step_on(
        &mut self,
        ev: StopEvent,
        live: bool,
    ) -> TargetResult<Option<StopEvent>> {
        let Some(rs) = self.range_step else {
            return Ok(Some(ev));
        };
        if ev != StopEvent::Step {
            self.end_range_step();
            return Ok(Some(ev));
        }
        if rs.interrupted {
            self.end_range_step();
            return Ok(Some(StopEvent::Signal(libc::SIGINT)));
        }
        let mut regs = None;
        let pc = match self.cursor {
            Some(n) if n < self.len() => self.insn_ip(n),
            Some(_) => self.read_registers().ok().map(|r| r.pc()),
            None if self.keeps_step_registers() => {
                let r = self.live.as_mut().and_then(|l| l.read_registers().ok());
                let pc = r.as_ref().map(|r| r.pc());
                regs = r;
                pc
            }
            None => self.live.as_mut().and_then(|l| l.pc().ok()),
        };
        if !pc.is_some_and(|pc| rs.range.contains(pc) && !self.bps.contains(&pc)) {
            self.end_range_step();
            return Ok(Some(ev));
        }
        if let Some(r) = regs {
            // The step goes on: these are the registers at a position the debugger never sees
            // as a stop (the last step's are the stop's own).
            self.step_regs.insert(rs.steps, r);
            if self.step_regs.len() > MAX_STEP_REGISTERS {
                self.step_regs.pop_first();
                self.range_stats.unplaced += 1;
            }
        }
        if live && self.cursor.is_none() {
            // Straight to the backend: no stop for the history (no sync, no image check).
            self.live_mut()?.resume(rs.how, rs.record)?;
            self.running = Running::Live;
        } else {
            // In the past (or onto the present from it): the ordinary resume, this range step
            // kept.
            self.resume(rs.how)?;
            self.range_step = Some(rs);
        }
        if let Some(r) = self.range_step.as_mut() {
            r.steps += 1;
        }
        Ok(None)
    }

    /// The debugger's interrupt during a range step: noted, the step in flight ends by itself
    /// (see [`RangeStep::forwarded`] for one that does not). `false` without a range step.
    pub(super) fn interrupt_range_step(&mut self) -> bool {
        match self.range_step.as_mut() {
            Some(rs) => {
                rs.interrupted = true;
                true
            }
            None => false,
        }
    }

    /// A live step of an interrupted range step that has not ended by itself: the interrupt
    /// goes to the backend (once).
    pub(super) fn forward_range_interrupt(&mut self) -> TargetResult<()> {
        let Some(rs) = self.range_step.as_mut() else {
            return Ok(());
        };
        if !rs.interrupted || rs.forwarded {
            return Ok(());
        }
        rs.forwarded = true;
        self.interrupt
            .store(true, std::sync::atomic::Ordering::Release);
        match self.live.as_mut() {
            Some(live) => live.interrupt(),
            None => Ok(()),
        }
    }

    fn end_range_step(&mut self) {
        if let Some(rs) = self.range_step.take() {
            self.range_stats.ended += 1;
            self.range_stats.steps += rs.steps;
        }
    }

    /// Whether live steps read the whole register file: a PC-only past, stepping the thread
    /// whose history it is.
    fn keeps_step_registers(&self) -> bool {
        self.live.as_ref().is_some_and(|l| {
            l.recorded_state().is_none() && l.selected_thread() == l.history_thread()
        })
    }

    /// Places the register files read at the last live range step's steps in the history,
    /// `stop` being the position of the stop that ended it: from the last step backwards,
    /// each where the history's instruction is at its PC. A run of steps at one PC (a `rep`
    /// instruction stepped an iteration at a time) that is one instruction in the history
    /// gives it the run's first file; a mismatch ends the placing.
    pub(super) fn place_range_registers(&mut self, stop: u64) {
        let steps = std::mem::take(&mut self.step_regs);
        let keys: Vec<u64> = steps.positions().collect();
        let pc_of = |i: usize| steps.pc(keys[i]);
        let mut i = keys.len();
        let mut at_stop = 0;
        // A last step that did not execute (a fault) has the stop's own registers.
        if i > 0 && pc_of(i - 1) != stop.checked_sub(1).and_then(|m| self.insn_ip(m)) {
            i -= 1;
            at_stop = 1;
        }
        let mut m = stop;
        let mut placed = 0u64;
        while i > 0 && m > 0 {
            let pc = pc_of(i - 1);
            let run = (1..i).take_while(|&a| pc_of(i - 1 - a) == pc).count() + 1;
            let in_history = (0..m.min(run as u64 + 1))
                .take_while(|&b| self.insn_ip(m - 1 - b) == pc)
                .count();
            let pairs: Vec<(usize, u64)> = match in_history {
                0 => break,
                // One instruction in the history: the state before it is the run's first.
                1 if run > 1 => vec![(i - run, m - 1)],
                b if b >= run => (0..run).map(|j| (i - 1 - j, m - 1 - j as u64)).collect(),
                _ => break,
            };
            for (k, n) in pairs {
                placed += u64::from(self.snapshots.insert_from(&steps, keys[k], n));
            }
            i -= run;
            m -= in_history.min(run) as u64;
        }
        self.range_stats.placed += placed;
        self.range_stats.unplaced += keys.len() as u64 - placed - at_stop;
    }
}
