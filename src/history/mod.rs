//! The indexed execution history: sync points, instruction numbers and random access both ways.
//!
//! A trace is a sequence of *segments*, one per PSB+ that the flow decoder honoured: segment `k`
//! holds the instructions between the [`EventKind::Psb`] events of sync points `k` and `k + 1`
//! (the last one runs to the end of the indexed trace). Because a [`FlowDecoder`] started at a
//! PSB yields exactly the suffix of the full decode from that PSB's event on, any segment can be
//! decoded on its own. The index is therefore the list of [`SyncPoint`]s — the trace offset of
//! each PSB and the number of instructions executed before it, 16 bytes per PSB — plus one
//! [`SegmentGroup`] per at least 4 KiB of trace: a [`CodeSummary`] (Bloom filters over the code
//! lines and pages its instructions ran) and its error/overflow counts, 80 bytes. About 2.3 % of
//! the trace with the default PSB period; nothing is stored per instruction.
//!
//! Queries decode segments on demand:
//!
//! * [`History::insn`] (reverse-stepi, goto) decodes the one segment holding the instruction and
//!   keeps it in a small LRU cache of expanded segments (runs + instruction lengths), so stepping
//!   backwards through a segment costs one decode of it. The decode cost follows the segment's
//!   trace bytes, not its instruction count, so one PSB period bounds it;
//! * [`History::rfind`] / [`History::rfind_with`] (reverse-continue) walk segments backwards,
//!   decoding each forward once. With a set of addresses ([`BreakpointSet`]) whole groups whose code
//!   summary excludes them are skipped undecoded; inside the segments that are decoded, the
//!   decoder ([`FilteredDecoder`]) passes over the runs of every block of code that holds none of
//!   them — asked once per block ([`IpMatch::may_match_insns`]), so a rejected run costs a table
//!   lookup and never leaves the decoder. When many segments remain they are decoded on several
//!   threads ([`History::set_search_threads`]); one decoder per thread serves the whole search
//!   so its block cache (decoded code and the matcher's verdicts) stays warm. When nothing can
//!   be skipped this scans faster than a plain forward decode hands out its runs;
//! * [`History::find`] / [`History::find_with`] (forward replay to a breakpoint) the same,
//!   forwards (one thread).
//!
//! # Growing traces
//!
//! [`History::update`] indexes a trace that grows at its end (recording in progress). With
//! `complete = false` it only trusts what cannot change when more bytes arrive: it decodes up to
//! the last PSB in the bytes present, so every PSB+ it records was read whole, and the
//! instructions after the last sync point stay pending. With `complete = true` (the target
//! stopped, or the recording ended) those pending instructions are counted too, as the decode of
//! the trace as it is now. [`worker::HistoryWorker`] runs this on a background thread.

use crate::flow::{Block, BlockItem, EventKind, FilteredDecoder, FlowConfig, FlowDecoder};
use crate::image::Image;
use crate::packet::find_psb_backward;

pub mod worker;

pub use worker::{HistoryWorker, TraceView, WaitError, WorkerProbe, WorkerStats};

/// A PSB the decoder synchronised at: decoding from `offset` yields the history from instruction
/// number `insn` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SyncPoint {
    /// Byte offset of the PSB in the trace.
    pub offset: u64,
    /// Number of instructions executed before this PSB took effect.
    pub insn: u64,
}

/// Counters and sizes of a [`History`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistoryStats {
    /// Instructions indexed ([`History::len`]).
    pub insns: u64,
    /// Sync points (PSB+ the decoder honoured).
    pub sync_points: u64,
    /// Trace bytes the index covers (the decoder's view at the last update).
    pub indexed_bytes: u64,
    /// Bytes the index itself occupies (sync points, excluding the segment cache).
    pub index_bytes: u64,
    /// Bytes held by the cache of decoded segments.
    pub cache_bytes: u64,
    /// Decode errors met while indexing (each one is a resynchronisation, never a stop).
    pub errors: u64,
    /// Overflows (OVF: packets the hardware lost) met while indexing.
    pub overflows: u64,
    /// Segments decoded to answer queries (cache misses of [`History::insn`] and segments
    /// scanned by the searches).
    pub segments_decoded: u64,
    /// Segments whose on-demand decode did not yield the instruction count the index recorded
    /// (the image changed under the history, or a decoder inconsistency). Always 0 in a sound
    /// history; instructions beyond what the decode yielded read as missing.
    pub segment_mismatches: u64,
    /// Backward searches that decoded segments on several threads.
    pub parallel_searches: u64,
}

/// Decides which instruction addresses a search stops at.
pub trait IpMatch {
    /// Whether the instruction at `ip` is a hit.
    fn matches(&mut self, ip: u64) -> bool;

    /// Whether some instruction in the address range `start ..= end` may be a hit. Returning
    /// `false` lets a search skip a whole run of instructions without looking at each one; the
    /// default (always `true`) looks at every instruction.
    fn may_match_range(&self, start: u64, end: u64) -> bool {
        let _ = (start, end);
        true
    }

