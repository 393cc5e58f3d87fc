//! [`GdbStubAdapter`]: gdbstub's `Target` over a ptrewind [`Target`] — the adapter between
//! gdbstub's traits and ptrewind's (registers, memory, breakpoints, resumption, host I/O,
//! monitor commands). One per served program, kept across debugger connections.

use super::arch::{GdbRegId, GdbRegisters, X86_64Linux, copy_range, target_xml};
use super::monitor::MonitorRegistry;
use super::svr4::read_library_list;
use crate::target::regs::GDB_REGS;
use crate::target::{Resume, ReverseResume, StepRange, StopEvent, Target, TargetError, WatchKind};
use gdbstub::common::{Pid, Signal, Tid};
use gdbstub::stub::MultiThreadStopReason;
use gdbstub::target::ext::base::BaseOps;
use gdbstub::target::ext::base::multithread::{
    MultiThreadBase, MultiThreadRangeStepping, MultiThreadRangeSteppingOps, MultiThreadResume,
    MultiThreadResumeOps, MultiThreadSchedulerLocking, MultiThreadSchedulerLockingOps,
    MultiThreadSingleStep, MultiThreadSingleStepOps,
};
use gdbstub::target::ext::base::reverse_exec::{
    ReplayLogPosition, ReverseCont, ReverseContOps, ReverseStep, ReverseStepOps,
};
use gdbstub::target::ext::base::single_register_access::{
    SingleRegisterAccess, SingleRegisterAccessOps,
};
use gdbstub::target::ext::breakpoints::{
    Breakpoints, BreakpointsOps, HwWatchpoint, HwWatchpointOps, SwBreakpoint, SwBreakpointOps,
    WatchKind as GsWatchKind,
};
use gdbstub::target::{TargetError as GsError, TargetResult as GsResult};

/// Linux signal number → GDB protocol signal number (`enum gdb_signal`).
pub fn linux_to_gdb_signal(sig: i32) -> u8 {
    const TABLE: [u8; 32] = [
        0, 1, 2, 3, 4, 5, 6, 10, 8, 9, 30, 11, 31, 13, 14, 15, 143, 20, 19, 17, 18, 21, 22, 16, 24,
        25, 26, 27, 28, 23, 32, 12,
    ];
    match sig {
        0..=31 => TABLE[sig as usize],
        32 => 77,
        33..=63 => (45 + (sig - 33)) as u8,
        64 => 78,
        _ => 143, // GDB_SIGNAL_UNKNOWN
    }
}

/// GDB protocol signal number → Linux signal number, if Linux has it.
pub fn gdb_to_linux_signal(sig: u8) -> Option<i32> {
    if sig == 0 {
        return None;
    }
    (1..=64).find(|&l| linux_to_gdb_signal(l) == sig && !(l == 16 && sig == 143))
}

