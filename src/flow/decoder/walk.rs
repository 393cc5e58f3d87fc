//! The walk layer (libipt's `pt_insn_decoder`/`pt_block_decoder`): blocks of the image, from
//! the block cache, walked to the next TNT bit, TIP target, FUP or PTWRITE; RET compression,
//! deferred TIPs, synchronous and asynchronous disables and their binding to instructions.

use super::*;

impl FlowDecoder<'_> {
    /// The block at `ip`: through the successor link of the previous step when it is valid.
    #[inline(always)]
    pub(super) fn cur_block(&mut self) -> u32 {
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
    pub(super) fn tnt_step(&mut self) -> Option<u32> {
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
            _ => match self.follow_untraced(idx) {
                Some((which, link, pushed)) => {
                    if pushed {
                        elem |= PATH_PUSH;
                    }
                    (which, link)
                }
                None => {
                    if self.rec_key != 0 {
                        // The recorded walk ends before this block, as it stood before this
                        // step.
                        self.finish_path(self.ip, idx, self.tnt_count, self.tnt_walked - n as u64);
                    }
                    return self.tnt_step_rare(idx);
                }
            },
        };
        if self.rec_key != 0 {
            self.record_elem(elem);
        }
        self.step_to(idx, n, which, link);
        Some(idx)
    }

    /// Takes the end of block `idx` when it needs no trace: a direct JMP or CALL (its return
    /// address pushed) or no branch; `ip` is then the next block's. Returns which successor
    /// that is (0 fall-through, 1 static target), its cached link, and whether a return
    /// address was pushed; `None` (nothing changed) for the block ends that need a packet.
    #[inline(always)]
    pub(super) fn follow_untraced(&mut self, idx: u32) -> Option<(usize, u32, bool)> {
        let b = &self.cache.blocks[idx as usize];
        match b.term {
            Term::Insn(InsnClass::DirectJump) => {
                self.ip = b.target;
                Some((1, b.succ[1], false))
            }
            Term::Insn(InsnClass::DirectCall) => {
                let (next, target, link) = (b.next, b.target, b.succ[1]);
                let pushed = target != next;
                if pushed {
                    self.ret.push(next);
                }
                self.ip = target;
                Some((1, link, pushed))
            }
            Term::Insn(InsnClass::Other | InsnClass::Special | InsnClass::Ptwrite)
            | Term::Limit => {
                self.ip = b.next;
                Some((0, b.succ[0], false))
            }
            _ => None,
        }
    }

    /// After block `idx` (`n` instructions) is handed out whole: the next block is its
    /// successor `which`, through the link `link` when the cache has one; the block counted.
    #[inline(always)]
    pub(super) fn step_to(&mut self, idx: u32, n: u32, which: usize, link: u32) {
        self.next_blk = if link != u32::MAX {
            link
        } else {
            self.cache.succ(self.image, idx, which, self.ip)
        };
        self.n_insns += n as u64;
        self.n_runs += 1;
    }

    /// Appends a block to the recording (or drops a recording that grew too long).
    #[inline(always)]
    pub(super) fn record_elem(&mut self, elem: u32) {
        let elems = &mut self.cache.paths.elems;
        if elems.len() - self.rec_at as usize >= MAX_PATH_LEN {
            self.abort_path();
        } else {
            elems.push(elem);
        }
    }

    /// The block ends [`Self::tnt_step`] does not handle inline.
    #[inline(never)]
    pub(super) fn tnt_step_rare(&mut self, idx: u32) -> Option<u32> {
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
    pub(super) fn runaway(&mut self) {
        self.error(FlowErrorKind::RunawayWalk, Some(self.ip));
    }

    /// A RET while TNT bits are pending: it is compressed (§3.3).
    #[inline(never)]
    pub(super) fn compressed_ret(&mut self, idx: u32) -> Option<u32> {
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
    pub(super) fn deferred_tip_step(&mut self, idx: u32, c: InsnClass) -> Option<u32> {
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

    pub(super) fn no_code(&mut self, b: CachedBlock) {
        let kind = if b.term == Term::NoCode {
            FlowErrorKind::NoCode
        } else {
            FlowErrorKind::BadInsn
        };
        self.error(kind, Some(b.next));
    }

    /// Reads the TIP for the branch that ends block `idx` (the decoder stands at that branch, not
    /// yet emitted). Middle packets (MODE.Exec, PIP, VMCS) are applied on the way.
    pub(super) fn deferred_tip(&mut self, idx: u32, b: &CachedBlock, c: InsnClass) -> Walk {
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
                    if let Some(ra) = b.return_address() {
                        self.ret.push(ra);
                    }
                    self.emit_disabled(t, false);
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
    pub(super) fn take_branch(&mut self, idx: u32, b: &CachedBlock, c: InsnClass, target: u64) {
        self.emit_run(idx, b.n - 1, 1);
        if c == InsnClass::IndirectCall {
            self.ret.push(b.next);
        }
        self.ip = target;
        self.apply_pending_mode();
    }

    /// A TIP: walk to the indirect branch, uncompressed RET or far transfer it belongs to.
    pub(super) fn tip(&mut self, target: u64) {
        // The fast path may have walked part of the way already.
        let mut walked = std::mem::take(&mut self.tip_walked);
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
                Term::NoCode | Term::BadInsn => {
                    self.emit_run(idx, 0, b.n);
                    self.no_code(b);
                    return;
                }
                Term::Insn(_) | Term::Limit => {
                    // A direct JMP or CALL, or no branch: the same step as the fast path's
                    // walk to a TIP (`step_before_tip`), so the two cannot drift apart.
                    self.emit_run(idx, 0, b.n);
                    let followed = self.follow_untraced(idx);
                    debug_assert!(followed.is_some(), "every other block end is matched above");
                }
            }
        }
    }

    /// Walks until `ip == x` through instructions that need no trace; `x` itself is not emitted.
    pub(super) fn walk_to_ip(&mut self, x: u64) -> Walk {
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
    pub(super) fn probe(
        &mut self,
        bind: impl Fn(&CachedBlock, InsnClass) -> bool,
    ) -> Option<Vec<u32>> {
        // The decoder's own buffer, handed back by `commit`: a TIP.PGD (filtered traces have
        // one every few hundred instructions) allocated a new one.
        let mut path = std::mem::take(&mut self.probe_buf);
        path.clear();
        let mut walked = 0u64;
        // Through the successor links, as the TNT walk goes, rather than a table lookup per
        // block: a filtered trace probes at every TIP.PGD.
        let mut idx = self.cur_block();
        let found = loop {
            let b = self.cache.blocks[idx as usize];
            walked += b.n as u64;
            if walked > self.cfg.max_walk {
                break false;
            }
            path.push(idx);
            let (which, ip) = match b.term {
                Term::Insn(c) if bind(&b, c) => break true,
                Term::Insn(InsnClass::DirectJump) | Term::Insn(InsnClass::DirectCall) => {
                    (1, b.target)
                }
                Term::Insn(c) if c.is_branch() => break false,
                Term::Insn(_) | Term::Limit => (0, b.next),
                Term::NoCode | Term::BadInsn => break false,
            };
            idx = self.cache.succ(self.image, idx, which, ip);
        };
        if found {
            Some(path)
        } else {
            self.probe_buf = path;
            None
        }
    }

    /// Emits a probed path (pushing the return address of each CALL on the way: direct ones
    /// anywhere, an indirect one only as the last block, where a TIP.PGD bound it); returns the
    /// last block.
    pub(super) fn commit(&mut self, path: Vec<u32>) -> Option<CachedBlock> {
        let mut last = None;
        for &idx in &path {
            let b = self.cache.blocks[idx as usize];
            self.emit_run(idx, 0, b.n);
            if let Some(ra) = b.return_address() {
                self.ret.push(ra);
            }
            last = Some(b);
        }
        self.probe_buf = path;
        last
    }

    /// A TIP.PGD without FUP: tracing stopped at the next instruction that can do that (§3.5).
    pub(super) fn sync_disable(&mut self, t: Option<u64>) {
        let path = self.disable_path(t);
        self.finish_disable(path, t);
    }

    /// The blocks that run before the TIP.PGD (target `t`) disables tracing: from the current
    /// IP to the first one whose end can disable it, through instructions that need no trace.
    /// `None` when a branch that needs trace (or missing code) comes first.
    pub(super) fn disable_path(&mut self, t: Option<u64>) -> Option<Vec<u32>> {
        match t {
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
        }
    }

    /// Emits the blocks `path` found by [`Self::disable_path`] (if any) and disables tracing.
    pub(super) fn finish_disable(&mut self, path: Option<Vec<u32>>, t: Option<u64>) {
        // No instruction reachable without trace can have disabled tracing, so it was disabled
        // before any of them ran: e.g. a TIP.PGE immediately followed by TIP.PGD (a tracer that
        // enables and disables at once, as in Griffin recordings). Disable right here.
        if let Some(path) = path {
            self.commit(path);
        }
        self.disable(t);
    }

    /// Tracing is off from here (a TIP.PGD with target `t`, bound to what was emitted before).
    pub(super) fn disable(&mut self, t: Option<u64>) {
        self.tnt_count = 0;
        self.emit_disabled(t, false);
        self.state = State::Disabled;
    }

    /// PTW without IP: binds to the next PTWRITE instruction.
    pub(super) fn walk_to_ptwrite(&mut self) -> Option<u64> {
        let path = self.probe(|_, c| c == InsnClass::Ptwrite)?;
        let b = self.commit(path)?;
        self.ip = b.next;
        Some(b.last_ip)
    }

    /// A FUP outside PSB+.
    pub(super) fn fup(&mut self, x: u64) {
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
                self.push_event(off, k);
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
    pub(super) fn async_target(&mut self, x: u64, optional: bool) {
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
                    self.emit_disabled(Some(x), true);
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
