//! The index: one [`SyncPoint`] per PSB the decoder honoured, grouped into [`SegmentGroup`]s
//! with a [`CodeSummary`] of the code they ran, built by scanning a (growing) trace
//! ([`History::update`]).

use super::{History, SyncPoint};
use crate::flow::{BlockItem, EventKind, FlowConfig, FlowDecoder};
use crate::image::Image;
use crate::packet::find_psb_backward;

/// Which code a group of segments executed, approximately: two 256-bit Bloom filters, over the 64-byte lines
/// and over the 4 KiB pages its instructions occupy. A search for a set of addresses skips every
/// segment whose summary rules them all out; a false "maybe" only costs a decode. The page filter
/// keeps pruning when a segment ran so much code that the line filter is saturated.
///
/// 64 bytes per [`SegmentGroup`] (at least 4 KiB of trace: at most 1.6 %); built while indexing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeSummary {
    pub(super) lines: [u64; 4],
    pub(super) pages: [u64; 4],
}

/// Bits of one filter (256) as a shift of the hashes' top bits.
pub(super) const SUMMARY_HASH_SHIFT: u32 = 64 - 8;

impl CodeSummary {
    #[inline(always)]
    pub(super) fn set(f: &mut [u64; 4], key: u64) {
        let h1 = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> SUMMARY_HASH_SHIFT) as usize;
        let h2 = (key.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) >> SUMMARY_HASH_SHIFT) as usize;
        f[h1 >> 6] |= 1 << (h1 & 63);
        f[h2 >> 6] |= 1 << (h2 & 63);
    }

    #[inline(always)]
    pub(super) fn test(f: &[u64; 4], key: u64) -> bool {
        let h1 = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> SUMMARY_HASH_SHIFT) as usize;
        let h2 = (key.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) >> SUMMARY_HASH_SHIFT) as usize;
        f[h1 >> 6] & (1 << (h1 & 63)) != 0 && f[h2 >> 6] & (1 << (h2 & 63)) != 0
    }

    /// Records the run of instructions from `start` to `end` (the last instruction's address; it
    /// may extend up to 15 bytes further, but no instruction *starts* beyond `end`).
    #[inline]
    pub fn add_run(&mut self, start: u64, end: u64) {
        if end < start || (end >> 6) - (start >> 6) > 4096 {
            // Wrapped (16/32-bit code) or absurdly long: give up on these segments.
            self.lines = [u64::MAX; 4];
            self.pages = [u64::MAX; 4];
            return;
        }
        let mut line = start >> 6;
        let mut page = u64::MAX;
        while line <= end >> 6 {
            Self::set(&mut self.lines, line);
            if line >> 6 != page {
                page = line >> 6;
                Self::set(&mut self.pages, page);
            }
            line += 1;
        }
    }

    /// Whether an instruction at `ip` may have executed in the segments summarised.
    #[inline]
    pub fn may_contain(&self, ip: u64) -> bool {
        Self::test(&self.pages, ip >> 12) && Self::test(&self.lines, ip >> 6)
    }

    /// Whether any of `ips` may have executed in the segments summarised.
    pub fn may_contain_any(&self, ips: &[u64]) -> bool {
        ips.iter().any(|&ip| self.may_contain(ip))
    }
}

/// What one indexing pass found, before it is applied to a [`History`].
#[derive(Debug, Clone, Default)]
pub(super) struct Scan {
    /// The sync point the pass started from, with its index (`None`: the start of the trace).
    /// It is always the first point of a summary group.
    pub(super) from: Option<(usize, SyncPoint)>,
    /// The view length the pass decoded.
    pub(super) view: u64,
    pub(super) complete: bool,
    /// Every PSB event after `from`.
    pub(super) points: Vec<SyncPoint>,
    /// The summary groups from `from` on.
    pub(super) groups: Vec<SegmentGroup>,
    /// How many of `points` are firm (their PSB+ lies wholly before the last PSB of the trace,
    /// so more trace bytes cannot change them).
    pub(super) firm: usize,
    /// Instructions after the last point (complete passes only).
    pub(super) tail: u64,
}

/// Trace bytes a [`SegmentGroup`] spans at least (except the last): bounds the summaries to
/// 80 bytes per 4 KiB of trace whatever the PSB frequency.
pub const GROUP_BYTES: u64 = 4096;

/// Consecutive segments spanning at least [`GROUP_BYTES`] of trace, with what their decode found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentGroup {
    /// Index of its first segment (= sync point); it runs to the next group's first segment.
    pub first: usize,
    /// The code its instructions executed.
    pub summary: CodeSummary,
    /// Decode errors in its segments.
    pub errors: u32,
    /// Overflows in its segments.
    pub overflows: u32,
}

