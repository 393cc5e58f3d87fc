//! [`PtraceTarget`]: a live process controlled with ptrace, every thread of it.
//!
//! Every thread the process creates stays traced (`PTRACE_O_TRACECLONE`). The target is
//! all-stop, as GDB expects: when it reports a stop, every thread is stopped. Register and step
//! operations apply to the *current* thread ([`PtraceTarget::select_thread`]; after a stop, the
//! thread that stopped). A full-speed continue runs every thread and, when one of them stops,
//! stops the others with `SIGSTOP` (a stop another thread reports meanwhile is kept and
//! reported by the next wait). A software recorder drives one thread at a time instead
//! ([`PtraceTarget::step_start`] / [`PtraceTarget::step_poll`]), so the global order of the
//! threads' instructions is known.

use super::regs::{X86Registers, xsave_area_size};
use super::{
    Breakpoints, HeldChildReply, HeldChildRequest, Notice, Resume, StopEvent, Target, TargetError,
    TargetResult,
};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

mod events;
mod sys;
#[cfg(test)]
mod tests;

use sys::*;

/// `NT_X86_XSTATE` (elf.h): the XSAVE regset.
const NT_X86_XSTATE: usize = 0x202;
/// `NT_PRFPREG` (elf.h): the FXSAVE regset, used when the CPU has no XSAVE.
const NT_PRFPREG: usize = 2;
/// The x86 breakpoint instruction.
const INT3: u8 = 0xcc;

/// How to start a program.
#[derive(Clone, Debug)]
pub struct SpawnOptions {
    /// Disable address-space randomisation in the child (`personality(ADDR_NO_RANDOMIZE)`), as
    /// GDB does by default, so addresses are the same from run to run.
    pub disable_aslr: bool,
    /// Drop the SIGINT and SIGQUIT a terminal sends the program (Ctrl-C, Ctrl-\: `si_code`
    /// `SI_KERNEL`) instead of reporting them. For a program sharing its terminal with the
    /// debugger (`ptrewind gdb`): the debugger gets the same Ctrl-C and interrupts the program
    /// through the protocol, so the program must not see a second, queued copy — native GDB
    /// intercepts the signal the same way (`handle SIGINT nopass`). Signals sent with
    /// `kill(2)` (`SI_USER`), including our own interrupt, are not affected.
    pub drop_terminal_interrupts: bool,
}

impl Default for SpawnOptions {
    fn default() -> Self {
        SpawnOptions {
            disable_aslr: true,
            drop_terminal_interrupts: false,
        }
    }
}

/// A fork whose two sides are both still traced, waiting for the debugger's choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct HeldFork {
    /// The thread that forked (the parent process's only thread).
    pub(super) parent: Pid,
    /// The child, stopped at its first stop.
    pub(super) child: Pid,
    /// A vfork: the parent waits at the event stop, inside the system call.
    pub(super) vfork: bool,
}

/// What the target knows about one traced thread.
#[derive(Clone, Copy, Debug, Default)]
struct ThreadInfo {
    /// Resumed by a full-speed continue (or a step in flight) and not yet seen stopped.
    running: bool,
    /// A stop this thread reported while the others were being stopped, not yet reported.
    pending: Option<Wait>,
    /// A `SIGSTOP` we sent it is still queued: drop it when it shows up.
    swallow_sigstop: bool,
    /// Stopped at a reported vfork's event, inside the system call: the next single step
    /// first finishes the call, which traps at its exit without running an instruction;
    /// that trap is not the step's.
    in_vfork_call: bool,
}

