//! Instruction-flow reconstruction: packets + process image → executed instructions and events.
//!
//! [`FlowDecoder`] walks the code of an [`Image`](crate::image::Image) as the packets of an Intel PT
//! trace dictate (reference: `../shared/docs/intel-pt-packets.md` §3): TNT bits steer conditional
//! branches and compressed RETs, TIPs give indirect and far targets, FUPs bind asynchronous events
//! to the instruction at their IP, TIP.PGE/TIP.PGD switch tracing on and off, PSB+ resynchronises
//! and OVF marks lost packets.
//!
//! # Model
//!
//! The decoder is *packet driven and lazy*: it only emits an instruction once a packet explains
//! it. A TNT packet walks forward until its last bit is used; the instructions after that last
//! branch are emitted only when the next packet (TNT, TIP, FUP, PSB+ FUP ...) says how far they
//! ran. That is what makes asynchronous events (FUP + TIP.PGD at an interrupt) exact: no
//! instruction that did not execute is ever emitted ahead of the event.
//!
//! Code is decoded once with iced-x86 into *blocks* (runs of instructions ending at a branch, a
//! PTWRITE or an instruction that can disable tracing), kept in a bounded cache keyed by IP. The hot
//! path of a decode is therefore: look up the block at the IP, emit it, take a TNT bit or a TIP,
//! jump. [`FlowDecoder::next_block`] hands out whole runs; [`FlowDecoder::next_item`] the same
//! stream one instruction at a time. `next_block` reads TNT-8 and TIP packets straight from their
//! bytes, and remembers the walk of each TNT-8 packet's bits from a block (the blocks handed out
//! and the state it ends in) in a bounded path cache, so a packet seen before from the same block
//! is replayed without deciding anything per block. A walk is recorded only across conditional
//! branches, direct jumps and calls and fall-throughs, where it depends on nothing but the block
//! and the bits; compressed RETs, TIPs, events and errors end a recording before them.
//!
//! # Output
//!
//! A stream of instructions ([`Insn`], or runs of them as [`Block`]) interleaved with [`Event`]s.
//! Each event carries the trace offset of the packet that caused it. Errors are events too
//! ([`EventKind::Error`]): the decoder reports them and resynchronises, it never panics and every
//! walk is bounded ([`FlowConfig::max_walk`]).
//!
//! # Restartability
//!
//! At every PSB+ the decoder emits [`EventKind::Psb`] at the point of the instruction stream where
//! that PSB's state (IP, mode, enable state) takes effect. A decoder started at that PSB with
//! [`FlowDecoder::at_psb`] yields exactly the suffix of the full decode from that event on. The
//! history index relies on this to decode any part of a trace independently.
//!
//! # Errata
//!
//! [`FlowConfig::errata`] enables libipt's workarounds for processors that emit packet sequences
//! the architecture forbids (BDM70, BDM64, SKD007, SKD010, SKD022, SKL014, APL11, APL12, SKZ84;
//! see [`errata`]). They are off by default, as for an unknown CPU: then an OVF followed by TIP or
//! TIP.PGD is an error, as in libipt.
//!
//! # Time
//!
//! Every instruction and event carries an approximate timestamp in TSC ticks (see [`crate::packet::time`]): the
//! time of the most recent TSC/MTC (plus CYC cycles converted at the CBR ratio when cycle-accurate
//! mode is on) before the packet that explained it. It is 0 when the trace has no timing packets.

mod cache;
mod class;
mod decoder;
pub mod errata;
pub mod ild;

pub use class::InsnClass;
pub use decoder::{Block, BlockItem, FilteredDecoder, FlowDecoder, FlowStats};
pub use errata::{Cpu, CpuVendor, Errata};

use crate::packet::{ExecMode, PacketError};

