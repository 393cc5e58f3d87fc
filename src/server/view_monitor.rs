//! `monitor view DIR`: the flame graph and the call timeline of the history so far, written
//! into DIR as `ptrewind view -o DIR` writes them (`flame.svg`, `timeline.json`).

use super::RecordingTarget;
use crate::server::MonitorRegistry;
use crate::timeline::{MONITOR_INDEX_WAIT, Timeline};
use crate::view::{
    Clock, FlameOptions, OutputFile, TrackInput, TscConversion, View, write_flamegraph,
};
use std::path::Path;

/// Registers `monitor view DIR` over the shared state of `target`.
pub fn register_view_monitor(registry: &mut MonitorRegistry, target: &RecordingTarget) {
    let s = target.shared();
    registry.register(
        "view",
        "view DIR: write DIR/flame.svg (flame graph) and DIR/timeline.json (Perfetto) of the history so far",
        move |_, a| {
            let dir = a.trim();
            if dir.is_empty() {
                return Err("usage: monitor view DIR".into());
            }
            write_view(&mut s.borrow_mut(), Path::new(dir))
        },
    );
}

/// Decodes the whole recorded trace once and writes both outputs; returns a summary.
pub fn write_view(t: &mut Timeline, dir: &Path) -> Result<String, String> {
    let history = t.ensure_indexed(MONITOR_INDEX_WAIT)?;
    let trace = t.trace_store().to_vec();
    let flow = t.flow_config().clone();
    let pid = u32::try_from(t.pid()).unwrap_or(1);
    let process = t
        .exec_path()
        .as_deref()
        .and_then(Path::file_name)
        .map_or_else(|| "recording".to_string(), |n| n.to_string_lossy().into());
    let symbols = t.symbolizer().clone();
    let image = t.image();
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let (svg_path, json_path) = (dir.join("flame.svg"), dir.join("timeline.json"));
    let json = OutputFile::create(&json_path).map_err(|e| io(&json_path, e))?;
    let clock = Clock::for_traces([&trace[..]], &flow.timing, TscConversion::Unknown);
    let mut view = View::new(Some(json), clock);
    let track = TrackInput {
        process: &process,
        name: "recording",
        pid,
        tid: pid,
        trace: &trace,
        image,
        symbols: &symbols,
        flow,
    };
    let report = view.add_track(&track, &mut |_| {});
    let mut other = serde_json::Map::new();
    other.insert("source".into(), "monitor view".into());
    other.insert("history_instructions".into(), history.into());
    let done = view.finish(other).map_err(|e| io(&json_path, e))?;
    if let Some((file, _)) = done.timeline {
        file.commit().map_err(|e| io(&json_path, e))?;
    }
    let mut svg = OutputFile::create(&svg_path).map_err(|e| io(&svg_path, e))?;
    let opts = FlameOptions {
        title: "Instructions by call stack".into(),
        subtitle: Some(format!(
            "{process}: {} instructions, {} calls",
            report.calls.insns, report.calls.frames
        )),
    };
    write_flamegraph(&done.tree, &opts, &mut svg).map_err(|e| io(&svg_path, e))?;
    svg.commit().map_err(|e| io(&svg_path, e))?;
    let mut text = format!(
        "wrote {} (flame graph: open it in a browser) and {} (timeline: open it in ui.perfetto.dev)\n\
         {} instructions, {} calls, deepest stack {}\n",
        svg_path.display(),
        json_path.display(),
        report.calls.insns,
        report.calls.frames,
        report.calls.max_depth
    );
    if report.calls.insns != history {
        text.push_str(&format!(
            "note: the trace decodes to {} instructions, the history has {history}\n",
            report.calls.insns
        ));
    }
    if report.flow.errors > 0 {
        text.push_str(&format!(
            "note: {} decode errors (each ends the call stack there)\n",
            report.flow.errors
        ));
    }
    Ok(text)
}