/// How one step (or wait) of a single thread ended ([`PtraceTarget::step_poll`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadStop {
    /// A stop of the thread (or the end of the whole process: `Exited`, `Killed`, `Exiting`).
    Stop(StopEvent),
    /// A successful `execve` replaced the program (`PTRACE_EVENT_EXEC`): the thread (now the
    /// leader, every other thread gone) stands at the new program's first instruction, still
    /// at the event stop. Only [`PtraceTarget::step_poll`] reports it (a recorder must forget
    /// the old code); a debugger's resume passes over it (see [`Notice::Exec`]).
    Exec,
    /// The step of a `fork` ended in the child, which the target now follows instead of the
    /// parent ([`PtraceTarget::set_follow_fork_child`]): the child stands right after the
    /// system call (RAX 0), the parent was detached.
    FollowedFork {
        /// The parent's pid (detached, running on untraced).
        parent: i32,
        /// The child's pid: the process (and its only thread) from now on.
        child: i32,
    },
    /// The step of a `vfork` held for the debugger ended at the event stop
    /// ([`PtraceTarget::set_report_forks`]): the thread's registers are those after the
    /// system call (RAX the child's pid); the next step finishes the call first.
    VForked,
    /// The step of the parent of a reported vfork ended at `PTRACE_EVENT_VFORK_DONE` (the
    /// child exec'd or exited), inside the system call: no instruction ran; the next step
    /// finishes the call first. The caller reports it ([`PtraceTarget::take_vfork_done_report`]).
    VForkDone,
    /// This thread ended (`exit`, not `exit_group`); the process goes on.
    ThreadExited {
        /// Its exit status.
        code: i32,
    },
}

/// Thread counters of a target (`monitor stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadStats {
    /// Threads created (clone with `CLONE_THREAD`) and traced.
    pub created: u64,
    /// Threads that ended while the process went on.
    pub exited: u64,
    /// Threads that vanished while stopped or stepping (`ESRCH`, killed from outside).
    pub vanished: u64,
    /// Most threads alive at once.
    pub peak: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunState {
    Stopped,
    Running(Resume),
    Exited,
}

/// A live process traced with ptrace, every thread of it (see the module docs). Forked children
/// are detached and exec is reported (see [`Notice`]), not followed.
///
/// ptrace ties a tracee to the *thread* that attached to it: create the target on the
/// thread that will drive it (the GDB server loop or a recorder) and keep it there. Dropping
/// the target kills a spawned program and detaches from an attached one.
#[derive(Debug)]
pub struct PtraceTarget {
    pid: Pid,
    exe: Option<PathBuf>,
    mem: File,
    /// Breakpoint address → original byte (refreshed each time the breakpoint is inserted).
    breakpoints: BTreeMap<u64, u8>,
    /// True while the `int3` bytes are written into the tracee (only while it runs).
    inserted: bool,
    /// Breakpoints were lifted for a vfork child that shares our memory; put them back at
    /// `PTRACE_EVENT_VFORK_DONE`.
    vfork_lifted: bool,
    /// Report `PTRACE_EVENT_EXIT` as [`StopEvent::Exiting`] (otherwise it is passed over).
    stop_at_exit: bool,
    /// The fatal signal of the exit event last seen (`PTRACE_GETEVENTMSG` there), `None` for an
    /// `exit`/`exit_group` or before any exit event.
    exit_signal: Option<i32>,
    state: RunState,
    /// A stop that happened while we stepped over a breakpoint, reported by the next `wait`.
    pending: Option<StopEvent>,
    notices: Vec<Notice>,
    spawned: bool,
    /// See [`SpawnOptions::drop_terminal_interrupts`].
    drop_terminal_interrupts: bool,
    /// Every traced thread, the leader included while it is alive.
    threads: BTreeMap<i32, ThreadInfo>,
    /// The thread register and step operations apply to.
    cur: Pid,
    /// Threads created since the last [`PtraceTarget::take_new_threads`].
    new_threads: Vec<i32>,
    thread_stats: ThreadStats,
    /// The process is on its way out (an exit event that ends it was seen).
    exiting: bool,
    /// Inside [`PtraceTarget::step_poll`]: an exec ends the step ([`ThreadStop::Exec`]).
    report_exec: bool,
    /// At a fork, follow the child and detach the parent (see
    /// [`PtraceTarget::set_follow_fork_child`]).
    follow_fork_child: bool,
    /// The child just followed at a fork, for the wait that saw the event.
    followed: Option<Pid>,
    /// Hold a forked child for the debugger to decide ([`PtraceTarget::set_report_forks`]).
    report_forks: bool,
    /// Hold a vfork child too (the debugger also wants exec events).
    report_vforks: bool,
    /// A fork reported (or to be reported) to the debugger, both sides still traced.
    held_fork: Option<HeldFork>,
    /// The child of a held fork not yet reported ([`PtraceTarget::take_fork_report`]).
    fork_report: Option<i32>,
    /// The reported vfork's `PTRACE_EVENT_VFORK_DONE` was seen and is not reported yet.
    vfork_done_report: bool,
    /// A vfork was reported and its `PTRACE_EVENT_VFORK_DONE` is still to come.
    vfork_reported: bool,
    /// Report exec to the debugger ([`PtraceTarget::set_report_execs`]).
    report_execs: bool,
    /// An exec happened and is not reported yet ([`PtraceTarget::take_exec_report`]).
    exec_report: bool,
    /// The program we started (its stdio handles); never waited on.
    child: Option<Child>,
}

