//! [`RecordingTarget`]: the server's [`Target`] over a [`Timeline`] — what the GDB session
//! (gdbstub) drives: registers and memory at the cursor, breakpoints, write watchpoints, and
//! resumption in both directions. All the logic is the timeline's; this is adaptation only.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::target::files::{open_host_file, read_host_link};
use crate::target::{
    Breakpoints, HeldChildReply, HeldChildRequest, Notice, RegMask, Resume, ReverseExecution,
    ReverseResume, StepRange, StopEvent, Target, TargetFile, TargetResult, WatchKind, Watchpoints,
    X86Registers,
};
use crate::timeline::Timeline;

/// A process recorded by a capture backend, or a recording replayed offline, with reverse
/// execution (see [`crate::timeline`]). Cheap handle on shared state:
/// [`RecordingTarget::shared`] gives the timeline to monitor commands.
#[derive(Debug, Clone)]
pub struct RecordingTarget {
    inner: Rc<RefCell<Timeline>>,
    pid: i32,
    exe: Option<PathBuf>,
    successor: Option<Successor>,
    /// After a succession, the register-file shape the debugger was given before it (XSAVE
    /// length, AVX offset): its target description stays that of the first timeline.
    shape: Option<(usize, Option<usize>)>,
    /// Notices taken from the timeline early (to find a [`Notice::RecordingKept`]), still to
    /// be given to the server.
    notices: Vec<Notice>,
}

/// Builds the replay that takes over a session whose process vanished by a signal no stop
/// could hold, from its kept recording directory and that signal (see
/// [`RecordingTarget::with_successor`]); `None` if it cannot be read.
#[derive(Clone)]
pub struct Successor(pub Rc<SuccessorFn>);

/// What a [`Successor`] calls: the kept recording's directory and the signal → the replay.
pub type SuccessorFn = dyn Fn(&Path, i32) -> Option<Timeline>;

impl std::fmt::Debug for Successor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Successor")
    }
}

impl RecordingTarget {
    /// Serves `timeline` to a debugger.
    pub fn new(mut timeline: Timeline) -> Self {
        let pid = timeline.pid();
        let exe = timeline.exec_path();
        RecordingTarget {
            inner: Rc::new(RefCell::new(timeline)),
            pid,
            exe,
            successor: None,
            shape: None,
            notices: Vec::new(),
        }
    }

    /// When the live process vanishes by a signal no stop could hold and the backend kept its
    /// recording ([`Notice::RecordingKept`]), the session goes on over the replay `successor`
    /// builds from it: the debugger is told of the signal as a stop at the end of the history
    /// (the rr model: the end of the program is a place in it), not of the end of the process.
    pub fn with_successor(mut self, successor: Successor) -> Self {
        self.successor = Some(successor);
        self
    }

    /// The timeline, if this is its only handle.
    pub fn into_timeline(self) -> Option<Timeline> {
        Rc::try_unwrap(self.inner).ok().map(RefCell::into_inner)
    }

    /// `r` in the shape the debugger was given before a succession (a `g` reply of another
    /// length would be refused): the XSAVE image cut or zero-extended, AVX upper halves
    /// unavailable where the replay has none.
    fn conform(&self, mut r: X86Registers) -> X86Registers {
        let Some((len, ymm)) = self.shape else {
            return r;
        };
        if (r.xsave.len(), r.ymm_hi_offset) != (len, ymm) {
            if ymm.is_some() && r.ymm_hi_offset.is_none() {
                r.unavailable = RegMask(r.unavailable.0 | RegMask::VECTOR.0);
            }
            r.xsave.resize(len, 0);
            r.ymm_hi_offset = ymm;
        }
        r
    }

    /// A process killed by a signal with its recording kept: the replay of that recording in
    /// its place (the monitor commands' handle sees it too), the stop to report instead.
    fn succeed(&mut self) -> Option<StopEvent> {
        let successor = self.successor.clone()?;
        let mut notices = self.inner.borrow_mut().take_notices();
        let found = notices.iter_mut().find_map(|n| match n {
            Notice::RecordingKept {
                signal,
                dir,
                replayed,
                ..
            } => Some((*signal, dir.clone(), replayed)),
            _ => None,
        });
        let mut stop = None;
        if let Some((signal, dir, replayed)) = found
            && let Some(replay) = (successor.0)(&dir, signal)
        {
            *replayed = true;
            self.shape = Some(self.inner.borrow().register_shape());
            *self.inner.borrow_mut() = replay;
            stop = Some(StopEvent::Signal(signal));
        }
        self.notices.extend(notices);
        stop
    }

