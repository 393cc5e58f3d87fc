//! Decoded segments and the cache of them: a segment expanded into runs of consecutive
//! instructions plus one length byte each, so random access ([`History::insn`]) and stepping
//! backwards cost one decode per segment; the walk that hands out a segment's blocks.

use super::matcher::IpMatch;
use super::{History, SyncPoint};
use crate::flow::{Block, BlockItem, EventKind, FilteredDecoder, FlowConfig, FlowDecoder};
use crate::image::Image;

/// Matches nothing but hands out every run (decoding a segment into the random-access cache).
pub(super) struct EveryRun;

impl IpMatch for EveryRun {
    fn matches(&mut self, _: u64) -> bool {
        false
    }
}

/// The search decoder: created once per search, then moved from segment to segment so its block
/// cache (decoded code, and which blocks the search's matcher rules out) is reused.
pub(super) fn reuse_decoder<'d, 'a>(
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
pub(super) fn walk_segment<M: IpMatch + ?Sized>(
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
pub(super) struct Run {
    /// Address of its first instruction.
    pub(super) start: u64,
    /// Index (within the segment) of its first instruction.
    pub(super) first: u32,
}

/// A decoded segment: its instructions as runs plus one length byte per instruction.
#[derive(Debug, Clone)]
pub(super) struct Segment {
    pub(super) k: usize,
    pub(super) first: u64,
    pub(super) runs: Vec<Run>,
    pub(super) lens: Vec<u8>,
}

impl Segment {
    pub(super) fn bytes(&self) -> u64 {
        (self.runs.capacity() * std::mem::size_of::<Run>() + self.lens.capacity()) as u64
            + std::mem::size_of::<Segment>() as u64
    }

    /// Index of the run holding segment-relative instruction `i`.
    #[inline]
    pub(super) fn run_of(&self, i: u32) -> usize {
        self.runs
            .partition_point(|r| r.first <= i)
            .saturating_sub(1)
    }

    /// Address of the run-relative instruction `i` given its run `r`.
    #[inline]
    pub(super) fn ip_at(&self, r: usize, i: u32) -> u64 {
        let run = self.runs[r];
        self.lens[run.first as usize..i as usize]
            .iter()
            .fold(run.start, |ip, &l| ip.wrapping_add(l as u64))
    }

    pub(super) fn insn(&self, n: u64) -> Option<(u64, u8)> {
        let i = u32::try_from(n.checked_sub(self.first)?).ok()?;
        let len = *self.lens.get(i as usize)?;
        Some((self.ip_at(self.run_of(i), i), len))
    }

    /// Run `r`'s end (exclusive, segment-relative).
    pub(super) fn run_end(&self, r: usize) -> u32 {
        self.runs
            .get(r + 1)
            .map_or(self.lens.len() as u32, |n| n.first)
    }

    /// Last instruction before `from` (absolute) that `m` matches.
    pub(super) fn rfind<M: IpMatch>(&self, from: u64, m: &mut M) -> Option<u64> {
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
    pub(super) fn find<M: IpMatch>(&self, from: u64, m: &mut M) -> Option<u64> {
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
pub(super) struct SegmentCache {
    pub(super) entries: Vec<(u64, Segment)>,
    pub(super) capacity: usize,
    pub(super) tick: u64,
}

impl SegmentCache {
    pub(super) fn new(capacity: usize) -> Self {
        SegmentCache {
            entries: Vec::new(),
            capacity: capacity.max(1),
            tick: 0,
        }
    }

    pub(super) fn set_capacity(&mut self, n: usize) {
        self.capacity = n.max(1);
        while self.entries.len() > self.capacity {
            self.evict();
        }
    }

    pub(super) fn get(&mut self, k: usize) -> Option<&Segment> {
        self.tick += 1;
        let tick = self.tick;
        let e = self.entries.iter_mut().find(|e| e.1.k == k)?;
        e.0 = tick;
        Some(&e.1)
    }

    pub(super) fn insert(&mut self, seg: Segment) {
        self.forget(seg.k);
        if self.entries.len() >= self.capacity {
            self.evict();
        }
        self.tick += 1;
        self.entries.push((self.tick, seg));
    }

    pub(super) fn evict(&mut self) {
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

    pub(super) fn forget(&mut self, k: usize) {
        self.entries.retain(|e| e.1.k != k);
    }

    pub(super) fn forget_from(&mut self, k: usize) {
        self.entries.retain(|e| e.1.k < k);
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }

    pub(super) fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.1.bytes()).sum()
    }
}

impl History {
    /// Decodes segment `k` into runs (`dec` is positioned at its PSB or will be resynchronised).
    pub(super) fn decode_segment(&mut self, dec: &mut FilteredDecoder<'_>, k: usize) -> Segment {
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
}
