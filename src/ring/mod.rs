//! Trace output rings: the SDM's ToPA and single-range output schemes as a software model, and the
//! perf AUX area, each with a writer side and a reader (drainer) side.
//!
//! References are to the Intel SDM Vol. 3C chapter "Intel Processor Trace" (§33.2.7 "Trace
//! Output" in the numbering of the excerpts in `shared/seeds`, §36.2.x in older editions) and to
//! the Linux driver `arch/x86/events/intel/pt.c`.
//!
//! * [`Topa`] — Table of Physical Addresses output (SDM §33.2.7.2): linked tables of output
//!   regions in a modelled [`Memory`], with END / INT / STOP entries, the three processor
//!   pointers, ToPA stop, ToPA PMI and every ToPA operational error.
//! * [`SingleRange`] — single-range output (SDM §33.2.7.1): one circular power-of-two range.
//! * [`SharedRing`] — the recorder thread writes, the drainer thread waits and drains.
//! * [`aux`] — the consumer side of a real perf event's data ring and AUX area
//!   (`perf_event_mmap_page` head/tail protocol, `PERF_RECORD_AUX` flags, snapshot mode).
//!
//! Both schemes implement [`TraceSink`] (the "processor" appends packet bytes) and
//! [`TraceSource`] (the drainer reads back what was written, with exact loss accounting).
//!
//! ## Stream offsets and loss
//!
//! Every byte offered to [`TraceSink::write`] gets a *stream offset* (0, 1, 2, …), including bytes
//! that are never stored. A drain covers the stream offsets `start..end` of its
//! [`DrainReport`]; each covered byte is either returned (`present`), was overwritten in memory
//! before it was drained (`overwritten`: the writer lapped the reader in a circular buffer), or
//! was never stored (`dropped`: output had stopped or hit an operational error). So
//! `end - start == present + overwritten + dropped` always holds, and the [`Chunk`]s say exactly
//! where the returned bytes sit in the stream, so a consumer can resynchronise after a gap (as
//! perf does after an AUX record flagged TRUNCATED).

pub mod aux;
mod memory;
mod shared;
mod single_range;
mod stream;
mod topa;

pub use memory::{Memory, MemoryError};
pub use shared::{SharedRing, Wake};
pub use single_range::SingleRange;
pub use topa::{
    EntryFlags, IntOn, MAX_TABLE_INDEX, Pmi, PmiHandler, RegionSize, TableId, Topa, TopaBuilder,
    TopaEntry, TopaPointers,
};

/// IA32_RTIT_OUTPUT_BASE (SDM §33.2.8.7).
pub const MSR_IA32_RTIT_OUTPUT_BASE: u32 = 0x560;
/// IA32_RTIT_OUTPUT_MASK_PTRS (SDM §33.2.8.8).
pub const MSR_IA32_RTIT_OUTPUT_MASK_PTRS: u32 = 0x561;
/// IA32_RTIT_CTL (SDM §33.2.8.2).
pub const MSR_IA32_RTIT_CTL: u32 = 0x570;
/// IA32_RTIT_STATUS (SDM §33.2.8.4).
pub const MSR_IA32_RTIT_STATUS: u32 = 0x571;
/// IA32_PERF_GLOBAL_STATUS bit 55, Trace_ToPA_PMI: set when a ToPA PMI is raised (SDM
/// §33.2.7.2 "ToPA PMI").
pub const PERF_GLOBAL_STATUS_TRACE_TOPA_PMI: u64 = 1 << 55;