    /// The shared timeline (for monitor commands).
    pub fn shared(&self) -> Rc<RefCell<Timeline>> {
        Rc::clone(&self.inner)
    }
}

impl Target for RecordingTarget {
    fn pid(&self) -> i32 {
        self.pid
    }

    fn current_pid(&self) -> i32 {
        self.inner.borrow().pid()
    }

    fn tid(&self) -> i32 {
        self.inner.borrow().tid()
    }

    fn thread_ids(&self) -> Vec<i32> {
        self.inner.borrow().thread_ids()
    }

    fn select_thread(&mut self, tid: i32) -> bool {
        self.inner.borrow_mut().select_thread(tid)
    }

    fn read_thread_registers(&mut self, tid: i32) -> TargetResult<X86Registers> {
        let r = self.inner.borrow_mut().thread_registers(tid)?;
        Ok(self.conform(r))
    }

    fn exec_path(&self) -> Option<PathBuf> {
        self.exe.clone()
    }

    fn stop_siginfo(&mut self, tid: i32) -> Option<Vec<u8>> {
        self.inner.borrow().stop_siginfo(tid)
    }

    fn read_registers(&mut self) -> TargetResult<X86Registers> {
        let r = self.inner.borrow_mut().read_registers()?;
        Ok(self.conform(r))
    }

    fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()> {
        self.inner.borrow_mut().write_registers(regs)
    }

    fn read_memory(&self, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        self.inner.borrow_mut().read_memory(addr, buf)
    }

    fn write_memory(&mut self, addr: u64, data: &[u8]) -> TargetResult<()> {
        self.inner.borrow_mut().write_memory(addr, data)
    }

    fn resume(&mut self, how: Resume) -> TargetResult<()> {
        self.inner.borrow_mut().resume(how)
    }

    fn resume_range(&mut self, how: Resume, range: StepRange) -> TargetResult<()> {
        self.inner.borrow_mut().resume_range(how, range)
    }

    fn wait(&mut self, block: bool) -> TargetResult<Option<StopEvent>> {
        let stop = self.inner.borrow_mut().wait(block)?;
        if let Some(StopEvent::Killed(_)) = stop
            && let Some(instead) = self.succeed()
        {
            return Ok(Some(instead));
        }
        if stop == Some(StopEvent::Exec) {
            // A new program: the debugger reads its name from the stop and `qXfer:exec-file`.
            self.exe = self.inner.borrow_mut().exec_path();
        }
        Ok(stop)
    }

    fn interrupt(&mut self) -> TargetResult<()> {
        self.inner.borrow_mut().interrupt()
    }

    fn kill(&mut self) -> TargetResult<()> {
        self.inner.borrow_mut().kill()
    }

    fn detach(&mut self) -> TargetResult<()> {
        self.inner.borrow_mut().detach()
    }

    fn has_exited(&self) -> bool {
        self.inner.borrow_mut().has_exited()
    }

    fn auxv(&self) -> TargetResult<Vec<u8>> {
        self.inner.borrow_mut().auxv()
    }

    fn inject_syscall(&mut self, nr: u64, args: [u64; 6]) -> TargetResult<u64> {
        self.inner.borrow_mut().inject_syscall(nr, args)
    }

    fn saved_library_list(&self) -> Option<String> {
        self.inner.borrow().saved_library_list().map(str::to_string)
    }

    fn open_file(&mut self, path: &std::path::Path) -> std::io::Result<TargetFile> {
        let recorded = self.inner.borrow_mut().target_file(path);
        recorded.unwrap_or_else(|| open_host_file(path))
    }

    fn read_link(&mut self, path: &std::path::Path) -> std::io::Result<PathBuf> {
        let recorded = self.inner.borrow_mut().target_link(path);
        recorded.unwrap_or_else(|| read_host_link(path))
    }

