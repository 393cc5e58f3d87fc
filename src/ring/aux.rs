//! The consumer side of a perf event's ring buffers: the data ring (side-band records) and the AUX
//! area (raw Intel PT bytes), written against the kernel ABI of
//! `include/uapi/linux/perf_event.h` (`struct perf_event_mmap_page`, `struct perf_event_header`,
//! `PERF_RECORD_*`, `PERF_AUX_FLAG_*`).
//!
//! Everything here is pure logic over two abstractions so that it can be unit-tested without a CPU
//! that has Intel PT:
//!
//! * [`PerfMmapPage`], a `#[repr(C)]` mirror of `struct perf_event_mmap_page` whose fields are
//!   atomics (same size and alignment as the kernel's `__u64`/`__u32`), so a `&PerfMmapPage` over the
//!   real first mmap page is sound even though the kernel writes it concurrently, and so that the
//!   memory-ordering rules of the header are expressed directly as `Acquire`/`Release`;
//! * [`RingRegion`], "the mapped pages of a ring": a byte slice in tests, an `mmap` in
//!   [`crate::capture::perf`].
//!
//! ## The ABI rules implemented here (quoted from `perf_event.h`)
//!
//! * `data_head`: "On SMP-capable platforms, after reading the data_head value, user-space should
//!   issue an smp_rmb()" — we load it with `Ordering::Acquire`.
//! * `data_tail`: "When the mapping is PROT_WRITE the data_tail value should be written by
//!   userspace to reflect the last read data, after issuing an smp_mb()" — we store it with
//!   `Ordering::Release` after the last read of the records (a release store orders all earlier
//!   loads and stores before it).
//! * `aux_head`/`aux_tail`: "have the same semantics as data_{head,tail} and same ordering rules
//!   apply" — same orderings in [`drain_aux_full`].
//! * Heads and tails are free-running byte counters; the position in the ring is the counter modulo
//!   the ring size (`data_size`, `aux_size`), so a record or a chunk of trace may straddle the end
//!   of the ring and is read in at most two slices.
//! * The kernel publishes `data_head` only after whole records are written, so a reader never sees
//!   half a record between `data_tail` and `data_head`.
//! * Overwrite ("snapshot") mode of the AUX area (AUX mapped without `PROT_WRITE`): `aux_tail` is
//!   ignored and the producer overwrites the oldest data; the consumer must disable the event
//!   before reading (kernel commit "perf: Support overwrite mode for the AUX area"). See
//!   [`SnapshotReader`] for how the head is interpreted.
//!
//! Loss is never silent: every `PERF_RECORD_AUX` flag (`TRUNCATED`, `PARTIAL`, `COLLISION`,
//! `OVERWRITE`), every `PERF_RECORD_LOST`/`PERF_RECORD_LOST_SAMPLES`, every corrupt record and every
//! byte the reader had to skip is counted in [`AuxStats`].

use std::sync::atomic::{AtomicI64, AtomicU16, AtomicU32, AtomicU64, Ordering};

use thiserror::Error;

use crate::perf::abi;
pub use crate::perf::abi::{
    PERF_EVENT_HEADER_SIZE, PERF_RECORD_AUX, PERF_RECORD_AUX_OUTPUT_HW_ID,
    PERF_RECORD_ITRACE_START, PERF_RECORD_LOST, PERF_RECORD_LOST_SAMPLES, SampleId,
};

