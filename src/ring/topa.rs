//! Table of Physical Addresses (ToPA) output, SDM §33.2.7.2, as a software model.
//!
//! The model is the processor side of ToPA: it keeps the three processor pointers
//! (`proc_trace_table_base`, `proc_trace_table_offset`, `proc_trace_output_offset`), reads table
//! entries from a modelled physical [`Memory`], stores trace bytes at
//! `trace_store_phys_addr := base address from current ToPA table entry +
//! proc_trace_output_offset`, walks to the next entry when a region fills, follows END entries to
//! the next table, and implements ToPA STOP, ToPA PMI and the ToPA operational errors. The
//! reader side ([`TraceSource`]) hands the drainer what was stored, with exact loss accounting.
//!
//! ## Which SDM rule each behaviour follows
//!
//! | Behaviour | SDM §33.2.7.2 rule |
//! |---|---|
//! | bytes cross region and table boundaries freely | "treats the various output regions … as a unified buffer … a single packet may span the boundary" |
//! | region full → next entry, offset 0 | "proc_trace_table_offset moves to the next ToPA entry, proc_trace_output_offset is set to 0" |
//! | END → table base := entry address, offsets 0 | "proc_trace_table_base is loaded with the base address stored in this END entry … offsets reset to 0" |
//! | no END/STOP up to offset 0FFFFFF8H → wrap to entry 0 | "the proc_trace_table_offset and proc_trace_output_offset are reset to 0" |
//! | STOP region full → Status.Stopped, no TIP.PGD, cut packet, rest lost | "ToPA STOP" |
//! | after a stop: OUTPUT_BASE = STOP entry's table, MaskOrTableOffset = its index, OutputOffset = region size | "ToPA STOP" (the English text says *size of the region*; the Korean translation in the seeds says *size − 1* but then "points to the next byte after the end", i.e. the size) |
//! | INT region full → Trace_ToPA_PMI (IA32_PERF_GLOBAL_STATUS bit 55), PMI | "ToPA PMI" |
//! | STOP and INT in one entry: Stopped is set before the PMI | Table 33-3, INT |
//! | PMI delivered after a skid (optional) | "This interrupt is not precise" |
//! | MENTRY = 0: one output entry, then END back to the same table; PMI before the region fills | "Single Output Region ToPA Implementation", "ToPA PMI and Single Output Region ToPA Implementation" |
//! | errors raised when the bad entry is *reached*, Status.Error set, output stops | "ToPA Errors": "when the problematic ToPA entry is reached" |
//! | PendToPAPMI set with InjectPsbPmiOnEnable | "PMI Preservation" |
//! | output into SMRR memory / table in SMRR → error | §33.2.7.4, Table 33-5 |
//!
//! ## Modelling choices where the SDM leaves room
//!
//! * The processor advances to the next entry as soon as a region is full, so errors in the next
//!   entry are raised at that moment (not at the next byte). The MSR view is always exact; real
//!   hardware only guarantees it while TraceEn = 0.
//! * Errors in the entry the MSRs point at are raised when TraceEn is set.
//! * A STOP, an error, or restricted memory ends output mid-write: the stored part of the write
//!   stays, the rest is counted as dropped ("packets remaining in internal buffers are lost").
//! * Table 33-5 says the processor *may* signal an error when output reaches SMRR memory; the
//!   model always does.
//! * Only the current entry is cached; tables may be rewritten with TraceEn = 0, as the SDM
//!   requires for predictable behaviour.
//! * Memory not backed by a [`Memory`] block is a model-only error ([`ErrorKind::Unbacked`]).
//! * PendToPAPMI is set, but the re-injection of a PMI when TraceEn is set again is not modelled.

use std::collections::VecDeque;

use super::memory::{Location, Memory};
use super::stream::StreamLog;
use super::{
    BuildError, Capabilities, Chunk, DrainReport, ErrorKind, ErrorSite, MsrFault, OperationalError,
    OutputState, RtitStatus, TraceSink, TraceSource, WriteOutcome,
};

/// A ToPA region size: the 4-bit Size field of an entry, `4 KiB << encoding` (Table 33-3:
/// 0: 4K, 1: 8K, … 9: 2M, … 15: 128M).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RegionSize(u8);

impl RegionSize {
    /// 4 KiB, encoding 0.
    pub const K4: RegionSize = RegionSize(0);
    /// 128 MiB, encoding 15.
    pub const M128: RegionSize = RegionSize(15);

    /// The size with Size-field `encoding` (0..=15).
    pub fn from_encoding(encoding: u8) -> Option<Self> {
        (encoding <= 15).then_some(RegionSize(encoding))
    }