    /// Whether some instruction of a block of code may be a hit: the block's instructions start
    /// at `start` and have the lengths `lens` (each one follows the previous). Searches ask this
    /// once per block of the decoder's block cache and keep the answer for the whole search, so
    /// a `false` lets them pass over every later run of that block without handing it out of the
    /// decoder; it must therefore give the same answer for the same block throughout a search.
    /// The default asks [`may_match_range`](Self::may_match_range) for the block's address
    /// range.
    fn may_match_insns(&self, start: u64, lens: &[u8]) -> bool {
        let last = lens[..lens.len().saturating_sub(1)]
            .iter()
            .fold(start, |ip, &l| ip.wrapping_add(l as u64));
        self.may_match_range(start, last)
    }

    /// Every address that can match, when the matcher is a finite set of addresses. Searches then
    /// skip, without decoding, every segment whose [code summary](CodeSummary) rules all of them
    /// out. The default (`None`) decodes every segment.
    fn addresses(&self) -> Option<&[u64]> {
        None
    }

    /// An independent copy for another thread, so a long search can decode several segments at
    /// once. The default (`None`) keeps the search on the calling thread.
    fn fork(&self) -> Option<Box<dyn IpMatch + Send>> {
        None
    }
}

impl IpMatch for Box<dyn IpMatch + Send> {
    fn matches(&mut self, ip: u64) -> bool {
        (**self).matches(ip)
    }
    fn may_match_range(&self, start: u64, end: u64) -> bool {
        (**self).may_match_range(start, end)
    }
    fn may_match_insns(&self, start: u64, lens: &[u8]) -> bool {
        (**self).may_match_insns(start, lens)
    }
    fn addresses(&self) -> Option<&[u64]> {
        (**self).addresses()
    }
    fn fork(&self) -> Option<Box<dyn IpMatch + Send>> {
        (**self).fork()
    }
}

/// An [`IpMatch`] from a closure over the instruction address (looks at every instruction).
#[derive(Debug, Clone, Copy)]
pub struct MatchFn<F>(pub F);

impl<F: FnMut(u64) -> bool> IpMatch for MatchFn<F> {
    fn matches(&mut self, ip: u64) -> bool {
        (self.0)(ip)
    }
}

/// A set of breakpoint addresses. Searches with it pass over every run of a block of code none of
/// whose instructions starts at a breakpoint, so a reverse-continue costs less than decoding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BreakpointSet {
    sorted: Vec<u64>,
}

impl BreakpointSet {
    /// A set of the given addresses (duplicates are dropped).
    pub fn new(addrs: impl IntoIterator<Item = u64>) -> Self {
        let mut sorted: Vec<u64> = addrs.into_iter().collect();
        sorted.sort_unstable();
        sorted.dedup();
        BreakpointSet { sorted }
    }

    /// The addresses, sorted.
    pub fn addrs(&self) -> &[u64] {
        &self.sorted
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
}

impl IpMatch for BreakpointSet {
    #[inline]
    fn matches(&mut self, ip: u64) -> bool {
        self.sorted.binary_search(&ip).is_ok()
    }

    #[inline]
    fn may_match_range(&self, start: u64, end: u64) -> bool {
        if end < start {
            // The run wrapped around the address space (16/32-bit code): be conservative.
            return !self.sorted.is_empty();
        }
        let i = self.sorted.partition_point(|&a| a < start);
        i < self.sorted.len() && self.sorted[i] <= end
    }

    /// Exact: whether one of the block's instructions starts at a breakpoint (a breakpoint in
    /// the middle of an instruction is never hit).
    fn may_match_insns(&self, start: u64, lens: &[u8]) -> bool {
        let Some((_, before_last)) = lens.split_last() else {
            return false;
        };
        let last = before_last
            .iter()
            .fold(start, |ip, &l| ip.wrapping_add(l as u64));
        // Only a block whose address range holds a breakpoint is looked at per instruction.
        if !self.may_match_range(start, last) {
            return false;
        }
        let mut ip = start;
        lens.iter().any(|&l| {
            let hit = self.sorted.binary_search(&ip).is_ok();
            ip = ip.wrapping_add(l as u64);
            hit
        })
    }

    fn addresses(&self) -> Option<&[u64]> {
        Some(&self.sorted)
    }

    fn fork(&self) -> Option<Box<dyn IpMatch + Send>> {
        Some(Box::new(self.clone()))
    }
}

/// Which code a group of segments executed, approximately: two 256-bit Bloom filters, over the 64-byte lines
/// and over the 4 KiB pages its instructions occupy. A search for a set of addresses skips every
/// segment whose summary rules them all out; a false "maybe" only costs a decode. The page filter
/// keeps pruning when a segment ran so much code that the line filter is saturated.
///
/// 64 bytes per [`SegmentGroup`] (at least 4 KiB of trace: at most 1.6 %); built while indexing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeSummary {
    lines: [u64; 4],
    pages: [u64; 4],
}

