//! The history index against an independent sequential decode of real traces: random access by
//! instruction number, backward and forward searches, and incremental indexing of a growing trace
//! must all agree with one plain pass of the flow decoder.

mod support;

use ptrewind::flow::{FlowConfig, FlowDecoder, Item};
use ptrewind::history::History;
use ptrewind::image::{Image, Section};

fn image_of(t: &support::CorpusTrace) -> Image {
    let mut img = Image::new();
    for s in &t.images {
        img.add(Section::new(s.addr, s.bytes.clone(), &s.name))
            .unwrap();
    }
    img
}

fn cfg_of(t: &support::CorpusTrace) -> FlowConfig {
    let mut cfg = FlowConfig::default();
    if t.mode == support::libipt::ExecMode::Bits32 {
        cfg.default_mode = ptrewind::packet::ExecMode::Bits32;
    }
    cfg
}

/// Every instruction address of one sequential decode: the independent ground truth.
fn sequential_ips(trace: &[u8], image: &Image, cfg: FlowConfig) -> Vec<u64> {
    let mut dec = FlowDecoder::new(trace, image, cfg);
    let mut ips = Vec::new();
    while let Some(item) = dec.next_item() {
        if let Item::Insn(i) = item {
            ips.push(i.ip);
        }
    }
    ips
}

/// A deterministic pseudo-random sequence (no test dependency on time or global RNG state).
fn lcg(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

fn check_trace(name: &str, samples: usize) {
    let Some(t) = support::trace(name) else {
        if support::require_corpus(name).is_none() {
            return;
        }
        panic!("{name}: not in the corpus");
    };
    let image = image_of(&t);
    let truth = sequential_ips(&t.pt, &image, cfg_of(&t));
    assert!(
        truth.len() > 1000,
        "{name}: too short a decode to test ({})",
        truth.len()
    );

    let mut h = History::build(&t.pt, &image, cfg_of(&t));
    assert_eq!(h.len(), truth.len() as u64, "{name}: history length");
    assert!(
        h.sync_points().len() > 1,
        "{name}: needs several PSB segments"
    );
    // The index costs at most 10% of the trace bytes (the budget); PSB segments make it
    // far smaller.
    assert!(
        h.stats().index_bytes * 10 <= t.pt.len() as u64,
        "{name}: index {} bytes for {} trace bytes",
        h.stats().index_bytes,
        t.pt.len()
    );

    // Random access, including both ends and every segment boundary.
    let mut positions: Vec<u64> = vec![0, truth.len() as u64 - 1];
    positions.extend(
        h.sync_points()
            .iter()
            .map(|p| p.insn)
            .filter(|&n| n < truth.len() as u64),
    );
    let mut seed = 0x5eed;
    positions.extend((0..samples).map(|_| lcg(&mut seed) % truth.len() as u64));
    for &n in &positions {
        let (ip, _) = h
            .insn(&t.pt, &image, n)
            .unwrap_or_else(|| panic!("{name}: no insn {n}"));
        assert_eq!(ip, truth[n as usize], "{name}: instruction {n}");
    }
    assert!(h.insn(&t.pt, &image, truth.len() as u64).is_none());

    // Walking backwards one instruction at a time across a segment boundary.
    let boundary = h.sync_points()[1].insn;
    for n in (boundary.saturating_sub(50)..(boundary + 50).min(truth.len() as u64)).rev() {
        assert_eq!(h.insn(&t.pt, &image, n).unwrap().0, truth[n as usize]);
    }

    // Backward and forward searches (reverse-continue / replay to a breakpoint) against a scan.
    for _ in 0..20 {
        let from = lcg(&mut seed) % truth.len() as u64;
        let target = truth[(lcg(&mut seed) % truth.len() as u64) as usize];
        let expect_prev = truth[..from as usize].iter().rposition(|&ip| ip == target);
        let got_prev = h.rfind(&t.pt, &image, from, |ip| ip == target);
        assert_eq!(
            got_prev,
            expect_prev.map(|i| i as u64),
            "{name}: rfind {target:#x} before {from}"
        );
        let expect_next = truth[from as usize..].iter().position(|&ip| ip == target);
        let got_next = h.find(&t.pt, &image, from, |ip| ip == target);
        assert_eq!(
            got_next,
            expect_next.map(|i| from + i as u64),
            "{name}: find {target:#x} from {from}"
        );
    }
    assert_eq!(h.rfind(&t.pt, &image, truth.len() as u64, |_| false), None);

    // Incremental indexing of a growing trace ends with the same index as one pass.
    let mut inc = History::new(cfg_of(&t));
    let mut end = 0;
    while end < t.pt.len() {
        end = (end + 1 + (lcg(&mut seed) as usize % 20_000)).min(t.pt.len());
        inc.update(&t.pt[..end], &image, false);
        assert!(inc.len() <= truth.len() as u64);
    }
    inc.update(&t.pt, &image, true);
    assert_eq!(inc.len(), truth.len() as u64, "{name}: incremental length");
    assert_eq!(
        inc.sync_points(),
        h.sync_points(),
        "{name}: incremental sync points"
    );
    for &n in positions.iter().take(50) {
        assert_eq!(inc.insn(&t.pt, &image, n).unwrap().0, truth[n as usize]);
    }
}

#[test]
fn history_matches_sequential_decode_arcus_hello() {
    check_trace("arcus/hello", 300);
}

#[test]
fn history_matches_sequential_decode_libxdc_unzip() {
    check_trace("libxdc/Unzip", 300);
}

#[test]
fn history_matches_sequential_decode_libxdc_mruby_with_overflow() {
    check_trace("libxdc/mruby", 200);
}

#[test]
fn history_matches_sequential_decode_32bit() {
    check_trace("libxdc/avscript_32", 200);
}
