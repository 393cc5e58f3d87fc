//! The one trait every live capture backend implements ([`LiveBackend`]), as the
//! [`Timeline`](crate::timeline::Timeline) drives it, and the optional record of past state a
//! backend may keep ([`RecordedState`]).
//!
//! A backend owns a process (or an emulated one) and everything about its present: registers,
//! memory, software breakpoints, forward runs (traced or not), the executable mappings and a
//! snapshot of their code. It produces the trace bytes into a [`TraceStore`] the history is
//! indexed from and, optionally, state beyond the PC at past positions (the software backend's
//! state log). Everything else — the cursor, reverse steps and searches, breakpoints in the
//! past, replaying forward, the hand-over to the live process at the present — is the
//! timeline's and the same for every backend. Nothing outside `capture/` names a backend's
//! types: the timeline and the server see only this trait.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::flow::FlowConfig;
use crate::image::Image;
use crate::store::live::TraceStore;
use crate::target::{
    HeldChildReply, HeldChildRequest, Notice, Resume, StopEvent, TargetResult, WatchKind,
    X86Registers,
};

/// Where the history thread's code was replaced: by `execve` (another program), or by a
/// `munmap`/`mmap(MAP_FIXED)` over executable code (`dlclose`, a JIT freeing code). It holds
/// the code before it, and where the next period starts. The timeline decodes the history
/// before the boundary against `image` and after it against the next period's code
/// ([`Image::push_period`]).
#[derive(Debug, Clone)]
pub struct ExecBoundary {
    /// What replaced the code: `exec`, or `munmap START-END` / `mmap START-END`.
    pub cause: String,
    /// The code of the program that ran before the `execve` (read just before the call).
    pub image: Arc<Image>,
    /// The old program's mappings in `/proc/PID/maps` form (for its symbols; may be empty).
    pub maps: String,
    /// The old program's executable, if known.
    pub exe: Option<PathBuf>,
    /// Number of the next program's first instruction in the history (`u64::MAX` in an
    /// offline recording: found at its PSB's sync point
    /// when the history is indexed, for a boundary placed in a recorded hardware trace).
    pub next_insn: u64,
    /// Offset in the history's [`TraceStore`] of the PSB that opens the next address space.
    pub next_offset: u64,
    /// The same in the other threads' stores, by thread id, for the threads that existed then
    /// (see [`crate::timeline`]'s periods: a thread not listed started after the boundary).
    pub thread_offsets: Vec<(i32, u64)>,
}

/// A live process recorded by a capture backend (software single-stepping, hardware Intel PT,
/// ...), as the timeline drives it. All present state goes through it.
pub trait LiveBackend {
    /// The backend, as `monitor stats` names it.
    fn name(&self) -> &'static str;

    /// Whether the trace comes from the CPU (decoders then apply the host CPU's errata) rather
    /// than from the software encoder.
    fn is_hardware(&self) -> bool {
        false
    }

    /// How the trace is decoded (a hardware trace: with the errata of the CPU it runs on).
    fn flow_config(&self) -> FlowConfig {
        FlowConfig::default()
    }

    /// The process id.
    fn pid(&self) -> i32;

    /// The id of the thread the last stop happened in (the one the debugger is told about).
    fn tid(&self) -> i32 {
        self.pid()
    }

    /// The thread whose instructions the history ([`store`](Self::store)) holds: the one a
    /// stop in the past is reported in.
    fn history_thread(&self) -> i32 {
        self.tid()
    }

    /// The thread [`select_thread`](Self::select_thread) chose (after a stop: [`tid`](Self::tid)).
    fn selected_thread(&self) -> i32 {
        self.tid()
    }

    /// Every live thread of the process, the main thread first (a backend that follows one
    /// thread: just [`tid`](Self::tid)).
    fn threads(&self) -> Vec<i32> {
        vec![self.tid()]
    }

    /// Makes `tid` the thread whose registers [`read_registers`](Self::read_registers) and
    /// [`write_registers`](Self::write_registers) access (at a stop; the next resume goes on
    /// with the backend's own choice).
    fn select_thread(&mut self, tid: i32) -> TargetResult<()> {
        if tid == self.tid() {
            Ok(())
        } else {
            Err(crate::target::TargetError::Unsupported(
                "this backend follows one thread",
            ))
        }
    }

    /// Every recorded thread's trace stream (ended threads too), the main thread first. Each
    /// carries TSC packets from one global instruction clock: the TSC value after a thread is
    /// (re-)enabled, and in every PSB+, is the number of instructions the whole process
    /// executed (recorded) before the next instruction of that stream, so merging the streams'
    /// runs by TSC gives the exact global order. A single-thread backend: `[(tid, store())]`.
    fn thread_stores(&self) -> Vec<(i32, TraceStore)> {
        vec![(self.tid(), self.store())]
    }

