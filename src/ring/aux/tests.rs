//! Simulated `perf_event_mmap_page` + data ring + AUX area. The simulated producer follows the
//! kernel's rules (records published whole, `data_head`/`aux_head` free-running, normal-mode AUX
//! writes limited by `aux_tail` with `TRUNCATED` when short, overwrite mode ignoring the tail).

use std::mem::{offset_of, size_of};

use perf_event_open_sys::bindings::perf_event_mmap_page as KPage;

use super::*;

const TRAILER: SampleIdLayout = SampleIdLayout {
    sample_type: SampleIdLayout::TID | SampleIdLayout::TIME,
};

/// Byte `i` of the simulated trace stream: never zero (the snapshot wrap heuristic relies on the
/// kernel's zeroed pages, and real PT data after a wrap is non-zero somewhere).
fn stream_byte(i: u64) -> u8 {
    (i % 251) as u8 + 1
}

fn stream(from: u64, len: u64) -> Vec<u8> {
    (from..from + len).map(stream_byte).collect()
}

struct Sim {
    page: PerfMmapPage,
    data: Vec<u8>,
    aux: Vec<u8>,
    /// Bytes of the trace stream produced so far (the producer's ground truth).
    produced: u64,
    /// Records the producer could not fit (what the kernel reports in PERF_RECORD_LOST).
    lost_pending: u64,
}

impl Sim {
    fn new(data_size: usize, aux_size: usize) -> Self {
        let page = PerfMmapPage::zeroed();
        page.data_offset.store(4096, Ordering::Relaxed);
        page.data_size.store(data_size as u64, Ordering::Relaxed);
        page.aux_offset
            .store(4096 + data_size as u64, Ordering::Relaxed);
        page.aux_size.store(aux_size as u64, Ordering::Relaxed);
        Self {
            page,
            data: vec![0; data_size],
            aux: vec![0; aux_size],
            produced: 0,
            lost_pending: 0,
        }
    }

    fn set_data_counters(&self, at: u64) {
        self.page.data_head.store(at, Ordering::Relaxed);
        self.page.data_tail.store(at, Ordering::Relaxed);
    }

    /// Kernel side of the data ring: write a whole record at `data_head` if it fits before
    /// `data_tail`, then publish the head. Returns false (and counts it) when it does not fit.
    fn push_record(&mut self, rec: &[u8]) -> bool {
        let size = self.data.len() as u64;
        let head = self.page.data_head.load(Ordering::Relaxed);
        let tail = self.page.data_tail.load(Ordering::Acquire);
        if head - tail + rec.len() as u64 > size {
            self.lost_pending += 1;
            return false;
        }
        for (i, &b) in rec.iter().enumerate() {
            self.data[((head + i as u64) % size) as usize] = b;
        }
        self.page
            .data_head
            .store(head + rec.len() as u64, Ordering::Release);
        true
    }

    /// Normal-mode AUX write of the next `len` stream bytes: only into free space
    /// (`aux_size - (aux_head - aux_tail)`), then a PERF_RECORD_AUX with TRUNCATED if short.
    fn write_aux_full(&mut self, len: u64) -> u64 {
        let size = self.aux.len() as u64;
        let head = self.page.aux_head.load(Ordering::Relaxed);
        let tail = self.page.aux_tail.load(Ordering::Acquire);
        let free = size - (head - tail);
        let n = len.min(free);
        for i in 0..n {
            self.aux[((head + i) % size) as usize] = stream_byte(self.produced + i);
        }
        self.produced += n;
        self.page.aux_head.store(head + n, Ordering::Release);
        let flags = if n < len { AuxFlags::TRUNCATED } else { 0 };
        let rec = aux_record(head, n, flags, 7, 100 + head);
        self.push_record(&rec);
        n
    }

    /// Overwrite-mode write; `running_count` selects the generic-ABI running head, otherwise the
    /// intel_pt driver's in-buffer position.
    fn write_aux_overwrite(&mut self, len: u64, running_count: bool) {
        let size = self.aux.len() as u64;
        let head = self.page.aux_head.load(Ordering::Relaxed);
        for i in 0..len {
            self.aux[((head + i) % size) as usize] = stream_byte(self.produced + i);
        }
        self.produced += len;
        let new_head = if running_count {
            head + len
        } else {
            (head + len) % size
        };
        self.page.aux_head.store(new_head, Ordering::Release);
    }
}

