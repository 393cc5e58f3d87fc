//! A zero-copy reader for Linux `perf.data` files, as far as Intel PT needs them.
//!
//! The reader borrows the whole file as a `&[u8]` (typically a memory map) and decodes lazily, in
//! the style of `object`/`gimli`: [`PerfData::parse`] only checks the file header; records are
//! decoded one at a time by [`PerfData::records`]; nothing is copied except where PT payloads split
//! over several `PERF_RECORD_AUXTRACE` records must be concatenated ([`PerfData::aux_streams`]).
//!
//! Both layouts `perf record` writes are supported:
//!
//! * the normal file: a 104-byte `perf_file_header` ("PERFILE2", header size, `attr_size`, the attrs,
//!   data and event-types sections, and the feature bitmap), the attrs section (`attr_size`-byte
//!   entries: a `perf_event_attr` followed by the file section of its sample ids), the data section
//!   (the records) and, after the data section, one file section per feature bit;
//! * pipe mode (`perf record -o -`): a 16-byte header (magic and size) followed directly by records,
//!   with the attrs, features and build ids carried inline as `PERF_RECORD_HEADER_*` records.
//!
//! Only little-endian files are read (perf writes the host byte order; a byte-swapped magic is
//! reported as unsupported rather than misread).
//!
//! Two records carry data *after* their `header.size` bytes: `PERF_RECORD_AUXTRACE` (the PT bytes,
//! `size` of them) and `PERF_RECORD_HEADER_TRACING_DATA` (the tracing data). The iterator steps over
//! both. Unknown record types are returned as [`RecordData::Other`] and stepped over by size; a
//! record whose size runs past the end of the data is an error carrying the record's file offset,
//! after which iteration stops (the framing is lost).
//!
//! Field layouts follow the kernel's `include/uapi/linux/perf_event.h` and perf's
//! `tools/perf/util/event.h`, `header.h` and `intel-pt.h`.

use std::borrow::Cow;
use std::fmt;

/// The file magic, "PERFILE2" read as a little-endian `u64`.
const MAGIC: u64 = u64::from_le_bytes(*b"PERFILE2");
/// Size of `struct perf_file_header` (normal mode).
const FILE_HEADER_SIZE: u64 = 104;
/// Size of `struct perf_pipe_file_header` (pipe mode).
const PIPE_HEADER_SIZE: u64 = 16;
/// Size of `struct perf_event_header`.
const RECORD_HEADER_SIZE: usize = 8;
/// Size of `struct perf_file_section`.
const SECTION_SIZE: u64 = 16;
/// Number of bits in the feature bitmap (`HEADER_FEAT_BITS`).
const FEATURE_BITS: u32 = 256;

/// Record types (`perf_event_type` in the kernel, from [`abi`](super::abi); `perf_user_event_type` in perf).
pub mod record_type {
    use crate::perf::abi;
    /// `PERF_RECORD_MMAP`.
    pub const MMAP: u32 = abi::PERF_RECORD_MMAP;
    /// `PERF_RECORD_LOST`.
    pub const LOST: u32 = abi::PERF_RECORD_LOST;
    /// `PERF_RECORD_COMM`.
    pub const COMM: u32 = abi::PERF_RECORD_COMM;
    /// `PERF_RECORD_EXIT`.
    pub const EXIT: u32 = abi::PERF_RECORD_EXIT;
    /// `PERF_RECORD_FORK`.
    pub const FORK: u32 = abi::PERF_RECORD_FORK;
    /// `PERF_RECORD_SAMPLE`.
    pub const SAMPLE: u32 = abi::PERF_RECORD_SAMPLE;
    /// `PERF_RECORD_MMAP2`.
    pub const MMAP2: u32 = abi::PERF_RECORD_MMAP2;
    /// `PERF_RECORD_AUX`.
    pub const AUX: u32 = abi::PERF_RECORD_AUX;
    /// `PERF_RECORD_ITRACE_START`.
    pub const ITRACE_START: u32 = abi::PERF_RECORD_ITRACE_START;
    /// `PERF_RECORD_LOST_SAMPLES`.
    pub const LOST_SAMPLES: u32 = abi::PERF_RECORD_LOST_SAMPLES;
    /// `PERF_RECORD_SWITCH`.
    pub const SWITCH: u32 = abi::PERF_RECORD_SWITCH;
    /// `PERF_RECORD_SWITCH_CPU_WIDE`.
    pub const SWITCH_CPU_WIDE: u32 = abi::PERF_RECORD_SWITCH_CPU_WIDE;
    /// First perf-internal ("user") record type; kernel records lie below.
    pub const USER_TYPE_START: u32 = 64;
    /// `PERF_RECORD_HEADER_ATTR` (pipe mode).
    pub const HEADER_ATTR: u32 = 64;
    /// `PERF_RECORD_HEADER_TRACING_DATA`: `size` bytes of tracing data follow the record.
    pub const HEADER_TRACING_DATA: u32 = 66;
    /// `PERF_RECORD_HEADER_BUILD_ID` (pipe mode, and the entries of the build-id feature).
    pub const HEADER_BUILD_ID: u32 = 67;
    /// `PERF_RECORD_FINISHED_ROUND`.
    pub const FINISHED_ROUND: u32 = 68;
    /// `PERF_RECORD_AUXTRACE_INFO`.
    pub const AUXTRACE_INFO: u32 = 70;
    /// `PERF_RECORD_AUXTRACE`: `size` bytes of trace data follow the record.
    pub const AUXTRACE: u32 = 71;
    /// `PERF_RECORD_AUXTRACE_ERROR`.
    pub const AUXTRACE_ERROR: u32 = 72;
    /// `PERF_RECORD_TIME_CONV`.
    pub const TIME_CONV: u32 = 79;
    /// `PERF_RECORD_HEADER_FEATURE` (pipe mode).
    pub const HEADER_FEATURE: u32 = 80;
    /// `PERF_RECORD_COMPRESSED` (zstd; not decoded by this reader).
    pub const COMPRESSED: u32 = 81;
}

/// `PERF_AUX_FLAG_*` bits of a `PERF_RECORD_AUX`.
pub mod aux_flag {
    use crate::perf::abi;
    /// The AUX buffer was full: data was lost after this record's range.
    pub const TRUNCATED: u64 = abi::PERF_AUX_FLAG_TRUNCATED;
    /// Snapshot (overwrite) mode: the range was overwritten rather than consumed.
    pub const OVERWRITE: u64 = abi::PERF_AUX_FLAG_OVERWRITE;
    /// The record contains gaps (the hardware lost data inside the range).
    pub const PARTIAL: u64 = abi::PERF_AUX_FLAG_PARTIAL;
    /// A sample collided with another one.
    pub const COLLISION: u64 = abi::PERF_AUX_FLAG_COLLISION;
}

/// Feature bit of the build-id table (`HEADER_BUILD_ID`).
pub const FEATURE_BUILD_ID: u32 = 2;
/// Feature bit of the CPU identification string (`HEADER_CPUID`, e.g. `GenuineIntel,6,94,3`).
pub const FEATURE_CPUID: u32 = 9;
/// `PERF_AUXTRACE_INTEL_PT`: the `type` of an Intel PT `PERF_RECORD_AUXTRACE_INFO`.
pub const AUXTRACE_TYPE_INTEL_PT: u32 = 1;

use super::abi::{PERF_SAMPLE_IDENTIFIER as SAMPLE_IDENTIFIER, SampleId, parse_sample_id};
/// perf_event_attr flag bit `sample_id_all`.
const ATTR_FLAG_SAMPLE_ID_ALL: u64 = 1 << 18;
use super::abi::{
    PERF_RECORD_MISC_BUILD_ID_SIZE as MISC_BUILD_ID_SIZE,
    PERF_RECORD_MISC_COMM_EXEC as MISC_COMM_EXEC,
    PERF_RECORD_MISC_MMAP_BUILD_ID as MISC_MMAP_BUILD_ID,
    PERF_RECORD_MISC_SWITCH_OUT as MISC_SWITCH_OUT,
    PERF_RECORD_MISC_SWITCH_OUT_PREEMPT as MISC_SWITCH_OUT_PREEMPT,
};

/// What went wrong while reading a perf.data file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerfDataErrorKind {
    /// The file does not start with "PERFILE2".
    BadMagic,
    /// The file was written in the other byte order (big-endian).
    BigEndian,
    /// The file is shorter than its header.
    HeaderTruncated {
        /// Bytes needed for the header.
        needed: u64,
    },
    /// The header's `size` field is neither a pipe header (16) nor a file header (>= 104).
    BadHeaderSize {
        /// The value found.
        size: u64,
    },
    /// `attr_size` is too small to hold an attr and its id section, or does not divide the attrs
    /// section.
    BadAttrSize {
        /// The value found.
        attr_size: u64,
    },
    /// A file section points outside the file.
    SectionOutOfBounds {
        /// Which section.
        section: &'static str,
        /// Its declared end.
        end: u64,
        /// The file length.
        file_len: u64,
    },
    /// A record's `header.size` is smaller than the 8-byte header.
    RecordTooSmall {
        /// The size found.
        size: u16,
    },
    /// A record (or the trace data following an AUXTRACE record) runs past the end of the data.
    RecordPastEnd {
        /// The record's type.
        record_type: u32,
        /// Bytes the record needs from its offset.
        needed: u64,
        /// Bytes available from its offset.
        available: u64,
    },
    /// The data section ends before its declared size (the file was cut short).
    DataTruncated {
        /// The declared end of the data.
        declared_end: u64,
        /// Where the file ends.
        file_len: u64,
    },
    /// A known record type whose body is too short for its fixed fields.
    MalformedRecord {
        /// The record's type.
        record_type: u32,
        /// What is missing.
        reason: &'static str,
    },
}

