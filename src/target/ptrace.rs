//! [`PtraceTarget`]: a live process controlled with ptrace (main thread only).

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunState {
    Stopped,
    Running(Resume),
    Exited,
}

/// A live process traced with ptrace. Only the main thread is debugged: new threads, forked
/// children and exec are detected (see [`Notice`]) and not followed.
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
        })
    }

    /// Attaches to the running process `pid` (its main thread) and stops it. Other threads
    /// keep running untraced; a [`Notice::OtherThreads`] says so.
    pub fn attach(pid: i32) -> TargetResult<Self> {
        let pid = Pid::from_raw(pid);
        nix::sys::ptrace::attach(pid).map_err(sys("PTRACE_ATTACH", pid))?;
        loop {
            match waitpid_raw(pid, true)? {
                Wait::Stopped(libc::SIGSTOP) => break,
                // Another signal arrived before our SIGSTOP: deliver it (the process would
                // have received it anyway) and keep waiting for the SIGSTOP.
                Wait::Stopped(sig) => {
                    ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", pid, Some(sig))?
                }
                Wait::Exited(_) | Wait::Killed(_) => {
                    return Err(TargetError::Exited { pid: pid.as_raw() });
                }
                _ => {}
            }
        }
        nix::sys::ptrace::setoptions(pid, trace_options())
            .map_err(sys("PTRACE_SETOPTIONS", pid))?;
        let mut notices = Vec::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", pid.as_raw())) {
            let count = tasks.count().saturating_sub(1);
            if count > 0 {
                notices.push(Notice::OtherThreads { count });
            }
        }
        Self::stopped(pid, notices, false)
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

    fn get_event_msg(&self) -> TargetResult<i32> {
        nix::sys::ptrace::getevent(self.pid)
            .map(|v| v as i32)
            .map_err(sys("PTRACE_GETEVENTMSG", self.pid))
    }

    /// Handles a `PTRACE_EVENT_*` stop of the main thread. The caller resumes afterwards.
    fn handle_event(&mut self, event: i32, mode: Resume) -> TargetResult<()> {
        match event {
            libc::PTRACE_EVENT_CLONE => {
                let tid = Pid::from_raw(self.get_event_msg()?);
                // The new thread starts traced with a pending SIGSTOP; collect it and let go.
                waitpid_raw(tid, true)?;
                ptrace_with_signal(libc::PTRACE_DETACH, "PTRACE_DETACH", tid, None)?;
                self.notices
                    .push(Notice::ThreadCreated { tid: tid.as_raw() });
            }
            libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                let vfork = event == libc::PTRACE_EVENT_VFORK;
                let child = Pid::from_raw(self.get_event_msg()?);
                waitpid_raw(child, true)?;
                if self.inserted {
                    if vfork {
                        // The child shares our memory: lift the breakpoints until it execs
                        // or exits (VFORK_DONE), or it would trap on them untraced.
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
                self.notices.push(Notice::Exec {
                    path: self.exe.clone(),
                });
            }
            _ => {}
        }
        Ok(())
    }

    fn raw_resume(&mut self, mode: Resume) -> TargetResult<()> {
        match mode {
            Resume::Continue { signal } => {
                self.insert_breakpoints()?;
                ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", self.pid, signal)
            }
            Resume::Step { signal } => ptrace_with_signal(
                libc::PTRACE_SINGLESTEP,
                "PTRACE_SINGLESTEP",
                self.pid,
                signal,
            ),
        }
    }

    /// Waits for the next reportable stop while the tracee runs in `mode`, handling ptrace
    /// events on the way. `Ok(None)` only when `block` is false and nothing happened.
    fn wait_stop(&mut self, mode: Resume, block: bool) -> TargetResult<Option<Wait>> {
        loop {
            match waitpid_raw(self.pid, block)? {
                Wait::StillRunning => return Ok(None),
                Wait::Event(libc::PTRACE_EVENT_EXIT) if self.stop_at_exit => {
                    return Ok(Some(Wait::Event(libc::PTRACE_EVENT_EXIT)));
                }
                Wait::Event(event) => {
                    self.handle_event(event, mode)?;
                    // Re-issue the same request without the signal (already delivered).
                    let again = match mode {
                        Resume::Continue { .. } => Resume::Continue { signal: None },
                        Resume::Step { .. } => Resume::Step { signal: None },
                    };
                    self.raw_resume(again)?;
                }
                Wait::Stopped(sig @ (libc::SIGINT | libc::SIGQUIT))
                    if self.drop_terminal_interrupts && self.sent_by_terminal(sig) =>
                {
                    // A signal-delivery stop: the instruction has not run yet, so the same
                    // request without the signal continues exactly where the program was.
                    let again = match mode {
                        Resume::Continue { .. } => Resume::Continue { signal: None },
                        Resume::Step { .. } => Resume::Step { signal: None },
                    };
                    self.raw_resume(again)?;
                }
                other => return Ok(Some(other)),
            }
        }
    }

    /// True if the pending signal `sig` was generated by the terminal (`SI_KERNEL`).
    fn sent_by_terminal(&self, sig: i32) -> bool {
        nix::sys::ptrace::getsiginfo(self.pid)
            .is_ok_and(|si| si.si_signo == sig && si.si_code == libc::SI_KERNEL)
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
                            nix::sys::ptrace::setregs(self.pid, regs.to_libc())
                                .map_err(sys("PTRACE_SETREGS", self.pid))?;
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

    fn exec_path(&self) -> Option<PathBuf> {
        self.exe.clone()
    }

    fn read_registers(&mut self) -> TargetResult<X86Registers> {
        if self.state == RunState::Exited {
            return Err(TargetError::Exited {
                pid: self.pid.as_raw(),
            });
        }
        let gprs = nix::sys::ptrace::getregs(self.pid).map_err(sys("PTRACE_GETREGS", self.pid))?;
        let (note, size) = match xsave_area_size() {
            Some(size) => (NT_X86_XSTATE, size),
            None => (NT_PRFPREG, 512),
        };
        let mut buf = vec![0u8; size];
        let written = regset(self.pid, RegsetOp::Get, note, &mut buf)?;
        buf.truncate(written.min(size));
        Ok(X86Registers::from_parts(&gprs, buf))
    }

    fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()> {
        self.ensure_stopped()?;
        nix::sys::ptrace::setregs(self.pid, regs.to_libc())
            .map_err(sys("PTRACE_SETREGS", self.pid))?;
        let note = if regs.xsave.len() > 512 {
            NT_X86_XSTATE
        } else {
            NT_PRFPREG
        };
        let mut buf = regs.xsave.clone();
        regset(self.pid, RegsetOp::Set, note, &mut buf)?;
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
        if let Resume::Continue { signal } = how {
            let pc = nix::sys::ptrace::getregs(self.pid)
                .map_err(sys("PTRACE_GETREGS", self.pid))?
                .rip;
            if self.breakpoints.contains_key(&pc) {
                // Step over the breakpoint under the PC with its original byte in place, then
                // insert all breakpoints and continue.
                let step = Resume::Step { signal };
                self.raw_resume(step)?;
                match self.wait_stop(step, true)? {
                    Some(Wait::Stopped(libc::SIGTRAP)) => {}
                    Some(other) => {
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
                self.raw_resume(cont)?;
                self.state = RunState::Running(cont);
                return Ok(());
            }
        }
        self.raw_resume(how)?;
        self.state = RunState::Running(how);
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
        match self.wait_stop(mode, block)? {
            None => Ok(None),
            Some(w) => self.finish_stop(w, mode).map(Some),
        }
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
        // A tracee stopped at its exit event is past signals: SIGKILL does not wake it, a
        // PTRACE_CONT lets it finish (an error here only means it is already running or gone).
        if self.state == RunState::Stopped {
            let _ = ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", self.pid, None);
        }
        loop {
            match waitpid_raw(self.pid, true)? {
                Wait::Exited(_) | Wait::Killed(_) => break,
                // A stop on the way out (the exit event): let it finish dying.
                Wait::Event(_) | Wait::Stopped(_) => {
                    let _ = ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", self.pid, None);
                }
                Wait::StillRunning => continue,
            }
        }
        self.state = RunState::Exited;
        self.inserted = false;
        Ok(())
    }

    fn detach(&mut self) -> TargetResult<()> {
        self.ensure_stopped()?;
        self.remove_breakpoints()?;
        ptrace_with_signal(libc::PTRACE_DETACH, "PTRACE_DETACH", self.pid, None)?;
        self.state = RunState::Exited;
        Ok(())
    }

    fn has_exited(&self) -> bool {
        self.state == RunState::Exited
    }

    fn inject_syscall(&mut self, nr: u64, args: [u64; 6]) -> TargetResult<u64> {
        self.ensure_stopped()?;
        let pid = self.pid;
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
                if let Ok(Some(w)) = self.wait_stop(Resume::Continue { signal: None }, true) {
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
