//! Threads, ptrace events and waits of the ptrace target: clone/fork/vfork/exec/exit events,
//! all-stop (stopping the other threads at a stop), single-thread steps for the recorder.

use super::*;
use std::time::Instant;

impl PtraceTarget {
    pub(super) fn get_event_msg(&self, tid: Pid) -> TargetResult<i32> {
        nix::sys::ptrace::getevent(tid)
            .map(|v| v as i32)
            .map_err(sys("PTRACE_GETEVENTMSG", tid))
    }

    /// Notes why thread `tid`, stopped at its exit event, is exiting: its pending wait status
    /// (`PTRACE_GETEVENTMSG`) says whether a signal ends it. Unreadable (the thread already
    /// gone) counts as an ordinary exit.
    pub(super) fn exit_event(&mut self, tid: Pid) -> StopEvent {
        let status = nix::sys::ptrace::getevent(tid).map(|v| v as i32).ok();
        self.exit_signal = status
            .filter(|&s| libc::WIFSIGNALED(s))
            .map(|s| libc::WTERMSIG(s));
        StopEvent::Exiting {
            signal: self.exit_signal,
        }
    }

    pub(super) fn add_thread(&mut self, tid: i32) {
        self.threads.insert(tid, ThreadInfo::default());
        self.new_threads.push(tid);
        self.thread_stats.created += 1;
        self.thread_stats.peak = self.thread_stats.peak.max(self.threads.len() as u64);
    }

