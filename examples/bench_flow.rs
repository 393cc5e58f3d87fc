//! Instruction-flow decoding benchmark: ptrewind's `FlowDecoder` against libipt's
//! `pt_insn_decoder` on the same real traces, in one run.
//!
//! ```text
//! cargo run --release --example bench_flow -- [--reps N] [--trace NAME]... [--compare]
//!                                              [--repeat-mib N] [--memory] [--stats]
//! ```
//!
//! For each trace: instructions/s and MB/s of PT for ptrewind (blocks only, and with every
//! instruction materialised as an `Insn`) and for libipt, the ratio, and both instruction counts.
//! `--compare` diffs the two instruction-address sequences and prints the first divergence
//! (`--trace all`: every corpus trace that has code images).
//! Peak RSS is read from /proc/self/status after each trace. `--memory` decodes each trace
//! repeated 1, 4, 16 and 64 times and prints the decoder's peak heap (it must not grow).
//! `--ours-only` times only ptrewind (for profiling); with `--evict` each run starts after
//! 32 MiB were written, i.e. with cold caches and TLB as after libipt's run in the comparison. `--stats` prints each trace's composition
//! (packets, runs, cold decodes, path-cache hits). `--repeat-mib N` runs everything on each trace
//! repeated (from its first PSB) to at least N MiB, the way a long recording of the same code
//! looks: the one-off decode of new code is amortised as it is in any long trace.

#[path = "../tests/support/mod.rs"]
mod support;

use ptrewind::flow::{BlockItem, EventKind, FlowConfig, FlowDecoder, Item};
use ptrewind::image::{Image, Section};
use support::corpus::{self, CorpusTrace};
use support::libipt;

fn image_of(t: &CorpusTrace) -> Image {
    let mut img = Image::new();
    for s in &t.images {
        let _ = img.add(Section::new(s.addr, s.bytes.clone(), &s.name));
    }
    img
}

fn cfg_of(t: &CorpusTrace) -> FlowConfig {
    let mut cfg = FlowConfig::default();
    if matches!(t.mode, libipt::ExecMode::Bits32) {
        cfg.default_mode = ptrewind::packet::ExecMode::Bits32;
    }
    cfg
}

/// Decodes with blocks only; returns (instructions, errors).
fn ours_blocks(pt: &[u8], img: &Image, cfg: &FlowConfig) -> (u64, u64) {
    let mut dec = FlowDecoder::new(pt, img, cfg.clone());
    let (mut n, mut errs) = (0u64, 0u64);
    while let Some(item) = dec.next_block() {
        match item {
            BlockItem::Block(b) => n += b.count as u64,
            BlockItem::Event(e) => {
                if matches!(e.kind, EventKind::Error { .. }) {
                    errs += 1;
                }
            }
        }
    }
    (n, errs)
}

/// Decodes and materialises every instruction (its IP is folded into a checksum so the work is
/// not optimised away).
fn ours_insns(pt: &[u8], img: &Image, cfg: &FlowConfig) -> (u64, u64) {
    let mut dec = FlowDecoder::new(pt, img, cfg.clone());
    let (mut n, mut sum) = (0u64, 0u64);
    while let Some(item) = dec.next_block() {
        if let BlockItem::Block(b) = item {
            for i in b.insns() {
                n += 1;
                sum = sum.wrapping_add(i.ip ^ i.len as u64);
            }
        }
    }
    (n, sum)
}

/// A libipt driver configured the way ptxed runs it: code in files added through an image
/// section cache (libipt maps and caches them itself), not through a read-memory callback.
#[allow(clashing_extern_declarations)]
mod fast_ipt {
    use std::ffi::{CString, c_char, c_int, c_void};

    #[repr(C, align(8))]
    struct Config([u8; 280]);
    #[repr(C)]
    struct Insn {
        ip: u64,
        isid: c_int,
        mode: u32,
        iclass: u32,
        raw: [u8; 15],
        size: u8,
        flags: u32,
    }
    #[repr(C, align(8))]
    struct Event([u8; 64]);

