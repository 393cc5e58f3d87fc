//! `ptrewind view`: the flame graph (SVG) and the call timeline (Chrome/Perfetto trace-event
//! JSON) of a recording — a `monitor save` directory (a track per thread), a raw PT file with
//! its code (`--pt FILE --elf/--raw`), a perf.data file (`--perf`, code from its MMAP records as
//! for `decode`), or a QEMU-backend recording directory (`--qemu DIR`, a track per thread).
//!
//! The inputs are read exactly as `ptrewind decode` reads them (the same options, errors and
//! missing-file reports). Each trace stream is decoded once; the call tree built on the way
//! feeds both outputs (see `ptrewind::view`). Files are written under a temporary name and
//! renamed when complete. A progress bar is drawn on stderr when it is a terminal.
//!
//! Exit status: 0 when the decode reported no error event, 2 when it did or the perf.data is
//! damaged (cut short, malformed records; said on stderr as `decode` says it) — the outputs are
//! still written: each error ends the call stack there and a new one begins — or when the
//! inputs could not be read (nothing is written then).

use super::CmdResult;
use super::code::{
    ImageArgs, exec_mode, flow_setup, given_images, parse_range, qemu_image, report_missing,
    stream_pid,
};
use super::perf_threads::{CodeSource, perf_inputs, thread_code};
use ptrewind::flow::Cpu;
use ptrewind::image::perf_maps::PerfSideband;
use ptrewind::image::{Image, Symbolizer};
use ptrewind::packet::time::TimingConfig;
use ptrewind::store::perf_data::PerfData;
use ptrewind::store::{SourceFormat, TraceFile};
use ptrewind::timeline::offline::load_saved;
use ptrewind::timeline::{ThreadRecording, load_saved_threads};
use ptrewind::view::{
    Clock, FlameOptions, OutputFile, TrackInput, TscConversion, View, write_flamegraph,
};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `ptrewind view`.
#[derive(clap::Args, Debug)]
pub struct ViewArgs {
    /// A directory written by `monitor save DIR`.
    #[arg(value_name = "DIR", conflicts_with_all = ["pt", "perf", "qemu"])]
    dir: Option<PathBuf>,
    /// A QEMU-backend recording directory (`record --backend qemu --trace-dir DIR`): one track
    /// per recorded thread.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["pt", "perf"])]
    qemu: Option<PathBuf>,
    /// Raw PT trace file.
    #[arg(long, value_name = "FILE", conflicts_with = "perf")]
    pt: Option<PathBuf>,
    /// perf.data recorded with `-e intel_pt//`; every thread is a track of the timeline (per-CPU
    /// streams split into threads by the context switches, as `decode` and `replay` do).
    #[arg(long, value_name = "perf.data")]
    perf: Option<PathBuf>,
    /// The code: --raw, --elf, and the perf.data mappings, as for `decode`.
    #[command(flatten)]
    image: ImageArgs,
    /// CPU the trace was recorded on (FAMILY/MODEL[/STEPPING]): selects the erratum
    /// workarounds (default for perf.data: the CPU in its header; otherwise none).
    #[arg(long, value_name = "FAMILY/MODEL[/STEPPING]")]
    cpu: Option<Cpu>,
    /// An IP filter range that was active while recording, FROM-TO inclusive (for SKL014).
    #[arg(long = "ip-filter", value_name = "FROM-TO", value_parser = parse_range)]
    ip_filter: Vec<(u64, u64)>,
    /// Execution mode assumed before the trace's first MODE.Exec (16, 32 or 64).
    #[arg(long, default_value_t = 64)]
    bits: u32,
    /// Write the flame graph (instructions by call stack) to this SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Write the call timeline (Chrome/Perfetto trace-event JSON) to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the folded stacks (`outer;inner COUNT` lines, for other flame graph tools).
    #[arg(long, value_name = "FILE")]
    folded: Option<PathBuf>,
    /// Leave calls of fewer than N instructions out of the timeline (they still count in their
    /// caller and in the flame graph): a smaller JSON for very large traces.
    #[arg(long = "min-insns", value_name = "N", default_value_t = 0)]
    min_insns: u64,
    /// Write DIR/flame.svg and DIR/timeline.json (DIR is created if needed).
    #[arg(short = 'o', long = "out-dir", value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

/// Where the outputs go.
struct Outputs {
    min_insns: u64,
    svg: Option<PathBuf>,
    json: Option<PathBuf>,
    folded: Option<PathBuf>,
}

impl Outputs {
    fn from_args(args: &ViewArgs) -> Result<Self, String> {
        let mut o = Outputs {
            min_insns: args.min_insns,
            svg: args.svg.clone(),
            json: args.json.clone(),
            folded: args.folded.clone(),
        };
        if let Some(dir) = &args.out_dir {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            o.svg.get_or_insert_with(|| dir.join("flame.svg"));
            o.json.get_or_insert_with(|| dir.join("timeline.json"));
        }
        if o.svg.is_none() && o.json.is_none() && o.folded.is_none() {
            return Err(
                "nothing to write: give --svg FILE, --json FILE (or --folded FILE), or -o DIR"
                    .into(),
            );
        }
        Ok(o)
    }
}

/// Runs `ptrewind view`.
pub fn run(args: ViewArgs) -> CmdResult {
    if args.image.pid.is_some() && args.perf.is_none() {
        return Err("--pid needs --perf (the process whose MMAP records to use)".into());
    }
    let outputs = Outputs::from_args(&args)?;
    match &args.dir {
        Some(dir) => {
            if !args.image.raw.is_empty() || !args.image.elf.is_empty() {
                return Err("a saved recording brings its own code: drop --elf/--raw".into());
            }
            if let Some((threads, _, _)) = load_saved_threads(dir)? {
                return view_saved_threads(dir, &threads, &outputs);
            }
            let rec = load_saved(dir)?;
            let process = rec
                .info
                .exe
                .as_deref()
                .and_then(Path::file_name)
                .map_or_else(|| "recording".to_string(), |n| n.to_string_lossy().into());
            let pid = u32::try_from(rec.info.pid).unwrap_or(1);
            let track = TrackInput {
                process: &process,
                name: "recording",
                pid,
                tid: pid,
                trace: &rec.trace,
                image: &rec.image,
                symbols: &rec.symbols,
                flow: rec.flow.clone(),
            };
            let clock =
                Clock::for_traces([&rec.trace[..]], &rec.flow.timing, TscConversion::Unknown);
            render(&outputs, vec![track], clock, &rec.info.source, 0)
        }
        None => match &args.qemu {
            Some(dir) => view_qemu(dir, &args, &outputs),
            None => view_trace_file(&args, &outputs),
        },
    }
}

/// A `monitor save` directory of several threads: each thread is a track, with its own saved
/// code and symbols.
fn view_saved_threads(dir: &Path, threads: &[ThreadRecording], outputs: &Outputs) -> CmdResult {
    let Some(first) = threads.first() else {
        return Err(format!("{}: the recording has no thread", dir.display()).into());
    };
    let process = first
        .recording
        .info
        .exe
        .as_deref()
        .and_then(Path::file_name)
        .map_or_else(|| "recording".to_string(), |n| n.to_string_lossy().into());
    let pid = u32::try_from(first.recording.info.pid).unwrap_or(1);
    let names: Vec<String> = threads
        .iter()
        .map(|t| format!("thread {}", t.tid))
        .collect();
    let tracks: Vec<TrackInput<'_>> = threads
        .iter()
        .zip(&names)
        .map(|(t, name)| TrackInput {
            process: &process,
            name,
            pid,
            tid: u32::try_from(t.tid).unwrap_or(pid),
            trace: &t.recording.trace,
            image: &t.recording.image,
            symbols: &t.recording.symbols,
            flow: t.recording.flow.clone(),
        })
        .collect();
    let clock = Clock::for_traces(
        tracks.iter().map(|t| t.trace),
        &first.recording.flow.timing,
        TscConversion::Unknown,
    );
    render(outputs, tracks, clock, &dir.display().to_string(), 0)
}

/// `--qemu DIR`: every recorded thread is a track; the code comes from the recorded mappings
/// of its process (the program's, or a forked child's), as `decode --qemu` builds it.
fn view_qemu(dir: &Path, args: &ViewArgs, outputs: &Outputs) -> CmdResult {
    let mode = exec_mode(args.bits)?;
    let (given, given_elfs) = given_images(&args.image)?;
    let recorded = ptrewind::capture::qemu::Recorded::open(dir)?;
    let mut codes: Vec<(u32, Image, Symbolizer)> = Vec::new();
    for pid in recorded.pids() {
        if let Some(one) = recorded.process(pid).filter(|r| !r.threads.is_empty()) {
            let (image, symbols) = qemu_image(&one, &given, &given_elfs)?;
            codes.push((pid, image, symbols));
        }
    }
    let code_of = |pid: u32| codes.iter().find(|c| c.0 == pid);
    if recorded.threads.is_empty() {
        return Err(format!("{}: the recording has no thread", dir.display()).into());
    }
    let flow = ptrewind::flow::FlowConfig {
        default_mode: mode,
        ip_filter: args.ip_filter.clone(),
        ..Default::default()
    };
    let mut losses = 0usize;
    for t in &recorded.threads {
        if let Some(m) = t.meta.as_ref().filter(|m| m.lost > 0) {
            losses += m.gaps.len().max(1);
            eprintln!(
                "ptrewind: {}: thread {}/{}: {} bytes of trace lost; the call stack restarts \
                 after each gap",
                dir.display(),
                t.pid,
                t.tid,
                m.lost
            );
        }
    }
    let process = codes
        .iter()
        .flat_map(|c| c.1.sections())
        .map(|s| Path::new(&*s.origin))
        .find(|p| p.is_absolute())
        .and_then(Path::file_name)
        .map_or_else(|| "recording".to_string(), |n| n.to_string_lossy().into());
    let names: Vec<String> = recorded
        .threads
        .iter()
        .map(|t| format!("thread {}", t.tid))
        .collect();
    let tracks: Vec<TrackInput<'_>> = recorded
        .threads
        .iter()
        .zip(&names)
        .filter_map(|(t, name)| {
            let (_, image, symbols) = code_of(t.pid)?;
            Some(TrackInput {
                process: &process,
                name,
                pid: t.pid,
                tid: t.tid,
                trace: &t.trace,
                image,
                symbols,
                flow: flow.clone(),
            })
        })
        .collect();
    let clock = Clock::for_traces(
        tracks.iter().map(|t| t.trace),
        &flow.timing,
        TscConversion::Unknown,
    );
    render(outputs, tracks, clock, &dir.display().to_string(), losses)
}

/// A track of a trace file: its label, process, thread, trace and image (index into the
/// images).
type Track<'a> = (String, Option<u32>, Option<u32>, Cow<'a, [u8]>, usize);