/// A `#[repr(C)]` mirror of the kernel's `struct perf_event_mmap_page` (the first page of a perf
/// mmap), field for field. Every field the kernel may write is an atomic of the kernel field's
/// width, so the layout is identical (checked against `perf-event-open-sys`'s bindgen type in the
/// tests) and shared references stay sound while the kernel updates the page.
///
/// The ring-control fields sit at fixed offsets: `data_head` 1024, `data_tail` 1032, `data_offset`
/// 1040, `data_size` 1048, `aux_head` 1056, `aux_tail` 1064, `aux_offset` 1072, `aux_size` 1080.
#[repr(C)]
#[derive(Debug)]
pub struct PerfMmapPage {
    /// `version`: version number of this structure.
    pub version: AtomicU32,
    /// `compat_version`: lowest version this is compatible with.
    pub compat_version: AtomicU32,
    /// `lock`: seqlock for the self-monitoring fields (`index`, `offset`, `time_*`).
    pub lock: AtomicU32,
    /// `index`: hardware event identifier for `rdpmc` (unused for `intel_pt`).
    pub index: AtomicU32,
    /// `offset`: add to the hardware event value.
    pub offset: AtomicI64,
    /// `time_enabled`: time the event was active.
    pub time_enabled: AtomicU64,
    /// `time_running`: time the event was running.
    pub time_running: AtomicU64,
    /// The `capabilities` union (`cap_user_rdpmc`, `cap_user_time`, ... bits).
    pub capabilities: AtomicU64,
    /// `pmc_width`.
    pub pmc_width: AtomicU16,
    /// `time_shift` (TSC → perf time conversion).
    pub time_shift: AtomicU16,
    /// `time_mult` (TSC → perf time conversion).
    pub time_mult: AtomicU32,
    /// `time_offset` (TSC → perf time conversion).
    pub time_offset: AtomicU64,
    /// `time_zero` (valid with `cap_user_time_zero`).
    pub time_zero: AtomicU64,
    /// `size`: header size up to `__reserved[]`.
    pub size: AtomicU32,
    /// `__reserved_1`.
    pub reserved_1: AtomicU32,
    /// `time_cycles`.
    pub time_cycles: AtomicU64,
    /// `time_mask`.
    pub time_mask: AtomicU64,
    /// `__reserved[118*8+4]`: pads the header so the ring-control fields start at byte 1024.
    pub reserved: [u8; 928],
    /// `data_head`: head of the data ring (free-running byte count). Read with acquire.
    pub data_head: AtomicU64,
    /// `data_tail`: user-space's read position in the data ring. Written with release.
    pub data_tail: AtomicU64,
    /// `data_offset`: where the data ring starts in the mmap.
    pub data_offset: AtomicU64,
    /// `data_size`: data ring size in bytes.
    pub data_size: AtomicU64,
    /// `aux_head`: head of the AUX area. Read with acquire.
    pub aux_head: AtomicU64,
    /// `aux_tail`: user-space's read position in the AUX area (ignored in overwrite mode).
    pub aux_tail: AtomicU64,
    /// `aux_offset`: mmap offset of the AUX area; user space sets it before mapping the AUX area.
    pub aux_offset: AtomicU64,
    /// `aux_size`: AUX area size; user space sets it before mapping the AUX area.
    pub aux_size: AtomicU64,
}

impl PerfMmapPage {
    /// An all-zero page, as used by simulations (the kernel fills a real one).
    pub fn zeroed() -> Self {
        Self {
            version: AtomicU32::new(0),
            compat_version: AtomicU32::new(0),
            lock: AtomicU32::new(0),
            index: AtomicU32::new(0),
            offset: AtomicI64::new(0),
            time_enabled: AtomicU64::new(0),
            time_running: AtomicU64::new(0),
            capabilities: AtomicU64::new(0),
            pmc_width: AtomicU16::new(0),
            time_shift: AtomicU16::new(0),
            time_mult: AtomicU32::new(0),
            time_offset: AtomicU64::new(0),
            time_zero: AtomicU64::new(0),
            size: AtomicU32::new(0),
            reserved_1: AtomicU32::new(0),
            time_cycles: AtomicU64::new(0),
            time_mask: AtomicU64::new(0),
            reserved: [0; 928],
            data_head: AtomicU64::new(0),
            data_tail: AtomicU64::new(0),
            data_offset: AtomicU64::new(0),
            data_size: AtomicU64::new(0),
            aux_head: AtomicU64::new(0),
            aux_tail: AtomicU64::new(0),
            aux_offset: AtomicU64::new(0),
            aux_size: AtomicU64::new(0),
        }
    }
}

/// The mapped pages of one ring (data ring or AUX area).
///
/// Contract: [`RingRegion::stable_slice`] is only called for byte ranges the producer is not
/// writing at that moment — `[tail, head)` of a ring whose tail the consumer owns, or the whole
/// AUX area of a disabled overwrite-mode event. That is what makes handing out `&[u8]` over memory
/// the kernel writes sound for the mmap implementation.
pub trait RingRegion {
    /// Size of the ring in bytes.
    fn ring_len(&self) -> usize;
    /// The bytes `[offset, offset + len)`, or `None` if the range is outside the ring.
    fn stable_slice(&self, offset: usize, len: usize) -> Option<&[u8]>;
}

impl RingRegion for [u8] {
    fn ring_len(&self) -> usize {
        self.len()
    }
    fn stable_slice(&self, offset: usize, len: usize) -> Option<&[u8]> {
        self.get(offset..offset.checked_add(len)?)
    }
}

impl RingRegion for Vec<u8> {
    fn ring_len(&self) -> usize {
        self.len()
    }
    fn stable_slice(&self, offset: usize, len: usize) -> Option<&[u8]> {
        self.as_slice().stable_slice(offset, len)
    }
}