/// Converts a target stop into the stop reply gdbstub sends.
pub fn stop_reason(tid: i32, ev: StopEvent) -> MultiThreadStopReason<u64> {
    let tid = thread_id(tid);
    match ev {
        StopEvent::Breakpoint { .. } => MultiThreadStopReason::SwBreak(tid),
        StopEvent::Watch { addr, kind } => MultiThreadStopReason::Watch {
            tid,
            kind: match kind {
                WatchKind::Write => GsWatchKind::Write,
                WatchKind::Read => GsWatchKind::Read,
                WatchKind::Access => GsWatchKind::ReadWrite,
            },
            addr,
        },
        StopEvent::Step => MultiThreadStopReason::SignalWithThread {
            tid,
            signal: Signal::SIGTRAP,
        },
        StopEvent::Signal(s) => MultiThreadStopReason::SignalWithThread {
            tid,
            signal: Signal(linux_to_gdb_signal(s)),
        },
        // The program stays stopped at its end: a trap for an exit, the fatal signal for a
        // death by one (as GDB says "received signal SIGKILL" before the end; the notice says
        // the rest); the exit itself is reported when it is resumed.
        StopEvent::Exiting { signal } => MultiThreadStopReason::SignalWithThread {
            tid,
            signal: signal.map_or(Signal::SIGTRAP, |s| Signal(linux_to_gdb_signal(s))),
        },
        // The router rewrites this reply: gdbstub names the child with the parent's pid.
        StopEvent::Forked { child, vfork } => {
            let new_tid = std::num::NonZeroUsize::new(child.max(1) as usize)
                .unwrap_or(std::num::NonZeroUsize::MIN);
            if vfork {
                MultiThreadStopReason::VFork {
                    cur_tid: tid,
                    new_tid,
                }
            } else {
                MultiThreadStopReason::Fork {
                    cur_tid: tid,
                    new_tid,
                }
            }
        }
        StopEvent::VForkDone => MultiThreadStopReason::VForkDone(tid),
        // gdbstub 0.7 has no exec stop reason: the router writes the `exec:` reply over this.
        StopEvent::Exec => MultiThreadStopReason::SignalWithThread {
            tid,
            signal: Signal::SIGTRAP,
        },
        StopEvent::Exited(code) => MultiThreadStopReason::Exited(code as u8),
        StopEvent::Killed(s) => MultiThreadStopReason::Terminated(Signal(linux_to_gdb_signal(s))),
        StopEvent::HistoryEnd { at_begin } => MultiThreadStopReason::ReplayLog {
            tid: Some(tid),
            pos: if at_begin {
                ReplayLogPosition::Begin
            } else {
                ReplayLogPosition::End
            },
        },
    }
}

fn thread_id(tid: i32) -> Tid {
    Tid::new(tid.max(1) as usize).unwrap_or(Tid::MIN)
}

/// The adapter gdbstub drives: the target, its monitor commands, the pending resume request
/// and the files a debugger opened through host I/O.
pub struct GdbStubAdapter {
    target: Box<dyn Target>,
    monitors: MonitorRegistry,
    resume: Option<Resume>,
    /// The range of a range step (`vCont;r`), with `resume` its step.
    step_range: Option<StepRange>,
    avx: Option<bool>,
    attached: bool,
    /// Files the debugger opened through host I/O (`vFile:open`).
    pub(super) host_files: super::host_io::OpenFiles,
    /// Fork events are reported to this connection's debugger (`fork-events+`).
    fork_events: bool,
    /// Vfork events too (`vfork-events+`, `vforkdone-events+`).
    vfork_events: bool,
    /// The process the debugger's last `vCont`/`Hc` named (`pPID.TID`), to tell which side
    /// of an unsettled fork it resumes.
    pub(super) resumed_pid: Option<i32>,
    /// Processes let go at a fork that the debugger may still name (`Hg pPID.TID`).
    pub(super) gone_pids: Vec<i32>,
    /// The breakpoints the held fork child has in the debugger's view: those of the parent at
    /// the fork (its memory is a copy), minus what the debugger removed from it, plus what it
    /// inserted in it (`z`/`Z` with the child as the general thread). GDB removes them all
    /// at the fork and inserts them again if it follows the child; LLDB leaves them.
    pub(super) child_breakpoints: Option<std::collections::BTreeSet<u64>>,
    /// The last fork reported was a vfork.
    vfork_reported: bool,
    /// The held fork child the debugger keeps as a process of its own (GDB's
    /// `detach-on-fork off`, resuming the parent): stopped until it runs, kills or detaches it.
    pub(super) kept_child: Option<i32>,
    /// Notices of the server's own (e.g. a fork it settled itself), sent with the target's.
    pub(super) notices: Vec<crate::target::Notice>,
    /// The thread GDB has selected, for a `bs` whose `Hc` named no thread: GDB's default
    /// scheduler locking resumes the whole process (`Hc pPID.0`, "any thread") and relies on
    /// the stub stepping its general thread (`Hg`), as gdbserver does; gdbstub would step the
    /// first listed one. Set by the router for that one packet.
    pub(super) wildcard_step_thread: Option<i32>,
}