    /// The size of `bytes` bytes, if it is one of the sixteen encodable sizes.
    pub fn from_bytes(bytes: u64) -> Option<Self> {
        if !bytes.is_power_of_two() || bytes < 4096 {
            return None;
        }
        Self::from_encoding(u8::try_from(bytes.trailing_zeros() - 12).ok()?)
    }

    /// The Size-field encoding.
    pub fn encoding(self) -> u8 {
        self.0
    }

    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        4096 << self.0
    }
}

/// The INT and STOP attributes of an output entry (Table 33-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntryFlags {
    /// INT: signal a ToPA PMI when the region fills.
    pub int: bool,
    /// STOP: set IA32_RTIT_STATUS.Stopped when the region fills, ending output.
    pub stop: bool,
}

impl EntryFlags {
    /// Neither INT nor STOP.
    pub const NONE: EntryFlags = EntryFlags {
        int: false,
        stop: false,
    };
    /// INT only.
    pub const INT: EntryFlags = EntryFlags {
        int: true,
        stop: false,
    };
    /// STOP only.
    pub const STOP: EntryFlags = EntryFlags {
        int: false,
        stop: true,
    };
    /// INT and STOP (the STOP happens before the INT).
    pub const INT_STOP: EntryFlags = EntryFlags {
        int: true,
        stop: true,
    };
}

/// One 64-bit ToPA table entry (SDM Figure 33-2 / Table 33-3; the kernel's
/// `struct topa_entry`):
///
/// | bits | field |
/// |---|---|
/// | 0 | END |
/// | 1 | reserved |
/// | 2 | INT |
/// | 3 | reserved |
/// | 4 | STOP |
/// | 5 | reserved |
/// | 9:6 | Size (4K << Size; ignored if END) |
/// | 11:10 | reserved |
/// | MAXPHYADDR-1:12 | output region base, or next table base if END |
/// | 63:MAXPHYADDR | reserved |
///
/// The constructors do not validate: like software writing a table, they can build any entry,
/// and the processor model reports invalid ones when it reaches them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TopaEntry(pub u64);

impl TopaEntry {
    /// Bit 0, END.
    pub const END: u64 = 1 << 0;
    /// Bit 2, INT.
    pub const INT: u64 = 1 << 2;
    /// Bit 4, STOP.
    pub const STOP: u64 = 1 << 4;
    /// Bits 9:6, Size.
    pub const SIZE_MASK: u64 = 0xF << 6;
    /// Shift of the Size field.
    pub const SIZE_SHIFT: u32 = 6;
    /// Reserved bits below the address field: 1, 3, 5, 11:10.
    pub const RESERVED_LOW: u64 = (1 << 1) | (1 << 3) | (1 << 5) | (0b11 << 10);
    /// Bits 63:12, the address field before the MAXPHYADDR limit.
    pub const ADDR_MASK: u64 = !0xFFF;

    /// An output entry for the region at `base` (bits 11:0 of `base` are not representable
    /// and are discarded, as the field starts at bit 12).
    pub fn output(base: u64, size: RegionSize, flags: EntryFlags) -> TopaEntry {
        let mut raw = (base & Self::ADDR_MASK) | (u64::from(size.encoding()) << Self::SIZE_SHIFT);
        if flags.int {
            raw |= Self::INT;
        }
        if flags.stop {
            raw |= Self::STOP;
        }
        TopaEntry(raw)
    }

    /// An END entry pointing to the table at `next_table` (bits 11:0 discarded).
    pub fn end(next_table: u64) -> TopaEntry {
        TopaEntry((next_table & Self::ADDR_MASK) | Self::END)
    }

    /// Decodes a raw entry.
    pub fn from_raw(raw: u64) -> TopaEntry {
        TopaEntry(raw)
    }

    /// The raw 64-bit value.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// END: the address is a table base.
    pub fn is_end(self) -> bool {
        self.0 & Self::END != 0
    }

    /// INT attribute.
    pub fn is_int(self) -> bool {
        self.0 & Self::INT != 0
    }

    /// STOP attribute.
    pub fn is_stop(self) -> bool {
        self.0 & Self::STOP != 0
    }

    /// INT and STOP.
    pub fn flags(self) -> EntryFlags {
        EntryFlags {
            int: self.is_int(),
            stop: self.is_stop(),
        }
    }

    /// The Size field (meaningless if END).
    pub fn size(self) -> RegionSize {
        RegionSize(((self.0 & Self::SIZE_MASK) >> Self::SIZE_SHIFT) as u8)
    }

    /// The address field, bits 63:12 (including any bits above MAXPHYADDR).
    pub fn base(self) -> u64 {
        self.0 & Self::ADDR_MASK
    }

    /// Set reserved bits among 1, 3, 5, 11:10.
    pub fn reserved_low_bits(self) -> u64 {
        self.0 & Self::RESERVED_LOW
    }