    /// The threads (besides the main one) that existed before the recording's first
    /// instruction — those of a process attached to, or created before recording began: in
    /// the past they are listed from the start of the history, not from their own first
    /// recorded instruction (they were waiting, in a system call, until then). Default: none.
    fn threads_at_start(&self) -> Vec<i32> {
        Vec::new()
    }

    /// The executable file, as an absolute path if known.
    fn exec_path(&mut self) -> Option<PathBuf>;

    /// The process's memory map in `/proc/PID/maps` form (empty if unknown).
    fn maps(&mut self) -> String;

    /// A snapshot of the code of every readable, executable mapping at the present.
    fn snapshot_image(&mut self) -> TargetResult<Image>;

    /// The address spaces the history thread left through a successful `execve`, in order:
    /// the old program's code and where the new one starts in the history (see
    /// [`ExecBoundary`]). Empty (the default) for a backend that does not follow them: its
    /// history is decoded against one image.
    fn exec_boundaries(&self) -> Vec<ExecBoundary> {
        Vec::new()
    }

    /// The auxiliary vector (raw bytes).
    fn auxv(&mut self) -> TargetResult<Vec<u8>>;

    /// All registers of the stopped thread at the present.
    fn read_registers(&mut self) -> TargetResult<X86Registers>;

    /// The stopped thread's PC at the present (asked after every step of a range step: a
    /// backend that can read it alone overrides this).
    fn pc(&mut self) -> TargetResult<u64> {
        self.read_registers().map(|r| r.pc())
    }

    /// Writes all registers of the stopped thread.
    fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()>;

    /// Reads memory at the present; returns how many leading bytes could be read (reading none
    /// is an error).
    fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> TargetResult<usize>;

    /// Writes all of `data` at `addr`.
    fn write_memory(&mut self, addr: u64, data: &[u8]) -> TargetResult<()>;

    /// Adds a software breakpoint for runs at full speed (a backend that stops after every
    /// instruction compares the PC with the set given to [`wait`](Self::wait) instead).
    fn add_breakpoint(&mut self, addr: u64) -> TargetResult<()>;

    /// Removes a software breakpoint; `false` if none was at `addr`.
    fn remove_breakpoint(&mut self, addr: u64) -> TargetResult<bool>;

    /// Takes the notices collected since the last call (threads, forks, exec, ...).
    fn take_notices(&mut self) -> Vec<Notice> {
        Vec::new()
    }

    /// Whether forks are held and reported to the debugger ([`StopEvent::Forked`]): asked
    /// once per connection with whether the debugger wants fork events, and `vforks` whether
    /// vforks too (see [`crate::target::Target::report_forks`]). Default: no (the backend
    /// detaches forked children itself).
    fn report_forks(&mut self, client_wants: bool, vforks: bool) -> bool {
        let _ = (client_wants, vforks);
        false
    }

    /// Whether exec is reported to the debugger as a stop
    /// ([`StopEvent::Exec`]), asked once per connection with
    /// whether the debugger wants exec events. Default: no.
    fn report_execs(&mut self, client_wants: bool) -> bool {
        let _ = client_wants;
        false
    }

    /// Settles a held fork: `detach` is the side the debugger lets go (see
    /// [`crate::target::Target::resolve_fork`]); the process from now on.
    fn resolve_fork(&mut self, detach: i32) -> TargetResult<Option<i32>> {
        let _ = detach;
        Ok(None)
    }

    /// The child of a held fork not settled yet.
    fn held_fork_child(&self) -> Option<i32> {
        None
    }

    /// Serves the debugger's request about the held fork child it keeps as a process of its
    /// own (see [`crate::target::Target::held_child`]).
    fn held_child(&mut self, request: HeldChildRequest) -> TargetResult<HeldChildReply> {
        let _ = request;
        Err(crate::target::TargetError::Unexpected {
            pid: 0,
            what: "this backend holds no forked child".into(),
        })
    }

    /// The `siginfo_t` of the signal thread `tid` is stopped with at the present (GDB's
    /// `$_siginfo`: a fault's address and cause, a signal's sender), as the kernel filled it;
    /// `None` (the default) if it did not stop with a signal or the backend cannot tell.
    fn stop_siginfo(&self, _tid: i32) -> Option<Vec<u8>> {
        None
    }

    /// The register file thread `tid` ended with, if it has exited and the backend kept it:
    /// with [`recorded_state`](Self::recorded_state), its exact registers at any earlier
    /// position are rebuilt from these (it has no present registers any more).
    fn exited_thread_registers(&self, _tid: i32) -> Option<X86Registers> {
        None
    }

