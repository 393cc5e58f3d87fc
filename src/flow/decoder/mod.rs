//! The flow decoder state machine.

use super::cache::{BlockCache, CachedBlock, MAX_PATH_LEN, PATH_PUSH, PathSlot, Term};
use super::class::InsnClass;
use super::{Event, EventKind, FlowConfig, FlowErrorKind, Insn, Item};
use crate::image::Image;
use crate::packet::time::TimeState;
use crate::packet::{
    ExecMode, IpCompression, IpPayload, LastIp, Packet, PacketDecoder, PacketError, Tnt,
};
use std::collections::VecDeque;

// A separate child module (it drives the private hot path below): see its docs.
mod fast;
mod filtered;
mod lookahead;
mod query;
mod walk;
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
    /// The next event of [`FlowDecoder::events`] (kept there, in order, so that a `Seg` stays
    /// small to move and an event costs no allocation: qemu's trace has one every 125
    /// instructions, three per PSB+).
    Event,
}

/// One piece of output of [`FlowDecoder::next_block_with`]'s steps, before the filter sees it.
enum Out {
    /// All of a cached block, already counted.
    Whole(u32),
    /// A run from the queue.
    Run(Run),
    /// An event from the queue.
    Event(Event),
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
    /// Changes of address space (a PSB opening another [`ImagePeriod`](crate::image::ImagePeriod)).
    pub image_switches: u64,
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
    // The ring wraps with a compare, not `%`: the depth is a run-time value, so a remainder
    // compiled to a division at every CALL and RET.
    #[inline]
    fn push(&mut self, ip: u64) {
        let cap = self.buf.len();
        self.top = if self.top + 1 >= cap { 0 } else { self.top + 1 };
        if let Some(slot) = self.buf.get_mut(self.top) {
            *slot = ip;
        }
        self.len = (self.len + 1).min(cap);
    }
    #[inline]
    fn pop(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let v = *self.buf.get(self.top)?;
        self.top = if self.top == 0 {
            self.buf.len() - 1
        } else {
            self.top - 1
        };
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
    /// The code of the address space being decoded: `root` itself, or the
    /// [`ImagePeriod`](crate::image::ImagePeriod) of `root` that the last PSB belongs to.
    image: &'a Image,
    /// The image the decoder was given, with its later address spaces (if any).
    root: &'a Image,
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
    /// Instructions [`Self::step_before_tip`] walked since the last packet, towards the branch
    /// of the TIP that comes next (0 when it walked none): the TIP's walk counts them against
    /// the runaway limit, and the branch's block is handed out as the general path would.
    tip_walked: u64,
    /// The fast path consumed CYC or MTC packets since the last other packet (see
    /// [`Self::skip_pads_and_timing`]).
    timed: bool,
    /// The blocks of the last `probe` (kept for its allocation).
    probe_buf: Vec<u32>,
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
    /// The events of the `Seg::Event`s in `out`, in the same order.
    events: VecDeque<Event>,
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
            root: image,
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
            tip_walked: 0,
            timed: false,
            probe_buf: Vec::new(),
            path_pos: 0,
            path_end: 0,
            rec_key: 0,
            rec_at: 0,
            ret: RetStack::new(cfg.ret_stack_depth),
            claims: Vec::new(),
            ovf_pending: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
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
        let (rest_insns, rest_runs) = self.replay_rest();
        self.n_insns -= rest_insns;
        self.n_runs -= rest_runs;
        self.path_pos = self.path_end;
        self.rec_key = 0;
        self.tip_walked = 0;
        self.timed = false;
        self.out.clear();
        self.events.clear();
        self.claims.clear();
        self.ovf_pending = None;
        self.tnt_count = 0;
        self.eof = false;
    }

