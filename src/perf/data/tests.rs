use super::*;
use crate::perf::abi::{
    PERF_SAMPLE_CPU as SAMPLE_CPU, PERF_SAMPLE_TID as SAMPLE_TID, PERF_SAMPLE_TIME as SAMPLE_TIME,
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
