//! The PT byte streams of a perf.data file: AUXTRACE chunks grouped by CPU or thread
//! ([`AuxStreams`]), payloads split over several records concatenated, and every loss
//! (truncated or lost AUX data, overlapping chunks) counted where it happened.

use super::*;
use crate::packet::time::TimingConfig;

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
    /// The `config` (IA32_RTIT_CTL bits) of the `intel_pt` event's attr, when an attr of the
    /// AUXTRACE_INFO's PMU type is in the file.
    pub pt_config: Option<u64>,
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

impl PerfScan {
    /// The parameters that turn the trace's timing packets into TSC time: the TSC:CTC ratio
    /// and the maximum non-turbo ratio of the AUXTRACE_INFO, and the MTC period N of the
    /// event's `config` (the AUXTRACE_INFO names its bits). Defaults (no MTC or CYC time) for
    /// what the file does not say.
    pub fn timing(&self) -> TimingConfig {
        let mut timing = TimingConfig::default();
        let Some(info) = self.intel_pt else {
            return timing;
        };
        if let (Some(n), Some(d)) = (info.tsc_ctc_ratio_n, info.tsc_ctc_ratio_d)
            && let (Ok(n), Ok(d)) = (u32::try_from(n), u32::try_from(d))
        {
            timing.ctc_ratio = (n, d);
        }
        if let Some(m) = info.max_non_turbo_ratio.and_then(|m| u8::try_from(m).ok()) {
            timing.max_nonturbo_ratio = m;
        }
        if let (Some(mask), Some(config)) = (info.mtc_freq_bits, self.pt_config)
            && mask != 0
        {
            timing.mtc_freq = ((config & mask) >> mask.trailing_zeros()) as u8;
        }
        timing
    }
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
    pub(super) fn collect(file: &PerfData<'data>) -> Self {
        let mut streams = Vec::new();
        let mut out = PerfScan::default();
        // (key, parts, losses) per stream, in first-seen order; concatenated at the end.
        let mut building: Vec<StreamBuilder<'data>> = Vec::new();
        let mut flagged: Vec<FlaggedAux> = Vec::new();
        // (PMU type, config) of every attr: the file's attrs section, or pipe mode's records.
        let mut configs: Vec<(u32, u64)> = file
            .attrs()
            .iter()
            .map(|a| (a.attr.kind, a.attr.config))
            .collect();
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
                RecordData::HeaderAttr { attr, .. } => configs.push((attr.kind, attr.config)),
                RecordData::Other { .. } => out.unknown_records += 1,
                _ => {}
            }
        }

        out.pt_config = out.intel_pt.and_then(|info| {
            configs
                .iter()
                .find(|(kind, _)| u64::from(*kind) == info.pmu_type)
                .map(|&(_, config)| config)
        });
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
