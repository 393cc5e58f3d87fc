//! Differential oracle: a minimal hand-written FFI to Intel's libipt 2.0.5 (Debian `libipt-dev`)
//! and safe wrappers that run its packet decoder and its instruction-flow decoder over a byte
//! slice, the way `ptdump` and `ptxed --raw` do.
//!
//! This is test and benchmark support code: it is never linked into the ptrewind library.
//! It is self-contained (no `super::` references) so that an example or benchmark can include it
//! with `#[path = "../tests/support/libipt.rs"] mod libipt;`.
//!
//! The `#[repr(C)]` structs below mirror `/usr/include/intel-pt.h` of libipt 2.0.5. Their sizes and
//! field offsets were checked against the header with a C program (`sizeof`/`offsetof`): pt_config
//! 280 (cpu @40, errata @48, cpuid_0x15_eax @112, mtc_freq @120, flags @124, addr_filter @144),
//! pt_packet 24 (payload @8), pt_insn 40 (raw @20, size @35), pt_event 64 (variant @40),
//! pt_cpu 8, pt_errata 64. Compile-time assertions keep them honest.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::size_of;

// ---------------------------------------------------------------------------------------------
// Raw FFI (mirrors intel-pt.h, libipt 2.0.5)
// ---------------------------------------------------------------------------------------------

/// `struct pt_cpu`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawCpu {
    /// `enum pt_cpu_vendor` (0 = unknown, 1 = intel).
    vendor: u32,
    family: u16,
    model: u8,
    stepping: u8,
}

/// `struct pt_errata`: ten 1-bit fields packed into the first u32, then `reserved[15]`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawErrata {
    bits: u32,
    reserved: [u32; 15],
}

/// `struct pt_config`.
#[repr(C)]
struct RawConfig {
    size: usize,
    begin: *mut u8,
    end: *mut u8,
    /// `decode.callback` (unknown-packet callback), always null here.
    decode_callback: *const c_void,
    /// `decode.context`.
    decode_context: *mut c_void,
    cpu: RawCpu,
    errata: RawErrata,
    cpuid_0x15_eax: u32,
    cpuid_0x15_ebx: u32,
    mtc_freq: u8,
    nom_freq: u8,
    /// `struct pt_conf_flags`: a union of bit-field structs padded to `uint32_t reserved[4]`.
    flags: [u32; 4],
    /// `struct pt_conf_addr_filter`: `addr_cfg`, `addr0_a` .. `addr3_b`, `reserved[8]`.
    addr_filter: [u64; 17],
}

/// `struct pt_packet`: `type`, `size`, then a 16-byte, 8-aligned payload union that is read per
/// type (see [`IptPacket::from_raw`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct RawPacket {
    kind: u32,
    size: u8,
    payload: [u64; 2],
}

/// `pt_max_insn_size`.
const PT_MAX_INSN_SIZE: usize = 15;

/// `struct pt_insn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawInsn {
    ip: u64,
    isid: c_int,
    mode: u32,
    iclass: u32,
    raw: [u8; PT_MAX_INSN_SIZE],
    size: u8,
    /// Bit 0 `speculative`, bit 1 `truncated`.
    flags: u32,
}

/// `struct pt_event`: the header fields, then a 24-byte union (`variant`) kept as raw words and
/// decoded per event type (see [`OracleEventKind::from_raw`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct RawEvent {
    kind: u32,
    /// Bit 0 `ip_suppressed`, bit 1 `status_update`, bit 2 `has_tsc`.
    flags: u32,
    tsc: u64,
    lost_mtc: u32,
    lost_cyc: u32,
    reserved: [u64; 2],
    variant: [u64; 3],
}

/// `struct pt_asid` (only ever received by the read callback; never dereferenced).
#[repr(C)]
struct RawAsid {
    size: usize,
    cr3: u64,
    vmcs: u64,
}

const _: () = assert!(size_of::<RawCpu>() == 8);
const _: () = assert!(size_of::<RawErrata>() == 64);
const _: () = assert!(size_of::<RawConfig>() == 280);
const _: () = assert!(std::mem::offset_of!(RawConfig, cpu) == 40);
const _: () = assert!(std::mem::offset_of!(RawConfig, errata) == 48);
const _: () = assert!(std::mem::offset_of!(RawConfig, cpuid_0x15_eax) == 112);
const _: () = assert!(std::mem::offset_of!(RawConfig, mtc_freq) == 120);
const _: () = assert!(std::mem::offset_of!(RawConfig, nom_freq) == 121);
const _: () = assert!(std::mem::offset_of!(RawConfig, flags) == 124);
const _: () = assert!(std::mem::offset_of!(RawConfig, addr_filter) == 144);
const _: () = assert!(size_of::<RawPacket>() == 24);
const _: () = assert!(std::mem::offset_of!(RawPacket, payload) == 8);
const _: () = assert!(size_of::<RawInsn>() == 40);
const _: () = assert!(std::mem::offset_of!(RawInsn, raw) == 20);
const _: () = assert!(std::mem::offset_of!(RawInsn, size) == 35);
const _: () = assert!(size_of::<RawEvent>() == 64);
const _: () = assert!(std::mem::offset_of!(RawEvent, variant) == 40);
const _: () = assert!(size_of::<RawAsid>() == 24);

/// Opaque `struct pt_packet_decoder`.
#[repr(C)]
struct PktDecoder {
    _opaque: [u8; 0],
}
/// Opaque `struct pt_insn_decoder`.
#[repr(C)]
struct InsnDecoder {
    _opaque: [u8; 0],
}
/// Opaque `struct pt_image`.
#[repr(C)]
struct Image {
    _opaque: [u8; 0],
}

/// `read_memory_callback_t`.
type ReadMemoryCallback = unsafe extern "C" fn(
    buffer: *mut u8,
    size: usize,
    asid: *const RawAsid,
    ip: u64,
    context: *mut c_void,
) -> c_int;

