//! Differential test of the cheap instruction decoder (`ptrewind::flow::ild`) against iced-x86
//! on real code: every distinct instruction the corpus traces execute, and a linear sweep over
//! every corpus image. Wherever the cheap decoder answers, it must agree with iced-x86 on the
//! length, the control-flow class and the direct-branch target. (Random bytes are covered by
//! the unit tests in `src/flow/ild.rs`.)

mod support;

use iced_x86::{Decoder, DecoderOptions};
use ptrewind::flow::ild;
use ptrewind::flow::{BlockItem, FlowConfig, FlowDecoder, InsnClass};
use ptrewind::image::{Image, Section};
use std::collections::HashSet;

/// Checks one instruction; returns whether the cheap decoder answered.
fn check(bytes: &[u8], bits: u32, ip: u64, what: &str) -> bool {
    let Some(got) = ild::decode(bytes, bits) else {
        return false;
    };
    let ins = Decoder::with_ip(bits, bytes, ip, DecoderOptions::NONE).decode();
    assert!(
        !ins.is_invalid(),
        "{what} {ip:#x}: iced-x86 says invalid, ild {got:?} ({:02x?})",
        &bytes[..bytes.len().min(15)]
    );
    let class = InsnClass::of(&ins);
    assert_eq!(
        (got.len as usize, got.class),
        (ins.len(), class),
        "{what} {ip:#x}: {:02x?} ({ins})",
        &bytes[..ins.len()]
    );
    if matches!(
        class,
        InsnClass::CondBranch | InsnClass::DirectJump | InsnClass::DirectCall
    ) {
        assert_eq!(
            got.target(ip, bits),
            ins.near_branch_target(),
            "{what} {ip:#x}"
        );
    }
    true
}

fn bits_of(t: &support::CorpusTrace) -> u32 {
    match t.mode {
        support::libipt::ExecMode::Bits32 => 32,
        support::libipt::ExecMode::Bits16 => 16,
        _ => 64,
    }
}

#[test]
fn ild_agrees_with_iced_on_executed_instructions() {
    let Some(root) = support::require_corpus("ild") else {
        return;
    };
    let (mut answered, mut total) = (0u64, 0u64);
    for name in support::corpus::trace_names(&root) {
        let t = support::corpus::load_trace(&root, &name).expect("trace");
        if !t.has_images() {
            continue;
        }
        let mut image = Image::new();
        for s in &t.images {
            let _ = image.add(Section::new(s.addr, s.bytes.clone(), &s.name));
        }
        let mut cfg = FlowConfig::default();
        if bits_of(&t) == 32 {
            cfg.default_mode = ptrewind::packet::ExecMode::Bits32;
        }
        let mut seen: HashSet<(u64, u32)> = HashSet::new();
        let mut dec = FlowDecoder::new(&t.pt, &image, cfg);
        while let Some(item) = dec.next_block() {
            let BlockItem::Block(b) = item else { continue };
            let bits = match b.mode {
                ptrewind::packet::ExecMode::Bits32 => 32,
                ptrewind::packet::ExecMode::Bits16 => 16,
                _ => 64,
            };
            for i in b.insns() {
                if !seen.insert((i.ip, bits)) {
                    continue;
                }
                let mut bytes = [0u8; 15];
                let got = image.read(i.ip, &mut bytes);
                total += 1;
                if check(&bytes[..got], bits, i.ip, &name) {
                    answered += 1;
                }
            }
        }
    }
    eprintln!("executed: ild answered {answered} of {total} distinct instructions");
    assert!(total > 100_000, "{total}");
    // The point of the cheap decoder: most real code never reaches iced-x86.
    assert!(
        answered * 10 > total * 8,
        "ild answered only {answered} of {total}"
    );
}

#[test]
fn ild_agrees_with_iced_on_a_sweep_of_every_image() {
    let Some(root) = support::require_corpus("ild") else {
        return;
    };
    let mut done: HashSet<(u64, usize, u32)> = HashSet::new();
    let mut answered = 0u64;
    for name in support::corpus::trace_names(&root) {
        let t = support::corpus::load_trace(&root, &name).expect("trace");
        let bits = bits_of(&t);
        for s in &t.images {
            // The arcus traces share their libraries: sweep each distinct section once.
            if !done.insert((s.addr, s.bytes.len(), bits)) {
                continue;
            }
            // A linear sweep (iced-x86's lengths; one byte on an invalid one), capped per
            // section to keep the test short.
            let data = &s.bytes[..s.bytes.len().min(1 << 20)];
            let mut off = 0usize;
            while off < data.len() {
                let bytes = &data[off..data.len().min(off + 15)];
                let ip = s.addr + off as u64;
                if check(bytes, bits, ip, &name) {
                    answered += 1;
                }
                let ins = Decoder::with_ip(bits, bytes, ip, DecoderOptions::NONE).decode();
                off += if ins.is_invalid() { 1 } else { ins.len() };
            }
        }
    }
    eprintln!("sweep: ild answered {answered} instructions");
    assert!(answered > 100_000, "{answered}");
}
