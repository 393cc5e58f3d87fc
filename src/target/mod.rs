//! Control of a live traced process through ptrace: start, attach, registers, memory, breakpoints.
//!
//! The [`Target`] trait is the small interface the GDB server drives. It follows gdbstub's
//! "implement only what you support" style: the required methods are the base (registers,
//! memory, resume, wait, kill), optional capabilities are reached through `support_*` methods
//! that return `None` by default ([`Target::support_breakpoints`]). A recording or replaying
//! layer implements `Target` by wrapping another `Target` (usually a [`PtraceTarget`]).
//!
//! # Driving a target from a recorder
//!
//! [`PtraceTarget`] also exposes synchronous primitives for a software trace backend that must
//! observe every instruction between two stops: [`PtraceTarget::single_step`] (step one
//! instruction and wait), [`PtraceTarget::cont`] + [`Target::wait`], [`Target::read_registers`]
//! / [`Target::read_memory`]. Breakpoints are only written into the tracee while it runs under
//! `cont`; whenever the target is stopped, memory reads see the original code bytes.

pub mod files;
mod procfs;
mod ptrace;
pub mod regs;

pub use files::{FileStat, TargetFile};
pub use procfs::{read_auxv, read_maps};
pub use ptrace::{PtraceTarget, SpawnOptions, ThreadStats, ThreadStop};
pub use regs::{Gprs, RegMask, X86Registers};

use std::fmt;
use std::path::PathBuf;

/// Errors of target control. Each carries the operation and the process or address concerned.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// A system call on the tracee failed.
    #[error("{op} on process {pid} failed: {source}")]
    Sys {
        /// What we were doing (`PTRACE_GETREGS`, `waitpid`, ...).
        op: &'static str,
        /// The process or thread id.
        pid: i32,
        /// The errno.
        source: nix::Error,
    },
    /// The program could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program path as given.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file under /proc could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No byte at this address could be read or written.
    #[error("memory at {addr:#x} is not accessible")]
    Memory {
        /// The first inaccessible address.
        addr: u64,
    },
    /// The process has exited; nothing can be done with it any more.
    #[error("process {pid} has exited")]
    Exited {
        /// The process id.
        pid: i32,
    },
    /// The process stopped in a way we did not expect (e.g. not at the exec trap after spawn).
    #[error("process {pid}: unexpected state: {what}")]
    Unexpected {
        /// The process id.
        pid: i32,
        /// Description.
        what: String,
    },
    /// The operation is not supported by this target.
    #[error("not supported: {0}")]
    Unsupported(&'static str),
}

/// Result of target operations.
pub type TargetResult<T> = Result<T, TargetError>;

/// How to resume a stopped target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// Run until something happens; deliver `signal` (a Linux signal number) first if given.
    Continue {
        /// Signal to deliver on resumption.
        signal: Option<i32>,
    },
    /// Execute one instruction; deliver `signal` first if given (the handler's first
    /// instruction is then the next stop, as on Linux).
    Step {
        /// Signal to deliver on resumption.
        signal: Option<i32>,
        /// The debugger lets the other threads run meanwhile (GDB's `vCont;s:T;c` for
        /// `next`/`step`/`stepi`); `false` with scheduler locking and for GDB's step over a
        /// breakpoint (`vCont;s:T` alone). A backend that holds the other threads during a
        /// step may report another thread's breakpoint hit instead when this is set.
        others: bool,
    },
}

/// The addresses a range step keeps stepping in: `[start, end)` (GDB's `vCont;r`, the line
/// being stepped). One stop is reported when the PC leaves the range, instead of one per
/// instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRange {
    /// The first address of the range.
    pub start: u64,
    /// The first address after it.
    pub end: u64,
}

impl StepRange {
    /// Whether `pc` is inside the range.
    pub fn contains(&self, pc: u64) -> bool {
        (self.start..self.end).contains(&pc)
    }
}

