//! Instruction-flow decoder tests.
//!
//! * Differential tests against Intel's libipt (`pt_insn_decoder`, through tests/support/libipt.rs)
//!   on every real corpus trace that has code images, plus the HASE ground-truth branch lists.
//! * Generated traces with known ground truth: small x86 code sequences built by hand and the
//!   packets a CPU emits for a chosen path, one test per decoding rule.
//! * Restartability: decoding from any PSB yields the suffix of the full decode.
//! * Robustness: corrupted traces never panic and always terminate.

mod support;

use ptrewind::flow::{
    BlockItem, Cpu, Errata, Event, EventKind, FlowConfig, FlowDecoder, FlowErrorKind, InsnClass,
    Item,
};
use ptrewind::image::{Image, Section};
use ptrewind::packet::{Encoder, ExecMode, IpKind, Packet, Tnt};
use support::corpus::{self, CorpusTrace};
use support::libipt::{self, OracleItem};

// ---------------------------------------------------------------------------------------------
// Helpers

fn image_of(t: &CorpusTrace) -> Image {
    let mut img = Image::new();
    for s in &t.images {
        img.add(Section::new(s.addr, s.bytes.clone(), &s.name))
            .expect("corpus section");
    }
    img
}

fn cfg_of(t: &CorpusTrace) -> FlowConfig {
    let mut cfg = FlowConfig::default();
    // The same errata libipt gets for the trace's CPU (none when it is unknown).
    if let Some((f, m, st)) = t.cpu {
        cfg.errata = Errata::for_cpu(&Cpu::intel(f, m, st));
    }
    if matches!(t.mode, libipt::ExecMode::Bits32) {
        cfg.default_mode = ExecMode::Bits32;
    }
    cfg
}

/// Our decode of a whole trace as items, with the error events separately. Also checks that
/// `next_block` (with its TNT/TIP fast paths and path replays) yields exactly the same stream.
fn decode_items(pt: &[u8], img: &Image, cfg: FlowConfig) -> Vec<Item> {
    let mut dec = FlowDecoder::new(pt, img, cfg.clone());
    let mut out = Vec::new();
    while let Some(i) = dec.next_item() {
        out.push(i);
    }
    let mut blocks = FlowDecoder::new(pt, img, cfg);
    let mut at = 0;
    while let Some(b) = blocks.next_block() {
        match b {
            BlockItem::Block(b) => {
                for i in b.insns() {
                    assert_eq!(out.get(at), Some(&Item::Insn(i)), "next_block at item {at}");
                    at += 1;
                }
            }
            BlockItem::Event(e) => {
                assert_eq!(
                    out.get(at),
                    Some(&Item::Event(e)),
                    "next_block at item {at}"
                );
                at += 1;
            }
        }
    }
    assert_eq!(at, out.len(), "next_block ended early");
    out
}

fn ips(items: &[Item]) -> Vec<u64> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Insn(x) => Some(x.ip),
            _ => None,
        })
        .collect()
}

fn errors(items: &[Item]) -> Vec<&Event> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Event(e) if matches!(e.kind, EventKind::Error { .. }) => Some(e),
            _ => None,
        })
        .collect()
}

/// Outcome of a lock-step comparison of our instruction stream with libipt's.
#[derive(Debug, Default)]
struct Diff {
    libipt_insns: u64,
    ours_insns: u64,
    /// Instructions both produced identically before the first difference (or the end).
    common: u64,
    /// First difference: (index, ours, libipt).
    first_diff: Option<(u64, Option<u64>, u64)>,
    libipt_errors: Vec<(i32, u64)>,
    our_errors: Vec<(FlowErrorKind, u64, Option<u64>)>,
    /// libipt's instruction count when its first error came.
    libipt_insns_at_first_error: Option<u64>,
}

/// Runs libipt (on the trace with the PSB+FUP-before-PGE artefact masked, see
/// `mask_psb_fup_before_pge`: libipt 2.0.5 cannot decode the original) and our decoder (on the
/// original trace) in lock step, without storing either instruction stream.
fn lockstep(t: &CorpusTrace) -> Diff {
    let img = image_of(t);
    let mut dec = FlowDecoder::new(&t.pt, &img, cfg_of(t));
    let mut d = Diff::default();
    let mut next_ours = |d: &mut Diff| -> Option<u64> {
        loop {
            match dec.next_item()? {
                Item::Insn(i) => {
                    d.ours_insns += 1;
                    return Some(i.ip);
                }
                Item::Event(e) => {
                    if let EventKind::Error { kind, ip } = e.kind {
                        d.our_errors.push((kind, e.offset, ip));
                    }
                }
            }
        }
    };
    let (masked, _) = libipt::mask_psb_fup_before_pge(&t.pt);
    let mut diverged = false;
    libipt::ipt_insn_walk(&masked, t.cpu, &t.images, |item| match item {
        OracleItem::Insn(i) => {
            d.libipt_insns += 1;
            if diverged {
                return;
            }
            let ours = next_ours(&mut d);
            if ours == Some(i.ip) {
                d.common += 1;
            } else {
                diverged = true;
                d.first_diff = Some((d.common, ours, i.ip));
            }
        }
        OracleItem::Error(e) => {
            if d.libipt_insns_at_first_error.is_none() {
                d.libipt_insns_at_first_error = Some(d.libipt_insns);
            }
            d.libipt_errors.push((e.code, e.offset));
        }
        OracleItem::Event(_) => {}
    });
    while next_ours(&mut d).is_some() {}
    d
}