/// Bits of one filter (256) as a shift of the hashes' top bits.
const SUMMARY_HASH_SHIFT: u32 = 64 - 8;

impl CodeSummary {
    #[inline(always)]
    fn set(f: &mut [u64; 4], key: u64) {
        let h1 = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> SUMMARY_HASH_SHIFT) as usize;
        let h2 = (key.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) >> SUMMARY_HASH_SHIFT) as usize;
        f[h1 >> 6] |= 1 << (h1 & 63);
        f[h2 >> 6] |= 1 << (h2 & 63);
    }

    #[inline(always)]
    fn test(f: &[u64; 4], key: u64) -> bool {
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

/// Most threads a backward search uses (see [`History::set_search_threads`]).
pub const MAX_SEARCH_THREADS: usize = 4;

/// A backward search goes parallel only when at least this many segments are left to decode.
const PARALLEL_MIN_SEGMENTS: usize = 8;

/// Default number of decoded segments kept for random access.
pub const DEFAULT_CACHE_SEGMENTS: usize = 8;

/// The instruction history of one trace: a sync-point index plus a cache of decoded segments.
///
/// The history does not own the trace or the image: every query takes them, so that the trace can
/// live in a growing buffer (see [`worker`]). They must be the ones the index was built from; the
/// trace may have grown since (only the indexed prefix is read).
#[derive(Debug, Clone)]
pub struct History {
    cfg: FlowConfig,
    sync: Vec<SyncPoint>,
    /// The first `firm` sync points cannot change when the trace grows; the others were found
    /// by a complete update after the last PSB+ that was certainly whole.
    firm: usize,
    /// Summary groups, in order; the first starts at segment 0.
    groups: Vec<SegmentGroup>,
    /// Instructions after the last sync point, counted by a complete update (0 otherwise).
    tail: u64,
    /// Length of the trace prefix the last update decoded: every segment is decoded in
    /// `trace[..view]`, so the tail reads exactly as it was counted.
    view: u64,
    /// The last update was complete (the tail is counted).
    complete: bool,
    cache: SegmentCache,
    segments_decoded: u64,
    segment_mismatches: u64,
    /// Threads a backward search may use (1: the caller's only).
    search_threads: usize,
    parallel_searches: u64,
}

/// What one indexing pass found, before it is applied to a [`History`].
#[derive(Debug, Clone, Default)]
struct Scan {
    /// The sync point the pass started from, with its index (`None`: the start of the trace).
    /// It is always the first point of a summary group.
    from: Option<(usize, SyncPoint)>,
    /// The view length the pass decoded.
    view: u64,
    complete: bool,
    /// Every PSB event after `from`.
    points: Vec<SyncPoint>,
    /// The summary groups from `from` on.
    groups: Vec<SegmentGroup>,
    /// How many of `points` are firm (their PSB+ lies wholly before the last PSB of the trace,
    /// so more trace bytes cannot change them).
    firm: usize,
    /// Instructions after the last point (complete passes only).
    tail: u64,
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
struct Plan {
    from: Option<(usize, SyncPoint)>,
}

/// The prefix of a growing trace that can be indexed for good: up to the last PSB in it (every
/// PSB+ before it was read whole), or all of it when the trace is complete.
fn view_len(trace: &[u8], complete: bool) -> usize {
    if complete {
        trace.len()
    } else {
        find_psb_backward(trace, trace.len()).unwrap_or(0)
    }
}

/// Decodes `trace[..view]` from `from` (or from the start) and records every PSB event after it,
/// with the summary groups.
fn scan(
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
    /// An empty history that will decode with `cfg`.
    pub fn new(cfg: FlowConfig) -> Self {
        History {
            cfg,
            sync: Vec::new(),
            firm: 0,
            groups: Vec::new(),
            tail: 0,
            view: 0,
            complete: false,
            cache: SegmentCache::new(DEFAULT_CACHE_SEGMENTS),
            segments_decoded: 0,
            search_threads: std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(MAX_SEARCH_THREADS),
            parallel_searches: 0,
            segment_mismatches: 0,
        }
    }

    /// The history of a complete trace, indexed in one pass.
    pub fn build(trace: &[u8], image: &Image, cfg: FlowConfig) -> Self {
        let mut h = History::new(cfg);
        h.update(trace, image, true);
        h
    }

    /// The decoder configuration.
    pub fn config(&self) -> &FlowConfig {
        &self.cfg
    }

    /// Sets how many threads a backward search ([`rfind_with`](Self::rfind_with)) may use to
    /// decode segments at once (1: only the calling thread). The default is the number of CPUs,
    /// at most [`MAX_SEARCH_THREADS`]. Only matchers that can [`fork`](IpMatch::fork) go parallel.
    pub fn set_search_threads(&mut self, n: usize) {
        self.search_threads = n.clamp(1, MAX_SEARCH_THREADS);
    }

    /// Sets how many decoded segments the random-access cache keeps (at least 1).
    pub fn set_cache_segments(&mut self, n: usize) {
        self.cache.set_capacity(n);
    }

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
    fn resume_point(&self) -> Option<(usize, SyncPoint)> {
        let last_firm = self.firm.checked_sub(1)?;
        let g = self.groups.partition_point(|g| g.first <= last_firm);
        let first = self.groups.get(g.checked_sub(1)?)?.first;
        Some((first, self.sync[first]))
    }

    /// Whether an update of `trace` with `complete` would change anything; if so, the point its
    /// scan starts from. Cheap (a backward PSB search).
    fn plan(&self, trace: &[u8], complete: bool) -> Option<Plan> {
        let view = view_len(trace, complete) as u64;
        let changed = view > self.view || (view == self.view && complete && !self.complete);
        changed.then(|| Plan {
            from: self.resume_point(),
        })
    }

    /// Applies a scan made from the current resume point. Returns `false` (and changes nothing)
    /// if the history moved on since the scan was planned.
    fn apply(&mut self, s: Scan) -> bool {
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

    /// Number of instructions in the history.
    pub fn len(&self) -> u64 {
        self.sync.last().map_or(0, |p| p.insn) + self.tail
    }

    /// Whether the history holds no instruction.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the last update was complete (the instructions after the last PSB are counted).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The sync points, in trace order (instruction numbers never decrease).
    pub fn sync_points(&self) -> &[SyncPoint] {
        &self.sync
    }

    /// Trace bytes the index covers.
    pub fn indexed_bytes(&self) -> u64 {
        self.view
    }

    /// Counters and sizes.
    pub fn stats(&self) -> HistoryStats {
        HistoryStats {
            insns: self.len(),
            sync_points: self.sync.len() as u64,
            indexed_bytes: self.view,
            index_bytes: (self.sync.capacity() * std::mem::size_of::<SyncPoint>()
                + self.groups.capacity() * std::mem::size_of::<SegmentGroup>())
                as u64,
            cache_bytes: self.cache.bytes(),
            errors: self.groups.iter().map(|g| g.errors as u64).sum(),
            overflows: self.groups.iter().map(|g| g.overflows as u64).sum(),
            segments_decoded: self.segments_decoded,
            segment_mismatches: self.segment_mismatches,
            parallel_searches: self.parallel_searches,
        }
    }

    /// Drops the decoded segments (the index stays).
    pub fn clear_cache(&mut self) {
        self.cache.clear();
    }

    /// Index of the segment holding instruction `n` (`n < len()`).
    fn segment_of(&self, n: u64) -> usize {
        // The last point whose first instruction is <= n. Empty segments (several PSBs with no
        // instruction between them) are skipped by taking the last one.
        self.sync.partition_point(|p| p.insn <= n).saturating_sub(1)
    }

    /// First instruction and end (exclusive) of segment `k`.
    fn segment_range(&self, k: usize) -> (u64, u64) {
        let first = self.sync[k].insn;
        let end = match self.sync.get(k + 1) {
            Some(p) => p.insn,
            None => first + self.tail,
        };
        (first, end)
    }

    /// The part of `trace` the index was built from.
    fn view_of<'t>(&self, trace: &'t [u8]) -> &'t [u8] {
        let v = usize::try_from(self.view).unwrap_or(usize::MAX);
        &trace[..v.min(trace.len())]
    }

    /// Address and length of instruction number `n` (0 is the first), or `None` past the end.
    /// Decodes at most one segment (none when it is cached).
    pub fn insn(&mut self, trace: &[u8], image: &Image, n: u64) -> Option<(u64, u8)> {
        if n >= self.len() {
            return None;
        }
        let k = self.segment_of(n);
        if self.cache.get(k).is_none() {
            let view = self.view_of(trace);
            let dec = FlowDecoder::at_psb(view, image, self.cfg.clone(), self.sync[k].offset);
            let seg = self.decode_segment(&mut FilteredDecoder::new(dec), k);
            self.cache.insert(seg);
        }
        self.cache.get(k)?.insn(n)
    }

    /// Decodes segment `k` into runs (`dec` is positioned at its PSB or will be resynchronised).
    fn decode_segment(&mut self, dec: &mut FilteredDecoder<'_>, k: usize) -> Segment {
        let (first, end) = self.segment_range(k);
        let mut seg = Segment {
            k,
            first,
            runs: Vec::new(),
            lens: Vec::with_capacity((end - first).min(1 << 24) as usize),
        };
        let expect = end - first;
        walk_segment(
            dec,
            &self.sync,
            k,
            first,
            u64::MAX,
            &mut EveryRun,
            |_, _, b| {
                let have = seg.lens.len() as u64;
                // Run indices are u32: a segment of more than 4 G instructions (a pathological trace)
                // is cut short and counted as a mismatch rather than mis-indexed.
                if have >= expect || have >= u64::from(u32::MAX) {
                    return false;
                }
                let lens = b.lens();
                let take = (lens.len() as u64).min(expect - have) as usize;
                seg.runs.push(Run {
                    start: b.start,
                    first: have as u32,
                });
                seg.lens.extend_from_slice(&lens[..take]);
                true
            },
        );
        self.segments_decoded += 1;
        if seg.lens.len() as u64 != expect {
            self.segment_mismatches += 1;
        }
        seg.runs.shrink_to_fit();
        seg
    }

    /// If the summary of the group holding segment `k` shows that `m` cannot match in it, the
    /// group's segments (`first..end`).
    fn ruled_out<M: IpMatch>(&self, k: usize, m: &M) -> Option<(usize, usize)> {
        let addrs = m.addresses()?;
        let g = self
            .groups
            .partition_point(|g| g.first <= k)
            .checked_sub(1)?;
        let grp = self.groups[g];
        if grp.summary.may_contain_any(addrs) {
            return None;
        }
        let end = self.groups.get(g + 1).map_or(self.sync.len(), |n| n.first);
        Some((grp.first, end))
    }

    /// The summary groups: consecutive segments spanning at least [`GROUP_BYTES`] of trace with
    /// a summary of the code they ran.
    pub fn groups(&self) -> &[SegmentGroup] {
        &self.groups
    }

    /// Number of the last instruction before `from` whose address satisfies `pred`
    /// (reverse-continue to a condition), or `None` if there is none.
    pub fn rfind(
        &mut self,
        trace: &[u8],
        image: &Image,
        from: u64,
        pred: impl FnMut(u64) -> bool,
    ) -> Option<u64> {
        self.rfind_with(trace, image, from, &mut MatchFn(pred))
    }

    /// Number of the first instruction at or after `from` whose address satisfies `pred`
    /// (forward replay to a condition), or `None` if there is none.
    pub fn find(
        &mut self,
        trace: &[u8],
        image: &Image,
        from: u64,
        pred: impl FnMut(u64) -> bool,
    ) -> Option<u64> {
        self.find_with(trace, image, from, &mut MatchFn(pred))
    }

    /// Number of the last instruction before `from` that `m` matches (reverse-continue). Walks
    /// segments backwards, each decoded forward once: cached segments are searched in place,
    /// groups of segments whose code summary rules the matcher out are skipped, and when many
    /// segments remain and the matcher can [`fork`](IpMatch::fork), several threads decode them
    /// at once (the nearest hit wins, as in the sequential order).
    pub fn rfind_with<M: IpMatch>(
        &mut self,
        trace: &[u8],
        image: &Image,
        from: u64,
        m: &mut M,
    ) -> Option<u64> {
        let from = from.min(self.len());
        if from == 0 {
            return None;
        }
        let view = self.view_of(trace);
        let mut dec: Option<FilteredDecoder<'_>> = None;
        let mut k = self.segment_of(from - 1);
        let mut first_segment = true;
        loop {
            if let Some((group_first, _)) = self.ruled_out(k, m) {
                // No breakpoint in this group's code: skip all its segments.
                if group_first == 0 {
                    return None;
                }
                k = group_first - 1;
                continue;
            }
            let hit = if let Some(seg) = self.cache.get(k) {
                seg.rfind(from, m)
            } else {
                if !first_segment && self.search_threads > 1 {
                    let todo = self.backward_candidates(k, m);
                    if todo.len() >= PARALLEL_MIN_SEGMENTS {
                        if let Some(forks) = (1..self.search_threads.min(todo.len()))
                            .map(|_| m.fork())
                            .collect::<Option<Vec<_>>>()
                        {
                            return self.par_rfind(view, image, from, &todo, m, forks);
                        }
                    }
                }
                let d = reuse_decoder(&mut dec, view, image, &self.cfg, self.sync[k].offset);
                self.segments_decoded += 1;
                scan_segment_back(d, &self.sync, k, self.segment_range(k).0, from, m)
            };
            if hit.is_some() {
                return hit;
            }
            if k == 0 {
                return None;
            }
            k -= 1;
            first_segment = false;
        }
    }

    /// The segments a backward search from segment `k` still has to look at, nearest first:
    /// all of them down to 0 except those in groups the matcher is ruled out of.
    fn backward_candidates<M: IpMatch>(&self, k: usize, m: &M) -> Vec<usize> {
        let mut out = Vec::new();
        let mut k = Some(k);
        while let Some(j) = k {
            match self.ruled_out(j, m) {
                Some((group_first, _)) => k = group_first.checked_sub(1),
                None => {
                    out.push(j);
                    k = j.checked_sub(1);
                }
            }
        }
        out
    }

    /// The parallel tail of [`rfind_with`](Self::rfind_with): `todo` (nearest first) is handed
    /// out to the calling thread and one thread per fork; each decodes whole segments with its
    /// own decoder. Once a hit is found in `todo[i]`, no segment after `i` is started, and the
    /// hit with the smallest `i` (the nearest to `from`) is the answer.
    fn par_rfind<M: IpMatch>(
        &mut self,
        view: &[u8],
        image: &Image,
        from: u64,
        todo: &[usize],
        m: &mut M,
        forks: Vec<Box<dyn IpMatch + Send>>,
    ) -> Option<u64> {
        use std::sync::Mutex;
        use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
        let next = AtomicUsize::new(0);
        let best = AtomicUsize::new(usize::MAX);
        let decoded = AtomicU64::new(0);
        let hits: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());
        let (sync, cfg) = (&self.sync[..], &self.cfg);
        let firsts: Vec<u64> = todo.iter().map(|&k| self.segment_range(k).0).collect();
        let work = |m: &mut dyn IpMatch| {
            let mut dec: Option<FilteredDecoder<'_>> = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= todo.len() || i > best.load(Ordering::Acquire) {
                    return;
                }
                let k = todo[i];
                let d = reuse_decoder(&mut dec, view, image, cfg, sync[k].offset);
                decoded.fetch_add(1, Ordering::Relaxed);
                let mut m = DynMatch(m);
                if let Some(hit) = scan_segment_back(d, sync, k, firsts[i], from, &mut m) {
                    best.fetch_min(i, Ordering::AcqRel);
                    hits.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((i, hit));
                    return;
                }
            }
        };
        std::thread::scope(|scope| {
            for mut f in forks {
                let work = &work;
                scope.spawn(move || work(&mut *f));
            }
            work(m);
        });
        self.segments_decoded += decoded.into_inner();
        self.parallel_searches += 1;
        let hits = hits.into_inner().unwrap_or_else(|e| e.into_inner());
        hits.into_iter().min_by_key(|h| h.0).map(|h| h.1)
    }

    /// Number of the first instruction at or after `from` that `m` matches (forward replay).
    pub fn find_with<M: IpMatch>(
        &mut self,
        trace: &[u8],
        image: &Image,
        from: u64,
        m: &mut M,
    ) -> Option<u64> {
        if from >= self.len() {
            return None;
        }
        let view = self.view_of(trace);
        let mut dec: Option<FilteredDecoder<'_>> = None;
        let mut k = self.segment_of(from);
        while k < self.sync.len() {
            if let Some((_, group_end)) = self.ruled_out(k, m) {
                k = group_end;
                continue;
            }
            let (first, end) = self.segment_range(k);
            let hit = if let Some(seg) = self.cache.get(k) {
                seg.find(from, m)
            } else if end <= from {
                None
            } else {
                let d = reuse_decoder(&mut dec, view, image, &self.cfg, self.sync[k].offset);
                self.segments_decoded += 1;
                let mut hit = None;
                // Runs the matcher rules out are passed over inside the decoder whatever their
                // position: none of them can hold the first hit at or after `from`.
                walk_segment(d, &self.sync, k, first, u64::MAX, m, |m, i, b| {
                    let n = b.count as u64;
                    if i + n > from {
                        let mut ip = b.start;
                        for (j, &len) in b.lens().iter().enumerate() {
                            let at = i + j as u64;
                            if at >= from && at < end && m.matches(ip) {
                                hit = Some(at);
                                return false;
                            }
                            ip = ip.wrapping_add(len as u64);
                        }
                    }
                    i + n < end
                });
                hit
            };
            if hit.is_some() {
                return hit;
            }
            k += 1;
        }
        None
    }
}