fn header(type_: u32, misc: u16, size: u16) -> Vec<u8> {
    let mut v = type_.to_le_bytes().to_vec();
    v.extend_from_slice(&misc.to_le_bytes());
    v.extend_from_slice(&size.to_le_bytes());
    v
}

fn with_trailer(mut body: Vec<u8>, pid: u32, tid: u32, time: u64) -> Vec<u8> {
    body.extend_from_slice(&pid.to_le_bytes());
    body.extend_from_slice(&tid.to_le_bytes());
    body.extend_from_slice(&time.to_le_bytes());
    let size = body.len() as u16;
    body[6..8].copy_from_slice(&size.to_le_bytes());
    body
}

fn aux_record(offset: u64, size: u64, flags: u64, tid: u32, time: u64) -> Vec<u8> {
    let mut v = header(PERF_RECORD_AUX, 0, 0);
    v.extend_from_slice(&offset.to_le_bytes());
    v.extend_from_slice(&size.to_le_bytes());
    v.extend_from_slice(&flags.to_le_bytes());
    with_trailer(v, 5, tid, time)
}

fn lost_record(id: u64, lost: u64) -> Vec<u8> {
    let mut v = header(PERF_RECORD_LOST, 0, 0);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&lost.to_le_bytes());
    with_trailer(v, 5, 7, 1)
}

fn itrace_record(pid: u32, tid: u32) -> Vec<u8> {
    let mut v = header(PERF_RECORD_ITRACE_START, 0, 0);
    v.extend_from_slice(&pid.to_le_bytes());
    v.extend_from_slice(&tid.to_le_bytes());
    with_trailer(v, pid, tid, 2)
}

fn read_all(sim: &Sim, stats: &mut AuxStats) -> Result<Vec<SideRecord>, RingError> {
    let mut reader = DataRingReader::new(TRAILER);
    let mut out = Vec::new();
    reader.read(&sim.page, &sim.data, stats, |r| out.push(r.clone()))?;
    Ok(out)
}

#[test]
fn mmap_page_layout_matches_kernel_bindings() {
    assert_eq!(size_of::<PerfMmapPage>(), size_of::<KPage>());
    assert_eq!(
        std::mem::align_of::<PerfMmapPage>(),
        std::mem::align_of::<KPage>()
    );
    macro_rules! same {
        ($ours:ident, $theirs:ident, $lit:expr) => {
            assert_eq!(offset_of!(PerfMmapPage, $ours), offset_of!(KPage, $theirs));
            assert_eq!(offset_of!(PerfMmapPage, $ours), $lit, stringify!($ours));
        };
    }
    same!(version, version, 0);
    same!(compat_version, compat_version, 4);
    same!(lock, lock, 8);
    same!(index, index, 12);
    same!(offset, offset, 16);
    same!(time_enabled, time_enabled, 24);
    same!(time_running, time_running, 32);
    same!(capabilities, __bindgen_anon_1, 40);
    same!(pmc_width, pmc_width, 48);
    same!(time_shift, time_shift, 50);
    same!(time_mult, time_mult, 52);
    same!(time_offset, time_offset, 56);
    same!(time_zero, time_zero, 64);
    same!(size, size, 72);
    same!(reserved_1, __reserved_1, 76);
    same!(time_cycles, time_cycles, 80);
    same!(time_mask, time_mask, 88);
    same!(reserved, __reserved, 96);
    same!(data_head, data_head, 1024);
    same!(data_tail, data_tail, 1032);
    same!(data_offset, data_offset, 1040);
    same!(data_size, data_size, 1048);
    same!(aux_head, aux_head, 1056);
    same!(aux_tail, aux_tail, 1064);
    same!(aux_offset, aux_offset, 1072);
    same!(aux_size, aux_size, 1080);
    assert_eq!(size_of::<PerfMmapPage>(), 1088);
}