fn corpus_traces(filter: impl Fn(&str) -> bool) -> Option<Vec<CorpusTrace>> {
    corpus::require_corpus("flow")?;
    Some(
        corpus::all_traces()
            .into_iter()
            .filter(|t| t.has_images() && filter(&t.name))
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// Differential tests on the real corpus

/// Every corpus trace that libipt decodes without error: identical instruction sequences, and no
/// error on our side. Includes the multi-million-instruction libxdc mruby and qemu traces.
#[test]
fn libipt_agrees_on_every_clean_corpus_trace() {
    let Some(traces) = corpus_traces(|_| true) else {
        return;
    };
    let mut checked = 0;
    for t in &traces {
        let d = lockstep(t);
        if !d.libipt_errors.is_empty() {
            continue; // covered by the tests below
        }
        checked += 1;
        assert_eq!(
            d.first_diff, None,
            "{}: first difference (index, ours, libipt)",
            t.name
        );
        assert_eq!(
            d.ours_insns, d.libipt_insns,
            "{}: instruction counts",
            t.name
        );
        assert!(
            d.our_errors.is_empty(),
            "{}: our errors {:x?}",
            t.name,
            d.our_errors
        );
        // The README's independent libipt figure, where it gives one.
        if let Some(n) = corpus::readme_libipt_insns(&t.name) {
            assert_eq!(d.ours_insns, n, "{}: README instruction count", t.name);
        }
    }
    // DynamoRIO, HASE, ARCUS hello/last and the libxdc traces at least.
    assert!(checked >= 12, "only {checked} clean traces");
}

/// ARCUS toy/CVE programs: libipt stops after the dynamic loader at `_start` (TIP.PGE, TIP.PGD
/// without IP, TIP.PGE at the same address: the Griffin tracer enabled and immediately disabled
/// tracing). No instruction reachable from `_start` without trace can disable tracing, so the
/// disable happened before any instruction ran; we resume at the second TIP.PGE and decode on
/// through `main` to the end. Up to libipt's error both streams are identical.
#[test]
fn arcus_decodes_past_libipt_to_main_and_the_crash() {
    let Some(traces) =
        corpus_traces(|n| n.starts_with("arcus/") && n != "arcus/hello" && n != "arcus/last")
    else {
        return;
    };
    assert!(traces.len() >= 13);
    for t in &traces {
        let d = lockstep(t);
        assert!(
            !d.libipt_errors.is_empty(),
            "{}: libipt decodes it cleanly now?",
            t.name
        );
        let at_err = d.libipt_insns_at_first_error.expect("error position");
        assert!(
            at_err > 100_000,
            "{}: libipt decodes the loader first ({at_err})",
            t.name
        );
        // libipt's prefix (the loader) is ours exactly.
        assert!(
            d.common >= at_err,
            "{}: common prefix {} < {at_err}: {:x?}",
            t.name,
            d.common,
            d.first_diff
        );
        assert!(
            d.our_errors.is_empty(),
            "{}: our errors {:x?}",
            t.name,
            d.our_errors
        );
        assert!(
            d.ours_insns > at_err,
            "{}: nothing decoded past libipt",
            t.name
        );
    }
    // The buffer-overflow PoCs end in an indirect branch of the PIE executable (a RET or a call
    // through an overwritten pointer) to the attacker's 0x41414141.. bytes: tracing stops there
    // (TIP.PGD with that target), after main's instructions.
    for t in traces
        .iter()
        .filter(|t| t.name.starts_with("arcus/ovf-") && t.name.ends_with("-poc"))
    {
        let img = image_of(t);
        let items = decode_items(&t.pt, &img, cfg_of(t));
        let d = lockstep(t);
        let at_err = d.libipt_insns_at_first_error.unwrap_or(0) as usize;
        let all = ips(&items);
        let exe = |ip: u64| (0x5500_0000_0000..0x5700_0000_0000).contains(&ip);
        let in_main = all[at_err..].iter().filter(|&&ip| exe(ip)).count();
        assert!(
            in_main > 20,
            "{}: only {in_main} instructions in the executable after _start",
            t.name
        );
        let last_insn = items.iter().rev().find_map(|i| match i {
            Item::Insn(x) => Some(*x),
            _ => None,
        });
        let last_insn = last_insn.expect("instructions");
        assert!(
            matches!(
                last_insn.class,
                InsnClass::Return | InsnClass::IndirectCall | InsnClass::IndirectJump
            ),
            "{}: {last_insn:?}",
            t.name
        );
        assert!(
            exe(last_insn.ip),
            "{}: last branch at {:#x}",
            t.name,
            last_insn.ip
        );
        let crash = items.iter().rev().find_map(|i| match i {
            Item::Event(Event {
                kind: EventKind::Disabled { ip: Some(ip), .. },
                ..
            }) => Some(*ip),
            _ => None,
        });
        let crash = crash.expect("final disable");
        // Fully (0x4141414141) or partially (0x554141414141) overwritten: the low bytes are 'A's.
        let a_bytes = crash
            .to_le_bytes()
            .iter()
            .take_while(|&&b| b == 0x41)
            .count();
        assert!(a_bytes >= 4, "{}: crash target {crash:#x}", t.name);
    }
}

/// libxdc dyn_test: the page list lacks some pages. libipt reports "no memory mapped" and
/// resynchronises at the next PSB; we report `NoCode` at the same trace offsets and resume at the
/// same PSBs, so the instruction streams stay identical.
#[test]
fn dyn_test_reports_missing_code_where_libipt_does() {
    let Some(traces) = corpus_traces(|n| n == "libxdc/dyn_test") else {
        return;
    };
    let t = &traces[0];
    let d = lockstep(t);
    assert_eq!(d.first_diff, None);
    assert_eq!(d.ours_insns, d.libipt_insns);
    assert!(!d.libipt_errors.is_empty());
    assert!(
        d.our_errors.iter().all(|e| e.0 == FlowErrorKind::NoCode),
        "{:x?}",
        d.our_errors
    );
    // libipt reports the offset after the failing query and skips to the next PSB; we report the
    // packet that led to the missing code and resume at the next TIP.PGE or PSB, so the offsets
    // may differ by up to a few packets and we may report a second miss before that PSB (with no
    // instruction in between: the streams are identical, asserted above).
    let ours: Vec<u64> = d.our_errors.iter().map(|e| e.1).collect();
    for (_, off) in &d.libipt_errors {
        assert!(
            ours.iter().any(|&o| o <= *off && off - o < 256),
            "libipt error at {off:#x} has no counterpart in {ours:x?}"
        );
    }
    // And the IPs we name are really unmapped.
    let img = image_of(t);
    for (_, _, ip) in &d.our_errors {
        assert!(img.slice_at(ip.expect("ip")).is_none());
    }
}

#[test]
fn hase_branches_match_ground_truth() {
    let Some(traces) = corpus_traces(|n| n.starts_with("hase/")) else {
        return;
    };
    let mut checked = 0;
    for t in &traces {
        let Some(truth) = &t.ground_truth else {
            continue;
        };
        let img = image_of(t);
        let items = decode_items(&t.pt, &img, cfg_of(t));
        assert!(
            errors(&items).is_empty(),
            "{}: {:?}",
            t.name,
            errors(&items)
        );
        let ours = corpus::hase_branches(&items);
        let first = ours.iter().zip(truth).position(|(a, b)| a != b);
        assert_eq!(
            ours.len(),
            truth.len(),
            "{}: first difference at {first:?}",
            t.name
        );
        assert_eq!(first, None, "{}", t.name);
        checked += 1;
    }
    assert!(checked >= 2);
}

// ---------------------------------------------------------------------------------------------
// Restartability

/// Item identity for suffix comparison: instructions by IP, events by offset and a hash of their
/// kind (timestamps depend on timing packets before the PSB and are not part of the contract).
fn key(i: &Item) -> (u64, u64) {
    use std::hash::{Hash, Hasher};
    match i {
        Item::Insn(x) => (x.ip, 0),
        Item::Event(e) => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            format!("{:?}", e.kind).hash(&mut h);
            (e.offset, h.finish() | 1)
        }
    }
}

fn is_psb(i: &Item) -> bool {
    matches!(
        i,
        Item::Event(Event {
            kind: EventKind::Psb { .. },
            ..
        })
    )
}

fn check_restart(name: &str, pt: &[u8], img: &Image, cfg: &FlowConfig, max_psbs: usize) {
    let mut full: Vec<(u64, u64)> = Vec::new();
    let mut psbs: Vec<(usize, u64)> = Vec::new();
    let mut dec = FlowDecoder::new(pt, img, cfg.clone());
    while let Some(item) = dec.next_item() {
        if is_psb(&item) {
            if let Item::Event(e) = &item {
                psbs.push((full.len(), e.offset));
            }
        }
        full.push(key(&item));
    }
    assert!(psbs.len() >= 2, "{name}: {} PSBs", psbs.len());
    let step = (psbs.len() / max_psbs).max(1);
    for &(at, off) in psbs.iter().step_by(step) {
        let mut dec = FlowDecoder::at_psb(pt, img, cfg.clone(), off);
        let mut k = at;
        while let Some(item) = dec.next_item() {
            let got = key(&item);
            assert!(
                k < full.len(),
                "{name}: restart at PSB {off:#x} yields more items"
            );
            assert_eq!(
                got, full[k],
                "{name}: restart at PSB {off:#x}, item {} of the full decode",
                k
            );
            k += 1;
        }
        assert_eq!(k, full.len(), "{name}: restart at PSB {off:#x} ended early");
    }
}

#[test]
fn decoding_from_any_psb_yields_the_suffix_of_the_full_decode() {
    let Some(traces) = corpus_traces(|n| {
        matches!(
            n,
            "arcus/last"
                | "arcus/ovf-01-poc"
                | "libxdc/avscript_32"
                | "libxdc/Unzip"
                | "libxdc/dyn_test"
                | "hase/control_flow-20180515"
                | "libxdc/foo"
                | "libxdc/mruby"
        )
    }) else {
        return;
    };
    assert_eq!(traces.len(), 8, "all eight traces present");
    for t in &traces {
        let img = image_of(t);
        // mruby (6.3 M instructions, with an OVF in the middle): fewer restarts, for time.
        let restarts = if t.name == "libxdc/mruby" { 5 } else { 12 };
        check_restart(&t.name, &t.pt, &img, &cfg_of(t), restarts);
    }
}

// ---------------------------------------------------------------------------------------------
// Generated traces with known ground truth

/// A trace under construction.
struct Gen {
    enc: Encoder,
    out: Vec<u8>,
}

impl Gen {
    fn new() -> Self {
        Gen {
            enc: Encoder::new(),
            out: Vec::new(),
        }
    }
    fn p(&mut self, p: Packet) -> &mut Self {
        self.enc.packet(&p, &mut self.out).expect("encodable");
        self
    }
    fn ip(&mut self, kind: IpKind, ip: Option<u64>) -> &mut Self {
        self.enc
            .ip_packet(kind, ip, &mut self.out)
            .expect("encodable");
        self
    }
    /// PSB+ with tracing off (no FUP).
    fn psb_off(&mut self) -> &mut Self {
        self.enc.psb(&mut self.out);
        self.p(Packet::PsbEnd)
    }
    /// [`Self::psb_off`] followed by the clock of [`timed_cfg`]'s tests: TSC 1 000 000, a
    /// TMA anchoring CTC 0 to it, CBR 20.
    fn psb_off_timed(&mut self) -> &mut Self {
        self.psb_off()
            .p(Packet::Tsc { tsc: 1_000_000 })
            .p(Packet::Tma { ctc: 0, fc: 0 })
            .p(Packet::Cbr { ratio: 20 })
    }
    /// PSB+ with tracing on at `ip` in 64-bit mode.
    fn psb_on(&mut self, ip: u64) -> &mut Self {
        self.enc.psb(&mut self.out);
        self.p(Packet::ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        });
        self.ip(IpKind::Fup, Some(ip));
        self.p(Packet::PsbEnd)
    }
    fn pge64(&mut self, ip: u64) -> &mut Self {
        self.p(Packet::ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        });
        self.ip(IpKind::TipPge, Some(ip))
    }
    /// TNT packets for `bits` (oldest first), as many as needed.
    fn tnt(&mut self, bits: &[bool]) -> &mut Self {
        for chunk in bits.chunks(6) {
            let mut v = 0u64;
            for &b in chunk {
                v = v << 1 | b as u64;
            }
            self.p(Packet::ShortTnt(Tnt::new(v, chunk.len() as u8)));
        }
        self
    }
}

fn image(code: &[(u64, &[u8])]) -> Image {
    let mut img = Image::new();
    for (addr, bytes) in code {
        img.add(Section::new(*addr, bytes.to_vec(), "generated"))
            .unwrap();
    }
    img
}

fn run(pt: &[u8], img: &Image) -> Vec<Item> {
    decode_items(pt, img, FlowConfig::default())
}

/// Short text of the stream: instruction IPs in hex, events as words.
fn text(items: &[Item]) -> Vec<String> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Insn(x) => Some(format!("{:x}", x.ip)),
            Item::Event(e) => match &e.kind {
                EventKind::Enabled { ip } => Some(format!("en {ip:x}")),
                EventKind::Disabled { ip: Some(ip), .. } => Some(format!("dis {ip:x}")),
                EventKind::Disabled { ip: None, .. } => Some("dis".into()),
                EventKind::AsyncBranch { from, to } => Some(format!("async {from:x}>{to:x}")),
                EventKind::Overflow { resume: Some(r) } => Some(format!("ovf {r:x}")),
                EventKind::Overflow { resume: None } => Some("ovf".into()),
                EventKind::Psb { .. } | EventKind::ModeChange { .. } => None,
                EventKind::Tsx { ip, in_tx, abort } => Some(format!("tsx {ip:x?} {in_tx} {abort}")),
                EventKind::Ptwrite { ip, payload } => Some(format!("ptw {ip:x?} {payload:x}")),
                EventKind::Error { kind, ip } => Some(format!("err {kind:?} {ip:x?}")),
                k => Some(format!("{k:?}")),
            },
        })
        .collect()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// call/ret, a loop, a syscall:
/// ```text
/// 1000: call 1010      1010: xor rax,rax
/// 1005: je 1009        1013: ret
/// 1007: jmp 1000
/// 1009: syscall
/// ```
const LOOP_CODE: &[u8] = &[
    0xE8, 0x0B, 0x00, 0x00, 0x00, // 1000 call 1010
    0x74, 0x02, // 1005 je 1009
    0xEB, 0xF7, // 1007 jmp 1000
    0x0F, 0x05, // 1009 syscall
    0x90, 0x90, 0x90, 0x90, 0x90, // padding
    0x48, 0x31, 0xC0, // 1010 xor rax,rax
    0xC3, // 1013 ret
];

const LOOP_PATH: &[&str] = &[
    "en 1000", "1000", "1010", "1013", "1005", "1007", "1000", "1010", "1013", "1005", "1009",
    "dis",
];

#[test]
fn ret_compression_on() {
    let img = image(&[(0x1000, LOOP_CODE)]);
    let mut g = Gen::new();
    // ret T, je N, ret T, je T; syscall into the untraced kernel: TIP.PGD without IP.
    g.psb_off()
        .pge64(0x1000)
        .tnt(&[true, false, true, true])
        .ip(IpKind::TipPgd, None);
    let items = run(&g.out, &img);
    assert_eq!(text(&items), s(LOOP_PATH));
}

#[test]
fn ret_compression_off() {
    let img = image(&[(0x1000, LOOP_CODE)]);
    let mut g = Gen::new();
    // Uncompressed RETs are never deferred: the pending TNT goes out before each RET's TIP.
    g.psb_off().pge64(0x1000);
    g.ip(IpKind::Tip, Some(0x1005))
        .tnt(&[false])
        .ip(IpKind::Tip, Some(0x1005))
        .tnt(&[true]);
    g.ip(IpKind::TipPgd, None);
    assert_eq!(text(&run(&g.out, &img)), s(LOOP_PATH));
}

#[test]
fn not_taken_bit_at_a_ret_is_an_error() {
    let img = image(&[(0x1000, LOOP_CODE)]);
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&[false]);
    let items = run(&g.out, &img);
    assert_eq!(
        text(&items),
        s(&[
            "en 1000",
            "1000",
            "1010",
            "err BadRetCompression Some(1013)"
        ])
    );
    let e = errors(&items)[0];
    assert!(
        e.offset > 16,
        "error carries the TNT's offset, not 0: {}",
        e.offset
    );
}

#[test]
fn zero_length_call_is_not_pushed() {
    // 2000: call 2005 (E8 00000000: pushes nothing for RET compression)
    // 2005: call 2010 ; 200a: syscall ; 2010: ret
    let code: &[u8] = &[
        0xE8, 0x00, 0x00, 0x00, 0x00, 0xE8, 0x06, 0x00, 0x00, 0x00, 0x0F, 0x05, 0x90, 0x90, 0x90,
        0x90, 0xC3,
    ];
    let img = image(&[(0x2000, code)]);
    let mut g = Gen::new();
    g.psb_off()
        .pge64(0x2000)
        .tnt(&[true])
        .ip(IpKind::TipPgd, None);
    assert_eq!(
        text(&run(&g.out, &img)),
        s(&["en 2000", "2000", "2005", "2010", "200a", "dis"])
    );
    // 2100: call 2105 (zero-length) ; 2105: ret. Had the CALL been pushed, a compressed RET could
    // pop it; it was not, so a taken bit at the RET is bad RET compression.
    let img = image(&[(0x2100, &[0xE8, 0x00, 0x00, 0x00, 0x00, 0xC3])]);
    let mut g = Gen::new();
    g.psb_off().pge64(0x2100).tnt(&[true]);
    assert_eq!(
        text(&run(&g.out, &img)),
        s(&["en 2100", "2100", "err BadRetCompression Some(2105)"])
    );
}

#[test]
fn return_stack_holds_64_calls_and_drops_the_oldest() {
    // 1000: call 1010 ; 1005: syscall
    // 1010: dec ecx ; 1012: jz 1019 ; 1014: call 1010 ; 1019: ret
    let mut code = vec![0xE8, 0x0B, 0x00, 0x00, 0x00, 0x0F, 0x05];
    code.resize(0x10, 0x90);
    code.extend_from_slice(&[0xFF, 0xC9, 0x74, 0x05, 0xE8, 0xF7, 0xFF, 0xFF, 0xFF, 0xC3]);
    let img = image(&[(0x1000, &code)]);
    let depth = 70; // 70 frames of f: deeper than the 64-entry stack
    let mut expect = vec!["en 1000".to_string(), "1000".to_string()];
    for i in 0..depth {
        expect.extend(["1010", "1012"].map(String::from));
        if i + 1 < depth {
            expect.push("1014".into());
        }
    }
    for _ in 0..depth {
        expect.push("1019".into());
    }
    expect.extend(["1005", "dis"].map(String::from));
    let mut jz = vec![false; depth - 1];
    jz.push(true);
    // The CPU compresses the 64 RETs whose CALLs it still remembers and sends the 6 older ones
    // (5 to 1019, the last to 1005) as TIPs.
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&jz).tnt(&[true; 64]);
    for _ in 0..depth - 65 {
        g.ip(IpKind::Tip, Some(0x1019));
    }
    g.ip(IpKind::Tip, Some(0x1005)).ip(IpKind::TipPgd, None);
    assert_eq!(text(&run(&g.out, &img)), expect);
    // Had a 65th RET been compressed, its CALL is gone from the stack: an error, not a guess.
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&jz).tnt(&[true; 65]);
    let t = text(&run(&g.out, &img));
    let rets = t.iter().filter(|l| *l == "1019").count();
    assert_eq!(rets, 64, "{:?}", &t[t.len() - 3..]);
    assert_eq!(t.last().unwrap(), "err BadRetCompression Some(1019)");
}

#[test]
fn deferred_tip_after_tnt() {
    // 3000: je 3002 ; 3002: jmp rax ; 3010: jne 3012 ; 3012: syscall
    let img = image(&[
        (0x3000, &[0x74, 0x00, 0xFF, 0xE0]),
        (0x3010, &[0x75, 0x00, 0x0F, 0x05]),
    ]);
    let mut g = Gen::new();
    // The CPU holds the indirect jump's TIP back until the TNT (with the later jne) is out.
    g.psb_off()
        .pge64(0x3000)
        .tnt(&[true, false])
        .ip(IpKind::Tip, Some(0x3010))
        .ip(IpKind::TipPgd, None);
    assert_eq!(
        text(&run(&g.out, &img)),
        s(&["en 3000", "3000", "3002", "3010", "3012", "dis"])
    );
    // A missing deferred TIP is an error at the indirect jump.
    let mut g = Gen::new();
    g.psb_off().pge64(0x3000).tnt(&[true, false]).tnt(&[true]);
    let t = text(&run(&g.out, &img));
    assert_eq!(t[..2], s(&["en 3000", "3000"])[..]);
    assert!(
        t[2].starts_with("err MissingTip") && t[2].ends_with("Some(3002)"),
        "{t:?}"
    );
}

#[test]
fn async_interrupt_fup_binds_to_the_interrupted_instruction() {
    // 4000..4004: nop x4 ; 4004: je 4000 ; 4006: syscall
    let img = image(&[(0x4000, &[0x90, 0x90, 0x90, 0x90, 0x74, 0xFA, 0x0F, 0x05])]);
    let mut g = Gen::new();
    g.psb_off().pge64(0x4000);
    // Interrupt before 4002 executed: FUP(4002) TIP.PGD; the kernel returns to 4002.
    g.ip(IpKind::Fup, Some(0x4002))
        .ip(IpKind::TipPgd, None)
        .ip(IpKind::TipPge, Some(0x4002));
    // Then a signal: FUP(4003) and a TIP to the handler at 4000 (async branch, traced).
    g.ip(IpKind::Fup, Some(0x4003))
        .ip(IpKind::Tip, Some(0x4000));
    g.tnt(&[false]).ip(IpKind::TipPgd, None);
    assert_eq!(
        text(&run(&g.out, &img)),
        s(&[
            "en 4000",
            "4000",
            "4001",
            "dis 4002",
            "en 4002",
            "4002",
            "async 4003>4000",
            "4000",
            "4001",
            "4002",
            "4003",
            "4004",
            "4006",
            "dis"
        ])
    );
}

#[test]
fn overflow_resumes_at_the_fup_and_clears_the_return_stack() {
    let img = image(&[(0x1000, LOOP_CODE)]);
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&[true, false]);
    // Packets lost; the overflow resolved with tracing on at 1010 (inside the callee).
    g.p(Packet::Ovf).ip(IpKind::Fup, Some(0x1010));
    // The RET's CALL was before the OVF: the CPU sends it uncompressed.
    g.ip(IpKind::Tip, Some(0x1005))
        .tnt(&[true])
        .ip(IpKind::TipPgd, None);
    assert_eq!(
        text(&run(&g.out, &img)),
        s(&[
            "en 1000", "1000", "1010", "1013", "1005", "ovf 1010", "1010", "1013", "1005", "1009",
            "dis"
        ])
    );
    // A compressed RET right after the OVF has nothing to pop: an error, not a guess.
    let mut g = Gen::new();
    g.psb_off()
        .pge64(0x1000)
        .tnt(&[true, false])
        .p(Packet::Ovf)
        .ip(IpKind::Fup, Some(0x1010));
    g.tnt(&[true]);
    let t = text(&run(&g.out, &img));
    assert_eq!(t.last().unwrap(), "err BadRetCompression Some(1013)");
    // OVF resolved while disabled: resume at TIP.PGE.
    let mut g = Gen::new();
    g.psb_off()
        .pge64(0x1000)
        .tnt(&[true, false])
        .p(Packet::Ovf)
        .pge64(0x1009);
    g.ip(IpKind::TipPgd, None);
    let t = text(&run(&g.out, &img));
    assert_eq!(t[5..], s(&["ovf", "en 1009", "1009", "dis"])[..]);
}