    /// True once the process has exited or was killed.
    fn has_exited(&mut self) -> bool;

    /// Kills the process and reaps it.
    fn kill(&mut self) -> TargetResult<()>;

    /// Lets the process run on, untraced.
    fn detach(&mut self) -> TargetResult<()>;

    /// The store the trace is drained into (a shared handle).
    fn store(&self) -> TraceStore;

    /// Instructions the backend itself counted while recording, to check the decoded history
    /// against; `None` when it cannot count them (hardware: only the trace knows).
    fn recorded(&self) -> Option<u64>;

    /// A counter of the instructions executed under the backend's control, readable from
    /// another thread while the process runs (progress displays); `None` if it has none.
    fn step_counter(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicU64>> {
        None
    }

    /// Runs one system call in the stopped process without recording anything (see
    /// [`crate::target::Target::inject_syscall`]).
    fn inject_syscall(&mut self, nr: u64, args: [u64; 6]) -> TargetResult<u64>;

    /// Registers and overwritten memory of every recorded instruction, if the backend keeps
    /// them (the software backend's state log). Without it, the past is served PC-only.
    fn recorded_state(&self) -> Option<&dyn RecordedState> {
        None
    }

    /// Write watchpoints for forward runs from the present: `[addr, addr + len)` ranges the
    /// backend stops after a write to ([`StopEvent::Watch`]). Returns `false` when it cannot
    /// see writes (the timeline then refuses watchpoints: a run that never stops would be
    /// wrong).
    fn set_watches(&mut self, _ranges: &[(u64, u64)]) -> bool {
        false
    }

    /// Watchpoints of every kind the backend checks itself in the running program (QEMU's
    /// plugin sees every memory access), for a backend whose past is PC-only: they stop forward
    /// runs from the present ([`StopEvent::Watch`]) and nothing else. Returns `false` when it
    /// cannot (the default; the timeline then refuses them).
    fn set_live_watches(&mut self, _watches: &[(u64, u64, WatchKind)]) -> bool {
        false
    }

    /// Starts a forward run from the present; `record`: whether it is traced. Breakpoints are
    /// the backend's own ([`add_breakpoint`](Self::add_breakpoint)) for a run at full speed, or
    /// `bps` given to [`wait`](Self::wait) for a backend that stops after every instruction.
    fn resume(&mut self, how: Resume, record: bool) -> TargetResult<()>;

    /// Runs the forward run on until it stops (`Ok(None)`: still running, after a slice when
    /// `block` is false). `interrupt` is set when the debugger asked for a stop.
    fn wait(
        &mut self,
        block: bool,
        bps: &BTreeSet<u64>,
        interrupt: &AtomicBool,
    ) -> TargetResult<Option<StopEvent>>;

    /// Interrupts a run at full speed (the software backend's stepping loop checks the flag
    /// itself).
    fn interrupt(&mut self) -> TargetResult<()>;

    /// Called at every stop: makes the store hold the trace of everything executed up to the
    /// stop PC (closing the trace there, draining buffers). `Err` says why the trace may be
    /// incomplete (it is shown by `monitor stats`).
    fn sync_at_stop(&mut self, exited: bool) -> Result<(), String>;

    /// Backend-specific `monitor stats` lines (`line(key, value)`).
    fn stats(&self, line: &mut dyn FnMut(&str, String));

    /// Whether the last [`sync_at_stop`](Self::sync_at_stop) replaced the store's bytes instead
    /// of appending to them ([`TraceStore::replace`]): the history is then indexed again from
    /// the start. Positions up to the previous stop must decode the same in the new bytes.
    fn trace_rewritten(&mut self) -> bool {
        false
    }
}

/// What a backend that records more than the PC knows about the past: registers and memory
/// at every recorded position, and which instruction wrote what.
pub trait RecordedState {
    /// Recorded instructions.
    fn len(&self) -> u64;

    /// Whether nothing is recorded.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The register file before instruction `n`, rebuilt from `present`: general-purpose
    /// registers exact; vector/x87 state from the record or marked unavailable (never the
    /// present values). `None` beyond the record.
    fn registers_at(&self, n: u64, present: &X86Registers) -> Option<X86Registers>;

    /// Thread `tid`'s register file before (global) instruction `n`, rebuilt from its
    /// `present` registers: only that thread's changes are undone. A record of one thread:
    /// [`registers_at`](Self::registers_at).
    fn registers_at_thread(
        &self,
        _tid: i32,
        n: u64,
        present: &X86Registers,
    ) -> Option<X86Registers> {
        self.registers_at(n, present)
    }

    /// The thread that executed (global) instruction `n`, if the record knows it.
    fn thread_at(&self, _n: u64) -> Option<i32> {
        None
    }

