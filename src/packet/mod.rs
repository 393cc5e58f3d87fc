//! The Intel PT packet layer: every packet type as a value, a zero-copy decoder from bytes, an
//! encoder, Last-IP reconstruction and PSB synchronisation.
//!
//! This layer knows nothing about instructions: it turns bytes into [`Packet`]s and back. The flow
//! layer (`crate::flow`) gives them meaning. Layouts follow the SDM chapter "Intel Processor
//! Trace" (see `../shared/docs/intel-pt-packets.md` §1 for the bit-level reference).

mod decode;
mod encode;
mod lastip;
mod sync;
pub mod time;

pub use decode::{PacketDecoder, Stop, decode_packet, next_block_context};
pub use encode::{
    EncodeError, Encoder, IpKind, encode_packet, encode_packet_in_block, shortest_compression,
};
pub use lastip::{LastIp, LastIpError};
pub use sync::{PSB_BYTES, find_psb_backward, find_psb_forward};

/// The full TSC of a TSC packet's low 56 bits, after the last full TSC `prev` of the same
/// stream: its upper bits, one more wrap of the 56-bit counter when the value fell far back.
#[inline]
pub fn extend_tsc(prev: Option<u64>, low56: u64) -> u64 {
    const MASK: u64 = (1 << 56) - 1;
    let last = prev.unwrap_or(0);
    let t = (last & !MASK) | (low56 & MASK);
    if prev.is_some() && t.wrapping_add(0x10000) < last {
        t.wrapping_add(1 << 56)
    } else {
        t
    }
}

/// How an IP packet (TIP, TIP.PGE, TIP.PGD, FUP) compresses its payload against Last IP: the
/// packet's IPBytes field (byte 0, bits 7:5).
///
/// The discriminants are the IPBytes values, so that the packet decoder's conversion from the
/// field is a range test rather than a table load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IpCompression {
    /// `000`: no payload; the IP is suppressed (out of context). Last IP is unchanged.
    Suppressed = 0,
    /// `001`: 2 payload bytes replace Last IP bits 15:0.
    Update16 = 1,
    /// `010`: 4 payload bytes replace Last IP bits 31:0.
    Update32 = 2,
    /// `011`: 6 payload bytes, sign-extended from bit 47.
    Sext48 = 3,
    /// `100`: 6 payload bytes replace Last IP bits 47:0.
    Update48 = 4,
    /// `110`: 8 payload bytes, the full IP.
    Full = 6,
}

impl IpCompression {
    /// The IPBytes field value (0, 1, 2, 3, 4 or 6).
    pub fn ipbytes(self) -> u8 {
        match self {
            IpCompression::Suppressed => 0,
            IpCompression::Update16 => 1,
            IpCompression::Update32 => 2,
            IpCompression::Sext48 => 3,
            IpCompression::Update48 => 4,
            IpCompression::Full => 6,
        }
    }

    /// Parses an IPBytes field; 5 and 7 (and anything above 7) are reserved and yield `None`.
    pub fn from_ipbytes(ipbytes: u8) -> Option<Self> {
        Some(match ipbytes {
            0 => IpCompression::Suppressed,
            1 => IpCompression::Update16,
            2 => IpCompression::Update32,
            3 => IpCompression::Sext48,
            4 => IpCompression::Update48,
            6 => IpCompression::Full,
            _ => return None,
        })
    }

    /// Number of payload bytes that follow the header.
    pub fn payload_len(self) -> usize {
        match self {
            IpCompression::Suppressed => 0,
            IpCompression::Update16 => 2,
            IpCompression::Update32 => 4,
            IpCompression::Sext48 | IpCompression::Update48 => 6,
            IpCompression::Full => 8,
        }
    }
}

/// The raw IP payload of a TIP, TIP.PGE, TIP.PGD or FUP packet, before Last-IP reconstruction.
///
/// Built with [`IpPayload::new`]. Packed (15 bytes, alignment 1) so that a [`Packet`] carrying
/// one stays 16 bytes with the tag and the compression in its first eight bytes and `raw` in the
/// second eight, aligned, as in the packets with a `u64` field: a packet moved out of a result
/// is then two 8-byte words. (With `raw` right after the compression, at byte 2 of the packet,
/// the compiler copied a moved packet as two overlapping 8-byte words, which the store buffer
/// cannot forward: a consumer of `PacketDecoder::read` that moved the packet out ran at a
/// quarter of the speed; see docs/benchmarks.md.) Fields are read by value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C, packed)]
pub struct IpPayload {
    /// The compression (IPBytes) the packet used.
    pub compression: IpCompression,
    /// Keeps `raw` at byte 8 of a [`Packet`]; always zero.
    _pad: [u8; 6],
    /// The payload bytes as a little-endian value (only the low `payload_len * 8` bits are used).
    pub raw: u64,
}

