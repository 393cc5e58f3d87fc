//! Which thread ran on each CPU when: the context-switch sideband of a perf.data file
//! (`PERF_RECORD_SWITCH_CPU_WIDE`, `PERF_RECORD_SWITCH`, `PERF_RECORD_ITRACE_START`, each placed
//! by its `sample_id` trailer's time and CPU) and the perf time ↔ TSC conversion of the
//! AUXTRACE_INFO (or `PERF_RECORD_TIME_CONV`), turned into a [`Schedule`]: per CPU, the
//! stretches of TSC time during which each thread may have run.
//!
//! This is what perf's own intel-pt decoder uses to give per-CPU trace data a thread (its
//! `intel_pt_context_switch` and `machine__set_current_tid`): a CPU-wide switch-out names the
//! next thread, a switch-in (or a `PERF_RECORD_SWITCH`) the thread itself. Unlike perf, which
//! keeps one "current thread" per CPU and attributes whatever the decoder reaches before the
//! next record's time, the schedule keeps *intervals* and errs wide: where a record is missing,
//! an interval reaches back to the previous record on that CPU (or forward to the next), and
//! lost sideband (`PERF_RECORD_LOST`) makes an interval of an unknown thread. A question about
//! a time range therefore gets every thread that could have run then, never fewer; callers
//! refuse to attribute when the answer is not a single thread.

use super::*;
use std::collections::BTreeMap;

/// perf's clock ↔ TSC conversion (`perf_event_mmap_page`'s `time_shift`, `time_mult`,
/// `time_zero`, as perf records them in the Intel PT AUXTRACE_INFO and in
/// `PERF_RECORD_TIME_CONV`). The same arithmetic as perf's `tsc_to_perf_time` and
/// `perf_time_to_tsc` (`tools/perf/util/tsc.c`), in 128-bit intermediates so no product wraps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscConversion {
    /// `time_shift`.
    pub time_shift: u32,
    /// `time_mult` (never 0 here).
    pub time_mult: u64,
    /// `time_zero`.
    pub time_zero: u64,
}

impl TscConversion {
    /// The conversion from raw fields; `None` when they cannot convert (`time_mult` 0, or a
    /// shift of 64 bits or more).
    pub fn new(time_shift: u64, time_mult: u64, time_zero: u64) -> Option<Self> {
        (time_mult != 0 && time_shift < 64).then_some(TscConversion {
            time_shift: time_shift as u32,
            time_mult,
            time_zero,
        })
    }

    /// The Intel PT AUXTRACE_INFO's conversion, when the kernel provided one
    /// (`cap_user_time_zero`).
    pub fn from_intel_pt(info: &IntelPtInfo) -> Option<Self> {
        if info.cap_user_time_zero == 0 {
            return None;
        }
        Self::new(info.time_shift, info.time_mult, info.time_zero)
    }

    /// perf time (ns) of TSC value `tsc` (perf's `tsc_to_perf_time`).
    pub fn tsc_to_perf_time(&self, tsc: u64) -> u64 {
        let shift = self.time_shift;
        let quot = u128::from(tsc >> shift);
        let rem = u128::from(tsc & ((1u64 << shift) - 1));
        let mult = u128::from(self.time_mult);
        let ns = quot * mult + ((rem * mult) >> shift);
        self.time_zero.wrapping_add(ns as u64)
    }

    /// TSC value of perf time `ns` (perf's `perf_time_to_tsc`).
    pub fn perf_time_to_tsc(&self, ns: u64) -> u64 {
        let t = u128::from(ns.wrapping_sub(self.time_zero));
        let mult = u128::from(self.time_mult);
        let (quot, rem) = (t / mult, t % mult);
        ((quot << self.time_shift) + ((rem << self.time_shift) / mult)) as u64
    }
}

/// What a sideband record says about a thread on a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchKind {
    /// The thread was switched in.
    In,
    /// The thread was switched out (`preempt`: while still runnable).
    Out {
        /// `PERF_RECORD_MISC_SWITCH_OUT_PREEMPT`.
        preempt: bool,
    },
    /// Tracing started for the thread's event (`PERF_RECORD_ITRACE_START`): it is running.
    ItraceStart,
}

impl SwitchKind {
    /// A switch record's kind from its `out` and `preempt` flags.
    fn of(out: bool, preempt: bool) -> Self {
        if out {
            SwitchKind::Out { preempt }
        } else {
            SwitchKind::In
        }
    }
}