impl std::fmt::Debug for GdbStubAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GdbStubAdapter")
            .field("pid", &self.target.pid())
            .field("monitors", &self.monitors)
            .field("resume", &self.resume)
            .finish()
    }
}

impl GdbStubAdapter {
    /// A session over `target` with the built-in monitor commands.
    pub fn new(target: Box<dyn Target>) -> Self {
        GdbStubAdapter {
            target,
            monitors: MonitorRegistry::with_builtins(),
            resume: None,
            step_range: None,
            avx: None,
            attached: false,
            host_files: Default::default(),
            fork_events: false,
            vfork_events: false,
            resumed_pid: None,
            gone_pids: Vec::new(),
            child_breakpoints: None,
            vfork_reported: false,
            kept_child: None,
            wildcard_step_thread: None,
            notices: Vec::new(),
        }
    }

    /// Sets whether fork events (and vfork events) are reported to the debugger of this
    /// connection (asked of the target after the debugger's `qSupported`, before gdbstub
    /// answers it).
    pub fn set_fork_events(&mut self, on: bool, vforks: bool) {
        self.fork_events = on;
        self.vfork_events = vforks;
    }

    /// Whether fork events are reported to this connection's debugger.
    pub fn fork_events(&self) -> bool {
        self.fork_events
    }

    /// A fork was reported: the child starts with the parent's breakpoints.
    pub(super) fn fork_reported(&mut self, vfork: bool) {
        self.vfork_reported = vfork;
        let addrs = self
            .target
            .support_breakpoints()
            .map(|bp| bp.breakpoint_addrs())
            .unwrap_or_default();
        self.child_breakpoints = Some(addrs.into_iter().collect());
    }

    /// Settles the held fork, letting `detach` go (see [`Target::resolve_fork`]); when the
    /// child is kept, the breakpoints become the child's as the debugger sees them.
    pub(super) fn settle_fork(&mut self, detach: i32) -> Result<Option<i32>, TargetError> {
        let parent = self.target.pid();
        let now = self.target.resolve_fork(detach)?;
        let child_bps = self.child_breakpoints.take();
        if let (Some(now), Some(want)) = (now, child_bps)
            && now != parent
            && let Some(bp) = self.target.support_breakpoints()
        {
            for addr in bp.breakpoint_addrs() {
                if !want.contains(&addr) {
                    let _ = bp.remove_breakpoint(addr);
                }
            }
            for addr in want {
                let _ = bp.add_breakpoint(addr);
            }
        }
        if now.is_some() {
            // GDB names only the last few (a program that forks in a loop must not grow this).
            if self.gone_pids.len() >= 64 {
                self.gone_pids.remove(0);
            }
            self.gone_pids.push(detach);
        }
        Ok(now)
    }

    /// After an exec: every breakpoint belonged to the old program (GDB marks them out
    /// without removing them and inserts the new program's), so none is kept.
    pub(super) fn forget_breakpoints(&mut self) {
        if let Some(bp) = self.target.support_breakpoints() {
            for addr in bp.breakpoint_addrs() {
                let _ = bp.remove_breakpoint(addr);
            }
        }
    }

