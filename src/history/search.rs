//! Searches over the history: the backward and forward scans (`rfind*`, `find*`) that skip summary groups
//! ruled out by their [`CodeSummary`](super::CodeSummary), decode the rest with a
//! [`FilteredDecoder`] and go parallel over many segments.

use super::matcher::{DynMatch, IpMatch, MatchFn};
use super::segment::{reuse_decoder, walk_segment};
use super::{History, PARALLEL_MIN_SEGMENTS, SyncPoint};
use crate::flow::FilteredDecoder;
use crate::image::Image;

/// Decodes segment `k` (whose first instruction is number `first`) and returns the last
/// instruction before `from` that `m` matches. Runs of blocks that `m` rules out
/// ([`IpMatch::may_match_insns`]) are passed over inside the decoder.
pub(super) fn scan_segment_back<M: IpMatch + ?Sized>(
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

impl History {
    /// If the summary of the group holding segment `k` shows that `m` cannot match in it, the
    /// group's segments (`first..end`).
    pub(super) fn ruled_out<M: IpMatch>(&self, k: usize, m: &M) -> Option<(usize, usize)> {
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
    pub(super) fn backward_candidates<M: IpMatch>(&self, k: usize, m: &M) -> Vec<usize> {
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
    pub(super) fn par_rfind<M: IpMatch>(
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
