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
use super::{Breakpoints, Notice, Resume, StopEvent, Target, TargetError, TargetResult};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

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

/// What the target knows about one traced thread.
#[derive(Clone, Copy, Debug, Default)]
struct ThreadInfo {
    /// Resumed by a full-speed continue (or a step in flight) and not yet seen stopped.
    running: bool,
    /// A stop this thread reported while the others were being stopped, not yet reported.
    pending: Option<Wait>,
    /// A `SIGSTOP` we sent it is still queued: drop it when it shows up.
    swallow_sigstop: bool,
}

/// How one step (or wait) of a single thread ended ([`PtraceTarget::step_poll`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadStop {
    /// A stop of the thread (or the end of the whole process: `Exited`, `Killed`, `Exiting`).
    Stop(StopEvent),
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
}

fn sys(op: &'static str, pid: Pid) -> impl FnOnce(nix::Error) -> TargetError {
    move |source| TargetError::Sys {
        op,
        pid: pid.as_raw(),
        source,
    }
}

/// Direction of a [`regset`] transfer.
#[derive(Clone, Copy)]
enum RegsetOp {
    /// `PTRACE_GETREGSET`: the kernel fills the buffer.
    Get,
    /// `PTRACE_SETREGSET`: the kernel reads the buffer.
    Set,
}

/// `PTRACE_GETREGSET` / `PTRACE_SETREGSET` of register set `note` with `buf`; returns the
/// number of bytes the kernel transferred.
fn regset(pid: Pid, op: RegsetOp, note: usize, buf: &mut [u8]) -> TargetResult<usize> {
    let (request, name) = match op {
        RegsetOp::Get => (libc::PTRACE_GETREGSET, "PTRACE_GETREGSET"),
        RegsetOp::Set => (libc::PTRACE_SETREGSET, "PTRACE_SETREGSET"),
    };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the kernel writes (GETREGSET) or reads (SETREGSET) at most `iov_len` bytes of
    // `buf`, which outlives the call, and updates `iov_len` to the size transferred.
    let r = unsafe {
        libc::ptrace(
            request,
            pid.as_raw(),
            note as *mut libc::c_void,
            &mut iov as *mut libc::iovec,
        )
    };
    if r < 0 {
        return Err(sys(name, pid)(nix::Error::last()));
    }
    Ok(iov.iov_len)
}

/// Decoded `waitpid` status (our own decoding: nix cannot represent real-time signals).
#[derive(Debug, Clone, Copy)]
enum Wait {
    StillRunning,
    Exited(i32),
    Killed(i32),
    Stopped(i32),
    Event(i32),
}

fn waitpid_raw(pid: Pid, block: bool) -> TargetResult<Wait> {
    let mut status: libc::c_int = 0;
    let flags = libc::__WALL | if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: waitpid only writes the status integer we own.
        let r = unsafe { libc::waitpid(pid.as_raw(), &mut status, flags) };
        if r < 0 {
            let err = nix::Error::last();
            if err == nix::Error::EINTR {
                continue;
            }
            return Err(sys("waitpid", pid)(err));
        }
        if r == 0 {
            return Ok(Wait::StillRunning);
        }
        break;
    }
    Ok(if libc::WIFEXITED(status) {
        Wait::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Wait::Killed(libc::WTERMSIG(status))
    } else if libc::WIFSTOPPED(status) {
        let event = status >> 16;
        if event != 0 {
            Wait::Event(event)
        } else {
            Wait::Stopped(libc::WSTOPSIG(status))
        }
    } else {
        Wait::StillRunning
    })
}

/// `ptrace(request, pid, 0, signal)` for the requests that take a signal number in `data`
/// (CONT, SINGLESTEP, DETACH). Raw because nix's `Signal` cannot carry real-time signals.
fn ptrace_with_signal(
    request: libc::c_uint,
    op: &'static str,
    pid: Pid,
    signal: Option<i32>,
) -> TargetResult<()> {
    let data = signal.unwrap_or(0) as usize;
    // SAFETY: these requests take no pointers: `addr` is ignored and `data` is a signal number.
    let r = unsafe {
        libc::ptrace(
            request,
            pid.as_raw(),
            std::ptr::null_mut::<libc::c_void>(),
            data as *mut libc::c_void,
        )
    };
    if r < 0 {
        return Err(sys(op, pid)(nix::Error::last()));
    }
    Ok(())
}

