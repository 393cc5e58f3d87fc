//! Zero-copy packet decoding: bytes → [`Packet`]s.
//!
//! The hot path borrows a fixed 16-byte window of the input (the longest packet, PSB, is 16
//! bytes) whenever at least 16 bytes remain, so the per-packet work is one test for the one-byte
//! packets (PAD, TNT-8) and a copy from a 256-entry packet table, or a 256-entry first-byte table
//! lookup and one jump for the rest, and a few loads with no bounds
//! checks. Near the end of the buffer the remaining bytes are copied into a zero-padded window and
//! the result is checked against what is actually there, which is what turns a cut-off packet into
//! [`PacketError::Truncated`] instead of a bogus [`PacketError::Invalid`].
//!
//! Performance notes (measured with `examples/bench_packets.rs`, see `docs/benchmarks.md`):
//! consumers should borrow the returned packet (`match &item`) rather than move it out of the
//! result right away (with [`PacketDecoder::read`]: 4.2× `pt_pkt_next` borrowed, 3.0× moved out,
//! in session 7), and [`PacketDecoder::decode_into`] is the batch API.

use super::sync::{PSB_BYTES, find_psb_forward};
use super::{IpCompression, IpPayload, Packet, PacketError, Tnt};

/// Length of the fixed decoding window: the longest packet (PSB) is 16 bytes.
const WINDOW: usize = 16;

/// The 16 bytes of a PSB: `02 82` eight times, as a little-endian `u128`.
pub(crate) const PSB_U128: u128 = u128::from_le_bytes(PSB_BYTES);

/// First-byte classes (outside a BBP block; the BIP test runs before the table lookup).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Class {
    Pad,
    Ext,
    Tnt,
    Cyc,
    TipPgd,
    Tip,
    TipPge,
    Fup,
    Tsc,
    Mtc,
    Mode,
    Trig,
    Bad,
}

/// The 256-entry first-byte dispatch table (SDM "Packet Summary"; reference §1.1).
static CLASS: [Class; 256] = build_class_table();

const fn build_class_table() -> [Class; 256] {
    let mut t = [Class::Bad; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = if b == 0x00 {
            Class::Pad
        } else if b == 0x02 {
            Class::Ext
        } else if b & 1 == 0 {
            Class::Tnt
        } else if b & 3 == 3 {
            Class::Cyc
        } else {
            match b & 0x1f {
                0x01 => Class::TipPgd,
                0x0d => Class::Tip,
                0x11 => Class::TipPge,
                0x1d => Class::Fup,
                0x19 => match b {
                    0x19 => Class::Tsc,
                    0x59 => Class::Mtc,
                    0x99 => Class::Mode,
                    0xd9 => Class::Trig,
                    _ => Class::Bad,
                },
                _ => Class::Bad,
            }
        };
        i += 1;
    }
    t
}

/// For every first byte `b` that is a complete one-byte packet outside a BBP block (PAD and TNT-8,
/// see [`is_one_byte_packet`]; 82 % of the packets of the corpus): that packet. Other entries hold
/// a PAD that is never used.
///
/// Why a table: the hot path then has one data-dependent branch ("one-byte packet or not",
/// computed from `b` alone so that it resolves early) instead of "PAD, TNT-8 or other", and the
/// packet itself is a plain copy that no branch waits for.
static ONE_BYTE_PACKET: [Packet; 256] = build_one_byte_table();

const fn build_one_byte_table() -> [Packet; 256] {
    let mut t = [Packet::Pad; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        if b != 0 && is_one_byte_packet(b) {
            t[i] = Packet::ShortTnt(tnt8(b));
        }
        i += 1;
    }
    t
}

/// Whether `b0` alone is a complete packet outside a BBP block: PAD (`00`) or TNT-8 (any other
/// even byte but the extended opcode `02`). Inside a block `xxxxx100` is a BIP instead.
#[inline(always)]
const fn is_one_byte_packet(b0: u8) -> bool {
    // `&` rather than `&&`: one branch on the combined condition.
    (b0 & 1 == 0) & (b0 != 2)
}

/// IPBytes (0..=7) → compression; `None` for the reserved 101 and 111. A `match` onto the
/// discriminants, which are the field's values: compiled to a test, not a table.
#[inline(always)]
const fn ip_compression(ipb: usize) -> Option<IpCompression> {
    match ipb {
        0 => Some(IpCompression::Suppressed),
        1 => Some(IpCompression::Update16),
        2 => Some(IpCompression::Update32),
        3 => Some(IpCompression::Sext48),
        4 => Some(IpCompression::Update48),
        6 => Some(IpCompression::Full),
        _ => None,
    }
}

/// IPBytes → payload length in bytes (reserved values: 0, never used).
static IP_PAYLOAD_LEN: [u8; 8] = [0, 2, 4, 6, 6, 0, 8, 0];

/// IPBytes → mask of the payload bits.
static IP_PAYLOAD_MASK: [u64; 8] = [
    0,
    0xffff,
    0xffff_ffff,
    0xffff_ffff_ffff,
    0xffff_ffff_ffff,
    0,
    u64::MAX,
    0,
];

const MASK_48: u64 = 0xffff_ffff_ffff;

#[inline(always)]
fn le64(w: &[u8; WINDOW], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&w[at..at + 8]);
    u64::from_le_bytes(b)
}

#[inline(always)]
fn le32(w: &[u8; WINDOW], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&w[at..at + 4]);
    u32::from_le_bytes(b)
}

#[inline(always)]
fn le16(w: &[u8; WINDOW], at: usize) -> u16 {
    u16::from_le_bytes([w[at], w[at + 1]])
}