/// An error reading a perf.data file: what, and at which file offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfDataError {
    /// File offset of the offending header, section entry or record.
    pub offset: u64,
    /// What went wrong.
    pub kind: PerfDataErrorKind,
}

impl PerfDataError {
    fn new(offset: u64, kind: PerfDataErrorKind) -> Self {
        PerfDataError { offset, kind }
    }

    /// Whether iteration can continue after this error (a malformed body keeps the framing intact;
    /// a bad size loses it).
    pub fn is_recoverable(&self) -> bool {
        matches!(self.kind, PerfDataErrorKind::MalformedRecord { .. })
    }
}

impl fmt::Display for PerfDataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use PerfDataErrorKind::*;
        write!(f, "perf.data offset {:#x}: ", self.offset)?;
        match &self.kind {
            BadMagic => write!(f, "not a perf.data file (no PERFILE2 magic)"),
            BigEndian => write!(f, "big-endian perf.data files are not supported"),
            HeaderTruncated { needed } => write!(f, "file too short for its {needed}-byte header"),
            BadHeaderSize { size } => write!(f, "unsupported header size {size}"),
            BadAttrSize { attr_size } => write!(f, "invalid attr_size {attr_size}"),
            SectionOutOfBounds {
                section,
                end,
                file_len,
            } => write!(
                f,
                "{section} section ends at {end:#x}, past the end of the file ({file_len:#x})"
            ),
            RecordTooSmall { size } => write!(f, "record size {size} is smaller than its header"),
            RecordPastEnd {
                record_type,
                needed,
                available,
            } => write!(
                f,
                "record type {record_type} needs {needed} bytes but only {available} remain"
            ),
            DataTruncated {
                declared_end,
                file_len,
            } => write!(
                f,
                "data section truncated: declared to end at {declared_end:#x}, file ends at {file_len:#x}"
            ),
            MalformedRecord {
                record_type,
                reason,
            } => write!(f, "malformed record type {record_type}: {reason}"),
        }
    }
}

impl std::error::Error for PerfDataError {}

/// Little-endian field reads from a byte slice; `None` when out of bounds.
fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        data.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        data.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        data.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The bytes up to the first NUL (or all of them).
fn c_string(bytes: &[u8]) -> &[u8] {
    match bytes.iter().position(|&b| b == 0) {
        Some(end) => &bytes[..end],
        None => bytes,
    }
}

/// A `perf_file_section`: an (offset, size) range of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSection {
    /// File offset.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

impl FileSection {
    fn read(data: &[u8], at: usize) -> Option<Self> {
        Some(FileSection {
            offset: u64_at(data, at)?,
            size: u64_at(data, at.checked_add(8)?)?,
        })
    }

    fn slice<'data>(
        &self,
        data: &'data [u8],
        name: &'static str,
        entry_offset: u64,
    ) -> Result<&'data [u8], PerfDataError> {
        let end = self.offset.checked_add(self.size);
        match end {
            Some(end) if end <= data.len() as u64 => Ok(&data[self.offset as usize..end as usize]),
            _ => Err(PerfDataError::new(
                entry_offset,
                PerfDataErrorKind::SectionOutOfBounds {
                    section: name,
                    end: end.unwrap_or(u64::MAX),
                    file_len: data.len() as u64,
                },
            )),
        }
    }
}

/// The fields of a `perf_event_attr` this reader uses, plus the attr's raw bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventAttr<'data> {
    /// File offset of the attr.
    pub offset: u64,
    /// PMU type (`intel_pt` has a dynamic type; see [`IntelPtInfo::pmu_type`]).
    pub kind: u32,
    /// `config`: for `intel_pt`, the IA32_RTIT_CTL bits requested.
    pub config: u64,
    /// `sample_type` (`PERF_SAMPLE_*` bits).
    pub sample_type: u64,
    /// The flag bitfield (disabled, inherit, ..., `sample_id_all` = bit 18, ...).
    pub flags: u64,
    /// The raw attr (its own `size` bytes).
    pub raw: &'data [u8],
}

impl<'data> EventAttr<'data> {
    /// Parses an attr at `bytes` (which may be longer than the attr).
    fn parse(bytes: &'data [u8], offset: u64) -> Option<Self> {
        let size = u32_at(bytes, 4)? as usize;
        // PERF_ATTR_SIZE_VER0 is 64 bytes; older files may store 0 meaning VER0.
        let size = if size == 0 { 64 } else { size };
        let raw = bytes.get(..size)?;
        Some(EventAttr {
            offset,
            kind: u32_at(raw, 0)?,
            config: u64_at(raw, 8)?,
            sample_type: u64_at(raw, 24)?,
            flags: u64_at(raw, 40)?,
            raw,
        })
    }

    /// Whether non-sample records of this event carry the sample_id trailer.
    pub fn sample_id_all(&self) -> bool {
        self.flags & ATTR_FLAG_SAMPLE_ID_ALL != 0
    }
}

/// One attr of the file with the sample ids that belong to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttrEntry<'data> {
    /// The attr.
    pub attr: EventAttr<'data>,
    /// The ids records of this event carry in their sample_id.
    pub ids: Vec<u64>,
}

/// How to read sample_id trailers, learnt from the attrs.
#[derive(Debug, Clone, Default)]
struct SampleIdLayout {
    /// (id, sample_type, sample_id_all) per known id.
    by_id: Vec<(u64, u64, bool)>,
    /// The first attr's (sample_type, sample_id_all): used when records carry no IDENTIFIER.
    first: Option<(u64, bool)>,
    /// Whether every attr has `PERF_SAMPLE_IDENTIFIER` (then the trailer's last u64 is the id).
    all_identifier: bool,
}

impl SampleIdLayout {
    fn add(&mut self, attr: &EventAttr<'_>, ids: &[u64]) {
        let has_identifier = attr.sample_type & SAMPLE_IDENTIFIER != 0;
        if self.first.is_none() {
            self.all_identifier = has_identifier;
            self.first = Some((attr.sample_type, attr.sample_id_all()));
        } else {
            self.all_identifier &= has_identifier;
        }
        for &id in ids {
            self.by_id
                .push((id, attr.sample_type, attr.sample_id_all()));
        }
    }

    /// Parses the trailer at the end of `body` (the record bytes after the header).
    fn parse(&self, body: &[u8]) -> Option<SampleId> {
        let (sample_type, id_all) = if self.all_identifier {
            let id = u64_at(body, body.len().checked_sub(8)?)?;
            match self.by_id.iter().find(|(known, _, _)| *known == id) {
                Some(&(_, st, all)) => (st, all),
                None => self.first?,
            }
        } else {
            self.first?
        };
        if !id_all {
            return None;
        }
        parse_sample_id(sample_type, body)
    }
}

/// A parsed perf.data file (borrowing the file's bytes).
#[derive(Debug, Clone)]
pub struct PerfData<'data> {
    data: &'data [u8],
    pipe: bool,
    /// File mode: the attr entries from the attrs section.
    attrs: Vec<AttrEntry<'data>>,
    /// Where the records start and where they are declared to end.
    records_start: u64,
    records_end: u64,
    /// File mode: the feature bitmap and where its sections start.
    features: [u64; 4],
    features_offset: u64,
}

impl<'data> PerfData<'data> {
    /// Whether `data` starts with the perf.data magic (either byte order).
    pub fn is_perf_data(data: &[u8]) -> bool {
        data.len() >= 8 && (&data[..8] == b"PERFILE2" || &data[..8] == b"2ELIFREP")
    }