    /// A resume while a reported fork is still unsettled: the debugger kept both processes
    /// (GDB's `detach-on-fork off`), which one recording cannot serve. The side it resumes
    /// goes on (the parent unless it named the child), the other is detached, and the user
    /// is told.
    fn settle_fork_on_resume(&mut self) -> Result<(), TargetError> {
        let Some(child) = self.target.held_fork_child() else {
            return Ok(());
        };
        if self.kept_child == Some(child) {
            // Kept stopped while the recorded process runs (the debugger's choice).
            return Ok(());
        }
        let parent = self.target.pid();
        if self.resumed_pid == Some(parent) && !self.vfork_reported {
            // GDB resumes the parent alone (`schedule-multiple off`): as natively, the child
            // stays stopped, its registers and memory served as its own, until the debugger
            // runs, kills or detaches it (`router::forks`).
            self.kept_child = Some(child);
            self.notices.push(crate::target::Notice::ForkChildKept {
                recorded: parent,
                child,
            });
            return Ok(());
        }
        let (kept, detached) = if self.resumed_pid == Some(child) {
            (child, parent)
        } else {
            (parent, child)
        };
        self.settle_fork(detached)?;
        if self.vfork_reported && kept == child {
            // GDB following a vfork child resumes it first and detaches the parent once the
            // child has exec'd or exited: that is `detach-on-fork on`, not a refusal.
            return Ok(());
        }
        self.notices
            .push(crate::target::Notice::BothForkSidesRefused { kept, detached });
        Ok(())
    }

    /// Marks the program as attached to (not started by us): GDB then detaches instead of
    /// killing it when it quits.
    pub fn set_attached(&mut self, attached: bool) {
        self.attached = attached;
    }

    /// True if the program was attached to rather than started by us.
    pub fn is_attached(&self) -> bool {
        self.attached
    }

    /// The target.
    pub fn target(&self) -> &dyn Target {
        self.target.as_ref()
    }

    /// The target, mutably.
    pub fn target_mut(&mut self) -> &mut dyn Target {
        self.target.as_mut()
    }

    /// The monitor command registry (add commands here).
    pub fn monitors_mut(&mut self) -> &mut MonitorRegistry {
        &mut self.monitors
    }

    /// Runs a monitor command line and returns its console text.
    pub fn run_monitor(&mut self, line: &str) -> String {
        self.monitors.run(self.target.as_mut(), line)
    }
}

fn non_fatal(e: TargetError) -> GsError<TargetError> {
    match e {
        TargetError::Memory { .. } => GsError::Errno(libc::EFAULT as u8),
        TargetError::Exited { .. } => GsError::Errno(libc::ESRCH as u8),
        _ => GsError::Errno(libc::EIO as u8),
    }
}

impl gdbstub::target::Target for GdbStubAdapter {
    type Arch = X86_64Linux;
    type Error = TargetError;

    fn base_ops(&mut self) -> BaseOps<'_, Self::Arch, Self::Error> {
        BaseOps::MultiThread(self)
    }

    fn support_breakpoints(&mut self) -> Option<BreakpointsOps<'_, Self>> {
        Some(self)
    }

    fn support_monitor_cmd(
        &mut self,
    ) -> Option<gdbstub::target::ext::monitor_cmd::MonitorCmdOps<'_, Self>> {
        Some(self)
    }

    fn support_exec_file(
        &mut self,
    ) -> Option<gdbstub::target::ext::exec_file::ExecFileOps<'_, Self>> {
        Some(self)
    }

    fn support_auxv(&mut self) -> Option<gdbstub::target::ext::auxv::AuxvOps<'_, Self>> {
        Some(self)
    }

    fn support_libraries_svr4(
        &mut self,
    ) -> Option<gdbstub::target::ext::libraries::LibrariesSvr4Ops<'_, Self>> {
        Some(self)
    }

    fn support_target_description_xml_override(
        &mut self,
    ) -> Option<
        gdbstub::target::ext::target_description_xml_override::TargetDescriptionXmlOverrideOps<
            '_,
            Self,
        >,
    > {
        Some(self)
    }

    fn support_host_io(&mut self) -> Option<gdbstub::target::ext::host_io::HostIoOps<'_, Self>> {
        Some(self)
    }

    fn support_extended_mode(
        &mut self,
    ) -> Option<gdbstub::target::ext::extended_mode::ExtendedModeOps<'_, Self>> {
        // Implemented (minimally) so gdbstub reports the real pid instead of a fake `p1`;
        // starting or attaching other processes from GDB is refused.
        Some(self)
    }

    // Forks and vforks are reported when the target holds them for the debugger (the ptrace
    // backend without `record --follow-fork child`), and a vfork's end.
    fn use_fork_stop_reason(&self) -> bool {
        self.fork_events
    }

    fn use_vfork_stop_reason(&self) -> bool {
        self.vfork_events
    }

    fn use_vforkdone_stop_reason(&self) -> bool {
        self.vfork_events
    }
}

