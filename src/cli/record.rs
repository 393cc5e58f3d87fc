//! `ptrewind record`: start a program under ptrace, record it (hardware Intel PT when
//! available, else the software encoder) and serve it to GDB with reverse execution.

use super::{CmdResult, signals};
use ptrewind::capture::perf::PerfCapture;
use ptrewind::capture::perf::{PerfPtConfig, PtCapabilities};
use ptrewind::capture::soft::recorder::run_to_breakpoint;
use ptrewind::capture::soft::{
    RecordFrom, RecorderConfig, RingConfig, SoftCapture, SoftRecorder, StepMode, procmaps,
};
use ptrewind::server::btrace::{PtCpu, TraceStoreProvider};
use ptrewind::server::{
    GdbStubAdapter, OnDisconnect, RecordingTarget, Router, ServeOutcome, check_listen_addr,
    register_monitors, tracing,
};
use ptrewind::target::{PtraceTarget, SpawnOptions};
use ptrewind::timeline::Timeline;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;

/// Capture backend choice.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Hardware Intel PT if available, else QEMU if `qemu-x86_64` can run the program, else
    /// ptrace (saying which and why).
    Auto,
    /// Hardware Intel PT (perf `intel_pt` PMU).
    Pt,
    /// QEMU user-mode emulation with the ptrewind plugin: every thread at near-native speed,
    /// debugged live through QEMU's gdbstub (PC-only past; `--no-live`: recorded to its end,
    /// then served).
    Qemu,
    /// Software encoder (ptrace single-stepping; exact registers and memory in the past).
    #[value(alias = "soft")]
    Ptrace,
}

/// Trace buffer mode.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Keep every byte of trace (drain the ring continuously).
    Full,
    /// Keep only the most recent buffer's worth (overwrite ring).
    Snapshot,
}

/// Which process the software backend records at a `fork`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FollowForkArg {
    /// The debugger decides when it asks for fork events (GDB and LLDB do: their
    /// `follow-fork-mode`); otherwise the parent, the child detached and running untraced.
    Parent,
    /// The child; the parent is detached and runs untraced, the recording goes on in the child
    /// (GDB's `follow-fork-mode child`, decided by the server and reported to no debugger).
    /// Not at a `vfork`/`posix_spawn`, nor in a parent with several threads: those children
    /// are detached.
    Child,
}

/// Whether the software backend keeps its state log.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateLogArg {
    /// Registers and memory are rebuilt exactly at every past position.
    On,
    /// PC-only past, exactly as with the hardware backend: RIP everywhere, all registers where
    /// they were captured (start, stops), other registers unavailable, memory only from
    /// read-only code (for checking that path, and for lower overhead).
    Off,
}

/// Where recording starts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordFromArg {
    /// At `main`.
    Main,
    /// At the executable's ELF entry point.
    Entry,
    /// Not automatically (`monitor record on`).
    None,
}

/// Arguments of `ptrewind record`.
#[derive(clap::Args, Debug)]
pub struct RecordArgs {
    /// Address to listen on for GDB (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Allow listening on a non-loopback address (whoever connects controls the program).
    #[arg(long)]
    allow_remote: bool,
    /// Capture backend: `auto` uses hardware Intel PT when the probe succeeds, else QEMU when
    /// `qemu-x86_64` can run the program, else the ptrace single-stepper, saying which and why.
    #[arg(long, value_enum, default_value = "auto")]
    backend: Backend,
    /// Trace output ring size, e.g. 512K or 4M (rounded to 8 power-of-two regions).
    #[arg(long)]
    buffer: Option<String>,
    /// Trace buffer mode.
    #[arg(long, value_enum, default_value = "full")]
    mode: Mode,
    /// Where recording starts: at `main`, at the executable's entry point, or not until
    /// `monitor record on`.
    #[arg(long, value_enum, default_value = "main")]
    record_from: RecordFromArg,
    /// Software backend: keep the state log (registers and memory in the past), or serve the
    /// past PC-only like the hardware backend.
    #[arg(long, value_enum, default_value = "on")]
    state_log: StateLogArg,
    /// Software backend: at a `fork`, go on recording the parent or the child (the other one is
    /// detached and runs untraced). With `parent` (default) a debugger that asks for fork
    /// events is told of each fork and chooses with its own `follow-fork-mode`; `child` is
    /// the server's choice, reported to no debugger.
    #[arg(long, value_enum, default_value = "parent")]
    follow_fork: FollowForkArg,
    /// Keep address-space randomisation enabled in the program (GDB disables it by default).
    #[arg(long)]
    keep_aslr: bool,
    /// QEMU backend (live): hold the program at its `exit_group` so that its
    /// history can be examined there (the software backend does this by default; for it the
    /// flag changes nothing).
    #[arg(long)]
    pub(crate) stop_at_exit: bool,
    /// Software and QEMU live backends: let the program exit (or die, software backend) at once,
    /// ending its history with it. By default it stops at its end (the process still alive) and the debugger is told, so
    /// reverse execution, `monitor` commands and `monitor save` work from there; a further
    /// continue lets it exit.
    #[arg(long, conflicts_with = "stop_at_exit")]
    pub(crate) no_stop_at_exit: bool,
    /// End when the debugger's connection closes (the program is killed). By default the
    /// program and its recording are kept, stopped, and ptrewind waits for a debugger to
    /// connect again (like gdbserver without --once). `ptrewind gdb` always ends with its GDB.
    #[arg(long)]
    pub(crate) once: bool,
    /// QEMU backend: the plugin (default: libptrewind_qemu_plugin.so beside this program or in
    /// its Cargo target directory).
    #[arg(long, value_name = "PATH")]
    pub(crate) qemu_plugin: Option<std::path::PathBuf>,
    /// QEMU backend: debug the program live (the default; kept for older command lines).
    #[arg(long, hide = true)]
    pub(crate) qemu_live: bool,
    /// QEMU backend: record the program to its end (or death) first, then serve the finished
    /// recording (every thread in one global order, PC-only past). By default the program is
    /// debugged live while it runs: QEMU's gdbstub for the present (every thread), the plugin's
    /// trace of the main thread for the past.
    #[arg(long, conflicts_with = "qemu_live")]
    pub(crate) no_live: bool,
    /// QEMU backend: the recording directory to create, kept after the session (default: a
    /// new private temporary directory, removed when the session ends, also when ptrewind is
    /// ended by SIGTERM, SIGHUP or SIGINT).
    #[arg(long, value_name = "DIR")]
    pub(crate) trace_dir: Option<std::path::PathBuf>,
    /// QEMU backend: serve only this thread (default: every thread of the process).
    #[arg(long, value_name = "TID")]
    pub(crate) thread: Option<u32>,
    /// The program to run, and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) command: Vec<OsString>,
}

