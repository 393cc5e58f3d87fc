//! Where a trace's code comes from, for every command that decodes one (`decode`, `view`,
//! `replay`): the code-image options (`--elf`, `--raw`, `--symfs`, `--search-dir`, `--pid`,
//! `--no-mmaps`), the images built from them and from a perf.data's or a QEMU recording's
//! mappings, the files that could not be found (said once each), and the flow decoder's
//! set-up (CPU errata, IP filter, execution mode, timing).

use ptrewind::flow::{Cpu, Errata, FlowConfig};
use ptrewind::image::perf_maps::{PerfSideband, hex_id};
use ptrewind::image::{
    ElfSpec, FileCache, Image, LoadedElf, MissingImage, MmapOptions, RawSpec, Section, Segments,
    Symbolizer,
};
use ptrewind::packet::ExecMode;
use ptrewind::store::perf_data::PerfData;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

/// The code-image options `decode` and `replay` share.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ImageArgs {
    /// Raw code bytes: FILE[:FROM[-TO]]:BASE (ptxed syntax).
    #[arg(long, value_name = "FILE[:FROM[-TO]]:BASE")]
    pub(crate) raw: Vec<RawSpec>,
    /// ELF file whose executable segments (and symbols) are loaded, at BASE if given.
    #[arg(long, value_name = "FILE[:BASE]")]
    pub(crate) elf: Vec<ElfSpec>,
    /// perf.data only: a root directory for the files its MMAP records name (DIR joined with
    /// the recorded absolute path, like perf --symfs). May be repeated.
    #[arg(long, value_name = "DIR", requires = "perf")]
    pub(crate) symfs: Vec<PathBuf>,
    /// perf.data only: a directory searched for the recorded files by base name (a flat
    /// directory of binaries). May be repeated.
    #[arg(long = "search-dir", value_name = "DIR", requires = "perf")]
    pub(crate) search_dir: Vec<PathBuf>,
    /// perf.data: use the MMAP records of this process (default: the process each AUX stream
    /// traced, from its ITRACE_START records; all processes if that is ambiguous); `replay`
    /// serves that process. `replay --qemu`: serve this process of the recording (a child the
    /// program forked; default: the program itself).
    #[arg(long)]
    pub(crate) pid: Option<u32>,
    /// perf.data only: ignore its MMAP records (code only from --elf/--raw).
    #[arg(long, requires = "perf")]
    pub(crate) no_mmaps: bool,
}

pub(crate) fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let num = |p: &str| ptrewind::image::parse_number(p).ok_or(format!("bad address {p:?}"));
    let (from, to) = s
        .split_once('-')
        .ok_or(format!("{s:?}: expected FROM-TO"))?;
    let (from, to) = (num(from)?, num(to)?);
    if from > to {
        return Err(format!("{s:?}: FROM is above TO"));
    }
    Ok((from, to))
}

/// The CPU (`cpu`, else the perf.data header; unknown means no errata, as in libipt), where it
/// came from, and the flow configuration for a trace: errata, IP filter, initial mode, and the
/// timing parameters of a perf.data recording. Shared by `decode`, `view` and `replay`.
pub(crate) fn flow_setup(
    cpu: Option<Cpu>,
    perf: Option<&PerfData>,
    source: &ptrewind::store::TraceStreams<'_>,
    mode: ExecMode,
    ip_filter: &[(u64, u64)],
) -> (Option<Cpu>, String, FlowConfig) {
    let (cpu, cpu_from) = match (cpu, perf.and_then(|p| p.cpuid())) {
        (Some(c), _) => (Some(c), "--cpu".to_string()),
        (None, Some(id)) => match Cpu::from_perf_cpuid(id) {
            Ok(c) => (Some(c), format!("perf.data header {id:?}")),
            Err(e) => {
                eprintln!("ptrewind: {e}; no erratum workarounds");
                (None, String::new())
            }
        },
        (None, None) => (None, String::new()),
    };
    let errata = cpu.as_ref().map(Errata::for_cpu).unwrap_or_default();
    let mut cfg = FlowConfig {
        default_mode: mode,
        errata,
        ip_filter: ip_filter.to_vec(),
        ..FlowConfig::default()
    };
    if let Some(perf) = source.perf.as_ref() {
        cfg.timing = perf.timing();
    }
    (cpu, cpu_from, cfg)
}

/// The execution mode of `--bits`.
pub(crate) fn exec_mode(bits: u32) -> Result<ExecMode, String> {
    match bits {
        16 => Ok(ExecMode::Bits16),
        32 => Ok(ExecMode::Bits32),
        64 => Ok(ExecMode::Bits64),
        b => Err(format!("--bits {b}: expected 16, 32 or 64")),
    }
}

/// The process whose mappings give `stream`'s code: `--pid`, else the process the stream traced
/// (its ITRACE_START records); `None` (all processes) with a warning when that is ambiguous.
pub(crate) fn stream_pid(
    args: &ImageArgs,
    sideband: Option<&PerfSideband>,
    stream: &ptrewind::store::TraceStream<'_>,
) -> Option<u32> {
    let pid = match sideband {
        Some(sb) => args
            .pid
            .or_else(|| sb.pid_for_stream(stream.cpu, stream.tid)),
        None => None,
    };
    if let (Some(sb), None) = (sideband, pid) {
        let mut pids: Vec<u32> = sb
            .mmaps
            .iter()
            .filter(|m| m.pid != 0 && m.pid != u32::MAX)
            .map(|m| m.pid)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        if pids.len() > 1 {
            eprintln!(
                "ptrewind: stream {}: the traced process is not known; using the mappings of \
                 all {} processes (later ones win where they overlap); choose one with --pid",
                stream.label,
                pids.len()
            );
        }
    }
    pid
}

