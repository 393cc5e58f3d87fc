//! [`LiveBackend`] for [`QemuLive`]: what the timeline asks of a program running under QEMU —
//! identity, threads, registers and memory at the present (through QEMU's gdbstub), run
//! control, the trace store of the traced thread, and the backend's lines in `monitor stats`.

use super::*;
use crate::capture::qemu::output::stream_path;

/// Register names of the [`gpr`] slots in QEMU's target description (`None`: not described).
fn qemu_name(slot: usize) -> Option<&'static str> {
    match slot {
        gpr::ORIG_RAX => None,
        s => gpr::NAMES.get(s).copied(),
    }
}

impl LiveBackend for QemuLive {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn pid(&self) -> i32 {
        self.rec.pid() as i32
    }

    fn tid(&self) -> i32 {
        i32::try_from(self.stop_thread.tid).unwrap_or_else(|_| self.pid())
    }

    fn history_thread(&self) -> i32 {
        i32::try_from(self.main.tid).unwrap_or_else(|_| self.pid())
    }

    fn thread_stores(&self) -> Vec<(i32, TraceStore)> {
        // Every thread's stream, completed at every stop; the main thread's first (the store
        // the timeline's own history is indexed from).
        self.streams
            .iter()
            .map(|s| (i32::try_from(s.tid).unwrap_or(0), s.store.clone()))
            .collect()
    }

    fn selected_thread(&self) -> i32 {
        i32::try_from(self.selected.tid).unwrap_or_else(|_| self.pid())
    }

    fn threads(&self) -> Vec<i32> {
        self.thread_list
            .iter()
            .filter_map(|t| i32::try_from(t.tid).ok())
            .collect()
    }

    fn select_thread(&mut self, tid: i32) -> TargetResult<()> {
        match self.thread_of(tid) {
            Some(t) => {
                self.selected = t;
                Ok(())
            }
            None => Err(TargetError::Unsupported("no such thread")),
        }
    }

    fn exec_path(&mut self) -> Option<PathBuf> {
        Some(self.program.clone())
    }

    fn maps(&mut self) -> String {
        // The guest's code mappings as /proc/PID/maps lines (read-only, executable, from files):
        // what the loader placed and what the guest mapped since, from the recording directory.
        let mut records = Recorded::open_layout(self.rec.dir())
            .map(|rec| rec.mmap_records())
            .unwrap_or_default();
        if records.is_empty() {
            // Stopped before the guest's first block (the stub holds a new program at its
            // interpreter's entry): the plugin has written nothing yet, but the loader has
            // placed the program and its interpreter, which the auxiliary vector says.
            let pid = self.rec.pid();
            if let Ok(auxv) = self.remote.auxv() {
                records = loader_mappings(&self.program, &auxv, pid);
            }
        }
        records
            .iter()
            .map(|m| {
                format!(
                    "{:x}-{:x} r{}p {:08x} 00:00 0 {}\n",
                    m.addr,
                    m.addr + m.len,
                    if m.exec { "-x" } else { "--" },
                    m.pgoff,
                    m.filename
                )
            })
            .collect()
    }

    fn snapshot_image(&mut self) -> TargetResult<Image> {
        let pid = self.pid();
        self.code_image()
            .cloned()
            .map_err(|what| TargetError::Unexpected { pid, what })
    }

    fn auxv(&mut self) -> TargetResult<Vec<u8>> {
        let e = self.err();
        self.remote.auxv().map_err(e)
    }

    fn read_registers(&mut self) -> TargetResult<X86Registers> {
        if let Some(x) = &self.at_exit {
            if self.selected != self.main {
                // Held inside the plugin, the stub answers nothing; the call says only the
                // exiting thread's registers.
                return Err(TargetError::Unsupported(
                    "another thread's registers while QEMU holds the program at its exit",
                ));
            }
            return Ok(Self::exit_registers(x));
        }
        let thread = self.selected;
        if let Some((t, r)) = &self.stop_regs
            && *t == thread
        {
            return Ok(r.clone());
        }
        self.fetch_registers(thread)
    }