impl PtraceTarget {
    /// Starts `program` with `args`, stopped at its first instruction (the exec trap, i.e. the
    /// entry of the dynamic loader or of a static executable). The program is executed
    /// directly, never through a shell.
    pub fn spawn(
        program: &OsString,
        args: &[OsString],
        options: &SpawnOptions,
    ) -> TargetResult<Self> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        Self::spawn_command(cmd, options)
    }

    /// Starts `cmd` (its arguments, environment, directory and stdio as the `Command` says),
    /// stopped at its first instruction like [`spawn`](Self::spawn). The child's stdio handles
    /// stay reachable through [`child_mut`](Self::child_mut).
    pub fn spawn_command(mut cmd: Command, options: &SpawnOptions) -> TargetResult<Self> {
        let program = cmd.get_program().to_owned();
        let disable_aslr = options.disable_aslr;
        // SAFETY: the closure runs in the forked child before exec and only issues the
        // async-signal-safe system calls personality(2) and ptrace(2); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if disable_aslr {
                    use nix::sys::personality::{self, Persona};
                    let current = personality::get().map_err(std::io::Error::from)?;
                    personality::set(current | Persona::ADDR_NO_RANDOMIZE)
                        .map_err(std::io::Error::from)?;
                }
                nix::sys::ptrace::traceme().map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().map_err(|source| TargetError::Spawn {
            program: program.to_string_lossy().into_owned(),
            source,
        })?;
        let pid = Pid::from_raw(child.id() as i32);
        match waitpid_raw(pid, true)? {
            Wait::Stopped(libc::SIGTRAP) => {}
            other => {
                return Err(TargetError::Unexpected {
                    pid: pid.as_raw(),
                    what: format!("expected the exec SIGTRAP after starting, got {other:?}"),
                });
            }
        }
        let opts = trace_options() | nix::sys::ptrace::Options::PTRACE_O_EXITKILL;
        nix::sys::ptrace::setoptions(pid, opts).map_err(sys("PTRACE_SETOPTIONS", pid))?;
        let mut target = Self::stopped(pid, Vec::new(), true)?;
        target.drop_terminal_interrupts = options.drop_terminal_interrupts;
        // Kept for its stdio handles only: we reap the process ourselves with waitpid.
        target.child = Some(child);
        Ok(target)
    }

    /// The `std::process::Child` of a program this target started (for its piped stdio
    /// handles); `None` for an attached process. Do not `wait` on it: the target reaps the
    /// process.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// The target for the traced, stopped process `pid` (options already set): no
    /// breakpoints yet, `notices` to report, `spawned` if we started it.
    fn stopped(pid: Pid, notices: Vec<Notice>, spawned: bool) -> TargetResult<Self> {
        Ok(PtraceTarget {
            pid,
            exe: exe_of(pid),
            mem: open_mem(pid)?,
            breakpoints: BTreeMap::new(),
            inserted: false,
            vfork_lifted: false,
            stop_at_exit: false,
            exit_signal: None,
            state: RunState::Stopped,
            pending: None,
            notices,
            spawned,
            drop_terminal_interrupts: false,
            threads: BTreeMap::from([(pid.as_raw(), ThreadInfo::default())]),
            cur: pid,
            new_threads: Vec::new(),
            exiting: false,
            child: None,
            report_exec: false,
            follow_fork_child: false,
            followed: None,
            report_forks: false,
            report_vforks: false,
            held_fork: None,
            fork_report: None,
            vfork_done_report: false,
            vfork_reported: false,
            report_execs: false,
            exec_report: false,
            thread_stats: ThreadStats {
                peak: 1,
                ..ThreadStats::default()
            },
        })
    }

    /// Attaches to the running process `pid` and stops it, every thread of it.
    pub fn attach(pid: i32) -> TargetResult<Self> {
        let pid = Pid::from_raw(pid);
        attach_one(pid)?;
        nix::sys::ptrace::setoptions(pid, trace_options())
            .map_err(sys("PTRACE_SETOPTIONS", pid))?;
        let mut target = Self::stopped(pid, Vec::new(), false)?;
        // The other threads, as they are now; a thread they create meanwhile is attached by
        // the kernel (TRACECLONE) once its creator is attached, so a second pass finds the rest.
        for _ in 0..2 {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", pid.as_raw())) else {
                break;
            };
            for tid in tasks
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
                .collect::<Vec<_>>()
            {
                if target.threads.contains_key(&tid) {
                    continue;
                }
                let t = Pid::from_raw(tid);
                // A thread that ended meanwhile is simply not there.
                if attach_one(t).is_ok() {
                    let _ = nix::sys::ptrace::setoptions(t, trace_options());
                    target.add_thread(tid);
                }
            }
        }
        target.new_threads.clear();
        Ok(target)
    }

    /// At a `fork` (not `vfork`/`CLONE_VFORK`: the parent would run on in the memory the child
    /// shares), follow the child instead of the parent: the parent is detached and runs on
    /// untraced, the child becomes the process (as GDB's `set follow-fork-mode child` with
    /// `detach-on-fork on`). Only while the process has a single thread (a forking
    /// multi-threaded parent keeps being followed, the child detached).
    pub fn set_follow_fork_child(&mut self, on: bool) {
        self.follow_fork_child = on;
    }

    /// At a `fork`, hold the child (stopped, still traced, without our breakpoints) and
    /// report the fork ([`StopEvent::Forked`], or
    /// [`take_fork_report`](Self::take_fork_report) after a step) so that the debugger decides
    /// which side is kept ([`resolve_fork`](Self::resolve_fork)); following the child of a
    /// multi-threaded parent detaches every thread of the parent. A `vfork` is reported at its
    /// event stop (the parent cannot finish the call while the child is held; its registers
    /// are set to those after the call, RAX the child's pid, which the kernel writes anyway),
    /// and its end, [`StopEvent::VForkDone`], at `PTRACE_EVENT_VFORK_DONE`, the parent still
    /// inside the call (the PC after it), before its next instruction (a recorder's step ends
    /// there without one: [`ThreadStop::VForkDone`]).
    /// [`set_follow_fork_child`] wins when both are set.
    ///
    /// [`set_follow_fork_child`]: Self::set_follow_fork_child
    pub fn set_report_forks(&mut self, on: bool) {
        self.report_forks = on;
        self.report_vforks = on;
    }

    /// Report each exec as a stop ([`StopEvent::Exec`] for a full-speed run, or
    /// [`take_exec_report`](Self::take_exec_report) after a recorder's step) instead of the
    /// [`Notice::Exec`] warning: the debugger then loads the new program itself.
    pub fn set_report_execs(&mut self, on: bool) {
        self.report_execs = on;
    }

    /// Whether the end of a reported vfork (the child exec'd or exited) was seen since the
    /// last call and is to be reported ([`StopEvent::VForkDone`]).
    pub fn take_vfork_done_report(&mut self) -> bool {
        std::mem::take(&mut self.vfork_done_report)
    }

    /// Whether an exec happened since the last call that is to be reported to the debugger
    /// ([`PtraceTarget::set_report_execs`]).
    pub fn take_exec_report(&mut self) -> bool {
        std::mem::take(&mut self.exec_report)
    }

    /// The signal the process is dying of, once a thread stopped at its exit event
    /// (`PTRACE_EVENT_EXIT`) because of one; `None` for an `exit`/`exit_group`.
    pub fn exit_signal(&self) -> Option<i32> {
        self.exit_signal
    }

    /// Whether the exit of the process is reported as a stop ([`StopEvent::Exiting`], the
    /// process still alive at its end) rather than passed over until it is gone.
    pub fn set_stop_at_exit(&mut self, on: bool) {
        self.stop_at_exit = on;
    }

    /// Resumes with `PTRACE_CONT` (inserting breakpoints, stepping over one at the PC first).
    /// Collect the stop with [`Target::wait`]. Same as `resume(Resume::Continue { signal })`.
    pub fn cont(&mut self, signal: Option<i32>) -> TargetResult<()> {
        self.resume(Resume::Continue { signal })
    }

    /// Executes exactly one instruction and waits for it: the primitive a software trace
    /// recorder uses between two stops. Returns `StopEvent::Step` normally, or the signal /
    /// exit that happened instead.
    pub fn single_step(&mut self, signal: Option<i32>) -> TargetResult<StopEvent> {
        self.resume(Resume::Step {
            signal,
            others: false,
        })?;
        match self.wait(true)? {
            Some(ev) => Ok(ev),
            None => Err(TargetError::Unexpected {
                pid: self.pid.as_raw(),
                what: "blocking wait returned no stop".into(),
            }),
        }
    }

    fn ensure_stopped(&self) -> TargetResult<()> {
        match self.state {
            RunState::Stopped => Ok(()),
            RunState::Exited => Err(TargetError::Exited {
                pid: self.pid.as_raw(),
            }),
            RunState::Running(_) => Err(TargetError::Unexpected {
                pid: self.pid.as_raw(),
                what: "the process is running".into(),
            }),
        }
    }

    /// Reads through /proc/PID/mem (as gdbserver does): unlike process_vm_readv it also
    /// reads pages the program cannot read itself (e.g. PROT_NONE guard pages GDB may ask
    /// for), and the kernel stops at the first unmapped page, which gives the partial count.
    fn read_raw(&self, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        let mut done = 0;
        while done < buf.len() {
            let at = addr.wrapping_add(done as u64);
            if at > i64::MAX as u64 {
                break;
            }
            match self.mem.read_at(&mut buf[done..], at) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        if done == 0 && !buf.is_empty() {
            return Err(TargetError::Memory { addr });
        }
        Ok(done)
    }

    fn write_raw(&self, addr: u64, data: &[u8]) -> TargetResult<()> {
        self.write_raw_to(&self.mem, addr, data)
    }

    fn write_raw_to(&self, mem: &File, addr: u64, data: &[u8]) -> TargetResult<()> {
        let mut done = 0;
        while done < data.len() {
            let at = addr.wrapping_add(done as u64);
            if at > i64::MAX as u64 {
                return Err(TargetError::Memory { addr: at });
            }
            match mem.write_at(&data[done..], at) {
                Ok(0) => return Err(TargetError::Memory { addr: at }),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return Err(TargetError::Memory { addr: at }),
            }
        }
        Ok(())
    }

    fn insert_breakpoints(&mut self) -> TargetResult<()> {
        if self.inserted {
            return Ok(());
        }
        let addrs: Vec<u64> = self.breakpoints.keys().copied().collect();
        for addr in addrs {
            let mut orig = [0u8; 1];
            self.read_raw(addr, &mut orig)?;
            self.write_raw(addr, &[INT3])?;
            self.breakpoints.insert(addr, orig[0]);
        }
        self.inserted = true;
        Ok(())
    }

    fn remove_breakpoints(&mut self) -> TargetResult<()> {
        if !self.inserted {
            return Ok(());
        }
        for (&addr, &orig) in &self.breakpoints {
            self.write_raw(addr, &[orig])?;
        }
        self.inserted = false;
        Ok(())
    }
}

