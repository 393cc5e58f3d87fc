//! Synthetic PT streams built by the encoder, for tests that need a known shape rather than a
//! recording. Also `#[path]`-included by the crate's unit tests (`timeline/threads.rs`), so it
//! names the packet layer as `super::packet`: the including module brings `packet` into scope
//! (`tests/support/mod.rs` from `ptrewind`, the unit tests from `crate`).

use super::packet::{Encoder, IpKind, Packet, Tnt};

/// A thread's PT stream as a CPU tracing it into its own AUX area writes it: PSB+, TIP.PGE at
/// `base` (a `jne .`), then per run a TSC packet of `runs[k].0` and `runs[k].1` taken branches
/// (the last run ends with one not taken), and TIP.PGD (no IP) at the `ret` after it, which is
/// not counted. Between two runs the thread leaves user space (FUP + TIP.PGD at `base`, as an
/// interrupt that preempts it, then TIP.PGE there), so each run lasted only as long as it took.
pub fn tsc_stream(base: u64, runs: &[(u64, u8)]) -> Vec<u8> {
    stamped_stream(base, runs, true)
}

/// [`tsc_stream`] traced throughout: each run lasted until the next one's TSC.
pub fn continuous_tsc_stream(base: u64, runs: &[(u64, u8)]) -> Vec<u8> {
    stamped_stream(base, runs, false)
}

fn stamped_stream(base: u64, runs: &[(u64, u8)], preempted: bool) -> Vec<u8> {
    let (mut enc, mut out) = enabled_at(base);
    let last = runs.len() - 1;
    for (k, &(tsc, taken)) in runs.iter().enumerate() {
        if k > 0 && preempted {
            enc.ip_packet(IpKind::Fup, Some(base), &mut out).unwrap();
            enc.ip_packet(IpKind::TipPgd, None, &mut out).unwrap();
            enc.ip_packet(IpKind::TipPge, Some(base), &mut out).unwrap();
        }
        enc.packet(&Packet::Tsc { tsc }, &mut out).unwrap();
        let mut bits = vec![true; taken as usize];
        if k == last {
            bits.push(false);
        }
        short_tnts(&mut enc, &bits, &mut out);
    }
    enc.ip_packet(IpKind::TipPgd, None, &mut out).unwrap();
    out
}

/// A stream's start: PSB+ (64-bit mode) and TIP.PGE at `base`; the encoder to go on with.
fn enabled_at(base: u64) -> (Encoder, Vec<u8>) {
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    enc.psb(&mut out);
    let mode = Packet::ModeExec {
        csl: true,
        csd: false,
        iflag: false,
    };
    enc.packet(&mode, &mut out).unwrap();
    enc.packet(&Packet::PsbEnd, &mut out).unwrap();
    enc.ip_packet(IpKind::TipPge, Some(base), &mut out).unwrap();
    (enc, out)
}

/// A thread stopped by a fault or signal: `jne .` at `base` taken `taken` times after a TSC of
/// `tsc`, then not taken; the stream ends with FUP + TIP.PGD at the instruction after it
/// (`base + 2`, which did not execute).
pub fn stopped_stream(base: u64, tsc: u64, taken: usize) -> Vec<u8> {
    let (mut enc, mut out) = enabled_at(base);
    enc.packet(&Packet::Tsc { tsc }, &mut out).unwrap();
    let mut bits = vec![true; taken];
    bits.push(false);
    short_tnts(&mut enc, &bits, &mut out);
    enc.ip_packet(IpKind::Fup, Some(base + 2), &mut out)
        .unwrap();
    enc.ip_packet(IpKind::TipPgd, None, &mut out).unwrap();
    out
}

/// `bits` (taken or not, oldest first) as short TNT packets of up to six each.
pub fn short_tnts(enc: &mut Encoder, bits: &[bool], out: &mut Vec<u8>) {
    for chunk in bits.chunks(6) {
        let mut t = Tnt::new(0, 0);
        for &b in chunk {
            t.bits = (t.bits << 1) | u64::from(b);
            t.count += 1;
        }
        enc.packet(&Packet::ShortTnt(t), out).unwrap();
    }
}