/// The Intel PT output capabilities a model implements (CPUID leaf 14H sub-leaf 0 and
/// CPUID.80000008H:EAX\[7:0\]); the Linux names are the `/sys/.../intel_pt/caps/*` files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// CPUID.14H.0:ECX\[0\] TOPAOUT (`topa_output`): ToPA output is supported.
    pub topa_output: bool,
    /// CPUID.14H.0:ECX\[1\] MENTRY (`topa_multiple_entries`): ToPA tables may hold many output
    /// entries. When clear, the "single output region ToPA implementation" rules apply (SDM
    /// §33.2.7.2): exactly one output entry followed by an END entry pointing back to the table.
    pub topa_multiple_entries: bool,
    /// CPUID.14H.0:ECX\[2\] (`single_range_output`): single-range output is supported.
    pub single_range_output: bool,
    /// CPUID.14H.0:ECX\[3\] (`output_subsys`): output to the trace transport subsystem
    /// (FabricEn, SDM §33.2.7.3). Not modelled beyond the flag.
    pub output_subsys: bool,
    /// CPUID.14H.0:EBX\[6\]: PMI preservation (IA32_RTIT_CTL.InjectPsbPmiOnEnable and
    /// IA32_RTIT_STATUS.PendToPAPMI).
    pub pmi_preservation: bool,
    /// MAXPHYADDR, CPUID.80000008H:EAX\[7:0\]: bits at and above it are reserved in ToPA entries
    /// and in IA32_RTIT_OUTPUT_BASE.
    pub max_phys_addr: u8,
    /// On single-output-region implementations the processor "will attempt to signal a ToPA PMI
    /// interrupt before the output wraps" (SDM §33.2.7.2). How early is not architectural; the
    /// model raises the PMI when at most this many bytes of the INT region remain, the margin
    /// the Linux driver assumes (`TOPA_PMI_MARGIN`, 512).
    pub single_entry_pmi_margin: u64,
}

impl Default for Capabilities {
    /// A current multi-entry implementation: ToPA with many entries, single range, MAXPHYADDR 46.
    fn default() -> Self {
        Capabilities {
            topa_output: true,
            topa_multiple_entries: true,
            single_range_output: true,
            output_subsys: false,
            pmi_preservation: false,
            max_phys_addr: 46,
            single_entry_pmi_margin: 512,
        }
    }
}

impl Capabilities {
    /// The first Intel PT generation (Broadwell): ToPA with a single output region only
    /// (MENTRY = 0, TOPAOUT = 1), no single range.
    pub fn single_entry_topa() -> Self {
        Capabilities {
            topa_multiple_entries: false,
            single_range_output: false,
            ..Self::default()
        }
    }

    /// Decodes CPUID.(EAX=14H,ECX=0):EBX/ECX and MAXPHYADDR.
    pub fn from_cpuid(ebx: u32, ecx: u32, max_phys_addr: u8) -> Self {
        Capabilities {
            topa_output: ecx & 1 != 0,
            topa_multiple_entries: ecx & (1 << 1) != 0,
            single_range_output: ecx & (1 << 2) != 0,
            output_subsys: ecx & (1 << 3) != 0,
            pmi_preservation: ebx & (1 << 6) != 0,
            max_phys_addr,
            single_entry_pmi_margin: 512,
        }
    }

    /// Mask of the physical-address bits the processor supports (bits MAXPHYADDR-1:0).
    pub fn phys_addr_mask(&self) -> u64 {
        match self.max_phys_addr {
            0 => 0,
            n if n >= 64 => u64::MAX,
            n => (1u64 << n) - 1,
        }
    }

    /// The #GP checks of WRMSR IA32_RTIT_OUTPUT_BASE / IA32_RTIT_OUTPUT_MASK_PTRS, the same
    /// for both output schemes: only while TraceEn = 0, and OUTPUT_BASE bits 6:0 and bits at or
    /// above MAXPHYADDR are reserved. Returns the MASK_PTRS value stored (bits 6:0 forced to 1).
    pub(crate) fn check_output_msrs(
        &self,
        trace_en: bool,
        output_base: u64,
        mask_ptrs: u64,
    ) -> Result<u64, MsrFault> {
        if trace_en {
            return Err(MsrFault::TraceEnabled);
        }
        if output_base & (0x7F | !self.phys_addr_mask()) != 0 {
            return Err(MsrFault::OutputBaseReserved(output_base));
        }
        Ok(mask_ptrs | 0x7F)
    }
}

/// IA32_RTIT_STATUS (MSR 571H) bits the output schemes touch (SDM §33.2.8.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RtitStatus(pub u64);