/// `&mut dyn IpMatch` as an [`IpMatch`] (for the shared search code).
struct DynMatch<'m>(&'m mut dyn IpMatch);

impl IpMatch for DynMatch<'_> {
    #[inline]
    fn matches(&mut self, ip: u64) -> bool {
        self.0.matches(ip)
    }
    #[inline]
    fn may_match_range(&self, start: u64, end: u64) -> bool {
        self.0.may_match_range(start, end)
    }
    #[inline]
    fn may_match_insns(&self, start: u64, lens: &[u8]) -> bool {
        self.0.may_match_insns(start, lens)
    }
}

/// Matches nothing but hands out every run (decoding a segment into the random-access cache).
struct EveryRun;

impl IpMatch for EveryRun {
    fn matches(&mut self, _: u64) -> bool {
        false
    }
}

/// Decodes segment `k` (whose first instruction is number `first`) and returns the last
/// instruction before `from` that `m` matches. Runs of blocks that `m` rules out
/// ([`IpMatch::may_match_insns`]) are passed over inside the decoder.
fn scan_segment_back<M: IpMatch + ?Sized>(
    dec: &mut FilteredDecoder<'_>,
    sync: &[SyncPoint],
    k: usize,
    first: u64,
    from: u64,
    m: &mut M,
) -> Option<u64> {
    let mut last = None;
    walk_segment(dec, sync, k, first, from, m, |m, i, b| {
        if i >= from {
            return false;
        }
        // The run's instructions before `from`, examined in a loop with nothing else in it.
        let lens = b.lens();
        let lens = &lens[..(from - i).min(lens.len() as u64) as usize];
        let mut ip = b.start;
        let mut hit = None;
        for (j, &len) in lens.iter().enumerate() {
            if m.matches(ip) {
                hit = Some(j);
            }
            ip = ip.wrapping_add(len as u64);
        }
        if let Some(j) = hit {
            last = Some(i + j as u64);
        }
        true
    });
    last
}

