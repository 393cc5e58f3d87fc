//! The query layer (libipt's `pt_query_decoder`): packets in, decoder state and events out.
//! It reads packets (with a one-packet pushback), reconstructs IPs and modes, queues TNT bits,
//! and handles PSB+, OVF, timing, FUP-bound events and the packets that need no code; walking
//! code is [`super::walk`]'s.

use super::*;

impl FlowDecoder<'_> {
    /// The next packet that matters for the flow. Timing packets update the time, PAD/MNT/BIP/BBP
    /// are skipped. `None` at the end of the trace, or after an invalid packet (reported; the
    /// decoder is then `NoSync`).
    #[inline(never)]
    pub(super) fn next_packet(&mut self) -> Option<(u64, Packet)> {
        self.next_packet_inline()
    }

    /// [`Self::next_packet`], inlined into the two loops that read most packets (the main loop
    /// and PSB+): a packet returned through memory from a call was stored in pieces and
    /// read back at other widths, a store-forwarding stall on every packet of the general path.
    #[inline(always)]
    pub(super) fn next_packet_inline(&mut self) -> Option<(u64, Packet)> {
        self.next_packet_with(|_, off, p| (off, p))
    }

    /// [`Self::next_packet_inline`] handing the packet to `f` where the packet decoder's result
    /// lies, rather than re-wrapping it in an `Option` first: the re-wrap copied the packet's
    /// payload as two overlapping 8-byte moves, the first of which straddled two of the decoder's
    /// stores (a store-forwarding stall on every packet of the general path).
    #[inline(always)]
    pub(super) fn next_packet_with<R>(
        &mut self,
        f: impl FnOnce(&mut Self, u64, Packet) -> R,
    ) -> Option<R> {
        if let Some((off, p)) = self.pushback.take() {
            self.cur_offset = off;
            return Some(f(self, off, p));
        }
        loop {
            self.skip_pads();
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
                        self.timed = false;
                        return Some(f(self, off, p));
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
    pub(super) fn ip_of(&mut self, p: IpPayload) -> Option<u64> {
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

    pub(super) fn mode_of(&mut self, csl: bool, csd: bool) -> Option<ExecMode> {
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

    pub(super) fn apply_pending_mode(&mut self) {
        if let Some(m) = self.pending_mode.take() {
            if m != self.mode {
                self.mode = m;
                self.emit_event(EventKind::ModeChange { mode: m });
            }
        }
    }

    /// Steps over PAD bytes in place. Traces pad their PSB+ sequences heavily (libxdc/qemu:
    /// 665 k PADs among 1.2 M packets, about 24 around each PSB+), and one call of the packet
    /// decoder per PAD was a large part of the general path. Only outside a BBP block, where a
    /// zero byte is always a PAD (as in `short_tnt_fast_path`).
    #[inline(always)]
    fn skip_pads(&mut self) {
        if self.pkt.block_context().is_some() {
            return;
        }
        let buf = self.pkt.buffer();
        let start = self.pkt.position();
        let mut pos = start;
        while buf.get(pos) == Some(&0) {
            pos += 1;
        }
        if pos != start {
            self.pkt.set_position(pos);
        }
    }

    // ----------------------------------------------------------------------------------------
    // Main loop

    /// Processes packets until some output is queued or the trace ends (with `stop_at_tnt`, also
    /// when TNT bits are pending: the caller walks them itself).
    pub(super) fn fill(&mut self, stop_at_tnt: bool) {
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
            self.next_packet_with(|d, off, p| d.handle(off, p));
        }
        if self.eof && self.out.is_empty() {
            self.flush_claims();
            if self.ovf_pending.take().is_some() {
                self.emit_event(EventKind::Overflow { resume: None });
            }
        }
    }

    /// Applies a packet that may sit between a FUP and its TIP, or stand alone (MODE.Exec, PIP,
    /// VMCS; reference §3.6): MODE.Exec takes effect at the next TIP/TIP.PGE, PIP and VMCS are
    /// events. Returns false for any other packet.
    pub(super) fn middle_packet(&mut self, p: Packet) -> bool {
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

    // Forced inline into `fill`'s closure (its only caller): left a call of its own, the
    // gain of `next_packet_with` was not there (measured).
    #[inline(always)]
    pub(super) fn handle(&mut self, off: u64, p: Packet) {
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
                self.emit_enabled(t);
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

    pub(super) fn claim(&mut self, kind: EventKind) {
        if self.claims.len() >= MAX_CLAIMS {
            let (off, k) = self.claims.remove(0);
            self.push_event(off, k);
        }
        self.claims.push((self.cur_offset, kind));
    }

    /// Emits the waiting events without an IP (their FUP never came).
    pub(super) fn flush_claims(&mut self) {
        if self.claims.is_empty() {
            return;
        }
        // Drained in place: the vector keeps its capacity for the next claims.
        let mut claims = std::mem::take(&mut self.claims);
        for (off, k) in claims.drain(..) {
            self.push_event(off, k);
        }
        self.claims = claims;
    }

    // ----------------------------------------------------------------------------------------
    // PSB+ and OVF

    pub(super) fn psb(&mut self, off: u64) {
        // A trace that crosses an execve: the PSB that opens an address space switches the
        // image (a period starts where tracing is off, after the exec's TIP.PGD).
        if !self.root.periods().is_empty() {
            self.enter_period(off);
        }
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
            let Some((_, p)) = self.next_packet_inline() else {
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

    pub(super) fn ovf(&mut self) {
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

    pub(super) fn tnt(&mut self, t: Tnt) {
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
    pub(super) fn pop_bit(&mut self) -> bool {
        self.tnt_count -= 1;
        (self.tnt_bits >> self.tnt_count) & 1 != 0
    }
}