    /// Set address bits at or above MAXPHYADDR.
    pub fn bits_beyond(self, caps: &Capabilities) -> u64 {
        self.0 & Self::ADDR_MASK & !caps.phys_addr_mask()
    }
}

/// Identifies a table inside a [`TopaBuilder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableId(pub usize);

/// Which regions of [`Topa::circular`] / [`Topa::one_shot`] get INT = 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntOn {
    /// No region.
    None,
    /// Every region.
    Every,
    /// The last region only.
    Last,
    /// The regions with these indices.
    Regions(Vec<usize>),
}

impl IntOn {
    fn applies(&self, i: usize, n: usize) -> bool {
        match self {
            IntOn::None => false,
            IntOn::Every => true,
            IntOn::Last => i + 1 == n,
            IntOn::Regions(v) => v.contains(&i),
        }
    }
}

/// The three processor pointers (SDM §33.2.7.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopaPointers {
    /// proc_trace_table_base: physical base of the current table.
    pub table_base: u64,
    /// proc_trace_table_offset / 8: index of the current entry.
    pub table_index: u64,
    /// proc_trace_output_offset: offset of the next byte inside the current region.
    pub output_offset: u64,
}

/// A ToPA PMI (the interrupt stand-in): which INT region filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pmi {
    /// Base of the table holding the INT entry.
    pub table_base: u64,
    /// Index of the INT entry.
    pub entry_index: u64,
    /// Physical base of the region.
    pub region_base: u64,
    /// Size of the region.
    pub region_size: u64,
    /// Stream offset of the next byte after the ones stored when the PMI was raised (for a
    /// regular PMI: the end of the filled region in the stream).
    pub stream_offset: u64,
    /// Stream offset when the PMI was delivered to the handler: `stream_offset` plus the skid
    /// (see [`Topa::set_pmi_skid`]), or earlier if output ended first.
    pub delivered_at: u64,
    /// Raised before the region filled: single-output-region implementations signal the PMI
    /// ahead of the wrap (see [`Capabilities::single_entry_pmi_margin`]).
    pub early: bool,
    /// The same entry had STOP = 1 and output has stopped (STOP happens before INT).
    pub stopped: bool,
}

/// The PMI callback. It runs on the writer's thread inside [`TraceSink::write`].
pub type PmiHandler = Box<dyn FnMut(&Pmi) + Send>;

/// The largest entry index: proc_trace_table_offset = 0FFFFFF8H. When the region of that entry
/// fills (no END, no STOP), the offsets wrap to the start of the current table.
pub const MAX_TABLE_INDEX: u64 = 0x0FFF_FFF8 / 8;

/// The output region the processor is filling (a cached copy of the current entry; the SDM
/// allows the processor to cache entries, so modifying a table while tracing is unpredictable).
#[derive(Debug, Clone, Copy)]
struct Current {
    base: u64,
    size: u64,
    flags: EntryFlags,
    loc: Location,
    /// Offset inside the region of the first restricted byte.
    restricted_at: Option<u64>,
    early_pmi_done: bool,
}

/// The ToPA output scheme: processor, modelled memory and reader bookkeeping.
pub struct Topa {
    caps: Capabilities,
    mem: Memory,
    /// IA32_RTIT_OUTPUT_BASE as last written by software.
    msr_base: u64,
    /// IA32_RTIT_OUTPUT_MASK_PTRS as last written by software.
    msr_mask_ptrs: u64,
    ptrs: TopaPointers,
    cur: Option<Current>,
    trace_en: bool,
    status: RtitStatus,
    inject_psb_pmi_on_enable: bool,
    global_topa_pmi: bool,
    error: Option<OperationalError>,
    pmi_count: u64,
    on_pmi: Option<PmiHandler>,
    pmi_skid: u64,
    /// Raised but not yet delivered PMIs, oldest first.
    pending_pmis: VecDeque<Pmi>,
    /// Stream offset of the next byte offered to `write`.
    head: u64,
    log: StreamLog,
}

impl std::fmt::Debug for Topa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topa")
            .field("ptrs", &self.ptrs)
            .field("trace_en", &self.trace_en)
            .field("status", &self.status)
            .field("error", &self.error)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