#[test]
fn record_type_and_flag_constants_match_kernel_bindings() {
    use perf_event_open_sys::bindings as b;
    assert_eq!(PERF_RECORD_LOST, b::PERF_RECORD_LOST);
    assert_eq!(PERF_RECORD_AUX, b::PERF_RECORD_AUX);
    assert_eq!(PERF_RECORD_ITRACE_START, b::PERF_RECORD_ITRACE_START);
    assert_eq!(PERF_RECORD_LOST_SAMPLES, b::PERF_RECORD_LOST_SAMPLES);
    assert_eq!(
        PERF_RECORD_AUX_OUTPUT_HW_ID,
        b::PERF_RECORD_AUX_OUTPUT_HW_ID
    );
    assert_eq!(AuxFlags::TRUNCATED, b::PERF_AUX_FLAG_TRUNCATED as u64);
    assert_eq!(AuxFlags::OVERWRITE, b::PERF_AUX_FLAG_OVERWRITE as u64);
    assert_eq!(AuxFlags::PARTIAL, b::PERF_AUX_FLAG_PARTIAL as u64);
    assert_eq!(AuxFlags::COLLISION, b::PERF_AUX_FLAG_COLLISION as u64);
    assert_eq!(
        AuxFlags::PMU_FORMAT_TYPE_MASK,
        b::PERF_AUX_FLAG_PMU_FORMAT_TYPE_MASK as u64
    );
    assert_eq!(SampleIdLayout::TID, b::PERF_SAMPLE_TID as u64);
    assert_eq!(SampleIdLayout::TIME, b::PERF_SAMPLE_TIME as u64);
    assert_eq!(SampleIdLayout::ID, b::PERF_SAMPLE_ID as u64);
    assert_eq!(SampleIdLayout::CPU, b::PERF_SAMPLE_CPU as u64);
    assert_eq!(SampleIdLayout::STREAM_ID, b::PERF_SAMPLE_STREAM_ID as u64);
    assert_eq!(SampleIdLayout::IDENTIFIER, b::PERF_SAMPLE_IDENTIFIER as u64);
    assert_eq!(PERF_EVENT_HEADER_SIZE, size_of::<b::perf_event_header>());
}

#[test]
fn data_ring_reads_records_counts_loss_and_publishes_tail() {
    let mut sim = Sim::new(256, 64);
    sim.set_data_counters(0);
    assert!(sim.push_record(&itrace_record(5, 7)));
    assert!(sim.push_record(&aux_record(0, 32, 0, 7, 10)));
    assert!(sim.push_record(&aux_record(
        32,
        16,
        AuxFlags::TRUNCATED | AuxFlags::PARTIAL,
        7,
        11
    )));
    assert!(sim.push_record(&aux_record(48, 8, AuxFlags::COLLISION, 7, 12)));
    assert!(sim.push_record(&lost_record(99, 3)));
    let head = sim.page.data_head.load(Ordering::Relaxed);
    let mut stats = AuxStats::default();
    let recs = read_all(&sim, &mut stats).unwrap();
    assert_eq!(recs.len(), 5);
    assert_eq!(
        recs[0],
        SideRecord::ItraceStart {
            pid: 5,
            tid: 7,
            sample: Some(SampleId {
                pid: Some(5),
                tid: Some(7),
                time: Some(2),
                ..SampleId::default()
            })
        }
    );
    assert!(matches!(
        recs[2],
        SideRecord::Aux { aux_offset: 32, aux_size: 16, flags, .. } if flags.truncated() && flags.partial() && !flags.collision()
    ));
    assert!(matches!(
        recs[4],
        SideRecord::Lost {
            id: 99,
            lost: 3,
            ..
        }
    ));
    assert_eq!(sim.page.data_tail.load(Ordering::Acquire), head);
    assert_eq!(
        stats,
        AuxStats {
            records: 5,
            aux_records: 3,
            aux_bytes_reported: 56,
            truncated: 1,
            partial: 1,
            collisions: 1,
            itrace_starts: 1,
            lost_records: 1,
            lost_events: 3,
            ..AuxStats::default()
        }
    );
    assert!(stats.any_loss());
    // Nothing new: a second read returns nothing and leaves the tail.
    let recs = read_all(&sim, &mut stats).unwrap();
    assert!(recs.is_empty());
    assert_eq!(sim.page.data_tail.load(Ordering::Relaxed), head);
}

