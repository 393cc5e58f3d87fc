//! Packet-decoding throughput: ptrewind's `PacketDecoder` against libipt's packet decoder
//! (`pt_pkt_alloc_decoder` / `pt_pkt_sync_forward` / `pt_pkt_next`) on the same large buffer, in
//! one run.
//!
//! The buffer is built from the real raw PT streams of the corpus (libxdc, hase, quipper,
//! DynamoRIO), each cut to start at its first PSB and to end after its last complete packet,
//! concatenated and repeated until it reaches `--mib` MiB. An untimed cross-check first requires
//! both decoders to produce the same sequence of (packet type, size) on one repetition; in the
//! timed runs both count packets and the counts must agree. Times are the best of `--reps` runs
//! of each decoder (interleaved), as thread CPU time (the machine is shared) and wall time.
//!
//! ```text
//! cargo run --release --example bench_packets -- [--mib 256] [--reps 3] [--corpus DIR]
//!     [--only libipt|next|read|read_moved|batch[,...]] [--kinds]
//! ```

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ptrewind::packet::{Packet, PacketDecoder, Stop, find_psb_forward};

mod libipt {
    //! The few libipt 2.0 declarations the benchmark needs, matching /usr/include/intel-pt.h.
    use std::ffi::c_void;

    /// `struct pt_cpu`.
    #[repr(C)]
    pub struct PtCpu {
        pub vendor: u32,
        pub family: u16,
        pub model: u8,
        pub stepping: u8,
    }

    /// `struct pt_errata`: one word of bit fields plus `reserved[15]`.
    #[repr(C)]
    pub struct PtErrata {
        pub bits: u32,
        pub reserved: [u32; 15],
    }

    /// `struct pt_conf_flags`: a union of bit-field structs and `reserved[4]`.
    #[repr(C)]
    pub struct PtConfFlags {
        pub variant: [u32; 4],
    }

    /// `struct pt_conf_addr_filter`.
    #[repr(C)]
    pub struct PtConfAddrFilter {
        pub addr_cfg: u64,
        pub addr: [u64; 8],
        pub reserved: [u64; 8],
    }

    /// `struct pt_config`.
    #[repr(C)]
    pub struct PtConfig {
        pub size: usize,
        pub begin: *mut u8,
        pub end: *mut u8,
        pub decode_callback: *mut c_void,
        pub decode_context: *mut c_void,
        pub cpu: PtCpu,
        pub errata: PtErrata,
        pub cpuid_0x15_eax: u32,
        pub cpuid_0x15_ebx: u32,
        pub mtc_freq: u8,
        pub nom_freq: u8,
        pub flags: PtConfFlags,
        pub addr_filter: PtConfAddrFilter,
    }

    /// `struct pt_packet`: type, size and a 16-byte payload union.
    #[repr(C)]
    pub struct PtPacket {
        pub kind: u32,
        pub size: u8,
        pub payload: [u64; 2],
    }

    // Layout checks against the C header (sizeof(struct pt_config) = 280, pt_packet = 24 on
    // x86-64, measured with a C program including intel-pt.h).
    const _: () = assert!(std::mem::size_of::<PtConfig>() == 280);
    const _: () = assert!(std::mem::offset_of!(PtConfig, cpuid_0x15_eax) == 112);
    const _: () = assert!(std::mem::offset_of!(PtConfig, flags) == 124);
    const _: () = assert!(std::mem::offset_of!(PtConfig, addr_filter) == 144);
    const _: () = assert!(std::mem::size_of::<PtPacket>() == 24);

    /// `ppt_tnt_8` of `enum pt_packet_type`.
    pub const PPT_TNT_8: u32 = 9;

    /// `-pte_eos`.
    pub const PTE_EOS: i32 = 7;

    /// Opaque `struct pt_packet_decoder`.
    #[repr(C)]
    pub struct PtPacketDecoder {
        _private: [u8; 0],
    }

    #[link(name = "ipt")]
    unsafe extern "C" {
        pub fn pt_pkt_alloc_decoder(config: *const PtConfig) -> *mut PtPacketDecoder;
        pub fn pt_pkt_free_decoder(decoder: *mut PtPacketDecoder);
        pub fn pt_pkt_sync_forward(decoder: *mut PtPacketDecoder) -> i32;
        pub fn pt_pkt_next(
            decoder: *mut PtPacketDecoder,
            packet: *mut PtPacket,
            psize: usize,
        ) -> i32;
        pub fn pt_errstr(code: i32) -> *const std::ffi::c_char;
    }
}

