//! `ptrewind replay`: reverse execution over a recording with no process behind it — a
//! directory written by `monitor save DIR`, or a trace file (raw PT or perf.data) with its
//! code image.
//!
//! The history is indexed before the server listens; the cursor starts at the end of the
//! history. The past is served PC-only (see [`crate::timeline`]): the PC at every
//! position, a saved recording's general-purpose registers at its start (position 0), at every
//! stop of the recorded process, and at its end (after the last instruction, where the cursor
//! then starts), and memory only inside the code image — of a
//! saved recording, only the mappings that were read-only and file-backed. Forward execution
//! stops at the end of the history with `replaylog:end`: there is no present to resume.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::inspect::symbolizer_from_maps;
use super::save::SAVE_FORMAT;
use super::{OfflineInfo, Timeline, spawn_worker};
use crate::capture::ExecBoundary;
use crate::flow::FlowConfig;
use crate::image::{Image, ImmutableCode, Section, Symbolizer};
use crate::store::dirfile::RecordingDir;
use crate::store::live::{TraceStore, append_bytes};
use crate::target::regs::gpr;
use crate::target::{RegMask, X86Registers};

/// How long loading waits for the history to be indexed.
pub const LOAD_INDEX_WAIT: Duration = Duration::from_secs(120);

/// The largest file of a saved recording that is read (a trace of a few hundred million
/// instructions is well below it; the bound keeps a hostile manifest from exhausting memory).
pub const MAX_SAVED_FILE: u64 = 16 << 30;

/// Offset of the AVX upper halves in the register-file shape used offline (the standard XSAVE
/// layout: legacy area, XSAVE header, then YMM_Hi128).
const OFFLINE_YMM_OFFSET: usize = 576;

/// What to replay: the trace, its code, and what is known about the process.
#[derive(Debug)]
pub struct OfflineRecording {
    /// Intel PT bytes of one thread.
    pub trace: Vec<u8>,
    /// The code the trace ran (after the last exec, if it crossed any).
    pub image: Image,
    /// The programs before each exec: their code and where the next one starts (empty for a
    /// recording of one program).
    pub exec_boundaries: Vec<ExecBoundary>,
    /// Where past memory reads are served from `image` (`None`: all of it).
    pub immutable: Option<ImmutableCode>,
    /// Symbols for `monitor where|history|calls`.
    pub symbols: Symbolizer,
    /// Registers before the first instruction, if known (general-purpose registers).
    pub registers_at_start: Option<X86Registers>,
    /// Registers after the last instruction, if known (general-purpose registers).
    pub registers_at_end: Option<X86Registers>,
    /// Registers known at other positions (the stops of the recorded process).
    pub registers_at: Vec<(u64, X86Registers)>,
    /// The instruction count the recording claims (checked against the decoded history).
    pub instructions: Option<u64>,
    /// Process id, executable, source description.
    pub info: OfflineInfo,
    /// How the trace is decoded (errata and timing of the CPU that recorded it).
    pub flow: FlowConfig,
}

/// A register-file shape for this CPU (with the AVX upper halves when the CPU has them, as the
/// target description says), every value zero.
fn offline_template() -> X86Registers {
    let avx = crate::target::regs::avx_enabled();
    let len = if avx {
        OFFLINE_YMM_OFFSET + 256
    } else {
        OFFLINE_YMM_OFFSET
    };
    let mut r = X86Registers {
        xsave: vec![0; len],
        ..X86Registers::default()
    };
    r.ymm_hi_offset = avx.then_some(OFFLINE_YMM_OFFSET);
    r
}

/// The general-purpose registers of a manifest object (`{"rip": "0x...", ...}`), the other
/// registers unavailable; `None` unless every general-purpose register is present and valid (a
/// partial set would pass zeros off as values).
pub fn regs_from_json(v: &serde_json::Value) -> Option<X86Registers> {
    let obj = v.as_object()?;
    let mut r = X86Registers {
        unavailable: RegMask::VECTOR,
        ..X86Registers::default()
    };
    for (i, name) in gpr::NAMES.iter().enumerate() {
        let text = obj.get(*name)?.as_str()?;
        r.gprs[i] = u64::from_str_radix(text.trim_start_matches("0x"), 16).ok()?;
    }
    Some(r)
}

