//! Write queries over the [`StateLog`]: which recorded instruction (or kernel event) last wrote,
//! or next writes, any byte of a set of address ranges. They serve write watchpoints natively
//! (`Z2`): a reverse-continue finds the last write before the cursor with one backward walk over
//! the log's compact arrays instead of one debugger round trip per instruction.
//!
//! ## What a write is
//!
//! Every memory record of an entry is a write: the operands of an instruction (implicit stack
//! writes included), the output buffers of a system call the log knows, a signal frame the
//! kernel wrote below the stack pointer. Undoing the log rewrites exactly these bytes, so a
//! write found here is exactly a change of the past memory the log shows.
//!
//! ## Writes the log does not know
//!
//! An entry whose writes are not all captured (a system call with unknown output buffers, an
//! operand with no size or a VSIB address, a buffer that could not be read) may have written the
//! watched memory or not. A search never walks past such an entry: it stops there and reports
//! it ([`WriteHit::unknown`]), because a watchpoint that silently misses a write would send the
//! user to the wrong place. Since the log has no old bytes for such a write, the memory shown
//! before and after the entry is the same: the caller must tell the user why it stopped.

use super::{EntryKind, MEM_MARK_EVERY, StateLog};

/// Why some memory an entry wrote is not in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownWrite {
    /// A system call whose output buffers the log does not know (`nr` is its number).
    Syscall {
        /// The system call number (RAX before the SYSCALL).
        nr: u64,
    },
    /// A memory operand with no size or a VSIB address (scatter), in the instruction at `ip`.
    Operand {
        /// The instruction's address.
        ip: u64,
    },
    /// Memory about to be written could not be read (or the length was implausible), from
    /// `addr` on: its old bytes are not kept.
    Unreadable {
        /// The first byte not kept.
        addr: u64,
    },
}

impl std::fmt::Display for UnknownWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnknownWrite::Syscall { nr } => write!(
                f,
                "system call {nr}, whose output buffers the state log does not know"
            ),
            UnknownWrite::Operand { ip } => write!(
                f,
                "the instruction at {ip:#x} writes memory the state log cannot size or address"
            ),
            UnknownWrite::Unreadable { addr } => write!(
                f,
                "the old bytes from {addr:#x} could not be read before they were written"
            ),
        }
    }
}

/// What a write search found: the log entry that wrote a watched range, or whose writes are not
/// known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteHit {
    /// Recorded instructions before the entry: an instruction's own position, or for a kernel
    /// event (signal delivery) or an interrupted REP run the position of the next instruction.
    pub insn: usize,
    /// What the entry is.
    pub kind: EntryKind,
    /// The lowest watched address the entry is known to write; `None` when the search stopped
    /// only because the entry's writes are not known.
    pub addr: Option<u64>,
    /// Set when the entry's writes are not all known (the search does not walk past it).
    pub unknown: Option<UnknownWrite>,
}

impl WriteHit {
    /// The newest position whose state is before the write: the instruction itself, or for an
    /// event between instructions `insn - 1` and `insn`, the instruction before it (the state
    /// between the two is not a position).
    pub fn before(&self) -> usize {
        match self.kind {
            EntryKind::Instruction => self.insn,
            EntryKind::Event | EntryKind::Partial => self.insn.saturating_sub(1),
        }
    }

    /// The oldest position whose state includes the write.
    pub fn after(&self) -> usize {
        match self.kind {
            EntryKind::Instruction => self.insn + 1,
            EntryKind::Event | EntryKind::Partial => self.insn,
        }
    }
}

/// A write search's target: `[addr, addr + len)` ranges (empty ones match nothing).
pub type WriteSearch<'a> = &'a [(u64, u64)];

/// The lowest address of `ranges` that the write `[a, a + len)` touches.
#[inline]
fn overlap(a: u64, len: u32, ranges: WriteSearch<'_>) -> Option<u64> {
    let end = a.saturating_add(u64::from(len));
    let mut best: Option<u64> = None;
    for &(s, n) in ranges {
        if n == 0 {
            continue;
        }
        let e = s.saturating_add(n);
        if a < e && s < end {
            let lo = a.max(s);
            best = Some(best.map_or(lo, |b| b.min(lo)));
        }
    }
    best
}