#[link(name = "ipt")]
unsafe extern "C" {
    fn pt_errstr(code: c_int) -> *const c_char;
    fn pt_cpu_errata(errata: *mut RawErrata, cpu: *const RawCpu) -> c_int;

    fn pt_pkt_alloc_decoder(config: *const RawConfig) -> *mut PktDecoder;
    fn pt_pkt_free_decoder(decoder: *mut PktDecoder);
    fn pt_pkt_sync_forward(decoder: *mut PktDecoder) -> c_int;
    fn pt_pkt_get_offset(decoder: *const PktDecoder, offset: *mut u64) -> c_int;
    fn pt_pkt_next(decoder: *mut PktDecoder, packet: *mut RawPacket, size: usize) -> c_int;

    fn pt_insn_alloc_decoder(config: *const RawConfig) -> *mut InsnDecoder;
    fn pt_insn_free_decoder(decoder: *mut InsnDecoder);
    fn pt_insn_sync_forward(decoder: *mut InsnDecoder) -> c_int;
    fn pt_insn_get_offset(decoder: *const InsnDecoder, offset: *mut u64) -> c_int;
    fn pt_insn_get_image(decoder: *mut InsnDecoder) -> *mut Image;
    fn pt_insn_next(decoder: *mut InsnDecoder, insn: *mut RawInsn, size: usize) -> c_int;
    fn pt_insn_event(decoder: *mut InsnDecoder, event: *mut RawEvent, size: usize) -> c_int;

    fn pt_image_set_callback(
        image: *mut Image,
        callback: Option<ReadMemoryCallback>,
        context: *mut c_void,
    ) -> c_int;
}

/// `enum pt_error_code` values used by the wrappers.
pub mod code {
    /// `pte_nosync`.
    pub const NOSYNC: i32 = 3;
    /// `pte_eos`: end of the trace stream.
    pub const EOS: i32 = 7;
    /// `pte_nomap`: no memory mapped at the instruction address.
    pub const NOMAP: i32 = 13;
    /// `pte_bad_context`: "unexpected packet context".
    pub const BAD_CONTEXT: i32 = 6;
    /// `pte_no_enable`: "expected tracing enabled event".
    pub const NO_ENABLE: i32 = 23;
    /// `pte_bad_query`: "trace stream does not match query".
    pub const BAD_QUERY: i32 = 8;
    /// `pte_internal`.
    pub const INTERNAL: i32 = 1;
}

/// `pts_event_pending`.
const PTS_EVENT_PENDING: c_int = 1 << 0;
/// `pts_eos`.
const PTS_EOS: c_int = 1 << 2;

/// libipt's human-readable text for a (positive) `pt_error_code`.
pub fn error_text(code: i32) -> String {
    // SAFETY: pt_errstr accepts any value and returns a pointer to a static NUL-terminated
    // string (a fallback text for unknown codes), never null.
    let ptr = unsafe { pt_errstr(code) };
    if ptr.is_null() {
        return format!("libipt error {code}");
    }
    // SAFETY: `ptr` is non-null and points to a static NUL-terminated C string owned by libipt.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// Builds a `pt_config` over `pt` (with errata for `cpu` when given).
///
/// The returned config points into `pt`; libipt only reads through `begin`/`end` (the `*mut`
/// is the header's type, not a write).
fn make_config(pt: &[u8], cpu: Option<(u16, u8, u8)>) -> RawConfig {
    let range = pt.as_ptr_range();
    let mut config = RawConfig {
        size: size_of::<RawConfig>(),
        begin: range.start.cast_mut(),
        end: range.end.cast_mut(),
        decode_callback: std::ptr::null(),
        decode_context: std::ptr::null_mut(),
        cpu: RawCpu::default(),
        errata: RawErrata::default(),
        cpuid_0x15_eax: 0,
        cpuid_0x15_ebx: 0,
        mtc_freq: 0,
        nom_freq: 0,
        flags: [0; 4],
        addr_filter: [0; 17],
    };
    if let Some((family, model, stepping)) = cpu {
        config.cpu = RawCpu {
            vendor: 1,
            family,
            model,
            stepping,
        };
        // SAFETY: both pointers are to live, correctly laid-out structs owned by this frame.
        let status = unsafe { pt_cpu_errata(&mut config.errata, &config.cpu) };
        // An unknown CPU leaves the errata cleared, which is what ptxed does too.
        let _ = status;
    }
    config
}

/// libipt's errata bits for an Intel CPU (`pt_cpu_errata`): the first word of `struct
/// pt_errata`, bit 0 = bdm70, then bdm64, skd007, skd022, skd010, skl014, apl12, apl11, skl168,
/// skz84 (declaration order). `None` if libipt rejects the CPU.
pub fn cpu_errata_bits(family: u16, model: u8, stepping: u8) -> Option<u32> {
    let cpu = RawCpu {
        vendor: 1,
        family,
        model,
        stepping,
    };
    let mut errata = RawErrata::default();
    // SAFETY: both pointers are to live, correctly laid-out structs owned by this frame.
    let status = unsafe { pt_cpu_errata(&mut errata, &cpu) };
    (status >= 0).then_some(errata.bits)
}

// ---------------------------------------------------------------------------------------------
// Shared public types
// ---------------------------------------------------------------------------------------------

/// A piece of the traced program's memory: `bytes` are mapped at virtual address `addr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSection {
    /// Virtual address of `bytes[0]`.
    pub addr: u64,
    /// The memory contents.
    pub bytes: Vec<u8>,
    /// Where the bytes came from (file and segment), for messages.
    pub name: String,
}

impl ImageSection {
    /// Every section of one of our images, as libipt gets them.
    pub fn all_of(image: &ptrewind::image::Image) -> Vec<ImageSection> {
        image
            .sections()
            .iter()
            .map(|s| ImageSection {
                addr: s.addr,
                bytes: s.data().to_vec(),
                name: s.origin.to_string(),
            })
            .collect()
    }
}

impl ImageSection {
    /// One past the last address covered.
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.bytes.len() as u64)
    }

    /// Whether `ip` lies inside this section.
    pub fn contains(&self, ip: u64) -> bool {
        ip >= self.addr && ip < self.end()
    }
}

/// An error libipt reported, with the trace offset where it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IptError {
    /// Positive `pt_error_code` (see [`code`]).
    pub code: i32,
    /// Trace byte offset reported by `pt_*_get_offset` right after the error.
    pub offset: u64,
    /// For the instruction decoder: the IP of the last instruction decoded before the error
    /// (0 if none yet); for the packet decoder: 0.
    pub ip: u64,
    /// libipt's text for `code`.
    pub message: String,
    /// Whether this came from a (re)synchronisation attempt rather than from decoding.
    pub during_sync: bool,
}

// ---------------------------------------------------------------------------------------------
// Packet decoder
// ---------------------------------------------------------------------------------------------