/// `--pt FILE` or `--perf perf.data`: inputs read as `decode` reads them.
fn view_trace_file(args: &ViewArgs, outputs: &Outputs) -> CmdResult {
    let mode = exec_mode(args.bits)?;
    let (given, given_elfs) = given_images(&args.image)?;
    let path = match (&args.pt, &args.perf) {
        (Some(p), None) | (None, Some(p)) => p.clone(),
        _ => return Err("give a saved recording DIR, --pt FILE or --perf perf.data".into()),
    };
    let file = TraceFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let source = file
        .source()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // The same checks as `decode`: the right kind of file, something to decode, damage said.
    if args.perf.is_some() {
        super::input::require_perf_data(&path, &source)?;
    }
    super::input::require_trace(&path, &source)?;
    let damaged = super::input::report_perf_damage(&path, &source);
    let perf = match source.format {
        SourceFormat::PerfData { .. } => Some(PerfData::parse(file.bytes())?),
        SourceFormat::RawPt => None,
    };
    let sideband = match &perf {
        Some(p) if !args.image.no_mmaps => Some(PerfSideband::read(p)),
        _ => None,
    };
    let (_, _, flow) = flow_setup(args.cpu, perf.as_ref(), &source, mode, &args.ip_filter);
    // Per-CPU streams thread by thread (split by the context switches), as `decode` and
    // `replay` read them; one image per traced process, or per thread of a process that
    // called execve (one period per program it ran).
    let inputs = perf_inputs(&path, &source, perf.as_ref());
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
    let mut images: Vec<(Image, Symbolizer)> = Vec::new();
    let mut by_pid: HashMap<Option<u32>, usize> = HashMap::new();
    let mut reported: HashSet<String> = HashSet::new();
    let mut any_missing = false;
    let mut built: Vec<Track<'_>> = Vec::new();
    for input in inputs {
        let pid = input.pid.filter(|_| args.image.pid.is_none()).or_else(|| {
            match source.stream(&input.label) {
                Some(s) => stream_pid(&args.image, sideband.as_ref(), s),
                None => args.image.pid,
            }
        });
        let crosses_exec = matches!(
            (sideband.as_ref(), pid),
            (Some(sb), Some(p)) if !sb.execs_of(p).is_empty()
        );
        let (data, index) = match by_pid.get(&pid) {
            Some(&k) if !crosses_exec => (input.data, k),
            _ => {
                let mut tc = thread_code(&code, pid, input.data, &input.label)?;
                for space in &tc.spaces {
                    any_missing |= report_missing(&space.3, pid, sideband.as_ref(), &mut reported);
                }
                let image = tc.image();
                let syms = tc.spaces.pop().map(|s| s.2).unwrap_or_default();
                images.push((image, syms));
                if !crosses_exec {
                    by_pid.insert(pid, images.len() - 1);
                }
                (tc.data, images.len() - 1)
            }
        };
        built.push((input.label, pid, input.tid, data, index));
    }
    if any_missing {
        eprintln!(
            "ptrewind: hint: give the missing files with --symfs DIR (DIR + recorded path), \
             --search-dir DIR (by file name), or --elf FILE:BASE / --raw FILE:BASE"
        );
    }
    if images.iter().all(|(image, _)| image.sections().is_empty()) {
        return Err(
            "no code for the trace: give it with --elf FILE[:BASE] or --raw \
             (perf.data: --symfs/--search-dir for its recorded mappings)"
                .into(),
        );
    }
    let conversion = match source.perf.as_ref().and_then(|p| p.intel_pt) {
        Some(i) if i.time_mult != 0 && i.time_mult <= u32::MAX as u64 && i.time_shift < 64 => {
            TscConversion::PerfTime {
                mult: i.time_mult as u32,
                shift: i.time_shift as u16,
            }
        }
        Some(i) => match i.max_non_turbo_ratio {
            Some(r) if r > 0 && r <= 255 => TscConversion::NonTurboRatio(r as u8),
            _ => TscConversion::Unknown,
        },
        None => TscConversion::Unknown,
    };
    // The process's name: the first --elf, else the first file its mappings came from, else
    // the trace file's.
    let first_file = |image: &Image| {
        image
            .sections()
            .iter()
            .map(|s| Path::new(&*s.origin))
            .find(|p| p.is_absolute())
            .map(Path::to_path_buf)
    };
    let process_names: Vec<String> = images
        .iter()
        .map(|(image, _)| {
            let file = args
                .image
                .elf
                .first()
                .map(|e| e.path.clone())
                .or_else(|| first_file(image))
                .unwrap_or_else(|| path.clone());
            file.file_name()
                .map_or_else(|| "trace".to_string(), |n| n.to_string_lossy().into())
        })
        .collect();
    let losses: usize = source.streams.iter().map(|s| s.losses.len()).sum();
    for (s, loss) in source
        .streams
        .iter()
        .flat_map(|s| s.losses.iter().map(move |l| (s, l)))
    {
        eprintln!(
            "ptrewind: {}: stream {}: data lost ({}){}; the call stack restarts after it",
            path.display(),
            s.label,
            super::input::loss_name(&loss.kind),
            loss.stream_offset
                .map(|o| format!(" at trace offset {o:#x}"))
                .unwrap_or_default()
        );
    }
    let tracks: Vec<TrackInput<'_>> = built
        .iter()
        .enumerate()
        .map(|(i, (label, pid, tid, data, index))| {
            let (image, symbols) = &images[*index];
            TrackInput {
                process: &process_names[*index],
                name: label,
                pid: pid.unwrap_or(1),
                tid: tid.unwrap_or(i as u32 + 1),
                trace: data,
                image,
                symbols,
                flow: flow.clone(),
            }
        })
        .collect();
    let clock = Clock::for_traces(tracks.iter().map(|t| t.trace), &flow.timing, conversion);
    let code = render(outputs, tracks, clock, &path.display().to_string(), losses)?;
    // A damaged perf.data is shown as far as it goes, and the exit status says so.
    Ok(if damaged { ExitCode::from(2) } else { code })
}

