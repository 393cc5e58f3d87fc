//! Per-CPU perf.data streams split into threads by their context-switch records
//! (`store::percpu`): a synthetic recording built by the encoder (2 CPUs, 3 threads migrating
//! between them) decodes, thread by thread, to exactly the instructions it was built from;
//! missing or contradicting sideband is counted, never attributed to a wrong thread; the
//! corpus's real per-CPU files split as their single traced process.

mod support;

use ptrewind::image::{Image, Section};
use ptrewind::perf::data::{PerfData, TscConversion};
use ptrewind::store::TraceStreams;
use ptrewind::store::percpu::{SplitError, Unattributed, split_per_cpu};
use support::flow_ips;
use support::percpu::{self, BASES, CODE, Variant};

fn image() -> Image {
    let mut img = Image::new();
    for base in BASES {
        img.add(Section::new(base, CODE.to_vec(), "code")).unwrap();
    }
    img
}

fn split(bytes: &[u8]) -> Result<ptrewind::store::percpu::ThreadSplit, SplitError> {
    let source = TraceStreams::from_bytes(bytes).unwrap();
    let scan = PerfData::parse(bytes).unwrap().context_switches();
    split_per_cpu(&source, &scan)
}

#[test]
fn every_thread_gets_exactly_its_instructions() {
    let bytes = percpu::perf_data(Variant::default());
    let split = split(&bytes).unwrap();
    let truth = percpu::truth();
    let tids: Vec<u32> = split.threads.iter().map(|t| t.tid).collect();
    assert_eq!(tids, [101, 102, 103]);
    assert!(split.threads.iter().all(|t| t.pid == percpu::PID));
    let img = image();
    for t in &split.threads {
        let (ips, errors) = flow_ips(&t.stream.data, &img);
        assert!(errors.is_empty(), "thread {}: {errors:?}", t.tid);
        assert_eq!(ips, truth[&t.tid], "thread {}", t.tid);
    }
    // Thread 101's first two regions (a system call between them, no switch) are one piece.
    let cpus: Vec<u32> = split.threads[0].pieces.iter().map(|p| p.cpu).collect();
    assert_eq!(cpus, [0, 1, 0], "{:?}", split.threads[0].pieces);
    assert_eq!(split.threads[0].pieces[0].regions, 2);
    let r = &split.report;
    assert_eq!((r.regions, r.attributed), (9, 9), "{r:?}");
    assert!(r.problems().is_empty(), "{:?}", r.problems());
}

/// Each thread's stream is stamped with the times of its pieces, never going back: the
/// global order of the three threads is their true interleaving.
#[test]
fn pieces_keep_their_time() {
    let bytes = percpu::perf_data(Variant::default());
    let split = split(&bytes).unwrap();
    let seen = interleaving(&split, &ptrewind::flow::FlowConfig::default());
    // By time: 101 (1020, 1030), 103 (1055), 102 (1105), 101 (1155), 103 (1205), 102 (1255,
    // 1265), 101 (1305).
    assert_eq!(seen, [101, 103, 102, 101, 103, 102, 101]);
}

/// The threads of `split` in the global order their clocks (under `cfg`) give: one entry per
/// run of one thread.
fn interleaving(
    split: &ptrewind::store::percpu::ThreadSplit,
    cfg: &ptrewind::flow::FlowConfig,
) -> Vec<u32> {
    use ptrewind::history::{GlobalOrder, ThreadClock};
    let img = image();
    let clocks: Vec<ThreadClock> = split
        .threads
        .iter()
        .map(|t| ThreadClock::from_trace(&t.stream.data, &img, cfg))
        .collect();
    let order = GlobalOrder::new(&clocks);
    let tids: Vec<u32> = split.threads.iter().map(|t| t.tid).collect();
    let mut seen = Vec::new();
    for g in 0..order.len() {
        let (t, _) = order.local(g).unwrap();
        if seen.last() != Some(&tids[t]) {
            seen.push(tids[t]);
        }
    }
    seen
}

/// Without switch records the threads cannot be told apart: an error saying so.
#[test]
fn no_switch_records_is_an_error() {
    let bytes = percpu::perf_data(Variant {
        no_switches: true,
        ..Variant::default()
    });
    let err = split(&bytes).unwrap_err();
    assert_eq!(err, SplitError::NoSwitches);
    assert!(
        err.to_string().contains("no context-switch records"),
        "{err}"
    );
}