#[test]
fn psb_every_few_hundred_bytes_and_restart() {
    // 5000: dec ecx ; 5002: jnz 5000 ; 5004: syscall
    let img = image(&[(0x5000, &[0xFF, 0xC9, 0x75, 0xFC, 0x0F, 0x05])]);
    let mut g = Gen::new();
    g.psb_off().pge64(0x5000);
    let iterations = 3000;
    let mut expect = vec!["en 5000".to_string()];
    let mut bits = 0;
    for i in 0..iterations {
        expect.push("5000".into());
        expect.push("5002".into());
        let last = i == iterations - 1;
        g.tnt(&[!last]);
        bits += 1;
        // A PSB+ roughly every 200 bytes: it states the current IP (the loop head).
        if bits % 150 == 0 && !last {
            g.psb_on(0x5000);
        }
    }
    expect.push("5004".into());
    expect.push("dis".into());
    g.ip(IpKind::TipPgd, None);
    assert!(g.out.len() > 3000);
    let items = run(&g.out, &img);
    assert_eq!(text(&items), expect);
    check_restart("generated loop", &g.out, &img, &FlowConfig::default(), 100);
}

#[test]
fn psb_fup_is_reached_by_walking_without_trace() {
    // 6000: nop; 6001: nop; 6002: jmp 6010 ; 6010: nop ; 6011: syscall
    let img = image(&[
        (0x6000, &[0x90, 0x90, 0xEB, 0x0C]),
        (0x6010, &[0x90, 0x0F, 0x05]),
    ]);
    let mut g = Gen::new();
    g.psb_off()
        .pge64(0x6000)
        .psb_on(0x6011)
        .ip(IpKind::TipPgd, None);
    let items = run(&g.out, &img);
    assert_eq!(
        text(&items),
        s(&["en 6000", "6000", "6001", "6002", "6010", "6011", "dis"])
    );
    // The PSB event sits right before the instruction at the PSB+ FUP IP.
    let pos = items.iter().position(|i| {
        matches!(
            i,
            Item::Event(Event {
                kind: EventKind::Psb {
                    ip: Some(0x6011),
                    ..
                },
                ..
            })
        )
    });
    assert!(matches!(items[pos.unwrap() + 1], Item::Insn(x) if x.ip == 0x6011));
}

#[test]
fn ptwrite_with_and_without_fup() {
    // 7000: ptwrite eax ; 7004: nop ; 7005: ptwrite eax ; 7009: syscall
    let code: &[u8] = &[
        0xF3, 0x0F, 0xAE, 0xE0, 0x90, 0xF3, 0x0F, 0xAE, 0xE0, 0x0F, 0x05,
    ];
    let img = image(&[(0x7000, code)]);
    let mut g = Gen::new();
    g.psb_off().pge64(0x7000);
    g.p(Packet::Ptw {
        payload: 0xAB,
        size: 4,
        ip: true,
    })
    .ip(IpKind::Fup, Some(0x7000));
    g.p(Packet::Ptw {
        payload: 0xCD,
        size: 8,
        ip: false,
    });
    g.ip(IpKind::TipPgd, None);
    assert_eq!(
        text(&run(&g.out, &img)),
        s(&[
            "en 7000",
            "7000",
            "ptw Some(7000) ab",
            "7004",
            "7005",
            "ptw Some(7005) cd",
            "7009",
            "dis"
        ])
    );
}

#[test]
fn tsx_begin_and_abort() {
    // 8000: xbegin 8020 (C7 F8 rel32) ; 8006: nop ; 8007: nop ; 8008: nop ; 8020: syscall
    let mut code = vec![0xC7, 0xF8, 0x1A, 0x00, 0x00, 0x00, 0x90, 0x90, 0x90];
    code.resize(0x20, 0x90);
    code.extend_from_slice(&[0x0F, 0x05]);
    let img = image(&[(0x8000, &code)]);
    let mut g = Gen::new();
    g.psb_off().pge64(0x8000);
    g.p(Packet::ModeTsx {
        intx: true,
        abort: false,
    })
    .ip(IpKind::Fup, Some(0x8006));
    g.p(Packet::ModeTsx {
        intx: false,
        abort: true,
    })
    .ip(IpKind::Fup, Some(0x8008));
    g.ip(IpKind::Tip, Some(0x8020)).ip(IpKind::TipPgd, None);
    assert_eq!(
        text(&run(&g.out, &img)),
        s(&[
            "en 8000",
            "8000",
            "tsx Some(8006) true false",
            "8006",
            "8007",
            "tsx Some(8008) false true",
            "async 8008>8020",
            "8020",
            "dis"
        ])
    );
}

#[test]
fn thirty_two_bit_mode() {
    // 32-bit: 9000: inc eax (40) ; 9001: dec eax (48) ; 9002: je 9004 ; 9004: int 0x80.
    // In 64-bit mode 40 48 would be REX prefixes of the je.
    let img = image(&[(0x9000, &[0x40, 0x48, 0x74, 0x00, 0xCD, 0x80])]);
    let mut g = Gen::new();
    g.psb_off().p(Packet::ModeExec {
        csl: false,
        csd: true,
        iflag: false,
    });
    g.ip(IpKind::TipPge, Some(0x9000))
        .tnt(&[true])
        .ip(IpKind::TipPgd, None);
    let items = run(&g.out, &img);
    assert_eq!(
        text(&items),
        s(&["en 9000", "9000", "9001", "9002", "9004", "dis"])
    );
    assert!(items.iter().all(|i| match i {
        Item::Insn(x) => x.mode == ExecMode::Bits32,
        _ => true,
    }));
}

#[test]
fn enable_immediately_disabled_then_enabled_again() {
    // The Griffin artefact: TIP.PGE(a) TIP.PGD() TIP.PGE(a) where the code at a reaches an
    // indirect call before any instruction that could disable tracing.
    // a000: mov eax,1 ; a005: call rax ; b000: syscall
    let img = image(&[
        (0xa000, &[0xB8, 0x01, 0x00, 0x00, 0x00, 0xFF, 0xD0]),
        (0xb000, &[0x0F, 0x05]),
    ]);
    let mut g = Gen::new();
    g.psb_off()
        .pge64(0xa000)
        .ip(IpKind::TipPgd, None)
        .ip(IpKind::TipPge, Some(0xa000));
    g.ip(IpKind::Tip, Some(0xb000)).ip(IpKind::TipPgd, None);
    assert_eq!(
        text(&run(&g.out, &img)),
        s(&["en a000", "dis", "en a000", "a000", "a005", "b000", "dis"])
    );
}

#[test]
fn syscall_disable_and_enable_at_an_unrelated_ip() {
    let img = image(&[(0x1000, LOOP_CODE)]);
    let mut g = Gen::new();
    // exec-like: tracing comes back somewhere else entirely (1010), no branch from 1009.
    g.psb_off()
        .pge64(0x1000)
        .tnt(&[true, true])
        .ip(IpKind::TipPgd, None);
    g.ip(IpKind::TipPge, Some(0x1010))
        .ip(IpKind::Tip, Some(0x1009))
        .ip(IpKind::TipPgd, None);
    assert_eq!(
        text(&run(&g.out, &img)),
        s(&[
            "en 1000", "1000", "1010", "1013", "1005", "1009", "dis", "en 1010", "1010", "1013",
            "1009", "dis"
        ])
    );
}

#[test]
fn missing_code_and_runaway_walks_are_errors() {
    // c000: jmp c000 forever; a TIP that needs an indirect branch never finds one.
    let img = image(&[(0xc000, &[0xEB, 0xFE])]);
    let mut g = Gen::new();
    g.psb_off().pge64(0xc000).ip(IpKind::Tip, Some(0xd000));
    let cfg = FlowConfig {
        max_walk: 1000,
        ..FlowConfig::default()
    };
    let items = decode_items(&g.out, &img, cfg);
    let errs = errors(&items);
    assert_eq!(errs.len(), 1);
    assert!(matches!(
        errs[0].kind,
        EventKind::Error {
            kind: FlowErrorKind::RunawayWalk,
            ..
        }
    ));
    // The limit counts the whole walk to the TIP, also the part the fast path walked.
    assert_eq!(ips(&items).len(), 1000);
    // Enabled at an address with no code.
    let mut g = Gen::new();
    g.psb_off().pge64(0xe000).tnt(&[true]);
    let t = text(&run(&g.out, &img));
    assert_eq!(t, s(&["en e000", "err NoCode Some(e000)"]));
}

/// The runs `next_block` hands out, as `(start, count, class)`.
fn runs(pt: &[u8], img: &Image) -> Vec<(u64, u32, &'static str)> {
    let mut dec = FlowDecoder::new(pt, img, FlowConfig::default());
    let mut out = Vec::new();
    while let Some(b) = dec.next_block() {
        if let BlockItem::Block(b) = b {
            out.push((b.start, b.count, b.class.name()));
        }
    }
    out
}