/// Errors of the ring readers. Each carries the counters involved.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RingError {
    /// The size in the control page does not match the mapped region.
    #[error("{ring} ring: control page says {page_size} bytes but {mapped} bytes are mapped")]
    SizeMismatch {
        /// `"data"` or `"aux"`.
        ring: &'static str,
        /// `data_size`/`aux_size` from the control page.
        page_size: u64,
        /// Length of the mapped region.
        mapped: u64,
    },
    /// The head moved behind the consumer's tail (the counters are free-running and only grow).
    #[error("{ring} ring: head {head:#x} is behind tail {tail:#x}")]
    HeadBehindTail {
        /// `"data"` or `"aux"`.
        ring: &'static str,
        /// Head counter read.
        head: u64,
        /// Tail counter.
        tail: u64,
    },
    /// A record header with `size < 8` (cannot be skipped); the rest of the ring was dropped.
    #[error(
        "data ring: corrupt record header at counter {at:#x} (type {type_}, size {size}); {dropped} bytes dropped"
    )]
    CorruptHeader {
        /// Free-running counter of the header.
        at: u64,
        /// `header.type`.
        type_: u32,
        /// `header.size`.
        size: u16,
        /// Bytes skipped to resynchronise at `data_head`.
        dropped: u64,
    },
    /// A record extends past `data_head` (the kernel never publishes half records).
    #[error("data ring: record at {at:#x} of size {size} extends past head {head:#x}")]
    RecordPastHead {
        /// Free-running counter of the header.
        at: u64,
        /// `header.size`.
        size: u16,
        /// `data_head`.
        head: u64,
    },
    /// The ring has zero size.
    #[error("{ring} ring has zero size")]
    EmptyRing {
        /// `"data"` or `"aux"`.
        ring: &'static str,
    },
}

/// `PERF_RECORD_AUX.flags` (`PERF_AUX_FLAG_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AuxFlags(pub u64);

impl AuxFlags {
    /// `PERF_AUX_FLAG_TRUNCATED`: the record was truncated to fit the free space (full mode: the
    /// consumer lagged; PT stopped producing until space was freed).
    pub const TRUNCATED: u64 = abi::PERF_AUX_FLAG_TRUNCATED;
    /// `PERF_AUX_FLAG_OVERWRITE`: snapshot from overwrite mode.
    pub const OVERWRITE: u64 = abi::PERF_AUX_FLAG_OVERWRITE;
    /// `PERF_AUX_FLAG_PARTIAL`: the record contains gaps (e.g. PT was off during VMX operation).
    pub const PARTIAL: u64 = abi::PERF_AUX_FLAG_PARTIAL;
    /// `PERF_AUX_FLAG_COLLISION`: the sample collided with another.
    pub const COLLISION: u64 = abi::PERF_AUX_FLAG_COLLISION;
    /// `PERF_AUX_FLAG_PMU_FORMAT_TYPE_MASK`: PMU-specific trace format type.
    pub const PMU_FORMAT_TYPE_MASK: u64 = abi::PERF_AUX_FLAG_PMU_FORMAT_TYPE_MASK;

    /// TRUNCATED is set.
    pub fn truncated(self) -> bool {
        self.0 & Self::TRUNCATED != 0
    }
    /// OVERWRITE is set.
    pub fn overwrite(self) -> bool {
        self.0 & Self::OVERWRITE != 0
    }
    /// PARTIAL is set.
    pub fn partial(self) -> bool {
        self.0 & Self::PARTIAL != 0
    }
    /// COLLISION is set.
    pub fn collision(self) -> bool {
        self.0 & Self::COLLISION != 0
    }
}

/// Which `sample_id` fields trail non-sample records when `attr.sample_id_all = 1`, derived from
/// `attr.sample_type` (`struct sample_id` in `perf_event.h`: `{pid,tid}` if `PERF_SAMPLE_TID`,
/// `time` if `TIME`, `id` if `ID`, `stream_id` if `STREAM_ID`, `{cpu,res}` if `CPU`, `id` if
/// `IDENTIFIER`, in that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SampleIdLayout {
    /// `attr.sample_type`; zero or `sample_id_all = 0` means no trailer.
    pub sample_type: u64,
}