/// A started recording (target, listener, how it is served), or the exit code after a printed
/// error.
pub(crate) type Started = Result<
    Result<(RecordingTarget, TcpListener, Served), ExitCode>,
    Box<dyn std::error::Error + Send + Sync>,
>;

/// Parses a size such as `4096`, `512K`, `4M`.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n >= 8 * 4096)
        .ok_or_else(|| format!("invalid --buffer size '{text}' (at least 32K, e.g. 512K or 4M)"))
}

/// The backend a recording uses.
#[derive(Debug)]
enum Chosen {
    /// The software encoder.
    Soft,
    /// QEMU with the plugin.
    Qemu,
    /// Hardware Intel PT (the probe succeeded).
    Pt(Box<PtCapabilities>),
}

/// Picks the backend: `pt` fails (exit code 2) with the probe's reason unless it succeeds;
/// `auto` uses Intel PT when the probe succeeds, else QEMU when it can run the program (see
/// [`qemu_for_auto`]), else the ptrace single-stepper, saying which and why in one line.
fn choose_backend(args: &RecordArgs) -> Result<Chosen, ExitCode> {
    let backend = args.backend;
    match backend {
        Backend::Ptrace => Ok(Chosen::Soft),
        Backend::Qemu => Ok(Chosen::Qemu),
        Backend::Pt | Backend::Auto => match ptrewind::capture::perf::probe() {
            Ok(caps) => Ok(Chosen::Pt(Box::new(caps))),
            Err(why) => {
                if backend == Backend::Pt {
                    eprintln!("ptrewind: --backend pt: Intel PT is not available: {why}");
                    return Err(ExitCode::from(2));
                }
                match qemu_for_auto(args) {
                    Ok(version) => {
                        eprintln!(
                            "ptrewind: hardware Intel PT is not available ({why}); recording \
                             under QEMU ({version}) with the ptrewind plugin: every thread at \
                             near-native speed, the past shows the PC only (registers where the \
                             program stopped); --backend ptrace gives exact registers and memory \
                             at every past instruction (single-stepping, much slower)"
                        );
                        Ok(Chosen::Qemu)
                    }
                    Err(no_qemu) => {
                        eprintln!(
                            "ptrewind: hardware Intel PT is not available ({why}) and {no_qemu}; \
                             recording with the software backend (ptrace single-stepping: exact \
                             registers and memory in the past, much slower)"
                        );
                        Ok(Chosen::Soft)
                    }
                }
            }
        },
    }
}

/// Whether `auto` can record under QEMU: `qemu-x86_64` runs, the plugin is found, the program
/// is an x86-64 ELF executable, and no option only the ptrace backend has was given. `Ok`:
/// QEMU's version; `Err`: why not (for the one line `auto` prints).
fn qemu_for_auto(args: &RecordArgs) -> Result<String, String> {
    if args.state_log == StateLogArg::Off
        || args.record_from != RecordFromArg::Main
        || args.keep_aslr
        || args.buffer.is_some()
        || args.mode == Mode::Snapshot
        || args.follow_fork == FollowForkArg::Child
    {
        return Err(
            "an option of the ptrace backend was given (--state-log, --record-from, --keep-aslr, --buffer, --mode or --follow-fork)"
                .into(),
        );
    }
    let version =
        ptrewind::capture::qemu::recording::qemu_version(std::path::Path::new("qemu-x86_64"))
            .map_err(|_| "qemu-x86_64 is not installed (package qemu-user)".to_string())?;
    if args.qemu_plugin.is_none() {
        let exe = std::env::current_exe().map_err(|e| format!("cannot locate ptrewind: {e}"))?;
        ptrewind::capture::qemu::recording::find_plugin(&exe).ok_or_else(|| {
            "the QEMU plugin libptrewind_qemu_plugin.so is not beside ptrewind".to_string()
        })?;
    }
    let program = args
        .command
        .first()
        .and_then(|p| find_program(p))
        .ok_or_else(|| "the program was not found".to_string())?;
    ptrewind::capture::qemu::remote::launch::check_program(&program)
        .map_err(|e| format!("QEMU cannot run it ({e})"))?;
    Ok(version)
}

