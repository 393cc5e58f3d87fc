//! Single-range output, SDM §33.2.7.1, as a software model.
//!
//! With IA32_RTIT_CTL.ToPA = 0 and FabricEn = 0 the processor writes to one contiguous physical
//! range, circularly:
//!
//! ```text
//! OutputBase[63:0]   := IA32_RTIT_OUTPUT_BASE[63:0]
//! OutputMask[63:0]   := ZeroExtend64(IA32_RTIT_OUTPUT_MASK_PTRS[31:0])
//! OutputOffset[63:0] := ZeroExtend64(IA32_RTIT_OUTPUT_MASK_PTRS[63:32])
//! trace_store_phys_addr := (OutputBase & ~OutputMask) + (OutputOffset & OutputMask)
//! ```
//!
//! MASK_PTRS bits 6:0 are forced to 1 (SDM §33.2.8.8), so the smallest range is 128 bytes and
//! every range is a power of two up to 4 GiB.

use super::memory::{Location, Memory};
use super::stream::StreamLog;
use super::{
    BuildError, Capabilities, Chunk, DrainReport, ErrorKind, ErrorSite, MsrFault, OperationalError,
    OutputState, RtitStatus, TraceSink, TraceSource, WriteOutcome,
};

/// The single-range output scheme: processor, modelled memory and reader bookkeeping.
#[derive(Debug)]
pub struct SingleRange {
    caps: Capabilities,
    mem: Memory,
    msr_base: u64,
    msr_mask_ptrs: u64,
    /// OutputMask (MASK_PTRS\[31:0\]).
    mask: u64,
    /// OutputOffset, the write pointer inside the range.
    output_offset: u64,
    loc: Option<Location>,
    restricted_at: Option<u64>,
    trace_en: bool,
    status: RtitStatus,
    error: Option<OperationalError>,
    head: u64,
    log: StreamLog,
}

impl SingleRange {
    /// Programs the output MSRs with IA32_RTIT_CTL.ToPA = 0 and sets TraceEn (see
    /// [`SingleRange::enable`] for the errors checked then).
    pub fn new(
        caps: Capabilities,
        mem: Memory,
        output_base: u64,
        output_mask_ptrs: u64,
    ) -> Result<SingleRange, MsrFault> {
        if !caps.single_range_output {
            return Err(MsrFault::Unsupported);
        }
        let mut s = SingleRange {
            caps,
            mem,
            msr_base: 0,
            msr_mask_ptrs: 0x7F,
            mask: 0x7F,
            output_offset: 0,
            loc: None,
            restricted_at: None,
            trace_en: false,
            status: RtitStatus::default(),
            error: None,
            head: 0,
            log: StreamLog::default(),
        };
        s.write_output_msrs(output_base, output_mask_ptrs)?;
        s.enable();
        Ok(s)
    }

    /// Allocates a `size`-byte range (a power of two, 128 B ..= 4 GiB) aligned to its size in
    /// a fresh [`Memory`] and enables tracing at offset 0.
    pub fn with_size(caps: Capabilities, size: u64) -> Result<SingleRange, BuildError> {
        if !size.is_power_of_two() || !(128..=1 << 32).contains(&size) {
            return Err(BuildError::BadRangeSize(size));
        }
        let mut mem = Memory::new();
        let base = mem.alloc(size, size)?;
        Ok(SingleRange::new(caps, mem, base, size - 1)?)
    }

    /// WRMSR IA32_RTIT_OUTPUT_BASE and IA32_RTIT_OUTPUT_MASK_PTRS (TraceEn = 0 only).
    /// OUTPUT_BASE bits 6:0 and bits at or above MAXPHYADDR are reserved (#GP); MASK_PTRS
    /// bits 6:0 are forced to 1.
    pub fn write_output_msrs(&mut self, output_base: u64, mask_ptrs: u64) -> Result<(), MsrFault> {
        self.msr_mask_ptrs = self
            .caps
            .check_output_msrs(self.trace_en, output_base, mask_ptrs)?;
        self.msr_base = output_base;
        Ok(())
    }

    /// WRMSR IA32_RTIT_STATUS (TraceEn = 0 only); keeps Error and Stopped.
    pub fn write_status(&mut self, status: u64) -> Result<(), MsrFault> {
        if self.trace_en {
            return Err(MsrFault::TraceEnabled);
        }
        self.status = RtitStatus(status & (RtitStatus::ERROR | RtitStatus::STOPPED));
        if !self.status.error() {
            self.error = None;
        }
        Ok(())
    }

    /// Clears TraceEn; the MSRs then hold the exact write pointer.
    pub fn disable(&mut self) {
        if self.trace_en {
            self.trace_en = false;
            self.msr_mask_ptrs = (self.msr_mask_ptrs & 0xFFFF_FFFF) | (self.output_offset << 32);
        }
    }

