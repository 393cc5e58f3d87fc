//! A decoder that passes over the runs of uninteresting blocks without handing them out.
//!
//! A search through a decode (the history's reverse-continue and forward replay to a breakpoint)
//! looks at almost no run: only those whose code holds a breakpoint. [`FlowDecoder::next_block`]
//! still builds and returns every run, and the caller rejects it; at ~5 instructions per run that
//! per-run hand-out is a large share of the decode. [`FilteredDecoder`] asks once per cached block
//! whether its instructions can interest the caller, keeps the answer beside the block cache, and
//! walks (or replays from the path cache) the uninteresting blocks without leaving the decoder,
//! only counting their instructions.
//!
//! There is one output loop, `FlowDecoder::next_block_with`, generic over a `RunFilter`; this
//! module supplies the filter (`Skip`: the per-block flags, the count and the budget), so the
//! filtered stream is by construction that of `next_block` with the passed-over runs removed
//! (`tests/history.rs` checks it against a sequential decode).

use super::{BlockItem, FlowDecoder, PathSum, RunFilter};
use crate::flow::cache::{BlockCache, PATH_PUSH};

/// Classification of a cached block, by block index.
const UNKNOWN: u8 = 0;
const PASS: u8 = 1;
const WANT: u8 = 2;

/// A [`FlowDecoder`] that hands out only the runs of blocks a classifier wants, and every event.
///
/// The classifier (`wants` in [`next_block`](Self::next_block)) is called at most once per block
/// of the decoder's block cache with the block's first address and instruction lengths; its answer
/// is kept until [`reset_filter`](Self::reset_filter) (or a flush of the block cache). It must
/// therefore answer the same for the same block for as long as the answers are kept, and say
/// `true` whenever *any* instruction of the block may interest the caller: a run handed out may be
/// a part of its block (a run cut by an event), and a run passed over is never seen again.
pub struct FilteredDecoder<'a> {
    dec: FlowDecoder<'a>,
    flags: Flags,
}

/// The kept classifications.
struct Flags {
    /// Per block index of the decoder's cache: `UNKNOWN`, `PASS` or `WANT`.
    of: Vec<u8>,
    /// The cache's flush count the flags belong to (a flush renumbers the blocks).
    flushes: u64,
    /// Per slot of the decoder's path cache: whether every block of the path in it is passed
    /// over, for the path recorded at `at` under `key` (a replaced or moved slot is judged anew).
    paths: Vec<PathVerdict>,
    /// The path cache's clear count the path verdicts belong to (after a clear, `key` and `at`
    /// may recur for another path).
    path_clears: u64,
}

/// A kept judgement of a recorded path.
#[derive(Clone, Copy, Default)]
struct PathVerdict {
    key: u64,
    at: u32,
    /// Whether every block of the path is passed over.
    pass: bool,
    /// Its instructions and pushes (when `pass`).
    sum: PathSum,
}

impl Flags {
    /// Drops the kept answers if the cache renumbered its blocks or cleared its paths since.
    #[inline(always)]
    fn validate(&mut self, cache: &BlockCache<'_>) {
        if cache.flushes != self.flushes || cache.paths.clears != self.path_clears {
            self.stale(cache);
        }
    }

    #[cold]
    #[inline(never)]
    fn stale(&mut self, cache: &BlockCache<'_>) {
        if cache.flushes != self.flushes {
            self.flushes = cache.flushes;
            self.of.clear();
        }
        self.path_clears = cache.paths.clears;
        self.paths.clear();
    }
}

impl<'a> FilteredDecoder<'a> {
    /// Filters the output of `dec`.
    pub fn new(dec: FlowDecoder<'a>) -> Self {
        let flushes = dec.cache.flushes;
        let path_clears = dec.cache.paths.clears;
        FilteredDecoder {
            dec,
            flags: Flags {
                of: Vec::new(),
                flushes,
                paths: Vec::new(),
                path_clears,
            },
        }
    }

