//! `ptrewind view`'s cost and memory on real traces: the flow decode alone against the same
//! decode feeding the call tracker, the call tree and the trace-event JSON (written to a byte
//! counter) plus the flame graph, in one run.
//!
//! ```text
//! cargo run --release --example bench_view -- [--reps N] [--trace NAME]... [--repeat N]
//! ```
//!
//! For each trace (default: the corpus's largest decodable ones): the best of `--reps` times
//! for both, their ratio, the calls found, the call tree's nodes, the JSON and SVG sizes; and
//! apart, the clock's packet scan and the view without its JSON.
//! `--repeat N` also runs the trace repeated 1, 4 .. N times (from its first PSB): the call
//! tree must not grow with the trace's length, only with its distinct stacks. The corpus
//! images have no symbols: functions are named by address, which costs the same.

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::time::Instant;

use ptrewind::flow::{BlockItem, FlowConfig, FlowDecoder};
use ptrewind::image::{Image, Section, Symbolizer};
use ptrewind::view::{Clock, FlameOptions, TrackInput, TscConversion, View, write_flamegraph};
use support::corpus::{self, CorpusTrace};

/// Counts the bytes written to it.
#[derive(Default)]
struct Counter(u64);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn image_of(t: &CorpusTrace) -> Image {
    let mut img = Image::new();
    for s in &t.images {
        let _ = img.add(Section::new(s.addr, s.bytes.clone(), &s.name));
    }
    img
}

fn cfg_of(t: &CorpusTrace) -> FlowConfig {
    let mut cfg = FlowConfig::default();
    if matches!(t.mode, support::libipt::ExecMode::Bits32) {
        cfg.default_mode = ptrewind::packet::ExecMode::Bits32;
    }
    cfg
}

fn decode_only(pt: &[u8], img: &Image, cfg: &FlowConfig) -> u64 {
    let mut dec = FlowDecoder::new(pt, img, cfg.clone());
    let mut n = 0u64;
    while let Some(item) = dec.next_block() {
        if let BlockItem::Block(b) = item {
            n += b.count as u64;
        }
    }
    n
}

struct Viewed {
    insns: u64,
    calls: u64,
    nodes: usize,
    json: u64,
    svg: u64,
}

fn view(pt: &[u8], img: &Image, syms: &Symbolizer, cfg: &FlowConfig, json: bool) -> Viewed {
    let clock = Clock::for_traces([pt], &cfg.timing, TscConversion::Unknown);
    let mut v = View::new(json.then(Counter::default), clock);
    let mut track = TrackInput::new("bench", "trace", pt, img, syms);
    track.flow = cfg.clone();
    let r = v.add_track(&track, &mut |_| {});
    let done = v.finish(Default::default()).expect("in memory");
    let mut svg = Counter::default();
    write_flamegraph(&done.tree, &FlameOptions::default(), &mut svg).expect("in memory");
    Viewed {
        insns: r.calls.insns,
        calls: r.calls.frames,
        nodes: done.tree.node_count(),
        json: done.timeline.map_or(0, |(c, _)| c.0),
        svg: svg.0,
    }
}

fn best<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::MAX;
    let mut out = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(r);
    }
    (best, out.expect("at least one rep"))
}

/// `pt` repeated `k` times from its first PSB (the way a longer run of the same code looks).
fn repeated(pt: &[u8], k: usize) -> Vec<u8> {
    let psb = [0x02u8, 0x82];
    let start = pt.windows(2).position(|w| w == psb).unwrap_or(0);
    let mut out = pt.to_vec();
    for _ in 1..k {
        out.extend_from_slice(&pt[start..]);
    }
    out
}

fn main() {
    let mut reps = 3usize;
    let mut names: Vec<String> = Vec::new();
    let mut repeat = 0usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).unwrap_or(3),
            "--trace" => names.extend(args.next()),
            "--repeat" => repeat = args.next().and_then(|v| v.parse().ok()).unwrap_or(16),
            other => panic!("unknown argument {other}"),
        }
    }
    if names.is_empty() {
        names = ["libxdc/mruby", "libxdc/qemu", "arcus/last"]
            .map(String::from)
            .to_vec();
    }
    let syms = Symbolizer::new();
    println!(
        "{:<16} {:>11} {:>9} {:>9} {:>6} {:>9} {:>7} {:>11} {:>9}",
        "trace",
        "insns",
        "decode s",
        "view s",
        "ratio",
        "calls",
        "nodes",
        "json bytes",
        "svg bytes"
    );
    for name in &names {
        let Some(t) = corpus::trace(name) else {
            return;
        };
        let (img, cfg) = (image_of(&t), cfg_of(&t));
        let (td, n) = best(reps, || decode_only(&t.pt, &img, &cfg));
        let (tc, _) = best(reps, || {
            Clock::for_traces([&t.pt[..]], &cfg.timing, TscConversion::Unknown)
        });
        let (tt, _) = best(reps, || view(&t.pt, &img, &syms, &cfg, false));
        let (tv, v) = best(reps, || view(&t.pt, &img, &syms, &cfg, true));
        assert_eq!(n, v.insns, "{name}: the view followed every instruction");
        println!(
            "{name:<16} {n:>11} {td:>9.3} {tv:>9.3} {:>6.2} {:>9} {:>7} {:>11} {:>9}   (clock scan {tc:.3} s, tree+svg without JSON {tt:.3} s)",
            tv / td,
            v.calls,
            v.nodes,
            v.json,
            v.svg
        );
        let mut k = 1;
        while repeat > 0 && k <= repeat {
            let pt = repeated(&t.pt, k);
            let v = view(&pt, &img, &syms, &cfg, true);
            println!(
                "  x{k:<3} {:>11} insns {:>9} calls {:>7} tree nodes {:>11} json bytes",
                v.insns, v.calls, v.nodes, v.json
            );
            k *= 4;
        }
    }
}