    fn pc(&mut self) -> TargetResult<u64> {
        // One register over the wire instead of the whole file.
        self.thread_pc(self.selected)
    }

    fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()> {
        if self.at_exit.is_some() {
            return Err(TargetError::Unsupported(
                "register writes while QEMU holds the program at its exit",
            ));
        }
        // General-purpose registers (the ones GDB writes: `set $rax = …`, `jump`), one `P`
        // each where they differ; the vector state is not written back.
        let current = self.read_registers()?;
        self.stop_regs = None;
        let e = self.err();
        for slot in 0..gpr::COUNT {
            let Some(name) = qemu_name(slot) else {
                continue;
            };
            if current.gprs[slot] == regs.gprs[slot] {
                continue;
            }
            let Some(info) = self.remote.layout().by_name(name).cloned() else {
                continue;
            };
            let bytes = regs.gprs[slot].to_le_bytes();
            self.remote
                .write_register(Some(self.selected), name, &bytes[..info.size().min(8)])
                .map_err(&e)?;
        }
        Ok(())
    }

    fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        if self.at_exit.is_some() {
            return self.read_memory_direct(addr, buf);
        }
        let e = self.err();
        let data = self.remote.read_memory(addr, buf.len()).map_err(e)?;
        buf[..data.len()].copy_from_slice(&data);
        Ok(data.len())
    }

    fn write_memory(&mut self, addr: u64, data: &[u8]) -> TargetResult<()> {
        if self.at_exit.is_some() {
            return Err(TargetError::Unsupported(
                "memory writes while QEMU holds the program at its exit",
            ));
        }
        let e = self.err();
        self.remote.write_memory(addr, data).map_err(e)
    }

    fn add_breakpoint(&mut self, addr: u64) -> TargetResult<()> {
        if self.bps.contains(&addr) {
            return Ok(());
        }
        if self.at_exit.is_some() {
            // The stub does not answer while the program is held; it only exits from here.
            self.bps.insert(addr);
            return Ok(());
        }
        let e = self.err();
        if self.bps_in_stub
            && !self
                .remote
                .insert_breakpoint(BreakKind::Software, addr, 1)
                .map_err(e)?
        {
            return Err(TargetError::Unsupported(
                "breakpoints (the qemu gdbstub refused Z0)",
            ));
        }
        self.bps.insert(addr);
        self.publish_breakpoints();
        Ok(())
    }

    fn remove_breakpoint(&mut self, addr: u64) -> TargetResult<bool> {
        if !self.bps.remove(&addr) {
            return Ok(false);
        }
        if !self.running {
            self.lifted.insert(addr);
        }
        self.publish_breakpoints();
        if self.at_exit.is_some() || !self.bps_in_stub {
            return Ok(true);
        }
        let e = self.err();
        self.remote
            .remove_breakpoint(BreakKind::Software, addr, 1)
            .map_err(e)
    }

    fn take_notices(&mut self) -> Vec<crate::target::Notice> {
        let mut notices = std::mem::take(&mut self.notices);
        notices.append(&mut self.watches.notices);
        notices
    }

    fn set_live_watches(&mut self, watches: &[(u64, u64, crate::target::WatchKind)]) -> bool {
        self.set_plugin_watches(watches)
    }

    fn has_exited(&mut self) -> bool {
        self.exited
    }

    fn kill(&mut self) -> TargetResult<()> {
        if !self.exited {
            // Held at its exit the stub does not answer (a `k` would wait for its deadline),
            // nor while the guest runs (QEMU 7.2's user-mode stub does not read its socket
            // then: a debugger vanishing mid-`continue` with `--once` waited 10 s).
            if self.at_exit.take().is_none() && !self.running {
                let _ = self.remote.kill();
            }
            let _ = self.rec.child_mut().kill();
            let _ = self.rec.child_mut().wait();
            self.exited = true;
        }
        Ok(())
    }

    fn detach(&mut self) -> TargetResult<()> {
        if self.at_exit.is_some() {
            // Nothing to detach from: let it exit.
            return self.release_exit();
        }
        for bp in std::mem::take(&mut self.bps) {
            if self.bps_in_stub {
                let _ = self.remote.remove_breakpoint(BreakKind::Software, bp, 1);
            }
        }
        self.lifted.clear();
        // A watchpoint hit would send the thread a SIGTRAP nobody takes any more: it would
        // kill the program.
        self.set_plugin_watches(&[]);
        self.publish_breakpoints();
        // The program runs on by itself: no thread may wait at the pause gate for a debugger
        // that is gone.
        self.set_gate(false);
        // (Opens the exit gate's file if no stop has yet.)
        self.check_exit_gate()?;
        if self.gate.is_some() {
            self.open_exit_gate()?;
        }
        let e = self.err();
        self.remote.detach().map_err(e)?;
        self.detached = true;
        Ok(())
    }

    fn store(&self) -> TraceStore {
        // The main thread's (the history's thread).
        self.streams[0].store.clone()
    }

    fn recorded(&self) -> Option<u64> {
        None
    }

    fn inject_syscall(&mut self, _nr: u64, _args: [u64; 6]) -> TargetResult<u64> {
        // QEMU's gdbstub has no way to run a system call in the guest outside its own flow.
        Err(TargetError::Unsupported(
            "system calls injected into a program under QEMU",
        ))
    }

    fn resume(&mut self, how: Resume, _record: bool) -> TargetResult<()> {
        // The plugin traces every block: runs are always recorded.
        if self.at_exit.is_some() {
            // From the held exit the only way on is the exit (the stub reports it).
            self.release_exit()?;
            self.running = true;
            return Ok(());
        }
        let (step, signal, others) = match how {
            Resume::Continue { signal } => (false, signal, true),
            Resume::Step { signal, others } => (true, signal, others),
        };
        self.check_stub_alone()?;
        self.early = None;
        if others && let Some((t, pc)) = self.parked_at_breakpoint() {
            // Another thread waits at the pause gate right at a breakpoint (it came there while
            // GDB stepped over one, its breakpoints out of QEMU): it would hit it first thing.
            // QEMU would not see it (the thread is inside that block already), so the hit is
            // reported here, nothing resumed. For a step that lets the other threads run
            // (`next`, `step`) too, as GDB would see natively: held through the step, the
            // thread kept QEMU's work at the step's start waiting until the hold limit, then
            // ran through the breakpoint.
            self.stop_thread = t;
            self.selected = t;
            self.early = Some(StopEvent::Breakpoint { pc });
            self.running = true;
            return Ok(());
        }
        // A step moves the selected thread; a continue lifts the breakpoint the thread that
        // stopped sits on (QEMU would report it again at once) and runs every thread.
        let thread = if step {
            self.selected
        } else {
            self.stop_thread
        };
        let pc = self.thread_pc(thread)?;
        let stepped_over = self.bps.contains(&pc);
        // Breakpoints out of QEMU while the others are held for a step (see
        // `place_stub_breakpoints`; a continue from a breakpoint steps over it first), in it
        // for a continue or a step into the kernel.
        let held_step = (step || stepped_over) && !self.enters_kernel(pc);
        self.place_stub_breakpoints(!held_step)?;
        if stepped_over {
            if let Some(ev) = self.step_over_breakpoint(thread, signal)? {
                self.early = Some(ev);
                self.running = true;
                return Ok(());
            }
            if step {
                // The step over the breakpoint was the step asked for.
                self.early = Some(StopEvent::Step);
                self.running = true;
                return Ok(());
            }
        }
        if !step {
            self.place_stub_breakpoints(true)?;
        }
        // A signal to deliver went with the step over the breakpoint.
        let signal = if stepped_over { None } else { signal };
        let action = match (step, signal) {
            (false, None) => Action::Continue,
            (false, Some(s)) => Action::ContinueSignal(gdb_from_linux(s)),
            (true, None) => Action::Step,
            (true, Some(s)) => Action::StepSignal(gdb_from_linux(s)),
        };
        let tid = u32::try_from(thread.tid).unwrap_or(0);
        let stepped = thread;
        let thread = step.then_some(thread);
        if !step && !self.lifted.is_empty() {
            // Running on: the breakpoints the debugger did not put back are gone.
            self.lifted.clear();
            self.publish_breakpoints();
        }
        let e = self.err();
        // A step moves one thread, the others stay stopped (as GDB's `vCont;s:T`); a continue
        // runs them all.
        self.check_stub_alone()?;
        self.stop_regs = None;
        self.remote
            .resume(&[ResumeAction { action, thread }])
            .map_err(e)?;
        if step {
            self.let_step_go(stepped);
            let now = std::time::Instant::now();
            self.step_hold = Some((now, now, tid));
        } else {
            // Only once the stub has taken the `vCont` (acknowledged it): a held thread let go
            // earlier can reach a breakpoint and enter the stub while the stopped thread is
            // still in it, and both read the debugger's socket (seen: QEMU resending its stop
            // reply while its other thread waits for the `vCont`, until the session timed out).
            self.set_gate(false);
        }
        self.stepping = step;
        self.running = true;
        Ok(())
    }

    fn wait(
        &mut self,
        block: bool,
        _bps: &BTreeSet<u64>,
        _interrupt: &AtomicBool,
    ) -> TargetResult<Option<StopEvent>> {
        if let Some(ev) = self.early.take() {
            self.running = false;
            return Ok(Some(ev));
        }
        if let Some(stop) = self.stashed.take() {
            self.set_gate(true);
            self.step_hold = None;
            self.running = false;
            let stepping = std::mem::take(&mut self.stepping);
            let ev = self.event(stop, stepping)?;
            self.threads_stale = true;
            return Ok(Some(ev));
        }
        // In slices, so the exit gate is watched too (the stub says nothing while it holds).
        let reply = loop {
            let slice = Some(if self.step_hold.is_some() {
                Duration::from_millis(2)
            } else {
                Duration::from_millis(20)
            });
            match self.remote.wait(slice) {
                Ok(None) => {}
                other => break other,
            }
            if let Some((began, pulsed, tid)) = self.step_hold {
                if began.elapsed() > STEP_HOLD_LIMIT {
                    // The stepped thread waits (a lock, a join): let the others run.
                    self.step_hold = None;
                    self.set_gate(false);
                } else if pulsed.elapsed() > STEP_PULSE {
                    // QEMU's exclusive work (flushing translations after a stop) waits for
                    // every thread to leave its block, held ones too: each runs the block it
                    // waits at and waits again at the next.
                    self.pulse();
                    self.step_hold = Some((began, std::time::Instant::now(), tid));
                }
            }
            if self.check_exit_gate()? {
                self.set_gate(true);
                self.running = false;
                self.stepping = false;
                self.stop_thread = self.main;
                self.selected = self.main;
                // Workers that ended since the last stop are gone from the list at this one.
                self.threads_stale = true;
                // The gate holds a thread at its `exit`/`exit_group` system call: no signal.
                return Ok(Some(StopEvent::Exiting { signal: None }));
            }
            if !block {
                break Ok(None);
            }
        };
        match reply {
            Ok(None) => Ok(None),
            Ok(Some(stop)) => {
                self.step_hold = None;
                // At once: the fewer blocks the other threads run meanwhile, the less likely
                // one of them enters the gdbstub too.
                self.set_gate(true);
                self.running = false;
                let stepping = std::mem::take(&mut self.stepping);
                let ev = self.event(stop, stepping)?;
                self.threads_stale = true;
                Ok(Some(ev))
            }
            Err(e) if e.is_disconnect() => {
                self.running = false;
                Ok(Some(self.gone()))
            }
            Err(e) => Err(remote_err(self.rec.pid())(e)),
        }
    }

    fn interrupt(&mut self) -> TargetResult<()> {
        if !self.running || self.exited {
            return Ok(());
        }
        self.interrupted = true;
        if self.terminal_interrupts {
            // The terminal's own SIGINT is on its way to QEMU: take its stop if it comes.
            if let Ok(Some(stop)) = self.remote.wait(Some(Duration::from_millis(300))) {
                self.set_gate(true);
                self.stashed = Some(stop);
                return Ok(());
            }
        }
        let pid = self.pid();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGINT,
        )
        .map_err(|e| TargetError::Unexpected {
            pid,
            what: format!("cannot interrupt qemu: {e}"),
        })
    }

    fn sync_at_stop(&mut self, exited: bool) -> Result<(), String> {
        self.stops += 1;
        if self.threads_stale {
            self.refresh_threads();
        }
        if exited && !self.exited {
            self.exited = true;
        }
        if self.streams.iter().all(|s| s.finished) {
            return Ok(());
        }
        let dir = self.rec.dir().to_path_buf();
        let pid = self.rec.pid();
        // Children forked since the last stop: said once each.
        for child in streams::forked_pids(&dir, pid) {
            if self.forks_seen.insert(child) {
                self.notices.push(crate::target::Notice::ForkedUnderQemu {
                    child: child as i32,
                    dir: dir.clone(),
                    kept: self.rec.keeps_dir(),
                });
            }
        }
        // Threads that started since the last stop.
        for tid in streams::stream_tids(&dir, pid) {
            if !self.streams.iter().any(|s| s.tid == tid) {
                self.streams
                    .push(streams::LiveStream::new(tid, TraceStore::new()));
            }
        }
        let mut total = streams::Synced::default();
        let mut main_note = None;
        if self.exited {
            // The process is gone: the reader completes every unfinished stream from its tail
            // file and the counters. Once.
            let rec = Recorded::open(&dir)
                .map_err(|e| format!("reading the recording directory: {e}"))?;
            for (k, s) in self.streams.iter_mut().enumerate() {
                if s.finished {
                    continue;
                }
                let Some(t) = rec.threads.iter().find(|t| t.pid == pid && t.tid == s.tid) else {
                    continue;
                };
                let done = s.finish_with(&t.trace, t.completed.clone());
                total.read += done.read;
                if k == 0 {
                    main_note = done.note;
                }
            }
            self.last_sync = (total.read, 0);
            self.last_completion = main_note;
            return Ok(());
        }
        // Where each live thread is: the one that stopped in the stub at its PC, the others at
        // the pause gate (or in a system call).
        self.wait_for_threads_to_settle();
        let mut places = Vec::with_capacity(self.streams.len());
        for k in 0..self.streams.len() {
            let (tid, finished) = (self.streams[k].tid, self.streams[k].finished);
            let ended = stream_path(&dir, pid, tid, "json").exists();
            let pc = match self.thread_of(tid as i32) {
                Some(t) if !finished && !ended => self.thread_pc(t).ok(),
                _ => None,
            };
            places.push((ended, pc));
        }
        self.code_image()?;
        let image = &self
            .code
            .as_ref()
            .ok_or_else(|| "no code image".to_string())?
            .1;
        let mut errors = Vec::new();
        // Every thread is stopped or held: the clock is where each stopped thread's last run
        // ended at the latest.
        let now = self.rec.clock_now();
        for (k, s) in self.streams.iter_mut().enumerate() {
            if s.finished {
                continue;
            }
            let (ended, pc) = places[k];
            let done = if ended {
                s.finish_from_file(&dir, pid)
            } else {
                s.sync_at(&dir, pid, pc, now, image)
            };
            match done {
                Ok(d) => {
                    total.read += d.read;
                    total.provisional += d.provisional;
                    if k == 0 {
                        main_note = d.note;
                    }
                }
                Err(e) => errors.push(format!("thread {}: {e}", s.tid)),
            }
        }
        self.last_sync = (total.read, total.provisional);
        self.last_completion = main_note;
        match errors.is_empty() {
            true => Ok(()),
            false => Err(errors.join("; ")),
        }
    }

    fn stats(&self, line: &mut dyn FnMut(&str, String)) {
        line("recording directory", self.rec.dir().display().to_string());
        line("qemu pid", self.rec.pid().to_string());
        line("qemu executable", self.qemu_exe.clone());
        line("main thread", self.main.tid.to_string());
        line(
            "threads recorded",
            format!(
                "{} ({} ended)",
                self.streams.len(),
                self.streams.iter().filter(|s| s.finished).count()
            ),
        );
        line("stops", self.stops.to_string());
        line(
            "trace read at last stop",
            format!(
                "{} stream bytes, {} provisional bytes (rewritten at the next stop), every \
                 thread",
                self.last_sync.0, self.last_sync.1
            ),
        );
        line(
            "stub bad checksums",
            self.remote.bad_checksums().to_string(),
        );
        if let Some(c) = &self.last_completion {
            line("stream end at last stop", c.clone());
        }
        if let Some(e) = self.stop_errors.last() {
            line("last stop error", e.clone());
        }
    }
}