    /// The underlying decoder.
    pub fn decoder(&self) -> &FlowDecoder<'a> {
        &self.dec
    }

    /// The underlying decoder, without the filter.
    pub fn into_inner(self) -> FlowDecoder<'a> {
        self.dec
    }

    /// [`FlowDecoder::resync_at`]: the block cache and the classifications are kept.
    pub fn resync_at(&mut self, offset: u64) {
        self.dec.resync_at(offset);
    }

    /// Forgets every classification (the classifier changed).
    pub fn reset_filter(&mut self) {
        self.flags.of.clear();
        self.flags.paths.clear();
    }

    /// The next event, or run of a block that `wants` accepts, as [`FlowDecoder::next_block`]
    /// would hand it out; `None` at the end of the trace. Runs of other blocks are passed over
    /// and their instructions added to `*count`, but only while `*count` stays below `budget`:
    /// the run that would reach it is handed out whatever its block, so a caller that adds the
    /// runs it is handed to `*count` too, and is interested only in instructions before
    /// `budget`, can stop there.
    #[inline]
    pub fn next_block(
        &mut self,
        count: &mut u64,
        budget: u64,
        wants: &mut impl FnMut(u64, &[u8]) -> bool,
    ) -> Option<BlockItem<'_>> {
        self.dec.next_block_with(&mut Skip {
            flags: &mut self.flags,
            count,
            budget,
            wants,
        })
    }
}

/// The filter of one [`FilteredDecoder::next_block`] call.
struct Skip<'f, W> {
    flags: &'f mut Flags,
    count: &'f mut u64,
    budget: u64,
    wants: &'f mut W,
}

impl<W: FnMut(u64, &[u8]) -> bool> RunFilter for Skip<'_, W> {
    #[inline(always)]
    fn pass_over(&mut self, cache: &BlockCache<'_>, blk: u32, n: u32) -> bool {
        let total = *self.count + n as u64;
        if total < self.budget && !self.wants(cache, blk) {
            *self.count = total;
            return true;
        }
        false
    }

    #[inline(always)]
    fn pass_over_path(&mut self, cache: &BlockCache<'_>, slot: usize) -> Option<PathSum> {
        let sum = self.path_passes(cache, slot)?;
        // Each block alone would pass while the running count stays below the budget: all of
        // them do exactly when the sum does (the counts are positive).
        let total = *self.count + sum.insns as u64;
        if total < self.budget {
            *self.count = total;
            return Some(sum);
        }
        None
    }
}

impl<W: FnMut(u64, &[u8]) -> bool> Skip<'_, W> {
    /// The sums of the path in slot `slot` if every block of it is passed over.
    #[inline(always)]
    fn path_passes(&mut self, cache: &BlockCache<'_>, slot: usize) -> Option<PathSum> {
        self.flags.validate(cache);
        let s = &cache.paths.slots[slot];
        let v = match self.flags.paths.get(slot) {
            Some(v) if v.key == s.key && v.at == s.at => *v,
            _ => self.judge_path(cache, slot),
        };
        v.pass.then_some(v.sum)
    }

    #[cold]
    #[inline(never)]
    fn judge_path(&mut self, cache: &BlockCache<'_>, slot: usize) -> PathVerdict {
        let s = cache.paths.slots[slot];
        let mut v = PathVerdict {
            key: s.key,
            at: s.at,
            pass: false,
            sum: PathSum::default(),
        };
        let Some(elems) = cache
            .paths
            .elems
            .get(s.at as usize..(s.at + s.len()) as usize)
        else {
            return v;
        };
        v.pass = true;
        for &e in elems {
            let blk = e & !PATH_PUSH;
            let Some(b) = cache.blocks.get(blk as usize) else {
                v.pass = false;
                break;
            };
            if self.wants(cache, blk) {
                v.pass = false;
                break;
            }
            // At most `MAX_PATH_LEN` blocks of at most `MAX_BLOCK_INSNS` instructions each.
            v.sum.insns = v.sum.insns.saturating_add(b.n);
            v.sum.pushes |= e & PATH_PUSH != 0;
        }
        let paths = &mut self.flags.paths;
        if paths.len() <= slot {
            paths.resize(
                cache.paths.slots.len().max(slot + 1),
                PathVerdict::default(),
            );
        }
        paths[slot] = v;
        v
    }

    /// Whether the run of block `blk` is handed out.
    #[inline(always)]
    fn wants(&mut self, cache: &BlockCache<'_>, blk: u32) -> bool {
        // A flush of the cache renumbers its blocks: the flags are then stale.
        self.flags.validate(cache);
        match self.flags.of.get(blk as usize) {
            Some(&PASS) => false,
            Some(&WANT) => true,
            _ => self.classify(cache, blk),
        }
    }

    #[cold]
    #[inline(never)]
    fn classify(&mut self, cache: &BlockCache<'_>, blk: u32) -> bool {
        let i = blk as usize;
        let Some(b) = cache.blocks.get(i) else {
            return true;
        };
        let yes = (self.wants)(b.start, cache.lens_of(b));
        let of = &mut self.flags.of;
        if of.len() <= i {
            of.resize(cache.blocks.len().max(i + 1), UNKNOWN);
        }
        of[i] = if yes { WANT } else { PASS };
        yes
    }
}