#[test]
fn records_straddling_the_end_of_the_data_ring_at_every_offset() {
    // 48-byte AUX records in a 64-byte ring: for each start position the header and/or payload
    // wrap. Counters start far from zero to exercise free-running arithmetic.
    for start in 0..64u64 {
        let mut sim = Sim::new(64, 64);
        let base = (1u64 << 40) + start;
        sim.set_data_counters(base);
        let rec = aux_record(0x1234_5678, 0x42, AuxFlags::OVERWRITE, 9, start);
        assert!(sim.push_record(&rec));
        let mut stats = AuxStats::default();
        let recs = read_all(&sim, &mut stats).unwrap();
        assert_eq!(recs.len(), 1, "start {start}");
        assert_eq!(
            recs[0],
            SideRecord::Aux {
                aux_offset: 0x1234_5678,
                aux_size: 0x42,
                flags: AuxFlags(AuxFlags::OVERWRITE),
                sample: Some(SampleId {
                    pid: Some(5),
                    tid: Some(9),
                    time: Some(start),
                    ..SampleId::default()
                })
            },
            "start {start}"
        );
        assert_eq!(stats.overwrite_records, 1);
        assert_eq!(sim.page.data_tail.load(Ordering::Relaxed), base + 48);
    }
}

#[test]
fn data_ring_producer_waits_for_tail_and_kernel_lost_records_are_counted() {
    let mut sim = Sim::new(128, 64);
    sim.set_data_counters(0);
    let mut stats = AuxStats::default();
    let mut seen = 0;
    for round in 0..20u64 {
        // Two 48-byte records fit, the third does not until the reader advances the tail.
        let pushed = (0..3)
            .filter(|i| sim.push_record(&aux_record(round * 3 + i, 1, 0, 1, 0)))
            .count();
        assert_eq!(pushed, 2);
        if sim.lost_pending > 0 {
            // What the kernel does when it could not write: a PERF_RECORD_LOST once space exists.
            seen += read_all(&sim, &mut stats).unwrap().len();
            assert!(sim.push_record(&lost_record(1, sim.lost_pending)));
            sim.lost_pending = 0;
            seen += read_all(&sim, &mut stats).unwrap().len();
        }
    }
    seen += read_all(&sim, &mut stats).unwrap().len();
    assert_eq!(stats.aux_records, 40);
    assert_eq!(stats.lost_records, 20);
    assert_eq!(stats.lost_events, 20);
    assert_eq!(seen, 60);
}

#[test]
fn unknown_and_malformed_records() {
    let mut sim = Sim::new(256, 64);
    sim.set_data_counters(0);
    // PERF_RECORD_MMAP (1), opaque to us.
    let mut mmap = header(1, 2, 24);
    mmap.extend_from_slice(&[0xaa; 16]);
    assert!(sim.push_record(&mmap));
    // An AUX record too short for its fields + trailer.
    let mut short = header(PERF_RECORD_AUX, 0, 16);
    short.extend_from_slice(&[0; 8]);
    assert!(sim.push_record(&short));
    let mut stats = AuxStats::default();
    let recs = read_all(&sim, &mut stats).unwrap();
    assert_eq!(
        recs,
        vec![
            SideRecord::Other {
                type_: 1,
                misc: 2,
                size: 24
            },
            SideRecord::Other {
                type_: PERF_RECORD_AUX,
                misc: 0,
                size: 16
            }
        ]
    );
    assert_eq!(stats.malformed_records, 1);
    assert_eq!(stats.aux_records, 0);
    assert!(stats.any_loss());
}