/// Result of one decoding pass. Every consumer does the same work per packet: count it, add a
/// TNT-8's outcome count to `tnt_bits` (so each reads the packet's kind and a payload field, and
/// the sums must agree between the decoders) and pass the packet to `black_box`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    packets: u64,
    bytes: u64,
    errors: u64,
    tnt_bits: u64,
}

fn corpus_dir(arg: Option<PathBuf>) -> PathBuf {
    arg.or_else(|| std::env::var_os("PTREWIND_CORPUS").map(PathBuf::from))
        .unwrap_or_else(|| {
            // <crate root>/../shared/corpus for the main checkout, one level more for worktrees.
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            ["../shared/corpus", "../../shared/corpus"]
                .iter()
                .map(|rel| root.join(rel))
                .find(|p| p.is_dir())
                .unwrap_or_else(|| root.join("../shared/corpus"))
        })
}

/// The raw PT streams of the corpus (see each folder's SOURCE.txt).
fn raw_streams(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for sub in [
        "libxdc-experiments",
        "hase-pt-recordings/extracted-aux",
        "quipper-perfdata-intel_pt/extracted",
        "dynamorio-drpt2trace",
    ] {
        let Ok(rd) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                let Ok(rd) = std::fs::read_dir(&p) else {
                    continue;
                };
                let mut inner: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
                inner.sort();
                for q in inner {
                    let name = q.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    let raw = name == "pt.bin"
                        || name.starts_with("trace")
                        || name.starts_with("failed_trace")
                        || name.starts_with("sample_raw")
                        || name == "ptlog"
                        || name.starts_with("loop_trace");
                    if raw {
                        v.push(q);
                    }
                }
            } else if p.extension().is_some_and(|e| e == "bin") {
                v.push(p);
            }
        }
    }
    v
}

/// Cuts a stream to [first PSB, end of the last complete packet) and checks that it decodes
/// without errors; returns `None` otherwise.
fn clean_stream(bytes: &[u8]) -> Option<&[u8]> {
    let start = find_psb_forward(bytes, 0)?;
    let s = &bytes[start..];
    let mut dec = PacketDecoder::new(s);
    let mut end = 0;
    while let Some(r) = dec.next_packet() {
        match r {
            Ok(_) => end = dec.position(),
            Err(ptrewind::packet::PacketError::Truncated { .. }) => break,
            Err(_) => return None,
        }
    }
    Some(&s[..end])
}

/// libipt's `enum pt_packet_type` value for one of our packets (BBP/BIP/BEP, CFE and EVD are
/// newer than libipt 2.0 and map to 0 = ppt_invalid).
fn ppt(p: &Packet) -> u32 {
    match p {
        Packet::Pad => 2,
        Packet::Psb => 3,
        Packet::PsbEnd => 4,
        Packet::Fup(_) => 5,
        Packet::Tip(_) => 6,
        Packet::TipPge(_) => 7,
        Packet::TipPgd(_) => 8,
        Packet::ShortTnt(_) => 9,
        Packet::LongTnt(_) => 10,
        Packet::ModeExec { .. } | Packet::ModeTsx { .. } => 11,
        Packet::Pip { .. } => 12,
        Packet::Vmcs { .. } => 13,
        Packet::Cbr { .. } => 14,
        Packet::Tsc { .. } => 15,
        Packet::Tma { .. } => 16,
        Packet::Mtc { .. } => 17,
        Packet::Cyc { .. } => 18,
        Packet::TraceStop => 19,
        Packet::Ovf => 20,
        Packet::Mnt { .. } => 21,
        Packet::Exstop { .. } => 22,
        Packet::Mwait { .. } => 23,
        Packet::Pwre { .. } => 24,
        Packet::Pwrx { .. } => 25,
        Packet::Ptw { .. } => 26,
        Packet::Bbp { .. } | Packet::Bip { .. } | Packet::Bep { .. } => 0,
        Packet::Cfe { .. } | Packet::Evd { .. } => 0,
    }
}