/// A direct CALL into a PLT stub whose indirect JMP takes the next TIP: the fast path walks the
/// CALL's block before the TIP without the general path, and still hands out the runs the
/// general path did (the stub's branch a run of its own when the stub has more instructions),
/// so `decode --format blocks` does not depend on the path taken.
#[test]
fn blocks_walked_before_a_tip_are_the_general_paths_runs() {
    // 1000: call 2000; 1005: nop
    // 2000: endbr64; 2004: jmp [rip+0x100]          (the stub of an IBT-enabled PLT)
    // 2100: jmp [rip+0x100]                         (a plain PLT stub)
    // 3000: nop; 3001: syscall
    let img = image(&[
        (0x1000, &[0xE8, 0xFB, 0x0F, 0x00, 0x00, 0x90]),
        (
            0x2000,
            &[0xF3, 0x0F, 0x1E, 0xFA, 0xFF, 0x25, 0x00, 0x01, 0x00, 0x00],
        ),
        (0x2100, &[0xFF, 0x25, 0x00, 0x01, 0x00, 0x00]),
        (0x3000, &[0x90, 0x0F, 0x05]),
    ]);
    let mut g = Gen::new();
    g.psb_off()
        .pge64(0x1000)
        .ip(IpKind::Tip, Some(0x3000))
        .ip(IpKind::TipPgd, None);
    assert_eq!(
        text(&run(&g.out, &img)),
        s(&["en 1000", "1000", "2000", "2004", "3000", "3001", "dis"])
    );
    assert_eq!(
        runs(&g.out, &img),
        vec![
            (0x1000, 1, "call"),
            (0x2000, 1, "other"),
            (0x2004, 1, "ind-jump"),
            (0x3000, 2, "syscall"),
        ]
    );
    // The same through a one-instruction stub: one run.
    let img = image(&[
        (0x1000, &[0xE8, 0xFB, 0x10, 0x00, 0x00, 0x90]),
        (0x2100, &[0xFF, 0x25, 0x00, 0x01, 0x00, 0x00]),
        (0x3000, &[0x90, 0x0F, 0x05]),
    ]);
    assert_eq!(
        runs(&g.out, &img),
        vec![
            (0x1000, 1, "call"),
            (0x2100, 1, "ind-jump"),
            (0x3000, 2, "syscall"),
        ]
    );
}

/// CYC and MTC packets between TNT packets and before a TIP (cycle-accurate tracing): the fast
/// paths consume them and apply them to the clock exactly as the general path does (every
/// instruction's time, checked by `decode_items` against `next_item`), and hand out the runs
/// the general path did.
/// A configuration in which MTC and CYC packets move the clock.
/// The times of the Enabled events (TIP.PGEs) of a decode, in order.
fn enabled_times(items: &[Item]) -> Vec<u64> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Event(Event {
                kind: EventKind::Enabled { .. },
                time,
                ..
            }) => Some(*time),
            _ => None,
        })
        .collect()
}

fn timed_cfg() -> FlowConfig {
    FlowConfig {
        timing: ptrewind::packet::time::TimingConfig {
            mtc_freq: 3,
            ctc_ratio: (2, 1),
            max_nonturbo_ratio: 10,
        },
        ..FlowConfig::default()
    }
}

#[test]
fn timing_packets_before_tnt_and_tip_keep_times_and_runs() {
    let img = image(&[(0x1000, LOOP_CODE)]);
    let mut g = Gen::new();
    g.psb_off_timed()
        .pge64(0x1000)
        .p(Packet::Mtc { ctc: 1 })
        .tnt(&[true, false])
        .p(Packet::Cyc { value: 7 })
        .p(Packet::Cyc { value: 300 })
        .p(Packet::Mtc { ctc: 2 })
        .tnt(&[true, true])
        .p(Packet::Cyc { value: 5 })
        .ip(IpKind::TipPgd, None);
    let items = decode_items(&g.out, &img, timed_cfg());
    assert_eq!(text(&items), s(LOOP_PATH));
    let mut times: Vec<u64> = items
        .iter()
        .filter_map(|i| match i {
            Item::Insn(x) => Some(x.time),
            _ => None,
        })
        .collect();
    times.dedup();
    assert!(times.len() >= 3, "the packets moved the clock: {times:?}");

    // 1000: nop; 1001: jmp [rip+0x100]: the TIP's block. 3000: nop; 3001: syscall.
    let img = image(&[
        (0x1000, &[0x90, 0xFF, 0x25, 0x00, 0x01, 0x00, 0x00]),
        (0x3000, &[0x90, 0x0F, 0x05]),
    ]);
    let tip_after = |timing: &[Packet]| {
        let mut g = Gen::new();
        g.psb_off().pge64(0x1000);
        for p in timing {
            g.p(*p);
        }
        g.ip(IpKind::Tip, Some(0x3000)).ip(IpKind::TipPgd, None);
        let _ = run(&g.out, &img);
        runs(&g.out, &img)
    };
    let whole = vec![(0x1000, 2, "ind-jump"), (0x3000, 2, "syscall")];
    let split = vec![
        (0x1000, 1, "other"),
        (0x1001, 1, "ind-jump"),
        (0x3000, 2, "syscall"),
    ];
    assert_eq!(tip_after(&[]), whole);
    // With a CYC or an MTC before it, the TIP was the general path's, which splits the block.
    assert_eq!(tip_after(&[Packet::Cyc { value: 3 }]), split);
    assert_eq!(tip_after(&[Packet::Mtc { ctc: 9 }]), split);
    assert_eq!(tip_after(&[Packet::Cyc { value: 1000 }]), split);
}

/// The timing packets of a stretch where tracing is off, which the TIP.PGE fast path reads in
/// runs with the time computed once per run: runs of MTCs and PADs, one- and two-byte CYCs
/// before and after the last MTC, a TSC that leaves the next MTC unanchored, a TMA and CBR
/// that anchor it again, and a three-byte CYC (left to the packet decoder). `decode_items`
/// holds `next_block` to `next_item`, times included; the first stretch's time is also
/// checked against the model of `packet::time` worked by hand.
#[test]
fn timing_runs_while_tracing_is_off() {
    // 1000: nop; 1001: jmp [rip+0x100], the TIP.PGD's branch.
    let img = image(&[(0x1000, &[0x90, 0xFF, 0x25, 0x00, 0x01, 0x00, 0x00])]);
    let stretches: [&[Packet]; 4] = [
        &[
            Packet::Mtc { ctc: 1 },
            Packet::Pad,
            Packet::Mtc { ctc: 2 },
            Packet::Mtc { ctc: 3 },
            Packet::Pad,
            Packet::Pad,
            Packet::Mtc { ctc: 4 },
            Packet::Mtc { ctc: 5 },
            Packet::Cyc { value: 300 },
            Packet::Cyc { value: 7 },
        ],
        &[
            Packet::Cyc { value: 7 },
            Packet::Cyc { value: 300 },
            Packet::Mtc { ctc: 6 },
            Packet::Mtc { ctc: 7 },
        ],
        &[
            Packet::Tsc { tsc: 2_000_000 },
            Packet::Mtc { ctc: 9 },
            Packet::Cyc { value: 40 },
        ],
        &[
            Packet::Tma { ctc: 0x48, fc: 0 },
            Packet::Cbr { ratio: 10 },
            Packet::Mtc { ctc: 10 },
            Packet::Cyc { value: 5 },
            Packet::Mtc { ctc: 12 },
            Packet::Cyc { value: 100_000 },
        ],
    ];
    let mut g = Gen::new();
    g.psb_off_timed()
        .pge64(0x1000)
        .ip(IpKind::TipPgd, Some(0x3000));
    for stretch in stretches {
        for p in stretch {
            g.p(*p);
        }
        g.ip(IpKind::TipPge, Some(0x1000))
            .ip(IpKind::TipPgd, Some(0x3000));
    }
    let items = decode_items(&g.out, &img, timed_cfg());
    let enabled_times = enabled_times(&items);
    // The model of `packet::time` worked by hand (MTC period 2^3 crystal ticks, 2 TSC ticks
    // each; cycles · 10 / CBR):
    // 1. MTC 5: 5 · 8 · 2 = 80 ticks after the TMA's TSC; then 307 cycles at CBR 20: 153.
    // 2. The CYCs before MTC 7 count for nothing: 7 · 8 · 2 = 112. (The MTC's time is below
    //    the CYC estimate before it: the model never moves the TSC reference back, but a CYC
    //    estimate is not a reference.)
    // 3. The TSC leaves MTC 9 unanchored; 40 cycles at CBR 20: 20.
    // 4. The TMA anchors CTC 0x48 (MTC 9); MTC 12 is 3 periods on: 48; then 100 000 cycles at
    //    CBR 10.
    assert_eq!(
        enabled_times,
        [
            1_000_000,
            1_000_000 + 80 + 153,
            1_000_000 + 112,
            2_000_000 + 20,
            2_000_000 + 48 + 100_000
        ]
    );
}