/// Decoder configuration.
#[derive(Debug, Clone)]
pub struct FlowConfig {
    /// Longest walk (in instructions) without any branch that needs trace before the decoder gives
    /// up with [`FlowErrorKind::RunawayWalk`]. Bounds loops like `jmp .` in corrupt images.
    pub max_walk: u64,
    /// Return-stack depth for RET compression. The hardware uses 64; deeper is harmless.
    pub ret_stack_depth: usize,
    /// Upper bound on the number of cached instructions; the block cache is flushed when it holds
    /// more, so memory does not grow with the trace.
    pub cache_insn_limit: usize,
    /// Execution mode assumed until the trace says otherwise (a PSB+ or MODE.Exec).
    pub default_mode: ExecMode,
    /// Timing parameters (for the approximate timestamps only).
    pub timing: crate::packet::time::TimingConfig,
    /// The processor errata to work around ([`Errata::for_cpu`]); none by default, as for an
    /// unknown CPU.
    pub errata: Errata,
    /// The IP filter ranges that were configured while recording (`[from, to]`, inclusive, as in
    /// `IA32_RTIT_ADDRn_A/B` with FilterEn). Only the SKL014 workaround reads them; empty means
    /// no filter.
    pub ip_filter: Vec<(u64, u64)>,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            max_walk: 1 << 20,
            ret_stack_depth: 64,
            cache_insn_limit: 1 << 22,
            default_mode: ExecMode::Bits64,
            timing: crate::packet::time::TimingConfig::default(),
            errata: Errata::default(),
            ip_filter: Vec::new(),
        }
    }
}

/// One executed instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Its address.
    pub ip: u64,
    /// Its length in bytes.
    pub len: u8,
    /// What kind of control flow it is.
    pub class: InsnClass,
    /// The execution mode it was decoded in.
    pub mode: ExecMode,
    /// Approximate timestamp in TSC ticks (0 without timing packets).
    pub time: u64,
}

/// An event in the instruction stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Offset in the trace of the packet that caused the event.
    pub offset: u64,
    /// Approximate timestamp in TSC ticks.
    pub time: u64,
    /// What happened.
    pub kind: EventKind,
}

/// What an [`Event`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// Tracing was (re-)enabled (TIP.PGE); the next instruction is at `ip`.
    Enabled {
        /// The first traced IP.
        ip: u64,
    },
    /// Tracing was disabled (TIP.PGD). `ip` is the IP execution continued at when it is known:
    /// the interrupted instruction for an asynchronous disable (FUP + TIP.PGD; that instruction
    /// did not execute), or the TIP.PGD target (filter exits); `None` when the IP was suppressed
    /// (e.g. a SYSCALL into the untraced kernel).
    Disabled {
        /// Where execution continued, when known.
        ip: Option<u64>,
        /// FUP + TIP.PGD: an asynchronous disable at `ip` (that instruction did not execute).
        asynchronous: bool,
    },
    /// An asynchronous transfer (interrupt, exception, signal, TSX abort ...) at `from` (which did
    /// not execute) to `to`.
    AsyncBranch {
        /// The interrupted IP.
        from: u64,
        /// The target.
        to: u64,
    },
    /// Packets were lost (OVF). Decoding resumes at `resume` if the overflow resolved with tracing
    /// on, otherwise at the next enable or PSB.
    Overflow {
        /// The resume IP, when the trace gave one.
        resume: Option<u64>,
    },
    /// A PSB+ took effect here. `ip` is the current IP from its FUP (`None`: tracing was off).
    /// Decoding from this PSB alone yields the rest of the stream from this event on.
    Psb {
        /// The IP from the PSB+ FUP, if tracing was on.
        ip: Option<u64>,
        /// The execution mode from the PSB+.
        mode: ExecMode,
    },
    /// Execution mode changed (MODE.Exec applied at a TIP / TIP.PGE).
    ModeChange {
        /// The new mode.
        mode: ExecMode,
    },
    /// TSX state change (MODE.TSX), bound to `ip` when the trace gave one.
    Tsx {
        /// The IP of the transaction event.
        ip: Option<u64>,
        /// Inside a transaction.
        in_tx: bool,
        /// The transaction aborted.
        abort: bool,
    },
    /// A PTWRITE operand; `ip` is the PTWRITE instruction when known.
    Ptwrite {
        /// The PTWRITE instruction.
        ip: Option<u64>,
        /// The operand.
        payload: u64,
    },
    /// CR3 changed (PIP).
    Paging {
        /// The new CR3.
        cr3: u64,
        /// VMX non-root.
        nr: bool,
    },
    /// VMCS pointer changed.
    Vmcs {
        /// VMCS base.
        base: u64,
    },
    /// Execution stopped (EXSTOP), at `ip` when given.
    Exstop {
        /// The IP.
        ip: Option<u64>,
    },
    /// MWAIT completed.
    Mwait {
        /// The IP (from the shared FUP), when given.
        ip: Option<u64>,
        /// EAX hints.
        hints: u8,
        /// ECX extensions.
        ext: u8,
    },
    /// Power entry (PWRE).
    PowerEntry {
        /// Resolved C-state.
        state: u8,
        /// Resolved sub C-state.
        substate: u8,
        /// Hardware initiated.
        hw: bool,
    },
    /// Power exit (PWRX).
    PowerExit {
        /// Last core C-state.
        last: u8,
        /// Deepest core C-state.
        deepest: u8,
        /// Wake reason bits.
        wake: u8,
    },
    /// Control-flow event (Event Trace CFE), at `ip` when given.
    Cfe {
        /// The IP.
        ip: Option<u64>,
        /// CFE type.
        kind: u8,
        /// Vector.
        vector: u8,
    },
    /// Event data (EVD).
    Evd {
        /// EVD type.
        kind: u8,
        /// Payload.
        payload: u64,
    },
    /// A PEBS-via-PT block (BBP … BEP) ended, at `ip` when given. Its items are skipped.
    PebsBlock {
        /// The IP.
        ip: Option<u64>,
    },
    /// Tracing stopped (TraceStop).
    Stop,
    /// The trace and the code disagree, or the trace is corrupt. The decoder resynchronises.
    Error {
        /// What went wrong.
        kind: FlowErrorKind,
        /// The IP where it went wrong, when known.
        ip: Option<u64>,
    },
}