impl Topa {
    /// Programs the output MSRs with IA32_RTIT_CTL.ToPA = 1 and sets TraceEn: the processor
    /// loads proc_trace_table_base from `output_base`, proc_trace_table_offset from
    /// `output_mask_ptrs\[31:7\]` and proc_trace_output_offset from `output_mask_ptrs\[63:32\]`,
    /// and reaches the current entry (which may raise an operational error: check
    /// [`Topa::error`]).
    pub fn new(
        caps: Capabilities,
        mem: Memory,
        output_base: u64,
        output_mask_ptrs: u64,
    ) -> Result<Topa, MsrFault> {
        if !caps.topa_output {
            return Err(MsrFault::Unsupported);
        }
        let mut t = Topa {
            caps,
            mem,
            msr_base: 0,
            msr_mask_ptrs: 0x7F,
            ptrs: TopaPointers {
                table_base: 0,
                table_index: 0,
                output_offset: 0,
            },
            cur: None,
            trace_en: false,
            status: RtitStatus::default(),
            inject_psb_pmi_on_enable: false,
            global_topa_pmi: false,
            error: None,
            pmi_count: 0,
            on_pmi: None,
            pmi_skid: 0,
            pending_pmis: VecDeque::new(),
            head: 0,
            log: StreamLog::default(),
        };
        t.write_output_msrs(output_base, output_mask_ptrs)?;
        t.enable();
        Ok(t)
    }

    /// Builds a circular buffer: one table (or a chain of 4 KiB tables when more than 511
    /// regions are given) holding one output entry per size in `region_sizes`, followed by an
    /// END entry pointing back to the first table (the Linux driver links its tables the same
    /// way, the last table's END entry pointing to the first). With MENTRY = 0 exactly one
    /// region is allowed.
    pub fn circular(
        caps: Capabilities,
        region_sizes: &[u64],
        int_on: IntOn,
    ) -> Result<Topa, BuildError> {
        Self::linear(caps, region_sizes, int_on, false)
    }

    /// Like [`Topa::circular`] but the last region has STOP = 1, so output ends (ToPA stop)
    /// instead of wrapping when the buffer is full.
    pub fn one_shot(
        caps: Capabilities,
        region_sizes: &[u64],
        int_on: IntOn,
    ) -> Result<Topa, BuildError> {
        Self::linear(caps, region_sizes, int_on, true)
    }

    fn linear(
        caps: Capabilities,
        region_sizes: &[u64],
        int_on: IntOn,
        stop_last: bool,
    ) -> Result<Topa, BuildError> {
        let n = region_sizes.len();
        if n == 0 {
            return Err(BuildError::Layout("no regions"));
        }
        if !caps.topa_multiple_entries && n > 1 {
            return Err(BuildError::MultipleEntriesUnsupported);
        }
        // 511 output entries + 1 END entry fill one 4 KiB table.
        const PER_TABLE: usize = 511;
        let mut b = TopaBuilder::new(caps);
        let tables: Vec<TableId> = (0..n.div_ceil(PER_TABLE)).map(|_| b.table()).collect();
        for (i, &size) in region_sizes.iter().enumerate() {
            let flags = EntryFlags {
                int: int_on.applies(i, n),
                stop: stop_last && i + 1 == n,
            };
            b.region(tables[i / PER_TABLE], size, flags)?;
        }
        for (k, &t) in tables.iter().enumerate() {
            b.end(t, tables[(k + 1) % tables.len()])?;
        }
        b.build()
    }

    /// Installs the PMI callback, called once per raised ToPA PMI, in order.
    pub fn set_pmi_handler(&mut self, handler: PmiHandler) {
        self.on_pmi = Some(handler);
    }

    /// IA32_RTIT_CTL.InjectPsbPmiOnEnable (bit 56): with PMI preservation, a raised ToPA PMI
    /// also sets IA32_RTIT_STATUS.PendToPAPMI. Ignored without [`Capabilities::pmi_preservation`].
    pub fn set_inject_psb_pmi_on_enable(&mut self, on: bool) {
        self.inject_psb_pmi_on_enable = on && self.caps.pmi_preservation;
    }

    /// Clears TraceEn. The processor stores its pointers to the MSRs (they are exact only
    /// while TraceEn = 0, SDM §33.2.7.2).
    pub fn disable(&mut self) {
        if self.trace_en {
            self.trace_en = false;
            self.deliver_pmis();
            self.msr_base = self.ptrs.table_base;
            self.msr_mask_ptrs = mask_ptrs(self.ptrs.table_index, self.ptrs.output_offset);
        }
    }

    /// WRMSR IA32_RTIT_OUTPUT_BASE and IA32_RTIT_OUTPUT_MASK_PTRS. Only allowed while
    /// TraceEn = 0; OUTPUT_BASE bits 6:0 and bits at or above MAXPHYADDR are reserved (#GP).
    /// MASK_PTRS bits 6:0 are forced to 1. A table base misaligned within bits 11:7 is *not* a
    /// #GP but an operational error when tracing is enabled (ToPA errors 2a).
    pub fn write_output_msrs(&mut self, output_base: u64, mask_ptrs: u64) -> Result<(), MsrFault> {
        self.msr_mask_ptrs = self
            .caps
            .check_output_msrs(self.trace_en, output_base, mask_ptrs)?;
        self.msr_base = output_base;
        Ok(())
    }