#[test]
fn corrupt_header_drops_rest_counts_it_and_resynchronises() {
    let mut sim = Sim::new(256, 64);
    sim.set_data_counters(0);
    assert!(sim.push_record(&itrace_record(1, 2)));
    let mut bad = header(PERF_RECORD_AUX, 0, 4);
    bad.extend_from_slice(&[0; 12]);
    assert!(sim.push_record(&bad)); // 16 bytes published, header claims size 4
    assert!(sim.push_record(&lost_record(1, 1)));
    let head = sim.page.data_head.load(Ordering::Relaxed);
    let mut stats = AuxStats::default();
    let mut reader = DataRingReader::new(TRAILER);
    let mut n = 0;
    let err = reader
        .read(&sim.page, &sim.data, &mut stats, |_| n += 1)
        .unwrap_err();
    assert_eq!(n, 1);
    assert_eq!(
        err,
        RingError::CorruptHeader {
            at: 32,
            type_: PERF_RECORD_AUX,
            size: 4,
            dropped: head - 32
        }
    );
    assert_eq!(stats.data_bytes_dropped, head - 32);
    assert_eq!(sim.page.data_tail.load(Ordering::Relaxed), head);
    // The ring is usable again.
    assert!(sim.push_record(&itrace_record(3, 4)));
    assert_eq!(read_all(&sim, &mut stats).unwrap().len(), 1);
}

#[test]
fn data_ring_rejects_inconsistent_counters() {
    let sim = Sim::new(64, 64);
    sim.page.data_head.store(8, Ordering::Relaxed);
    sim.page.data_tail.store(16, Ordering::Relaxed);
    let mut stats = AuxStats::default();
    assert_eq!(
        read_all(&sim, &mut stats),
        Err(RingError::HeadBehindTail {
            ring: "data",
            head: 8,
            tail: 16
        })
    );
    let mut reader = DataRingReader::new(TRAILER);
    let short = vec![0u8; 32];
    assert!(matches!(
        reader.read(&sim.page, &short, &mut stats, |_| {}),
        Err(RingError::SizeMismatch { ring: "data", .. })
    ));
    // A record whose size runs past the published head.
    let sim = Sim::new(64, 64);
    let h = header(PERF_RECORD_ITRACE_START, 0, 32);
    sim.page.data_head.store(8, Ordering::Relaxed);
    let mut data = sim.data.clone();
    data[..8].copy_from_slice(&h);
    let mut reader = DataRingReader::new(TRAILER);
    assert_eq!(
        reader.read(&sim.page, &data, &mut stats, |_| {}),
        Err(RingError::RecordPastHead {
            at: 0,
            size: 32,
            head: 8
        })
    );
    assert_eq!(sim.page.data_tail.load(Ordering::Relaxed), 0);
}

#[test]
fn sample_id_layout_all_fields() {
    let layout = SampleIdLayout {
        sample_type: SampleIdLayout::TID
            | SampleIdLayout::TIME
            | SampleIdLayout::ID
            | SampleIdLayout::STREAM_ID
            | SampleIdLayout::CPU
            | SampleIdLayout::IDENTIFIER,
    };
    assert_eq!(layout.trailer_len(), 48);
    let mut rec = header(PERF_RECORD_LOST_SAMPLES, 0, 64);
    rec.extend_from_slice(&77u64.to_le_bytes());
    for v in [1u32, 2] {
        rec.extend_from_slice(&v.to_le_bytes());
    }
    for v in [3u64, 4, 5] {
        rec.extend_from_slice(&v.to_le_bytes());
    }
    rec.extend_from_slice(&6u32.to_le_bytes());
    rec.extend_from_slice(&0u32.to_le_bytes());
    rec.extend_from_slice(&8u64.to_le_bytes());
    let (r, ok) = parse_record(&rec, layout).unwrap();
    assert!(ok);
    assert_eq!(
        r,
        SideRecord::LostSamples {
            lost: 77,
            sample: Some(SampleId {
                pid: Some(1),
                tid: Some(2),
                time: Some(3),
                id: Some(4),
                stream_id: Some(5),
                cpu: Some(6),
                identifier: Some(8)
            })
        }
    );
    assert_eq!(SampleIdLayout::NONE.trailer_len(), 0);
    assert_eq!(parse_record(&[1, 2, 3], layout), None);
}

