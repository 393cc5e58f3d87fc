//! A perf.data's traces thread by thread, each with the code of every program it ran: shared
//! by `replay --perf`, `decode --perf` and `view --perf`.
//!
//! * Per-CPU streams (perf's default mode) are split into threads by the context switches
//!   ([`split_per_cpu`]); what is not attributed is said on stderr.
//! * A thread whose process called `execve` while it was traced is cut at the exec
//!   ([`cut_at_execs`]: a PSB where the new program starts, placed by the exec's sideband time)
//!   and gets one image per address space, each from the `MMAP`/`MMAP2` records of that
//!   program ([`PerfSideband::space_mmaps`]). An exec that cannot be placed is said, counted,
//!   and the thread's trace ends before it: nothing is decoded against the wrong program.

use super::code::{ImageArgs, build_image_with};
use ptrewind::image::perf_maps::PerfSideband;
use ptrewind::image::{Image, LoadedElf, MissingImage, Section, Symbolizer};
use ptrewind::packet::time::TimingConfig;
use ptrewind::perf::data::{PerfData, TscConversion};
use ptrewind::store::TraceStreams;
use ptrewind::store::exec_cut::{ExecAt, ExecPlace, cut_at_execs};
use ptrewind::store::percpu::split_per_cpu;
use std::borrow::Cow;
use std::path::Path;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One thread's (or stream's) trace: thread id, process id when the per-CPU split knows it,
/// label, bytes.
pub(crate) struct ThreadInput<'a> {
    /// The thread (per-thread streams and split threads), if known.
    pub tid: Option<u32>,
    /// The process, when the per-CPU split says.
    pub pid: Option<u32>,
    /// The stream's label (`tidN` for a split thread).
    pub label: String,
    /// The trace bytes.
    pub data: Cow<'a, [u8]>,
}

/// Splits the per-CPU streams of `source` into threads (`None`: the file has no per-CPU
/// stream). Problems of the split and a summary go to stderr. When the split cannot be made
/// at all, `Err` with the reason (the caller decides whether to go on CPU by CPU).
pub(crate) fn split_threads(
    path: &Path,
    source: &TraceStreams<'_>,
    perf: &PerfData<'_>,
) -> Option<Result<Vec<ThreadInput<'static>>, String>> {
    if !source.streams.iter().any(|s| s.cpu.is_some()) {
        return None;
    }
    let scan = perf.context_switches();
    let split = match split_per_cpu(source, &scan) {
        Ok(split) => split,
        Err(e) => return Some(Err(e.to_string())),
    };
    for line in split.report.problems() {
        eprintln!("ptrewind: {}: {line}", path.display());
    }
    let cpus: Vec<&str> = source
        .streams
        .iter()
        .filter(|s| s.cpu.is_some())
        .map(|s| s.label.as_str())
        .collect();
    let tids: Vec<String> = split.threads.iter().map(|t| t.tid.to_string()).collect();
    eprintln!(
        "ptrewind: {}: per-CPU stream(s) {} split by context switches into {} thread(s) \
         ({}): {} of {} trace regions attributed",
        path.display(),
        cpus.join(", "),
        split.threads.len(),
        tids.join(", "),
        split.report.attributed,
        split.report.regions
    );
    Some(Ok(split
        .threads
        .into_iter()
        .map(|t| ThreadInput {
            tid: Some(t.tid),
            pid: Some(t.pid),
            label: t.stream.label,
            data: t.stream.data,
        })
        .collect()))
}

/// The code of one thread's trace: its bytes (with a PSB at each exec placed in it) and one
/// image per address space it ran, the first from its start, each later one from the PSB at
/// its offset.
pub(crate) struct ThreadCode<'a> {
    /// The trace, rewritten at execs (a PSB where the new program starts; cut at an exec that
    /// could not be placed).
    pub data: Cow<'a, [u8]>,
    /// The address spaces: the trace offset of the PSB that opens each (`None` for the
    /// first), its code, symbols, and the mappings whose files are missing.
    pub spaces: Vec<(Option<u64>, Image, Symbolizer, Vec<MissingImage>)>,
    /// Execs of the process that could not be placed in this trace.
    pub unplaced: usize,
}

impl ThreadCode<'_> {
    /// All address spaces as one image for the flow decoder: the first with each later one as
    /// a period ([`Image::push_period`]).
    pub(crate) fn image(&self) -> Image {
        let mut spaces = self.spaces.iter();
        let mut root = spaces
            .next()
            .map(|s| s.1.first_period())
            .unwrap_or_default();
        for (offset, image, _, _) in spaces {
            root.push_period(offset.unwrap_or(0), std::sync::Arc::new(image.clone()));
        }
        root
    }
}