/// The search decoder: created once per search, then moved from segment to segment so its block
/// cache (decoded code, and which blocks the search's matcher rules out) is reused.
fn reuse_decoder<'d, 'a>(
    slot: &'d mut Option<FilteredDecoder<'a>>,
    view: &'a [u8],
    image: &'a Image,
    cfg: &FlowConfig,
    offset: u64,
) -> &'d mut FilteredDecoder<'a> {
    match slot {
        Some(d) => {
            d.resync_at(offset);
            d
        }
        None => slot.insert(FilteredDecoder::new(FlowDecoder::at_psb(
            view,
            image,
            cfg.clone(),
            offset,
        ))),
    }
}

/// Feeds the runs of segment `k` (first instruction number `first`; it starts at sync point
/// `k` and ends at the PSB event of `k + 1`, or at the end of the decoder's view) to
/// `f(m, number of the run's first instruction, run)`, until `f` returns `false`. Runs of blocks
/// that `m` rules out are passed over without reaching `f`, but only before instruction
/// `budget`: from the run holding it on, every run reaches `f` (so `f` can stop there). The
/// decoder must have been positioned at sync point `k`. Returns the number of the instruction
/// after the last one walked.
fn walk_segment<M: IpMatch + ?Sized>(
    dec: &mut FilteredDecoder<'_>,
    sync: &[SyncPoint],
    k: usize,
    first: u64,
    budget: u64,
    m: &mut M,
    mut f: impl FnMut(&mut M, u64, &Block<'_>) -> bool,
) -> u64 {
    let (at, next) = (sync[k], sync.get(k + 1).copied());
    let mut started = false;
    let mut n = first;
    loop {
        let Some(item) = dec.next_block(&mut n, budget, &mut |start, lens| {
            m.may_match_insns(start, lens)
        }) else {
            return n;
        };
        match &item {
            BlockItem::Event(e) => {
                if let EventKind::Psb { .. } = e.kind {
                    if !started && e.offset == at.offset {
                        started = true;
                        // Nothing precedes the segment's own PSB event when starting at its
                        // PSB; count from it in any case.
                        n = first;
                    } else if next.is_some_and(|p| p.offset == e.offset) || started {
                        // The next sync point (or, if the index and the decode disagree, any
                        // later PSB) ends the segment.
                        return n;
                    }
                }
            }
            BlockItem::Block(b) => {
                if started {
                    if !f(m, n, b) {
                        return n;
                    }
                    n += b.count as u64;
                }
            }
        }
    }
}

/// A run of consecutive instructions inside a decoded segment.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Address of its first instruction.
    start: u64,
    /// Index (within the segment) of its first instruction.
    first: u32,
}

