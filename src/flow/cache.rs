//! Instruction classification (iced-x86) and the block cache.
//!
//! New code is decoded by the cheap length-and-class decoder ([`super::ild`]) where it can, and by
//! iced-x86 otherwise (see `BlockCache::decode`).
//!
//! A block is a run of instructions that ends at the first instruction whose successor the trace
//! (or a static target) decides: any branch, a far transfer, PTWRITE (PTW packets bind to it), or
//! an instruction that can switch tracing off. Blocks are decoded once and then replayed from the
//! cache: the decoder never runs iced-x86 twice on the same address unless the cache was flushed.

use super::class::InsnClass;
use crate::image::Image;
use crate::packet::ExecMode;
use iced_x86::{Decoder, DecoderError, DecoderOptions, Instruction};

/// Positions the kept section decoder at `ip` (replacing it by a new one for another section or
/// mode); false when nothing is mapped at `ip`.
fn position_decoder<'a>(
    kept: &mut Option<SectionDecoder<'a>>,
    image: &'a Image,
    ip: u64,
    bits: u32,
) -> bool {
    let Some(s) = image.section_at(ip) else {
        return false;
    };
    let data = s.data();
    let reuse = matches!(kept, Some(sd) if sd.addr == s.addr && sd.bits == bits
        && std::ptr::eq(sd.data, data));
    if !reuse {
        *kept = Some(SectionDecoder {
            addr: s.addr,
            bits,
            data,
            dec: Decoder::with_ip(bits, data, s.addr, DecoderOptions::NONE),
        });
    }
    match kept {
        Some(sd) => {
            sd.dec.set_ip(ip);
            sd.dec.set_position((ip - s.addr) as usize).is_ok()
        }
        None => false,
    }
}

/// Bitness for iced-x86.
pub(crate) fn bitness(mode: ExecMode) -> u32 {
    match mode {
        ExecMode::Bits16 => 16,
        ExecMode::Bits32 => 32,
        ExecMode::Bits64 | ExecMode::Invalid => 64,
    }
}

/// How a cached block ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Term {
    /// The last instruction is of this class (counted in the block).
    Insn(InsnClass),
    /// The block reached its length limit; the next instruction is at `next`.
    Limit,
    /// No code is mapped at `next` (the block holds the instructions before it).
    NoCode,
    /// The bytes at `next` do not decode.
    BadInsn,
}

/// One cached block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CachedBlock {
    /// First instruction.
    pub start: u64,
    /// IP of the last instruction (meaningless when `n == 0`).
    pub last_ip: u64,
    /// Fall-through IP after the last instruction (or the IP of the failing instruction for
    /// `NoCode`/`BadInsn`).
    pub next: u64,
    /// Static target of a direct branch (taken target of a conditional one).
    pub target: u64,
    /// Index of the first instruction length in the length arena.
    pub lens_at: u32,
    /// Number of instructions.
    pub n: u32,
    /// How it ends.
    pub term: Term,
    /// Mode it was decoded in.
    pub mode: ExecMode,
    /// Cached indices of the successor blocks: `[fall-through, static target]` (`u32::MAX`
    /// until first used). Following a TNT bit or a direct branch then needs no hash lookup.
    pub succ: [u32; 2],
}

impl CachedBlock {
    /// The return address the block's last instruction pushes onto the RET-compression stack:
    /// a CALL's fall-through, except for a direct CALL to that same address (a zero-length
    /// call, `call $+5`, which reads the IP), not pushed as libipt does not push it
    /// (`tests/flow.rs zero_length_call_is_not_pushed`).
    #[inline(always)]
    pub fn return_address(&self) -> Option<u64> {
        match self.term {
            Term::Insn(InsnClass::DirectCall) if self.target != self.next => Some(self.next),
            Term::Insn(InsnClass::IndirectCall) => Some(self.next),
            _ => None,
        }
    }
}

/// A recorded TNT walk (see [`PathCache`]): what walking the bits `pattern` from block `start`
/// produced, keyed by `(start << 8) | pattern`.
#[derive(Debug, Clone, Copy, Default)]
// 32 bytes, aligned: a slot is a quarter of a cache line and never straddles two (at 40 bytes,
// three slots in eight did, and the table was a fifth larger).
#[repr(C, align(32))]
pub(crate) struct PathSlot {
    /// `(start block << 8) | pattern`, where `pattern` is the pending bits with a stop bit above
    /// them (so never 0); 0 marks an empty slot.
    pub key: u64,
    /// Where the walk left off: the IP of the next block, ...
    pub end_ip: u64,
    /// ... its index when a successor link gave it (`u32::MAX` otherwise), ...
    pub end_blk: u32,
    /// The walked blocks: `path_elems[at .. at + len()]`.
    pub at: u32,
    /// Instructions of all of them (the replay counts them at its start, see
    /// `FlowDecoder::start_path`).
    pub insns: u32,
    /// Number of blocks walked, less one (a walk has 1 to [`MAX_PATH_LEN`] blocks).
    pub len_m1: u8,
    /// ... the number of TNT bits still pending at the end (0 when the walk used them all) ...
    pub end_count: u8,
    /// ... and the instructions walked since the last bit was used (the runaway guard).
    pub end_walked: u16,
}

