//! What the software recorder needs from a traced process ([`StepTarget`]), and a minimal
//! ptrace-controlled child implementing it ([`PtraceChild`]).
//!
//! The recorder only needs registers, memory and single steps; keeping that as a small trait lets
//! the GDB server's own target type drive the recorder too.

use std::ffi::OsStr;
use std::fs::File;
use std::io::IoSliceMut;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::uio::{RemoteIoVec, process_vm_readv};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

/// The general-purpose registers as the kernel exposes them to ptrace.
pub type Regs = libc::user_regs_struct;

/// A failure while controlling the target, with the operation and address it concerns.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// A ptrace/wait/memory system call failed.
    #[error("{op} failed for pid {pid}: {errno}")]
    Sys {
        /// What was attempted.
        op: &'static str,
        /// The process.
        pid: i32,
        /// The error.
        errno: Errno,
    },
    /// Memory at `addr` could not be read or written.
    #[error("cannot access {len} byte(s) of pid {pid} memory at {addr:#x}: {source}")]
    Memory {
        /// The process.
        pid: i32,
        /// First address.
        addr: u64,
        /// Length of the access.
        len: usize,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The process could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The process is gone; no further operation is possible.
    #[error("process {pid} has exited")]
    Gone {
        /// The process.
        pid: i32,
    },
    /// The process stopped in a way the operation did not expect.
    #[error("pid {pid}: unexpected stop: {what}")]
    Unexpected {
        /// The process.
        pid: i32,
        /// What happened.
        what: String,
    },
}

/// How a resumed target stopped.
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
    fn regs(&mut self) -> Result<Regs, TargetError>;
    /// Writes the general-purpose registers.
    fn set_regs(&mut self, regs: &Regs) -> Result<(), TargetError>;
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
    /// The thread's XSAVE image (x87, SSE, AVX state, as `PTRACE_GETREGSET NT_X86_XSTATE`
    /// returns it), for the state log; `None` if this target cannot read it (the log then
    /// reports the vector state before such instructions as unknown).
    fn xstate(&mut self) -> Option<Vec<u8>> {
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
    /// Asks thread `tid`, inside a step begun with [`step_start`](Self::step_start), to stop
    /// (`SIGSTOP`: a blocking system call is interrupted and restarts later).
    fn interrupt_thread(&mut self, _tid: i32) {}
}

/// A child process started under ptrace (`PTRACE_TRACEME`) with address-space randomisation
/// disabled (`personality(ADDR_NO_RANDOMIZE)`), stopped at its first instruction after `execve`.
///
/// Dropping it kills the process (`PTRACE_O_EXITKILL` also covers a crash of the tracer).
#[derive(Debug)]
pub struct PtraceChild {
    pid: Pid,
    child: Child,
    mem: Option<File>,
    gone: bool,
}

fn sys(op: &'static str, pid: Pid) -> impl FnOnce(Errno) -> TargetError {
    move |errno| TargetError::Sys {
        op,
        pid: pid.as_raw(),
        errno,
    }
}

fn open_mem(pid: Pid) -> Option<File> {
    File::options()
        .read(true)
        .write(true)
        .open(format!("/proc/{}/mem", pid.as_raw()))
        .ok()
}

