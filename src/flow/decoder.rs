//! The flow decoder state machine.

use super::cache::{BlockCache, CachedBlock, InsnClass, MAX_PATH_LEN, PATH_PUSH, PathSlot, Term};
use super::time::TimeState;
use super::{Event, EventKind, FlowConfig, FlowErrorKind, Insn, Item};
use crate::image::Image;
use crate::packet::{
    ExecMode, IpCompression, IpPayload, LastIp, Packet, PacketDecoder, PacketError, Tnt,
};
use std::collections::VecDeque;

// A separate child module (it drives the private hot path below): see its docs.
mod filtered;
pub use filtered::FilteredDecoder;

/// Where the decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not synchronised: looking for a PSB.
    NoSync,
    /// In sync, tracing off: waiting for TIP.PGE (or a PSB+ with FUP).
    Disabled,
    /// In sync, tracing on, `ip` is the next instruction.
    Enabled,
    /// After an error: the IP is unknown. TIP.PGE, a PSB+ with FUP, or a FUP after OVF resume.
    Lost,
}

/// `count` instructions of cached block `blk` from index `skip`.
#[derive(Debug, Clone, Copy)]
struct Run {
    blk: u32,
    skip: u32,
    count: u32,
    start_ip: u64,
    end_ip: u64,
    time: u64,
}

/// A piece of output waiting in the queue.
#[derive(Debug, Clone)]
enum Seg {
    /// A run of instructions.
    Run(Run),
    /// Boxed: events are rare, runs are the hot path and should stay small to move.
    Event(Box<Event>),
}

/// One piece of output of [`FlowDecoder::next_block_with`]'s steps, before the filter sees it.
enum Out {
    /// All of a cached block, already counted.
    Whole(u32),
    /// A run from the queue.
    Run(Run),
    /// An event from the queue.
    Event(Box<Event>),
    /// The end of the trace.
    End,
}

/// Which runs [`FlowDecoder::next_block_with`] passes over instead of handing out. Only a
/// [`FlowDecoder`]'s own loop drives it, once per run; the implementations are tiny and
/// always inlined, so each filter gets its own copy of the loop with no indirection.
trait RunFilter {
    /// Whether the run of `n` instructions of block `blk` of `cache` is passed over (the filter
    /// accounts for it) rather than handed out.
    fn pass_over(&mut self, cache: &BlockCache<'_>, blk: u32, n: u32) -> bool;

    /// Whether the whole replay of path slot `slot` of `cache.paths`, about to start, is passed
    /// over at once (the filter accounts for all its instructions, and returns their sum and
    /// whether any block pushes): only if [`Self::pass_over`] would pass over each of its blocks
    /// in turn. The default never does, so a filter without it keeps the block-per-call replay
    /// (and the plain decoder's path cache keeps no per-path sums: the filter computes them).
    #[inline(always)]
    fn pass_over_path(&mut self, _cache: &BlockCache<'_>, _slot: usize) -> Option<PathSum> {
        None
    }
}

/// What a path replay passed over as a whole amounts to (see [`RunFilter::pass_over_path`]).
#[derive(Clone, Copy, Default)]
struct PathSum {
    /// Instructions of all its blocks.
    insns: u32,
    /// Whether any of its elements is [`PATH_PUSH`] flagged.
    pushes: bool,
}

/// The filter of the plain [`FlowDecoder::next_block`]: hands out every run (zero-sized; the
/// filter's checks compile away).
struct HandOutAll;

impl RunFilter for HandOutAll {
    #[inline(always)]
    fn pass_over(&mut self, _: &BlockCache<'_>, _: u32, _: u32) -> bool {
        false
    }
}

/// A run of consecutive instructions (all fall through to the next one, except possibly the last).
#[derive(Debug, Clone, Copy)]
pub struct Block<'d> {
    /// IP of the first instruction.
    pub start: u64,
    /// IP of the last instruction.
    pub end: u64,
    /// Number of instructions.
    pub count: u32,
    /// Execution mode.
    pub mode: ExecMode,
    /// Class of the last instruction (`Other` when the run was cut by an event before its branch).
    pub class: InsnClass,
    /// Approximate timestamp (TSC ticks).
    pub time: u64,
    lens: &'d [u8],
}

impl<'d> Block<'d> {
    /// The instruction lengths, in order.
    pub fn lens(&self) -> &'d [u8] {
        self.lens
    }

    /// The instructions of the run.
    pub fn insns(&self) -> impl Iterator<Item = Insn> + 'd {
        let mut ip = self.start;
        let last = self.lens.len().saturating_sub(1);
        let (mode, class, time) = (self.mode, self.class, self.time);
        self.lens.iter().enumerate().map(move |(k, &len)| {
            let i = Insn {
                ip,
                len,
                class: if k == last { class } else { InsnClass::Other },
                mode,
                time,
            };
            ip = ip.wrapping_add(len as u64);
            i
        })
    }
}

/// One step of [`FlowDecoder::next_block`].
#[derive(Debug, Clone)]
pub enum BlockItem<'d> {
    /// A run of instructions.
    Block(Block<'d>),
    /// An event.
    Event(Event),
}

/// Counters of a decode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Instructions emitted.
    pub insns: u64,
    /// Runs emitted.
    pub runs: u64,
    /// Events emitted (errors included).
    pub events: u64,
    /// Error events emitted.
    pub errors: u64,
    /// Instructions decoded with iced-x86 (block-cache misses).
    pub decoded_insns: u64,
    /// Block-cache flushes.
    pub cache_flushes: u64,
    /// TNT-8 packets whose walk was replayed from the path cache.
    pub path_hits: u64,
    /// TNT-8 packet walks recorded into the path cache.
    pub paths_recorded: u64,
}

/// The return stack for RET compression: a fixed ring that drops its oldest entry when full.
#[derive(Debug, Clone)]
struct RetStack {
    buf: Vec<u64>,
    top: usize,
    len: usize,
}

impl RetStack {
    fn new(depth: usize) -> Self {
        RetStack {
            buf: vec![0; depth.max(1)],
            top: 0,
            len: 0,
        }
    }
    #[inline]
    fn push(&mut self, ip: u64) {
        self.top = (self.top + 1) % self.buf.len();
        self.buf[self.top] = ip;
        self.len = (self.len + 1).min(self.buf.len());
    }
    #[inline]
    fn pop(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let v = self.buf[self.top];
        self.top = (self.top + self.buf.len() - 1) % self.buf.len();
        self.len -= 1;
        Some(v)
    }
    fn clear(&mut self) {
        self.len = 0;
    }
}

/// Events that wait for the FUP that gives their IP (MODE.TSX, PTW, EXSTOP, MWAIT, BEP, CFE).
const MAX_CLAIMS: usize = 16;

/// Reconstructs the executed instructions of a trace. See the [module docs](super).
pub struct FlowDecoder<'a> {
    image: &'a Image,
    cfg: FlowConfig,
    pkt: PacketDecoder<'a>,
    pushback: Option<(u64, Packet)>,
    last_ip: LastIp,
    cache: BlockCache<'a>,
    state: State,
    ip: u64,
    mode: ExecMode,
    pending_mode: Option<ExecMode>,
    /// TNT FIFO: the oldest pending bit is bit `tnt_count - 1`.
    tnt_bits: u64,
    tnt_count: u32,
    /// Instructions walked since the last TNT bit was used (runaway guard of the TNT walk).
    tnt_walked: u64,
    /// Cache index of the block at `ip` when the TNT walk knows it through a successor link
    /// (`u32::MAX` or stale otherwise: checked against `ip` and `mode` before use).
    next_blk: u32,
    /// Replay of a recorded TNT walk: the path elements `path_pos .. path_end` are still to be
    /// handed out (the walk's end state is already applied).
    path_pos: u32,
    path_end: u32,
    /// Key of the TNT walk being recorded (0: none) and where its elements start.
    rec_key: u64,
    rec_at: u32,
    ret: RetStack,
    claims: Vec<(u64, EventKind)>,
    ovf_pending: Option<u64>,
    out: VecDeque<Seg>,
    time: TimeState,
    cur_offset: u64,
    eof: bool,
    stats: FlowStats,
    n_insns: u64,
    n_runs: u64,
}

/// Result of a walk.
enum Walk {
    /// The goal was reached.
    Done,
    /// An error was reported; the decoder is now `Lost`.
    Failed,
}