impl SampleIdLayout {
    /// `PERF_SAMPLE_TID`.
    pub const TID: u64 = abi::PERF_SAMPLE_TID;
    /// `PERF_SAMPLE_TIME`.
    pub const TIME: u64 = abi::PERF_SAMPLE_TIME;
    /// `PERF_SAMPLE_ID`.
    pub const ID: u64 = abi::PERF_SAMPLE_ID;
    /// `PERF_SAMPLE_CPU`.
    pub const CPU: u64 = abi::PERF_SAMPLE_CPU;
    /// `PERF_SAMPLE_STREAM_ID`.
    pub const STREAM_ID: u64 = abi::PERF_SAMPLE_STREAM_ID;
    /// `PERF_SAMPLE_IDENTIFIER`.
    pub const IDENTIFIER: u64 = abi::PERF_SAMPLE_IDENTIFIER;

    /// No `sample_id` trailer (`sample_id_all = 0`).
    pub const NONE: SampleIdLayout = SampleIdLayout { sample_type: 0 };

    /// Size in bytes of the trailer.
    pub fn trailer_len(self) -> usize {
        abi::sample_id_len(self.sample_type)
    }

    /// Parses the trailer at the end of `record` (which includes its header). `None` if the record
    /// is too short to hold it.
    pub fn parse(self, record: &[u8]) -> Option<SampleId> {
        let start = record.len().checked_sub(self.trailer_len())?;
        if start < PERF_EVENT_HEADER_SIZE {
            return None;
        }
        abi::parse_sample_id(self.sample_type, record)
    }
}

/// A parsed side-band record of the data ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SideRecord {
    /// `PERF_RECORD_AUX`: new data landed in the AUX area.
    Aux {
        /// `aux_offset`: AUX counter where the data starts.
        aux_offset: u64,
        /// `aux_size`: bytes written.
        aux_size: u64,
        /// `flags`.
        flags: AuxFlags,
        /// Trailer.
        sample: Option<SampleId>,
    },
    /// `PERF_RECORD_ITRACE_START`: tracing started for the event (the first PSB+ follows).
    ItraceStart {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// Trailer.
        sample: Option<SampleId>,
    },
    /// `PERF_RECORD_LOST`: the data ring overflowed and `lost` records were dropped.
    Lost {
        /// Event id.
        id: u64,
        /// Number of records lost.
        lost: u64,
        /// Trailer.
        sample: Option<SampleId>,
    },
    /// `PERF_RECORD_LOST_SAMPLES`.
    LostSamples {
        /// Number of samples lost.
        lost: u64,
        /// Trailer.
        sample: Option<SampleId>,
    },
    /// `PERF_RECORD_AUX_OUTPUT_HW_ID`.
    AuxOutputHwId {
        /// Hardware id.
        hw_id: u64,
        /// Trailer.
        sample: Option<SampleId>,
    },
    /// Any other record type, or a known type too short for its fixed fields (counted as
    /// malformed in [`AuxStats::malformed_records`]).
    Other {
        /// `header.type`.
        type_: u32,
        /// `header.misc`.
        misc: u16,
        /// `header.size`.
        size: u16,
    },
}

/// Counters of a capture. Every kind of loss has its own counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AuxStats {
    /// Side-band records read from the data ring.
    pub records: u64,
    /// `PERF_RECORD_AUX` records.
    pub aux_records: u64,
    /// Sum of `aux_size` over `PERF_RECORD_AUX` records (in overwrite mode `intel_pt` reports the
    /// whole buffer size per record, so this is not a byte count of new data there).
    pub aux_bytes_reported: u64,
    /// AUX records with `TRUNCATED` (trace lost because the consumer lagged).
    pub truncated: u64,
    /// AUX records with `PARTIAL` (gaps in the trace).
    pub partial: u64,
    /// AUX records with `COLLISION`.
    pub collisions: u64,
    /// AUX records with `OVERWRITE` (overwrite-mode writes).
    pub overwrite_records: u64,
    /// `PERF_RECORD_ITRACE_START` records.
    pub itrace_starts: u64,
    /// `PERF_RECORD_LOST` records.
    pub lost_records: u64,
    /// Sum of `lost` over `PERF_RECORD_LOST` records (side-band records the kernel dropped).
    pub lost_events: u64,
    /// Sum of `lost` over `PERF_RECORD_LOST_SAMPLES`.
    pub lost_samples: u64,
    /// Records too short for their fixed fields.
    pub malformed_records: u64,
    /// Data-ring bytes skipped after a corrupt header.
    pub data_bytes_dropped: u64,
    /// Trace bytes copied out of the AUX area.
    pub aux_bytes_copied: u64,
    /// Full mode: bytes the reader found overwritten (head more than `aux_size` ahead of tail).
    pub aux_overrun_bytes: u64,
    /// Snapshots taken.
    pub snapshots: u64,
    /// Snapshots whose older data had been overwritten with an exactly known byte count.
    pub snapshot_overwritten_bytes: u64,
    /// Snapshots where older data may have been overwritten by an unknown amount.
    pub snapshots_possibly_overwritten: u64,
    /// Times the capture backend re-enabled an event the kernel had disabled because the AUX
    /// area was full (`perf_aux_output_begin` sets `pending_disable` when no space is left).
    pub reenables: u64,
}