/// The code sections a manifest array lists (`[{"file", "addr", "origin"}]`), read through
/// `read`; `what` names an element in errors.
fn sections_from_json(
    list: &serde_json::Value,
    what: &str,
    read: &dyn Fn(&str) -> Result<Vec<u8>, String>,
) -> Result<Image, String> {
    let mut image = Image::new();
    for (i, sec) in list
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let bad = |e: &str| format!("manifest.json: {what} {i}: {e}");
        let file = sec["file"].as_str().ok_or_else(|| bad("no file"))?;
        let addr = sec["addr"]
            .as_str()
            .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
            .ok_or_else(|| bad("no addr"))?;
        let origin = sec["origin"].as_str().unwrap_or(file);
        image
            .add(Section::new(addr, read(file)?, origin))
            .map_err(|e| bad(&e.to_string()))?;
    }
    Ok(image)
}

/// A manifest's `exec_periods` (see `save.rs`): the programs before each exec, in order. The
/// boundaries must grow and lie inside the trace (`trace_len` bytes): a manifest that says
/// otherwise is refused rather than decoded against the wrong program.
fn exec_periods_from_json(
    list: &serde_json::Value,
    trace_len: usize,
    read: &dyn Fn(&str) -> Result<Vec<u8>, String>,
) -> Result<Vec<ExecBoundary>, String> {
    let mut out: Vec<ExecBoundary> = Vec::new();
    for (k, p) in list
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let bad = |e: &str| format!("manifest.json: exec period {k}: {e}");
        let next_insn = p["next_insn"].as_u64().ok_or_else(|| bad("no next_insn"))?;
        let next_offset = p["next_offset"]
            .as_u64()
            .ok_or_else(|| bad("no next_offset"))?;
        if next_offset > trace_len as u64 {
            return Err(bad("next_offset lies beyond the trace"));
        }
        if let Some(prev) = out.last()
            && (next_insn < prev.next_insn || next_offset < prev.next_offset)
        {
            return Err(bad("periods out of order"));
        }
        let image = sections_from_json(&p["sections"], &format!("exec period {k} section"), read)?;
        let maps = p["maps"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        out.push(ExecBoundary {
            // Recordings saved before periods had causes were exec periods.
            cause: p["cause"].as_str().unwrap_or("exec").to_string(),
            image: Arc::new(image),
            maps,
            exe: p["exe"].as_str().map(PathBuf::from),
            next_insn,
            next_offset,
            // Saved recordings keep the main thread's periods only.
            thread_offsets: Vec::new(),
        });
    }
    Ok(out)
}