impl Target for PtraceTarget {
    fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    fn tid(&self) -> i32 {
        self.cur.as_raw()
    }

    fn thread_ids(&self) -> Vec<i32> {
        self.threads()
    }

    fn select_thread(&mut self, tid: i32) -> bool {
        PtraceTarget::select_thread(self, tid).is_ok()
    }

    fn read_thread_registers(&mut self, tid: i32) -> TargetResult<X86Registers> {
        let prev = self.cur;
        if PtraceTarget::select_thread(self, tid).is_err() {
            return self.read_registers();
        }
        let r = self.read_registers();
        self.cur = prev;
        r
    }

    fn exec_path(&self) -> Option<PathBuf> {
        self.exe.clone()
    }

    fn read_registers(&mut self) -> TargetResult<X86Registers> {
        if self.state == RunState::Exited {
            return Err(TargetError::Exited {
                pid: self.pid.as_raw(),
            });
        }
        registers_of(self.cur)
    }

    fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()> {
        self.ensure_stopped()?;
        nix::sys::ptrace::setregs(self.cur, regs.to_libc())
            .map_err(sys("PTRACE_SETREGS", self.cur))?;
        let note = if regs.xsave.len() > 512 {
            NT_X86_XSTATE
        } else {
            NT_PRFPREG
        };
        let mut buf = regs.xsave.clone();
        regset(self.cur, RegsetOp::Set, note, &mut buf)?;
        Ok(())
    }