/// Runs `ptrewind record`.
pub fn run(args: RecordArgs) -> CmdResult {
    let (target, listener, served) = match start_recording(&args, false)? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    let program = args.command[0].clone();
    serve_recording(target, listener, served, &program, args.once)
}

/// Starts the program and its recording and binds the listener; `Err(code)` when the command
/// must end with that exit code (the message was printed). `shared_terminal`: the program
/// shares its terminal with the debugger (`ptrewind gdb`): the terminal's Ctrl-C is left to the
/// debugger (see [`SpawnOptions::drop_terminal_interrupts`]).
pub(crate) fn start_recording(args: &RecordArgs, shared_terminal: bool) -> Started {
    check_listen_addr(args.listen, args.allow_remote)?;
    if let Some(program) = args.command.first()
        && let Some(note) = check_program(program)?
    {
        eprintln!("ptrewind: note: {note}");
    }
    let chosen = match choose_backend(args) {
        Ok(c) => c,
        Err(code) => return Ok(Err(code)),
    };
    let Some((program, prog_args)) = args.command.split_first() else {
        return Err("no program given".into());
    };

    if let Chosen::Pt(caps) = chosen {
        eprintln!(
            "ptrewind: recording with hardware Intel PT (perf intel_pt PMU type {})",
            caps.pmu_type
        );
        return start_hardware_recording(args, program, prog_args, shared_terminal);
    }
    if let Chosen::Qemu = chosen {
        let opts = super::record_qemu::QemuOptions {
            qemu_plugin: args.qemu_plugin.clone(),
            trace_dir: args.trace_dir.clone(),
            qemu_live: !args.no_live,
            thread: args.thread,
            stop_at_exit: !args.no_stop_at_exit,
            shared_terminal,
            follow_fork_child: args.follow_fork == FollowForkArg::Child,
        };
        return Ok(
            match super::record_qemu::start(&opts, program, prog_args)? {
                Ok((target, live)) => {
                    let served = if live {
                        Served::Started
                    } else {
                        Served::Replay
                    };
                    Ok((target, bind(args.listen)?, served))
                }
                Err(code) => Err(code),
            },
        );
    }
    let mut ring = RingConfig::default();
    if let Some(b) = &args.buffer {
        let total = parse_size(b)?;
        // 8 regions of a power-of-two multiple of 4 KiB each.
        let region = (total / 8).max(4096).next_power_of_two();
        ring.region_sizes = vec![region; 8];
    }
    if args.mode == Mode::Snapshot {
        eprintln!(
            "ptrewind: note: --mode snapshot is not supported by the software backend (reverse \
             execution needs the whole history); recording in full mode"
        );
    }
    let listener = bind(args.listen)?;
    let options = SpawnOptions {
        disable_aslr: !args.keep_aslr,
        drop_terminal_interrupts: shared_terminal,
    };
    let mut target = PtraceTarget::spawn(program, prog_args, &options)?;
    target.set_follow_fork_child(args.follow_fork == FollowForkArg::Child);
    let config = RecorderConfig {
        ring,
        record_from: match args.record_from {
            RecordFromArg::Main => RecordFrom::Main,
            RecordFromArg::Entry => RecordFrom::Entry,
            RecordFromArg::None => RecordFrom::OnDemand,
        },
        state_log: args.state_log == StateLogArg::On,
        step_mode: StepMode::Single,
        capture_image_at_exit: false,
        ..RecorderConfig::default()
    };
    let recorder =
        SoftRecorder::new(target, config).map_err(|e| format!("cannot start recording: {e}"))?;
    let target = soft_recording(recorder, !args.no_stop_at_exit)?;
    Ok(Ok((target, listener, Served::Started)))
}