/// One context-switch fact: a `PERF_RECORD_SWITCH_CPU_WIDE`, `PERF_RECORD_SWITCH` or
/// `PERF_RECORD_ITRACE_START` with its time and CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextSwitch {
    /// File offset of the record.
    pub record_offset: u64,
    /// In, out, or tracing started.
    pub kind: SwitchKind,
    /// The CPU (`sample_id`).
    pub cpu: u32,
    /// perf time (`sample_id`).
    pub time: u64,
    /// The process of the thread the record is about (the one switched in or out, or started).
    pub pid: u32,
    /// The thread the record is about.
    pub tid: u32,
    /// `PERF_RECORD_SWITCH_CPU_WIDE` only: the other thread as `(pid, tid)` — the next one
    /// on a switch-out, the previous one on a switch-in.
    pub other: Option<(u32, u32)>,
}

/// Sideband the kernel could not write (`PERF_RECORD_LOST`, `PERF_RECORD_LOST_SAMPLES`): switch
/// records may be missing before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidebandLoss {
    /// File offset of the record.
    pub record_offset: u64,
    /// The CPU whose buffer lost records, when the record says (`sample_id`).
    pub cpu: Option<u32>,
    /// perf time of the record, when it says.
    pub time: Option<u64>,
    /// How many records were lost.
    pub lost: u64,
}

/// The context-switch sideband of a perf.data file ([`PerfData::context_switches`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwitchScan {
    /// Every usable switch / tracing-start record, in file order (perf writes each CPU's
    /// buffer in rounds, so the order across CPUs is not time order).
    pub switches: Vec<ContextSwitch>,
    /// File offsets of switch records that cannot be placed: their event has no `sample_id`
    /// time, CPU or (for `PERF_RECORD_SWITCH`) thread.
    pub unplaced: Vec<u64>,
    /// Lost sideband.
    pub lost: Vec<SidebandLoss>,
    /// `PERF_RECORD_FORK` records as `(pid, ppid)`: which processes descend from which.
    pub forks: Vec<(u32, u32)>,
    /// perf time ↔ TSC: the AUXTRACE_INFO's, else `PERF_RECORD_TIME_CONV`'s.
    pub conversion: Option<TscConversion>,
    /// The framing error that ended the scan early, if any (as in [`PerfScan::error`]).
    pub error: Option<PerfDataError>,
}

impl PerfData<'_> {
    /// Reads the context-switch sideband (see [`SwitchScan`]). Never fails: a framing error
    /// ends the scan and is kept in [`SwitchScan::error`]; malformed records are skipped (the
    /// AUX scan reports them).
    pub fn context_switches(&self) -> SwitchScan {
        let mut out = SwitchScan::default();
        let mut time_conv = None;
        for item in self.records() {
            let record = match item {
                Ok(r) => r,
                Err(e) if e.is_recoverable() => continue,
                Err(e) => {
                    out.error = Some(e);
                    break;
                }
            };
            let sid = record.sample_id;
            let (kind, body_thread, other) = match record.data {
                RecordData::SwitchCpuWide {
                    out: is_out,
                    preempt,
                    next_prev_pid,
                    next_prev_tid,
                } => (
                    SwitchKind::of(is_out, preempt),
                    None,
                    Some((next_prev_pid, next_prev_tid)),
                ),
                RecordData::Switch {
                    out: is_out,
                    preempt,
                } => (SwitchKind::of(is_out, preempt), None, None),
                RecordData::ItraceStart { pid, tid } => {
                    (SwitchKind::ItraceStart, Some((pid, tid)), None)
                }
                RecordData::Lost { lost, .. } => {
                    out.lost.push(SidebandLoss {
                        record_offset: record.offset,
                        cpu: sid.cpu,
                        time: sid.time,
                        lost,
                    });
                    continue;
                }
                RecordData::Other {
                    kind: record_type::LOST_SAMPLES,
                    body,
                    ..
                } => {
                    out.lost.push(SidebandLoss {
                        record_offset: record.offset,
                        cpu: sid.cpu,
                        time: sid.time,
                        lost: u64_at(body, 0).unwrap_or(0),
                    });
                    continue;
                }
                RecordData::Fork { pid, ppid, .. } => {
                    out.forks.push((pid, ppid));
                    continue;
                }
                RecordData::AuxtraceInfo(info) if out.conversion.is_none() => {
                    out.conversion = info
                        .intel_pt()
                        .as_ref()
                        .and_then(TscConversion::from_intel_pt);
                    continue;
                }
                RecordData::TimeConv {
                    time_shift,
                    time_mult,
                    time_zero,
                } => {
                    time_conv = time_conv.or(TscConversion::new(time_shift, time_mult, time_zero));
                    continue;
                }
                _ => continue,
            };
            let thread = body_thread.or(sid.pid.zip(sid.tid));
            match (sid.cpu, sid.time, thread) {
                (Some(cpu), Some(time), Some((pid, tid))) => out.switches.push(ContextSwitch {
                    record_offset: record.offset,
                    kind,
                    cpu,
                    time,
                    pid,
                    tid,
                    other,
                }),
                _ => out.unplaced.push(record.offset),
            }
        }
        out.conversion = out.conversion.or(time_conv);
        out
    }
}