    /// Parses the file header (and, in file mode, the attrs section). Records are read lazily.
    pub fn parse(data: &'data [u8]) -> Result<Self, PerfDataError> {
        let magic = u64_at(data, 0).ok_or(PerfDataError::new(
            0,
            PerfDataErrorKind::HeaderTruncated { needed: 8 },
        ))?;
        if magic != MAGIC {
            let kind = if magic.swap_bytes() == MAGIC {
                PerfDataErrorKind::BigEndian
            } else {
                PerfDataErrorKind::BadMagic
            };
            return Err(PerfDataError::new(0, kind));
        }
        let size = u64_at(data, 8).ok_or(PerfDataError::new(
            8,
            PerfDataErrorKind::HeaderTruncated { needed: 16 },
        ))?;
        if size == PIPE_HEADER_SIZE {
            return Ok(PerfData {
                data,
                pipe: true,
                attrs: Vec::new(),
                records_start: PIPE_HEADER_SIZE,
                records_end: data.len() as u64,
                features: [0; 4],
                features_offset: 0,
            });
        }
        if size < FILE_HEADER_SIZE {
            return Err(PerfDataError::new(
                8,
                PerfDataErrorKind::BadHeaderSize { size },
            ));
        }
        if (data.len() as u64) < FILE_HEADER_SIZE {
            return Err(PerfDataError::new(
                0,
                PerfDataErrorKind::HeaderTruncated {
                    needed: FILE_HEADER_SIZE,
                },
            ));
        }
        // The header is at least FILE_HEADER_SIZE bytes long here, so these reads cannot fail.
        let field = |at: usize| u64_at(data, at).unwrap_or(0);
        let attr_size = field(16);
        let attrs_section =
            FileSection::read(data, 24).unwrap_or(FileSection { offset: 0, size: 0 });
        let data_section =
            FileSection::read(data, 40).unwrap_or(FileSection { offset: 0, size: 0 });
        let mut features = [0u64; 4];
        for (i, word) in features.iter_mut().enumerate() {
            *word = field(72 + 8 * i);
        }

        let attrs_bytes = attrs_section.slice(data, "attrs", 24)?;
        if attrs_section.size > 0
            && (attr_size < SECTION_SIZE + 64 || attrs_section.size % attr_size != 0)
        {
            return Err(PerfDataError::new(
                16,
                PerfDataErrorKind::BadAttrSize { attr_size },
            ));
        }
        let mut attrs = Vec::new();
        if attrs_section.size > 0 {
            for (i, entry) in attrs_bytes.chunks_exact(attr_size as usize).enumerate() {
                let entry_offset = attrs_section.offset + i as u64 * attr_size;
                let attr_bytes = &entry[..(attr_size - SECTION_SIZE) as usize];
                let attr = EventAttr::parse(attr_bytes, entry_offset).ok_or(PerfDataError::new(
                    entry_offset,
                    PerfDataErrorKind::BadAttrSize { attr_size },
                ))?;
                let ids_at = entry_offset + attr_size - SECTION_SIZE;
                let ids_section = FileSection::read(entry, (attr_size - SECTION_SIZE) as usize)
                    .unwrap_or(FileSection { offset: 0, size: 0 });
                let ids = ids_section
                    .slice(data, "attr ids", ids_at)?
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect();
                attrs.push(AttrEntry { attr, ids });
            }
        }

        // A perf killed before it rewrote the header leaves data.size = 0: the records then run to
        // the end of the file (as perf itself assumes).
        let records_start = data_section.offset;
        let records_end = if data_section.size == 0 {
            data.len() as u64
        } else {
            data_section.offset.saturating_add(data_section.size)
        };
        if records_start > data.len() as u64 {
            return Err(PerfDataError::new(
                40,
                PerfDataErrorKind::SectionOutOfBounds {
                    section: "data",
                    end: records_end,
                    file_len: data.len() as u64,
                },
            ));
        }
        Ok(PerfData {
            data,
            pipe: false,
            attrs,
            records_start,
            records_end,
            features,
            features_offset: records_end,
        })
    }

    /// Whether the file is in pipe mode.
    pub fn is_pipe(&self) -> bool {
        self.pipe
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &'data [u8] {
        self.data
    }

    /// The attrs of the attrs section (file mode; empty in pipe mode, where the attrs are
    /// [`RecordData::HeaderAttr`] records).
    pub fn attrs(&self) -> &[AttrEntry<'data>] {
        &self.attrs
    }

    /// The records, in file order.
    pub fn records(&self) -> Records<'data> {
        let mut layout = SampleIdLayout::default();
        for entry in &self.attrs {
            layout.add(&entry.attr, &entry.ids);
        }
        Records {
            data: self.data,
            offset: self.records_start,
            end: self.records_end,
            layout,
            done: false,
        }
    }

    /// Whether feature bit `feature` is set in the file header (file mode).
    pub fn has_feature(&self, feature: u32) -> bool {
        feature < FEATURE_BITS
            && self.features[(feature / 64) as usize] & (1 << (feature % 64)) != 0
    }

    /// The section of feature `feature` (file mode): the feature sections follow the data
    /// section, one `perf_file_section` per set bit, in bit order.
    pub fn feature_section(&self, feature: u32) -> Option<Result<&'data [u8], PerfDataError>> {
        if self.pipe || !self.has_feature(feature) {
            return None;
        }
        let index = (0..feature).filter(|&bit| self.has_feature(bit)).count() as u64;
        let entry_offset = self.features_offset.saturating_add(index * SECTION_SIZE);
        let Some(section) = usize::try_from(entry_offset)
            .ok()
            .and_then(|at| FileSection::read(self.data, at))
        else {
            return Some(Err(PerfDataError::new(
                entry_offset,
                PerfDataErrorKind::SectionOutOfBounds {
                    section: "feature table",
                    end: entry_offset.saturating_add(SECTION_SIZE),
                    file_len: self.data.len() as u64,
                },
            )));
        };
        Some(section.slice(self.data, "feature", entry_offset))
    }

    /// The build-id table (the `HEADER_BUILD_ID` feature, file mode). Pipe-mode files carry
    /// build ids as [`RecordData::BuildId`] records instead.
    pub fn build_ids(&self) -> Result<Vec<BuildId<'data>>, PerfDataError> {
        let Some(section) = self.feature_section(FEATURE_BUILD_ID) else {
            return Ok(Vec::new());
        };
        let section = section?;
        let base = section.as_ptr() as usize - self.data.as_ptr() as usize;
        let mut out = Vec::new();
        let mut at = 0usize;
        while at < section.len() {
            let offset = (base + at) as u64;
            let size = u16_at(section, at + 6).ok_or(PerfDataError::new(
                offset,
                PerfDataErrorKind::RecordPastEnd {
                    record_type: record_type::HEADER_BUILD_ID,
                    needed: 8,
                    available: (section.len() - at) as u64,
                },
            ))? as usize;
            if size < RECORD_HEADER_SIZE {
                return Err(PerfDataError::new(
                    offset,
                    PerfDataErrorKind::RecordTooSmall { size: size as u16 },
                ));
            }
            let record = section.get(at..at + size).ok_or(PerfDataError::new(
                offset,
                PerfDataErrorKind::RecordPastEnd {
                    record_type: record_type::HEADER_BUILD_ID,
                    needed: size as u64,
                    available: (section.len() - at) as u64,
                },
            ))?;
            let misc = u16_at(record, 4).unwrap_or(0);
            out.push(BuildId::parse(&record[RECORD_HEADER_SIZE..], misc, offset)?);
            at += size;
        }
        Ok(out)
    }

    /// A string header feature (`HEADER_CPUID`, `HEADER_CPUDESC`, `HEADER_OSRELEASE`, ...): the
    /// file-mode feature section, or the first `PERF_RECORD_HEADER_FEATURE` record for it in pipe
    /// mode. The feature's data is a `perf_header_string` (a `u32` length, then that many bytes
    /// holding a NUL-terminated, NUL-padded string). `None` when the file does not have it or
    /// its data is malformed.
    pub fn string_feature(&self, feature: u32) -> Option<&'data [u8]> {
        let data = if self.pipe {
            self.records().find_map(|r| match r {
                Ok(Record {
                    data: RecordData::Feature { feature: f, data },
                    ..
                }) if f == u64::from(feature) => Some(data),
                _ => None,
            })?
        } else {
            self.feature_section(feature)?.ok()?
        };
        let len = u32_at(data, 0)? as usize;
        let bytes = data.get(4..4usize.checked_add(len)?)?;
        Some(c_string(bytes))
    }

    /// The CPU the file was recorded on, as perf writes it in `HEADER_CPUID`: on x86
    /// `VENDOR,FAMILY,MODEL,STEPPING` (e.g. `GenuineIntel,6,94,3`).
    pub fn cpuid(&self) -> Option<&'data str> {
        std::str::from_utf8(self.string_feature(FEATURE_CPUID)?).ok()
    }

    /// Groups the `PERF_RECORD_AUXTRACE` payloads into one logical trace stream per (cpu, tid),
    /// and attributes `PERF_RECORD_AUX` loss flags and AUX offset gaps to the streams.
    ///
    /// Never fails: a framing error ends the scan and is returned in [`PerfScan::error`] (in
    /// [`AuxStreams::scan`]) with the streams gathered up to it; malformed records are collected
    /// in [`PerfScan::malformed`].
    pub fn aux_streams(&self) -> AuxStreams<'data> {
        let mut aux = AuxStreams::collect(self);
        aux.scan.features = self.feature_errors();
        aux
    }

    /// Every header feature (file mode) whose table entry or section lies outside the file.
    pub fn feature_errors(&self) -> Vec<PerfDataError> {
        (0..FEATURE_BITS)
            .filter_map(|bit| self.feature_section(bit)?.err())
            .collect()
    }
}

