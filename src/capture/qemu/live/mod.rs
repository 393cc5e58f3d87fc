//! The QEMU backend live: the program runs under `qemu-x86_64` with the ptrewind plugin *and*
//! QEMU's gdbstub, so a debugger can stop it, look at it and go back in its history while it
//! runs.
//!
//! * **present** — registers, memory, breakpoints, run control and the auxiliary vector come
//!   from the gdbstub through [`Remote`] (QEMU's translator breakpoints; a breakpoint at
//!   the resume PC is lifted for one step, since QEMU would report it again at once; `Ctrl-C` is
//!   a `SIGINT` to QEMU, see [`super::remote`]).
//! * **past** — the plugin's stream of every thread (`streams.rs`; the main thread's is the
//!   store the timeline's own history reads, the others go to the multi-thread live history
//!   through `LiveBackend::thread_stores`). At every stop the bytes the plugin wrote to each
//!   thread's stream file since the last stop are read (the file only grows) and the stream is
//!   closed where the thread is from its tail file (the
//!   encoder bytes not yet written, the pending TNT bits, and the running block walked to the
//!   stop PC: [`complete_at_pc`]), followed by FUP + TIP.PGD. That closing part is provisional:
//!   the stream at the next stop runs on through it, so the next stop rewrites the store from
//!   the end of the written bytes ([`TraceStore::rewrite_from`]) and the history worker forgets
//!   and re-reads only from the last sync point before that offset. A stop costs the new bytes
//!   and one PSB period, not the whole trace. Positions before a stop decode the same in every
//!   later stream, so registers keyed at earlier stops stay valid.
//! * **what the past shows** — PC-only, as with the hardware backend: RIP everywhere, the full
//!   register file at every stop (and where the program started), memory only from read-only
//!   code.
//!
//! * **threads** — every thread the stub lists is served at the present (a stop is reported in
//!   its thread; registers and steps apply to the selected one). QEMU 7.2's stub stops only the
//!   reporting thread, so the plugin's pause gate holds the others while the program is stopped
//!   (see `set_gate` and docs/qemu-gdbstub.md).
//!
//! * **watchpoints** — served by the plugin, which sees every memory access (the stub has none
//!   in user mode): see `watch.rs`.
//!
//! Limits (QEMU 7.2): the past is PC-only for every thread; a watchpoint stop lands at the end
//! of the translated block of the access.

use std::collections::{BTreeSet, HashSet};
use std::ffi::OsString;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::recording::{QemuConfig, QemuError, QemuRecording, Recorded, loader_mappings};
use super::remote::launch::{LaunchError, connect_socket};
use super::remote::{
    Action, BreakKind, Remote, RemoteError, RemoteOptions, ResumeAction, StopReply, ThreadId,
    gdb_signal,
};
use crate::capture::LiveBackend;
use crate::image::Image;
use crate::store::live::TraceStore;
use crate::target::regs::gpr;
use crate::target::{RegMask, Resume, StopEvent, TargetError, TargetResult, X86Registers};

mod backend;
mod streams;
mod watch;

/// How long a single step holds the other threads before they are let go.
const STEP_HOLD_LIMIT: Duration = Duration::from_millis(500);
/// How often a single step that has not ended lets each held thread run the one block it waits
/// at (see [`super::output::pause_gate::PULSE`]).
const STEP_PULSE: Duration = Duration::from_millis(6);

/// Linux signal number → GDB's (they differ above 6 for a few: SIGBUS, SIGUSR1/2, SIGCHLD…).
pub fn gdb_from_linux(sig: i32) -> u8 {
    match sig {
        7 => 10,  // SIGBUS
        10 => 30, // SIGUSR1
        12 => 31, // SIGUSR2
        16 => 0,  // SIGSTKFLT: none
        17 => 20, // SIGCHLD
        18 => 19, // SIGCONT
        19 => 17, // SIGSTOP
        20 => 18, // SIGTSTP
        23 => 16, // SIGURG
        29 => 23, // SIGIO
        30 => 32, // SIGPWR
        31 => 12, // SIGSYS
        s @ 1..=31 => s as u8,
        _ => 0,
    }
}

/// GDB signal number → Linux's (the inverse of [`gdb_from_linux`] for 1..=31).
pub fn linux_from_gdb(sig: u8) -> i32 {
    (1..=31)
        .find(|&l| gdb_from_linux(l) == sig)
        .unwrap_or(i32::from(sig))
}

