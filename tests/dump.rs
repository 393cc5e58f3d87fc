//! Integration tests of the trace store inputs (perf.data reader, raw files) and `ptrewind dump`.
//!
//! Ground truth comes from outside this crate: the PT bytes that the corpus's `extracted/` and
//! `extracted-aux/` files hold (cut out of the AUXTRACE records by someone else), the build-id
//! list quipper ships with its perf.data, the record counts and AUXTRACE_INFO values that `perf
//! report -D` (perf 6.1) and SOURCE.txt give, libipt's packet decoder (tests/support/libipt.rs)
//! and hand-assembled packets.
//!
//! Run: `cargo test --test dump` (add `-- --nocapture` to see the per-file packet counts).

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ptrewind::packet::{PacketDecoder, PacketError};
use ptrewind::store::perf_data::{PerfData, RecordData, record_type};
use ptrewind::store::{SourceFormat, TraceStreams};

const BIN: &str = env!("CARGO_BIN_EXE_ptrewind");

fn corpus() -> Option<PathBuf> {
    support::require_corpus("dump")
}

/// Runs `ptrewind dump <args>`.
fn dump(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("dump")
        .args(args)
        .output()
        .expect("run ptrewind")
}

fn dump_path(path: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&str> = extra.to_vec();
    let p = path.to_str().expect("utf-8 path");
    args.push(p);
    dump(&args)
}