    /// WRMSR IA32_RTIT_STATUS (while TraceEn = 0), e.g. to clear Stopped or Error before
    /// re-enabling. Only the bits this model tracks (Error, Stopped, PendToPAPMI) are kept.
    pub fn write_status(&mut self, status: u64) -> Result<(), MsrFault> {
        if self.trace_en {
            return Err(MsrFault::TraceEnabled);
        }
        self.status = RtitStatus(
            status & (RtitStatus::ERROR | RtitStatus::STOPPED | RtitStatus::PEND_TOPA_PMI),
        );
        if !self.status.error() {
            self.error = None;
        }
        Ok(())
    }

    /// Sets TraceEn (0 → 1): loads the processor pointers from the output MSRs and reaches
    /// the current entry. An error found there is an operational error; nothing is stored.
    pub fn enable(&mut self) {
        if self.trace_en {
            return;
        }
        self.trace_en = true;
        self.ptrs = TopaPointers {
            table_base: self.msr_base,
            table_index: (self.msr_mask_ptrs & 0xFFFF_FFFF) >> 7,
            output_offset: self.msr_mask_ptrs >> 32,
        };
        self.cur = None;
        if self.status.error() || self.status.stopped() {
            return;
        }
        if self.ptrs.table_base & 0xFFF != 0 {
            let site = self.site(None);
            self.raise(
                ErrorKind::TableMisaligned {
                    table_base: self.ptrs.table_base,
                },
                site,
            );
            return;
        }
        self.reach();
    }

    fn site(&self, raw: Option<u64>) -> ErrorSite {
        ErrorSite::TopaEntry {
            table_base: self.ptrs.table_base,
            index: self.ptrs.table_index,
            raw,
        }
    }

    fn raise(&mut self, kind: ErrorKind, site: ErrorSite) {
        self.status.0 |= RtitStatus::ERROR;
        self.cur = None;
        self.error = Some(OperationalError {
            kind,
            site,
            stream_offset: self.head,
        });
    }

    /// The processor reaches the entry at proc_trace_table_base + proc_trace_table_offset
    /// (after enabling, or after the previous region filled). Follows at most one END entry:
    /// its target's entry 0 cannot be an END entry (ToPA errors 4b), so the walk is bounded.
    fn reach(&mut self) {
        for _ in 0..2 {
            let addr = self.ptrs.table_base + 8 * self.ptrs.table_index;
            if self.mem.first_restricted(addr, 8).is_some() {
                self.raise(ErrorKind::RestrictedTable { addr }, self.site(None));
                return;
            }
            let Some(raw) = self.mem.read_u64(addr) else {
                self.raise(ErrorKind::Unbacked { addr, len: 8 }, self.site(None));
                return;
            };
            let e = TopaEntry(raw);
            let site = self.site(Some(raw));
            let rsvd = e.reserved_low_bits();
            if rsvd != 0 {
                return self.raise(ErrorKind::ReservedBits { bits: rsvd }, site);
            }
            let beyond = e.bits_beyond(&self.caps);
            if beyond != 0 {
                return self.raise(ErrorKind::BeyondMaxPhysAddr { bits: beyond }, site);
            }
            if e.is_end() {
                if e.is_int() || e.is_stop() {
                    return self.raise(ErrorKind::EndWithIntOrStop, site);
                }
                if self.ptrs.table_index == 0 {
                    return self.raise(ErrorKind::EndInEntry0, site);
                }
                if !self.caps.topa_multiple_entries && e.base() != self.ptrs.table_base {
                    return self.raise(ErrorKind::SingleEntryEndNotSelf { target: e.base() }, site);
                }
                // END: proc_trace_table_base := entry address; offsets reset to 0.
                self.ptrs.table_base = e.base();
                self.ptrs.table_index = 0;
                self.ptrs.output_offset = 0;
                continue;
            }
            if !self.caps.topa_multiple_entries && self.ptrs.table_index != 0 {
                return self.raise(ErrorKind::SingleEntryNoEnd, site);
            }
            let size = e.size().bytes();
            let base = e.base();
            if base & (size - 1) != 0 {
                return self.raise(
                    ErrorKind::RegionMisaligned {
                        region_base: base,
                        region_size: size,
                    },
                    site,
                );
            }
            if self.ptrs.output_offset >= size {
                return self.raise(
                    ErrorKind::OutputOffsetTooLarge {
                        output_offset: self.ptrs.output_offset,
                        region_size: size,
                    },
                    site,
                );
            }
            let Some(loc) = self.mem.locate(base, size) else {
                return self.raise(
                    ErrorKind::Unbacked {
                        addr: base,
                        len: size,
                    },
                    site,
                );
            };
            let restricted_at = self.mem.first_restricted(base, size).map(|a| a - base);
            self.cur = Some(Current {
                base,
                size,
                flags: e.flags(),
                loc,
                restricted_at,
                early_pmi_done: false,
            });
            self.log.enter_region(base, base + size);
            return;
        }
        // Unreachable: the second iteration is at index 0, where END is an error.
        self.raise(ErrorKind::EndInEntry0, self.site(None));
    }

