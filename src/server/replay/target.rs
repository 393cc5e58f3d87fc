//! [`RecordingTarget`]: the ptrewind [`Target`] over the reverse-execution core — live
//! registers and memory at the present, the past as the [`Recorder`] rebuilds it, breakpoints by
//! address, and reverse resumption.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{LiveCapture, Recorder, Running, SoftCapture};
use crate::capture::soft::SoftRecorder;
use crate::target::{
    Breakpoints, Notice, PtraceTarget, Resume, ReverseExecution, ReverseResume, StopEvent, Target,
    TargetError, TargetResult, WatchKind, Watchpoints, X86Registers,
};

/// A process recorded by a capture backend, or a recording replayed offline, with reverse
/// execution (see the module docs). Cheap handle on shared state: [`RecordingTarget::shared`]
/// gives the state to monitor commands.
#[derive(Debug, Clone)]
pub struct RecordingTarget {
    inner: Rc<RefCell<Recorder>>,
    pid: i32,
    exe: Option<PathBuf>,
    interrupt: Arc<AtomicBool>,
}

impl RecordingTarget {
    /// Wraps a software recorder over a ptrace target. With its state log on, registers and
    /// memory are rebuilt in the past; without, the past is served PC-only.
    pub fn new(rec: SoftRecorder<PtraceTarget>) -> TargetResult<Self> {
        let record_wanted = rec.is_recording();
        Self::with_capture(Box::new(SoftCapture::new(rec)), record_wanted)
    }

    /// Wraps any live capture whose process is stopped where recording starts.
    pub fn with_capture(mut live: Box<dyn LiveCapture>, record_wanted: bool) -> TargetResult<Self> {
        let pid = Target::pid(live.ptrace());
        let exe = live.ptrace().exec_path();
        let mut r = Recorder::new(live, record_wanted)?;
        // Index what was recorded before GDB connects (nothing when recording starts at main).
        r.sync_history();
        Ok(Self::from_recorder(r, pid, exe))
    }

    pub(super) fn from_recorder(r: Recorder, pid: i32, exe: Option<PathBuf>) -> Self {
        let interrupt = Arc::clone(&r.interrupt);
        RecordingTarget {
            inner: Rc::new(RefCell::new(r)),
            pid,
            exe,
            interrupt,
        }
    }

    /// The shared recording state (for monitor commands).
    pub fn shared(&self) -> Rc<RefCell<Recorder>> {
        Rc::clone(&self.inner)
    }
}

impl Target for RecordingTarget {
    fn pid(&self) -> i32 {
        self.pid
    }

    fn exec_path(&self) -> Option<PathBuf> {
        self.exe.clone()
    }

    fn read_registers(&mut self) -> TargetResult<X86Registers> {
        let mut r = self.inner.borrow_mut();
        if r.exited.is_some() {
            return Err(TargetError::Exited { pid: self.pid });
        }
        match r.cursor {
            None => r.live()?.ptrace().read_registers(),
            Some(n) => r.past_registers(n),
        }
    }

    fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()> {
        let mut r = self.inner.borrow_mut();
        if r.cursor.is_some() {
            return Err(TargetError::Unsupported(
                "changing registers in the past (go to the present first: monitor goto end)",
            ));
        }
        r.live()?.ptrace().write_registers(regs)
    }

    fn read_memory(&self, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        let mut r = self.inner.borrow_mut();
        let Some(pos) = r.cursor else {
            return Target::read_memory(r.live()?.ptrace(), addr, buf);
        };
        if !r.has_state_log() {
            return r.pc_only_memory(pos, addr, buf);
        }
        let live = r.live()?;
        let n = Target::read_memory(live.ptrace(), addr, buf)?;
        if let Some(log) = live.state_log() {
            log.memory_at(pos as usize, addr, &mut buf[..n]);
        }
        Ok(n)
    }

    fn write_memory(&mut self, addr: u64, data: &[u8]) -> TargetResult<()> {
        let mut r = self.inner.borrow_mut();
        if r.cursor.is_some() {
            return Err(TargetError::Unsupported(
                "changing memory in the past (go to the present first: monitor goto end)",
            ));
        }
        r.live()?.ptrace().write_memory(addr, data)
    }