/// What went wrong in an [`EventKind::Error`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlowErrorKind {
    /// No code is mapped at the IP.
    #[error("no code mapped")]
    NoCode,
    /// The bytes at the IP do not decode as an instruction.
    #[error("undecodable instruction")]
    BadInsn,
    /// A conditional branch (or compressed RET) needs a TNT bit but the next packet is something
    /// else.
    #[error("expected TNT, got {0}")]
    ExpectedTnt(&'static str),
    /// A TNT bit arrived but the walk reached an indirect branch needing a TIP first.
    #[error("TNT where the code needs a TIP")]
    UnexpectedTnt,
    /// An indirect branch or far transfer needs a TIP but the next packet is something else.
    #[error("missing TIP, got {0}")]
    MissingTip(&'static str),
    /// A TIP arrived but the walk reached a conditional branch first.
    #[error("TIP where the code has a conditional branch")]
    UnexpectedTip,
    /// RET compression: a not-taken bit at a RET, or an empty return stack.
    #[error("bad RET compression")]
    BadRetCompression,
    /// The walk to an event IP (FUP, PSB+ FUP) met a branch that needs trace first.
    #[error("event IP {0:#x} not reachable without trace")]
    EventIpUnreachable(u64),
    /// More than [`FlowConfig::max_walk`] instructions without a branch that needs trace.
    #[error("runaway walk")]
    RunawayWalk,
    /// A FUP that nothing claims and no TIP/TIP.PGD follows.
    #[error("FUP without TIP")]
    LoneFup,
    /// A packet that makes no sense here.
    #[error("unexpected {0}")]
    UnexpectedPacket(&'static str),
    /// A compressed IP packet before any full IP since the last PSB.
    #[error("no last IP to decompress against")]
    NoLastIp,
    /// MODE.Exec with CS.L = CS.D = 1.
    #[error("invalid execution mode")]
    BadMode,
    /// The packet layer failed (invalid bytes); decoding resumes at the next PSB.
    #[error("{0}")]
    Packet(PacketError),
}

/// One step of [`FlowDecoder::next_item`]: an instruction or an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// An executed instruction.
    Insn(Insn),
    /// An event.
    Event(Event),
}