impl AuxStats {
    /// Adds `other` into `self` (aggregating per-thread streams).
    pub fn accumulate(&mut self, o: &AuxStats) {
        self.records += o.records;
        self.aux_records += o.aux_records;
        self.aux_bytes_reported += o.aux_bytes_reported;
        self.truncated += o.truncated;
        self.partial += o.partial;
        self.collisions += o.collisions;
        self.overwrite_records += o.overwrite_records;
        self.itrace_starts += o.itrace_starts;
        self.lost_records += o.lost_records;
        self.lost_events += o.lost_events;
        self.lost_samples += o.lost_samples;
        self.malformed_records += o.malformed_records;
        self.data_bytes_dropped += o.data_bytes_dropped;
        self.aux_bytes_copied += o.aux_bytes_copied;
        self.aux_overrun_bytes += o.aux_overrun_bytes;
        self.snapshots += o.snapshots;
        self.snapshot_overwritten_bytes += o.snapshot_overwritten_bytes;
        self.snapshots_possibly_overwritten += o.snapshots_possibly_overwritten;
        self.reenables += o.reenables;
    }

    /// True if any counter reports lost or damaged trace or side-band data.
    pub fn any_loss(&self) -> bool {
        self.truncated
            + self.partial
            + self.collisions
            + self.lost_records
            + self.lost_samples
            + self.malformed_records
            + self.data_bytes_dropped
            + self.aux_overrun_bytes
            + self.snapshot_overwritten_bytes
            + self.snapshots_possibly_overwritten
            > 0
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let s = self.bytes.get(self.pos..self.pos.checked_add(N)?)?;
        self.pos += N;
        s.try_into().ok()
    }
    fn u16(&mut self) -> Option<u16> {
        self.take::<2>().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }
}

/// Checks the size the control page gives for `ring` against the mapped length.
fn check_ring_size(ring: &'static str, page_size: u64, mapped: usize) -> Result<(), RingError> {
    if page_size == 0 {
        return Err(RingError::EmptyRing { ring });
    }
    if page_size != mapped as u64 {
        return Err(RingError::SizeMismatch {
            ring,
            page_size,
            mapped: mapped as u64,
        });
    }
    Ok(())
}

/// Checks that the producer's head of `ring` is not behind our tail (free-running counters).
fn check_head_tail(ring: &'static str, head: u64, tail: u64) -> Result<(), RingError> {
    if head < tail {
        return Err(RingError::HeadBehindTail { ring, head, tail });
    }
    Ok(())
}

/// Hands the `n` bytes at free-running counter `start` of the AUX ring to `sink`, in at most
/// two slices (before and after the wrap). `n <= page_size`, the ring's length.
fn sink_range<R, F>(
    aux: &R,
    start: u64,
    n: u64,
    page_size: u64,
    sink: &mut F,
) -> Result<(), RingError>
where
    R: RingRegion + ?Sized,
    F: FnMut(&[u8]),
{
    // n <= page_size <= usize::MAX because the region is mapped.
    let Some((a, b)) = ring_slices(aux, start, n as usize) else {
        return Err(RingError::SizeMismatch {
            ring: "aux",
            page_size,
            mapped: aux.ring_len() as u64,
        });
    };
    sink(a);
    if !b.is_empty() {
        sink(b);
    }
    Ok(())
}

/// Splits `len` bytes starting at free-running counter `start` of a ring of `region.ring_len()`
/// bytes into at most two slices (before and after the wrap).
pub fn ring_slices<R: RingRegion + ?Sized>(
    region: &R,
    start: u64,
    len: usize,
) -> Option<(&[u8], &[u8])> {
    let size = region.ring_len();
    if size == 0 || len > size {
        return None;
    }
    let off = (start % size as u64) as usize;
    let first_len = len.min(size - off);
    let first = region.stable_slice(off, first_len)?;
    let second = region.stable_slice(0, len - first_len)?;
    Some((first, second))
}