/// Untimed cross-check on one repetition of the input: both decoders must produce the same
/// sequence of (packet type, packet size). Returns the number of packets compared.
fn cross_check(buf: &mut [u8]) -> usize {
    use libipt::*;
    let ours: Vec<(u32, u8)> = {
        let mut v = Vec::new();
        let mut dec = PacketDecoder::new(buf);
        while let Some(Ok((off, p))) = dec.next_packet() {
            v.push((ppt(&p), (dec.position() as u64 - off) as u8));
        }
        v
    };
    // The per-packet `read` API must give exactly what `next_packet` gives.
    let mut dec = PacketDecoder::new(buf);
    let mut i = 0;
    while let Ok(p) = dec.read() {
        let size = (dec.position() as u64 - dec.last_offset()) as u8;
        assert_eq!(
            ours.get(i),
            Some(&(ppt(&p), size)),
            "read() differs at packet {i}"
        );
        i += 1;
    }
    assert_eq!(i, ours.len(), "read() stopped after {i} packets");
    let mut theirs = Vec::with_capacity(ours.len());
    // SAFETY: as in libipt_pass: a zeroed pt_config with size, begin and end describing `buf`.
    let mut cfg: PtConfig = unsafe { std::mem::zeroed() };
    cfg.size = std::mem::size_of::<PtConfig>();
    cfg.begin = buf.as_mut_ptr();
    // SAFETY: one past the end of the same allocation.
    cfg.end = unsafe { buf.as_mut_ptr().add(buf.len()) };
    // SAFETY: cfg describes `buf`, which outlives the decoder.
    let dec = unsafe { pt_pkt_alloc_decoder(&cfg) };
    assert!(!dec.is_null(), "pt_pkt_alloc_decoder failed");
    // SAFETY: dec is live.
    if unsafe { pt_pkt_sync_forward(dec) } >= 0 {
        let mut pkt = PtPacket {
            kind: 0,
            size: 0,
            payload: [0; 2],
        };
        // SAFETY: dec is live; pkt is a properly sized pt_packet.
        while unsafe { pt_pkt_next(dec, &mut pkt, std::mem::size_of::<PtPacket>()) } >= 0 {
            theirs.push((pkt.kind, pkt.size));
        }
    }
    // SAFETY: allocated above, freed once.
    unsafe { pt_pkt_free_decoder(dec) };
    if let Some(i) = ours.iter().zip(&theirs).position(|(a, b)| a != b) {
        panic!(
            "packet {i} differs: ptrewind (type, size) {:?}, libipt {:?}",
            ours[i], theirs[i]
        );
    }
    assert_eq!(ours.len(), theirs.len(), "packet counts differ");
    ours.len()
}

// The counters of the consumers below are locals, not fields of the returned `Counts`: the
// result is written through the caller's return slot, which `black_box` (it clobbers memory)
// forced to be stored on every packet.

#[inline(never)]
fn ours(buf: &[u8]) -> Counts {
    let (mut packets, mut errors, mut tnt_bits) = (0u64, 0u64, 0u64);
    let mut dec = PacketDecoder::new(buf);
    loop {
        // Borrow the packet where the decoder built it (as a consumer that matches on it does);
        // see docs/benchmarks.md on moving packets out of the result.
        let item = dec.next_packet();
        let Some(r) = &item else { break };
        match r {
            Ok((_, p)) => {
                packets += 1;
                if let Packet::ShortTnt(t) = p {
                    tnt_bits += t.count as u64;
                }
                black_box(p);
            }
            Err(_) => {
                errors += 1;
                if dec.sync_forward().is_none() {
                    break;
                }
            }
        }
    }
    Counts {
        packets,
        bytes: dec.position() as u64,
        errors,
        tnt_bits,
    }
}

/// The same consumer over the 16-byte `read` API (offset on demand, error kept in the decoder),
/// borrowing the packet in the result.
#[inline(never)]
fn ours_read(buf: &[u8]) -> Counts {
    let (mut packets, mut errors, mut tnt_bits) = (0u64, 0u64, 0u64);
    let mut dec = PacketDecoder::new(buf);
    loop {
        let r = dec.read();
        match &r {
            Ok(p) => {
                packets += 1;
                if let Packet::ShortTnt(t) = p {
                    tnt_bits += t.count as u64;
                }
                black_box(p);
            }
            Err(Stop::End) => break,
            Err(Stop::Error) => {
                errors += 1;
                black_box(dec.take_error());
                if dec.sync_forward().is_none() {
                    break;
                }
            }
        }
    }
    Counts {
        packets,
        bytes: dec.position() as u64,
        errors,
        tnt_bits,
    }
}

