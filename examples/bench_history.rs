//! History benchmark: reverse-stepi, goto and reverse-continue latency as the history grows.
//!
//! ```text
//! cargo run --release --example bench_history -- [SIZE]... [--dense] [--quick]
//! ```
//!
//! For each history size (default 10^4, 10^5, 10^6, 10^7, 10^8 instructions) a trace with known
//! structure is generated: a small x86-64 program assembled in memory (nested counted loops,
//! calls and returns, a recursion deeper than the 64-entry RET-compression stack, an indirect call
//! through a table, conditional branches taken by a reproducible pseudo-random pattern) is
//! "executed" by a simulator that knows every branch outcome, and each executed instruction is fed
//! to the software backend's `SoftEncoder`, which writes the packets a CPU would (PSB+ every
//! 4 KiB, short TNTs, RET compression, TIPs). The history is then indexed and queried:
//!
//! * build: `History::build` (one forward decode through the indexer) and a bare `FlowDecoder`
//!   block pass, as instructions/s; index bytes against trace bytes;
//! * reverse-stepi: `insn(n - 1)` right after `insn(n)`, near the present, in the middle and at
//!   the very beginning — *cold* (n is the first instruction of a segment, so n - 1 lies in a
//!   segment that is not cached) and *warm* (n - 1 in the cached segment); median and max;
//! * worst segment: a cold `insn` into the segment with the most instructions;
//! * goto: `insn(n)` at random n with an empty segment cache;
//! * reverse-continue: `rfind_with` from the present to a breakpoint that only the first
//!   instructions hit (a full backward scan), with a `BreakpointSet` set and with a closure, as
//!   scanned instructions/s and as a ratio to the forward decode.
//!
//! * scan comparison: the forward decode and the unprunable backward scan (a breakpoint search
//!   with the code summaries ignored, so every segment is decoded) on the same history,
//!   alternating `--reps N` times (default 3), on one thread and on two, in thread CPU time and
//!   wall time, as ratios; `--scan` runs only this.
//!
//! `--dense` adds the worst case for segment size: a loop of 64 straight-line instructions per
//! conditional branch (~400 instructions per trace byte, ~1.6 M per PSB segment).

use ptrewind::capture::soft::{Cofi, EncoderConfig, SoftEncoder, Step};
use ptrewind::flow::{BlockItem, FlowConfig, FlowDecoder};
use ptrewind::history::{BreakpointSet, History, IpMatch, MatchFn};
use ptrewind::image::{Image, Section};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------------
// A tiny assembler whose instructions carry their meaning for the simulator.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label(usize);

#[derive(Debug, Clone)]
enum Op {
    /// Falls through, no effect the simulator tracks.
    Plain,
    /// `mov reg, imm32`: counter[c] = n.
    Set(usize, u32),
    /// `dec reg`: counter[c] -= 1.
    Dec(usize),
    /// `jnz`: taken while counter[c] != 0.
    JnzCnt(usize, Label),
    /// `jz`: taken when counter[c] == 0.
    JzCnt(usize, Label),
    /// `jz`: taken with probability p/256 (pseudo-random, reproducible).
    JRand(Label, u32),
    Jmp(Label),
    Call(Label),
    Ret,
    /// `call [rax*8 + table]`: one of the targets, chosen pseudo-randomly.
    CallTable(Vec<Label>),
}

#[derive(Debug, Clone)]
struct SimInsn {
    ip: u64,
    len: u8,
    op: Op,
}

struct Asm {
    base: u64,
    code: Vec<u8>,
    insns: Vec<SimInsn>,
    /// Label → instruction index.
    labels: Vec<Option<usize>>,
    /// (offset of a rel32 in `code`, address after the instruction, label).
    fixups: Vec<(usize, u64, Label)>,
    /// (offset of a disp32 table address, index of the table).
    tables: Vec<Vec<Label>>,
    table_fixups: Vec<(usize, usize)>,
    filler: usize,
}

/// Straight-line instructions that do not touch the counters (ecx, edx, esi, edi, r8d).
const FILLERS: &[&[u8]] = &[
    &[0x01, 0xd8],             // add eax, ebx
    &[0x48, 0x8d, 0x04, 0x58], // lea rax, [rax + rbx*2]
    &[0x45, 0x31, 0xc9],       // xor r9d, r9d
    &[0x83, 0xf8, 0x07],       // cmp eax, 7
    &[0x49, 0xff, 0xc2],       // inc r10
    &[0x49, 0x89, 0xc3],       // mov r11, rax
    &[0x0f, 0xaf, 0xc3],       // imul eax, ebx
    &[0x90],                   // nop
];

/// Counter registers: mov r32, imm32 / dec r32 encodings.
const COUNTERS: &[(&[u8], &[u8])] = &[
    (&[0xb9], &[0xff, 0xc9]),             // ecx
    (&[0xba], &[0xff, 0xca]),             // edx
    (&[0xbe], &[0xff, 0xce]),             // esi
    (&[0xbf], &[0xff, 0xcf]),             // edi
    (&[0x41, 0xb8], &[0x41, 0xff, 0xc8]), // r8d
];

