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

mod records;
mod streams;
mod switches;
#[cfg(test)]
mod tests;

pub use records::*;
pub use streams::*;
pub use switches::*;