    /// The INT region filled (or, single-entry, nearly filled): Trace_ToPA_PMI (and with PMI
    /// preservation PendToPAPMI) is set now; the interrupt is delivered after the skid.
    fn raise_pmi(&mut self, cur: &Current, early: bool) {
        self.global_topa_pmi = true;
        if self.inject_psb_pmi_on_enable {
            self.status.0 |= RtitStatus::PEND_TOPA_PMI;
        }
        self.pmi_count += 1;
        self.pending_pmis.push_back(Pmi {
            table_base: self.ptrs.table_base,
            entry_index: self.ptrs.table_index,
            region_base: cur.base,
            region_size: cur.size,
            stream_offset: self.head,
            delivered_at: self.head,
            early,
            stopped: self.status.stopped(),
        });
    }

    /// Delivers the PMIs whose skid has elapsed, or all of them once output is no longer
    /// proceeding (nothing more will be written that could delay them). Returns how many.
    fn deliver_pmis(&mut self) -> u32 {
        let force = !self.trace_en || self.cur.is_none();
        let mut n = 0;
        while let Some(p) = self.pending_pmis.front() {
            if !force && self.head < p.stream_offset + self.pmi_skid {
                break;
            }
            let Some(mut p) = self.pending_pmis.pop_front() else {
                break;
            };
            p.delivered_at = self.head;
            n += 1;
            if let Some(h) = self.on_pmi.as_mut() {
                h(&p);
            }
        }
        n
    }

    /// Models PMI skid: "this interrupt is not precise, and it is thus likely that writes to
    /// the next region will occur by the time the interrupt is taken" (SDM "ToPA PMI"). A PMI
    /// is delivered to the handler once `bytes` more bytes were stored after it was raised
    /// (default 0: delivered at the exact fill point), or when output stops, fails or is
    /// disabled.
    pub fn set_pmi_skid(&mut self, bytes: u64) {
        self.pmi_skid = bytes;
    }

    /// The current region is full (proc_trace_output_offset reached its size).
    fn region_filled(&mut self, cur: Current) {
        if cur.flags.stop {
            // ToPA STOP: Stopped is set, pointers stay on the STOP entry with OutputOffset =
            // region size ("pointing to the next byte after the end of the region").
            self.status.0 |= RtitStatus::STOPPED;
            self.cur = None;
        }
        // STOP happens before INT (Table 33-3), so the handler sees Stopped already set.
        if cur.flags.int && !cur.early_pmi_done {
            self.raise_pmi(&cur, false);
        }
        if cur.flags.stop {
            return;
        }
        self.ptrs.output_offset = 0;
        self.ptrs.table_index = if self.ptrs.table_index >= MAX_TABLE_INDEX {
            0
        } else {
            self.ptrs.table_index + 1
        };
        self.reach();
    }

    /// The processor pointers (read-only; exact at any time in the model, whereas hardware
    /// only guarantees the MSRs while TraceEn = 0).
    pub fn pointers(&self) -> TopaPointers {
        self.ptrs
    }

    /// IA32_RTIT_OUTPUT_BASE: proc_trace_table_base.
    pub fn output_base(&self) -> u64 {
        if self.trace_en {
            self.ptrs.table_base
        } else {
            self.msr_base
        }
    }

    /// IA32_RTIT_OUTPUT_MASK_PTRS: bits 6:0 = 7FH, MaskOrTableOffset (bits 31:7) = entry index
    /// (proc_trace_table_offset\[27:3\]), OutputOffset (bits 63:32).
    pub fn output_mask_ptrs(&self) -> u64 {
        if self.trace_en {
            mask_ptrs(self.ptrs.table_index, self.ptrs.output_offset)
        } else {
            self.msr_mask_ptrs
        }
    }

    /// IA32_RTIT_STATUS.
    pub fn status(&self) -> RtitStatus {
        self.status
    }

    /// IA32_PERF_GLOBAL_STATUS.Trace_ToPA_PMI (bit 55): a ToPA PMI is pending.
    pub fn topa_pmi_pending(&self) -> bool {
        self.global_topa_pmi
    }

    /// Writes 1 to bit 55 of IA32_PERF_GLOBAL_STATUS_RESET (MSR 390H), clearing
    /// Trace_ToPA_PMI.
    pub fn clear_topa_pmi(&mut self) {
        self.global_topa_pmi = false;
    }