impl Asm {
    fn new(base: u64) -> Self {
        Asm {
            base,
            code: Vec::new(),
            insns: Vec::new(),
            labels: Vec::new(),
            fixups: Vec::new(),
            tables: Vec::new(),
            table_fixups: Vec::new(),
            filler: 0,
        }
    }
    /// Pads with INT3 up to a multiple of `n` bytes (never executed).
    fn align(&mut self, n: usize) {
        while (self.base as usize + self.code.len()) % n != 0 {
            self.code.push(0xcc);
        }
    }
    fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }
    fn bind(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }
    fn here(&self) -> u64 {
        self.base + self.code.len() as u64
    }
    fn emit(&mut self, bytes: &[u8], op: Op) {
        let ip = self.here();
        self.code.extend_from_slice(bytes);
        self.insns.push(SimInsn {
            ip,
            len: bytes.len() as u8,
            op,
        });
    }
    fn rel32(&mut self, opcode: &[u8], l: Label, op: Op) {
        let mut b = opcode.to_vec();
        let at = self.code.len() + b.len();
        b.extend_from_slice(&[0; 4]);
        let end = self.here() + b.len() as u64;
        self.fixups.push((at, end, l));
        self.emit(&b, op);
    }
    fn plain(&mut self, n: usize) {
        for _ in 0..n {
            let f = FILLERS[self.filler % FILLERS.len()];
            self.filler += 1;
            self.emit(f, Op::Plain);
        }
    }
    fn set(&mut self, c: usize, n: u32) {
        let mut b = COUNTERS[c].0.to_vec();
        b.extend_from_slice(&n.to_le_bytes());
        self.emit(&b, Op::Set(c, n));
    }
    fn dec(&mut self, c: usize) {
        self.emit(COUNTERS[c].1, Op::Dec(c));
    }
    fn jnz_cnt(&mut self, c: usize, l: Label) {
        self.rel32(&[0x0f, 0x85], l, Op::JnzCnt(c, l));
    }
    fn jz_cnt(&mut self, c: usize, l: Label) {
        self.rel32(&[0x0f, 0x84], l, Op::JzCnt(c, l));
    }
    fn jrand(&mut self, l: Label, p: u32) {
        self.rel32(&[0x0f, 0x84], l, Op::JRand(l, p));
    }
    fn jmp(&mut self, l: Label) {
        self.rel32(&[0xe9], l, Op::Jmp(l));
    }
    fn call(&mut self, l: Label) {
        self.rel32(&[0xe8], l, Op::Call(l));
    }
    fn ret(&mut self) {
        self.emit(&[0xc3], Op::Ret);
    }
    fn call_table(&mut self, targets: Vec<Label>) {
        // call [rax*8 + disp32]
        let at = self.code.len() + 3;
        self.table_fixups.push((at, self.tables.len()));
        self.tables.push(targets.clone());
        self.emit(&[0xff, 0x14, 0xc5, 0, 0, 0, 0], Op::CallTable(targets));
    }

    /// Resolves labels; returns (code bytes incl. tables, instructions, label → index).
    fn finish(mut self) -> Program {
        let idx = |l: Label| self.labels[l.0].expect("unbound label");
        for &(at, end, l) in &self.fixups {
            let target = self.insns[idx(l)].ip;
            let rel = (target as i64 - end as i64) as i32;
            self.code[at..at + 4].copy_from_slice(&rel.to_le_bytes());
        }
        // Tables after the code, 8-aligned.
        while self.code.len() % 8 != 0 {
            self.code.push(0xcc);
        }
        for (t, targets) in self.tables.iter().enumerate() {
            let addr = self.here() as u32;
            for &(at, tt) in &self.table_fixups {
                if tt == t {
                    self.code[at..at + 4].copy_from_slice(&addr.to_le_bytes());
                }
            }
            for &l in targets {
                let ip = self.insns[idx(l)].ip;
                self.code.extend_from_slice(&ip.to_le_bytes());
            }
        }
        let labels = self.labels.iter().map(|l| l.unwrap_or(0)).collect();
        Program {
            base: self.base,
            code: self.code,
            insns: self.insns,
            labels,
        }
    }
}

struct Program {
    base: u64,
    code: Vec<u8>,
    insns: Vec<SimInsn>,
    labels: Vec<usize>,
}

