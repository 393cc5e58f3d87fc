//! A synthetic perf.data of a process that calls `execve` while traced (hardware recording,
//! user-only): program A runs two regions (the second ends in the `execve`), then program B —
//! another program at the same addresses — runs two. Written per thread (`perf record
//! --per-thread`: one AUX stream) or per CPU (perf's default: A's regions and B's first on
//! CPU 0, B's second on CPU 1 after a migration, with switch records), with the sideband a
//! kernel writes: ITRACE_START, `MMAP2` of A, the `COMM` with the exec flag, `MMAP2` of B.
//! The code files are the caller's (their paths go into the `MMAP2` records).

use super::percpu::{self, Region, cpu_stream, cpu_stream_mtc, perf_time, record, sample_id};

/// The process (and its one thread).
pub const PID: u32 = 300;
/// Where both programs are mapped.
pub const BASE: u64 = 0x1000;
/// Program A: 8 copies of `jne . ; ret ; nop` (as the per-CPU scenario's code).
pub const CODE_A: [u8; 32] = percpu::CODE;
/// Program B: 8 copies of `nop ; jne .-3 (to the nop) ; ret`.
pub const CODE_B: [u8; 32] = [
    0x90, 0x75, 0xfd, 0xc3, 0x90, 0x75, 0xfd, 0xc3, 0x90, 0x75, 0xfd, 0xc3, 0x90, 0x75, 0xfd, 0xc3,
    0x90, 0x75, 0xfd, 0xc3, 0x90, 0x75, 0xfd, 0xc3, 0x90, 0x75, 0xfd, 0xc3, 0x90, 0x75, 0xfd, 0xc3,
];
/// TSC of the exec (the COMM record's time).
pub const EXEC_TSC: u64 = 1050;

const fn region(tsc: Option<u64>, inside: Option<u64>, ip: u64, taken: u8, at: u64) -> Region {
    Region {
        tsc,
        inside,
        psb_after: None,
        tid: PID,
        ip,
        taken,
        at,
    }
}

/// A's regions; the second one has a TSC inside only when `timed` (without it, the exec may
/// lie before or after it: TSC packets do not tell).
fn regions_a(timed: bool) -> [Region; 2] {
    [
        region(Some(1020), Some(1021), BASE, 2, 1020),
        region(None, timed.then_some(1031), BASE + 4, 1, 1030),
    ]
}

/// B's regions: the first on the CPU of the exec, the second (per CPU: on CPU 1).
const REGIONS_B: [Region; 2] = [
    region(None, Some(1061), BASE, 2, 1060),
    region(Some(1105), Some(1106), BASE + 4, 1, 1105),
];

/// The thread's instructions: A's, then B's.
pub fn truth() -> Vec<u64> {
    let mut out = Vec::new();
    for r in regions_a(true) {
        out.extend(std::iter::repeat_n(r.ip, usize::from(r.taken) + 1));
    }
    for r in REGIONS_B {
        for _ in 0..=r.taken {
            out.extend([r.ip, r.ip + 1]);
        }
    }
    out
}

/// A's instructions only (what an unplaceable exec leaves to decode: the regions before the
/// first place it may lie in).
pub fn truth_before_ambiguity() -> Vec<u64> {
    let r = regions_a(false)[0];
    vec![r.ip; usize::from(r.taken) + 1]
}

/// How to record.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// perf's default per-CPU mode (else `--per-thread`).
    pub per_cpu: bool,
    /// A's second region has no TSC: the exec cannot be placed.
    pub ambiguous: bool,
    /// Per CPU: the thread migrates to CPU 1 during the exec, so B runs only there (the
    /// split's piece of CPU 1 starts with a PSB+ right where B starts).
    pub migrate_at_exec: bool,
    /// The streams carry MTCs around every region and no TSC but their PSBs'
    /// ([`percpu::cpu_stream_mtc`]), with the TSC:CTC ratio in the AUXTRACE_INFO: only MTC
    /// times place the exec.
    pub mtc: bool,
}

fn mmap2(path: &str, time_tsc: u64, cpu: u32) -> Vec<u8> {
    const MMAP2: u32 = 10;
    let mut body = Vec::new();
    for v in [PID, PID] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    for v in [BASE, 32, 0] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    // maj, min, ino, ino_generation.
    body.extend_from_slice(&[0u8; 24]);
    // prot PROT_READ | PROT_EXEC, flags MAP_PRIVATE.
    body.extend_from_slice(&5u32.to_le_bytes());
    body.extend_from_slice(&2u32.to_le_bytes());
    let mut name = path.as_bytes().to_vec();
    name.push(0);
    name.resize(name.len().div_ceil(8) * 8, 0);
    body.extend(name);
    body.extend(sample_id(PID, PID, perf_time(time_tsc), cpu));
    record(MMAP2, 0, &body)
}

