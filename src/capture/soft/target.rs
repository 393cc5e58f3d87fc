//! What the software recorder needs from a traced process ([`StepTarget`]), implemented by the
//! one ptrace task type, [`PtraceTarget`].
//!
//! The recorder only needs registers, memory and single steps of one thread at a time; keeping
//! that as a small trait keeps the recorder testable apart from ptrace. Errors are the
//! target layer's [`TargetError`]: one error type for every ptrace operation.
//!
//! Registers, `siginfo` and register writes go straight to ptrace on the selected thread (the
//! full register read also fetches the XSAVE area, which the recorder does not need on every
//! step); memory and resumption go through the target so its breakpoint bookkeeping stays
//! right. Call these from the thread that traces the process (a ptrace requirement).
//!
//! The target reports the exit event ([`StepStop::Exiting`]) of a continue only when asked
//! ([`PtraceTarget::set_stop_at_exit`]); a single step always reports it.

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::target::{Gprs, PtraceTarget, StopEvent, Target, TargetError, ThreadStop};

/// How a resumed target stopped, as the recorder sees it.
///
/// Not a second [`ThreadStop`] (the target's report of one thread's step, which it is made
/// from in one place, `to_stop`): a [`ThreadStop::Stop`] carries a [`StopEvent`], the
/// debugger-facing vocabulary, whose watchpoint hits, vfork-done reports and `SIGTRAP` signals
/// are all the recorder's [`StepStop::Trap`] (the step's trap, told apart by
/// [`StepTarget::siginfo`]), and whose fork events in a full-speed run, history ends and
/// unknown signal numbers are errors before the recorder sees them. This closed set keeps the
/// recorder's matches exhaustive without arms for stops a step cannot produce, with signals
/// typed (`nix::sys::signal::Signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepStop {
    /// Stopped with SIGTRAP: normally the single-step trap, but also a signal-handler entry after
    /// an injected signal or the program's own INT3; [`StepTarget::siginfo`] tells them apart.
    Trap,
    /// A signal-delivery stop: the signal has not been delivered yet. Pass it with the next
    /// resume to deliver it, as the program would receive it.
    Signal(Signal),
    /// The process is about to exit (`PTRACE_EVENT_EXIT`): its memory is still readable.
    Exiting,
    /// A debugger breakpoint of the target's own bookkeeping was hit during a full-speed run;
    /// the target already moved the PC back to `pc` (only targets that manage breakpoints, such
    /// as the GDB server's, report this).
    Breakpoint {
        /// The breakpoint address, where the process stands.
        pc: u64,
    },
    /// A successful `execve` replaced the program (`PTRACE_EVENT_EXEC`); the process stands at
    /// the new program's first instruction.
    Exec,
    /// The step of a `fork` ended in the child, which the target follows from now on (the
    /// parent detached): the `fork` executed, and the thread to step is now `child`.
    FollowedFork {
        /// The child's pid (its only thread).
        child: i32,
    },
    /// The step of a `vfork` held for the debugger ended at the event stop: the system call
    /// executed as far as the parent can see (its registers are those after it); the target
    /// finishes it at the next step.
    VForked,
    /// The step of a vfork parent ended at the vfork's end (the child exec'd or exited),
    /// inside the system call: nothing ran.
    VForkDone,
    /// The process exited with this status.
    Exited(i32),
    /// The process was killed by this signal.
    Killed(Signal),
    /// The stepped thread ended by itself (`exit`, not `exit_group`) with this status; the
    /// process goes on.
    ThreadExited(i32),
}

/// The `siginfo` fields the recorder looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SigInfo {
    /// Signal number.
    pub signo: i32,
    /// `si_code`: > 0 for kernel-generated signals (faults, traps), ≤ 0 for signals sent by
    /// processes (`kill`, `tgkill`, timers, queues).
    pub code: i32,
}

/// The size of Linux's `siginfo_t` on x86-64, as GDB's `qXfer:siginfo:read` transfers it.
pub const SIGINFO_SIZE: usize = 128;

/// `si_code` of the single-step trap (`TRAP_TRACE`).
pub const TRAP_TRACE: i32 = 2;
/// `si_code` of the trap reported after single-stepping a system call (`TRAP_BRKPT`).
pub const TRAP_BRKPT: i32 = 1;
/// `si_code` of `ptrace_notify(SIGTRAP)`, which reports a single-stepped signal delivery: the
/// tracee stands at the first instruction of the handler (`SIGTRAP | PTRACE_EVENT_NONE << 8`).
pub const TRAP_SIGNAL_DELIVERED: i32 = libc::SIGTRAP;
/// `si_code` of a kernel-generated signal (the program's own INT3 reports this).
pub const SI_KERNEL: i32 = 0x80;

