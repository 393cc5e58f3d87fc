//! Packet encoding: [`Packet`]s → bytes, and an [`Encoder`] that picks the shortest IP
//! compression against its own Last-IP model (reference §1.5).

use super::decode::next_block_context;
use super::sync::PSB_BYTES;
use super::{IpCompression, IpPayload, LastIp, Packet, Tnt};

/// Why a packet value cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode {packet} packet: {reason}")]
pub struct EncodeError {
    /// The packet's name (as [`Packet::name`]).
    pub packet: &'static str,
    /// What is out of range.
    pub reason: &'static str,
}

/// Which IP packet to emit with [`Encoder::ip_packet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpKind {
    /// TIP.
    Tip,
    /// TIP.PGE.
    TipPge,
    /// TIP.PGD.
    TipPgd,
    /// FUP.
    Fup,
}

impl IpKind {
    /// The packet of this kind with payload `p`.
    pub fn packet(self, p: IpPayload) -> Packet {
        match self {
            IpKind::Tip => Packet::Tip(p),
            IpKind::TipPge => Packet::TipPge(p),
            IpKind::TipPgd => Packet::TipPgd(p),
            IpKind::Fup => Packet::Fup(p),
        }
    }

    /// The header's low five bits (the opcode without IPBytes).
    fn opcode(self) -> u8 {
        match self {
            IpKind::Tip => 0x0d,
            IpKind::TipPge => 0x11,
            IpKind::TipPgd => 0x01,
            IpKind::Fup => 0x1d,
        }
    }
}

impl Packet {
    /// The IP kind and payload of a TIP, TIP.PGE, TIP.PGD or FUP; `None` for other packets.
    pub fn ip_payload(&self) -> Option<(IpKind, IpPayload)> {
        match *self {
            Packet::Tip(p) => Some((IpKind::Tip, p)),
            Packet::TipPge(p) => Some((IpKind::TipPge, p)),
            Packet::TipPgd(p) => Some((IpKind::TipPgd, p)),
            Packet::Fup(p) => Some((IpKind::Fup, p)),
            _ => None,
        }
    }
}

fn check(p: &Packet, ok: bool, reason: &'static str) -> Result<(), EncodeError> {
    if ok {
        Ok(())
    } else {
        Err(EncodeError {
            packet: p.name(),
            reason,
        })
    }
}

fn fits(v: u64, bits: u32) -> bool {
    bits >= 64 || v >> bits == 0
}

fn tnt_ok(t: &Tnt, max: u8) -> bool {
    t.count >= 1 && t.count <= max && fits(t.bits, t.count as u32)
}

/// Writes an IP packet: header (opcode | IPBytes << 5), then the payload bytes.
fn encode_ip(
    p: &Packet,
    kind: IpKind,
    ip: IpPayload,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let len = ip.compression.payload_len();
    check(
        p,
        fits(ip.raw, 8 * len as u32),
        "IP payload wider than its IPBytes",
    )?;
    out.push(kind.opcode() | (ip.compression.ipbytes() << 5));
    out.extend_from_slice(&ip.raw.to_le_bytes()[..len]);
    Ok(())
}

/// Encodes `p` outside a BBP block, appending its bytes to `out`; returns the number of bytes
/// written. A BIP needs its block's payload size, so it is rejected here: use
/// [`encode_packet_in_block`] or [`Encoder::packet`].
///
/// Values that no packet can carry (a TNT with 0 or too many outcomes or bits above its count, a
/// payload wider than its field, a CR3 or VMCS pointer with bits outside the encoded range, a PTW
/// size other than 4 or 8, …) are rejected and nothing is written.
pub fn encode_packet(p: &Packet, out: &mut Vec<u8>) -> Result<usize, EncodeError> {
    encode_packet_in_block(p, None, out)
}