    /// ToPA PMIs raised so far (delivered or not).
    pub fn pmi_count(&self) -> u64 {
        self.pmi_count
    }

    /// The operational error that disabled output, if any.
    pub fn error(&self) -> Option<&OperationalError> {
        self.error.as_ref()
    }

    /// TraceEn.
    pub fn trace_en(&self) -> bool {
        self.trace_en
    }

    /// The modelled physical memory (tables and regions).
    pub fn memory(&self) -> &Memory {
        &self.mem
    }

    /// Mutable memory, e.g. to rewrite table entries while TraceEn = 0 (SDM: modify tables only
    /// with TraceEn = 0; the model caches the current entry like a processor may).
    pub fn memory_mut(&mut self) -> &mut Memory {
        &mut self.mem
    }

    /// Stream offset of the next byte offered to [`TraceSink::write`].
    pub fn stream_offset(&self) -> u64 {
        self.head
    }

    /// Undrained bytes still present in memory (what a drain would return now).
    pub fn present(&self) -> u64 {
        self.log.present()
    }

    /// Bytes overwritten before being drained, since creation.
    pub fn overwritten_total(&self) -> u64 {
        self.log.overwritten_total()
    }

    /// Bytes dropped (never stored), since creation.
    pub fn dropped_total(&self) -> u64 {
        self.log.dropped_total()
    }

    fn drop_rest(&mut self, n: usize) {
        self.log.drop_bytes(n as u64);
        self.head += n as u64;
    }
}

fn mask_ptrs(index: u64, output_offset: u64) -> u64 {
    0x7F | ((index & 0x01FF_FFFF) << 7) | (output_offset << 32)
}

impl TraceSink for Topa {
    /// Stores `bytes` at the current output position, crossing region and table boundaries
    /// (packets may straddle regions, SDM §33.2.7.2). A ToPA STOP or an operational error
    /// mid-write ends output there; the rest of the write is dropped and counted.
    fn write(&mut self, bytes: &[u8]) -> WriteOutcome {
        let mut rest = bytes;
        let mut stored = 0;
        let mut pmis = 0;
        while !rest.is_empty() {
            let Some(mut cur) = self.cur.filter(|_| self.trace_en) else {
                break;
            };
            let off = self.ptrs.output_offset;
            let mut n = (cur.size - off).min(rest.len() as u64);
            let margin = self.caps.single_entry_pmi_margin;
            let early_pmi =
                !self.caps.topa_multiple_entries && cur.flags.int && !cur.early_pmi_done;
            if early_pmi && cur.size - off > margin {
                n = n.min(cur.size - off - margin);
            }
            if let Some(r) = cur.restricted_at {
                if off <= r && off + n > r {
                    n = r - off;
                }
            }
            let (now, later) = rest.split_at(n as usize);
            if n > 0 {
                let loc = Location {
                    block: cur.loc.block,
                    offset: cur.loc.offset + off as usize,
                };
                self.mem.write_at(loc, now);
                self.log.record(self.head, cur.base + off, n);
                self.head += n;
                self.ptrs.output_offset += n;
                stored += n as usize;
                rest = later;
            }
            let off = self.ptrs.output_offset;
            if cur.restricted_at == Some(off) {
                // Table 33-5: the output pointer reached restricted memory.
                let site = self.site(
                    self.mem
                        .read_u64(self.ptrs.table_base + 8 * self.ptrs.table_index),
                );
                self.raise(
                    ErrorKind::RestrictedOutput {
                        addr: cur.base + off,
                    },
                    site,
                );
                break;
            }
            if early_pmi && cur.size - off <= margin {
                cur.early_pmi_done = true;
                self.cur = Some(cur);
                self.raise_pmi(&cur, true);
            }
            if off == cur.size {
                self.region_filled(cur);
            }
            if !self.pending_pmis.is_empty() {
                pmis += self.deliver_pmis();
            }
        }
        if !self.pending_pmis.is_empty() {
            pmis += self.deliver_pmis();
        }
        let dropped = rest.len();
        if dropped > 0 {
            self.drop_rest(dropped);
        }
        WriteOutcome {
            stored,
            dropped,
            pmis,
            state: self.state(),
        }
    }
}

impl TraceSource for Topa {
    fn drain_with(&mut self, f: &mut dyn FnMut(Chunk<'_>)) -> DrainReport {
        let state = self.state();
        self.log.drain(&self.mem, self.head, state, f)
    }

    fn pending(&self) -> u64 {
        self.log.pending(self.head)
    }

    /// Total size of the output regions reachable from the current table by following END
    /// entries (at most 4096 tables are walked).
    fn capacity(&self) -> u64 {
        let mut total = 0;
        let mut seen = Vec::new();
        let mut table = self.ptrs.table_base & !0xFFF;
        'tables: while !seen.contains(&table) && seen.len() < 4096 {
            seen.push(table);
            for i in 0..=MAX_TABLE_INDEX {
                let Some(raw) = self.mem.read_u64(table + 8 * i) else {
                    break 'tables;
                };
                let e = TopaEntry(raw);
                if e.is_end() {
                    table = e.base();
                    continue 'tables;
                }
                total += e.size().bytes();
                if e.is_stop() {
                    break 'tables;
                }
            }
            break;
        }
        total
    }