/// Parses one record (header included) into a [`SideRecord`] and whether it was well formed (a
/// known type long enough for its fixed fields and trailer). `None` only when `bytes` is shorter
/// than a header.
pub fn parse_record(bytes: &[u8], layout: SampleIdLayout) -> Option<(SideRecord, bool)> {
    let mut c = Cursor { bytes, pos: 0 };
    let type_ = c.u32()?;
    let misc = c.u16()?;
    let size = c.u16()?;
    let other = SideRecord::Other { type_, misc, size };
    let fixed_len = match type_ {
        PERF_RECORD_AUX => 24,
        PERF_RECORD_LOST => 16,
        PERF_RECORD_ITRACE_START | PERF_RECORD_LOST_SAMPLES | PERF_RECORD_AUX_OUTPUT_HW_ID => 8,
        _ => return Some((other, true)),
    };
    if bytes.len() < PERF_EVENT_HEADER_SIZE + fixed_len + layout.trailer_len() {
        return Some((other, false));
    }
    let sample = layout.parse(bytes);
    match parse_fixed(type_, &mut c, sample) {
        Some(rec) => Some((rec, true)),
        None => Some((other, false)),
    }
}

fn parse_fixed(type_: u32, c: &mut Cursor<'_>, sample: Option<SampleId>) -> Option<SideRecord> {
    Some(match type_ {
        PERF_RECORD_AUX => SideRecord::Aux {
            aux_offset: c.u64()?,
            aux_size: c.u64()?,
            flags: AuxFlags(c.u64()?),
            sample,
        },
        PERF_RECORD_ITRACE_START => SideRecord::ItraceStart {
            pid: c.u32()?,
            tid: c.u32()?,
            sample,
        },
        PERF_RECORD_LOST => SideRecord::Lost {
            id: c.u64()?,
            lost: c.u64()?,
            sample,
        },
        PERF_RECORD_LOST_SAMPLES => SideRecord::LostSamples {
            lost: c.u64()?,
            sample,
        },
        PERF_RECORD_AUX_OUTPUT_HW_ID => SideRecord::AuxOutputHwId {
            hw_id: c.u64()?,
            sample,
        },
        _ => return None,
    })
}

/// Reader of the data ring (`data_head`/`data_tail`, `PERF_RECORD_*` side-band records).
#[derive(Debug, Default)]
pub struct DataRingReader {
    layout: SampleIdLayout,
    scratch: Vec<u8>,
}

impl DataRingReader {
    /// A reader for records whose `sample_id` trailer follows `layout`.
    pub fn new(layout: SampleIdLayout) -> Self {
        Self {
            layout,
            scratch: Vec::new(),
        }
    }

    /// Reads every complete record in `[data_tail, data_head)`, updates `stats`, hands each record
    /// to `on_record`, then publishes the new `data_tail` with release ordering. Records that
    /// straddle the end of the ring are reassembled. Returns the number of records read.
    ///
    /// On a corrupt header (`size < 8`, which cannot be skipped) the reader drops the rest of the
    /// ring (counted in [`AuxStats::data_bytes_dropped`]), moves the tail to the head so the kernel
    /// can keep writing, and returns [`RingError::CorruptHeader`].
    pub fn read<R, F>(
        &mut self,
        page: &PerfMmapPage,
        data: &R,
        stats: &mut AuxStats,
        mut on_record: F,
    ) -> Result<usize, RingError>
    where
        R: RingRegion + ?Sized,
        F: FnMut(&SideRecord),
    {
        let size = page.data_size.load(Ordering::Relaxed);
        check_ring_size("data", size, data.ring_len())?;
        // perf_event.h: read data_head, then smp_rmb() before reading the records.
        let head = page.data_head.load(Ordering::Acquire);
        // Only we write data_tail.
        let mut tail = page.data_tail.load(Ordering::Relaxed);
        check_head_tail("data", head, tail)?;
        let mut count = 0;
        let mut result = Ok(());
        while head - tail >= PERF_EVENT_HEADER_SIZE as u64 {
            let Some((a, b)) = ring_slices(data, tail, PERF_EVENT_HEADER_SIZE) else {
                break;
            };
            let mut hdr = [0u8; PERF_EVENT_HEADER_SIZE];
            hdr[..a.len()].copy_from_slice(a);
            hdr[a.len()..].copy_from_slice(b);
            let type_ = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
            let rec_size = u16::from_le_bytes([hdr[6], hdr[7]]);
            if (rec_size as usize) < PERF_EVENT_HEADER_SIZE || rec_size as u64 > size {
                let dropped = head - tail;
                stats.data_bytes_dropped += dropped;
                result = Err(RingError::CorruptHeader {
                    at: tail,
                    type_,
                    size: rec_size,
                    dropped,
                });
                tail = head;
                break;
            }
            if tail + rec_size as u64 > head {
                result = Err(RingError::RecordPastHead {
                    at: tail,
                    size: rec_size,
                    head,
                });
                break;
            }
            let Some((a, b)) = ring_slices(data, tail, rec_size as usize) else {
                break;
            };
            self.scratch.clear();
            self.scratch.extend_from_slice(a);
            self.scratch.extend_from_slice(b);
            if let Some((rec, well_formed)) = parse_record(&self.scratch, self.layout) {
                stats.records += 1;
                if !well_formed {
                    stats.malformed_records += 1;
                }
                account(&rec, stats);
                on_record(&rec);
                count += 1;
            }
            tail += rec_size as u64;
        }
        // perf_event.h: smp_mb() after reading, then write data_tail; a release store orders the
        // record reads above before the kernel may reuse the space.
        page.data_tail.store(tail, Ordering::Release);
        result.map(|()| count)
    }
}