/// Why a resumed target stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopEvent {
    /// A software breakpoint was hit; the PC has been moved back to the breakpoint address.
    Breakpoint {
        /// The breakpoint address (the PC).
        pc: u64,
    },
    /// A single step completed.
    Step,
    /// A watchpoint triggered: memory at `addr` (inside a watched range) was written (or, for
    /// read and access watchpoints, read). Forward, the target stops after the accessing
    /// instruction; in reverse, before it (the state GDB sees is the one before the write).
    Watch {
        /// The lowest watched address accessed.
        addr: u64,
        /// The kind of the watchpoint hit.
        kind: WatchKind,
    },
    /// The program received a signal (Linux signal number); it is delivered only if the next
    /// resume passes it.
    Signal(i32),
    /// The program is exiting (`exit`, `exit_group` or a fatal signal) and is stopped at its
    /// end, still alive (`PTRACE_EVENT_EXIT`): registers and memory can be read; resuming lets it
    /// exit. Reported only by targets asked to stop there
    /// ([`PtraceTarget::set_stop_at_exit`]).
    Exiting {
        /// The signal it is dying of (`SIGKILL` from outside, a fatal signal passed on), or
        /// `None` for `exit`/`exit_group`.
        signal: Option<i32>,
    },
    /// The program exited with this status.
    Exited(i32),
    /// The program was killed by this signal.
    Killed(i32),
    /// The program forked (`fork`, or `clone` without `CLONE_VM`) and the debugger asked for
    /// fork events: the parent stands after the system call (in a step, or at the event stop
    /// in a full-speed run) and the child is held, stopped right after it, until the debugger
    /// says which one it keeps ([`Target::resolve_fork`]). Reported only by targets asked to
    /// ([`PtraceTarget::set_report_forks`]).
    Forked {
        /// The child's pid.
        child: i32,
        /// A `vfork` (`CLONE_VFORK`: `posix_spawn`, `system`): the child shares the parent's
        /// memory, and the parent stands at the system call's event stop (its registers
        /// already those after the call) until the child has exec'd or exited
        /// ([`StopEvent::VForkDone`]).
        vfork: bool,
    },
    /// The child of a reported vfork has exec'd or exited: the parent's memory is its own
    /// again (GDB puts its breakpoints back). Reported one instruction after the parent
    /// resumed, or at the event in a full-speed run.
    VForkDone,
    /// The program called exec and the debugger asked for exec events: the process (same
    /// pid, the exec'ing thread now its only one) stands at the new program's first
    /// instruction; [`Target::exec_path`] names the new executable. Reported only by targets
    /// asked to ([`PtraceTarget::set_report_execs`]).
    Exec,
    /// Execution (replay) reached an end of the recorded history: the beginning when going
    /// backward (`at_begin`), the live end when replaying forward. Only targets that support
    /// [`ReverseExecution`] report it.
    HistoryEnd {
        /// True at the oldest recorded instruction.
        at_begin: bool,
    },
}

/// Direction-reversed resumption, for targets with a recorded history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReverseResume {
    /// Go back one instruction.
    Step,
    /// Go back until a breakpoint address is reached (reported as [`StopEvent::Breakpoint`]
    /// with the PC at the breakpoint) or the history begins ([`StopEvent::HistoryEnd`]).
    Continue,
}

/// Reverse execution over a recorded history. The stop is collected with [`Target::wait`],
/// exactly as for a forward resume.
pub trait ReverseExecution {
    /// Starts a reverse step or continue.
    fn resume_reverse(&mut self, how: ReverseResume) -> TargetResult<()>;
}