/// A stretch of one CPU's time during which one thread may have run, in TSC units (both ends
/// included; `0` and `u64::MAX` stand for "since before the first record" and "until after the
/// last").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadRun {
    /// First TSC.
    pub start: u64,
    /// Last TSC.
    pub end: u64,
    /// `(pid, tid)` of the thread; `None` for an unknown thread (sideband was lost there).
    pub thread: Option<(u32, u32)>,
}

/// Per CPU, which threads may have run when ([`Schedule::new`]), and what did not fit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    cpus: BTreeMap<u32, Vec<ThreadRun>>,
    /// Records that contradict the thread the CPU was running by the records before them
    /// (a switch-out of another thread than the one switched in, ...): both threads are kept
    /// as candidates around them.
    pub inconsistent: Vec<u64>,
    /// Records whose perf time, on their CPU, is earlier than the record before them in the
    /// file (perf writes each CPU's records in order, so this means damage; they are sorted).
    pub out_of_order: Vec<u64>,
}

impl Schedule {
    /// Builds the runs of every CPU from `scan`'s switch records, converted to TSC with
    /// `conv`. Wherever the records leave a start or end open, the run reaches to the
    /// neighbouring record (see the module docs).
    pub fn new(scan: &SwitchScan, conv: &TscConversion) -> Self {
        let mut sched = Schedule::default();
        let mut by_cpu: BTreeMap<u32, Vec<&ContextSwitch>> = BTreeMap::new();
        for s in &scan.switches {
            let list = by_cpu.entry(s.cpu).or_default();
            if list.last().is_some_and(|p| p.time > s.time) {
                sched.out_of_order.push(s.record_offset);
            }
            list.push(s);
        }
        for (cpu, mut list) in by_cpu {
            list.sort_by_key(|s| s.time);
            let runs = sched.runs_of(&list, conv);
            sched.cpus.insert(cpu, runs);
        }
        for loss in &scan.lost {
            // The lost records were written (and lost) after the last record that made it
            // into that CPU's buffer before the loss record: an unknown thread may have run
            // anywhere from there to the loss record. Without a CPU or a time, every CPU and
            // all time are in doubt.
            let cpus: Vec<u32> = match loss.cpu {
                Some(c) => vec![c],
                None => sched.cpus.keys().copied().collect(),
            };
            for cpu in cpus {
                let end = loss.time.map_or(u64::MAX, |t| conv.perf_time_to_tsc(t));
                let runs = sched.cpus.entry(cpu).or_default();
                let start = runs
                    .iter()
                    .map(|r| r.start)
                    .filter(|&s| s <= end && s != 0)
                    .max()
                    .unwrap_or(0);
                runs.push(ThreadRun {
                    start,
                    end,
                    thread: None,
                });
            }
        }
        sched
    }

    fn runs_of(&mut self, list: &[&ContextSwitch], conv: &TscConversion) -> Vec<ThreadRun> {
        let mut runs = Vec::new();
        // The thread running now and since when; `None`: not known from the records.
        let mut current: Option<((u32, u32), u64)> = None;
        // The time of the previous record (0: none yet, "since ever").
        let mut prev_time = 0u64;
        for s in list {
            let t = conv.perf_time_to_tsc(s.time);
            let me = (s.pid, s.tid);
            let close = |runs: &mut Vec<ThreadRun>, thread: (u32, u32), start: u64| {
                runs.push(ThreadRun {
                    start,
                    end: t,
                    thread: Some(thread),
                });
            };
            match s.kind {
                SwitchKind::Out { .. } => {
                    match current {
                        Some((c, since)) if c.1 == me.1 => close(&mut runs, me, since),
                        Some((c, since)) => {
                            // The records said another thread ran: keep both.
                            self.inconsistent.push(s.record_offset);
                            close(&mut runs, c, since);
                            close(&mut runs, me, prev_time);
                        }
                        None => close(&mut runs, me, prev_time),
                    }
                    current = s.other.map(|next| (next, t));
                }
                SwitchKind::In => {
                    match current {
                        Some((c, _)) if c.1 == me.1 => {}
                        Some((c, since)) => {
                            self.inconsistent.push(s.record_offset);
                            close(&mut runs, c, since);
                            current = Some((me, t));
                        }
                        None => {
                            // The previous thread (CPU-wide records name it) ran up to here.
                            if let Some(prev) = s.other {
                                close(&mut runs, prev, prev_time);
                            }
                            current = Some((me, t));
                        }
                    }
                }
                SwitchKind::ItraceStart => match current {
                    Some((c, _)) if c.1 == me.1 => {}
                    Some((c, since)) => {
                        self.inconsistent.push(s.record_offset);
                        close(&mut runs, c, since);
                        current = Some((me, prev_time));
                    }
                    None => current = Some((me, prev_time)),
                },
            }
            prev_time = t;
        }
        if let Some((c, since)) = current {
            runs.push(ThreadRun {
                start: since,
                end: u64::MAX,
                thread: Some(c),
            });
        }
        runs
    }