/// A decoded segment: its instructions as runs plus one length byte per instruction.
#[derive(Debug, Clone)]
struct Segment {
    k: usize,
    first: u64,
    runs: Vec<Run>,
    lens: Vec<u8>,
}

impl Segment {
    fn bytes(&self) -> u64 {
        (self.runs.capacity() * std::mem::size_of::<Run>() + self.lens.capacity()) as u64
            + std::mem::size_of::<Segment>() as u64
    }

    /// Index of the run holding segment-relative instruction `i`.
    #[inline]
    fn run_of(&self, i: u32) -> usize {
        self.runs
            .partition_point(|r| r.first <= i)
            .saturating_sub(1)
    }

    /// Address of the run-relative instruction `i` given its run `r`.
    #[inline]
    fn ip_at(&self, r: usize, i: u32) -> u64 {
        let run = self.runs[r];
        self.lens[run.first as usize..i as usize]
            .iter()
            .fold(run.start, |ip, &l| ip.wrapping_add(l as u64))
    }

    fn insn(&self, n: u64) -> Option<(u64, u8)> {
        let i = u32::try_from(n.checked_sub(self.first)?).ok()?;
        let len = *self.lens.get(i as usize)?;
        Some((self.ip_at(self.run_of(i), i), len))
    }

    /// Run `r`'s end (exclusive, segment-relative).
    fn run_end(&self, r: usize) -> u32 {
        self.runs
            .get(r + 1)
            .map_or(self.lens.len() as u32, |n| n.first)
    }

