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

impl Cli {
    /// Parses the process's command line (see [`Cli::parse_from_args`]).
    pub fn parse_args() -> Cli {
        Cli::parse_from_args(std::env::args_os().collect())
    }

    /// Parses `argv` (program name first).
    ///
    /// `decode` and `dump` are run over many traces by scripts, where building the whole
    /// command tree (every subcommand's arguments) was a fifth of a short trace's process
    /// (≈ 0.18 ms and 56 page faults of about 1 ms). They are parsed on their own first. Any
    /// error, `--help` or `--version` goes through the full parser, so what the user sees is
    /// the same.
    fn parse_from_args(argv: Vec<std::ffi::OsString>) -> Cli {
        use clap::{Args, FromArgMatches};
        fn alone<A: Args + FromArgMatches>(
            name: &'static str,
            rest: &[std::ffi::OsString],
        ) -> Option<A> {
            let m = A::augment_args(clap::Command::new(name))
                .no_binary_name(true)
                .try_get_matches_from(rest)
                .ok()?;
            A::from_arg_matches(&m).ok()
        }
        let rest = argv.get(2..).unwrap_or_default();
        let quick = match argv.get(1).and_then(|a| a.to_str()) {
            Some("decode") => alone("decode", rest).map(Command::Decode),
            Some("dump") => alone("dump", rest).map(Command::Dump),
            _ => None,
        };
        match quick {
            Some(command) => Cli { command },
            None => Cli::parse_from(argv),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The quick parse of `decode`/`dump` gives what the full parser gives.
    #[test]
    fn decode_and_dump_parse_alone_as_in_the_full_command() {
        let cases: &[&[&str]] = &[
            &[
                "decode",
                "--pt",
                "t.pt",
                "--raw",
                "a.bin:0x400000",
                "--raw",
                "b.bin:0x1000",
            ],
            &[
                "decode",
                "--pt=t.pt",
                "--elf",
                "a.out",
                "--cpu",
                "6/85/4",
                "--bits",
                "32",
                "--format",
                "ips-bin",
                "--stats",
                "--ip-filter",
                "0x1000-0x2000",
            ],
            &[
                "decode",
                "--perf",
                "perf.data",
                "--pid",
                "7",
                "--format",
                "json",
            ],
            &["decode", "--qemu", "dir", "--format", "calls"],
            &["dump", "t.pt"],
            &["dump", "--lastip", "--sync", "--stream", "cpu0", "-"],
        ];
        for case in cases {
            let argv: Vec<std::ffi::OsString> = std::iter::once("ptrewind")
                .chain(case.iter().copied())
                .map(Into::into)
                .collect();
            let full = Cli::try_parse_from(&argv).expect("the full parser takes it");
            let quick = Cli::parse_from_args(argv);
            assert_eq!(format!("{quick:?}"), format!("{full:?}"), "{case:?}");
        }
    }
}
