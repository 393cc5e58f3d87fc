//! Readers for the real-hardware trace corpus in `shared/corpus` (see its README.md and each
//! folder's SOURCE.txt). These containers are TEST INPUT formats, not product features: the
//! product's own perf.data reader lives in `src/store`.
//!
//! Every trace comes out as a [`CorpusTrace`]: the raw PT bytes, the code images as
//! [`ImageSection`]s (address + bytes), the CPU when SOURCE.txt states it, the initial execution
//! mode, and ground truth where the corpus has it (HASE `*.trace` branch lists).
//!
//! Needs a sibling module `libipt` (for [`ImageSection`] and [`ExecMode`]); an example can use
//! both with `#[path = "../tests/support/libipt.rs"] mod libipt;` and
//! `#[path = "../tests/support/corpus.rs"] mod corpus;` at its crate root.
#![allow(dead_code)]

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

pub use super::libipt::{ExecMode, ImageSection};

/// The corpus root: env `PTREWIND_CORPUS`, else `<crate>/../shared/corpus`, else (for a CI clone
/// that sits one level deeper) `<crate>/../../shared/corpus`. None if no candidate exists.
pub fn corpus_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PTREWIND_CORPUS") {
        let dir = PathBuf::from(dir);
        return dir.is_dir().then_some(dir);
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        manifest.join("../shared/corpus"),
        manifest.join("../../shared/corpus"),
    ]
    .into_iter()
    .find(|candidate| candidate.join("README.md").is_file())
}

/// The corpus root for a test that needs it. Without a corpus this panics with a clear message,
/// unless env `PTREWIND_ALLOW_NO_CORPUS=1`, in which case it returns None (the test should then
/// return early, having checked nothing).
pub fn require_corpus(test: &str) -> Option<PathBuf> {
    match corpus_dir() {
        Some(dir) => Some(dir),
        None if std::env::var("PTREWIND_ALLOW_NO_CORPUS").as_deref() == Ok("1") => {
            eprintln!("{test}: corpus not found, skipped (PTREWIND_ALLOW_NO_CORPUS=1)");
            None
        }
        None => panic!(
            "{test}: the trace corpus was not found (set PTREWIND_CORPUS, or place it at \
             <crate>/../shared/corpus); set PTREWIND_ALLOW_NO_CORPUS=1 to skip"
        ),
    }
}

/// Which corpus folder a trace comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collection {
    /// `dynamorio-drpt2trace/`: raw AUX dumps of a static `hello` + its ELF.
    DynamoRio,
    /// `hase-pt-recordings/`: perf recordings of tiny static programs, with ground truth.
    Hase,
    /// `arcus-griffin/`: Griffin containers (PT + executable page snapshots).
    Arcus,
    /// `libxdc-experiments/`: KVM-PT traces with page-list images.
    Libxdc,
    /// `quipper-perfdata-intel_pt/`: perf.data-extracted PT, no images.
    Quipper,
}

/// One trace of the corpus, ready to decode.
#[derive(Clone, Debug)]
pub struct CorpusTrace {
    /// Stable name, e.g. "libxdc/mruby", "arcus/hello", "hase/loopy-20180404", "dynamorio/v1".
    pub name: String,
    /// Corpus folder.
    pub collection: Collection,
    /// The file the PT bytes came from.
    pub pt_path: PathBuf,
    /// The raw PT byte stream.
    pub pt: Vec<u8>,
    /// The code (and data) images at their run-time addresses, sorted by address,
    /// non-overlapping. Empty when the corpus has no images for this trace.
    pub images: Vec<ImageSection>,
    /// (family, model, stepping) when SOURCE.txt states it.
    pub cpu: Option<(u16, u8, u8)>,
    /// The execution mode of the traced code (the trace's MODE.Exec packets are authoritative;
    /// this is what a decoder should assume before the first one).
    pub mode: ExecMode,
    /// Ground-truth control transfers `(from, to)`, 0 = trace enable/disable (HASE `.trace`).
    pub ground_truth: Option<Vec<(u64, u64)>>,
    /// The IP filter range [start, end) the trace was recorded with, when known (libxdc).
    pub ip_filter: Option<(u64, u64)>,
}