/// Where `program` is found: as given if it contains a `/`, otherwise the first executable
/// regular file of that name in `$PATH` (as `execvp` searches).
fn find_program(program: &std::ffi::OsStr) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let p = std::path::Path::new(program);
    if program.as_encoded_bytes().contains(&b'/') {
        return Some(p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(p))
        .find(|c| {
            std::fs::metadata(c).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Checks that `program` is something ptrewind can record before starting it: an ELF file, or
/// a `#!` script (the interpreter is what runs and is recorded: the returned note says so).
/// Anything else is an error: `execvp` would silently run it with `/bin/sh`, and the recording
/// would be of the shell. A program that cannot be found is said at once (a name that starts
/// with `-` as an option given after the options, GDB's `-ex`).
fn check_program(program: &std::ffi::OsStr) -> Result<Option<String>, String> {
    use std::io::Read;
    let Some(path) = find_program(program).filter(|p| p.exists()) else {
        let name = program.to_string_lossy();
        if name.starts_with('-') {
            // `ptrewind gdb --batch -ex 'break main' -- prog`: GDB's spelling of an option
            // ends the options, and `-ex` would be started as the program.
            return Err(format!(
                "`{name}` is not a program: ptrewind's options come before the program, and \
                 GDB's `-ex CMD` is spelled `--ex CMD` here (`ptrewind gdb --ex 'break main' -- \
                 PROGRAM ARGS`); name a program that starts with `-` by its path (`./{name}`)"
            ));
        }
        // Said before a backend is chosen: the choice's reasons would only bury it.
        return Err(if program.as_encoded_bytes().contains(&b'/') {
            format!("cannot start {name}: no such file")
        } else {
            format!("cannot start {name}: not found in PATH")
        });
    };
    let mut head = Vec::with_capacity(256);
    match std::fs::File::open(&path) {
        Ok(f) => {
            if let Err(e) = f.take(256).read_to_end(&mut head) {
                return Err(format!("cannot read {}: {e}", path.display()));
            }
        }
        // Not readable (or gone): the start reports it.
        Err(_) => return Ok(None),
    }
    if head.starts_with(b"\x7fELF") {
        return Ok(None);
    }
    if let Some(rest) = head.strip_prefix(b"#!") {
        let line = rest.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        let interp = line.trim();
        return Ok(Some(format!(
            "{} is a script: the kernel runs its interpreter `{interp}`, and that interpreter is \
             what is recorded (its instructions, not the script's lines)",
            path.display()
        )));
    }
    Err(format!(
        "{} is not an ELF executable (nor a `#!` script): there is no program to record (the \
         system would run it with /bin/sh)",
        path.display()
    ))
}

/// `--backend pt`: runs the program to the configured start under ptrace, opens the
/// `intel_pt` event on it and serves it with the hardware capture (PC-only past).
fn start_hardware_recording(
    args: &RecordArgs,
    program: &OsString,
    prog_args: &[OsString],
    shared_terminal: bool,
) -> Started {
    if args.mode == Mode::Snapshot {
        eprintln!(
            "ptrewind: note: --mode snapshot keeps only the newest trace, but reverse execution \
             needs the whole history; recording in full mode"
        );
    }
    if args.state_log == StateLogArg::On {
        eprintln!(
            "ptrewind: note: the hardware backend has no state log: the past is served PC-only \
             (RIP everywhere, all registers where the program stopped, other registers \
             unavailable, memory only from read-only code)"
        );
    }
    let mut config = PerfPtConfig::default();
    if let Some(b) = &args.buffer {
        let total = parse_size(b)?;
        let pages = (total / 4096).max(1).next_power_of_two();
        config.aux_pages_log2 = pages.trailing_zeros().min(20) as u8;
    }
    let listener = bind(args.listen)?;
    let options = SpawnOptions {
        disable_aslr: !args.keep_aslr,
        drop_terminal_interrupts: shared_terminal,
    };
    let mut target = PtraceTarget::spawn(program, prog_args, &options)?;
    let pid = ptrewind::target::Target::pid(&target);
    let start = match args.record_from {
        RecordFromArg::Main => Some(
            procmaps::symbol_address(pid, "main")
                .or_else(|_| procmaps::exe_addresses(pid).map(|(_, a, _)| a.entry))
                .map_err(|e| format!("cannot find where to start recording: {e}"))?,
        ),
        RecordFromArg::Entry => Some(
            procmaps::exe_addresses(pid)
                .map(|(_, a, _)| a.entry)
                .map_err(|e| format!("cannot find the entry point: {e}"))?,
        ),
        RecordFromArg::None => None,
    };
    if let Some(addr) = start {
        run_to_breakpoint(&mut target, addr)
            .map_err(|e| format!("cannot run to {addr:#x}: {e}"))?;
    }
    let capture = match PerfCapture::open(target, config) {
        Ok(c) => c.stop_at_exit(!args.no_stop_at_exit),
        Err(e) => {
            eprintln!("ptrewind: --backend pt: {e}");
            return Ok(Err(ExitCode::from(2)));
        }
    };
    let target = RecordingTarget::new(Timeline::live(Box::new(capture), start.is_some())?);
    Ok(Ok((target, listener, Served::Started)))
}

/// Serves a software recorder over a ptrace target. With its state log on, registers and
/// memory are rebuilt in the past; without, the past is served PC-only. `stop_at_exit`: the end
/// of the program is a place in the history (the default; `--no-stop-at-exit` turns it off).
pub(crate) fn soft_recording(
    rec: SoftRecorder<PtraceTarget>,
    stop_at_exit: bool,
) -> Result<RecordingTarget, ptrewind::target::TargetError> {
    let capture = SoftCapture::new(rec).stop_at_exit(stop_at_exit);
    let record = capture.is_recording();
    Ok(RecordingTarget::new(Timeline::live(
        Box::new(capture),
        record,
    )?))
}

/// How the served process came to be, for the messages and for what happens when the debugger
/// leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// Started by us: killed when the debugger leaves.
    Started,
    /// Started by us for the GDB we run in the same terminal (`ptrewind gdb`): as `Started`,
    /// but warnings go only to GDB's console (printing them on stderr too showed them twice).
    StartedForGdb,
    /// Attached to: detached (left running) when the debugger leaves.
    Attached,
    /// A recording replayed with no process.
    Replay,
}

impl Served {
    fn how(self) -> &'static str {
        match self {
            Served::Started | Served::StartedForGdb => "started",
            Served::Attached => "attached to",
            Served::Replay => "replaying",
        }
    }
}

/// Serves a recording session to one GDB connection; `served` as for [`serve_session`] (an
/// attached process is detached, not killed, when the debugger leaves).
pub(crate) fn serve_recording(
    target: RecordingTarget,
    listener: TcpListener,
    served: Served,
    fallback_exe: &std::ffi::OsStr,
    once: bool,
) -> CmdResult {
    let mut session = GdbStubAdapter::new(Box::new(target.clone()));
    register_monitors(session.monitors_mut(), &target);
    // LLDB's Intel PT plug-in (`process trace start`, `thread trace dump ...`) reads the
    // whole recorded trace itself. GDB gets reverse execution from the server, and its own
    // `record btrace pt` only when the user asks: a view of the recording from that point on
    // (of all of it in a replay).
    let cpu = if target.shared().borrow().has_hardware_trace() {
        ptrewind::capture::perf::host_cpu()
    } else {
        PtCpu::SOFTWARE
    };
    let mut provider = TraceStoreProvider::new(cpu);
    // A replay, or a recording replayed after the program ended (QEMU to completion), has no
    // "from now on": GDB's `record btrace pt` shows the whole recorded history of each thread.
    let mut gdb_view = if served == Served::Replay || !target.shared().borrow().is_live() {
        TraceStoreProvider::new(cpu)
    } else if target.shared().borrow().backend_name() == Some("qemu") {
        // The plugin's PSBs are far apart: a view from the first PSB after the enable point
        // would stay empty.
        TraceStoreProvider::from_enable_or_last_psb(cpu)
    } else {
        TraceStoreProvider::from_enable(cpu)
    };
    // Every thread's trace (one for a single-thread recording), and the threads that start
    // later when a debugger asks for them.
    for (tid, store) in target.shared().borrow().thread_stores() {
        if let Ok(tid) = u32::try_from(tid) {
            provider.attach(tid, store.clone());
            gdb_view.attach(tid, store);
        }
    }
    let shared = target.shared();
    let lookup = ptrewind::server::btrace::StoreLookup(std::rc::Rc::new(move |tid: u32| {
        let tid = i32::try_from(tid).ok()?;
        shared.try_borrow().ok()?.thread_store(tid)
    }));
    provider.set_lookup(lookup.clone());
    gdb_view.set_lookup(lookup);
    // Progress lines while the program runs and the recording grows, on a terminal only, and
    // not when the terminal is GDB's (`ptrewind gdb`).
    let progress =
        (served != Served::StartedForGdb && std::io::stderr().is_terminal()).then(|| {
            let t = target.shared();
            let t = t.borrow();
            Progress::start(t.progress_probe(), t.step_counter())
        });
    let r = serve_session(session, listener, served, fallback_exe, once, |router| {
        ptrewind::server::install_stop_query(router, &target);
        tracing::install_lldb(router, Box::new(provider));
        tracing::install_btrace(router, Box::new(gdb_view));
        ptrewind::server::alloc::install(router);
    });
    drop(progress);
    r
}

/// How often the progress thread looks, and how long the recording must have grown without a
/// pause before (and between) progress lines.
const PROGRESS_TICK: std::time::Duration = std::time::Duration::from_millis(250);
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// A thread printing `ptrewind: recording: N instructions (R/s), B of trace` every few seconds
/// while the recording grows. Whole lines (no redrawn bar): the program writes to the same
/// terminal. Stopped when dropped.
struct Progress {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(
        probe: ptrewind::history::WorkerProbe<ptrewind::store::live::TraceStore>,
        steps: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    ) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut last = (0, 0);
            // (when the current run of growth began, instructions then, last line printed)
            let mut run: Option<(std::time::Instant, u64, std::time::Instant)> = None;
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(PROGRESS_TICK);
                let s = probe.stats();
                // The software backend counts its steps; otherwise the indexed history.
                let insns = steps
                    .as_ref()
                    .map_or(s.insns, |c| c.load(Ordering::Relaxed));
                let now = std::time::Instant::now();
                if (insns, s.trace_bytes) == last {
                    // Stopped (the debugger has it): the next run starts afresh.
                    run = None;
                    continue;
                }
                last = (insns, s.trace_bytes);
                let (began, insns0, printed) = *run.get_or_insert((now, insns, now));
                if now.duration_since(printed) >= PROGRESS_EVERY {
                    let secs = now.duration_since(began).as_secs_f64().max(1e-3);
                    let rate = (insns.saturating_sub(insns0)) as f64 / secs;
                    eprintln!(
                        "ptrewind: recording: {} instructions ({}/s), {} of trace",
                        insns,
                        human(rate),
                        indicatif::HumanBytes(s.trace_bytes)
                    );
                    run = Some((began, insns0, now));
                }
            }
        });
        Progress {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `1234567.0` as `1.2M`.
fn human(x: f64) -> String {
    match x {
        x if x >= 1e9 => format!("{:.1}G", x / 1e9),
        x if x >= 1e6 => format!("{:.1}M", x / 1e6),
        x if x >= 1e3 => format!("{:.1}k", x / 1e3),
        x => format!("{x:.0}"),
    }
}

/// Binds the listening socket (after the loopback check done by the caller).
pub(crate) fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))
}