    fn read_memory(&self, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        if self.state == RunState::Exited {
            return Err(TargetError::Exited {
                pid: self.pid.as_raw(),
            });
        }
        let n = self.read_raw(addr, buf)?;
        if self.inserted {
            // Never show our own int3 bytes.
            let end = addr.saturating_add(n as u64);
            for (&bp, &orig) in self.breakpoints.range(addr..end) {
                buf[(bp - addr) as usize] = orig;
            }
        }
        Ok(n)
    }

    fn write_memory(&mut self, addr: u64, data: &[u8]) -> TargetResult<()> {
        self.ensure_stopped()?;
        self.write_raw(addr, data)
    }

    fn resume(&mut self, how: Resume) -> TargetResult<()> {
        self.ensure_stopped()?;
        if let Resume::Continue { .. } = how
            && let Some((&tid, _)) = self.threads.iter().find(|(_, i)| i.pending.is_some())
        {
            // A thread stopped while the others were being stopped at the last stop: that
            // stop comes first (all-stop: nothing runs).
            let w = self
                .threads
                .get_mut(&tid)
                .and_then(|i| i.pending.take())
                .unwrap_or(Wait::Stopped(libc::SIGSTOP));
            self.cur = Pid::from_raw(tid);
            let ev = self.finish_stop(w, how)?;
            self.pending = Some(ev);
            self.state = RunState::Running(how);
            return Ok(());
        }
        if let Resume::Continue { signal } = how {
            let pc = nix::sys::ptrace::getregs(self.cur)
                .map_err(sys("PTRACE_GETREGS", self.cur))?
                .rip;
            if self.breakpoints.contains_key(&pc) {
                // Step over the breakpoint under the PC with its original byte in place, then
                // insert all breakpoints and continue.
                let step = Resume::Step {
                    signal,
                    others: false,
                };
                self.raw_resume(step)?;
                match self.wait_stop(step, true)? {
                    Some((_, Wait::Stopped(libc::SIGTRAP))) => {}
                    Some((_, other)) => {
                        // Something else happened during the step: report it instead.
                        let ev = self.finish_stop(other, step)?;
                        self.pending = Some(ev);
                        if self.state == RunState::Stopped {
                            self.state = RunState::Running(how);
                        }
                        return Ok(());
                    }
                    None => {
                        return Err(TargetError::Unexpected {
                            pid: self.pid.as_raw(),
                            what: "blocking wait returned nothing".into(),
                        });
                    }
                }
                let cont = Resume::Continue { signal: None };
                self.state = RunState::Running(cont);
                self.raw_resume(cont)?;
                return Ok(());
            }
        }
        // Set first: threads created while resuming are resumed too.
        self.state = RunState::Running(how);
        self.raw_resume(how)?;
        Ok(())
    }