    /// The same record with *global* positions (every thread's instructions in the order they
    /// ran: the positions of a multi-thread timeline), when this one's positions are one
    /// thread's; `None` when they already are global (or there is one thread).
    fn global(&self) -> Option<&dyn RecordedState> {
        None
    }

    /// The (global) position of thread `tid`'s own instruction `n` (`n` equal to its count:
    /// the end), if the record keeps threads apart; what orders the threads' histories exactly
    /// as the record does.
    fn global_of(&self, _tid: i32, _n: u64) -> Option<u64> {
        None
    }

    /// Puts back into `buf` (present memory at `addr`) every byte written since position `n`.
    fn memory_at(&self, n: u64, addr: u64, buf: &mut [u8]);

    /// The last write to one of `ranges` (`(addr, len)`) between positions `floor` and
    /// `before`, or the last entry there whose writes are not known, whichever is newer.
    fn rfind_write(&self, before: u64, floor: u64, ranges: &[(u64, u64)]) -> Option<PastWrite>;

    /// The first write to one of `ranges` by the instructions `from..to` (or entry with unknown
    /// writes), whichever is older.
    fn find_write(&self, from: u64, to: u64, ranges: &[(u64, u64)]) -> Option<PastWrite>;
}

/// A write a [`RecordedState`] search found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastWrite {
    /// The newest position whose state is before the write.
    pub before: u64,
    /// The oldest position whose state includes the write.
    pub after: u64,
    /// The lowest watched address known to be written; `None` when the search stopped only
    /// because the writes there are not known.
    pub addr: Option<u64>,
    /// Why the writes there are not all known, if they are not.
    pub unknown: Option<String>,
}

/// The present-state methods of a [`LiveBackend`] whose process is a
/// [`PtraceTarget`](crate::target::PtraceTarget) reached through `self.$get()` (a
/// `&mut PtraceTarget`): one definition for every ptrace-based backend.
macro_rules! ptrace_present_state {
    ($get:ident) => {
        fn exec_path(&mut self) -> Option<std::path::PathBuf> {
            crate::target::Target::exec_path(self.$get())
        }

        fn maps(&mut self) -> String {
            let pid = crate::target::Target::pid(self.$get());
            std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()
        }

        fn snapshot_image(&mut self) -> crate::target::TargetResult<crate::image::Image> {
            let t = self.$get();
            let pid = crate::target::Target::pid(t);
            crate::capture::soft::procmaps::capture_image(t)
                .map(|(image, _skipped)| image)
                .map_err(|e| crate::target::TargetError::Unexpected {
                    pid,
                    what: format!("cannot snapshot the code: {e}"),
                })
        }

        fn auxv(&mut self) -> crate::target::TargetResult<Vec<u8>> {
            crate::target::Target::auxv(self.$get())
        }

        fn read_registers(&mut self) -> crate::target::TargetResult<crate::target::X86Registers> {
            crate::target::Target::read_registers(self.$get())
        }

        fn write_registers(
            &mut self,
            regs: &crate::target::X86Registers,
        ) -> crate::target::TargetResult<()> {
            crate::target::Target::write_registers(self.$get(), regs)
        }

        fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> crate::target::TargetResult<usize> {
            crate::target::Target::read_memory(self.$get(), addr, buf)
        }

        fn write_memory(&mut self, addr: u64, data: &[u8]) -> crate::target::TargetResult<()> {
            crate::target::Target::write_memory(self.$get(), addr, data)
        }

        fn add_breakpoint(&mut self, addr: u64) -> crate::target::TargetResult<()> {
            match crate::target::Target::support_breakpoints(self.$get()) {
                Some(bp) => bp.add_breakpoint(addr),
                None => Ok(()),
            }
        }

        fn remove_breakpoint(&mut self, addr: u64) -> crate::target::TargetResult<bool> {
            match crate::target::Target::support_breakpoints(self.$get()) {
                Some(bp) => bp.remove_breakpoint(addr),
                None => Ok(false),
            }
        }

        fn inject_syscall(&mut self, nr: u64, args: [u64; 6]) -> crate::target::TargetResult<u64> {
            crate::target::Target::inject_syscall(self.$get(), nr, args)
        }

        fn take_notices(&mut self) -> Vec<crate::target::Notice> {
            crate::target::Target::take_notices(self.$get())
        }

        fn has_exited(&mut self) -> bool {
            crate::target::Target::has_exited(self.$get())
        }

        fn kill(&mut self) -> crate::target::TargetResult<()> {
            crate::target::Target::kill(self.$get())
        }

        fn detach(&mut self) -> crate::target::TargetResult<()> {
            crate::target::Target::detach(self.$get())
        }
    };
}
pub(crate) use ptrace_present_state;
