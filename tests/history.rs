//! The history index against an independent sequential decode of real traces: random access by
//! instruction number, backward and forward searches, and incremental indexing of a growing trace
//! must all agree with one plain pass of the flow decoder.

mod support;

use ptrewind::flow::{BlockItem, FilteredDecoder, FlowConfig, FlowDecoder, Item};
use ptrewind::history::{BreakpointSet, History, HistoryWorker, IpMatch};
use ptrewind::image::{Image, Section};
use std::sync::{Arc, RwLock};
use std::time::Duration;

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

/// The filtered decode ([`FilteredDecoder`]) with a breakpoint set as the filter, against the
/// sequential decode: the runs it hands out sit at the right instruction numbers, it never passes
/// over an instruction at a breakpoint, and from the budget on it hands out every run.
fn check_filtered(
    name: &str,
    t: &support::CorpusTrace,
    image: &Image,
    truth: &[u64],
    addrs: &[u64],
    cfg: FlowConfig,
) {
    let bps = BreakpointSet::new(addrs.iter().copied());
    let budget = truth.len() as u64 * 3 / 4;
    let cache_limit = cfg.cache_insn_limit;
    let mut dec = FilteredDecoder::new(FlowDecoder::new(&t.pt, image, cfg));
    let mut n = 0u64;
    let mut handed_out = vec![false; truth.len()];
    let mut wants = |start: u64, lens: &[u8]| bps.may_match_insns(start, lens);
    while let Some(item) = dec.next_block(&mut n, budget, &mut wants) {
        if let BlockItem::Block(b) = item {
            let mut ip = b.start;
            for (j, &len) in b.lens().iter().enumerate() {
                let at = n as usize + j;
                assert_eq!(truth.get(at), Some(&ip), "{name}: filtered run at {at}");
                handed_out[at] = true;
                ip = ip.wrapping_add(len as u64);
            }
            n += b.count as u64;
        }
    }
    assert_eq!(n, truth.len() as u64, "{name}: filtered decode length");
    for (i, ip) in truth.iter().enumerate() {
        assert!(
            handed_out[i] || (!addrs.contains(ip) && (i as u64) < budget),
            "{name}: filtered decode passed over instruction {i} at {ip:#x}"
        );
    }
    let passed_over = handed_out.iter().filter(|h| !**h).count();
    assert!(
        passed_over > 0,
        "{name}: the filter passed over no instruction"
    );
    // A cache limit below the code the trace runs must have flushed the cache.
    let st = dec.decoder().stats();
    assert!(
        st.cache_flushes > 0 || st.decoded_insns as usize <= cache_limit.max(4096),
        "{name}: {} instructions decoded into the block cache without a flush",
        st.decoded_insns
    );
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

    // The same searches with breakpoint sets, which skip segments by their code summaries and
    // runs by their address ranges: no hit may be lost. Some addresses are executed, one lies
    // just past an executed one (usually inside an instruction, never or rarely executed).
    // Summary groups start at segment 0, in order, each spanning at least 4 KiB of trace.
    let groups = h.groups();
    assert_eq!(groups.first().map(|g| g.first), Some(0), "{name}: groups");
    for w in groups.windows(2) {
        let (a, b) = (h.sync_points()[w[0].first], h.sync_points()[w[1].first]);
        assert!(
            b.offset >= a.offset + ptrewind::history::GROUP_BYTES,
            "{name}: groups"
        );
    }
    for round in 0..20 {
        let from = lcg(&mut seed) % truth.len() as u64;
        let mut addrs: Vec<u64> = (0..1 + round % 3)
            .map(|_| truth[(lcg(&mut seed) % truth.len() as u64) as usize])
            .collect();
        addrs.push(addrs[0] + 1);
        let is_bp = |ip: &u64| addrs.contains(ip);
        let expect_prev = truth[..from as usize].iter().rposition(is_bp);
        let expect_next = truth[from as usize..].iter().position(is_bp);
        let mut bps = BreakpointSet::new(addrs.iter().copied());
        if round % 2 == 0 {
            h.clear_cache();
        }
        // Alternate between one search thread and several (the parallel backward scan).
        h.set_search_threads(if round % 4 < 2 { 1 } else { 4 });
        assert_eq!(
            h.rfind_with(&t.pt, &image, from, &mut bps),
            expect_prev.map(|i| i as u64),
            "{name}: rfind_with {addrs:x?} before {from}"
        );
        assert_eq!(
            h.find_with(&t.pt, &image, from, &mut bps),
            expect_next.map(|i| from + i as u64),
            "{name}: find_with {addrs:x?} from {from}"
        );
    }
    // A search for an address no instruction starts at, in code that runs everywhere (one byte
    // past the most frequent instruction): nothing is pruned, so on a long trace the backward
    // scan goes parallel, and must still find nothing.
    let mut counts = std::collections::HashMap::new();
    for &ip in &truth {
        *counts.entry(ip).or_insert(0u64) += 1;
    }
    let hot = counts
        .iter()
        .max_by_key(|e| *e.1)
        .map(|e| *e.0)
        .unwrap_or(0);
    if !truth.contains(&(hot + 1)) {
        h.set_search_threads(4);
        let before = h.stats().parallel_searches;
        let mut never = BreakpointSet::new([hot + 1]);
        assert_eq!(
            h.rfind_with(&t.pt, &image, truth.len() as u64, &mut never),
            None,
            "{name}: rfind_with {:#x}",
            hot + 1
        );
        let parallel = h.stats().parallel_searches > before;
        assert!(
            parallel || h.sync_points().len() < 16,
            "{name}: a long unpruned backward search stayed on one thread"
        );
    }
    assert_eq!(
        h.stats().segment_mismatches,
        0,
        "{name}: a segment decoded differently on demand than while indexing"
    );

    // The filtered decode the searches run on, with the default block cache and with one so
    // small that it is flushed during the decode (the filter's verdicts must go with it).
    let addrs: Vec<u64> = (0..3)
        .map(|_| truth[(lcg(&mut seed) % truth.len() as u64) as usize])
        .collect();
    check_filtered(name, &t, &image, &truth, &addrs, cfg_of(&t));
    let mut small = cfg_of(&t);
    small.cache_insn_limit = 0;
    check_filtered(name, &t, &image, &truth, &addrs, small);

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
    assert_eq!(
        inc.groups(),
        h.groups(),
        "{name}: incremental summary groups"
    );
    assert_eq!(
        inc.stats().errors,
        h.stats().errors,
        "{name}: incremental errors"
    );
    assert_eq!(
        inc.stats().overflows,
        h.stats().overflows,
        "{name}: incremental overflows"
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

/// The live indexer against a one-pass build: a thread appends a real trace in random chunks while
/// the worker indexes; mid-way complete waits must agree with the truth before their last sync
/// point, and the final index must equal `History::build` of the whole trace.
fn check_worker(name: &str, seed0: u64) {
    let Some(t) = support::trace(name) else {
        if support::require_corpus(name).is_none() {
            return;
        }
        panic!("{name}: not in the corpus");
    };
    let image = Arc::new(image_of(&t));
    let truth = sequential_ips(&t.pt, &image, cfg_of(&t));
    let built = History::build(&t.pt, &image, cfg_of(&t));

    let buf = Arc::new(RwLock::new(Vec::<u8>::new()));
    // A small window makes the worker take many steps even for a small trace.
    let worker = Arc::new(
        HistoryWorker::spawn_with_window(Arc::clone(&buf), Arc::clone(&image), cfg_of(&t), 16384)
            .expect("spawn the history worker"),
    );
    let pt = Arc::new(t.pt.clone());
    let appender = {
        let (buf, worker, pt) = (Arc::clone(&buf), Arc::clone(&worker), Arc::clone(&pt));
        std::thread::spawn(move || {
            let mut seed = seed0;
            let mut end = 0;
            while end < pt.len() {
                let next = (end + 1 + (lcg(&mut seed) as usize % 30_000)).min(pt.len());
                buf.write().unwrap().extend_from_slice(&pt[end..next]);
                end = next;
                worker.notify();
                if lcg(&mut seed) % 4 == 0 {
                    std::thread::yield_now();
                }
            }
        })
    };

    // Reverse requests while recording: each waits for a complete index of what is there.
    let mut seed = seed0 ^ 0xabcd;
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(lcg(&mut seed) % 20));
        let n = worker
            .wait_indexed(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            n <= truth.len() as u64 + 64,
            "{name}: {n} instructions mid-way"
        );
        let points = worker.sync_points();
        // Everything before the second-to-last sync point is firm: it must match the truth.
        let firm = points
            .len()
            .checked_sub(2)
            .map_or(0, |i| points[i].insn)
            .min(n);
        if firm > 0 {
            worker.with_history(|h, trace, image| {
                for _ in 0..20 {
                    let k = lcg(&mut seed) % firm;
                    assert_eq!(
                        h.insn(trace, image, k).map(|x| x.0),
                        Some(truth[k as usize]),
                        "{name}: instruction {k} mid-way"
                    );
                }
            });
        }
    }
    appender.join().expect("appender");

    let n = worker
        .wait_indexed(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        n,
        truth.len() as u64,
        "{name}: instructions after the last append"
    );
    assert_eq!(
        worker.sync_points(),
        built.sync_points(),
        "{name}: sync points"
    );
    let st = worker.stats();
    assert_eq!(st.decode_lag, 0, "{name}: {st:?}");
    assert!(st.complete, "{name}: {st:?}");
    assert_eq!(st.insns, truth.len() as u64);
    assert_eq!(st.sync_points, built.sync_points().len() as u64);
    assert_eq!(st.errors, built.stats().errors, "{name}: errors");
    assert_eq!(st.overflows, built.stats().overflows, "{name}: overflows");
    worker.with_history(|h, trace, image| {
        for _ in 0..100 {
            let k = lcg(&mut seed) % truth.len() as u64;
            assert_eq!(
                h.insn(trace, image, k).map(|x| x.0),
                Some(truth[k as usize])
            );
        }
        assert_eq!(h.groups(), built.groups(), "{name}: summary groups");
    });
    let worker = Arc::try_unwrap(worker).expect("appender gone");
    let h = worker.into_history();
    assert_eq!(h.len(), truth.len() as u64);
}