/// Whether a packet keeps an open BBP block open (reference §1.4: the block context survives PAD,
/// TSC, TMA, MTC, CYC, CBR, MNT, FUP, EXSTOP, PWRE, PWRX and BIP; a BBP opens a new block; anything
/// else ends it).
///
/// Returns the block context that applies to the packet after `p`, given the context `block` that
/// applied to `p` (`Some(sz)` inside a block whose BIP payloads are 4 bytes when `sz` is true).
#[inline(always)]
pub fn next_block_context(block: Option<bool>, p: &Packet) -> Option<bool> {
    match p {
        Packet::Bbp { sz, .. } => Some(*sz),
        Packet::Pad
        | Packet::Tsc { .. }
        | Packet::Tma { .. }
        | Packet::Mtc { .. }
        | Packet::Cyc { .. }
        | Packet::Cbr { .. }
        | Packet::Mnt { .. }
        | Packet::Fup(_)
        | Packet::Exstop { .. }
        | Packet::Pwre { .. }
        | Packet::Pwrx { .. }
        | Packet::Bip { .. } => block,
        _ => None,
    }
}

/// Applies a packet's effect on the BBP block context (see [`next_block_context`]) to `$place`:
/// `keep` for the packets a block survives, `end` for those that end it, `(sz)` for a BBP.
macro_rules! update_block {
    ($place:expr, keep) => {};
    ($place:expr, end) => {
        $place = None
    };
    ($place:expr, ($sz:expr)) => {
        $place = Some($sz)
    };
}

/// The packet decoding table, as a macro so that every arm hands its packet straight to the
/// caller's `$emit!(packet, length, block_effect)` (or `$err!(reason)`).
///
/// Why a macro: the arms construct different enum variants. Joining them into one `Packet` value
/// and then moving it into the caller's result makes the compiler assemble the packet in a stack
/// temporary with narrow stores and copy it out with wide loads, a store-forwarding stall on
/// every packet that cost more than the decoding itself. Expanding the caller's construction
/// into each arm builds the packet in its final place.
///
/// `$w` is a `&[u8; 16]` window starting at the packet (zero padded near the end of the buffer;
/// callers check the length against the real bytes), `$block` the BBP block context.
macro_rules! decode_window {
    ($w:ident, $block:expr, $emit:ident, $err:ident) => {{
        let b0 = $w[0];
        if let (Some(sz), 4) = ($block, b0 & 7) {
            // Inside a block `xxxxx100` is a BIP: this test runs before the TNT test.
            let id = b0 >> 3;
            if sz {
                $emit!(
                    Packet::Bip {
                        id,
                        value: le32($w, 1) as u64
                    },
                    5,
                    keep
                )
            } else {
                $emit!(
                    Packet::Bip {
                        id,
                        value: le64($w, 1)
                    },
                    9,
                    keep
                )
            }
        } else if b0 == 0 {
            // PAD and TNT-8 are by far the most frequent packets: test for them before the
            // jump table.
            $emit!(Packet::Pad, 1, keep)
        } else if b0 & 1 == 0 && b0 != 2 {
            $emit!(Packet::ShortTnt(tnt8(b0)), 1, end)
        } else if b0 == 2 {
            // The extended opcodes (most of the PSB+ sequence) by a direct test rather than
            // through the first-byte jump table.
            decode_ext!($w, $emit, $err)
        } else {
            match CLASS[b0 as usize] {
                Class::Tnt => $emit!(Packet::ShortTnt(tnt8(b0)), 1, end),
                Class::Pad => $emit!(Packet::Pad, 1, keep),
                Class::Tip | Class::TipPge | Class::TipPgd | Class::Fup => {
                    ip_packet!($w, b0, $emit, $err)
                }
                // Not reached: `02` is tested above.
                Class::Ext => $err!("invalid opcode"),
                Class::Cyc => match decode_cyc($w) {
                    Ok((value, len)) => $emit!(Packet::Cyc { value }, len, keep),
                    Err(reason) => $err!(reason),
                },
                Class::Tsc => {
                    $emit!(
                        Packet::Tsc {
                            tsc: le64($w, 1) & 0x00ff_ffff_ffff_ffff
                        },
                        8,
                        keep
                    )
                }
                Class::Mtc => $emit!(Packet::Mtc { ctc: $w[1] }, 2, keep),
                Class::Mode => {
                    let b1 = $w[1];
                    match b1 >> 5 {
                        0 => $emit!(
                            Packet::ModeExec {
                                csl: b1 & 1 != 0,
                                csd: b1 & 2 != 0,
                                iflag: b1 & 4 != 0,
                            },
                            2,
                            end
                        ),
                        1 => $emit!(
                            Packet::ModeTsx {
                                intx: b1 & 1 != 0,
                                abort: b1 & 2 != 0
                            },
                            2,
                            end
                        ),
                        _ => $err!("MODE packet with a reserved leaf (not 000 or 001)"),
                    }
                }
                Class::Trig => $err!("TRIG packet (0xD9) is not supported"),
                Class::Bad => $err!("invalid opcode"),
            }
        }
    }};
}

