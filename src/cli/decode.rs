//! `ptrewind decode`: reconstruct the executed instructions of a trace (like libipt's ptxed).
//!
//! Output formats (`--format`):
//! * `ips` (default): one executed instruction address per line as lowercase hex with `0x`;
//!   every event on its own line starting with `[` (`[enabled]`, `[disabled]`, `[overflow]`,
//!   `[psb]`, `[interrupt 0x… -> 0x…]`, `[error: <what> at offset 0x…]` …). This format is an
//!   interface: scripts compare it.
//! * `insn`: address, symbol+offset, Intel-syntax disassembly.
//! * `blocks`: one line per run of sequential instructions: `0xSTART..0xEND COUNT CLASS`.
//! * `calls`: the function-call history as an indented tree (like GDB's
//!   `record function-call-history`).
//! * `json`: one JSON object per line (`{"ip":…}` or `{"event":…}`).
//! * `ips-bin`: for tools: every executed instruction address as a little-endian u64 (8 bytes
//!   per instruction, nothing else: no events, no header). Errors still go to stderr as
//!   `[error: …]` lines and set exit status 2.
//!
//! Output is formatted by hand into a 256 KiB buffer (`super::output`), and start-up does only
//! what the format needs: symbol tables are read for `insn` and `calls` only, the disassembler
//! is set up for `insn` only.
//!
//! Code images: `--raw` and `--elf` as in ptxed; with `--perf`, also the perf.data file's own
//! `MMAP`/`MMAP2` records (see `ptrewind::image::perf_maps`): each AUX stream gets the mappings of
//! the process it traced (`PERF_RECORD_ITRACE_START`, or `--pid`), the files found under
//! `--symfs DIR` (DIR + recorded path), at the recorded path, or by base name in `--search-dir
//! DIR`, checked against the perf.data build ids. `--elf`/`--raw` are mapped on top and win
//! where they overlap. Every mapping whose file is missing is reported on stderr (once per file)
//! before decoding, which then reports the instructions it could not find as errors.
//!
//! Errata: `--cpu FAMILY/MODEL[/STEPPING]`, or else the perf.data `HEADER_CPUID`, selects the
//! processor errata the flow decoder works around (`ptrewind::flow::errata`); none when the CPU
//! is unknown. `--stats` names the CPU and errata used.
//!
//! `--stats` prints only counts and throughput, on stdout. A progress bar is drawn on stderr when
//! it is a terminal (and the trace is over 1 MiB). A perf.data file recorded per CPU (perf's
//! default) is split into threads by its context switches, as `replay` splits it
//! (`store::percpu`), and decoded thread by thread, each introduced by `[thread PID/TID]` when
//! there are several (what the split cannot attribute is said on stderr; if it cannot be split
//! at all, CPU by CPU as `[stream cpuN]`); one recorded per thread is decoded stream by
//! stream, each introduced by `[stream LABEL]`.
//!
//! A process that called `execve` while traced: each thread's trace is cut at the exec, found
//! by the sideband's time and mappings (`store::exec_cut`), and decoded against the program
//! before it up to there and against the new program after (their `MMAP` records before and
//! after the exec). An exec that cannot be placed is said on stderr, the thread's trace is
//! decoded only up to where it may lie, and the exit status is 2 (see `perf_threads`).
//!
//! Exit status: 0 when the decode reported no error event, 2 when it did (the output is still
//! complete: errors are lines in the stream) or when the perf.data is damaged (cut short,
//! malformed records: what could be read is decoded, the damage is said on stderr), and 2 with
//! only a message when the inputs cannot be used (unreadable, empty, a device, no Intel PT data,
//! no PSB).