/// Prints how to connect, accepts one GDB connection and serves `target` until the session
/// ends.
pub(crate) fn serve(
    target: PtraceTarget,
    listener: TcpListener,
    served: Served,
    fallback_exe: &std::ffi::OsStr,
    once: bool,
) -> CmdResult {
    let session = GdbStubAdapter::new(Box::new(target));
    serve_session(session, listener, served, fallback_exe, once, |_| {})
}

/// `PTREWIND_POLL_US`: how long the server polls for the debugger's next packet before
/// blocking, in microseconds (`Router::set_poll_window`; 0 blocks at once).
fn poll_window_from_env() -> Option<std::time::Duration> {
    let text = std::env::var_os("PTREWIND_POLL_US")?;
    match text.to_str().and_then(|t| t.trim().parse::<u64>().ok()) {
        Some(us) if us <= 1_000_000 => Some(std::time::Duration::from_micros(us)),
        _ => {
            eprintln!(
                "ptrewind: warning: PTREWIND_POLL_US={}: not a number of microseconds up to \
                 1000000; using the default",
                text.to_string_lossy()
            );
            None
        }
    }
}

/// Prints how to connect, then serves `session` to one debugger at a time: a second one
/// connecting meanwhile is refused with an error packet and a message. When the connection
/// closes without `detach`/`kill`, the program and its recording are kept stopped and the next
/// debugger is awaited, unless `once` (the program is then killed, or detached if attached to).
/// `configure` adds interceptors to the router.
pub(crate) fn serve_session(
    mut session: GdbStubAdapter,
    listener: TcpListener,
    served: Served,
    fallback_exe: &std::ffi::OsStr,
    once: bool,
    configure: impl FnOnce(&mut Router),
) -> CmdResult {
    let how = served.how();
    let attached = served == Served::Attached;
    let addr = listener.local_addr()?;
    let pid = session.target().pid();
    let exe = session
        .target()
        .exec_path()
        .unwrap_or_else(|| std::path::PathBuf::from(fallback_exe));
    eprintln!("ptrewind: {how} process {pid}; listening on {addr}");
    eprintln!(
        "ptrewind: connect with: gdb -ex 'target remote {addr}' {}",
        shell_quote(&exe.to_string_lossy())
    );
    eprintln!(
        "ptrewind:          or: lldb -o 'gdb-remote {addr}' {}",
        shell_quote(&exe.to_string_lossy())
    );
    let connections = Acceptor::spawn(listener)?;
    // A terminating signal closes the served connection and wakes the wait for one.
    let _waker = connections.wake_on_ending();
    session.set_attached(attached);
    let mut router = Router::default();
    if served != Served::StartedForGdb {
        router.on_notice(|n| eprintln!("ptrewind: warning: {n}"));
    }
    router.set_on_disconnect(if once {
        OnDisconnect::End
    } else {
        OnDisconnect::Keep
    });
    if let Some(window) = poll_window_from_env() {
        router.set_poll_window(window);
    }
    configure(&mut router);
    let outcome = loop {
        let Some((stream, peer)) = connections.next()? else {
            return Ok(end_on_signal(&mut session, served, None));
        };
        eprintln!("ptrewind: debugger connected from {peer}");
        let outcome = router.serve(stream, &mut session);
        connections.done();
        if signals::received().is_some() {
            // The connection was closed under the router (or ended meanwhile); an error
            // (closed mid-packet) leaves the program to `end_on_signal` too.
            return Ok(end_on_signal(&mut session, served, outcome.ok()));
        }
        // A followed fork child is the process from now on.
        let pid = session.target().current_pid();
        match outcome? {
            ServeOutcome::Kept => eprintln!(
                "ptrewind: debugger disconnected; process {pid} and its recording are kept \
                 (stopped); waiting for a debugger on {addr} (--once: end instead)"
            ),
            other => break other,
        }
    };
    let pid = session.target().current_pid();
    if served == Served::Replay {
        eprintln!("ptrewind: debugger disconnected; replay of process {pid} ended");
        return Ok(ExitCode::SUCCESS);
    }
    let closed = matches!(outcome, ServeOutcome::ConnectionClosed | ServeOutcome::Kept);
    eprintln!(
        "ptrewind: {}{}",
        if closed {
            "debugger disconnected; "
        } else {
            ""
        },
        what_became(&outcome, pid, attached)
    );
    Ok(ExitCode::SUCCESS)
}