    /// The CPUs with records.
    pub fn cpus(&self) -> impl Iterator<Item = u32> + '_ {
        self.cpus.keys().copied()
    }

    /// The runs of `cpu` that overlap the TSC range `lo..=hi`.
    pub fn runs_during(&self, cpu: u32, lo: u64, hi: u64) -> impl Iterator<Item = &ThreadRun> {
        self.cpus
            .get(&cpu)
            .into_iter()
            .flatten()
            .filter(move |r| r.start <= hi && r.end >= lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switch(
        cpu: u32,
        time: u64,
        kind: SwitchKind,
        tid: u32,
        other: Option<u32>,
    ) -> ContextSwitch {
        ContextSwitch {
            record_offset: time,
            kind,
            cpu,
            time,
            pid: tid,
            tid,
            other: other.map(|o| (o, o)),
        }
    }

    fn threads(s: &Schedule, cpu: u32, lo: u64, hi: u64) -> Vec<Option<u32>> {
        let mut t: Vec<Option<u32>> = s
            .runs_during(cpu, lo, hi)
            .map(|r| r.thread.map(|t| t.1))
            .collect();
        t.sort();
        t.dedup();
        t
    }

    const ONE: TscConversion = TscConversion {
        time_shift: 0,
        time_mult: 1,
        time_zero: 0,
    };

    /// CPU-wide records: a switch-out names the next thread, which owns the CPU from there;
    /// the thread before the first record is the one the first record switches out.
    #[test]
    fn cpu_wide_switches_make_runs() {
        let out = SwitchKind::Out { preempt: false };
        let scan = SwitchScan {
            switches: vec![
                switch(0, 100, out, 7, Some(8)),
                switch(0, 110, SwitchKind::In, 8, Some(7)),
                switch(0, 200, out, 8, Some(0)),
                switch(0, 210, SwitchKind::In, 0, Some(8)),
            ],
            ..SwitchScan::default()
        };
        let s = Schedule::new(&scan, &ONE);
        assert!(s.inconsistent.is_empty() && s.out_of_order.is_empty());
        assert_eq!(threads(&s, 0, 0, 50), [Some(7)]);
        assert_eq!(threads(&s, 0, 105, 105), [Some(8)]);
        assert_eq!(threads(&s, 0, 150, 250), [Some(0), Some(8)]);
        assert_eq!(threads(&s, 0, 300, 400), [Some(0)]);
        assert!(threads(&s, 1, 0, u64::MAX).is_empty());
    }

    /// A switch-out of another thread than the one running contradicts the records before:
    /// counted, and both threads stay candidates. Lost sideband makes an unknown thread.
    #[test]
    fn contradictions_and_losses_widen_the_runs() {
        let out = SwitchKind::Out { preempt: true };
        let scan = SwitchScan {
            switches: vec![
                switch(0, 100, out, 7, Some(8)),
                // 8 switched in, but then 9 is switched out: a record was lost.
                switch(0, 200, out, 9, Some(7)),
            ],
            lost: vec![SidebandLoss {
                record_offset: 1,
                cpu: Some(0),
                time: Some(300),
                lost: 2,
            }],
            ..SwitchScan::default()
        };
        let s = Schedule::new(&scan, &ONE);
        assert_eq!(s.inconsistent, [200]);
        assert_eq!(threads(&s, 0, 150, 150), [Some(8), Some(9)]);
        assert_eq!(threads(&s, 0, 250, 250), [None, Some(7)]);
    }
}