use super::CmdResult;
use super::code::{
    ImageArgs, build_image_with, exec_mode, flow_setup, given_images_from, parse_range,
    qemu_image_with, report_missing, stream_pid,
};
use super::output::{Out, RunText};
use super::perf_threads::{CodeSource, exec_conversion, perf_inputs, thread_code};
use ptrewind::flow::{BlockItem, Cpu, Event, EventKind, FlowConfig, FlowDecoder, InsnClass};
use ptrewind::image::perf_maps::PerfSideband;
use ptrewind::image::{FileCache, Image, LoadedElf, MmapOptions, Section, Symbolizer};
use ptrewind::packet::ExecMode;
use ptrewind::packet::time::TimingConfig;
use ptrewind::store::TraceFile;
use ptrewind::store::perf_data::PerfData;
use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Output format of `ptrewind decode`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One instruction address per line, events in brackets.
    Ips,
    /// Address, symbol+offset and disassembly.
    Insn,
    /// Runs of sequential instructions.
    Blocks,
    /// Function-call history tree.
    Calls,
    /// One JSON object per line.
    Json,
    /// Every instruction address as a little-endian u64, nothing else (for tools).
    IpsBin,
}

impl Format {
    /// Whether the format prints symbols (only then are symbol tables read).
    fn needs_symbols(self) -> bool {
        matches!(self, Format::Insn | Format::Calls)
    }
}

/// Arguments of `ptrewind decode`.
#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// Raw PT trace file.
    #[arg(long, value_name = "FILE", conflicts_with = "perf")]
    pt: Option<PathBuf>,
    /// perf.data recorded with `-e intel_pt//`: per CPU (split into threads by its context
    /// switches) or `--per-thread`; every thread is decoded in turn.
    #[arg(long, value_name = "perf.data")]
    perf: Option<PathBuf>,
    /// A recording directory of `record --backend qemu`: every thread's stream is decoded in
    /// turn over the recorded mappings (`--elf`/`--raw` over them).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["pt", "perf"])]
    qemu: Option<PathBuf>,
    /// The code: --raw, --elf, and the perf.data mappings.
    #[command(flatten)]
    image: ImageArgs,
    /// CPU the trace was recorded on (FAMILY/MODEL[/STEPPING]): selects the erratum
    /// workarounds (default for perf.data: the CPU in its header; otherwise none).
    #[arg(long, value_name = "FAMILY/MODEL[/STEPPING]")]
    cpu: Option<Cpu>,
    /// An IP filter range that was active while recording, FROM-TO inclusive (IA32_RTIT_ADDRn
    /// with FilterEn); only the SKL014 erratum workaround uses it. May be repeated.
    #[arg(long = "ip-filter", value_name = "FROM-TO", value_parser = parse_range)]
    ip_filter: Vec<(u64, u64)>,
    /// Execution mode assumed before the trace's first MODE.Exec (16, 32 or 64).
    #[arg(long, default_value_t = 64)]
    bits: u32,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Ips)]
    format: Format,
    /// Print only counts and throughput (on stdout).
    #[arg(long)]
    stats: bool,
}

