//! A synthetic per-CPU perf.data (perf's default mode: one AUX stream per CPU, threads
//! interleaved) with its per-thread ground truth: 2 CPUs, 3 threads of process 100 migrating
//! between them, `PERF_RECORD_SWITCH_CPU_WIDE` records (written CPU by CPU, so out of time
//! order across CPUs, as perf writes its per-CPU buffers), ITRACE_START, a thread of an untraced
//! process in between, and TSC packets where perf's per-task events emit them (TraceEn 0→1 at
//! every switch-in) plus regions without one (a system call of the same thread). Built by the
//! crate's encoder; also `#[path]`-included by the crate's unit tests, so it names the packet
//! layer `super::packet` (see `synth.rs`).

use super::packet::{Encoder, IpKind, Packet};
use std::collections::BTreeMap;

/// The traced process.
pub const PID: u32 = 100;
/// Code bases of the three threads (`--raw CODE:BASE` each): 8 copies of `jne . ; ret ; nop`.
pub const BASES: [u64; 3] = [0x1000, 0x2000, 0x3000];
/// The code every base holds.
pub const CODE: [u8; 32] = [
    0x75, 0xfe, 0xc3, 0x90, 0x75, 0xfe, 0xc3, 0x90, 0x75, 0xfe, 0xc3, 0x90, 0x75, 0xfe, 0xc3, 0x90,
    0x75, 0xfe, 0xc3, 0x90, 0x75, 0xfe, 0xc3, 0x90, 0x75, 0xfe, 0xc3, 0x90, 0x75, 0xfe, 0xc3, 0x90,
];

/// One stretch of user code of a thread on a CPU: an optional TSC in the gap before it (as
/// perf's per-task event gives at every switch-in: TraceEn 0→1), an optional TSC inside it
/// (as a PSB+ or a C-state exit gives), an optional PSB+ with a TSC in the gap after it (the
/// PSB period running out while the thread is in the kernel), the thread, the `jne .` it starts
/// at and how often that is taken before it falls through to the `ret` (where TIP.PGD stops
/// the trace; the `ret` is not counted), and when it ran (TSC, for the ground truth's order).
#[derive(Debug, Clone, Copy)]
pub struct Region {
    pub tsc: Option<u64>,
    pub inside: Option<u64>,
    pub psb_after: Option<u64>,
    pub tid: u32,
    pub ip: u64,
    pub taken: u8,
    pub at: u64,
}

const fn region(tsc: Option<u64>, tid: u32, ip: u64, taken: u8, at: u64) -> Region {
    Region {
        tsc,
        inside: match tsc {
            Some(t) => Some(t + 1),
            None => None,
        },
        psb_after: None,
        tid,
        ip,
        taken,
        at,
    }
}

/// CPU 0's and CPU 1's regions.
pub const CPU0: [Region; 5] = [
    region(Some(1020), 101, 0x1000, 2, 1020),
    // A system call of thread 101: no TSC, same thread; a PSB+ in the kernel after it.
    Region {
        psb_after: Some(1040),
        ..region(None, 101, 0x1004, 1, 1030)
    },
    region(Some(1105), 102, 0x2000, 3, 1105),
    region(Some(1205), 103, 0x3004, 1, 1205),
    region(Some(1305), 101, 0x100c, 4, 1305),
];
/// See [`CPU0`].
pub const CPU1: [Region; 4] = [
    region(Some(1055), 103, 0x3000, 2, 1055),
    region(Some(1155), 101, 0x1008, 3, 1155),
    region(Some(1255), 102, 0x2004, 2, 1255),
    region(None, 102, 0x2008, 0, 1265),
];

/// A context switch: `(cpu, TSC, out, the record's thread, the other thread)` (pids: 0 for
/// idle, 555 for the untraced process, [`PID`] otherwise).
pub type Switch = (u32, u64, bool, u32, u32);