fn stdout(o: &Output) -> &str {
    std::str::from_utf8(&o.stdout).expect("utf-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// What the library decoder makes of a stream, with dump's policy: from offset 0 (or the first
/// PSB), resync at the next PSB after an invalid packet, stop at a truncated packet.
#[derive(Debug, Default, PartialEq, Eq)]
struct LibCount {
    packets: usize,
    invalid: usize,
    truncated: bool,
}

fn library_count(pt: &[u8], sync: bool) -> LibCount {
    let mut count = LibCount::default();
    let mut dec = PacketDecoder::new(pt);
    if sync {
        dec.sync_forward();
    }
    while let Some(item) = dec.next_packet() {
        match item {
            Ok(_) => count.packets += 1,
            Err(PacketError::Invalid { offset, .. }) => {
                count.invalid += 1;
                dec.set_position(offset as usize + 1);
                dec.sync_forward();
            }
            Err(PacketError::Truncated { .. }) => {
                count.truncated = true;
                break;
            }
        }
    }
    count
}

/// The listing's lines, checked for the `<16 hex digits>  <name>` shape.
fn listing_lines(out: &str) -> Vec<&str> {
    let lines: Vec<&str> = out.lines().collect();
    for line in &lines {
        let (offset, rest) = line.split_at(16.min(line.len()));
        assert!(
            offset.len() == 16 && offset.bytes().all(|b| b.is_ascii_hexdigit()),
            "not a listing line: {line:?}"
        );
        assert!(
            rest.starts_with("  ") && rest.len() > 2,
            "not a listing line: {line:?}"
        );
    }
    lines
}

/// The perf.data files of the corpus, with the extracted streams that must come out of them:
/// (perf.data, [(stream label, extracted file)]).
fn perf_files(root: &Path) -> Vec<(PathBuf, Vec<(&'static str, PathBuf)>)> {
    let q = root.join("quipper-perfdata-intel_pt");
    let h = root.join("hase-pt-recordings");
    let aux = |stem: &str| h.join("extracted-aux").join(format!("{stem}.aux.bin"));
    vec![
        (
            q.join("perf.data.intel_pt-4.14"),
            vec![
                (
                    "cpu0",
                    q.join("extracted/aux_perf.data.intel_pt-4.14_0_cpu0.bin"),
                ),
                (
                    "cpu3",
                    q.join("extracted/aux_perf.data.intel_pt-4.14_3_cpu3.bin"),
                ),
            ],
        ),
        (
            q.join("perf.data.piped.intel_pt-4.14"),
            vec![
                (
                    "cpu0",
                    q.join("extracted/aux_perf.data.piped.intel_pt-4.14_0_cpu0.bin"),
                ),
                (
                    "cpu3",
                    q.join("extracted/aux_perf.data.piped.intel_pt-4.14_3_cpu3.bin"),
                ),
            ],
        ),
        (
            h.join("loopy-20180404/loopy-20180404T162955.perf"),
            vec![("cpu2", aux("loopy-20180404T162955"))],
        ),
        (
            h.join("control_flow-20180404/control_flow-20180404T163033.perf"),
            vec![("cpu1", aux("control_flow-20180404T163033"))],
        ),
        (
            h.join("loopy-20180514/perf.data.1"),
            vec![("cpu1", aux("loopy-20180514T145114"))],
        ),
        (
            h.join("control_flow-20180515/perf.data.1"),
            vec![("cpu1", aux("control_flow-20180515T180451"))],
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// (a) the perf.data reader against the corpus
// ---------------------------------------------------------------------------------------------

#[test]
fn perf_data_streams_equal_the_extracted_bytes() {
    let Some(root) = corpus() else { return };
    for (path, expected) in perf_files(&root) {
        let bytes = std::fs::read(&path).unwrap();
        let source = TraceStreams::from_bytes(&bytes).unwrap();
        let pipe = path.to_string_lossy().contains("piped");
        assert_eq!(
            source.format,
            SourceFormat::PerfData { pipe },
            "{}",
            path.display()
        );
        let perf = source.perf.as_ref().unwrap();
        assert!(perf.error.is_none(), "{}: {:?}", path.display(), perf.error);
        assert!(
            perf.malformed.is_empty(),
            "{}: {:?}",
            path.display(),
            perf.malformed
        );
        assert_eq!(
            source
                .streams
                .iter()
                .map(|s| s.label.as_str())
                .collect::<Vec<_>>(),
            expected.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
            "{}",
            path.display()
        );
        for (label, extracted) in &expected {
            let stream = source.stream(label).unwrap();
            let want = std::fs::read(extracted).unwrap();
            assert!(
                stream.data[..] == want[..],
                "{} {label}: {} bytes read, {} expected from {}",
                path.display(),
                stream.data.len(),
                want.len(),
                extracted.display()
            );
            assert!(stream.losses.is_empty(), "{label}: {:?}", stream.losses);
            // Every chunk maps back onto the file bytes it came from.
            let mut next = 0;
            for chunk in &stream.chunks {
                assert_eq!(chunk.stream_offset, next);
                let (f, s) = (chunk.file_offset as usize, chunk.stream_offset as usize);
                let n = chunk.size as usize;
                assert_eq!(&bytes[f..f + n], &stream.data[s..s + n]);
                next += chunk.size;
            }
            assert_eq!(next, stream.data.len() as u64);
        }
    }
}

#[test]
fn quipper_records_match_perf_and_source_txt() {
    let Some(root) = corpus() else { return };
    let q = root.join("quipper-perfdata-intel_pt");
    let bytes = std::fs::read(q.join("perf.data.intel_pt-4.14")).unwrap();
    let perf = PerfData::parse(&bytes).unwrap();
    assert!(!perf.is_pipe());

    // SOURCE.txt: attr[0] type 6 (intel_pt), config 0x300e601.
    let attr = &perf.attrs()[0].attr;
    assert_eq!((attr.kind, attr.config), (6, 0x300e601));
    // `perf report --header-only`: the intel_pt event has ids 124..=127.
    assert_eq!(perf.attrs()[0].ids, vec![124, 125, 126, 127]);

    // Record counts as `perf report -D` (perf 6.1) prints them for this file.
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    let mut auxtrace_offsets = Vec::new();
    let mut mmap2 = Vec::new();
    let mut aux_cpus = Vec::new();
    let mut info = None;
    for record in perf.records() {
        let record = record.unwrap();
        let kind = match record.data {
            RecordData::Mmap { .. } => record_type::MMAP,
            RecordData::Mmap2 {
                pid,
                addr,
                len,
                prot,
                filename,
                ..
            } => {
                let name = String::from_utf8_lossy(filename).into_owned();
                mmap2.push((pid, addr, len, prot, name));
                record_type::MMAP2
            }
            RecordData::Comm { .. } => record_type::COMM,
            RecordData::Exit { .. } => record_type::EXIT,
            RecordData::Aux { .. } => {
                aux_cpus.push(record.sample_id.cpu);
                record_type::AUX
            }
            RecordData::ItraceStart { .. } => record_type::ITRACE_START,
            RecordData::SwitchCpuWide { .. } => record_type::SWITCH_CPU_WIDE,
            RecordData::Auxtrace(a) => {
                auxtrace_offsets.push((record.offset, a.cpu, a.data.len()));
                record_type::AUXTRACE
            }
            RecordData::AuxtraceInfo(i) => {
                info = i.intel_pt();
                record_type::AUXTRACE_INFO
            }
            RecordData::TimeConv { .. } => record_type::TIME_CONV,
            RecordData::FinishedRound => record_type::FINISHED_ROUND,
            RecordData::Sample { .. } => record_type::SAMPLE,
            ref other => panic!("unexpected record {other:?}"),
        };
        *counts.entry(kind).or_default() += 1;
    }
    let want: BTreeMap<u32, usize> = [
        (record_type::AUX, 10),
        (record_type::AUXTRACE, 2),
        (record_type::AUXTRACE_INFO, 1),
        (record_type::COMM, 3),
        (record_type::EXIT, 1),
        (record_type::FINISHED_ROUND, 4),
        (record_type::ITRACE_START, 2),
        (record_type::MMAP, 56),
        (record_type::MMAP2, 10),
        (record_type::SAMPLE, 15),
        (record_type::SWITCH_CPU_WIDE, 152),
        (record_type::TIME_CONV, 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(counts, want);
    // perf -D: "0x29c0 ... AUXTRACE size: 0x2fd0 ... cpu: 0", "0x7788 ... size: 0x21a00 ... cpu: 3".
    assert_eq!(
        auxtrace_offsets,
        vec![(0x29c0, 0, 0x2fd0), (0x7788, 3, 0x21a00)]
    );
    // perf -D prints the AUX records of cpu 3 (9) and cpu 0 (1): the sample_id trailer's CPU.
    aux_cpus.sort();
    let mut want_cpus = vec![Some(0)];
    want_cpus.extend(std::iter::repeat_n(Some(3), 9));
    assert_eq!(aux_cpus, want_cpus);
    // perf -D: "PERF_RECORD_MMAP2 3174/3174: [0x5cba63156000(0x125000) @ 0 ...]: r-xp
    // /usr/bin/coreutils" and "[0x7fb36d08b000(0x227000) ...]: r-xp /lib64/ld-2.23.so".
    let r_x = (libc::PROT_READ | libc::PROT_EXEC) as u32;
    let coreutils = (
        3174,
        0x5cba63156000,
        0x125000,
        r_x,
        "/usr/bin/coreutils".to_string(),
    );
    let ld = (
        3174,
        0x7fb36d08b000,
        0x227000,
        r_x,
        "/lib64/ld-2.23.so".to_string(),
    );
    assert!(mmap2.contains(&coreutils), "{mmap2:?}");
    assert!(mmap2.contains(&ld), "{mmap2:?}");
    // SOURCE.txt AUXTRACE_INFO values.
    let info = info.expect("intel_pt AUXTRACE_INFO");
    assert_eq!(info.pmu_type, 6);
    assert_eq!(info.time_shift, 31);
    assert_eq!(info.time_mult, 0x6aaaaaaa);
    assert_eq!(info.time_zero, 0xfffffff86343cb91);
    assert_eq!(info.tsc_bit, 0x400);
    assert_eq!(info.noretcomp_bit, 0x800);
    assert_eq!(info.have_sched_switch, 3);
    assert_eq!(info.per_cpu_mmaps, 1);
    assert_eq!(info.mtc_bit, Some(0x200));
    assert_eq!(info.mtc_freq_bits, Some(0x3c000));
    assert_eq!(
        (info.tsc_ctc_ratio_n, info.tsc_ctc_ratio_d),
        (Some(0x64), Some(2))
    );
    assert_eq!(info.cyc_bit, Some(2));
    assert_eq!(info.max_non_turbo_ratio, Some(0xc));

    // The build-id feature equals the list quipper ships beside the file.
    let text = std::fs::read_to_string(q.join("perf.data.intel_pt-4.14.buildids")).unwrap();
    let want: Vec<(String, String)> = text
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (id, name) = l.split_once(' ').unwrap();
            (id.to_string(), name.to_string())
        })
        .collect();
    let got: Vec<(String, String)> = perf
        .build_ids()
        .unwrap()
        .iter()
        .map(|b| {
            let hex: String = b.build_id.iter().map(|x| format!("{x:02x}")).collect();
            (hex, String::from_utf8_lossy(b.filename).into_owned())
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn hase_and_piped_auxtrace_info_and_attrs() {
    let Some(root) = corpus() else { return };
    // SOURCE.txt: loopy-20180404 AUXTRACE_INFO time_mult 0x2819aa06, time_zero
    // 0xfffffffd108e9db0, tsc_ctc 0x10a/2, max_non_turbo_ratio 0x20.
    let bytes =
        std::fs::read(root.join("hase-pt-recordings/loopy-20180404/loopy-20180404T162955.perf"))
            .unwrap();
    let info = PerfData::parse(&bytes)
        .unwrap()
        .aux_streams()
        .scan
        .intel_pt
        .unwrap();
    assert_eq!(info.time_mult, 0x2819aa06);
    assert_eq!(info.time_zero, 0xfffffffd108e9db0);
    assert_eq!(
        (info.tsc_ctc_ratio_n, info.tsc_ctc_ratio_d),
        (Some(0x10a), Some(2))
    );
    assert_eq!(info.max_non_turbo_ratio, Some(0x20));

    // Pipe mode: the attrs arrive as HEADER_ATTR records (4 events, the first intel_pt).
    let bytes = std::fs::read(root.join("quipper-perfdata-intel_pt/perf.data.piped.intel_pt-4.14"))
        .unwrap();
    let perf = PerfData::parse(&bytes).unwrap();
    assert!(perf.is_pipe());
    let attrs: Vec<_> = perf
        .records()
        .filter_map(|r| match r.unwrap().data {
            RecordData::HeaderAttr { attr, .. } => Some((attr.kind, attr.config)),
            _ => None,
        })
        .collect();
    assert_eq!(attrs.len(), 4);
    assert_eq!(attrs[0], (6, 0x300e601));
    // hase 2018-05 recordings are snapshots (AUX OVERWRITE), which is not data loss.
    let bytes = std::fs::read(root.join("hase-pt-recordings/loopy-20180514/perf.data.1")).unwrap();
    let streams = PerfData::parse(&bytes).unwrap().aux_streams();
    assert_eq!(streams.scan.aux_records, 2);
    assert_eq!(streams.loss_count(), 0);
}

// ---------------------------------------------------------------------------------------------
// (b) dump over the whole corpus
// ---------------------------------------------------------------------------------------------

#[test]
fn dump_lists_every_corpus_trace_without_invalid_packets() {
    let Some(root) = corpus() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut figures = Vec::new();
    for trace in support::all_traces() {
        // Raw files are dumped in place; containers (Griffin) through their PT bytes.
        let on_disk = std::fs::read(&trace.pt_path).unwrap();
        let path = if on_disk == trace.pt {
            trace.pt_path.clone()
        } else {
            let p = tmp.path().join(trace.name.replace('/', "_"));
            std::fs::write(&p, &trace.pt).unwrap();
            p
        };
        let out = dump_path(&path, &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            trace.name,
            stderr(&out)
        );
        assert!(out.stderr.is_empty(), "{}: {}", trace.name, stderr(&out));
        let lines = listing_lines(stdout(&out)).len();
        let lib = library_count(&trace.pt, false);
        assert_eq!(lib.invalid, 0, "{}", trace.name);
        assert_eq!(lines, lib.packets, "{}", trace.name);

        // From the first PSB on, the listing has as many packets as libipt's packet decoder.
        let synced = dump_path(&path, &["--sync"]);
        assert_eq!(synced.status.code(), Some(0), "{}", trace.name);
        let synced_lines = listing_lines(stdout(&synced));
        let ipt = support::ipt_packets(&trace.pt);
        assert!(
            ipt.errors.is_empty(),
            "{}: libipt {:?}",
            trace.name,
            ipt.errors
        );
        assert_eq!(synced_lines.len(), ipt.packets.len(), "{}", trace.name);
        let first = format!("{:016x}  psb", ipt.first_sync.unwrap());
        assert_eq!(synced_lines[0], first, "{}", trace.name);
        // Line by line, offsets, names and payloads agree with libipt's packets.
        for (line, record) in synced_lines.iter().zip(&ipt.packets) {
            if let Some(want) = render_libipt(record) {
                assert_eq!(*line, want, "{}", trace.name);
            } else {
                assert_eq!(
                    line[..16],
                    format!("{:016x}", record.offset),
                    "{}",
                    trace.name
                );
            }
        }
        figures.push(format!(
            "{:<32} {:>9} bytes {:>9} packets",
            trace.name,
            trace.pt.len(),
            lines
        ));
    }
    for (path, streams) in perf_files(&root) {
        let out = dump_path(&path, &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            path.display(),
            stderr(&out)
        );
        // stderr: one header line per stream and nothing else.
        let err = stderr(&out);
        assert_eq!(err.lines().count(), streams.len(), "{err}");
        assert!(
            err.lines().all(|l| l.starts_with("ptrewind: stream ")),
            "{err}"
        );
        let mut total = 0;
        for (label, extracted) in &streams {
            let pt = std::fs::read(extracted).unwrap();
            let want = library_count(&pt, false);
            let one = dump_path(&path, &["--stream", label]);
            assert_eq!(one.status.code(), Some(0), "{}", path.display());
            // The per-stream listing is exactly the listing of the extracted bytes.
            let raw = dump_path(extracted, &[]);
            assert_eq!(stdout(&one), stdout(&raw), "{} {label}", path.display());
            assert_eq!(listing_lines(stdout(&one)).len(), want.packets);
            assert!(
                stderr(&one).contains(&format!("stream {label} (")),
                "{}",
                stderr(&one)
            );
            total += want.packets;
        }
        assert_eq!(
            listing_lines(stdout(&out)).len(),
            total,
            "{}",
            path.display()
        );
        let name = path.strip_prefix(&root).unwrap().display().to_string();
        figures.push(format!("{name:<32} {total:>25} packets"));
    }
    eprintln!("packets per corpus file:\n{}", figures.join("\n"));
}

/// A libipt packet rendered the way the listing prints it (None for kinds this test does not
/// render; their offset is still compared).
fn render_libipt(record: &support::libipt::PacketRecord) -> Option<String> {
    use support::libipt::IptPacket as P;
    let ip = |ipc: u32, ip: u64| match ipc {
        0 => "0: ????????????????".to_string(),
        1 => format!("1: ????????????{:04x}", ip & 0xffff),
        2 => format!("2: ????????{:08x}", ip & 0xffff_ffff),
        3 => format!("3: {:016x}", ((ip << 16) as i64 >> 16) as u64),
        4 => format!("4: ????{:012x}", ip & 0xffff_ffff_ffff),
        6 => format!("6: {ip:016x}"),
        _ => format!("bad ipc {ipc}"),
    };
    let tnt = |bits: u8, payload: u64| -> String {
        (0..bits)
            .rev()
            .map(|i| if payload >> i & 1 == 1 { '!' } else { '.' })
            .collect()
    };
    let flags = |f: &[(bool, &str)]| -> String {
        f.iter()
            .filter(|(set, _)| *set)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (name, payload) = match record.packet {
        P::Pad => ("pad", String::new()),
        P::Psb => ("psb", String::new()),
        P::Psbend => ("psbend", String::new()),
        P::Ovf => ("ovf", String::new()),
        P::Stop => ("stop", String::new()),
        P::Fup { ipc, ip: v } => ("fup", ip(ipc, v)),
        P::Tip { ipc, ip: v } => ("tip", ip(ipc, v)),
        P::TipPge { ipc, ip: v } => ("tip.pge", ip(ipc, v)),
        P::TipPgd { ipc, ip: v } => ("tip.pgd", ip(ipc, v)),
        P::Tnt8 { bits, payload } => ("tnt.8", tnt(bits, payload)),
        P::Tnt64 { bits, payload } => ("tnt.64", tnt(bits, payload)),
        P::ModeExec { csl, csd } => ("mode.exec", flags(&[(csl, "cs.l"), (csd, "cs.d")])),
        P::ModeTsx { intx, abrt } => ("mode.tsx", flags(&[(intx, "intx"), (abrt, "abrt")])),
        P::Pip { cr3, nr } => ("pip", format!("{cr3:x}{}", if nr { ", nr" } else { "" })),
        P::Vmcs { base } => ("vmcs", format!("{base:x}")),
        P::Cbr { ratio } => ("cbr", format!("{ratio:x}")),
        P::Tsc { tsc } => ("tsc", format!("{tsc:x}")),
        P::Tma { ctc, fc } => ("tma", format!("{ctc:x}, {fc:x}")),
        P::Mtc { ctc } => ("mtc", format!("{ctc:x}")),
        P::Cyc { value } => ("cyc", format!("{value:x}")),
        _ => return None,
    };
    let line = format!("{:016x}  {name:<11}{payload}", record.offset);
    Some(line.trim_end().to_string())
}

// ---------------------------------------------------------------------------------------------
// (c) --sync, --lastip, --stats
// ---------------------------------------------------------------------------------------------

/// PSB, then the given packets.
fn with_psb(packets: &[&[u8]]) -> Vec<u8> {
    let mut out = ptrewind::packet::PSB_BYTES.to_vec();
    for p in packets {
        out.extend_from_slice(p);
    }
    out
}

#[test]
fn lastip_reconstructs_hand_assembled_ips() {
    let tmp = tempfile::tempdir().unwrap();
    // SDM encodings: TIP.PGE = 0x11 | IPBytes << 5, TIP = 0x0d | .., TIP.PGD = 0x01 | ..,
    // FUP = 0x1d | ..; payload little-endian.
    let pt = with_psb(&[
        &[0x02, 0x23],                                           // psbend
        &[0xd1, 0x00, 0x10, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00], // tip.pge, ipb 6: 7f00001000
        &[0x2d, 0x34, 0x12],                                     // tip, ipb 1: ....1234
        &[0x4d, 0x78, 0x56, 0x34, 0x12],                         // tip, ipb 2: ....12345678
        &[0x7d, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80],             // fup, ipb 3: sext(800000000000)
        &[0x01],                                                 // tip.pgd, ipb 0: suppressed
        &[0x06],                                                 // tnt.8: one taken
    ]);
    let path = tmp.path().join("ips.pt");
    std::fs::write(&path, &pt).unwrap();
    let out = dump_path(&path, &["--lastip"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<&str> = stdout(&out).lines().collect();
    let ip_of = |line: &str| line.rsplit_once("ip=").map(|(_, ip)| ip.to_string());
    assert_eq!(lines.len(), 8);
    assert_eq!(ip_of(lines[0]), None); // psb
    assert_eq!(ip_of(lines[2]).as_deref(), Some("0x0000007f00001000"));
    assert_eq!(ip_of(lines[3]).as_deref(), Some("0x0000007f00001234"));
    assert_eq!(ip_of(lines[4]).as_deref(), Some("0x0000007f12345678"));
    assert_eq!(ip_of(lines[5]).as_deref(), Some("0xffff800000000000"));
    assert_eq!(ip_of(lines[6]).as_deref(), Some("suppressed"));
    assert_eq!(ip_of(lines[7]), None);
    assert!(lines[7].ends_with("tnt.8      !"), "{}", lines[7]);
    // Without --lastip the same lines carry no ip=.
    let plain = dump_path(&path, &[]);
    assert!(!stdout(&plain).contains("ip="));
    let plain_lines: Vec<&str> = stdout(&plain).lines().collect();
    assert_eq!(
        plain_lines[3],
        "000000000000001b  tip        1: ????????????1234"
    );
    assert_eq!(
        plain_lines[4],
        "000000000000001e  tip        2: ????????12345678"
    );
    assert_eq!(
        plain_lines[5],
        "0000000000000023  fup        3: ffff800000000000"
    );
    assert_eq!(
        plain_lines[6],
        "000000000000002a  tip.pgd    0: ????????????????"
    );

    // Before any PSB Last IP is unknown: a compressed IP cannot be reconstructed.
    let path = tmp.path().join("nopsb.pt");
    std::fs::write(&path, [0x2d, 0x34, 0x12]).unwrap();
    let out = dump_path(&path, &["--lastip"]);
    assert!(
        stdout(&out).trim_end().ends_with("ip=unknown"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn lastip_enable_ips_match_hase_ground_truth() {
    let Some(root) = corpus() else { return };
    let h = root.join("hase-pt-recordings");
    for (perf, truth) in [
        (
            "loopy-20180404/loopy-20180404T162955.perf",
            "loopy-20180404/loopy-20180404T162955.trace",
        ),
        (
            "control_flow-20180404/control_flow-20180404T163033.perf",
            "control_flow-20180404/control_flow-20180404T163033.trace",
        ),
    ] {
        // Ground truth: "from<TAB>to", from = 0 is a trace enable at `to`.
        let enables: Vec<u64> = support::corpus::read_branch_list(&h.join(truth))
            .unwrap()
            .into_iter()
            .filter(|&(from, _)| from == 0)
            .map(|(_, to)| to)
            .collect();
        assert!(!enables.is_empty());
        let out = dump_path(&h.join(perf), &["--lastip"]);
        assert_eq!(out.status.code(), Some(0));
        let pge: Vec<u64> = stdout(&out)
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("tip.pge"))
            .map(|l| {
                let ip = l.rsplit_once("ip=0x").expect("tip.pge with an IP").1;
                u64::from_str_radix(ip, 16).unwrap()
            })
            .collect();
        assert_eq!(pge, enables, "{perf}");
    }
}

#[test]
fn sync_skips_to_the_first_psb() {
    let tmp = tempfile::tempdir().unwrap();
    let mut pt = vec![0x06, 0x00, 0x59, 0x12]; // tnt.8, pad, mtc: valid packets before the PSB
    pt.extend(with_psb(&[&[0x02, 0x23]]));
    let path = tmp.path().join("late-psb.pt");
    std::fs::write(&path, &pt).unwrap();
    let plain = dump_path(&path, &[]);
    let lines: Vec<&str> = stdout(&plain).lines().collect();
    assert_eq!(lines.len(), 5);
    assert!(lines[0].starts_with("0000000000000000  tnt.8"));
    let synced = dump_path(&path, &["--sync"]);
    let lines: Vec<&str> = stdout(&synced).lines().collect();
    assert_eq!(
        lines,
        vec!["0000000000000004  psb", "0000000000000014  psbend"]
    );
    let stats = dump_path(&path, &["--sync", "--stats"]);
    assert!(stat(stdout(&stats), "skipped") == 4, "{}", stdout(&stats));
}

/// The number in the `--stats` row `name` (its first numeric column).
fn stat(out: &str, name: &str) -> u64 {
    out.lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some(name)).then(|| words.next().unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {name} row in {out}"))
}

#[test]
fn stats_replace_the_listing_and_agree_with_it() {
    let Some(root) = corpus() else { return };
    let path = root.join("quipper-perfdata-intel_pt/perf.data.intel_pt-4.14");
    let listing = dump_path(&path, &["--stream", "cpu3"]);
    let out = dump_path(&path, &["--stream", "cpu3", "--stats"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(
        !text.contains("0000000000000000  psb"),
        "listing leaked into --stats"
    );
    let lines = stdout(&listing).lines().collect::<Vec<_>>();
    assert_eq!(stat(text, "total"), lines.len() as u64);
    for name in ["psb", "tnt.8", "tip", "pad", "mtc", "tip.pge"] {
        let n = lines
            .iter()
            .filter(|l| l.split_whitespace().nth(1) == Some(name))
            .count() as u64;
        assert_eq!(stat(text, name), n, "{name}");
    }
    assert_eq!(stat(text, "invalid"), 0);
    assert_eq!(stat(text, "resyncs"), 0);
    assert_eq!(stat(text, "data-loss"), 0);
    // Bytes: the packets cover the whole stream.
    let total_bytes: u64 = text
        .lines()
        .find(|l| l.trim_start().starts_with("total"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total_bytes, 0x21a00);
    // With several streams there is a total block too.
    let all = dump_path(&path, &["--stats"]);
    assert!(
        stdout(&all).contains("stream total: 149968 bytes"),
        "{}",
        stdout(&all)
    );
}

// ---------------------------------------------------------------------------------------------
// (d) corrupt inputs
// ---------------------------------------------------------------------------------------------

#[test]
fn garbage_in_a_pt_stream_is_reported_and_resynced() {
    let Some(root) = corpus() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut pt =
        std::fs::read(root.join("hase-pt-recordings/extracted-aux/loopy-20180514T145114.aux.bin"))
            .unwrap();
    // Overwrite the packet after the second PSB's PSBEND with bytes no packet starts with
    // (0x39: reserved first byte), so the invalid offset is known exactly.
    let psbs: Vec<usize> = (0..pt.len())
        .filter(|&i| ptrewind::packet::find_psb_forward(&pt, i) == Some(i))
        .collect();
    assert!(psbs.len() >= 3, "{psbs:?}");
    let mut dec = PacketDecoder::new(&pt);
    dec.set_position(psbs[1]);
    let mut at = 0;
    for item in dec.by_ref() {
        let (offset, packet) = item.unwrap();
        if packet == ptrewind::packet::Packet::PsbEnd {
            at = offset as usize + 2;
            break;
        }
    }
    assert!(at > psbs[1] && at + 4 < psbs[2]);
    pt[at..at + 4].fill(0x39);
    let path = tmp.path().join("garbage.pt");
    std::fs::write(&path, &pt).unwrap();

    let out = dump_path(&path, &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("invalid packet at offset {at:#x}")),
        "{err}"
    );
    assert!(
        err.contains(&format!("resynced at PSB offset {:#x}", psbs[2])),
        "{err}"
    );
    let lines = listing_lines(stdout(&out));
    let want = library_count(&pt, false);
    assert_eq!((want.invalid, lines.len()), (1, want.packets));
    // The listing jumps from before the garbage to the next PSB.
    let after = lines
        .iter()
        .position(|l| u64::from_str_radix(&l[..16], 16).unwrap() >= at as u64)
        .unwrap();
    assert_eq!(lines[after], format!("{:016x}  psb", psbs[2]));
    let stats = dump_path(&path, &["--stats"]);
    assert_eq!(stats.status.code(), Some(1));
    assert_eq!(stat(stdout(&stats), "invalid"), 1);
    assert_eq!(stat(stdout(&stats), "resyncs"), 1);
    assert_eq!(stat(stdout(&stats), "skipped"), (psbs[2] - at) as u64);

    // Pseudo-random garbage (xorshift): never a panic, every invalid packet reported.
    let mut x = 0x9e3779b97f4a7c15u64;
    let mut noise: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    noise.splice(30_000..30_000, ptrewind::packet::PSB_BYTES);
    let path = tmp.path().join("noise.pt");
    std::fs::write(&path, &noise).unwrap();
    let out = dump_path(&path, &["--stats"]);
    let want = library_count(&noise, false);
    assert!(want.invalid > 0);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stat(stdout(&out), "invalid"), want.invalid as u64);
    assert_eq!(
        stderr(&out).matches("invalid packet at offset").count(),
        want.invalid
    );
    assert_eq!(stat(stdout(&out), "resyncs"), 1);
}

#[test]
fn truncated_last_packet_is_not_invalid() {
    let tmp = tempfile::tempdir().unwrap();
    // PSB, PSBEND, then a TSC cut after 4 of its 8 bytes.
    let pt = with_psb(&[&[0x02, 0x23], &[0x19, 0x01, 0x02, 0x03]]);
    let path = tmp.path().join("cut.pt");
    std::fs::write(&path, &pt).unwrap();
    let out = dump_path(&path, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2);
    let err = stderr(&out);
    assert!(err.contains("truncated packet at offset 0x12"), "{err}");
    assert!(!err.contains("invalid"), "{err}");
    let stats = dump_path(&path, &["--stats"]);
    assert_eq!(stat(stdout(&stats), "truncated"), 4);
    assert_eq!(stat(stdout(&stats), "invalid"), 0);
}

#[test]
fn truncated_perf_data_keeps_the_complete_streams() {
    let Some(root) = corpus() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let q = root.join("quipper-perfdata-intel_pt");
    let bytes = std::fs::read(q.join("perf.data.intel_pt-4.14")).unwrap();
    // Cut inside the cpu3 AUXTRACE payload (record at 0x7788 per perf -D, 0x30-byte header).
    let cut = &bytes[..0x7788 + 0x30 + 1000];
    let path = tmp.path().join("cut.perf");
    std::fs::write(&path, cut).unwrap();
    let out = dump_path(&path, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("perf.data offset 0x7788"), "{err}");
    assert!(err.contains("record type 71 needs"), "{err}");
    // cpu0 came before the damage and is listed whole.
    let cpu0 = std::fs::read(q.join("extracted/aux_perf.data.intel_pt-4.14_0_cpu0.bin")).unwrap();
    assert_eq!(
        listing_lines(stdout(&out)).len(),
        library_count(&cpu0, false).packets
    );
    // A file cut inside its header is a hard error.
    let path = tmp.path().join("header.perf");
    std::fs::write(&path, &bytes[..50]).unwrap();
    let out = dump_path(&path, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("header"), "{}", stderr(&out));
}

#[test]
fn mutated_perf_data_never_panics() {
    let Some(root) = corpus() else { return };
    let q = root.join("quipper-perfdata-intel_pt");
    let h = root.join("hase-pt-recordings");
    let mut x = 0x2545f4914f6cdd1du64;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for path in [
        h.join("loopy-20180404/loopy-20180404T162955.perf"),
        h.join("control_flow-20180515/perf.data.1"),
        q.join("perf.data.piped.intel_pt-4.14"),
    ] {
        let original = std::fs::read(&path).unwrap();
        for round in 0..300 {
            let mut bytes = original.clone();
            // Mostly header and record headers, where a flipped byte changes the structure.
            for _ in 0..1 + round % 8 {
                let limit = if round % 2 == 0 { 4096 } else { bytes.len() };
                let at = rand() as usize % limit.min(bytes.len());
                bytes[at] = rand() as u8;
            }
            if round % 5 == 0 {
                bytes.truncate(rand() as usize % bytes.len());
            }
            // Whatever the damage: a value, never a panic; streams stay within the file.
            if let Ok(source) = TraceStreams::from_bytes(&bytes) {
                for stream in &source.streams {
                    for chunk in &stream.chunks {
                        assert!(chunk.file_offset + chunk.size <= bytes.len() as u64);
                    }
                }
            }
            if let Ok(perf) = PerfData::parse(&bytes) {
                for record in perf.records() {
                    let _ = record;
                }
                let _ = perf.build_ids();
            }
        }
    }
}

#[test]
fn bogus_record_sizes_are_errors_with_offsets() {
    let Some(root) = corpus() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(root.join("hase-pt-recordings/loopy-20180514/perf.data.1")).unwrap();
    let perf = PerfData::parse(&bytes).unwrap();
    let mmap2 = perf
        .records()
        .map(|r| r.unwrap())
        .find(|r| matches!(r.data, RecordData::Mmap2 { .. }))
        .unwrap()
        .offset as usize;
    for (size, what) in [
        (0xfff8u16, "needs 65528 bytes"),
        (4, "record size 4 is smaller"),
    ] {
        let mut bad = bytes.clone();
        bad[mmap2 + 6..mmap2 + 8].copy_from_slice(&size.to_le_bytes());
        let path = tmp.path().join(format!("size{size}.perf"));
        std::fs::write(&path, &bad).unwrap();
        let out = dump_path(&path, &[]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!("perf.data offset {mmap2:#x}")),
            "{err}"
        );
        assert!(err.contains(what), "{err}");
    }
}

/// A pipe-mode perf.data with the given AUXTRACE chunks (payload, aux offset) on CPU 1.
fn pipe_perf_data(chunks: &[(&[u8], u64)]) -> Vec<u8> {
    let mut out = b"PERFILE2".to_vec();
    out.extend_from_slice(&16u64.to_le_bytes());
    for (payload, aux_offset) in chunks {
        out.extend_from_slice(&record_type::AUXTRACE.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&48u16.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&aux_offset.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes()); // reference
        for v in [1u32, 77, 1, 0] {
            out.extend_from_slice(&v.to_le_bytes()); // idx, tid, cpu, reserved
        }
        out.extend_from_slice(payload);
    }
    out
}

#[test]
fn aux_gap_is_data_loss_and_decoding_resumes_at_a_psb() {
    let tmp = tempfile::tempdir().unwrap();
    let first = with_psb(&[&[0x02, 0x23], &[0x19, 0x01, 0x02]]); // ends inside a TSC
    let second = with_psb(&[&[0x02, 0x23]]);
    let mut junk_then_psb = vec![0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08];
    junk_then_psb.extend(with_psb(&[&[0x02, 0x23]]));
    let file = pipe_perf_data(&[
        (&first, 0),
        (&junk_then_psb, first.len() as u64 + 64), // 64 bytes lost
        (
            &second,
            first.len() as u64 + 64 + junk_then_psb.len() as u64,
        ),
    ]);
    let path = tmp.path().join("gap.perf");
    std::fs::write(&path, &file).unwrap();
    let out = dump_path(&path, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let gap_at = first.len();
    assert!(
        err.contains(&format!(
            "data loss (AUX gap of 64 bytes) at offset {gap_at:#x}"
        )),
        "{err}"
    );
    // The cut TSC is truncated at the loss point, the junk after it skipped to the PSB.
    assert!(err.contains("truncated packet at offset 0x12"), "{err}");
    assert!(!err.contains("invalid"), "{err}");
    let lines = listing_lines(stdout(&out));
    let offsets: Vec<String> = lines.iter().map(|l| l[..16].to_string()).collect();
    let psb2 = gap_at + 8;
    assert_eq!(
        offsets,
        [0, 0x10, psb2, psb2 + 16, psb2 + 18, psb2 + 34]
            .iter()
            .map(|o| format!("{o:016x}"))
            .collect::<Vec<_>>()
    );
    let stats = dump_path(&path, &["--stats"]);
    assert_eq!(stat(stdout(&stats), "data-loss"), 1);
    assert_eq!(stat(stdout(&stats), "skipped"), 8);
}

#[test]
fn cli_errors_exit_2() {
    let out = dump(&["/nonexistent/ptrewind.pt"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/nonexistent/ptrewind.pt"));
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("one.perf");
    std::fs::write(&path, pipe_perf_data(&[(&with_psb(&[]), 0)])).unwrap();
    let out = dump_path(&path, &["--stream", "cpu7"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("streams: cpu1"), "{}", stderr(&out));
    let out = dump_path(&path, &["--stream", "cpu1"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), "0000000000000000  psb\n");
    // An unknown record type is stepped over by its size and counted, not fatal.
    let mut file = pipe_perf_data(&[(&with_psb(&[]), 0)]);
    file.extend_from_slice(&[0xc8, 0, 0, 0, 0, 0, 16, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    file.extend_from_slice(&pipe_perf_data(&[(&with_psb(&[&[0x02, 0x23]]), 16)])[16..]);
    std::fs::write(&path, &file).unwrap();
    let out = dump_path(&path, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 record(s) of types not decoded"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out).lines().count(), 3);
    let help = Command::new(BIN).args(["dump", "--help"]).output().unwrap();
    let help = stdout(&help).to_string();
    assert!(
        help.contains("EXIT STATUS") && help.contains("--lastip"),
        "{help}"
    );
}

#[test]
fn pipe_mode_perf_data_from_stdin() {
    let Some(root) = corpus() else { return };
    let path = root.join("quipper-perfdata-intel_pt/perf.data.piped.intel_pt-4.14");
    let from_file = dump_path(&path, &[]);
    let from_stdin = Command::new(BIN)
        .args(["dump", "-"])
        .stdin(std::fs::File::open(&path).unwrap())
        .output()
        .unwrap();
    assert_eq!(from_stdin.status.code(), Some(0), "{}", stderr(&from_stdin));
    assert!(!from_stdin.stdout.is_empty());
    assert_eq!(from_stdin.stdout, from_file.stdout);
}
