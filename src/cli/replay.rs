//! `ptrewind replay`: serve a recording to GDB/LLDB with no live process — a directory written
//! by `monitor save DIR`, or a trace file (raw PT with `--pt`, perf.data with `--perf`) with its
//! code given like `ptrewind decode`'s (`--elf`, `--raw`). Reverse execution is PC-only.

use super::CmdResult;
use super::decode::build_image;
use super::record::{Served, bind, serve_session};
use ptrewind::image::{ElfSpec, RawSpec};
use ptrewind::server::replay::OfflineInfo;
use ptrewind::server::replay::offline::{OfflineRecording, load_saved};
use ptrewind::server::{RecordingTarget, Session, check_listen_addr, register_monitors};
use ptrewind::store::TraceFile;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `ptrewind replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// A directory written by `monitor save DIR` (trace.pt, code-*.bin, manifest.json).
    #[arg(value_name = "DIR", conflicts_with_all = ["pt", "perf"])]
    dir: Option<PathBuf>,
    /// Raw PT trace file (one thread).
    #[arg(long, value_name = "FILE", conflicts_with = "perf")]
    pt: Option<PathBuf>,
    /// perf.data recorded with `-e intel_pt//` (one AUX stream, or pick one with `--stream`).
    #[arg(long, value_name = "perf.data")]
    perf: Option<PathBuf>,
    /// The AUX stream of a perf.data file to replay (its label as `ptrewind decode` prints it
    /// in `[stream LABEL]`, or its index from 0) when there are several.
    #[arg(long, value_name = "LABEL|N")]
    stream: Option<String>,
    /// Raw code bytes: FILE[:FROM[-TO]]:BASE (ptxed syntax).
    #[arg(long, value_name = "FILE[:FROM[-TO]]:BASE")]
    raw: Vec<RawSpec>,
    /// ELF file whose executable segments (and symbols) are loaded, at BASE if given.
    #[arg(long, value_name = "FILE[:BASE]")]
    elf: Vec<ElfSpec>,
    /// Address to listen on for GDB (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Allow listening on a non-loopback address.
    #[arg(long)]
    allow_remote: bool,
}

/// The trace bytes of `--pt FILE` or of one AUX stream of `--perf perf.data`.
fn load_trace(args: &ReplayArgs) -> Result<(Vec<u8>, String), String> {
    let path = match (&args.pt, &args.perf) {
        (Some(p), None) | (None, Some(p)) => p,
        _ => return Err("give a saved recording DIR, --pt FILE or --perf perf.data".into()),
    };
    let file = TraceFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let source = file
        .source()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let labels: Vec<&str> = source.streams.iter().map(|s| s.label.as_str()).collect();
    let index = match &args.stream {
        None if source.streams.len() == 1 => 0,
        None => {
            return Err(format!(
                "{} has {} trace streams ({}); choose one with --stream",
                path.display(),
                labels.len(),
                labels.join(", ")
            ));
        }
        Some(want) => labels
            .iter()
            .position(|l| l == want)
            .or_else(|| want.parse::<usize>().ok().filter(|&i| i < labels.len()))
            .ok_or_else(|| {
                format!(
                    "no stream {want:?} in {} (streams: {})",
                    path.display(),
                    labels.join(", ")
                )
            })?,
    };
    let stream = &source.streams[index];
    Ok((
        stream.data.to_vec(),
        format!("{} [{}]", path.display(), stream.label),
    ))
}

/// Runs `ptrewind replay`.
pub fn run(args: ReplayArgs) -> CmdResult {
    check_listen_addr(args.listen, args.allow_remote)?;
    let rec = match &args.dir {
        Some(dir) => {
            if !args.raw.is_empty() || !args.elf.is_empty() {
                return Err("a saved recording brings its own code: drop --elf/--raw".into());
            }
            load_saved(dir)?
        }
        None => {
            let (trace, source) = load_trace(&args)?;
            let (image, symbols) = build_image(&args.raw, &args.elf)?;
            if image.sections().is_empty() {
                return Err("give the traced code with --elf FILE[:BASE] or --raw".into());
            }
            OfflineRecording {
                trace,
                image,
                immutable: None,
                symbols,
                registers_at_start: None,
                registers_at_end: None,
                instructions: None,
                info: OfflineInfo {
                    pid: 1,
                    exe: args.elf.first().map(|e| e.path.clone()),
                    source,
                },
            }
        }
    };
    let target = match RecordingTarget::offline(rec) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ptrewind: cannot replay: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    {
        let shared = target.shared();
        let mut r = shared.borrow_mut();
        eprintln!("ptrewind: {}", r.where_text().trim_end());
    }
    let listener = bind(args.listen)?;
    let mut session = Session::new(Box::new(target.clone()));
    register_monitors(session.monitors_mut(), &target);
    serve_session(session, listener, Served::Replay, "".as_ref(), |_router| {})
}
