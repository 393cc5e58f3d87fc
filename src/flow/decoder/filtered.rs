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
//! It lives in a child module of the decoder because it drives the decoder's private fast path
//! (path replay, the TNT-8 refill, `tnt_step`, the TIP fast path, then the output queue and
//! `fill`) step by step exactly as `next_block` does; the output it hands out is that of
//! `next_block` with the passed-over runs removed. A change to `next_block`'s steps must be
//! mirrored here: `tests/history.rs` checks the filtered stream against a sequential decode.

use super::{BlockItem, FlowDecoder, Seg, State};

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
    /// Per block index of `dec`'s cache: `UNKNOWN`, `PASS` or `WANT`.
    flags: Vec<u8>,
    /// The cache's flush count the flags belong to (a flush renumbers the blocks).
    flushes: u64,
}

impl<'a> FilteredDecoder<'a> {
    /// Filters the output of `dec`.
    pub fn new(dec: FlowDecoder<'a>) -> Self {
        let flushes = dec.cache.flushes;
        FilteredDecoder {
            dec,
            flags: Vec::new(),
            flushes,
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
        self.flags.clear();
    }

    /// Whether the run of block `blk` is handed out.
    #[inline(always)]
    fn wants(&mut self, blk: u32, wants: &mut impl FnMut(u64, &[u8]) -> bool) -> bool {
        match self.flags.get(blk as usize) {
            Some(&PASS) => false,
            Some(&WANT) => true,
            _ => self.classify(blk, wants),
        }
    }

    #[cold]
    #[inline(never)]
    fn classify(&mut self, blk: u32, wants: &mut impl FnMut(u64, &[u8]) -> bool) -> bool {
        let i = blk as usize;
        let Some(b) = self.dec.cache.blocks.get(i) else {
            return true;
        };
        let yes = wants(b.start, self.dec.cache.lens_of(b));
        if self.flags.len() <= i {
            self.flags
                .resize(self.dec.cache.blocks.len().max(i + 1), UNKNOWN);
        }
        self.flags[i] = if yes { WANT } else { PASS };
        yes
    }

    /// After anything that may have flushed the block cache: drop stale classifications.
    #[inline(always)]
    fn check_flush(&mut self) {
        if self.dec.cache.flushes != self.flushes {
            self.flushes = self.dec.cache.flushes;
            self.flags.clear();
        }
    }

    /// Whether a run of `n` instructions of block `blk` is passed over (and counted).
    #[inline(always)]
    fn pass_over(
        &mut self,
        blk: u32,
        n: u32,
        count: &mut u64,
        budget: u64,
        wants: &mut impl FnMut(u64, &[u8]) -> bool,
    ) -> bool {
        let total = *count + n as u64;
        if total < budget && !self.wants(blk, wants) {
            *count = total;
            return true;
        }
        false
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
        loop {
            // The decoder's fast path, step by step as in `next_block`: a path replay, a TNT-8
            // refill (replayed from the path cache, or walked), a TIP fast path. Each yields one
            // whole block, already counted.
            let mut step = Step::Slow;
            if self.dec.path_pos < self.dec.path_end {
                step = Step::Block(self.dec.replay_step());
            } else if self.dec.out.is_empty() && self.dec.state == State::Enabled {
                if self.dec.tnt_count == 0 {
                    let refilled = self.dec.short_tnt_refill();
                    self.check_flush();
                    if !refilled {
                        if let Some(idx) = self.dec.tip_fast_path() {
                            step = Step::Block(idx);
                        }
                    } else if self.dec.start_path() {
                        step = Step::Block(self.dec.replay_step());
                    } else {
                        step = Step::of(self.dec.tnt_step());
                    }
                } else {
                    step = Step::of(self.dec.tnt_step());
                }
            }
            match step {
                Step::Block(idx) => {
                    let n = self.dec.cache.blocks[idx as usize].n;
                    if !self.pass_over(idx, n, count, budget, wants) {
                        return Some(BlockItem::Block(self.dec.whole_block(idx)));
                    }
                }
                // The step queued its output: the slow path below hands it out next round.
                Step::Queued => {}
                Step::Slow => {
                    // As `next_block_slow`.
                    if self.dec.rec_key != 0 || self.dec.path_pos < self.dec.path_end {
                        self.dec.settle_path();
                    }
                    if let Some(seg) = self.dec.out.pop_front() {
                        match seg {
                            Seg::Event(e) => return Some(BlockItem::Event(*e)),
                            Seg::Run(r) => {
                                if !self.pass_over(r.blk, r.count, count, budget, wants) {
                                    return Some(BlockItem::Block(self.dec.block_of(r)));
                                }
                            }
                        }
                        continue;
                    }
                    if self.dec.walking_tnt() {
                        if let Some(idx) = self.dec.tnt_step() {
                            let n = self.dec.cache.blocks[idx as usize].n;
                            if !self.pass_over(idx, n, count, budget, wants) {
                                return Some(BlockItem::Block(self.dec.whole_block(idx)));
                            }
                        }
                        continue;
                    }
                    self.dec.fill(true);
                    self.check_flush();
                    if self.dec.out.is_empty() && !self.dec.walking_tnt() {
                        return None;
                    }
                }
            }
        }
    }
}

/// What one round of [`FilteredDecoder::next_block`]'s fast path produced.
enum Step {
    /// A whole block, counted.
    Block(u32),
    /// Output went to the queue (or nothing came out).
    Queued,
    /// The fast path does not apply.
    Slow,
}

impl Step {
    #[inline(always)]
    fn of(tnt_step: Option<u32>) -> Step {
        tnt_step.map_or(Step::Queued, Step::Block)
    }
}
