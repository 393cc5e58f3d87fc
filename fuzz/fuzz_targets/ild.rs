//! Fuzz the cheap instruction decoder against iced-x86: wherever `ild::decode` answers, in
//! 32- or 64-bit mode, iced-x86 must call the bytes valid and agree on the length, the
//! control-flow class and a direct branch's target. The unit tests enumerate the encodings the
//! decoder takes; this searches the rest of the byte space for one it takes wrongly.
//!
//! Run (stable toolchain): `RUSTC_BOOTSTRAP=1 cargo fuzz run ild -- -max_len=16 -max_total_time=300`
#![no_main]

use iced_x86::{Decoder, DecoderOptions};
use libfuzzer_sys::fuzz_target;
use ptrewind::flow::InsnClass;
use ptrewind::flow::ild;

fuzz_target!(|data: &[u8]| {
    for bits in [64u32, 32] {
        let Some(got) = ild::decode(data, bits) else {
            continue;
        };
        let ip = 0x7f00_1234_5000u64 & if bits == 64 { u64::MAX } else { 0xFFFF_FFFF };
        let ins = Decoder::with_ip(bits, data, ip, DecoderOptions::NONE).decode();
        assert!(!ins.is_invalid(), "{bits}-bit {data:02x?}: iced-x86 says invalid, ild {got:?}");
        let class = InsnClass::of(&ins);
        assert_eq!((got.len as usize, got.class), (ins.len(), class), "{bits}-bit {data:02x?}");
        if matches!(class, InsnClass::CondBranch | InsnClass::DirectJump | InsnClass::DirectCall) {
            assert_eq!(got.target(ip, bits), ins.near_branch_target(), "{bits}-bit {data:02x?}");
        }
    }
});