/// A packet as libipt's packet decoder (`pt_pkt_next`) sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IptPacket {
    /// `ppt_invalid`.
    Invalid,
    /// `ppt_unknown` (only with a decode callback; never produced here).
    Unknown,
    /// PAD.
    Pad,
    /// PSB.
    Psb,
    /// PSBEND.
    Psbend,
    /// FUP; `ipc` is the raw IP-compression field (0 suppressed, 1 = 16-bit update, 2 = 32-bit
    /// update, 3 = 48-bit sign-extended, 4 = 48-bit update, 6 = full 64 bits), `ip` the payload
    /// bits exactly as encoded (not reconstructed with LastIP).
    Fup {
        /// `enum pt_ip_compression`.
        ipc: u32,
        /// Raw payload bits as libipt stores them.
        ip: u64,
    },
    /// TIP.
    Tip {
        /// `enum pt_ip_compression`.
        ipc: u32,
        /// Raw payload bits.
        ip: u64,
    },
    /// TIP.PGE.
    TipPge {
        /// `enum pt_ip_compression`.
        ipc: u32,
        /// Raw payload bits.
        ip: u64,
    },
    /// TIP.PGD.
    TipPgd {
        /// `enum pt_ip_compression`.
        ipc: u32,
        /// Raw payload bits.
        ip: u64,
    },
    /// Short TNT.
    Tnt8 {
        /// Number of TNT bits (stop bit excluded).
        bits: u8,
        /// TNT bits with the stop bit removed, as libipt stores them: the oldest branch is bit
        /// `bits - 1`, the newest bit 0 (byte 0x0a → bits 2, payload 0b01: not taken, taken).
        payload: u64,
    },
    /// Long TNT.
    Tnt64 {
        /// Number of TNT bits (stop bit excluded).
        bits: u8,
        /// TNT bits, same convention as [`IptPacket::Tnt8`].
        payload: u64,
    },
    /// MODE.Exec.
    ModeExec {
        /// CS.L.
        csl: bool,
        /// CS.D.
        csd: bool,
    },
    /// MODE.TSX.
    ModeTsx {
        /// InTX.
        intx: bool,
        /// TXAbort.
        abrt: bool,
    },
    /// MODE with an unknown leaf.
    ModeOther {
        /// `enum pt_mode_leaf`.
        leaf: u32,
    },
    /// PIP.
    Pip {
        /// CR3 value (bits 5..51 as shifted by libipt).
        cr3: u64,
        /// NR (non-root) bit.
        nr: bool,
    },
    /// VMCS.
    Vmcs {
        /// VMCS base address.
        base: u64,
    },
    /// CBR.
    Cbr {
        /// Core:bus ratio.
        ratio: u8,
    },
    /// TSC.
    Tsc {
        /// TSC value.
        tsc: u64,
    },
    /// TMA.
    Tma {
        /// CTC bits.
        ctc: u16,
        /// Fast counter.
        fc: u16,
    },
    /// MTC.
    Mtc {
        /// CTC payload.
        ctc: u8,
    },
    /// CYC.
    Cyc {
        /// Cycle count.
        value: u64,
    },
    /// TraceStop.
    Stop,
    /// OVF.
    Ovf,
    /// MNT.
    Mnt {
        /// Payload.
        payload: u64,
    },
    /// EXSTOP.
    Exstop {
        /// IP bit.
        ip: bool,
    },
    /// MWAIT.
    Mwait {
        /// Hints.
        hints: u32,
        /// Extensions.
        ext: u32,
    },
    /// PWRE.
    Pwre {
        /// Resolved C-state.
        state: u8,
        /// Sub C-state.
        sub_state: u8,
        /// HW bit.
        hw: bool,
    },
    /// PWRX.
    Pwrx {
        /// Last core C-state.
        last: u8,
        /// Deepest core C-state.
        deepest: u8,
        /// Wake reason bits: interrupt (bit 0), store (bit 1), autonomous (bit 2).
        wake: u8,
    },
    /// PTWRITE.
    Ptw {
        /// Payload.
        payload: u64,
        /// Payload-size code.
        plc: u8,
        /// IP bit.
        ip: bool,
    },
    /// A `pt_packet_type` this wrapper does not know.
    Other {
        /// The raw type value.
        kind: u32,
    },
}

impl IptPacket {
    fn from_raw(raw: &RawPacket) -> IptPacket {
        let w0 = raw.payload[0];
        let w1 = raw.payload[1];
        // Payload layouts (offsets within the union): ip: ipc u32 @0, ip u64 @8;
        // tnt: bit_size u8 @0, payload u64 @8; mode: leaf u32 @0, bits u32 @4;
        // pip: cr3 u64 @0, nr bit @8; ptw: payload u64 @0, plc u8 @8, ip bit @12.
        let ipc = w0 as u32;
        match raw.kind {
            0 => IptPacket::Invalid,
            1 => IptPacket::Unknown,
            2 => IptPacket::Pad,
            3 => IptPacket::Psb,
            4 => IptPacket::Psbend,
            5 => IptPacket::Fup { ipc, ip: w1 },
            6 => IptPacket::Tip { ipc, ip: w1 },
            7 => IptPacket::TipPge { ipc, ip: w1 },
            8 => IptPacket::TipPgd { ipc, ip: w1 },
            9 => IptPacket::Tnt8 {
                bits: w0 as u8,
                payload: w1,
            },
            10 => IptPacket::Tnt64 {
                bits: w0 as u8,
                payload: w1,
            },
            11 => {
                let leaf = w0 as u32;
                let bits = (w0 >> 32) as u32;
                match leaf {
                    0x00 => IptPacket::ModeExec {
                        csl: bits & 1 != 0,
                        csd: bits & 2 != 0,
                    },
                    0x20 => IptPacket::ModeTsx {
                        intx: bits & 1 != 0,
                        abrt: bits & 2 != 0,
                    },
                    leaf => IptPacket::ModeOther { leaf },
                }
            }
            12 => IptPacket::Pip {
                cr3: w0,
                nr: w1 & 1 != 0,
            },
            13 => IptPacket::Vmcs { base: w0 },
            14 => IptPacket::Cbr { ratio: w0 as u8 },
            15 => IptPacket::Tsc { tsc: w0 },
            16 => IptPacket::Tma {
                ctc: w0 as u16,
                fc: (w0 >> 16) as u16,
            },
            17 => IptPacket::Mtc { ctc: w0 as u8 },
            18 => IptPacket::Cyc { value: w0 },
            19 => IptPacket::Stop,
            20 => IptPacket::Ovf,
            21 => IptPacket::Mnt { payload: w0 },
            22 => IptPacket::Exstop { ip: w0 & 1 != 0 },
            23 => IptPacket::Mwait {
                hints: w0 as u32,
                ext: (w0 >> 32) as u32,
            },
            // pwre: state u8 @0, sub_state u8 @1, hw bit @4.
            24 => IptPacket::Pwre {
                state: w0 as u8,
                sub_state: (w0 >> 8) as u8,
                hw: (w0 >> 32) & 1 != 0,
            },
            // pwrx: last u8 @0, deepest u8 @1, interrupt/store/autonomous bits @4.
            25 => IptPacket::Pwrx {
                last: w0 as u8,
                deepest: (w0 >> 8) as u8,
                wake: ((w0 >> 32) & 7) as u8,
            },
            26 => IptPacket::Ptw {
                payload: w0,
                plc: w1 as u8,
                ip: (w1 >> 32) & 1 != 0,
            },
            kind => IptPacket::Other { kind },
        }
    }