/// The benchmark program. Returns it and the label of `init` (run once, at the start).
fn program(dense: bool) -> (Program, Label) {
    let mut a = Asm::new(0x40_1000);
    let (main, outer, l1, skip) = (a.label(), a.label(), a.label(), a.label());
    let (init, work, w1, w2) = (a.label(), a.label(), a.label(), a.label());
    let (f0, f1, f2, f2a, f3) = (a.label(), a.label(), a.label(), a.label(), a.label());
    let (rec, recdone, tight, t1) = (a.label(), a.label(), a.label(), a.label());

    a.bind(main);
    a.call(init);
    a.bind(outer);
    if dense {
        // 64 straight-line instructions per conditional branch.
        a.set(0, 1_000_000);
        a.bind(l1);
        a.plain(64);
        a.dec(0);
        a.jnz_cnt(0, l1);
        a.jmp(outer);
        a.bind(skip);
        a.bind(work);
        a.bind(w1);
        a.bind(w2);
        a.bind(f0);
        a.bind(f1);
        a.bind(f2);
        a.bind(f2a);
        a.bind(f3);
        a.bind(rec);
        a.bind(recdone);
        a.bind(tight);
        a.bind(t1);
    } else {
        a.set(0, 40);
        a.bind(l1);
        a.plain(2);
        a.call(work);
        a.plain(1);
        a.jrand(skip, 64);
        a.call_table(vec![f0, f1, f2, f3]);
        a.bind(skip);
        a.plain(1);
        a.dec(0);
        a.jnz_cnt(0, l1);
        a.call(tight);
        a.jmp(outer);

        a.bind(work);
        a.set(1, 3);
        a.bind(w1);
        a.plain(1);
        a.jrand(w2, 128);
        a.plain(3);
        a.bind(w2);
        a.dec(1);
        a.jnz_cnt(1, w1);
        a.ret();

        a.bind(f0);
        a.plain(3);
        a.ret();

        a.bind(f1);
        a.plain(1);
        a.call(work);
        a.plain(1);
        a.ret();

        a.bind(f2);
        a.plain(2);
        a.jrand(f2a, 200);
        a.plain(4);
        a.bind(f2a);
        a.ret();

        // Recursion 70 deep: deeper than the 64-entry RET-compression stack, so the outermost
        // returns go out as TIPs.
        a.bind(f3);
        a.set(3, 70);
        a.call(rec);
        a.ret();
        a.bind(rec);
        a.dec(3);
        a.jz_cnt(3, recdone);
        a.call(rec);
        a.bind(recdone);
        a.ret();

        // A tight loop: three instructions per TNT bit.
        a.bind(tight);
        a.set(2, 100);
        a.bind(t1);
        a.plain(1);
        a.dec(2);
        a.jnz_cnt(2, t1);
        a.ret();
    }
    // Start-up code lives apart from the loops, as it does in real programs (its own cache
    // line), so a breakpoint in it shows in the code summaries of the first segments only.
    a.align(64);
    a.bind(init);
    a.plain(5);
    a.ret();
    (a.finish(), init)
}

// ------------------------------------------------------------------------------------------------
// The simulator: runs the program for `n` instructions and encodes each step.

fn generate(p: &Program, n: u64) -> Vec<u8> {
    let mut enc = SoftEncoder::new(EncoderConfig::default());
    let mut out = Vec::with_capacity((n / 8) as usize + 4096);
    let mut counters = [0u32; 8];
    let mut stack: Vec<usize> = Vec::new();
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rand = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let target = |l: &Label| p.labels[l.0];
    let mut pc = 0usize;
    for i in 0..n {
        let ins = &p.insns[pc];
        let (cofi, next) = match &ins.op {
            Op::Plain => (Cofi::None, pc + 1),
            Op::Set(c, v) => {
                counters[*c] = *v;
                (Cofi::None, pc + 1)
            }
            Op::Dec(c) => {
                counters[*c] = counters[*c].wrapping_sub(1);
                (Cofi::None, pc + 1)
            }
            Op::JnzCnt(c, l) => {
                let taken = counters[*c] != 0;
                (
                    Cofi::Conditional { taken },
                    if taken { target(l) } else { pc + 1 },
                )
            }
            Op::JzCnt(c, l) => {
                let taken = counters[*c] == 0;
                (
                    Cofi::Conditional { taken },
                    if taken { target(l) } else { pc + 1 },
                )
            }
            Op::JRand(l, prob) => {
                let taken = ((rand() >> 24) & 0xff) < *prob as u64;
                (
                    Cofi::Conditional { taken },
                    if taken { target(l) } else { pc + 1 },
                )
            }
            Op::Jmp(l) => (Cofi::DirectJump, target(l)),
            Op::Call(l) => {
                stack.push(pc + 1);
                (Cofi::DirectCall, target(l))
            }
            Op::Ret => {
                // Returning from `main` never happens: the outer loop runs forever.
                let to = stack.pop().expect("return without call");
                (Cofi::Return, to)
            }
            Op::CallTable(ts) => {
                stack.push(pc + 1);
                let k = (rand() >> 32) as usize % ts.len();
                (Cofi::IndirectCall, target(&ts[k]))
            }
        };
        if i % 4096 == 0 {
            enc.set_tsc(i);
        }
        enc.step(Step {
            ip: ins.ip,
            len: ins.len,
            cofi,
            next_ip: p.insns[next].ip,
        });
        if enc.pending_output().len() > 1 << 20 {
            enc.consume_output(|b| out.extend_from_slice(b));
        }
        pc = next;
    }
    enc.finish(Some(p.insns[pc].ip));
    enc.consume_output(|b| out.extend_from_slice(b));
    out
}

