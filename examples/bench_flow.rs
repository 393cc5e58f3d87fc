//! Instruction-flow decoding benchmark: ptrewind's `FlowDecoder` against libipt's
//! `pt_insn_decoder` on the same real traces, in one run.
//!
//! ```text
//! cargo run --release --example bench_flow -- [--reps N] [--trace NAME]... [--compare]
//! ```
//!
//! For each trace: instructions/s and MB/s of PT for ptrewind (blocks only, and with every
//! instruction materialised as an `Insn`) and for libipt, the ratio, and both instruction counts.
//! `--compare` diffs the two instruction-address sequences and prints the first divergence.
//! Peak RSS is read from /proc/self/status after each trace.

#[path = "../tests/support/mod.rs"]
mod support;

use ptrewind::flow::{BlockItem, EventKind, FlowConfig, FlowDecoder, Item};
use ptrewind::image::{Image, Section};
use std::time::Instant;
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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut reps = 3u32;
    let mut names = Vec::new();
    let mut cmp = false;
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
        let Some(t) = corpus::trace(name) else {
            eprintln!("no trace {name}");
            continue;
        };
        let img = image_of(&t);
        let cfg = cfg_of(&t);
        if cmp {
            compare(&t, &img, &cfg);
            continue;
        }
        let mb = t.pt.len() as f64 * reps as f64 / 1e6;
        // Warm up (page-in, allocator) once, then time `reps` runs each.
        let (n_ours, errs) = ours_blocks(&t.pt, &img, &cfg);
        let t0 = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(ours_blocks(&t.pt, &img, &cfg));
        }
        let d_ours = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let mut n_full = 0;
        for _ in 0..reps {
            n_full = std::hint::black_box(ours_insns(&t.pt, &img, &cfg)).0;
        }
        let d_full = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let mut n_ipt = 0;
        for _ in 0..reps {
            n_ipt = libipt::ipt_insn_count(&t.pt, t.cpu, &t.images).insns;
        }
        let d_ipt = t0.elapsed().as_secs_f64();
        let total = |n: u64| n as f64 * reps as f64;
        println!(
            "{:<22} {:>10} {:>10} {:>9.1} {:>9.1} {:>9.1} {:>8.1} {:>8.2} {:>7.1} {:>7.1} {:>9}",
            t.name,
            n_ours,
            n_ipt,
            total(n_ours) / d_ours / 1e6,
            total(n_full) / d_full / 1e6,
            total(n_ipt) / d_ipt / 1e6,
            mb / d_ours,
            mb / d_ipt,
            d_ipt / d_ours,
            d_ipt / d_full,
            peak_rss_kb()
        );
        if errs > 0 {
            println!("  ({errs} error events in our decode)");
        }
    }
}