impl MultiThreadBase for GdbStubAdapter {
    fn read_registers(&mut self, regs: &mut GdbRegisters, tid: Tid) -> GsResult<(), Self> {
        regs.regs = self
            .target
            .read_thread_registers(tid.get() as i32)
            .map_err(non_fatal)?;
        self.avx = Some(regs.regs.has_avx());
        Ok(())
    }

    fn write_registers(&mut self, regs: &GdbRegisters, _tid: Tid) -> GsResult<(), Self> {
        let mut live = self.target.read_registers().map_err(non_fatal)?;
        let mut off = 0;
        for (num, desc) in GDB_REGS.iter().enumerate() {
            let Some(bytes) = regs.written.get(off..off + desc.size) else {
                break;
            };
            if !live.set_gdb_reg(num, bytes) {
                break;
            }
            off += desc.size;
        }
        if off != regs.written.len() {
            return Err(GsError::Errno(libc::EINVAL as u8));
        }
        self.target.write_registers(&live).map_err(non_fatal)
    }

    fn support_single_register_access(&mut self) -> Option<SingleRegisterAccessOps<'_, Tid, Self>> {
        Some(self)
    }

    fn read_addrs(&mut self, start: u64, data: &mut [u8], _tid: Tid) -> GsResult<usize, Self> {
        self.target.read_memory(start, data).map_err(non_fatal)
    }

    fn write_addrs(&mut self, start: u64, data: &[u8], _tid: Tid) -> GsResult<(), Self> {
        self.target.write_memory(start, data).map_err(non_fatal)
    }

    fn list_active_threads(
        &mut self,
        thread_is_active: &mut dyn FnMut(Tid),
    ) -> Result<(), Self::Error> {
        for tid in self.target.thread_ids() {
            thread_is_active(thread_id(tid));
        }
        Ok(())
    }

    fn support_resume(&mut self) -> Option<MultiThreadResumeOps<'_, Self>> {
        Some(self)
    }
}

impl SingleRegisterAccess<Tid> for GdbStubAdapter {
    fn read_register(&mut self, tid: Tid, reg: GdbRegId, buf: &mut [u8]) -> GsResult<usize, Self> {
        let regs = self
            .target
            .read_thread_registers(tid.get() as i32)
            .map_err(non_fatal)?;
        if regs.unavailable.contains(reg.0) {
            // gdbstub answers `xx` x the register size: "valid but unavailable".
            return Ok(0);
        }
        let mut n = 0;
        regs.gdb_layout(|num, bytes| {
            if num == reg.0 && bytes.len() <= buf.len() {
                buf[..bytes.len()].copy_from_slice(bytes);
                n = bytes.len();
            }
        });
        if n == 0 {
            return Err(GsError::Errno(libc::EINVAL as u8));
        }
        Ok(n)
    }

    fn write_register(&mut self, _tid: Tid, reg: GdbRegId, val: &[u8]) -> GsResult<(), Self> {
        let mut regs = self.target.read_registers().map_err(non_fatal)?;
        if !regs.set_gdb_reg(reg.0, val) {
            return Err(GsError::Errno(libc::EINVAL as u8));
        }
        self.target.write_registers(&regs).map_err(non_fatal)
    }
}

impl MultiThreadResume for GdbStubAdapter {
    fn resume(&mut self) -> Result<(), Self::Error> {
        let how = self.resume.unwrap_or(Resume::Continue { signal: None });
        self.resume = Some(how);
        self.settle_fork_on_resume()?;
        match self.step_range.take() {
            Some(range) if matches!(how, Resume::Step { .. }) => {
                self.target.resume_range(how, range)
            }
            _ => self.target.resume(how),
        }
    }