    fn resume(&mut self, how: Resume) -> TargetResult<()> {
        self.inner.borrow_mut().resume(how)
    }

    fn wait(&mut self, block: bool) -> TargetResult<Option<StopEvent>> {
        self.inner.borrow_mut().wait(block)
    }

    fn interrupt(&mut self) -> TargetResult<()> {
        self.interrupt.store(true, Ordering::Release);
        let mut r = self.inner.borrow_mut();
        if r.running == Running::Live
            && let Some(live) = r.live.as_mut()
        {
            live.interrupt()?;
        }
        Ok(())
    }

    fn kill(&mut self) -> TargetResult<()> {
        let mut r = self.inner.borrow_mut();
        r.running = Running::Idle;
        match r.live.as_mut() {
            Some(live) => live.ptrace().kill(),
            None => Ok(()),
        }
    }

    fn detach(&mut self) -> TargetResult<()> {
        match self.inner.borrow_mut().live.as_mut() {
            Some(live) => live.ptrace().detach(),
            None => Ok(()),
        }
    }

    fn has_exited(&self) -> bool {
        let mut r = self.inner.borrow_mut();
        if r.exited.is_some() {
            return true;
        }
        r.live.as_mut().is_some_and(|l| l.ptrace().has_exited())
    }

    fn auxv(&self) -> TargetResult<Vec<u8>> {
        let mut r = self.inner.borrow_mut();
        match r.live.as_mut() {
            Some(live) => live.ptrace().auxv(),
            None => Err(TargetError::Unsupported(
                "the auxiliary vector of a replayed recording",
            )),
        }
    }

    fn take_notices(&mut self) -> Vec<Notice> {
        let mut r = self.inner.borrow_mut();
        let mut n = std::mem::take(&mut r.notices);
        if let Some(live) = r.live.as_mut() {
            n.extend(live.ptrace().take_notices());
        }
        n
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

/// Write watchpoints, served from the state log (which records what every instruction wrote):
/// reverse-continue stops before the last earlier write, forward replay and live recording
/// after the next one. Refused without a state log (PC-only past: what was written is not
/// known) and for read/access watchpoints (reads are not recorded), so GDB reports that it
/// could not insert them instead of waiting for a stop that would never be reported.
impl Watchpoints for RecordingTarget {
    fn add_watchpoint(&mut self, addr: u64, len: u64, kind: WatchKind) -> TargetResult<bool> {
        if kind != WatchKind::Write {
            return Ok(false);
        }
        Ok(self.inner.borrow_mut().add_watch(addr, len))
    }

    fn remove_watchpoint(&mut self, addr: u64, len: u64, kind: WatchKind) -> TargetResult<bool> {
        if kind != WatchKind::Write {
            return Ok(false);
        }
        Ok(self.inner.borrow_mut().remove_watch(addr, len))
    }
}

impl Breakpoints for RecordingTarget {
    fn add_breakpoint(&mut self, addr: u64) -> TargetResult<()> {
        let mut r = self.inner.borrow_mut();
        if let Some(live) = r.live.as_mut()
            && let Some(bp) = live.ptrace().support_breakpoints()
        {
            bp.add_breakpoint(addr)?;
        }
        r.bps.insert(addr);
        Ok(())
    }

    fn remove_breakpoint(&mut self, addr: u64) -> TargetResult<bool> {
        let mut r = self.inner.borrow_mut();
        if let Some(live) = r.live.as_mut()
            && let Some(bp) = live.ptrace().support_breakpoints()
        {
            bp.remove_breakpoint(addr)?;
        }
        Ok(r.bps.remove(&addr))
    }

    fn breakpoint_addrs(&self) -> Vec<u64> {
        self.inner.borrow().bps.iter().copied().collect()
    }
}

impl ReverseExecution for RecordingTarget {
    fn resume_reverse(&mut self, how: ReverseResume) -> TargetResult<()> {
        self.inner.borrow_mut().reverse(how)
    }
}