/// The same over `read`, moving the packet out of the result (`Ok(p) => …`), as most code
/// would write it.
#[inline(never)]
fn ours_read_moved(buf: &[u8]) -> Counts {
    let (mut packets, mut errors, mut tnt_bits) = (0u64, 0u64, 0u64);
    let mut dec = PacketDecoder::new(buf);
    loop {
        match dec.read() {
            Ok(p) => {
                packets += 1;
                if let Packet::ShortTnt(t) = p {
                    tnt_bits += t.count as u64;
                }
                black_box(&p);
            }
            Err(Stop::End) => break,
            Err(Stop::Error) => {
                errors += 1;
                black_box(dec.take_error());
                if dec.sync_forward().is_none() {
                    break;
                }
            }
        }
    }
    Counts {
        packets,
        bytes: dec.position() as u64,
        errors,
        tnt_bits,
    }
}

#[inline(never)]
fn ours_batch(buf: &[u8], scratch: &mut Vec<(u64, Packet)>) -> Counts {
    let (mut packets, mut errors, mut tnt_bits) = (0u64, 0u64, 0u64);
    let mut dec = PacketDecoder::new(buf);
    loop {
        scratch.clear();
        let done = match dec.decode_into(scratch, 4096) {
            Ok(0) => true,
            Ok(_) => false,
            Err(_) => {
                errors += 1;
                dec.sync_forward().is_none()
            }
        };
        packets += scratch.len() as u64;
        for (_, p) in scratch.iter() {
            if let Packet::ShortTnt(t) = p {
                tnt_bits += t.count as u64;
            }
        }
        black_box(&scratch);
        if done {
            break;
        }
    }
    Counts {
        packets,
        bytes: dec.position() as u64,
        errors,
        tnt_bits,
    }
}

#[inline(never)]
fn libipt_pass(buf: &mut [u8]) -> Counts {
    use libipt::*;
    let (mut packets, mut errors, mut tnt_bits) = (0u64, 0u64, 0u64);
    // SAFETY: PtConfig is plain data; all-zero is libipt's documented initial state
    // (pt_config_init memsets it and sets `size`).
    let mut cfg: PtConfig = unsafe { std::mem::zeroed() };
    cfg.size = std::mem::size_of::<PtConfig>();
    cfg.begin = buf.as_mut_ptr();
    // SAFETY: one past the end of the same allocation.
    cfg.end = unsafe { buf.as_mut_ptr().add(buf.len()) };
    // SAFETY: cfg is a valid pt_config describing `buf`, which outlives the decoder.
    let dec = unsafe { pt_pkt_alloc_decoder(&cfg) };
    assert!(!dec.is_null(), "pt_pkt_alloc_decoder failed");
    // SAFETY: dec is a live decoder.
    let mut st = unsafe { pt_pkt_sync_forward(dec) };
    let mut pkt = PtPacket {
        kind: 0,
        size: 0,
        payload: [0; 2],
    };
    while st >= 0 {
        // SAFETY: dec is live; pkt is a properly sized pt_packet.
        let r = unsafe { pt_pkt_next(dec, &mut pkt, std::mem::size_of::<PtPacket>()) };
        if r >= 0 {
            packets += 1;
            if pkt.kind == PPT_TNT_8 {
                // `struct pt_packet_tnt`: `bit_size` is the payload's first byte.
                tnt_bits += pkt.payload[0] & 0xff;
            }
            black_box(&pkt);
            continue;
        }
        if r == -PTE_EOS {
            break;
        }
        errors += 1;
        if errors <= 3 {
            // SAFETY: pt_errstr returns a static NUL-terminated string.
            let msg = unsafe { std::ffi::CStr::from_ptr(pt_errstr(-r)) };
            eprintln!("libipt: error {r} ({})", msg.to_string_lossy());
        }
        // SAFETY: dec is live.
        st = unsafe { pt_pkt_sync_forward(dec) };
    }
    // SAFETY: dec came from pt_pkt_alloc_decoder and is freed once.
    unsafe { pt_pkt_free_decoder(dec) };
    Counts {
        packets,
        bytes: buf.len() as u64,
        errors,
        tnt_bits,
    }
}