    fn clear_resume_actions(&mut self) -> Result<(), Self::Error> {
        self.resume = None;
        self.step_range = None;
        Ok(())
    }

    fn set_resume_action_continue(
        &mut self,
        _tid: Tid,
        signal: Option<Signal>,
    ) -> Result<(), Self::Error> {
        // A step request for our thread wins over a wildcard continue.
        if !matches!(self.resume, Some(Resume::Step { .. })) {
            self.resume = Some(Resume::Continue {
                signal: signal.and_then(|s| gdb_to_linux_signal(s.0)),
            });
        }
        Ok(())
    }

    fn support_single_step(&mut self) -> Option<MultiThreadSingleStepOps<'_, Self>> {
        Some(self)
    }

    fn support_scheduler_locking(&mut self) -> Option<MultiThreadSchedulerLockingOps<'_, Self>> {
        Some(self)
    }

    fn support_range_step(&mut self) -> Option<MultiThreadRangeSteppingOps<'_, Self>> {
        Some(self)
    }

    fn support_reverse_step(&mut self) -> Option<ReverseStepOps<'_, Tid, Self>> {
        if self.target.support_reverse().is_some() {
            Some(self)
        } else {
            None
        }
    }

    fn support_reverse_cont(&mut self) -> Option<ReverseContOps<'_, Tid, Self>> {
        if self.target.support_reverse().is_some() {
            Some(self)
        } else {
            None
        }
    }
}

impl GdbStubAdapter {
    fn reverse(&mut self, how: ReverseResume) -> Result<(), TargetError> {
        match self.target.support_reverse() {
            Some(rev) => rev.resume_reverse(how),
            None => Err(TargetError::Unsupported("reverse execution")),
        }
    }
}

impl ReverseStep<Tid> for GdbStubAdapter {
    fn reverse_step(&mut self, tid: Tid) -> Result<(), Self::Error> {
        // The thread GDB named (`Hc`) steps; under a wildcard `Hc`, its general thread.
        let tid = self.wildcard_step_thread.take().unwrap_or(tid.get() as i32);
        self.target.select_thread(tid);
        self.reverse(ReverseResume::Step)
    }
}

impl ReverseCont<Tid> for GdbStubAdapter {
    fn reverse_cont(&mut self) -> Result<(), Self::Error> {
        self.reverse(ReverseResume::Continue)
    }
}

impl MultiThreadSingleStep for GdbStubAdapter {
    fn set_resume_action_step(
        &mut self,
        tid: Tid,
        signal: Option<Signal>,
    ) -> Result<(), Self::Error> {
        self.target.select_thread(tid.get() as i32);
        self.step_range = None;
        self.resume = Some(Resume::Step {
            signal: signal.and_then(|s| gdb_to_linux_signal(s.0)),
            // Until the packet turns out to have no wildcard continue (scheduler locking).
            others: true,
        });
        Ok(())
    }
}

impl MultiThreadRangeStepping for GdbStubAdapter {
    fn set_resume_action_range_step(
        &mut self,
        tid: Tid,
        start: u64,
        end: u64,
    ) -> Result<(), Self::Error> {
        // A step repeated while the PC stays in the line GDB steps (`next`, `step`): one stop
        // for the line instead of one per instruction. An empty range is a plain step.
        self.set_resume_action_step(tid, None)?;
        self.step_range = (start < end).then_some(StepRange { start, end });
        Ok(())
    }
}

impl MultiThreadSchedulerLocking for GdbStubAdapter {
    fn set_resume_action_scheduler_lock(&mut self) -> Result<(), Self::Error> {
        // The other threads stay where they are (a step over a breakpoint, or GDB's
        // `scheduler-locking`).
        if let Some(Resume::Step { others, .. }) = &mut self.resume {
            *others = false;
        }
        Ok(())
    }
}