impl RtitStatus {
    /// Bit 4, Error: an operational error disabled packet generation (SDM §33.3.10).
    pub const ERROR: u64 = 1 << 4;
    /// Bit 5, Stopped: a ToPA STOP region filled (or TraceStop), TriggerEn is clear.
    pub const STOPPED: u64 = 1 << 5;
    /// Bit 7, PendToPAPMI: a ToPA PMI is pending (PMI preservation only).
    pub const PEND_TOPA_PMI: u64 = 1 << 7;

    /// Status.Error.
    pub fn error(self) -> bool {
        self.0 & Self::ERROR != 0
    }
    /// Status.Stopped.
    pub fn stopped(self) -> bool {
        self.0 & Self::STOPPED != 0
    }
    /// Status.PendToPAPMI.
    pub fn pend_topa_pmi(self) -> bool {
        self.0 & Self::PEND_TOPA_PMI != 0
    }

    /// Whether output proceeds, given this status and TraceEn: an error or a stop wins over
    /// TraceEn (both keep TraceEn set but end output).
    pub fn output_state(self, trace_en: bool) -> OutputState {
        if self.error() {
            OutputState::Error
        } else if self.stopped() {
            OutputState::Stopped
        } else if !trace_en {
            OutputState::Disabled
        } else {
            OutputState::Tracing
        }
    }
}

/// Whether the modelled processor is producing output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputState {
    /// TraceEn = 1 and output proceeds.
    Tracing,
    /// TraceEn = 0: software disabled tracing; nothing is generated.
    Disabled,
    /// Status.Stopped: a ToPA STOP region filled; output ceased (SDM "ToPA STOP").
    Stopped,
    /// Status.Error: an operational error disabled packet generation.
    Error,
}

/// What one [`TraceSink::write`] did with the offered bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Bytes stored in the output memory.
    pub stored: usize,
    /// Bytes not stored because output stopped, hit an operational error or was disabled. They
    /// are counted in [`DrainReport::dropped`] too.
    pub dropped: usize,
    /// ToPA PMIs delivered to the handler during this write (one per filled INT region, once
    /// its skid has elapsed; see `Topa::set_pmi_skid`).
    pub pmis: u32,
    /// State after the write.
    pub state: OutputState,
}

/// The writer side: the modelled processor storing trace bytes.
pub trait TraceSink {
    /// Appends `bytes` to the trace output (one packet, several packets or part of one: the
    /// output schemes do not look at packet boundaries, SDM §33.2.7.2 "unified buffer").
    fn write(&mut self, bytes: &[u8]) -> WriteOutcome;
}

/// A run of drained bytes and where it sits in the writer's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// Stream offset of `bytes\[0\]`.
    pub stream_offset: u64,
    /// The bytes, borrowed from the output memory.
    pub bytes: &'a [u8],
}

/// What a drain covered. `end - start == present + overwritten + dropped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainReport {
    /// Stream offset the drain started at (the previous drain's `end`).
    pub start: u64,
    /// Stream offset after the last byte offered to the writer so far.
    pub end: u64,
    /// Bytes returned.
    pub present: u64,
    /// Bytes written and then overwritten (the writer lapped the reader) before this drain.
    pub overwritten: u64,
    /// Bytes offered to the writer but never stored (stopped, error, disabled).
    pub dropped: u64,
    /// Writer state at the time of the drain.
    pub state: OutputState,
}

impl DrainReport {
    /// Bytes covered by the drain but not returned.
    pub fn lost(&self) -> u64 {
        self.overwritten + self.dropped
    }
}

/// A contiguous run inside [`Drain::data`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Stream offset of the run's first byte.
    pub stream_offset: u64,
    /// Offset of the run inside [`Drain::data`].
    pub data_offset: usize,
    /// Length of the run.
    pub len: usize,
}

/// An owned drain: the present bytes concatenated in stream order, with where each run sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    /// Present bytes, in stream order.
    pub data: Vec<u8>,
    /// Maximal stream-contiguous runs of `data`; a gap between runs is lost data.
    pub runs: Vec<Run>,
    /// Totals for the drain.
    pub report: DrainReport,
}