#[test]
fn worker_indexes_growing_trace_unzip() {
    check_worker("libxdc/Unzip", 1);
}

#[test]
fn worker_indexes_growing_trace_mruby_with_overflow() {
    check_worker("libxdc/mruby", 2);
}

#[test]
fn worker_indexes_growing_trace_32bit() {
    check_worker("libxdc/avscript_32", 3);
}

/// A worker over a trace that is complete from the start, and a wait on an empty trace.
#[test]
fn worker_on_static_and_empty_traces() {
    let name = "arcus/hello";
    let Some(t) = support::trace(name) else {
        if support::require_corpus(name).is_none() {
            return;
        }
        panic!("{name}: not in the corpus");
    };
    let image = Arc::new(image_of(&t));
    let built = History::build(&t.pt, &image, cfg_of(&t));
    let w = HistoryWorker::spawn(Arc::new(t.pt.clone()), Arc::clone(&image), cfg_of(&t))
        .expect("spawn");
    assert_eq!(w.wait_indexed(Duration::from_secs(60)), Ok(built.len()));
    assert_eq!(w.sync_points(), built.sync_points());
    // A second wait with nothing new returns at once with the same answer.
    assert_eq!(w.wait_indexed(Duration::from_secs(60)), Ok(built.len()));

    let empty = HistoryWorker::spawn(Arc::new(Vec::<u8>::new()), image, cfg_of(&t)).expect("spawn");
    assert_eq!(empty.wait_indexed(Duration::from_secs(60)), Ok(0));
    assert_eq!(empty.stats().insns, 0);
}