// ------------------------------------------------------------------------------------------------
// Measurements.

/// Time spent on the CPU by this thread. The benchmark machine is shared (load average well above
/// its two cores), so wall-clock latencies mostly measure the scheduler; the thread's CPU time
/// measures the work. Wall-clock figures are printed beside the throughputs.
fn cpu_now() -> Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of all threads of the process (the parallel search).
fn process_cpu_now() -> Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the CPU-time clocks are always available on
    // Linux.
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A start time on both clocks.
struct Tick {
    wall: Instant,
    cpu: Duration,
}

impl Tick {
    fn now() -> Self {
        Tick {
            wall: Instant::now(),
            cpu: cpu_now(),
        }
    }
    /// Thread CPU time since `now`.
    fn elapsed(&self) -> Duration {
        cpu_now().saturating_sub(self.cpu)
    }
    /// Wall-clock time since `now`.
    fn wall(&self) -> Duration {
        self.wall.elapsed()
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn mips(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64() / 1e6
}

/// Latencies of one kind: median and max.
#[derive(Default, Clone, Copy)]
struct Lat {
    med: Duration,
    max: Duration,
}

fn lat(mut v: Vec<Duration>) -> Lat {
    let max = v.iter().copied().max().unwrap_or_default();
    Lat {
        med: median(&mut v),
        max,
    }
}

struct Row {
    label: String,
    insns: u64,
    trace_bytes: u64,
    generate: Duration,
    build: Duration,
    fwd_raw: Duration,
    fwd_raw_wall: Duration,
    build_wall: Duration,
    rcont_wall: Duration,
    index_bytes: u64,
    sync_points: u64,
    max_segment: u64,
    cold: Lat,
    warm: Lat,
    depth_cold: [Lat; 3],
    worst_segment: Duration,
    goto: Lat,
    rcont: Duration,
    rcont_scanned: u64,
    rcont_fn: Duration,
    rcont_full: Duration,
    rcont_par_wall: Duration,
    rcont_par_cpu: Duration,
}

/// A breakpoint set whose searches do not use the code summaries.
struct NoSummaries(BreakpointSet);

impl IpMatch for NoSummaries {
    fn matches(&mut self, ip: u64) -> bool {
        self.0.matches(ip)
    }
    fn may_match_range(&self, start: u64, end: u64) -> bool {
        self.0.may_match_range(start, end)
    }
    fn may_match_insns(&self, start: u64, lens: &[u8]) -> bool {
        self.0.may_match_insns(start, lens)
    }
    fn fork(&self) -> Option<Box<dyn IpMatch + Send>> {
        Some(Box::new(NoSummaries(self.0.clone())))
    }
}

fn measure(label: &str, p: &Program, init_ip: u64, n: u64) -> Row {
    let t = Tick::now();
    let trace = generate(p, n);
    let generate = t.elapsed();
    let mut image = Image::new();
    image
        .add(Section::new(p.base, p.code.clone(), "bench"))
        .expect("one section");
    let cfg = FlowConfig::default();

    // Forward decode, bare decoder.
    let t = Tick::now();
    let mut dec = FlowDecoder::new(&trace, &image, cfg.clone());
    let mut raw = 0u64;
    while let Some(item) = dec.next_block() {
        if let BlockItem::Block(b) = item {
            raw += b.count as u64;
        }
    }
    let (fwd_raw, fwd_raw_wall) = (t.elapsed(), t.wall());

    // Forward decode through the indexer.
    let t = Tick::now();
    let mut h = History::build(&trace, &image, cfg);
    let (build, build_wall) = (t.elapsed(), t.wall());
    assert_eq!(h.len(), raw, "indexer and decoder disagree");
    assert_eq!(
        h.len(),
        n,
        "history length differs from the instructions simulated"
    );
    let st = h.stats();
    let sp = h.sync_points().to_vec();
    let len = h.len();

    // Segment sizes.
    let seg_end = |k: usize| sp.get(k + 1).map_or(len, |p| p.insn);
    let (biggest, max_segment) = (0..sp.len())
        .map(|k| (k, seg_end(k) - sp[k].insn))
        .max_by_key(|x| x.1)
        .unwrap_or((0, 0));

    // Reverse-stepi at three depths.
    let boundaries: Vec<u64> = sp.iter().map(|p| p.insn).filter(|&b| b > 0).collect();
    let pick = |centre: usize| -> Vec<usize> {
        if boundaries.is_empty() {
            return Vec::new();
        }
        let lo = centre
            .saturating_sub(10)
            .min(boundaries.len().saturating_sub(20));
        (lo..(lo + 20).min(boundaries.len())).collect()
    };
    let depths = [
        pick(boundaries.len().saturating_sub(1)),
        pick(boundaries.len() / 2),
        pick(0),
    ];
    let mut cold_all = Vec::new();
    let mut warm_all = Vec::new();
    let mut depth_cold = [Lat::default(); 3];
    for (d, idxs) in depths.iter().enumerate() {
        let mut cold = Vec::new();
        for &i in idxs {
            let b = boundaries[i];
            h.clear_cache();
            h.insn(&trace, &image, b).expect("in range");
            let t = Tick::now();
            let r = h.insn(&trace, &image, b - 1);
            cold.push(t.elapsed());
            assert!(r.is_some());
            // Warm: the middle of the segment that was just decoded.
            let k = sp.partition_point(|p| p.insn < b) - 1;
            let m = (sp[k].insn + seg_end(k)) / 2;
            if m > sp[k].insn {
                h.insn(&trace, &image, m).expect("in range");
                let t = Tick::now();
                let r = h.insn(&trace, &image, m - 1);
                warm_all.push(t.elapsed());
                assert!(r.is_some());
            }
        }
        // The very beginning: from instruction 1 to 0, cold and warm.
        if d == 2 && len > 1 {
            h.clear_cache();
            let t = Tick::now();
            h.insn(&trace, &image, 0).expect("in range");
            cold.push(t.elapsed());
            let t = Tick::now();
            h.insn(&trace, &image, 0).expect("in range");
            warm_all.push(t.elapsed());
        }
        // Near the present: the very last instruction, cold.
        if d == 0 && len > 1 {
            h.clear_cache();
            let t = Tick::now();
            h.insn(&trace, &image, len - 2).expect("in range");
            cold.push(t.elapsed());
        }
        depth_cold[d] = lat(cold.clone());
        cold_all.extend(cold);
    }

    // Worst segment, cold.
    let mut worst = Vec::new();
    for _ in 0..3 {
        h.clear_cache();
        let t = Tick::now();
        h.insn(&trace, &image, seg_end(biggest) - 1)
            .expect("in range");
        worst.push(t.elapsed());
    }
    let worst_segment = worst.into_iter().max().unwrap_or_default();

    // Goto: random instruction numbers, cold cache.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut gotos = Vec::new();
    for _ in 0..200 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let k = (seed >> 11) % len;
        h.clear_cache();
        let t = Tick::now();
        h.insn(&trace, &image, k).expect("in range");
        gotos.push(t.elapsed());
    }

    // Reverse-continue from the present to `init`, which only the first instructions execute.
    h.clear_cache();
    let mut bp = BreakpointSet::new([init_ip]);
    let t = Tick::now();
    let hit = h.rfind_with(&trace, &image, len, &mut bp);
    let (rcont, rcont_wall) = (t.elapsed(), t.wall());
    let hit = hit.expect("init is executed at the start");
    assert!(hit < 16, "init hit at {hit}");
    assert_eq!(h.insn(&trace, &image, hit).map(|x| x.0), Some(init_ip));
    h.clear_cache();
    let t = Tick::now();
    let hit2 = h.rfind(&trace, &image, len, |ip| ip == init_ip);
    let rcont_fn = t.elapsed();
    assert_eq!(hit2, Some(hit));
    // No pruning: the same breakpoint with the code summaries ignored, so every segment is
    // decoded (runs are still filtered by address range): the raw backward scan speed, on one
    // thread (CPU time) and on all of them (wall-clock time).
    h.clear_cache();
    h.set_search_threads(1);
    let mut unpruned = NoSummaries(BreakpointSet::new([init_ip]));
    let t = Tick::now();
    let hit3 = h.rfind_with(&trace, &image, len, &mut unpruned);
    let rcont_full = t.elapsed();
    assert_eq!(hit3, Some(hit));
    h.clear_cache();
    h.set_search_threads(ptrewind::history::MAX_SEARCH_THREADS);
    let (t, p0) = (Tick::now(), process_cpu_now());
    let hit4 = h.rfind_with(&trace, &image, len, &mut unpruned);
    let rcont_par_wall = t.wall();
    let rcont_par_cpu = process_cpu_now().saturating_sub(p0);
    assert_eq!(hit4, Some(hit));

    Row {
        label: label.to_string(),
        insns: len,
        trace_bytes: trace.len() as u64,
        generate,
        build,
        fwd_raw,
        fwd_raw_wall,
        build_wall,
        rcont_wall,
        index_bytes: st.index_bytes,
        sync_points: st.sync_points,
        max_segment,
        cold: lat(cold_all),
        warm: lat(warm_all),
        depth_cold,
        worst_segment,
        goto: lat(gotos),
        rcont,
        rcont_scanned: len - hit,
        rcont_fn,
        rcont_full,
        rcont_par_wall,
        rcont_par_cpu,
    }
}

/// One repetition of one case of the scan comparison: (thread CPU, wall) of the forward decode
/// and of the 1-thread backward scan, (CPU of all threads, wall) of the 2-thread scan.
#[derive(Clone, Copy, Default)]
struct ScanRep {
    fwd: (Duration, Duration),
    back1: (Duration, Duration),
    back2: (Duration, Duration),
}

/// A backward search that nothing prunes, compared against the forward decode.
struct ScanCase {
    label: String,
    /// Instructions the search looks at (from the present back to its hit, or all).
    scanned: u64,
    reps: Vec<ScanRep>,
}

/// Forward decode against unprunable backward scans on the same history, alternating (forward,
/// backward on 1 thread, backward on 2 threads) `reps` times per case, so a change in the
/// machine's load hits both sides alike. Cases: the breakpoint on `init` with the code summaries
/// ignored (every segment decoded; only the last instructions hit), and a breakpoint one byte
/// into an instruction of the hottest loop with the summaries on (never hit, in code every
/// segment runs: nothing can be skipped by summary or address range).
struct ScanCompare {
    label: String,
    insns: u64,
    cases: Vec<ScanCase>,
    /// Reverse-continue to a breakpoint hit in the last segment (the hottest loop), from the
    /// present with an empty segment cache: (thread CPU, wall) per repetition.
    near: Vec<(Duration, Duration)>,
}

/// Address one byte into a multi-byte instruction of the hottest loop (`l1`'s body): inside
/// code every segment runs, and never an instruction start.
fn hot_mid_address(p: &Program) -> u64 {
    p.insns
        .iter()
        .find(|i| i.len >= 2 && matches!(i.op, Op::Plain))
        .map_or(p.base, |i| i.ip + 1)
}

/// The address of the first instruction of the hottest loop (hit in every segment).
fn hot_address(p: &Program) -> u64 {
    p.insns
        .iter()
        .find(|i| matches!(i.op, Op::Plain))
        .map_or(p.base, |i| i.ip)
}

/// What every case of [`scan_compare`] runs on.
struct CaseCtx<'a> {
    trace: &'a [u8],
    image: &'a Image,
    cfg: &'a FlowConfig,
    init_ip: u64,
    reps: usize,
}