/// Decodes every thread of `split`: no decode error, and each thread's instructions are its
/// own, in order, some perhaps left out (regions given to no thread); returns how many were
/// given.
fn given_in_order(split: &ptrewind::store::percpu::ThreadSplit) -> usize {
    let img = image();
    let truth = percpu::truth();
    let mut total = 0;
    for t in &split.threads {
        let (ips, errors) = flow_ips(&t.stream.data, &img);
        assert!(errors.is_empty(), "thread {}: {errors:?}", t.tid);
        assert!(
            is_subsequence(&ips, &truth[&t.tid]),
            "thread {}: {ips:x?}",
            t.tid
        );
        total += ips.len();
    }
    total
}

/// `a` is `b` with some elements left out, in order.
fn is_subsequence(a: &[u64], b: &[u64]) -> bool {
    let mut it = b.iter();
    a.iter().all(|x| it.any(|y| y == x))
}

/// A thread migration whose switch records are missing (CPU 1's switch from thread 103 to
/// 101): thread 101's region there lies where, by the remaining records, 103 may still have
/// run, so it is counted as unattributed (and the contradiction is counted); every region that
/// is attributed is its own thread's.
#[test]
fn missing_switch_records_leave_regions_unattributed_not_misattributed() {
    let bytes = percpu::perf_data(Variant {
        drop_cpu1_migration: true,
        ..Variant::default()
    });
    let split = split(&bytes).unwrap();
    let r = &split.report;
    assert_eq!((r.regions, r.attributed), (9, 8), "{r:?}");
    assert_eq!(r.inconsistent_switches, 1, "{r:?}");
    assert_eq!(r.unattributed.len(), 1, "{r:?}");
    assert_eq!(r.unattributed[0].cpu, 1, "{r:?}");
    assert_eq!(
        r.unattributed[0].why,
        Unattributed::Ambiguous(vec![(100, 101), (100, 103)]),
        "{r:?}"
    );
    assert!(
        r.problems()
            .iter()
            .any(|l| l.starts_with("1 region(s)") && l.contains("given to no thread")),
        "{:?}",
        r.problems()
    );
    let total = given_in_order(&split);
    let truth = percpu::truth();
    // Lost: thread 101's 4 instructions on CPU 1.
    let all: usize = truth.values().map(Vec::len).sum();
    assert_eq!(total, all - 4);
}

/// A recording whose regions carry no TSC (TraceEn set once, as `perf record -a` does; a
/// TSC only in PSB+s): MTCs in the kernel between the regions place each region between two
/// crystal-clock ticks, and every region goes to its thread — each thread decodes to exactly
/// its instructions. The same streams without the TSC:CTC ratio (MTCs give no time) leave the
/// regions that only MTCs could place unattributed: only CPU 0's first two (between its first
/// PSB's TSC and the PSB after them, where only thread 101 ran) are given, never a wrong one.
#[test]
fn mtc_times_place_regions_between_timestamps() {
    let img = image();
    let truth = percpu::truth();
    let bytes_mtc = percpu::perf_data(Variant {
        mtc: Some(true),
        ..Variant::default()
    });
    let split_mtc = split(&bytes_mtc).unwrap();
    let r = &split_mtc.report;
    assert_eq!((r.regions, r.attributed), (9, 9), "{r:?}");
    assert!(r.problems().is_empty(), "{:?}", r.problems());
    let tids: Vec<u32> = split_mtc.threads.iter().map(|t| t.tid).collect();
    assert_eq!(tids, [101, 102, 103]);
    for t in &split_mtc.threads {
        let (ips, errors) = flow_ips(&t.stream.data, &img);
        assert!(errors.is_empty(), "thread {}: {errors:?}", t.tid);
        assert_eq!(ips, truth[&t.tid], "thread {}", t.tid);
    }

    // Each piece's synthetic PSB+ keeps the TSC, TMA and MTCs, so the threads' clocks (with
    // the recording's timing parameters) give their true interleaving.
    let source = TraceStreams::from_bytes(&bytes_mtc).unwrap();
    let cfg = ptrewind::flow::FlowConfig {
        timing: source.perf.as_ref().unwrap().timing(),
        ..ptrewind::flow::FlowConfig::default()
    };
    assert_eq!(cfg.timing.ctc_ratio, (2, 1));
    assert_eq!(cfg.timing.mtc_freq, 0);
    assert_eq!(
        interleaving(&split_mtc, &cfg),
        [101, 103, 102, 101, 103, 102, 101]
    );

    let split_none = split(&percpu::perf_data(Variant {
        mtc: Some(false),
        ..Variant::default()
    }))
    .unwrap();
    let r = &split_none.report;
    assert_eq!((r.regions, r.attributed), (9, 2), "{r:?}");
    assert!(
        r.unattributed
            .iter()
            .all(|u| matches!(u.why, Unattributed::Ambiguous(_))),
        "{r:?}"
    );
    let given = given_in_order(&split_none);
    // Thread 101's first two regions: 3 + 2 instructions.
    assert_eq!(given, 5);
}