/// Reads a directory written by `monitor save DIR`.
pub fn load_saved(dir: &Path) -> Result<OfflineRecording, String> {
    // The manifest names files of the directory (`monitor save` writes plain names): a path
    // elsewhere (`/dev/zero`, `../x`) or a link is refused (see `store::dirfile`).
    let files = RecordingDir::open(dir).map_err(|e| e.to_string())?;
    let read = |name: &str| files.read(name, MAX_SAVED_FILE).map_err(|e| e.to_string());
    let manifest: serde_json::Value = serde_json::from_slice(&read("manifest.json")?)
        .map_err(|e| format!("{}: {e}", dir.join("manifest.json").display()))?;
    let format = manifest["format"].as_str().unwrap_or("");
    if format != SAVE_FORMAT {
        return Err(format!(
            "{}: format {format:?}, expected {SAVE_FORMAT:?}",
            dir.join("manifest.json").display()
        ));
    }
    let trace_name = manifest["trace"].as_str().unwrap_or("trace.pt");
    let trace = read(trace_name)?;
    // A trace cut short (a copy that ran out of space) would decode to a shorter history
    // without a word.
    if let Some(want) = manifest["trace_bytes"].as_u64()
        && want != trace.len() as u64
    {
        return Err(format!(
            "{}: {} bytes, but manifest.json says {want}: the recording is incomplete",
            dir.join(trace_name).display(),
            trace.len()
        ));
    }
    let image = sections_from_json(&manifest["sections"], "section", &read)?;
    let exec_boundaries = exec_periods_from_json(&manifest["exec_periods"], trace.len(), &read)?;
    // maps.json is optional (older recordings), but if it is there it must be a file of ours.
    let maps: Vec<String> = if files.exists("maps.json").map_err(|e| e.to_string())? {
        serde_json::from_slice(&read("maps.json")?)
            .map_err(|e| format!("{}: {e}", dir.join("maps.json").display()))?
    } else {
        Vec::new()
    };
    let maps = maps.join("\n");
    let files = super::files::SavedFiles::from_json(&manifest["files"], dir)?;
    let immutable = (!maps.is_empty()).then(|| ImmutableCode::from_maps(&maps));
    // Saved by newer versions only: older recordings replay without them.
    let auxv = match manifest["auxv"].as_str() {
        Some(name) => Some(read(name)?),
        None => None,
    };
    let mut memory_at_end = Vec::new();
    for (i, m) in manifest["memory_at_end"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let bad = |what: &str| format!("manifest.json: memory_at_end {i}: {what}");
        let file = m["file"].as_str().ok_or_else(|| bad("no file"))?;
        let addr = m["addr"]
            .as_str()
            .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
            .ok_or_else(|| bad("no addr"))?;
        let bytes = read(file)?;
        if addr.checked_add(bytes.len() as u64).is_none() {
            return Err(bad("wraps around the address space"));
        }
        memory_at_end.push((addr, bytes));
    }
    let libraries_xml = match manifest["libraries"].as_str() {
        Some(name) => Some(
            String::from_utf8(read(name)?)
                .map_err(|_| format!("{}: {name}: not UTF-8", dir.display()))?,
        ),
        None => None,
    };
    Ok(OfflineRecording {
        trace,
        image,
        exec_boundaries,
        immutable,
        symbols: symbolizer_from_maps(&maps, None),
        registers_at_start: regs_from_json(&manifest["registers_at_start"]),
        registers_at_end: regs_from_json(&manifest["registers_at_end"]),
        registers_at: manifest["registers_at_stops"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|s| Some((s["position"].as_u64()?, regs_from_json(&s["registers"])?)))
            .collect(),
        instructions: manifest["instructions"].as_u64(),
        info: OfflineInfo {
            pid: manifest["pid"]
                .as_i64()
                .and_then(|p| i32::try_from(p).ok())
                .filter(|&p| p > 0)
                .unwrap_or(1),
            tid: manifest["tid"].as_i64().and_then(|t| i32::try_from(t).ok()),
            exe: manifest["exe"].as_str().map(PathBuf::from),
            source: format!("saved recording {}", dir.display()),
            auxv,
            libraries_xml,
            memory_at_end,
            maps: maps.clone(),
            files,
        },
        // A saved recording is the software backend's: no errata apply.
        flow: FlowConfig::default(),
    })
}