impl Breakpoints for GdbStubAdapter {
    fn support_sw_breakpoint(&mut self) -> Option<SwBreakpointOps<'_, Self>> {
        Some(self)
    }

    fn support_hw_watchpoint(&mut self) -> Option<HwWatchpointOps<'_, Self>> {
        Some(self)
    }
}

fn watch_kind(kind: GsWatchKind) -> WatchKind {
    match kind {
        GsWatchKind::Write => WatchKind::Write,
        GsWatchKind::Read => WatchKind::Read,
        GsWatchKind::ReadWrite => WatchKind::Access,
    }
}

/// `Z2`–`Z4`: the target decides (a recording with a state log serves write watchpoints);
/// anything it refuses is an error reply, so GDB says it could not insert the watchpoint rather
/// than trusting a stop that would never come.
impl HwWatchpoint for GdbStubAdapter {
    fn add_hw_watchpoint(
        &mut self,
        addr: u64,
        len: u64,
        kind: GsWatchKind,
    ) -> GsResult<bool, Self> {
        match self.target.support_watchpoints() {
            Some(w) => w
                .add_watchpoint(addr, len, watch_kind(kind))
                .map_err(non_fatal),
            None => Ok(false),
        }
    }

    fn remove_hw_watchpoint(
        &mut self,
        addr: u64,
        len: u64,
        kind: GsWatchKind,
    ) -> GsResult<bool, Self> {
        match self.target.support_watchpoints() {
            Some(w) => w
                .remove_watchpoint(addr, len, watch_kind(kind))
                .map_err(non_fatal),
            None => Ok(false),
        }
    }
}

impl SwBreakpoint for GdbStubAdapter {
    fn add_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> GsResult<bool, Self> {
        match self.target.support_breakpoints() {
            Some(bp) => Ok(bp.add_breakpoint(addr).is_ok()),
            None => Ok(false),
        }
    }

    fn remove_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> GsResult<bool, Self> {
        match self.target.support_breakpoints() {
            Some(bp) => bp.remove_breakpoint(addr).map_err(non_fatal),
            None => Ok(false),
        }
    }
}

impl gdbstub::target::ext::monitor_cmd::MonitorCmd for GdbStubAdapter {
    fn handle_monitor_cmd(
        &mut self,
        cmd: &[u8],
        mut out: gdbstub::target::ext::monitor_cmd::ConsoleOutput<'_>,
    ) -> Result<(), Self::Error> {
        let line = String::from_utf8_lossy(cmd).into_owned();
        let text = self.run_monitor(&line);
        out.write_raw(text.as_bytes());
        Ok(())
    }
}

impl gdbstub::target::ext::extended_mode::ExtendedMode for GdbStubAdapter {
    fn run(
        &mut self,
        _filename: Option<&[u8]>,
        _args: gdbstub::target::ext::extended_mode::Args<'_, '_>,
    ) -> GsResult<Pid, Self> {
        Err(GsError::Errno(libc::EPERM as u8))
    }

    fn attach(&mut self, _pid: Pid) -> GsResult<(), Self> {
        Err(GsError::Errno(libc::EPERM as u8))
    }

    fn query_if_attached(
        &mut self,
        _pid: Pid,
    ) -> GsResult<gdbstub::target::ext::extended_mode::AttachKind, Self> {
        Ok(if self.attached {
            gdbstub::target::ext::extended_mode::AttachKind::Attach
        } else {
            gdbstub::target::ext::extended_mode::AttachKind::Run
        })
    }

    fn kill(
        &mut self,
        _pid: Option<Pid>,
    ) -> GsResult<gdbstub::target::ext::extended_mode::ShouldTerminate, Self> {
        self.target.kill().map_err(GsError::Fatal)?;
        Ok(gdbstub::target::ext::extended_mode::ShouldTerminate::Yes)
    }