/// What [`thread_code`] needs besides the thread: the image options and given code, the
/// sideband, the perf time → TSC conversion, and how to build images.
pub(crate) struct CodeSource<'s> {
    /// `--elf`, `--raw`, `--symfs`, … of the command line.
    pub args: &'s ImageArgs,
    /// The `--raw`/`--elf` sections.
    pub given: &'s [Section],
    /// The `--elf` files.
    pub given_elfs: &'s [LoadedElf],
    /// The perf.data sideband (`None`: `--no-mmaps` or a raw trace).
    pub sideband: Option<&'s PerfSideband>,
    /// perf time → TSC (the AUXTRACE_INFO's), to place execs.
    pub conversion: Option<TscConversion>,
    /// The trace's timing parameters (MTC times narrow where an exec lies).
    pub timing: TimingConfig,
    /// Read the ELF symbol tables.
    pub symbols: bool,
    /// Map the files instead of reading them (`decode`).
    pub map_files: bool,
}

impl<'s> CodeSource<'s> {
    /// The code source of a command that keeps the image while it serves or draws the trace
    /// (`replay`, `view`): symbols read, files read whole (a mapping would fault if a file were
    /// truncated meanwhile), execs placed with the perf.data's own time conversion.
    pub(crate) fn kept(
        args: &'s ImageArgs,
        given: &'s [Section],
        given_elfs: &'s [LoadedElf],
        sideband: Option<&'s PerfSideband>,
        perf: Option<&PerfData<'_>>,
        timing: TimingConfig,
    ) -> Self {
        CodeSource {
            args,
            given,
            given_elfs,
            sideband,
            conversion: perf.and_then(|p| exec_conversion(p, sideband)),
            timing,
            symbols: true,
            map_files: false,
        }
    }
}

