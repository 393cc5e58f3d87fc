//! Fuzzes the small text inputs: `/proc/PID/maps` (`parse_maps`, `parse_maps_lenient`,
//! `MapEntry::parse_line`), the `--raw FILE[:FROM[-TO]]:BASE` and `--elf FILE[:BASE]` argument
//! parsers, a saved recording's `manifest.json` (through `load_saved` over a scratch directory
//! holding the input as `manifest.json`, a trace and a code file) and the register objects in it
//! (`regs_from_json`).
//!
//! Checked: no panic, no hang; a spec that parses prints (`Display`) to a string that parses back
//! to the same spec.
//!
//! Run: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run text_inputs -- -max_len=4096 -max_total_time=180`
#![no_main]

use libfuzzer_sys::fuzz_target;
use ptrewind::image::procfs::{MapEntry, parse_maps, parse_maps_lenient};
use ptrewind::image::{ElfSpec, RawSpec};
use ptrewind::timeline::offline::{load_saved, regs_from_json};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("ptrewind-fuzz-saved-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("scratch dir");
        // A PSB+ and one TIP.PGE, and one page of code.
        let psb = [0x02, 0x82].repeat(8);
        std::fs::write(d.join("trace.pt"), psb).expect("trace");
        std::fs::write(d.join("code-400000.bin"), vec![0x90u8; 4096]).expect("code");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match selector % 4 {
        0 => {
            let _ = parse_maps(&text, Path::new("/proc/fuzz/maps"));
            let _ = parse_maps_lenient(&text).count();
            for line in text.lines() {
                if let Some(e) = MapEntry::parse_line(line) {
                    let _ = (e.len(), e.is_empty(), e.is_file(), e.perms(), e.name());
                }
            }
        }
        1 => {
            if let Ok(spec) = text.parse::<RawSpec>() {
                let again = spec.to_string().parse::<RawSpec>();
                assert_eq!(again.as_ref(), Ok(&spec), "raw spec {text:?} → {spec}");
            }
            if let Ok(spec) = text.parse::<ElfSpec>() {
                let again = spec.to_string().parse::<ElfSpec>();
                assert_eq!(again.as_ref(), Ok(&spec), "elf spec {text:?} → {spec}");
            }
        }
        2 => {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(rest) {
                let _ = regs_from_json(&v);
            }
        }
        _ => {
            let dir = scratch();
            std::fs::write(dir.join("manifest.json"), rest).expect("write manifest");
            let _ = load_saved(dir);
        }
    }
});