    fn restart(&mut self) -> Result<(), Self::Error> {
        // `R` is only sent in extended-remote mode, which we do not offer.
        Ok(())
    }

    fn support_current_active_pid(
        &mut self,
    ) -> Option<gdbstub::target::ext::extended_mode::CurrentActivePidOps<'_, Self>> {
        Some(self)
    }
}

impl gdbstub::target::ext::extended_mode::CurrentActivePid for GdbStubAdapter {
    fn current_active_pid(&mut self) -> Result<Pid, Self::Error> {
        Ok(Pid::new(self.target.pid().max(1) as usize).unwrap_or(Pid::MIN))
    }
}

impl gdbstub::target::ext::exec_file::ExecFile for GdbStubAdapter {
    fn get_exec_file(
        &self,
        _pid: Option<Pid>,
        offset: u64,
        length: usize,
        buf: &mut [u8],
    ) -> GsResult<usize, Self> {
        let path = self
            .target
            .exec_path()
            .ok_or(GsError::Errno(libc::ENOENT as u8))?;
        Ok(copy_range(
            path.as_os_str().as_encoded_bytes(),
            offset,
            length,
            buf,
        ))
    }
}

impl gdbstub::target::ext::auxv::Auxv for GdbStubAdapter {
    fn get_auxv(&self, offset: u64, length: usize, buf: &mut [u8]) -> GsResult<usize, Self> {
        let auxv = self.target.auxv().map_err(non_fatal)?;
        Ok(copy_range(&auxv, offset, length, buf))
    }
}

impl gdbstub::target::ext::libraries::LibrariesSvr4 for GdbStubAdapter {
    fn get_libraries_svr4(
        &self,
        offset: u64,
        length: usize,
        buf: &mut [u8],
    ) -> GsResult<usize, Self> {
        let xml = self
            .target
            .saved_library_list()
            .unwrap_or_else(|| read_library_list(self.target.as_ref()).to_xml());
        Ok(copy_range(xml.as_bytes(), offset, length, buf))
    }
}

impl gdbstub::target::ext::target_description_xml_override::TargetDescriptionXmlOverride
    for GdbStubAdapter
{
    fn target_description_xml(
        &self,
        annex: &[u8],
        offset: u64,
        length: usize,
        buf: &mut [u8],
    ) -> GsResult<usize, Self> {
        if annex != b"target.xml" {
            return Err(GsError::Errno(libc::ENOENT as u8));
        }
        // `avx` is learnt on the first register read; before that, ask the CPU directly.
        let avx = self.avx.unwrap_or_else(cpu_has_avx_state);
        Ok(copy_range(target_xml(avx).as_bytes(), offset, length, buf))
    }
}

fn cpu_has_avx_state() -> bool {
    crate::target::regs::avx_enabled()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_numbers_follow_gdb() {
        assert_eq!(linux_to_gdb_signal(libc::SIGSEGV), 11);
        assert_eq!(linux_to_gdb_signal(libc::SIGUSR1), 30);
        assert_eq!(linux_to_gdb_signal(libc::SIGUSR2), 31);
        assert_eq!(linux_to_gdb_signal(libc::SIGCHLD), 20);
        assert_eq!(linux_to_gdb_signal(libc::SIGBUS), 10);
        assert_eq!(linux_to_gdb_signal(libc::SIGSYS), 12);
        assert_eq!(linux_to_gdb_signal(libc::SIGSTOP), 17);
        assert_eq!(linux_to_gdb_signal(libc::SIGIO), 23);
        assert_eq!(linux_to_gdb_signal(34), 46);
        for linux in 1..=64 {
            if linux == 16 {
                continue; // SIGSTKFLT has no GDB number
            }
            assert_eq!(gdb_to_linux_signal(linux_to_gdb_signal(linux)), Some(linux));
        }
        assert_eq!(gdb_to_linux_signal(0), None);
    }
}
