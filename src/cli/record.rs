//! `ptrewind record`: start a program under ptrace and serve it to GDB.

use super::CmdResult;
use ptrewind::server::{Router, ServeOutcome, Session, check_listen_addr};
use ptrewind::target::{PtraceTarget, SpawnOptions, Target};
use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;

/// Capture backend choice.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Hardware Intel PT if available, else the software encoder.
    Auto,
    /// Hardware Intel PT (perf `intel_pt` PMU).
    Pt,
    /// Software encoder (ptrace single-stepping).
    Soft,
}

/// Trace buffer mode.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Keep every byte of trace (drain the ring continuously).
    Full,
    /// Keep only the most recent buffer's worth (overwrite ring).
    Snapshot,
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
    /// Capture backend (recording is not wired into the server yet).
    #[arg(long, value_enum)]
    backend: Option<Backend>,
    /// Trace buffer size, e.g. 4M (recording is not wired into the server yet).
    #[arg(long)]
    buffer: Option<String>,
    /// Trace buffer mode (recording is not wired into the server yet).
    #[arg(long, value_enum)]
    mode: Option<Mode>,
    /// Keep address-space randomisation enabled in the program (GDB disables it by default).
    #[arg(long)]
    keep_aslr: bool,
    /// The program to run, and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// Runs `ptrewind record`.
pub fn run(args: RecordArgs) -> CmdResult {
    check_listen_addr(args.listen, args.allow_remote)?;
    if args.backend.is_some() || args.buffer.is_some() || args.mode.is_some() {
        eprintln!(
            "ptrewind: note: recording is not wired into the server yet; --backend/--buffer/--mode \
             are accepted but the program is only debugged forward"
        );
    }
    let Some((program, prog_args)) = args.command.split_first() else {
        return Err("no program given".into());
    };
    let listener = bind(args.listen)?;
    let options = SpawnOptions {
        disable_aslr: !args.keep_aslr,
    };
    let target = PtraceTarget::spawn(program, prog_args, &options)?;
    serve(target, listener, "started", false, program)
}

/// Binds the listening socket (after the loopback check done by the caller).
pub(crate) fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))
}

/// Prints how to connect, accepts one GDB connection and serves `target` until the session
/// ends. `how` is "started" or "attached to" (for the messages).
pub(crate) fn serve(
    target: PtraceTarget,
    listener: TcpListener,
    how: &str,
    attached: bool,
    fallback_exe: &std::ffi::OsStr,
) -> CmdResult {
    let addr = listener.local_addr()?;
    let pid = target.pid();
    let exe = target
        .exec_path()
        .unwrap_or_else(|| std::path::PathBuf::from(fallback_exe));
    eprintln!("ptrewind: {how} process {pid}; listening on {addr}");
    eprintln!(
        "ptrewind: connect with: gdb -ex 'target remote {addr}' {}",
        shell_quote(&exe.to_string_lossy())
    );
    let (stream, peer) = listener.accept()?;
    eprintln!("ptrewind: debugger connected from {peer}");
    let mut session = Session::new(Box::new(target));
    session.set_attached(attached);
    let mut router = Router::default();
    router.on_notice(|n| eprintln!("ptrewind: warning: {n}"));
    let outcome = router.serve(stream, &mut session)?;
    match outcome {
        ServeOutcome::Exited(code) => {
            eprintln!("ptrewind: process {pid} exited with status {code}");
        }
        ServeOutcome::Killed(sig) => eprintln!("ptrewind: process {pid} killed by signal {sig}"),
        ServeOutcome::Detached => eprintln!("ptrewind: detached from process {pid}"),
        ServeOutcome::KilledByDebugger => {
            eprintln!("ptrewind: process {pid} killed by the debugger")
        }
        ServeOutcome::ConnectionClosed if attached => {
            eprintln!("ptrewind: debugger disconnected; detached from process {pid}")
        }
        ServeOutcome::ConnectionClosed => {
            eprintln!("ptrewind: debugger disconnected; process {pid} killed")
        }
    }
    Ok(ExitCode::SUCCESS)
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