/// The switch records of both CPUs.
pub const SWITCHES: [Switch; 22] = [
    (0, 1000, true, 0, 101),
    (0, 1010, false, 101, 0),
    (0, 1100, true, 101, 102),
    (0, 1110, false, 102, 101),
    (0, 1200, true, 102, 103),
    (0, 1210, false, 103, 102),
    (0, 1300, true, 103, 101),
    (0, 1310, false, 101, 103),
    (0, 1400, true, 101, 0),
    (0, 1402, false, 0, 101),
    // CPU 1: an untraced process's thread 555 first.
    (1, 1020, true, 0, 555),
    (1, 1022, false, 555, 0),
    (1, 1030, true, 555, 0),
    (1, 1032, false, 0, 555),
    (1, 1050, true, 0, 103),
    (1, 1060, false, 103, 0),
    (1, 1150, true, 103, 101),
    (1, 1160, false, 101, 103),
    (1, 1250, true, 101, 102),
    (1, 1260, false, 102, 101),
    (1, 1350, true, 102, 0),
    (1, 1352, false, 0, 102),
];

fn pid_of(tid: u32) -> u32 {
    match tid {
        0 => 0,
        555 => 555,
        _ => PID,
    }
}

/// Every thread's instruction addresses in execution order.
pub fn truth() -> BTreeMap<u32, Vec<u64>> {
    let mut all: Vec<Region> = CPU0.iter().chain(CPU1.iter()).copied().collect();
    all.sort_by_key(|r| r.at);
    let mut out: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for r in all {
        out.entry(r.tid)
            .or_default()
            .extend(std::iter::repeat_n(r.ip, usize::from(r.taken) + 1));
    }
    out
}

/// Region `r` itself: MODE.Exec, TIP.PGE, [a TSC `inside`], its TNTs, TIP.PGD.
fn region_packets(enc: &mut Encoder, r: &Region, inside: Option<u64>, out: &mut Vec<u8>) {
    let mode = Packet::ModeExec {
        csl: true,
        csd: false,
        iflag: false,
    };
    enc.packet(&mode, out).unwrap();
    enc.ip_packet(IpKind::TipPge, Some(r.ip), out).unwrap();
    if let Some(tsc) = inside {
        enc.packet(&Packet::Tsc { tsc }, out).unwrap();
    }
    let mut bits = vec![true; usize::from(r.taken)];
    bits.push(false);
    super::synth::short_tnts(enc, &bits, out);
    enc.ip_packet(IpKind::TipPgd, None, out).unwrap();
}

/// A CPU's PT stream: PSB+ (tracing off, TSC `start`), then each region as [TSC] MODE.Exec,
/// TIP.PGE (compressed against the previous region's IP, as the processor does), [TSC], TNT,
/// TIP.PGD, [PSB+ with a TSC].
pub fn cpu_stream(start: u64, regions: &[Region]) -> Vec<u8> {
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    enc.psb(&mut out);
    enc.packet(&Packet::Tsc { tsc: start }, &mut out).unwrap();
    enc.packet(&Packet::PsbEnd, &mut out).unwrap();
    for r in regions {
        if let Some(tsc) = r.tsc {
            enc.packet(&Packet::Tsc { tsc }, &mut out).unwrap();
        }
        region_packets(&mut enc, r, r.inside, &mut out);
        if let Some(tsc) = r.psb_after {
            enc.psb(&mut out);
            enc.packet(&Packet::Tsc { tsc }, &mut out).unwrap();
            enc.packet(&Packet::PsbEnd, &mut out).unwrap();
        }
    }
    out
}

/// TSC ticks per crystal-clock tick in [`cpu_stream_mtc`] (`tsc_ctc_ratio_n` / `_d` = 2 / 1);
/// the MTC period is 2^0 crystal-clock ticks (`mtc_period=0` in the attr's config), so an MTC
/// is worth 2 TSC ticks and its value is CTC bits 7:0.
pub const MTC_TICKS: u64 = 2;

/// A TSC, then the TMA that anchors the crystal clock at it (CTC = TSC / 2, no fast-counter
/// remainder).
fn tsc_tma(enc: &mut Encoder, tsc: u64, out: &mut Vec<u8>) {
    enc.packet(&Packet::Tsc { tsc }, out).unwrap();
    let tma = Packet::Tma {
        ctc: (tsc / MTC_TICKS) as u16,
        fc: 0,
    };
    enc.packet(&tma, out).unwrap();
}

/// The MTC of the crystal-clock tick at TSC `t` (a multiple of [`MTC_TICKS`]).
fn mtc_at(enc: &mut Encoder, t: u64, out: &mut Vec<u8>) {
    let mtc = Packet::Mtc {
        ctc: (t / MTC_TICKS) as u8,
    };
    enc.packet(&mtc, out).unwrap();
}