/// A filtered trace's TIP.PGD/TIP.PGE pairs (a call out of the traced range and the return into
/// it): the fast paths take a TIP.PGD bound to one block (a direct or an indirect CALL) or to a
/// longer path (a CALL into a PLT stub), and a TIP.PGE after timing packets and a MODE.Exec.
/// The stream (`decode_items` holds `next_block` to `next_item`, times included), the runs and
/// the return stack (the compressed RET at the end) are the general path's.
#[test]
fn filtered_disable_and_enable_pairs() {
    // 1000: nop; 1001: call 1100; 1006: call 3000; 100b: call [rip+0x100]; 1011: ret.
    // 1100: jmp [rip+0x100] (a PLT stub).
    let img = image(&[
        (
            0x1000,
            &[
                0x90, 0xE8, 0xFA, 0x00, 0x00, 0x00, 0xE8, 0xF5, 0x1F, 0x00, 0x00, 0xFF, 0x15, 0x00,
                0x01, 0x00, 0x00, 0xC3,
            ],
        ),
        (0x1100, &[0xFF, 0x25, 0x00, 0x01, 0x00, 0x00]),
    ]);
    // The code from 100b on is the same instructions in 32-bit mode.
    let mode32 = Packet::ModeExec {
        csl: false,
        csd: true,
        iflag: false,
    };
    let mut g = Gen::new();
    g.psb_off_timed()
        .pge64(0x1000)
        .ip(IpKind::TipPgd, Some(0x2000))
        .p(Packet::Cyc { value: 300 })
        .p(Packet::Mtc { ctc: 1 })
        .ip(IpKind::TipPge, Some(0x1006))
        .ip(IpKind::TipPgd, Some(0x3000))
        .p(Packet::Cyc { value: 5 })
        .p(mode32)
        .ip(IpKind::TipPge, Some(0x100b))
        .ip(IpKind::TipPgd, Some(0x4000))
        .p(Packet::Mtc { ctc: 2 })
        .ip(IpKind::TipPge, Some(0x1011))
        .tnt(&[true, true])
        .ip(IpKind::TipPgd, Some(0x4000));
    let items = decode_items(&g.out, &img, timed_cfg());
    // The two RETs pop what the indirect CALL at 100b, then the direct CALL at 1006, pushed.
    assert_eq!(
        text(&items),
        s(&[
            "en 1000", "1000", "1001", "1100", "dis 2000", "en 1006", "1006", "dis 3000",
            "en 100b", "100b", "dis 4000", "en 1011", "1011", "1011", "100b", "dis 4000",
        ])
    );
    let mode_change = items.iter().position(|i| {
        matches!(
            i,
            Item::Event(Event {
                kind: EventKind::ModeChange {
                    mode: ExecMode::Bits32
                },
                ..
            })
        )
    });
    let enabled_100b = items.iter().position(|i| {
        matches!(
            i,
            Item::Event(Event {
                kind: EventKind::Enabled { ip: 0x100b },
                ..
            })
        )
    });
    assert_eq!(
        mode_change.map(|k| k + 1),
        enabled_100b,
        "the MODE.Exec took effect at the TIP.PGE"
    );
    let enabled_times = enabled_times(&items);
    assert!(
        enabled_times.windows(2).all(|w| w[0] < w[1]),
        "the timing packets moved the clock: {enabled_times:?}"
    );
    assert_eq!(
        runs(&g.out, &img),
        vec![
            (0x1000, 2, "call"),
            (0x1100, 1, "ind-jump"),
            (0x1006, 1, "call"),
            (0x100b, 1, "ind-call"),
            (0x1011, 1, "ret"),
            (0x1011, 1, "ret"),
            (0x100b, 1, "ind-call"),
        ]
    );
}

#[test]
fn blocks_and_items_agree() {
    let img = image(&[(0x1000, LOOP_CODE)]);
    let mut g = Gen::new();
    g.psb_off()
        .pge64(0x1000)
        .tnt(&[true, false, true, true])
        .ip(IpKind::TipPgd, None);
    let items = run(&g.out, &img);
    let mut dec = FlowDecoder::new(&g.out, &img, FlowConfig::default());
    let mut from_blocks = Vec::new();
    while let Some(b) = dec.next_block() {
        match b {
            BlockItem::Block(b) => {
                assert_eq!(b.count as usize, b.lens().len());
                let v: Vec<_> = b.insns().collect();
                assert_eq!(v.first().unwrap().ip, b.start);
                assert_eq!(v.last().unwrap().ip, b.end);
                from_blocks.extend(v.into_iter().map(Item::Insn));
            }
            BlockItem::Event(e) => from_blocks.push(Item::Event(e)),
        }
    }
    assert_eq!(from_blocks, items);
    assert_eq!(dec.stats().insns, 10);
}

/// `next_block` (runs, with its TNT fast path and the replay of recorded TNT walks) and a mix of
/// `next_block`/`next_item` calls on one decoder yield exactly the stream of `next_item`, which
/// the differential tests above hold against libipt. Every corpus trace, each twice in a row so
/// the second copy replays walks recorded in the first.
#[test]
fn next_block_stream_equals_next_item_on_every_corpus_trace() {
    let Some(traces) = corpus_traces(|_| true) else {
        return;
    };
    for t in &traces {
        let img = image_of(t);
        let pt = t.pt.repeat(2);
        let mut reference = FlowDecoder::new(&pt, &img, cfg_of(t));
        let mut blocks = FlowDecoder::new(&pt, &img, cfg_of(t));
        let mut mixed = FlowDecoder::new(&pt, &img, cfg_of(t));
        let mut pending: std::collections::VecDeque<Item> = Default::default();
        let mut pending_mixed: std::collections::VecDeque<Item> = Default::default();
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut n = 0u64;
        while let Some(want) = reference.next_item() {
            if pending.is_empty() {
                match blocks.next_block() {
                    Some(BlockItem::Block(b)) => pending.extend(b.insns().map(Item::Insn)),
                    Some(BlockItem::Event(e)) => pending.push_back(Item::Event(e)),
                    None => {}
                }
            }
            if pending_mixed.is_empty() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                if seed % 3 == 0 {
                    pending_mixed.extend(mixed.next_item());
                } else {
                    match mixed.next_block() {
                        Some(BlockItem::Block(b)) => {
                            pending_mixed.extend(b.insns().map(Item::Insn))
                        }
                        Some(BlockItem::Event(e)) => pending_mixed.push_back(Item::Event(e)),
                        None => {}
                    }
                }
            }
            assert_eq!(
                pending.pop_front().as_ref(),
                Some(&want),
                "{}: item {n}",
                t.name
            );
            assert_eq!(
                pending_mixed.pop_front().as_ref(),
                Some(&want),
                "{}: item {n} (mixed calls)",
                t.name
            );
            n += 1;
        }
        assert!(
            pending.is_empty() && blocks.next_block().is_none(),
            "{}",
            t.name
        );
        assert!(pending_mixed.is_empty(), "{}", t.name);
        assert_eq!(blocks.stats().insns, reference.stats().insns, "{}", t.name);
    }
}

// ---------------------------------------------------------------------------------------------
// Robustness