impl PtraceChild {
    /// Starts `command` traced. Its stdin/stdout/stderr and environment are whatever the
    /// `Command` says. Returns once the child stopped after `execve`.
    pub fn spawn(mut command: Command) -> Result<PtraceChild, TargetError> {
        let program = command.get_program().to_string_lossy().into_owned();
        // SAFETY: the closure runs in the forked child before execve and only makes two system
        // calls (ptrace, personality), which are async-signal-safe; it touches no locks or heap.
        unsafe {
            command.pre_exec(|| {
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                // Stable addresses from run to run (as gdb and rr do); failure is harmless.
                libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|source| TargetError::Spawn { program, source })?;
        let pid = Pid::from_raw(child.id() as i32);
        let mut me = PtraceChild {
            pid,
            child,
            mem: None,
            gone: false,
        };
        match waitpid(pid, None).map_err(sys("waitpid", pid))? {
            WaitStatus::Stopped(_, Signal::SIGTRAP) => {}
            other => {
                me.gone = !matches!(other, WaitStatus::Stopped(..));
                return Err(TargetError::Unexpected {
                    pid: pid.as_raw(),
                    what: format!("first stop after exec: {other:?}"),
                });
            }
        }
        ptrace::setoptions(
            pid,
            // TRACEEXEC: an exec is reported as an event, not as a plain SIGTRAP that would
            // look like the program's own signal.
            ptrace::Options::PTRACE_O_EXITKILL
                | ptrace::Options::PTRACE_O_TRACEEXIT
                | ptrace::Options::PTRACE_O_TRACEEXEC,
        )
        .map_err(sys("PTRACE_SETOPTIONS", pid))?;
        me.mem = open_mem(pid);
        Ok(me)
    }

    /// Convenience: starts `program` with `args`.
    pub fn spawn_program<I, S>(program: impl AsRef<OsStr>, args: I) -> Result<Self, TargetError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = Command::new(program);
        c.args(args);
        Self::spawn(c)
    }

    /// The `std::process::Child` (for its piped stdio handles). Do not `wait` on it: the
    /// tracer reaps the process.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Whether the process has exited or was killed.
    pub fn is_gone(&self) -> bool {
        self.gone
    }

    fn check_alive(&self) -> Result<(), TargetError> {
        if self.gone {
            Err(TargetError::Gone {
                pid: self.pid.as_raw(),
            })
        } else {
            Ok(())
        }
    }

    fn wait(&mut self) -> Result<StepStop, TargetError> {
        loop {
            let status = waitpid(self.pid, None).map_err(sys("waitpid", self.pid))?;
            return Ok(match status {
                WaitStatus::Stopped(_, Signal::SIGTRAP) => StepStop::Trap,
                WaitStatus::Stopped(_, sig) => StepStop::Signal(sig),
                WaitStatus::PtraceEvent(_, _, ev) if ev == libc::PTRACE_EVENT_EXIT => {
                    StepStop::Exiting
                }
                WaitStatus::PtraceEvent(_, _, ev) if ev == libc::PTRACE_EVENT_EXEC => {
                    // The open /proc/PID/mem still refers to the old address space.
                    self.mem = open_mem(self.pid);
                    StepStop::Exec
                }
                WaitStatus::Exited(_, code) => {
                    self.gone = true;
                    StepStop::Exited(code)
                }
                WaitStatus::Signaled(_, sig, _) => {
                    self.gone = true;
                    StepStop::Killed(sig)
                }
                // Other ptrace events are not enabled; continue past anything else.
                WaitStatus::PtraceEvent(..)
                | WaitStatus::PtraceSyscall(_)
                | WaitStatus::Continued(_)
                | WaitStatus::StillAlive => continue,
            });
        }
    }
}

impl Drop for PtraceChild {
    fn drop(&mut self) {
        if !self.gone {
            // Kill and reap so no traced zombie outlives its tracer handle.
            let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
            let _ = waitpid(self.pid, None);
        }
    }
}

impl StepTarget for PtraceChild {
    fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    fn regs(&mut self) -> Result<Regs, TargetError> {
        self.check_alive()?;
        ptrace::getregs(self.pid).map_err(sys("PTRACE_GETREGS", self.pid))
    }

    fn set_regs(&mut self, regs: &Regs) -> Result<(), TargetError> {
        self.check_alive()?;
        ptrace::setregs(self.pid, *regs).map_err(sys("PTRACE_SETREGS", self.pid))
    }

    fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> Result<usize, TargetError> {
        self.check_alive()?;
        if buf.is_empty() {
            return Ok(0);
        }
        let len = buf.len();
        let remote = [RemoteIoVec {
            base: addr as usize,
            len,
        }];
        match process_vm_readv(self.pid, &mut [IoSliceMut::new(buf)], &remote) {
            Ok(n) if n == len => return Ok(n),
            _ => {}
        }
        // process_vm_readv refuses pages without read permission and stops at the first
        // unreadable page; /proc/PID/mem reads what ptrace may read (FOLL_FORCE).
        let pid = self.pid.as_raw();
        let Some(mem) = &self.mem else {
            return Err(TargetError::Memory {
                pid,
                addr,
                len,
                source: std::io::Error::other("/proc/PID/mem not open"),
            });
        };
        let mut done = 0;
        while done < len {
            match mem.read_at(&mut buf[done..], addr + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) if done == 0 => {
                    return Err(TargetError::Memory {
                        pid,
                        addr,
                        len,
                        source,
                    });
                }
                Err(_) => break,
            }
        }
        Ok(done)
    }

    fn write_memory(&mut self, addr: u64, data: &[u8]) -> Result<(), TargetError> {
        self.check_alive()?;
        let pid = self.pid.as_raw();
        let err = |source| TargetError::Memory {
            pid,
            addr,
            len: data.len(),
            source,
        };
        let mem = self
            .mem
            .as_ref()
            .ok_or_else(|| err(std::io::Error::other("/proc/PID/mem not open")))?;
        mem.write_all_at(data, addr).map_err(err)
    }

    fn single_step(&mut self, signal: Option<Signal>) -> Result<StepStop, TargetError> {
        self.check_alive()?;
        ptrace::step(self.pid, signal).map_err(sys("PTRACE_SINGLESTEP", self.pid))?;
        self.wait()
    }

    fn cont(&mut self, signal: Option<Signal>) -> Result<StepStop, TargetError> {
        self.check_alive()?;
        ptrace::cont(self.pid, signal).map_err(sys("PTRACE_CONT", self.pid))?;
        self.wait()
    }

    fn siginfo(&mut self) -> Result<SigInfo, TargetError> {
        self.check_alive()?;
        let si = ptrace::getsiginfo(self.pid).map_err(sys("PTRACE_GETSIGINFO", self.pid))?;
        Ok(SigInfo {
            signo: si.si_signo,
            code: si.si_code,
        })
    }
}
