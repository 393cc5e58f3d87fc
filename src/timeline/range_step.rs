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

use super::{Running, Timeline};
use crate::target::{Resume, StepRange, StopEvent, TargetResult};
use std::time::Duration;

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
        let pc = match self.cursor {
            Some(n) if n < self.len() => self.insn_ip(n),
            Some(_) => self.read_registers().ok().map(|r| r.pc()),
            None => self.live.as_mut().and_then(|l| l.pc().ok()),
        };
        if !pc.is_some_and(|pc| rs.range.contains(pc) && !self.bps.contains(&pc)) {
            self.end_range_step();
            return Ok(Some(ev));
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
            self.range_steps.0 += 1;
            self.range_steps.1 += rs.steps;
        }
    }
}