/// The code of a QEMU recording (its recorded mappings) with `given` mapped over it, and the
/// symbols of its ELF files and `given_elfs`; mappings whose file is missing are reported.
/// Shared by `decode --qemu` and `view --qemu`.
pub(crate) fn qemu_image(
    recorded: &ptrewind::capture::qemu::Recorded,
    given: &[Section],
    given_elfs: &[LoadedElf],
) -> Result<(Image, Symbolizer), Box<dyn std::error::Error + Send + Sync>> {
    qemu_image_with(recorded, given, given_elfs, &MmapOptions::default())
}

/// [`qemu_image`] with `opts` for the recorded mappings (`decode` maps the files).
pub(crate) fn qemu_image_with(
    recorded: &ptrewind::capture::qemu::Recorded,
    given: &[Section],
    given_elfs: &[LoadedElf],
    opts: &MmapOptions<'_>,
) -> Result<(Image, Symbolizer), Box<dyn std::error::Error + Send + Sync>> {
    let built = recorded.mmap_image_with(opts);
    let mut image = built.image;
    let mut syms = Symbolizer::new();
    for elf in built.elfs.iter().chain(given_elfs) {
        // Symbols are a convenience: an ELF without a usable symbol table still decodes.
        let _ = syms.add_elf(elf);
    }
    for s in given {
        image.add(s.clone())?;
    }
    report_missing(&built.missing, None, None, &mut HashSet::new());
    Ok((image, syms))
}

/// The `--raw` sections and `--elf` files of the command line (mapped over the perf.data
/// mappings by [`build_image`]), read into memory.
pub(crate) fn given_images(
    args: &ImageArgs,
) -> Result<(Vec<Section>, Vec<LoadedElf>), ptrewind::image::LoadError> {
    given_images_from(args, &mut FileCache::new())
}

/// [`given_images`] through `cache`: `decode`, which reads its files once and ends, maps them
/// ([`FileCache::mapping`]: only the pages the decoder touches are read, none is copied).
pub(crate) fn given_images_from(
    args: &ImageArgs,
    cache: &mut FileCache,
) -> Result<(Vec<Section>, Vec<LoadedElf>), ptrewind::image::LoadError> {
    let mut given: Vec<Section> = Vec::new();
    let mut given_elfs: Vec<LoadedElf> = Vec::new();
    for spec in &args.raw {
        given.push(spec.load_cached(cache)?);
    }
    for spec in &args.elf {
        let elf = LoadedElf::open_cached(spec, cache)?;
        given.extend(elf.sections(Segments::Executable));
        given_elfs.push(elf);
    }
    Ok((given, given_elfs))
}

/// The image and symbols for process `pid` (all processes when `None`): the perf.data
/// mappings, then the command-line images over them (shared by `decode`, `view` and
/// `replay`), reading the ELF symbol tables only when `symbols` is set (an empty
/// [`Symbolizer`] otherwise: formats that print no symbols skip that start-up cost), and
/// mapping the recorded files instead of reading them when `map_files` is set (`decode`, see
/// [`ptrewind::image::map_file`]). `records`: the sideband mappings to use instead of those
/// after each process's last exec (one address space of a trace that crosses an exec).
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_image_with(
    args: &ImageArgs,
    sideband: Option<&PerfSideband>,
    pid: Option<u32>,
    given: &[Section],
    given_elfs: &[LoadedElf],
    symbols: bool,
    map_files: bool,
    records: Option<&[ptrewind::image::MmapRecord]>,
) -> Result<(Image, Symbolizer, Vec<MissingImage>), ptrewind::image::ImageError> {
    let mut syms = Symbolizer::new();
    let (mut image, missing) = match sideband {
        Some(sb) => {
            let opts = MmapOptions {
                pid,
                symfs: args.symfs.clone(),
                search_dirs: args.search_dir.clone(),
                build_ids: sb.build_id_map(),
                map_files,
                ..MmapOptions::default()
            };
            let m = Image::from_mmaps(records.unwrap_or(&sb.mmaps), &opts);
            for elf in m.elfs.iter().filter(|_| symbols) {
                // Symbols are a convenience: an ELF without a usable symbol table still decodes.
                let _ = syms.add_elf(elf);
            }
            (m.image, m.missing)
        }
        None => (Image::new(), Vec::new()),
    };
    for s in given {
        image.add(s.clone())?;
    }
    for elf in given_elfs.iter().filter(|_| symbols) {
        let _ = syms.add_elf(elf);
    }
    Ok((image, syms, missing))
}

/// Prints each missing file once (all its mappings on one line); true if anything was printed.
pub(crate) fn report_missing(
    missing: &[MissingImage],
    pid: Option<u32>,
    sideband: Option<&PerfSideband>,
    reported: &mut HashSet<String>,
) -> bool {
    let mut by_file: BTreeMap<&str, Vec<&MissingImage>> = BTreeMap::new();
    for m in missing {
        by_file.entry(&m.filename).or_default().push(m);
    }
    let mut any = false;
    for (name, maps) in by_file {
        if !reported.insert(name.to_string()) {
            continue;
        }
        any = true;
        let ranges: Vec<String> = maps
            .iter()
            .map(|m| format!("{:#x}-{:#x}", m.addr, m.addr.wrapping_add(m.len)))
            .collect();
        let id = sideband
            .and_then(|sb| sb.build_ids.get(name))
            .map(|id| format!(" build id {}", hex_id(id)))
            .unwrap_or_default();
        eprintln!(
            "ptrewind: no code for {name}{}{id} at {}: {}",
            pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
            ranges.join(", "),
            maps[0].reason
        );
    }
    any
}
