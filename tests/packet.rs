//! Integration tests of the packet layer (`ptrewind::packet`): decoder, encoder, Last IP and PSB
//! synchronisation.
//!
//! Ground truth comes from the reference (`shared/docs/intel-pt-packets.md` §1, §2; SDM Table
//! "FUP/TIP IP Reconstruction"): the byte vectors and expected values below are worked out by hand
//! from the documented layouts, not taken from the decoder's output. Real traces (the corpus) are
//! checked against properties that hold independently of our code (bytes → packets → bytes is the
//! identity; every PSB the scanner finds is a PSB packet of the linear decode; the TIP.PGE targets
//! of the hase recordings equal the enable addresses of their ground-truth branch lists).

use std::path::PathBuf;

use proptest::prelude::*;
use ptrewind::packet::{
    Encoder, IpCompression, IpKind, IpPayload, LastIp, LastIpError, PSB_BYTES, Packet,
    PacketDecoder, PacketError, Stop, Tnt, decode_packet, encode_packet, encode_packet_in_block,
    find_psb_backward, find_psb_forward, next_block_context, shortest_compression,
};

// ---------------------------------------------------------------------------------------------
// Helpers

fn ip(compression: IpCompression, raw: u64) -> IpPayload {
    IpPayload::new(compression, raw)
}

fn tnt(bits: u64, count: u8) -> Tnt {
    Tnt::new(bits, count)
}

/// Decodes exactly one packet from `bytes` (outside a block) and checks it spans all of them.
fn decode_one(bytes: &[u8]) -> Packet {
    decode_one_in(bytes, None)
}

fn decode_one_in(bytes: &[u8], block: Option<bool>) -> Packet {
    let (p, len) =
        decode_packet(bytes, 0, block).unwrap_or_else(|e| panic!("decoding {bytes:02x?}: {e}"));
    assert_eq!(len, bytes.len(), "length of {p:?} from {bytes:02x?}");
    p
}

fn encode_in(p: &Packet, block: Option<bool>) -> Vec<u8> {
    let mut v = Vec::new();
    let n =
        encode_packet_in_block(p, block, &mut v).unwrap_or_else(|e| panic!("encoding {p:?}: {e}"));
    assert_eq!(n, v.len());
    v
}

fn is_invalid(bytes: &[u8], block: Option<bool>) -> bool {
    matches!(
        decode_packet(bytes, 0, block),
        Err(PacketError::Invalid { offset: 0, .. })
    )
}

fn corpus_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTREWIND_CORPUS") {
        return Some(PathBuf::from(p));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // <crate root>/../shared/corpus in the main checkout; worktrees sit one level deeper.
    ["../shared/corpus", "../../shared/corpus"]
        .iter()
        .map(|r| root.join(r))
        .find(|p| p.is_dir())
}

/// The raw PT streams of the corpus (SOURCE.txt of each folder says which files are raw PT).
fn corpus_streams() -> Vec<(String, Vec<u8>)> {
    let Some(dir) = corpus_dir() else {
        eprintln!("corpus not found (set PTREWIND_CORPUS); skipping corpus checks");
        return Vec::new();
    };
    let files = [
        "libxdc-experiments/Unzip/trace",
        "libxdc-experiments/foo/trace",
        "libxdc-experiments/mruby/trace",
        "libxdc-experiments/qemu/trace1",
        "libxdc-experiments/avscript_32/failed_trace_12709_1",
        "libxdc-experiments/dyn_test/sample_raw_0",
        "libxdc-experiments/icelake_tip/ptlog",
        "libxdc-experiments/Kernel/trace",
        "libxdc-experiments/infinite_loop_linux/loop_trace_26023_0",
        "hase-pt-recordings/extracted-aux/loopy-20180404T162955.aux.bin",
        "hase-pt-recordings/extracted-aux/control_flow-20180404T163033.aux.bin",
        "hase-pt-recordings/extracted-aux/loopy-20180514T145114.aux.bin",
        "hase-pt-recordings/extracted-aux/control_flow-20180515T180451.aux.bin",
        "quipper-perfdata-intel_pt/extracted/aux_perf.data.intel_pt-4.14_0_cpu0.bin",
        "quipper-perfdata-intel_pt/extracted/aux_perf.data.intel_pt-4.14_3_cpu3.bin",
        "dynamorio-drpt2trace/v1_final_raw/pt.bin",
        "dynamorio-drpt2trace/v2_tracedir_820k/pt.bin",
        "dynamorio-drpt2trace/v3_raw_2848/pt.bin",
        "dynamorio-drpt2trace/v4_tracedir_32304/pt.bin",
        "dynamorio-drpt2trace/v5_tracedir_22112/pt.bin",
        "dynamorio-drpt2trace/v6_tracedir_15040/pt.bin",
    ];
    let v: Vec<_> = files
        .iter()
        .filter_map(|f| std::fs::read(dir.join(f)).ok().map(|b| (f.to_string(), b)))
        .collect();
    assert_eq!(
        v.len(),
        files.len(),
        "corpus at {} is incomplete",
        dir.display()
    );
    v
}

// ---------------------------------------------------------------------------------------------
// (b) Every packet type against hand-written byte vectors from the reference.

