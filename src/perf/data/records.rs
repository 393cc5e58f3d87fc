//! The records of a perf.data file: the lazy [`Records`] iterator and what each record type
//! carries ([`RecordData`]: AUXTRACE payloads, AUXTRACE_INFO with Intel PT's parameters,
//! build ids, sideband).

use super::*;

/// Lazy iterator over the records of a perf.data file.
///
/// Yields `Err` for a malformed record body (and continues) or for a broken framing (and stops).
#[derive(Debug, Clone)]
pub struct Records<'data> {
    pub(super) data: &'data [u8],
    pub(super) offset: u64,
    pub(super) end: u64,
    pub(super) layout: SampleIdLayout,
    pub(super) done: bool,
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
    pub(super) fn parse(body: &'data [u8], misc: u16, offset: u64) -> Result<Self, PerfDataError> {
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
