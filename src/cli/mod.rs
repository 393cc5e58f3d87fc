//! Command-line parsing and one module per subcommand.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

pub mod attach;
mod code;
pub mod decode;
pub mod dump;
mod input;
mod output;
mod perf_threads;
pub mod record;
pub mod record_qemu;
pub mod replay;
mod signals;
pub mod view;

/// The result type of a subcommand: an exit code, or an error printed by `main`.
pub type CmdResult = Result<ExitCode, Box<dyn std::error::Error + Send + Sync>>;

/// Record-and-replay debugging over Intel Processor Trace.
#[derive(Parser, Debug)]
#[command(name = "ptrewind", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the packets of a trace, one per line (like libipt's ptdump).
    Dump(dump::DumpArgs),
    /// Reconstruct the executed instructions of a trace (like libipt's ptxed).
    Decode(decode::DecodeArgs),
    /// Run a program under ptrewind, record it and serve it to GDB/LLDB.
    Record(record::RecordArgs),
    /// Attach to a running process, record it from there on and serve it to GDB (`--no-record`:
    /// forward debugging only).
    Attach(attach::AttachArgs),
    /// Record a program and debug it in GDB with reverse execution (like `rr replay`).
    Gdb(record::GdbArgs),
    /// Serve a saved recording or a trace file to GDB/LLDB with reverse execution (no live
    /// process; registers and memory in the past as far as they are known).
    Replay(replay::ReplayArgs),
    /// Write a flame graph (SVG) and a call timeline (Chrome/Perfetto JSON) of a recording.
    View(view::ViewArgs),
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> CmdResult {
    if matches!(
        cli.command,
        Command::Record(_) | Command::Attach(_) | Command::Gdb(_) | Command::Replay(_)
    ) {
        // Before any program, QEMU or temporary directory exists (see `signals`).
        if let Err(e) = signals::install() {
            eprintln!(
                "ptrewind: warning: cannot handle SIGTERM/SIGHUP/SIGINT ({e}): ending by a \
                 signal will leave temporary files behind"
            );
        }
    }
    match cli.command {
        Command::Dump(args) => dump::run(args),
        Command::Decode(args) => decode::run(args),
        Command::Record(args) => record::run(args),
        Command::Attach(args) => attach::run(args),
        Command::Gdb(args) => record::run_gdb(args),
        Command::Replay(args) => replay::run(args),
        Command::View(args) => view::run(args),
    }
}