impl IpPayload {
    /// A payload of `compression` with the raw payload bytes `raw`.
    #[inline(always)]
    pub const fn new(compression: IpCompression, raw: u64) -> Self {
        IpPayload {
            compression,
            _pad: [0; 6],
            raw,
        }
    }
}

impl std::fmt::Debug for IpPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (compression, raw) = (self.compression, self.raw);
        f.debug_struct("IpPayload")
            .field("compression", &compression)
            .field("raw", &raw)
            .finish()
    }
}

/// Execution mode from MODE.Exec's CS.L/CS.D bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecMode {
    /// CS.L = 0, CS.D = 0.
    Bits16,
    /// CS.L = 0, CS.D = 1.
    Bits32,
    /// CS.L = 1, CS.D = 0.
    Bits64,
    /// CS.L = 1, CS.D = 1 (invalid combination; reported, not guessed).
    Invalid,
}

/// One Intel PT packet. Fields hold the raw payloads; reserved bits are not kept (the encoder writes
/// them as zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Packet {
    /// PAD (`00`): filler.
    Pad,
    /// Short TNT (TNT-8): 1..=6 outcomes.
    ShortTnt(Tnt),
    /// Long TNT (`02 A3`): 1..=47 outcomes.
    LongTnt(Tnt),
    /// TIP: target of an indirect branch, uncompressed RET, far transfer, interrupt, ...
    Tip(IpPayload),
    /// TIP.PGE: packet generation enabled at the payload IP.
    TipPge(IpPayload),
    /// TIP.PGD: packet generation disabled (IP often suppressed).
    TipPgd(IpPayload),
    /// FUP: flow update, the source IP of an asynchronous event or a status IP.
    Fup(IpPayload),
    /// MODE.Exec (`99`, leaf 000).
    ModeExec {
        /// CS.L & EFER.LMA.
        csl: bool,
        /// CS.D.
        csd: bool,
        /// RFLAGS.IF (Event Trace era; 0 otherwise).
        iflag: bool,
    },
    /// MODE.TSX (`99`, leaf 001).
    ModeTsx {
        /// Inside a transaction.
        intx: bool,
        /// The transaction aborted.
        abort: bool,
    },
    /// PIP (`02 43`): CR3 changed.
    Pip {
        /// CR3 value (bits 51:5; low bits zero).
        cr3: u64,
        /// VMX non-root.
        nr: bool,
    },
    /// TraceStop (`02 83`).
    TraceStop,
    /// CBR (`02 03`): core:bus ratio.
    Cbr {
        /// The ratio.
        ratio: u8,
    },
    /// TSC (`19`): low 56 bits of the time-stamp counter.
    Tsc {
        /// TSC\[55:0\].
        tsc: u64,
    },
    /// MTC (`59`): 8 bits of the crystal clock counter.
    Mtc {
        /// CTC[N+7:N].
        ctc: u8,
    },
    /// TMA (`02 73`): aligns the preceding TSC with the crystal clock.
    Tma {
        /// CTC\[15:0\].
        ctc: u16,
        /// FastCounter\[8:0\].
        fc: u16,
    },
    /// CYC: core cycles since the previous CYC.
    Cyc {
        /// The cycle count (up to 64 bits).
        value: u64,
    },
    /// VMCS (`02 C8`): VMCS pointer changed.
    Vmcs {
        /// VMCS base address (bits 51:12; low bits zero).
        base: u64,
    },
    /// OVF (`02 F3`): internal buffer overflow; packets were lost.
    Ovf,
    /// PSB (`02 82` × 8): synchronisation point, starts PSB+.
    Psb,
    /// PSBEND (`02 23`): ends PSB+.
    PsbEnd,
    /// MNT (`02 C3 88`): maintenance, model specific.
    Mnt {
        /// The 64-bit payload.
        payload: u64,
    },
    /// PTW (`02 x2`): PTWRITE operand.
    Ptw {
        /// The operand (4 or 8 bytes).
        payload: u64,
        /// Payload size in bytes: 4 or 8.
        size: u8,
        /// A FUP with the PTWRITE's IP follows.
        ip: bool,
    },
    /// EXSTOP (`02 62` / `02 E2`): execution stopped.
    Exstop {
        /// A FUP follows.
        ip: bool,
    },
    /// MWAIT (`02 C2`).
    Mwait {
        /// EAX hints\[7:0\].
        hints: u8,
        /// ECX extensions\[1:0\].
        ext: u8,
    },
    /// PWRE (`02 22`): power entry.
    Pwre {
        /// Hardware-initiated.
        hw: bool,
        /// Resolved thread C-state.
        state: u8,
        /// Resolved thread sub C-state.
        substate: u8,
    },
    /// PWRX (`02 A2`): power exit.
    Pwrx {
        /// Last core C-state.
        last: u8,
        /// Deepest core C-state.
        deepest: u8,
        /// Wake reason bits.
        wake: u8,
    },
    /// BBP (`02 63`): begins a block of state items.
    Bbp {
        /// BIP payloads are 4 bytes (true) or 8 bytes (false).
        sz: bool,
        /// Block type.
        kind: u8,
    },
    /// BIP: one block item (only inside a BBP block).
    Bip {
        /// Item ID.
        id: u8,
        /// The value (4 or 8 bytes, by the enclosing BBP's SZ).
        value: u64,
    },
    /// BEP (`02 33` / `02 B3`): ends a block.
    Bep {
        /// A FUP follows.
        ip: bool,
    },
    /// CFE (`02 13`): control-flow event (Event Trace).
    Cfe {
        /// A FUP follows.
        ip: bool,
        /// Event type.
        kind: u8,
        /// Vector.
        vector: u8,
    },
    /// EVD (`02 53`): event data for the next CFE.
    Evd {
        /// Data type.
        kind: u8,
        /// 64-bit payload.
        payload: u64,
    },
}