/// Where an update's scan starts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) from: Option<(usize, SyncPoint)>,
}

/// The prefix of a growing trace that can be indexed for good: up to the last PSB in it (every
/// PSB+ before it was read whole), or all of it when the trace is complete.
pub(super) fn view_len(trace: &[u8], complete: bool) -> usize {
    if complete {
        trace.len()
    } else {
        find_psb_backward(trace, trace.len()).unwrap_or(0)
    }
}

/// Decodes `trace[..view]` from `from` (or from the start) and records every PSB event after it,
/// with the summary groups.
pub(super) fn scan(
    trace: &[u8],
    image: &Image,
    cfg: &FlowConfig,
    from: Option<(usize, SyncPoint)>,
    complete: bool,
) -> Scan {
    let view = view_len(trace, complete);
    // Points at or after the last PSB may still change: their PSB+ may be cut short by the end
    // of the bytes present (only a complete pass decodes that far).
    let firm_limit = view_len(trace, false) as u64;
    let bytes = &trace[..view];
    let mut s = Scan {
        from,
        view: view as u64,
        complete,
        ..Scan::default()
    };
    let (mut dec, mut insns, mut skip_first) = match from {
        Some((_, p)) => (
            FlowDecoder::at_psb(bytes, image, cfg.clone(), p.offset),
            p.insn,
            true,
        ),
        None => (FlowDecoder::new(bytes, image, cfg.clone()), 0, false),
    };
    let base_idx = from.map_or(0, |(i, _)| i + 1);
    // The group being filled, and the trace offset where it started.
    let mut cur: Option<SegmentGroup> = from.map(|(i, _)| SegmentGroup {
        first: i,
        ..SegmentGroup::default()
    });
    let mut group_at = from.map_or(0, |(_, p)| p.offset);
    // (groups before the one holding the last firm point, its errors, its overflows) as they
    // stood at that point: what an incomplete pass keeps.
    let mut firm_snap = (0usize, 0u32, 0u32);
    // Errors before the first PSB (none in practice: the decoder starts by synchronising).
    let (mut early_errors, mut early_overflows) = (0u32, 0u32);
    while let Some(item) = dec.next_block() {
        match item {
            BlockItem::Block(b) => {
                insns += b.count as u64;
                if let Some(g) = cur.as_mut() {
                    g.summary.add_run(b.start, b.end);
                }
            }
            BlockItem::Event(e) => match e.kind {
                EventKind::Psb { .. } => {
                    if skip_first && from.is_some_and(|(_, p)| p.offset == e.offset) {
                        skip_first = false;
                        continue;
                    }
                    skip_first = false;
                    let idx = base_idx + s.points.len();
                    s.points.push(SyncPoint {
                        offset: e.offset,
                        insn: insns,
                    });
                    if cur.is_none() || e.offset >= group_at.saturating_add(GROUP_BYTES) {
                        s.groups.extend(cur.take());
                        cur = Some(SegmentGroup {
                            first: idx,
                            errors: std::mem::take(&mut early_errors),
                            overflows: std::mem::take(&mut early_overflows),
                            ..SegmentGroup::default()
                        });
                        group_at = e.offset;
                    }
                    if e.offset < firm_limit {
                        s.firm = s.points.len();
                        let g = cur.as_ref().map_or((0, 0), |g| (g.errors, g.overflows));
                        firm_snap = (s.groups.len(), g.0, g.1);
                    }
                }
                EventKind::Error { .. } => match cur.as_mut() {
                    Some(g) => g.errors = g.errors.saturating_add(1),
                    None => early_errors = early_errors.saturating_add(1),
                },
                EventKind::Overflow { .. } => match cur.as_mut() {
                    Some(g) => g.overflows = g.overflows.saturating_add(1),
                    None => early_overflows = early_overflows.saturating_add(1),
                },
                _ => {}
            },
        }
    }
    s.groups.extend(cur);
    if complete {
        let base = s
            .points
            .last()
            .copied()
            .or(from.map(|(_, p)| p))
            .map_or(0, |p| p.insn);
        s.tail = insns - base;
    } else {
        // Keep what cannot change: the firm points, and the groups up to the one holding the
        // last of them, with its counts as they stood there. (Its summary may hold code run
        // after that point: a harmless "maybe", recomputed by the next pass, which starts at
        // that group.)
        s.points.truncate(s.firm);
        let (g, errors, overflows) = firm_snap;
        s.groups.truncate(g + 1);
        if let Some(last) = s.groups.get_mut(g) {
            last.errors = errors;
            last.overflows = overflows;
        }
    }
    s
}