impl QemuLive {
    /// The registers of `thread` as QEMU's stub has them (`g`, and `p` for what a `g` reply
    /// leaves out), the FXSAVE area built from its x87/SSE registers.
    pub(super) fn fetch_registers(&mut self, thread: ThreadId) -> TargetResult<X86Registers> {
        let e = self.err();
        let regs = self.remote.read_registers(Some(thread)).map_err(&e)?;
        let layout = self.remote.layout().clone();
        let mut out = X86Registers {
            xsave: vec![0; 512],
            ..X86Registers::default()
        };
        for slot in 0..gpr::COUNT {
            let Some(name) = qemu_name(slot) else {
                continue;
            };
            out.gprs[slot] = match regs.u64(&layout, name) {
                Some(v) => v,
                None if matches!(slot, gpr::FS_BASE | gpr::GS_BASE) => self
                    .remote
                    .read_register_u64(Some(thread), name)
                    .unwrap_or(0),
                None => 0,
            };
        }
        // The FXSAVE legacy area from the x87/SSE registers of the description.
        let get = |n: &str| regs.u64(&layout, n);
        let x = &mut out.xsave;
        if let Some(v) = get("fctrl") {
            x[0..2].copy_from_slice(&(v as u16).to_le_bytes());
        }
        if let Some(v) = get("fstat") {
            x[2..4].copy_from_slice(&(v as u16).to_le_bytes());
        }
        if let Some(v) = get("ftag") {
            // FXSAVE keeps the abridged tag word: one bit per register, set unless empty (3).
            x[4] = (0..8).fold(0u8, |a, i| a | u8::from((v >> (2 * i)) & 3 != 3) << i);
        }
        if let Some(v) = get("fop") {
            x[6..8].copy_from_slice(&(v as u16).to_le_bytes());
        }
        if let Some(v) = get("fioff") {
            x[8..16].copy_from_slice(&v.to_le_bytes());
        }
        if let Some(v) = get("fooff") {
            x[16..24].copy_from_slice(&v.to_le_bytes());
        }
        if let Some(v) = get("mxcsr") {
            x[24..28].copy_from_slice(&(v as u32).to_le_bytes());
        }
        for i in 0..8 {
            if let Some(info) = layout.by_name(&format!("st{i}"))
                && let Some(raw) = regs.raw(info.regnum)
            {
                let n = raw.len().min(10);
                x[32 + 16 * i..32 + 16 * i + n].copy_from_slice(&raw[..n]);
            }
        }
        for i in 0..16 {
            if let Some(info) = layout.by_name(&format!("xmm{i}"))
                && let Some(raw) = regs.raw(info.regnum)
            {
                let n = raw.len().min(16);
                x[160 + 16 * i..160 + 16 * i + n].copy_from_slice(&raw[..n]);
            }
        }
        if layout.by_name("xmm0").is_none() {
            out.unavailable = RegMask::VECTOR;
        }
        if let Some(pc) = self.paused_pc(thread) {
            out.gprs[gpr::RIP] = pc;
        }
        Ok(out)
    }
}