const _: () = assert!(std::mem::size_of::<PathSlot>() == 32);

impl PathSlot {
    /// Number of blocks walked.
    #[inline(always)]
    pub(crate) fn len(&self) -> u32 {
        self.len_m1 as u32 + 1
    }
}

/// Flag on a path element: the block ends in a direct CALL that pushes its return address.
pub(crate) const PATH_PUSH: u32 = 1 << 31;

/// Slots of the path table at most (direct mapped: a new path replaces an older one in its
/// slot). It starts small, so that a short trace does not pay for clearing a large table.
const PATH_SLOTS: usize = 1 << 13;
const PATH_SLOTS_INITIAL: usize = 1 << 9;

/// Blocks in one recorded path at most (longer walks are not recorded).
pub(crate) const MAX_PATH_LEN: usize = 256;

/// Path elements kept at most before the path cache is cleared (bounds its memory: 256 KiB;
/// paths evicted from their slot leave their elements behind until then).
const PATH_ELEMS_LIMIT: usize = 1 << 16;

/// The TNT-packet outcome cache (libxdc's idea, kept exact): for a block and the bits of one
/// TNT-8 packet, the blocks the walk hands out and the state it ends in. A walk is a function of
/// (start block, bits) alone as long as it meets only conditional branches, direct jumps and
/// calls and fall-throughs (compressed RETs, TIPs and errors end a recording before them), so
/// replaying it hands out the same blocks without deciding anything per block.
pub(crate) struct PathCache {
    pub(crate) slots: Vec<PathSlot>,
    /// Paths recorded since the table last grew.
    pub(crate) recorded: usize,
    /// Block indices of all recorded paths, [`PATH_PUSH`] flagged.
    pub(crate) elems: Vec<u32>,
    /// Number of clears (after one, a slot's `key` and `at` may recur with other elements).
    pub(crate) clears: u64,
}

impl PathCache {
    fn new() -> Self {
        PathCache {
            slots: vec![PathSlot::default(); PATH_SLOTS_INITIAL],
            recorded: 0,
            elems: Vec::with_capacity(INITIAL_BLOCKS * 4),
            clears: 0,
        }
    }

    /// The slot for `key`.
    #[inline(always)]
    pub(crate) fn slot(&self, key: u64) -> usize {
        hash(key) & (self.slots.len() - 1)
    }

    /// Forgets every path (block indices are about to change, or the arena is full).
    fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| s.key = 0);
        self.elems.clear();
        self.clears += 1;
    }

    /// Clears the cache if its arena has outgrown its limit. Only call this when no replay is
    /// in progress.
    #[inline(always)]
    pub(crate) fn maybe_clear(&mut self) {
        if self.elems.len() + MAX_PATH_LEN > PATH_ELEMS_LIMIT {
            // A recording adds at most `MAX_PATH_LEN` elements: the arena never outgrows the
            // limit, so its capacity stops growing there too.
            self.clear();
        } else if self.recorded > self.slots.len() / 2 && self.slots.len() < PATH_SLOTS {
            self.grow();
        }
    }

    /// Four times the slots, keeping the paths recorded so far.
    #[cold]
    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        self.slots = vec![PathSlot::default(); old.len() * 4];
        for s in old.into_iter().filter(|s| s.key != 0) {
            let at = self.slot(s.key);
            self.slots[at] = s;
        }
        self.recorded = 0;
    }
}

/// Instructions per block at most (a straight run longer than this is split).
const MAX_BLOCK_INSNS: u32 = 1024;

/// The block cache: an open-addressing table from IP to block index plus arenas for the blocks and
/// their instruction lengths. Flushed as a whole when it grows past its limit.
/// An iced-x86 decoder over one whole section, kept between block decodes: creating one per
/// block cost more than decoding a short block.
struct SectionDecoder<'a> {
    addr: u64,
    bits: u32,
    data: &'a [u8],
    dec: Decoder<'a>,
}

