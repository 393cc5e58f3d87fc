//! Fuzzes ELF loading from arbitrary bytes: `LoadedElf::from_bytes` (object crate parse, the
//! `PT_LOAD` checks, placement at a base), its sections, adding them to an `Image`,
//! `elf_build_id`, and the symbolizer over the same bytes.
//!
//! Checked: no panic, no hang; the sections of a loaded file lie inside the file.
//!
//! Run: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run elf_bytes -- -max_len=65536 -max_total_time=180`
//! (seed it with small ELF files, e.g. the corpus's `hase-pt-recordings/*/binaries`).
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use ptrewind::image::perf_maps::elf_build_id;
use ptrewind::image::{Image, LoadedElf, Segments};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    // Half the time start from the valid tiny ELF with the input as its code, so that the
    // segment and placement logic is reached; otherwise the bytes are the whole file.
    let bytes = if data.first().is_some_and(|b| b & 1 == 1) {
        common::tiny_elf(&data[1..])
    } else {
        data.to_vec()
    };
    let _ = elf_build_id(&bytes);
    let base = data
        .get(1..9)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    for base in [None, base] {
        let Ok(elf) = LoadedElf::from_bytes(Path::new("fuzz.elf"), bytes.clone().into(), base)
        else {
            continue;
        };
        for which in [Segments::Executable, Segments::AllLoadable] {
            let mut img = Image::new();
            for s in elf.sections(which) {
                assert!(
                    s.offset
                        .checked_add(s.len)
                        .is_some_and(|e| e <= s.bytes.len())
                );
                let _ = img.add(s);
            }
            let _ = img.add_elf(&elf, which);
        }
        let _ = elf.to_vaddr(elf.entry);
        let _ = elf.to_addr(0);
    }
});