fn comm_exec(name: &str, time_tsc: u64, cpu: u32) -> Vec<u8> {
    const COMM: u32 = 3;
    const MISC_COMM_EXEC: u16 = 1 << 13;
    let mut body = Vec::new();
    for v in [PID, PID] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    n.resize(n.len().div_ceil(8) * 8, 0);
    body.extend(n);
    body.extend(sample_id(PID, PID, perf_time(time_tsc), cpu));
    record(COMM, MISC_COMM_EXEC, &body)
}

/// The pipe-mode perf.data: `prog_a`/`prog_b` are the paths the `MMAP2` records name.
pub fn perf_data(v: Variant, prog_a: &str, prog_b: &str) -> Vec<u8> {
    const AUXTRACE: u32 = 71;
    const ITRACE_START: u32 = 12;
    const SWITCH_CPU_WIDE: u32 = 15;
    const MISC_SWITCH_OUT: u16 = 1 << 13;
    let mut out = if v.mtc {
        percpu::perf_header_timed(v.per_cpu, Some((percpu::MTC_TICKS, 1)))
    } else {
        percpu::perf_header(v.per_cpu)
    };
    let cpu_stream = if v.mtc { cpu_stream_mtc } else { cpu_stream };
    let a = regions_a(!v.ambiguous);
    let mut records: Vec<(u64, u32, Vec<u8>)> = Vec::new();
    let itrace = |t: u64, cpu: u32| {
        let mut body = Vec::new();
        body.extend_from_slice(&PID.to_le_bytes());
        body.extend_from_slice(&PID.to_le_bytes());
        body.extend(sample_id(PID, PID, perf_time(t), cpu));
        (t, cpu, record(ITRACE_START, 0, &body))
    };
    records.push(itrace(1012, 0));
    records.push((1005, 0, mmap2(prog_a, 1005, 0)));
    records.push((EXEC_TSC, 0, comm_exec("progB", EXEC_TSC, 0)));
    records.push((EXEC_TSC + 2, 0, mmap2(prog_b, EXEC_TSC + 2, 0)));
    if v.per_cpu {
        records.push(itrace(1101, 1));
        // (cpu, TSC, out, the record's thread, the other thread): 300 runs on CPU 0 from
        // 1010 to 1090, on CPU 1 from 1100 to 1200 (migrating at the exec: on CPU 0 to 1052,
        // on CPU 1 from 1055).
        let (out0, in1) = if v.migrate_at_exec {
            (1052, 1055)
        } else {
            (1090, 1100)
        };
        for (cpu, t, is_out, me, other) in [
            (0u32, 1008u64, true, 0u32, PID),
            (0, 1010, false, PID, 0),
            (0, out0, true, PID, 0),
            (0, out0 + 2, false, 0, PID),
            (1, in1 - 2, true, 0, PID),
            (1, in1, false, PID, 0),
            (1, 1200, true, PID, 0),
            (1, 1202, false, 0, PID),
        ] {
            let pid_of = |t: u32| if t == 0 { 0 } else { PID };
            let mut body = Vec::new();
            body.extend_from_slice(&pid_of(other).to_le_bytes());
            body.extend_from_slice(&other.to_le_bytes());
            body.extend(sample_id(pid_of(me), me, perf_time(t), cpu));
            let misc = if is_out { MISC_SWITCH_OUT } else { 0 };
            records.push((t, cpu, record(SWITCH_CPU_WIDE, misc, &body)));
        }
    }
    // Each CPU's records in time order, CPU by CPU (as perf writes its per-CPU buffers).
    records.sort_by_key(|r| (r.1, r.0));
    for (_, _, r) in records {
        out.extend(r);
    }
    let streams: Vec<(u32, u32, Vec<u8>)> = if v.per_cpu && v.migrate_at_exec {
        vec![
            (0, 0, cpu_stream(1000, &a)),
            (1, 1, cpu_stream(1053, &REGIONS_B)),
        ]
    } else if v.per_cpu {
        vec![
            (0, 0, cpu_stream(1000, &[a[0], a[1], REGIONS_B[0]])),
            (1, 1, cpu_stream(1095, &REGIONS_B[1..])),
        ]
    } else {
        let all = [a[0], a[1], REGIONS_B[0], REGIONS_B[1]];
        vec![(0, u32::MAX, cpu_stream(1000, &all))]
    };
    for (idx, cpu, data) in streams {
        let mut body = Vec::new();
        body.extend_from_slice(&(data.len() as u64).to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&0x1234u64.to_le_bytes());
        // idx, tid (the workload's pid), cpu (-1 per thread).
        for x in [idx, PID, cpu, 0] {
            body.extend_from_slice(&x.to_le_bytes());
        }
        out.extend(record(AUXTRACE, 0, &body));
        out.extend_from_slice(&data);
    }
    out
}