fn open_mem(pid: Pid) -> TargetResult<File> {
    let path = PathBuf::from(format!("/proc/{}/mem", pid.as_raw()));
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| TargetError::Io { path, source })
}

fn exe_of(pid: Pid) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{}/exe", pid.as_raw())).ok()
}

fn trace_options() -> nix::sys::ptrace::Options {
    use nix::sys::ptrace::Options;
    Options::PTRACE_O_TRACECLONE
        | Options::PTRACE_O_TRACEFORK
        | Options::PTRACE_O_TRACEVFORK
        | Options::PTRACE_O_TRACEVFORKDONE
        | Options::PTRACE_O_TRACEEXEC
        | Options::PTRACE_O_TRACEEXIT
}

/// `PTRACE_ATTACH` to one thread and waits for its `SIGSTOP` (signals that arrive first are
/// delivered, as they would have been).
fn attach_one(tid: Pid) -> TargetResult<()> {
    nix::sys::ptrace::attach(tid).map_err(sys("PTRACE_ATTACH", tid))?;
    loop {
        match waitpid_raw(tid, true)? {
            Wait::Stopped(libc::SIGSTOP) => return Ok(()),
            Wait::Stopped(sig) => {
                ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", tid, Some(sig))?
            }
            Wait::Exited(_) | Wait::Killed(_) => {
                return Err(TargetError::Exited { pid: tid.as_raw() });
            }
            _ => {}
        }
    }
}