/// `--kinds`: where the time goes per kind of packet. The corpus's packets are split, in stream
/// order, into the one-byte packets (PAD, TNT-8), the IP packets (TIP, TIP.PGE, TIP.PGD, FUP) and
/// the rest (PSB+ contents, timing); each part, repeated to the input size after one PSB (libipt starts at a PSB), is a valid
/// packet stream of its own, decoded by libipt and by the `read` consumer. The time per packet of each
/// part says what a packet of that kind costs in the mixed stream, up to the branch history the
/// mix changes.
fn per_kind(unit: &[u8], target: usize, reps: usize) {
    let mut parts: [(&str, Vec<u8>); 3] = [
        ("one-byte (PAD, TNT-8)", Vec::new()),
        ("IP (TIP*, FUP)", Vec::new()),
        ("other", Vec::new()),
    ];
    let mut dec = PacketDecoder::new(unit);
    let mut at = 0;
    while let Some(Ok((_, p))) = dec.next_packet() {
        let part = match p {
            Packet::Pad | Packet::ShortTnt(_) => 0,
            Packet::Tip(_) | Packet::TipPge(_) | Packet::TipPgd(_) | Packet::Fup(_) => 1,
            _ => 2,
        };
        parts[part].1.extend_from_slice(&unit[at..dec.position()]);
        at = dec.position();
    }
    for (name, part) in parts {
        if std::env::var("BENCH_KIND").is_ok_and(|k| !name.starts_with(&k)) {
            continue;
        }
        // libipt starts decoding at a PSB.
        let mut buf = Vec::with_capacity(target + part.len());
        if !part.starts_with(&ptrewind::packet::PSB_BYTES) {
            buf.extend_from_slice(&ptrewind::packet::PSB_BYTES);
        }
        while buf.len() < target {
            buf.extend_from_slice(&part);
        }
        let (mut ipt, mut red) = (Measure::new(), Measure::new());
        for _ in 0..reps {
            ipt.run(|| libipt_pass(&mut buf));
            red.run(|| ours_read(&buf));
        }
        let (Some(a), Some(b)) = (ipt.counts, red.counts) else {
            continue;
        };
        assert_eq!(a.packets, b.packets, "{name}: packet counts differ");
        let ns = |m: &Measure| m.cpu.as_secs_f64() * 1e9 / a.packets as f64;
        println!(
            "{name:<22}: {:>10} packets, {:.2} bytes/packet; libipt {:.2} ns/packet, read {:.2} ns/packet ({:.2}x)",
            a.packets,
            buf.len() as f64 / a.packets as f64,
            ns(&ipt),
            ns(&red),
            ipt.cpu.as_secs_f64() / red.cpu.as_secs_f64()
        );
    }
}

/// CPU time of the calling thread: the machine is shared, so wall time would mostly measure the
/// other processes; thread CPU time counts only the cycles this decoder ran.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which is valid and writable.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One measured decoder: its best (smallest) CPU and wall time over the repetitions.
struct Measure {
    counts: Option<Counts>,
    cpu: Duration,
    wall: Duration,
}

impl Measure {
    fn new() -> Self {
        Measure {
            counts: None,
            cpu: Duration::MAX,
            wall: Duration::MAX,
        }
    }

    fn run<F: FnOnce() -> Counts>(&mut self, f: F) {
        let (w0, c0) = (Instant::now(), thread_cpu_time());
        let c = f();
        let (cpu, wall) = (thread_cpu_time() - c0, w0.elapsed());
        self.cpu = self.cpu.min(cpu);
        self.wall = self.wall.min(wall);
        if let Some(prev) = self.counts {
            assert_eq!(prev, c, "non-deterministic counts");
        }
        self.counts = Some(c);
    }
}

fn rate(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64()
}