/// Deterministic byte corruption of real traces: never a panic, always the end of the stream,
/// output bounded.
#[test]
fn corrupted_traces_terminate_without_panic() {
    let Some(traces) =
        corpus_traces(|n| matches!(n, "arcus/hello" | "libxdc/Unzip" | "hase/loopy-20180404"))
    else {
        return;
    };
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for t in &traces {
        let img = image_of(t);
        for round in 0..20 {
            let mut pt = t.pt.clone();
            let flips = 1 + round * 3;
            for _ in 0..flips {
                let at = (rnd() as usize) % pt.len();
                pt[at] = rnd() as u8;
            }
            let mut dec = FlowDecoder::new(&pt, &img, FlowConfig::default());
            let mut n = 0u64;
            while dec.next_block().is_some() {
                n += 1;
                assert!(n < 50_000_000, "{}: no end", t.name);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CPU errata: each workaround on a generated trace that shows the erratum, with the errata of
// a CPU that has it and without (an unknown CPU); against libipt configured with the same CPU
// where libipt 2.0.5 implements the workaround.

/// Skylake (6/0x5e): BDM70, SKD007, SKD022, SKD010, SKL014, SKL168.
const SKYLAKE: (u16, u8, u8) = (6, 0x5e, 3);
/// Broadwell (6/0x3d): BDM70, BDM64.
const BROADWELL: (u16, u8, u8) = (6, 0x3d, 4);
/// Apollo Lake (6/0x5c): APL12, APL11.
const APOLLO_LAKE: (u16, u8, u8) = (6, 0x5c, 9);
/// Gemini Lake (6/0x7a): APL11 only.
const GEMINI_LAKE: (u16, u8, u8) = (6, 0x7a, 1);

fn errata_of(cpu: (u16, u8, u8)) -> Errata {
    Errata::for_cpu(&Cpu::intel(cpu.0, cpu.1, cpu.2))
}

fn run_on(pt: &[u8], img: &Image, cpu: Option<(u16, u8, u8)>) -> Vec<Item> {
    let cfg = FlowConfig {
        errata: cpu.map(errata_of).unwrap_or_default(),
        ..FlowConfig::default()
    };
    decode_items(pt, img, cfg)
}

fn oracle(pt: &[u8], code: &[(u64, &[u8])], cpu: Option<(u16, u8, u8)>) -> libipt::OracleRun {
    let images: Vec<libipt::ImageSection> = code
        .iter()
        .map(|(addr, bytes)| libipt::ImageSection {
            addr: *addr,
            bytes: bytes.to_vec(),
            name: "generated".into(),
        })
        .collect();
    libipt::ipt_insns(pt, cpu, &images)
}

/// With the CPU: libipt and we agree and neither reports an error. Without: libipt reports one
/// (its decode is wrong or stops), as our decode does (`ours_fails`) or at least differs.
fn check_against_libipt(
    name: &str,
    pt: &[u8],
    code: &[(u64, &[u8])],
    cpu: (u16, u8, u8),
    expected: &[&str],
) {
    let img = image(code);
    let with = run_on(pt, &img, Some(cpu));
    assert_eq!(text(&with), s(expected), "{name}: with the workaround");
    let lib = oracle(pt, code, Some(cpu));
    assert!(lib.errors().is_empty(), "{name}: libipt {:?}", lib.errors());
    assert_eq!(ips(&with), lib.ips(), "{name}: libipt with the same CPU");
    let lib_without = oracle(pt, code, None);
    eprintln!(
        "{name}: libipt without the CPU: {} insns, errors {:?}",
        lib_without.insn_count(),
        lib_without.errors()
    );
    assert!(
        !lib_without.errors().is_empty() || lib_without.ips() != lib.ips(),
        "{name}: libipt decodes it without the erratum too"
    );
}

#[test]
fn errata_table_matches_libipt_for_every_model() {
    let names = [
        "bdm70", "bdm64", "skd007", "skd022", "skd010", "skl014", "apl12", "apl11", "skl168",
        "skz84",
    ];
    let mut with_errata = 0;
    for family in [5u16, 6, 7, 15] {
        for model in 0..=255u8 {
            // libipt rejects CPUs it knows nothing about (other families): no errata.
            let bits = libipt::cpu_errata_bits(family, model, 0).unwrap_or(0);
            let theirs: Vec<&str> = (0..names.len())
                .filter(|&i| bits & (1 << i) != 0)
                .map(|i| names[i])
                .collect();
            let ours = Errata::for_cpu(&Cpu::intel(family, model, 0)).names();
            assert_eq!(ours, theirs, "{family}/{model:#x}");
            with_errata += !ours.is_empty() as u32;
        }
    }
    assert!(with_errata >= 25);
    assert!(Errata::default().is_empty());
}

/// BDM70: a PSB+ before TIP.PGE carries FUP + MODE.Exec although tracing is off. With the
/// workaround the PSB says "disabled" (no IP), which is what a decoder started there needs.
#[test]
fn erratum_bdm70_psb_fup_before_tip_pge() {
    let code: &[(u64, &[u8])] = &[(0x1000, LOOP_CODE)];
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&[true, false, true, true]);
    g.ip(IpKind::TipPgd, None);
    // Tracing is off; the next PSB+ wrongly holds FUP 0x1000 and MODE.Exec, then TIP.PGE.
    g.psb_on(0x1000).pge64(0x1000).tnt(&[true, true]);
    g.ip(IpKind::TipPgd, None);
    let path = [
        "en 1000", "1000", "1010", "1013", "1005", "1007", "1000", "1010", "1013", "1005", "1009",
        "dis", "en 1000", "1000", "1010", "1013", "1005", "1009", "dis",
    ];
    check_against_libipt("bdm70", &g.out, code, SKYLAKE, &path);
    let psb_ips = |items: &[Item]| -> Vec<Option<u64>> {
        items
            .iter()
            .filter_map(|i| match i {
                Item::Event(Event {
                    kind: EventKind::Psb { ip, .. },
                    ..
                }) => Some(*ip),
                _ => None,
            })
            .collect()
    };
    let img = image(code);
    assert_eq!(psb_ips(&run_on(&g.out, &img, Some(SKYLAKE))), [None, None]);
    // Without: the PSB claims tracing was on at 0x1000.
    assert_eq!(psb_ips(&run(&g.out, &img)), [None, Some(0x1000)]);
    // While tracing is (believed to be) on, the walk to the FUP still happens, and the PSB still
    // says "disabled": a decoder started at that PSB gives the suffix of the full decode.
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&[true]);
    let second = g.out.len() as u64;
    g.psb_on(0x1005).pge64(0x1000).tnt(&[true, true]);
    g.ip(IpKind::TipPgd, None);
    let cfg = FlowConfig {
        errata: errata_of(SKYLAKE),
        ..FlowConfig::default()
    };
    let full = decode_items(&g.out, &img, cfg.clone());
    assert_eq!(psb_ips(&full), [None, None]);
    assert_eq!(
        text(&full),
        s(&[
            "en 1000", "1000", "1010", "1013", "en 1000", "1000", "1010", "1013", "1005", "1009",
            "dis"
        ])
    );
    let mut dec = FlowDecoder::at_psb(&g.out, &img, cfg, second);
    let suffix: Vec<Item> = std::iter::from_fn(|| dec.next_item()).collect();
    let at = full
        .iter()
        .position(|i| matches!(i, Item::Event(e) if e.offset == second))
        .unwrap();
    assert_eq!(suffix, full[at..]);
}

/// SKD007: an OVF after the first byte of a 2-byte CYC: `07 02 F3` reads as CYC(07 02) CYC(F3)
/// and hides the OVF.
#[test]
fn erratum_skd007_ovf_inside_cyc() {
    let code: &[(u64, &[u8])] = &[(0x1000, LOOP_CODE)];
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&[true, false]);
    g.out.extend_from_slice(&[0x07, 0x02, 0xF3]);
    g.ip(IpKind::Fup, Some(0x1009)).ip(IpKind::TipPgd, None);
    let expected = [
        "en 1000", "1000", "1010", "1013", "1005", "ovf 1009", "1009", "dis",
    ];
    check_against_libipt("skd007", &g.out, code, SKYLAKE, &expected);
    // Without: no overflow, and the FUP cannot be reached from where the TNT left off.
    let t = text(&run(&g.out, &image(code)));
    assert!(!t.iter().any(|x| x.starts_with("ovf")), "{t:?}");
    assert!(t.iter().any(|x| x.starts_with("err")), "{t:?}");
}

/// SKD010: the FUP after an OVF is missing; the next TIP tells where execution resumed.
#[test]
fn erratum_skd010_tip_after_ovf() {
    let code: &[(u64, &[u8])] = &[(0x1000, LOOP_CODE)];
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&[true, false]);
    g.p(Packet::Ovf).ip(IpKind::Tip, Some(0x1009));
    g.ip(IpKind::TipPgd, None);
    let expected = [
        "en 1000", "1000", "1010", "1013", "1005", "ovf 1009", "1009", "dis",
    ];
    check_against_libipt("skd010", &g.out, code, SKYLAKE, &expected);
    let t = text(&run(&g.out, &image(code)));
    assert_eq!(
        t[5..],
        s(&[
            "ovf",
            "err UnexpectedPacket(\"tip after overflow\") Some(1009)"
        ])[..]
    );
}

/// APL11: an OVF followed by TIP.PGD (tracing was being disabled as the overflow resolved).
#[test]
fn erratum_apl11_tip_pgd_after_ovf() {
    let code: &[(u64, &[u8])] = &[(0x1000, LOOP_CODE)];
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&[true, false]);
    g.p(Packet::Ovf).ip(IpKind::TipPgd, None);
    g.pge64(0x1009).ip(IpKind::TipPgd, None);
    let expected = [
        "en 1000", "1000", "1010", "1013", "1005", "ovf", "dis", "en 1009", "1009", "dis",
    ];
    check_against_libipt("apl11", &g.out, code, GEMINI_LAKE, &expected);
    // SKD010 CPUs take the same path (their FUP was dropped, then tracing stopped).
    assert_eq!(
        text(&run_on(&g.out, &image(code), Some(SKYLAKE))),
        s(&expected)
    );
    let t = text(&run(&g.out, &image(code)));
    assert_eq!(t[5], "ovf");
    assert!(
        t[6].starts_with("err UnexpectedPacket(\"tip.pgd after overflow\")"),
        "{t:?}"
    );
    assert_eq!(t[7..], s(&["en 1009", "1009", "dis"])[..]);
}

/// APL12: a FUP after an OVF although tracing is off (the TIP.PGE that follows shows it).
#[test]
fn erratum_apl12_spurious_fup_after_ovf() {
    let code: &[(u64, &[u8])] = &[(0x1000, LOOP_CODE)];
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&[true, false]);
    g.p(Packet::Ovf).ip(IpKind::Fup, Some(0x1005));
    g.pge64(0x1009).ip(IpKind::TipPgd, None);
    let expected = [
        "en 1000", "1000", "1010", "1013", "1005", "ovf", "en 1009", "1009", "dis",
    ];
    check_against_libipt("apl12", &g.out, code, APOLLO_LAKE, &expected);
    // Without: the overflow claims tracing resumed at the spurious FUP.
    let t = text(&run(&g.out, &image(code)));
    assert_eq!(t[5], "ovf 1005");
    // With APL12 a FUP that is followed by trace is still the architectural resume point.
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&[true, false]);
    g.p(Packet::Ovf)
        .ip(IpKind::Fup, Some(0x1009))
        .ip(IpKind::TipPgd, None);
    let t = text(&run_on(&g.out, &image(code), Some(APOLLO_LAKE)));
    assert_eq!(t[5..], s(&["ovf 1009", "1009", "dis"])[..]);
}

/// SKD022: a VMLAUNCH that clears TraceEn sends FUP + TIP.PGD: the VMLAUNCH ran, the disable is
/// synchronous.
#[test]
fn erratum_skd022_vm_entry_fup_tip_pgd() {
    // 2000: nop ; 2001: vmlaunch
    let code: &[(u64, &[u8])] = &[(0x2000, &[0x90, 0x0F, 0x01, 0xC2])];
    let mut g = Gen::new();
    g.psb_off().pge64(0x2000);
    g.ip(IpKind::Fup, Some(0x2001)).ip(IpKind::TipPgd, None);
    check_against_libipt(
        "skd022",
        &g.out,
        code,
        SKYLAKE,
        &["en 2000", "2000", "2001", "dis"],
    );
    // Without: an asynchronous disable before the VMLAUNCH.
    assert_eq!(
        text(&run(&g.out, &image(code))),
        s(&["en 2000", "2000", "dis 2001"])
    );
    // An ordinary instruction at the FUP stays an asynchronous disable with the workaround.
    let code: &[(u64, &[u8])] = &[(0x2000, &[0x90, 0x90, 0x0F, 0x05])];
    assert_eq!(
        text(&run_on(&g.out, &image(code), Some(SKYLAKE))),
        s(&["en 2000", "2000", "dis 2001"])
    );
}