/// TNT outcomes. Bit `count - 1` of `bits` is the oldest outcome (B1), bit 0 the youngest (BN);
/// 1 = taken.
///
/// Built with [`Tnt::new`]. Packed (15 bytes, alignment 1) for the same reason as
/// [`IpPayload`]: `count` in the first eight bytes of a [`Packet`], `bits` aligned in the second.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C, packed)]
pub struct Tnt {
    /// How many outcomes (1..=6 for short TNT, 1..=47 for long TNT).
    pub count: u8,
    /// Keeps `bits` at byte 8 of a [`Packet`]; always zero.
    _pad: [u8; 6],
    /// The outcomes, oldest in the highest used bit.
    pub bits: u64,
}

impl Tnt {
    /// `count` outcomes, the oldest in bit `count - 1` of `bits`.
    #[inline(always)]
    pub const fn new(bits: u64, count: u8) -> Self {
        Tnt {
            count,
            _pad: [0; 6],
            bits,
        }
    }
}

impl std::fmt::Debug for Tnt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (bits, count) = (self.bits, self.count);
        f.debug_struct("Tnt")
            .field("bits", &bits)
            .field("count", &count)
            .finish()
    }
}

impl Packet {
    /// The packet's name as ptdump prints it (e.g. `tnt.8`, `tip.pge`, `psbend`).
    pub fn name(&self) -> &'static str {
        match self {
            Packet::Pad => "pad",
            Packet::ShortTnt(_) => "tnt.8",
            Packet::LongTnt(_) => "tnt.64",
            Packet::Tip(_) => "tip",
            Packet::TipPge(_) => "tip.pge",
            Packet::TipPgd(_) => "tip.pgd",
            Packet::Fup(_) => "fup",
            Packet::ModeExec { .. } => "mode.exec",
            Packet::ModeTsx { .. } => "mode.tsx",
            Packet::Pip { .. } => "pip",
            Packet::TraceStop => "stop",
            Packet::Cbr { .. } => "cbr",
            Packet::Tsc { .. } => "tsc",
            Packet::Mtc { .. } => "mtc",
            Packet::Tma { .. } => "tma",
            Packet::Cyc { .. } => "cyc",
            Packet::Vmcs { .. } => "vmcs",
            Packet::Ovf => "ovf",
            Packet::Psb => "psb",
            Packet::PsbEnd => "psbend",
            Packet::Mnt { .. } => "mnt",
            Packet::Ptw { .. } => "ptw",
            Packet::Exstop { .. } => "exstop",
            Packet::Mwait { .. } => "mwait",
            Packet::Pwre { .. } => "pwre",
            Packet::Pwrx { .. } => "pwrx",
            Packet::Bbp { .. } => "bbp",
            Packet::Bip { .. } => "bip",
            Packet::Bep { .. } => "bep",
            Packet::Cfe { .. } => "cfe",
            Packet::Evd { .. } => "evd",
        }
    }
}

/// Why bytes could not be decoded as a packet. Every error carries the byte offset of the packet's
/// first byte within the decoded buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// The buffer ends inside a packet (a ToPA STOP or the end of a chunk can do that): not
    /// corruption, but more bytes are needed.
    #[error("truncated packet at offset {offset:#x}: {needed} more byte(s) needed")]
    Truncated {
        /// Offset of the packet's first byte.
        offset: u64,
        /// How many more bytes are needed at least.
        needed: usize,
    },
    /// The bytes are not a valid packet (unknown opcode, reserved encoding, malformed payload).
    #[error("invalid packet at offset {offset:#x}: {reason}")]
    Invalid {
        /// Offset of the packet's first byte.
        offset: u64,
        /// What is wrong.
        reason: &'static str,
    },
}

// A packet fits in two registers: the per-packet API returns it without going through memory.
const _: () = assert!(std::mem::size_of::<Packet>() == 16);
