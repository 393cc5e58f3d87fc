//! Checks shared by every command that reads a trace (`dump`, `decode`, `replay`): what a
//! perf.data scan found damaged is said on stderr (with file offsets) and makes the command fail,
//! and an input with nothing to decode — a perf.data without Intel PT data, a raw file without
//! a single PSB — is an error naming the file and what is missing, never an empty success.

use ptrewind::packet::find_psb_forward;
use ptrewind::store::perf_data::LossKind;
use ptrewind::store::{SourceFormat, TraceStreams};
use std::path::Path;

/// A perf loss's kind in words.
pub(crate) fn loss_name(kind: &LossKind) -> String {
    match kind {
        LossKind::Gap { bytes } => format!("AUX gap of {bytes} bytes"),
        LossKind::Overlap { bytes } => format!("AUX overlap of {bytes} bytes"),
        LossKind::Truncated => "AUX TRUNCATED".to_string(),
        LossKind::Partial => "AUX PARTIAL".to_string(),
    }
}

/// Prints what the perf.data scan of `source` found damaged (a framing error that ended the
/// scan — typically a file cut short —, records that could not be decoded, losses that match
/// no stream); true when there was any (the command must then not exit 0).
pub(crate) fn report_perf_damage(path: &Path, source: &TraceStreams<'_>) -> bool {
    let Some(perf) = &source.perf else {
        return false;
    };
    let mut damaged = false;
    for err in &perf.malformed {
        eprintln!("ptrewind: {}: {err} (record skipped)", path.display());
        damaged = true;
    }
    if let Some(err) = &perf.error {
        eprintln!(
            "ptrewind: {}: {err}; the records after it are ignored",
            path.display()
        );
        damaged = true;
    }
    for err in &perf.features {
        eprintln!(
            "ptrewind: {}: {err} (a header feature: build ids, CPU, ... are lost)",
            path.display()
        );
        damaged = true;
    }
    if perf.unknown_records > 0 {
        eprintln!(
            "ptrewind: {} record(s) of types not decoded by ptrewind were skipped",
            perf.unknown_records
        );
    }
    for loss in &perf.unattributed_losses {
        eprintln!(
            "ptrewind: data loss ({}) flagged by the perf record at file offset {:#x} matches no \
             stream",
            loss_name(&loss.kind),
            loss.record_offset
        );
        damaged = true;
    }
    damaged
}

/// Fails when a file given as perf.data (`--perf`) is not one: read as raw PT, its complaint
/// would be about packets, not about the wrong kind of file.
pub(crate) fn require_perf_data(path: &Path, source: &TraceStreams<'_>) -> Result<(), String> {
    match source.format {
        SourceFormat::PerfData { .. } => Ok(()),
        SourceFormat::RawPt => Err(format!(
            "{}: not a perf.data file (it does not start with the PERFILE2 magic); a raw Intel \
             PT trace is given with --pt",
            path.display()
        )),
    }
}

/// Fails unless `source` has something to decode: a perf.data needs at least one AUX stream, and
/// some stream needs a PSB (decoding starts at one). The message names the file, what is
/// missing, and for a perf.data cut short where its records stop.
pub(crate) fn require_trace(path: &Path, source: &TraceStreams<'_>) -> Result<(), String> {
    let file = path.display();
    if matches!(source.format, SourceFormat::PerfData { .. }) && source.streams.is_empty() {
        let why = match source.perf.as_ref().and_then(|p| p.error.as_ref()) {
            Some(e) => format!(" (its records stop early: {e})"),
            None => " (was it recorded with -e intel_pt//?)".to_string(),
        };
        return Err(format!(
            "{file}: no Intel PT data: the perf.data has no AUXTRACE records{why}"
        ));
    }
    if source
        .streams
        .iter()
        .all(|s| find_psb_forward(&s.data, 0).is_none())
    {
        let bytes: usize = source.streams.iter().map(|s| s.data.len()).sum();
        let what = match source.format {
            SourceFormat::RawPt => "not an Intel PT trace".to_string(),
            SourceFormat::PerfData { .. } => {
                format!("in {} AUX stream(s)", source.streams.len())
            }
        };
        return Err(format!(
            "{file}: no PSB packet in {bytes} byte(s) of trace ({what}): nothing to decode \
             (decoding starts at a PSB)"
        ));
    }
    Ok(())
}