/// Lazy iterator over the records of a perf.data file.
///
/// Yields `Err` for a malformed record body (and continues) or for a broken framing (and stops).
#[derive(Debug, Clone)]
pub struct Records<'data> {
    data: &'data [u8],
    offset: u64,
    end: u64,
    layout: SampleIdLayout,
    done: bool,
}

impl<'data> Iterator for Records<'data> {
    type Item = Result<Record<'data>, PerfDataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let file_len = self.data.len() as u64;
        let limit = self.end.min(file_len);
        if self.offset >= limit {
            self.done = true;
            if self.end > file_len && self.offset >= file_len {
                return Some(Err(PerfDataError::new(
                    self.offset,
                    PerfDataErrorKind::DataTruncated {
                        declared_end: self.end,
                        file_len,
                    },
                )));
            }
            return None;
        }
        let offset = self.offset;
        let at = offset as usize;
        let available = limit - offset;
        let fail = |this: &mut Self, kind| {
            this.done = true;
            Some(Err(PerfDataError::new(offset, kind)))
        };
        if available < RECORD_HEADER_SIZE as u64 {
            return fail(
                self,
                PerfDataErrorKind::RecordPastEnd {
                    record_type: u32_at(self.data, at).unwrap_or(0),
                    needed: RECORD_HEADER_SIZE as u64,
                    available,
                },
            );
        }
        // In bounds: checked above.
        let kind = u32_at(self.data, at).unwrap_or(0);
        let misc = u16_at(self.data, at + 4).unwrap_or(0);
        let size = u16_at(self.data, at + 6).unwrap_or(0);
        if (size as usize) < RECORD_HEADER_SIZE {
            return fail(self, PerfDataErrorKind::RecordTooSmall { size });
        }
        if size as u64 > available {
            return fail(
                self,
                PerfDataErrorKind::RecordPastEnd {
                    record_type: kind,
                    needed: size as u64,
                    available,
                },
            );
        }
        let record = &self.data[at..at + size as usize];
        let body = &record[RECORD_HEADER_SIZE..];
        // Data that follows the record without being counted in header.size.
        let trailing = match kind {
            record_type::AUXTRACE => u64_at(body, 0),
            record_type::HEADER_TRACING_DATA => u32_at(body, 0).map(u64::from),
            _ => Some(0),
        };
        let Some(trailing) = trailing else {
            // Too short to say how much follows: the framing is lost.
            return fail(
                self,
                PerfDataErrorKind::MalformedRecord {
                    record_type: kind,
                    reason: "record too short for its size field",
                },
            );
        };
        // `trailing` is a u64 read from the file (AUXTRACE's payload size): a huge value must
        // not wrap the sum (found by `fuzz/fuzz_targets/perf_data.rs`: "attempt to add with
        // overflow"; in a release build the wrapped total passed the bound check).
        let total = (size as u64).saturating_add(trailing);
        if total > available {
            return fail(
                self,
                PerfDataErrorKind::RecordPastEnd {
                    record_type: kind,
                    needed: total,
                    available,
                },
            );
        }
        let payload = &self.data[at + size as usize..(offset + total) as usize];
        self.offset = offset + total;

        let sample_id = if kind < record_type::USER_TYPE_START && kind != record_type::SAMPLE {
            self.layout.parse(body).unwrap_or_default()
        } else {
            SampleId::default()
        };
        let parsed = RecordData::parse(kind, misc, offset, body, payload, offset + size as u64);
        let data = match parsed {
            Ok(data) => data,
            Err(reason) => {
                return Some(Err(PerfDataError::new(
                    offset,
                    PerfDataErrorKind::MalformedRecord {
                        record_type: kind,
                        reason,
                    },
                )));
            }
        };
        if let RecordData::HeaderAttr { attr, ids } = &data {
            let ids: Vec<u64> = ids
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            self.layout.add(attr, &ids);
        }
        Some(Ok(Record {
            offset,
            misc,
            size,
            data,
            sample_id,
        }))
    }
}

/// One record of a perf.data file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'data> {
    /// File offset of the record header.
    pub offset: u64,
    /// `header.misc` (cpumode and record-specific flags).
    pub misc: u16,
    /// `header.size` (not counting an AUXTRACE payload).
    pub size: u16,
    /// The decoded record.
    pub data: RecordData<'data>,
    /// The sample_id trailer (all `None` when the event has no `sample_id_all`).
    pub sample_id: SampleId,
}

/// The decoded body of a record. Strings (file names, comm) are raw bytes without the NUL: perf
/// does not promise UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // Field names are the kernel's; each variant documents its record.
pub enum RecordData<'data> {
    /// `PERF_RECORD_MMAP`: an executable mapping.
    Mmap {
        pid: u32,
        tid: u32,
        addr: u64,
        len: u64,
        pgoff: u64,
        filename: &'data [u8],
    },
    /// `PERF_RECORD_MMAP2`: a mapping with device/inode (or build id) and protection.
    Mmap2 {
        pid: u32,
        tid: u32,
        addr: u64,
        len: u64,
        pgoff: u64,
        /// Build id, when the record carries one instead of device/inode.
        build_id: Option<&'data [u8]>,
        prot: u32,
        flags: u32,
        filename: &'data [u8],
    },
    /// `PERF_RECORD_COMM`: a thread's name (`exec` set when it comes from an exec).
    Comm {
        pid: u32,
        tid: u32,
        comm: &'data [u8],
        exec: bool,
    },
    /// `PERF_RECORD_EXIT`.
    Exit {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
        time: u64,
    },
    /// `PERF_RECORD_FORK`.
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
        time: u64,
    },
    /// `PERF_RECORD_LOST`: the kernel dropped `lost` records.
    Lost { id: u64, lost: u64 },
    /// `PERF_RECORD_AUX`: new data in the AUX area, with loss flags ([`aux_flag`]).
    Aux {
        aux_offset: u64,
        aux_size: u64,
        flags: u64,
    },
    /// `PERF_RECORD_ITRACE_START`: tracing started for a thread.
    ItraceStart { pid: u32, tid: u32 },
    /// `PERF_RECORD_SWITCH`: a context switch of the traced thread.
    Switch { out: bool, preempt: bool },
    /// `PERF_RECORD_SWITCH_CPU_WIDE`: a context switch on a CPU, naming the other thread.
    SwitchCpuWide {
        out: bool,
        preempt: bool,
        next_prev_pid: u32,
        next_prev_tid: u32,
    },
    /// `PERF_RECORD_AUXTRACE`: a chunk of trace data (`data`, at file offset `data_offset`).
    Auxtrace(Auxtrace<'data>),
    /// `PERF_RECORD_AUXTRACE_INFO`: the trace configuration.
    AuxtraceInfo(AuxtraceInfo<'data>),
    /// `PERF_RECORD_TIME_CONV`: perf time ↔ TSC conversion.
    TimeConv {
        time_shift: u64,
        time_mult: u64,
        time_zero: u64,
    },
    /// `PERF_RECORD_HEADER_ATTR` (pipe mode): an attr and the raw `u64` ids of its event.
    HeaderAttr {
        attr: EventAttr<'data>,
        ids: &'data [u8],
    },
    /// `PERF_RECORD_HEADER_BUILD_ID` (pipe mode).
    BuildId(BuildId<'data>),
    /// `PERF_RECORD_HEADER_FEATURE` (pipe mode): one header feature.
    Feature { feature: u64, data: &'data [u8] },
    /// `PERF_RECORD_FINISHED_ROUND`.
    FinishedRound,
    /// `PERF_RECORD_SAMPLE` (not decoded; the body depends on the event's sample_type).
    Sample { body: &'data [u8] },
    /// Any other record type, stepped over by size (`trailing`: bytes after the record, e.g.
    /// tracing data).
    Other {
        kind: u32,
        body: &'data [u8],
        trailing: &'data [u8],
    },
}

/// A `PERF_RECORD_AUXTRACE` record and the trace bytes that follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Auxtrace<'data> {
    /// Position of the data in the AUX area (monotonic per mmap; gaps mean lost data).
    pub aux_offset: u64,
    /// perf's reference (a TSC value or a counter).
    pub reference: u64,
    /// The mmap index (one per CPU in per-CPU mode, per thread with `--per-thread`).
    pub idx: u32,
    /// Thread id (`u32::MAX` = -1 when not per-thread).
    pub tid: u32,
    /// CPU (`u32::MAX` = -1 in per-thread mode).
    pub cpu: u32,
    /// The trace bytes (`size` of them, including perf's zero padding to 8 bytes).
    pub data: &'data [u8],
    /// File offset of `data`.
    pub data_offset: u64,
}

/// A `PERF_RECORD_AUXTRACE_INFO` record: the trace type and its private configuration array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuxtraceInfo<'data> {
    /// `PERF_AUXTRACE_*` type (1 = Intel PT).
    pub kind: u32,
    /// The raw `priv[]` array (`u64` entries).
    pub priv_bytes: &'data [u8],
}

impl AuxtraceInfo<'_> {
    /// Entry `index` of `priv[]`, if present.
    pub fn priv_entry(&self, index: usize) -> Option<u64> {
        u64_at(self.priv_bytes, index.checked_mul(8)?)
    }

    /// The Intel PT view of `priv[]` (perf `intel-pt.h` order), when `kind` is Intel PT.
    /// Entries missing from older perf versions are `None`.
    pub fn intel_pt(&self) -> Option<IntelPtInfo> {
        if self.kind != AUXTRACE_TYPE_INTEL_PT {
            return None;
        }
        let e = |i| self.priv_entry(i);
        Some(IntelPtInfo {
            pmu_type: e(0)?,
            time_shift: e(1)?,
            time_mult: e(2)?,
            time_zero: e(3)?,
            cap_user_time_zero: e(4)?,
            tsc_bit: e(5)?,
            noretcomp_bit: e(6)?,
            have_sched_switch: e(7)?,
            snapshot_mode: e(8)?,
            per_cpu_mmaps: e(9)?,
            mtc_bit: e(10),
            mtc_freq_bits: e(11),
            tsc_ctc_ratio_n: e(12),
            tsc_ctc_ratio_d: e(13),
            cyc_bit: e(14),
            max_non_turbo_ratio: e(15),
            filter_str_len: e(16),
        })
    }
}

/// Intel PT's `PERF_RECORD_AUXTRACE_INFO` private data (perf `tools/perf/util/intel-pt.h`).
/// The `*_bit` fields are masks of the attr `config` bits meaning that feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // Field names are perf's INTEL_PT_* priv indexes.
pub struct IntelPtInfo {
    pub pmu_type: u64,
    pub time_shift: u64,
    pub time_mult: u64,
    pub time_zero: u64,
    pub cap_user_time_zero: u64,
    pub tsc_bit: u64,
    pub noretcomp_bit: u64,
    pub have_sched_switch: u64,
    pub snapshot_mode: u64,
    pub per_cpu_mmaps: u64,
    pub mtc_bit: Option<u64>,
    pub mtc_freq_bits: Option<u64>,
    pub tsc_ctc_ratio_n: Option<u64>,
    pub tsc_ctc_ratio_d: Option<u64>,
    pub cyc_bit: Option<u64>,
    pub max_non_turbo_ratio: Option<u64>,
    pub filter_str_len: Option<u64>,
}

/// A build-id entry (`struct perf_record_header_build_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildId<'data> {
    /// File offset of the entry.
    pub offset: u64,
    /// Process id (-1 for the kernel / all processes).
    pub pid: i32,
    /// The build id bytes (20 for SHA-1 unless the entry says otherwise).
    pub build_id: &'data [u8],
    /// The file's path.
    pub filename: &'data [u8],
}