/// Decodes every track once and writes the outputs.
fn render(
    outputs: &Outputs,
    tracks: Vec<TrackInput<'_>>,
    clock: Clock,
    source: &str,
    losses: usize,
) -> CmdResult {
    let with_path = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    let json = match &outputs.json {
        Some(p) => Some(OutputFile::create(p).map_err(|e| with_path(p, e))?),
        None => None,
    };
    let total: u64 = tracks.iter().map(|t| t.trace.len() as u64).sum();
    let bar = (std::io::stderr().is_terminal() && total > (1 << 20)).then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {eta} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut view = View::new(json, clock);
    view.set_min_slice_insns(outputs.min_insns);
    let mut done = 0u64;
    for t in &tracks {
        if let Some(b) = &bar {
            b.set_message(t.name.to_string());
        }
        view.add_track(t, &mut |off| {
            if let Some(b) = &bar {
                b.set_position(done + off);
            }
        });
        done += t.trace.len() as u64;
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut other = serde_json::Map::new();
    other.insert("source".into(), source.into());
    other.insert("trace_data_losses".into(), losses.into());
    let json_path = outputs.json.as_deref().unwrap_or(Path::new("-"));
    let finished = view.finish(other).map_err(|e| with_path(json_path, e))?;
    if let Some((file, _)) = finished.timeline {
        file.commit().map_err(|e| with_path(json_path, e))?;
    }
    let insns: u64 = finished.tracks.iter().map(|(_, r)| r.calls.insns).sum();
    let frames: u64 = finished.tracks.iter().map(|(_, r)| r.calls.frames).sum();
    let errors: u64 = finished.tracks.iter().map(|(_, r)| r.flow.errors).sum();
    if let Some(p) = &outputs.svg {
        let mut f = OutputFile::create(p).map_err(|e| with_path(p, e))?;
        let opts = FlameOptions {
            title: "Instructions by call stack".into(),
            subtitle: Some(format!(
                "{source}: {insns} instructions, {frames} calls, {} track{}",
                tracks.len(),
                if tracks.len() == 1 { "" } else { "s" }
            )),
        };
        write_flamegraph(&finished.tree, &opts, &mut f).map_err(|e| with_path(p, e))?;
        f.commit().map_err(|e| with_path(p, e))?;
    }
    if let Some(p) = &outputs.folded {
        let mut f = OutputFile::create(p).map_err(|e| with_path(p, e))?;
        for line in finished.tree.folded() {
            writeln!(f, "{line}").map_err(|e| with_path(p, e))?;
        }
        f.commit().map_err(|e| with_path(p, e))?;
    }
    let written: Vec<String> = [&outputs.svg, &outputs.json, &outputs.folded]
        .into_iter()
        .flatten()
        .map(|p| p.display().to_string())
        .collect();
    eprintln!(
        "ptrewind: {insns} instructions, {frames} calls in {} track{} (times: {}); wrote {}",
        tracks.len(),
        if tracks.len() == 1 { "" } else { "s" },
        clock.describe(),
        written.join(", ")
    );
    if errors > 0 {
        eprintln!(
            "ptrewind: the decode reported {errors} error{} (each ends the call stack there; see \
             `ptrewind decode` for where)",
            if errors == 1 { "" } else { "s" }
        );
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}
