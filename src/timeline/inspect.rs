//! What the history shows around the cursor, as data for the server's inspection commands
//! (`monitor where|history|calls`): the PC at the cursor, branches and function segments
//! before it, symbols.

use std::collections::BTreeSet;
use std::path::Path;

use super::{MONITOR_INDEX_WAIT, Timeline};
use crate::image::Symbolizer;
use crate::image::procfs::parse_maps_lenient;

/// Symbols of every file-backed object with code in `maps` (`/proc/PID/maps` lines), each
/// placed by its first executable mapping (data files mapped by the program are not read);
/// objects `previous` placed by the same mapping are taken from it.
pub(crate) fn symbolizer_from_maps(maps: &str, previous: Option<&Symbolizer>) -> Symbolizer {
    let mut sym = Symbolizer::new();
    let mut seen = BTreeSet::new();
    for m in parse_maps_lenient(maps) {
        let Some(path) = m.path.as_deref().filter(|p| p.starts_with('/')) else {
            continue;
        };
        if m.exec && seen.insert(path.to_string()) {
            // An object that cannot be read just has no symbols.
            let _ = sym.add_mapped_file(Path::new(path), m.start, m.offset, previous);
        }
    }
    sym
}

/// A change of flow among the instructions before the cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Branch {
    /// The position of the branching instruction.
    pub at: u64,
    /// Its address.
    pub from: u64,
    /// The address of the next instruction executed.
    pub to: u64,
}

/// A run of instructions in one function (like GDB's `record function-call-history`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSegment {
    /// The segment's number, counted from the oldest segment scanned.
    pub index: usize,
    /// Its first position.
    pub first: u64,
    /// Its last position.
    pub last: u64,
    /// Call depth relative to the shallowest segment shown (0 or more).
    pub depth: usize,
    /// The function's name (`??` when unknown).
    pub function: String,
}

/// How far back `monitor history`/`calls` decode at most.
const SCAN_WINDOW: u64 = 200_000;

impl Timeline {
    /// Symbols of the recorded program at the cursor (read from its mappings at the first
    /// query, again after libraries were loaded or unloaded): before an exec, the old
    /// program's.
    pub fn symbolizer(&mut self) -> &Symbolizer {
        if let Some(i) = self.earlier_period(self.position()) {
            return self.period_symbols(i);
        }
        if self.symbols.is_none() {
            let maps = match self.live.as_mut() {
                Some(live) => live.maps(),
                None => String::new(),
            };
            let previous = self.stale_symbols.take();
            self.symbols = Some(symbolizer_from_maps(&maps, previous.as_ref()));
        }
        self.symbols.get_or_insert_with(Symbolizer::new)
    }

    /// The PC at the cursor, if known.
    pub fn cursor_pc(&mut self) -> Option<u64> {
        let pos = self.position();
        if pos < self.len() {
            return self.insn_ip(pos);
        }
        if let Some(pc) = self.snapshots.pc(pos)
            && self.live.is_none()
        {
            return Some(pc);
        }
        if self.exited.is_some() {
            return None;
        }
        self.live
            .as_mut()
            .and_then(|l| l.read_registers().ok())
            .map(|r| r.pc())
    }

    /// Branches among the instructions before the cursor (and into it), oldest first, the last
    /// `max` of at most 200 000 instructions.
    pub fn branches(&mut self, max: u64) -> Vec<Branch> {
        let end = self.position();
        let start = end.saturating_sub(SCAN_WINDOW);
        let mut out: std::collections::VecDeque<(u64, u64, u64)> = Default::default();
        let mut prev: Option<(u64, u64, u8)> = None;
        // Include the cursor's instruction, so the last branch into it counts.
        let upto = (end + 1).min(self.len());
        self.for_each_insn(start, upto, |n, ip, len| {
            if let Some((pn, pip, plen)) = prev
                && pip.wrapping_add(u64::from(plen)) != ip
            {
                out.push_back((pn, pip, ip));
                if out.len() as u64 > max {
                    out.pop_front();
                }
            }
            prev = Some((n, ip, len));
        });
        out.into_iter()
            .map(|(at, from, to)| Branch { at, from, to })
            .collect()
    }

    /// The last `max` function segments before the cursor (and its own), with their call
    /// depth (a transfer to a function's first byte is a call, any other change of function a
    /// return), like GDB's `record function-call-history`.
    pub fn call_segments(&mut self, max: u64) -> Vec<CallSegment> {
        let end = (self.position() + 1).min(self.len());
        let start = end.saturating_sub(SCAN_WINDOW);
        let mut ips: Vec<(u64, u64)> = Vec::new();
        self.for_each_insn(start, end, |n, ip, _| ips.push((n, ip)));
        let sym = self.symbolizer().clone();
        // (first insn, last insn, depth, function name)
        let mut segs: Vec<(u64, u64, i64, String)> = Vec::new();
        let mut depth: i64 = 0;
        for (n, ip) in ips {
            let (name, off) = sym
                .symbol(ip)
                .map_or(("??".to_string(), u64::MAX), |(s, o)| (s.to_string(), o));
            match segs.last_mut() {
                Some(last) if last.3 == name && off != 0 => last.1 = n,
                Some(_) => {
                    depth += if off == 0 { 1 } else { -1 };
                    segs.push((n, n, depth, name));
                }
                None => segs.push((n, n, 0, name)),
            }
        }
        let min = segs.iter().map(|s| s.2).min().unwrap_or(0);
        let skip = segs.len().saturating_sub(max as usize);
        segs.into_iter()
            .enumerate()
            .skip(skip)
            .map(|(index, (first, last, depth, function))| CallSegment {
                index,
                first,
                last,
                depth: (depth - min) as usize,
                function,
            })
            .collect()
    }