/// Something the user should know that is not a stop: events we detect but do not follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The program forked (or vforked); the child runs untraced.
    Forked {
        /// The child's pid.
        child: i32,
        /// True for vfork / `CLONE_VFORK` (e.g. `posix_spawn`, `system`).
        vfork: bool,
    },
    /// The program forked under QEMU: the child runs on without the debugger (QEMU's
    /// user-mode gdbstub does not follow forks), its control flow still recorded by the plugin.
    ForkedUnderQemu {
        /// The child's pid.
        child: i32,
        /// The recording directory holding the child's streams.
        dir: PathBuf,
        /// Whether the directory outlives the session (`--trace-dir`, `monitor save`).
        kept: bool,
    },
    /// The program forked and the target follows the child
    /// ([`PtraceTarget::set_follow_fork_child`]); the parent runs on untraced.
    FollowedFork {
        /// The parent's pid (detached).
        parent: i32,
        /// The child's pid, the process from now on.
        child: i32,
    },
    /// The debugger keeps both processes of a fork (GDB's `detach-on-fork off`) and resumed
    /// the recorded one: the child stays stopped, held for it ([`Target::held_child`]).
    ForkChildKept {
        /// The process recorded.
        recorded: i32,
        /// The child, stopped and not recorded.
        child: i32,
    },
    /// The debugger ran the held fork child: it runs, not recorded, to its end.
    HeldChildRuns {
        /// The child.
        child: i32,
    },
    /// The debugger asked to step the held fork child, which is not recorded.
    HeldChildStepRefused {
        /// The child.
        child: i32,
    },
    /// The debugger resumed without settling a fork it was told of: it keeps both processes
    /// (GDB's `detach-on-fork off`), but one recording follows one process.
    BothForkSidesRefused {
        /// The process recorded from now on (the one the debugger resumed).
        kept: i32,
        /// The process detached, running free.
        detached: i32,
    },
    /// The program called exec; the old breakpoints and GDB's symbols are stale.
    Exec {
        /// The new executable, if it could be read from /proc.
        path: Option<PathBuf>,
    },
    /// The trace at a stop may not cover everything executed up to it (the capture could not
    /// complete it); reverse execution there may miss instructions.
    TraceIncomplete {
        /// What happened.
        what: String,
    },
    /// The program is exiting and stays stopped at its end: the recording ends here and the
    /// past stays available; a further continue ends the program.
    AtExit {
        /// The signal it is dying of, `None` for `exit`/`exit_group`.
        signal: Option<i32>,
    },
    /// The process vanished by a signal no stop could hold (SIGKILL from outside, under QEMU):
    /// its end is not a place in this session's history, but the recording on disk is whole
    /// and kept for `ptrewind replay`.
    RecordingKept {
        /// The signal that ended it.
        signal: i32,
        /// The recording directory.
        dir: PathBuf,
        /// Whether it was a temporary directory, kept now instead of removed.
        was_temporary: bool,
        /// Whether the session went on over a replay of it (the server's successor).
        replayed: bool,
    },
    /// A watchpoint was refused (GDB then says only that it could not insert a hardware
    /// watchpoint): the past is PC-only, so no write to a location, nor its earlier values, is
    /// known.
    WatchRefused {
        /// The capture backend (`qemu backend`, …) or `offline replay`.
        backend: String,
    },
    /// A watchpoint stop that is not right after the accessing instruction: the backend (QEMU)
    /// stops the thread at the end of the instruction's translated block.
    WatchStopAfterBlock {
        /// The instruction that accessed the watched location.
        insn: u64,
        /// Where the thread stopped.
        stop: u64,
    },
    /// Reverse execution or replay ran through a PC-only past with watchpoints of the running
    /// program set: they are not checked there.
    WatchPastUnchecked {
        /// The capture backend (`qemu backend`, …).
        backend: String,
    },
    /// The cursor moved into another program's part of the history (across an exec): the PCs,
    /// code and symbols the server shows there are that program's, but the debugger keeps the
    /// symbols of the file it loaded.
    ExecPeriod {
        /// That program's executable, if known.
        program: Option<PathBuf>,
        /// What began that period (`exec`, `munmap START-END`, ...; `None`: the first one).
        started_by: Option<String>,
        /// What ended that period (`None`: the present one).
        ended_by: Option<String>,
        /// The history position of its first instruction.
        first: u64,
        /// The position of the next program's first instruction (`None`: the present one).
        end: Option<u64>,
    },
    /// Replay stopped with watchpoints set at an instruction whose memory writes the recording
    /// does not know: a watched location may have changed there unseen.
    WatchUncertain {
        /// The history position of the stop.
        position: u64,
        /// Why the writes are not known.
        what: String,
    },
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::Forked { child, vfork } => write!(
                f,
                "the program {} child process {child}; the child is detached and runs untraced \
                 (following forks is not supported)",
                if *vfork { "vforked" } else { "forked" }
            ),
            Notice::ForkedUnderQemu { child, dir, kept } => {
                write!(
                    f,
                    "the program forked child process {child}; under QEMU it runs on without \
                     the debugger (QEMU's gdbstub does not follow forks), its trace recorded in \
                     {} ({child}-*.pt)",
                    dir.display()
                )?;
                if *kept {
                    write!(
                        f,
                        ": `ptrewind replay --qemu {} --pid {child}` serves it",
                        dir.display()
                    )?;
                } else {
                    write!(
                        f,
                        ", a temporary directory removed when this session ends (with \
                         --trace-dir DIR it is kept and `ptrewind replay --qemu DIR --pid \
                         {child}` serves it; `record --backend qemu --no-live --follow-fork \
                         child` serves the first child once the program has ended)"
                    )?;
                }
                write!(f, "; --backend ptrace follows forks live")
            }
            Notice::FollowedFork { parent, child } => write!(
                f,
                "the program forked child process {child}; following the child (--follow-fork \
                 child): the parent {parent} is detached and runs untraced; the recording goes \
                 on in the child"
            ),
            Notice::ForkChildKept { recorded, child } => write!(
                f,
                "the debugger keeps both processes of the fork (detach-on-fork off); ptrewind \
                 records one, {recorded}; child {child} stays stopped where fork returned in it \
                 (its own registers and memory) until the debugger runs, kills or detaches it; \
                 run, it is not recorded and runs to its end without stopping at breakpoints"
            ),
            Notice::HeldChildRuns { child } => write!(
                f,
                "process {child} (the fork's child) runs to its end, not recorded, without \
                 stopping at breakpoints"
            ),
            Notice::HeldChildStepRefused { child } => write!(
                f,
                "process {child} (the fork's child) is not recorded: it can be run to its end \
                 (continue), killed or detached, not stepped"
            ),
            Notice::BothForkSidesRefused { kept, detached } => write!(
                f,
                "the debugger keeps both processes of the fork (detach-on-fork off), but \
                 ptrewind records one process: {detached} was detached and runs free; the \
                 recording goes on in {kept} (set detach-on-fork on to choose with \
                 follow-fork-mode)"
            ),
            Notice::Exec { path } => write!(
                f,
                "the program called exec ({}); breakpoints were dropped and the debugger's \
                 symbols are stale (following exec is not supported)",
                path.as_ref()
                    .map_or_else(|| "unknown file".to_string(), |p| p.display().to_string())
            ),
            Notice::AtExit { signal } => {
                match signal {
                    Some(s) => {
                        let name = nix::sys::signal::Signal::try_from(*s)
                            .map_or("unknown", |s| s.as_str());
                        write!(f, "the program was killed by signal {s} ({name})")?;
                    }
                    None => write!(f, "the program is exiting")?,
                }
                write!(
                    f,
                    ": it stays stopped at its end, where the recording ends; reverse execution \
                     and monitor commands (history, calls, save, ...) work from here; continue \
                     again to let it exit"
                )
            }
            Notice::RecordingKept {
                signal,
                dir,
                was_temporary,
                replayed,
            } => {
                let name =
                    nix::sys::signal::Signal::try_from(*signal).map_or("unknown", |s| s.as_str());
                let kept = if *was_temporary {
                    " (kept, not removed: delete it when done)"
                } else {
                    ""
                };
                if *replayed {
                    write!(
                        f,
                        "the program was killed by signal {signal} ({name}), which no stop can \
                         hold: the session goes on over a replay of every thread's recording up \
                         to there, in {}{kept}; reverse execution and monitor commands work from \
                         this end (PC-only past)",
                        dir.display()
                    )
                } else {
                    write!(
                        f,
                        "the program was killed by signal {signal} ({name}), which no stop can \
                         hold, so this session cannot go back from its end; every thread's \
                         recording up to there is in {}{kept}: ptrewind replay --qemu {} serves it",
                        dir.display(),
                        dir.display()
                    )
                }
            }
            Notice::WatchRefused { backend } => write!(
                f,
                "watchpoints are refused here: this recording's past is PC-only ({backend}), \
                 so which instruction wrote a location, and its earlier values, are \
                 not known; delete the watchpoint to go on. Watchpoints need the state log \
                 of the ptrace backend (record --backend ptrace), or a running program under \
                 the qemu backend"
            ),
            Notice::WatchStopAfterBlock { insn, stop } => write!(
                f,
                "the watched location was accessed by the instruction at {insn:#x}; under QEMU \
                 the thread stops at the end of that instruction's translated block, at \
                 {stop:#x} (the instructions in between have run)"
            ),
            Notice::WatchPastUnchecked { backend } => write!(
                f,
                "watchpoints are checked only in the running program: this recording's past \
                 is PC-only ({backend}), so which instruction wrote a location, and its earlier \
                 values, are not known; reverse execution and replay in the past do not stop at \
                 watched accesses. For watchpoints in the past: record --backend ptrace \
                 (state log)"
            ),
            Notice::TraceIncomplete { what } => write!(
                f,
                "the recorded trace at this stop may be incomplete: {what} (monitor stats)"
            ),
            Notice::ExecPeriod {
                program,
                started_by,
                ended_by,
                first,
                end,
            } => {
                let name = program.as_ref().map_or_else(
                    || "an unknown program".to_string(),
                    |p| p.display().to_string(),
                );
                let mut span = match end {
                    Some(end) => format!("instructions {first}..{end}"),
                    None => format!("from instruction {first}"),
                };
                match started_by.as_deref() {
                    Some("exec") => span.push_str(", after the exec"),
                    Some(cause) => {
                        span.push_str(&format!(", after the code was replaced ({cause})"))
                    }
                    None => {}
                }
                match ended_by.as_deref() {
                    Some("exec") => span.push_str(", before its exec"),
                    Some(cause) => {
                        span.push_str(&format!(", before the code was replaced ({cause})"))
                    }
                    None => {}
                }
                write!(
                    f,
                    "now in the history of {name} ({span}): the code and the server's symbols \
                     (monitor history/calls/where) are that program's; the debugger keeps the \
                     symbols of the file it loaded (in GDB: file {name})"
                )
            }
            Notice::WatchUncertain { position, what } => write!(
                f,
                "stopped at instruction {position} with watchpoints set: its memory writes are \
                 not all recorded ({what}); a watched location may have changed here without \
                 the old value being known"
            ),
        }
    }
}