/// What became of process `pid` when serving ended with `outcome` (the router killed it, or
/// detached if `attached`, when the connection closed), for the closing message.
fn what_became(outcome: &ServeOutcome, pid: i32, attached: bool) -> String {
    match outcome {
        ServeOutcome::Exited(code) => format!("process {pid} exited with status {code}"),
        ServeOutcome::Killed(sig) => format!("process {pid} killed by signal {sig}"),
        ServeOutcome::Detached => format!("detached from process {pid}"),
        ServeOutcome::KilledByDebugger => format!("process {pid} killed by the debugger"),
        ServeOutcome::ConnectionClosed | ServeOutcome::Kept if attached => {
            format!("detached from process {pid}")
        }
        ServeOutcome::ConnectionClosed | ServeOutcome::Kept => format!("process {pid} killed"),
    }
}

/// Ends a session on the terminating signal received: the program is killed (detached if
/// attached to; a replay has none) unless `outcome`, how the last connection's serving ended
/// (the router kills or detaches the program when the connection closed under it with
/// `--once`), says that was done; then the caller's return drops the recording and with it
/// everything ptrewind created. Exit code 128 + the signal's number.
fn end_on_signal(
    session: &mut GdbStubAdapter,
    served: Served,
    outcome: Option<ServeOutcome>,
) -> ExitCode {
    let sig = signals::received().unwrap_or(libc::SIGTERM);
    let name = signals::name(sig);
    let pid = session.target().current_pid();
    let attached = served == Served::Attached;
    let t = session.target_mut();
    let what = match outcome {
        _ if served == Served::Replay => format!("replay of process {pid} ended"),
        // Kept through the closed connection: ended here.
        Some(ServeOutcome::Kept) | None => kill_or_detach(t, pid, attached),
        Some(outcome) => what_became(&outcome, pid, attached),
    };
    signals::say(&format!("ptrewind: ended by {name}; {what}"));
    signals::exit_code(sig)
}