/// The operations the software recorder needs from a stopped, ptrace-controlled process.
pub trait StepTarget {
    /// The process id.
    fn pid(&self) -> i32;
    /// Reads the general-purpose registers.
    fn regs(&mut self) -> Result<Gprs, TargetError>;
    /// Writes the general-purpose registers.
    fn set_regs(&mut self, regs: &Gprs) -> Result<(), TargetError>;
    /// Reads memory at `addr` into `buf`; returns how many bytes could be read (a short read
    /// stops at the first unreadable page).
    fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> Result<usize, TargetError>;
    /// Writes memory (also read-only text, as a debugger writes breakpoints).
    fn write_memory(&mut self, addr: u64, data: &[u8]) -> Result<(), TargetError>;
    /// Executes one instruction (delivering `signal` first, if given) and waits for the stop.
    fn single_step(&mut self, signal: Option<Signal>) -> Result<StepStop, TargetError>;
    /// Resumes at full speed (delivering `signal` first, if given) until the next stop.
    fn cont(&mut self, signal: Option<Signal>) -> Result<StepStop, TargetError>;
    /// The siginfo of the current signal stop.
    fn siginfo(&mut self) -> Result<SigInfo, TargetError>;
    /// The whole `siginfo_t` of the current signal stop, as the kernel filled it (what GDB's
    /// `$_siginfo` shows: the fault address of a `SIGSEGV`, the sender of a `kill`); `None`
    /// if this target cannot read it.
    fn siginfo_bytes(&mut self) -> Option<[u8; SIGINFO_SIZE]> {
        None
    }
    /// The thread's XSAVE image (x87, SSE, AVX state, as `PTRACE_GETREGSET NT_X86_XSTATE`
    /// returns it), for the state log; `None` if this target cannot read it (the log then
    /// reports the vector state before such instructions as unknown).
    fn xstate(&mut self) -> Option<Vec<u8>> {
        None
    }
    /// The parts of `addr..addr + len` whose pages hold data (resident or swapped out), as
    /// `(start, len)` ranges in address order; pages never touched (or dropped) read as zeros
    /// or as their file's bytes. `None` if this target cannot tell.
    fn resident_ranges(&mut self, addr: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        let _ = (addr, len);
        None
    }
    /// The threads to record, the main thread first. A target that does not follow threads
    /// has one: the process.
    fn threads(&self) -> Vec<i32> {
        vec![self.pid()]
    }
    /// The selected thread ([`select_thread`](Self::select_thread)).
    fn current_thread(&self) -> i32 {
        self.pid()
    }
    /// Threads created since the last call (recorded from their first instruction on).
    fn take_new_threads(&mut self) -> Vec<i32> {
        Vec::new()
    }
    /// Makes `tid` the thread that [`regs`](Self::regs), [`set_regs`](Self::set_regs),
    /// [`single_step`](Self::single_step), [`siginfo`](Self::siginfo) and
    /// [`xstate`](Self::xstate) act on.
    fn select_thread(&mut self, tid: i32) -> Result<(), TargetError> {
        if tid == self.pid() {
            Ok(())
        } else {
            Err(TargetError::Unexpected {
                pid: self.pid(),
                what: format!("this target does not follow thread {tid}"),
            })
        }
    }
    /// Starts a single step of the selected thread without waiting for it (a system call may
    /// block until another thread acts); `Ok(false)` when the target cannot (then use
    /// [`single_step`](Self::single_step)).
    fn step_start(&mut self, _signal: Option<Signal>) -> Result<bool, TargetError> {
        Ok(false)
    }
    /// Collects a step of thread `tid` begun with [`step_start`](Self::step_start);
    /// `Ok(None)` while it runs (only when `block` is false).
    fn step_poll(&mut self, _tid: i32, _block: bool) -> Result<Option<StepStop>, TargetError> {
        Ok(None)
    }
    /// The child of a fork a step just executed, held (stopped, traced) for the debugger's
    /// decision; taken once ([`PtraceTarget::set_report_forks`]).
    fn take_fork_report(&mut self) -> Option<i32> {
        None
    }
    /// Whether the end of a reported vfork is to be reported (taken once).
    fn take_vfork_done_report(&mut self) -> bool {
        false
    }
    /// Whether a step's exec is to be reported to the debugger (taken once,
    /// [`PtraceTarget::set_report_execs`]).
    fn take_exec_report(&mut self) -> bool {
        false
    }
    /// The thread that made the fork held for the debugger, if one is held.
    fn held_fork_parent(&self) -> Option<i32> {
        None
    }
    /// Settles a held fork: `detach` is the side let go (see
    /// [`PtraceTarget::resolve_fork`]); the process from now on.
    fn resolve_fork(&mut self, detach: i32) -> Result<Option<i32>, TargetError> {
        let _ = detach;
        Ok(None)
    }
    /// Asks thread `tid`, inside a step begun with [`step_start`](Self::step_start), to stop
    /// (`SIGSTOP`: a blocking system call is interrupted and restarts later).
    fn interrupt_thread(&mut self, _tid: i32) {}
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
        StopEvent::Exiting { .. } => StepStop::Exiting,
        StopEvent::Exited(code) => StepStop::Exited(code),
        StopEvent::Killed(s) => StepStop::Killed(Signal::try_from(s).unwrap_or(Signal::SIGKILL)),
        StopEvent::HistoryEnd { .. } => {
            return Err(TargetError::Unexpected {
                pid,
                what: "history end on a live target".into(),
            });
        }
        StopEvent::Exec => StepStop::Exec,
        StopEvent::VForkDone => StepStop::Trap,
        StopEvent::Forked { child, .. } => {
            // Full-speed runs of the recorder end before system calls.
            return Err(TargetError::Unexpected {
                pid,
                what: format!("fork event (child {child}) inside a recorder's full-speed run"),
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

    fn resident_ranges(&mut self, addr: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        resident_ranges(StepTarget::pid(self), addr, len)
    }

    fn regs(&mut self) -> Result<Gprs, TargetError> {
        let pid = self.current_thread();
        nix::sys::ptrace::getregs(Pid::from_raw(pid)).map_err(|source| TargetError::Sys {
            op: "PTRACE_GETREGS",
            pid,
            source,
        })
    }

    fn set_regs(&mut self, regs: &Gprs) -> Result<(), TargetError> {
        let pid = self.current_thread();
        nix::sys::ptrace::setregs(Pid::from_raw(pid), *regs).map_err(|source| TargetError::Sys {
            op: "PTRACE_SETREGS",
            pid,
            source,
        })
    }

    fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> Result<usize, TargetError> {
        Target::read_memory(self, addr, buf)
    }

    fn write_memory(&mut self, addr: u64, data: &[u8]) -> Result<(), TargetError> {
        Target::write_memory(self, addr, data)
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
        PtraceTarget::select_thread(self, tid)
    }

    fn step_start(&mut self, signal: Option<Signal>) -> Result<bool, TargetError> {
        PtraceTarget::step_start(self, signal.map(|s| s as i32))?;
        Ok(true)
    }

    fn step_poll(&mut self, tid: i32, block: bool) -> Result<Option<StepStop>, TargetError> {
        match PtraceTarget::step_poll(self, tid, block)? {
            None => Ok(None),
            Some(ThreadStop::ThreadExited { code }) => Ok(Some(StepStop::ThreadExited(code))),
            Some(ThreadStop::Exec) => Ok(Some(StepStop::Exec)),
            Some(ThreadStop::VForked) => Ok(Some(StepStop::VForked)),
            Some(ThreadStop::VForkDone) => Ok(Some(StepStop::VForkDone)),
            Some(ThreadStop::FollowedFork { child, .. }) => {
                Ok(Some(StepStop::FollowedFork { child }))
            }
            Some(ThreadStop::Stop(ev)) => to_stop(tid, ev).map(Some),
        }
    }

    fn take_fork_report(&mut self) -> Option<i32> {
        PtraceTarget::take_fork_report(self)
    }

    fn take_exec_report(&mut self) -> bool {
        PtraceTarget::take_exec_report(self)
    }

    fn take_vfork_done_report(&mut self) -> bool {
        PtraceTarget::take_vfork_done_report(self)
    }

    fn held_fork_parent(&self) -> Option<i32> {
        PtraceTarget::held_fork_parent(self)
    }

    fn resolve_fork(&mut self, detach: i32) -> Result<Option<i32>, TargetError> {
        PtraceTarget::resolve_fork(self, detach)
    }

    fn interrupt_thread(&mut self, tid: i32) {
        // SAFETY: tgkill only sends a signal; no memory is passed.
        unsafe {
            libc::syscall(libc::SYS_tgkill, Target::pid(self), tid, libc::SIGSTOP);
        }
    }

    fn cont(&mut self, signal: Option<Signal>) -> Result<StepStop, TargetError> {
        let pid = Target::pid(self);
        PtraceTarget::cont(self, signal.map(|s| s as i32))?;
        match Target::wait(self, true)? {
            Some(ev) => to_stop(pid, ev),
            None => Err(TargetError::Unexpected {
                pid,
                what: "blocking wait returned no stop".into(),
            }),
        }
    }

    fn siginfo(&mut self) -> Result<SigInfo, TargetError> {
        let pid = self.current_thread();
        let si = nix::sys::ptrace::getsiginfo(Pid::from_raw(pid)).map_err(|source| {
            TargetError::Sys {
                op: "PTRACE_GETSIGINFO",
                pid,
                source,
            }
        })?;
        Ok(SigInfo {
            signo: si.si_signo,
            code: si.si_code,
        })
    }

    fn siginfo_bytes(&mut self) -> Option<[u8; SIGINFO_SIZE]> {
        let si = nix::sys::ptrace::getsiginfo(Pid::from_raw(self.current_thread())).ok()?;
        // SAFETY: `siginfo_t` is a plain C struct of integers, 128 bytes on x86-64 without
        // padding (`transmute` checks the size when it compiles), which PTRACE_GETSIGINFO
        // filled whole: every byte is initialised.
        Some(unsafe { std::mem::transmute::<libc::siginfo_t, [u8; SIGINFO_SIZE]>(si) })
    }
}

/// Bits of a `/proc/PID/pagemap` entry (Documentation/admin-guide/mm/pagemap.rst): the page
/// is in memory, or swapped out.
const PAGEMAP_PRESENT: u64 = 1 << 63;
const PAGEMAP_SWAPPED: u64 = 1 << 62;

/// The resident or swapped pages of `addr..addr + len` in process `pid`, merged into ranges,
/// from `/proc/PID/pagemap` (one 8-byte entry per page). At most 1 GiB is looked at (a larger
/// range gives `None`, as does an unreadable pagemap).
fn resident_ranges(pid: i32, addr: u64, len: u64) -> Option<Vec<(u64, u64)>> {
    use std::os::unix::fs::FileExt;
    const PAGE: u64 = 4096;
    if len == 0 {
        return Some(Vec::new());
    }
    if len > 1 << 30 {
        return None;
    }
    let first = addr / PAGE;
    let end = addr.checked_add(len)?.div_ceil(PAGE);
    let file = std::fs::File::open(format!("/proc/{pid}/pagemap")).ok()?;
    let mut entries = vec![0u8; usize::try_from((end - first) * 8).ok()?];
    file.read_exact_at(&mut entries, first.checked_mul(8)?)
        .ok()?;
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (k, e) in entries.chunks_exact(8).enumerate() {
        let e = u64::from_le_bytes(e.try_into().ok()?);
        if e & (PAGEMAP_PRESENT | PAGEMAP_SWAPPED) == 0 {
            continue;
        }
        let page = (first + k as u64) * PAGE;
        let (from, to) = (page.max(addr), (page + PAGE).min(addr + len));
        match out.last_mut() {
            Some((s, l)) if *s + *l == from => *l += to - from,
            _ => out.push((from, to - from)),
        }
    }
    Some(out)
}

#[cfg(test)]
mod resident_tests {
    use super::resident_ranges;

    /// A page just written is resident, clipped to the bytes asked for; an empty range has
    /// none; more than 1 GiB is not looked at.
    #[test]
    fn a_written_page_is_resident() {
        let mut block = vec![0u8; 5 * 4096].into_boxed_slice();
        let base = (block.as_ptr() as u64).next_multiple_of(4096);
        let pid = std::process::id() as i32;
        let off = (base - block.as_ptr() as u64) as usize;
        block[off + 4096 + 10] = 1;
        let got = resident_ranges(pid, base + 4096 + 100, 50).unwrap();
        assert_eq!(got, [(base + 4096 + 100, 50)]);
        assert_eq!(resident_ranges(pid, base, 0).unwrap(), []);
        assert!(resident_ranges(pid, base, 2 << 30).is_none());
    }
}