impl CaseCtx<'_> {
    /// `reps` times: the forward decode, then the backward search from the present with a fresh
    /// `make()` on 1 thread and on 2 (statically dispatched, as the server calls it).
    fn run<M: IpMatch>(&self, h: &mut History, label: &str, make: impl Fn() -> M) -> ScanCase {
        let (trace, image, len) = (self.trace, self.image, h.len());
        let mut case = ScanCase {
            label: label.to_string(),
            scanned: 0,
            reps: Vec::new(),
        };
        for _ in 0..self.reps {
            let mut rep = ScanRep::default();
            let t = Tick::now();
            let mut dec = FlowDecoder::new(trace, image, self.cfg.clone());
            let mut raw = 0u64;
            while let Some(item) = dec.next_block() {
                if let BlockItem::Block(b) = item {
                    raw += b.count as u64;
                }
            }
            rep.fwd = (t.elapsed(), t.wall());
            assert_eq!(raw, len, "decoder and history disagree");

            let mut m = make();
            h.clear_cache();
            h.set_search_threads(1);
            let t = Tick::now();
            let hit = h.rfind_with(trace, image, len, &mut m);
            rep.back1 = (t.elapsed(), t.wall());
            if let Some(hit) = hit {
                assert!(hit < 16, "init hit at {hit}");
                assert_eq!(h.insn(trace, image, hit).map(|x| x.0), Some(self.init_ip));
            }
            case.scanned = len - hit.unwrap_or(0);

            let mut m = make();
            h.clear_cache();
            h.set_search_threads(2);
            let parallel = h.stats().parallel_searches;
            let (t, p0) = (Tick::now(), process_cpu_now());
            let hit2 = h.rfind_with(trace, image, len, &mut m);
            rep.back2 = (process_cpu_now().saturating_sub(p0), t.wall());
            assert_eq!(hit2, hit);
            assert!(
                h.stats().parallel_searches > parallel
                    || m.fork().is_none()
                    || h.sync_points().len() < 16,
                "the 2-thread search stayed on one thread"
            );
            case.reps.push(rep);
        }
        case
    }
}