/// Software breakpoints (x86 `int3`).
pub trait Breakpoints {
    /// Adds a breakpoint at `addr`. Adding the same address twice is harmless.
    fn add_breakpoint(&mut self, addr: u64) -> TargetResult<()>;
    /// Removes a breakpoint; returns `false` if none was at `addr`.
    fn remove_breakpoint(&mut self, addr: u64) -> TargetResult<bool>;
    /// The current breakpoint addresses, sorted.
    fn breakpoint_addrs(&self) -> Vec<u64>;
}

/// What a watchpoint watches for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchKind {
    /// Writes (`watch`, `Z2`).
    Write,
    /// Reads (`rwatch`, `Z3`).
    Read,
    /// Reads and writes (`awatch`, `Z4`).
    Access,
}

/// Data watchpoints (GDB's "hardware" watchpoints, `Z2`–`Z4`).
pub trait Watchpoints {
    /// Watches `[addr, addr + len)` for `kind`. `Ok(false)`: this kind of watchpoint is not
    /// supported here (GDB then reports that it could not insert it).
    fn add_watchpoint(&mut self, addr: u64, len: u64, kind: WatchKind) -> TargetResult<bool>;
    /// Removes one watchpoint added with the same arguments; `false` if there was none.
    fn remove_watchpoint(&mut self, addr: u64, len: u64, kind: WatchKind) -> TargetResult<bool>;
}

