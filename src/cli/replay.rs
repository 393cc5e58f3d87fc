//! `ptrewind replay`: serve a recording to GDB/LLDB with no live process — a directory written
//! by `monitor save DIR`, or a trace file (raw PT with `--pt`, perf.data with `--perf`) with its
//! code given like `ptrewind decode`'s (`--elf`, `--raw`). Reverse execution is PC-only.

use super::CmdResult;
use super::code::{ImageArgs, flow_setup, given_images, report_missing};
use super::perf_threads::{CodeSource, ThreadCode, split_threads, thread_code};
use super::record::{Served, bind, serve_session};
use ptrewind::capture::ExecBoundary;
use ptrewind::flow::{Cpu, FlowConfig};
use ptrewind::image::Image;
use ptrewind::image::perf_maps::PerfSideband;
use ptrewind::packet::time::TimingConfig;
use ptrewind::server::recording_monitors::where_text;
use ptrewind::server::{GdbStubAdapter, RecordingTarget, check_listen_addr, register_monitors};
use ptrewind::store::perf_data::PerfData;
use ptrewind::store::{SourceFormat, TraceFile};
use ptrewind::timeline::{
    FatalSignal, OfflineInfo, OfflineRecording, ThreadRecording, Timeline, load_saved,
    load_saved_threads,
};
use std::borrow::Cow;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Arguments of `ptrewind replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// A directory written by `monitor save DIR` (trace.pt, code-*.bin, manifest.json).
    #[arg(value_name = "DIR", conflicts_with_all = ["pt", "perf", "qemu"])]
    dir: Option<PathBuf>,
    /// A recording directory of `record --backend qemu` (its `--trace-dir`): every thread of
    /// the process is served, in one global order.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["pt", "perf"])]
    qemu: Option<PathBuf>,
    /// With --qemu: serve only this thread.
    #[arg(long, value_name = "TID", requires = "qemu")]
    thread: Option<u32>,
    /// Raw PT trace file (one thread).
    #[arg(long, value_name = "FILE", conflicts_with = "perf")]
    pt: Option<PathBuf>,
    /// perf.data recorded with `-e intel_pt//`: per CPU (perf's default; split into threads by
    /// its context-switch records) or `--per-thread` (one stream per thread); every thread is
    /// served.
    #[arg(long, value_name = "perf.data")]
    perf: Option<PathBuf>,
    /// Replay only this AUX stream of a perf.data file, as one thread (its label as `ptrewind
    /// decode` prints it in `[stream LABEL]`, or its index from 0). A per-CPU stream given
    /// this way is not split by context switches: every thread that ran on that CPU is served
    /// as one.
    #[arg(long, value_name = "LABEL|N")]
    stream: Option<String>,
    /// CPU the trace was recorded on (FAMILY/MODEL[/STEPPING]): selects the erratum
    /// workarounds (default for perf.data: the CPU in its header; otherwise none).
    #[arg(long, value_name = "FAMILY/MODEL[/STEPPING]")]
    cpu: Option<Cpu>,
    /// The code: --raw, --elf, and (perf.data) the recorded mappings, as for `decode`.
    #[command(flatten)]
    image: ImageArgs,
    /// Address to listen on for GDB (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Allow listening on a non-loopback address.
    #[arg(long)]
    allow_remote: bool,
    /// End when the debugger's connection closes. By default ptrewind waits for a debugger to
    /// connect again (the cursor stays where it was).
    #[arg(long)]
    once: bool,
}