/// perf's time conversion with the values of a real recording (HASE's loopy): the TSC of the
/// trace's first PSB lies right after its ITRACE_START record, and conversions round-trip.
#[test]
fn perf_time_converts_to_tsc_as_perf_does() {
    let conv = TscConversion::new(31, 0x2819aa06, 0xfffffffd108e9db0).unwrap();
    // ITRACE_START at perf time 969349987535241; the PSB+'s TSC is 0xafe29d5f88f96.
    let start = conv.perf_time_to_tsc(969_349_987_535_241);
    assert_eq!(start, 0xafe29d5f87d5b);
    assert_eq!(conv.tsc_to_perf_time(0xafe29d5f88f96), 969_349_987_536_703);
    for ns in [969_349_987_535_241u64, 969_350_059_434_472] {
        let back = conv.tsc_to_perf_time(conv.perf_time_to_tsc(ns));
        assert!(back.abs_diff(ns) <= 1, "{ns} -> {back}");
    }
    assert!(TscConversion::new(64, 1, 0).is_none());
    assert!(TscConversion::new(1, 0, 0).is_none());
}

fn corpus() -> Option<std::path::PathBuf> {
    support::require_corpus("percpu")
}

/// HASE's recordings are per-CPU (one CPU, user-only, SWITCH_CPU_WIDE records of every task
/// on the machine): the split gives the one traced thread, and its stream decodes to the
/// ground-truth instructions, like the unsplit stream.
#[test]
fn hase_per_cpu_recordings_split_into_their_thread() {
    let Some(root) = corpus() else { return };
    let dir = root.join("hase-pt-recordings");
    for (sub, exe, perf, trace) in [
        (
            "loopy-20180404",
            "loopy",
            "loopy-20180404T162955.perf",
            "loopy-20180404T162955.trace",
        ),
        (
            "control_flow-20180404",
            "control_flow",
            "control_flow-20180404T163033.perf",
            "control_flow-20180404T163033.trace",
        ),
    ] {
        let exe = dir.join(sub).join(exe);
        let bytes = std::fs::read(dir.join(sub).join(perf)).unwrap();
        let split = split(&bytes).unwrap();
        assert_eq!(split.threads.len(), 1, "{sub}: {:?}", split.report);
        let t = &split.threads[0];
        let r = &split.report;
        assert_eq!(r.attributed, r.regions, "{sub}: {r:?}");
        assert!(r.unattributed.is_empty(), "{sub}: {r:?}");
        let img = elf_image(&exe);
        let truth = support::hase::ground_truth(
            &std::fs::read_to_string(dir.join(sub).join(trace)).unwrap(),
            &support::hase::objdump_insns(&exe),
        );
        let (ips, errors) = flow_ips(&t.stream.data, &img);
        assert!(errors.is_empty(), "{sub}: {errors:?}");
        // Exactly what the unsplit stream decodes to.
        let source = TraceStreams::from_bytes(&bytes).unwrap();
        let (whole, _) = flow_ips(&source.streams[0].data, &img);
        assert_eq!(ips, whole, "{sub}");
        if sub.starts_with("loopy") {
            assert_eq!(ips, truth, "{sub}");
        } else {
            assert!(
                ips.len() + 8 > truth.len(),
                "{sub}: {} of {}",
                ips.len(),
                truth.len()
            );
        }
    }
}

fn elf_image(exe: &std::path::Path) -> Image {
    let mut img = Image::new();
    for s in support::corpus::elf_load_segments(exe).unwrap() {
        img.add(Section::new(s.addr, s.bytes.clone(), &s.name))
            .unwrap();
    }
    img
}

/// HASE's 2018-05 recordings (snapshot mode, several PSBs, one CPU): split into their one
/// thread, whose stream decodes to what the unsplit stream decodes to.
#[test]
fn hase_snapshot_recordings_split_like_the_unsplit_stream() {
    let Some(root) = corpus() else { return };
    let dir = root.join("hase-pt-recordings");
    for (sub, bin) in [
        ("loopy-20180514", "loopy"),
        ("control_flow-20180515", "control_flow"),
    ] {
        let exe = dir
            .join(sub)
            .join("binaries/home/joerg/git/hase/tests/bin")
            .join(bin)
            .join(bin);
        let bytes = std::fs::read(dir.join(sub).join("perf.data.1")).unwrap();
        let split = split(&bytes).unwrap();
        assert_eq!(split.threads.len(), 1, "{sub}: {:?}", split.report);
        let r = &split.report;
        assert!(r.unattributed.is_empty() && r.regions > 0, "{sub}: {r:?}");
        let img = elf_image(&exe);
        let (ips, _) = flow_ips(&split.threads[0].stream.data, &img);
        let source = TraceStreams::from_bytes(&bytes).unwrap();
        let (whole, _) = flow_ips(&source.streams[0].data, &img);
        assert!(ips.len() > 50, "{sub}: {}", ips.len());
        assert_eq!(ips, whole, "{sub}");
    }
}