/// TIP, TIP.PGE, TIP.PGD and FUP: IPBytes in b0[7:5], then 0..8 payload bytes.
///
/// One target of the first-byte dispatch for the four kinds, which differ only in the tag (and
/// FUP keeping a BBP block open): the payload and the length are computed once, then a small
/// match on the opcode bits picks the kind. (With one dispatch target per kind, the indirect
/// jump mispredicted on the mix of TIP, TIP.PGE, TIP.PGD and FUP; see docs/benchmarks.md.)
macro_rules! ip_packet {
    ($w:ident, $b0:ident, $emit:ident, $err:ident) => {{
        let ipb = ($b0 >> 5) as usize;
        match ip_compression(ipb) {
            None => $err!("reserved IPBytes value (101 or 111)"),
            Some(compression) => {
                let pl = IpPayload::new(compression, le64($w, 1) & IP_PAYLOAD_MASK[ipb]);
                let len = 1 + IP_PAYLOAD_LEN[ipb] as usize;
                match $b0 & 0x1f {
                    0x0d => $emit!(Packet::Tip(pl), len, end),
                    0x11 => $emit!(Packet::TipPge(pl), len, end),
                    0x01 => $emit!(Packet::TipPgd(pl), len, end),
                    _ => $emit!(Packet::Fup(pl), len, keep),
                }
            }
        }
    }};
}

/// Extended opcodes (`02 xx`); see [`decode_window!`].
macro_rules! decode_ext {
    ($w:ident, $emit:ident, $err:ident) => {{
        let b1 = $w[1];
        let b2 = $w[2];
        // The extended packets of a PSB+ sequence (PSB, PIP, VMCS, CBR, PSBEND) through direct
        // tests, whose branches the predictor learns from the fixed order of the sequence,
        // before the jump table for the rest (see docs/benchmarks.md, session 9).
        if b1 == 0x82 {
            if u128::from_le_bytes(*$w) != PSB_U128 {
                $err!("malformed PSB (02 82 not repeated 8 times)")
            } else {
                $emit!(Packet::Psb, 16, end)
            }
        } else if b1 == 0x43 {
            let v = le64($w, 2) & MASK_48;
            $emit!(
                Packet::Pip {
                    cr3: (v & !1) << 4,
                    nr: v & 1 != 0
                },
                8,
                end
            )
        } else if b1 == 0xc8 {
            let v = le64($w, 2) & 0xff_ffff_ffff;
            $emit!(Packet::Vmcs { base: v << 12 }, 7, end)
        } else if b1 == 0x03 {
            $emit!(Packet::Cbr { ratio: b2 }, 4, keep)
        } else if b1 == 0x23 {
            $emit!(Packet::PsbEnd, 2, end)
        } else {
            match b1 {
                0xa3 => {
                    let v = le64($w, 2) & MASK_48;
                    if v <= 1 {
                        $err!("long TNT without TNT bits (no stop bit or stop bit only)")
                    } else {
                        let count = 63 - v.leading_zeros() as u8;
                        $emit!(
                            Packet::LongTnt(Tnt::new(v & ((1u64 << count) - 1), count)),
                            8,
                            end
                        )
                    }
                }
                0x73 => {
                    if $w[6] & 0xfe != 0 {
                        $err!("TMA with reserved bits set")
                    } else {
                        let ctc = le16($w, 2);
                        let fc = $w[5] as u16 | ((($w[6] & 1) as u16) << 8);
                        $emit!(Packet::Tma { ctc, fc }, 7, keep)
                    }
                }
                0xf3 => $emit!(Packet::Ovf, 2, end),
                0x83 => $emit!(Packet::TraceStop, 2, end),
                0xc3 => {
                    if b2 != 0x88 {
                        $err!("invalid MNT sub-opcode (02 C3 not followed by 88)")
                    } else {
                        $emit!(
                            Packet::Mnt {
                                payload: le64($w, 3)
                            },
                            11,
                            keep
                        )
                    }
                }
                0x12 | 0x92 => $emit!(
                    Packet::Ptw {
                        payload: le32($w, 2) as u64,
                        size: 4,
                        ip: b1 & 0x80 != 0
                    },
                    6,
                    end
                ),
                0x32 | 0xb2 => {
                    $emit!(
                        Packet::Ptw {
                            payload: le64($w, 2),
                            size: 8,
                            ip: b1 & 0x80 != 0
                        },
                        10,
                        end
                    )
                }
                0x52 | 0x72 | 0xd2 | 0xf2 => $err!("PTW with a reserved payload size"),
                0x62 | 0xe2 => $emit!(Packet::Exstop { ip: b1 & 0x80 != 0 }, 2, keep),
                0xc2 => $emit!(
                    Packet::Mwait {
                        hints: b2,
                        ext: $w[6] & 3
                    },
                    10,
                    end
                ),
                0x22 => $emit!(
                    Packet::Pwre {
                        hw: b2 & 0x80 != 0,
                        state: $w[3] >> 4,
                        substate: $w[3] & 0xf
                    },
                    4,
                    keep
                ),
                0xa2 => $emit!(
                    Packet::Pwrx {
                        last: b2 >> 4,
                        deepest: b2 & 0xf,
                        wake: $w[3] & 0xf
                    },
                    7,
                    keep
                ),
                0x63 => {
                    let sz = b2 & 0x80 != 0;
                    $emit!(
                        Packet::Bbp {
                            sz,
                            kind: b2 & 0x1f
                        },
                        3,
                        (sz)
                    )
                }
                0x33 | 0xb3 => $emit!(Packet::Bep { ip: b1 & 0x80 != 0 }, 2, end),
                0x13 => $emit!(
                    Packet::Cfe {
                        ip: b2 & 0x80 != 0,
                        kind: b2 & 0x1f,
                        vector: $w[3]
                    },
                    4,
                    end
                ),
                0x53 => $emit!(
                    Packet::Evd {
                        kind: b2 & 0x3f,
                        payload: le64($w, 3)
                    },
                    11,
                    end
                ),
                _ => $err!("invalid extended opcode"),
            }
        }
    }};
}

/// The outcomes of a TNT-8 opcode `b0` (even, neither `00` nor `02`): the 7-bit field `b0 >> 1`
/// has its stop bit above at least one TNT bit.
#[inline(always)]
const fn tnt8(b0: u8) -> Tnt {
    let field = b0 >> 1;
    let count = 7 - field.leading_zeros() as u8;
    Tnt::new((field as u64) & ((1u64 << count) - 1), count)
}