/// Kills the program (detaches from it if `attached`) at an end it was kept through; what
/// became of it, for the closing message.
fn kill_or_detach(t: &mut dyn ptrewind::target::Target, pid: i32, attached: bool) -> String {
    if t.has_exited() {
        format!("process {pid} had ended")
    } else if attached {
        match t.detach() {
            Ok(()) => format!("detached from process {pid}"),
            Err(e) => format!("process {pid} could not be detached cleanly ({e})"),
        }
    } else {
        match t.kill() {
            Ok(()) => format!("process {pid} killed"),
            Err(e) => format!("process {pid} could not be killed cleanly ({e})"),
        }
    }
}

/// What the accepting thread hands to the serving loop.
enum Accepted {
    /// A debugger connection to serve.
    Conn(std::net::TcpStream, SocketAddr),
    /// A terminating signal arrived: stop waiting.
    Ending,
}

/// Accepts debugger connections on a thread of its own: the first while none is served is
/// handed to the serving loop ([`Acceptor::next`]); any other is refused at once with an error
/// packet naming the reason, then closed (a second debugger would otherwise hang, connected to
/// a server that never reads from it).
struct Acceptor {
    tx: std::sync::mpsc::Sender<Accepted>,
    rx: std::sync::mpsc::Receiver<Accepted>,
    busy: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// A handle on the connection being served, for [`Acceptor::wake_on_ending`] to close.
    current: std::sync::Arc<std::sync::Mutex<Option<std::net::TcpStream>>>,
}

impl Acceptor {
    fn spawn(listener: TcpListener) -> std::io::Result<Self> {
        use std::sync::atomic::Ordering;
        let (tx, rx) = std::sync::mpsc::channel();
        let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&busy);
        let accepted = tx.clone();
        std::thread::Builder::new()
            .name("ptrewind-accept".into())
            .spawn(move || {
                let tx = accepted;
                for conn in listener.incoming() {
                    let Ok(stream) = conn else { continue };
                    let Ok(peer) = stream.peer_addr() else {
                        continue;
                    };
                    if !flag.swap(true, Ordering::AcqRel) {
                        if tx.send(Accepted::Conn(stream, peer)).is_err() {
                            break;
                        }
                        continue;
                    }
                    // Busy. A debugger reconnecting right after its connection dropped may be
                    // faster than the server noticing the drop: give the served connection a
                    // moment to end before refusing. Its own thread: accepting goes on.
                    let tx = tx.clone();
                    let flag = std::sync::Arc::clone(&flag);
                    let _ = std::thread::Builder::new()
                        .name("ptrewind-refuse".into())
                        .spawn(move || {
                            let deadline =
                                std::time::Instant::now() + std::time::Duration::from_secs(1);
                            while std::time::Instant::now() < deadline {
                                if !flag.swap(true, Ordering::AcqRel) {
                                    let _ = tx.send(Accepted::Conn(stream, peer));
                                    return;
                                }
                                std::thread::sleep(std::time::Duration::from_millis(10));
                            }
                            eprintln!(
                                "ptrewind: refused a second debugger from {peer}: another one \
                                 is connected"
                            );
                            refuse(stream);
                        });
                }
            })?;
        Ok(Acceptor {
            tx,
            rx,
            busy,
            current: std::sync::Arc::default(),
        })
    }

    /// On a terminating signal: closes the served connection (its reads end as if the
    /// debugger had gone) and wakes [`Acceptor::next`].
    fn wake_on_ending(&self) -> signals::WakerGuard {
        let tx = self.tx.clone();
        let current = std::sync::Arc::clone(&self.current);
        signals::on_ending(move || {
            if let Some(s) = current.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            let _ = tx.send(Accepted::Ending);
        })
    }

    /// The next connection to serve (blocks until one arrives); `None` when a terminating
    /// signal arrived.
    fn next(&self) -> std::io::Result<Option<(std::net::TcpStream, SocketAddr)>> {
        loop {
            let accepted = self
                .rx
                .recv()
                .map_err(|_| std::io::Error::other("the listening thread ended"))?;
            if signals::received().is_some() {
                return Ok(None);
            }
            if let Accepted::Conn(stream, peer) = accepted {
                *self.current.lock().unwrap_or_else(|p| p.into_inner()) = stream.try_clone().ok();
                // A signal between the check above and the handle being stored found nothing
                // to close: look again.
                if signals::received().is_some() {
                    return Ok(None);
                }
                return Ok(Some((stream, peer)));
            }
        }
    }

    /// The served connection ended: the next one may be served.
    fn done(&self) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.busy.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// Tells a debugger it cannot connect: waits (at most 2 s) for its first packet, acknowledges