    fn report_forks(&mut self, client_wants: bool, vforks: bool) -> bool {
        self.inner.borrow_mut().report_forks(client_wants, vforks)
    }

    fn report_execs(&mut self, client_wants: bool) -> bool {
        self.inner.borrow_mut().report_execs(client_wants)
    }

    fn resolve_fork(&mut self, detach: i32) -> TargetResult<Option<i32>> {
        let now = self.inner.borrow_mut().resolve_fork(detach)?;
        if let Some(pid) = now {
            // The debugger follows this process now (it was told of the fork).
            self.pid = pid;
        }
        Ok(now)
    }

    fn held_fork_child(&self) -> Option<i32> {
        self.inner.borrow().held_fork_child()
    }

    fn held_child(&mut self, request: HeldChildRequest) -> TargetResult<HeldChildReply> {
        self.inner.borrow_mut().held_child(request)
    }

    fn take_notices(&mut self) -> Vec<Notice> {
        let mut notices = std::mem::take(&mut self.notices);
        notices.extend(self.inner.borrow_mut().take_notices());
        notices
    }

    fn support_breakpoints(&mut self) -> Option<&mut dyn Breakpoints> {
        Some(self)
    }

    fn support_reverse(&mut self) -> Option<&mut dyn ReverseExecution> {
        Some(self)
    }

    fn support_watchpoints(&mut self) -> Option<&mut dyn Watchpoints> {
        Some(self)
    }
}

/// Answers GDB's and LLDB's `?` (why the target stopped) with the signal that ended a
/// recording, in the thread it killed, when the cursor is at that end (gdbstub would answer a
/// plain trap in its first thread); otherwise gdbstub answers.
pub fn install_stop_query(router: &mut super::Router, target: &RecordingTarget) {
    let shared = target.shared();
    router.intercept(b"?", move |session, state, packet| {
        let pid = session.target().pid();
        if packet != b"?" {
            return super::Intercept::Pass;
        }
        let Some((sig, tid)) = shared.borrow().fatal_stop() else {
            return super::Intercept::Pass;
        };
        let sig = super::linux_to_gdb_signal(sig);
        let thread = if state.client_features.iter().any(|f| f == "multiprocess+") {
            format!("p{pid:x}.{tid:x}")
        } else {
            format!("{tid:x}")
        };
        super::Intercept::Reply(format!("T{sig:02x}thread:{thread};").into_bytes())
    });
}

/// Write watchpoints, served from the state log (which records what every instruction wrote):
/// reverse-continue stops before the last earlier write, forward replay and live recording
/// after the next one. Without a state log (PC-only past: what was written is not known) only
/// a backend that checks accesses in the running program (QEMU's plugin) takes them, of every
/// kind, for the present. Anything else is refused (read/access watchpoints with a state log:
/// reads are not recorded), so GDB reports that it could not insert them instead of waiting
/// for a stop that would never be reported.
impl Watchpoints for RecordingTarget {
    fn add_watchpoint(&mut self, addr: u64, len: u64, kind: WatchKind) -> TargetResult<bool> {
        Ok(self.inner.borrow_mut().add_watch(addr, len, kind))
    }

    fn remove_watchpoint(&mut self, addr: u64, len: u64, kind: WatchKind) -> TargetResult<bool> {
        Ok(self.inner.borrow_mut().remove_watch(addr, len, kind))
    }
}

impl Breakpoints for RecordingTarget {
    fn add_breakpoint(&mut self, addr: u64) -> TargetResult<()> {
        self.inner.borrow_mut().add_breakpoint(addr)
    }

    fn remove_breakpoint(&mut self, addr: u64) -> TargetResult<bool> {
        self.inner.borrow_mut().remove_breakpoint(addr)
    }

    fn breakpoint_addrs(&self) -> Vec<u64> {
        self.inner.borrow().breakpoints()
    }
}

impl ReverseExecution for RecordingTarget {
    fn resume_reverse(&mut self, how: ReverseResume) -> TargetResult<()> {
        self.inner.borrow_mut().reverse(how)
    }
}