/// A program under QEMU with the plugin and the gdbstub, as a [`LiveBackend`].
pub struct QemuLive {
    rec: QemuRecording,
    remote: Remote<UnixStream>,
    /// The traced thread (the main thread: its id is the process id).
    main: ThreadId,
    program: PathBuf,
    /// Every guest thread's stream (ended threads too), the main thread's first: what the
    /// history of each thread is indexed from.
    streams: Vec<streams::LiveStream>,
    /// The code image and the mappings text it was built from.
    code: Option<(String, Image)>,
    /// At the last stop, over every thread: stream bytes read, provisional bytes written.
    last_sync: (u64, u64),
    /// The plugin's exit gate (`exit_stop`), once opened.
    gate: Option<std::fs::File>,
    /// Held at `exit_group` by the gate: the call and the PC of its SYSCALL.
    at_exit: Option<ExitCall>,
    bps: HashSet<u64>,
    /// Breakpoints the debugger took out while the program was stopped, until it runs on
    /// (GDB lifts every breakpoint at a stop and puts them back as it resumes, all but the one
    /// a step over a breakpoint passes): still published to the plugin, so a held thread that
    /// reaches one meanwhile waits there (see `publish_breakpoints`).
    lifted: HashSet<u64>,
    /// Whether the breakpoints (`bps`) are inserted in QEMU's stub. A step that holds the
    /// other threads takes them out (see [`QemuLive::place_stub_breakpoints`]); a continue,
    /// or a step over a system call, puts them back.
    bps_in_stub: bool,
    /// The event a resume already met (a step over a breakpoint that stopped elsewhere).
    early: Option<StopEvent>,
    /// The current run is a single step.
    stepping: bool,
    /// A single step holding the other threads: when it started, the last pulse, and the
    /// thread let run (see `STEP_PULSE`).
    step_hold: Option<(std::time::Instant, std::time::Instant, u32)>,
    /// A `SIGINT` was sent for an interrupt.
    interrupted: bool,
    running: bool,
    exited: bool,
    /// The debugger detached: the program runs on under QEMU, on its own (not killed at drop).
    detached: bool,
    /// Forked children already told of (see `streams::forked_pids`).
    forks_seen: BTreeSet<u32>,
    /// Notices for the debugger's console, other than the watchpoints'.
    notices: Vec<crate::target::Notice>,
    /// How the last stream was completed, and problems met at stops.
    last_completion: Option<String>,
    stops: u64,
    stop_errors: Vec<String>,
    /// The thread of the last stop (the one QEMU's gdbstub reported, or one waiting at the
    /// pause gate right at a breakpoint, reported from there).
    stop_thread: ThreadId,
    /// The thread QEMU's gdbstub reported last: the one inside the stub while the program is
    /// stopped.
    in_stub: ThreadId,
    /// The thread registers are read from and a step moves (the debugger's `Hg`/`Hc`).
    selected: ThreadId,
    /// Every guest thread at the last stop, the main thread first.
    thread_list: Vec<ThreadId>,
    /// `thread_list` is to be listed again (at the next stop the timeline syncs: a range step's
    /// intermediate steps do not ask QEMU for its threads each time).
    threads_stale: bool,
    /// The registers of the last stop reply's thread, read for that reply (one `g`, which the
    /// debugger and the timeline ask for next anyway; a range step reads them after every
    /// step), until the program runs or its registers are written.
    stop_regs: Option<(ThreadId, X86Registers)>,
    /// The plugin's pause gate (see [`super::output::PAUSE_FILE`]), once opened.
    pause: Option<std::fs::File>,
    /// The terminal's Ctrl-C reaches QEMU itself (it shares the debugger's terminal).
    terminal_interrupts: bool,
    /// A stop reply received while an interrupt waited for one (handed out by `wait`).
    stashed: Option<StopReply>,
    /// Pulses sent (the pause file's `PULSE` word).
    pulses: u64,
    /// How QEMU was run (for `monitor stats`).
    qemu_exe: String,
    /// Watchpoints, served by the plugin (see `watch.rs`).
    watches: watch::Watches,
}

impl std::fmt::Debug for QemuLive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QemuLive")
            .field("pid", &self.rec.pid())
            .field("dir", &self.rec.dir())
            .finish_non_exhaustive()
    }
}

/// The traced process held at its `exit_group` by the plugin's exit gate: the gdbstub does not
/// answer while it is held (the vCPU is inside the plugin), so the present is what the call
/// says (its number and arguments, the PC of its SYSCALL) and memory read from QEMU's process.
#[derive(Debug, Clone, Copy)]
struct ExitCall {
    num: u64,
    args: [u64; 6],
    pc: u64,
}

/// Why the live QEMU backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum QemuLiveError {
    /// Launching QEMU with the plugin.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// Connecting to the gdbstub.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The gdbstub handshake.
    #[error("gdbstub: {0}")]
    Remote(#[from] RemoteError),
}

fn remote_err(pid: u32) -> impl Fn(RemoteError) -> TargetError {
    move |e| TargetError::Unexpected {
        pid: pid as i32,
        what: format!("qemu gdbstub: {e}"),
    }
}

impl QemuLive {
    /// Starts `program args` under QEMU with the plugin (`config`) and the gdbstub on a UNIX
    /// socket in the (private) recording directory; the program is stopped at its first
    /// instruction.
    pub fn spawn(
        config: &QemuConfig,
        program: &Path,
        args: &[OsString],
        configure: impl FnOnce(&mut std::process::Command),
    ) -> Result<QemuLive, QemuLiveError> {
        // The socket lives in a private directory of its own (the recording directory may be
        // one the user named).
        let sock_dir = tempfile::Builder::new()
            .prefix("ptrewind-gdb-")
            // Private: whoever connects to the socket first controls the program.
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(LaunchError::TempDir)?;
        let sock = sock_dir.path().join("gdb");
        let mut config = config.clone();
        // Hold the other threads while one is stopped in the gdbstub (see `set_gate`).
        config.pause = true;
        // QEMU runs from an unlinked copy of itself (see `unlinked_copy`); kept open until
        // QEMU has started.
        let copy = unlinked_copy(&config.qemu);
        let qemu_exe = match &copy {
            Ok((fd, _)) => {
                use std::os::fd::AsRawFd;
                config.qemu = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                "an unlinked copy (so LLDB does not take QEMU for the program)".to_string()
            }
            Err(e) => format!(
                "as installed (no unlinked copy: {e}; LLDB will name the executable after QEMU)"
            ),
        };
        config.qemu_args.push("-g".into());
        config.qemu_args.push(sock.clone().into_os_string());
        let arg0 = copy.as_ref().ok().map(|(_, path)| path.clone());
        let mut rec = QemuRecording::spawn_with(&config, program, args, |cmd| {
            use std::os::unix::process::CommandExt;
            if let Some(name) = &arg0 {
                // Its command line names QEMU, not the memory file it runs from.
                cmd.arg0(name);
            }
            // (QEMU dies with the debugger's server thread: `spawn_with` sets
            // PR_SET_PDEATHSIG.)
            configure(cmd);
        })?;
        let qemu_name = arg0.unwrap_or_else(|| config.qemu.clone());
        drop(copy);
        let stream = connect_socket(rec.child_mut(), &qemu_name, &sock, Duration::from_secs(20))?;
        // Connected: the socket file is no longer needed.
        drop(sock_dir);
        let remote = Remote::connect(stream, RemoteOptions::default())?;
        let main = remote.initial_stop().thread().unwrap_or(ThreadId {
            pid: Some(1),
            tid: i64::from(rec.pid()),
        });
        let program = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
        let mut live = QemuLive {
            rec,
            remote,
            main,
            program,
            streams: vec![streams::LiveStream::new(
                u32::try_from(main.tid).unwrap_or(0),
                TraceStore::new(),
            )],
            code: None,
            last_sync: (0, 0),
            gate: None,
            at_exit: None,
            bps: HashSet::new(),
            lifted: HashSet::new(),
            bps_in_stub: true,
            early: None,
            stepping: false,
            step_hold: None,
            interrupted: false,
            running: false,
            exited: false,
            detached: false,
            forks_seen: BTreeSet::new(),
            notices: Vec::new(),
            last_completion: None,
            stops: 0,
            stop_errors: Vec::new(),
            stop_thread: main,
            in_stub: main,
            selected: main,
            thread_list: vec![main],
            threads_stale: false,
            stop_regs: None,
            pause: None,
            terminal_interrupts: false,
            stashed: None,
            pulses: 0,
            qemu_exe,
            watches: watch::Watches::default(),
        };
        // Stopped at the first instruction: threads started while stopped wait (see
        // `set_gate`).
        live.set_gate(true);
        Ok(live)
    }