/// The thread-group id of `tid` (`Tgid:` in `/proc/TID/status`).
fn tgid_of(tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
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
        // `child` is dropped without waiting: we reap the process ourselves with waitpid.
        drop(child);
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
        Ok(target)
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
            state: RunState::Stopped,
            pending: None,
            notices,
            spawned,
            drop_terminal_interrupts: false,
            threads: BTreeMap::from([(pid.as_raw(), ThreadInfo::default())]),
            cur: pid,
            new_threads: Vec::new(),
            exiting: false,
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
        self.resume(Resume::Step { signal })?;
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

    fn get_event_msg(&self, tid: Pid) -> TargetResult<i32> {
        nix::sys::ptrace::getevent(tid)
            .map(|v| v as i32)
            .map_err(sys("PTRACE_GETEVENTMSG", tid))
    }

    fn add_thread(&mut self, tid: i32) {
        self.threads.insert(tid, ThreadInfo::default());
        self.new_threads.push(tid);
        self.thread_stats.created += 1;
        self.thread_stats.peak = self.thread_stats.peak.max(self.threads.len() as u64);
    }

    /// Forgets a thread that ended; the current thread moves to another one if it was that.
    fn remove_thread(&mut self, tid: Pid) {
        self.threads.remove(&tid.as_raw());
        if self.cur == tid
            && let Some(&other) = self.threads.keys().next()
        {
            self.cur = Pid::from_raw(other);
        }
    }

    /// The traced threads: the leader first (while it is alive), then the others by id.
    pub fn threads(&self) -> Vec<i32> {
        let leader = self.pid.as_raw();
        let mut v: Vec<i32> = self
            .threads
            .keys()
            .copied()
            .filter(|&t| t != leader)
            .collect();
        if self.threads.contains_key(&leader) {
            v.insert(0, leader);
        }
        v
    }

    /// Threads created since the last call.
    pub fn take_new_threads(&mut self) -> Vec<i32> {
        std::mem::take(&mut self.new_threads)
    }

    /// Thread counters.
    pub fn thread_stats(&self) -> ThreadStats {
        self.thread_stats
    }

    /// The thread register and step operations apply to.
    pub fn current_thread(&self) -> i32 {
        self.cur.as_raw()
    }

    /// Makes `tid` the thread register and step operations apply to.
    pub fn select_thread(&mut self, tid: i32) -> TargetResult<()> {
        if !self.threads.contains_key(&tid) {
            return Err(TargetError::Unexpected {
                pid: self.pid.as_raw(),
                what: format!("no traced thread {tid}"),
            });
        }
        self.cur = Pid::from_raw(tid);
        Ok(())
    }

    /// Whether `tid`, stopped at its `PTRACE_EVENT_EXIT`, ends alone (`exit`, other threads
    /// alive) rather than taking the process with it (`exit_group`, a fatal signal, the last
    /// thread).
    fn is_thread_exit(&self, tid: Pid) -> bool {
        self.threads.len() > 1
            && nix::sys::ptrace::getregs(tid).is_ok_and(|r| r.orig_rax == libc::SYS_exit as u64)
    }

    /// Handles a `PTRACE_EVENT_*` stop of thread `tid`. The caller resumes it afterwards.
    fn handle_event(&mut self, tid: Pid, event: i32, mode: Resume) -> TargetResult<()> {
        match event {
            libc::PTRACE_EVENT_CLONE => {
                let new = Pid::from_raw(self.get_event_msg(tid)?);
                // The new task starts traced with a pending SIGSTOP; collect it.
                waitpid_raw(new, true)?;
                if tgid_of(new.as_raw()) == Some(self.pid.as_raw()) {
                    self.add_thread(new.as_raw());
                    if matches!(self.state, RunState::Running(Resume::Continue { .. })) {
                        // A full-speed run runs every thread (the SIGSTOP is dropped).
                        ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", new, None)?;
                        if let Some(t) = self.threads.get_mut(&new.as_raw()) {
                            t.running = true;
                        }
                    }
                } else {
                    // clone without CLONE_THREAD: another process, handled as a fork.
                    self.release_child(new, false)?;
                }
            }
            libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                let vfork = event == libc::PTRACE_EVENT_VFORK;
                let child = Pid::from_raw(self.get_event_msg(tid)?);
                waitpid_raw(child, true)?;
                self.release_child(child, vfork)?;
            }
            libc::PTRACE_EVENT_VFORK_DONE if self.vfork_lifted => {
                self.vfork_lifted = false;
                if matches!(mode, Resume::Continue { .. }) {
                    self.insert_breakpoints()?;
                }
            }
            libc::PTRACE_EVENT_EXEC => {
                // A new address space: the old int3 bytes and saved originals are meaningless.
                self.breakpoints.clear();
                self.inserted = false;
                self.exe = exe_of(self.pid);
                self.mem = open_mem(self.pid)?;
                // The other threads are gone (the kernel killed them; the exec'ing thread now
                // has the leader's id): collect what they left.
                let others = self.other_threads();
                for t in others {
                    let _ = waitpid_raw(Pid::from_raw(t), false);
                    self.threads.remove(&t);
                }
                self.threads.entry(self.pid.as_raw()).or_default().running = false;
                self.cur = self.pid;
                self.notices.push(Notice::Exec {
                    path: self.exe.clone(),
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// Detaches a forked child (stopped at its first stop), with no int3 of ours left in it.
    fn release_child(&mut self, child: Pid, vfork: bool) -> TargetResult<()> {
        if self.inserted {
            if vfork {
                // The child shares our memory: lift the breakpoints until it execs or exits
                // (VFORK_DONE), or it would trap on them untraced.
                self.remove_breakpoints()?;
                self.vfork_lifted = true;
            } else if let Ok(mem) = open_mem(child) {
                // The child has a copy of our memory, int3 bytes included.
                for (&addr, &orig) in &self.breakpoints {
                    let _ = self.write_raw_to(&mem, addr, &[orig]);
                }
            }
        }
        ptrace_with_signal(libc::PTRACE_DETACH, "PTRACE_DETACH", child, None)?;
        self.notices.push(Notice::Forked {
            child: child.as_raw(),
            vfork,
        });
        Ok(())
    }

    /// Resumes thread `tid` in `mode` (ptrace's own request; no breakpoint handling).
    fn resume_thread(&mut self, tid: Pid, mode: Resume) -> TargetResult<()> {
        let r = match mode {
            Resume::Continue { signal } => {
                ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", tid, signal)
            }
            Resume::Step { signal } => {
                ptrace_with_signal(libc::PTRACE_SINGLESTEP, "PTRACE_SINGLESTEP", tid, signal)
            }
        };
        if let Some(t) = self.threads.get_mut(&tid.as_raw()) {
            t.running = true;
        }
        r
    }

    fn raw_resume(&mut self, mode: Resume) -> TargetResult<()> {
        match mode {
            Resume::Continue { .. } => {
                self.insert_breakpoints()?;
                self.resume_thread(self.cur, mode)?;
                // All-stop: a full-speed run runs every thread.
                let others: Vec<i32> = self
                    .threads
                    .iter()
                    .filter(|(t, i)| **t != self.cur.as_raw() && !i.running)
                    .map(|(t, _)| *t)
                    .collect();
                for t in others {
                    let t = Pid::from_raw(t);
                    if let Err(e) = self.resume_thread(t, Resume::Continue { signal: None }) {
                        // Gone meanwhile (killed): its end is collected by the wait.
                        if !matches!(
                            e,
                            TargetError::Sys {
                                source: nix::Error::ESRCH,
                                ..
                            }
                        ) {
                            return Err(e);
                        }
                        self.thread_stats.vanished += 1;
                    }
                }
                Ok(())
            }
            Resume::Step { .. } => self.resume_thread(self.cur, mode),
        }
    }

    /// The threads a wait in `mode` listens to: the current one for a step, every running
    /// thread and the leader (whose status ends the process) for a continue.
    fn waited_threads(&self, mode: Resume) -> Vec<Pid> {
        match mode {
            Resume::Step { .. } => vec![self.cur],
            Resume::Continue { .. } => {
                let mut v: Vec<Pid> = self
                    .threads
                    .iter()
                    .filter(|(_, i)| i.running)
                    .map(|(t, _)| Pid::from_raw(*t))
                    .collect();
                if !v.contains(&self.pid) {
                    v.push(self.pid);
                }
                v
            }
        }
    }

    /// Waits for the next stop of one of `waited`: `(thread, status)`; `None` only when
    /// `block` is false and nothing happened. Several threads are polled in turn (never
    /// `waitpid(-1)`: the debugger may be our child too).
    fn wait_any(&self, waited: &[Pid], block: bool) -> TargetResult<Option<(Pid, Wait)>> {
        if let [one] = waited {
            return match waitpid_raw(*one, block)? {
                Wait::StillRunning => Ok(None),
                w => Ok(Some((*one, w))),
            };
        }
        let mut pause = Duration::from_micros(20);
        loop {
            for &t in waited {
                match waitpid_raw(t, false) {
                    Ok(Wait::StillRunning) => {}
                    Ok(w) => return Ok(Some((t, w))),
                    // Reaped already (a thread whose end was collected elsewhere).
                    Err(TargetError::Sys {
                        source: nix::Error::ECHILD,
                        ..
                    }) => {}
                    Err(e) => return Err(e),
                }
            }
            if !block {
                return Ok(None);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }

    /// Waits for the next reportable stop while the tracee runs in `mode`, handling ptrace
    /// events, thread creation and thread ends on the way. `Ok(None)` only when `block` is
    /// false and nothing happened.
    fn wait_stop(&mut self, mode: Resume, block: bool) -> TargetResult<Option<(Pid, Wait)>> {
        let again = match mode {
            Resume::Continue { .. } => Resume::Continue { signal: None },
            Resume::Step { .. } => Resume::Step { signal: None },
        };
        loop {
            let waited = self.waited_threads(mode);
            let Some((tid, w)) = self.wait_any(&waited, block)? else {
                return Ok(None);
            };
            if let Some(t) = self.threads.get_mut(&tid.as_raw()) {
                t.running = false;
            }
            match w {
                Wait::StillRunning => return Ok(None),
                Wait::Event(libc::PTRACE_EVENT_EXIT) => {
                    if self.is_thread_exit(tid) {
                        // One thread ends: let it; its status follows.
                        self.resume_thread(tid, Resume::Continue { signal: None })?;
                    } else if self.stop_at_exit && !self.exiting {
                        self.exiting = true;
                        return Ok(Some((tid, w)));
                    } else {
                        self.exiting = true;
                        self.resume_thread(tid, Resume::Continue { signal: None })?;
                    }
                }
                Wait::Event(event) => {
                    self.handle_event(tid, event, mode)?;
                    // Re-issue the same request without the signal (already delivered).
                    if tid == self.cur || matches!(mode, Resume::Continue { .. }) {
                        self.resume_thread(tid, again)?;
                    }
                }
                Wait::Stopped(libc::SIGSTOP)
                    if self
                        .threads
                        .get(&tid.as_raw())
                        .is_some_and(|t| t.swallow_sigstop) =>
                {
                    // Our own SIGSTOP, from stopping the threads at an earlier stop.
                    if let Some(t) = self.threads.get_mut(&tid.as_raw()) {
                        t.swallow_sigstop = false;
                    }
                    let mode = if tid == self.cur {
                        again
                    } else {
                        Resume::Continue { signal: None }
                    };
                    self.resume_thread(tid, mode)?;
                }
                Wait::Stopped(sig @ (libc::SIGINT | libc::SIGQUIT))
                    if self.drop_terminal_interrupts && self.sent_by_terminal(tid, sig) =>
                {
                    // A signal-delivery stop: the instruction has not run yet, so the same
                    // request without the signal continues exactly where the program was.
                    let mode = if tid == self.cur {
                        again
                    } else {
                        Resume::Continue { signal: None }
                    };
                    self.resume_thread(tid, mode)?;
                }
                Wait::Exited(_) | Wait::Killed(_) if tid != self.pid => {
                    // A thread ended (the process goes on, or ends with the leader's status).
                    if !self.exiting {
                        self.thread_stats.exited += 1;
                    }
                    let was_cur = tid == self.cur;
                    self.remove_thread(tid);
                    if was_cur && matches!(mode, Resume::Step { .. }) {
                        return Ok(Some((tid, w)));
                    }
                }
                other => return Ok(Some((tid, other))),
            }
        }
    }

    /// Stops every running thread other than the current one (all-stop), keeping a stop one
    /// of them reports first for a later wait.
    fn stop_others(&mut self) -> TargetResult<()> {
        let running: Vec<i32> = self
            .threads
            .iter()
            .filter(|(t, i)| **t != self.cur.as_raw() && i.running)
            .map(|(t, _)| *t)
            .collect();
        for &t in &running {
            // SAFETY: tgkill only sends a signal; no memory is passed.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, self.pid.as_raw(), t, libc::SIGSTOP) };
            if r != 0 {
                // Already gone: collected below.
                self.thread_stats.vanished += 1;
            }
        }
        for t in running {
            let pid = Pid::from_raw(t);
            loop {
                match waitpid_raw(pid, true) {
                    Ok(Wait::Stopped(libc::SIGSTOP)) => break,
                    Ok(Wait::Event(libc::PTRACE_EVENT_EXIT)) if self.is_thread_exit(pid) => {
                        self.resume_thread(pid, Resume::Continue { signal: None })?;
                    }
                    Ok(Wait::Event(libc::PTRACE_EVENT_CLONE)) => {
                        // Stopped at the event; our SIGSTOP stays queued.
                        self.handle_event(
                            pid,
                            libc::PTRACE_EVENT_CLONE,
                            Resume::Step { signal: None },
                        )?;
                        if let Some(i) = self.threads.get_mut(&t) {
                            i.swallow_sigstop = true;
                        }
                        break;
                    }
                    Ok(w @ (Wait::Stopped(_) | Wait::Event(_))) => {
                        if let Some(i) = self.threads.get_mut(&t) {
                            i.pending = Some(w);
                            i.swallow_sigstop = true;
                        }
                        break;
                    }
                    Ok(Wait::Exited(_) | Wait::Killed(_)) | Err(_) => {
                        self.thread_stats.exited += 1;
                        self.threads.remove(&t);
                        break;
                    }
                    Ok(Wait::StillRunning) => {}
                }
            }
            if let Some(i) = self.threads.get_mut(&t) {
                i.running = false;
            }
        }
        Ok(())
    }

    /// Every traced thread but the leader (a snapshot: the callers change `threads`).
    fn other_threads(&self) -> Vec<i32> {
        self.threads
            .keys()
            .copied()
            .filter(|&t| t != self.pid.as_raw())
            .collect()
    }

    /// Collects the end of every thread of a process that is exiting or was killed, the leader
    /// last (its status is the process's).
    fn reap_all(&mut self) -> Option<Wait> {
        // A thread whose stop was already collected (at its exit event, or any ptrace stop)
        // reports nothing new until it is resumed; one that is running ignores this.
        for &t in self.threads.keys() {
            let _ = ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", Pid::from_raw(t), None);
        }
        let _ = ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", self.pid, None);
        let others = self.other_threads();
        for t in others {
            let pid = Pid::from_raw(t);
            loop {
                match waitpid_raw(pid, true) {
                    Ok(Wait::Stopped(_) | Wait::Event(_)) => {
                        let _ = ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", pid, None);
                    }
                    Ok(Wait::StillRunning) => {}
                    _ => break,
                }
            }
            self.threads.remove(&t);
        }
        loop {
            match waitpid_raw(self.pid, true) {
                Ok(Wait::Stopped(_) | Wait::Event(_)) => {
                    let _ = ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", self.pid, None);
                }
                Ok(Wait::StillRunning) => {}
                Ok(w) => {
                    self.threads.clear();
                    return Some(w);
                }
                Err(_) => {
                    self.threads.clear();
                    return None;
                }
            }
        }
    }

    /// True if the pending signal `sig` of `tid` was generated by the terminal (`SI_KERNEL`).
    fn sent_by_terminal(&self, tid: Pid, sig: i32) -> bool {
        nix::sys::ptrace::getsiginfo(tid)
            .is_ok_and(|si| si.si_signo == sig && si.si_code == libc::SI_KERNEL)
    }

    /// Starts one single step of the current thread (delivering `signal` first); the other
    /// threads stay stopped. Collect it with [`step_poll`](Self::step_poll): a step into a
    /// blocking system call may take any time, during which the caller may step other threads.
    pub fn step_start(&mut self, signal: Option<i32>) -> TargetResult<()> {
        self.ensure_stopped()?;
        let tid = self.cur;
        match self.resume_thread(tid, Resume::Step { signal }) {
            Ok(()) => Ok(()),
            // Not in a ptrace-stop any more: killed from outside and on its way out; the
            // poll collects how it ended.
            Err(TargetError::Sys {
                source: nix::Error::ESRCH,
                ..
            }) => {
                self.thread_stats.vanished += 1;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Collects the step of thread `tid` started with [`step_start`](Self::step_start):
    /// `Ok(None)` while it has not stopped (only with `block == false`). The process's end is
    /// a [`ThreadStop::Stop`] with `Exiting` (always reported: the caller lets it go with a
    /// continue), `Exited` or `Killed`.
    pub fn step_poll(&mut self, tid: i32, block: bool) -> TargetResult<Option<ThreadStop>> {
        let tid = Pid::from_raw(tid);
        let prev = self.cur;
        self.cur = tid;
        let mode = Resume::Step { signal: None };
        let saved_stop_at_exit = self.stop_at_exit;
        self.stop_at_exit = true;
        let r = self.wait_stop(mode, block);
        self.stop_at_exit = saved_stop_at_exit;
        let r = r?;
        let Some((t, w)) = r else {
            self.cur = prev;
            return Ok(None);
        };
        Ok(Some(match w {
            Wait::Exited(code) if t != self.pid => ThreadStop::ThreadExited { code },
            // The process is on its way out and another thread is kept at its exit event: this
            // one is simply gone.
            Wait::Killed(sig) if t != self.pid && self.exiting => {
                ThreadStop::ThreadExited { code: 128 + sig }
            }
            Wait::Killed(sig) if t != self.pid => {
                // A thread killed by a signal: the whole process goes.
                let end = self.reap_all().unwrap_or(Wait::Killed(sig));
                ThreadStop::Stop(self.finish_stop(end, mode)?)
            }
            Wait::Event(libc::PTRACE_EVENT_EXIT) => ThreadStop::Stop(StopEvent::Exiting),
            w => ThreadStop::Stop(self.finish_stop(w, mode)?),
        }))
    }

    /// Turns a raw stop into the event reported to the debugger, and records the new state.
    fn finish_stop(&mut self, w: Wait, mode: Resume) -> TargetResult<StopEvent> {
        match w {
            Wait::Exited(code) => {
                self.state = RunState::Exited;
                self.inserted = false;
                Ok(StopEvent::Exited(code))
            }
            Wait::Killed(sig) => {
                self.state = RunState::Exited;
                self.inserted = false;
                Ok(StopEvent::Killed(sig))
            }
            Wait::Stopped(sig) => {
                self.state = RunState::Stopped;
                self.remove_breakpoints()?;
                if sig != libc::SIGTRAP {
                    return Ok(StopEvent::Signal(sig));
                }
                match mode {
                    Resume::Step { .. } => Ok(StopEvent::Step),
                    Resume::Continue { .. } => {
                        let mut regs = self.read_registers()?;
                        let bp = regs.pc().wrapping_sub(1);
                        if self.breakpoints.contains_key(&bp) {
                            // int3 traps after the instruction: move the PC back onto it.
                            regs.set_pc(bp);
                            nix::sys::ptrace::setregs(self.cur, regs.to_libc())
                                .map_err(sys("PTRACE_SETREGS", self.cur))?;
                            Ok(StopEvent::Breakpoint { pc: bp })
                        } else {
                            Ok(StopEvent::Signal(libc::SIGTRAP))
                        }
                    }
                }
            }
            Wait::Event(libc::PTRACE_EVENT_EXIT) => {
                // Still alive at its end: registers and memory stay readable until resumed.
                self.state = RunState::Stopped;
                self.remove_breakpoints()?;
                Ok(StopEvent::Exiting)
            }
            Wait::StillRunning | Wait::Event(_) => Err(TargetError::Unexpected {
                pid: self.pid.as_raw(),
                what: format!("unexpected wait status {w:?}"),
            }),
        }
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
        let gprs = nix::sys::ptrace::getregs(self.cur).map_err(sys("PTRACE_GETREGS", self.cur))?;
        let (note, size) = match xsave_area_size() {
            Some(size) => (NT_X86_XSTATE, size),
            None => (NT_PRFPREG, 512),
        };
        let mut buf = vec![0u8; size];
        let written = regset(self.cur, RegsetOp::Get, note, &mut buf)?;
        buf.truncate(written.min(size));
        Ok(X86Registers::from_parts(&gprs, buf))
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
                let step = Resume::Step { signal };
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
        self.finish_stop(w, mode).map(Some)
    }

    fn interrupt(&mut self) -> TargetResult<()> {
        if let RunState::Running(_) = self.state {
            nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGINT)
                .map_err(sys("kill(SIGINT)", self.pid))?;
        }
        Ok(())
    }

    fn kill(&mut self) -> TargetResult<()> {
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
            return;
        }
        if self.spawned {
            let _ = Target::kill(self);
        } else {
            if let RunState::Running(_) = self.state {
                let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGSTOP);
                if let Ok(Some((_, w))) = self.wait_stop(Resume::Continue { signal: None }, true) {
                    let _ = self.finish_stop(w, Resume::Step { signal: None });
                }
            }
            if self.state == RunState::Stopped {
                let _ = self.detach();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn(prog: &str, args: &[&str]) -> PtraceTarget {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        PtraceTarget::spawn(&OsString::from(prog), &args, &SpawnOptions::default()).unwrap()
    }

    #[test]
    fn spawn_step_read_and_exit() {
        let mut t = spawn("/bin/sh", &["-c", "exit 7"]);
        let regs = t.read_registers().unwrap();
        let pc = regs.pc();
        // Code at the PC is readable, and reading via /proc/PID/mem matches process_vm_readv.
        let mut code = [0u8; 16];
        assert_eq!(t.read_memory(pc, &mut code).unwrap(), 16);
        let mut check = [0u8; 16];
        let local = [std::io::IoSliceMut::new(&mut check)];
        let remote = [nix::sys::uio::RemoteIoVec {
            base: pc as usize,
            len: 16,
        }];
        let mut local = local;
        nix::sys::uio::process_vm_readv(t.pid, &mut local, &remote).unwrap();
        assert_eq!(code, check);
        // Unmapped memory is an error, not garbage.
        assert!(matches!(
            t.read_memory(8, &mut code),
            Err(TargetError::Memory { addr: 8 })
        ));
        assert!(regs.xsave.len() >= 512);
        if super::super::regs::avx_enabled() {
            assert!(
                regs.has_avx(),
                "xcr0={:#x} len={}",
                regs.xcr0(),
                regs.xsave.len()
            );
        }
        // One step moves the PC.
        assert_eq!(t.single_step(None).unwrap(), StopEvent::Step);
        assert_ne!(t.read_registers().unwrap().pc(), pc);
        t.cont(None).unwrap();
        assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Exited(7)));
        assert!(t.has_exited());
        assert!(t.read_registers().is_err());
    }

    #[test]
    fn partial_read_at_the_end_of_a_mapping() {
        let t = spawn("/bin/true", &[]);
        let maps = crate::target::read_maps(t.pid()).unwrap();
        // A mapping whose end is not the start of another one: the next page is unmapped.
        let end = maps
            .iter()
            .map(|m| m.end)
            .find(|&end| !maps.iter().any(|m| m.start <= end && end < m.end))
            .expect("a mapping followed by a hole");
        let mut buf = [0u8; 16];
        assert_eq!(t.read_memory(end - 8, &mut buf).unwrap(), 8);
        assert!(
            matches!(t.read_memory(end, &mut buf), Err(TargetError::Memory { addr }) if addr == end)
        );
    }

    #[test]
    fn breakpoint_hit_and_step_over() {
        let mut t = spawn("/bin/true", &[]);
        let pc = t.read_registers().unwrap().pc();
        // Find the address reached after a few steps, put a breakpoint there, restart a
        // fresh process and run to it.
        let mut addrs = vec![pc];
        for _ in 0..5 {
            assert_eq!(t.single_step(None).unwrap(), StopEvent::Step);
            addrs.push(t.read_registers().unwrap().pc());
        }
        drop(t);
        let mut t = spawn("/bin/true", &[]);
        let target_pc = addrs[5];
        t.add_breakpoint(target_pc).unwrap();
        let mut orig = [0u8; 1];
        t.read_memory(target_pc, &mut orig).unwrap();
        t.cont(None).unwrap();
        assert_eq!(
            t.wait(true).unwrap(),
            Some(StopEvent::Breakpoint { pc: target_pc })
        );
        assert_eq!(t.read_registers().unwrap().pc(), target_pc);
        // While stopped, memory shows the original byte, not int3.
        let mut now = [0u8; 1];
        t.read_memory(target_pc, &mut now).unwrap();
        assert_eq!(now, orig);
        // Continuing steps over the breakpoint and runs to the end.
        t.cont(None).unwrap();
        assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Exited(0)));
    }
}