    /// Forgets a thread that ended; the current thread moves to another one if it was that.
    pub(super) fn remove_thread(&mut self, tid: Pid) {
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
    pub(super) fn is_thread_exit(&self, tid: Pid) -> bool {
        if self.threads.len() <= 1 {
            return false;
        }
        let Ok(regs) = nix::sys::ptrace::getregs(tid) else {
            return false;
        };
        if regs.orig_rax == libc::SYS_exit as u64 {
            return true;
        }
        // Ended without calling exit or exit_group itself: maybe by another thread's exec.
        !self.exiting
            && regs.orig_rax != libc::SYS_exit_group as u64
            && self.other_thread_in_exec(tid)
    }

    /// Whether a thread other than `tid` is inside `execve`/`execveat`: the kernel ends every
    /// other thread of the process (SIGKILL, each reporting its exit event) before the new
    /// program starts, and the process goes on in the new program — the leader's end
    /// included. The exec'ing thread shows the call in `/proc/PID/task/TID/syscall` once it
    /// waits for the others to die, which may take a moment on a busy machine: looked at for
    /// up to 100 ms (once per process end: then the process is known to be exiting).
    fn other_thread_in_exec(&self, tid: Pid) -> bool {
        let deadline = Instant::now() + Duration::from_millis(100);
        loop {
            let found = self
                .threads
                .keys()
                .filter(|&&t| t != tid.as_raw())
                .any(|&t| {
                    // The number of the system call the thread is blocked in (or "running").
                    std::fs::read_to_string(format!("/proc/{}/task/{t}/syscall", self.pid))
                        .ok()
                        .and_then(|s| s.split_whitespace().next()?.parse::<i64>().ok())
                        .is_some_and(|n| n == libc::SYS_execve || n == libc::SYS_execveat)
                });
            if found || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Handles a `PTRACE_EVENT_*` stop of thread `tid`. The caller resumes it afterwards.
    pub(super) fn handle_event(&mut self, tid: Pid, event: i32, mode: Resume) -> TargetResult<()> {
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
                let single = self.threads.len() == 1;
                if self.follow_fork_child && !vfork && single {
                    self.follow_child(tid, child)?;
                } else if self.report_forks
                    && (!vfork || self.report_vforks)
                    && self.held_fork.is_none()
                {
                    self.hold_child(tid, child, vfork)?;
                } else {
                    self.release_child(child, vfork)?;
                }
            }
            libc::PTRACE_EVENT_VFORK_DONE if self.vfork_reported => {
                // The reported vfork's child exec'd or exited: the wait ends here.
                self.vfork_reported = false;
                self.vfork_done_report = true;
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
                if self.report_execs {
                    // The debugger is told with a stop and loads the new program itself.
                    self.exec_report = true;
                } else {
                    self.notices.push(Notice::Exec {
                        path: self.exe.clone(),
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Detaches a forked child (stopped at its first stop), with no int3 of ours left in it.
    pub(super) fn release_child(&mut self, child: Pid, vfork: bool) -> TargetResult<()> {
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

    /// Keeps a forked child (stopped at its first stop) traced for the debugger's decision,
    /// with no int3 of ours in its copy of memory: it may be detached at once (the parent
    /// followed) or become the process, whose breakpoints GDB then inserts itself. The parent
    /// may have several threads: the child has one, the copy of `parent`.
    pub(super) fn hold_child(&mut self, parent: Pid, child: Pid, vfork: bool) -> TargetResult<()> {
        if self.inserted && !vfork {
            let mem = open_mem(child)?;
            for (&addr, &orig) in &self.breakpoints {
                let _ = self.write_raw_to(&mem, addr, &[orig]);
            }
        }
        if vfork {
            // The parent stays at the event stop, inside the call, until the debugger lets the
            // child go (it waits for the child's exec or exit): its registers are made those
            // after the call now (the kernel writes the same RAX at the call's exit), so the
            // stop shows the state after the `syscall` instruction.
            let mut regs =
                nix::sys::ptrace::getregs(parent).map_err(sys("PTRACE_GETREGS", parent))?;
            regs.rax = child.as_raw() as u64;
            nix::sys::ptrace::setregs(parent, regs).map_err(sys("PTRACE_SETREGS", parent))?;
            if let Some(t) = self.threads.get_mut(&parent.as_raw()) {
                t.in_vfork_call = true;
            }
            self.vfork_reported = true;
        }
        self.held_fork = Some(HeldFork {
            parent,
            child,
            vfork,
        });
        self.fork_report = Some(child.as_raw());
        Ok(())
    }

    /// The child of a held fork that a recorder's step saw and that is not reported yet
    /// (a full-speed run reports it as its stop, [`StopEvent::Forked`]).
    pub fn take_fork_report(&mut self) -> Option<i32> {
        self.fork_report.take()
    }

    /// The child of the held fork, if one waits for the debugger's decision.
    pub fn held_fork_child(&self) -> Option<i32> {
        self.held_fork.map(|h| h.child.as_raw())
    }

    /// Whether the held fork is a vfork.
    pub fn held_fork_is_vfork(&self) -> bool {
        self.held_fork.is_some_and(|h| h.vfork)
    }

    /// The thread that made the held fork (the child's only thread is its copy).
    pub fn held_fork_parent(&self) -> Option<i32> {
        self.held_fork.map(|h| h.parent.as_raw())
    }

    /// Settles the held fork (see [`PtraceTarget::set_report_forks`]): `detach` names the
    /// side the debugger lets go. The child: it is detached and runs free (the parent goes on
    /// being the process). The parent: it is detached and the child becomes the process, as
    /// with [`set_follow_fork_child`](Self::set_follow_fork_child). `Ok(None)` when no fork
    /// is held or `detach` is neither side; otherwise the process from now on.
    pub fn resolve_fork(&mut self, detach: i32) -> TargetResult<Option<i32>> {
        let Some(h) = self.held_fork else {
            return Ok(None);
        };
        self.ensure_stopped()?;
        if detach == h.child.as_raw() {
            self.held_fork = None;
            self.fork_report = None;
            ptrace_with_signal(libc::PTRACE_DETACH, "PTRACE_DETACH", h.child, None)?;
            Ok(Some(self.pid.as_raw()))
        } else if detach == self.pid.as_raw() {
            self.held_fork = None;
            self.fork_report = None;
            // A vfork's end happens in the parent, which is let go.
            self.vfork_reported = false;
            // Stopped (every thread): no int3 of ours is in the parent's memory.
            let mem = open_mem(h.child)?;
            let mut queued_sigstop = false;
            for (&t, info) in &self.threads {
                if t != h.parent.as_raw() {
                    // A thread that ended meanwhile cannot be detached: nothing to do.
                    let _ = ptrace_with_signal(
                        libc::PTRACE_DETACH,
                        "PTRACE_DETACH",
                        Pid::from_raw(t),
                        None,
                    );
                    queued_sigstop |= info.swallow_sigstop;
                }
            }
            ptrace_with_signal(libc::PTRACE_DETACH, "PTRACE_DETACH", h.parent, None)?;
            if queued_sigstop {
                // A SIGSTOP we sent to stop a thread is still queued for it: once detached it
                // would stop the whole parent; let it run on.
                let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGCONT);
            }
            self.mem = mem;
            self.pid = h.child;
            self.cur = h.child;
            self.threads = BTreeMap::from([(h.child.as_raw(), ThreadInfo::default())]);
            Ok(Some(h.child.as_raw()))
        } else {
            Ok(None)
        }
    }

    /// Serves the debugger's request about the held fork child while it keeps both sides of
    /// the fork (GDB's `detach-on-fork off`; see [`Target::held_child`]): the child stays
    /// stopped where `fork` returned in it until the debugger runs, kills or detaches it.
    ///
    /// [`Target::held_child`]: crate::target::Target::held_child
    pub fn held_child(&mut self, request: HeldChildRequest) -> TargetResult<HeldChildReply> {
        let Some(h) = self.held_fork else {
            return Err(TargetError::Unexpected {
                pid: self.pid.as_raw(),
                what: "no forked child is held".into(),
            });
        };
        Ok(match request {
            HeldChildRequest::Registers => {
                HeldChildReply::Registers(Box::new(super::registers_of(h.child)?))
            }
            HeldChildRequest::Memory { addr, len } => {
                // Its own copy of memory (none of our int3s is in it: `hold_child`).
                let mem = open_mem(h.child)?;
                let mut buf = vec![0u8; len];
                let mut done = 0;
                while done < len {
                    match mem.read_at(&mut buf[done..], addr.wrapping_add(done as u64)) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                if done == 0 && len > 0 {
                    return Err(TargetError::Memory { addr });
                }
                buf.truncate(done);
                HeldChildReply::Memory(buf)
            }
            HeldChildRequest::RunToEnd => {
                self.held_fork = None;
                self.fork_report = None;
                HeldChildReply::Ended(run_to_end(h.child)?)
            }
            HeldChildRequest::Kill => {
                self.end_held_fork(true);
                HeldChildReply::Done
            }
            HeldChildRequest::Detach => {
                self.end_held_fork(false);
                HeldChildReply::Done
            }
        })
    }

    /// Lets go of a held fork's child when the whole session ends: killed with the program
    /// (`kill`), or detached to run free.
    pub(super) fn end_held_fork(&mut self, kill: bool) {
        let Some(h) = self.held_fork.take() else {
            return;
        };
        self.fork_report = None;
        if kill {
            let _ = nix::sys::signal::kill(h.child, nix::sys::signal::Signal::SIGKILL);
            // Reap it (we are its tracer, so its end is ours to collect): it stops once more
            // at its exit event on the way out.
            let _ = ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", h.child, None);
            while let Ok(Wait::Stopped(_) | Wait::Event(_) | Wait::StillRunning) =
                waitpid_raw(h.child, true)
            {
                let _ = ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", h.child, None);
            }
        } else {
            let _ = ptrace_with_signal(libc::PTRACE_DETACH, "PTRACE_DETACH", h.child, None);
        }
    }

    /// Follows a forked child instead of the parent ([`PtraceTarget::set_follow_fork_child`]):
    /// the parent, at its fork event, gets its original code bytes back and is detached (it
    /// runs on untraced); the child, stopped at its first instruction — the one after the
    /// `fork` system call, in an address space identical to the parent's — becomes the
    /// process. Breakpoints inserted in the parent stay inserted in the child's copy.
    pub(super) fn follow_child(&mut self, parent: Pid, child: Pid) -> TargetResult<()> {
        if self.inserted {
            for (&addr, &orig) in &self.breakpoints {
                let _ = self.write_raw_to(&self.mem, addr, &[orig]);
            }
        }
        let mem = open_mem(child)?;
        ptrace_with_signal(libc::PTRACE_DETACH, "PTRACE_DETACH", parent, None)?;
        self.mem = mem;
        self.pid = child;
        self.cur = child;
        self.threads = BTreeMap::from([(child.as_raw(), ThreadInfo::default())]);
        self.followed = Some(child);
        self.notices.push(Notice::FollowedFork {
            parent: parent.as_raw(),
            child: child.as_raw(),
        });
        Ok(())
    }

    /// Resumes thread `tid` in `mode` (ptrace's own request; no breakpoint handling).
    pub(super) fn resume_thread(&mut self, tid: Pid, mode: Resume) -> TargetResult<()> {
        if matches!(mode, Resume::Continue { .. })
            && let Some(t) = self.threads.get_mut(&tid.as_raw())
        {
            // A continue finishes a vfork call without a trap.
            t.in_vfork_call = false;
        }
        let r = match mode {
            Resume::Continue { signal } => {
                ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", tid, signal)
            }
            Resume::Step { signal, .. } => {
                ptrace_with_signal(libc::PTRACE_SINGLESTEP, "PTRACE_SINGLESTEP", tid, signal)
            }
        };
        if let Some(t) = self.threads.get_mut(&tid.as_raw()) {
            t.running = true;
        }
        r
    }

    pub(super) fn raw_resume(&mut self, mode: Resume) -> TargetResult<()> {
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
    pub(super) fn waited_threads(&self, mode: Resume) -> Vec<Pid> {
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
    pub(super) fn wait_any(
        &self,
        waited: &[Pid],
        block: bool,
    ) -> TargetResult<Option<(Pid, Wait)>> {
        if let [one] = waited {
            let (t, w) = match waitpid_raw(*one, block) {
                // A thread gone without a status of its own: it exec'd and now runs under
                // the leader's id, where its step's end (the exec event) is reported.
                Err(TargetError::Sys {
                    source: nix::Error::ECHILD,
                    ..
                }) if *one != self.pid => (self.pid, waitpid_raw(self.pid, block)?),
                r => (*one, r?),
            };
            return match w {
                Wait::StillRunning => Ok(None),
                w => Ok(Some((t, w))),
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
    pub(super) fn wait_stop(
        &mut self,
        mode: Resume,
        block: bool,
    ) -> TargetResult<Option<(Pid, Wait)>> {
        let again = match mode {
            Resume::Continue { .. } => Resume::Continue { signal: None },
            Resume::Step { others, .. } => Resume::Step {
                signal: None,
                others,
            },
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
                Wait::Event(libc::PTRACE_EVENT_EXEC)
                    if self.report_exec && matches!(mode, Resume::Step { .. }) =>
                {
                    // A recorder's step: the exec is the step's end (a new program, new code),
                    // left at the event stop; the next step goes on from there.
                    self.handle_event(tid, libc::PTRACE_EVENT_EXEC, mode)?;
                    return Ok(Some((self.pid, w)));
                }
                Wait::Event(event) => {
                    self.handle_event(tid, event, mode)?;
                    if matches!(mode, Resume::Continue { .. })
                        && event == libc::PTRACE_EVENT_EXEC
                        && self.exec_report
                    {
                        // A full-speed run stops at the new program's first instruction.
                        return Ok(Some((self.pid, w)));
                    }
                    if self.fork_report.is_some() && self.held_fork.is_some_and(|h| h.vfork) {
                        // A vfork held for the debugger: the parent cannot finish the call
                        // while the child is held, so the step (or run) ends at the event.
                        return Ok(Some((tid, w)));
                    }
                    if event == libc::PTRACE_EVENT_VFORK_DONE && self.vfork_done_report {
                        // The reported vfork's child exec'd or exited: said where the parent
                        // stands, still inside the call (as a native debugger sees it), before
                        // its next instruction — a step ends here without one (the next step
                        // finishes the call first: `in_vfork_call`).
                        return Ok(Some((tid, w)));
                    }
                    if matches!(mode, Resume::Continue { .. }) && self.fork_report.is_some() {
                        // A full-speed run stops at the fork event; the debugger decides
                        // (a step finishes the system call first: `take_fork_report`).
                        return Ok(Some((tid, w)));
                    }
                    if let Some(child) = self.followed.take() {
                        // The process is now the forked child, stopped right after the `fork`.
                        if matches!(mode, Resume::Step { .. }) {
                            // That is where the step of the `fork` instruction ends.
                            return Ok(Some((child, Wait::Event(libc::PTRACE_EVENT_FORK))));
                        }
                        self.resume_thread(child, again)?;
                        continue;
                    }
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
                Wait::Stopped(libc::SIGTRAP)
                    if self
                        .threads
                        .get(&tid.as_raw())
                        .is_some_and(|t| t.in_vfork_call) =>
                {
                    // The vfork call finished (its exit trap, no instruction ran): now the
                    // step itself.
                    if let Some(t) = self.threads.get_mut(&tid.as_raw()) {
                        t.in_vfork_call = false;
                    }
                    self.resume_thread(tid, again)?;
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
    pub(super) fn stop_others(&mut self) -> TargetResult<()> {
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
                            Resume::Step {
                                signal: None,
                                others: false,
                            },
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
    pub(super) fn other_threads(&self) -> Vec<i32> {
        self.threads
            .keys()
            .copied()
            .filter(|&t| t != self.pid.as_raw())
            .collect()
    }

    /// Collects the end of every thread of a process that is exiting or was killed, the leader
    /// last (its status is the process's).
    pub(super) fn reap_all(&mut self) -> Option<Wait> {
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
    pub(super) fn sent_by_terminal(&self, tid: Pid, sig: i32) -> bool {
        nix::sys::ptrace::getsiginfo(tid)
            .is_ok_and(|si| si.si_signo == sig && si.si_code == libc::SI_KERNEL)
    }

    /// Starts one single step of the current thread (delivering `signal` first); the other
    /// threads stay stopped. Collect it with [`step_poll`](Self::step_poll): a step into a
    /// blocking system call may take any time, during which the caller may step other threads.
    pub fn step_start(&mut self, signal: Option<i32>) -> TargetResult<()> {
        self.ensure_stopped()?;
        let tid = self.cur;
        match self.resume_thread(
            tid,
            Resume::Step {
                signal,
                others: false,
            },
        ) {
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
        let mode = Resume::Step {
            signal: None,
            others: false,
        };
        let saved_stop_at_exit = self.stop_at_exit;
        self.stop_at_exit = true;
        self.report_exec = true;
        let r = self.wait_stop(mode, block);
        self.stop_at_exit = saved_stop_at_exit;
        self.report_exec = false;
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
            Wait::Event(libc::PTRACE_EVENT_EXIT) => ThreadStop::Stop(self.exit_event(t)),
            Wait::Event(libc::PTRACE_EVENT_EXEC) => {
                self.state = RunState::Stopped;
                ThreadStop::Exec
            }
            Wait::Event(libc::PTRACE_EVENT_VFORK) => {
                self.state = RunState::Stopped;
                ThreadStop::VForked
            }
            Wait::Event(libc::PTRACE_EVENT_VFORK_DONE) => {
                // Reported by the caller (`take_vfork_done_report`).
                self.state = RunState::Stopped;
                ThreadStop::VForkDone
            }
            Wait::Event(libc::PTRACE_EVENT_FORK) => {
                self.state = RunState::Stopped;
                ThreadStop::FollowedFork {
                    parent: tid.as_raw(),
                    child: t.as_raw(),
                }
            }
            w => ThreadStop::Stop(self.finish_stop(w, mode)?),
        }))
    }

    /// Turns a raw stop into the event reported to the debugger, and records the new state.
    pub(super) fn finish_stop(&mut self, w: Wait, mode: Resume) -> TargetResult<StopEvent> {
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
            Wait::Event(libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK)
                if matches!(mode, Resume::Continue { .. }) =>
            {
                // A full-speed run stopped at a fork it holds for the debugger (`hold_child`).
                self.state = RunState::Stopped;
                self.remove_breakpoints()?;
                let vfork = self.held_fork.is_some_and(|h| h.vfork);
                match self.fork_report.take() {
                    Some(child) => Ok(StopEvent::Forked { child, vfork }),
                    None => Ok(StopEvent::Signal(libc::SIGTRAP)),
                }
            }
            Wait::Event(libc::PTRACE_EVENT_VFORK) => {
                // A step of `vfork` ends at the event (`hold_child`): the call executed as far
                // as the parent can see.
                self.state = RunState::Stopped;
                Ok(StopEvent::Step)
            }
            Wait::Event(libc::PTRACE_EVENT_VFORK_DONE) => {
                self.state = RunState::Stopped;
                self.vfork_done_report = false;
                Ok(StopEvent::VForkDone)
            }
            Wait::Event(libc::PTRACE_EVENT_EXEC) if matches!(mode, Resume::Continue { .. }) => {
                // A full-speed run stopped at an exec reported to the debugger (the old
                // breakpoints are gone with the old address space).
                self.state = RunState::Stopped;
                self.exec_report = false;
                Ok(StopEvent::Exec)
            }
            Wait::Event(libc::PTRACE_EVENT_FORK) => {
                // A debugger's step of `fork`, ending in the followed child (`follow_child`).
                self.state = RunState::Stopped;
                Ok(StopEvent::Step)
            }
            Wait::Event(libc::PTRACE_EVENT_EXIT) => {
                // Still alive at its end: registers and memory stay readable until resumed.
                self.state = RunState::Stopped;
                self.remove_breakpoints()?;
                Ok(self.exit_event(self.cur))
            }
            Wait::StillRunning | Wait::Event(_) => Err(TargetError::Unexpected {
                pid: self.pid.as_raw(),
                what: format!("unexpected wait status {w:?}"),
            }),
        }
    }
}

/// Runs traced process `pid` (stopped, one thread) untraced in all but name to its end: its
/// own forks and clones are not followed, an exec is let through (an event stop, not the
/// legacy `SIGTRAP` a tracee gets without `PTRACE_O_TRACEEXEC`), every signal it receives is
/// delivered to it. Returns how it ended. Blocks until then: the caller holds nothing else
/// running that it could wait for (a process that waits for it would otherwise wait for us,
/// its tracer, to collect its end first).
fn run_to_end(pid: Pid) -> TargetResult<StopEvent> {
    nix::sys::ptrace::setoptions(pid, nix::sys::ptrace::Options::PTRACE_O_TRACEEXEC)
        .map_err(sys("PTRACE_SETOPTIONS", pid))?;
    let mut signal = None;
    loop {
        ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", pid, signal)?;
        signal = match waitpid_raw(pid, true)? {
            Wait::Exited(code) => return Ok(StopEvent::Exited(code)),
            Wait::Killed(sig) => return Ok(StopEvent::Killed(sig)),
            Wait::Stopped(sig) => Some(sig),
            Wait::Event(_) | Wait::StillRunning => None,
        };
    }
}