    /// Sets TraceEn and checks the single-range error conditions (SDM §33.2.7.1
    /// "Single-Range Output Errors"): a non-contiguous mask, `base & mask != 0`, and
    /// `OutputOffset > mask`. Each is an operational error: Status.Error is set and nothing is
    /// stored.
    pub fn enable(&mut self) {
        if self.trace_en {
            return;
        }
        self.trace_en = true;
        self.mask = self.msr_mask_ptrs & 0xFFFF_FFFF;
        self.output_offset = self.msr_mask_ptrs >> 32;
        self.loc = None;
        if self.status.error() || self.status.stopped() {
            return;
        }
        let (base, mask) = (self.msr_base, self.mask);
        let kind = if mask & (mask + 1) != 0 {
            Some(ErrorKind::MaskNotContiguous { mask })
        } else if base & mask != 0 {
            Some(ErrorKind::BaseMaskOverlap { base, mask })
        } else if self.output_offset > mask {
            Some(ErrorKind::OffsetBeyondMask {
                output_offset: self.output_offset,
                mask,
            })
        } else {
            None
        };
        if let Some(kind) = kind {
            return self.raise(kind);
        }
        let size = mask + 1;
        match self.mem.locate(base, size) {
            Some(loc) => self.loc = Some(loc),
            None => {
                return self.raise(ErrorKind::Unbacked {
                    addr: base,
                    len: size,
                });
            }
        }
        self.restricted_at = self.mem.first_restricted(base, size).map(|a| a - base);
        self.log.enter_region(base, base + size);
    }

    fn raise(&mut self, kind: ErrorKind) {
        self.status.0 |= RtitStatus::ERROR;
        self.loc = None;
        self.error = Some(OperationalError {
            kind,
            site: ErrorSite::SingleRange {
                base: self.msr_base,
                mask: self.mask,
            },
            stream_offset: self.head,
        });
    }

    /// IA32_RTIT_OUTPUT_BASE.
    pub fn output_base(&self) -> u64 {
        self.msr_base
    }

    /// IA32_RTIT_OUTPUT_MASK_PTRS: mask in bits 31:0, OutputOffset in bits 63:32.
    pub fn output_mask_ptrs(&self) -> u64 {
        if self.trace_en {
            self.mask | (self.output_offset << 32)
        } else {
            self.msr_mask_ptrs
        }
    }

    /// The current write address, `trace_store_phys_addr`.
    pub fn store_address(&self) -> u64 {
        (self.msr_base & !self.mask) + (self.output_offset & self.mask)
    }

    /// IA32_RTIT_STATUS.
    pub fn status(&self) -> RtitStatus {
        self.status
    }

    /// The operational error that disabled output, if any.
    pub fn error(&self) -> Option<&OperationalError> {
        self.error.as_ref()
    }

    /// The modelled physical memory.
    pub fn memory(&self) -> &Memory {
        &self.mem
    }

    /// Mutable memory (e.g. to add blocks or restricted ranges before re-enabling).
    pub fn memory_mut(&mut self) -> &mut Memory {
        &mut self.mem
    }

    /// Undrained bytes still present in memory (what a drain would return now).
    pub fn present(&self) -> u64 {
        self.log.present()
    }

    /// Stream offset of the next byte offered to [`TraceSink::write`].
    pub fn stream_offset(&self) -> u64 {
        self.head
    }
}

impl TraceSink for SingleRange {
    /// Stores `bytes` circularly: at the end of the range the write pointer wraps to the base.
    fn write(&mut self, bytes: &[u8]) -> WriteOutcome {
        let mut rest = bytes;
        let mut stored = 0;
        let size = self.mask + 1;
        let base = self.msr_base & !self.mask;
        while !rest.is_empty() {
            let Some(loc) = self.loc.filter(|_| self.trace_en) else {
                break;
            };
            let off = self.output_offset;
            let mut n = (size - off).min(rest.len() as u64);
            if let Some(r) = self.restricted_at {
                if off <= r && off + n > r {
                    n = r - off;
                }
            }
            if self.restricted_at == Some(off) {
                // SDM Table 33-5: output reached restricted memory.
                self.raise(ErrorKind::RestrictedOutput { addr: base + off });
                break;
            }
            let (now, later) = rest.split_at(n as usize);
            self.mem.write_at(
                Location {
                    block: loc.block,
                    offset: loc.offset + off as usize,
                },
                now,
            );
            self.log.record(self.head, base + off, n);
            self.head += n;
            stored += n as usize;
            rest = later;
            self.output_offset += n;
            if self.output_offset == size {
                self.output_offset = 0;
                self.log.enter_region(base, base + size);
            }
        }
        let dropped = rest.len();
        if dropped > 0 {
            self.log.drop_bytes(dropped as u64);
            self.head += dropped as u64;
        }
        WriteOutcome {
            stored,
            dropped,
            pmis: 0,
            state: self.state(),
        }
    }
}

impl TraceSource for SingleRange {
    fn drain_with(&mut self, f: &mut dyn FnMut(Chunk<'_>)) -> DrainReport {
        let state = self.state();
        self.log.drain(&self.mem, self.head, state, f)
    }

    fn pending(&self) -> u64 {
        self.log.pending(self.head)
    }

    fn capacity(&self) -> u64 {
        self.mask + 1
    }

    fn state(&self) -> OutputState {
        self.status.output_state(self.trace_en)
    }
}