    #[link(name = "ipt")]
    unsafe extern "C" {
        fn pt_cpu_errata(errata: *mut u8, cpu: *const u8) -> c_int;
        fn pt_iscache_alloc(name: *const c_char) -> *mut c_void;
        fn pt_iscache_free(c: *mut c_void);
        fn pt_iscache_add_file(
            c: *mut c_void,
            filename: *const c_char,
            offset: u64,
            size: u64,
            vaddr: u64,
        ) -> c_int;
        fn pt_image_add_cached(
            image: *mut c_void,
            c: *mut c_void,
            isid: c_int,
            asid: *const c_void,
        ) -> c_int;
        fn pt_insn_alloc_decoder(config: *const Config) -> *mut c_void;
        fn pt_insn_free_decoder(d: *mut c_void);
        fn pt_insn_get_image(d: *mut c_void) -> *mut c_void;
        fn pt_insn_sync_forward(d: *mut c_void) -> c_int;
        fn pt_insn_next(d: *mut c_void, insn: *mut Insn, size: usize) -> c_int;
        fn pt_insn_event(d: *mut c_void, ev: *mut Event, size: usize) -> c_int;
    }

    /// Code sections written to files once (adjacent pages coalesced), cached by libipt.
    pub struct Files {
        iscache: *mut c_void,
        isids: Vec<c_int>,
        dir: std::path::PathBuf,
    }