/// Runs `ptrewind decode`.
pub fn run(args: DecodeArgs) -> CmdResult {
    if args.image.pid.is_some() && args.perf.is_none() {
        return Err("--pid needs --perf (the process whose MMAP records to use)".into());
    }
    let mode = exec_mode(args.bits)?;
    // The images given on the command line: mapped after (over) the perf.data mappings.
    let (given, given_elfs) = given_images_from(&args.image, &mut FileCache::mapping())?;
    if let Some(dir) = &args.qemu {
        return decode_qemu(dir, &args, mode, &given, &given_elfs);
    }
    let path = match (&args.pt, &args.perf) {
        (Some(p), None) | (None, Some(p)) => p.clone(),
        _ => return Err("give the trace with --pt FILE or --perf perf.data".into()),
    };
    // Mapped until the process exits (see `leave_to_exit`): the streams borrow it to the end.
    let file: &TraceFile = Box::leak(Box::new(TraceFile::open(&path)?));
    let source = file.source()?;
    if args.perf.is_some() {
        super::input::require_perf_data(&path, &source)?;
    }
    super::input::require_trace(&path, &source)?;
    // A damaged perf.data (cut short, malformed records) is decoded as far as it goes, said on
    // stderr, and makes the exit status 2.
    let damaged = super::input::report_perf_damage(&path, &source);
    let perf = match source.format {
        ptrewind::store::SourceFormat::PerfData { .. } => Some(PerfData::parse(file.bytes())?),
        ptrewind::store::SourceFormat::RawPt => None,
    };
    let sideband = match &perf {
        Some(p) if !args.image.no_mmaps => Some(PerfSideband::read(p)),
        _ => None,
    };
    let (cpu, cpu_from, cfg) = flow_setup(args.cpu, perf.as_ref(), &source, mode, &args.ip_filter);
    let errata = cfg.errata;
    let stdout = std::io::stdout();
    let mut out = stdout_out(stdout.lock());
    if args.stats {
        let names = errata.names();
        match cpu {
            Some(c) => writeln!(
                out,
                "cpu {c} from {cpu_from} errata {}",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(",")
                }
            )?,
            None => writeln!(out, "cpu unknown errata none")?,
        }
    }
    // Per-CPU streams go thread by thread (split by the context switches, as `replay`
    // does); per-thread streams and a raw trace as they are.
    let inputs = perf_inputs(&path, &source, perf.as_ref());
    let conversion = perf
        .as_ref()
        .and_then(|p| exec_conversion(p, sideband.as_ref()));
    let code = CodeSource {
        args: &args.image,
        given: &given,
        given_elfs: &given_elfs,
        sideband: sideband.as_ref(),
        conversion,
        timing: source
            .perf
            .as_ref()
            .map_or_else(TimingConfig::default, |p| p.timing()),
        symbols: args.format.needs_symbols() && !args.stats,
        map_files: true,
    };
    // One image per process the streams traced, built on first use (a process that called
    // execve gets its images per thread: where its programs start differs by thread).
    let mut images: HashMap<Option<u32>, (Image, Symbolizer)> = HashMap::new();
    let mut reported: HashSet<String> = HashSet::new();
    let mut any_missing = false;
    let many = inputs.len() > 1;
    let mut errors = 0u64;
    let mut unplaced = 0;
    let streams = inputs.len();
    for (k, input) in inputs.into_iter().enumerate() {
        let last = k + 1 == streams;
        let pid = input.pid.filter(|_| args.image.pid.is_none()).or_else(|| {
            let stream = source.stream(&input.label);
            match stream {
                Some(s) => stream_pid(&args.image, sideband.as_ref(), s),
                None => args.image.pid,
            }
        });
        let header = match (input.pid, input.tid) {
            (Some(p), Some(t)) => format!("[thread {p}/{t}]"),
            _ => format!("[stream {}]", input.label),
        };
        let crosses_exec =
            matches!((sideband.as_ref(), pid), (Some(sb), Some(p)) if !sb.execs_of(p).is_empty());
        if many && !args.stats && args.format != Format::IpsBin {
            writeln!(out, "{header}")?;
        }
        let r = if crosses_exec {
            let tc = thread_code(&code, pid, input.data, &input.label)?;
            unplaced += tc.unplaced;
            for (offset, image, _, missing) in &tc.spaces {
                any_missing |= report_missing(missing, pid, sideband.as_ref(), &mut reported);
                if args.stats {
                    writeln!(
                        out,
                        "image{}{} sections {} bytes {} missing {}",
                        pid.map(|p| format!(" pid {p}")).unwrap_or_default(),
                        offset.map(|o| format!(" from {o:#x}")).unwrap_or_default(),
                        image.sections().len(),
                        image.mapped_bytes(),
                        missing.len()
                    )?;
                }
            }
            // Symbols: the last program's (an `insn` line of an earlier one may be named
            // after the later program's symbols at the same address).
            let image = tc.image();
            let syms = tc.spaces.last().map(|s| &s.2);
            let empty = Symbolizer::new();
            decode_stream(
                &tc.data,
                &image,
                syms.unwrap_or(&empty),
                cfg.clone(),
                &args,
                &mut out,
                last,
            )
        } else {
            if let std::collections::hash_map::Entry::Vacant(slot) = images.entry(pid) {
                let (image, syms, missing) = build_image_with(
                    &args.image,
                    sideband.as_ref(),
                    pid,
                    &given,
                    &given_elfs,
                    code.symbols,
                    true,
                    None,
                )?;
                any_missing |= report_missing(&missing, pid, sideband.as_ref(), &mut reported);
                if args.stats {
                    writeln!(
                        out,
                        "image{} sections {} bytes {} missing {}",
                        pid.map(|p| format!(" pid {p}")).unwrap_or_default(),
                        image.sections().len(),
                        image.mapped_bytes(),
                        missing.len()
                    )?;
                }
                slot.insert((image, syms));
            }
            let (image, syms) = &images[&pid];
            decode_stream(&input.data, image, syms, cfg.clone(), &args, &mut out, last)
        };
        match r {
            Ok(e) => errors += e,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            Err(e) => return Err(e.into()),
        }
        if args.stats && many {
            writeln!(out, "  ({})", &header[1..header.len() - 1])?;
        }
    }
    if any_missing {
        eprintln!(
            "ptrewind: hint: give the missing files with --symfs DIR (DIR + recorded path), \
             --search-dir DIR (by file name), or --elf FILE:BASE / --raw FILE:BASE"
        );
    }
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
        r => r?,
    }
    leave_to_exit((images, given, given_elfs));
    Ok(if errors > 0 || damaged || unplaced > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// `decode`'s output. Our own buffer does the batching: the writes go to a duplicate of the
/// stdout descriptor, past std's line-buffered `Stdout`, which would scan every 256 KiB chunk
/// for its last newline (the whole chunk for `ips-bin`). Nothing else writes to stdout
/// meanwhile.
fn stdout_out(lock: std::io::StdoutLock<'_>) -> Out<Sink<'_>> {
    match lock.as_fd().try_clone_to_owned() {
        Ok(fd) => Out::new(Sink::File(std::fs::File::from(fd))),
        Err(_) => Out::new(Sink::Std(lock)),
    }
}

/// Where `decode` writes: a duplicate of the stdout descriptor, or `Stdout` itself if that
/// could not be made.
enum Sink<'a> {
    File(std::fs::File),
    Std(std::io::StdoutLock<'a>),
}

impl Write for Sink<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::File(f) => f.write(b),
            Sink::Std(s) => s.write(b),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::File(f) => f.flush(),
            Sink::Std(s) => s.flush(),
        }
    }
}