/// The reader side: the drainer taking bytes out of the output memory.
pub trait TraceSource {
    /// Passes every byte written since the previous drain and still present to `f`, in stream
    /// order, borrowed from the output memory, and reports what was lost.
    fn drain_with(&mut self, f: &mut dyn FnMut(Chunk<'_>)) -> DrainReport;

    /// Stream bytes (present or lost) a drain would cover now.
    fn pending(&self) -> u64;

    /// Bytes of output memory (the most a drain can return without loss).
    fn capacity(&self) -> u64;

    /// Writer state.
    fn state(&self) -> OutputState;

    /// Drains into an owned buffer.
    fn drain(&mut self) -> Drain {
        let mut data = Vec::new();
        let mut runs: Vec<Run> = Vec::new();
        let report = self.drain_with(&mut |c| {
            match runs.last_mut() {
                Some(r) if r.stream_offset + r.len as u64 == c.stream_offset => {
                    r.len += c.bytes.len();
                }
                _ => runs.push(Run {
                    stream_offset: c.stream_offset,
                    data_offset: data.len(),
                    len: c.bytes.len(),
                }),
            }
            data.extend_from_slice(c.bytes);
        });
        Drain { data, runs, report }
    }
}

/// Where an operational error was detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSite {
    /// The ToPA entry at `table_base + 8 * index` (the entry proc_trace_table_base /
    /// proc_trace_table_offset pointed at when the error was detected).
    TopaEntry {
        /// proc_trace_table_base.
        table_base: u64,
        /// proc_trace_table_offset / 8.
        index: u64,
        /// The raw entry, if it could be read.
        raw: Option<u64>,
    },
    /// The single output range.
    SingleRange {
        /// IA32_RTIT_OUTPUT_BASE.
        base: u64,
        /// IA32_RTIT_OUTPUT_MASK_PTRS\[31:0\].
        mask: u64,
    },
}

/// Why an operational error was raised (SDM §33.2.7.1 "Single-Range Output Errors",
/// §33.2.7.2 "ToPA Errors", §33.2.7.4 "Restricted Memory Access").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// ToPA errors 1: reserved bits 1, 3, 5 or 11:10 of the entry are set.
    ReservedBits {
        /// The offending bits.
        bits: u64,
    },
    /// ToPA errors 2a: the table base is not 4 KiB aligned (from IA32_RTIT_OUTPUT_BASE; an END
    /// entry's address field cannot express a misaligned base).
    TableMisaligned {
        /// The table base.
        table_base: u64,
    },
    /// ToPA errors 2b: an output region base is not aligned to the region size.
    RegionMisaligned {
        /// Region base from the entry.
        region_base: u64,
        /// Region size from the entry.
        region_size: u64,
    },
    /// ToPA errors 2c: the entry's address sets physical-address bits at or above MAXPHYADDR.
    BeyondMaxPhysAddr {
        /// The offending bits.
        bits: u64,
    },
    /// ToPA errors 3: OutputOffset ≥ the current region's size (e.g. re-enabling after a ToPA
    /// stop without moving the pointers, SDM "ToPA STOP").
    OutputOffsetTooLarge {
        /// IA32_RTIT_OUTPUT_MASK_PTRS.OutputOffset.
        output_offset: u64,
        /// Size of the current region.
        region_size: u64,
    },
    /// ToPA errors 4a / Table 33-3: END = 1 together with INT or STOP (the SDM treats it as a
    /// reserved-bit violation).
    EndWithIntOrStop,
    /// ToPA errors 4b: END set in entry 0 of a table.
    EndInEntry0,
    /// ToPA errors 4c-i (MENTRY = 0): table entry 1 has END = 0.
    SingleEntryNoEnd,
    /// ToPA errors 4c-ii (MENTRY = 0): the END entry does not point back to the table base.
    SingleEntryEndNotSelf {
        /// Where the END entry points.
        target: u64,
    },
    /// Table 33-5: the output pointer reached restricted (SMRR) memory.
    RestrictedOutput {
        /// First restricted address reached.
        addr: u64,
    },
    /// Table 33-5: the ToPA table pointer entered restricted (SMRR) memory.
    RestrictedTable {
        /// Address of the entry.
        addr: u64,
    },
    /// Single-range error: the mask has a 0 below its most significant 1.
    MaskNotContiguous {
        /// IA32_RTIT_OUTPUT_MASK_PTRS\[31:0\].
        mask: u64,
    },
    /// Single-range error: IA32_RTIT_OUTPUT_BASE & mask ≠ 0 (base not aligned to the range).
    BaseMaskOverlap {
        /// IA32_RTIT_OUTPUT_BASE.
        base: u64,
        /// IA32_RTIT_OUTPUT_MASK_PTRS\[31:0\].
        mask: u64,
    },
    /// Single-range error: OutputOffset > mask.
    OffsetBeyondMask {
        /// IA32_RTIT_OUTPUT_MASK_PTRS.OutputOffset.
        output_offset: u64,
        /// IA32_RTIT_OUTPUT_MASK_PTRS\[31:0\].
        mask: u64,
    },
    /// Model-only: the table entry or output range is not inside one block of the modelled
    /// [`Memory`] (real hardware would access whatever is there).
    Unbacked {
        /// First address of the access.
        addr: u64,
        /// Its length.
        len: u64,
    },
}