/// Decodes the packet at the start of `w` (function form of [`decode_window!`], for the slow
/// path): the packet and its length.
#[inline(always)]
fn decode_window(w: &[u8; WINDOW], block: Option<bool>) -> Result<(Packet, usize), &'static str> {
    macro_rules! emit {
        ($p:expr, $len:expr, $blk:tt) => {
            Ok(($p, $len))
        };
    }
    macro_rules! err {
        ($r:expr) => {
            Err($r)
        };
    }
    decode_window!(w, block, emit, err)
}

/// CYC: b0[2] = Exp, b0[7:3] = value[4:0]; each extension byte: bit 0 = Exp, bits 7:1 = the next
/// 7 value bits. At most 10 bytes (5 + 8·7 + 3 = 64 bits); more would overflow 64 bits.
/// Returns the value and the packet length.
#[inline(always)]
fn decode_cyc(w: &[u8; WINDOW]) -> Result<(u64, usize), &'static str> {
    let b0 = w[0];
    let mut value = (b0 >> 3) as u64;
    if b0 & 4 == 0 {
        return Ok((value, 1));
    }
    let mut shift = 5u32;
    let mut i = 1usize;
    while i < WINDOW {
        let c = w[i];
        let bits = (c >> 1) as u64;
        // The 10th byte (shift 61) has room for 3 value bits and must end the packet.
        if shift == 61 && (bits >> 3 != 0 || c & 1 != 0) {
            return Err("CYC value overflows 64 bits");
        }
        value |= bits << shift;
        i += 1;
        if c & 1 == 0 {
            return Ok((value, i));
        }
        shift += 7;
    }
    Err("CYC value overflows 64 bits")
}