    fn wait(&mut self, block: bool) -> TargetResult<Option<StopEvent>> {
        if let Some(ev) = self.pending.take() {
            if self.state != RunState::Exited {
                self.state = RunState::Stopped;
            }
            return Ok(Some(ev));
        }
        let mode = match self.state {
            RunState::Running(mode) => mode,
            RunState::Stopped => {
                return Err(TargetError::Unexpected {
                    pid: self.pid.as_raw(),
                    what: "wait on a stopped process".into(),
                });
            }
            RunState::Exited => {
                return Err(TargetError::Exited {
                    pid: self.pid.as_raw(),
                });
            }
        };
        let Some((tid, w)) = self.wait_stop(mode, block)? else {
            return Ok(None);
        };
        if matches!(w, Wait::Exited(_) | Wait::Killed(_)) {
            if tid != self.pid {
                // The stepped thread ended (its own `exit`): the step is over, in another
                // thread.
                self.state = RunState::Stopped;
                return Ok(Some(StopEvent::Step));
            }
            return self.finish_stop(w, mode).map(Some);
        }
        self.cur = tid;
        if let Resume::Continue { .. } = mode {
            self.stop_others()?;
        }
        let ev = self.finish_stop(w, mode)?;
        if ev == StopEvent::Step
            && let Some(child) = self.fork_report.take()
        {
            // The stepped `fork` executed; its child is held for the debugger.
            let vfork = self.held_fork.is_some_and(|h| h.vfork);
            return Ok(Some(StopEvent::Forked { child, vfork }));
        }
        if ev == StopEvent::Step && std::mem::take(&mut self.vfork_done_report) {
            return Ok(Some(StopEvent::VForkDone));
        }
        if ev == StopEvent::Step && self.take_exec_report() {
            return Ok(Some(StopEvent::Exec));
        }
        Ok(Some(ev))
    }