impl<'data> BuildId<'data> {
    fn parse(body: &'data [u8], misc: u16, offset: u64) -> Result<Self, PerfDataError> {
        let malformed = || {
            PerfDataError::new(
                offset,
                PerfDataErrorKind::MalformedRecord {
                    record_type: record_type::HEADER_BUILD_ID,
                    reason: "build-id record shorter than its fixed fields",
                },
            )
        };
        let pid = u32_at(body, 0).ok_or_else(malformed)? as i32;
        let id_area = body.get(4..28).ok_or_else(malformed)?;
        let len = if misc & MISC_BUILD_ID_SIZE != 0 {
            (id_area[20] as usize).min(20)
        } else {
            20
        };
        Ok(BuildId {
            offset,
            pid,
            build_id: &id_area[..len],
            filename: c_string(&body[28..]),
        })
    }
}

impl<'data> RecordData<'data> {
    /// Decodes the body of a record at file offset `offset`.
    fn parse(
        kind: u32,
        misc: u16,
        offset: u64,
        body: &'data [u8],
        trailing: &'data [u8],
        trailing_offset: u64,
    ) -> Result<Self, &'static str> {
        use record_type as t;
        const SHORT: &str = "record shorter than its fixed fields";
        let r32 = |at| u32_at(body, at).ok_or(SHORT);
        let r64 = |at| u64_at(body, at).ok_or(SHORT);
        Ok(match kind {
            t::MMAP => RecordData::Mmap {
                pid: r32(0)?,
                tid: r32(4)?,
                addr: r64(8)?,
                len: r64(16)?,
                pgoff: r64(24)?,
                filename: c_string(&body[32..]),
            },
            t::MMAP2 => {
                // pid, tid, addr, len, pgoff (32 bytes), then either maj, min, ino,
                // ino_generation or (MISC_MMAP_BUILD_ID) build_id_size, 3 reserved bytes and
                // 20 build-id bytes (24 bytes either way), then prot, flags, filename.
                let build_id = if misc & MISC_MMAP_BUILD_ID != 0 {
                    let len = (*body.get(32).ok_or(SHORT)? as usize).min(20);
                    Some(body.get(36..36 + len).ok_or(SHORT)?)
                } else {
                    None
                };
                RecordData::Mmap2 {
                    pid: r32(0)?,
                    tid: r32(4)?,
                    addr: r64(8)?,
                    len: r64(16)?,
                    pgoff: r64(24)?,
                    build_id,
                    prot: r32(56)?,
                    flags: r32(60)?,
                    filename: c_string(&body[64..]),
                }
            }
            t::COMM => RecordData::Comm {
                pid: r32(0)?,
                tid: r32(4)?,
                comm: c_string(body.get(8..).ok_or(SHORT)?),
                exec: misc & MISC_COMM_EXEC != 0,
            },
            t::EXIT | t::FORK => {
                let (pid, ppid, tid, ptid, time) = (r32(0)?, r32(4)?, r32(8)?, r32(12)?, r64(16)?);
                if kind == t::EXIT {
                    RecordData::Exit {
                        pid,
                        ppid,
                        tid,
                        ptid,
                        time,
                    }
                } else {
                    RecordData::Fork {
                        pid,
                        ppid,
                        tid,
                        ptid,
                        time,
                    }
                }
            }
            t::LOST => RecordData::Lost {
                id: r64(0)?,
                lost: r64(8)?,
            },
            t::AUX => RecordData::Aux {
                aux_offset: r64(0)?,
                aux_size: r64(8)?,
                flags: r64(16)?,
            },
            t::ITRACE_START => RecordData::ItraceStart {
                pid: r32(0)?,
                tid: r32(4)?,
            },
            t::SWITCH => RecordData::Switch {
                out: misc & MISC_SWITCH_OUT != 0,
                preempt: misc & MISC_SWITCH_OUT_PREEMPT != 0,
            },
            t::SWITCH_CPU_WIDE => RecordData::SwitchCpuWide {
                out: misc & MISC_SWITCH_OUT != 0,
                preempt: misc & MISC_SWITCH_OUT_PREEMPT != 0,
                next_prev_pid: r32(0)?,
                next_prev_tid: r32(4)?,
            },
            t::AUXTRACE => RecordData::Auxtrace(Auxtrace {
                aux_offset: r64(8)?,
                reference: r64(16)?,
                idx: r32(24)?,
                tid: r32(28)?,
                cpu: r32(32)?,
                data: trailing,
                data_offset: trailing_offset,
            }),
            t::AUXTRACE_INFO => RecordData::AuxtraceInfo(AuxtraceInfo {
                kind: r32(0)?,
                priv_bytes: body.get(8..).ok_or(SHORT)?,
            }),
            t::TIME_CONV => RecordData::TimeConv {
                time_shift: r64(0)?,
                time_mult: r64(8)?,
                time_zero: r64(16)?,
            },
            t::HEADER_ATTR => {
                let attr = EventAttr::parse(body, offset + RECORD_HEADER_SIZE as u64)
                    .ok_or("attr record shorter than its attr")?;
                let ids = &body[attr.raw.len()..];
                RecordData::HeaderAttr { attr, ids }
            }
            t::HEADER_BUILD_ID => {
                RecordData::BuildId(BuildId::parse(body, misc, offset).map_err(|_| SHORT)?)
            }
            t::HEADER_FEATURE => RecordData::Feature {
                feature: r64(0)?,
                data: &body[8..],
            },
            t::FINISHED_ROUND => RecordData::FinishedRound,
            t::SAMPLE => RecordData::Sample { body },
            _ => RecordData::Other {
                kind,
                body,
                trailing,
            },
        })
    }
}

/// Which stream an AUXTRACE chunk belongs to: its CPU (per-CPU mode) and thread (per-thread
/// mode). perf writes -1 for the one that does not apply; it is `None` here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    /// The CPU, in per-CPU mode.
    pub cpu: Option<u32>,
    /// The thread, in per-thread mode (and the traced thread in per-CPU mode of one task).
    pub tid: Option<u32>,
}

impl StreamKey {
    fn from_auxtrace(aux: &Auxtrace<'_>) -> Self {
        let opt = |v: u32| (v != u32::MAX).then_some(v);
        StreamKey {
            cpu: opt(aux.cpu),
            tid: opt(aux.tid),
        }
    }
}

