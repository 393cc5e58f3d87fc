//! Fuzzes the instruction-flow decoder: arbitrary (typically mutated real) trace bytes against a
//! fixed code image. The image is libxdc's Unzip page list from the corpus
//! (`$PTREWIND_CORPUS` or `../../shared/corpus` relative to this crate), or, without the corpus,
//! a small built-in code snippet. Seed the fuzzer with real traces, e.g.
//! `cp ../shared/corpus/libxdc-experiments/Unzip/trace /tmp/flowseeds/`.
//!
//! Checked: no panic, the decode ends, and the block and item views give the same stream
//! (instructions with their times, and events); a decode started at a PSB found by scanning
//! (which may lie inside another packet of the full decode's packet stream) also terminates
//! without panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ptrewind::flow::{BlockItem, FlowConfig, FlowDecoder, Item};
use ptrewind::image::{Image, Section};
use ptrewind::packet::time::TimingConfig;
use std::path::PathBuf;
use std::sync::OnceLock;

fn corpus_image() -> Option<Image> {
    let root = std::env::var_os("PTREWIND_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"));
    let dir = root.join("libxdc-experiments/Unzip");
    let addrs = std::fs::read(dir.join("data.addr")).ok()?;
    let dump = std::fs::read(dir.join("data.dump")).ok()?;
    let mut img = Image::new();
    for (i, a) in addrs.chunks_exact(8).enumerate() {
        let addr = u64::from_le_bytes(a.try_into().ok()?);
        let page = dump.get(i * 4096..(i + 1) * 4096)?;
        img.add(Section::new(addr, page.to_vec(), "Unzip")).ok()?;
    }
    Some(img)
}

fn image() -> &'static Image {
    static IMG: OnceLock<Image> = OnceLock::new();
    IMG.get_or_init(|| {
        corpus_image().unwrap_or_else(|| {
            // call/ret, a conditional loop, an indirect jump and a syscall at 0x400000.
            let code = [
                0xE8, 0x0B, 0x00, 0x00, 0x00, 0x74, 0x02, 0xEB, 0xF7, 0x0F, 0x05, 0xFF, 0xE0, 0x90,
                0x90, 0x90, 0x48, 0x31, 0xC0, 0xC3,
            ];
            let mut img = Image::new();
            let _ = img.add(Section::new(0x400000, code.to_vec(), "builtin"));
            img
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let img = image();
    let cfg = FlowConfig {
        max_walk: 1 << 16,
        // MTC and CYC packets give times (the default gives none), so that the fast paths'
        // time arithmetic, which works on runs of them, is held to the general path's.
        timing: TimingConfig {
            mtc_freq: 3,
            ctc_ratio: (7, 3),
            max_nonturbo_ratio: 12,
        },
        ..FlowConfig::default()
    };
    // `next_block` runs the fast paths, `next_item` only the general path: the two streams
    // (every instruction with its time, every event) must be the same item for item.
    let mut dec = FlowDecoder::new(data, img, cfg.clone());
    let mut from_blocks = Vec::new();
    while let Some(b) = dec.next_block() {
        match b {
            BlockItem::Block(b) => {
                assert_eq!(b.count as usize, b.lens().len());
                from_blocks.extend(b.insns().map(Item::Insn));
            }
            BlockItem::Event(e) => from_blocks.push(Item::Event(e)),
        }
    }
    let insns = from_blocks
        .iter()
        .filter(|i| matches!(i, Item::Insn(_)))
        .count();
    assert_eq!(insns as u64, dec.stats().insns);
    let mut dec = FlowDecoder::new(data, img, cfg.clone());
    let mut items = Vec::new();
    while let Some(i) = dec.next_item() {
        items.push(i);
    }
    assert_eq!(items, from_blocks);
    if let Some(psb) = ptrewind::packet::find_psb_forward(data, 1) {
        let mut dec = FlowDecoder::at_psb(data, img, cfg, psb as u64);
        while dec.next_item().is_some() {}
    }
});