    /// Last instruction before `from` (absolute) that `m` matches.
    fn rfind<M: IpMatch>(&self, from: u64, m: &mut M) -> Option<u64> {
        let limit = from.saturating_sub(self.first).min(self.lens.len() as u64) as u32;
        if limit == 0 {
            return None;
        }
        let mut r = self.run_of(limit - 1);
        loop {
            let run = self.runs[r];
            let end = self.run_end(r).min(limit);
            if end > run.first {
                let last_ip = self.ip_at(r, end - 1);
                if m.may_match_range(run.start, last_ip) {
                    let mut ip = run.start;
                    let mut hit = None;
                    for i in run.first..end {
                        if m.matches(ip) {
                            hit = Some(i);
                        }
                        ip = ip.wrapping_add(self.lens[i as usize] as u64);
                    }
                    if let Some(i) = hit {
                        return Some(self.first + i as u64);
                    }
                }
            }
            if r == 0 {
                return None;
            }
            r -= 1;
        }
    }

    /// First instruction at or after `from` (absolute) that `m` matches.
    fn find<M: IpMatch>(&self, from: u64, m: &mut M) -> Option<u64> {
        let start = from.saturating_sub(self.first);
        if start >= self.lens.len() as u64 {
            return None;
        }
        let start = start as u32;
        for r in self.run_of(start)..self.runs.len() {
            let run = self.runs[r];
            let end = self.run_end(r);
            if end == run.first {
                continue;
            }
            if m.may_match_range(run.start, self.ip_at(r, end - 1)) {
                let mut ip = run.start;
                for i in run.first..end {
                    if i >= start && m.matches(ip) {
                        return Some(self.first + i as u64);
                    }
                    ip = ip.wrapping_add(self.lens[i as usize] as u64);
                }
            }
        }
        None
    }
}

