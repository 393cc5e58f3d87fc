//! Lookaheads and checks of the erratum workarounds (see [`crate::flow::errata`]): kept apart
//! from the query layer's hot path, which calls them only on PSB+, OVF, FUP and TIP.PGD.

use super::*;

/// How far the erratum lookaheads read.
const LOOKAHEAD_PACKETS: usize = 1 << 12;

/// Lookaheads and checks of the erratum workarounds (see [`super::errata`]). They read packets
/// with a copy of the packet decoder, so the decoder's own position never moves.
impl FlowDecoder<'_> {
    /// The packets after the current position, as far as they decode, at most
    /// [`LOOKAHEAD_PACKETS`] of them (a scan that finds no answer counts as "cannot tell", so a
    /// trace of nothing but timing packets after each OVF cannot make decoding quadratic).
    pub(super) fn lookahead(&self) -> impl Iterator<Item = Packet> + '_ {
        let mut pkt = self.pkt.clone();
        std::iter::from_fn(move || match pkt.next_packet() {
            Some(Ok((_, p))) => Some(p),
            _ => None,
        })
        .take(LOOKAHEAD_PACKETS)
    }

    /// BDM70: whether a TIP.PGE follows (the PSBEND just read) with only PAD, timing, PIP, MODE,
    /// VMCS or MNT packets in between (libipt's list).
    pub(super) fn tip_pge_follows_psbend(&self) -> bool {
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
    pub(super) fn apl12_tracing_is_off(&self) -> bool {
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
    pub(super) fn skd007_ovf_in_cyc(&mut self, off: u64) -> bool {
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
    pub(super) fn skz84_skip_tma(&mut self, e: &PacketError) -> bool {
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
    pub(super) fn pkt_base(&self) -> u64 {
        self.pkt.offset().wrapping_sub(self.pkt.position() as u64)
    }

    /// SKD022: whether the instruction at `ip` is VMLAUNCH or VMRESUME.
    pub(super) fn is_vm_entry(&self, ip: u64) -> bool {
        let mut bytes = [0u8; 16];
        let n = self.image.read(ip, &mut bytes);
        // VMLAUNCH and VMRESUME are `0F 01 C2` and `0F 01 C3` (after prefixes, if any):
        // without those bytes iced-x86 need not be asked, nor its tables built (≈ 0.4 ms of
        // a process's start, more than a short trace's whole decode).
        let opcode = |w: &[u8]| w[0] == 0x0F && w[1] == 0x01 && matches!(w[2], 0xC2 | 0xC3);
        if !bytes[..n].windows(3).any(opcode) {
            return false;
        }
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
    pub(super) fn reaches_without_trace(&mut self, x: u64) -> bool {
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