    /// The guest's code now: built from the recording directory's mappings when they changed
    /// since the last call.
    fn code_image(&mut self) -> Result<&Image, String> {
        let rec = Recorded::open_layout(self.rec.dir())
            .map_err(|e| format!("reading the recording directory: {e}"))?;
        let key: String = rec.maps.iter().map(|(_, text)| text.as_str()).collect();
        if self.code.as_ref().is_none_or(|(k, _)| *k != key) {
            self.code = Some((key, rec.mmap_image().image));
        }
        Ok(&self.code.as_ref().ok_or("no code image")?.1)
    }

    /// Whether the plugin holds the process at its `exit_group` (the gate says WAITING); if so
    /// the call is kept in `at_exit`.
    fn check_exit_gate(&mut self) -> TargetResult<bool> {
        use super::output::exit_gate as g;
        use std::os::unix::fs::FileExt;
        if self.gate.is_none() {
            let path = self.rec.dir().join(super::output::EXIT_FILE);
            match std::fs::File::options().read(true).write(true).open(&path) {
                Ok(f) => self.gate = Some(f),
                Err(_) => return Ok(false),
            }
        }
        let Some(f) = self.gate.as_ref() else {
            return Ok(false);
        };
        let mut words = [0u8; g::SIZE as usize];
        if f.read_exact_at(&mut words, 0).is_err() {
            return Ok(false);
        }
        let w = |i: usize| u64::from_ne_bytes(words[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        if w(g::STATE) != g::WAITING {
            return Ok(false);
        }
        let mut args = [0u64; 6];
        for (i, a) in args.iter_mut().enumerate() {
            *a = w(g::ARGS + i);
        }
        // The SYSCALL is the last instruction of the block that was running (the call is not
        // executed yet: the history ends before it).
        let pid = self.pid();
        let tid = u32::try_from(self.main.tid).unwrap_or(0);
        let tail = std::fs::read(super::output::stream_path(
            self.rec.dir(),
            pid as u32,
            tid,
            "tail",
        ))
        .ok()
        .and_then(|d| super::output::TailState::read(&d));
        let Some((start, insns, _, _)) = tail.and_then(|t| t.in_flight) else {
            return Err(TargetError::Unexpected {
                pid,
                what: "held at exit_group, but the running block is unknown".into(),
            });
        };
        let image = self
            .code_image()
            .map_err(|what| TargetError::Unexpected { pid, what })?;
        let mut pc = start;
        for _ in 1..insns {
            let mut b = [0u8; 15];
            let n = image.read(pc, &mut b);
            match crate::capture::soft::classify::decode_insn(pc, &b[..n]) {
                Some(i) => pc = i.nlip(),
                None => break,
            }
        }
        self.at_exit = Some(ExitCall {
            num: w(g::NUM),
            args,
            pc,
        });
        Ok(true)
    }

    /// Lets the process held at its `exit_group` go on (and exit).
    fn release_exit(&mut self) -> TargetResult<()> {
        if self.at_exit.take().is_none() {
            return Ok(());
        }
        self.open_exit_gate()
    }

    /// Lets the program's `exit_group` go: one that waits now, and (the plugin checks first)
    /// any later one, which is then not held at all (after a detach nobody serves the end).
    fn open_exit_gate(&mut self) -> TargetResult<()> {
        use super::output::exit_gate as g;
        use std::os::unix::fs::FileExt;
        let pid = self.pid();
        let f = self
            .gate
            .as_ref()
            .ok_or(TargetError::Unsupported("no exit gate"))?;
        f.write_all_at(&g::RELEASED.to_ne_bytes(), (g::STATE * 8) as u64)
            .map_err(|e| TargetError::Unexpected {
                pid,
                what: format!("releasing the exit gate: {e}"),
            })
    }

    /// Registers at the held `exit_group`: RIP at the SYSCALL, RAX the call number and the
    /// argument registers; every other register is unavailable.
    fn exit_registers(x: &ExitCall) -> X86Registers {
        let mut r = X86Registers {
            xsave: vec![0; 512],
            ..X86Registers::default()
        };
        r.gprs[gpr::RIP] = x.pc;
        r.gprs[gpr::RAX] = x.num;
        r.gprs[gpr::ORIG_RAX] = x.num;
        for (slot, v) in [gpr::RDI, gpr::RSI, gpr::RDX, gpr::R10, gpr::R8, gpr::R9]
            .into_iter()
            .zip(x.args)
        {
            r.gprs[slot] = v;
        }
        // GDB numbers: rax 0, rdx 3, rsi 4, rdi 5, r8 8, r9 9, r10 10 are known.
        let known = [0u32, 3, 4, 5, 8, 9, 10]
            .iter()
            .fold(0u128, |m, &n| m | 1u128 << n);
        r.unavailable = RegMask(RegMask::ALL_BUT_PC.0 & !known);
        r
    }

    /// Guest memory read from QEMU's own process while the gdbstub cannot answer (held at
    /// exit): guest addresses are host addresses plus the guest base.
    fn read_memory_direct(&mut self, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        use std::os::unix::fs::FileExt;
        let pid = self.pid();
        let base = Recorded::open_layout(self.rec.dir())
            .ok()
            .and_then(|r| {
                r.maps.iter().find_map(|(_, t)| {
                    t.split_whitespace()
                        .find_map(|w| w.strip_prefix("guest_base="))
                        .and_then(|b| b.parse::<i64>().ok())
                })
            })
            .unwrap_or(0);
        let mem = std::fs::File::open(format!("/proc/{pid}/mem")).map_err(|e| {
            TargetError::Unexpected {
                pid,
                what: format!("reading QEMU's memory at exit: {e}"),
            }
        })?;
        match mem.read_at(buf, addr.wrapping_add(base as u64)) {
            Ok(n) => Ok(n),
            Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(0),
            Err(e) => Err(TargetError::Unexpected {
                pid,
                what: format!("reading QEMU's memory at exit: {e}"),
            }),
        }
    }

    /// The recording directory (every thread's stream; a temporary one is removed when the
    /// session ends unless [`remove_dir_at_end`](Self::remove_dir_at_end) says otherwise).
    pub fn dir(&self) -> &Path {
        self.rec.dir()
    }

    /// The program shares the debugger's terminal, whose Ctrl-C reaches QEMU directly: an
    /// interrupt first waits briefly for that stop instead of sending a second `SIGINT`
    /// (which would stop the program again after the next resume).
    pub fn terminal_interrupts(&mut self, on: bool) {
        self.terminal_interrupts = on;
    }

    /// Removes (the default) or keeps a temporary recording directory when the session ends
    /// (`monitor save` keeps a recording); a directory the configuration named is kept.
    pub fn remove_dir_at_end(&mut self, remove: bool) {
        self.rec.keep_dir(!remove);
    }

    fn err(&self) -> impl Fn(RemoteError) -> TargetError + use<> {
        remote_err(self.rec.pid())
    }

    /// The PC of thread `t`: where it waits at the pause gate (QEMU's own PC of a thread held
    /// inside a chain of translated blocks can be stale), else the gdbstub's.
    fn thread_pc(&mut self, t: ThreadId) -> TargetResult<u64> {
        if let Some(x) = self.at_exit
            && t == self.main
        {
            return Ok(x.pc);
        }
        if let Some(pc) = self.paused_pc(t) {
            return Ok(pc);
        }
        if let Some((s, r)) = &self.stop_regs
            && *s == t
        {
            return Ok(r.pc());
        }
        if self.at_exit.is_some() {
            // The gdbstub does not answer while the exit is held.
            return Err(TargetError::Unsupported(
                "another thread's PC while QEMU holds the program at its exit",
            ));
        }
        let e = self.err();
        self.remote.read_register_u64(Some(t), "rip").map_err(e)
    }

    /// Opens (`false`) or closes (`true`) the plugin's pause gate: while the debugger has the
    /// program stopped, every other guest thread waits at its next block start (or system call
    /// return). QEMU 7.2's user-mode gdbstub stops only the thread that reports, and a second
    /// thread entering the stub meanwhile would read the debugger's packets too. The gate is
    /// open during every resume (QEMU's exclusive work, e.g. flushing translations after a
    /// stop, needs every thread to leave its block).
    fn set_gate(&mut self, closed: bool) {
        self.set_gate_for(closed.then_some(0));
    }

    /// [`set_gate`](Self::set_gate) holding every thread but `run` (`Some(0)`: all; `None`:
    /// none).
    fn set_gate_for(&mut self, run: Option<u32>) {
        use super::output::pause_gate as g;
        // A step of one thread (`Some(tid)`): the others' watchpoint hits wait for a continue.
        self.publish_step(run.unwrap_or(0));
        self.write_gate_words(g::GATE, &[g::encode(run)]);
        if run.is_some() {
            // Stopped: a claim of the thread that reached the breakpoint is over.
            self.write_gate_words(g::CLAIM, &[0]);
        }
    }

    /// Tells the plugin the breakpoint addresses (it keeps the other threads back while one
    /// runs a block that may lead to one; see [`super::output::pause_gate::CLAIM`]), the
    /// lifted ones too: a held thread let out of its block during a step (QEMU's exclusive
    /// work) that comes to one of them while it is out of QEMU waits there, not moved by later
    /// pulses, and its hit is reported when the program runs on ([`Self::parked_at_breakpoint`]).
    /// Without that, such a thread ran through the breakpoint in the next pulse: a worker's hit
    /// was missed when two workers reached a breakpoint together.
    fn publish_breakpoints(&mut self) {
        use super::output::pause_gate as g;
        let mut words: Vec<u64> = self
            .bps
            .union(&self.lifted)
            .copied()
            .take(g::MAX_BPS)
            .collect();
        let n = words.len() as u64;
        // The addresses first, then the count: the plugin reads the count first. A thread
        // held right before a listed breakpoint does not take the list's rewriting for its
        // removal (`BPS_BUSY`).
        self.write_gate_words(g::BPS_BUSY, &[1]);
        self.write_gate_words(g::NBPS, &[0]);
        words.resize(g::MAX_BPS, 0);
        self.write_gate_words(g::BPS, &words);
        self.write_gate_words(g::NBPS, &[n]);
        self.write_gate_words(g::BPS_BUSY, &[0]);
    }

    /// Puts the breakpoints in QEMU's stub (`true`) or takes them out of it (`false`), once per
    /// change. Out of it during a step that holds the other threads: a held thread that a
    /// pulse (see [`pulse`](Self::pulse)) lets run one block could start its next block at a
    /// breakpoint, where QEMU's check (before the block runs, before any plugin callback)
    /// would take it into the stub beside the stepped thread — QEMU 7.2's user-mode stub then
    /// reads the debugger's packets from both, and GDB, sent the other thread's stop while the
    /// step is still in flight, failed its `finish_step_over` assertion. Out of the stub, the
    /// plugin holds that thread at the listed breakpoint (block start, or a callback right
    /// before it inside a block) and the next resume reports the hit. The stepped thread's own
    /// step stops after one instruction either way.
    fn place_stub_breakpoints(&mut self, inserted: bool) -> TargetResult<()> {
        if self.bps_in_stub == inserted {
            return Ok(());
        }
        let e = self.err();
        let mut bps: Vec<u64> = self.bps.iter().copied().collect();
        bps.sort_unstable();
        for bp in bps {
            if inserted {
                self.remote
                    .insert_breakpoint(BreakKind::Software, bp, 1)
                    .map_err(&e)?;
            } else {
                self.remote
                    .remove_breakpoint(BreakKind::Software, bp, 1)
                    .map_err(&e)?;
            }
        }
        self.bps_in_stub = inserted;
        Ok(())
    }

    /// Whether the instruction at `pc` enters the kernel (`syscall`, `sysenter`, `int 0x80`):
    /// a step over it may wait for another thread (a lock, a join), which the hold limit then
    /// lets run — with the breakpoints in QEMU, so that it stops at them. Unknown bytes count
    /// as a system call (the breakpoints stay in, as they were before steps lifted them).
    fn enters_kernel(&mut self, pc: u64) -> bool {
        let mut b = [0u8; 2];
        let got = self
            .code
            .as_ref()
            .map_or(0, |(_, image)| image.read(pc, &mut b));
        if got < 2 {
            match self.remote.read_memory(pc, 2) {
                Ok(v) if v.len() == 2 => b.copy_from_slice(&v),
                _ => return true,
            }
        }
        matches!(b, [0x0f, 0x05] | [0x0f, 0x34] | [0xcd, 0x80])
    }

    /// Lets every held thread run the one block it waits at (QEMU's exclusive work during a
    /// single step needs every thread out of its block); each waits again at its next block.
    fn pulse(&mut self) {
        self.pulses += 1;
        self.write_gate_words(super::output::pause_gate::PULSE, &[self.pulses]);
    }

    /// Waits (at most 60 s) for the stop of a single step taken with the other threads held:
    /// they are pulsed every [`STEP_PULSE`] and let go after [`STEP_HOLD_LIMIT`] (the stepped
    /// thread waits for one of them: a lock, a join).
    fn wait_step_held(&mut self) -> Result<Option<StopReply>, RemoteError> {
        let began = std::time::Instant::now();
        let mut pulsed = began;
        let mut held = true;
        while began.elapsed() < Duration::from_secs(60) {
            if let Some(stop) = self.remote.wait(Some(Duration::from_millis(2)))? {
                return Ok(Some(stop));
            }
            if held && began.elapsed() > STEP_HOLD_LIMIT {
                self.set_gate(false);
                held = false;
            } else if held && pulsed.elapsed() > STEP_PULSE {
                self.pulse();
                pulsed = std::time::Instant::now();
            }
        }
        Ok(None)
    }

    /// Lets `thread` run a single step the stub has just taken (its `vCont` acknowledged):
    /// opens the pause gate for it alone. A thread waiting at the gate, not the one in the stub
    /// (its stop was reported from the gate), is let go only once the stub has handled the
    /// `vCont` and set it stepping — the stub's thread no longer reads the debugger's socket
    /// (waited for at most 50 ms): let go before, it ran on freely (seen: to its exit, and the
    /// stub then refused the step with `E22`).
    fn let_step_go(&mut self, thread: ThreadId) {
        if thread != self.in_stub {
            let path = format!("/proc/{}/task/{}/syscall", self.pid(), self.in_stub.tid);
            let began = std::time::Instant::now();
            // `0`: read(2), where the stub waits for the debugger's bytes.
            while std::fs::read_to_string(&path).is_ok_and(|s| s.starts_with("0 "))
                && began.elapsed() < Duration::from_millis(50)
            {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        self.set_gate_for(Some(u32::try_from(thread.tid).unwrap_or(0)));
    }

    /// Writes words of the pause file from word `at`.
    fn write_gate_words(&mut self, at: usize, words: &[u64]) {
        use std::os::unix::fs::FileExt;
        if self.pause.is_none() {
            let path = self.rec.dir().join(super::output::PAUSE_FILE);
            match std::fs::File::options().read(true).write(true).open(&path) {
                Ok(f) => self.pause = Some(f),
                Err(e) => {
                    self.stop_errors
                        .push(format!("no pause gate ({}): {e}", path.display()));
                    return;
                }
            }
        }
        if let Some(f) = &self.pause {
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
            if let Err(e) = f.write_all_at(&bytes, (at * 8) as u64) {
                self.stop_errors.push(format!("pause gate: {e}"));
            }
        }
    }

    /// Where thread `t` waits at the pause gate: the start of the block it has not run yet
    /// (`None`: not waiting there, or waiting at a system call's return, where the gdbstub's
    /// PC is right).
    fn paused_pc(&mut self, t: ThreadId) -> Option<u64> {
        let tid = u64::try_from(t.tid).ok()?;
        self.pause_slots()
            .into_iter()
            .find(|&(w, _)| w == tid)
            .map(|(_, pc)| pc)
            .filter(|&pc| pc != 0)
    }

    /// Every thread waiting at the pause gate now: `(tid, the block start it waits at, 0 at a
    /// system call's return)`.
    fn pause_slots(&self) -> Vec<(u64, u64)> {
        use super::output::pause_gate as g;
        use std::os::unix::fs::FileExt;
        let Some(f) = self.pause.as_ref() else {
            return Vec::new();
        };
        let mut raw = vec![0u8; g::SIZE as usize];
        if f.read_exact_at(&mut raw, 0).is_err() {
            return Vec::new();
        }
        let word =
            |i: usize| u64::from_ne_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        (0..g::MAX_SLOTS)
            .map(|i| (word(g::SLOTS + 2 * i), word(g::SLOTS + 2 * i + 1)))
            .filter(|&(tid, _)| tid != 0)
            .collect()
    }

    /// A thread (not the one that stopped) waiting at the pause gate at the start of a block
    /// that begins at a breakpoint, and that breakpoint.
    fn parked_at_breakpoint(&self) -> Option<(ThreadId, u64)> {
        let slots = self.pause_slots();
        self.thread_list.iter().find_map(|t| {
            let (_, pc) = slots
                .iter()
                .find(|&&(w, pc)| i64::try_from(w) == Ok(t.tid) && pc != 0)?;
            (*t != self.stop_thread && self.bps.contains(pc)).then_some((*t, *pc))
        })
    }

    /// Waits (at most 50 ms) until every guest thread but the one that stopped is where a
    /// stop leaves it: at the pause gate (its slot published) or not running on a CPU (inside
    /// a system call). A thread still finishing the block it was in when the gate closed
    /// writes its stream and tail file until it reaches the gate.
    fn wait_for_threads_to_settle(&mut self) {
        let began = std::time::Instant::now();
        let pid = self.pid();
        loop {
            let slots = self.pause_slots();
            let running = self.thread_list.iter().any(|t| {
                *t != self.stop_thread
                    && !slots.iter().any(|&(w, _)| i64::try_from(w) == Ok(t.tid))
                    && std::fs::read_to_string(format!("/proc/{pid}/task/{}/stat", t.tid))
                        .ok()
                        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('R')))
                        .unwrap_or(false)
            });
            if !running || began.elapsed() > Duration::from_millis(50) {
                return;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// Lists the guest threads again (at a stop).
    fn refresh_threads(&mut self) {
        self.threads_stale = false;
        if self.exited {
            return;
        }
        // Held at its `exit_group` inside the plugin, the program has the stub say nothing: the
        // threads are those of the last stop, less the ones that have ended since.
        let listed = if self.at_exit.is_some() {
            Ok(self.thread_list.clone())
        } else {
            self.remote.threads()
        };
        if let Ok(mut list) = listed {
            // A thread that has made its `exit` call (the plugin ended its stream) is gone for
            // the program, though QEMU may still list it while it winds down, and its registers
            // can no longer be read (GDB: "Could not read registers").
            let dir = self.rec.dir().to_path_buf();
            let pid = self.rec.pid();
            list.retain(|t| {
                t.tid == self.main.tid
                    || u32::try_from(t.tid).is_ok_and(|tid| {
                        !super::output::stream_path(&dir, pid, tid, "json").exists()
                    })
            });
            if let Some(i) = list.iter().position(|t| t.tid == self.main.tid) {
                let m = list.remove(i);
                list.insert(0, m);
            }
            if !list.is_empty() {
                self.thread_list = list;
            }
        }
    }

    /// Our thread id of a gdbstub thread.
    fn thread_of(&self, tid: i32) -> Option<ThreadId> {
        self.thread_list
            .iter()
            .copied()
            .find(|t| t.tid == i64::from(tid))
    }

    /// Fails (the session cannot go on) if another thread's stop reply came while the program
    /// was stopped: two threads are inside QEMU's gdbstub. The pause gate and the claims keep
    /// that from happening for breakpoints reached directly and watchpoints, but a fault, a
    /// `SIGINT` sent while the program ran, or a breakpoint reached through an indirect branch
    /// enter the stub unclaimed. QEMU 7.2's user-mode stub then has both threads read the
    /// debugger's socket (the one that sent a stop reply waits for its `+` one byte at a time and
    /// sends the reply again for every other byte): resuming there wedged sessions until the
    /// debugger's timeout. Said at once instead, with where the recording is.
    pub(super) fn check_stub_alone(&self) -> TargetResult<()> {
        let pending = self.remote.pending_stops();
        if pending == 0 {
            return Ok(());
        }
        Err(TargetError::Unexpected {
            pid: self.rec.pid() as i32,
            what: format!(
                "{pending} more stop repl{} came from QEMU's gdbstub while thread {} was \
                 stopped: threads stopped together (e.g. two faults at once) and are inside \
                 QEMU 7.2's user-mode gdbstub at the same time, which cannot serve them (both \
                 read the debugger's connection); the program cannot be resumed reliably and \
                 the session ends here. Its recording up to this stop is in {} (kept with \
                 --trace-dir; replay it with `ptrewind replay --qemu DIR`)",
                if pending == 1 { "y" } else { "ies" },
                self.stop_thread.tid,
                self.rec.dir().display()
            ),
        })
    }

    /// Single-steps the traced thread over the breakpoint at its PC (QEMU reports a breakpoint
    /// at the resume PC again). `Some(event)`: the step stopped for something else.
    fn step_over_breakpoint(
        &mut self,
        thread: ThreadId,
        signal: Option<i32>,
    ) -> TargetResult<Option<StopEvent>> {
        let pc = self.thread_pc(thread)?;
        let e = self.err();
        // (Out of QEMU already, all of them, unless the step enters the kernel.)
        let in_stub = self.bps_in_stub;
        if in_stub {
            self.remote
                .remove_breakpoint(BreakKind::Software, pc, 1)
                .map_err(&e)?;
        }
        let action = match signal {
            Some(s) => Action::StepSignal(gdb_from_linux(s)),
            None => Action::Step,
        };
        self.stop_regs = None;
        self.remote
            .resume(&[ResumeAction {
                action,
                thread: Some(thread),
            }])
            .map_err(&e)?;
        self.let_step_go(thread);
        let stop = self.wait_step_held().map_err(&e);
        self.set_gate(true);
        if in_stub {
            self.remote
                .insert_breakpoint(BreakKind::Software, pc, 1)
                .map_err(&e)
                .ok();
        }
        let stop = stop?.ok_or_else(|| TargetError::Unexpected {
            pid: self.rec.pid() as i32,
            what: "a single step over a breakpoint did not stop within 60 s".into(),
        })?;
        let ev = self.event(stop, true)?;
        Ok((ev != StopEvent::Step).then_some(ev))
    }

    /// A stop reply as the timeline's event.
    fn event(&mut self, stop: StopReply, stepping: bool) -> TargetResult<StopEvent> {
        Ok(match stop {
            StopReply::Exited { status, .. } => {
                self.exited = true;
                StopEvent::Exited(i32::from(status))
            }
            StopReply::Terminated { signal, .. } => {
                self.exited = true;
                StopEvent::Killed(linux_from_gdb(signal))
            }
            StopReply::Signal { signal, thread, .. } => {
                let t = thread.unwrap_or(self.main);
                self.stop_thread = t;
                self.in_stub = t;
                self.selected = t;
                let regs = self.fetch_registers(t)?;
                let pc = regs.pc();
                self.stop_regs = Some((t, regs));
                // A watchpoint hit of this thread: its SIGTRAP (or the step it happened in).
                let watch = (signal == gdb_signal::TRAP)
                    .then(|| self.take_watch_hit(t.tid, pc))
                    .flatten();
                if let Some((addr, kind)) = watch {
                    StopEvent::Watch { addr, kind }
                } else if signal == gdb_signal::TRAP && self.bps.contains(&pc) && !stepping {
                    StopEvent::Breakpoint { pc }
                } else if signal == gdb_signal::TRAP && stepping {
                    StopEvent::Step
                } else if signal == gdb_signal::INT && std::mem::take(&mut self.interrupted) {
                    StopEvent::Signal(libc::SIGINT)
                } else {
                    StopEvent::Signal(linux_from_gdb(signal))
                }
            }
        })
    }

    fn gone(&mut self) -> StopEvent {
        self.exited = true;
        let status = self.rec.child_mut().wait().ok();
        use std::os::unix::process::ExitStatusExt;
        let ev = match status {
            Some(s) if s.signal().is_some() => StopEvent::Killed(s.signal().unwrap_or(9)),
            Some(s) => StopEvent::Exited(s.code().unwrap_or(0)),
            None => StopEvent::Killed(libc::SIGKILL),
        };
        if let StopEvent::Killed(signal) = ev {
            // QEMU itself died (SIGKILL from outside, or a crash of QEMU): no stop at the exit
            // or at the signal could hold the program, so this session cannot show its end.
            // The streams written so far are a whole recording: kept, not removed with a
            // temporary directory, and said.
            let removed = !self.rec.keeps_dir();
            self.rec.keep_dir(true);
            self.notices.push(crate::target::Notice::RecordingKept {
                signal,
                dir: self.rec.dir().to_path_buf(),
                was_temporary: removed,
                replayed: false,
            });
        }
        ev
    }
}

/// A copy of the QEMU binary `qemu` (a name is looked up in `PATH`) in an anonymous memory file
/// (`memfd_create`, close-on-exec), and the path it was copied from. QEMU run from it has a
/// `/proc/PID/exe` naming a file that does not exist: LLDB on this host names the main
/// executable after that link (its host platform's process info, not the stub's), and took
/// `qemu-x86_64` for the program (breakpoints by name resolved in QEMU's own symbols); when
/// the file the link names cannot be loaded it keeps the program it was given, as for any
/// remote target. QEMU does not need its own path in user mode (the guest's `/proc/self/exe` is
/// the program's).
fn unlinked_copy(qemu: &Path) -> std::io::Result<(std::os::fd::OwnedFd, PathBuf)> {
    let path = super::remote::launch::find_qemu(qemu.as_os_str())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()))?;
    let fd =
        nix::sys::memfd::memfd_create(c"ptrewind-qemu", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .map_err(std::io::Error::from)?;
    let mut out = std::fs::File::from(fd);
    let mut src = std::fs::File::open(&path)?;
    std::io::copy(&mut src, &mut out)?;
    Ok((out.into(), path))
}

/// Completes a live thread's stream at a stop at `pc`, after the `written` bytes of its stream
/// file: appends to `out` the encoder output not yet in the file, the pending TNT bits, then the
/// running block walked from its start to `pc` (its last instruction's outcome added when `pc`
/// is where it went: a TNT bit for a conditional branch, a TIP for an indirect one; a system
/// call the thread is inside of or returns from: TIP.PGD as the plugin writes it, then TIP.PGE
/// at `pc`), and
/// FUP(`pc`) + TIP.PGD, preceded by a TSC packet of `now` (the global clock at the stop, when
/// known: the thread's last run lasted until then, at most). The instruction at `pc` is not
/// counted as executed. Returns how it was done (for `monitor stats`).
pub fn complete_at_pc(
    written: u64,
    out: &mut Vec<u8>,
    tail: &super::output::TailState,
    pc: u64,
    now: Option<u64>,
    image: &Image,
) -> String {
    use crate::capture::soft::classify::decode_insn;
    use crate::flow::InsnClass;
    use crate::packet::{Encoder, IpKind, Packet, Tnt, encode_packet};
    let start_len = out.len();
    if tail.file_offset == written {
        out.extend_from_slice(&tail.bytes);
    }
    let mut enc = Encoder::new();
    if written == 0 && out.len() == start_len {
        enc.psb(out);
        let _ = encode_packet(&Packet::PsbEnd, out);
    }
    if tail.tnt.1 > 0 {
        let _ = encode_packet(&Packet::ShortTnt(Tnt::new(tail.tnt.0, tail.tnt.1)), out);
    }
    let mut note = format!("stream completed at the stop PC {pc:#x}");
    if let Some((start, insns, _, _)) = tail.in_flight {
        if !tail.tracing {
            let _ = encode_packet(
                &Packet::ModeExec {
                    csl: true,
                    csd: false,
                    iflag: false,
                },
                out,
            );
            let _ = enc.ip_packet(IpKind::TipPge, Some(start), out);
        }
        let mut ip = start;
        let mut done = 0u32;
        while ip != pc && done < insns {
            let mut b = [0u8; 15];
            let n = image.read(ip, &mut b);
            let Some(i) = decode_insn(ip, &b[..n]) else {
                note = format!("{note}; no code at {ip:#x} in the running block at {start:#x}");
                break;
            };
            done += 1;
            if done < insns {
                ip = i.nlip();
                continue;
            }
            // The block's last instruction: where it went is the stop PC.
            match i.class {
                InsnClass::CondBranch => {
                    let _ = encode_packet(
                        &Packet::ShortTnt(Tnt::new(u64::from(pc != i.nlip()), 1)),
                        out,
                    );
                }
                InsnClass::IndirectJump | InsnClass::IndirectCall | InsnClass::Return => {
                    let _ = enc.ip_packet(IpKind::Tip, Some(pc), out);
                }
                InsnClass::SysCall | InsnClass::SoftInt => {
                    // Stopped inside the call (or at its return): the thread left user space
                    // as the plugin's encoder writes it (TIP.PGD; INT n: FUP + TIP.PGD), and
                    // comes back at `pc` (TIP.PGE), where the stop's FUP + TIP.PGD below
                    // binds to nothing executed: the stream ends *at* `pc`.
                    if i.class == InsnClass::SoftInt {
                        let _ = enc.ip_packet(IpKind::Fup, Some(i.insn.ip()), out);
                    }
                    let _ = enc.ip_packet(IpKind::TipPgd, None, out);
                    let _ = encode_packet(
                        &Packet::ModeExec {
                            csl: true,
                            csd: false,
                            iflag: false,
                        },
                        out,
                    );
                    let _ = enc.ip_packet(IpKind::TipPge, Some(pc), out);
                }
                _ => {}
            }
            ip = pc;
        }
        note = format!("{note} ({done} of the {insns} instructions of the block at {start:#x})");
    }
    super::output::stamp_end(now, out);
    let _ = enc.ip_packet(IpKind::Fup, Some(pc), out);
    let _ = enc.ip_packet(IpKind::TipPgd, None, out);
    note
}

impl Drop for QemuLive {
    fn drop(&mut self) {
        // Never leave QEMU (and the guest) running behind: kill and reap it. A program the
        // debugger detached runs on to its end, and we wait for it (QEMU dies with us: it is
        // started with PR_SET_PDEATHSIG).
        if !self.exited && !self.detached {
            let _ = self.rec.child_mut().kill();
        }
        // Reaps it (at once when it has exited; std keeps the status of a reaped child).
        // Then `rec` removes a temporary recording directory (its `TempDir`).
        let _ = self.rec.child_mut().wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::qemu::output::started_stream;
    use crate::flow::{EventKind, FlowConfig, FlowDecoder, Item};
    use crate::image::Section;

    /// 0x1000 mov eax,1; 0x1005 add eax,2; 0x1008 jne 0x1020; … 0x1020 nop.
    fn image() -> Image {
        let mut code = vec![0x90u8; 0x30];
        code[..10].copy_from_slice(&[0xb8, 1, 0, 0, 0, 0x83, 0xc0, 2, 0x75, 0x16]);
        let mut img = Image::new();
        img.add(Section::new(0x1000, code, "test")).unwrap();
        img
    }

    /// A stream whose block at 0x1000 (`insns` instructions) is running, nothing of it
    /// written yet, tracing on from a PSB+ (with a TSC of `tsc`, if given) and TIP.PGE at the
    /// block start already in the file, completed at the stop `pc` with the clock `now`.
    fn stopped_stream(
        img: &Image,
        insns: u32,
        pc: u64,
        tsc: Option<u64>,
        now: Option<u64>,
    ) -> Vec<u8> {
        let (mut trace, tail) = started_stream(tsc, insns, u64::MAX);
        let written = trace.len() as u64;
        complete_at_pc(written, &mut trace, &tail, pc, now, img);
        trace
    }

    /// [`stopped_stream`] with no clock: the stream and its decoded IPs and errors.
    fn completed_stream(img: &Image, insns: u32, pc: u64) -> (Vec<u8>, Vec<u64>, Vec<String>) {
        let trace = stopped_stream(img, insns, pc, None, None);
        let mut dec = FlowDecoder::new(&trace, img, FlowConfig::default());
        let (mut ips, mut errors) = (Vec::new(), Vec::new());
        while let Some(item) = dec.next_item() {
            match item {
                Item::Insn(i) => ips.push(i.ip),
                Item::Event(e) => {
                    if let EventKind::Error { kind, .. } = &e.kind {
                        errors.push(kind.to_string());
                    }
                }
            }
        }
        (trace, ips, errors)
    }

    /// The block of [`image`] (3 instructions) cut at `pc`: its IPs and decode errors.
    fn live_stream(pc: u64) -> (Vec<u64>, Vec<String>) {
        let (_, ips, errors) = completed_stream(&image(), 3, pc);
        (ips, errors)
    }

    #[test]
    fn a_live_stream_is_cut_at_the_stop_pc() {
        // A fault at the second instruction: only the first counts.
        assert_eq!(live_stream(0x1005), (vec![0x1000], vec![]));
        // Stopped where the block's branch went (taken, not taken): the whole block counts.
        assert_eq!(live_stream(0x1020), (vec![0x1000, 0x1005, 0x1008], vec![]));
        assert_eq!(live_stream(0x100a), (vec![0x1000, 0x1005, 0x1008], vec![]));
        // Stopped before the block ran (a breakpoint at its start): nothing counts.
        assert_eq!(live_stream(0x1000), (vec![], vec![]));
    }

    #[test]
    fn a_thread_inside_a_system_call_is_cut_after_it() {
        // 0x1000 mov eax,1; 0x1005 syscall; 0x1007 nop
        let mut code = vec![0x90u8; 0x10];
        code[..7].copy_from_slice(&[0xb8, 1, 0, 0, 0, 0x0f, 0x05]);
        let mut img = Image::new();
        img.add(Section::new(0x1000, code, "test")).unwrap();
        let (trace, ips, errors) = completed_stream(&img, 2, 0x1007);
        assert_eq!((ips, errors), (vec![0x1000, 0x1005], vec![]));
        // Its place at the stop is after the call (where it goes on): what the thread group
        // shows at its end.
        let clock = crate::history::ThreadClock::from_trace(&trace, &img, &FlowConfig::default());
        assert_eq!((clock.len(), clock.stop_ip()), (2, Some(0x1007)));
    }

    /// The clock at the stop ends the stopped thread's last run: the stream's last stamp is
    /// it, whether it ends that run or dates the instructions walked to the stop PC.
    #[test]
    fn a_live_stream_is_stamped_with_the_clock_at_the_stop() {
        let img = image();
        let trace = stopped_stream(&img, 3, 0x1020, Some(100), Some(500));
        let c = crate::history::ThreadClock::from_trace(&trace, &img, &FlowConfig::default());
        assert_eq!(c.len(), 3);
        let last = c.runs().len() - 1;
        assert!(
            c.end_time() == 500 || c.run_until(last) == Some(500),
            "{:?}",
            c.runs()
        );
    }

    #[test]
    fn signal_numbers_round_trip() {
        for l in 1..=31 {
            if l == 16 {
                continue;
            }
            assert_eq!(linux_from_gdb(gdb_from_linux(l)), l, "linux {l}");
        }
        assert_eq!(gdb_from_linux(libc::SIGSEGV), gdb_signal::SEGV);
        assert_eq!(gdb_from_linux(libc::SIGUSR1), 30);
        assert_eq!(linux_from_gdb(gdb_signal::INT), libc::SIGINT);
    }
}