    /// A short stable name for the packet kind: "pad", "psb", "psbend", "fup", "tip", "tip.pge",
    /// "tip.pgd", "tnt8", "tnt64", "mode.exec", "mode.tsx", "mode", "pip", "vmcs", "cbr", "tsc",
    /// "tma", "mtc", "cyc", "stop", "ovf", "mnt", "exstop", "mwait", "pwre", "pwrx", "ptw",
    /// "invalid", "unknown", "other".
    pub fn kind_name(&self) -> &'static str {
        match self {
            IptPacket::Invalid => "invalid",
            IptPacket::Unknown => "unknown",
            IptPacket::Pad => "pad",
            IptPacket::Psb => "psb",
            IptPacket::Psbend => "psbend",
            IptPacket::Fup { .. } => "fup",
            IptPacket::Tip { .. } => "tip",
            IptPacket::TipPge { .. } => "tip.pge",
            IptPacket::TipPgd { .. } => "tip.pgd",
            IptPacket::Tnt8 { .. } => "tnt8",
            IptPacket::Tnt64 { .. } => "tnt64",
            IptPacket::ModeExec { .. } => "mode.exec",
            IptPacket::ModeTsx { .. } => "mode.tsx",
            IptPacket::ModeOther { .. } => "mode",
            IptPacket::Pip { .. } => "pip",
            IptPacket::Vmcs { .. } => "vmcs",
            IptPacket::Cbr { .. } => "cbr",
            IptPacket::Tsc { .. } => "tsc",
            IptPacket::Tma { .. } => "tma",
            IptPacket::Mtc { .. } => "mtc",
            IptPacket::Cyc { .. } => "cyc",
            IptPacket::Stop => "stop",
            IptPacket::Ovf => "ovf",
            IptPacket::Mnt { .. } => "mnt",
            IptPacket::Exstop { .. } => "exstop",
            IptPacket::Mwait { .. } => "mwait",
            IptPacket::Pwre { .. } => "pwre",
            IptPacket::Pwrx { .. } => "pwrx",
            IptPacket::Ptw { .. } => "ptw",
            IptPacket::Other { .. } => "other",
        }
    }
}

/// One packet with its position in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketRecord {
    /// Byte offset of the packet's first byte.
    pub offset: u64,
    /// Encoded size in bytes.
    pub size: u8,
    /// The decoded packet.
    pub packet: IptPacket,
}

/// Everything libipt's packet decoder made of a trace (ptdump-style: sync forward, decode,
/// on an error resync forward to the next PSB and go on).
#[derive(Clone, Debug, Default)]
pub struct PacketRun {
    /// The packets, in trace order.
    pub packets: Vec<PacketRecord>,
    /// Errors (decode errors and sync failures other than end of stream), in trace order.
    pub errors: Vec<IptError>,
    /// Offset of the first PSB libipt synchronised to (None: no PSB at all).
    pub first_sync: Option<u64>,
}

impl PacketRun {
    /// Number of packets per [`IptPacket::kind_name`].
    pub fn counts_by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for record in &self.packets {
            *counts.entry(record.packet.kind_name()).or_insert(0) += 1;
        }
        counts
    }

    /// Offset of the first decode error, if any.
    pub fn first_error_offset(&self) -> Option<u64> {
        self.errors.first().map(|e| e.offset)
    }
}

/// Owns a libipt packet decoder and frees it on drop.
struct PktGuard(*mut PktDecoder);
impl Drop for PktGuard {
    fn drop(&mut self) {
        // SAFETY: the pointer came from pt_pkt_alloc_decoder, is non-null and freed only here.
        unsafe { pt_pkt_free_decoder(self.0) }
    }
}

/// Runs libipt's packet decoder over `pt`.
///
/// Panics only if libipt cannot allocate a decoder (a broken installation, not bad input).
pub fn ipt_packets(pt: &[u8]) -> PacketRun {
    let mut run = PacketRun::default();
    if pt.is_empty() {
        return run;
    }
    let config = make_config(pt, None);
    // SAFETY: `config` is a fully initialised pt_config whose begin/end delimit `pt`, which
    // outlives the decoder (the decoder is freed by `guard` before this function returns).
    let decoder = unsafe { pt_pkt_alloc_decoder(&config) };
    assert!(!decoder.is_null(), "pt_pkt_alloc_decoder failed");
    let guard = PktGuard(decoder);

    let offset_of = |d: *mut PktDecoder| -> u64 {
        let mut offset = 0u64;
        // SAFETY: `d` is a live decoder; `offset` is a valid out-pointer.
        let status = unsafe { pt_pkt_get_offset(d, &mut offset) };
        if status < 0 { u64::MAX } else { offset }
    };

    let mut last_sync: Option<u64> = None;
    'sync: loop {
        // SAFETY: live decoder.
        let status = unsafe { pt_pkt_sync_forward(guard.0) };
        if status < 0 {
            if -status != code::EOS {
                run.errors.push(IptError {
                    code: -status,
                    offset: offset_of(guard.0),
                    ip: 0,
                    message: error_text(-status),
                    during_sync: true,
                });
            }
            break;
        }
        let here = offset_of(guard.0);
        // Guard against a resync that makes no progress.
        if last_sync.is_some_and(|prev| here <= prev) {
            break;
        }
        last_sync = Some(here);
        if run.first_sync.is_none() {
            run.first_sync = Some(here);
        }
        loop {
            let offset = offset_of(guard.0);
            let mut raw = RawPacket {
                kind: 0,
                size: 0,
                payload: [0; 2],
            };
            // SAFETY: live decoder; `raw` is a pt_packet-sized, writable struct and we pass
            // its exact size as the header requires.
            let status = unsafe { pt_pkt_next(guard.0, &mut raw, size_of::<RawPacket>()) };
            if status < 0 {
                if -status == code::EOS {
                    break 'sync;
                }
                run.errors.push(IptError {
                    code: -status,
                    offset,
                    ip: 0,
                    message: error_text(-status),
                    during_sync: false,
                });
                continue 'sync;
            }
            run.packets.push(PacketRecord {
                offset,
                size: raw.size,
                packet: IptPacket::from_raw(&raw),
            });
        }
    }
    run
}