/// it and answers with an `E.` error packet carrying the reason (GDB prints it), then closes.
fn refuse(mut stream: std::net::TcpStream) {
    use std::io::{Read as _, Write as _};
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(2)));
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    // Up to the end of the first packet (`#` and two checksum digits), or 4 KiB.
    while seen.len() < 4096 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
        if let Some(h) = seen.iter().position(|&b| b == b'#')
            && seen.len() >= h + 3
        {
            break;
        }
    }
    let reply = ptrewind::server::router::encode_packet(
        b"E.ptrewind: another debugger is already connected to this recording",
    );
    let _ = stream.write_all(b"+");
    let _ = stream.write_all(&reply);
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Quotes a path for the printed shell command line.
fn shell_quote(s: &str) -> String {
    if s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+,:@".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Arguments of `ptrewind gdb`.
#[derive(clap::Args, Debug)]
pub struct GdbArgs {
    /// A GDB command to run after connecting (repeatable; passed as `gdb -ex CMD`).
    #[arg(long = "ex", value_name = "CMD")]
    ex: Vec<String>,
    /// Run GDB in batch mode (`-batch -nx`: exit after the `--ex` commands).
    #[arg(long)]
    batch: bool,
    /// The GDB executable.
    #[arg(long, default_value = "gdb")]
    gdb: OsString,
    #[command(flatten)]
    record: RecordArgs,
}

/// The GDB helper script (`pt history`, `pt calls`, ...), embedded so the binary is
/// self-contained.
const GDB_SCRIPT: &str = include_str!("../../gdb-scripts/ptrewind.py");

/// Runs `ptrewind gdb`: records the program and runs GDB connected to the recording (like
/// `rr replay`). GDB is executed directly, never through a shell.
pub fn run_gdb(args: GdbArgs) -> CmdResult {
    // A Ctrl-C typed in GDB's terminal goes to the whole foreground process group: GDB, which
    // interrupts the program through the protocol (`\x03`), ptrewind, which used to die of it
    // (GDB then lost the connection) and now ignores it (below), and the program, whose copy
    // the target drops (the program keeps the terminal for its own input and output).
    let (target, listener, served) = match start_recording(&args.record, true)? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    let program = args.record.command[0].clone();
    let addr = listener.local_addr()?;
    // A private directory (mode 0700, unpredictable name, created with O_EXCL by `tempfile`)
    // holds the script: in a shared $TMPDIR a predictable name could be a planted link, or be
    // replaced by another user before GDB sources it. Removed when `scratch` is dropped.
    let scratch = tempfile::Builder::new()
        .prefix("ptrewind-gdb-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
        .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let script = scratch.path().join("ptrewind.py");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&script)
        .and_then(|mut f| std::io::Write::write_all(&mut f, GDB_SCRIPT.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let exe = ptrewind::target::Target::exec_path(&target)
        .map(std::ffi::OsString::from)
        .unwrap_or_else(|| program.clone());
    let mut cmd = std::process::Command::new(&args.gdb);
    cmd.arg("-q");
    if args.batch {
        cmd.args(["-batch", "-nx"]);
    }
    let mut source = std::ffi::OsString::from("source ");
    source.push(&script);
    cmd.arg("-ex").arg(source);
    // The program runs on this machine (or under QEMU user mode, which sees its files): GDB
    // reads the executable and libraries directly instead of through the server's host I/O,
    // without "Reading … from remote target" for each and the "transfers can be slow"
    // warning. The maps file GDB reads at connection still comes from the server.
    cmd.arg("-ex").arg("set sysroot");
    cmd.arg("-ex").arg(format!("target remote {addr}"));
    for e in &args.ex {
        cmd.arg("-ex").arg(e);
    }
    cmd.arg(&exe);
    let mut gdb = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", args.gdb.to_string_lossy()))?;
    // Disregarded only now (before, it ends the recording cleanly): GDB handles the
    // terminal's Ctrl-C itself; ptrewind ends when GDB ends.
    signals::ignore_sigint(true);
    // Ended by SIGTERM or SIGHUP: GDB, whose connection is closed under it, is told to quit
    // (it would otherwise sit at its prompt while ptrewind waits for it). Not once reaped: its
    // pid could name another process.
    let gdb_pid = nix::unistd::Pid::from_raw(i32::try_from(gdb.id()).unwrap_or(0));
    let gdb_running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let gdb_waker = {
        let running = std::sync::Arc::clone(&gdb_running);
        signals::on_ending(move || {
            if running.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = nix::sys::signal::kill(gdb_pid, nix::sys::signal::Signal::SIGTERM);
            }
        })
    };
    // If GDB ends without connecting (a bad option, a failed `target remote`), the accept below
    // would wait forever: when GDB exits, poke the listener so the accept returns and the
    // session ends as "debugger disconnected" (after a normal session nobody listens any more
    // and the connection attempt just fails).
    let watcher = std::thread::spawn(move || {
        let status = gdb.wait();
        gdb_running.store(false, std::sync::atomic::Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(addr);
        status
    });
    // GDB is ours: when it goes, the session ends (no waiting for another debugger).
    let served = match served {
        Served::Started => Served::StartedForGdb,
        other => other,
    };
    let served = serve_recording(target, listener, served, &program, true);
    let status = watcher
        .join()
        .map_err(|_| "the thread waiting for gdb panicked".to_string())?;
    drop(gdb_waker);
    drop(scratch);
    let served = served?;
    if signals::received().is_some() {
        return Ok(served);
    }
    let status = status.map_err(|e| format!("waiting for gdb: {e}"))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(c.clamp(1, 255) as u8),
        None => ExitCode::FAILURE,
    })
}
