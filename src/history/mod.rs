//! The indexed execution history: sync points, instruction numbers and random access both ways.
//!
//! A trace is a sequence of *segments*, one per PSB+ that the flow decoder honoured: segment `k`
//! holds the instructions between the [`EventKind::Psb`](crate::flow::EventKind::Psb) events of sync points `k` and `k + 1`
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

use crate::flow::{FilteredDecoder, FlowConfig, FlowDecoder};
use crate::image::Image;

mod index;
mod matcher;
mod search;
mod segment;
pub mod threads;
pub mod worker;

pub use index::{CodeSummary, GROUP_BYTES, SegmentGroup};
use index::{Scan, scan, view_len};
pub use matcher::{BreakpointSet, IpMatch, MatchFn};
use segment::SegmentCache;
pub use threads::{GlobalOrder, ThreadClock};
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