// ---------------------------------------------------------------------------------------------
// Instruction-flow decoder
// ---------------------------------------------------------------------------------------------

/// `enum pt_insn_class`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InsnClass {
    /// `ptic_error`: class not available.
    Error,
    /// Not a control-flow instruction.
    Other,
    /// Near call.
    Call,
    /// Near return.
    Return,
    /// Near unconditional jump.
    Jump,
    /// Near conditional jump.
    CondJump,
    /// Far call (incl. syscall, int).
    FarCall,
    /// Far return (incl. sysret, iret).
    FarReturn,
    /// Far jump.
    FarJump,
    /// PTWRITE.
    Ptwrite,
    /// A value this wrapper does not know.
    Unknown(u32),
}

impl InsnClass {
    fn from_raw(v: u32) -> InsnClass {
        match v {
            0 => InsnClass::Error,
            1 => InsnClass::Other,
            2 => InsnClass::Call,
            3 => InsnClass::Return,
            4 => InsnClass::Jump,
            5 => InsnClass::CondJump,
            6 => InsnClass::FarCall,
            7 => InsnClass::FarReturn,
            8 => InsnClass::FarJump,
            9 => InsnClass::Ptwrite,
            v => InsnClass::Unknown(v),
        }
    }
}

/// `enum pt_exec_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExecMode {
    /// Unknown.
    Unknown,
    /// 16-bit.
    Bits16,
    /// 32-bit (compatibility or legacy protected mode).
    Bits32,
    /// 64-bit.
    Bits64,
}

impl ExecMode {
    fn from_raw(v: u32) -> ExecMode {
        match v {
            1 => ExecMode::Bits16,
            2 => ExecMode::Bits32,
            3 => ExecMode::Bits64,
            _ => ExecMode::Unknown,
        }
    }
}

/// One instruction returned by `pt_insn_next`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OracleInsn {
    /// Virtual address.
    pub ip: u64,
    /// Length in bytes.
    pub size: u8,
    /// libipt's coarse class.
    pub iclass: InsnClass,
    /// Execution mode.
    pub mode: ExecMode,
    /// Executed speculatively (inside a TSX transaction).
    pub speculative: bool,
    /// The instruction spans two image sections.
    pub truncated: bool,
}

/// The payload of a libipt event. IPs are `None` when libipt flags them suppressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OracleEventKind {
    /// `ptev_enabled`: tracing (re)enabled at `ip`; `resumed` after a disable at the same IP.
    Enabled {
        /// Where execution resumes.
        ip: Option<u64>,
        /// Resumed from the same IP (e.g. after a TIP.PGD/TIP.PGE pair).
        resumed: bool,
    },
    /// `ptev_disabled`: tracing disabled after the last instruction.
    Disabled {
        /// The next IP, if known (usually suppressed for user-only tracing).
        ip: Option<u64>,
    },
    /// `ptev_async_disabled`: disabled asynchronously at `at`.
    AsyncDisabled {
        /// Source IP (where the asynchronous event hit).
        at: u64,
        /// Destination IP, if known.
        ip: Option<u64>,
    },
    /// `ptev_async_branch`: interrupt/exception from `from` to `to`.
    AsyncBranch {
        /// Source IP.
        from: u64,
        /// Destination IP, if known.
        to: Option<u64>,
    },
    /// `ptev_paging`: CR3 change bound to the next branch.
    Paging {
        /// New CR3.
        cr3: u64,
        /// Non-root (VMX guest).
        non_root: bool,
    },
    /// `ptev_async_paging`: CR3 change at `ip`.
    AsyncPaging {
        /// New CR3.
        cr3: u64,
        /// Non-root (VMX guest).
        non_root: bool,
        /// Where it takes effect.
        ip: Option<u64>,
    },
    /// `ptev_overflow`: trace overflow; decoding resumes at `ip`.
    Overflow {
        /// Where decoding resumes, if known.
        ip: Option<u64>,
    },
    /// `ptev_exec_mode`.
    ExecMode {
        /// The new mode.
        mode: ExecMode,
        /// Where it takes effect.
        ip: Option<u64>,
    },
    /// `ptev_tsx`.
    Tsx {
        /// Where it takes effect.
        ip: Option<u64>,
        /// Now speculative.
        speculative: bool,
        /// Transaction aborted.
        aborted: bool,
    },
    /// `ptev_stop`.
    Stop,
    /// `ptev_vmcs`.
    Vmcs {
        /// VMCS base.
        base: u64,
    },
    /// `ptev_async_vmcs`.
    AsyncVmcs {
        /// VMCS base.
        base: u64,
        /// Where it takes effect.
        ip: Option<u64>,
    },
    /// `ptev_exstop`.
    Exstop {
        /// Where execution stopped.
        ip: Option<u64>,
    },
    /// `ptev_mwait`.
    Mwait {
        /// Where.
        ip: Option<u64>,
        /// Hints.
        hints: u32,
        /// Extensions.
        ext: u32,
    },
    /// `ptev_pwre`.
    Pwre,
    /// `ptev_pwrx`.
    Pwrx,
    /// `ptev_ptwrite`.
    Ptwrite {
        /// Where.
        ip: Option<u64>,
        /// Payload.
        payload: u64,
    },
    /// `ptev_tick`.
    Tick,
    /// `ptev_cbr`.
    Cbr {
        /// Core:bus ratio.
        ratio: u16,
    },
    /// `ptev_mnt`.
    Mnt {
        /// Payload.
        payload: u64,
    },
    /// An event type this wrapper does not know.
    Other {
        /// The raw `enum pt_event_type` value.
        kind: u32,
    },
}