impl CorpusTrace {
    /// Whether the corpus has code images for this trace (flow-decodable).
    pub fn has_images(&self) -> bool {
        !self.images.is_empty()
    }
}

/// What Intel's libipt 2.0.5 makes of the corpus, transcribed from shared/corpus/README.md
/// ("What Intel's libipt makes of them"): (trace name, instructions returned by
/// `pt_insn_next`, errors). Independent ground truth for the oracle and for flow decoders.
/// dynamorio/v1 is with `--cpu 6/85/4` (this crate's `CorpusTrace::cpu` for it).
pub const README_LIBIPT_INSNS: &[(&str, u64, usize)] = &[
    ("dynamorio/v1", 8, 0),
    ("hase/loopy-20180404", 57, 0),
    ("hase/control_flow-20180404", 1_092, 0),
    ("arcus/hello", 147_458, 0),
    ("arcus/last", 1_873_231, 0),
    ("libxdc/Unzip", 149_576, 0),
    ("libxdc/foo", 117_967, 0),
    ("libxdc/mruby", 6_334_131, 0),
    ("libxdc/qemu", 9_635_736, 0),
    ("libxdc/avscript_32", 1_114_194, 0),
    ("libxdc/icelake_tip", 15, 0),
];

/// The README's instruction count for `name`, if it gives one.
pub fn readme_libipt_insns(name: &str) -> Option<u64> {
    README_LIBIPT_INSNS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, insns, _)| *insns)
}

// ---------------------------------------------------------------------------------------------
// Enumeration
// ---------------------------------------------------------------------------------------------

/// Every trace name the corpus at `root` provides, in a stable order.
pub fn trace_names(root: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for (version, _) in DYNAMORIO {
        names.push(format!("dynamorio/{version}"));
    }
    for (name, _) in HASE {
        names.push(format!("hase/{name}"));
    }
    names.push("arcus/hello".to_string());
    names.push("arcus/last".to_string());
    if let Ok(entries) = fs::read_dir(root.join("arcus-griffin/traces")) {
        let mut dirs: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("trace.griffin.gz").is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        dirs.sort();
        names.extend(dirs.into_iter().map(|d| format!("arcus/{d}")));
    }
    for spec in LIBXDC {
        names.push(format!("libxdc/{}", spec.dir));
    }
    for (name, _) in QUIPPER {
        names.push(format!("quipper/{name}"));
    }
    names
}

/// Loads one trace by name from the corpus at `root`.
pub fn load_trace(root: &Path, name: &str) -> Result<CorpusTrace, String> {
    let (collection, rest) = name
        .split_once('/')
        .ok_or_else(|| format!("bad trace name {name:?}"))?;
    match collection {
        "dynamorio" => load_dynamorio(root, rest),
        "hase" => load_hase(root, rest),
        "arcus" => load_arcus(root, rest),
        "libxdc" => load_libxdc(root, rest),
        "quipper" => load_quipper(root, rest),
        _ => Err(format!("unknown collection in {name:?}")),
    }
    .map_err(|e| format!("{name}: {e}"))
}

/// Every trace of the corpus (empty if the corpus is absent and `PTREWIND_ALLOW_NO_CORPUS=1`;
/// panics if it is absent otherwise, or if a corpus file is unreadable or malformed).
pub fn all_traces() -> Vec<CorpusTrace> {
    let Some(root) = require_corpus("all_traces") else {
        return Vec::new();
    };
    trace_names(&root)
        .iter()
        .map(|name| load_trace(&root, name).unwrap_or_else(|e| panic!("corpus: {e}")))
        .collect()
}