/// A small LRU of decoded segments.
#[derive(Debug, Clone)]
struct SegmentCache {
    entries: Vec<(u64, Segment)>,
    capacity: usize,
    tick: u64,
}

impl SegmentCache {
    fn new(capacity: usize) -> Self {
        SegmentCache {
            entries: Vec::new(),
            capacity: capacity.max(1),
            tick: 0,
        }
    }

    fn set_capacity(&mut self, n: usize) {
        self.capacity = n.max(1);
        while self.entries.len() > self.capacity {
            self.evict();
        }
    }

    fn get(&mut self, k: usize) -> Option<&Segment> {
        self.tick += 1;
        let tick = self.tick;
        let e = self.entries.iter_mut().find(|e| e.1.k == k)?;
        e.0 = tick;
        Some(&e.1)
    }

    fn insert(&mut self, seg: Segment) {
        self.forget(seg.k);
        if self.entries.len() >= self.capacity {
            self.evict();
        }
        self.tick += 1;
        self.entries.push((self.tick, seg));
    }

    fn evict(&mut self) {
        if let Some(i) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.0)
            .map(|(i, _)| i)
        {
            self.entries.swap_remove(i);
        }
    }

    fn forget(&mut self, k: usize) {
        self.entries.retain(|e| e.1.k != k);
    }

    fn forget_from(&mut self, k: usize) {
        self.entries.retain(|e| e.1.k < k);
    }

    fn clear(&mut self) {
        self.entries.clear();
    }

    fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.1.bytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakpoints_match_blocks_exactly() {
        // Instructions at 0x1000 (2 bytes), 0x1002 (3 bytes), 0x1005 (1 byte).
        let lens = [2u8, 3, 1];
        let at = |a: &[u64]| BreakpointSet::new(a.iter().copied()).may_match_insns(0x1000, &lens);
        assert!(at(&[0x1000]));
        assert!(at(&[0x1002]));
        assert!(at(&[0x1005]));
        assert!(at(&[0x0fff, 0x1005, 0x2000]));
        // Inside an instruction, before the block, after its last instruction's start.
        assert!(!at(&[0x1001]));
        assert!(!at(&[0x1003, 0x1004]));
        assert!(!at(&[0x0fff]));
        assert!(!at(&[0x1006]));
        assert!(!at(&[]));
        assert!(!BreakpointSet::new([0x1000]).may_match_insns(0x1000, &[]));
        // The default answer is the address range of the instruction starts.
        let range_only = MatchFn(|_| true);
        assert!(range_only.may_match_insns(0x1000, &lens));
        struct Below(u64);
        impl IpMatch for Below {
            fn matches(&mut self, ip: u64) -> bool {
                ip < self.0
            }
            fn may_match_range(&self, start: u64, _end: u64) -> bool {
                start < self.0
            }
        }
        assert!(Below(0x1001).may_match_insns(0x1000, &lens));
        assert!(!Below(0x1000).may_match_insns(0x1000, &lens));
    }
}