fn account(rec: &SideRecord, stats: &mut AuxStats) {
    match *rec {
        SideRecord::Aux {
            aux_size, flags, ..
        } => {
            stats.aux_records += 1;
            stats.aux_bytes_reported += aux_size;
            stats.truncated += flags.truncated() as u64;
            stats.partial += flags.partial() as u64;
            stats.collisions += flags.collision() as u64;
            stats.overwrite_records += flags.overwrite() as u64;
        }
        SideRecord::ItraceStart { .. } => stats.itrace_starts += 1,
        SideRecord::Lost { lost, .. } => {
            stats.lost_records += 1;
            stats.lost_events += lost;
        }
        SideRecord::LostSamples { lost, .. } => stats.lost_samples += lost,
        SideRecord::AuxOutputHwId { .. } | SideRecord::Other { .. } => {}
    }
}

/// Full (non-overwrite) mode: copies `[aux_tail, aux_head)` to `sink` in at most two slices and
/// advances `aux_tail` (release) past what was copied. `limit` bounds the bytes moved in one call
/// (the rest stays in the ring, back-pressuring the producer, which truncates when the ring is
/// full). Returns the number of bytes copied.
///
/// ABI: `aux_head` is read with acquire (the header's "smp_rmb() after reading aux_head"),
/// `aux_tail` is published with release after the copy; both are free-running, position =
/// counter mod `aux_size`. The kernel never lets `aux_head - aux_tail` exceed `aux_size` in this
/// mode; if it does anyway, the oldest excess bytes are counted in
/// [`AuxStats::aux_overrun_bytes`] and skipped.
pub fn drain_aux_full<R, F>(
    page: &PerfMmapPage,
    aux: &R,
    limit: Option<u64>,
    stats: &mut AuxStats,
    mut sink: F,
) -> Result<u64, RingError>
where
    R: RingRegion + ?Sized,
    F: FnMut(&[u8]),
{
    let size = page.aux_size.load(Ordering::Relaxed);
    check_ring_size("aux", size, aux.ring_len())?;
    let head = page.aux_head.load(Ordering::Acquire);
    let mut tail = page.aux_tail.load(Ordering::Relaxed);
    check_head_tail("aux", head, tail)?;
    if head - tail > size {
        let lost = head - tail - size;
        stats.aux_overrun_bytes += lost;
        tail = head - size;
    }
    let n = (head - tail).min(limit.unwrap_or(u64::MAX));
    if n > 0 {
        sink_range(aux, tail, n, size, &mut sink)?;
        stats.aux_bytes_copied += n;
    }
    page.aux_tail.store(tail + n, Ordering::Release);
    Ok(n)
}

/// How much older trace an overwrite-mode snapshot lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotLoss {
    /// Nothing produced since the previous snapshot was overwritten.
    None,
    /// Exactly this many bytes (known when `aux_head` is a running count).
    Exact(u64),
    /// The buffer wrapped, so older data may be gone, but the head does not tell how much.
    Unknown,
}

/// Result of one snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// `aux_head` read for the snapshot.
    pub head: u64,
    /// Bytes handed to the sink (the newest ones, ending at the head).
    pub bytes: u64,
    /// The buffer has wrapped at least once (so it is full of valid data).
    pub wrapped: bool,
    /// Loss of older data since the previous snapshot (or since the start, for the first).
    pub loss: SnapshotLoss,
}