/// One AUXTRACE payload inside a logical stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuxChunk {
    /// Offset of the chunk's first byte in the concatenated stream.
    pub stream_offset: u64,
    /// File offset of the chunk's first byte.
    pub file_offset: u64,
    /// AUX area offset of the chunk's first byte (the record's `offset`).
    pub aux_offset: u64,
    /// Size in bytes.
    pub size: u64,
    /// File offset of the `PERF_RECORD_AUXTRACE` record.
    pub record_offset: u64,
}

/// Why some trace data is missing from a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossKind {
    /// Consecutive AUXTRACE chunks are not contiguous in the AUX area: `bytes` were never written
    /// to the file.
    Gap {
        /// Missing bytes.
        bytes: u64,
    },
    /// A chunk starts before the previous one ended (snapshot mode overlap): `bytes` are repeated.
    Overlap {
        /// Overlapping bytes.
        bytes: u64,
    },
    /// A `PERF_RECORD_AUX` had the TRUNCATED flag: the AUX buffer was full and data was dropped.
    Truncated,
    /// A `PERF_RECORD_AUX` had the PARTIAL flag: its range contains gaps.
    Partial,
}

/// A place in a stream where data was lost; decoding must resynchronise after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataLoss {
    /// What was lost.
    pub kind: LossKind,
    /// Offset in the concatenated stream where the discontinuity is (`None` when the AUX range
    /// of a flagged record is not in any chunk of the file).
    pub stream_offset: Option<u64>,
    /// File offset of the record that revealed the loss (AUXTRACE for gaps, AUX for flags).
    pub record_offset: u64,
}

/// One logical PT stream: the concatenated payloads of the AUXTRACE records of one (cpu, tid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuxStream<'data> {
    /// The stream's key.
    pub key: StreamKey,
    /// perf's mmap index of the first chunk.
    pub idx: u32,
    /// The bytes (borrowed when the stream is a single chunk).
    pub data: Cow<'data, [u8]>,
    /// The chunks, in stream order.
    pub chunks: Vec<AuxChunk>,
    /// Data lost in this stream, in stream order.
    pub losses: Vec<DataLoss>,
}

impl AuxStream<'_> {
    /// The chunk holding stream offset `offset`.
    pub fn chunk_at(&self, offset: u64) -> Option<&AuxChunk> {
        let i = self
            .chunks
            .partition_point(|c| c.stream_offset + c.size <= offset);
        self.chunks.get(i).filter(|c| c.stream_offset <= offset)
    }

    /// Maps a stream offset to (file offset, AUX area offset).
    pub fn locate(&self, offset: u64) -> Option<(u64, u64)> {
        let chunk = self.chunk_at(offset)?;
        let delta = offset - chunk.stream_offset;
        Some((
            chunk.file_offset + delta,
            chunk.aux_offset.wrapping_add(delta),
        ))
    }

    /// A short label: `cpu<N>` in per-CPU mode, `tid<N>` in per-thread mode.
    pub fn label(&self) -> String {
        match (self.key.cpu, self.key.tid) {
            (Some(cpu), _) => format!("cpu{cpu}"),
            (None, Some(tid)) => format!("tid{tid}"),
            (None, None) => format!("idx{}", self.idx),
        }
    }
}

/// The result of [`PerfData::aux_streams`]: the streams and what the scan found besides them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuxStreams<'data> {
    /// The streams, ordered by key.
    pub streams: Vec<AuxStream<'data>>,
    /// Everything else the scan found.
    pub scan: PerfScan,
}

/// What a scan of a perf.data file's records found besides the trace streams: configuration,
/// counts, and every problem (none of them fatal to the streams read before it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PerfScan {
    /// The Intel PT configuration, if the file has an Intel PT AUXTRACE_INFO.
    pub intel_pt: Option<IntelPtInfo>,
    /// Records read.
    pub records: u64,
    /// Records of types this reader does not decode, stepped over by size.
    pub unknown_records: u64,
    /// `PERF_RECORD_AUX` records seen.
    pub aux_records: u64,
    /// Losses flagged by AUX records that match no stream.
    pub unattributed_losses: Vec<DataLoss>,
    /// Records whose body could not be decoded (skipped).
    pub malformed: Vec<PerfDataError>,
    /// The framing error that ended the scan early, if any.
    pub error: Option<PerfDataError>,
    /// Header feature sections (file mode) that cannot be read: a file cut short after its
    /// data section loses its build ids, CPU and the rest this way.
    pub features: Vec<PerfDataError>,
}

/// A stream being assembled by [`AuxStreams::collect`].
struct StreamBuilder<'data> {
    key: StreamKey,
    idx: u32,
    parts: Vec<&'data [u8]>,
    chunks: Vec<AuxChunk>,
    losses: Vec<DataLoss>,
}

/// A `PERF_RECORD_AUX` with a loss flag, attributed to a stream once all streams are known (AUX
/// records precede the AUXTRACE records carrying their data).
struct FlaggedAux {
    sid: SampleId,
    /// AUX offset just past the flagged range.
    end: u64,
    kind: LossKind,
    record_offset: u64,
}

impl<'data> AuxStreams<'data> {
    fn collect(file: &PerfData<'data>) -> Self {
        let mut streams = Vec::new();
        let mut out = PerfScan::default();
        // (key, parts, losses) per stream, in first-seen order; concatenated at the end.
        let mut building: Vec<StreamBuilder<'data>> = Vec::new();
        let mut flagged: Vec<FlaggedAux> = Vec::new();
        for item in file.records() {
            let record = match item {
                Ok(record) => record,
                Err(err) if err.is_recoverable() => {
                    out.malformed.push(err);
                    continue;
                }
                Err(err) => {
                    out.error = Some(err);
                    break;
                }
            };
            out.records += 1;
            match record.data {
                RecordData::Auxtrace(aux) => {
                    let key = StreamKey::from_auxtrace(&aux);
                    let slot = match building.iter().position(|b| b.key == key) {
                        Some(i) => i,
                        None => {
                            building.push(StreamBuilder {
                                key,
                                idx: aux.idx,
                                parts: Vec::new(),
                                chunks: Vec::new(),
                                losses: Vec::new(),
                            });
                            building.len() - 1
                        }
                    };
                    let StreamBuilder {
                        parts,
                        chunks,
                        losses,
                        ..
                    } = &mut building[slot];
                    let stream_offset = chunks.last().map_or(0, |c| c.stream_offset + c.size);
                    if let Some(prev) = chunks.last() {
                        let expected = prev.aux_offset.wrapping_add(prev.size);
                        let kind = if aux.aux_offset > expected {
                            Some(LossKind::Gap {
                                bytes: aux.aux_offset - expected,
                            })
                        } else if aux.aux_offset < expected {
                            Some(LossKind::Overlap {
                                bytes: expected - aux.aux_offset,
                            })
                        } else {
                            None
                        };
                        if let Some(kind) = kind {
                            losses.push(DataLoss {
                                kind,
                                stream_offset: Some(stream_offset),
                                record_offset: record.offset,
                            });
                        }
                    }
                    parts.push(aux.data);
                    chunks.push(AuxChunk {
                        stream_offset,
                        file_offset: aux.data_offset,
                        aux_offset: aux.aux_offset,
                        size: aux.data.len() as u64,
                        record_offset: record.offset,
                    });
                }
                RecordData::Aux {
                    aux_offset,
                    aux_size,
                    flags,
                } => {
                    out.aux_records += 1;
                    let end = aux_offset.wrapping_add(aux_size);
                    let sid = record.sample_id;
                    if flags & aux_flag::TRUNCATED != 0 {
                        flagged.push(FlaggedAux {
                            sid,
                            end,
                            kind: LossKind::Truncated,
                            record_offset: record.offset,
                        });
                    }
                    if flags & aux_flag::PARTIAL != 0 {
                        flagged.push(FlaggedAux {
                            sid,
                            end,
                            kind: LossKind::Partial,
                            record_offset: record.offset,
                        });
                    }
                }
                RecordData::AuxtraceInfo(info) if out.intel_pt.is_none() => {
                    out.intel_pt = info.intel_pt();
                }
                RecordData::Other { .. } => out.unknown_records += 1,
                _ => {}
            }
        }

        for FlaggedAux {
            sid,
            end,
            kind,
            record_offset,
        } in flagged
        {
            let (cpu, tid) = (sid.cpu, sid.tid);
            // Per-CPU streams match on the CPU, per-thread streams on the thread.
            let slot = building.iter().position(|b| match b.key.cpu {
                Some(c) => cpu == Some(c),
                None => b.key.tid.is_some() && b.key.tid == tid,
            });
            let Some(slot) = slot else {
                out.unattributed_losses.push(DataLoss {
                    kind,
                    stream_offset: None,
                    record_offset,
                });
                continue;
            };
            let chunks = &building[slot].chunks;
            // The loss sits right after the flagged range: map its end into the stream (an end
            // exactly at a chunk's end belongs to that chunk).
            let stream_offset = chunks
                .iter()
                .find(|c| end > c.aux_offset && end - c.aux_offset <= c.size)
                .map(|c| c.stream_offset + (end - c.aux_offset));
            building[slot].losses.push(DataLoss {
                kind,
                stream_offset,
                record_offset,
            });
        }

        building.sort_by_key(|b| b.key);
        for StreamBuilder {
            key,
            idx,
            parts,
            chunks,
            mut losses,
        } in building
        {
            losses.sort_by_key(|l| (l.stream_offset.unwrap_or(u64::MAX), l.record_offset));
            let data = if parts.len() == 1 {
                Cow::Borrowed(parts[0])
            } else {
                Cow::Owned(parts.concat())
            };
            streams.push(AuxStream {
                key,
                idx,
                data,
                chunks,
                losses,
            });
        }
        AuxStreams { streams, scan: out }
    }