#[test]
fn aux_full_copies_in_at_most_two_slices_and_advances_tail() {
    let mut sim = Sim::new(512, 64);
    sim.set_data_counters(0);
    let mut out = Vec::new();
    let mut calls = Vec::new();
    let mut stats = AuxStats::default();
    // 40 bytes, then 40 more: the second chunk wraps at 64.
    for expect_calls in [1usize, 2] {
        assert_eq!(sim.write_aux_full(40), 40);
        calls.clear();
        let n = drain_aux_full(&sim.page, &sim.aux, None, &mut stats, |b| {
            calls.push(b.len());
            out.extend_from_slice(b);
        })
        .unwrap();
        assert_eq!(n, 40);
        assert_eq!(calls.len(), expect_calls, "{calls:?}");
    }
    assert_eq!(calls, vec![24, 16]);
    assert_eq!(out, stream(0, 80));
    assert_eq!(sim.page.aux_tail.load(Ordering::Relaxed), 80);
    assert_eq!(stats.aux_bytes_copied, 80);
    read_all(&sim, &mut stats).unwrap();
    assert_eq!((stats.aux_records, stats.truncated), (2, 0));
    // Empty ring: nothing copied, the sink is not called.
    let n = drain_aux_full(&sim.page, &sim.aux, None, &mut stats, |_| panic!("called")).unwrap();
    assert_eq!(n, 0);
}

#[test]
fn aux_full_back_pressure_truncates_and_is_counted() {
    let mut sim = Sim::new(4096, 64);
    sim.set_data_counters(0);
    let mut out = Vec::new();
    let mut stats = AuxStats::default();
    // The producer offers 100 bytes into a 64-byte ring the drainer has not read yet.
    assert_eq!(sim.write_aux_full(100), 64);
    // Full ring: nothing more fits until the tail moves.
    assert_eq!(sim.write_aux_full(10), 0);
    // The drainer moves at most 16 bytes per call (back-pressure from the consumer side).
    let n = drain_aux_full(&sim.page, &sim.aux, Some(16), &mut stats, |b| {
        out.extend_from_slice(b)
    })
    .unwrap();
    assert_eq!(n, 16);
    assert_eq!(sim.page.aux_tail.load(Ordering::Relaxed), 16);
    assert_eq!(sim.write_aux_full(30), 16);
    while drain_aux_full(&sim.page, &sim.aux, Some(16), &mut stats, |b| {
        out.extend_from_slice(b)
    })
    .unwrap()
        > 0
    {}
    // Everything the producer managed to write arrives, in order, exactly once.
    assert_eq!(out, stream(0, sim.produced));
    assert_eq!(sim.produced, 80);
    read_all(&sim, &mut stats).unwrap();
    assert_eq!(stats.aux_records, 3);
    assert_eq!(stats.truncated, 3, "every short write is flagged");
    assert_eq!(stats.aux_bytes_reported, 80);
    assert!(stats.any_loss());
}

#[test]
fn aux_full_randomised_interleaving_preserves_the_stream() {
    // Deterministic xorshift: producer writes and consumer drains in random sizes.
    let mut rng = crate::test_rng::XorShift::new(0x9e37_79b9_7f4a_7c15);
    let mut rnd = move |m: u64| rng.below(m);
    let mut sim = Sim::new(1 << 16, 256);
    sim.set_data_counters(0);
    sim.page.aux_head.store(u64::MAX - 1000, Ordering::Relaxed);
    sim.page.aux_tail.store(u64::MAX - 1000, Ordering::Relaxed);
    let mut out = Vec::new();
    let mut stats = AuxStats::default();
    let mut truncated_writes = 0;
    for _ in 0..300 {
        let want = rnd(200);
        if sim.write_aux_full(want) < want {
            truncated_writes += 1;
        }
        let limit = rnd(300);
        drain_aux_full(&sim.page, &sim.aux, Some(limit), &mut stats, |b| {
            out.extend_from_slice(b)
        })
        .unwrap();
        if sim.page.aux_head.load(Ordering::Relaxed) > u64::MAX - 300 {
            break;
        }
    }
    drain_aux_full(&sim.page, &sim.aux, None, &mut stats, |b| {
        out.extend_from_slice(b)
    })
    .unwrap();
    assert_eq!(out, stream(0, sim.produced));
    read_all(&sim, &mut stats).unwrap();
    assert_eq!(stats.truncated, truncated_writes);
    assert_eq!(stats.aux_bytes_reported, sim.produced);
}