impl<'a> FlowDecoder<'a> {
    /// A decoder over the whole `trace`, starting at its first PSB.
    pub fn new(trace: &'a [u8], image: &'a Image, cfg: FlowConfig) -> Self {
        let mode = cfg.default_mode;
        FlowDecoder {
            image,
            pkt: PacketDecoder::new(trace),
            pushback: None,
            last_ip: LastIp::new(),
            cache: BlockCache::new(cfg.cache_insn_limit),
            state: State::NoSync,
            ip: 0,
            mode,
            pending_mode: None,
            tnt_bits: 0,
            tnt_count: 0,
            tnt_walked: 0,
            next_blk: u32::MAX,
            path_pos: 0,
            path_end: 0,
            rec_key: 0,
            rec_at: 0,
            ret: RetStack::new(cfg.ret_stack_depth),
            claims: Vec::new(),
            ovf_pending: None,
            out: VecDeque::new(),
            time: TimeState::new(cfg.timing),
            cur_offset: 0,
            eof: false,
            stats: FlowStats::default(),
            n_insns: 0,
            n_runs: 0,
            cfg,
        }
    }

    /// A decoder that starts at the PSB at byte `offset` of `trace` (or at the first PSB after it
    /// if there is none exactly there). Its output is the suffix of the full decode from that PSB's
    /// [`EventKind::Psb`] event on.
    pub fn at_psb(trace: &'a [u8], image: &'a Image, cfg: FlowConfig, offset: u64) -> Self {
        let mut d = Self::new(trace, image, cfg);
        d.pkt
            .set_position(usize::try_from(offset).unwrap_or(usize::MAX));
        d
    }

    /// Drops all state and resynchronises at the next PSB at or after `offset`.
    pub fn resync_at(&mut self, offset: u64) {
        self.pkt
            .set_position(usize::try_from(offset).unwrap_or(usize::MAX));
        self.pushback = None;
        self.state = State::NoSync;
        self.path_pos = self.path_end;
        self.rec_key = 0;
        self.out.clear();
        self.claims.clear();
        self.ovf_pending = None;
        self.tnt_count = 0;
        self.eof = false;
    }

    /// Offset in the trace of the next packet to be read. Output already queued may come from
    /// packets before it.
    pub fn offset(&self) -> u64 {
        self.pkt.offset()
    }

    /// Counters so far.
    pub fn stats(&self) -> FlowStats {
        let mut s = self.stats;
        s.insns = self.n_insns;
        s.runs = self.n_runs;
        s.decoded_insns = self.cache.decoded;
        s.cache_flushes = self.cache.flushes;
        s
    }