/// The trace of `--pt FILE` or of one AUX stream of `--perf perf.data`, with its code image
/// built as `ptrewind decode` builds it (perf.data mappings, then `--elf`/`--raw` over them).
/// A perf.data recorded per thread (`perf record --per-thread`: one AUX stream per thread)
/// without `--stream` gives every thread's stream, each with its thread id; one recorded per
/// CPU (perf's default) is split into threads by its context-switch records
/// (`store::percpu`), each thread with its own process's code.
fn load_trace(args: &ReplayArgs) -> Result<Vec<(Option<u32>, OfflineRecording)>, BoxError> {
    let path = match (&args.pt, &args.perf) {
        (Some(p), None) | (None, Some(p)) => p,
        _ => return Err("give a saved recording DIR, --pt FILE or --perf perf.data".into()),
    };
    let file = TraceFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let source = file
        .source()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if args.perf.is_some() {
        super::input::require_perf_data(path, &source)?;
    }
    super::input::require_trace(path, &source)?;
    // The history would silently end where the damage is: refuse (decode shows what is left).
    if super::input::report_perf_damage(path, &source) {
        return Err(format!(
            "{}: the perf.data is damaged (see above); `ptrewind decode --perf` shows what can \
             be read of it",
            path.display()
        )
        .into());
    }
    let labels: Vec<&str> = source.streams.iter().map(|s| s.label.as_str()).collect();
    // One AUX stream per thread: every thread, in the order of their TSC packets.
    let per_thread = source.streams.len() > 1
        && source
            .streams
            .iter()
            .all(|s| s.cpu.is_none() && s.tid.is_some());
    // Parsed once: the context switches (per-CPU split), the CPU and the sideband.
    let perf = match source.format {
        SourceFormat::PerfData { .. } => Some(PerfData::parse(file.bytes())?),
        SourceFormat::RawPt => None,
    };
    // Per-CPU streams (perf's default mode): split into threads by the context switches.
    let per_cpu_perf = perf
        .as_ref()
        .filter(|_| args.stream.is_none() && source.streams.iter().any(|s| s.cpu.is_some()));
    let mut inputs: Vec<StreamInput<'_>> = Vec::new();
    let split = match per_cpu_perf.and_then(|perf| split_threads(path, &source, perf)) {
        Some(Ok(threads)) => Some(threads),
        None => None,
        Some(Err(e)) if source.streams.len() == 1 => {
            eprintln!(
                "ptrewind: {}: {e}; serving its one stream ({}) as one thread",
                path.display(),
                labels[0]
            );
            None
        }
        Some(Err(e)) => {
            return Err(format!(
                "{} has {} per-CPU trace streams ({}) that cannot be split into threads: \
                 {e}; choose one with --stream",
                path.display(),
                labels.len(),
                labels.join(", ")
            )
            .into());
        }
    };
    if let Some(threads) = split {
        if threads.is_empty() {
            return Err(format!(
                "{}: no part of the per-CPU trace could be given to a thread (see above); \
                 `--stream LABEL` replays one CPU's stream as it is, as one thread",
                path.display()
            )
            .into());
        }
        // A CPU-wide recording (`perf record -a`) has every process's threads: one process is
        // served (`--pid`, or the only one).
        let mut pids: Vec<u32> = threads.iter().filter_map(|t| t.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let pid = match (args.image.pid, pids.as_slice()) {
            (Some(p), _) if pids.contains(&p) => p,
            (None, [only]) => *only,
            _ => {
                let list: Vec<String> = pids.iter().map(u32::to_string).collect();
                return Err(format!(
                    "{}: the per-CPU trace has threads of the processes {}: choose one with \
                     --pid PID",
                    path.display(),
                    list.join(", ")
                )
                .into());
            }
        };
        for t in threads.into_iter().filter(|t| t.pid == Some(pid)) {
            inputs.push((t.tid, t.pid, t.label, t.data));
        }
    } else {
        let indices: Vec<usize> = match &args.stream {
            None if source.streams.len() == 1 => vec![0],
            None if per_thread => (0..source.streams.len()).collect(),
            None => {
                return Err(format!(
                    "{} has {} trace streams ({}) that are neither per thread nor per CPU: \
                     choose one with --stream",
                    path.display(),
                    labels.len(),
                    labels.join(", ")
                )
                .into());
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
                })
                .map(|i| vec![i])?,
        };
        for index in indices {
            let s = &source.streams[index];
            inputs.push((
                s.tid.filter(|_| per_thread),
                None,
                s.label.clone(),
                Cow::Borrowed(&s.data[..]),
            ));
        }
    }
    // Errata and timing as `decode` picks them: --cpu, else the perf.data header.
    let (_, _, flow) = flow_setup(
        args.cpu,
        perf.as_ref(),
        &source,
        FlowConfig::default().default_mode,
        &[],
    );
    let sideband = match &perf {
        Some(p) if !args.image.no_mmaps => Some(PerfSideband::read(p)),
        _ => None,
    };
    let (given, given_elfs) = given_images(&args.image)?;
    let code = CodeSource::kept(
        &args.image,
        &given,
        &given_elfs,
        sideband.as_ref(),
        perf.as_ref(),
        source
            .perf
            .as_ref()
            .map_or_else(TimingConfig::default, |p| p.timing()),
    );
    let mut out = Vec::with_capacity(inputs.len());
    for (tid, split_pid, label, data) in inputs {
        let pid = sideband.as_ref().and_then(|sb| {
            args.image.pid.or(split_pid).or_else(|| {
                // A per-thread stream's thread, or the one stream's CPU and thread.
                let s = source.stream(&label);
                sb.pid_for_stream(s.and_then(|s| s.cpu), s.and_then(|s| s.tid).or(tid))
            })
        });
        let name = format!("{} [{label}]", path.display());
        let tc = thread_code(&code, pid, data, &name)?;
        let rec = stream_recording(args, sideband.as_ref(), pid, flow.clone(), tc, name)?;
        out.push((tid, rec));
    }
    Ok(out)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One stream to replay: (thread id, process id from the per-CPU split, the stream's label,
/// its bytes).
type StreamInput<'a> = (Option<u32>, Option<u32>, String, Cow<'a, [u8]>);

/// One stream's recording: its code (one image per program it ran, see
/// [`super::perf_threads`]) and what is known of it.
fn stream_recording(
    args: &ReplayArgs,
    sideband: Option<&PerfSideband>,
    pid: Option<u32>,
    flow: FlowConfig,
    code: ThreadCode<'_>,
    source: String,
) -> Result<OfflineRecording, BoxError> {
    let mut reported = HashSet::new();
    for space in &code.spaces {
        report_missing(&space.3, pid, sideband, &mut reported);
    }
    // The first ELF given, else the first recorded file that exists here.
    let exe_of = |image: &Image| {
        args.image.elf.first().map(|e| e.path.clone()).or_else(|| {
            image
                .sections()
                .iter()
                .map(|s| PathBuf::from(&*s.origin))
                .find(|p| p.is_absolute() && p.is_file())
        })
    };
    let mut spaces = code.spaces;
    // Where each program after the first starts in the trace.
    let starts: Vec<u64> = spaces.iter().skip(1).map(|s| s.0.unwrap_or(0)).collect();
    let Some((_, image, symbols, _)) = spaces.pop() else {
        return Err("no code for the trace".into());
    };
    if image.sections().is_empty() {
        return Err(
            "no code for the trace: give it with --elf FILE[:BASE] or --raw \
                    (perf.data: --symfs/--search-dir for its recorded mappings)"
                .into(),
        );
    }
    // The programs before each exec placed in the trace; where the next one starts in the
    // history is found when it is indexed (`next_insn` unknown).
    let exec_boundaries = spaces
        .iter()
        .zip(starts)
        .map(|((_, before, _, _), next_offset)| ExecBoundary {
            cause: "exec".into(),
            exe: exe_of(before),
            image: Arc::new(before.clone()),
            maps: String::new(),
            next_insn: u64::MAX,
            next_offset,
            thread_offsets: Vec::new(),
        })
        .collect();
    let exe = exe_of(&image);
    Ok(OfflineRecording {
        trace: code.data.into_owned(),
        image,
        exec_boundaries,
        immutable: None,
        symbols,
        registers_at_start: None,
        registers_at_end: None,
        registers_at: Vec::new(),
        instructions: None,
        flow,
        info: OfflineInfo {
            pid: pid.and_then(|p| i32::try_from(p).ok()).unwrap_or(1),
            exe,
            source,
            ..Default::default()
        },
    })
}

/// Runs `ptrewind replay`.
pub fn run(args: ReplayArgs) -> CmdResult {
    check_listen_addr(args.listen, args.allow_remote)?;
    if args.image.pid.is_some() && args.perf.is_none() && args.qemu.is_none() {
        return Err("--pid chooses a process of a --perf or --qemu recording".into());
    }
    if let Some(dir) = &args.qemu {
        let recorded = ptrewind::capture::qemu::Recorded::open(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        // A recording directory does not say how the program ended; a stream completed from
        // its tail file is what a killed QEMU leaves.
        let which = args
            .image
            .pid
            .map_or(super::record_qemu::ServeProcess::Launched, |p| {
                super::record_qemu::ServeProcess::Pid(p)
            });
        let target =
            match super::record_qemu::serve_target(&recorded, which, args.thread, None, true) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("ptrewind: cannot replay: {e}");
                    return Ok(ExitCode::from(2));
                }
            };
        return serve(target, &args);
    }
    let rec = match &args.dir {
        Some(dir) => {
            if !args.image.raw.is_empty() || !args.image.elf.is_empty() {
                return Err("a saved recording brings its own code: drop --elf/--raw".into());
            }
            // A multi-thread recording: every thread, in one global order.
            if let Some((threads, fatal, ended_by)) = load_saved_threads(dir)? {
                return serve_threads(threads, fatal, ended_by, &args);
            }
            load_saved(dir)?
        }
        None => {
            let mut recs = load_trace(&args)?;
            if recs.len() > 1 {
                let threads = recs
                    .drain(..)
                    .map(|(tid, recording)| ThreadRecording {
                        tid: tid.and_then(|t| i32::try_from(t).ok()).unwrap_or(0),
                        recording,
                    })
                    .collect();
                return serve_threads(threads, None, None, &args);
            }
            recs.pop().map(|r| r.1).ok_or("no trace stream")?
        }
    };
    let target = match Timeline::offline(rec) {
        Ok(t) => RecordingTarget::new(t),
        Err(e) => {
            eprintln!("ptrewind: cannot replay: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    serve(target, &args)
}

/// Serves a multi-thread recording (every thread, in one global order); threads that cannot be
/// served are named in a warning.
fn serve_threads(
    threads: Vec<ThreadRecording>,
    fatal: Option<FatalSignal>,
    ended_by: Option<i32>,
    args: &ReplayArgs,
) -> CmdResult {
    match Timeline::offline_threads(threads, fatal, ended_by) {
        Ok(t) => {
            for why in t.skipped_threads() {
                eprintln!("ptrewind: warning: not served: {why}");
            }
            serve(RecordingTarget::new(t), args)
        }
        Err(e) => {
            eprintln!("ptrewind: cannot replay: {e}");
            Ok(ExitCode::from(2))
        }
    }
}

/// Serves a replay target until the debugger leaves (or for every debugger, without --once).
fn serve(target: RecordingTarget, args: &ReplayArgs) -> CmdResult {
    {
        let shared = target.shared();
        let mut r = shared.borrow_mut();
        eprintln!("ptrewind: {}", where_text(&mut r).trim_end());
    }
    let listener = bind(args.listen)?;
    let mut session = GdbStubAdapter::new(Box::new(target.clone()));
    register_monitors(session.monitors_mut(), &target);
    serve_session(
        session,
        listener,
        Served::Replay,
        "".as_ref(),
        args.once,
        |router| ptrewind::server::install_stop_query(router, &target),
    )
}