impl StateLog {
    /// Number of log entries (instructions, events, partial REP runs) closed so far: a mark for
    /// [`find_write_since`](Self::find_write_since).
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// The entry index position `p` starts at (`len()` and beyond: the end of the log).
    fn entry_of(&self, p: usize) -> usize {
        self.positions
            .get(p)
            .map_or(self.entries.len(), |&e| e as usize)
    }

    /// Recorded instructions before entry `e`.
    fn insns_before(&self, e: usize) -> usize {
        self.positions.partition_point(|&x| (x as usize) < e)
    }

    /// The index in `mem_addr` of entry `e`'s first memory record (`e` at the end: where the
    /// entry being built starts). At most [`MEM_MARK_EVERY`] entries are summed.
    fn mem_start_of(&self, e: usize) -> usize {
        if e >= self.entries.len() {
            return self.pending_mem_start();
        }
        let m = e / MEM_MARK_EVERY;
        let base = self.mem_marks.get(m).copied().unwrap_or(0);
        base + self.entries[m * MEM_MARK_EVERY..e]
            .iter()
            .map(|x| x.mem_len as usize)
            .sum::<usize>()
    }

    fn hit(&self, e: usize, addr: Option<u64>, unknown: Option<UnknownWrite>) -> WriteHit {
        WriteHit {
            insn: self.insns_before(e),
            kind: self.entries[e].kind,
            addr,
            unknown,
        }
    }

    /// The newest entry in `lo..hi` that writes `ranges` or whose writes are not known.
    fn rscan(&self, lo: usize, hi: usize, ranges: WriteSearch<'_>) -> Option<WriteHit> {
        let hi = hi.min(self.entries.len());
        if lo >= hi {
            return None;
        }
        let u = self.unknown.partition_point(|&(e, _)| (e as usize) < hi);
        let unknown = u
            .checked_sub(1)
            .map(|i| self.unknown[i])
            .filter(|&(e, _)| e as usize >= lo)
            .map(|(e, why)| (e as usize, why));
        let stop = unknown.map_or(lo, |(e, _)| e);
        let mut mem_end = self.mem_start_of(hi);
        for e in (stop..hi).rev() {
            let n = self.entries[e].mem_len as usize;
            if n != 0 {
                let start = mem_end - n;
                let mut found: Option<u64> = None;
                for m in start..mem_end {
                    if let Some(a) = overlap(self.mem_addr[m], self.mem_len[m], ranges) {
                        found = Some(found.map_or(a, |f| f.min(a)));
                    }
                }
                if found.is_some() {
                    let why = unknown.filter(|&(u, _)| u == e).map(|(_, w)| w);
                    return Some(self.hit(e, found, why));
                }
                mem_end = start;
            }
        }
        unknown.map(|(e, why)| self.hit(e, None, Some(why)))
    }

    /// The oldest entry in `lo..hi` that writes `ranges` or whose writes are not known.
    fn scan(&self, lo: usize, hi: usize, ranges: WriteSearch<'_>) -> Option<WriteHit> {
        let hi = hi.min(self.entries.len());
        if lo >= hi {
            return None;
        }
        let u = self.unknown.partition_point(|&(e, _)| (e as usize) < lo);
        let unknown = self
            .unknown
            .get(u)
            .filter(|&&(e, _)| (e as usize) < hi)
            .map(|&(e, why)| (e as usize, why));
        let stop = unknown.map_or(hi, |(e, _)| e + 1);
        let mut mem = self.mem_start_of(lo);
        for e in lo..stop {
            let n = self.entries[e].mem_len as usize;
            if n != 0 {
                let mut found: Option<u64> = None;
                for m in mem..mem + n {
                    if let Some(a) = overlap(self.mem_addr[m], self.mem_len[m], ranges) {
                        found = Some(found.map_or(a, |f| f.min(a)));
                    }
                }
                if found.is_some() {
                    let why = unknown.filter(|&(u, _)| u == e).map(|(_, w)| w);
                    return Some(self.hit(e, found, why));
                }
                mem += n;
            }
        }
        unknown.map(|(e, why)| self.hit(e, None, Some(why)))
    }

    /// The last write to `ranges` between position `floor` and position `before` — by one of
    /// the instructions `floor..before` or a kernel event between them — or the last entry
    /// there whose writes are not known, whichever is newer (see the module docs). `None`: no
    /// write to the ranges in that span. A backward walk over the log's arrays, no allocation.
    pub fn rfind_write(
        &self,
        before: usize,
        floor: usize,
        ranges: WriteSearch<'_>,
    ) -> Option<WriteHit> {
        if floor >= before {
            return None;
        }
        self.rscan(self.entry_of(floor), self.entry_of(before), ranges)
    }