/// SKL014: a direct JMP out of the IP filter range gives a TIP.PGD without IP; libipt gets the
/// same filter configuration.
#[test]
fn erratum_skl014_direct_jump_leaves_the_filter() {
    // 3000: nop ; 3001: jmp 5000 (outside the filter) ; 5000: syscall
    let code: &[(u64, &[u8])] = &[
        (0x3000, &[0x90, 0xE9, 0xFA, 0x1F, 0x00, 0x00]),
        (0x5000, &[0x0F, 0x05]),
    ];
    let img = image(code);
    let mut g = Gen::new();
    g.psb_off().pge64(0x3000).ip(IpKind::TipPgd, None);
    g.pge64(0x3000).ip(IpKind::TipPgd, Some(0x5000));
    let cfg = |errata, filter: &[(u64, u64)]| FlowConfig {
        errata,
        ip_filter: filter.to_vec(),
        ..FlowConfig::default()
    };
    let filter = [(0x3000, 0x3fff)];
    let with = decode_items(&g.out, &img, cfg(errata_of(SKYLAKE), &filter));
    assert_eq!(
        text(&with),
        s(&[
            "en 3000", "3000", "3001", "dis", "en 3000", "3000", "3001", "dis 5000"
        ])
    );
    let sections: Vec<libipt::ImageSection> = code
        .iter()
        .map(|(addr, bytes)| libipt::ImageSection {
            addr: *addr,
            bytes: bytes.to_vec(),
            name: "generated".into(),
        })
        .collect();
    let mut lib = Vec::new();
    let summary = libipt::ipt_insn_walk_filtered(&g.out, Some(SKYLAKE), &filter, &sections, |i| {
        if let OracleItem::Insn(x) = i {
            lib.push(x.ip)
        }
    });
    assert!(summary.errors.is_empty(), "{:?}", summary.errors);
    assert_eq!(ips(&with), lib);
    let mut lib_without = Vec::new();
    let summary = libipt::ipt_insn_walk_filtered(&g.out, None, &filter, &sections, |i| {
        if let OracleItem::Insn(x) = i {
            lib_without.push(x.ip)
        }
    });
    eprintln!(
        "skl014: libipt without the CPU: {lib_without:x?} {:?}",
        summary.errors
    );
    assert!(lib_without != lib || !summary.errors.is_empty());
    // Without the erratum (or without the filter configuration) the suppressed disable binds to
    // the SYSCALL past the jump, which was never traced.
    let expected_wrong = [
        "en 3000", "3000", "3001", "5000", "dis", "en 3000", "3000", "3001", "dis 5000",
    ];
    for c in [
        cfg(Errata::default(), &filter),
        cfg(errata_of(SKYLAKE), &[]),
    ] {
        assert_eq!(text(&decode_items(&g.out, &img, c)), s(&expected_wrong));
    }
}

/// BDM64: a TSX abort right after an indirect branch whose TIP target is wrong: the abort FUP
/// cannot be reached from that target.
#[test]
fn erratum_bdm64_tsx_abort_after_wrong_tip() {
    // 4000: jmp rax ; 4010: nop ; 4100: jmp rbx ; 4200: syscall
    let mut code = vec![0x90u8; 0x210];
    code[0..2].copy_from_slice(&[0xFF, 0xE0]);
    code[0x100..0x102].copy_from_slice(&[0xFF, 0xE3]);
    code[0x200..0x202].copy_from_slice(&[0x0F, 0x05]);
    let code: &[(u64, &[u8])] = &[(0x4000, &code)];
    let mut g = Gen::new();
    g.psb_off().pge64(0x4000).ip(IpKind::Tip, Some(0x4100));
    g.p(Packet::ModeTsx {
        intx: false,
        abort: true,
    })
    .ip(IpKind::Fup, Some(0x4010));
    g.ip(IpKind::Tip, Some(0x4200)).ip(IpKind::TipPgd, None);
    let expected = [
        "en 4000",
        "4000",
        "tsx Some(4010) false true",
        "async 4010>4200",
        "4200",
        "dis",
    ];
    check_against_libipt("bdm64", &g.out, code, BROADWELL, &expected);
    let t = text(&run(&g.out, &image(code)));
    assert!(
        t.iter().any(|x| x.starts_with("err EventIpUnreachable")),
        "{t:?}"
    );
}

/// SKZ84: in a VMX guest with TSC offsetting a TMA has reserved bits set and a bogus extra
/// byte. With the workaround the 8 bytes are skipped; without, the packet is invalid and the
/// decoder loses sync until the next PSB.
#[test]
fn erratum_skz84_corrupt_tma() {
    let code: &[(u64, &[u8])] = &[(0x1000, LOOP_CODE)];
    let img = image(code);
    let mut g = Gen::new();
    g.psb_off().pge64(0x1000).tnt(&[true, false]);
    g.out
        .extend_from_slice(&[0x02, 0x73, 0x34, 0x12, 0x00, 0x56, 0xfe, 0x99]);
    g.tnt(&[true, true]).ip(IpKind::TipPgd, None);
    check_against_libipt("skz84", &g.out, code, (6, 0x55, 4), LOOP_PATH);
    let t = text(&run(&g.out, &img));
    assert!(
        t.iter().any(|x| x.starts_with("err Packet(Invalid")),
        "{t:?}"
    );
    assert!(!t.contains(&"1009".to_string()), "{t:?}");
}

/// The HASE recordings decoded with the errata of the CPUs they were recorded on (perf.data
/// headers: GenuineIntel,6,94,3 and 6,61,4): same instructions as libipt configured alike, and
/// still the ground truth.
#[test]
fn hase_with_the_recording_cpus_errata() {
    let Some(traces) = corpus_traces(|n| n.starts_with("hase/")) else {
        return;
    };
    for mut t in traces {
        t.cpu = Some(if t.name.contains("201804") {
            SKYLAKE_I5_6500
        } else {
            BROADWELL_I7_5600U
        });
        let d = lockstep(&t);
        assert!(d.libipt_insns > 0, "{}", t.name);
        assert_eq!(d.first_diff, None, "{}: {d:?}", t.name);
        assert_eq!(d.ours_insns, d.libipt_insns, "{}", t.name);
        assert!(
            d.our_errors.is_empty() && d.libipt_errors.is_empty(),
            "{}: {d:?}",
            t.name
        );
    }
}

const SKYLAKE_I5_6500: (u16, u8, u8) = (6, 94, 3);
const BROADWELL_I7_5600U: (u16, u8, u8) = (6, 61, 4);

/// The HASE 2018-05 recordings (Broadwell i7-5600U, GenuineIntel,6,61,4: BDM70) really show
/// BDM70: PSB+ blocks with a FUP right before a TIP.PGE. libipt configured with that CPU decodes
/// the original stream (without it, it stops with an error, which is why the other tests mask
/// those FUPs for libipt), identically to us, and our PSB events then say "disabled".
#[test]
fn bdm70_in_the_real_hase_2018_05_recordings() {
    let Some(traces) = corpus_traces(|n| n.starts_with("hase/") && n.contains("201805")) else {
        return;
    };
    assert!(!traces.is_empty());
    for t in &traces {
        let (_, masked) = libipt::mask_psb_fup_before_pge(&t.pt);
        assert!(!masked.is_empty(), "{}: no BDM70 pattern", t.name);
        let lib = libipt::ipt_insns(&t.pt, Some(BROADWELL_I7_5600U), &t.images);
        assert!(lib.errors().is_empty(), "{}: {:?}", t.name, lib.errors());
        let lib_unknown = libipt::ipt_insns(&t.pt, None, &t.images);
        assert!(!lib_unknown.errors().is_empty(), "{}", t.name);
        let img = image_of(t);
        let cfg = FlowConfig {
            errata: errata_of(BROADWELL_I7_5600U),
            ..FlowConfig::default()
        };
        let ours = decode_items(&t.pt, &img, cfg.clone());
        assert!(errors(&ours).is_empty(), "{}", t.name);
        assert_eq!(ips(&ours), lib.ips(), "{}", t.name);
        // With the workaround, decoding from any PSB still yields the suffix of the full decode.
        check_restart(&t.name, &t.pt, &img, &cfg, 64);
        // Each PSB whose FUP libipt's workaround drops is a "disabled" PSB for us too.
        let disabled_psbs = |items: &[Item]| {
            items
                .iter()
                .filter(|i| {
                    matches!(
                        i,
                        Item::Event(Event {
                            kind: EventKind::Psb { ip: None, .. },
                            ..
                        })
                    )
                })
                .count()
        };
        let plain = decode_items(&t.pt, &img, FlowConfig::default());
        assert_eq!(ips(&plain), ips(&ours), "{}", t.name);
        assert_eq!(
            disabled_psbs(&ours),
            disabled_psbs(&plain) + masked.len(),
            "{}",
            t.name
        );
    }
}

/// `stats()` counts what was handed out: a path replay is counted whole when it starts (one
/// update instead of one per block), so the blocks it has not handed out yet are taken back in
/// `stats()` and when `next_item` hands the rest of a replay to the queue (the totals of a
/// decode by blocks and of one mixing both calls).
#[test]
fn stats_count_what_was_handed_out() {
    let Some(traces) = corpus_traces(|_| true) else {
        return;
    };
    let mut replays = 0;
    for t in &traces {
        let img = image_of(t);
        // Repeated, so that most TNT-8 walks replay.
        let pt = t.pt.repeat(2);
        let mut dec = FlowDecoder::new(&pt, &img, cfg_of(t));
        let (mut insns, mut runs, mut k) = (0u64, 0u64, 0u64);
        while let Some(item) = dec.next_block() {
            if let BlockItem::Block(b) = item {
                insns += b.count as u64;
                runs += 1;
            }
            k += 1;
            // Output queued behind an event is counted when queued: the counts may run ahead
            // of what was handed out, never behind.
            let s = dec.stats();
            assert!(
                s.insns >= insns && s.runs >= runs,
                "{}: block {k}: {:?} < {:?}",
                t.name,
                (s.insns, s.runs),
                (insns, runs)
            );
        }
        let s = dec.stats();
        assert_eq!((s.insns, s.runs), (insns, runs), "{}: at the end", t.name);
        replays += dec.stats().path_hits;

        let mut mixed = FlowDecoder::new(&pt, &img, cfg_of(t));
        let (mut handed, mut seed) = (0u64, 0x9E37_79B9_7F4A_7C15u64);
        loop {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if seed % 5 == 0 {
                match mixed.next_item() {
                    Some(Item::Insn(_)) => handed += 1,
                    Some(Item::Event(_)) => {}
                    None => break,
                }
            } else {
                match mixed.next_block() {
                    Some(BlockItem::Block(b)) => handed += b.count as u64,
                    Some(BlockItem::Event(_)) => {}
                    None => break,
                }
            }
        }
        assert_eq!(mixed.stats().insns, handed, "{} (mixed calls)", t.name);
        assert_eq!(handed, insns, "{}", t.name);
    }
    assert!(replays > 1000, "paths replayed: {replays}");
}