    /// Total losses (in streams and unattributed).
    pub fn loss_count(&self) -> usize {
        self.streams.iter().map(|s| s.losses.len()).sum::<usize>()
            + self.scan.unattributed_losses.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::abi::{
        PERF_SAMPLE_CPU as SAMPLE_CPU, PERF_SAMPLE_TID as SAMPLE_TID,
        PERF_SAMPLE_TIME as SAMPLE_TIME,
    };

    /// Builds a record: header + body.
    fn record(kind: u32, misc: u16, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&misc.to_le_bytes());
        out.extend_from_slice(&((8 + body.len()) as u16).to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    fn auxtrace(payload: &[u8], aux_offset: u64, idx: u32, tid: u32, cpu: u32) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        body.extend_from_slice(&aux_offset.to_le_bytes());
        body.extend_from_slice(&0x1234u64.to_le_bytes());
        for v in [idx, tid, cpu, 0] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        let mut out = record(record_type::AUXTRACE, 0, &body);
        out.extend_from_slice(payload);
        out
    }

    /// A pipe-mode file with one attr (sample_type TID|TIME|CPU|IDENTIFIER, sample_id_all, id 7).
    fn pipe_file(records: &[Vec<u8>]) -> Vec<u8> {
        let mut out = b"PERFILE2".to_vec();
        out.extend_from_slice(&16u64.to_le_bytes());
        let mut attr = vec![0u8; 112];
        attr[0..4].copy_from_slice(&6u32.to_le_bytes());
        attr[4..8].copy_from_slice(&112u32.to_le_bytes());
        let st = SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU | SAMPLE_IDENTIFIER;
        attr[24..32].copy_from_slice(&st.to_le_bytes());
        attr[40..48].copy_from_slice(&ATTR_FLAG_SAMPLE_ID_ALL.to_le_bytes());
        attr.extend_from_slice(&7u64.to_le_bytes());
        out.extend(record(record_type::HEADER_ATTR, 0, &attr));
        for r in records {
            out.extend_from_slice(r);
        }
        out
    }

    fn sample_id(pid: u32, tid: u32, time: u64, cpu: u32, id: u64) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&pid.to_le_bytes());
        out.extend_from_slice(&tid.to_le_bytes());
        out.extend_from_slice(&time.to_le_bytes());
        out.extend_from_slice(&cpu.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
        out
    }

    fn aux_record(aux_offset: u64, aux_size: u64, flags: u64, cpu: u32) -> Vec<u8> {
        let mut body = Vec::new();
        for v in [aux_offset, aux_size, flags] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend(sample_id(1, 1, 99, cpu, 7));
        record(record_type::AUX, 0, &body)
    }

    #[test]
    fn rejects_bad_magic_and_big_endian() {
        let err = PerfData::parse(b"NOTPERF!\x10\0\0\0\0\0\0\0").unwrap_err();
        assert_eq!(err.kind, PerfDataErrorKind::BadMagic);
        let err = PerfData::parse(b"2ELIFREP\0\0\0\0\0\0\0\x10").unwrap_err();
        assert_eq!(err.kind, PerfDataErrorKind::BigEndian);
        let err = PerfData::parse(b"PERFILE2").unwrap_err();
        assert!(matches!(
            err.kind,
            PerfDataErrorKind::HeaderTruncated { .. }
        ));
        let mut short = b"PERFILE2".to_vec();
        short.extend_from_slice(&104u64.to_le_bytes());
        let err = PerfData::parse(&short).unwrap_err();
        assert!(matches!(
            err.kind,
            PerfDataErrorKind::HeaderTruncated { needed: 104 }
        ));
    }

    #[test]
    fn pipe_mode_records_and_sample_id() {
        let mut mmap = Vec::new();
        for v in [10u32, 11] {
            mmap.extend_from_slice(&v.to_le_bytes());
        }
        for v in [0x400000u64, 0x1000, 0] {
            mmap.extend_from_slice(&v.to_le_bytes());
        }
        mmap.extend_from_slice(b"/bin/true\0\0\0\0\0\0\0");
        mmap.extend(sample_id(10, 11, 5, 3, 7));
        let file = pipe_file(&[record(record_type::MMAP, 0, &mmap)]);
        let perf = PerfData::parse(&file).unwrap();
        assert!(perf.is_pipe());
        let records: Vec<_> = perf.records().collect::<Result<_, _>>().unwrap();
        assert_eq!(records.len(), 2);
        assert!(matches!(records[0].data, RecordData::HeaderAttr { .. }));
        assert_eq!(
            records[1].data,
            RecordData::Mmap {
                pid: 10,
                tid: 11,
                addr: 0x400000,
                len: 0x1000,
                pgoff: 0,
                filename: b"/bin/true",
            }
        );
        assert_eq!(records[1].sample_id.cpu, Some(3));
        assert_eq!(records[1].sample_id.time, Some(5));
        assert_eq!(records[1].sample_id.id, Some(7));
    }

    #[test]
    fn auxtrace_payload_is_skipped_and_streams_concatenate() {
        let file = pipe_file(&[
            auxtrace(&[1, 2, 3, 4, 5, 6, 7, 8], 0, 0, 42, 0),
            auxtrace(&[0xa; 8], 0, 1, 42, 1),
            // Unknown record type in the middle: skipped by size.
            record(200, 0, &[0xff; 16]),
            auxtrace(&[9, 10, 11, 12, 13, 14, 15, 16], 8, 0, 42, 0),
            // Gap: 8 bytes missing.
            auxtrace(&[17; 8], 24, 0, 42, 0),
        ]);
        let perf = PerfData::parse(&file).unwrap();
        let streams = perf.aux_streams();
        assert!(streams.scan.error.is_none());
        assert_eq!(streams.scan.unknown_records, 1);
        assert_eq!(streams.streams.len(), 2);
        let cpu0 = &streams.streams[0];
        assert_eq!(cpu0.label(), "cpu0");
        let mut expected: Vec<u8> = (1..=16).collect();
        expected.extend_from_slice(&[17; 8]);
        assert_eq!(&cpu0.data[..], &expected[..]);
        assert_eq!(cpu0.chunks.len(), 3);
        assert_eq!(cpu0.chunks[2].stream_offset, 16);
        assert_eq!(cpu0.chunks[2].aux_offset, 24);
        assert_eq!(
            cpu0.losses,
            vec![DataLoss {
                kind: LossKind::Gap { bytes: 8 },
                stream_offset: Some(16),
                record_offset: cpu0.chunks[2].record_offset,
            }]
        );
        // Map the first byte of the last chunk back to the file.
        let (file_off, aux_off) = cpu0.locate(17).unwrap();
        assert_eq!(file[file_off as usize], 17);
        assert_eq!(aux_off, 25);
        assert_eq!(&streams.streams[1].data[..], &[0xa; 8]);
        assert!(cpu0.locate(24).is_none());
    }

    #[test]
    fn truncated_aux_flag_is_a_loss_in_its_cpu_stream() {
        let file = pipe_file(&[
            aux_record(0, 8, aux_flag::TRUNCATED, 1),
            aux_record(8, 8, 0, 1),
            auxtrace(&[0; 16], 0, 1, u32::MAX, 1),
            aux_record(0, 8, aux_flag::TRUNCATED, 5),
        ]);
        let perf = PerfData::parse(&file).unwrap();
        let streams = perf.aux_streams();
        assert_eq!(streams.scan.aux_records, 3);
        assert_eq!(streams.streams.len(), 1);
        let s = &streams.streams[0];
        assert_eq!(
            s.key,
            StreamKey {
                cpu: Some(1),
                tid: None
            }
        );
        assert_eq!(s.losses.len(), 1);
        assert_eq!(s.losses[0].kind, LossKind::Truncated);
        assert_eq!(s.losses[0].stream_offset, Some(8));
        assert_eq!(streams.scan.unattributed_losses.len(), 1);
        assert_eq!(streams.loss_count(), 2);
    }