    fn report_execs(&mut self, client_wants: bool) -> bool {
        self.report_execs = client_wants;
        client_wants
    }

    fn report_forks(&mut self, client_wants: bool, vforks: bool) -> bool {
        self.report_forks = client_wants && !self.follow_fork_child;
        self.report_vforks = self.report_forks && vforks;
        self.report_forks
    }

    fn resolve_fork(&mut self, detach: i32) -> TargetResult<Option<i32>> {
        PtraceTarget::resolve_fork(self, detach)
    }

    fn held_fork_child(&self) -> Option<i32> {
        PtraceTarget::held_fork_child(self)
    }

    fn held_child(&mut self, request: HeldChildRequest) -> TargetResult<HeldChildReply> {
        PtraceTarget::held_child(self, request)
    }

    fn interrupt(&mut self) -> TargetResult<()> {
        if let RunState::Running(_) = self.state {
            nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGINT)
                .map_err(sys("kill(SIGINT)", self.pid))?;
        }
        Ok(())
    }

    fn kill(&mut self) -> TargetResult<()> {
        // A forked child held for the debugger goes with the program (as GDB kills an
        // unfollowed fork child).
        self.end_held_fork(true);
        if self.state == RunState::Exited {
            return Ok(());
        }
        nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL)
            .map_err(sys("kill(SIGKILL)", self.pid))?;
        // Every thread stops at its exit event on the way out (and a thread stopped there
        // is past signals): `reap_all` lets each one finish dying, the leader last.
        self.reap_all();
        self.state = RunState::Exited;
        self.inserted = false;
        Ok(())
    }

    fn detach(&mut self) -> TargetResult<()> {
        self.end_held_fork(false);
        self.ensure_stopped()?;
        self.remove_breakpoints()?;
        let others = self.other_threads();
        for t in others {
            // A thread that ended meanwhile cannot be detached: nothing to do for it.
            let _ =
                ptrace_with_signal(libc::PTRACE_DETACH, "PTRACE_DETACH", Pid::from_raw(t), None);
        }
        ptrace_with_signal(libc::PTRACE_DETACH, "PTRACE_DETACH", self.pid, None)?;
        self.state = RunState::Exited;
        Ok(())
    }

    fn has_exited(&self) -> bool {
        self.state == RunState::Exited
    }

    fn inject_syscall(&mut self, nr: u64, args: [u64; 6]) -> TargetResult<u64> {
        self.ensure_stopped()?;
        let pid = self.cur;
        let saved = nix::sys::ptrace::getregs(pid).map_err(sys("PTRACE_GETREGS", pid))?;
        let pc = saved.rip;
        let mut code = [0u8; 2];
        if self.read_raw(pc, &mut code)? != 2 {
            return Err(TargetError::Memory { addr: pc });
        }
        // `syscall` at the PC, the call in the registers, one step, then everything back.
        self.write_raw(pc, &[0x0f, 0x05])?;
        let mut r = saved;
        r.rax = nr;
        (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) =
            (args[0], args[1], args[2], args[3], args[4], args[5]);
        // Not inside an interrupted call: the kernel must not apply its restart rules.
        r.orig_rax = u64::MAX;
        let run = nix::sys::ptrace::setregs(pid, r)
            .map_err(sys("PTRACE_SETREGS", pid))
            .and_then(|()| {
                ptrace_with_signal(libc::PTRACE_SINGLESTEP, "PTRACE_SINGLESTEP", pid, None)
            })
            .and_then(|()| waitpid_raw(pid, true));
        let result = nix::sys::ptrace::getregs(pid).map(|r| r.rax);
        let restored = self.write_raw(pc, &code).and_then(|()| {
            nix::sys::ptrace::setregs(pid, saved).map_err(sys("PTRACE_SETREGS", pid))
        });
        match run? {
            Wait::Stopped(libc::SIGTRAP) => {}
            other => {
                return Err(TargetError::Unexpected {
                    pid: pid.as_raw(),
                    what: format!("an injected system call stopped with {other:?}"),
                });
            }
        }
        restored?;
        result.map_err(sys("PTRACE_GETREGS", pid))
    }

    fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    fn support_breakpoints(&mut self) -> Option<&mut dyn Breakpoints> {
        Some(self)
    }
}