    fn state(&self) -> OutputState {
        self.status.output_state(self.trace_en)
    }
}

#[derive(Debug, Clone)]
enum Spec {
    Region { size: RegionSize, flags: EntryFlags },
    End { next: usize },
    Raw(u64),
}

/// Lays out ToPA tables and regions in a fresh [`Memory`] and enables tracing at entry 0 of
/// the first table.
#[derive(Debug, Clone)]
pub struct TopaBuilder {
    caps: Capabilities,
    tables: Vec<Vec<Spec>>,
}

impl TopaBuilder {
    /// An empty layout.
    pub fn new(caps: Capabilities) -> Self {
        TopaBuilder {
            caps,
            tables: Vec::new(),
        }
    }

    /// Adds an empty table.
    pub fn table(&mut self) -> TableId {
        self.tables.push(Vec::new());
        TableId(self.tables.len() - 1)
    }

    fn push(&mut self, table: TableId, spec: Spec) -> Result<&mut Self, BuildError> {
        self.tables
            .get_mut(table.0)
            .ok_or(BuildError::Layout("no such table"))?
            .push(spec);
        Ok(self)
    }

    /// Appends an output entry with a freshly allocated region of `size` bytes.
    pub fn region(
        &mut self,
        table: TableId,
        size: u64,
        flags: EntryFlags,
    ) -> Result<&mut Self, BuildError> {
        let size = RegionSize::from_bytes(size).ok_or(BuildError::BadRegionSize(size))?;
        self.push(table, Spec::Region { size, flags })
    }

    /// Appends an END entry pointing to table `next`.
    pub fn end(&mut self, table: TableId, next: TableId) -> Result<&mut Self, BuildError> {
        if next.0 >= self.tables.len() {
            return Err(BuildError::Layout("no such table"));
        }
        self.push(table, Spec::End { next: next.0 })
    }

    /// Appends a raw entry, written verbatim (for invalid layouts).
    pub fn raw(&mut self, table: TableId, raw: u64) -> Result<&mut Self, BuildError> {
        self.push(table, Spec::Raw(raw))
    }

    /// Allocates tables (4 KiB aligned) and regions (aligned to their size), writes the
    /// entries, and enables tracing with OUTPUT_BASE = first table, offsets 0.
    pub fn build(self) -> Result<Topa, BuildError> {
        if self.tables.is_empty() {
            return Err(BuildError::Layout("no tables"));
        }
        let mut mem = Memory::new();
        let bases = self
            .tables
            .iter()
            .map(|t| mem.alloc((t.len().max(1) as u64 * 8).next_multiple_of(4096), 4096))
            .collect::<Result<Vec<u64>, _>>()?;
        for (t, specs) in self.tables.iter().enumerate() {
            for (i, spec) in specs.iter().enumerate() {
                let raw = match *spec {
                    Spec::Region { size, flags } => {
                        let base = mem.alloc(size.bytes(), size.bytes())?;
                        TopaEntry::output(base, size, flags).raw()
                    }
                    Spec::End { next } => TopaEntry::end(bases[next]).raw(),
                    Spec::Raw(raw) => raw,
                };
                mem.write_u64(bases[t] + 8 * i as u64, raw)?;
            }
        }
        Ok(Topa::new(self.caps, mem, bases[0], 0x7F)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_ptrs_layout_matches_the_kernel_encoding() {
        // Linux pt_config_buffer(): 0x7f | (cur_idx << 7) | (output_off << 32).
        assert_eq!(mask_ptrs(3, 0x123), 0x7F | (3 << 7) | (0x123 << 32));
        assert_eq!(mask_ptrs(MAX_TABLE_INDEX, 0), 0xFFFF_FFFF);
    }

    #[test]
    fn entry_flags_and_reserved_bits() {
        let caps = Capabilities {
            max_phys_addr: 39,
            ..Capabilities::default()
        };
        let e = TopaEntry::from_raw((1 << 39) | (1 << 12) | TopaEntry::STOP | (1 << 3));
        assert_eq!(e.flags(), EntryFlags::STOP);
        assert_eq!(e.reserved_low_bits(), 1 << 3);
        assert_eq!(e.bits_beyond(&caps), 1 << 39);
        assert_eq!(TopaEntry::end(0x1234_5678).base(), 0x1234_5000);
    }
}