    #[test]
    fn record_past_end_is_an_error_with_offset() {
        let mut file = pipe_file(&[auxtrace(&[0; 16], 0, 0, 1, 0)]);
        let auxtrace_offset = file.len() - 16 - 48;
        file.truncate(file.len() - 3);
        let perf = PerfData::parse(&file).unwrap();
        let results: Vec<_> = perf.records().collect();
        assert_eq!(results.len(), 2);
        let err = results[1].clone().unwrap_err();
        assert_eq!(err.offset, auxtrace_offset as u64);
        assert_eq!(
            err.kind,
            PerfDataErrorKind::RecordPastEnd {
                record_type: record_type::AUXTRACE,
                needed: 64,
                available: 61,
            }
        );
        assert!(!err.is_recoverable());
        let streams = perf.aux_streams();
        assert_eq!(streams.scan.error, Some(err));
        assert!(streams.streams.is_empty());
    }

    #[test]
    fn zero_size_record_stops_iteration() {
        let mut file = pipe_file(&[]);
        let bad_at = file.len() as u64;
        file.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9]);
        let perf = PerfData::parse(&file).unwrap();
        let results: Vec<_> = perf.records().collect();
        assert_eq!(results.len(), 2);
        assert_eq!(
            results[1].clone().unwrap_err(),
            PerfDataError::new(bad_at, PerfDataErrorKind::RecordTooSmall { size: 0 })
        );
    }

    #[test]
    fn malformed_known_record_is_recoverable() {
        let file = pipe_file(&[
            record(record_type::MMAP, 0, &[0; 4]),
            record(record_type::FINISHED_ROUND, 0, &[]),
        ]);
        let perf = PerfData::parse(&file).unwrap();
        let results: Vec<_> = perf.records().collect();
        assert_eq!(results.len(), 3);
        let err = results[1].clone().unwrap_err();
        assert!(err.is_recoverable());
        assert!(matches!(
            results[2],
            Ok(Record {
                data: RecordData::FinishedRound,
                ..
            })
        ));
    }

    #[test]
    fn mmap2_both_layouts_switch_and_tracing_data() {
        let mmap2 = |misc: u16, id_area: [u8; 24]| {
            let mut body = Vec::new();
            for v in [5u32, 6] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            for v in [0x7f00_0000_0000u64, 0x2000, 0x1000] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            body.extend_from_slice(&id_area);
            body.extend_from_slice(&5u32.to_le_bytes()); // prot r-x
            body.extend_from_slice(&2u32.to_le_bytes()); // flags MAP_PRIVATE
            body.extend_from_slice(b"/lib/x.so\0\0\0\0\0\0\0");
            body.extend(sample_id(5, 6, 1, 0, 7));
            record(record_type::MMAP2, misc, &body)
        };
        let mut with_id = [0u8; 24];
        with_id[0] = 20;
        with_id[4..24].copy_from_slice(&[0xcd; 20]);
        // Tracing data: 8 bytes follow the record without being counted in header.size.
        let mut tracing = record(record_type::HEADER_TRACING_DATA, 0, &8u32.to_le_bytes());
        tracing.extend_from_slice(&[0xee; 8]);
        let mut build_id_body = Vec::new();
        build_id_body.extend_from_slice(&42i32.to_le_bytes());
        build_id_body.extend_from_slice(&[0x11; 24]);
        build_id_body.extend_from_slice(b"/bin/sh\0");
        let file = pipe_file(&[
            mmap2(0, [0x33; 24]),
            mmap2(MISC_MMAP_BUILD_ID, with_id),
            record(
                record_type::SWITCH,
                MISC_SWITCH_OUT,
                &sample_id(5, 6, 2, 0, 7),
            ),
            tracing,
            record(record_type::HEADER_BUILD_ID, 0, &build_id_body),
        ]);
        let perf = PerfData::parse(&file).unwrap();
        let records: Vec<_> = perf.records().collect::<Result<_, _>>().unwrap();
        assert_eq!(records.len(), 6);
        for (record, build_id) in [(&records[1], None), (&records[2], Some(&[0xcd; 20][..]))] {
            assert_eq!(
                record.data,
                RecordData::Mmap2 {
                    pid: 5,
                    tid: 6,
                    addr: 0x7f00_0000_0000,
                    len: 0x2000,
                    pgoff: 0x1000,
                    build_id,
                    prot: 5,
                    flags: 2,
                    filename: b"/lib/x.so",
                }
            );
        }
        assert_eq!(
            records[3].data,
            RecordData::Switch {
                out: true,
                preempt: false
            }
        );
        assert_eq!(records[3].sample_id.time, Some(2));
        assert!(matches!(
            records[4].data,
            RecordData::Other {
                kind: record_type::HEADER_TRACING_DATA,
                trailing: [0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee],
                ..
            }
        ));
        let RecordData::BuildId(id) = &records[5].data else {
            panic!("{:?}", records[5].data)
        };
        assert_eq!(
            (id.pid, id.build_id, id.filename),
            (42, &[0x11; 20][..], &b"/bin/sh"[..])
        );
        assert_eq!(id.offset, records[5].offset);
    }

    #[test]
    fn intel_pt_info_fields() {
        let mut body = Vec::new();
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        for v in 0..17u64 {
            body.extend_from_slice(&(100 + v).to_le_bytes());
        }
        let file = pipe_file(&[record(record_type::AUXTRACE_INFO, 0, &body)]);
        let perf = PerfData::parse(&file).unwrap();
        let info = perf.aux_streams().scan.intel_pt.unwrap();
        assert_eq!(info.pmu_type, 100);
        assert_eq!(info.tsc_bit, 105);
        assert_eq!(info.max_non_turbo_ratio, Some(115));
        assert_eq!(info.filter_str_len, Some(116));
    }

    /// A minimal file-mode perf.data: one attr, one AUXTRACE, a build-id feature.
    #[test]
    fn file_mode_sections_and_build_ids() {
        let attr_size = 112 + 16;
        let attrs_offset = 104u64;
        let ids_offset = attrs_offset + attr_size;
        let data_offset = ids_offset + 8;
        let records = auxtrace(&[0x42; 8], 0, 2, 9, 2);
        let feat_offset = data_offset + records.len() as u64;
        let mut build_id_body = Vec::new();
        build_id_body.extend_from_slice(&(-1i32).to_le_bytes());
        build_id_body.extend_from_slice(&[0xab; 20]);
        build_id_body.extend_from_slice(&[0; 4]);
        build_id_body.extend_from_slice(b"[kernel.kallsyms]\0\0\0\0\0\0\0");
        let build_id = record(record_type::HEADER_BUILD_ID, 1, &build_id_body);

        let mut file = b"PERFILE2".to_vec();
        for v in [
            104u64,
            attr_size,
            attrs_offset,
            attr_size,
            data_offset,
            records.len() as u64,
            0,
            0,
        ] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        file.extend_from_slice(&(1u64 << FEATURE_BUILD_ID).to_le_bytes());
        file.extend_from_slice(&[0; 24]);
        let mut attr = vec![0u8; 112];
        attr[4..8].copy_from_slice(&112u32.to_le_bytes());
        file.extend_from_slice(&attr);
        file.extend_from_slice(&ids_offset.to_le_bytes());
        file.extend_from_slice(&8u64.to_le_bytes());
        file.extend_from_slice(&77u64.to_le_bytes());
        file.extend_from_slice(&records);
        let sections_end = feat_offset + 16;
        file.extend_from_slice(&sections_end.to_le_bytes());
        file.extend_from_slice(&(build_id.len() as u64).to_le_bytes());
        file.extend_from_slice(&build_id);

        let perf = PerfData::parse(&file).unwrap();
        assert!(!perf.is_pipe());
        assert_eq!(perf.attrs().len(), 1);
        assert_eq!(perf.attrs()[0].ids, vec![77]);
        let streams = perf.aux_streams();
        assert_eq!(streams.streams.len(), 1);
        assert_eq!(streams.streams[0].label(), "cpu2");
        assert_eq!(&streams.streams[0].data[..], &[0x42; 8]);
        let ids = perf.build_ids().unwrap();
        assert_eq!(ids.len(), 1);
        assert_eq!(ids[0].pid, -1);
        assert_eq!(ids[0].build_id, &[0xab; 20]);
        assert_eq!(ids[0].filename, b"[kernel.kallsyms]");

        // Cut the file inside the data section: the truncation is reported, not a panic.
        let cut = &file[..(data_offset + 20) as usize];
        let perf = PerfData::parse(cut).unwrap();
        let err = perf.records().last().unwrap().unwrap_err();
        assert_eq!(err.offset, data_offset);
        assert!(matches!(err.kind, PerfDataErrorKind::RecordPastEnd { .. }));
        // Cut right after the data: the declared size exceeds the file.
        let mut bad = file[..feat_offset as usize].to_vec();
        bad[48..56].copy_from_slice(&(records.len() as u64 + 64).to_le_bytes());
        let perf = PerfData::parse(&bad).unwrap();
        let err = perf.records().last().unwrap().unwrap_err();
        assert!(matches!(err.kind, PerfDataErrorKind::DataTruncated { .. }));
    }
}