#[test]
fn aux_full_overrun_is_counted_and_newest_bytes_kept() {
    let sim = Sim::new(64, 64);
    // A producer that ignored the tail: 100 bytes for a 64-byte ring.
    let mut aux = vec![0u8; 64];
    for i in 0..100u64 {
        aux[(i % 64) as usize] = stream_byte(i);
    }
    sim.page.aux_head.store(100, Ordering::Relaxed);
    let mut out = Vec::new();
    let mut stats = AuxStats::default();
    let n = drain_aux_full(&sim.page, &aux, None, &mut stats, |b| {
        out.extend_from_slice(b)
    })
    .unwrap();
    assert_eq!(n, 64);
    assert_eq!(out, stream(36, 64));
    assert_eq!(stats.aux_overrun_bytes, 36);
    // Head behind tail is an error and does not move the tail.
    sim.page.aux_tail.store(200, Ordering::Relaxed);
    assert_eq!(
        drain_aux_full(&sim.page, &aux, None, &mut stats, |_| {}),
        Err(RingError::HeadBehindTail {
            ring: "aux",
            head: 100,
            tail: 200
        })
    );
    assert_eq!(sim.page.aux_tail.load(Ordering::Relaxed), 200);
    sim.page.aux_size.store(0, Ordering::Relaxed);
    assert_eq!(
        drain_aux_full(&sim.page, &aux, None, &mut stats, |_| {}),
        Err(RingError::EmptyRing { ring: "aux" })
    );
}

#[test]
fn snapshot_position_mode_before_and_after_wrap() {
    let mut sim = Sim::new(64, 64);
    let mut snap = SnapshotReader::new();
    let mut stats = AuxStats::default();
    let take = |snap: &mut SnapshotReader, sim: &Sim, max, stats: &mut AuxStats| {
        let mut out = Vec::new();
        let mut calls = 0;
        let info = snap
            .take(&sim.page, &sim.aux, max, stats, |b| {
                calls += 1;
                out.extend_from_slice(b)
            })
            .unwrap();
        assert!(calls <= 2);
        (info, out)
    };
    // Nothing written.
    let (info, out) = take(&mut snap, &sim, None, &mut stats);
    assert_eq!(
        (info.bytes, info.wrapped, info.loss),
        (0, false, SnapshotLoss::None)
    );
    assert!(out.is_empty());
    // 40 bytes, not wrapped: everything is valid.
    sim.write_aux_overwrite(40, false);
    let (info, out) = take(&mut snap, &sim, None, &mut stats);
    assert_eq!(out, stream(0, 40));
    assert_eq!(
        (info.head, info.wrapped, info.loss),
        (40, false, SnapshotLoss::None)
    );
    // Newest 16 only.
    let (_, out) = take(&mut snap, &sim, Some(16), &mut stats);
    assert_eq!(out, stream(24, 16));
    // 50 more: position 90 % 64 = 26 < 40, the head moved back: wrapped, older data gone.
    sim.write_aux_overwrite(50, false);
    let (info, out) = take(&mut snap, &sim, None, &mut stats);
    assert_eq!(info.head, 26);
    assert!(info.wrapped);
    assert_eq!(info.loss, SnapshotLoss::Unknown);
    assert_eq!(
        out,
        stream(90 - 64, 64),
        "the newest 64 bytes, oldest first"
    );
    assert_eq!(stats.snapshots_possibly_overwritten, 1);
    // Unchanged head: no new loss reported.
    let (info, _) = take(&mut snap, &sim, None, &mut stats);
    assert_eq!(info.loss, SnapshotLoss::None);
    assert_eq!(stats.snapshots, 5);
}

#[test]
fn snapshot_detects_a_wrap_the_head_alone_hides() {
    // The first snapshot happens after 64 + 10 bytes: the position (10) did not move back
    // relative to any earlier snapshot, but the bytes after it are non-zero.
    let mut sim = Sim::new(64, 64);
    sim.write_aux_overwrite(74, false);
    let mut snap = SnapshotReader::new();
    let mut stats = AuxStats::default();
    let mut out = Vec::new();
    let info = snap
        .take(&sim.page, &sim.aux, None, &mut stats, |b| {
            out.extend_from_slice(b)
        })
        .unwrap();
    assert!(info.wrapped);
    assert_eq!(info.loss, SnapshotLoss::Unknown);
    assert_eq!(out, stream(10, 64));
}