/// An operational error (SDM §33.3.10): IA32_RTIT_STATUS.Error is set and packet generation
/// stops; packets still buffered are lost (the model counts them as dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Intel PT operational error at {site:x?} (stream offset {stream_offset}): {kind:x?}")]
pub struct OperationalError {
    /// What was wrong.
    pub kind: ErrorKind,
    /// Which entry (or range) was wrong.
    pub site: ErrorSite,
    /// Stream offset of the first byte that was not stored because of the error.
    pub stream_offset: u64,
}

/// A WRMSR the model refuses, as the processor would with #GP(0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MsrFault {
    /// The output scheme is not enumerated in CPUID leaf 14H (IA32_RTIT_CTL.ToPA = 1 without
    /// TOPAOUT, or single range without `single_range_output`).
    #[error("#GP: output scheme not supported by the capabilities")]
    Unsupported,
    /// IA32_RTIT_OUTPUT_BASE with reserved bits set (bits 6:0, or bits at or above MAXPHYADDR;
    /// SDM §33.2.8.7).
    #[error("#GP: IA32_RTIT_OUTPUT_BASE {0:#x} sets reserved bits")]
    OutputBaseReserved(u64),
    /// Writes to the output MSRs while TraceEn = 1 (SDM §33.2.8.1).
    #[error("#GP: output MSRs written while TraceEn = 1")]
    TraceEnabled,
}

/// Why a convenience builder could not set up a ring.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A ToPA region size is not 4 KiB << n for n in 0..=15.
    #[error("{0} bytes is not a ToPA region size (4K << 0..=15)")]
    BadRegionSize(u64),
    /// A single-range size is not a power of two between 128 bytes and 4 GiB.
    #[error("{0} bytes is not a single-range size (power of two, 128 B ..= 4 GiB)")]
    BadRangeSize(u64),
    /// No regions were given, or a table index was out of range.
    #[error("invalid layout: {0}")]
    Layout(&'static str),
    /// The layout needs several output entries but MENTRY = 0.
    #[error("layout needs multiple ToPA output entries, but topa_multiple_entries = 0")]
    MultipleEntriesUnsupported,
    /// Memory allocation failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The MSR writes were refused.
    #[error(transparent)]
    Msr(#[from] MsrFault),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_from_cpuid_leaf_14h() {
        // ECX: TOPAOUT | single range; EBX: PMI preservation.
        let c = Capabilities::from_cpuid(1 << 6, 0b101, 39);
        assert!(c.topa_output && !c.topa_multiple_entries && c.single_range_output);
        assert!(!c.output_subsys && c.pmi_preservation);
        assert_eq!(c.phys_addr_mask(), (1 << 39) - 1);
    }
}