    impl Files {
        pub fn new(sections: &[(u64, &[u8])]) -> Files {
            let dir = std::env::temp_dir().join(format!("ptrewind-bench-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let mut merged: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut sorted = sections.to_vec();
            sorted.sort_by_key(|s| s.0);
            for (addr, bytes) in sorted {
                match merged.last_mut() {
                    Some((a, b)) if *a + b.len() as u64 == addr => b.extend_from_slice(bytes),
                    _ => merged.push((addr, bytes.to_vec())),
                }
            }
            let name = CString::new("bench").unwrap();
            // SAFETY: plain allocation; freed in Drop.
            let iscache = unsafe { pt_iscache_alloc(name.as_ptr()) };
            assert!(!iscache.is_null());
            let mut isids = Vec::new();
            for (i, (addr, bytes)) in merged.iter().enumerate() {
                let path = dir.join(format!("s{i}.bin"));
                std::fs::write(&path, bytes).expect("write section");
                let c = CString::new(path.to_string_lossy().as_bytes()).unwrap();
                // SAFETY: live cache, NUL-terminated path of a file we just wrote.
                let isid = unsafe {
                    pt_iscache_add_file(iscache, c.as_ptr(), 0, bytes.len() as u64, *addr)
                };
                assert!(isid > 0, "pt_iscache_add_file: {isid}");
                isids.push(isid);
            }
            Files {
                iscache,
                isids,
                dir,
            }
        }

        /// Decodes `pt` like ptxed (sync forward, drain events, resync after errors) and returns
        /// the number of instructions.
        pub fn count(&self, pt: &[u8], cpu: Option<(u16, u8, u8)>) -> u64 {
            let mut cfg = Config([0; 280]);
            cfg.0[0..8].copy_from_slice(&280usize.to_le_bytes());
            cfg.0[8..16].copy_from_slice(&(pt.as_ptr() as usize).to_le_bytes());
            cfg.0[16..24].copy_from_slice(&(pt.as_ptr() as usize + pt.len()).to_le_bytes());
            if let Some((f, m, s)) = cpu {
                cfg.0[40..44].copy_from_slice(&1u32.to_le_bytes());
                cfg.0[44..46].copy_from_slice(&f.to_le_bytes());
                cfg.0[46] = m;
                cfg.0[47] = s;
                let cpu_bytes: [u8; 8] = cfg.0[40..48].try_into().unwrap();
                // SAFETY: errata is the 64-byte pt_errata inside the config.
                unsafe { pt_cpu_errata(cfg.0.as_mut_ptr().add(48), cpu_bytes.as_ptr()) };
            }
            // SAFETY: the config delimits `pt`, which outlives the decoder freed below.
            let d = unsafe { pt_insn_alloc_decoder(&cfg) };
            assert!(!d.is_null());
            // SAFETY: live decoder and cache; sections stay valid while the cache lives.
            unsafe {
                let img = pt_insn_get_image(d);
                for &isid in &self.isids {
                    pt_image_add_cached(img, self.iscache, isid, std::ptr::null());
                }
            }
            let mut n = 0u64;
            let mut insn = Insn {
                ip: 0,
                isid: 0,
                mode: 0,
                iclass: 0,
                raw: [0; 15],
                size: 0,
                flags: 0,
            };
            let mut ev = Event([0; 64]);
            loop {
                // SAFETY: live decoder.
                let mut st = unsafe { pt_insn_sync_forward(d) };
                if st < 0 {
                    break;
                }
                loop {
                    while st >= 0 && st & 1 != 0 {
                        // SAFETY: live decoder, event buffer of the size passed.
                        st = unsafe { pt_insn_event(d, &mut ev, 64) };
                    }
                    if st < 0 || st & 4 != 0 {
                        break;
                    }
                    insn.iclass = 0;
                    // SAFETY: live decoder, insn buffer of the size passed.
                    st = unsafe { pt_insn_next(d, &mut insn, std::mem::size_of::<Insn>()) };
                    if insn.iclass != 0 {
                        n += 1;
                    }
                    if st < 0 {
                        break;
                    }
                }
            }
            // SAFETY: allocated above, freed once.
            unsafe { pt_insn_free_decoder(d) };
            n
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            // SAFETY: allocated in `new`, freed once; no decoder uses it any more.
            unsafe { pt_iscache_free(self.iscache) };
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Counts heap bytes so the benchmark can show the decoder's memory does not grow with the trace.
struct CountingAlloc;
static CUR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static PEAK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only adds relaxed counters.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        use std::sync::atomic::Ordering::Relaxed;
        let now = CUR.fetch_add(l.size(), Relaxed) + l.size();
        PEAK.fetch_max(now, Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        CUR.fetch_sub(l.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: `p` was allocated by `alloc` with `l`.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Peak heap growth (bytes) while decoding `pt`.
fn decoder_heap_peak(pt: &[u8], img: &Image, cfg: &FlowConfig) -> (u64, usize) {
    use std::sync::atomic::Ordering::Relaxed;
    let base = CUR.load(Relaxed);
    PEAK.store(base, Relaxed);
    let (n, _) = ours_insns(pt, img, cfg);
    (n, PEAK.load(Relaxed) - base)
}

/// This thread's CPU time in seconds.
fn cpu_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn compare(t: &CorpusTrace, img: &Image, cfg: &FlowConfig) {
    let (masked, _) = libipt::mask_psb_fup_before_pge(&t.pt);
    let oracle = libipt::ipt_insns(&masked, t.cpu, &t.images);
    let theirs = oracle.ips();
    let mut ours = Vec::new();
    let mut events = Vec::new();
    let mut dec = FlowDecoder::new(&t.pt, img, cfg.clone());
    while let Some(item) = dec.next_item() {
        match item {
            Item::Insn(i) => ours.push(i.ip),
            Item::Event(e) => events.push((ours.len(), e)),
        }
    }
    let same = ours.iter().zip(&theirs).take_while(|(a, b)| a == b).count();
    println!(
        "  compare {}: ours {} libipt {} common prefix {} libipt errors {:?}",
        t.name,
        ours.len(),
        theirs.len(),
        same,
        oracle
            .errors()
            .iter()
            .map(|e| (e.code, e.offset))
            .collect::<Vec<_>>()
    );
    if same < ours.len().max(theirs.len()) {
        let lo = same.saturating_sub(5);
        println!("  ours  : {:x?}", &ours[lo..(same + 5).min(ours.len())]);
        println!("  libipt: {:x?}", &theirs[lo..(same + 5).min(theirs.len())]);
        let ins: Vec<_> = oracle
            .insns()
            .skip(same)
            .take(40)
            .map(|i| (i.ip, i.iclass))
            .collect();
        println!("  libipt after: {:x?}", ins);
        for (at, e) in events
            .iter()
            .filter(|(at, _)| *at + 20 >= same && *at <= same + 5)
        {
            println!("  event at {at}: {e:?}");
        }
    }
    println!("  tail ips: {:x?}", &ours[ours.len().saturating_sub(8)..]);
    for (at, e) in events.iter().rev().take(4) {
        println!("  tail event at {at}: {e:?}");
    }
    let errs: Vec<_> = events
        .iter()
        .filter(|(_, e)| matches!(e.kind, EventKind::Error { .. }))
        .take(5)
        .collect();
    for (at, e) in errs {
        println!("  our error at insn {at}: {e:?}");
    }
}

/// `pt` followed by copies of itself from its first PSB on (a valid stream: each copy starts
/// with a PSB+) until it is at least `min_len` bytes long. The decoders then see a long recording
/// of the same code, as the issue's "real trace repeated to ≥ 256 MiB" asks: the block decode of
/// new code is paid once, as in any long trace.
fn repeated(pt: &[u8], min_len: usize) -> Vec<u8> {
    const PSB: [u8; 16] = [
        0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02,
        0x82,
    ];
    let from = pt.windows(16).position(|w| w == PSB).unwrap_or(0);
    let copy = &pt[from..];
    let mut out = Vec::with_capacity(min_len + pt.len());
    out.extend_from_slice(pt);
    while out.len() < min_len && !copy.is_empty() {
        out.extend_from_slice(copy);
    }
    out
}

/// Trace composition: packet kinds, runs, cold decodes (what the decoder's time is spent on).
fn print_stats(t: &CorpusTrace, img: &Image, cfg: &FlowConfig) {
    use ptrewind::packet::{Packet, PacketDecoder};
    let mut kinds: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let mut tnt_bits = 0u64;
    let mut pkts = PacketDecoder::new(&t.pt);
    while let Some(Ok((_, p))) = pkts.next_packet() {
        if let Packet::ShortTnt(tn) | Packet::LongTnt(tn) = p {
            tnt_bits += tn.count as u64;
        }
        *kinds.entry(p.name()).or_default() += 1;
    }
    let mut dec = FlowDecoder::new(&t.pt, img, cfg.clone());
    while dec.next_block().is_some() {}
    let s = dec.stats();
    println!(
        "{}: {} B, {} insns, {} runs ({:.1} insns/run), {} cold-decoded insns, {} TNT bits, {} events",
        t.name,
        t.pt.len(),
        s.insns,
        s.runs,
        s.insns as f64 / s.runs.max(1) as f64,
        s.decoded_insns,
        tnt_bits,
        s.events
    );
    println!(
        "  path cache: {} TNT-8 walks replayed, {} recorded",
        s.path_hits, s.paths_recorded
    );
    println!("  packets: {kinds:?}");
}

/// Writes `junk` (larger than the last-level cache) so that the next timed run starts with
/// cold caches and TLB, as it does after libipt's run in the comparison (`--evict`).
#[inline(never)]
fn evict_caches(junk: &mut [u8], salt: u8) {
    for chunk in junk.chunks_mut(64) {
        chunk[0] = chunk[0].wrapping_add(salt | 1);
    }
    std::hint::black_box(junk);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut reps = 3u32;
    let mut names = Vec::new();
    let mut cmp = false;
    let mut ours_only = false;
    let mut evict = false;
    let mut memory = false;
    let mut stats = false;
    let mut repeat_mib = 0usize;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--reps" => {
                i += 1;
                reps = args.get(i).and_then(|v| v.parse().ok()).unwrap_or(3);
            }
            "--trace" => {
                i += 1;
                if let Some(n) = args.get(i) {
                    names.push(n.clone());
                }
            }
            "--compare" => cmp = true,
            "--ours-only" => ours_only = true,
            "--evict" => evict = true,
            "--memory" => memory = true,
            "--stats" => stats = true,
            "--repeat-mib" => {
                i += 1;
                repeat_mib = args.get(i).and_then(|v| v.parse().ok()).unwrap_or(32);
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    if names.is_empty() {
        names = [
            "libxdc/mruby",
            "libxdc/qemu",
            "arcus/last",
            "libxdc/avscript_32",
            "arcus/hello",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
    }
    if names.iter().any(|n| n == "all") {
        names = corpus::all_traces()
            .into_iter()
            .filter(|t| t.has_images())
            .map(|t| t.name)
            .collect();
    }
    if corpus::corpus_dir().is_none() {
        eprintln!("corpus not found (set PTREWIND_CORPUS)");
        std::process::exit(1);
    }
    println!(
        "{:<22} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7} {:>7} {:>9}",
        "trace",
        "ours-insn",
        "ipt-insn",
        "ours-M/s",
        "full-M/s",
        "ipt-M/s",
        "ours-MB/s",
        "ipt-MB/s",
        "ratio",
        "full-x",
        "rss-KiB"
    );
    for name in &names {
        let Some(mut t) = corpus::trace(name) else {
            eprintln!("no trace {name}");
            continue;
        };
        // libipt 2.0.5 cannot decode a PSB+ FUP followed by TIP.PGE to the same IP (see
        // tests/support/libipt.rs `mask_psb_fup_before_pge`); it gets the masked trace. The mask
        // is computed on the original trace (it lists every packet, too much memory for a long
        // one) and repeated like it: each copy starts at a PSB, where the mask's state resets.
        let (mut masked, _) = libipt::mask_psb_fup_before_pge(&t.pt);
        if repeat_mib > 0 {
            t.pt = repeated(&t.pt, repeat_mib << 20);
            masked = repeated(&masked, repeat_mib << 20);
        }
        let img = image_of(&t);
        let cfg = cfg_of(&t);
        if cmp {
            compare(&t, &img, &cfg);
            continue;
        }
        if memory {
            for k in [1usize, 4, 16, 64] {
                let long: Vec<u8> = t.pt.repeat(k);
                let (n, peak) = decoder_heap_peak(&long, &img, &cfg);
                println!(
                    "{:<22} x{k:<3} {:>6.1} MB of PT {:>11} insns: decoder peak heap {:>8} KiB",
                    t.name,
                    long.len() as f64 / 1e6,
                    n,
                    peak / 1024
                );
            }
            continue;
        }
        if stats {
            print_stats(&t, &img, &cfg);
            continue;
        }
        if ours_only {
            // Best of `reps` in thread CPU time, like the comparison below.
            let (mut n, mut best) = (0, f64::MAX);
            let mut junk = if evict {
                vec![1u8; 32 << 20]
            } else {
                Vec::new()
            };
            for r in 0..reps {
                if evict {
                    evict_caches(&mut junk, r as u8);
                }
                let t0 = cpu_now();
                n = std::hint::black_box(ours_blocks(&t.pt, &img, &cfg)).0;
                best = best.min(cpu_now() - t0);
            }
            println!(
                "{:<22} {:>10} {:>9.1} M insn/s",
                t.name,
                n,
                n as f64 / best / 1e6
            );
            continue;
        }
        // Warm up (page-in, allocator) once, then keep the best of `reps` runs of each decoder,
        // interleaved so that load from other processes hits all three alike. Times are thread
        // CPU time (the development machine is shared; wall time mostly measures the others).
        // A long repeated trace needs no warm-up (and would double the run time).
        let (mut n_ours, mut errs) = if repeat_mib == 0 {
            ours_blocks(&t.pt, &img, &cfg)
        } else {
            (0, 0)
        };
        let secs: Vec<(u64, &[u8])> = t
            .images
            .iter()
            .map(|s| (s.addr, s.bytes.as_slice()))
            .collect();
        let files = fast_ipt::Files::new(&secs);
        if repeat_mib == 0 {
            let _ = files.count(&masked, t.cpu);
        }
        let (mut d_ours, mut d_full, mut d_ipt) = (f64::MAX, f64::MAX, f64::MAX);
        let (mut n_full, mut n_ipt) = (0, 0);
        for _ in 0..reps {
            let t0 = cpu_now();
            (n_ours, errs) = std::hint::black_box(ours_blocks(&t.pt, &img, &cfg));
            d_ours = d_ours.min(cpu_now() - t0);
            let t0 = cpu_now();
            n_full = std::hint::black_box(ours_insns(&t.pt, &img, &cfg)).0;
            d_full = d_full.min(cpu_now() - t0);
            let t0 = cpu_now();
            n_ipt = files.count(&masked, t.cpu);
            d_ipt = d_ipt.min(cpu_now() - t0);
        }
        let mb = t.pt.len() as f64 / 1e6;
        assert_eq!(n_full, n_ours);
        println!(
            "{:<22} {:>10} {:>10} {:>9.1} {:>9.1} {:>9.1} {:>8.1} {:>8.2} {:>7.1} {:>7.1} {:>9}",
            t.name,
            n_ours,
            n_ipt,
            n_ours as f64 / d_ours / 1e6,
            n_full as f64 / d_full / 1e6,
            n_ipt as f64 / d_ipt / 1e6,
            mb / d_ours,
            mb / d_ipt,
            d_ipt / d_ours,
            d_ipt / d_full,
            peak_rss_kb()
        );
        if errs > 0 {
            println!("  ({errs} error events in our decode)");
        }
        if n_ours != n_ipt {
            println!("  (instruction counts differ: ours {n_ours}, libipt {n_ipt})");
        }
    }
}