fn scan_compare(label: &str, p: &Program, init_ip: u64, n: u64, reps: usize) -> ScanCompare {
    let trace = generate(p, n);
    let mut image = Image::new();
    image
        .add(Section::new(p.base, p.code.clone(), "bench"))
        .expect("one section");
    let cfg = FlowConfig::default();
    let mut h = History::build(&trace, &image, cfg.clone());
    let len = h.len();
    assert_eq!(
        len, n,
        "history length differs from the instructions simulated"
    );
    let mid = hot_mid_address(p);
    let mut out = ScanCompare {
        label: label.to_string(),
        insns: len,
        cases: Vec::new(),
        near: Vec::new(),
    };
    let ctx = CaseCtx {
        trace: &trace,
        image: &image,
        cfg: &cfg,
        init_ip,
        reps,
    };
    out.cases.push(ctx.run(&mut h, "`init`, summaries off", || {
        NoSummaries(BreakpointSet::new([init_ip]))
    }));
    out.cases
        .push(ctx.run(&mut h, "inside the hot loop (never hit)", || {
            BreakpointSet::new([mid])
        }));
    // An address the optimiser cannot see, so every instruction is really compared.
    let nowhere = std::hint::black_box(u64::MAX);
    out.cases.push(ctx.run(
        &mut h,
        "closure `ip == x`, never true (every instruction examined; 1 thread)",
        || MatchFn(move |ip: u64| ip == nowhere),
    ));
    let hot = hot_address(p);
    for _ in 0..reps.max(5) {
        h.clear_cache();
        let mut bp = BreakpointSet::new([hot]);
        let t = Tick::now();
        let hit = h.rfind_with(&trace, &image, len, &mut bp);
        out.near.push((t.elapsed(), t.wall()));
        let hit = hit.expect("the hot loop runs in the last segment");
        let last = h.sync_points().last().map_or(0, |p| p.insn);
        assert!(hit >= last, "hot-loop hit {hit} before the last segment");
    }
    out
}