impl OracleEventKind {
    fn from_raw(raw: &RawEvent) -> OracleEventKind {
        let suppressed = raw.flags & 1 != 0;
        let v = raw.variant;
        let opt = |ip: u64| if suppressed { None } else { Some(ip) };
        match raw.kind {
            0 => OracleEventKind::Enabled {
                ip: opt(v[0]),
                resumed: v[1] & 1 != 0,
            },
            1 => OracleEventKind::Disabled { ip: opt(v[0]) },
            2 => OracleEventKind::AsyncDisabled {
                at: v[0],
                ip: opt(v[1]),
            },
            3 => OracleEventKind::AsyncBranch {
                from: v[0],
                to: opt(v[1]),
            },
            4 => OracleEventKind::Paging {
                cr3: v[0],
                non_root: v[1] & 1 != 0,
            },
            5 => OracleEventKind::AsyncPaging {
                cr3: v[0],
                non_root: v[1] & 1 != 0,
                ip: opt(v[2]),
            },
            6 => OracleEventKind::Overflow { ip: opt(v[0]) },
            // exec_mode: mode enum @0, ip u64 @8.
            7 => OracleEventKind::ExecMode {
                mode: ExecMode::from_raw(v[0] as u32),
                ip: opt(v[1]),
            },
            8 => OracleEventKind::Tsx {
                ip: opt(v[0]),
                speculative: v[1] & 1 != 0,
                aborted: v[1] & 2 != 0,
            },
            9 => OracleEventKind::Stop,
            10 => OracleEventKind::Vmcs { base: v[0] },
            11 => OracleEventKind::AsyncVmcs {
                base: v[0],
                ip: opt(v[1]),
            },
            12 => OracleEventKind::Exstop { ip: opt(v[0]) },
            13 => OracleEventKind::Mwait {
                ip: opt(v[0]),
                hints: v[1] as u32,
                ext: (v[1] >> 32) as u32,
            },
            14 => OracleEventKind::Pwre,
            15 => OracleEventKind::Pwrx,
            // ptwrite: ip @0, size u8 @8, payload @16.
            16 => OracleEventKind::Ptwrite {
                ip: opt(v[0]),
                payload: v[2],
            },
            17 => OracleEventKind::Tick,
            18 => OracleEventKind::Cbr { ratio: v[0] as u16 },
            19 => OracleEventKind::Mnt { payload: v[0] },
            kind => OracleEventKind::Other { kind },
        }
    }
}

/// An event libipt reported between instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OracleEvent {
    /// What happened.
    pub kind: OracleEventKind,
    /// A status update (e.g. the state re-announced at a PSB), not a change.
    pub status_update: bool,
    /// The event's TSC, if the trace had one.
    pub tsc: Option<u64>,
}

/// One step of libipt's instruction-flow output, in trace order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OracleItem {
    /// An instruction.
    Insn(OracleInsn),
    /// An event.
    Event(OracleEvent),
    /// libipt stopped here; decoding went on from the next PSB.
    Error(IptError),
}

/// Counts over an instruction-flow run (see [`ipt_insn_walk`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OracleSummary {
    /// Instructions returned by `pt_insn_next` (the README's definition).
    pub insns: u64,
    /// Events drained with `pt_insn_event`.
    pub events: u64,
    /// Errors, in trace order (end of stream is not an error).
    pub errors: Vec<IptError>,
}

/// Everything libipt's instruction-flow decoder made of a trace.
#[derive(Clone, Debug, Default)]
pub struct OracleRun {
    /// Instructions, events and errors in order.
    pub items: Vec<OracleItem>,
    /// The counts.
    pub summary: OracleSummary,
}

impl OracleRun {
    /// Number of instructions returned by `pt_insn_next`.
    pub fn insn_count(&self) -> u64 {
        self.summary.insns
    }

    /// The errors, in order.
    pub fn errors(&self) -> &[IptError] {
        &self.summary.errors
    }

    /// The instructions, in order.
    pub fn insns(&self) -> impl Iterator<Item = &OracleInsn> + '_ {
        self.items.iter().filter_map(|item| match item {
            OracleItem::Insn(insn) => Some(insn),
            _ => None,
        })
    }

    /// The instruction addresses, in order.
    pub fn ips(&self) -> Vec<u64> {
        self.insns().map(|insn| insn.ip).collect()
    }

    /// The events, in order.
    pub fn events(&self) -> impl Iterator<Item = &OracleEvent> + '_ {
        self.items.iter().filter_map(|item| match item {
            OracleItem::Event(event) => Some(event),
            _ => None,
        })
    }

    /// The control transfers in perf-script / HASE `.trace` form: `(from, to)` with `from = 0`
    /// for a trace enable and `to = 0` for a trace disable.
    ///
    /// A transfer is recorded whenever the next instruction is not at `ip + size` (taken
    /// branches, calls, returns, far transfers). An enable yields `(0, ip)` (status updates
    /// excluded); a disable, async disable or overflow yields `(last, 0)`, where `last` is the
    /// last instruction since the enable, or the enable address when none ran in between.
    /// An overflow or an error ends the current segment without a transfer of its own: the
    /// instruction after it is not paired with the one before it.
    pub fn branches(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        // The address to report as "from" of a disable.
        let mut last_ip: Option<u64> = None;
        // The fall-through address of the previous instruction, if it belongs to this segment.
        let mut prev: Option<(u64, u64)> = None;
        for item in &self.items {
            match item {
                OracleItem::Insn(insn) => {
                    if let Some((prev_ip, fall_through)) = prev
                        && insn.ip != fall_through
                    {
                        out.push((prev_ip, insn.ip));
                    }
                    prev = Some((insn.ip, insn.ip.wrapping_add(u64::from(insn.size))));
                    last_ip = Some(insn.ip);
                }
                OracleItem::Event(event) if !event.status_update => match event.kind {
                    OracleEventKind::Enabled { ip, .. } => {
                        if let Some(ip) = ip {
                            out.push((0, ip));
                            last_ip = Some(ip);
                        }
                        prev = None;
                    }
                    OracleEventKind::Disabled { .. } => {
                        if let Some(from) = last_ip.take() {
                            out.push((from, 0));
                        }
                        prev = None;
                    }
                    OracleEventKind::AsyncDisabled { at, .. } => {
                        out.push((at, 0));
                        last_ip = None;
                        prev = None;
                    }
                    OracleEventKind::Overflow { .. } => {
                        prev = None;
                    }
                    _ => {}
                },
                OracleItem::Event(_) => {}
                OracleItem::Error(_) => {
                    prev = None;
                    last_ip = None;
                }
            }
        }
        out
    }
}

/// The in-memory image handed to libipt's read-memory callback: sections sorted by address.
struct CallbackImage<'a> {
    sections: Vec<(u64, &'a [u8])>,
}