/// A CPU's stream as a CPU-wide recording (TraceEn set once) has it: no TSC at a switch-in
/// nor inside a region (the regions' `tsc` and `inside` are ignored), a TSC only in PSB+s, each
/// with its TMA; an MTC in the kernel right before each region (the last tick before `at`)
/// and right after it (the first tick at least 6 TSC ticks after `at`, past its last
/// instruction). Only MTC times tell where between two PSBs a region lies.
pub fn cpu_stream_mtc(start: u64, regions: &[Region]) -> Vec<u8> {
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    enc.psb(&mut out);
    tsc_tma(&mut enc, start, &mut out);
    enc.packet(&Packet::PsbEnd, &mut out).unwrap();
    for r in regions {
        mtc_at(&mut enc, (r.at - 1) / MTC_TICKS * MTC_TICKS, &mut out);
        region_packets(&mut enc, r, None, &mut out);
        mtc_at(
            &mut enc,
            (r.at + 6).div_ceil(MTC_TICKS) * MTC_TICKS,
            &mut out,
        );
        if let Some(tsc) = r.psb_after {
            enc.psb(&mut out);
            tsc_tma(&mut enc, tsc, &mut out);
            enc.packet(&Packet::PsbEnd, &mut out).unwrap();
        }
    }
    out
}

/// A perf record: header (type, misc, size) and body.
pub fn record(kind: u32, misc: u16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&misc.to_le_bytes());
    out.extend_from_slice(&((8 + body.len()) as u16).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The `sample_id` trailer of the attr below: TID, TIME, CPU, IDENTIFIER.
pub fn sample_id(pid: u32, tid: u32, time: u64, cpu: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [pid, tid] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&time.to_le_bytes());
    out.extend_from_slice(&cpu.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&7u64.to_le_bytes());
    out
}

/// perf time of TSC `tsc` with the conversion written below (`time_shift` 1, `time_mult` 1,
/// `time_zero` 0: a TSC tick is half a nanosecond).
pub fn perf_time(tsc: u64) -> u64 {
    tsc / 2
}

/// What to leave out or damage in [`perf_data`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// Write no switch records at all.
    pub no_switches: bool,
    /// Drop CPU 1's switch-out of thread 103 to 101 (and its switch-in): CPU 1's region of
    /// thread 101 then lies where 103 may still have run.
    pub drop_cpu1_migration: bool,
    /// Cut the file in the middle of CPU 1's AUXTRACE payload.
    pub truncate_aux: bool,
    /// A CPU-wide recording (`perf record -a`): AUXTRACE records name no task, and CPU 1's
    /// trace also has the untraced process's thread 555 ([`OTHER`]).
    pub cpu_wide: bool,
    /// The streams of [`cpu_stream_mtc`] (times from MTCs only); `Some(false)`: the
    /// AUXTRACE_INFO lacks the TSC:CTC ratio, so the MTCs give no time.
    pub mtc: Option<bool>,
}

/// Thread 555's region in a CPU-wide recording: 2 instructions at 0x1010.
pub const OTHER: Region = region(Some(1024), 555, 0x1010, 1, 1024);

/// The start of a pipe-mode perf.data: the magic, the one `intel_pt` event's attribute
/// (sample_id_all with TID, TIME, CPU and IDENTIFIER) and AUXTRACE_INFO (Intel PT, pmu_type 8,
/// time_shift 1, time_mult 1, time_zero 0, cap_user_time_zero 1, tsc_bit, noretcomp_bit,
/// have_sched_switch 3, snapshot 0, and `per_cpu` as per_cpu_mmaps).
pub fn perf_header(per_cpu: bool) -> Vec<u8> {
    perf_header_timed(per_cpu, None)
}