/// quipper's recording (user + kernel, `echo` migrating from CPU 3 to CPU 0, no code
/// images): both CPU streams split into the one process's thread, whose stream parses.
#[test]
fn quipper_per_cpu_recording_splits_into_its_thread() {
    let Some(root) = corpus() else { return };
    let bytes =
        std::fs::read(root.join("quipper-perfdata-intel_pt/perf.data.intel_pt-4.14")).unwrap();
    let split = split(&bytes).unwrap();
    let tids: Vec<u32> = split.threads.iter().map(|t| t.tid).collect();
    assert_eq!(tids, [3174], "{:?}", split.report);
    let t = &split.threads[0];
    let cpus: Vec<u32> = t.pieces.iter().map(|p| p.cpu).collect();
    assert!(cpus.contains(&0) && cpus.contains(&3), "{:?}", t.pieces);
    let r = &split.report;
    assert!(r.attributed > 0, "{r:?}");
    let mut dec = ptrewind::packet::PacketDecoder::new(&t.stream.data);
    let mut packets = 0;
    while let Some(p) = dec.next_packet() {
        p.unwrap();
        packets += 1;
    }
    assert!(packets > 1000, "{packets}");
}

/// An invalid packet inside a region of CPU 1 (thread 101's): the damage is reported, the
/// region's piece ends with an OVF (its thread's decoder sees the loss), reading resumes at the
/// next PSB (CPU 1 has none after it: the rest is skipped and counted), and nothing of another
/// thread ends up in a thread's stream.
#[test]
fn damage_in_a_cpu_stream_is_counted_and_cut() {
    use ptrewind::packet::{Packet, PacketDecoder};
    let mut bytes = percpu::perf_data(Variant::default());
    let cpu1 = percpu::cpu_stream(1010, &percpu::CPU1);
    let base = bytes.len() - cpu1.len();
    assert_eq!(&bytes[base..], &cpu1[..]);
    // The packet after the TSC inside the second region (thread 101's on CPU 1).
    let mut dec = PacketDecoder::new(&cpu1);
    let mut pges = 0;
    let mut at = None;
    while let Some(Ok((off, p))) = dec.next_packet() {
        match p {
            Packet::TipPge(_) => pges += 1,
            Packet::Tsc { .. } if pges == 2 => {
                at = Some(off as usize + 8);
                break;
            }
            _ => {}
        }
    }
    let at = base + at.unwrap();
    bytes[at] = 0x02;
    bytes[at + 1] = 0xff;
    let split = split(&bytes).unwrap();
    let r = &split.report;
    assert_eq!(r.damage.len(), 1, "{r:?}");
    assert_eq!(r.damage[0].0, 1, "{r:?}");
    assert!(r.skipped_bytes > 0, "{r:?}");
    assert!(
        r.problems()
            .iter()
            .any(|l| l.starts_with("cpu1 stream offset")),
        "{:?}",
        r.problems()
    );
    let img = image();
    let truth = percpu::truth();
    for t in &split.threads {
        let (ips, _) = flow_ips(&t.stream.data, &img);
        assert!(
            is_subsequence(&ips, &truth[&t.tid]),
            "thread {}: {ips:x?}",
            t.tid
        );
    }
    // Thread 102 lost its regions on CPU 1 (after the damage, no PSB): only CPU 0's remain.
    let t102 = split.threads.iter().find(|t| t.tid == 102).unwrap();
    assert!(t102.pieces.iter().all(|p| p.cpu == 0), "{:?}", t102.pieces);
    let t101 = split.threads.iter().find(|t| t.tid == 101).unwrap();
    // Its CPU 1 piece (between its two CPU 0 pieces) ends with the OVF.
    let cpus: Vec<u32> = t101.pieces.iter().map(|p| p.cpu).collect();
    assert_eq!(cpus, [0, 1, 0], "{:?}", t101.pieces);
    let end = t101.pieces[2].stream_offset as usize;
    assert_eq!(&t101.stream.data[end - 2..end], &[0x02, 0xf3]);
}