/// The code of the trace `data` of a thread of process `pid` (`label` names it in messages):
/// one address space, or, when the process called `execve` while traced, one per program (see
/// the module docs).
pub(crate) fn thread_code<'a>(
    src: &CodeSource<'_>,
    pid: Option<u32>,
    data: Cow<'a, [u8]>,
    label: &str,
) -> Result<ThreadCode<'a>, BoxError> {
    let build = |records: Option<&[ptrewind::image::MmapRecord]>| {
        build_image_with(
            src.args,
            src.sideband,
            pid,
            src.given,
            src.given_elfs,
            src.symbols,
            src.map_files,
            records,
        )
    };
    let one = |data: Cow<'a, [u8]>| -> Result<ThreadCode<'a>, BoxError> {
        let (image, syms, missing) = build(None)?;
        Ok(ThreadCode {
            data,
            spaces: vec![(None, image, syms, missing)],
            unplaced: 0,
        })
    };
    let (Some(sb), Some(pid)) = (src.sideband, pid) else {
        return one(data);
    };
    let execs = sb.execs_of(pid);
    if execs.is_empty() {
        return one(data);
    }
    let tscs: Option<Vec<u64>> = execs
        .iter()
        .map(|e| Some(src.conversion?.perf_time_to_tsc(e.time?)))
        .collect();
    let Some(tscs) = tscs else {
        eprintln!(
            "ptrewind: {label}: process {pid} called execve {} time(s), but the recording has \
             no time for it (no sample time or no perf-time to TSC conversion): its trace is \
             decoded against the program after the last exec",
            execs.len()
        );
        return one(data);
    };
    // The executable mappings of each address space (from the records, found or not).
    let ranges: Vec<Vec<(u64, u64)>> = (0..=execs.len())
        .map(|k| {
            sb.space_mmaps(pid, k)
                .iter()
                .filter(|m| m.exec)
                .map(|m| (m.addr, m.addr.saturating_add(m.len)))
                .collect()
        })
        .collect();
    let mapped: Vec<Box<dyn Fn(u64) -> bool + '_>> = ranges
        .iter()
        .map(|r| Box::new(move |ip: u64| r.iter().any(|&(a, b)| a <= ip && ip < b)) as Box<_>)
        .collect();
    let at: Vec<ExecAt<'_>> = tscs
        .iter()
        .enumerate()
        .map(|(k, &tsc)| ExecAt {
            tsc,
            old_code: &*mapped[k],
            new_code: &*mapped[k + 1],
            old_has_code: !ranges[k].is_empty(),
        })
        .collect();
    let cut = cut_at_execs(&data, &at, &src.timing);
    let mut first = 0;
    let mut starts: Vec<(u64, usize)> = Vec::new();
    let mut unplaced = 0;
    for (k, (place, exec)) in cut.places.iter().zip(&execs).enumerate() {
        let (at, dropped) = cut.truncated_at.unwrap_or_default();
        let cannot = |why: &str| {
            eprintln!(
                "ptrewind: {label}: the execve of process {pid} ({}) cannot be placed in this \
                 thread's trace: {why}; the trace is decoded only up to offset {at:#x} \
                 ({dropped} bytes after it left out)",
                exec.comm
            );
        };
        match place {
            ExecPlace::BeforeTrace => first = first.max(k + 1),
            ExecPlace::AfterTrace => {}
            ExecPlace::At { psb_offset } => {
                eprintln!(
                    "ptrewind: {label}: execve of process {pid} ({}) at trace offset \
                     {psb_offset:#x}: the code from there on is the new program's",
                    exec.comm
                );
                starts.push((*psb_offset, k + 1));
            }
            ExecPlace::Ambiguous { fitting, by_time } => {
                unplaced += 1;
                cannot(&match (fitting, by_time) {
                    (0, 0) => "its time contradicts the trace's".to_string(),
                    (0, t) => format!(
                        "{t} place(s) in the trace fit its time (TSC and MTC packets), none \
                         the mappings before and after it"
                    ),
                    (n, t) => format!(
                        "{n} places in the trace fit its time and mappings ({t} its time: \
                         no TSC or usable MTC between them)"
                    ),
                });
            }
            ExecPlace::InKernelTrace => {
                unplaced += 1;
                cannot(
                    "the trace includes kernel code, so the exec lies inside a traced stretch \
                     that TSC packets do not divide",
                );
            }
        }
    }
    starts.sort_unstable();
    // No exec inside the trace: the bytes stay as they were (no copy).
    let data = if starts.is_empty() && cut.truncated_at.is_none() {
        data
    } else {
        Cow::Owned(cut.data)
    };
    let mut spaces = Vec::with_capacity(starts.len() + 1);
    for (offset, space) in
        std::iter::once((None, first)).chain(starts.iter().map(|&(o, s)| (Some(o), s)))
    {
        let records = sb.space_mmaps(pid, space);
        let (image, syms, missing) = build(Some(&records))?;
        spaces.push((offset, image, syms, missing));
    }
    Ok(ThreadCode {
        data,
        spaces,
        unplaced,
    })
}

/// The traces of `source` to decode one by one: the threads of its per-CPU streams (split by
/// the context switches; when they cannot be split, said on stderr and CPU by CPU, each
/// stream as it is), or every stream as it is (per-thread streams, a raw trace).
pub(crate) fn perf_inputs<'a>(
    path: &Path,
    source: &'a TraceStreams<'a>,
    perf: Option<&PerfData<'_>>,
) -> Vec<ThreadInput<'a>> {
    let as_they_are = || {
        source
            .streams
            .iter()
            .map(|s| ThreadInput {
                tid: s.tid.filter(|_| s.cpu.is_none()),
                pid: None,
                label: s.label.clone(),
                data: Cow::Borrowed(&s.data[..]),
            })
            .collect()
    };
    match perf.and_then(|p| split_threads(path, source, p)) {
        None => as_they_are(),
        Some(Ok(threads)) if !threads.is_empty() => threads,
        Some(Ok(_)) => {
            eprintln!(
                "ptrewind: {}: no part of the per-CPU trace could be given to a thread (see \
                 above): decoded CPU by CPU",
                path.display()
            );
            as_they_are()
        }
        Some(Err(e)) => {
            eprintln!(
                "ptrewind: {}: the per-CPU streams cannot be split into threads: {e}; decoded \
                 CPU by CPU",
                path.display()
            );
            as_they_are()
        }
    }
}

/// perf time → TSC for placing execs, when the sideband has any (the context-switch scan's:
/// AUXTRACE_INFO, else TIME_CONV).
pub(crate) fn exec_conversion(
    perf: &PerfData<'_>,
    sideband: Option<&PerfSideband>,
) -> Option<TscConversion> {
    sideband
        .filter(|sb| !sb.execs.is_empty())
        .and_then(|_| perf.context_switches().conversion)
}
