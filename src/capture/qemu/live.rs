//! The QEMU backend live: the program runs under `qemu-x86_64` with the ptrewind plugin *and*
//! QEMU's gdbstub, so a debugger can stop it, look at it and go back in its history while it
//! runs.
//!
//! * **present** — registers, memory, breakpoints, run control and the auxiliary vector come
//!   from the gdbstub through [`Remote`] (QEMU's translator breakpoints; a breakpoint at
//!   the resume PC is lifted for one step, since QEMU would report it again at once; `Ctrl-C` is
//!   a `SIGINT` to QEMU, see [`super::remote`]).
//! * **past** — the plugin's stream of the traced thread (the main thread). At every stop the
//!   bytes the plugin wrote to the thread's stream file since the last stop are read (the file
//!   only grows) and the stream is closed at the stop PC from the thread's tail file (the
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
//! Limits (QEMU 7.2): the past is the main thread's (the others are recorded in the directory);
//! no watchpoints (the stub has none in user mode).

use std::collections::{BTreeSet, HashSet};
use std::ffi::OsString;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::recording::{QemuConfig, QemuError, QemuRecording, Recorded};
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

/// How long a single step holds the other threads before they are let go.
const STEP_HOLD_LIMIT: Duration = Duration::from_millis(500);
/// How often a single step that has not ended lets the held threads out of their blocks.
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
    store: TraceStore,
    /// The traced thread's stream file, once it exists (read on from where the last stop
    /// stopped reading).
    stream: Option<std::fs::File>,
    /// Bytes of the stream file in the store (the store's bytes after them are provisional).
    written: u64,
    /// The stream ended (the plugin's summary, or the process gone) and is in the store whole.
    finished: bool,
    /// The code image and the mappings text it was built from.
    code: Option<(String, Image)>,
    /// At the last stop: stream bytes read, provisional bytes written.
    last_sync: (u64, u64),
    /// The plugin's exit gate (`exit_stop`), once opened.
    gate: Option<std::fs::File>,
    /// Held at `exit_group` by the gate: the call and the PC of its SYSCALL.
    at_exit: Option<ExitCall>,
    bps: HashSet<u64>,
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
    /// How the last stream was completed, and problems met at stops.
    last_completion: Option<String>,
    stops: u64,
    stop_errors: Vec<String>,
    /// The plugin's streams of other threads seen at the last stop.
    other_threads: usize,
    /// The thread of the last stop (the one QEMU's gdbstub reported).
    stop_thread: ThreadId,
    /// The thread registers are read from and a step moves (the debugger's `Hg`/`Hc`).
    selected: ThreadId,
    /// Every guest thread at the last stop, the main thread first.
    thread_list: Vec<ThreadId>,
    /// The plugin's pause gate (see [`super::output::PAUSE_FILE`]), once opened.
    pause: Option<std::fs::File>,
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
            .tempdir()
            .map_err(LaunchError::TempDir)?;
        let sock = sock_dir.path().join("gdb");
        let mut config = config.clone();
        // Hold the other threads while one is stopped in the gdbstub (see `set_gate`).
        config.pause = true;
        config.qemu_args.push("-g".into());
        config.qemu_args.push(sock.clone().into_os_string());
        let mut rec = QemuRecording::spawn_with(&config, program, args, |cmd| {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the forked child before exec and only makes the
            // async-signal-safe prctl(2) call; it allocates nothing.
            unsafe {
                cmd.pre_exec(|| {
                    // QEMU dies with the debugger's server thread (as ptrace's EXITKILL does for
                    // native targets) instead of running the guest on unobserved.
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            configure(cmd);
        })?;
        let stream = connect_socket(
            rec.child_mut(),
            &config.qemu,
            &sock,
            Duration::from_secs(20),
        )?;
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
            store: TraceStore::new(),
            stream: None,
            written: 0,
            finished: false,
            code: None,
            last_sync: (0, 0),
            gate: None,
            at_exit: None,
            bps: HashSet::new(),
            early: None,
            stepping: false,
            step_hold: None,
            interrupted: false,
            running: false,
            exited: false,
            last_completion: None,
            stops: 0,
            stop_errors: Vec::new(),
            other_threads: 0,
            stop_thread: main,
            selected: main,
            thread_list: vec![main],
            pause: None,
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
        use super::output::exit_gate as g;
        use std::os::unix::fs::FileExt;
        if self.at_exit.take().is_none() {
            return Ok(());
        }
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

    /// The recording directory (every thread's stream; kept after the session).
    pub fn dir(&self) -> &Path {
        self.rec.dir()
    }

    fn err(&self) -> impl Fn(RemoteError) -> TargetError + use<> {
        remote_err(self.rec.pid())
    }

    fn pc(&mut self) -> TargetResult<u64> {
        self.thread_pc(self.main)
    }

    /// The PC of thread `t`: where it waits at the pause gate (QEMU's own PC of a thread held
    /// inside a chain of translated blocks can be stale), else the gdbstub's.
    fn thread_pc(&mut self, t: ThreadId) -> TargetResult<u64> {
        if let Some(x) = self.at_exit {
            return Ok(x.pc);
        }
        if let Some(pc) = self.paused_pc(t) {
            return Ok(pc);
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
        self.write_gate_words(g::GATE, &[g::encode(run)]);
        if run.is_some() {
            // Stopped: a claim of the thread that reached the breakpoint is over.
            self.write_gate_words(g::CLAIM, &[0]);
        }
    }

    /// Tells the plugin the breakpoint addresses (it keeps the other threads back while one
    /// runs a block that may lead to one; see [`super::output::pause_gate::CLAIM`]).
    fn publish_breakpoints(&mut self) {
        use super::output::pause_gate as g;
        let mut words: Vec<u64> = self.bps.iter().copied().take(g::MAX_BPS).collect();
        let n = words.len() as u64;
        // The addresses first, then the count: the plugin reads the count first.
        self.write_gate_words(g::NBPS, &[0]);
        words.resize(g::MAX_BPS, 0);
        self.write_gate_words(g::BPS, &words);
        self.write_gate_words(g::NBPS, &[n]);
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
        use super::output::pause_gate as g;
        use std::os::unix::fs::FileExt;
        let f = self.pause.as_ref()?;
        let mut raw = vec![0u8; g::SIZE as usize];
        f.read_exact_at(&mut raw, 0).ok()?;
        let word =
            |i: usize| u64::from_ne_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let tid = u64::try_from(t.tid).ok()?;
        (0..g::MAX_SLOTS)
            .find(|&i| word(g::SLOTS + 2 * i) == tid)
            .map(|i| word(g::SLOTS + 2 * i + 1))
            .filter(|&pc| pc != 0)
    }

    /// Lists the guest threads again (at a stop).
    fn refresh_threads(&mut self) {
        if self.exited {
            return;
        }
        if let Ok(mut list) = self.remote.threads() {
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

    /// Single-steps the traced thread over the breakpoint at its PC (QEMU reports a breakpoint
    /// at the resume PC again). `Some(event)`: the step stopped for something else.
    fn step_over_breakpoint(
        &mut self,
        thread: ThreadId,
        signal: Option<i32>,
    ) -> TargetResult<Option<StopEvent>> {
        let pc = self.thread_pc(thread)?;
        let e = self.err();
        self.remote
            .remove_breakpoint(BreakKind::Software, pc, 1)
            .map_err(&e)?;
        let action = match signal {
            Some(s) => Action::StepSignal(gdb_from_linux(s)),
            None => Action::Step,
        };
        self.set_gate_for(Some(u32::try_from(thread.tid).unwrap_or(0)));
        self.remote
            .resume(&[ResumeAction {
                action,
                thread: Some(thread),
            }])
            .map_err(&e)?;
        let stop = self.remote.wait(Some(Duration::from_secs(60))).map_err(&e);
        self.set_gate(true);
        self.remote
            .insert_breakpoint(BreakKind::Software, pc, 1)
            .map_err(&e)
            .ok();
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
                self.selected = t;
                let e = self.err();
                let pc = self.remote.read_register_u64(Some(t), "rip").map_err(e)?;
                if signal == gdb_signal::TRAP && self.bps.contains(&pc) && !stepping {
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
        match status {
            Some(s) if s.signal().is_some() => StopEvent::Killed(s.signal().unwrap_or(9)),
            Some(s) => StopEvent::Exited(s.code().unwrap_or(0)),
            None => StopEvent::Killed(libc::SIGKILL),
        }
    }
}

/// Completes a live thread's stream at a stop at `pc`, after the `written` bytes of its stream
/// file: appends to `out` the encoder output not yet in the file, the pending TNT bits, then the
/// running block walked from its start to `pc` (its last instruction's outcome added when `pc`
/// is where it went: a TNT bit for a conditional branch, a TIP for an indirect one), and
/// FUP(`pc`) + TIP.PGD. The instruction at `pc` is not counted as executed. Returns how it was
/// done (for `monitor stats`).
pub fn complete_at_pc(
    written: u64,
    out: &mut Vec<u8>,
    tail: &super::output::TailState,
    pc: u64,
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
        let _ = encode_packet(
            &Packet::ShortTnt(Tnt {
                bits: tail.tnt.0,
                count: tail.tnt.1,
            }),
            out,
        );
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
                        &Packet::ShortTnt(Tnt {
                            bits: u64::from(pc != i.nlip()),
                            count: 1,
                        }),
                        out,
                    );
                }
                InsnClass::IndirectJump | InsnClass::IndirectCall | InsnClass::Return => {
                    let _ = enc.ip_packet(IpKind::Tip, Some(pc), out);
                }
                _ => {}
            }
            ip = pc;
        }
        note = format!("{note} ({done} of the {insns} instructions of the block at {start:#x})");
    }
    let _ = enc.ip_packet(IpKind::Fup, Some(pc), out);
    let _ = enc.ip_packet(IpKind::TipPgd, None, out);
    note
}

impl Drop for QemuLive {
    fn drop(&mut self) {
        // Never leave QEMU (and the guest) running behind: kill and reap it.
        if !self.exited {
            let _ = self.rec.child_mut().kill();
        }
        // Reaps it (at once when it has exited; std keeps the status of a reaped child).
        let _ = self.rec.child_mut().wait();
    }
}

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
        let Ok(rec) = Recorded::open_layout(self.rec.dir()) else {
            return String::new();
        };
        rec.mmap_records()
            .iter()
            .map(|m| {
                format!(
                    "{:x}-{:x} r-xp {:08x} 00:00 0 {}\n",
                    m.addr,
                    m.addr + m.len,
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
        let e = self.err();
        let thread = self.selected;
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

    fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()> {
        if self.at_exit.is_some() {
            return Err(TargetError::Unsupported(
                "register writes while QEMU holds the program at its exit",
            ));
        }
        // General-purpose registers (the ones GDB writes: `set $rax = …`, `jump`), one `P`
        // each where they differ; the vector state is not written back.
        let current = self.read_registers()?;
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
        if !self
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
        self.publish_breakpoints();
        if self.at_exit.is_some() {
            return Ok(true);
        }
        let e = self.err();
        self.remote
            .remove_breakpoint(BreakKind::Software, addr, 1)
            .map_err(e)
    }

    fn has_exited(&mut self) -> bool {
        self.exited
    }

    fn kill(&mut self) -> TargetResult<()> {
        if !self.exited {
            // Held at its exit the stub does not answer (a `k` would wait for its deadline).
            if self.at_exit.take().is_none() {
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
            let _ = self.remote.remove_breakpoint(BreakKind::Software, bp, 1);
        }
        let e = self.err();
        self.remote.detach().map_err(e)
    }

    fn store(&self) -> TraceStore {
        self.store.clone()
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
        let (step, signal) = match how {
            Resume::Continue { signal } => (false, signal),
            Resume::Step { signal } => (true, signal),
        };
        self.early = None;
        // A step moves the selected thread; a continue lifts the breakpoint the thread that
        // stopped sits on (QEMU would report it again at once) and runs every thread.
        let thread = if step {
            self.selected
        } else {
            self.stop_thread
        };
        let pc = self.thread_pc(thread)?;
        let stepped_over = self.bps.contains(&pc);
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
        // A signal to deliver went with the step over the breakpoint.
        let signal = if stepped_over { None } else { signal };
        let action = match (step, signal) {
            (false, None) => Action::Continue,
            (false, Some(s)) => Action::ContinueSignal(gdb_from_linux(s)),
            (true, None) => Action::Step,
            (true, Some(s)) => Action::StepSignal(gdb_from_linux(s)),
        };
        let tid = u32::try_from(thread.tid).unwrap_or(0);
        let thread = step.then_some(thread);
        let e = self.err();
        // A step moves one thread, the others stay stopped (as GDB's `vCont;s:T`); a continue
        // runs them all.
        if step {
            self.set_gate_for(Some(tid));
            let now = std::time::Instant::now();
            self.step_hold = Some((now, now, tid));
        } else {
            self.set_gate(false);
        }
        self.remote
            .resume(&[ResumeAction { action, thread }])
            .map_err(e)?;
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
                    // every thread to leave its block, held ones too: let them out briefly;
                    // they stop again at their next block.
                    self.write_gate_words(super::output::pause_gate::GATE, &[0]);
                    std::thread::sleep(Duration::from_millis(1));
                    self.write_gate_words(
                        super::output::pause_gate::GATE,
                        &[super::output::pause_gate::encode(Some(tid))],
                    );
                    self.step_hold = Some((began, std::time::Instant::now(), tid));
                }
            }
            if self.check_exit_gate()? {
                self.set_gate(true);
                self.running = false;
                self.stepping = false;
                self.stop_thread = self.main;
                self.selected = self.main;
                return Ok(Some(StopEvent::Exiting));
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
                self.refresh_threads();
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
        if exited && !self.exited {
            self.exited = true;
        }
        if self.finished {
            return Ok(());
        }
        let dir = self.rec.dir().to_path_buf();
        let pid = self.rec.pid();
        let tid = u32::try_from(self.main.tid).map_err(|_| "bad thread id".to_string())?;
        let path = super::output::stream_path(&dir, pid, tid, "pt");
        let ended = super::output::stream_path(&dir, pid, tid, "json").exists();
        if ended || self.exited {
            // The stream ended (the plugin wrote its summary) or the process is gone: the
            // reader completes an unfinished stream from its tail file and the counters. Once.
            let rec = Recorded::open(&dir)
                .map_err(|e| format!("reading the recording directory: {e}"))?;
            self.other_threads = rec.threads.len().saturating_sub(1);
            let Some(t) = rec.thread(Some(tid)) else {
                return Ok(());
            };
            let from = usize::try_from(self.written)
                .unwrap_or(usize::MAX)
                .min(t.trace.len());
            self.store.rewrite_from(from, &t.trace[from..]);
            self.last_sync = ((t.trace.len() - from) as u64, 0);
            self.last_completion = t.completed.clone();
            self.written = t.trace.len() as u64;
            self.finished = true;
            return Ok(());
        }
        if self.stream.is_none() {
            match std::fs::File::open(&path) {
                Ok(f) => self.stream = Some(f),
                // Nothing executed yet (stopped before the first block).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(format!("opening {}: {e}", path.display())),
            }
        }
        // The bytes written since the last stop (the file only grows; the thread is stopped,
        // and only it writes its stream).
        let mut bytes = Vec::new();
        if let Some(f) = self.stream.as_mut() {
            use std::io::Read;
            f.read_to_end(&mut bytes)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
        }
        let read = bytes.len() as u64;
        let written = self.written + read;
        let tail = std::fs::read(super::output::stream_path(&dir, pid, tid, "tail"))
            .ok()
            .and_then(|d| super::output::TailState::read(&d));
        let mut note = None;
        if let (Some(tail), Ok(pc)) = (tail, self.pc()) {
            let image = self.code_image()?;
            note = Some(complete_at_pc(written, &mut bytes, &tail, pc, image));
        }
        let from = usize::try_from(self.written).unwrap_or(usize::MAX);
        self.last_sync = (read, bytes.len() as u64 - read);
        self.store.rewrite_from(from, &bytes);
        self.written = written;
        self.last_completion = note.or_else(|| {
            Some("no tail file: the stream ends at its last write (not closed at the PC)".into())
        });
        self.other_threads = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".pt"))
                    .count()
                    .saturating_sub(1)
            })
            .unwrap_or(0);
        Ok(())
    }

    fn stats(&self, line: &mut dyn FnMut(&str, String)) {
        line("recording directory", self.rec.dir().display().to_string());
        line("qemu pid", self.rec.pid().to_string());
        line("traced thread", self.main.tid.to_string());
        line("other threads recorded", self.other_threads.to_string());
        line("stops", self.stops.to_string());
        line(
            "trace read at the last stop",
            format!(
                "{} stream bytes, {} provisional bytes (rewritten at the next stop)",
                self.last_sync.0, self.last_sync.1
            ),
        );
        line(
            "stub packets with bad checksums",
            self.remote.bad_checksums().to_string(),
        );
        if let Some(c) = &self.last_completion {
            line("stream completed at the last stop", c.clone());
        }
        if let Some(e) = self.stop_errors.last() {
            line("last stop error", e.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::qemu::output::TailState;
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

    /// The block at 0x1000 (3 instructions) running, nothing written yet, tracing on from a
    /// PSB+ with TIP.PGE at the block start already in the file.
    fn live_stream(pc: u64) -> (Vec<u64>, Vec<String>) {
        use crate::packet::{Encoder, IpKind, Packet, encode_packet};
        let img = image();
        let mut enc = Encoder::new();
        let mut trace = Vec::new();
        enc.psb(&mut trace);
        let _ = encode_packet(&Packet::PsbEnd, &mut trace);
        let _ = enc.ip_packet(IpKind::TipPge, Some(0x1000), &mut trace);
        let tail = TailState {
            file_offset: trace.len() as u64,
            bytes: Vec::new(),
            tracing: true,
            in_flight: Some((0x1000, 3, u64::MAX, 0)),
            tnt: (0, 0),
        };
        let written = trace.len() as u64;
        complete_at_pc(written, &mut trace, &tail, pc, &img);
        let mut dec = FlowDecoder::new(&trace, &img, FlowConfig::default());
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