/// What the debugger asks of a held fork child it keeps ([`Target::held_child`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldChildRequest {
    /// Its registers (it is stopped where the `fork` returned in it).
    Registers,
    /// `len` bytes of its memory at `addr` (its own copy, not the recorded process's).
    Memory {
        /// First address.
        addr: u64,
        /// Bytes wanted (at most this many are returned).
        len: usize,
    },
    /// Run it, unrecorded and without breakpoints, to its end: the reply is its exit.
    RunToEnd,
    /// Kill it.
    Kill,
    /// Detach it: it runs free.
    Detach,
}

/// The answer to a [`HeldChildRequest`].
#[derive(Clone, Debug)]
pub enum HeldChildReply {
    /// Its registers.
    Registers(Box<X86Registers>),
    /// The bytes read (fewer than asked where memory ends).
    Memory(Vec<u8>),
    /// It ended: [`StopEvent::Exited`] or [`StopEvent::Killed`].
    Ended(StopEvent),
    /// Done (killed or detached); it is no longer held.
    Done,
}

/// A debuggable process (live or recorded), as the GDB server sees it.
///
/// The *selected* thread (`tid()`) is the one that steps and whose registers are written; a
/// target with several threads lists them ([`Target::thread_ids`]) and reads each one's
/// registers ([`Target::read_thread_registers`]). By default only one thread (the main thread,
/// `tid() == pid()`) is debugged; see [`Notice`] for the events that are detected but not
/// followed.
pub trait Target {
    /// The process id.
    fn pid(&self) -> i32;
    /// The process recorded now: [`pid`](Self::pid) unless the target followed a fork child
    /// the debugger was not told of (`record --follow-fork child`: the debugger keeps the pid
    /// it first saw).
    fn current_pid(&self) -> i32 {
        self.pid()
    }
    /// The id of the selected thread (the one a stop is reported in).
    fn tid(&self) -> i32 {
        self.pid()
    }
    /// Every thread, the selected one first.
    fn thread_ids(&self) -> Vec<i32> {
        vec![self.tid()]
    }
    /// Makes `tid` the selected thread (GDB's `Hc`/`vCont` thread, or the thread of a reverse
    /// step); `false` if there is no such thread.
    fn select_thread(&mut self, tid: i32) -> bool {
        tid == self.tid()
    }
    /// Reads all registers of thread `tid` (the selected thread's by default).
    fn read_thread_registers(&mut self, tid: i32) -> TargetResult<X86Registers> {
        let _ = tid;
        self.read_registers()
    }
    /// The `siginfo_t` of the signal thread `tid` is stopped with (GDB's `$_siginfo`, served
    /// as `qXfer:siginfo:read`); `None` (the default) when it did not stop with a signal, in
    /// the past, or when the target cannot tell.
    fn stop_siginfo(&mut self, tid: i32) -> Option<Vec<u8>> {
        let _ = tid;
        None
    }
    /// The executable file, as an absolute path if known.
    fn exec_path(&self) -> Option<PathBuf>;
    /// Reads all registers of the stopped thread.
    fn read_registers(&mut self) -> TargetResult<X86Registers>;
    /// Writes all registers of the stopped thread.
    fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()>;
    /// Reads memory at `addr` into `buf`; returns how many leading bytes could be read
    /// (fewer than `buf.len()` when the range runs into an unmapped page). Reading zero bytes
    /// is an error ([`TargetError::Memory`]).
    fn read_memory(&self, addr: u64, buf: &mut [u8]) -> TargetResult<usize>;
    /// Writes all of `data` at `addr`.
    fn write_memory(&mut self, addr: u64, data: &[u8]) -> TargetResult<()>;
    /// Resumes the stopped target. The stop is collected with [`Target::wait`].
    fn resume(&mut self, how: Resume) -> TargetResult<()>;
    /// A step (`how` is a [`Resume::Step`]) repeated while the PC stays in `range`, with one
    /// stop at the end (or at a breakpoint, a signal, a watchpoint, another thread's stop).
    /// By default a single step: GDB then asks again while the PC is in the range, one round
    /// trip per instruction.
    fn resume_range(&mut self, how: Resume, range: StepRange) -> TargetResult<()> {
        let _ = range;
        self.resume(how)
    }
    /// Waits for the resumed target to stop. With `block == false` returns `Ok(None)` if it
    /// is still running.
    fn wait(&mut self, block: bool) -> TargetResult<Option<StopEvent>>;
    /// Asks a running target to stop (the stop is reported by [`Target::wait`] as
    /// `Signal(SIGINT)`).
    fn interrupt(&mut self) -> TargetResult<()>;
    /// Kills the process and reaps it.
    fn kill(&mut self) -> TargetResult<()>;
    /// Lets the process run on untraced (breakpoints removed).
    fn detach(&mut self) -> TargetResult<()>;
    /// True once the process has exited or was killed.
    fn has_exited(&self) -> bool;
    /// The auxiliary vector (raw bytes of /proc/PID/auxv).
    fn auxv(&self) -> TargetResult<Vec<u8>> {
        read_auxv(self.pid())
    }
    /// Runs one system call `nr` with `args` in the stopped process, outside of everything
    /// recorded: its registers and the two code bytes used are restored afterwards, and no
    /// program code runs. Returns the call's raw result (negative: `-errno`). For debugger
    /// requests such as LLDB's memory allocation (`_M`), which would otherwise run `mmap` in
    /// the program and enter its history.
    fn inject_syscall(&mut self, _nr: u64, _args: [u64; 6]) -> TargetResult<u64> {
        Err(TargetError::Unsupported(
            "running a system call in the process",
        ))
    }
    /// The dynamic loader's library list (`qXfer:libraries-svr4` XML) when it cannot be read
    /// from the process's memory, such as a saved recording's (`None`: read the memory).
    fn saved_library_list(&self) -> Option<String> {
        None
    }
    /// Opens `path` read-only as the program sees it, for the debugger's host I/O (GDB's
    /// `vFile:open`). Default: the file of this machine (regular files only, see
    /// [`files::open_host_file`]). A recording serves its own `/proc/PID/maps` and files.
    fn open_file(&mut self, path: &std::path::Path) -> std::io::Result<TargetFile> {
        files::open_host_file(path)
    }
    /// The target of the symbolic link `path` as the program sees it (`vFile:readlink`).
    fn read_link(&mut self, path: &std::path::Path) -> std::io::Result<PathBuf> {
        files::read_host_link(path)
    }
    /// Takes the notices collected since the last call.
    fn take_notices(&mut self) -> Vec<Notice> {
        Vec::new()
    }
    /// Whether forks are reported to the debugger ([`StopEvent::Forked`]): the server then
    /// advertises GDB's `fork-events`. Asked once per connection, after the debugger's
    /// `qSupported` (`client_wants` says whether it asked for them; `vforks`, whether vforks
    /// are to be reported too: a debugger that follows a vfork child must learn of the exec
    /// that usually comes next, so the server asks for both vfork and exec events).
    fn report_forks(&mut self, client_wants: bool, vforks: bool) -> bool {
        let _ = (client_wants, vforks);
        false
    }
    /// Whether exec is reported to the debugger ([`StopEvent::Exec`]): the server then
    /// advertises GDB's `exec-events`. Asked once per connection, after the debugger's
    /// `qSupported` (`client_wants` says whether it asked for them).
    fn report_execs(&mut self, client_wants: bool) -> bool {
        let _ = client_wants;
        false
    }
    /// Settles the fork reported by the last [`StopEvent::Forked`]: the debugger detaches
    /// process `detach` (the child: the parent stays the process; the parent: the child
    /// becomes the process, its history going on from the parent's). `Ok(None)` when no fork
    /// waits or `detach` is neither side; `Ok(Some(pid))`: the process from now on.
    fn resolve_fork(&mut self, detach: i32) -> TargetResult<Option<i32>> {
        let _ = detach;
        Ok(None)
    }
    /// The child of a fork reported and not yet settled ([`Target::resolve_fork`]).
    fn held_fork_child(&self) -> Option<i32> {
        None
    }
    /// Serves the debugger's request about the held fork child
    /// ([`held_fork_child`](Self::held_fork_child)) while it keeps it as a process of its own
    /// (GDB's `detach-on-fork off`): it is stopped, traced and not recorded.
    fn held_child(&mut self, request: HeldChildRequest) -> TargetResult<HeldChildReply> {
        let _ = request;
        Err(TargetError::Unexpected {
            pid: self.pid(),
            what: "no forked child is held".into(),
        })
    }
    /// Software breakpoints, if supported.
    fn support_breakpoints(&mut self) -> Option<&mut dyn Breakpoints> {
        None
    }
    /// Data watchpoints, if supported (asked at every `Z2`–`Z4`).
    fn support_watchpoints(&mut self) -> Option<&mut dyn Watchpoints> {
        None
    }
    /// Reverse execution, if this target has a history. The GDB server advertises
    /// `ReverseStep+`/`ReverseContinue+` (and accepts `bs`/`bc`) only when this returns
    /// `Some` at connection time.
    fn support_reverse(&mut self) -> Option<&mut dyn ReverseExecution> {
        None
    }
}