    /// The next run of instructions or event; `None` at the end of the trace.
    #[inline]
    pub fn next_block(&mut self) -> Option<BlockItem<'_>> {
        self.next_block_with(&mut HandOutAll)
    }

    /// The decoder's one output loop, shared by [`Self::next_block`] (with [`HandOutAll`],
    /// monomorphised into exactly the plain loop) and [`FilteredDecoder::next_block`]: the next
    /// event, or run that `filter` does not pass over.
    ///
    /// The hot path, small enough to inline into the caller's loop: one block per TNT bit (or
    /// direct branch), handed out without a trip through the queue; a TNT-8 packet whose walk
    /// from this block was seen before is replayed from the path cache ([`Self::fast_block`]).
    /// Everything else goes through the queue ([`Self::slow_step`]). A run passed over goes
    /// back to the fast path.
    ///
    /// `#[inline(always)]`: with only `#[inline]` LLVM kept the plain `next_block` out of line
    /// (3.6 KiB), a call per run; inlined, the caller's loop runs the fast path in place (bench
    /// figures in docs/benchmarks.md). The slow path returns an [`Out`] that borrows nothing,
    /// and the public view is built here, so that a passed-over run can loop back (a borrowed
    /// item returned on one arm of a loop would keep `self` borrowed on the others).
    #[inline(always)]
    fn next_block_with<F: RunFilter>(&mut self, filter: &mut F) -> Option<BlockItem<'_>> {
        loop {
            let out = match self.fast_block(filter) {
                Some(idx) => Out::Whole(idx),
                None => self.slow_step(),
            };
            match out {
                Out::Whole(idx) => {
                    let n = self.cache.blocks[idx as usize].n;
                    if !filter.pass_over(&self.cache, idx, n) {
                        return Some(BlockItem::Block(self.whole_block(idx)));
                    }
                }
                Out::Run(r) => {
                    if !filter.pass_over(&self.cache, r.blk, r.count) {
                        return Some(BlockItem::Block(self.block_of(r)));
                    }
                }
                Out::Event(e) => return Some(BlockItem::Event(*e)),
                Out::End => return None,
            }
        }
    }

    /// The fast paths: a path replay, a TNT-8 refill (replayed from the path cache, or walked),
    /// a TNT bit walked, a TIP fast path. `Some` whole block, already counted; `None` when none
    /// applies (or the step queued its output instead): the slow path runs next.
    ///
    /// A replay that `filter` passes over as a whole ([`RunFilter::pass_over_path`]) is applied
    /// in one step ([`Self::skip_path`]) and the fast path goes on from its end; with a filter
    /// that never does, the loop is not one.
    #[inline(always)]
    fn fast_block<F: RunFilter>(&mut self, filter: &mut F) -> Option<u32> {
        if self.path_pos < self.path_end {
            return Some(self.replay_step());
        }
        loop {
            if !self.out.is_empty() || self.state != State::Enabled {
                return None;
            }
            if self.tnt_count == 0 {
                if !self.short_tnt_refill() {
                    return self.tip_fast_path();
                }
                if let Some(slot) = self.start_path() {
                    if let Some(sum) = filter.pass_over_path(&self.cache, slot) {
                        self.skip_path(sum);
                        continue;
                    }
                    return Some(self.replay_step());
                }
            }
            return self.tnt_step();
        }
    }

    /// The whole replay just started by [`Self::start_path`] (summed up by `sum`) at once, as
    /// [`Self::replay_step`] for each of its blocks would: counted, its CALLs pushed in order.
    #[inline(always)]
    fn skip_path(&mut self, sum: PathSum) {
        self.n_insns += sum.insns as u64;
        self.n_runs += (self.path_end - self.path_pos) as u64;
        if sum.pushes {
            let paths = &self.cache.paths;
            for &e in &paths.elems[self.path_pos as usize..self.path_end as usize] {
                if e & PATH_PUSH != 0 {
                    self.ret
                        .push(self.cache.blocks[(e & !PATH_PUSH) as usize].next);
                }
            }
        }
        self.path_pos = self.path_end;
    }

    /// At the start of a TNT-8 packet's walk: replays the recorded walk of these bits from the
    /// current block (returns its path slot; its end state is applied at once), or starts
    /// recording it.
    #[inline(always)]
    fn start_path(&mut self) -> Option<usize> {
        let idx = self.cur_block();
        self.next_blk = idx;
        if self.tnt_count > 7 || idx >= PATH_PUSH {
            return None;
        }
        let pattern = (1u64 << self.tnt_count) | (self.tnt_bits & ((1u64 << self.tnt_count) - 1));
        let key = ((idx as u64) << 8) | pattern;
        let paths = &self.cache.paths;
        let at = paths.slot(key);
        let slot = &paths.slots[at];
        if slot.key == key {
            self.stats.path_hits += 1;
            self.ip = slot.end_ip;
            self.next_blk = slot.end_blk;
            self.tnt_count = slot.end_count;
            self.tnt_walked = slot.end_walked as u64;
            self.path_pos = slot.at;
            self.path_end = slot.at + slot.len;
            return Some(at);
        }
        self.cache.paths.maybe_clear();
        self.rec_key = key;
        self.rec_at = self.cache.paths.elems.len() as u32;
        None
    }

    /// A TIP (with an IP) that the block at the current IP ends for: an uncompressed RET or an
    /// indirect branch or far transfer with nothing to walk before it, the usual case right
    /// after a TNT walk. The TIP is decoded straight from its bytes and the block, branch
    /// included, handed out as one run, with no trip through the packet decoder and the queue.
    /// `None` (nothing consumed) for anything else; the general path then handles it.
    #[inline(never)]
    fn tip_fast_path(&mut self) -> Option<u32> {
        if self.pushback.is_some()
            || self.pkt.block_context().is_some()
            || self.pending_mode.is_some()
            || self.ovf_pending.is_some()
        {
            return None;
        }
        let buf = self.pkt.buffer();
        let pos = self.pkt.position();
        let b0 = *buf.get(pos)?;
        if b0 & 0x1f != 0x0d {
            return None;
        }
        let (compression, len) = match b0 >> 5 {
            1 => (IpCompression::Update16, 2),
            2 => (IpCompression::Update32, 4),
            3 => (IpCompression::Sext48, 6),
            4 => (IpCompression::Update48, 6),
            6 => (IpCompression::Full, 8),
            _ => return None,
        };
        let payload = buf.get(pos + 1..pos + 1 + len)?;
        let raw = payload
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | b as u64);
        let pl = IpPayload { compression, raw };
        let Ok(Some(target)) = self.last_ip.reconstruct(pl) else {
            return None;
        };
        let idx = self.cur_block();
        let b = &self.cache.blocks[idx as usize];
        let (n, next) = (b.n, b.next);
        match b.term {
            Term::Insn(InsnClass::Return) => {
                // An uncompressed RET still pops, so later compressed RETs line up.
                self.ret.pop();
            }
            Term::Insn(c) if c.needs_tip() => {
                if c == InsnClass::IndirectCall {
                    self.ret.push(next);
                }
            }
            _ => return None,
        }
        let _ = self.last_ip.apply(pl);
        self.pkt.set_position(pos + 1 + len);
        self.cur_offset = pos as u64;
        self.ip = target;
        self.next_blk = u32::MAX;
        self.n_insns += n as u64;
        self.n_runs += 1;
        Some(idx)
    }

    /// Hands out the next block of a path replay (counted, its CALL pushed).
    #[inline(always)]
    fn replay_step(&mut self) -> u32 {
        let e = self.cache.paths.elems[self.path_pos as usize];
        self.path_pos += 1;
        let idx = e & !PATH_PUSH;
        let b = &self.cache.blocks[idx as usize];
        if e & PATH_PUSH != 0 {
            self.ret.push(b.next);
        }
        self.n_insns += b.n as u64;
        self.n_runs += 1;
        idx
    }

    /// Ends a recording: the walk so far, from its start to `end_ip` (block `end_blk` when
    /// known) with `end_count` bits pending and `end_walked` instructions walked since the last.
    #[inline(never)]
    fn finish_path(&mut self, end_ip: u64, end_blk: u32, end_count: u32, end_walked: u64) {
        let key = std::mem::take(&mut self.rec_key);
        let paths = &mut self.cache.paths;
        let len = paths.elems.len() as u32 - self.rec_at;
        if len == 0 || end_walked > u32::MAX as u64 {
            return;
        }
        self.stats.paths_recorded += 1;
        paths.recorded += 1;
        let at = paths.slot(key);
        paths.slots[at] = PathSlot {
            key,
            end_ip,
            end_blk,
            end_count,
            end_walked: end_walked as u32,
            at: self.rec_at,
            len,
        };
    }

    /// Drops a recording in progress.
    #[inline(never)]
    fn abort_path(&mut self) {
        self.rec_key = 0;
        self.cache.paths.elems.truncate(self.rec_at as usize);
    }

    /// Before anything but the fast path runs: the rest of a replay goes to the queue (in order,
    /// ahead of whatever comes next) and a recording in progress is dropped.
    #[inline(never)]
    fn settle_path(&mut self) {
        if self.rec_key != 0 {
            self.abort_path();
        }
        while self.path_pos < self.path_end {
            let e = self.cache.paths.elems[self.path_pos as usize];
            self.path_pos += 1;
            let idx = e & !PATH_PUSH;
            let b = &self.cache.blocks[idx as usize];
            let n = b.n;
            if e & PATH_PUSH != 0 {
                self.ret.push(b.next);
            }
            let r = self.make_run(idx, 0, n);
            self.out.push_back(Seg::Run(r));
        }
    }

    /// The next TNT-8 packet's bits when the walk has used up the last ones (see
    /// [`Self::short_tnt_fast_path`]): a run of TNT-8 packets is walked without leaving
    /// [`Self::next_block`]'s fast path.
    #[inline(always)]
    fn short_tnt_refill(&mut self) -> bool {
        // No block index is referenced by queued output now (the queue is empty), so this is as
        // good a place as `fill` to keep the block cache bounded.
        self.cache.maybe_flush();
        self.short_tnt_fast_path() && self.tnt_count > 0
    }

    /// [`Self::next_block_with`] when the queue holds output or packets must be read: the next
    /// piece of output (not yet offered to the filter).
    #[inline(never)]
    fn slow_step(&mut self) -> Out {
        if self.rec_key != 0 || self.path_pos < self.path_end {
            self.settle_path();
        }
        loop {
            if let Some(seg) = self.out.pop_front() {
                return match seg {
                    Seg::Event(e) => Out::Event(e),
                    Seg::Run(r) => Out::Run(r),
                };
            }
            if self.walking_tnt() {
                // The hot path: one block per TNT bit (or direct branch), handed out without a
                // trip through the queue.
                if let Some(idx) = self.tnt_step() {
                    return Out::Whole(idx);
                }
                continue;
            }
            self.fill(true);
            if self.out.is_empty() && !self.walking_tnt() {
                return Out::End;
            }
        }
    }

    /// The public view of a run.
    #[inline(always)]
    fn block_of(&self, r: Run) -> Block<'_> {
        let b = &self.cache.blocks[r.blk as usize];
        let at = (b.lens_at + r.skip) as usize;
        Block {
            start: r.start_ip,
            end: r.end_ip,
            count: r.count,
            mode: b.mode,
            class: run_class(b, r.skip, r.count),
            time: r.time,
            lens: &self.cache.lens[at..at + r.count as usize],
        }
    }

    /// The public view of all of block `idx` (already counted by `tnt_step`): built straight
    /// from the cached block, with no intermediate [`Run`].
    #[inline(always)]
    fn whole_block(&self, idx: u32) -> Block<'_> {
        let b = &self.cache.blocks[idx as usize];
        let at = b.lens_at as usize;
        Block {
            start: b.start,
            end: b.last_ip,
            count: b.n,
            mode: b.mode,
            class: match b.term {
                Term::Insn(c) => c,
                _ => InsnClass::Other,
            },
            time: self.time.now(),
            lens: &self.cache.lens[at..at + b.n as usize],
        }
    }

    /// True while TNT bits wait to be walked (no packet may be read before they are).
    #[inline(always)]
    fn walking_tnt(&self) -> bool {
        self.tnt_count > 0 && self.state == State::Enabled
    }

    /// The next instruction or event; `None` at the end of the trace.
    pub fn next_item(&mut self) -> Option<Item> {
        if self.rec_key != 0 || self.path_pos < self.path_end {
            self.settle_path();
        }
        if self.out.is_empty() {
            self.fill(false);
        }
        let front = self.out.front_mut()?;
        match front {
            Seg::Event(_) => match self.out.pop_front() {
                Some(Seg::Event(e)) => Some(Item::Event(*e)),
                _ => None,
            },
            Seg::Run(Run {
                blk,
                skip,
                count,
                start_ip,
                time,
                ..
            }) => {
                let b = &self.cache.blocks[*blk as usize];
                let len = self.cache.lens[(b.lens_at + *skip) as usize];
                let class = run_class(b, *skip, 1);
                let insn = Insn {
                    ip: *start_ip,
                    len,
                    class,
                    mode: b.mode,
                    time: *time,
                };
                *start_ip = start_ip.wrapping_add(len as u64);
                *skip += 1;
                *count -= 1;
                if *count == 0 {
                    self.out.pop_front();
                }
                Some(Item::Insn(insn))
            }
        }
    }

    // ----------------------------------------------------------------------------------------
    // Output

    fn emit_event(&mut self, kind: EventKind) {
        if matches!(kind, EventKind::Error { .. }) {
            self.stats.errors += 1;
        }
        self.stats.events += 1;
        self.out.push_back(Seg::Event(Box::new(Event {
            offset: self.cur_offset,
            time: self.time.now(),
            kind,
        })));
    }

    fn error(&mut self, kind: FlowErrorKind, ip: Option<u64>) {
        self.emit_event(EventKind::Error { kind, ip });
        self.state = State::Lost;
        self.tnt_count = 0;
        self.claims.clear();
    }

    /// Emits instructions `skip .. skip+count` of block `idx`.
    #[inline]
    fn emit_run(&mut self, idx: u32, skip: u32, count: u32) {
        if count == 0 {
            return;
        }
        let r = self.make_run(idx, skip, count);
        self.out.push_back(Seg::Run(r));
    }

    /// Instructions `skip .. skip+count` (`count > 0`) of block `idx` as output, counted.
    #[inline(always)]
    fn make_run(&mut self, idx: u32, skip: u32, count: u32) -> Run {
        // Plain scalar counters: updating `stats.insns`/`stats.runs` together compiled to one
        // 16-byte read-modify-write per run, which stalled on the previous run's store.
        self.n_insns += count as u64;
        self.n_runs += 1;
        self.run_of(idx, skip, count)
    }

    /// Instructions `skip .. skip+count` (`count > 0`) of block `idx` as a [`Run`] (not counted).
    #[inline(always)]
    fn run_of(&self, idx: u32, skip: u32, count: u32) -> Run {
        let b = &self.cache.blocks[idx as usize];
        let (start_ip, end_ip) = if skip == 0 && count == b.n {
            (b.start, b.last_ip)
        } else {
            let lens = self.cache.lens_of(b);
            let mut ip = b.start;
            for &l in &lens[..skip as usize] {
                ip = ip.wrapping_add(l as u64);
            }
            let start = ip;
            for &l in &lens[skip as usize..(skip + count - 1) as usize] {
                ip = ip.wrapping_add(l as u64);
            }
            (start, ip)
        };
        Run {
            blk: idx,
            skip,
            count,
            start_ip,
            end_ip,
            time: self.time.now(),
        }
    }

    // ----------------------------------------------------------------------------------------
    // Packets

    /// The next packet that matters for the flow. Timing packets update the time, PAD/MNT/BIP/BBP
    /// are skipped. `None` at the end of the trace, or after an invalid packet (reported; the
    /// decoder is then `NoSync`).
    fn next_packet(&mut self) -> Option<(u64, Packet)> {
        if let Some(p) = self.pushback.take() {
            self.cur_offset = p.0;
            return Some(p);
        }
        loop {
            match self.pkt.next_packet() {
                None => {
                    self.eof = true;
                    return None;
                }
                Some(Ok((off, p))) => match p {
                    Packet::Pad | Packet::Mnt { .. } | Packet::Bip { .. } | Packet::Bbp { .. } => {}
                    Packet::Tsc { tsc } => self.time.tsc(tsc),
                    Packet::Tma { ctc, fc } => self.time.tma(ctc, fc),
                    Packet::Mtc { ctc } => self.time.mtc(ctc),
                    Packet::Cyc { value } => {
                        if self.cfg.errata.skd007 && self.skd007_ovf_in_cyc(off) {
                            continue;
                        }
                        self.time.cyc(value)
                    }
                    Packet::Cbr { ratio } => self.time.cbr(ratio),
                    _ => {
                        self.cur_offset = off;
                        return Some((off, p));
                    }
                },
                Some(Err(PacketError::Truncated { .. })) => {
                    // A cut-off final packet is the normal end of a ToPA/AUX buffer.
                    self.eof = true;
                    return None;
                }
                Some(Err(e)) => {
                    if self.cfg.errata.skz84 && self.skz84_skip_tma(&e) {
                        continue;
                    }
                    if let PacketError::Invalid { offset, .. } = e {
                        self.cur_offset = offset;
                    }
                    self.error(FlowErrorKind::Packet(e), None);
                    self.state = State::NoSync;
                    return None;
                }
            }
        }
    }

    /// Applies an IP payload to Last IP; reports and returns `None` on failure or suppression.
    fn ip_of(&mut self, p: IpPayload) -> Option<u64> {
        match self.last_ip.apply(p) {
            Ok(ip) => ip,
            Err(_) => {
                self.emit_event(EventKind::Error {
                    kind: FlowErrorKind::NoLastIp,
                    ip: None,
                });
                self.stats.errors += 0;
                None
            }
        }
    }

    fn mode_of(&mut self, csl: bool, csd: bool) -> Option<ExecMode> {
        match (csl, csd) {
            (true, false) => Some(ExecMode::Bits64),
            (false, true) => Some(ExecMode::Bits32),
            (false, false) => Some(ExecMode::Bits16),
            (true, true) => {
                self.emit_event(EventKind::Error {
                    kind: FlowErrorKind::BadMode,
                    ip: None,
                });
                None
            }
        }
    }

    fn apply_pending_mode(&mut self) {
        if let Some(m) = self.pending_mode.take() {
            if m != self.mode {
                self.mode = m;
                self.emit_event(EventKind::ModeChange { mode: m });
            }
        }
    }

    // ----------------------------------------------------------------------------------------
    // Main loop

    /// Processes packets until some output is queued or the trace ends (with `stop_at_tnt`, also
    /// when TNT bits are pending: the caller walks them itself).
    fn fill(&mut self, stop_at_tnt: bool) {
        // No block index is referenced by queued output now, so a flush is safe.
        self.cache.maybe_flush();
        while self.out.is_empty() && !self.eof {
            if self.walking_tnt() {
                if stop_at_tnt {
                    return;
                }
                if let Some(idx) = self.tnt_step() {
                    let r = self.run_of(idx, 0, self.cache.blocks[idx as usize].n);
                    self.out.push_back(Seg::Run(r));
                }
                continue;
            }
            if self.state == State::NoSync
                && self.pushback.is_none()
                && self.pkt.sync_forward().is_none()
            {
                self.eof = true;
                break;
            }
            if self.state == State::Enabled && self.short_tnt_fast_path() {
                continue;
            }
            let Some((off, p)) = self.next_packet() else {
                continue;
            };
            self.handle(off, p);
        }
        if self.eof && self.out.is_empty() {
            self.flush_claims();
            if self.ovf_pending.take().is_some() {
                self.emit_event(EventKind::Overflow { resume: None });
            }
        }
    }

    /// TNT-8 is the most frequent packet: decode it straight from the byte (reference §1.4)
    /// without the general packet decoder, skipping the PADs before it. Only outside a BBP block,
    /// where a byte with bit 0 clear (other than PAD and the `02` escape) is always TNT-8.
    #[inline(always)]
    fn short_tnt_fast_path(&mut self) -> bool {
        if self.pushback.is_some() || self.pkt.block_context().is_some() {
            return false;
        }
        let buf = self.pkt.buffer();
        let start = self.pkt.position();
        let mut pos = start;
        let b = loop {
            match buf.get(pos) {
                Some(0) => pos += 1,
                Some(&b) => break b,
                None => break 1,
            }
        };
        if b & 1 != 0 || b == 2 {
            if pos != start {
                // Only PADs were consumed.
                self.pkt.set_position(pos);
            }
            return false;
        }
        let payload = b >> 1;
        // The stop bit is the highest set bit; its index is the number of outcomes.
        let count = 7 - payload.leading_zeros() as u8;
        let bits = (payload & ((1u8 << count) - 1)) as u64;
        self.pkt.set_position(pos + 1);
        self.cur_offset = pos as u64;
        self.tnt(Tnt { bits, count });
        true
    }

    /// Applies a packet that may sit between a FUP and its TIP, or stand alone (MODE.Exec, PIP,
    /// VMCS; reference §3.6): MODE.Exec takes effect at the next TIP/TIP.PGE, PIP and VMCS are
    /// events. Returns false for any other packet.
    fn middle_packet(&mut self, p: Packet) -> bool {
        match p {
            Packet::ModeExec { csl, csd, .. } => {
                if let Some(m) = self.mode_of(csl, csd) {
                    self.pending_mode = Some(m);
                }
            }
            Packet::Pip { cr3, nr } => self.emit_event(EventKind::Paging { cr3, nr }),
            Packet::Vmcs { base } => self.emit_event(EventKind::Vmcs { base }),
            _ => return false,
        }
        true
    }

    fn handle(&mut self, off: u64, p: Packet) {
        match p {
            Packet::Psb => return self.psb(off),
            Packet::Ovf => return self.ovf(),
            _ => {}
        }
        if self.state == State::NoSync || self.middle_packet(p) {
            return;
        }
        match p {
            // Applied by `middle_packet` above.
            Packet::ModeExec { .. } | Packet::Pip { .. } | Packet::Vmcs { .. } => {}
            Packet::ShortTnt(t) | Packet::LongTnt(t) => self.tnt(t),
            Packet::Tip(pl) => {
                let Some(t) = self.ip_of(pl) else {
                    if self.state == State::Enabled {
                        self.error(
                            FlowErrorKind::UnexpectedPacket("tip without ip"),
                            Some(self.ip),
                        );
                    }
                    return;
                };
                self.tip(t);
            }
            Packet::TipPge(pl) => {
                let Some(t) = self.ip_of(pl) else {
                    self.error(FlowErrorKind::UnexpectedPacket("tip.pge without ip"), None);
                    return;
                };
                if let Some(o) = self.ovf_pending.take() {
                    let _ = o;
                    self.emit_event(EventKind::Overflow { resume: None });
                }
                self.tnt_count = 0;
                self.apply_pending_mode();
                self.emit_event(EventKind::Enabled { ip: t });
                self.state = State::Enabled;
                self.ip = t;
            }
            Packet::TipPgd(pl) => {
                let t = if pl.compression == crate::packet::IpCompression::Suppressed {
                    None
                } else {
                    self.ip_of(pl)
                };
                if self.ovf_pending.take().is_some() {
                    self.emit_event(EventKind::Overflow { resume: None });
                    if !(self.cfg.errata.apl11 || self.cfg.errata.skd010) {
                        // Only a FUP or TIP.PGE may resolve an overflow (§3.8).
                        self.error(FlowErrorKind::UnexpectedPacket("tip.pgd after overflow"), t);
                        return;
                    }
                    // APL11: an OVF may be followed by TIP.PGD (SKD010: its FUP was dropped and
                    // tracing stopped since); continue disabled.
                    self.emit_event(EventKind::Disabled {
                        ip: t,
                        asynchronous: false,
                    });
                    self.state = State::Disabled;
                    return;
                }
                if self.state == State::Enabled {
                    self.sync_disable(t);
                } else if self.state == State::Lost {
                    self.state = State::Disabled;
                }
            }
            Packet::Fup(pl) => {
                let Some(x) = self.ip_of(pl) else { return };
                self.fup(x);
            }
            Packet::ModeTsx { intx, abort } => {
                let kind = EventKind::Tsx {
                    ip: None,
                    in_tx: intx,
                    abort,
                };
                if self.state == State::Enabled {
                    self.claim(kind);
                } else {
                    self.emit_event(kind);
                }
            }
            Packet::TraceStop => {
                self.emit_event(EventKind::Stop);
                if self.state == State::Enabled {
                    self.state = State::Disabled;
                }
            }
            Packet::Ptw { payload, ip, .. } => {
                if ip {
                    self.claim(EventKind::Ptwrite { ip: None, payload });
                } else {
                    let at = if self.state == State::Enabled {
                        self.walk_to_ptwrite()
                    } else {
                        None
                    };
                    self.emit_event(EventKind::Ptwrite { ip: at, payload });
                }
            }
            Packet::Exstop { ip } => {
                if ip {
                    self.claim(EventKind::Exstop { ip: None });
                } else {
                    self.emit_event(EventKind::Exstop { ip: None });
                }
            }
            Packet::Mwait { hints, ext } => self.claim(EventKind::Mwait {
                ip: None,
                hints,
                ext,
            }),
            Packet::Pwre {
                hw,
                state,
                substate,
            } => self.emit_event(EventKind::PowerEntry {
                state,
                substate,
                hw,
            }),
            Packet::Pwrx {
                last,
                deepest,
                wake,
            } => self.emit_event(EventKind::PowerExit {
                last,
                deepest,
                wake,
            }),
            Packet::Bep { ip } => {
                if ip {
                    self.claim(EventKind::PebsBlock { ip: None });
                } else {
                    self.emit_event(EventKind::PebsBlock { ip: None });
                }
            }
            Packet::Cfe { ip, kind, vector } => {
                if ip {
                    self.claim(EventKind::Cfe {
                        ip: None,
                        kind,
                        vector,
                    });
                } else {
                    self.emit_event(EventKind::Cfe {
                        ip: None,
                        kind,
                        vector,
                    });
                }
            }
            Packet::Evd { kind, payload } => self.emit_event(EventKind::Evd { kind, payload }),
            Packet::PsbEnd => {}
            // Handled by `next_packet` / above.
            Packet::Psb
            | Packet::Ovf
            | Packet::Pad
            | Packet::Mnt { .. }
            | Packet::Bip { .. }
            | Packet::Bbp { .. }
            | Packet::Tsc { .. }
            | Packet::Tma { .. }
            | Packet::Mtc { .. }
            | Packet::Cyc { .. }
            | Packet::Cbr { .. } => {}
        }
    }

    fn claim(&mut self, kind: EventKind) {
        if self.claims.len() >= MAX_CLAIMS {
            let (off, k) = self.claims.remove(0);
            self.out.push_back(Seg::Event(Box::new(Event {
                offset: off,
                time: self.time.now(),
                kind: k,
            })));
            self.stats.events += 1;
        }
        self.claims.push((self.cur_offset, kind));
    }

    /// Emits the waiting events without an IP (their FUP never came).
    fn flush_claims(&mut self) {
        for (off, k) in std::mem::take(&mut self.claims) {
            self.out.push_back(Seg::Event(Box::new(Event {
                offset: off,
                time: self.time.now(),
                kind: k,
            })));
            self.stats.events += 1;
        }
    }

    // ----------------------------------------------------------------------------------------
    // PSB+ and OVF

    fn psb(&mut self, off: u64) {
        // The processor resets its Last IP and RET-compression history at a PSB.
        self.last_ip.reset();
        self.ret.clear();
        self.flush_claims();
        self.tnt_count = 0;
        self.tnt_bits = 0;
        self.pushback = None;
        let mut fup = None;
        let mut mode = None;
        let mut pip = None;
        let mut vmcs = None;
        let mut tsx = None;
        let mut ovf_inside = false;
        loop {
            let Some((_, p)) = self.next_packet() else {
                if self.state == State::NoSync && !self.eof {
                    return; // invalid packet inside PSB+: already reported
                }
                break;
            };
            match p {
                Packet::PsbEnd => break,
                Packet::Fup(pl) => fup = self.ip_of(pl),
                Packet::ModeExec { csl, csd, .. } => mode = self.mode_of(csl, csd),
                Packet::ModeTsx { intx, abort } => tsx = Some((intx, abort)),
                Packet::Pip { cr3, nr } => pip = Some((cr3, nr)),
                Packet::Vmcs { base } => vmcs = Some(base),
                Packet::Ovf => {
                    ovf_inside = true;
                    break;
                }
                other => {
                    self.cur_offset = off;
                    self.emit_event(EventKind::Error {
                        kind: FlowErrorKind::UnexpectedPacket(other.name()),
                        ip: None,
                    });
                    break;
                }
            }
        }
        self.cur_offset = off;
        // BDM70: a PSB+ right before a TIP.PGE may hold a FUP although tracing is off. libipt
        // checks only while it believes tracing is off; checking in every state keeps a decoder
        // started at this PSB in agreement with the full decode (a TIP.PGE cannot follow while
        // tracing is on, so the full decode was wrong to think it was).
        let bdm70 =
            fup.is_some() && !ovf_inside && self.cfg.errata.bdm70 && self.tip_pge_follows_psbend();
        if self.ovf_pending.take().is_some() {
            self.emit_event(EventKind::Overflow { resume: None });
        }
        if let (Some(x), State::Enabled) = (fup, self.state) {
            // In sync: the PSB+ FUP is the current IP; reach it without trace.
            if let Walk::Failed = self.walk_to_ip(x) {
                // Reported; the PSB+ state below resynchronises anyway.
            }
        }
        if bdm70 {
            fup = None;
        }
        // A PSB+ without MODE.Exec means tracing is off and a MODE.Exec will precede the next
        // TIP.PGE; falling back to the configured mode keeps a decode started at this PSB
        // identical to the full decode.
        self.mode = mode.unwrap_or(self.cfg.default_mode);
        self.pending_mode = None;
        self.emit_event(EventKind::Psb {
            ip: fup,
            mode: self.mode,
        });
        if let Some(base) = vmcs {
            self.emit_event(EventKind::Vmcs { base });
        }
        if let Some((cr3, nr)) = pip {
            self.emit_event(EventKind::Paging { cr3, nr });
        }
        if let Some((in_tx, abort)) = tsx {
            if in_tx || abort {
                self.emit_event(EventKind::Tsx {
                    ip: None,
                    in_tx,
                    abort,
                });
            }
        }
        match fup {
            Some(x) => {
                self.state = State::Enabled;
                self.ip = x;
            }
            None => self.state = State::Disabled,
        }
        if ovf_inside {
            self.ovf();
        }
    }

    fn ovf(&mut self) {
        self.flush_claims();
        self.tnt_count = 0;
        self.ret.clear();
        self.last_ip.reset();
        self.pending_mode = None;
        self.ovf_pending = Some(self.cur_offset);
        // Instructions cannot be walked until the trace says where execution resumed.
        self.state = State::Disabled;
    }

    // ----------------------------------------------------------------------------------------
    // Flow packets

    fn tnt(&mut self, t: Tnt) {
        match self.state {
            State::Enabled => {}
            State::Disabled => {
                if self.ovf_pending.take().is_some() {
                    self.emit_event(EventKind::Overflow { resume: None });
                }
                self.error(FlowErrorKind::UnexpectedPacket("tnt while disabled"), None);
                return;
            }
            _ => return,
        }
        let count = t.count as u32;
        if count == 0 || count > 47 {
            return;
        }
        if self.tnt_count + count > 64 {
            self.tnt_count = 0;
        }
        self.tnt_bits = (self.tnt_bits << count) | (t.bits & ((1u64 << count) - 1));
        self.tnt_count += count;
        // The bits are walked block by block by the caller of `fill` (`tnt_step`).
        self.tnt_walked = 0;
    }

    #[inline(always)]
    fn pop_bit(&mut self) -> bool {
        self.tnt_count -= 1;
        (self.tnt_bits >> self.tnt_count) & 1 != 0
    }

    /// The block at `ip`: through the successor link of the previous step when it is valid.
    #[inline(always)]
    fn cur_block(&mut self) -> u32 {
        let n = self.next_blk;
        if let Some(b) = self.cache.blocks.get(n as usize) {
            if b.start == self.ip && b.mode == self.mode {
                return n;
            }
        }
        self.cache.get(self.image, self.ip, self.mode)
    }

    /// One block of the walk while TNT bits are pending (`walking_tnt()`): stops right after the
    /// block's last instruction. Returns the block's index when all of it is the step's output
    /// (counted; the caller hands it out or queues it); anything else (events, split runs) is
    /// queued and `None` returned.
    ///
    /// Only the frequent block ends are handled here, so that this stays small enough to be
    /// inlined into the consumer's loop; the rest is in [`Self::tnt_step_rare`].
    #[inline(always)]
    fn tnt_step(&mut self) -> Option<u32> {
        let idx = self.cur_block();
        self.next_blk = u32::MAX;
        let b = &self.cache.blocks[idx as usize];
        let n = b.n;
        self.tnt_walked += n as u64;
        if self.tnt_walked > self.cfg.max_walk {
            if self.rec_key != 0 {
                self.abort_path();
            }
            self.runaway();
            return None;
        }
        // The common arms read only the fields they need from the cached block and follow its
        // successor link: no copy of the whole block, no second lookup to build the output.
        let mut elem = idx;
        let (which, link) = match b.term {
            Term::Insn(InsnClass::CondBranch) => {
                self.tnt_count -= 1;
                let taken = (self.tnt_bits >> self.tnt_count) & 1 != 0;
                self.ip = if taken { b.target } else { b.next };
                self.tnt_walked = 0;
                let link = b.succ[taken as usize];
                if self.tnt_count == 0 {
                    // The walk stops here; keep a known link for the next packet's walk, but
                    // do not decode ahead.
                    self.next_blk = link;
                    self.n_insns += n as u64;
                    self.n_runs += 1;
                    if self.rec_key != 0 {
                        self.cache.paths.elems.push(idx);
                        self.finish_path(self.ip, link, 0, 0);
                    }
                    return Some(idx);
                }
                (taken as usize, link)
            }
            Term::Insn(InsnClass::DirectJump) => {
                self.ip = b.target;
                (1, b.succ[1])
            }
            Term::Insn(InsnClass::DirectCall) => {
                let (next, target, link) = (b.next, b.target, b.succ[1]);
                if target != next {
                    self.ret.push(next);
                    elem |= PATH_PUSH;
                }
                self.ip = target;
                (1, link)
            }
            Term::Insn(InsnClass::Other | InsnClass::Special | InsnClass::Ptwrite)
            | Term::Limit => {
                self.ip = b.next;
                (0, b.succ[0])
            }
            _ => {
                if self.rec_key != 0 {
                    // The recorded walk ends before this block, as it stood before this step.
                    self.finish_path(self.ip, idx, self.tnt_count, self.tnt_walked - n as u64);
                }
                return self.tnt_step_rare(idx);
            }
        };
        if self.rec_key != 0 {
            self.record_elem(elem);
        }
        self.next_blk = if link != u32::MAX {
            link
        } else {
            self.cache.succ(self.image, idx, which, self.ip)
        };
        self.n_insns += n as u64;
        self.n_runs += 1;
        Some(idx)
    }

    /// Appends a block to the recording (or drops a recording that grew too long).
    #[inline(always)]
    fn record_elem(&mut self, elem: u32) {
        let elems = &mut self.cache.paths.elems;
        if elems.len() - self.rec_at as usize >= MAX_PATH_LEN {
            self.abort_path();
        } else {
            elems.push(elem);
        }
    }

    /// The block ends [`Self::tnt_step`] does not handle inline.
    #[inline(never)]
    fn tnt_step_rare(&mut self, idx: u32) -> Option<u32> {
        let b: CachedBlock = self.cache.blocks[idx as usize];
        match b.term {
            Term::Insn(InsnClass::Return) => self.compressed_ret(idx),
            Term::NoCode | Term::BadInsn => {
                self.emit_run(idx, 0, b.n);
                self.no_code(b);
                None
            }
            // Every class `tnt_step` leaves needs a TIP (and `Limit` never gets here).
            Term::Insn(c) => self.deferred_tip_step(idx, c),
            Term::Limit => {
                self.ip = b.next;
                self.n_insns += b.n as u64;
                self.n_runs += 1;
                Some(idx)
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn runaway(&mut self) {
        self.error(FlowErrorKind::RunawayWalk, Some(self.ip));
    }

    /// A RET while TNT bits are pending: it is compressed (§3.3).
    #[inline(never)]
    fn compressed_ret(&mut self, idx: u32) -> Option<u32> {
        let (n, last_ip) = {
            let b = &self.cache.blocks[idx as usize];
            (b.n, b.last_ip)
        };
        let taken = self.pop_bit();
        let target = if taken { self.ret.pop() } else { None };
        let Some(t) = target else {
            self.emit_run(idx, 0, n - 1);
            self.error(FlowErrorKind::BadRetCompression, Some(last_ip));
            return None;
        };
        self.ip = t;
        self.tnt_walked = 0;
        self.n_insns += n as u64;
        self.n_runs += 1;
        Some(idx)
    }

    /// A branch that needs a TIP while TNT bits are pending: a deferred TIP (§3.4), the next
    /// packet must be its TIP.
    #[inline(never)]
    fn deferred_tip_step(&mut self, idx: u32, c: InsnClass) -> Option<u32> {
        let b: CachedBlock = self.cache.blocks[idx as usize];
        self.emit_run(idx, 0, b.n - 1);
        self.ip = b.last_ip;
        if let Walk::Failed = self.deferred_tip(idx, &b, c) {
            // The trace ended (or the error was reported): the rest of the bits are not walked.
            self.tnt_count = 0;
            return None;
        }
        if self.state != State::Enabled {
            if self.tnt_count > 0 {
                self.error(FlowErrorKind::UnexpectedTnt, None);
            }
            return None;
        }
        self.tnt_walked = 0;
        None
    }

    fn no_code(&mut self, b: CachedBlock) {
        let kind = if b.term == Term::NoCode {
            FlowErrorKind::NoCode
        } else {
            FlowErrorKind::BadInsn
        };
        self.error(kind, Some(b.next));
    }

    /// Reads the TIP for the branch that ends block `idx` (the decoder stands at that branch, not
    /// yet emitted). Middle packets (MODE.Exec, PIP, VMCS) are applied on the way.
    fn deferred_tip(&mut self, idx: u32, b: &CachedBlock, c: InsnClass) -> Walk {
        loop {
            let Some((off, p)) = self.next_packet() else {
                return Walk::Failed;
            };
            if self.middle_packet(p) {
                continue;
            }
            match p {
                Packet::Tip(pl) => {
                    let Some(t) = self.ip_of(pl) else {
                        self.error(FlowErrorKind::MissingTip("tip without ip"), Some(b.last_ip));
                        return Walk::Failed;
                    };
                    self.take_branch(idx, b, c, t);
                    return Walk::Done;
                }
                Packet::TipPgd(pl) => {
                    let t = if pl.compression == crate::packet::IpCompression::Suppressed {
                        None
                    } else {
                        self.ip_of(pl)
                    };
                    self.emit_run(idx, b.n - 1, 1);
                    if c == InsnClass::IndirectCall || c == InsnClass::DirectCall {
                        self.ret.push(b.next);
                    }
                    self.emit_event(EventKind::Disabled {
                        ip: t,
                        asynchronous: false,
                    });
                    self.state = State::Disabled;
                    return Walk::Done;
                }
                other => {
                    self.pushback = Some((off, other));
                    self.error(FlowErrorKind::MissingTip(other.name()), Some(b.last_ip));
                    return Walk::Failed;
                }
            }
        }
    }

    /// Emits the branch at the end of block `idx` and continues at `target`.
    fn take_branch(&mut self, idx: u32, b: &CachedBlock, c: InsnClass, target: u64) {
        self.emit_run(idx, b.n - 1, 1);
        if c == InsnClass::IndirectCall {
            self.ret.push(b.next);
        }
        self.ip = target;
        self.apply_pending_mode();
    }

    /// A TIP: walk to the indirect branch, uncompressed RET or far transfer it belongs to.
    fn tip(&mut self, target: u64) {
        match self.state {
            State::Enabled => {}
            State::Disabled if self.ovf_pending.is_some() && !self.cfg.errata.skd010 => {
                self.ovf_pending = None;
                self.emit_event(EventKind::Overflow { resume: None });
                self.error(
                    FlowErrorKind::UnexpectedPacket("tip after overflow"),
                    Some(target),
                );
                return;
            }
            State::Disabled if self.ovf_pending.is_some() => {
                // SKD010: the FUP after OVF is missing; resume at the TIP.
                self.ovf_pending = None;
                self.emit_event(EventKind::Overflow {
                    resume: Some(target),
                });
                self.apply_pending_mode();
                self.state = State::Enabled;
                self.ip = target;
                return;
            }
            State::Disabled => {
                self.error(FlowErrorKind::UnexpectedPacket("tip while disabled"), None);
                return;
            }
            _ => return,
        }
        let mut walked = 0u64;
        loop {
            let idx = self.cache.get(self.image, self.ip, self.mode);
            let b: CachedBlock = self.cache.blocks[idx as usize];
            walked += b.n as u64;
            if walked > self.cfg.max_walk {
                self.error(FlowErrorKind::RunawayWalk, Some(self.ip));
                return;
            }
            match b.term {
                Term::Insn(InsnClass::Return) => {
                    self.emit_run(idx, 0, b.n);
                    // An uncompressed RET still pops, so later compressed RETs line up.
                    self.ret.pop();
                    self.ip = target;
                    self.apply_pending_mode();
                    return;
                }
                Term::Insn(c) if c.needs_tip() => {
                    self.emit_run(idx, 0, b.n - 1);
                    self.take_branch(idx, &b, c, target);
                    return;
                }
                Term::Insn(InsnClass::CondBranch) => {
                    self.emit_run(idx, 0, b.n - 1);
                    self.ip = b.last_ip;
                    self.error(FlowErrorKind::UnexpectedTip, Some(b.last_ip));
                    return;
                }
                Term::Insn(InsnClass::DirectJump) => {
                    self.emit_run(idx, 0, b.n);
                    self.ip = b.target;
                }
                Term::Insn(InsnClass::DirectCall) => {
                    self.emit_run(idx, 0, b.n);
                    if b.target != b.next {
                        self.ret.push(b.next);
                    }
                    self.ip = b.target;
                }
                Term::Insn(_) | Term::Limit => {
                    self.emit_run(idx, 0, b.n);
                    self.ip = b.next;
                }
                Term::NoCode | Term::BadInsn => {
                    self.emit_run(idx, 0, b.n);
                    self.no_code(b);
                    return;
                }
            }
        }
    }

    /// Walks until `ip == x` through instructions that need no trace; `x` itself is not emitted.
    fn walk_to_ip(&mut self, x: u64) -> Walk {
        let mut walked = 0u64;
        loop {
            if self.ip == x {
                return Walk::Done;
            }
            let idx = self.cache.get(self.image, self.ip, self.mode);
            let b: CachedBlock = self.cache.blocks[idx as usize];
            if b.n > 0 && x > b.start && x <= b.last_ip {
                let lens = self.cache.lens_of(&b);
                let mut ip = b.start;
                let mut k = 0u32;
                while ip < x && (k as usize) < lens.len() {
                    ip = ip.wrapping_add(lens[k as usize] as u64);
                    k += 1;
                }
                if ip == x {
                    self.emit_run(idx, 0, k);
                    self.ip = x;
                    return Walk::Done;
                }
            }
            walked += b.n as u64;
            if walked > self.cfg.max_walk {
                self.error(FlowErrorKind::RunawayWalk, Some(self.ip));
                return Walk::Failed;
            }
            match b.term {
                Term::Insn(InsnClass::DirectJump) => {
                    self.emit_run(idx, 0, b.n);
                    self.ip = b.target;
                }
                Term::Insn(InsnClass::DirectCall) => {
                    self.emit_run(idx, 0, b.n);
                    if b.target != b.next {
                        self.ret.push(b.next);
                    }
                    self.ip = b.target;
                }
                Term::Insn(c) if c.is_branch() => {
                    self.emit_run(idx, 0, b.n - 1);
                    self.ip = b.last_ip;
                    self.error(FlowErrorKind::EventIpUnreachable(x), Some(b.last_ip));
                    return Walk::Failed;
                }
                Term::Insn(_) | Term::Limit => {
                    self.emit_run(idx, 0, b.n);
                    self.ip = b.next;
                }
                Term::NoCode | Term::BadInsn => {
                    self.emit_run(idx, 0, b.n);
                    self.no_code(b);
                    return Walk::Failed;
                }
            }
        }
    }

    /// Looks ahead (without emitting) for the first block end `bind` accepts, following only
    /// instructions that need no trace. Returns the blocks to emit, or `None` if a branch that
    /// needs trace (or missing code) comes first.
    fn probe(&mut self, bind: impl Fn(&CachedBlock, InsnClass) -> bool) -> Option<Vec<u32>> {
        let mut path = Vec::new();
        let mut ip = self.ip;
        let mut walked = 0u64;
        loop {
            let idx = self.cache.get(self.image, ip, self.mode);
            let b = self.cache.blocks[idx as usize];
            walked += b.n as u64;
            if walked > self.cfg.max_walk {
                return None;
            }
            path.push(idx);
            match b.term {
                Term::Insn(c) if bind(&b, c) => return Some(path),
                Term::Insn(InsnClass::DirectJump) | Term::Insn(InsnClass::DirectCall) => {
                    ip = b.target
                }
                Term::Insn(c) if c.is_branch() => return None,
                Term::Insn(_) | Term::Limit => ip = b.next,
                Term::NoCode | Term::BadInsn => return None,
            }
        }
    }

    /// Emits a probed path (pushing direct calls on the way); returns the last block.
    fn commit(&mut self, path: &[u32]) -> Option<CachedBlock> {
        let mut last = None;
        for &idx in path {
            let b = self.cache.blocks[idx as usize];
            self.emit_run(idx, 0, b.n);
            if b.term == Term::Insn(InsnClass::DirectCall) && b.target != b.next {
                self.ret.push(b.next);
            }
            last = Some(b);
        }
        last
    }

    /// A TIP.PGD without FUP: tracing stopped at the next instruction that can do that (§3.5).
    fn sync_disable(&mut self, t: Option<u64>) {
        let path = match t {
            None if self.cfg.errata.skl014 && !self.cfg.ip_filter.is_empty() => {
                // SKL014: a direct JMP/CALL whose target leaves the filter may give a TIP.PGD
                // without IP.
                let filter = std::mem::take(&mut self.cfg.ip_filter);
                let path = self.probe(|b, c| {
                    c.can_disable_suppressed()
                        || (matches!(c, InsnClass::DirectJump | InsnClass::DirectCall)
                            && !filter
                                .iter()
                                .any(|&(lo, hi)| lo <= b.target && b.target <= hi))
                });
                self.cfg.ip_filter = filter;
                path
            }
            None => self.probe(|_, c| c.can_disable_suppressed()),
            Some(to) => self.probe(|b, c| match c {
                InsnClass::Other | InsnClass::Ptwrite | InsnClass::Special => false,
                InsnClass::DirectJump | InsnClass::DirectCall => b.target == to,
                _ => true,
            }),
        };
        // No instruction reachable without trace can have disabled tracing, so it was disabled
        // before any of them ran: e.g. a TIP.PGE immediately followed by TIP.PGD (a tracer that
        // enables and disables at once, as in Griffin recordings). Disable right here.
        if let Some(path) = path {
            if let Some(b) = self.commit(&path) {
                if b.term == Term::Insn(InsnClass::IndirectCall) {
                    self.ret.push(b.next);
                }
            }
        }
        self.tnt_count = 0;
        self.emit_event(EventKind::Disabled {
            ip: t,
            asynchronous: false,
        });
        self.state = State::Disabled;
    }

    /// PTW without IP: binds to the next PTWRITE instruction.
    fn walk_to_ptwrite(&mut self) -> Option<u64> {
        let path = self.probe(|_, c| c == InsnClass::Ptwrite)?;
        let b = self.commit(&path)?;
        self.ip = b.next;
        Some(b.last_ip)
    }

    /// A FUP outside PSB+.
    fn fup(&mut self, x: u64) {
        if !self.claims.is_empty() {
            let claims = std::mem::take(&mut self.claims);
            let mut async_follows = false;
            if self.state == State::Enabled {
                // BDM64: the branch target logged just before a TSX abort may be wrong; when the
                // abort's FUP cannot be reached from where the trace left us, it says where
                // execution really was, so nothing is walked to get there. (libipt applies this
                // when the last instruction was a branch, which is where this lazy decoder stands
                // at every packet boundary.)
                let bdm64 = self.cfg.errata.bdm64
                    && claims
                        .iter()
                        .any(|(_, k)| matches!(k, EventKind::Tsx { abort: true, .. }))
                    && !self.reaches_without_trace(x);
                if !bdm64 {
                    if let Walk::Failed = self.walk_to_ip(x) {
                        self.state = State::Enabled;
                    }
                }
                self.ip = x;
                // PTW's FUP names the PTWRITE itself, which has executed: emit it first.
                if claims
                    .iter()
                    .any(|(_, k)| matches!(k, EventKind::Ptwrite { .. }))
                {
                    let _ = self.walk_to_ptwrite();
                }
            }
            for (off, mut k) in claims {
                match &mut k {
                    EventKind::Tsx { ip, abort, .. } => {
                        *ip = Some(x);
                        async_follows |= *abort;
                    }
                    EventKind::Ptwrite { ip, .. }
                    | EventKind::Exstop { ip }
                    | EventKind::Mwait { ip, .. }
                    | EventKind::PebsBlock { ip } => *ip = Some(x),
                    EventKind::Cfe { ip, .. } => {
                        *ip = Some(x);
                        async_follows = true;
                    }
                    _ => {}
                }
                self.out.push_back(Seg::Event(Box::new(Event {
                    offset: off,
                    time: self.time.now(),
                    kind: k,
                })));
                self.stats.events += 1;
            }
            if async_follows && self.state == State::Enabled {
                self.async_target(x, true);
            }
            return;
        }
        if self.ovf_pending.is_some() && self.cfg.errata.apl12 && self.apl12_tracing_is_off() {
            // APL12: a FUP after OVF although tracing is off; ignore it.
            self.ovf_pending = None;
            self.emit_event(EventKind::Overflow { resume: None });
            self.state = State::Disabled;
            return;
        }
        if self.ovf_pending.take().is_some() {
            // The overflow resolved with tracing on: resume at the FUP IP (not a branch).
            self.emit_event(EventKind::Overflow { resume: Some(x) });
            self.apply_pending_mode();
            self.state = State::Enabled;
            self.ip = x;
            return;
        }
        if self.state != State::Enabled {
            return;
        }
        self.tnt_count = 0;
        if let Walk::Failed = self.walk_to_ip(x) {
            // Reported; the FUP tells where execution was, so carry on from there.
            self.state = State::Enabled;
            self.ip = x;
        }
        self.async_target(x, false);
    }

    /// After an asynchronous FUP at `x`: the TIP or TIP.PGD that completes the transfer.
    fn async_target(&mut self, x: u64, optional: bool) {
        loop {
            let Some((off, p)) = self.next_packet() else {
                return;
            };
            if self.middle_packet(p) {
                continue;
            }
            match p {
                Packet::Tip(pl) => {
                    let Some(t) = self.ip_of(pl) else {
                        self.error(FlowErrorKind::UnexpectedPacket("tip without ip"), Some(x));
                        return;
                    };
                    self.emit_event(EventKind::AsyncBranch { from: x, to: t });
                    self.apply_pending_mode();
                    self.ip = t;
                    self.state = State::Enabled;
                    return;
                }
                Packet::TipPgd(pl) => {
                    let t = if pl.compression != crate::packet::IpCompression::Suppressed {
                        self.ip_of(pl)
                    } else {
                        None
                    };
                    if self.cfg.errata.skd022 && self.ip == x && self.is_vm_entry(x) {
                        // SKD022: a VM entry that clears TraceEn sends FUP + TIP.PGD; the
                        // VMLAUNCH/VMRESUME at the FUP ran and disabled tracing synchronously.
                        self.sync_disable(t);
                        return;
                    }
                    self.emit_event(EventKind::Disabled {
                        ip: Some(x),
                        asynchronous: true,
                    });
                    self.state = State::Disabled;
                    return;
                }
                other => {
                    self.pushback = Some((off, other));
                    if !optional {
                        self.emit_event(EventKind::Error {
                            kind: FlowErrorKind::LoneFup,
                            ip: Some(x),
                        });
                    }
                    return;
                }
            }
        }
    }
}

/// How far the erratum lookaheads read.
const LOOKAHEAD_PACKETS: usize = 1 << 12;

/// Lookaheads and checks of the erratum workarounds (see [`super::errata`]). They read packets
/// with a copy of the packet decoder, so the decoder's own position never moves.
impl FlowDecoder<'_> {
    /// The packets after the current position, as far as they decode, at most
    /// [`LOOKAHEAD_PACKETS`] of them (a scan that finds no answer counts as "cannot tell", so a
    /// trace of nothing but timing packets after each OVF cannot make decoding quadratic).
    fn lookahead(&self) -> impl Iterator<Item = Packet> + '_ {
        let mut pkt = self.pkt.clone();
        std::iter::from_fn(move || match pkt.next_packet() {
            Some(Ok((_, p))) => Some(p),
            _ => None,
        })
        .take(LOOKAHEAD_PACKETS)
    }

    /// BDM70: whether a TIP.PGE follows (the PSBEND just read) with only PAD, timing, PIP, MODE,
    /// VMCS or MNT packets in between (libipt's list).
    fn tip_pge_follows_psbend(&self) -> bool {
        for p in self.lookahead() {
            match p {
                Packet::TipPge(_) => return true,
                Packet::Pad
                | Packet::Tsc { .. }
                | Packet::Cbr { .. }
                | Packet::PsbEnd
                | Packet::Pip { .. }
                | Packet::ModeExec { .. }
                | Packet::ModeTsx { .. }
                | Packet::Vmcs { .. }
                | Packet::Tma { .. }
                | Packet::Mtc { .. }
                | Packet::Cyc { .. }
                | Packet::Mnt { .. } => {}
                _ => return false,
            }
        }
        false
    }

    /// APL12: whether the packets after an OVF's FUP show that tracing is in fact off: a TIP.PGE
    /// or TraceStop before any TNT, TIP or TIP.PGD, or a PSB+ without FUP. The end of the trace,
    /// another OVF or an undecodable packet cannot tell, which keeps the FUP (libipt's rule).
    fn apl12_tracing_is_off(&self) -> bool {
        let mut in_psb = false;
        for p in self.lookahead() {
            match p {
                Packet::TipPge(_) | Packet::TraceStop if !in_psb => return true,
                Packet::ShortTnt(_) | Packet::LongTnt(_) | Packet::Tip(_) | Packet::TipPgd(_) => {
                    return false;
                }
                Packet::Psb => in_psb = true,
                Packet::Fup(_) if in_psb => return false,
                Packet::PsbEnd => return in_psb,
                Packet::Ovf => return false,
                _ => {}
            }
        }
        false
    }

    /// SKD007: the CYC at `off` (just decoded, 2 bytes) is the start of a CYC cut off by an OVF
    /// when its second byte is `02` and `F3` follows: then the decoder is moved to that `02`, so
    /// the next packet read is the OVF.
    fn skd007_ovf_in_cyc(&mut self, off: u64) -> bool {
        let buf = self.pkt.buffer();
        let end = self.pkt.position();
        let Ok(start) = usize::try_from(off.wrapping_sub(self.pkt_base())) else {
            return false;
        };
        let hit =
            end == start + 2 && buf.get(start + 1) == Some(&0x02) && buf.get(end) == Some(&0xf3);
        if hit {
            self.pkt.set_position(start + 1);
        }
        hit
    }

    /// SKZ84: a TMA with reserved bits set is corrupt and followed by one bogus byte; skip the
    /// 8 bytes and ignore it (libipt's packet decoder does the same).
    fn skz84_skip_tma(&mut self, e: &PacketError) -> bool {
        let PacketError::Invalid { offset, .. } = *e else {
            return false;
        };
        let Ok(start) = usize::try_from(offset.wrapping_sub(self.pkt_base())) else {
            return false;
        };
        let buf = self.pkt.buffer();
        let hit = buf.get(start..start + 2) == Some(&[0x02, 0x73][..]) && buf.len() >= start + 8;
        if hit {
            self.pkt.set_position(start + 8);
        }
        hit
    }

    /// The trace offset of buffer position 0 (packet offsets are positions plus this base).
    fn pkt_base(&self) -> u64 {
        self.pkt.offset().wrapping_sub(self.pkt.position() as u64)
    }

    /// SKD022: whether the instruction at `ip` is VMLAUNCH or VMRESUME.
    fn is_vm_entry(&self, ip: u64) -> bool {
        let mut bytes = [0u8; 16];
        let n = self.image.read(ip, &mut bytes);
        let bits = match self.mode {
            ExecMode::Bits16 => 16,
            ExecMode::Bits32 => 32,
            _ => 64,
        };
        let insn =
            iced_x86::Decoder::with_ip(bits, &bytes[..n], ip, iced_x86::DecoderOptions::NONE)
                .decode();
        matches!(
            insn.mnemonic(),
            iced_x86::Mnemonic::Vmlaunch | iced_x86::Mnemonic::Vmresume
        )
    }

    /// BDM64: whether `x` can be reached from the current IP through instructions that need no
    /// trace, within a short distance (libipt looks 256 instructions ahead).
    fn reaches_without_trace(&mut self, x: u64) -> bool {
        let mut ip = self.ip;
        let mut walked = 0u32;
        while walked < 256 {
            let idx = self.cache.get(self.image, ip, self.mode);
            let b = self.cache.blocks[idx as usize];
            if x >= b.start && x <= b.last_ip && b.n > 0 {
                return true;
            }
            walked += b.n.max(1);
            match b.term {
                Term::Insn(InsnClass::DirectJump) | Term::Insn(InsnClass::DirectCall) => {
                    ip = b.target
                }
                Term::Insn(c) if c.is_branch() => return false,
                Term::Insn(_) | Term::Limit => ip = b.next,
                Term::NoCode | Term::BadInsn => return false,
            }
        }
        false
    }
}

/// Class of the last instruction of a run.
#[inline]
fn run_class(b: &CachedBlock, skip: u32, count: u32) -> InsnClass {
    match b.term {
        Term::Insn(c) if skip + count == b.n => c,
        _ => InsnClass::Other,
    }
}