/// The median of a list of figures.
fn med(v: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.into_iter().collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// "median (min–max)" of a list of ratios.
fn spread(v: impl IntoIterator<Item = f64>) -> String {
    let v: Vec<f64> = v.into_iter().collect();
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.2} ({lo:.2}–{hi:.2})", med(v.iter().copied()))
}

fn print_scan(rows: &[ScanCompare]) {
    println!(
        "\n### Unprunable backward scan against forward decoding (same history, alternating)\n"
    );
    println!(
        "Throughputs are medians over the repetitions; ratios are per repetition (both passes ran under the same load), median (min–max).\n"
    );
    println!(
        "| history | breakpoint | reps | forward Minsn/s: CPU / wall | backward 1 thread Minsn/s: CPU / wall | 1 thread ÷ forward, CPU | 1 thread ÷ forward, wall | backward 2 threads Minsn/s: wall / per CPU-s of both | 2 threads wall ÷ forward wall | 2 threads wall ÷ forward CPU |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        for c in &r.cases {
            let f = |d: Duration, n: u64| mips(n, d);
            let fig = |g: fn(&ScanRep) -> Duration, n: u64| med(c.reps.iter().map(|x| f(g(x), n)));
            // Ratios per repetition (the passes of one repetition ran under the same load).
            let q = |a: fn(&ScanRep) -> Duration, b: fn(&ScanRep) -> Duration| {
                spread(c.reps.iter().map(|x| f(a(x), c.scanned) / f(b(x), r.insns)))
            };
            println!(
                "| {} | {} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {} | {} | {:.0} / {:.0} | {} | {} |",
                r.label,
                c.label,
                c.reps.len(),
                fig(|x| x.fwd.0, r.insns),
                fig(|x| x.fwd.1, r.insns),
                fig(|x| x.back1.0, c.scanned),
                fig(|x| x.back1.1, c.scanned),
                q(|x| x.back1.0, |x| x.fwd.0),
                q(|x| x.back1.1, |x| x.fwd.1),
                fig(|x| x.back2.1, c.scanned),
                fig(|x| x.back2.0, c.scanned),
                q(|x| x.back2.1, |x| x.fwd.1),
                q(|x| x.back2.1, |x| x.fwd.0),
            );
        }
    }
    println!(
        "\nReverse-continue to a breakpoint hit in the last segment (cold segment cache), µs CPU (wall): median (min–max)\n"
    );
    for r in rows {
        let cpu: Vec<f64> = r.near.iter().map(|x| x.0.as_secs_f64() * 1e6).collect();
        let wall: Vec<f64> = r.near.iter().map(|x| x.1.as_secs_f64() * 1e6).collect();
        let lohi = |v: &[f64]| {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.0} ({lo:.0}–{hi:.0})", med(v.iter().copied()))
        };
        println!("* {}: {} CPU, {} wall", r.label, lohi(&cpu), lohi(&wall));
    }
}

