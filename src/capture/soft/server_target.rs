//! [`StepTarget`] for the GDB server's ptrace target ([`crate::target::PtraceTarget`]), so the
//! server can drive the software recorder on the process it debugs.
//!
//! Registers, `siginfo` and register writes go straight to ptrace on the target's pid (the
//! server's register read also fetches the XSAVE area, which the recorder does not need on every
//! step); memory and resumption go through the server target so its breakpoint bookkeeping stays
//! right. Call these from the thread that traces the process (a ptrace requirement).
//!
//! The server target reports the exit event ([`StepStop::Exiting`]) only when asked
//! ([`PtraceTarget::set_stop_at_exit`], as the timeline's software backend does).

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::target::{Regs, SigInfo, StepStop, StepTarget, TargetError};
use crate::target::{PtraceTarget, StopEvent, Target, TargetError as ServerError, ThreadStop};

fn convert(pid: i32, op: &'static str, e: ServerError) -> TargetError {
    match e {
        ServerError::Sys { source, .. } => TargetError::Sys {
            op,
            pid,
            errno: source,
        },
        ServerError::Exited { pid } => TargetError::Gone { pid },
        other => TargetError::Unexpected {
            pid,
            what: format!("{op}: {other}"),
        },
    }
}

fn to_stop(pid: i32, ev: StopEvent) -> Result<StepStop, TargetError> {
    Ok(match ev {
        StopEvent::Step => StepStop::Trap,
        StopEvent::Breakpoint { pc } => StepStop::Breakpoint { pc },
        StopEvent::Signal(libc::SIGTRAP) | StopEvent::Watch { .. } => StepStop::Trap,
        StopEvent::Signal(s) => match Signal::try_from(s) {
            Ok(sig) => StepStop::Signal(sig),
            Err(_) => {
                return Err(TargetError::Unexpected {
                    pid,
                    what: format!("stopped by unknown signal {s}"),
                });
            }
        },
        StopEvent::Exiting => StepStop::Exiting,
        StopEvent::Exited(code) => StepStop::Exited(code),
        StopEvent::Killed(s) => StepStop::Killed(Signal::try_from(s).unwrap_or(Signal::SIGKILL)),
        StopEvent::HistoryEnd { .. } => {
            return Err(TargetError::Unexpected {
                pid,
                what: "history end on a live target".into(),
            });
        }
    })
}

impl StepTarget for PtraceTarget {
    fn pid(&self) -> i32 {
        Target::pid(self)
    }

    fn xstate(&mut self) -> Option<Vec<u8>> {
        Target::read_registers(self).ok().map(|r| r.xsave)
    }

    fn regs(&mut self) -> Result<Regs, TargetError> {
        let pid = self.current_thread();
        nix::sys::ptrace::getregs(Pid::from_raw(pid)).map_err(|errno| TargetError::Sys {
            op: "PTRACE_GETREGS",
            pid,
            errno,
        })
    }

    fn set_regs(&mut self, regs: &Regs) -> Result<(), TargetError> {
        let pid = self.current_thread();
        nix::sys::ptrace::setregs(Pid::from_raw(pid), *regs).map_err(|errno| TargetError::Sys {
            op: "PTRACE_SETREGS",
            pid,
            errno,
        })
    }

    fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> Result<usize, TargetError> {
        let pid = Target::pid(self);
        Target::read_memory(self, addr, buf).map_err(|e| convert(pid, "read memory", e))
    }

    fn write_memory(&mut self, addr: u64, data: &[u8]) -> Result<(), TargetError> {
        let pid = Target::pid(self);
        Target::write_memory(self, addr, data).map_err(|e| convert(pid, "write memory", e))
    }

    fn single_step(&mut self, signal: Option<Signal>) -> Result<StepStop, TargetError> {
        let tid = self.current_thread();
        StepTarget::step_start(self, signal)?;
        match StepTarget::step_poll(self, tid, true)? {
            Some(stop) => Ok(stop),
            None => Err(TargetError::Unexpected {
                pid: tid,
                what: "blocking wait returned no stop".into(),
            }),
        }
    }

    fn threads(&self) -> Vec<i32> {
        PtraceTarget::threads(self)
    }

    fn current_thread(&self) -> i32 {
        PtraceTarget::current_thread(self)
    }

    fn take_new_threads(&mut self) -> Vec<i32> {
        PtraceTarget::take_new_threads(self)
    }

    fn select_thread(&mut self, tid: i32) -> Result<(), TargetError> {
        PtraceTarget::select_thread(self, tid).map_err(|e| convert(tid, "select thread", e))
    }

    fn step_start(&mut self, signal: Option<Signal>) -> Result<bool, TargetError> {
        let tid = self.current_thread();
        PtraceTarget::step_start(self, signal.map(|s| s as i32))
            .map_err(|e| convert(tid, "single step", e))?;
        Ok(true)
    }

    fn step_poll(&mut self, tid: i32, block: bool) -> Result<Option<StepStop>, TargetError> {
        match PtraceTarget::step_poll(self, tid, block).map_err(|e| convert(tid, "wait", e))? {
            None => Ok(None),
            Some(ThreadStop::ThreadExited { code }) => Ok(Some(StepStop::ThreadExited(code))),
            Some(ThreadStop::Stop(ev)) => to_stop(tid, ev).map(Some),
        }
    }

    fn interrupt_thread(&mut self, tid: i32) {
        // SAFETY: tgkill only sends a signal; no memory is passed.
        unsafe {
            libc::syscall(libc::SYS_tgkill, Target::pid(self), tid, libc::SIGSTOP);
        }
    }

    fn cont(&mut self, signal: Option<Signal>) -> Result<StepStop, TargetError> {
        let pid = Target::pid(self);
        PtraceTarget::cont(self, signal.map(|s| s as i32))
            .map_err(|e| convert(pid, "continue", e))?;
        match Target::wait(self, true).map_err(|e| convert(pid, "wait", e))? {
            Some(ev) => to_stop(pid, ev),
            None => Err(TargetError::Unexpected {
                pid,
                what: "blocking wait returned no stop".into(),
            }),
        }
    }

    fn siginfo(&mut self) -> Result<SigInfo, TargetError> {
        let pid = self.current_thread();
        let si =
            nix::sys::ptrace::getsiginfo(Pid::from_raw(pid)).map_err(|errno| TargetError::Sys {
                op: "PTRACE_GETSIGINFO",
                pid,
                errno,
            })?;
        Ok(SigInfo {
            signo: si.si_signo,
            code: si.si_code,
        })
    }
}