    /// The statistics `monitor stats` shows, as `line(key, value)` calls: trace, backend,
    /// history and consistency checks (the check waits up to [`MONITOR_INDEX_WAIT`] for the
    /// index; the counters are shown either way).
    pub fn stats(&mut self, line: &mut dyn FnMut(&str, String)) {
        let indexed = self.ensure_indexed(MONITOR_INDEX_WAIT);
        let h = self.worker.stats();
        match (self.live.as_ref(), self.offline.as_ref()) {
            (Some(live), _) => line("backend", live.name().into()),
            (None, Some(o)) => line("backend", format!("offline replay of {}", o.source)),
            (None, None) => line("backend", "offline replay".into()),
        }
        line("past reads", self.past_reads_text().into());
        if self.live.is_some() {
            line(
                "recording",
                if self.record_wanted { "on" } else { "off" }.into(),
            );
        }
        line("trace bytes", self.store.len().to_string());
        line("lost bytes", self.store.lost().to_string());
        line("gaps", self.store.gaps().len().to_string());
        if let Some(live) = self.live.as_ref() {
            live.stats(line);
        }
        line("history instructions", h.insns.to_string());
        line("sync points (PSB)", h.sync_points.to_string());
        line("decode lag (bytes)", h.decode_lag.to_string());
        line("indexed trace bytes", h.indexed_bytes.to_string());
        line(
            "index bytes",
            format!(
                "{} ({:.4} per trace byte)",
                h.index_bytes,
                h.index_bytes as f64 / h.trace_bytes.max(1) as f64
            ),
        );
        line("index updates", h.updates.to_string());
        line(
            "indexed at last stop",
            format!("{} instructions (in the background)", self.indexed_at_stop),
        );
        line(
            "index complete",
            if h.complete { "yes" } else { "no" }.into(),
        );
        line("decode errors", h.errors.to_string());
        line("overflows", h.overflows.to_string());
        line("untraced runs", self.untraced_runs.to_string());
        line(
            "debugger calls",
            format!("{} (run outside the recording)", self.diversions),
        );
        line("range steps", {
            let r = &self.range_stats;
            let mut s = format!("{} ({} instructions stepped in them", r.ended, r.steps);
            if r.placed + r.unplaced > 0 {
                s += &format!(
                    "; register files kept at {} of their steps, {} not placed",
                    r.placed, r.unplaced
                );
            }
            s + ")"
        });
        line("reverse floor", self.floor().to_string());
        let known = if self.snapshots.is_empty() {
            "0".to_string()
        } else {
            let mut at: Vec<String> = self
                .snapshots
                .positions()
                .take(8)
                .map(|n| n.to_string())
                .collect();
            if self.snapshots.len() > at.len() {
                at.push("…".into());
            }
            format!(
                "{} ({} distinct XSAVE images; at instructions {})",
                self.snapshots.len(),
                self.snapshots.distinct_xsave_images(),
                at.join(", ")
            )
        };
        line("known register files", known);
        line("stop trace problems", self.stop_errors.to_string());
        line(
            "cursor",
            match self.cursor {
                Some(n) => format!("{n} (replaying)"),
                None => format!("{} (present)", self.len()),
            },
        );
        if let Some(g) = &self.group {
            let (runs, spread) = g.order.runs();
            line(
                "global order",
                format!(
                    "{} threads, {runs} runs by time; {spread} spread over the clock they lasted \
                     (approximate, to within a run, between threads that synchronise through \
                     memory alone)",
                    g.tids.len()
                ),
            );
        }
        let group_check = self.live_group_check();
        let recorded = self
            .live
            .as_ref()
            .and_then(|l| l.recorded())
            .filter(|_| group_check.is_none());
        let logged = self
            .live
            .as_ref()
            .and_then(|l| l.recorded_state())
            .map(|l| l.len());
        let consistent = recorded.is_none_or(|r| h.insns == r && logged.is_none_or(|l| l == r));
        line(
            "history check",
            if let Some(text) = group_check {
                text
            } else if let Err(e) = indexed {
                format!("pending: {e}")
            } else if recorded.is_none() && self.checks.length_mismatches == 0 {
                "not applicable: the backend does not count instructions (the trace is the \
                 only record)"
                    .into()
            } else if consistent && self.checks.length_mismatches == 0 {
                "ok: history length == recorded instructions".into()
            } else {
                format!(
                    "ERROR: history {} vs recorded {:?} vs state log {:?}; {} mismatching \
                     stop(s){}",
                    h.insns,
                    recorded,
                    logged,
                    self.checks.length_mismatches,
                    self.checks
                        .last_mismatch
                        .as_ref()
                        .map(|m| format!(" (last: {m})"))
                        .unwrap_or_default()
                )
            },
        );
        if self.checks.pc_mismatches > 0 {
            line(
                "replay PC check",
                format!(
                    "ERROR: {} position(s) where the state log's RIP differs from the trace",
                    self.checks.pc_mismatches
                ),
            );
        }
        if self.checks.snapshot_mismatches > 0 {
            line(
                "register file check",
                format!(
                    "ERROR: {} captured register file(s) whose RIP differs from the trace at \
                     their position (not served)",
                    self.checks.snapshot_mismatches
                ),
            );
        }
    }
}