/// `decode --qemu DIR`: each thread of a QEMU recording, `[thread PID/TID]` before each; the
/// threads of each process (the program, and the children it forked) with that process's
/// own code image.
fn decode_qemu(
    dir: &std::path::Path,
    args: &DecodeArgs,
    mode: ExecMode,
    given: &[Section],
    given_elfs: &[LoadedElf],
) -> CmdResult {
    let all = ptrewind::capture::qemu::Recorded::open(dir)?;
    let map = MmapOptions {
        map_files: true,
        ..MmapOptions::default()
    };
    let cfg = FlowConfig {
        default_mode: mode,
        ip_filter: args.ip_filter.clone(),
        ..FlowConfig::default()
    };
    let stdout = std::io::stdout();
    let mut out = stdout_out(stdout.lock());
    let mut errors = 0;
    let mut pids = all.pids();
    // The launched process first (pids may wrap), then its children by id.
    let launched = all.launched_pid();
    pids.sort_by_key(|&p| (Some(p) != launched, p));
    for recorded in pids.into_iter().filter_map(|p| all.process(p)) {
        if recorded.threads.is_empty() {
            continue;
        }
        let (image, syms) = qemu_image_with(&recorded, given, given_elfs, &map)?;
        match decode_qemu_threads(&recorded, &image, &syms, &cfg, args, &mut out) {
            Ok(e) => errors += e,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            Err(e) => return Err(e.into()),
        }
    }
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
        r => r?,
    }
    Ok(if errors > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// The threads of one process of a QEMU recording, for [`decode_qemu`]: the error count.
fn decode_qemu_threads<W: Write>(
    recorded: &ptrewind::capture::qemu::Recorded,
    image: &Image,
    syms: &Symbolizer,
    cfg: &FlowConfig,
    args: &DecodeArgs,
    out: &mut Out<W>,
) -> std::io::Result<u64> {
    let mut errors = 0;
    for t in &recorded.threads {
        if !args.stats {
            writeln!(out, "[thread {}/{}]", t.pid, t.tid)?;
        }
        errors += decode_stream(&t.trace, image, syms, cfg.clone(), args, out, false)?;
        if args.stats {
            writeln!(out, "  (thread {}/{})", t.pid, t.tid)?;
        }
    }
    Ok(errors)
}

/// Text of an event for the `ips`/`insn`/`blocks` formats.
fn event_line(e: &Event) -> String {
    match &e.kind {
        EventKind::Enabled { .. } => "[enabled]".into(),
        EventKind::Disabled { .. } => "[disabled]".into(),
        EventKind::AsyncBranch { from, to } => format!("[interrupt {from:#x} -> {to:#x}]"),
        EventKind::Overflow { .. } => "[overflow]".into(),
        EventKind::Psb { .. } => "[psb]".into(),
        EventKind::ModeChange { mode } => format!("[mode {}]", mode_bits(*mode)),
        EventKind::Tsx { in_tx, abort, .. } => {
            format!(
                "[tsx{}{}]",
                if *in_tx { " begin" } else { "" },
                if *abort { " abort" } else { "" }
            )
        }
        EventKind::Ptwrite { payload, .. } => format!("[ptwrite {payload:#x}]"),
        EventKind::Paging { cr3, .. } => format!("[paging cr3={cr3:#x}]"),
        EventKind::Vmcs { base } => format!("[vmcs {base:#x}]"),
        EventKind::Exstop { .. } => "[exstop]".into(),
        EventKind::Mwait { hints, ext, .. } => format!("[mwait {hints:#x} {ext:#x}]"),
        EventKind::PowerEntry {
            state, substate, ..
        } => format!("[pwre c{state}.{substate}]"),
        EventKind::PowerExit { last, deepest, .. } => format!("[pwrx c{last} c{deepest}]"),
        EventKind::Cfe { kind, vector, .. } => format!("[cfe {kind} {vector}]"),
        EventKind::Evd { kind, payload } => format!("[evd {kind} {payload:#x}]"),
        EventKind::PebsBlock { .. } => "[pebs]".into(),
        EventKind::Stop => "[stop]".into(),
        EventKind::Error { kind, ip } => match ip {
            Some(ip) => format!("[error: {kind} at offset {:#x}, ip {ip:#x}]", e.offset),
            None => format!("[error: {kind} at offset {:#x}]", e.offset),
        },
    }
}

fn mode_bits(m: ExecMode) -> u32 {
    match m {
        ExecMode::Bits16 => 16,
        ExecMode::Bits32 => 32,
        _ => 64,
    }
}

fn event_json(e: &Event) -> serde_json::Value {
    let name = match &e.kind {
        EventKind::Enabled { .. } => "enabled",
        EventKind::Disabled { .. } => "disabled",
        EventKind::AsyncBranch { .. } => "interrupt",
        EventKind::Overflow { .. } => "overflow",
        EventKind::Psb { .. } => "psb",
        EventKind::ModeChange { .. } => "mode",
        EventKind::Tsx { .. } => "tsx",
        EventKind::Ptwrite { .. } => "ptwrite",
        EventKind::Paging { .. } => "paging",
        EventKind::Vmcs { .. } => "vmcs",
        EventKind::Exstop { .. } => "exstop",
        EventKind::Mwait { .. } => "mwait",
        EventKind::PowerEntry { .. } => "pwre",
        EventKind::PowerExit { .. } => "pwrx",
        EventKind::Cfe { .. } => "cfe",
        EventKind::Evd { .. } => "evd",
        EventKind::PebsBlock { .. } => "pebs",
        EventKind::Stop => "stop",
        EventKind::Error { .. } => "error",
    };
    serde_json::json!({
        "event": name,
        "offset": e.offset,
        "time": e.time,
        "detail": format!("{:?}", e.kind),
    })
}

struct Calls {
    depth: usize,
    pending: bool,
    seq: u64,
}

fn sym_of(syms: &Symbolizer, ip: u64) -> String {
    match syms.symbol(ip) {
        Some((name, 0)) => name.to_string(),
        Some((name, off)) => format!("{name}+{off:#x}"),
        None => format!("{ip:#x}"),
    }
}

/// Decodes one stream to `out`: the number of decode errors. With `last`, the decoder and the
/// run-text cache are left to the process's exit ([`leave_to_exit`]).
fn decode_stream<W: Write>(
    pt: &[u8],
    image: &Image,
    syms: &Symbolizer,
    cfg: FlowConfig,
    args: &DecodeArgs,
    out: &mut Out<W>,
    last: bool,
) -> std::io::Result<u64> {
    let started = Instant::now();
    let mut dec = FlowDecoder::new(pt, image, cfg);
    let bar = if std::io::stderr().is_terminal() && pt.len() > (1 << 20) {
        let b = indicatif::ProgressBar::new(pt.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    let mut calls = Calls {
        depth: 0,
        pending: true,
        seq: 0,
    };
    // Only `insn` disassembles: its formatter (whose tables take a while to set up) and the
    // per-instruction text cache are made on first use.
    let mut insn_text: Option<InsnText> = None;
    // `ips` copies the text of runs it printed before. The cache is keyed by address, so it is
    // used only while one image holds for the whole trace (no exec periods).
    let mut run_text =
        (args.format == Format::Ips && image.periods().is_empty()).then(RunText::new);
    let mut n = 0u64;
    loop {
        if let Some(b) = &bar {
            if n & 0xfff == 0 {
                b.set_position(dec.offset());
            }
        }
        n += 1;
        let Some(item) = dec.next_block() else { break };
        if args.stats {
            continue;
        }
        match item {
            BlockItem::Event(e) => match args.format {
                Format::Json => writeln!(out, "{}", event_json(&e))?,
                Format::Calls => {
                    if matches!(
                        e.kind,
                        EventKind::Enabled { .. }
                            | EventKind::Disabled { .. }
                            | EventKind::Overflow { .. }
                            | EventKind::Error { .. }
                            | EventKind::AsyncBranch { .. }
                    ) {
                        writeln!(out, "{}", event_line(&e))?;
                        calls.pending = true;
                    }
                }
                // The binary format carries addresses only; an error must still be seen.
                Format::IpsBin => {
                    if matches!(e.kind, EventKind::Error { .. }) {
                        eprintln!("{}", event_line(&e));
                    }
                }
                _ => writeln!(out, "{}", event_line(&e))?,
            },
            BlockItem::Block(b) => match args.format {
                Format::Ips => match &mut run_text {
                    Some(t) => out.ip_lines_cached(t, b.start, b.lens(), b.mode as u8)?,
                    None => out.ip_lines(b.start, b.lens())?,
                },
                Format::IpsBin => out.ip_bins(b.start, b.lens())?,
                Format::Blocks => out.block_line(b.start, b.end, b.count, b.class.name())?,
                Format::Json => {
                    for i in b.insns() {
                        out.json_insn(i.ip, i.len, i.class.name(), i.time)?;
                    }
                }
                Format::Insn => {
                    let text = insn_text.get_or_insert_with(InsnText::new);
                    for i in b.insns() {
                        out.padded_ip_and(i.ip, text.rest_of_line(image, syms, &i))?;
                    }
                }
                Format::Calls => {
                    if calls.pending {
                        calls.seq += 1;
                        writeln!(
                            out,
                            "{}\t{}{}",
                            calls.seq,
                            "  ".repeat(calls.depth.min(64)),
                            sym_of_fn(syms, b.start)
                        )?;
                        calls.pending = false;
                    }
                    match b.class {
                        InsnClass::DirectCall | InsnClass::IndirectCall | InsnClass::FarCall => {
                            calls.depth += 1;
                            calls.pending = true;
                        }
                        InsnClass::Return | InsnClass::FarReturn => {
                            calls.depth = calls.depth.saturating_sub(1);
                            calls.pending = true;
                        }
                        _ => {}
                    }
                }
            },
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let s = dec.stats();
    if args.stats {
        let secs = started.elapsed().as_secs_f64();
        writeln!(
            out,
            "insns {} runs {} events {} errors {} trace-bytes {} decoded-insns {} seconds {:.3} Minsn/s {:.1} MB/s {:.1}",
            s.insns,
            s.runs,
            s.events,
            s.errors,
            pt.len(),
            s.decoded_insns,
            secs,
            s.insns as f64 / secs / 1e6,
            pt.len() as f64 / secs / 1e6
        )?;
    }
    if last {
        leave_to_exit((dec, run_text));
    }
    Ok(s.errors)
}

/// Leaves `value` to the end of the process instead of dropping it. `decode` exits right after
/// its last stream, and unmapping the decoder's tables, the run-text arena and the mapped
/// images one by one cost a system call and a TLB flush each: 5 % of a 0.5 M-instruction
/// trace's `decode` (docs/benchmarks.md, session 23). The exit tears the address space down in
/// one pass. Only for values that own nothing but memory, mappings and descriptors (buffered
/// output is flushed first).
fn leave_to_exit<T>(value: T) {
    std::mem::forget(value);
}

/// The `insn` format's text after the address, per instruction: disassembling and looking up
/// the symbol again for every execution of a hot loop would cost far more than decoding it.
struct InsnText {
    formatter: iced_x86::IntelFormatter,
    /// (ip, length, mode) -> "  symbol+off<pad> disassembly\n".
    cache: HashMap<(u64, u8, u8), Box<[u8]>>,
    text: String,
}

impl InsnText {
    /// Entries kept before the cache is cleared (bounds memory on huge code footprints).
    const LIMIT: usize = 1 << 20;

    fn new() -> Self {
        InsnText {
            formatter: iced_x86::IntelFormatter::new(),
            cache: HashMap::new(),
            text: String::new(),
        }
    }

    fn rest_of_line(
        &mut self,
        image: &Image,
        syms: &Symbolizer,
        i: &ptrewind::flow::Insn,
    ) -> &[u8] {
        let key = (i.ip, i.len, mode_bits(i.mode) as u8);
        if !self.cache.contains_key(&key) {
            if self.cache.len() >= Self::LIMIT {
                self.cache.clear();
            }
            let mut bytes = [0u8; 16];
            let len = (i.len as usize).min(bytes.len());
            let got = image.read(i.ip, &mut bytes[..len]);
            let mut d = iced_x86::Decoder::with_ip(
                ptrewind_bits(i.mode),
                &bytes[..got],
                i.ip,
                iced_x86::DecoderOptions::NONE,
            );
            let ins = d.decode();
            self.text.clear();
            iced_x86::Formatter::format(&mut self.formatter, &ins, &mut self.text);
            let line = format!("  {:<32} {}\n", sym_of(syms, i.ip), self.text);
            self.cache.insert(key, line.into_bytes().into_boxed_slice());
        }
        self.cache.get(&key).map(|b| &b[..]).unwrap_or(b"\n")
    }
}

/// The function name at `ip` (without offset), for the call tree.
fn sym_of_fn(syms: &Symbolizer, ip: u64) -> String {
    match syms.symbol(ip) {
        Some((name, _)) => name.to_string(),
        None => format!("{ip:#x}"),
    }
}

fn ptrewind_bits(m: ExecMode) -> u32 {
    mode_bits(m)
}