pub(crate) struct BlockCache<'a> {
    keys: Vec<u64>,
    vals: Vec<u32>,
    mask: usize,
    used: usize,
    pub(crate) blocks: Vec<CachedBlock>,
    pub(crate) lens: Vec<u8>,
    insn_limit: usize,
    /// Instructions decoded with iced-x86 so far (cache misses), for statistics.
    pub(crate) decoded: u64,
    /// Number of flushes.
    pub(crate) flushes: u64,
    /// Recorded TNT walks over these blocks (flushed with them).
    pub(crate) paths: PathCache,
    /// The decoder of the section decoded last.
    iced: Option<SectionDecoder<'a>>,
}

const EMPTY: u32 = u32::MAX;

/// Blocks the cache has room for before its arenas first grow (and half its table's slots).
const INITIAL_BLOCKS: usize = 4096;

#[inline(always)]
fn hash(ip: u64) -> usize {
    // Fibonacci hashing: multiply by 2^64/phi, take the high bits.
    (ip.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize
}

impl<'a> BlockCache<'a> {
    pub(crate) fn new(insn_limit: usize) -> Self {
        let cap = INITIAL_BLOCKS * 2;
        BlockCache {
            keys: vec![0; cap],
            vals: vec![EMPTY; cap],
            mask: cap - 1,
            used: 0,
            // Room for a typical working set up front: growing these by doubling copied them
            // several times while a short trace was still decoding its code for the first time.
            blocks: Vec::with_capacity(INITIAL_BLOCKS),
            lens: Vec::with_capacity(INITIAL_BLOCKS * 4),
            insn_limit: insn_limit.max(4096),
            decoded: 0,
            flushes: 0,
            paths: PathCache::new(),
            iced: None,
        }
    }

    /// Drops everything if the cache has outgrown its limit. Only call this when no block index
    /// handed out earlier is still in use.
    #[inline(always)]
    pub(crate) fn maybe_flush(&mut self) {
        if self.lens.len() > self.insn_limit || self.blocks.len() > self.insn_limit {
            self.flush();
        }
    }

    /// Drops every cached block and path (the code changed: another address space). Only call
    /// this when no block index handed out earlier is still in use.
    #[cold]
    #[inline(never)]
    pub(crate) fn clear(&mut self) {
        self.flush();
        self.iced = None;
    }

    #[cold]
    #[inline(never)]
    fn flush(&mut self) {
        self.keys.iter_mut().for_each(|k| *k = 0);
        self.vals.iter_mut().for_each(|v| *v = EMPTY);
        self.used = 0;
        self.blocks.clear();
        self.lens.clear();
        self.paths.clear();
        self.flushes += 1;
    }

    #[inline(always)]
    fn find(&self, ip: u64) -> Option<u32> {
        let mut i = hash(ip) & self.mask;
        loop {
            let v = self.vals[i];
            if v == EMPTY {
                return None;
            }
            if self.keys[i] == ip {
                return Some(v);
            }
            i = (i + 1) & self.mask;
        }
    }

    fn insert(&mut self, ip: u64, idx: u32) {
        if (self.used + 1) * 2 > self.keys.len() {
            self.grow();
        }
        let mut i = hash(ip) & self.mask;
        loop {
            if self.vals[i] == EMPTY {
                self.keys[i] = ip;
                self.vals[i] = idx;
                self.used += 1;
                return;
            }
            if self.keys[i] == ip {
                self.vals[i] = idx;
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    fn grow(&mut self) {
        let cap = self.keys.len() * 2;
        let old_k = std::mem::replace(&mut self.keys, vec![0; cap]);
        let old_v = std::mem::replace(&mut self.vals, vec![EMPTY; cap]);
        self.mask = cap - 1;
        self.used = 0;
        for (k, v) in old_k.into_iter().zip(old_v) {
            if v != EMPTY {
                self.insert(k, v);
            }
        }
    }

    /// The block starting at `ip` in `mode`, decoding it on a miss.
    #[inline]
    pub(crate) fn get(&mut self, image: &'a Image, ip: u64, mode: ExecMode) -> u32 {
        if let Some(idx) = self.find(ip) {
            // Indices stay valid: blocks are only dropped all at once by `maybe_flush`, which
            // also clears the table.
            if self.blocks[idx as usize].mode == mode {
                return idx;
            }
        }
        self.decode(image, ip, mode)
    }

    #[cold]
    fn decode(&mut self, image: &'a Image, ip: u64, mode: ExecMode) -> u32 {
        let bits = bitness(mode);
        let lens_at = self.lens.len() as u32;
        let mut cur = ip;
        let mut n = 0u32;
        let mut instr = Instruction::default();
        let mut buf = [0u8; 16];
        let mut last_ip = ip;
        let mut target = 0;
        // The section's bytes for the cheap decoder (`ild`), which handles the common
        // encodings; iced-x86 (kept positioned in the section, set up only when first needed)
        // decodes the rest. An instruction that runs into an adjacent section (page lists!)
        // goes through a copy.
        let sec = image.section_at(ip).map(|s| (s.addr, s.data()));
        // Where the kept iced-x86 decoder stands (it advances by itself through a run of
        // instructions the cheap decoder leaves to it).
        let mut iced_at: Option<u64> = None;
        // 64-bit code: the cheap decoder's prefix-free path in a loop of its own (no section
        // test, mode dispatch or iced-x86 state per instruction), until an instruction it
        // does not take, where the general loop below goes on.
        let mut fast_end = None;
        if let (64, Some((addr, data))) = (bits, sec) {
            let first = n;
            while n < MAX_BLOCK_INSNS {
                let Some(d) = cur
                    .checked_sub(addr)
                    .and_then(|off| data.get(off as usize..))
                    .and_then(|s| s.first_chunk::<16>())
                    .and_then(super::ild::decode_plain64)
                else {
                    break;
                };
                self.lens.push(d.len);
                n += 1;
                last_ip = cur;
                cur = cur.wrapping_add(d.len as u64);
                if d.class != InsnClass::Other {
                    if d.class.has_direct_target() {
                        target = d.target(last_ip, 64);
                    }
                    fast_end = Some(Term::Insn(d.class));
                    break;
                }
            }
            self.decoded += u64::from(n - first);
        }
        let term = if let Some(term) = fast_end {
            term
        } else {
            loop {
                if n >= MAX_BLOCK_INSNS {
                    break Term::Limit;
                }
                let fast = match sec {
                    Some((addr, data)) if cur >= addr && cur - addr < data.len() as u64 => {
                        super::ild::decode(&data[(cur - addr) as usize..], bits)
                    }
                    _ => None,
                };
                let (len, class, branch_target) = if let Some(d) = fast {
                    (d.len, d.class, d.target(cur, bits))
                } else {
                    let mut ok = false;
                    if iced_at == Some(cur) || position_decoder(&mut self.iced, image, cur, bits) {
                        if let Some(sd) = self.iced.as_mut() {
                            sd.dec.decode_out(&mut instr);
                            if !instr.is_invalid() {
                                ok = true;
                            } else if sd.dec.last_error() != DecoderError::NoMoreBytes {
                                break Term::BadInsn;
                            }
                        }
                    }
                    iced_at = None;
                    if ok {
                        iced_at = Some(instr.next_ip());
                    } else {
                        // Crossing the section end, or no section here: decode a copy.
                        let got = image.read(cur, &mut buf[..15]);
                        if got == 0 {
                            break Term::NoCode;
                        }
                        let mut dec =
                            Decoder::with_ip(bits, &buf[..got], cur, DecoderOptions::NONE);
                        dec.decode_out(&mut instr);
                        if instr.is_invalid() {
                            break if dec.last_error() == DecoderError::NoMoreBytes {
                                Term::NoCode
                            } else {
                                Term::BadInsn
                            };
                        }
                    }
                    // The class table is built on first use: a trace whose code the cheap decoder
                    // covers never pays for it (nor for iced-x86's own tables).
                    let class = InsnClass::of_code(instr.code());
                    (instr.len() as u8, class, instr.near_branch_target())
                };
                self.decoded += 1;
                self.lens.push(len);
                n += 1;
                last_ip = cur;
                cur = match bits {
                    64 => cur.wrapping_add(len as u64),
                    32 => (cur as u32).wrapping_add(len as u32) as u64,
                    _ => (cur as u16).wrapping_add(len as u16) as u64,
                };
                if class != InsnClass::Other {
                    if class.has_direct_target() {
                        target = branch_target;
                    }
                    break Term::Insn(class);
                }
            }
        };
        let idx = self.blocks.len() as u32;
        self.blocks.push(CachedBlock {
            start: ip,
            last_ip,
            next: cur,
            target,
            lens_at,
            n,
            term,
            mode,
            succ: [EMPTY; 2],
        });
        self.insert(ip, idx);
        idx
    }

    /// The block at `ip`, the successor `which` (0 fall-through, 1 static target) of block
    /// `from`, through the successor link when it is set.
    #[inline(always)]
    pub(crate) fn succ(&mut self, image: &'a Image, from: u32, which: usize, ip: u64) -> u32 {
        let b = &self.blocks[from as usize];
        let s = b.succ[which];
        if s != EMPTY {
            return s;
        }
        let mode = b.mode;
        let idx = self.get(image, ip, mode);
        self.blocks[from as usize].succ[which] = idx;
        idx
    }

    /// The instruction lengths of block `idx`.
    #[inline]
    pub(crate) fn lens_of(&self, b: &CachedBlock) -> &[u8] {
        &self.lens[b.lens_at as usize..(b.lens_at + b.n) as usize]
    }
}
