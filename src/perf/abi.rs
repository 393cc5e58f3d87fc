//! Kernel perf ABI: record types, flags and the `sample_id` trailer of non-sample records.
//!
//! The values come from `perf-event-open-sys`'s bindgen output of `linux/perf_event.h`; only what
//! the kernel header does not define (perf-tool record types, `PERF_RECORD_MISC_BUILD_ID_SIZE`)
//! is written here by hand.

use perf_event_open_sys::bindings as b;

/// `PERF_RECORD_MMAP`.
pub const PERF_RECORD_MMAP: u32 = b::PERF_RECORD_MMAP;
/// `PERF_RECORD_LOST`: `{ header; u64 id; u64 lost; sample_id }`.
pub const PERF_RECORD_LOST: u32 = b::PERF_RECORD_LOST;
/// `PERF_RECORD_COMM`.
pub const PERF_RECORD_COMM: u32 = b::PERF_RECORD_COMM;
/// `PERF_RECORD_EXIT`.
pub const PERF_RECORD_EXIT: u32 = b::PERF_RECORD_EXIT;
/// `PERF_RECORD_FORK`.
pub const PERF_RECORD_FORK: u32 = b::PERF_RECORD_FORK;
/// `PERF_RECORD_SAMPLE`.
pub const PERF_RECORD_SAMPLE: u32 = b::PERF_RECORD_SAMPLE;
/// `PERF_RECORD_MMAP2`.
pub const PERF_RECORD_MMAP2: u32 = b::PERF_RECORD_MMAP2;
/// `PERF_RECORD_AUX`: `{ header; u64 aux_offset; u64 aux_size; u64 flags; sample_id }`.
pub const PERF_RECORD_AUX: u32 = b::PERF_RECORD_AUX;
/// `PERF_RECORD_ITRACE_START`: `{ header; u32 pid; u32 tid; sample_id }`.
pub const PERF_RECORD_ITRACE_START: u32 = b::PERF_RECORD_ITRACE_START;
/// `PERF_RECORD_LOST_SAMPLES`: `{ header; u64 lost; sample_id }`.
pub const PERF_RECORD_LOST_SAMPLES: u32 = b::PERF_RECORD_LOST_SAMPLES;
/// `PERF_RECORD_SWITCH`.
pub const PERF_RECORD_SWITCH: u32 = b::PERF_RECORD_SWITCH;
/// `PERF_RECORD_SWITCH_CPU_WIDE`.
pub const PERF_RECORD_SWITCH_CPU_WIDE: u32 = b::PERF_RECORD_SWITCH_CPU_WIDE;
/// `PERF_RECORD_AUX_OUTPUT_HW_ID`: `{ header; u64 hw_id; sample_id }`.
pub const PERF_RECORD_AUX_OUTPUT_HW_ID: u32 = b::PERF_RECORD_AUX_OUTPUT_HW_ID;

/// `sizeof(struct perf_event_header)`: `{ u32 type; u16 misc; u16 size; }`.
pub const PERF_EVENT_HEADER_SIZE: usize = std::mem::size_of::<b::perf_event_header>();

/// `PERF_AUX_FLAG_TRUNCATED`: the AUX area was full; data was lost after this record's range.
pub const PERF_AUX_FLAG_TRUNCATED: u64 = b::PERF_AUX_FLAG_TRUNCATED as u64;
/// `PERF_AUX_FLAG_OVERWRITE`: snapshot (overwrite) mode.
pub const PERF_AUX_FLAG_OVERWRITE: u64 = b::PERF_AUX_FLAG_OVERWRITE as u64;
/// `PERF_AUX_FLAG_PARTIAL`: the record contains gaps.
pub const PERF_AUX_FLAG_PARTIAL: u64 = b::PERF_AUX_FLAG_PARTIAL as u64;
/// `PERF_AUX_FLAG_COLLISION`: the sample collided with another.
pub const PERF_AUX_FLAG_COLLISION: u64 = b::PERF_AUX_FLAG_COLLISION as u64;
/// `PERF_AUX_FLAG_PMU_FORMAT_TYPE_MASK`: PMU-specific trace format type.
pub const PERF_AUX_FLAG_PMU_FORMAT_TYPE_MASK: u64 = b::PERF_AUX_FLAG_PMU_FORMAT_TYPE_MASK as u64;

/// `PERF_SAMPLE_TID`.
pub const PERF_SAMPLE_TID: u64 = b::PERF_SAMPLE_TID as u64;
/// `PERF_SAMPLE_TIME`.
pub const PERF_SAMPLE_TIME: u64 = b::PERF_SAMPLE_TIME as u64;
/// `PERF_SAMPLE_ID`.
pub const PERF_SAMPLE_ID: u64 = b::PERF_SAMPLE_ID as u64;
/// `PERF_SAMPLE_CPU`.
pub const PERF_SAMPLE_CPU: u64 = b::PERF_SAMPLE_CPU as u64;
/// `PERF_SAMPLE_STREAM_ID`.
pub const PERF_SAMPLE_STREAM_ID: u64 = b::PERF_SAMPLE_STREAM_ID as u64;
/// `PERF_SAMPLE_IDENTIFIER`.
pub const PERF_SAMPLE_IDENTIFIER: u64 = b::PERF_SAMPLE_IDENTIFIER as u64;