    /// The first write to `ranges` between position `from` and position `to` (by one of the
    /// instructions `from..to` or a kernel event between them), or the first entry there whose
    /// writes are not known, whichever is older.
    pub fn find_write(&self, from: usize, to: usize, ranges: WriteSearch<'_>) -> Option<WriteHit> {
        if from >= to {
            return None;
        }
        self.scan(self.entry_of(from), self.entry_of(to), ranges)
    }

    /// The first write to `ranges` (or entry with unknown writes) among the entries closed
    /// since [`entry_count`](Self::entry_count) returned `mark`: what one forward step of a
    /// live recording wrote.
    pub fn find_write_since(&self, mark: usize, ranges: WriteSearch<'_>) -> Option<WriteHit> {
        self.scan(mark, self.entries.len(), ranges)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Pending;
    use super::*;
    use crate::target::regs::zeroed_gprs;

    /// One generated entry: its kind, its writes and whether they are all known.
    #[derive(Debug, Clone)]
    struct Gen {
        kind: EntryKind,
        writes: Vec<(u64, u32)>,
        unknown: Option<UnknownWrite>,
    }

    fn push(log: &mut StateLog, g: &Gen) {
        log.pending = Pending {
            before: Some(zeroed_gprs()),
            unknown: g.unknown,
            mem_mark: log.mem_addr.len(),
            data_mark: log.data.len(),
            open: true,
            ..Pending::default()
        };
        for &(a, n) in &g.writes {
            log.mem_addr.push(a);
            log.mem_len.push(n);
            log.data.extend(std::iter::repeat_n(0u8, n as usize));
        }
        log.close(&zeroed_gprs(), g.kind);
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn generate(rng: &mut Rng, count: usize, unknown_every: u64) -> Vec<Gen> {
        (0..count)
            .map(|_| {
                let kind = match rng.below(40) {
                    0 => EntryKind::Event,
                    1 => EntryKind::Partial,
                    _ => EntryKind::Instruction,
                };
                let writes = match rng.below(4) {
                    0 | 1 => vec![],
                    2 => vec![(0x1000 + rng.below(256), 1 + rng.below(8) as u32)],
                    _ => (0..1 + rng.below(3))
                        .map(|_| (0x1000 + rng.below(512), 1 + rng.below(16) as u32))
                        .collect(),
                };
                let unknown = (unknown_every != 0 && rng.below(unknown_every) == 0)
                    .then(|| UnknownWrite::Syscall { nr: rng.below(400) });
                Gen {
                    kind,
                    writes,
                    unknown,
                }
            })
            .collect()
    }

    /// The instructions before each entry, and the entry each position starts at.
    fn layout(gens: &[Gen]) -> (Vec<usize>, Vec<usize>) {
        let mut insns = Vec::new();
        let mut starts = Vec::new();
        let mut n = 0;
        for (e, g) in gens.iter().enumerate() {
            insns.push(n);
            if g.kind == EntryKind::Instruction {
                starts.push(e);
                n += 1;
            }
        }
        (insns, starts)
    }

    fn reference_hit(gens: &[Gen], insns: &[usize], e: usize, ranges: &[(u64, u64)]) -> WriteHit {
        let g = &gens[e];
        let addr = g
            .writes
            .iter()
            .flat_map(|&(a, n)| {
                ranges
                    .iter()
                    .filter(move |&&(s, l)| l > 0 && a < s + l && s < a + u64::from(n))
                    .map(move |&(s, _)| a.max(s))
            })
            .min();
        WriteHit {
            insn: insns[e],
            kind: g.kind,
            addr,
            unknown: g.unknown,
        }
    }

    fn matches(h: &WriteHit) -> bool {
        h.addr.is_some() || h.unknown.is_some()
    }

    #[test]
    fn searches_equal_a_brute_force_walk() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for (round, unknown_every) in [(0, 0), (1, 300), (2, 40), (3, 0)] {
            let gens = generate(&mut rng, 3000 + round * 517, unknown_every);
            let mut log = StateLog::new();
            for g in &gens {
                push(&mut log, g);
            }
            let (insns, starts) = layout(&gens);
            let len = starts.len();
            assert_eq!(log.len(), len);
            let entry_of = |p: usize| starts.get(p).copied().unwrap_or(gens.len());
            for _ in 0..300 {
                let ranges: Vec<(u64, u64)> = (0..1 + rng.below(3))
                    .map(|_| (0x1000 + rng.below(600), rng.below(9)))
                    .collect();
                let a = rng.below(len as u64 + 1) as usize;
                let b = rng.below(len as u64 + 1) as usize;
                let (lo, hi) = (a.min(b), a.max(b));
                let want_back = (entry_of(lo)..entry_of(hi))
                    .rev()
                    .map(|e| reference_hit(&gens, &insns, e, &ranges))
                    .find(matches);
                assert_eq!(
                    log.rfind_write(hi, lo, &ranges),
                    want_back,
                    "rfind {lo}..{hi} {ranges:x?}"
                );
                let want_fwd = (entry_of(lo)..entry_of(hi))
                    .map(|e| reference_hit(&gens, &insns, e, &ranges))
                    .find(matches);
                assert_eq!(
                    log.find_write(lo, hi, &ranges),
                    want_fwd,
                    "find {lo}..{hi} {ranges:x?}"
                );
                let mark = rng.below(gens.len() as u64 + 1) as usize;
                let want_since = (mark..gens.len())
                    .map(|e| reference_hit(&gens, &insns, e, &ranges))
                    .find(matches);
                assert_eq!(log.find_write_since(mark, &ranges), want_since);
            }
        }
    }

    #[test]
    fn hit_positions_bracket_the_write() {
        let mut log = StateLog::new();
        let gens = [
            (EntryKind::Instruction, vec![]),
            (EntryKind::Instruction, vec![(0x2000, 8)]),
            (EntryKind::Event, vec![(0x2004, 4)]),
            (EntryKind::Instruction, vec![]),
        ];
        for (kind, writes) in gens {
            push(
                &mut log,
                &Gen {
                    kind,
                    writes,
                    unknown: None,
                },
            );
        }
        let w = [(0x2000, 8)];
        // The signal frame written between instructions 1 and 2 is part of the state at 2.
        let h = log.rfind_write(2, 0, &w).unwrap();
        assert_eq!(
            (h.kind, h.insn, h.before(), h.after()),
            (EntryKind::Event, 2, 1, 2)
        );
        assert_eq!(h.addr, Some(0x2004));
        assert_eq!(log.rfind_write(3, 0, &w), Some(h));
        // Instruction 1 wrote the low half: before it is position 1, after it position 2.
        let h = log.rfind_write(3, 0, &[(0x2000, 4)]).unwrap();
        assert_eq!(
            (h.kind, h.before(), h.after()),
            (EntryKind::Instruction, 1, 2)
        );
        assert_eq!(h.addr, Some(0x2000));
        assert_eq!(log.find_write(0, 3, &w).map(|h| h.after()), Some(2));
        assert_eq!(log.find_write(2, 3, &w), None);
        assert_eq!(log.rfind_write(1, 0, &w), None);
        assert_eq!(log.rfind_write(3, 2, &w), None);
        assert_eq!(log.rfind_write(3, 0, &[(0x1ff8, 8)]), None);
    }

    #[test]
    fn the_entry_being_built_is_not_searched() {
        let mut log = StateLog::new();
        push(
            &mut log,
            &Gen {
                kind: EntryKind::Instruction,
                writes: vec![(0x3000, 4)],
                unknown: None,
            },
        );
        // A REP instruction mid-way: its records exist but no position does yet.
        log.pending = Pending {
            before: Some(zeroed_gprs()),
            mem_mark: log.mem_addr.len(),
            data_mark: log.data.len(),
            open: true,
            ..Pending::default()
        };
        log.mem_addr.push(0x4000);
        log.mem_len.push(4);
        log.data.extend([0; 4]);
        assert_eq!(log.rfind_write(1, 0, &[(0x4000, 4)]), None);
        assert_eq!(
            log.rfind_write(1, 0, &[(0x3000, 4), (0x4000, 4)])
                .map(|h| h.addr),
            Some(Some(0x3000))
        );
        assert_eq!(log.find_write_since(0, &[(0x4000, 4)]), None);
    }
}