fn print(rows: &[Row]) {
    println!("### Index build (forward decode) and size\n");
    println!(
        "| history | trace bytes | insns/byte | generate s | decoder Minsn/s (wall) | build (History::update) Minsn/s (wall) | sync points | max insns/segment | index bytes | index/trace |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.1} | {:.2} | {:.0} ({:.0}) | {:.0} ({:.0}) | {} | {} | {} | {:.2} % |",
            r.label,
            r.trace_bytes,
            r.insns as f64 / r.trace_bytes as f64,
            r.generate.as_secs_f64(),
            mips(r.insns, r.fwd_raw),
            mips(r.insns, r.fwd_raw_wall),
            mips(r.insns, r.build),
            mips(r.insns, r.build_wall),
            r.sync_points,
            r.max_segment,
            r.index_bytes,
            100.0 * r.index_bytes as f64 / r.trace_bytes as f64,
        );
    }
    println!("\n### Reverse-stepi and goto latency (µs of thread CPU time; median / max)\n");
    println!(
        "| history | warm | cold, all depths | cold near present | cold middle | cold beginning | worst segment, cold | goto (cold) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let f = |l: Lat| format!("{} / {}", us(l.med), us(l.max));
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            f(r.warm),
            f(r.cold),
            f(r.depth_cold[0]),
            f(r.depth_cold[1]),
            f(r.depth_cold[2]),
            us(r.worst_segment),
            f(r.goto),
        );
    }
    println!("\n### Reverse-continue: full backward scan to the first instructions\n");
    println!(
        "| history | scanned insns | breakpoint ms (wall) | breakpoint Minsn/s (wall) | summaries off, 1 thread Minsn/s | summaries off, {} threads: Minsn/s wall (per CPU-second of all threads) | closure Minsn/s | forward decoder Minsn/s (wall) | ratio to forward: breakpoint (wall) / 1 thread / parallel (wall) / closure |",
        threads()
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let fwd = mips(r.insns, r.fwd_raw);
        let fwd_wall = mips(r.insns, r.fwd_raw_wall);
        let bp = mips(r.rcont_scanned, r.rcont_wall);
        let seq = mips(r.rcont_scanned, r.rcont_full);
        let par = mips(r.rcont_scanned, r.rcont_par_wall);
        let par_cpu = mips(r.rcont_scanned, r.rcont_par_cpu);
        let cl = mips(r.rcont_scanned, r.rcont_fn);
        println!(
            "| {} | {} | {:.2} ({:.2} CPU) | {:.0} | {:.0} | {:.0} ({:.0}) | {:.0} | {:.0} ({:.0}) | {:.0} / {:.2} / {:.2} / {:.2} |",
            r.label,
            r.rcont_scanned,
            r.rcont_wall.as_secs_f64() * 1e3,
            r.rcont.as_secs_f64() * 1e3,
            bp,
            seq,
            par,
            par_cpu,
            cl,
            fwd,
            fwd_wall,
            bp / fwd_wall,
            seq / fwd,
            par / fwd_wall,
            cl / fwd,
        );
    }
}

fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(ptrewind::history::MAX_SEARCH_THREADS)
}

fn main() {
    let mut sizes: Vec<u64> = Vec::new();
    let mut dense = false;
    let mut scan_only = false;
    let mut reps = 3usize;
    let usage = || -> ! {
        eprintln!("usage: bench_history [SIZE]... [--dense] [--quick] [--scan] [--reps N]");
        std::process::exit(2);
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dense" => dense = true,
            "--quick" => sizes.extend([10_000, 100_000, 1_000_000]),
            "--scan" => scan_only = true,
            "--reps" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) if n >= 1 => reps = n,
                _ => usage(),
            },
            s => match s.replace('_', "").parse::<f64>() {
                Ok(v) if v >= 1.0 => sizes.push(v as u64),
                _ => usage(),
            },
        }
    }
    if sizes.is_empty() {
        sizes = vec![10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];
    }
    let (prog, init) = program(false);
    let init_ip = prog.insns[prog.labels[init.0]].ip;
    let label_of = |n: u64| {
        let exp = (n as f64).log10();
        if (exp - exp.round()).abs() < 1e-9 {
            format!("10^{}", exp.round() as u32)
        } else {
            n.to_string()
        }
    };
    let mut rows = Vec::new();
    if !scan_only {
        for &n in &sizes {
            let label = label_of(n);
            eprintln!("measuring {label} ...");
            rows.push(measure(&label, &prog, init_ip, n));
        }
        if dense {
            let (dp, dinit) = program(true);
            let dinit_ip = dp.insns[dp.labels[dinit.0]].ip;
            let n = *sizes.iter().max().unwrap_or(&10_000_000);
            let n = n.min(30_000_000);
            eprintln!("measuring dense {n} ...");
            rows.push(measure(&format!("dense {n}"), &dp, dinit_ip, n));
        }
        print(&rows);
    }
    // The scan comparison, on the sizes where a scan lasts long enough to time (>= 10^6).
    let mut scans = Vec::new();
    for &n in sizes.iter().filter(|&&n| n >= 1_000_000 || scan_only) {
        let label = label_of(n);
        eprintln!("comparing scans at {label} ...");
        scans.push(scan_compare(&label, &prog, init_ip, n, reps));
    }
    if dense {
        let (dp, dinit) = program(true);
        let dinit_ip = dp.insns[dp.labels[dinit.0]].ip;
        let n = sizes
            .iter()
            .copied()
            .max()
            .unwrap_or(10_000_000)
            .min(30_000_000);
        eprintln!("comparing scans at dense {n} ...");
        scans.push(scan_compare(&format!("dense {n}"), &dp, dinit_ip, n, reps));
    }
    print_scan(&scans);
}