impl History {
    /// Indexes what `trace` holds beyond the last update. `trace` is the same trace as before,
    /// possibly longer. With `complete = false` only the instructions before the last PSB in
    /// `trace` are counted (more bytes cannot change them); with `complete = true` all of them,
    /// as the trace decodes now. A later update recounts whatever a complete one counted after
    /// the last PSB, so [`len`](Self::len) may shrink when a complete update is followed by an
    /// incomplete one. Returns the number of instructions indexed.
    ///
    /// Cost: one decode from the last firm sync point to the end of the trace (the pending tail
    /// is decoded again by the next update; the PSB period bounds that repeated work).
    pub fn update(&mut self, trace: &[u8], image: &Image, complete: bool) -> u64 {
        if let Some(plan) = self.plan(trace, complete) {
            let s = scan(trace, image, &self.cfg, plan.from, complete);
            self.apply(s);
        }
        self.len()
    }

    /// Where the next scan starts: the first point of the summary group that holds the last
    /// firm point (the group's summary is rebuilt whole), with its index.
    pub(super) fn resume_point(&self) -> Option<(usize, SyncPoint)> {
        let last_firm = self.firm.checked_sub(1)?;
        let g = self.groups.partition_point(|g| g.first <= last_firm);
        let first = self.groups.get(g.checked_sub(1)?)?.first;
        Some((first, self.sync[first]))
    }

    /// Whether an update of `trace` with `complete` would change anything; if so, the point its
    /// scan starts from. Cheap (a backward PSB search).
    pub(super) fn plan(&self, trace: &[u8], complete: bool) -> Option<Plan> {
        let view = view_len(trace, complete) as u64;
        let changed = view > self.view || (view == self.view && complete && !self.complete);
        changed.then(|| Plan {
            from: self.resume_point(),
        })
    }

    /// Forgets everything indexed that may depend on trace bytes at or after `offset` (the
    /// store rewrote them, see [`TraceView::rewritten_since`](crate::store::TraceView)): the
    /// firm points at or after it, and the last one before it (its segment may run into the
    /// rewritten bytes); the tail count; the decoded copies. The next update decodes from the
    /// resume point again. Points before that stay: their instruction numbers depend only on
    /// bytes before them.
    pub(super) fn rewind(&mut self, offset: u64) {
        let before = self.sync.partition_point(|p| p.offset < offset);
        self.firm = self.firm.min(before.saturating_sub(1));
        let resume = self.resume_point();
        let keep = resume.map_or(0, |(i, _)| i + 1);
        self.cache.forget_from(keep.saturating_sub(1));
        self.sync.truncate(self.firm.max(keep));
        let firm = self.firm;
        let g = self.groups.partition_point(|g| g.first < firm);
        self.groups.truncate(g);
        self.tail = 0;
        self.complete = false;
        // Any scan from the resume point covers more than this, so the next update applies.
        self.view = resume.map_or(0, |(_, p)| p.offset);
    }

    /// Applies a scan made from the current resume point. Returns `false` (and changes nothing)
    /// if the history moved on since the scan was planned.
    pub(super) fn apply(&mut self, s: Scan) -> bool {
        if s.from != self.resume_point() || s.view < self.view {
            return false;
        }
        let keep = s.from.map_or(0, |(i, _)| i + 1);
        let keep_groups = s
            .from
            .map_or(0, |(i, _)| self.groups.partition_point(|g| g.first < i));
        // The segments from the resume point on are re-read: drop their decoded copies.
        self.cache.forget_from(keep.saturating_sub(1));
        self.sync.truncate(keep);
        self.sync.extend_from_slice(&s.points);
        self.groups.truncate(keep_groups);
        self.groups.extend_from_slice(&s.groups);
        self.firm = keep + s.firm;
        self.tail = s.tail;
        self.view = s.view;
        self.complete = s.complete;
        if s.complete {
            // A complete update is a stop or the end of a recording: a good time to return the
            // vectors' spare capacity.
            self.sync.shrink_to_fit();
            self.groups.shrink_to_fit();
        }
        true
    }

    /// The summary groups: consecutive segments spanning at least [`GROUP_BYTES`] of trace with
    /// a summary of the code they ran.
    pub fn groups(&self) -> &[SegmentGroup] {
        &self.groups
    }
}