fn main() {
    let mut mib = 256usize;
    let mut reps = 3usize;
    let mut corpus = None;
    let mut only: Option<String> = None;
    let mut kinds = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mib" => mib = args.next().and_then(|v| v.parse().ok()).expect("--mib N"),
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            "--corpus" => corpus = args.next().map(PathBuf::from),
            "--only" => only = args.next(),
            "--kinds" => kinds = true,
            other => panic!("unknown argument {other}"),
        }
    }
    let reps = reps.max(1);
    let dir = corpus_dir(corpus);
    let mut unit = Vec::new();
    let mut used = 0;
    for path in raw_streams(&dir) {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        match clean_stream(&bytes) {
            Some(s) if !s.is_empty() => {
                unit.extend_from_slice(s);
                used += 1;
            }
            _ => eprintln!(
                "skipping {} (no PSB or not cleanly decodable)",
                path.display()
            ),
        }
    }
    assert!(
        !unit.is_empty(),
        "no raw PT streams found under {}",
        dir.display()
    );
    let checked = cross_check(&mut unit);
    println!(
        "cross-check: both decoders give the same {checked} (packet type, size) pairs on one repetition"
    );
    let target = mib << 20;
    let mut buf = Vec::with_capacity(target + unit.len());
    while buf.len() < target {
        buf.extend_from_slice(&unit);
    }
    if kinds {
        per_kind(&unit, target, reps);
        return;
    }
    if std::env::var_os("BENCH_STATS").is_some() {
        let mut hist = std::collections::BTreeMap::<&str, (u64, u64)>::new();
        let mut dec = PacketDecoder::new(&unit);
        while let Some(Ok((off, p))) = dec.next_packet() {
            let e = hist.entry(p.name()).or_default();
            e.0 += 1;
            e.1 += dec.position() as u64 - off;
        }
        eprintln!("packet mix of one repetition (name: packets, bytes): {hist:?}");
        eprintln!(
            "sizes: Packet {} B, next_packet item {} B",
            std::mem::size_of::<Packet>(),
            std::mem::size_of::<Option<Result<(u64, Packet), ptrewind::packet::PacketError>>>()
        );
    }
    println!(
        "input: {used} raw corpus streams ({} bytes) repeated to {} bytes ({:.1} MiB); best of {reps}",
        unit.len(),
        buf.len(),
        buf.len() as f64 / (1 << 20) as f64
    );

    // Interleave the decoders in every repetition so that load changes hit all of them alike.
    let (mut ipt, mut our, mut bat) = (Measure::new(), Measure::new(), Measure::new());
    let (mut red, mut mov) = (Measure::new(), Measure::new());
    let mut scratch = Vec::with_capacity(4096);
    for _ in 0..reps {
        let want = |name: &str| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|o| o == name))
        };
        if want("libipt") {
            ipt.run(|| libipt_pass(&mut buf));
        }
        if want("next") {
            our.run(|| ours(&buf));
        }
        if want("read") {
            red.run(|| ours_read(&buf));
        }
        if want("read_moved") {
            mov.run(|| ours_read_moved(&buf));
        }
        if want("batch") {
            bat.run(|| ours_batch(&buf, &mut scratch));
        }
    }
    let report = |name: &str, m: &Measure| {
        let c = m.counts?;
        let ratio = if ipt.counts.is_some() {
            format!(
                " ({:.2}x libipt)",
                ipt.cpu.as_secs_f64() / m.cpu.as_secs_f64()
            )
        } else {
            String::new()
        };
        println!(
            "{name:<24}: {:>10} packets, {} errors, cpu {:>7.3} s = {:>7.1} MB/s{ratio}; wall {:>7.3} s = {:>7.1} MB/s",
            c.packets,
            c.errors,
            m.cpu.as_secs_f64(),
            rate(buf.len(), m.cpu) / 1e6,
            m.wall.as_secs_f64(),
            rate(buf.len(), m.wall) / 1e6,
        );
        Some(c)
    };
    let ipt = report("libipt pt_pkt_next", &ipt);
    let our = report("ptrewind next_packet", &our);
    let red = report("ptrewind read", &red);
    let mov = report("ptrewind read, moved out", &mov);
    let bat = report("ptrewind decode_into", &bat);
    // Every decoder that ran must agree on the packet count and the TNT-8 outcome count.
    let ran: Vec<Counts> = [ipt, our, red, mov, bat].into_iter().flatten().collect();
    let agree = ran
        .windows(2)
        .all(|w| (w[0].packets, w[0].tnt_bits) == (w[1].packets, w[1].tnt_bits));
    println!(
        "packet and TNT-8 outcome counts agree: {}",
        if agree { "yes" } else { "NO" }
    );
    if !agree {
        std::process::exit(1);
    }
}