/// A store whose end is provisional (the QEMU backend's completion at each stop): at every
/// "stop" the bytes after the previous committed end are rewritten with the next committed part
/// plus a new provisional end (a cut-off later part of the trace, or garbage). The worker forgets
/// only what it read from the rewritten bytes; at every stop its index equals a history built
/// from scratch over the store's bytes as they are then.
#[test]
fn worker_follows_a_store_whose_end_is_rewritten() {
    use ptrewind::store::live::TraceStore;
    let name = "libxdc/Unzip";
    let Some(t) = support::trace(name) else {
        if support::require_corpus(name).is_none() {
            return;
        }
        panic!("{name}: not in the corpus");
    };
    let image = Arc::new(image_of(&t));
    let store = TraceStore::new();
    let worker = HistoryWorker::spawn_with_window(
        Arc::new(store.clone()),
        Arc::clone(&image),
        cfg_of(&t),
        16384,
    )
    .expect("spawn the history worker");
    store.set_listener(Some(worker.notifier().into_listener()));
    let pt = &t.pt;
    let mut seed = 7u64;
    let mut committed = 0usize;
    let mut rewinds = 0;
    let step = pt.len() / 16;
    for stop in 0..12 {
        let next = (committed + 1 + (lcg(&mut seed) as usize % step)).min(pt.len());
        // The provisional end: more of the real trace (a longer one than the next stop will
        // commit, sometimes), or bytes that decode to errors.
        let mut bytes = pt[committed..next].to_vec();
        if stop % 3 == 2 {
            bytes.extend_from_slice(&[0x02, 0x82, 0x99, 0x42, 0x13, 0x00, 0xff]);
        } else {
            let extra = (1 + lcg(&mut seed) as usize % step).min(pt.len() - next);
            bytes.extend_from_slice(&pt[next..next + extra]);
        }
        if store.len() > committed {
            rewinds += 1;
        }
        store.rewrite_from(committed, &bytes);
        committed = next;
        let n = worker
            .wait_indexed(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{name}: stop {stop}: {e}"));
        let now = store.to_vec();
        let built = History::build(&now, &image, cfg_of(&t));
        assert_eq!(n, built.len(), "{name}: stop {stop}: instructions");
        assert_eq!(
            worker.sync_points(),
            built.sync_points(),
            "{name}: stop {stop}: sync points"
        );
        assert!(worker.stats().complete, "{name}: stop {stop}");
        let truth = sequential_ips(&now, &image, cfg_of(&t));
        worker.with_history(|h, trace, image| {
            for _ in 0..50 {
                let Some(k) = (truth.len() as u64).checked_sub(1 + lcg(&mut seed) % 64) else {
                    break;
                };
                assert_eq!(
                    h.insn(trace, image, k).map(|x| x.0),
                    Some(truth[k as usize]),
                    "{name}: stop {stop}: instruction {k}"
                );
            }
        });
    }
    assert!(rewinds >= 10, "{rewinds} of 12 stops rewrote bytes");
}