/// Encodes `p` with the BBP block context `block` (as in
/// [`decode_packet`](super::decode_packet)): a BIP is written with a 4-byte payload when
/// `block == Some(true)`, 8 bytes when `Some(false)`, and rejected outside a block.
pub fn encode_packet_in_block(
    p: &Packet,
    block: Option<bool>,
    out: &mut Vec<u8>,
) -> Result<usize, EncodeError> {
    let start = out.len();
    match *p {
        Packet::Pad => out.push(0x00),
        Packet::ShortTnt(t) => {
            check(
                p,
                tnt_ok(&t, 6),
                "TNT-8 needs 1..=6 outcomes within the count",
            )?;
            out.push((((1u64 << t.count) | t.bits) << 1) as u8);
        }
        Packet::LongTnt(t) => {
            check(
                p,
                tnt_ok(&t, 47),
                "long TNT needs 1..=47 outcomes within the count",
            )?;
            let v = (1u64 << t.count) | t.bits;
            out.extend_from_slice(&[0x02, 0xa3]);
            out.extend_from_slice(&v.to_le_bytes()[..6]);
        }
        Packet::Tip(ip) => encode_ip(p, IpKind::Tip, ip, out)?,
        Packet::TipPge(ip) => encode_ip(p, IpKind::TipPge, ip, out)?,
        Packet::TipPgd(ip) => encode_ip(p, IpKind::TipPgd, ip, out)?,
        Packet::Fup(ip) => encode_ip(p, IpKind::Fup, ip, out)?,
        Packet::ModeExec { csl, csd, iflag } => {
            out.extend_from_slice(&[0x99, csl as u8 | (csd as u8) << 1 | (iflag as u8) << 2]);
        }
        Packet::ModeTsx { intx, abort } => {
            out.extend_from_slice(&[0x99, 0x20 | intx as u8 | (abort as u8) << 1]);
        }
        Packet::Pip { cr3, nr } => {
            check(
                p,
                cr3 & 0x1f == 0 && fits(cr3, 52),
                "CR3 must have bits 4:0 and 63:52 clear",
            )?;
            let v = (cr3 >> 4) | nr as u64;
            out.extend_from_slice(&[0x02, 0x43]);
            out.extend_from_slice(&v.to_le_bytes()[..6]);
        }
        Packet::TraceStop => out.extend_from_slice(&[0x02, 0x83]),
        Packet::Cbr { ratio } => out.extend_from_slice(&[0x02, 0x03, ratio, 0]),
        Packet::Tsc { tsc } => {
            check(p, fits(tsc, 56), "TSC carries only 56 bits")?;
            out.push(0x19);
            out.extend_from_slice(&tsc.to_le_bytes()[..7]);
        }
        Packet::Mtc { ctc } => out.extend_from_slice(&[0x59, ctc]),
        Packet::Tma { ctc, fc } => {
            check(p, fits(fc as u64, 9), "TMA FastCounter has 9 bits")?;
            let c = ctc.to_le_bytes();
            out.extend_from_slice(&[0x02, 0x73, c[0], c[1], 0, fc as u8, (fc >> 8) as u8]);
        }
        Packet::Cyc { value } => {
            let mut b0 = ((value & 0x1f) << 3) as u8 | 0x03;
            let mut rest = value >> 5;
            if rest != 0 {
                b0 |= 4;
            }
            out.push(b0);
            while rest != 0 {
                let mut c = ((rest & 0x7f) << 1) as u8;
                rest >>= 7;
                if rest != 0 {
                    c |= 1;
                }
                out.push(c);
            }
        }
        Packet::Vmcs { base } => {
            check(
                p,
                base & 0xfff == 0 && fits(base, 52),
                "VMCS pointer is bits 51:12",
            )?;
            out.extend_from_slice(&[0x02, 0xc8]);
            out.extend_from_slice(&(base >> 12).to_le_bytes()[..5]);
        }
        Packet::Ovf => out.extend_from_slice(&[0x02, 0xf3]),
        Packet::Psb => out.extend_from_slice(&PSB_BYTES),
        Packet::PsbEnd => out.extend_from_slice(&[0x02, 0x23]),
        Packet::Mnt { payload } => {
            out.extend_from_slice(&[0x02, 0xc3, 0x88]);
            out.extend_from_slice(&payload.to_le_bytes());
        }
        Packet::Ptw { payload, size, ip } => {
            let ipb = (ip as u8) << 7;
            match size {
                4 => {
                    check(
                        p,
                        fits(payload, 32),
                        "4-byte PTW payload wider than 32 bits",
                    )?;
                    out.extend_from_slice(&[0x02, 0x12 | ipb]);
                    out.extend_from_slice(&(payload as u32).to_le_bytes());
                }
                8 => {
                    out.extend_from_slice(&[0x02, 0x32 | ipb]);
                    out.extend_from_slice(&payload.to_le_bytes());
                }
                _ => check(p, false, "PTW payload size must be 4 or 8")?,
            }
        }
        Packet::Exstop { ip } => out.extend_from_slice(&[0x02, 0x62 | (ip as u8) << 7]),
        Packet::Mwait { hints, ext } => {
            check(p, ext < 4, "MWAIT extensions have 2 bits")?;
            out.extend_from_slice(&[0x02, 0xc2, hints, 0, 0, 0, ext, 0, 0, 0]);
        }
        Packet::Pwre {
            hw,
            state,
            substate,
        } => {
            check(p, state < 16 && substate < 16, "PWRE C-states have 4 bits")?;
            out.extend_from_slice(&[0x02, 0x22, (hw as u8) << 7, state << 4 | substate]);
        }
        Packet::Pwrx {
            last,
            deepest,
            wake,
        } => {
            check(
                p,
                last < 16 && deepest < 16 && wake < 16,
                "PWRX fields have 4 bits",
            )?;
            out.extend_from_slice(&[0x02, 0xa2, last << 4 | deepest, wake, 0, 0, 0]);
        }
        Packet::Bbp { sz, kind } => {
            check(p, kind < 32, "BBP type has 5 bits")?;
            out.extend_from_slice(&[0x02, 0x63, (sz as u8) << 7 | kind]);
        }
        Packet::Bip { id, value } => {
            check(p, id < 32, "BIP id has 5 bits")?;
            match block {
                Some(true) => {
                    check(p, fits(value, 32), "4-byte BIP value wider than 32 bits")?;
                    out.push(id << 3 | 4);
                    out.extend_from_slice(&(value as u32).to_le_bytes());
                }
                Some(false) => {
                    out.push(id << 3 | 4);
                    out.extend_from_slice(&value.to_le_bytes());
                }
                None => check(p, false, "BIP outside a BBP block")?,
            }
        }
        Packet::Bep { ip } => out.extend_from_slice(&[0x02, 0x33 | (ip as u8) << 7]),
        Packet::Cfe { ip, kind, vector } => {
            check(p, kind < 32, "CFE type has 5 bits")?;
            out.extend_from_slice(&[0x02, 0x13, (ip as u8) << 7 | kind, vector]);
        }
        Packet::Evd { kind, payload } => {
            check(p, kind < 64, "EVD type has 6 bits")?;
            out.extend_from_slice(&[0x02, 0x53, kind]);
            out.extend_from_slice(&payload.to_le_bytes());
        }
    }
    Ok(out.len() - start)
}