/// Damaged files (bytes flipped anywhere: records, sample ids, the switch records' times and
/// CPUs, the PT bytes) never make the sideband scan or the split panic, and every region is
/// either attributed or counted (a cheap stand-in for the `perf_data` fuzz target, which also
/// reaches this).
#[test]
fn flipped_bytes_never_panic_and_lose_no_region() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut inputs = vec![percpu::perf_data(Variant::default())];
    if let Some(root) = corpus() {
        inputs.push(
            std::fs::read(
                root.join("hase-pt-recordings/loopy-20180404/loopy-20180404T162955.perf"),
            )
            .unwrap(),
        );
    }
    for original in inputs {
        for round in 0..400 {
            let mut bytes = original.clone();
            for _ in 0..1 + round % 8 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] ^= 1 << (next() % 8);
            }
            let Ok(perf) = PerfData::parse(&bytes) else {
                continue;
            };
            let scan = perf.context_switches();
            let Ok(source) = TraceStreams::from_bytes(&bytes) else {
                continue;
            };
            if let Ok(split) = split_per_cpu(&source, &scan) {
                let r = &split.report;
                assert_eq!(r.attributed + r.unattributed.len() as u64, r.regions);
                let _ = r.problems();
            }
        }
    }
}

/// A CPU-wide recording (`perf record -a`: the AUXTRACE records name no task) keeps the
/// threads of every process: the untraced process's thread 555 gets its own region, the
/// others exactly theirs.
#[test]
fn cpu_wide_recordings_keep_every_process() {
    let bytes = percpu::perf_data(Variant {
        cpu_wide: true,
        ..Variant::default()
    });
    let split = split(&bytes).unwrap();
    let threads: Vec<(u32, u32)> = split.threads.iter().map(|t| (t.pid, t.tid)).collect();
    assert_eq!(threads, [(100, 101), (100, 102), (100, 103), (555, 555)]);
    let img = image();
    let truth = percpu::truth();
    for t in &split.threads {
        let (ips, errors) = flow_ips(&t.stream.data, &img);
        assert!(errors.is_empty(), "thread {}: {errors:?}", t.tid);
        let want = truth.get(&t.tid).cloned().unwrap_or(vec![0x1010, 0x1010]);
        assert_eq!(ips, want, "thread {}", t.tid);
    }
}

/// The synthetic per-CPU file on disk with its code, and `--raw` arguments for each base.
fn on_disk() -> (tempfile::TempDir, std::path::PathBuf, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let perf = dir.path().join("perf.data");
    std::fs::write(&perf, percpu::perf_data(Variant::default())).unwrap();
    let code = dir.path().join("code.bin");
    std::fs::write(&code, CODE).unwrap();
    let mut raw = Vec::new();
    for base in BASES {
        raw.push("--raw".to_string());
        raw.push(format!("{}:{base:#x}", code.display()));
    }
    (dir, perf, raw)
}

/// `decode --perf` of a per-CPU file goes thread by thread (split as `replay` splits it): a
/// `[thread PID/TID]` section per thread with exactly its instructions.
#[test]
fn decode_goes_thread_by_thread() {
    let (_dir, perf, raw) = on_disk();
    let out = support::gdb::ptrewind()
        .args(["decode", "--perf"])
        .arg(&perf)
        .args(&raw)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("split by context switches into 3 thread(s)"),
        "{err}"
    );
    let mut got: std::collections::BTreeMap<u32, Vec<u64>> = Default::default();
    let mut current = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(t) = line
            .strip_prefix("[thread 100/")
            .and_then(|l| l.strip_suffix(']'))
        {
            current = t.parse::<u32>().ok();
        } else if let (Some(t), Some(h)) = (current, line.strip_prefix("0x")) {
            got.entry(t)
                .or_default()
                .push(u64::from_str_radix(h, 16).unwrap());
        }
    }
    assert_eq!(got, percpu::truth(), "{err}");
}

/// `view --perf` of a per-CPU file has a track per thread (not per CPU).
#[test]
fn view_has_a_track_per_thread() {
    let (dir, perf, raw) = on_disk();
    let json = dir.path().join("timeline.json");
    let out = support::gdb::ptrewind()
        .args(["view", "--perf"])
        .arg(&perf)
        .args(&raw)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = v
        .get("traceEvents")
        .and_then(|e| e.as_array())
        .or_else(|| v.as_array())
        .expect("trace events");
    let tids: std::collections::BTreeSet<u64> = events
        .iter()
        .filter(|e| e["ph"] != "M")
        .filter_map(|e| e["tid"].as_u64())
        .collect();
    assert_eq!(
        tids.into_iter().collect::<Vec<_>>(),
        [101, 102, 103],
        "{err}"
    );
}