/// What the header bytes alone say about a packet's length (slow path only).
enum HeaderLen {
    /// The packet is this long in total.
    Known(usize),
    /// The length is not yet determined; at least this many more bytes are needed.
    NeedMore(usize),
    /// The header itself is invalid.
    Invalid(&'static str),
}

/// Determines the length of the packet at the start of `avail` from its header bytes, for a buffer
/// that ends within 16 bytes. Used only to tell a cut-off packet from an invalid one.
fn header_len(avail: &[u8], block: Option<bool>) -> HeaderLen {
    let Some(&b0) = avail.first() else {
        return HeaderLen::NeedMore(1);
    };
    if let Some(sz) = block {
        if b0 & 7 == 4 {
            return HeaderLen::Known(if sz { 5 } else { 9 });
        }
    }
    match CLASS[b0 as usize] {
        Class::Pad | Class::Tnt => HeaderLen::Known(1),
        Class::Tip | Class::TipPge | Class::TipPgd | Class::Fup => {
            let ipb = (b0 >> 5) as usize;
            if ip_compression(ipb).is_none() {
                return HeaderLen::Invalid("reserved IPBytes value (101 or 111)");
            }
            HeaderLen::Known(1 + IP_PAYLOAD_LEN[ipb] as usize)
        }
        Class::Tsc => HeaderLen::Known(8),
        Class::Mtc | Class::Mode => HeaderLen::Known(2),
        Class::Trig => HeaderLen::Invalid("TRIG packet (0xD9) is not supported"),
        Class::Bad => HeaderLen::Invalid("invalid opcode"),
        Class::Cyc => {
            if b0 & 4 == 0 {
                return HeaderLen::Known(1);
            }
            for (i, &c) in avail.iter().enumerate().skip(1) {
                if c & 1 == 0 {
                    return HeaderLen::Known(i + 1);
                }
            }
            HeaderLen::NeedMore(1)
        }
        Class::Ext => {
            let Some(&b1) = avail.get(1) else {
                return HeaderLen::NeedMore(1);
            };
            let len = match b1 {
                0xa3 | 0x43 => 8,
                0x82 => {
                    if avail.iter().zip(PSB_BYTES.iter()).any(|(a, b)| a != b) {
                        return HeaderLen::Invalid("malformed PSB (02 82 not repeated 8 times)");
                    }
                    16
                }
                0x23 | 0xf3 | 0x83 | 0x62 | 0xe2 | 0x33 | 0xb3 => 2,
                0x03 | 0x22 | 0x13 => 4,
                0x73 | 0xc8 | 0xa2 => 7,
                0xc3 => match avail.get(2) {
                    None => return HeaderLen::NeedMore(1),
                    Some(0x88) => 11,
                    Some(_) => {
                        return HeaderLen::Invalid(
                            "invalid MNT sub-opcode (02 C3 not followed by 88)",
                        );
                    }
                },
                0x12 | 0x92 => 6,
                0x32 | 0xb2 | 0xc2 => 10,
                0x52 | 0x72 | 0xd2 | 0xf2 => {
                    return HeaderLen::Invalid("PTW with a reserved payload size");
                }
                0x63 => 3,
                0x53 => 11,
                _ => return HeaderLen::Invalid("invalid extended opcode"),
            };
            HeaderLen::Known(len)
        }
    }
}

/// Error of the position-independent core: turned into a [`PacketError`] with an offset by the
/// callers.
#[derive(Clone, Copy)]
enum CoreError {
    Invalid(&'static str),
    Truncated(usize),
}

impl CoreError {
    #[inline]
    fn at(self, offset: u64) -> PacketError {
        match self {
            CoreError::Invalid(reason) => PacketError::Invalid { offset, reason },
            CoreError::Truncated(needed) => PacketError::Truncated { offset, needed },
        }
    }
}

/// Slow path: fewer than 16 bytes remain at `pos` (and at least one).
#[cold]
#[inline(never)]
fn decode_tail(buf: &[u8], pos: usize, block: Option<bool>) -> Result<(Packet, usize), CoreError> {
    let avail = &buf[pos.min(buf.len())..];
    let rem = avail.len();
    let mut w = [0u8; WINDOW];
    let n = rem.min(WINDOW);
    w[..n].copy_from_slice(&avail[..n]);
    match decode_window(&w, block) {
        Ok((p, len)) if len <= rem => Ok((p, len)),
        Ok((_, len)) => Err(CoreError::Truncated(len - rem)),
        Err(reason) => match header_len(avail, block) {
            HeaderLen::Known(len) if len > rem => Err(CoreError::Truncated(len - rem)),
            HeaderLen::Known(_) => Err(CoreError::Invalid(reason)),
            HeaderLen::NeedMore(n) => Err(CoreError::Truncated(n)),
            HeaderLen::Invalid(r) => Err(CoreError::Invalid(r)),
        },
    }
}

/// Decodes one packet at `pos`, position-independent error.
#[inline(always)]
fn decode_core(buf: &[u8], pos: usize, block: Option<bool>) -> Result<(Packet, usize), CoreError> {
    if let Some(w) = buf.get(pos..).and_then(|s| s.first_chunk::<WINDOW>()) {
        decode_window(w, block).map_err(CoreError::Invalid)
    } else {
        decode_tail(buf, pos, block)
    }
}

/// Decodes the one packet that starts at `buf[pos]` and returns it with its length in bytes.
///
/// `block` is the BBP block context that applies at `pos`: `Some(sz)` inside a block opened by a
/// `BBP` whose SZ bit is `sz` (BIP payloads of 4 bytes when true, 8 when false), `None` otherwise.
/// [`next_block_context`] computes the context for the following packet; [`PacketDecoder`] tracks
/// it for you.
///
/// Errors carry `pos` as their offset. A packet that the end of `buf` cuts off (including
/// `pos >= buf.len()`) is [`PacketError::Truncated`], never [`PacketError::Invalid`].
#[inline]
pub fn decode_packet(
    buf: &[u8],
    pos: usize,
    block: Option<bool>,
) -> Result<(Packet, usize), PacketError> {
    decode_core(buf, pos, block).map_err(|e| e.at(pos as u64))
}

/// [`PacketDecoder::read`]'s error for an invalid packet at `pos` (out of line, over values).
#[cold]
#[inline(never)]
fn invalid_at(base: u64, pos: usize, reason: &'static str) -> PacketError {
    CoreError::Invalid(reason).at(base.wrapping_add(pos as u64))
}

/// What [`read_tail_at`] leaves: the result and the decoder's new state.
struct TailRead {
    result: Result<Packet, Stop>,
    pos: usize,
    block: Option<bool>,
    last: usize,
    /// The error behind `Err(Stop::Error)`, offset still to be added.
    error: Option<CoreError>,
}

/// [`PacketDecoder::read`] within 16 bytes of the end of the buffer, over values (see `read`):
/// the same packets, errors and positions as [`PacketDecoder::next_packet`]'s tail; `last`
/// (the previous packet's position) stays at the end and after an error, as there.
///
/// `#[cold]` because it runs once per buffer: marked so, its call no longer counts as part of
/// the caller's loop, and the loop's own values (a consumer's counters) keep their registers
/// instead of being spilled around it, a read-modify-write of the stack per packet
/// (docs/benchmarks.md, session 15).
#[cold]
#[inline(never)]
fn read_tail_at(buf: &[u8], pos: usize, block: Option<bool>, last: usize) -> TailRead {
    if pos >= buf.len() {
        return TailRead {
            result: Err(Stop::End),
            pos,
            block,
            last,
            error: None,
        };
    }
    match decode_tail(buf, pos, block) {
        Ok((p, len)) => TailRead {
            pos: pos + len,
            block: next_block_context(block, &p),
            result: Ok(p),
            last: pos,
            error: None,
        },
        Err(e) => TailRead {
            result: Err(Stop::Error),
            pos: match e {
                CoreError::Invalid(_) => pos + 1,
                CoreError::Truncated(_) => buf.len(),
            },
            block: None,
            last,
            error: Some(e),
        },
    }
}

/// A zero-copy packet decoder over a byte slice. It tracks the BBP block context itself.
///
/// Iterating yields `(offset, packet)` pairs, where the offset is the base offset given to
/// [`PacketDecoder::with_base_offset`] plus the packet's position in the slice.
///
/// Error handling: after [`PacketError::Invalid`] the decoder has stepped one byte past the bad
/// packet's first byte (so it always makes progress) and left any block; the caller decides what
/// to do, typically [`PacketDecoder::sync_forward`] to the next PSB. After
/// [`PacketError::Truncated`] the decoder is at the end of the buffer and stops.
#[derive(Debug, Clone)]
pub struct PacketDecoder<'a> {
    buf: &'a [u8],
    pos: usize,
    base: u64,
    block: Option<bool>,
    /// Position of the packet [`PacketDecoder::read`] returned last.
    last: usize,
    /// The error that ended [`PacketDecoder::read`]'s last call, until taken.
    error: Option<PacketError>,
}

/// Why [`PacketDecoder::read`] returned no packet. One byte, so that `Result<Packet, Stop>`
/// stays the 16 bytes of a [`Packet`] (the packet's tag has room for it) and comes back in two
/// registers; the error itself waits in the decoder ([`PacketDecoder::take_error`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The end of the buffer: no more packets.
    End,
    /// A packet could not be decoded: [`PacketDecoder::take_error`] says why and where. The
    /// decoder stands where [`PacketDecoder::next_packet`] would leave it after that error.
    Error,
}