/// The shortest compression of `ip` against `last` (reference §1.5): Update16, then Update32,
/// then Sext48 (only when bits 63:48 are the sign extension of bit 47) or Update48, then Full.
/// Compressions against Last IP are used only when it is known.
pub fn shortest_compression(last: &LastIp, ip: u64) -> IpPayload {
    let sext = (((ip << 16) as i64) >> 16) as u64 == ip;
    let compression = match last.ip() {
        Some(l) if l >> 16 == ip >> 16 => IpCompression::Update16,
        Some(l) if l >> 32 == ip >> 32 => IpCompression::Update32,
        _ if sext => IpCompression::Sext48,
        Some(l) if l >> 48 == ip >> 48 => IpCompression::Update48,
        _ => IpCompression::Full,
    };
    let len = compression.payload_len();
    let raw = if len == 8 {
        ip
    } else {
        ip & ((1u64 << (8 * len)) - 1)
    };
    IpPayload::new(compression, raw)
}

/// A stateful encoder: tracks its own Last IP (to choose the shortest IP compression) and the BBP
/// block context (to size BIP payloads).
///
/// A new encoder does not know Last IP, so until its first [`Encoder::psb`] it only uses Sext48 or
/// Full payloads. After an OVF it forgets Last IP again, so the stream decodes the same whether
/// the decoder resets Last IP at OVF (libipt) or not (perf).
#[derive(Debug, Clone, Default)]
pub struct Encoder {
    last_ip: LastIp,
    block: Option<bool>,
}

impl Encoder {
    /// A new encoder with unknown Last IP, outside any block.
    pub fn new() -> Self {
        Self::default()
    }

    /// The encoder's Last-IP model.
    pub fn last_ip(&self) -> &LastIp {
        &self.last_ip
    }

    /// Emits a PSB and resets the Last-IP model to 0 (as the processor does). Returns 16.
    pub fn psb(&mut self, out: &mut Vec<u8>) -> usize {
        out.extend_from_slice(&PSB_BYTES);
        self.last_ip.reset();
        self.block = None;
        PSB_BYTES.len()
    }

    /// Emits an IP packet for `ip` with the shortest valid compression against Last IP (`None`:
    /// IP suppressed, Last IP unchanged) and updates the model. Returns the bytes written.
    pub fn ip_packet(
        &mut self,
        kind: IpKind,
        ip: Option<u64>,
        out: &mut Vec<u8>,
    ) -> Result<usize, EncodeError> {
        let payload = match ip {
            None => IpPayload::new(IpCompression::Suppressed, 0),
            Some(ip) => shortest_compression(&self.last_ip, ip),
        };
        self.packet(&kind.packet(payload), out)
    }

    /// Emits any packet as given (IP payloads keep their compression) and keeps the Last-IP model
    /// and the block context up to date. An IP payload compressed against an unknown Last IP is
    /// rejected, since no decoder could reconstruct it.
    pub fn packet(&mut self, p: &Packet, out: &mut Vec<u8>) -> Result<usize, EncodeError> {
        let mut last_ip = self.last_ip;
        match p {
            Packet::Psb => last_ip.reset(),
            Packet::Ovf => last_ip.forget(),
            _ => {
                if let Some((_, payload)) = p.ip_payload() {
                    last_ip.apply(payload).map_err(|_| EncodeError {
                        packet: p.name(),
                        reason: "IP compressed against an unknown Last IP",
                    })?;
                }
            }
        }
        let n = encode_packet_in_block(p, self.block, out)?;
        self.last_ip = last_ip;
        self.block = next_block_context(self.block, p);
        Ok(n)
    }
}