/// [`perf_header`], and with `ctc_ratio` the AUXTRACE_INFO's MTC entries too: mtc_bit,
/// mtc_freq_bits (config bits 17:14, 0 in the attr: `mtc_period=0`), tsc_ctc_ratio_n / _d,
/// cyc_bit and max_non_turbo_ratio 0.
pub fn perf_header_timed(per_cpu: bool, ctc_ratio: Option<(u64, u64)>) -> Vec<u8> {
    const HEADER_ATTR: u32 = 64;
    const AUXTRACE_INFO: u32 = 70;
    let mut out = b"PERFILE2".to_vec();
    out.extend_from_slice(&16u64.to_le_bytes());
    let mut attr = vec![0u8; 112];
    attr[0..4].copy_from_slice(&8u32.to_le_bytes());
    attr[4..8].copy_from_slice(&112u32.to_le_bytes());
    let st: u64 = (1 << 1) | (1 << 2) | (1 << 7) | (1 << 16);
    attr[24..32].copy_from_slice(&st.to_le_bytes());
    attr[40..48].copy_from_slice(&(1u64 << 18).to_le_bytes());
    attr.extend_from_slice(&7u64.to_le_bytes());
    out.extend(record(HEADER_ATTR, 0, &attr));
    let mut info = Vec::new();
    info.extend_from_slice(&1u32.to_le_bytes());
    info.extend_from_slice(&0u32.to_le_bytes());
    for x in [8u64, 1, 1, 0, 1, 0x400, 0x800, 3, 0, u64::from(per_cpu)] {
        info.extend_from_slice(&x.to_le_bytes());
    }
    if let Some((n, d)) = ctc_ratio {
        for x in [1u64 << 9, 0xf << 14, n, d, 1 << 1, 0] {
            info.extend_from_slice(&x.to_le_bytes());
        }
    }
    out.extend(record(AUXTRACE_INFO, 0, &info));
    out
}

/// The pipe-mode perf.data of the scenario.
pub fn perf_data(v: Variant) -> Vec<u8> {
    const AUXTRACE: u32 = 71;
    const ITRACE_START: u32 = 12;
    const SWITCH_CPU_WIDE: u32 = 15;
    const MISC_SWITCH_OUT: u16 = 1 << 13;
    let mut out = match v.mtc {
        Some(ratio) => perf_header_timed(true, Some((MTC_TICKS, u64::from(ratio)))),
        None => perf_header(true),
    };
    for cpu in 0..2u32 {
        // Each CPU's records in time order, as perf's per-CPU buffers hold them.
        let mut records: Vec<(u64, Vec<u8>)> = Vec::new();
        // Tracing starts for the process's event on each CPU (ITRACE_START names the thread
        // running then; perf's inherited events write no more of them).
        let (t, tid): (u64, u32) = if cpu == 0 { (1015, 101) } else { (1058, 103) };
        let mut body = Vec::new();
        body.extend_from_slice(&PID.to_le_bytes());
        body.extend_from_slice(&tid.to_le_bytes());
        body.extend(sample_id(PID, tid, perf_time(t), cpu));
        records.push((t, record(ITRACE_START, 0, &body)));
        for &(c, t, is_out, me, other) in SWITCHES.iter().filter(|s| s.0 == cpu) {
            if v.no_switches || (v.drop_cpu1_migration && c == 1 && (t == 1150 || t == 1160)) {
                continue;
            }
            let mut body = Vec::new();
            body.extend_from_slice(&pid_of(other).to_le_bytes());
            body.extend_from_slice(&other.to_le_bytes());
            body.extend(sample_id(pid_of(me), me, perf_time(t), c));
            let misc = if is_out { MISC_SWITCH_OUT } else { 0 };
            records.push((t, record(SWITCH_CPU_WIDE, misc, &body)));
        }
        records.sort_by_key(|r| r.0);
        for (_, r) in records {
            out.extend(r);
        }
    }
    let cpu1: Vec<Region> = if v.cpu_wide {
        std::iter::once(OTHER).chain(CPU1).collect()
    } else {
        CPU1.to_vec()
    };
    let task = if v.cpu_wide { u32::MAX } else { PID };
    let stream = if v.mtc.is_some() {
        cpu_stream_mtc
    } else {
        cpu_stream
    };
    for (cpu, data) in [(0u32, stream(1000, &CPU0)), (1, stream(1010, &cpu1))] {
        let mut body = Vec::new();
        body.extend_from_slice(&(data.len() as u64).to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&0x1234u64.to_le_bytes());
        // idx, tid (perf writes the workload's pid in per-CPU mode of one task), cpu.
        for v in [cpu, task, cpu, 0] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        out.extend(record(AUXTRACE, 0, &body));
        out.extend_from_slice(&data);
    }
    if v.truncate_aux {
        out.truncate(out.len() - 7);
    }
    out
}