/// One trace by name (None if the corpus is absent and `PTREWIND_ALLOW_NO_CORPUS=1`; panics if
/// it is absent otherwise, or if the trace cannot be loaded).
pub fn trace(name: &str) -> Option<CorpusTrace> {
    let root = require_corpus(name)?;
    Some(load_trace(&root, name).unwrap_or_else(|e| panic!("corpus: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Generic helpers
// ---------------------------------------------------------------------------------------------

fn read(path: &Path) -> Result<Vec<u8>, String> {
    fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn read_gz(path: &Path) -> Result<Vec<u8>, String> {
    let compressed = read(path)?;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(compressed.as_slice())
        .read_to_end(&mut out)
        .map_err(|e| format!("{}: gunzip: {e}", path.display()))?;
    Ok(out)
}

/// The PT_LOAD segments of an ELF file (32- or 64-bit) at their virtual addresses, with their
/// file contents (p_filesz bytes; the zero-filled tail up to p_memsz is not code). This is what
/// `ptxed --elf` loads for a non-PIE executable.
pub fn elf_load_segments(path: &Path) -> Result<Vec<ImageSection>, String> {
    use object::{Object, ObjectSegment};
    let data = read(path)?;
    let file =
        object::File::parse(data.as_slice()).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut sections = Vec::new();
    for (index, segment) in file.segments().enumerate() {
        let bytes = segment
            .data()
            .map_err(|e| format!("{}: segment {index}: {e}", path.display()))?;
        if bytes.is_empty() {
            continue;
        }
        sections.push(ImageSection {
            addr: segment.address(),
            bytes: bytes.to_vec(),
            name: format!("{}[PT_LOAD {index}]", path.display()),
        });
    }
    sections.sort_by_key(|s| s.addr);
    Ok(sections)
}

/// Reads a libxdc page list: `addr_path` holds little-endian u64 page addresses, `dump_path` the
/// 4 KiB pages in the same order. Pages are sorted and runs of contiguous pages merged into one
/// section each. An entry that is not page aligned (dyn_test's last entry 0x7ffff7fcffff looks
/// like a sentinel, yet it has a page of bytes in the dump) is kept as is, at its stated address.
pub fn read_page_list(addr_path: &Path, dump_path: &Path) -> Result<Vec<ImageSection>, String> {
    const PAGE: usize = 4096;
    let addrs = read(addr_path)?;
    let dump = read(dump_path)?;
    if addrs.len() % 8 != 0 {
        return Err(format!(
            "{}: size {} is not a multiple of 8",
            addr_path.display(),
            addrs.len()
        ));
    }
    let count = addrs.len() / 8;
    if dump.len() != count * PAGE {
        return Err(format!(
            "{}: {} bytes, expected {} pages = {} bytes",
            dump_path.display(),
            dump.len(),
            count,
            count * PAGE
        ));
    }
    let mut pages: Vec<(u64, &[u8])> = addrs
        .chunks_exact(8)
        .zip(dump.chunks_exact(PAGE))
        .map(|(a, page)| {
            let mut word = [0u8; 8];
            word.copy_from_slice(a);
            (u64::from_le_bytes(word), page)
        })
        .collect();
    pages.sort_by_key(|(addr, _)| *addr);
    let mut sections: Vec<ImageSection> = Vec::new();
    for (addr, page) in pages {
        match sections.last_mut() {
            Some(last) if last.end() == addr => last.bytes.extend_from_slice(page),
            Some(last) if last.end() > addr => {
                return Err(format!(
                    "{}: page {addr:#x} overlaps {:#x}..{:#x}",
                    addr_path.display(),
                    last.addr,
                    last.end()
                ));
            }
            _ => sections.push(ImageSection {
                addr,
                bytes: page.to_vec(),
                name: format!("{}@{addr:#x}", dump_path.display()),
            }),
        }
    }
    Ok(sections)
}

/// Parses a HASE ground-truth `.trace` file: one `from<TAB>to` pair of hex numbers per line,
/// 0 standing for a trace enable (as `from`) or disable (as `to`).
pub fn read_branch_list(path: &Path) -> Result<Vec<(u64, u64)>, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split_whitespace();
        let parse = |field: Option<&str>| -> Result<u64, String> {
            let field =
                field.ok_or_else(|| format!("{}:{}: missing field", path.display(), lineno + 1))?;
            let digits = field.trim_start_matches("0x");
            u64::from_str_radix(digits, 16)
                .map_err(|e| format!("{}:{}: {field:?}: {e}", path.display(), lineno + 1))
        };
        let from = parse(fields.next())?;
        let to = parse(fields.next())?;
        out.push((from, to));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// DynamoRIO
// ---------------------------------------------------------------------------------------------

/// (version, directory) of the DynamoRIO drpt2trace test data.
const DYNAMORIO: &[(&str, &str)] = &[
    ("v1", "v1_final_raw"),
    ("v2", "v2_tracedir_820k"),
    ("v3", "v3_raw_2848"),
    ("v4", "v4_tracedir_32304"),
    ("v5", "v5_tracedir_22112"),
    ("v6", "v6_tracedir_15040"),
];

fn load_dynamorio(root: &Path, version: &str) -> Result<CorpusTrace, String> {
    let (_, dir) = DYNAMORIO
        .iter()
        .find(|(v, _)| *v == version)
        .ok_or_else(|| format!("unknown version {version:?}"))?;
    let dir = root.join("dynamorio-drpt2trace").join(dir);
    let pt_path = dir.join("pt.bin");
    // v5 keeps its ELF under tmp/.
    let elf = if version == "v5" {
        dir.join("tmp/hello")
    } else {
        dir.join("hello")
    };
    // SOURCE.txt: v1/v2 recorded on 6/85/4 (Skylake-SP), v4/v5 decode with 6/85/7; v3 and v6
    // give no CPU.
    let cpu = match version {
        "v1" | "v2" => Some((6, 85, 4)),
        "v4" | "v5" => Some((6, 85, 7)),
        _ => None,
    };
    Ok(CorpusTrace {
        name: format!("dynamorio/{version}"),
        collection: Collection::DynamoRio,
        pt: read(&pt_path)?,
        pt_path,
        images: elf_load_segments(&elf)?,
        cpu,
        mode: if version == "v3" {
            ExecMode::Bits32
        } else {
            ExecMode::Bits64
        },
        ground_truth: None,
        ip_filter: None,
    })
}

// ---------------------------------------------------------------------------------------------
// HASE
// ---------------------------------------------------------------------------------------------

/// (name, stem of the recording) of the HASE recordings.
const HASE: &[(&str, &str)] = &[
    ("loopy-20180404", "loopy-20180404T162955"),
    ("control_flow-20180404", "control_flow-20180404T163033"),
    ("loopy-20180514", "loopy-20180514T145114"),
    ("control_flow-20180515", "control_flow-20180515T180451"),
];

fn load_hase(root: &Path, name: &str) -> Result<CorpusTrace, String> {
    let (_, stem) = HASE
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| format!("unknown recording {name:?}"))?;
    let base = root.join("hase-pt-recordings");
    let pt_path = base.join("extracted-aux").join(format!("{stem}.aux.bin"));
    let program = name.split('-').next().unwrap_or(name);
    let dir = base.join(name);
    // The 2018-04 recordings keep the ELF beside the perf file; the 2018-05 tarballs keep it
    // under binaries/<original absolute path>.
    let elf = if dir.join(program).is_file() {
        dir.join(program)
    } else {
        dir.join("binaries/home/joerg/git/hase/tests/bin")
            .join(program)
            .join(program)
    };
    let truth = dir.join(format!("{stem}.trace"));
    Ok(CorpusTrace {
        name: format!("hase/{name}"),
        collection: Collection::Hase,
        pt: read(&pt_path)?,
        pt_path,
        images: elf_load_segments(&elf)?,
        cpu: None,
        mode: ExecMode::Bits64,
        ground_truth: if truth.is_file() {
            Some(read_branch_list(&truth)?)
        } else {
            None
        },
        ip_filter: None,
    })
}

// ---------------------------------------------------------------------------------------------
// ARCUS / Griffin
// ---------------------------------------------------------------------------------------------

/// A Griffin image record (kind 3): a mapped file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GriffinImage {
    /// Process.
    pub tgid: u64,
    /// Load address.
    pub base: u64,
    /// Mapped size.
    pub size: u32,
    /// Path of the file on the recording machine.
    pub path: String,
}

/// A parsed Griffin container (format from ARCUS tools/angr/griffin.py, described in
/// arcus-griffin/SOURCE.txt).
#[derive(Clone, Debug, Default)]
pub struct Griffin {
    /// Process command name (kind 1), if present.
    pub process: Option<String>,
    /// Mapped files (kind 3).
    pub images: Vec<GriffinImage>,
    /// Executable page snapshots (kind 4), sorted by address.
    pub xpages: Vec<ImageSection>,
    /// PT bytes per (tgid, pid): buffers (kind 0) concatenated in sequence order.
    pub streams: Vec<((u64, u64), Vec<u8>)>,
    /// Number of items of kinds 5 (unmap) and 6 (fork) (not used for decoding).
    pub unmaps: usize,
    /// Number of fork items.
    pub forks: usize,
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}
fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Parses a Griffin container (already decompressed).
pub fn parse_griffin(data: &[u8]) -> Result<Griffin, String> {
    const MAGIC: u32 = 0x51C0_FFEE;
    if le_u32(data, 0) != Some(MAGIC) {
        return Err("not a Griffin container (bad magic)".into());
    }
    if le_u32(data, 4) != Some(1) {
        return Err(format!("unsupported Griffin version {:?}", le_u32(data, 4)));
    }
    let mut out = Griffin::default();
    let mut buffers: Vec<((u64, u64), u64, &[u8])> = Vec::new();
    let mut pos = 8usize;
    while pos < data.len() {
        let bad = |what: &str| format!("item at offset {pos:#x}: {what}");
        let kind = le_u32(data, pos).ok_or_else(|| bad("truncated header"))?;
        let size = le_u32(data, pos + 4).ok_or_else(|| bad("truncated header"))? as usize;
        if size < 8 {
            return Err(bad(&format!("size {size} < 8")));
        }
        let item = data
            .get(pos..pos + size)
            .ok_or_else(|| bad(&format!("size {size} runs past the end")))?;
        let body = &item[8..];
        match kind {
            0 => {
                let tgid = le_u64(body, 0).ok_or_else(|| bad("short buffer"))?;
                let pid = le_u64(body, 8).ok_or_else(|| bad("short buffer"))?;
                let seq = le_u64(body, 16).ok_or_else(|| bad("short buffer"))?;
                let len = le_u64(body, 24).ok_or_else(|| bad("short buffer"))? as usize;
                let bytes = body
                    .get(32..32 + len)
                    .ok_or_else(|| bad("buffer payload runs past the item"))?;
                buffers.push(((tgid, pid), seq, bytes));
            }
            1 => out.process = Some(c_string(body.get(16..).unwrap_or(&[]))),
            2 => {}
            3 => {
                let tgid = le_u64(body, 0).ok_or_else(|| bad("short image"))?;
                let base = le_u64(body, 8).ok_or_else(|| bad("short image"))?;
                let size = le_u32(body, 16).ok_or_else(|| bad("short image"))?;
                out.images.push(GriffinImage {
                    tgid,
                    base,
                    size,
                    path: c_string(body.get(32..).unwrap_or(&[])),
                });
            }
            4 => {
                let base = le_u64(body, 8).ok_or_else(|| bad("short xpage"))?;
                let len = le_u64(body, 16).ok_or_else(|| bad("short xpage"))? as usize;
                let bytes = body
                    .get(24..24 + len)
                    .ok_or_else(|| bad("xpage payload runs past the item"))?;
                out.xpages.push(ImageSection {
                    addr: base,
                    bytes: bytes.to_vec(),
                    name: format!("griffin xpage @{base:#x}"),
                });
            }
            5 => out.unmaps += 1,
            6 => out.forks += 1,
            other => return Err(bad(&format!("unknown item kind {other}"))),
        }
        pos += size;
    }
    out.xpages.sort_by_key(|s| s.addr);
    for pair in out.xpages.windows(2) {
        if pair[0].end() > pair[1].addr {
            return Err(format!(
                "xpages {:#x}..{:#x} and {:#x} overlap",
                pair[0].addr,
                pair[0].end(),
                pair[1].addr
            ));
        }
    }
    buffers.sort_by_key(|(id, seq, _)| (*id, *seq));
    for (id, _, bytes) in buffers {
        match out.streams.last_mut() {
            Some((last, stream)) if *last == id => stream.extend_from_slice(bytes),
            _ => out.streams.push((id, bytes.to_vec())),
        }
    }
    Ok(out)
}

fn load_arcus(root: &Path, name: &str) -> Result<CorpusTrace, String> {
    let base = root.join("arcus-griffin");
    let path = match name {
        "hello" => base.join("griffin/hello.griffin"),
        "last" => base.join("griffin/last.griffin.gz"),
        other => base.join("traces").join(other).join("trace.griffin.gz"),
    };
    let data = if path.extension().is_some_and(|e| e == "gz") {
        read_gz(&path)?
    } else {
        read(&path)?
    };
    let griffin = parse_griffin(&data).map_err(|e| format!("{}: {e}", path.display()))?;
    // Every container in the corpus traces exactly one thread; refuse to guess otherwise.
    let [(_, pt)] = <[_; 1]>::try_from(griffin.streams).map_err(|streams: Vec<_>| {
        format!(
            "{}: expected one PT stream, found {}",
            path.display(),
            streams.len()
        )
    })?;
    Ok(CorpusTrace {
        name: format!("arcus/{name}"),
        collection: Collection::Arcus,
        pt_path: path,
        pt,
        images: griffin.xpages,
        cpu: None,
        mode: ExecMode::Bits64,
        ground_truth: None,
        ip_filter: None,
    })
}

// ---------------------------------------------------------------------------------------------
// libxdc-experiments
// ---------------------------------------------------------------------------------------------

struct LibxdcSpec {
    dir: &'static str,
    trace: &'static str,
    /// Page-list stem (`<stem>.addr` / `<stem>.dump`); None when the dump is absent.
    pages: Option<&'static str>,
    filter: (u64, u64),
    mode: ExecMode,
}

/// The libxdc-experiments traces (table in its SOURCE.txt).
const LIBXDC: &[LibxdcSpec] = &[
    LibxdcSpec {
        dir: "Unzip",
        trace: "trace",
        pages: Some("data"),
        filter: (0x400000, 0x427000),
        mode: ExecMode::Bits64,
    },
    LibxdcSpec {
        dir: "foo",
        trace: "trace",
        pages: Some("data"),
        filter: (0x7fff_f781_9000, 0x7fff_f79c_a000),
        mode: ExecMode::Bits64,
    },
    LibxdcSpec {
        dir: "mruby",
        trace: "trace",
        pages: Some("data"),
        filter: (0x400000, 0x4b6000),
        mode: ExecMode::Bits64,
    },
    LibxdcSpec {
        dir: "qemu",
        trace: "trace1",
        pages: Some("page_cache"),
        filter: (0x5555_5555_4000, 0x5555_55d6_0000),
        mode: ExecMode::Bits64,
    },
    LibxdcSpec {
        dir: "avscript_32",
        trace: "failed_trace_12709_1",
        pages: Some("page_cache"),
        filter: (0x1000, 0x7fff_ffff_f000),
        mode: ExecMode::Bits32,
    },
    LibxdcSpec {
        dir: "dyn_test",
        trace: "sample_raw_0",
        pages: Some("page_cache"),
        filter: (0x1000, 0x7fff_ffff_f000),
        mode: ExecMode::Bits64,
    },
    LibxdcSpec {
        dir: "icelake_tip",
        trace: "ptlog",
        pages: Some("pagecache"),
        filter: (0x1000, 0xffff_ffff_ffff_f000),
        mode: ExecMode::Bits64,
    },
    LibxdcSpec {
        dir: "Kernel",
        trace: "trace",
        pages: None,
        filter: (0xffff_ffff_8100_0000, 0xffff_ffff_81e5_3ba0),
        mode: ExecMode::Bits64,
    },
    LibxdcSpec {
        dir: "infinite_loop_linux",
        trace: "loop_trace_26023_0",
        pages: None,
        filter: (0xffff_ffff_8100_0000, 0xffff_ffff_81e5_3ba0),
        mode: ExecMode::Bits64,
    },
];

fn load_libxdc(root: &Path, name: &str) -> Result<CorpusTrace, String> {
    let spec = LIBXDC
        .iter()
        .find(|s| s.dir == name)
        .ok_or_else(|| format!("unknown libxdc trace {name:?}"))?;
    let dir = root.join("libxdc-experiments").join(spec.dir);
    let pt_path = dir.join(spec.trace);
    let images = match spec.pages {
        Some(stem) => read_page_list(
            &dir.join(format!("{stem}.addr")),
            &dir.join(format!("{stem}.dump")),
        )?,
        None => Vec::new(),
    };
    Ok(CorpusTrace {
        name: format!("libxdc/{}", spec.dir),
        collection: Collection::Libxdc,
        pt: read(&pt_path)?,
        pt_path,
        images,
        cpu: None,
        mode: spec.mode,
        ground_truth: None,
        ip_filter: Some(spec.filter),
    })
}

// ---------------------------------------------------------------------------------------------
// quipper
// ---------------------------------------------------------------------------------------------

/// (name, extracted file) of the quipper perf.data PT streams.
const QUIPPER: &[(&str, &str)] = &[
    ("intel_pt-cpu0", "aux_perf.data.intel_pt-4.14_0_cpu0.bin"),
    ("intel_pt-cpu3", "aux_perf.data.intel_pt-4.14_3_cpu3.bin"),
    ("piped-cpu0", "aux_perf.data.piped.intel_pt-4.14_0_cpu0.bin"),
    ("piped-cpu3", "aux_perf.data.piped.intel_pt-4.14_3_cpu3.bin"),
];

fn load_quipper(root: &Path, name: &str) -> Result<CorpusTrace, String> {
    let (_, file) = QUIPPER
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| format!("unknown quipper stream {name:?}"))?;
    let pt_path = root.join("quipper-perfdata-intel_pt/extracted").join(file);
    Ok(CorpusTrace {
        name: format!("quipper/{name}"),
        collection: Collection::Quipper,
        pt: read(&pt_path)?,
        pt_path,
        images: Vec::new(),
        cpu: None,
        mode: ExecMode::Bits64,
        ground_truth: None,
        ip_filter: None,
    })
}

/// A decoded stream's branches in the HASE `.trace` form (the ground truth the HASE recordings
/// come with): `(from, to)` for every transfer, `(0, ip)` at an
/// enable, `(last, 0)` at a disable (the interrupted IP for an asynchronous one).
pub fn hase_branches(items: &[ptrewind::flow::Item]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut last: Option<u64> = None;
    let mut prev: Option<(u64, u64)> = None;
    for i in items {
        match i {
            ptrewind::flow::Item::Insn(x) => {
                if let Some((pip, fall)) = prev {
                    if x.ip != fall {
                        out.push((pip, x.ip));
                    }
                }
                prev = Some((x.ip, x.ip + x.len as u64));
                last = Some(x.ip);
            }
            ptrewind::flow::Item::Event(e) => match e.kind {
                ptrewind::flow::EventKind::Enabled { ip } => {
                    out.push((0, ip));
                    last = Some(ip);
                    prev = None;
                }
                ptrewind::flow::EventKind::Disabled { ip, asynchronous } => {
                    let from = if asynchronous { ip } else { last };
                    if let Some(f) = from {
                        out.push((f, 0));
                    }
                    last = None;
                    prev = None;
                }
                ptrewind::flow::EventKind::Overflow { .. }
                | ptrewind::flow::EventKind::Error { .. } => prev = None,
                _ => {}
            },
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Command-line inputs
// ---------------------------------------------------------------------------------------------

/// The files a command-line decoder (`ptrewind decode`, a ptxed-style driver) reads for one
/// trace: the PT bytes and one raw file per contiguous image range.
#[derive(Clone, Debug)]
pub struct CliInputs {
    /// The raw PT stream.
    pub pt: PathBuf,
    /// (file, load address) of each contiguous piece of the image, in address order.
    pub raws: Vec<(PathBuf, u64)>,
    /// `--cpu` (FAMILY/MODEL/STEPPING) when the corpus states the CPU.
    pub cpu: Option<String>,
    /// `--bits` (16, 32 or 64).
    pub bits: u32,
    /// `--ip-filter FROM-TO` (inclusive) when the trace was recorded with one.
    pub ip_filter: Option<String>,
}

impl CliInputs {
    /// The `ptrewind decode` arguments for these files (without `--format`).
    pub fn decode_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec!["--pt".into(), self.pt.clone().into()];
        for (path, base) in &self.raws {
            args.push("--raw".into());
            let mut spec = path.clone().into_os_string();
            spec.push(format!(":{base:#x}"));
            args.push(spec);
        }
        if let Some(cpu) = &self.cpu {
            args.push("--cpu".into());
            args.push(cpu.into());
        }
        args.push("--bits".into());
        args.push(self.bits.to_string().into());
        if let Some(f) = &self.ip_filter {
            args.push("--ip-filter".into());
            args.push(f.into());
        }
        args
    }
}

/// Writes `trace`'s PT bytes and images under `dir` (adjacent image sections joined into one
/// file, so page-list images do not need hundreds of arguments).
pub fn write_cli_inputs(trace: &CorpusTrace, dir: &Path) -> std::io::Result<CliInputs> {
    let mut inputs = write_raw_inputs(&trace.pt, &trace.images, dir)?;
    inputs.cpu = trace.cpu.map(|(f, m, s)| format!("{f}/{m}/{s}"));
    inputs.bits = match trace.mode {
        ExecMode::Bits16 => 16,
        ExecMode::Bits32 => 32,
        _ => 64,
    };
    inputs.ip_filter = trace
        .ip_filter
        .map(|(from, to)| format!("{from:#x}-{:#x}", to.saturating_sub(1)));
    Ok(inputs)
}

/// Writes `pt` and `images` (sorted, non-overlapping) under `dir` as `trace.pt` and one
/// `imageK.bin` per contiguous range; 64-bit code, no CPU, no IP filter.
pub fn write_raw_inputs(
    pt: &[u8],
    images: &[ImageSection],
    dir: &Path,
) -> std::io::Result<CliInputs> {
    let pt_path = dir.join("trace.pt");
    fs::write(&pt_path, pt)?;
    let mut pieces: Vec<(u64, Vec<u8>)> = Vec::new();
    for s in images {
        match pieces.last_mut() {
            Some((addr, bytes)) if *addr + bytes.len() as u64 == s.addr => {
                bytes.extend_from_slice(&s.bytes)
            }
            _ => pieces.push((s.addr, s.bytes.clone())),
        }
    }
    let mut raws = Vec::new();
    for (k, (addr, bytes)) in pieces.iter().enumerate() {
        let path = dir.join(format!("image{k}.bin"));
        fs::write(&path, bytes)?;
        raws.push((path, *addr));
    }
    Ok(CliInputs {
        pt: pt_path,
        raws,
        cpu: None,
        bits: 64,
        ip_filter: None,
    })
}