impl CallbackImage<'_> {
    /// Copies up to `buf.len()` bytes at `ip` from the section containing it; like libipt's own
    /// file sections, a read never crosses a section end (libipt handles instructions that
    /// straddle two sections itself). Returns the number of bytes copied, or None if unmapped.
    fn read(&self, ip: u64, buf: &mut [u8]) -> Option<usize> {
        let idx = self.sections.partition_point(|(addr, _)| *addr <= ip);
        let (addr, bytes) = self.sections.get(idx.checked_sub(1)?)?;
        let start = usize::try_from(ip - addr).ok()?;
        let avail = bytes.get(start..)?;
        if avail.is_empty() {
            return None;
        }
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        Some(n)
    }
}

/// libipt read-memory callback over a [`CallbackImage`].
///
/// # Safety
/// `buffer` must be valid for `size` writable bytes and `context` must point to a live
/// `CallbackImage` (guaranteed by [`ipt_insn_walk`], which owns both for the decoder's life).
unsafe extern "C" fn read_memory(
    buffer: *mut u8,
    size: usize,
    _asid: *const RawAsid,
    ip: u64,
    context: *mut c_void,
) -> c_int {
    if buffer.is_null() || context.is_null() {
        return -code::INTERNAL;
    }
    // SAFETY: per this function's contract, `context` points to the CallbackImage that
    // ipt_insn_walk registered and keeps alive while the decoder exists.
    let image = unsafe { &*(context as *const CallbackImage<'_>) };
    // SAFETY: libipt passes a buffer of `size` writable bytes (at most pt_max_insn_size).
    let buf = unsafe { std::slice::from_raw_parts_mut(buffer, size) };
    match image.read(ip, buf) {
        Some(n) => c_int::try_from(n).unwrap_or(c_int::MAX),
        None => -code::NOMAP,
    }
}

/// Owns a libipt instruction decoder and frees it on drop.
struct InsnGuard(*mut InsnDecoder);
impl Drop for InsnGuard {
    fn drop(&mut self) {
        // SAFETY: the pointer came from pt_insn_alloc_decoder, is non-null and freed only here.
        unsafe { pt_insn_free_decoder(self.0) }
    }
}

/// Runs libipt's instruction-flow decoder over `pt` with the given code `images`, calling `sink`
/// for every instruction, event and error in order, and returns the counts.
///
/// Follows `ptxed`: `pt_insn_sync_forward`; drain pending events with `pt_insn_event`; stop the
/// segment at `pts_eos`; `pt_insn_next`; an instruction returned together with an error still
/// counts (its class is not `ptic_error`); after an error, record it with the offset from
/// `pt_insn_get_offset` and resynchronise forward to the next PSB (giving up when a resync makes
/// no progress). `cpu` = (family, model, stepping) enables libipt's errata workarounds.
pub fn ipt_insn_walk(
    pt: &[u8],
    cpu: Option<(u16, u8, u8)>,
    images: &[ImageSection],
    sink: impl FnMut(OracleItem),
) -> OracleSummary {
    ipt_insn_walk_filtered(pt, cpu, &[], images, sink)
}

/// [`ipt_insn_walk`] with IP filter ranges (`[from, to]`, up to four) in
/// `pt_config.addr_filter`, each configured as a FilterEn range (`addrN_cfg = pt_addr_cfg_filter`).
pub fn ipt_insn_walk_filtered(
    pt: &[u8],
    cpu: Option<(u16, u8, u8)>,
    filter: &[(u64, u64)],
    images: &[ImageSection],
    mut sink: impl FnMut(OracleItem),
) -> OracleSummary {
    let mut summary = OracleSummary::default();
    if pt.is_empty() {
        return summary;
    }
    let mut sections: Vec<(u64, &[u8])> = images
        .iter()
        .filter(|s| !s.bytes.is_empty())
        .map(|s| (s.addr, s.bytes.as_slice()))
        .collect();
    sections.sort_by_key(|(addr, _)| *addr);
    let image = CallbackImage { sections };

    let mut config = make_config(pt, cpu);
    // `addr_filter`: the addrN_cfg nibbles (1 = filter), then addr0_a, addr0_b, addr1_a, ...
    for (i, &(from, to)) in filter.iter().take(4).enumerate() {
        config.addr_filter[0] |= 1 << (4 * i);
        config.addr_filter[1 + 2 * i] = from;
        config.addr_filter[2 + 2 * i] = to;
    }
    // SAFETY: `config` is a fully initialised pt_config delimiting `pt`, which outlives the
    // decoder (freed by `guard` at the end of this function).
    let decoder = unsafe { pt_insn_alloc_decoder(&config) };
    assert!(!decoder.is_null(), "pt_insn_alloc_decoder failed");
    let guard = InsnGuard(decoder);
    // SAFETY: live decoder; the returned image belongs to the decoder.
    let pt_image = unsafe { pt_insn_get_image(guard.0) };
    assert!(!pt_image.is_null(), "pt_insn_get_image failed");
    // SAFETY: `pt_image` is the decoder's live image; `image` outlives the decoder (declared
    // before `guard`, so dropped after it) and is only read through a shared reference.
    let status = unsafe {
        pt_image_set_callback(
            pt_image,
            Some(read_memory),
            &image as *const CallbackImage<'_> as *mut c_void,
        )
    };
    assert!(status >= 0, "pt_image_set_callback failed: {status}");

    let offset_of = |d: *mut InsnDecoder| -> u64 {
        let mut offset = 0u64;
        // SAFETY: `d` is a live decoder; `offset` is a valid out-pointer.
        let status = unsafe { pt_insn_get_offset(d, &mut offset) };
        if status < 0 { u64::MAX } else { offset }
    };

    let mut last_ip = 0u64;
    let mut last_sync_offset: Option<u64> = None;
    loop {
        // SAFETY: live decoder.
        let mut status = unsafe { pt_insn_sync_forward(guard.0) };
        if status < 0 {
            if -status == code::EOS {
                break;
            }
            let offset = offset_of(guard.0);
            let error = IptError {
                code: -status,
                offset,
                ip: last_ip,
                message: error_text(-status),
                during_sync: true,
            };
            summary.errors.push(error.clone());
            sink(OracleItem::Error(error));
            if last_sync_offset.is_some_and(|prev| offset <= prev) || offset == u64::MAX {
                break;
            }
            last_sync_offset = Some(offset);
            continue;
        }
        last_sync_offset = Some(offset_of(guard.0));

        // Decode until an error or the end of the stream.
        let error_status = loop {
            while status >= 0 && status & PTS_EVENT_PENDING != 0 {
                let mut raw = RawEvent {
                    kind: 0,
                    flags: 0,
                    tsc: 0,
                    lost_mtc: 0,
                    lost_cyc: 0,
                    reserved: [0; 2],
                    variant: [0; 3],
                };
                // SAFETY: live decoder; `raw` is a writable pt_event-sized struct and we pass
                // its exact size.
                status = unsafe { pt_insn_event(guard.0, &mut raw, size_of::<RawEvent>()) };
                if status >= 0 {
                    summary.events += 1;
                    sink(OracleItem::Event(OracleEvent {
                        kind: OracleEventKind::from_raw(&raw),
                        status_update: raw.flags & 2 != 0,
                        tsc: (raw.flags & 4 != 0).then_some(raw.tsc),
                    }));
                }
            }
            if status < 0 {
                break status;
            }
            if status & PTS_EOS != 0 {
                break -code::EOS;
            }
            let mut raw = RawInsn {
                ip: 0,
                isid: 0,
                mode: 0,
                iclass: 0,
                raw: [0; PT_MAX_INSN_SIZE],
                size: 0,
                flags: 0,
            };
            // SAFETY: live decoder; `raw` is a writable pt_insn-sized struct and we pass its
            // exact size.
            status = unsafe { pt_insn_next(guard.0, &mut raw, size_of::<RawInsn>()) };
            // Even on error the current instruction may have been decoded (ptxed prints it).
            if raw.iclass != 0 {
                summary.insns += 1;
                last_ip = raw.ip;
                sink(OracleItem::Insn(OracleInsn {
                    ip: raw.ip,
                    size: raw.size,
                    iclass: InsnClass::from_raw(raw.iclass),
                    mode: ExecMode::from_raw(raw.mode),
                    speculative: raw.flags & 1 != 0,
                    truncated: raw.flags & 2 != 0,
                }));
            }
            if status < 0 {
                break status;
            }
        };
        if -error_status == code::EOS {
            break;
        }
        let error = IptError {
            code: -error_status,
            offset: offset_of(guard.0),
            ip: last_ip,
            message: error_text(-error_status),
            during_sync: false,
        };
        summary.errors.push(error.clone());
        sink(OracleItem::Error(error));
    }
    drop(guard);
    drop(image);
    summary
}

/// Runs libipt's instruction-flow decoder (see [`ipt_insn_walk`]) and keeps every item.
pub fn ipt_insns(pt: &[u8], cpu: Option<(u16, u8, u8)>, images: &[ImageSection]) -> OracleRun {
    let mut items = Vec::new();
    let summary = ipt_insn_walk(pt, cpu, images, |item| items.push(item));
    OracleRun { items, summary }
}

/// Like [`ipt_insns`] but only counts (no per-instruction storage): for big traces.
pub fn ipt_insn_count(
    pt: &[u8],
    cpu: Option<(u16, u8, u8)>,
    images: &[ImageSection],
) -> OracleSummary {
    ipt_insn_walk(pt, cpu, images, |_| {})
}

/// Reconstructs a full IP from an IP packet's raw payload and LastIP (SDM "IP Compression").
fn last_ip_update(last: &mut u64, ipc: u32, raw: u64) -> Option<u64> {
    *last = match ipc {
        1 => (*last & !0xffff) | (raw & 0xffff),
        2 => (*last & !0xffff_ffff) | (raw & 0xffff_ffff),
        // Sign-extend bit 47.
        3 => (((raw & 0xffff_ffff_ffff) << 16) as i64 >> 16) as u64,
        4 => (*last & !0xffff_ffff_ffff) | (raw & 0xffff_ffff_ffff),
        6 => raw,
        _ => return None,
    };
    Some(*last)
}

/// Masks (overwrites with PAD bytes, so every offset stays valid) each FUP inside a PSB+ that is
/// immediately followed (PADs aside) by a TIP.PGE to the same IP. Returns the patched stream and
/// the offsets of the masked FUPs.
///
/// Why: several corpus traces (libxdc avscript_32, icelake_tip, dyn_test; HASE 2018-05
/// recordings) were recorded so that tracing is (re-)enabled right at a PSB: the PSB+ already
/// carries a FUP (= "tracing enabled at x") and a TIP.PGE to x follows. libipt 2.0.5 treats the
/// PSB+ FUP as enabling, then rejects the TIP.PGE's enabled event with `pte_bad_context`
/// ("unexpected packet context") and drops everything up to the next PSB. Masking the redundant
/// FUP makes libipt see the plain "disabled PSB+, then TIP.PGE" form; the shared/corpus README
/// figures for avscript_32 (1 114 194) and icelake_tip (15) were measured that way.
pub fn mask_psb_fup_before_pge(pt: &[u8]) -> (Vec<u8>, Vec<u64>) {
    let mut out = pt.to_vec();
    let mut masked = Vec::new();
    let packets = ipt_packets(pt);
    let mut last_ip = 0u64;
    let mut in_psb = false;
    // The FUP seen in the current PSB+ (offset, size, ip), while it is still a candidate.
    let mut candidate: Option<(u64, u8, Option<u64>)> = None;
    let mut after_psbend = false;
    for record in &packets.packets {
        match record.packet {
            IptPacket::Psb => {
                in_psb = true;
                last_ip = 0;
                candidate = None;
                after_psbend = false;
            }
            IptPacket::Pad => {}
            IptPacket::Psbend => {
                in_psb = false;
                after_psbend = candidate.is_some();
            }
            IptPacket::Fup { ipc, ip } if in_psb => {
                let full = last_ip_update(&mut last_ip, ipc, ip);
                candidate = Some((record.offset, record.size, full));
            }
            IptPacket::TipPge { ipc, ip } => {
                let full = last_ip_update(&mut last_ip, ipc, ip);
                if after_psbend
                    && let Some((offset, size, Some(fup_ip))) = candidate
                    && full == Some(fup_ip)
                {
                    let start = offset as usize;
                    if let Some(bytes) = out.get_mut(start..start + usize::from(size)) {
                        bytes.fill(0);
                        masked.push(offset);
                    }
                }
                candidate = None;
                after_psbend = false;
            }
            IptPacket::Fup { ipc, ip }
            | IptPacket::Tip { ipc, ip }
            | IptPacket::TipPgd { ipc, ip } => {
                last_ip_update(&mut last_ip, ipc, ip);
                if !in_psb {
                    candidate = None;
                    after_psbend = false;
                }
            }
            _ => {
                if !in_psb {
                    candidate = None;
                    after_psbend = false;
                }
            }
        }
    }
    (out, masked)
}