/// `PERF_RECORD_MISC_MMAP_BUILD_ID`: an MMAP2 carries a build id instead of device/inode.
pub const PERF_RECORD_MISC_MMAP_BUILD_ID: u16 = b::PERF_RECORD_MISC_MMAP_BUILD_ID as u16;
/// `PERF_RECORD_MISC_SWITCH_OUT`.
pub const PERF_RECORD_MISC_SWITCH_OUT: u16 = b::PERF_RECORD_MISC_SWITCH_OUT as u16;
/// `PERF_RECORD_MISC_SWITCH_OUT_PREEMPT`.
pub const PERF_RECORD_MISC_SWITCH_OUT_PREEMPT: u16 = b::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT as u16;
/// `PERF_RECORD_MISC_COMM_EXEC`.
pub const PERF_RECORD_MISC_COMM_EXEC: u16 = b::PERF_RECORD_MISC_COMM_EXEC as u16;
/// `PERF_RECORD_MISC_BUILD_ID_SIZE` (perf tool): the build-id record's size byte is valid. Not in
/// the kernel header.
pub const PERF_RECORD_MISC_BUILD_ID_SIZE: u16 = 1 << 15;

/// The `sample_id` trailer of a non-sample record (`struct sample_id` in `perf_event.h`:
/// `{pid,tid}` if `PERF_SAMPLE_TID`, `time` if `TIME`, `id` if `ID`, `stream_id` if `STREAM_ID`,
/// `{cpu,res}` if `CPU`, `id` if `IDENTIFIER`, in that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SampleId {
    /// Process id (`PERF_SAMPLE_TID`).
    pub pid: Option<u32>,
    /// Thread id (`PERF_SAMPLE_TID`).
    pub tid: Option<u32>,
    /// perf clock timestamp (`PERF_SAMPLE_TIME`).
    pub time: Option<u64>,
    /// Event id: `PERF_SAMPLE_ID`, or `PERF_SAMPLE_IDENTIFIER` when only that is sampled (the
    /// kernel writes the same id in both).
    pub id: Option<u64>,
    /// Stream id (`PERF_SAMPLE_STREAM_ID`).
    pub stream_id: Option<u64>,
    /// CPU (`PERF_SAMPLE_CPU`).
    pub cpu: Option<u32>,
    /// Identifier (`PERF_SAMPLE_IDENTIFIER`).
    pub identifier: Option<u64>,
}

/// Size in bytes of the `sample_id` trailer for `sample_type`.
pub fn sample_id_len(sample_type: u64) -> usize {
    [
        PERF_SAMPLE_TID,
        PERF_SAMPLE_TIME,
        PERF_SAMPLE_ID,
        PERF_SAMPLE_STREAM_ID,
        PERF_SAMPLE_CPU,
        PERF_SAMPLE_IDENTIFIER,
    ]
    .iter()
    .filter(|&&bit| sample_type & bit != 0)
    .count()
        * 8
}

/// Parses the `sample_id` trailer for `sample_type` at the end of `bytes`; `None` if `bytes` is
/// shorter than the trailer.
pub fn parse_sample_id(sample_type: u64, bytes: &[u8]) -> Option<SampleId> {
    let start = bytes.len().checked_sub(sample_id_len(sample_type))?;
    let mut at = start;
    let mut u64_next = || {
        let v = u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?);
        at += 8;
        Some(v)
    };
    let has = |bit: u64| sample_type & bit != 0;
    let mut out = SampleId::default();
    if has(PERF_SAMPLE_TID) {
        let v = u64_next()?;
        out.pid = Some(v as u32);
        out.tid = Some((v >> 32) as u32);
    }
    if has(PERF_SAMPLE_TIME) {
        out.time = Some(u64_next()?);
    }
    if has(PERF_SAMPLE_ID) {
        out.id = Some(u64_next()?);
    }
    if has(PERF_SAMPLE_STREAM_ID) {
        out.stream_id = Some(u64_next()?);
    }
    if has(PERF_SAMPLE_CPU) {
        // `{ u32 cpu; u32 res; }`
        out.cpu = Some(u64_next()? as u32);
    }
    if has(PERF_SAMPLE_IDENTIFIER) {
        let v = u64_next()?;
        out.identifier = Some(v);
        out.id = out.id.or(Some(v));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailer_fields_in_kernel_order() {
        let all = PERF_SAMPLE_TID
            | PERF_SAMPLE_TIME
            | PERF_SAMPLE_ID
            | PERF_SAMPLE_STREAM_ID
            | PERF_SAMPLE_CPU
            | PERF_SAMPLE_IDENTIFIER;
        assert_eq!(sample_id_len(all), 48);
        let mut b = vec![0xee; 3];
        for v in [1u32, 2] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [3u64, 4, 5] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&6u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&8u64.to_le_bytes());
        let s = parse_sample_id(all, &b).unwrap();
        assert_eq!(
            s,
            SampleId {
                pid: Some(1),
                tid: Some(2),
                time: Some(3),
                id: Some(4),
                stream_id: Some(5),
                cpu: Some(6),
                identifier: Some(8),
            }
        );
        // IDENTIFIER alone gives the event id too.
        let s = parse_sample_id(PERF_SAMPLE_IDENTIFIER, &9u64.to_le_bytes()).unwrap();
        assert_eq!((s.id, s.identifier), (Some(9), Some(9)));
        assert_eq!(parse_sample_id(all, &[0; 47]), None);
        assert_eq!(parse_sample_id(0, &[]), Some(SampleId::default()));
    }
}