/// Overwrite ("snapshot", flight-recorder) mode reader.
///
/// The generic AUX ABI lets the PMU driver supply `aux_head` in overwrite mode
/// (`perf_aux_output_end`: "in overwrite mode, driver provides aux_head via handle"). A running
/// count (`aux_head ≥ aux_size` once wrapped) tells exactly how much was overwritten; the
/// `intel_pt` driver instead reports the write *position* inside the buffer (`pt_update_head`
/// with `buf->snapshot`), which wraps. The reader handles both: the write position is always
/// `aux_head mod aux_size`, and the buffer is known to have wrapped when the head is ≥ `aux_size`,
/// when the head moved backwards since the previous snapshot, or when any byte after the write
/// position is non-zero (AUX pages are allocated zeroed — the same test as perf's
/// `intel_pt_first_wrap`). With a position-style head, the amount overwritten is unknowable, so
/// a wrapped buffer that received new data (head moved, or [`SnapshotReader::note_aux_record`]
/// was called for a `PERF_RECORD_AUX`) reports [`SnapshotLoss::Unknown`].
///
/// The caller must disable the event around [`SnapshotReader::take`] (the kernel ABI makes the
/// consumer responsible for stopping writers before reading an overwrite-mode AUX area).
#[derive(Debug, Default, Clone)]
pub struct SnapshotReader {
    prev_head: Option<u64>,
    wrapped: bool,
    running_count: bool,
    activity: bool,
}

impl SnapshotReader {
    /// A reader for a freshly mapped (zeroed) AUX area.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells the reader that a `PERF_RECORD_AUX` arrived since the previous snapshot, i.e. the
    /// producer wrote. With a position-style head this is the only way to tell "nothing new" from
    /// "exactly a multiple of `aux_size` new bytes" (the head ends where it was in both cases).
    pub fn note_aux_record(&mut self) {
        self.activity = true;
    }

    /// Copies the newest `min(max_len, valid bytes)` bytes ending at `aux_head` to `sink`, oldest
    /// first, in at most two slices, and reports whether older data was overwritten (counted in
    /// `stats`).
    pub fn take<R, F>(
        &mut self,
        page: &PerfMmapPage,
        aux: &R,
        max_len: Option<u64>,
        stats: &mut AuxStats,
        mut sink: F,
    ) -> Result<SnapshotInfo, RingError>
    where
        R: RingRegion + ?Sized,
        F: FnMut(&[u8]),
    {
        let size = page.aux_size.load(Ordering::Relaxed);
        if size == 0 {
            return Err(RingError::EmptyRing { ring: "aux" });
        }
        if size != aux.ring_len() as u64 {
            return Err(RingError::SizeMismatch {
                ring: "aux",
                page_size: size,
                mapped: aux.ring_len() as u64,
            });
        }
        let head = page.aux_head.load(Ordering::Acquire);
        let pos = head % size;
        if head >= size {
            self.running_count = true;
        }
        let moved_back = !self.running_count && self.prev_head.is_some_and(|p| head < p);
        let was_wrapped = self.wrapped;
        if !self.wrapped {
            self.wrapped = head >= size
                || moved_back
                || aux
                    .stable_slice(pos as usize, (size - pos) as usize)
                    .is_some_and(|rest| rest.iter().any(|&b| b != 0));
        }
        let loss = if self.running_count {
            let since = self.prev_head.unwrap_or(0);
            if head < since {
                return Err(RingError::HeadBehindTail {
                    ring: "aux",
                    head,
                    tail: since,
                });
            }
            let produced = head - since;
            if produced > size {
                SnapshotLoss::Exact(produced - size)
            } else {
                SnapshotLoss::None
            }
        } else if self.wrapped && (!was_wrapped || self.activity || Some(head) != self.prev_head) {
            SnapshotLoss::Unknown
        } else {
            SnapshotLoss::None
        };
        let valid = if self.wrapped { size } else { pos };
        let n = valid.min(max_len.unwrap_or(u64::MAX));
        if n > 0 {
            let start = (pos + size - n) % size;
            sink_range(aux, start, n, size, &mut sink)?;
        }
        stats.snapshots += 1;
        stats.aux_bytes_copied += n;
        match loss {
            SnapshotLoss::Exact(k) => stats.snapshot_overwritten_bytes += k,
            SnapshotLoss::Unknown => stats.snapshots_possibly_overwritten += 1,
            SnapshotLoss::None => {}
        }
        self.prev_head = Some(head);
        self.activity = false;
        Ok(SnapshotInfo {
            head,
            bytes: n,
            wrapped: self.wrapped,
            loss,
        })
    }
}

#[cfg(test)]
mod tests;