#[test]
fn snapshot_running_count_mode_reports_exact_loss() {
    let mut sim = Sim::new(64, 64);
    let mut snap = SnapshotReader::new();
    let mut stats = AuxStats::default();
    let mut go = |sim: &Sim, stats: &mut AuxStats| {
        let mut out = Vec::new();
        let info = snap
            .take(&sim.page, &sim.aux, None, stats, |b| {
                out.extend_from_slice(b)
            })
            .unwrap();
        (info, out)
    };
    sim.write_aux_overwrite(64, true);
    let (info, out) = go(&sim, &mut stats);
    assert_eq!(
        (info.head, info.wrapped, info.loss),
        (64, true, SnapshotLoss::None)
    );
    assert_eq!(out, stream(0, 64));
    sim.write_aux_overwrite(30, true);
    let (info, out) = go(&sim, &mut stats);
    assert_eq!(
        info.loss,
        SnapshotLoss::None,
        "30 new bytes all still present"
    );
    assert_eq!(out, stream(30, 64));
    sim.write_aux_overwrite(200, true);
    let (info, out) = go(&sim, &mut stats);
    assert_eq!(info.head, 294);
    assert_eq!(info.loss, SnapshotLoss::Exact(200 - 64));
    assert_eq!(out, stream(294 - 64, 64));
    assert_eq!(stats.snapshot_overwritten_bytes, 136);
    assert_eq!(stats.aux_bytes_copied, 192);
}

#[test]
fn ring_slices_bounds() {
    let r = vec![1u8, 2, 3, 4];
    assert_eq!(ring_slices(&r, 6, 3), Some((&[3u8, 4][..], &[1u8][..])));
    assert_eq!(ring_slices(&r, 0, 4), Some((&[1u8, 2, 3, 4][..], &[][..])));
    assert_eq!(ring_slices(&r, 0, 5), None);
    let empty: Vec<u8> = Vec::new();
    assert_eq!(ring_slices(&empty, 0, 0), None);
}

#[test]
fn snapshot_randomised_against_ground_truth() {
    let mut rng = crate::test_rng::XorShift::new(0x2545_f491_4f6c_dd1d);
    let mut rnd = move |m: u64| rng.below(m);
    for running_count in [false, true] {
        let mut sim = Sim::new(64, 128);
        let mut snap = SnapshotReader::new();
        let mut stats = AuxStats::default();
        let mut last_seen = 0u64; // stream position of the previous snapshot's head
        let mut exact_lost = 0u64;
        for _ in 0..200 {
            let len = rnd(300);
            sim.write_aux_overwrite(len, running_count);
            if len > 0 {
                // The kernel emits a PERF_RECORD_AUX (OVERWRITE) per write.
                snap.note_aux_record();
            }
            let max = if rnd(3) == 0 { Some(rnd(200)) } else { None };
            let mut out = Vec::new();
            let info = snap
                .take(&sim.page, &sim.aux, max, &mut stats, |b| {
                    out.extend_from_slice(b)
                })
                .unwrap();
            // Ground truth: the newest min(produced, size, max) bytes of the stream.
            let avail = sim.produced.min(128);
            let n = avail.min(max.unwrap_or(u64::MAX));
            assert_eq!(out, stream(sim.produced - n, n), "running={running_count}");
            assert_eq!(info.wrapped, sim.produced >= 128);
            let new = sim.produced - last_seen;
            match info.loss {
                SnapshotLoss::Exact(k) => {
                    assert!(running_count);
                    assert_eq!(k, new - 128);
                    exact_lost += k;
                }
                SnapshotLoss::None => assert!(new <= 128, "new {new}"),
                SnapshotLoss::Unknown => assert!(!running_count && info.wrapped),
            }
            last_seen = sim.produced;
        }
        assert_eq!(stats.snapshot_overwritten_bytes, exact_lost);
        assert_eq!(stats.snapshots, 200);
    }
}