// The per-packet result must stay in registers (see `Stop`).
const _: () = assert!(std::mem::size_of::<Result<Packet, Stop>>() == 16);

impl<'a> PacketDecoder<'a> {
    /// A decoder at the start of `buf`; offsets are positions in `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self::with_base_offset(buf, 0)
    }

    /// A decoder at the start of `buf` whose reported offsets are `base + position`.
    pub fn with_base_offset(buf: &'a [u8], base: u64) -> Self {
        PacketDecoder {
            buf,
            pos: 0,
            base,
            block: None,
            last: 0,
            error: None,
        }
    }

    /// The current position in the slice (the start of the next packet).
    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The offset (base + position) of the next packet.
    #[inline]
    pub fn offset(&self) -> u64 {
        self.base.wrapping_add(self.pos as u64)
    }

    /// Moves to `pos` (clamped to the end of the buffer). The block context is reset, as it
    /// cannot be known at an arbitrary position.
    pub fn set_position(&mut self, pos: usize) {
        self.pos = pos.min(self.buf.len());
        self.block = None;
    }

    /// The BBP block context for the next packet (see [`decode_packet`]).
    pub fn block_context(&self) -> Option<bool> {
        self.block
    }

    /// Overrides the BBP block context for the next packet.
    pub fn set_block_context(&mut self, block: Option<bool>) {
        self.block = block;
    }

    /// The whole buffer this decoder reads.
    pub fn buffer(&self) -> &'a [u8] {
        self.buf
    }

    /// Moves to the next PSB at or after the current position and returns its offset, or moves to
    /// the end of the buffer and returns `None` when there is none.
    #[inline]
    pub fn sync_forward(&mut self) -> Option<u64> {
        match find_psb_forward(self.buf, self.pos) {
            Some(p) => {
                self.pos = p;
                self.block = None;
                Some(self.offset())
            }
            None => {
                self.pos = self.buf.len();
                self.block = None;
                None
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn fail(&mut self, e: CoreError) -> PacketError {
        let err = e.at(self.offset());
        match e {
            CoreError::Invalid(_) => self.pos += 1,
            CoreError::Truncated(_) => self.pos = self.buf.len(),
        }
        self.block = None;
        err
    }

    /// Decodes the next packet: `None` at the end of the buffer, otherwise the packet with its
    /// offset or the error (see the type's documentation for where the decoder stands after one).
    #[inline(always)]
    pub fn next_packet(&mut self) -> Option<Result<(u64, Packet), PacketError>> {
        let pos = self.pos;
        // Borrow the window in place: copying it into a local array makes the compiler keep 16
        // bytes in registers and spill the decoder state.
        let Some(w) = self.buf.get(pos..).and_then(|s| s.first_chunk::<WINDOW>()) else {
            return self.next_tail();
        };
        let off = self.base.wrapping_add(pos as u64);
        if self.block.is_none() && is_one_byte_packet(w[0]) {
            // PAD or TNT-8 outside a block: neither opens a block.
            self.pos = pos + 1;
            return Some(Ok((off, ONE_BYTE_PACKET[w[0] as usize])));
        }
        macro_rules! emit {
            ($p:expr, $len:expr, $blk:tt) => {{
                self.pos = pos + $len;
                update_block!(self.block, $blk);
                Some(Ok((off, $p)))
            }};
        }
        macro_rules! err {
            ($r:expr) => {
                Some(Err(self.fail(CoreError::Invalid($r))))
            };
        }
        decode_window!(w, self.block, emit, err)
    }

    /// The per-packet API at its cheapest: the next packet, or why there is none. The packet's
    /// offset is [`Self::last_offset`]; after [`Stop::Error`] the error is
    /// [`Self::take_error`]'s. Same packets, errors and positions as [`Self::next_packet`], without
    /// building a 40-byte `Option<Result<(u64, Packet), PacketError>>` per packet.
    #[inline(always)]
    pub fn read(&mut self) -> Result<Packet, Stop> {
        // The slow paths are free functions over values, never `&mut self`: a decoder whose
        // address reaches an out-of-line call lives in memory, and its position was loaded and
        // stored on every packet (the flow decoder keeps `next_packet`'s out-of-line forms,
        // whose code it shares; see docs/benchmarks.md).
        let pos = self.pos;
        let Some(w) = self.buf.get(pos..).and_then(|s| s.first_chunk::<WINDOW>()) else {
            let t = read_tail_at(self.buf, pos, self.block, self.last);
            self.pos = t.pos;
            self.block = t.block;
            self.last = t.last;
            if let Some(e) = t.error {
                self.error = Some(e.at(self.base.wrapping_add(pos as u64)));
            }
            return t.result;
        };
        self.last = pos;
        if self.block.is_none() && is_one_byte_packet(w[0]) {
            self.pos = pos + 1;
            return Ok(ONE_BYTE_PACKET[w[0] as usize]);
        }
        macro_rules! emit {
            ($p:expr, $len:expr, $blk:tt) => {{
                self.pos = pos + $len;
                update_block!(self.block, $blk);
                Ok($p)
            }};
        }
        macro_rules! err {
            ($r:expr) => {{
                // As `fail` leaves it after an invalid packet.
                self.pos = pos + 1;
                self.block = None;
                self.error = Some(invalid_at(self.base, pos, $r));
                Err(Stop::Error)
            }};
        }
        decode_window!(w, self.block, emit, err)
    }

    /// Byte offset (base + position) of the packet [`Self::read`] returned last.
    #[inline]
    pub fn last_offset(&self) -> u64 {
        self.base.wrapping_add(self.last as u64)
    }

    /// The error behind the last [`Stop::Error`] (once; `None` if there was none since).
    #[inline]
    pub fn take_error(&mut self) -> Option<PacketError> {
        self.error.take()
    }

    /// [`PacketDecoder::next_packet`] within 16 bytes of the end of the buffer.
    #[inline(never)]
    fn next_tail(&mut self) -> Option<Result<(u64, Packet), PacketError>> {
        if self.pos >= self.buf.len() {
            return None;
        }
        Some(match decode_tail(self.buf, self.pos, self.block) {
            Ok((p, len)) => {
                let off = self.offset();
                self.pos += len;
                self.block = next_block_context(self.block, &p);
                Ok((off, p))
            }
            Err(e) => Err(self.fail(e)),
        })
    }

    /// Batch API: decodes packets and appends them to `out` until the end of the buffer, an error
    /// or until `limit` packets were appended. Returns how many packets were appended (0 only at
    /// the end of the buffer or for `limit == 0`); on an error the packets decoded before it stay
    /// in `out` and the decoder stands where [`PacketDecoder::next_packet`] would leave it.
    pub fn decode_into(
        &mut self,
        out: &mut Vec<(u64, Packet)>,
        limit: usize,
    ) -> Result<usize, PacketError> {
        let buf = self.buf;
        let base = self.base;
        let mut pos = self.pos;
        let mut block = self.block;
        let mut n = 0usize;
        out.reserve(limit.min(buf.len().saturating_sub(pos)).min(1 << 16));
        macro_rules! emit {
            ($p:expr, $len:expr, $blk:tt) => {{
                out.push((base.wrapping_add(pos as u64), $p));
                pos += $len;
                update_block!(block, $blk);
                n += 1;
            }};
        }
        macro_rules! err {
            ($r:expr) => {{
                self.pos = pos;
                self.block = block;
                return Err(self.fail(CoreError::Invalid($r)));
            }};
        }
        // Fast loop: a full window is always available, no tail checks.
        while n < limit {
            let Some(w) = buf.get(pos..).and_then(|s| s.first_chunk::<WINDOW>()) else {
                break;
            };
            if w[0] == 0 {
                // A run of PADs (KVM-PT and hardware pad with zeros): emit the whole run in one
                // go instead of dispatching on every byte; PAD keeps the block context. (Doing
                // the same for runs of PAD and TNT-8 mixed measured slower.)
                let run = ((u128::from_le_bytes(*w).trailing_zeros() / 8) as usize).min(limit - n);
                for i in 0..run {
                    out.push((base.wrapping_add((pos + i) as u64), Packet::Pad));
                }
                pos += run;
                n += run;
                continue;
            }
            if block.is_none() {
                if is_one_byte_packet(w[0]) {
                    out.push((
                        base.wrapping_add(pos as u64),
                        ONE_BYTE_PACKET[w[0] as usize],
                    ));
                    pos += 1;
                    n += 1;
                    continue;
                }
                // Outside a block (nearly always) the BIP test folds away.
                decode_window!(w, None, emit, err);
            } else {
                decode_window!(w, block, emit, err);
            }
        }
        self.pos = pos;
        self.block = block;
        while n < limit {
            match self.next_packet() {
                None => break,
                Some(Ok(item)) => {
                    out.push(item);
                    n += 1;
                }
                Some(Err(e)) => return Err(e),
            }
        }
        Ok(n)
    }
}

impl Iterator for PacketDecoder<'_> {
    type Item = Result<(u64, Packet), PacketError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.next_packet()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(bytes: &[u8]) -> Result<(Packet, usize), PacketError> {
        decode_packet(bytes, 0, None)
    }

    #[test]
    fn class_table_matches_reference_dispatch() {
        assert_eq!(CLASS[0x00], Class::Pad);
        assert_eq!(CLASS[0x02], Class::Ext);
        assert_eq!(CLASS[0x04], Class::Tnt);
        assert_eq!(CLASS[0xfe], Class::Tnt);
        assert_eq!(CLASS[0x03], Class::Cyc);
        assert_eq!(CLASS[0xff], Class::Cyc);
        assert_eq!(CLASS[0x01], Class::TipPgd);
        assert_eq!(CLASS[0x0d], Class::Tip);
        assert_eq!(CLASS[0x11], Class::TipPge);
        assert_eq!(CLASS[0x1d], Class::Fup);
        assert_eq!(CLASS[0x19], Class::Tsc);
        assert_eq!(CLASS[0x59], Class::Mtc);
        assert_eq!(CLASS[0x99], Class::Mode);
        for b in [0x39, 0x79, 0xb9, 0xf9, 0x05, 0x09, 0x15, 0xc9] {
            assert_eq!(CLASS[b], Class::Bad, "{b:#x}");
        }
    }

    #[test]
    fn one_byte_table_matches_full_dispatch() {
        // The fast path (combined test + table) must agree with the full decode table for every
        // first byte outside a block, and must not claim any byte the table decodes otherwise.
        for b in 0..=255u8 {
            let mut w = [0u8; WINDOW];
            w[0] = b;
            let full = decode_window(&w, None);
            if is_one_byte_packet(b) {
                assert_eq!(full, Ok((ONE_BYTE_PACKET[b as usize], 1)), "{b:#04x}");
            } else {
                assert!(
                    !matches!(full, Ok((Packet::Pad | Packet::ShortTnt(_), _))),
                    "{b:#04x}"
                );
            }
        }
    }

    #[test]
    fn ip_packets_of_every_first_byte() {
        // The four IP kinds share one dispatch target and pick the kind from the opcode bits:
        // check every first byte against the SDM's opcodes, compressions and lengths.
        let payload = [0x11u8, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];
        for b0 in 0..=255u8 {
            let kind = match b0 & 0x1f {
                0x0d => "tip",
                0x11 => "tip.pge",
                0x01 => "tip.pgd",
                0x1d => "fup",
                _ => continue,
            };
            let mut w = [0u8; WINDOW];
            w[0] = b0;
            w[1..9].copy_from_slice(&payload);
            let got = decode_window(&w, None);
            let (compression, n) = match b0 >> 5 {
                0 => (IpCompression::Suppressed, 0),
                1 => (IpCompression::Update16, 2),
                2 => (IpCompression::Update32, 4),
                3 => (IpCompression::Sext48, 6),
                4 => (IpCompression::Update48, 6),
                6 => (IpCompression::Full, 8),
                _ => {
                    assert!(got.is_err(), "{b0:#04x}: reserved IPBytes accepted");
                    continue;
                }
            };
            let mut raw = [0u8; 8];
            raw[..n].copy_from_slice(&payload[..n]);
            let pl = IpPayload::new(compression, u64::from_le_bytes(raw));
            let (p, len) = got.unwrap();
            assert_eq!((p.name(), len), (kind, 1 + n), "{b0:#04x}");
            let (Packet::Tip(x) | Packet::TipPge(x) | Packet::TipPgd(x) | Packet::Fup(x)) = p
            else {
                panic!("{b0:#04x}: {p:?}");
            };
            assert_eq!(x, pl, "{b0:#04x}");
            // FUP keeps a BBP block open, the others end it.
            let mut d = PacketDecoder::new(&w);
            d.set_block_context(Some(true));
            assert!(d.read().is_ok());
            assert_eq!(d.block_context().is_some(), kind == "fup", "{b0:#04x}");
        }
    }

    #[test]
    fn short_tnt_bit_order() {
        // 0x06: stop bit at byte bit 2, one TNT bit, taken.
        assert_eq!(one(&[0x06]).unwrap(), (Packet::ShortTnt(Tnt::new(1, 1)), 1));
        // 0x08: two not-taken.
        assert_eq!(one(&[0x08]).unwrap(), (Packet::ShortTnt(Tnt::new(0, 2)), 1));
        // 0xfe: six taken.
        assert_eq!(
            one(&[0xfe]).unwrap(),
            (Packet::ShortTnt(Tnt::new(0x3f, 6)), 1)
        );
    }

    #[test]
    fn bip_only_inside_block() {
        let bytes = [0x0c, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(
            decode_packet(&bytes, 0, Some(true)).unwrap(),
            (
                Packet::Bip {
                    id: 1,
                    value: 0x0403_0201
                },
                5
            )
        );
        assert_eq!(
            decode_packet(&bytes, 0, Some(false)).unwrap(),
            (
                Packet::Bip {
                    id: 1,
                    value: 0x0807_0605_0403_0201
                },
                9
            )
        );
        assert!(matches!(
            decode_packet(&bytes, 0, None).unwrap().0,
            Packet::ShortTnt(_)
        ));
    }

    #[test]
    fn tail_errors_are_truncated() {
        assert_eq!(
            one(&[0x02]),
            Err(PacketError::Truncated {
                offset: 0,
                needed: 1
            })
        );
        assert_eq!(
            one(&[0x02, 0xc3]),
            Err(PacketError::Truncated {
                offset: 0,
                needed: 1
            })
        );
        assert_eq!(
            one(&[0x02, 0xa3, 0, 0]),
            Err(PacketError::Truncated {
                offset: 0,
                needed: 4
            })
        );
        assert!(matches!(
            one(&[0x02, 0x82, 0x02, 0x00]),
            Err(PacketError::Invalid { .. })
        ));
        assert!(matches!(one(&[0xa1]), Err(PacketError::Invalid { .. })));
        assert!(matches!(one(&[]), Err(PacketError::Truncated { .. })));
    }

    #[test]
    fn cyc_limits() {
        // 10 bytes: 5 + 8*7 + 3 bits = 64 bits.
        let mut max = vec![0xff];
        max.extend(std::iter::repeat_n(0xff, 8));
        max.push(0x0e);
        max.extend([0u8; 8]);
        assert_eq!(one(&max).unwrap(), (Packet::Cyc { value: u64::MAX }, 10));
        max[9] = 0x10;
        assert!(matches!(one(&max), Err(PacketError::Invalid { .. })));
        max[9] = 0x0f;
        assert!(matches!(one(&max), Err(PacketError::Invalid { .. })));
    }

    #[test]
    fn decoder_tracks_block_and_offsets() {
        // BBP sz=1, BIP id 0 (4 bytes), PAD, BIP, BEP, then 0x04 is a TNT again.
        let bytes = [
            0x02, 0x63, 0x84, 0x04, 1, 0, 0, 0, 0x00, 0x0c, 2, 0, 0, 0, 0x02, 0x33, 0x04,
        ];
        let got: Vec<_> = PacketDecoder::with_base_offset(&bytes, 100)
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(
            got,
            vec![
                (100, Packet::Bbp { sz: true, kind: 4 }),
                (103, Packet::Bip { id: 0, value: 1 }),
                (108, Packet::Pad),
                (109, Packet::Bip { id: 1, value: 2 }),
                (114, Packet::Bep { ip: false }),
                (116, Packet::ShortTnt(Tnt::new(0, 1))),
            ]
        );
        let mut d = PacketDecoder::new(&bytes);
        let mut v = Vec::new();
        assert_eq!(d.decode_into(&mut v, usize::MAX), Ok(6));
        assert_eq!(
            v.iter().map(|x| x.1).collect::<Vec<_>>(),
            got.iter().map(|x| x.1).collect::<Vec<_>>()
        );
    }
}