/// The full register file of stopped tracee `tid`: general-purpose registers and XSAVE state
/// (the legacy FXSAVE area where XSAVE is unknown).
fn registers_of(tid: Pid) -> TargetResult<X86Registers> {
    let gprs = nix::sys::ptrace::getregs(tid).map_err(sys("PTRACE_GETREGS", tid))?;
    let (note, size) = match xsave_area_size() {
        Some(size) => (NT_X86_XSTATE, size),
        None => (NT_PRFPREG, 512),
    };
    let mut buf = vec![0u8; size];
    let written = regset(tid, RegsetOp::Get, note, &mut buf)?;
    buf.truncate(written.min(size));
    Ok(X86Registers::from_parts(&gprs, buf))
}

impl Breakpoints for PtraceTarget {
    fn add_breakpoint(&mut self, addr: u64) -> TargetResult<()> {
        // Refuse addresses we could not patch, so GDB reports the failure at `break` time.
        let mut probe = [0u8; 1];
        self.read_raw(addr, &mut probe)?;
        if self.inserted && !self.breakpoints.contains_key(&addr) {
            self.write_raw(addr, &[INT3])?;
        }
        self.breakpoints.entry(addr).or_insert(probe[0]);
        Ok(())
    }

    fn remove_breakpoint(&mut self, addr: u64) -> TargetResult<bool> {
        match self.breakpoints.remove(&addr) {
            Some(orig) => {
                if self.inserted {
                    self.write_raw(addr, &[orig])?;
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn breakpoint_addrs(&self) -> Vec<u64> {
        self.breakpoints.keys().copied().collect()
    }
}

impl Drop for PtraceTarget {
    fn drop(&mut self) {
        if self.state == RunState::Exited {
            self.end_held_fork(self.spawned);
            return;
        }
        if self.spawned {
            let _ = Target::kill(self);
        } else {
            if let RunState::Running(_) = self.state {
                let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGSTOP);
                if let Ok(Some((_, w))) = self.wait_stop(Resume::Continue { signal: None }, true) {
                    let _ = self.finish_stop(
                        w,
                        Resume::Step {
                            signal: None,
                            others: false,
                        },
                    );
                }
            }
            if self.state == RunState::Stopped {
                let _ = self.detach();
            }
        }
    }
}