impl Timeline {
    /// A timeline replaying `rec` with no process: indexes the history (waiting up to
    /// [`LOAD_INDEX_WAIT`]) and puts the cursor at its end.
    pub fn offline(rec: OfflineRecording) -> Result<Self, String> {
        let store = TraceStore::new();
        append_bytes(&store, &rec.trace);
        let present = Arc::new(rec.image);
        let image = super::periods::compose(&rec.exec_boundaries, &present);
        let worker = spawn_worker(&store, &image, &rec.flow)
            .map_err(|e| format!("cannot start the indexer: {e}"))?;
        let template = offline_template();
        let immutable = rec.immutable.unwrap_or_else(|| {
            ImmutableCode::from_ranges(
                present
                    .sections()
                    .iter()
                    .map(|s| (s.addr, s.end()))
                    .collect(),
            )
        });
        let mut r = Timeline::assemble(None, store, worker, image, template.clone());
        r.present = present;
        r.exec_bounds = rec.exec_boundaries;
        r.immutable = immutable;
        r.symbols = Some(rec.symbols);
        r.record_wanted = false;
        r.offline = Some(rec.info.clone());
        r.flow = rec.flow.clone();
        r.worker.request_complete();
        let len = r.ensure_indexed(LOAD_INDEX_WAIT)?;
        if len == 0 {
            return Err("the trace decodes to no instruction (wrong code image?)".into());
        }
        // A boundary placed in a recorded trace (perf.data: `next_insn` unknown, `u64::MAX`)
        // starts where the history's sync point at its PSB is.
        if r.exec_bounds.iter().any(|b| b.next_insn == u64::MAX) {
            let points = r.worker.sync_points();
            for b in &mut r.exec_bounds {
                if b.next_insn == u64::MAX {
                    let at = points.partition_point(|p| p.offset < b.next_offset);
                    b.next_insn = points.get(at).map_or(len, |p| p.insn);
                }
            }
        }
        let full = |g: &X86Registers| {
            let mut x = template.clone();
            x.gprs = g.gprs;
            // Only the general-purpose registers were saved.
            x.unavailable = RegMask::VECTOR;
            x
        };
        // Stops inside the history (each is checked against the trace's PC when served).
        for (n, g) in &rec.registers_at {
            if *n < len {
                r.snapshots.insert(*n, full(g));
            }
        }
        if let Some(g) = &rec.registers_at_start {
            r.snapshots.insert(0, full(g));
        }
        match (rec.instructions, &rec.registers_at_end) {
            (Some(n), Some(g)) if n == len => {
                r.snapshots.insert(len, full(g));
            }
            (Some(n), _) if n != len => {
                r.checks.length_mismatches += 1;
                r.checks.last_mismatch = Some(format!(
                    "the recording says {n} instructions, its trace decodes to {len}; the \
                     registers saved at its end are not served"
                ));
            }
            _ => {}
        }
        let end = r.end();
        r.cursor = Some(end);
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_registers_need_every_register() {
        let mut obj = serde_json::Map::new();
        for (i, n) in gpr::NAMES.iter().enumerate() {
            obj.insert(n.to_string(), format!("{:#x}", i * 16).into());
        }
        let full = serde_json::Value::Object(obj.clone());
        let r = regs_from_json(&full).unwrap();
        assert_eq!(r.gprs[gpr::RIP], 16 * 16);
        assert_eq!(r.gprs[gpr::R15], 0);
        assert_eq!(r.gprs[gpr::GS], 26 * 16);
        obj.remove("rsp");
        assert!(regs_from_json(&serde_json::Value::Object(obj.clone())).is_none());
        obj.insert("rsp".into(), "zz".into());
        assert!(regs_from_json(&serde_json::Value::Object(obj)).is_none());
        assert!(regs_from_json(&serde_json::Value::Null).is_none());
    }

    /// A manifest may only name files of its directory: `/dev/zero` as the trace would be read
    /// forever, `../` reaches outside the recording.
    #[test]
    fn manifest_file_names_stay_in_the_directory() {
        // A fresh private directory (a predictable name in a shared /tmp could be a planted
        // link that the writes below would follow); removed when `tmp` is dropped.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("trace.pt"), [0x02, 0x82].repeat(8)).unwrap();
        let load = |manifest: serde_json::Value| {
            std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
            load_saved(&dir)
        };
        let ok = load(serde_json::json!({"format": SAVE_FORMAT, "trace": "trace.pt"}));
        assert_eq!(ok.map(|r| r.trace.len()).ok(), Some(16));
        for (trace, file) in [
            ("/dev/zero", "trace.pt"),
            ("../trace.pt", "trace.pt"),
            ("", "trace.pt"),
            ("sub", "trace.pt"),
            ("trace.pt", "/dev/zero"),
            ("trace.pt", "sub/../../x"),
        ] {
            let m = serde_json::json!({
                "format": SAVE_FORMAT,
                "trace": trace,
                "sections": [{"file": file, "addr": "0x1000"}],
            });
            let err = load(m)
                .err()
                .unwrap_or_else(|| panic!("{trace:?} {file:?} accepted"));
            assert!(
                err.contains("not a file name in the recording directory")
                    || err.contains("not a regular file")
                    || err.contains("symbolic link"),
                "{trace:?} {file:?}: {err}"
            );
        }
    }
}