    /// Decodes from the PSB at `offset` on against the address space it belongs to
    /// ([`Image::at_offset`]). A change of image drops every cached block: the same addresses
    /// hold other code now. Called at a PSB, when nothing decoded is queued (the queue is
    /// filled only once it is empty) and no cached path is being replayed.
    #[cold]
    pub(super) fn enter_period(&mut self, offset: u64) {
        let image = self.root.at_offset(offset);
        if std::ptr::eq(image, self.image) {
            return;
        }
        self.image = image;
        let (rest_insns, rest_runs) = self.replay_rest();
        self.n_insns -= rest_insns;
        self.n_runs -= rest_runs;
        self.path_pos = self.path_end;
        self.rec_key = 0;
        self.next_blk = u32::MAX;
        self.cache.clear();
        self.stats.image_switches += 1;
    }

    /// Offset in the trace of the next packet to be read. Output already queued may come from
    /// packets before it.
    pub fn offset(&self) -> u64 {
        self.pkt.offset()
    }

    /// The instructions and blocks of the path replay in progress not handed out yet: a replay
    /// is counted whole when it starts (`start_path`), these are taken back when it is cut.
    fn replay_rest(&self) -> (u64, u64) {
        let rest = &self.cache.paths.elems[self.path_pos as usize..self.path_end as usize];
        let insns = rest
            .iter()
            .map(|&e| self.cache.blocks[(e & !PATH_PUSH) as usize].n as u64)
            .sum();
        (insns, rest.len() as u64)
    }

    /// Counters so far.
    pub fn stats(&self) -> FlowStats {
        let mut s = self.stats;
        let (rest_insns, rest_runs) = self.replay_rest();
        s.insns = self.n_insns - rest_insns;
        s.runs = self.n_runs - rest_runs;
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
                Out::Event(e) => return Some(BlockItem::Event(e)),
                Out::End => return None,
            }
        }
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
                match seg {
                    Seg::Event => {
                        if let Some(e) = self.events.pop_front() {
                            return Out::Event(e);
                        }
                    }
                    Seg::Run(r) => return Out::Run(r),
                }
                continue;
            }
            if self.walking_tnt() {
                // The hot path: one block per TNT bit (or direct branch), handed out without a
                // trip through the queue.
                if let Some(idx) = self.tnt_step() {
                    return Out::Whole(idx);
                }
                continue;
            }
            if self.state == State::Disabled {
                // A filtered trace re-enables every few hundred instructions: the TIP.PGE
                // without the general packet decoder, when nothing else comes first.
                self.pge_fast_path();
                if !self.out.is_empty() {
                    continue;
                }
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
            Seg::Event => {
                self.out.pop_front();
                self.events.pop_front().map(Item::Event)
            }
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
        let offset = self.cur_offset;
        self.push_event(offset, kind);
    }

    /// [`Self::emit_event`] for the Enabled event of a TIP.PGE, and [`Self::emit_disabled`]
    /// for the Disabled event of a TIP.PGD (after a FUP: `asynchronous`): a filtered trace has
    /// one of each every few hundred instructions. The kind is built where it is queued:
    /// passed by reference to `emit_event`, it was stored in pieces and read back whole, a
    /// store-forwarding stall on every event (5 % of libxdc/foo's profile).
    #[inline(never)]
    fn emit_enabled(&mut self, ip: u64) {
        self.push_event(self.cur_offset, EventKind::Enabled { ip });
    }

    /// See [`Self::emit_enabled`].
    #[inline(never)]
    fn emit_disabled(&mut self, ip: Option<u64>, asynchronous: bool) {
        self.push_event(self.cur_offset, EventKind::Disabled { ip, asynchronous });
    }

    /// Queues an event (counted) behind the output queued so far.
    #[inline(always)]
    fn push_event(&mut self, offset: u64, kind: EventKind) {
        self.stats.events += 1;
        self.out.push_back(Seg::Event);
        self.events.push_back(Event {
            offset,
            time: self.time.now(),
            kind,
        });
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
}

/// Class of the last instruction of a run.
#[inline]
fn run_class(b: &CachedBlock, skip: u32, count: u32) -> InsnClass {
    match b.term {
        Term::Insn(c) if skip + count == b.n => c,
        _ => InsnClass::Other,
    }
}
