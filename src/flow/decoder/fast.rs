//! The walk layer's fast paths: TNT-8 bytes decoded in place, the path cache's replay and
//! recording of whole TNT-8 walks, and TIP straight from its bytes. Everything here is an
//! optimisation of [`super::walk`] over [`super::query`]'s packets: the slow path gives the same output.

use super::*;

impl FlowDecoder<'_> {
    /// The fast paths: a path replay, a TNT-8 refill (replayed from the path cache, or walked),
    /// a TNT bit walked, a TIP fast path. `Some` whole block, already counted; `None` when none
    /// applies (or the step queued its output instead): the slow path runs next.
    ///
    /// A replay that `filter` passes over as a whole ([`RunFilter::pass_over_path`]) is applied
    /// in one step ([`Self::skip_path`]) and the fast path goes on from its end; with a filter
    /// that never does, the loop is not one.
    #[inline(always)]
    pub(super) fn fast_block<F: RunFilter>(&mut self, filter: &mut F) -> Option<u32> {
        if self.path_pos < self.path_end {
            return Some(self.replay_step());
        }
        loop {
            // Two tests, not one `||`: with the fast paths for TIP.PGD/PGE the one test compiled
            // to a consumer loop that ran dynamorio/v5 10 % slower (measured; code layout).
            if !self.out.is_empty() {
                return None;
            }
            if self.state != State::Enabled {
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
    pub(super) fn skip_path(&mut self, sum: PathSum) {
        // Counted by `start_path` already.
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
    pub(super) fn start_path(&mut self) -> Option<usize> {
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
            // The whole replay is counted here, once: per block, the two counters compiled
            // to one 16-byte read-modify-write that stalled on the scalar stores of the walk
            // before it (store forwarding), the single largest cost of a replayed block.
            // `settle_path` takes back what it hands to the queue instead.
            self.n_insns += slot.insns as u64;
            self.n_runs += slot.len() as u64;
            self.ip = slot.end_ip;
            self.next_blk = slot.end_blk;
            self.tnt_count = slot.end_count as u32;
            self.tnt_walked = slot.end_walked as u64;
            self.path_pos = slot.at;
            self.path_end = slot.at + slot.len();
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
    pub(super) fn tip_fast_path(&mut self) -> Option<u32> {
        if self.pushback.is_some()
            || self.pkt.block_context().is_some()
            || self.pending_mode.is_some()
            || self.ovf_pending.is_some()
        {
            return None;
        }
        let b0 = self.skip_pads_and_timing()?;
        match b0 & 0x1f {
            0x0d => {}
            0x01 => return self.pgd_fast_path(b0),
            _ => return None,
        }
        let pos = self.pkt.position();
        let (pl, len) = self.ip_payload_at(b0, pos)?;
        // The target first: the general path reports a TIP it cannot give an IP before it
        // walks anything.
        let Ok(Some(target)) = self.last_ip.reconstruct(pl) else {
            return None;
        };
        let idx = self.cur_block();
        if self.rec_key == 0 {
            if let Some(step) = self.step_before_tip(idx) {
                return Some(step);
            }
        }
        let b = &self.cache.blocks[idx as usize];
        let (n, next) = (b.n, b.next);
        match b.term {
            Term::Insn(InsnClass::Return) => {
                // An uncompressed RET still pops, so later compressed RETs line up.
                self.ret.pop();
            }
            Term::Insn(c) if c.needs_tip() => {
                if (self.tip_walked > 0 || self.timed) && n > 1 {
                    // Blocks were walked to this one since the last packet, or timing packets
                    // came before the TIP: before the fast paths took these, the general path
                    // did, and it hands the block out with its branch a run of its own. So it
                    // is here: runs (`decode --format blocks`) stay what they were.
                    let b = *b;
                    self.take_tip(pl, pos, len);
                    self.emit_run(idx, 0, n - 1);
                    self.take_branch(idx, &b, c, target);
                    self.next_blk = u32::MAX;
                    return None;
                }
                if c == InsnClass::IndirectCall {
                    self.ret.push(next);
                }
            }
            _ => return None,
        }
        self.take_tip(pl, pos, len);
        self.ip = target;
        self.next_blk = u32::MAX;
        self.n_insns += n as u64;
        self.n_runs += 1;
        Some(idx)
    }

    /// The IP payload of the TIP-family packet (first byte `b0`) at `pos`, and its length in
    /// bytes; `None` for a suppressed IP, a reserved IPBytes value or a cut-off packet.
    #[inline(always)]
    fn ip_payload_at(&self, b0: u8, pos: usize) -> Option<(IpPayload, usize)> {
        let buf = self.pkt.buffer();
        let compression = IpCompression::from_ipbytes(b0 >> 5)?;
        let len = compression.payload_len();
        if len == 0 {
            return None;
        }
        let raw = match buf.get(pos + 1..pos + 9) {
            // One load where eight bytes follow (all but the end of the trace), masked to the
            // payload's length.
            Some(w) => {
                let w = u64::from_le_bytes(w.try_into().ok()?);
                w & (u64::MAX >> (64 - 8 * len))
            }
            None => buf
                .get(pos + 1..pos + 1 + len)?
                .iter()
                .rev()
                .fold(0u64, |acc, &b| (acc << 8) | b as u64),
        };
        Some((IpPayload::new(compression, raw), len))
    }

    /// A TIP.PGD with an IP (first byte `b0`) while tracing is on: the blocks before it found
    /// as the general path finds them ([`Self::disable_path`]). The usual case, one block
    /// (filtered traces, libxdc/foo: a call out of the traced range every 170 instructions),
    /// is handed out whole with the Disabled event queued behind it; a longer path goes to the
    /// queue as the general path queues it. `None` (nothing consumed) for a suppressed IP or
    /// one Last IP cannot reconstruct: the general path reports or handles it.
    #[inline(never)]
    fn pgd_fast_path(&mut self, b0: u8) -> Option<u32> {
        if self.rec_key != 0 || self.tip_walked != 0 {
            return None;
        }
        let pos = self.pkt.position();
        let (pl, len) = self.ip_payload_at(b0, pos)?;
        let Ok(Some(target)) = self.last_ip.reconstruct(pl) else {
            return None;
        };
        self.take_tip(pl, pos, len);
        let path = self.disable_path(Some(target));
        self.next_blk = u32::MAX;
        if let Some([idx]) = path.as_deref() {
            let idx = *idx;
            let b = &self.cache.blocks[idx as usize];
            let n = b.n;
            // What `commit` pushes for it.
            if let Some(ra) = b.return_address() {
                self.ret.push(ra);
            }
            self.probe_buf = path.unwrap_or_default();
            self.n_insns += n as u64;
            self.n_runs += 1;
            self.disable(Some(target));
            return Some(idx);
        }
        self.finish_disable(path, Some(target));
        None
    }

    /// While tracing is off, with nothing queued: a TIP.PGE with an IP, after the PADs, timing
    /// packets and MODE.Exec before it, applied as the general path applies them (its events
    /// queued, the next output). When the next packet is anything else, or anything is pending,
    /// only what came before it is consumed, and the general path goes on from there. Called
    /// by [`Self::slow_step`], not [`Self::fast_block`]: in the hot loop, the extra branch made
    /// traces with no TIP.PGE on their hot path 3–9 % slower (arcus/last, dynamorio/v2, v4).
    #[inline(never)]
    pub(super) fn pge_fast_path(&mut self) {
        if self.pushback.is_some()
            || self.pkt.block_context().is_some()
            || self.pending_mode.is_some()
            || self.ovf_pending.is_some()
        {
            return;
        }
        // One loop over what may come before the TIP.PGE, so that `skip_pads_and_timing` is
        // inlined once (each copy moved the hot loops' layout).
        let b0 = loop {
            self.skip_timing_run();
            let Some(b) = self.skip_pads_and_timing() else {
                return;
            };
            let pos = self.pkt.position();
            let next = self.pkt.buffer().get(pos + 1).copied();
            if b == 0x99 && self.pending_mode.is_none() {
                // A MODE.Exec before the TIP.PGE (most tracers send one), taken as
                // `middle_packet` takes it; a bad mode (CS.L and CS.D both set), another MODE
                // leaf or a second MODE.Exec is left to the general path.
                let mode = match next.map(|c| (c >> 5, c & 3)) {
                    Some((0, 1)) => ExecMode::Bits64,
                    Some((0, 2)) => ExecMode::Bits32,
                    Some((0, 0)) => ExecMode::Bits16,
                    _ => return,
                };
                self.pkt.set_position(pos + 2);
                self.cur_offset = pos as u64;
                self.timed = false;
                self.pending_mode = Some(mode);
            } else if (b == 0x19 || (b == 0x02 && matches!(next, Some(0x03 | 0x73))))
                && self.clock_packet()
            {
                // A TSC, TMA or CBR while tracing is off (hase's traces send the three every
                // few hundred MTCs): applied here, so that the MTCs after them stay off the
                // general path too.
            } else {
                break b;
            }
        };
        if b0 & 0x1f != 0x11 {
            return;
        }
        let pos = self.pkt.position();
        let Some((pl, len)) = self.ip_payload_at(b0, pos) else {
            return;
        };
        let Ok(Some(target)) = self.last_ip.reconstruct(pl) else {
            return;
        };
        self.take_tip(pl, pos, len);
        self.tnt_count = 0;
        self.apply_pending_mode();
        self.emit_enabled(target);
        self.state = State::Enabled;
        self.ip = target;
        self.next_blk = u32::MAX;
    }

    /// Consumes the TIP at `pos` (payload `pl`, `len` bytes): the last IP updated, the walk
    /// towards it and the timing packets before it done with.
    #[inline(always)]
    fn take_tip(&mut self, pl: IpPayload, pos: usize, len: usize) {
        let _ = self.last_ip.apply(pl);
        self.pkt.set_position(pos + 1 + len);
        self.cur_offset = pos as u64;
        self.tip_walked = 0;
        self.timed = false;
    }

    /// A block before the TIP's branch that needs no packet (it ends in a direct CALL or JMP,
    /// or in no branch): walked and handed out whole, the TIP left for a later block. A call
    /// into a PLT stub is the usual case (the stub's indirect JMP takes the TIP). Nothing else
    /// can bind here: the next packet is the TIP, so no event (FUP, TIP.PGD, PTW) is pending.
    /// `None` for the other block ends, and past the walk's runaway limit (the general path
    /// reports it, counting from where the walk to the TIP began: [`Self::tip_walked`]).
    #[inline(always)]
    fn step_before_tip(&mut self, idx: u32) -> Option<u32> {
        let n = self.cache.blocks[idx as usize].n;
        if self.tip_walked + n as u64 > self.cfg.max_walk {
            return None;
        }
        let (which, link, _) = self.follow_untraced(idx)?;
        self.tip_walked += n as u64;
        self.step_to(idx, n, which, link);
        Some(idx)
    }

    /// Hands out the next block of a path replay (its CALL pushed; counted by `start_path`).
    #[inline(always)]
    pub(super) fn replay_step(&mut self) -> u32 {
        let e = self.cache.paths.elems[self.path_pos as usize];
        self.path_pos += 1;
        let idx = e & !PATH_PUSH;
        if e & PATH_PUSH != 0 {
            self.ret.push(self.cache.blocks[idx as usize].next);
        }
        idx
    }

    /// Ends a recording: the walk so far, from its start to `end_ip` (block `end_blk` when
    /// known) with `end_count` bits pending and `end_walked` instructions walked since the last.
    #[inline(never)]
    pub(super) fn finish_path(
        &mut self,
        end_ip: u64,
        end_blk: u32,
        end_count: u32,
        end_walked: u64,
    ) {
        let key = std::mem::take(&mut self.rec_key);
        let paths = &mut self.cache.paths;
        let len = paths.elems.len() as u32 - self.rec_at;
        let (Some(len_m1), Ok(end_count), Ok(end_walked)) = (
            len.checked_sub(1).and_then(|l| u8::try_from(l).ok()),
            u8::try_from(end_count),
            u16::try_from(end_walked),
        ) else {
            return;
        };
        let blocks = &self.cache.blocks;
        let insns: u64 = paths.elems[self.rec_at as usize..]
            .iter()
            .map(|&e| blocks[(e & !PATH_PUSH) as usize].n as u64)
            .sum();
        let Ok(insns) = u32::try_from(insns) else {
            return;
        };
        self.stats.paths_recorded += 1;
        paths.recorded += 1;
        let at = paths.slot(key);
        paths.slots[at] = PathSlot {
            key,
            end_ip,
            end_blk,
            end_count,
            end_walked,
            at: self.rec_at,
            len_m1,
            insns,
        };
    }

    /// Drops a recording in progress.
    #[inline(never)]
    pub(super) fn abort_path(&mut self) {
        self.rec_key = 0;
        self.cache.paths.elems.truncate(self.rec_at as usize);
    }

    /// Before anything but the fast path runs: the rest of a replay goes to the queue (in order,
    /// ahead of whatever comes next) and a recording in progress is dropped.
    #[inline(never)]
    pub(super) fn settle_path(&mut self) {
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
            // `start_path` counted it; `make_run` counts it again.
            self.n_insns -= n as u64;
            self.n_runs -= 1;
            let r = self.make_run(idx, 0, n);
            self.out.push_back(Seg::Run(r));
        }
    }

    /// The next TNT-8 packet's bits when the walk has used up the last ones (see
    /// [`Self::short_tnt_fast_path`]): a run of TNT-8 packets is walked without leaving
    /// [`Self::next_block`]'s fast path.
    #[inline(always)]
    pub(super) fn short_tnt_refill(&mut self) -> bool {
        // No block index is referenced by queued output now (the queue is empty), so this is as
        // good a place as `fill` to keep the block cache bounded.
        self.cache.maybe_flush();
        self.short_tnt_fast_path() && self.tnt_count > 0
    }

    /// TNT-8 is the most frequent packet: decode it straight from the byte (reference §1.4)
    /// without the general packet decoder, skipping the PADs before it. Only outside a BBP block,
    /// where a byte with bit 0 clear (other than PAD and the `02` escape) is always TNT-8.
    #[inline(always)]
    pub(super) fn short_tnt_fast_path(&mut self) -> bool {
        if self.pushback.is_some() || self.pkt.block_context().is_some() {
            return false;
        }
        let Some(b) = self.skip_pads_and_timing() else {
            return false;
        };
        if b & 1 != 0 || b == 2 {
            return false;
        }
        let pos = self.pkt.position();
        self.timed = false;
        let payload = b >> 1;
        // The stop bit is the highest set bit; its index is the number of outcomes.
        let count = 7 - payload.leading_zeros() as u8;
        let bits = (payload & ((1u8 << count) - 1)) as u64;
        self.pkt.set_position(pos + 1);
        self.cur_offset = pos as u64;
        self.tnt(Tnt::new(bits, count));
        true
    }

    /// Consumes the PADs, and the CYC and MTC packets (applied to the clock as the general path
    /// applies them, [`Self::next_packet_with`]), before the next packet; its first byte, `None`
    /// at the end of the buffer. With cycle-accurate tracing a CYC comes before most TNT and
    /// TIP packets: left to the general path, they kept every walk out of the path cache.
    /// Only outside a BBP block, where a byte with bits `11` at the bottom is always a CYC.
    #[inline(always)]
    pub(super) fn skip_pads_and_timing(&mut self) -> Option<u8> {
        loop {
            let buf = self.pkt.buffer();
            let start = self.pkt.position();
            let mut pos = start;
            while buf.get(pos) == Some(&0) {
                pos += 1;
            }
            let b = *buf.get(pos)?;
            if b & 7 == 3 {
                // A one-byte CYC (the commonest; SKD007 concerns longer ones).
                self.pkt.set_position(pos + 1);
                self.time.cyc((b >> 3) as u64);
            } else if let (7, Some(&c)) = (b & 7, buf.get(pos + 1)) {
                // A two-byte CYC (most of the rest): its second byte ends it (bit 0 clear). One
                // whose second byte is `02` goes to the general path, which checks it for an OVF
                // that cut it off (SKD007).
                if c & 1 != 0 || c == 0x02 {
                    self.pkt.set_position(pos);
                    if !self.timing_packet() {
                        return Some(b);
                    }
                } else {
                    self.pkt.set_position(pos + 2);
                    self.time.cyc((b >> 3) as u64 | (((c >> 1) as u64) << 5));
                }
            } else if let (0x59, Some(&ctc)) = (b, buf.get(pos + 1)) {
                self.pkt.set_position(pos + 2);
                self.time.mtc(ctc);
            } else {
                if pos != start {
                    self.pkt.set_position(pos);
                }
                if b & 3 != 3 || !self.timing_packet() {
                    return Some(b);
                }
            }
            self.timed = true;
        }
    }

    /// The PADs, MTCs and one- and two-byte CYCs at the current position, applied. While
    /// tracing is off they come in runs of hundreds (hase's traces, DynamoRIO's): the position
    /// is kept in a register ([`Self::skip_pads_and_timing`] stores it after each packet and
    /// waited on that store at the next), and the time is computed once for the run
    /// ([`TimeState::settle`]: one division per run instead of one per packet).
    #[inline(always)]
    fn skip_timing_run(&mut self) {
        let buf = self.pkt.buffer();
        let start = self.pkt.position();
        let mut pos = start;
        let (mut mtc, mut cyc, mut timed) = (false, false, false);
        while let Some(&b) = buf.get(pos) {
            if b == 0 {
                pos += 1;
            } else if b & 7 == 3 {
                self.time.cyc_unsettled((b >> 3) as u64);
                pos += 1;
                cyc = true;
            } else if let (0x59, Some(&ctc)) = (b, buf.get(pos + 1)) {
                mtc |= self.time.mtc_unsettled(ctc);
                pos += 2;
                timed = true;
            } else if let (7, Some(&c)) = (b & 7, buf.get(pos + 1)) {
                // A two-byte CYC, as in `skip_pads_and_timing` (a longer one, or one ending in
                // `02`, is left to it).
                if c & 1 != 0 || c == 0x02 {
                    break;
                }
                self.time
                    .cyc_unsettled((b >> 3) as u64 | (((c >> 1) as u64) << 5));
                pos += 2;
                cyc = true;
            } else {
                break;
            }
        }
        if pos != start {
            self.pkt.set_position(pos);
            self.timed |= timed | cyc;
            self.time.settle(mtc, cyc);
        }
    }

    /// The TSC, TMA or CBR packet at the current position, applied as the general path applies
    /// it; `false` (nothing consumed) for anything else, a packet error included (the general
    /// path reports it, or skips it for SKZ84).
    #[inline(never)]
    fn clock_packet(&mut self) -> bool {
        let at = self.pkt.position();
        match self.pkt.next_packet() {
            Some(Ok((_, Packet::Tsc { tsc }))) => self.time.tsc(tsc),
            Some(Ok((_, Packet::Tma { ctc, fc }))) => self.time.tma(ctc, fc),
            Some(Ok((_, Packet::Cbr { ratio }))) => self.time.cbr(ratio),
            _ => {
                self.pkt.set_position(at);
                return false;
            }
        }
        self.timed = true;
        true
    }

    /// The CYC or MTC packet at the current position, applied; `false` (nothing consumed) for
    /// anything else, a packet error included (the general path reports it).
    #[inline(never)]
    fn timing_packet(&mut self) -> bool {
        let at = self.pkt.position();
        match self.pkt.next_packet() {
            Some(Ok((off, Packet::Cyc { value }))) => {
                if !(self.cfg.errata.skd007 && self.skd007_ovf_in_cyc(off)) {
                    self.time.cyc(value);
                }
                true
            }
            Some(Ok((_, Packet::Mtc { ctc }))) => {
                self.time.mtc(ctc);
                true
            }
            _ => {
                self.pkt.set_position(at);
                false
            }
        }
    }
}