/// (bytes, block context, expected packet) for every packet type. Each expected value is worked
/// out from the layout tables in the reference, §1.3/§1.4.
fn reference_vectors() -> Vec<(Vec<u8>, Option<bool>, Packet)> {
    use IpCompression::*;
    vec![
        (vec![0x00], None, Packet::Pad),
        // TNT-8: 0x06 = 0000_0110: stop bit at byte bit 2 → one bit, B1 = 1 (taken).
        (vec![0x06], None, Packet::ShortTnt(tnt(0b1, 1))),
        // 0xFE: six taken.
        (vec![0xfe], None, Packet::ShortTnt(tnt(0b11_1111, 6))),
        // 0x08: two not taken.
        (vec![0x08], None, Packet::ShortTnt(tnt(0b00, 2))),
        // 0x0A = 0000_1010: stop at byte bit 3, B1 = byte bit 2 = 0 (N), B2 = byte bit 1 = 1 (T).
        (vec![0x0a], None, Packet::ShortTnt(tnt(0b01, 2))),
        // Long TNT: 48-bit value 0b1101: stop bit at 3, B1..B3 = 1,0,1.
        (
            vec![0x02, 0xa3, 0x0d, 0, 0, 0, 0, 0],
            None,
            Packet::LongTnt(tnt(0b101, 3)),
        ),
        // Long TNT with 47 bits: stop bit at value bit 47 (byte 7 bit 7).
        (
            vec![0x02, 0xa3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            None,
            Packet::LongTnt(tnt((1 << 47) - 1, 47)),
        ),
        // TIP.PGD, IPBytes 000: suppressed.
        (vec![0x01], None, Packet::TipPgd(ip(Suppressed, 0))),
        // TIP, IPBytes 001 (0x20 | 0x0d), payload 0x1234.
        (
            vec![0x2d, 0x34, 0x12],
            None,
            Packet::Tip(ip(Update16, 0x1234)),
        ),
        // TIP.PGE, IPBytes 010 (0x40 | 0x11).
        (
            vec![0x51, 0x78, 0x56, 0x34, 0x12],
            None,
            Packet::TipPge(ip(Update32, 0x1234_5678)),
        ),
        // FUP, IPBytes 011 (0x60 | 0x1d), 6 bytes.
        (
            vec![0x7d, 0x01, 0x02, 0x03, 0x04, 0x05, 0x86],
            None,
            Packet::Fup(ip(Sext48, 0x8605_0403_0201)),
        ),
        // TIP, IPBytes 100 (0x80 | 0x0d).
        (
            vec![0x8d, 1, 2, 3, 4, 5, 6],
            None,
            Packet::Tip(ip(Update48, 0x0605_0403_0201)),
        ),
        // TIP.PGD, IPBytes 110 (0xc0 | 0x01), 8 bytes.
        (
            vec![0xc1, 8, 7, 6, 5, 4, 3, 2, 0xff],
            None,
            Packet::TipPgd(ip(Full, 0xff02_0304_0506_0708)),
        ),
        // MODE.Exec: b1 = 0000_0001: CS.L = 1 (64-bit).
        (
            vec![0x99, 0x01],
            None,
            Packet::ModeExec {
                csl: true,
                csd: false,
                iflag: false,
            },
        ),
        // MODE.Exec: b1 = 0000_0110: CS.D and IF.
        (
            vec![0x99, 0x06],
            None,
            Packet::ModeExec {
                csl: false,
                csd: true,
                iflag: true,
            },
        ),
        // MODE.TSX: leaf 001, InTX.
        (
            vec![0x99, 0x21],
            None,
            Packet::ModeTsx {
                intx: true,
                abort: false,
            },
        ),
        (
            vec![0x99, 0x22],
            None,
            Packet::ModeTsx {
                intx: false,
                abort: true,
            },
        ),
        // PIP: V = CR3 >> 4 | NR; CR3 = 0x1234_5000, NR = 1 → V = 0x0123_4501.
        (
            vec![0x02, 0x43, 0x01, 0x45, 0x23, 0x01, 0x00, 0x00],
            None,
            Packet::Pip {
                cr3: 0x1234_5000,
                nr: true,
            },
        ),
        // PIP with CR3 bit 51 set: V bit 47.
        (
            vec![0x02, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80],
            None,
            Packet::Pip {
                cr3: 1 << 51,
                nr: false,
            },
        ),
        (vec![0x02, 0x83], None, Packet::TraceStop),
        // CBR: ratio 0x2a, reserved byte.
        (
            vec![0x02, 0x03, 0x2a, 0x00],
            None,
            Packet::Cbr { ratio: 42 },
        ),
        // TSC: 7 payload bytes.
        (
            vec![0x19, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77],
            None,
            Packet::Tsc {
                tsc: 0x0077_6655_4433_2211,
            },
        ),
        (vec![0x59, 0xab], None, Packet::Mtc { ctc: 0xab }),
        // TMA: CTC 0x1234, FC = 0x1ff (b5 = 0xff, b6 bit 0 = 1).
        (
            vec![0x02, 0x73, 0x34, 0x12, 0x00, 0xff, 0x01],
            None,
            Packet::Tma {
                ctc: 0x1234,
                fc: 0x1ff,
            },
        ),
        // CYC: 0x03 → 0; 0xfb = 11111_0_11 → 31.
        (vec![0x03], None, Packet::Cyc { value: 0 }),
        (vec![0xfb], None, Packet::Cyc { value: 31 }),
        // CYC 32: b0 = 00000_1_11 (Exp), c1 = 0000001_0 → 1 << 5.
        (vec![0x07, 0x02], None, Packet::Cyc { value: 32 }),
        // CYC 4095 = 0b1111111_11111: b0 = 11111_1_11, c1 = 1111111_0.
        (vec![0xff, 0xfe], None, Packet::Cyc { value: 4095 }),
        // VMCS: base 0x1_2345_6000 → bits 51:12 = 0x12345 6? (0x1_2345_6000 >> 12 = 0x12_3456).
        (
            vec![0x02, 0xc8, 0x56, 0x34, 0x12, 0x00, 0x00],
            None,
            Packet::Vmcs {
                base: 0x1_2345_6000,
            },
        ),
        (vec![0x02, 0xf3], None, Packet::Ovf),
        (PSB_BYTES.to_vec(), None, Packet::Psb),
        (vec![0x02, 0x23], None, Packet::PsbEnd),
        // MNT: 02 C3 88 + 8 bytes.
        (
            vec![0x02, 0xc3, 0x88, 1, 2, 3, 4, 5, 6, 7, 8],
            None,
            Packet::Mnt {
                payload: 0x0807_0605_0403_0201,
            },
        ),
        // PTW: 02 92 = IP=1, 4 bytes; 02 32 = IP=0, 8 bytes; 02 12 = IP=0, 4 bytes; 02 B2.
        (
            vec![0x02, 0x92, 0xef, 0xbe, 0xad, 0xde],
            None,
            Packet::Ptw {
                payload: 0xdead_beef,
                size: 4,
                ip: true,
            },
        ),
        (
            vec![0x02, 0x32, 1, 2, 3, 4, 5, 6, 7, 8],
            None,
            Packet::Ptw {
                payload: 0x0807_0605_0403_0201,
                size: 8,
                ip: false,
            },
        ),
        (
            vec![0x02, 0x12, 1, 0, 0, 0],
            None,
            Packet::Ptw {
                payload: 1,
                size: 4,
                ip: false,
            },
        ),
        (
            vec![0x02, 0xb2, 0, 0, 0, 0, 0, 0, 0, 0x80],
            None,
            Packet::Ptw {
                payload: 1 << 63,
                size: 8,
                ip: true,
            },
        ),
        (vec![0x02, 0x62], None, Packet::Exstop { ip: false }),
        (vec![0x02, 0xe2], None, Packet::Exstop { ip: true }),
        // MWAIT: b2 = hints, b6[1:0] = extensions.
        (
            vec![0x02, 0xc2, 0x20, 0, 0, 0, 0x01, 0, 0, 0],
            None,
            Packet::Mwait {
                hints: 0x20,
                ext: 1,
            },
        ),
        // PWRE: b2[7] = HW; b3 = state:substate.
        (
            vec![0x02, 0x22, 0x80, 0x21],
            None,
            Packet::Pwre {
                hw: true,
                state: 2,
                substate: 1,
            },
        ),
        // PWRX: b2 = last:deepest, b3[3:0] = wake reason.
        (
            vec![0x02, 0xa2, 0x62, 0x04, 0, 0, 0],
            None,
            Packet::Pwrx {
                last: 6,
                deepest: 2,
                wake: 4,
            },
        ),
        // BBP: b2[7] = SZ, b2[4:0] = type 4 (PEBS basic).
        (
            vec![0x02, 0x63, 0x84],
            None,
            Packet::Bbp { sz: true, kind: 4 },
        ),
        (
            vec![0x02, 0x63, 0x05],
            None,
            Packet::Bbp { sz: false, kind: 5 },
        ),
        // BIP: b0 = id << 3 | 100; 4 or 8 bytes by the block's SZ.
        (
            vec![0x14, 0x78, 0x56, 0x34, 0x12],
            Some(true),
            Packet::Bip {
                id: 2,
                value: 0x1234_5678,
            },
        ),
        (
            vec![0x0c, 1, 2, 3, 4, 5, 6, 7, 8],
            Some(false),
            Packet::Bip {
                id: 1,
                value: 0x0807_0605_0403_0201,
            },
        ),
        (vec![0x02, 0x33], None, Packet::Bep { ip: false }),
        (vec![0x02, 0xb3], Some(true), Packet::Bep { ip: true }),
        // CFE: b2[7] = IP, b2[4:0] = type 1 (INTR); b3 = vector 0x20.
        (
            vec![0x02, 0x13, 0x81, 0x20],
            None,
            Packet::Cfe {
                ip: true,
                kind: 1,
                vector: 0x20,
            },
        ),
        // EVD: type 0 (CR2), payload.
        (
            vec![0x02, 0x53, 0x00, 0x00, 0x10, 0, 0, 0, 0, 0, 0],
            None,
            Packet::Evd {
                kind: 0,
                payload: 0x1000,
            },
        ),
    ]
}

#[test]
fn reference_vectors_decode_and_encode() {
    for (bytes, block, expected) in reference_vectors() {
        assert_eq!(
            decode_one_in(&bytes, block),
            expected,
            "decoding {bytes:02x?}"
        );
        assert_eq!(encode_in(&expected, block), bytes, "encoding {expected:?}");
        // Same bytes at a non-zero position, followed by more data: position-independent.
        let mut shifted = vec![0x00, 0x00, 0x00];
        shifted.extend_from_slice(&bytes);
        shifted.extend_from_slice(&[0xff; 20]);
        assert_eq!(
            decode_packet(&shifted, 3, block),
            Ok((expected, bytes.len()))
        );
    }
}

#[test]
fn every_packet_type_is_covered_by_the_vectors() {
    let mut names: Vec<_> = reference_vectors().iter().map(|v| v.2.name()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 31, "{names:?}");
}

#[test]
fn reserved_and_malformed_encodings_are_invalid() {
    let cases: &[(&[u8], &str)] = &[
        (&[0xad], "TIP IPBytes 101"),
        (&[0xed], "TIP IPBytes 111"),
        (
            &[0xbd, 0, 0, 0, 0, 0, 0, 0, 0],
            "FUP IPBytes 101 even with bytes after it",
        ),
        (&[0xf1], "TIP.PGE IPBytes 111"),
        (
            &[0x02, 0xa3, 0, 0, 0, 0, 0, 0],
            "long TNT with zero payload (no stop bit)",
        ),
        (
            &[0x02, 0xa3, 1, 0, 0, 0, 0, 0],
            "long TNT with only the stop bit",
        ),
        (&[0x99, 0x40], "MODE leaf 010"),
        (&[0x99, 0xe0], "MODE leaf 111"),
        (
            &[0x02, 0xc3, 0x89, 0, 0, 0, 0, 0, 0, 0, 0],
            "MNT sub-opcode 89",
        ),
        (&[0x02, 0x52, 0, 0, 0, 0, 0, 0, 0, 0], "PTW size 10"),
        (&[0x02, 0xf2, 0, 0, 0, 0, 0, 0, 0, 0], "PTW size 11"),
        (&[0x02, 0x73, 0, 0, 0, 0, 0x02], "TMA reserved bit"),
        (&[0x02, 0x00], "extended opcode 00"),
        (
            &[
                0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
                0x02, 0x83,
            ],
            "PSB with a wrong last byte",
        ),
        (&[0x39], "opcode 39"),
        (&[0x05], "opcode 05"),
        (&[0xd9, 0, 0, 0, 0], "TRIG (not supported)"),
    ];
    for (bytes, what) in cases {
        assert!(
            is_invalid(bytes, None),
            "{what}: {:?}",
            decode_packet(bytes, 0, None)
        );
    }
    // CYC: 10 bytes hold at most 64 bits; an 11th byte or too many bits in the 10th overflow.
    let mut cyc = vec![0xff; 9];
    cyc.push(0x0e);
    assert_eq!(decode_one(&cyc), Packet::Cyc { value: u64::MAX });
    cyc[9] = 0x10;
    assert!(is_invalid(&cyc, None), "CYC with bit 64 set");
    cyc[9] = 0x01;
    cyc.push(0x00);
    assert!(is_invalid(&cyc, None), "CYC of 11 bytes");
}

#[test]
fn invalid_errors_carry_the_offset() {
    let buf = [0x00, 0x00, 0xad, 0x00];
    let mut d = PacketDecoder::with_base_offset(&buf, 0x1000);
    assert_eq!(d.next(), Some(Ok((0x1000, Packet::Pad))));
    assert_eq!(d.next(), Some(Ok((0x1001, Packet::Pad))));
    assert!(matches!(
        d.next(),
        Some(Err(PacketError::Invalid { offset: 0x1002, .. }))
    ));
    // The decoder stepped past the bad byte and can continue.
    assert_eq!(d.next(), Some(Ok((0x1003, Packet::Pad))));
    assert_eq!(d.next(), None);
}

#[test]
fn bip_dispatch_and_block_context() {
    // Outside a block, 0x0c is a TNT-8 (stop bit at byte bit 3: two outcomes, N then T).
    assert_eq!(decode_one(&[0x0c]), Packet::ShortTnt(tnt(0b10, 2)));
    // A block survives PAD, TSC, TMA, MTC, CYC, CBR, MNT, FUP, EXSTOP, PWRE, PWRX and BIP.
    let bbp = Packet::Bbp { sz: true, kind: 4 };
    let survivors = [
        Packet::Pad,
        Packet::Tsc { tsc: 1 },
        Packet::Tma { ctc: 1, fc: 1 },
        Packet::Mtc { ctc: 1 },
        Packet::Cyc { value: 1 },
        Packet::Cbr { ratio: 1 },
        Packet::Mnt { payload: 1 },
        Packet::Fup(ip(IpCompression::Suppressed, 0)),
        Packet::Exstop { ip: true },
        Packet::Pwre {
            hw: false,
            state: 1,
            substate: 0,
        },
        Packet::Pwrx {
            last: 1,
            deepest: 1,
            wake: 1,
        },
        Packet::Bip { id: 3, value: 7 },
    ];
    for s in survivors {
        assert_eq!(next_block_context(Some(true), &s), Some(true), "{s:?}");
        assert_eq!(next_block_context(None, &s), None, "{s:?}");
    }
    let enders = [
        Packet::Bep { ip: false },
        Packet::ShortTnt(tnt(1, 1)),
        Packet::Tip(ip(IpCompression::Suppressed, 0)),
        Packet::Psb,
        Packet::PsbEnd,
        Packet::Ovf,
        Packet::ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        },
        Packet::Pip { cr3: 0, nr: false },
        Packet::Cfe {
            ip: false,
            kind: 1,
            vector: 0,
        },
    ];
    for e in enders {
        assert_eq!(next_block_context(Some(false), &e), None, "{e:?}");
    }
    assert_eq!(
        next_block_context(Some(true), &Packet::Bbp { sz: false, kind: 1 }),
        Some(false)
    );
    // In a stream: BBP(sz=1), PAD, BIP, BEP, then the same byte 0x0c is a TNT again.
    let mut buf = encode_in(&bbp, None);
    buf.extend_from_slice(&[0x00, 0x0c, 1, 0, 0, 0, 0x02, 0x33, 0x0c]);
    let got: Vec<_> = PacketDecoder::new(&buf).map(|r| r.unwrap().1).collect();
    assert_eq!(
        got,
        vec![
            bbp,
            Packet::Pad,
            Packet::Bip { id: 1, value: 1 },
            Packet::Bep { ip: false },
            Packet::ShortTnt(tnt(0b10, 2)),
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// (c) Last IP: SDM Table "FUP/TIP IP Reconstruction".

#[test]
fn last_ip_table() {
    use IpCompression::*;
    let last = 0x1122_3344_5566_7788u64;
    let at = |c, raw| {
        let mut l = LastIp::new();
        l.apply(ip(Full, last)).unwrap();
        let r = l.apply(ip(c, raw));
        (r, l.ip())
    };
    // 001: Last IP[63:16] : payload[15:0].
    assert_eq!(
        at(Update16, 0xaabb),
        (Ok(Some(0x1122_3344_5566_aabb)), Some(0x1122_3344_5566_aabb))
    );
    // 010: Last IP[63:32] : payload[31:0].
    assert_eq!(at(Update32, 0xaabb_ccdd).0, Ok(Some(0x1122_3344_aabb_ccdd)));
    // 011: payload[47] extended.
    assert_eq!(
        at(Sext48, 0x7fff_ffff_f000).0,
        Ok(Some(0x0000_7fff_ffff_f000))
    );
    assert_eq!(
        at(Sext48, 0x8000_0000_0000).0,
        Ok(Some(0xffff_8000_0000_0000))
    );
    // 100: Last IP[63:48] : payload[47:0], no sign extension.
    assert_eq!(
        at(Update48, 0x8000_0000_0000).0,
        Ok(Some(0x1122_8000_0000_0000))
    );
    // 110: the full payload.
    assert_eq!(
        at(Full, 0xffff_ffff_8100_0000).0,
        Ok(Some(0xffff_ffff_8100_0000))
    );
    // 000: suppressed, Last IP unchanged.
    assert_eq!(at(Suppressed, 0), (Ok(None), Some(last)));
    // Payload bits above the compression's width are ignored.
    assert_eq!(at(Update16, 0xdead_aabb).0, Ok(Some(0x1122_3344_5566_aabb)));
}

#[test]
fn last_ip_psb_reset_and_suppression() {
    use IpCompression::*;
    let mut l = LastIp::new();
    // Synced without a PSB: compressed IPs cannot be trusted.
    assert!(!l.have_ip());
    for c in [Update16, Update32, Update48] {
        assert_eq!(
            l.apply(ip(c, 0x1234)),
            Err(LastIpError::NoLastIp { compression: c })
        );
    }
    assert_eq!(l.ip(), None);
    // PSB resets Last IP to zero: the next IP may be compressed against 0.
    l.reset();
    assert!(l.have_ip());
    assert_eq!(l.apply(ip(Update16, 0x1234)), Ok(Some(0x1234)));
    // Real sequence from the reference (§2 rule 3): FUP(011) + TIP.PGD(000), then TIP.PGE(001)
    // compressed against the FUP's IP.
    l.reset();
    assert_eq!(
        l.apply(ip(Sext48, 0x7f12_3456_789a)),
        Ok(Some(0x7f12_3456_789a))
    );
    assert_eq!(l.apply(ip(Suppressed, 0)), Ok(None));
    assert_eq!(l.apply(ip(Update16, 0x1000)), Ok(Some(0x7f12_3456_1000)));
    // A later PSB resets again.
    l.reset();
    assert_eq!(l.ip(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// Random valid packets

fn ip_payload_strategy() -> impl Strategy<Value = IpPayload> {
    use IpCompression::*;
    (
        prop_oneof![
            Just(Suppressed),
            Just(Update16),
            Just(Update32),
            Just(Sext48),
            Just(Update48),
            Just(Full)
        ],
        any::<u64>(),
    )
        .prop_map(|(c, raw)| {
            let bits = 8 * c.payload_len() as u32;
            let raw = if bits == 64 {
                raw
            } else {
                raw & ((1u64 << bits) - 1)
            };
            ip(c, raw)
        })
}

fn tnt_strategy(max: u8) -> impl Strategy<Value = Tnt> {
    (1..=max, any::<u64>()).prop_map(|(count, b)| tnt(b & ((1u64 << count) - 1), count))
}

/// Packets that keep a BBP block open (other than BIP).
fn block_survivor_strategy() -> impl Strategy<Value = Packet> {
    prop_oneof![
        Just(Packet::Pad),
        (0..1u64 << 56).prop_map(|tsc| Packet::Tsc { tsc }),
        (any::<u16>(), 0..512u16).prop_map(|(ctc, fc)| Packet::Tma { ctc, fc }),
        any::<u8>().prop_map(|ctc| Packet::Mtc { ctc }),
        any::<u64>().prop_map(|value| Packet::Cyc { value }),
        (0..64u32, any::<u64>()).prop_map(|(s, v)| Packet::Cyc { value: v >> s }),
        any::<u8>().prop_map(|ratio| Packet::Cbr { ratio }),
        any::<u64>().prop_map(|payload| Packet::Mnt { payload }),
        ip_payload_strategy().prop_map(Packet::Fup),
        any::<bool>().prop_map(|ip| Packet::Exstop { ip }),
        (any::<bool>(), 0..16u8, 0..16u8).prop_map(|(hw, state, substate)| Packet::Pwre {
            hw,
            state,
            substate
        }),
        (0..16u8, 0..16u8, 0..16u8).prop_map(|(last, deepest, wake)| Packet::Pwrx {
            last,
            deepest,
            wake
        }),
    ]
}

/// Any packet but BBP and BIP (which the block strategy generates).
fn plain_packet_strategy() -> impl Strategy<Value = Packet> {
    prop_oneof![
        block_survivor_strategy(),
        tnt_strategy(6).prop_map(Packet::ShortTnt),
        tnt_strategy(47).prop_map(Packet::LongTnt),
        ip_payload_strategy().prop_map(Packet::Tip),
        ip_payload_strategy().prop_map(Packet::TipPge),
        ip_payload_strategy().prop_map(Packet::TipPgd),
        (any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(csl, csd, iflag)| Packet::ModeExec { csl, csd, iflag }),
        (any::<bool>(), any::<bool>()).prop_map(|(intx, abort)| Packet::ModeTsx { intx, abort }),
        (0..1u64 << 47, any::<bool>()).prop_map(|(v, nr)| Packet::Pip { cr3: v << 5, nr }),
        Just(Packet::TraceStop),
        (0..1u64 << 40).prop_map(|v| Packet::Vmcs { base: v << 12 }),
        Just(Packet::Ovf),
        Just(Packet::Psb),
        Just(Packet::PsbEnd),
        (any::<u32>(), any::<bool>()).prop_map(|(p, ip)| Packet::Ptw {
            payload: p as u64,
            size: 4,
            ip
        }),
        (any::<u64>(), any::<bool>()).prop_map(|(payload, ip)| Packet::Ptw {
            payload,
            size: 8,
            ip
        }),
        (any::<u8>(), 0..4u8).prop_map(|(hints, ext)| Packet::Mwait { hints, ext }),
        any::<bool>().prop_map(|ip| Packet::Bep { ip }),
        (any::<bool>(), 0..32u8, any::<u8>()).prop_map(|(ip, kind, vector)| Packet::Cfe {
            ip,
            kind,
            vector
        }),
        (0..64u8, any::<u64>()).prop_map(|(kind, payload)| Packet::Evd { kind, payload }),
    ]
}

/// A BBP block: BBP, then BIPs and packets the block survives, then a BEP.
fn block_strategy() -> impl Strategy<Value = Vec<Packet>> {
    (any::<bool>(), 0..32u8).prop_flat_map(|(sz, kind)| {
        let item = prop_oneof![
            3 => (0..32u8, any::<u64>()).prop_map(move |(id, v)| Packet::Bip {
                id,
                value: if sz { v & 0xffff_ffff } else { v },
            }),
            1 => block_survivor_strategy(),
        ];
        (proptest::collection::vec(item, 0..8), any::<bool>()).prop_map(move |(items, ip)| {
            let mut v = vec![Packet::Bbp { sz, kind }];
            v.extend(items);
            v.push(Packet::Bep { ip });
            v
        })
    })
}

fn sequence_strategy() -> impl Strategy<Value = Vec<Packet>> {
    proptest::collection::vec(
        prop_oneof![
            6 => plain_packet_strategy().prop_map(|p| vec![p]),
            1 => block_strategy(),
        ],
        0..40,
    )
    .prop_map(|v| v.into_iter().flatten().collect())
}

/// Encodes a sequence, tracking the block context; returns the bytes and each packet's offset.
fn encode_sequence(packets: &[Packet]) -> (Vec<u8>, Vec<u64>) {
    let mut bytes = Vec::new();
    let mut offsets = Vec::new();
    let mut block = None;
    for p in packets {
        offsets.push(bytes.len() as u64);
        encode_packet_in_block(p, block, &mut bytes).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        block = next_block_context(block, p);
    }
    (bytes, offsets)
}

/// Everything `next_packet` gives on `bytes` (errors included; it goes on after an `Invalid`),
/// and the same through `read`, with offsets and positions after each item.
type Items = Vec<(Result<(u64, Packet), PacketError>, usize)>;
fn both_apis(bytes: &[u8], base: u64) -> (Items, Items) {
    let mut d = PacketDecoder::with_base_offset(bytes, base);
    let mut a = Vec::new();
    while let Some(r) = d.next_packet() {
        a.push((r, d.position()));
    }
    let mut d = PacketDecoder::with_base_offset(bytes, base);
    let mut b = Vec::new();
    loop {
        match d.read() {
            Ok(p) => b.push((Ok((d.last_offset(), p)), d.position())),
            Err(Stop::End) => break,
            Err(Stop::Error) => {
                let e = d.take_error().expect("Stop::Error leaves its error");
                assert_eq!(d.take_error(), None, "the error is taken once");
                b.push((Err(e), d.position()));
            }
        }
    }
    (a, b)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    // The 16-byte `read` API gives exactly `next_packet`'s packets, offsets, errors and
    // positions: on valid sequences, on the same cut anywhere, and on random bytes.
    #[test]
    fn read_equals_next_packet(
        packets in sequence_strategy(),
        noise in proptest::collection::vec(any::<u8>(), 0..64),
        cut in any::<prop::sample::Index>(),
        base in any::<u32>(),
    ) {
        let (bytes, _) = encode_sequence(&packets);
        let (a, b) = both_apis(&bytes, base as u64);
        prop_assert_eq!(&a, &b);
        prop_assert!(a.iter().all(|(r, _)| r.is_ok()));
        let cut = &bytes[..cut.index(bytes.len() + 1)];
        let (a, b) = both_apis(cut, base as u64);
        prop_assert_eq!(a, b);
        let (a, b) = both_apis(&noise, base as u64);
        prop_assert_eq!(a, b);
    }

    // (a) encode → decode is the identity, offsets included, for both decoding APIs.
    #[test]
    fn round_trip_sequences(packets in sequence_strategy(), base in any::<u32>()) {
        let (bytes, offsets) = encode_sequence(&packets);
        let base = base as u64;
        let expected: Vec<(u64, Packet)> =
            offsets.iter().map(|o| o + base).zip(packets.iter().copied()).collect();
        let got: Result<Vec<_>, _> = PacketDecoder::with_base_offset(&bytes, base).collect();
        prop_assert_eq!(got.as_ref(), Ok(&expected));
        let mut batch = Vec::new();
        let mut d = PacketDecoder::with_base_offset(&bytes, base);
        let mut total = 0;
        loop {
            let n = d.decode_into(&mut batch, 7).unwrap();
            if n == 0 { break; }
            total += n;
        }
        prop_assert_eq!(total, packets.len());
        prop_assert_eq!(&batch, &expected);
        prop_assert_eq!(d.position(), bytes.len());
    }

    // (d) every valid packet cut at every shorter length is Truncated, never Invalid.
    #[test]
    fn truncation_is_never_invalid(
        p in prop_oneof![plain_packet_strategy(), (0..32u8, any::<u64>()).prop_map(|(id, value)| Packet::Bip { id, value })],
        sz in any::<bool>(),
        prefix in 0usize..4,
    ) {
        let (p, block) = match p {
            Packet::Bip { id, value } if sz => (Packet::Bip { id, value: value & 0xffff_ffff }, Some(true)),
            Packet::Bip { .. } => (p, Some(false)),
            _ => (p, None),
        };
        let bytes = encode_in(&p, block);
        let mut buf = vec![0u8; prefix];
        buf.extend_from_slice(&bytes);
        for cut in prefix..buf.len() {
            match decode_packet(&buf[..cut], prefix, block) {
                Err(PacketError::Truncated { offset, needed }) => {
                    prop_assert_eq!(offset, prefix as u64);
                    prop_assert!(needed >= 1 && needed <= buf.len() - cut,
                        "{:?} cut at {}: needed {}", p, cut - prefix, needed);
                }
                other => prop_assert!(false, "{:?} cut at {}: {:?}", p, cut - prefix, other),
            }
            // The decoder reports the same and stops.
            let mut d = PacketDecoder::new(&buf[prefix..cut]);
            d.set_block_context(block);
            if cut > prefix {
                let is_truncated = matches!(d.next(), Some(Err(PacketError::Truncated { .. })));
                prop_assert!(is_truncated);
                prop_assert_eq!(d.next(), None);
            } else {
                prop_assert_eq!(d.next(), None);
            }
        }
        prop_assert_eq!(decode_packet(&buf, prefix, block), Ok((p, bytes.len())));
    }

    // (e) arbitrary bytes never panic; the decoder always advances and terminates; both APIs
    // agree; every decoded packet re-encodes to bytes that decode to the same packet.
    #[test]
    fn arbitrary_bytes(
        bytes in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200),
            proptest::collection::vec(
                prop_oneof![Just(0x02u8), Just(0x82), Just(0x00), Just(0x63), Just(0x04), Just(0xff), Just(0xa3), any::<u8>()],
                0..200),
        ],
        base in any::<u64>(),
    ) {
        for pos in 0..=bytes.len() + 2 {
            for block in [None, Some(true), Some(false)] {
                if let Ok((p, len)) = decode_packet(&bytes, pos, block) {
                    prop_assert!(len >= 1 && pos + len <= bytes.len());
                    let re = encode_in(&p, block);
                    prop_assert_eq!(decode_packet(&re, 0, block), Ok((p, re.len())));
                    // Same length, except that a CYC may carry redundant zero extension bytes.
                    if matches!(p, Packet::Cyc { .. }) {
                        prop_assert!(re.len() <= len);
                    } else {
                        prop_assert_eq!(re.len(), len);
                    }
                }
            }
        }
        let mut d = PacketDecoder::with_base_offset(&bytes, base);
        let mut items = Vec::new();
        let mut last = None;
        while let Some(item) = d.next() {
            prop_assert!(last.is_none_or(|l| d.position() > l), "no progress");
            last = Some(d.position());
            prop_assert!(items.len() <= bytes.len());
            items.push(item);
        }
        prop_assert_eq!(d.position(), bytes.len());
        // Batch API: same packets and errors in the same order.
        let mut d = PacketDecoder::with_base_offset(&bytes, base);
        let mut batch_items = Vec::new();
        loop {
            let mut out = Vec::new();
            match d.decode_into(&mut out, usize::MAX) {
                Ok(n) => {
                    batch_items.extend(out.into_iter().map(Ok));
                    if n == 0 { break; }
                }
                Err(e) => {
                    batch_items.extend(out.into_iter().map(Ok));
                    batch_items.push(Err(e));
                }
            }
        }
        prop_assert_eq!(batch_items, items);
    }

    // (f) sync against a naive reference implementation.
    #[test]
    fn sync_matches_naive_reference(
        pieces in proptest::collection::vec(
            prop_oneof![
                Just(vec![0x02u8, 0x82]),
                Just(PSB_BYTES.to_vec()),
                proptest::collection::vec(prop_oneof![Just(0x02u8), Just(0x82), any::<u8>()], 0..5),
            ],
            0..12),
    ) {
        let buf: Vec<u8> = pieces.concat();
        let naive_fwd = |from: usize| -> Option<usize> {
            let start = (from..buf.len()).find(|&i| buf[i..].starts_with(&PSB_BYTES))?;
            let mut end = start;
            while buf[end..].starts_with(&[0x02, 0x82]) { end += 2; }
            Some(end - 16)
        };
        let all: Vec<usize> = (0..=buf.len()).filter_map(naive_fwd).collect();
        for from in 0..=buf.len() + 2 {
            prop_assert_eq!(find_psb_forward(&buf, from), naive_fwd(from.min(buf.len())), "from {}", from);
        }
        for before in 0..=buf.len() + 2 {
            let expected = all.iter().copied().filter(|&s| s < before).max();
            prop_assert_eq!(find_psb_backward(&buf, before), expected, "before {}", before);
        }
    }

    // (g) the encoder picks the shortest compression that decodes to the IP.
    #[test]
    fn shortest_compression_property(
        last in any::<u64>(),
        known in any::<bool>(),
        flip in any::<u64>(),
        width in 0u32..64,
        sext in any::<bool>(),
    ) {
        use IpCompression::*;
        // IPs near Last IP (differing only in the low `width` bits) hit every compression.
        let mut target = last ^ (flip & (u64::MAX >> (63 - width)));
        if sext {
            target = (((target << 16) as i64) >> 16) as u64;
        }
        let mut l = LastIp::new();
        if known {
            l.apply(ip(Full, last)).unwrap();
        }
        let chosen = shortest_compression(&l, target);
        let mut check = l;
        prop_assert_eq!(check.apply(chosen), Ok(Some(target)));
        for c in [Update16, Update32, Sext48, Update48, Full] {
            if c.payload_len() < chosen.compression.payload_len() {
                let bits = 8 * c.payload_len() as u32;
                let cand = ip(c, target & ((1u64 << bits) - 1));
                prop_assert_ne!(l.reconstruct(cand), Ok(Some(target)),
                    "{:?} is shorter than {:?} and also works", c, chosen.compression);
            }
        }
        // The encoder emits it and keeps its model in step.
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        if known {
            enc.ip_packet(IpKind::Fup, Some(last), &mut out).unwrap();
        }
        let start = out.len();
        enc.ip_packet(IpKind::Tip, Some(target), &mut out).unwrap();
        prop_assert_eq!(decode_packet(&out, start, None), Ok((Packet::Tip(chosen), out.len() - start)));
        prop_assert_eq!(enc.last_ip().ip(), Some(target));
    }
}

// ---------------------------------------------------------------------------------------------
// Encoder

#[test]
fn encoder_rejects_unencodable_values() {
    let bad = [
        Packet::ShortTnt(tnt(0, 0)),
        Packet::ShortTnt(tnt(0, 7)),
        Packet::ShortTnt(tnt(0b100, 2)),
        Packet::LongTnt(tnt(0, 0)),
        Packet::LongTnt(tnt(0, 48)),
        Packet::Tip(ip(IpCompression::Update16, 0x1_0000)),
        Packet::Fup(ip(IpCompression::Suppressed, 1)),
        Packet::Pip {
            cr3: 0x1001,
            nr: false,
        },
        Packet::Pip {
            cr3: 1 << 52,
            nr: false,
        },
        Packet::Tsc { tsc: 1 << 56 },
        Packet::Tma { ctc: 0, fc: 512 },
        Packet::Vmcs { base: 0x800 },
        Packet::Vmcs { base: 1 << 52 },
        Packet::Ptw {
            payload: 0,
            size: 2,
            ip: false,
        },
        Packet::Ptw {
            payload: 1 << 32,
            size: 4,
            ip: false,
        },
        Packet::Mwait { hints: 0, ext: 4 },
        Packet::Pwre {
            hw: false,
            state: 16,
            substate: 0,
        },
        Packet::Pwrx {
            last: 0,
            deepest: 0,
            wake: 16,
        },
        Packet::Bbp {
            sz: false,
            kind: 32,
        },
        Packet::Bip { id: 0, value: 0 },
        Packet::Cfe {
            ip: false,
            kind: 32,
            vector: 0,
        },
        Packet::Evd {
            kind: 64,
            payload: 0,
        },
    ];
    for p in bad {
        let mut out = vec![0xaa];
        assert!(
            encode_packet(&p, &mut out).is_err(),
            "{p:?} was encoded as {out:02x?}"
        );
        assert_eq!(out, vec![0xaa], "{p:?}: nothing may be written on error");
    }
    assert!(
        encode_packet_in_block(
            &Packet::Bip { id: 32, value: 0 },
            Some(true),
            &mut Vec::new()
        )
        .is_err()
    );
    assert!(
        encode_packet_in_block(
            &Packet::Bip {
                id: 0,
                value: 1 << 32
            },
            Some(true),
            &mut Vec::new()
        )
        .is_err()
    );
    // Any CYC value is encodable.
    for value in [0, 31, 32, u64::MAX, 1 << 63] {
        let b = encode_in(&Packet::Cyc { value }, None);
        assert_eq!(decode_one(&b), Packet::Cyc { value });
    }
}

#[test]
fn encoder_stream_with_psb_and_compression() {
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    // Before any PSB Last IP is unknown: the first IP must be uncompressed.
    enc.ip_packet(IpKind::TipPge, Some(0x40_1000), &mut out)
        .unwrap();
    assert_eq!(out[0] >> 5, 3, "Sext48 before the first PSB");
    out.clear();
    assert_eq!(enc.psb(&mut out), 16);
    assert_eq!(out, PSB_BYTES);
    // After the PSB, Last IP is 0: 0x40_1000 compresses to Update32 (bits 63:32 equal to 0).
    let n = enc
        .ip_packet(IpKind::Fup, Some(0x40_1000), &mut out)
        .unwrap();
    assert_eq!((n, out[16]), (5, 0x5d));
    let n = enc
        .ip_packet(IpKind::Tip, Some(0x40_1234), &mut out)
        .unwrap();
    assert_eq!(n, 3, "Update16 against 0x40_1000");
    let n = enc.ip_packet(IpKind::TipPgd, None, &mut out).unwrap();
    assert_eq!((n, *out.last().unwrap()), (1, 0x01));
    let n = enc
        .ip_packet(IpKind::TipPge, Some(0xffff_8000_0000_0000), &mut out)
        .unwrap();
    assert_eq!(n, 7, "kernel address: Sext48");
    let n = enc
        .ip_packet(IpKind::Tip, Some(0x1234_5678_9abc_def0), &mut out)
        .unwrap();
    assert_eq!(n, 9, "non-canonical: Full");
    // Decoding with a LastIp that resets at the PSB gives back the IPs.
    let mut l = LastIp::new();
    let mut ips = Vec::new();
    for r in PacketDecoder::new(&out) {
        let (_, p) = r.unwrap();
        if p == Packet::Psb {
            l.reset();
        } else if let Some((_, payload)) = p.ip_payload() {
            ips.push(l.apply(payload).unwrap());
        }
    }
    assert_eq!(
        ips,
        vec![
            Some(0x40_1000),
            Some(0x40_1234),
            None,
            Some(0xffff_8000_0000_0000),
            Some(0x1234_5678_9abc_def0)
        ]
    );
    // After an OVF the encoder forgets Last IP, so the next IP is uncompressed.
    let mut out = Vec::new();
    enc.packet(&Packet::Ovf, &mut out).unwrap();
    enc.ip_packet(IpKind::Fup, Some(0x1234_5678_9abc_def1), &mut out)
        .unwrap();
    assert_eq!(out.len(), 2 + 9);
    // Compressed payloads against an unknown Last IP are refused.
    assert!(
        enc.packet(
            &Packet::Tip(ip(IpCompression::Update16, 1)),
            &mut Vec::new()
        )
        .is_ok()
    );
    let mut fresh = Encoder::new();
    assert!(
        fresh
            .packet(
                &Packet::Tip(ip(IpCompression::Update16, 1)),
                &mut Vec::new()
            )
            .is_err()
    );
}

// ---------------------------------------------------------------------------------------------
// (f) Sync: hand-made cases.

#[test]
fn sync_longer_run_rule() {
    // A TSC whose payload ends in 02 82 02 82, then a PSB: the run of pairs is 20 bytes; the PSB
    // is its last 16 bytes.
    let mut buf = vec![0x19, 0x11, 0x22, 0x33, 0x02, 0x82, 0x02, 0x82];
    buf.extend_from_slice(&PSB_BYTES);
    buf.extend_from_slice(&[0x02, 0x23]);
    assert_eq!(find_psb_forward(&buf, 0), Some(8));
    assert_eq!(find_psb_forward(&buf, 4), Some(8));
    assert_eq!(find_psb_forward(&buf, 9), None);
    assert_eq!(find_psb_backward(&buf, buf.len()), Some(8));
    assert_eq!(find_psb_backward(&buf, 8), None);
    // The linear decode agrees: TSC, PSB, PSBEND.
    let got: Vec<_> = PacketDecoder::new(&buf).map(|r| r.unwrap()).collect();
    assert_eq!(
        got,
        vec![
            (
                0,
                Packet::Tsc {
                    tsc: 0x0082_0282_0233_2211
                }
            ),
            (8, Packet::Psb),
            (24, Packet::PsbEnd)
        ]
    );
    // Misaligned pattern: 82 02 82 ... is not a PSB start.
    let mut odd = vec![0x82];
    odd.extend_from_slice(&PSB_BYTES);
    assert_eq!(find_psb_forward(&odd, 0), Some(1));
    // Never panics on out-of-range positions.
    for x in [0, 1, 16, 17, usize::MAX] {
        let _ = find_psb_forward(&odd, x);
        let _ = find_psb_backward(&odd, x);
        let _ = find_psb_forward(&[], x);
        let _ = find_psb_backward(&[], x);
    }
    // PacketDecoder::sync_forward.
    let mut junk = vec![0xd9, 0x05, 0x02];
    junk.extend_from_slice(&PSB_BYTES);
    let mut d = PacketDecoder::with_base_offset(&junk, 100);
    assert!(matches!(
        d.next(),
        Some(Err(PacketError::Invalid { offset: 100, .. }))
    ));
    assert_eq!(d.sync_forward(), Some(103));
    assert_eq!(d.next(), Some(Ok((103, Packet::Psb))));
    assert_eq!(d.sync_forward(), None);
    assert_eq!(d.next(), None);
}

// ---------------------------------------------------------------------------------------------
// Real traces

#[test]
fn corpus_streams_decode_and_reencode_exactly() {
    let mut total_packets = 0usize;
    for (name, bytes) in corpus_streams() {
        let start = find_psb_forward(&bytes, 0).unwrap_or_else(|| panic!("{name}: no PSB"));
        let stream = &bytes[start..];
        let mut d = PacketDecoder::new(stream);
        let mut reencoded = Vec::new();
        let mut block = None;
        let mut psbs = Vec::new();
        let mut end = 0;
        while let Some(r) = d.next() {
            match r {
                Ok((off, p)) => {
                    assert_eq!(off as usize, reencoded.len(), "{name}");
                    encode_packet_in_block(&p, block, &mut reencoded).unwrap();
                    block = next_block_context(block, &p);
                    if p == Packet::Psb {
                        psbs.push(off as usize);
                    }
                    total_packets += 1;
                    end = d.position();
                }
                // A stream may end inside a packet (AUX chunks are cut anywhere).
                Err(PacketError::Truncated { offset, .. }) => {
                    assert!(stream.len() - offset as usize <= 16, "{name}");
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
        // bytes → packets → bytes is the identity: the decoder neither drops nor invents fields.
        assert!(reencoded == stream[..end], "{name}: re-encoding differs");
        // The scanner finds exactly the PSBs of the linear decode.
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(p) = find_psb_forward(stream, from) {
            found.push(p);
            from = p + 1;
        }
        assert_eq!(found, psbs, "{name}: PSB offsets");
        let mut back = Vec::new();
        let mut before = stream.len();
        while let Some(p) = find_psb_backward(stream, before) {
            back.push(p);
            before = p;
        }
        back.reverse();
        assert_eq!(back, psbs, "{name}: backward PSB offsets");
    }
    if corpus_dir().is_some() {
        assert!(
            total_packets > 1_000_000,
            "decoded only {total_packets} packets"
        );
    }
}

/// The hase recordings come with ground-truth branch lists (`from<TAB>to`, 0 = enable/disable).
/// The TIP.PGE targets reconstructed with Last IP must be exactly the enable targets (`0 → to`).
#[test]
fn hase_enable_targets_match_ground_truth() {
    let Some(dir) = corpus_dir() else { return };
    for (aux, truth) in [
        (
            "hase-pt-recordings/extracted-aux/loopy-20180404T162955.aux.bin",
            "hase-pt-recordings/loopy-20180404/loopy-20180404T162955.trace",
        ),
        (
            "hase-pt-recordings/extracted-aux/control_flow-20180404T163033.aux.bin",
            "hase-pt-recordings/control_flow-20180404/control_flow-20180404T163033.trace",
        ),
    ] {
        let bytes = std::fs::read(dir.join(aux)).unwrap();
        let text = std::fs::read_to_string(dir.join(truth)).unwrap();
        let expected: Vec<u64> = text
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .filter(|(from, _)| *from == "0")
            .map(|(_, to)| u64::from_str_radix(to.trim(), 16).unwrap())
            .collect();
        assert!(!expected.is_empty());
        let mut l = LastIp::new();
        let mut pge = Vec::new();
        for r in PacketDecoder::new(&bytes) {
            let Ok((_, p)) = r else { break };
            match p {
                Packet::Psb | Packet::Ovf => l.reset(),
                Packet::TipPge(payload) => pge.push(l.apply(payload).unwrap().unwrap()),
                _ => {
                    if let Some((_, payload)) = p.ip_payload() {
                        l.apply(payload).unwrap();
                    }
                }
            }
        }
        assert_eq!(pge, expected, "{aux}");
    }
}
