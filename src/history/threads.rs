//! Several threads' histories in one global order.
//!
//! Each thread of a process has its own trace stream and its own [`History`](super::History)
//! (instruction numbers `0..len` of that thread). What ties the threads together is time: every
//! backend that records several threads stamps each stream with timing packets taken from one
//! counter shared by all threads (QEMU: TSC packets from one instruction clock; the software
//! backend: a global single-step count; a CPU: the TSC). A [`ThreadClock`] is one thread's
//! *runs*: the maximal stretches of its instructions that carry the same timestamp. The
//! [`GlobalOrder`] sorts the runs of all threads by (timestamp, thread, first instruction) and
//! concatenates them: a *global position* `g` in `0..total` is one instruction of one thread,
//! and [`GlobalOrder::local`] / [`GlobalOrder::global`] convert both ways by binary search over
//! the runs (nothing is stored per instruction).
//!
//! The order is exact where the timestamps are: a backend that serialises the threads and
//! stamps every switch (the software backend) gives the true interleaving; QEMU runs guest
//! threads in parallel and stamps at every return from the kernel, every 4 K instructions and
//! as a thread leaves (a system call's entry, a fault, a live stop). A run whose end the stream
//! knows (the thread was traced until its next stamp, or a stamp came right before the TIP.PGD
//! that ended it) is spread over the clock it lasted, at an even pace, and cut where another
//! thread's run begins inside it; a run ended by a TIP.PGD alone lasts only its instructions.
//! So the order is exact across any synchronisation through the kernel (a lock that waits, a
//! join, a pipe) and approximate, to within a run's spread, between runs that truly ran at
//! once. Streams without timing packets (time 0 throughout) are ordered thread after thread.

use crate::flow::{BlockItem, EventKind, FlowConfig, FlowDecoder};
use crate::image::Image;

/// One thread's instructions grouped by timestamp: `runs[k] = (first instruction, time)`, the
/// first instructions strictly increasing and the times never decreasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadClock {
    runs: Vec<(u64, u64)>,
    /// Per run, the time it is known to have lasted until, when the stream says: the next
    /// timestamp, when the thread was traced throughout (no TIP.PGD in between), or a stamp
    /// written right before the TIP.PGD that ended it. `None`: only its start is known.
    until: Vec<Option<u64>>,
    len: u64,
    /// Where the thread was stopped at the end of its stream by an asynchronous transfer
    /// (FUP + TIP.PGD: a fault, a signal that killed it): that instruction did not execute.
    stop_ip: Option<u64>,
}

impl ThreadClock {
    /// The runs of a thread whose stamps a backend knows directly: `runs` as `(first
    /// instruction, time)` (sorted by instruction; later entries with a smaller time are
    /// raised to keep time monotonic), `len` instructions in all.
    pub fn from_runs(runs: impl IntoIterator<Item = (u64, u64)>, len: u64) -> Self {
        let mut c = ThreadClock {
            len,
            ..ThreadClock::default()
        };
        let mut last_time = 0;
        let mut last_first = None;
        for (first, time) in runs {
            // A second stamp for the same instruction (or an earlier one) is ignored.
            if first >= len || last_first.is_some_and(|f| f >= first) {
                continue;
            }
            last_first = Some(first);
            last_time = last_time.max(time);
            // Runs a backend knows directly are exact: each lasts as long as its instructions.
            c.push(first, last_time, false);
        }
        if let Some(first) = c.runs.first_mut() {
            // Instructions before the first stamp run at the first stamp's time.
            first.0 = 0;
        } else if len > 0 {
            c.runs.push((0, 0));
            c.until.push(None);
        }
        c
    }

    /// Starts a run at instruction `first` with `time`, unless the last run's time is the same
    /// or later: a stamp that goes back (a TSC a little behind the last MTC estimate, or a
    /// per-CPU trace's piece whose PSB+ repeats an older TSC) continues the last run, so a
    /// thread's times never decrease and [`GlobalOrder`] keeps its instructions in order.
    /// `lasted`: the last run was traced throughout until this stamp, so it lasted until
    /// `time`. Returns whether a run was started.
    fn push(&mut self, first: u64, time: u64, lasted: bool) -> bool {
        match self.runs.last() {
            Some(&(_, t)) if t >= time => false,
            last => {
                // A run before the stream's first stamp (time 0) has no known start to spread
                // from.
                if lasted
                    && last.is_some_and(|&(_, t)| t > 0)
                    && let Some(u) = self.until.last_mut()
                {
                    *u = Some(time);
                }
                self.runs.push((first, time));
                self.until.push(None);
                true
            }
        }
    }

    /// The last run ended where tracing stopped (TIP.PGD) at `time`: it lasted until then if
    /// that is a later stamp (one written as the thread left: a system call, a fault).
    fn ended_at(&mut self, time: u64) {
        if let (Some(&(_, t)), Some(u)) = (self.runs.last(), self.until.last_mut())
            && time > t
        {
            *u = Some(time);
        }
    }

    /// Decodes `trace` once (over `image`) and groups its instructions by the decoder's
    /// timestamps. The instruction numbers are those of the thread's
    /// [`History`](super::History), which decodes the same stream with the same decoder.
    pub fn from_trace(trace: &[u8], image: &Image, cfg: &FlowConfig) -> Self {
        let mut c = ThreadClock::default();
        let mut dec = FlowDecoder::new(trace, image, cfg.clone());
        let mut n = 0u64;
        // The last run has been traced throughout since it began (no TIP.PGD yet).
        let mut traced = false;
        while let Some(item) = dec.next_block() {
            match item {
                BlockItem::Block(b) => {
                    if b.count > 0 {
                        traced |= c.push(n, b.time, traced);
                        n += u64::from(b.count);
                        c.stop_ip = None;
                    }
                }
                BlockItem::Event(e) => match e.kind {
                    EventKind::Disabled { ip, asynchronous } => {
                        if traced {
                            c.ended_at(e.time);
                        }
                        traced = false;
                        if let (Some(ip), true) = (ip, asynchronous) {
                            c.stop_ip = Some(ip);
                        }
                    }
                    EventKind::Enabled { .. } => c.stop_ip = None,
                    _ => {}
                },
            }
        }
        c.len = n;
        c
    }

    /// Instructions of the thread.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the thread executed no instruction.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The runs: `(first instruction, time)`.
    pub fn runs(&self) -> &[(u64, u64)] {
        &self.runs
    }

    /// The instruction the stream ended on without executing it (an asynchronous disable after
    /// the last instruction: the fault or signal that stopped the thread), if any.
    pub fn stop_ip(&self) -> Option<u64> {
        self.stop_ip
    }

    /// Sets where the thread's stream ended without executing an instruction (see
    /// [`stop_ip`](Self::stop_ip)), for clocks made with [`from_runs`](Self::from_runs).
    pub fn set_stop_ip(&mut self, ip: Option<u64>) {
        self.stop_ip = ip;
    }

    /// The timestamp of instruction `n` (`None` past the end).
    pub fn time_of(&self, n: u64) -> Option<u64> {
        if n >= self.len {
            return None;
        }
        let k = self.runs.partition_point(|&(f, _)| f <= n).checked_sub(1)?;
        Some(self.runs[k].1)
    }

    /// The timestamp after the thread's last instruction (its last run's).
    pub fn end_time(&self) -> u64 {
        self.runs.last().map_or(0, |&(_, t)| t)
    }

    /// The time run `k` is known to have lasted until (see the field), if the stream says.
    pub fn run_until(&self, k: usize) -> Option<u64> {
        self.until.get(k).copied().flatten()
    }
}

/// One run in the global order.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Global position of its first instruction.
    global: u64,
    thread: u32,
}

/// Global positions over several threads' instructions (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct GlobalOrder {
    /// Per thread: each run's first instruction and global position.
    threads: Vec<Vec<(u64, u64)>>,
    lens: Vec<u64>,
    /// Every run with at least one instruction, in global order (a spread run's pieces each
    /// count as one).
    runs: Vec<Run>,
    total: u64,
    /// Runs spread over the clock they lasted.
    spread: usize,
}

impl GlobalOrder {
    /// Merges the threads' runs; thread `t` of the order is `clocks[t]`. A run known to have
    /// lasted until a later time ([`ThreadClock::run_until`]) is spread evenly over that
    /// stretch of the clock: it is cut where another thread's run begins inside it, and each
    /// piece is placed at its own time, so that what another thread did while it ran is put
    /// among its instructions rather than after all of them.
    pub fn new(clocks: &[ThreadClock]) -> Self {
        // Where runs begin: the times a spread run is cut at.
        let mut starts: Vec<u64> = clocks
            .iter()
            .flat_map(|c| c.runs.iter().map(|&(_, t)| t))
            .collect();
        starts.sort_unstable();
        starts.dedup();
        // (time, a piece cut from a run: it comes after the runs that begin at its time, the
        // thread, the piece's place in the thread, its first instruction, its length).
        let mut all: Vec<(u64, bool, u32, u32, u64, u64)> = Vec::new();
        let mut spread = 0;
        for (t, c) in clocks.iter().enumerate() {
            // Pieces in the thread's own order.
            let mut seq = 0u32;
            let mut piece = |time: u64, cut: bool, first: u64, len: u64| {
                all.push((time, cut, t as u32, seq, first, len));
                seq += 1;
            };
            for (k, &(first, time)) in c.runs.iter().enumerate() {
                let end = c.runs.get(k + 1).map_or(c.len, |&(f, _)| f);
                if end <= first {
                    continue;
                }
                let n = end - first;
                let Some(until) = c.run_until(k).filter(|&u| u > time && n > 1) else {
                    piece(time, false, first, n);
                    continue;
                };
                spread += 1;
                let (mut at, mut at_time, mut cut_here) = (first, time, false);
                let inside = &starts[starts.partition_point(|&s| s <= time)..];
                for &s in &inside[..inside.partition_point(|&s| s < until)] {
                    // The instruction the run had reached at time `s`, at an even pace.
                    let cut = first
                        + (u128::from(s - time) * u128::from(n) / u128::from(until - time)) as u64;
                    if cut > at && cut < end {
                        piece(at_time, cut_here, at, cut - at);
                        (at, at_time, cut_here) = (cut, s, true);
                    }
                }
                piece(at_time, cut_here, at, end - at);
            }
        }
        // By time, then thread, then position in the thread (which keeps each thread's pieces
        // in their own order: their times never decrease).
        all.sort_unstable_by_key(|&(time, cut, t, k, _, _)| (time, cut, t, k));
        let mut threads: Vec<Vec<(u64, u64)>> = clocks.iter().map(|_| Vec::new()).collect();
        let mut runs = Vec::with_capacity(all.len());
        let mut g = 0u64;
        for &(_, _, t, _, first, len) in &all {
            runs.push(Run {
                global: g,
                thread: t,
            });
            g += len;
            threads[t as usize].push((first, runs.last().map_or(0, |r| r.global)));
        }
        GlobalOrder {
            threads,
            lens: clocks.iter().map(ThreadClock::len).collect(),
            runs,
            total: g,
            spread,
        }
    }

    /// Runs in the order (each piece of a spread run counted), and how many runs were spread
    /// over the clock they lasted (`monitor stats`).
    pub fn runs(&self) -> (usize, usize) {
        (self.runs.len(), self.spread)
    }

    /// Instructions of all threads.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Whether no thread executed anything.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.lens.len()
    }

    /// Instructions of thread `t`.
    pub fn thread_len(&self, t: usize) -> u64 {
        self.lens.get(t).copied().unwrap_or(0)
    }

    /// The global position of instruction `n` of thread `t`; for `n == thread_len(t)` the
    /// position just after the thread's last instruction. `None` beyond that.
    pub fn global(&self, t: usize, n: u64) -> Option<u64> {
        let runs = self.threads.get(t)?;
        let len = self.thread_len(t);
        if n > len || runs.is_empty() {
            return None;
        }
        if n == len {
            let &(first, g) = runs.last()?;
            return Some(g + (len - first));
        }
        let k = runs.partition_point(|&(f, _)| f <= n).checked_sub(1)?;
        let (first, g) = runs[k];
        Some(g + (n - first))
    }

    /// The thread and its instruction number at global position `g` (`None` past the end).
    pub fn local(&self, g: u64) -> Option<(usize, u64)> {
        if g >= self.total {
            return None;
        }
        let i = self
            .runs
            .partition_point(|r| r.global <= g)
            .checked_sub(1)?;
        let r = self.runs[i];
        let t = r.thread as usize;
        // The run's entry in its thread's list: the thread's runs appear in global order.
        let runs = &self.threads[t];
        let k = runs.partition_point(|&(_, rg)| rg <= g).checked_sub(1)?;
        let (first, rg) = runs[k];
        debug_assert_eq!(rg, r.global);
        Some((t, first + (g - rg)))
    }

    /// How many instructions of thread `t` come before global position `g`: the thread's
    /// position (its next instruction) when everything before `g` has executed.
    pub fn executed_before(&self, t: usize, g: u64) -> u64 {
        let Some(runs) = self.threads.get(t) else {
            return 0;
        };
        let len = self.thread_len(t);
        let k = runs.partition_point(|&(_, rg)| rg < g);
        if k == 0 {
            return 0;
        }
        let (first, rg) = runs[k - 1];
        let end = runs.get(k).map_or(len, |&(f, _)| f);
        (first + (g - rg)).min(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_runs_by_time_then_thread() {
        // Thread 0: 10 insns at t=5, 10 at t=30. Thread 1: 4 at t=10, 6 at t=30, 2 at t=40.
        let a = ThreadClock::from_runs([(0, 5), (10, 30)], 20);
        let b = ThreadClock::from_runs([(0, 10), (4, 30), (10, 40)], 12);
        let o = GlobalOrder::new(&[a, b]);
        assert_eq!(o.len(), 32);
        // a0..9 | b0..3 | a10..19 | b4..9 | b10..11
        assert_eq!(o.local(0), Some((0, 0)));
        assert_eq!(o.local(9), Some((0, 9)));
        assert_eq!(o.local(10), Some((1, 0)));
        assert_eq!(o.local(14), Some((0, 10)));
        assert_eq!(o.local(24), Some((1, 4)));
        assert_eq!(o.local(31), Some((1, 11)));
        assert_eq!(o.local(32), None);
        for g in 0..32 {
            let (t, n) = o.local(g).unwrap();
            assert_eq!(o.global(t, n), Some(g), "{g}");
            assert_eq!(o.executed_before(t, g), n);
        }
        assert_eq!(o.global(0, 20), Some(24));
        assert_eq!(o.global(1, 12), Some(32));
        assert_eq!(o.global(1, 13), None);
        assert_eq!(o.executed_before(1, 12), 2);
        assert_eq!(o.executed_before(0, 12), 10);
        assert_eq!(o.executed_before(0, 32), 20);
        assert_eq!(o.executed_before(1, 0), 0);
    }

    #[test]
    fn a_run_lasts_until_the_next_stamp_only_while_traced_throughout() {
        let mut c = ThreadClock::default();
        c.push(0, 10, false);
        c.push(5, 20, true);
        // Traced throughout from 10 to 20.
        assert_eq!(c.run_until(0), Some(20));
        // A stamp written as the thread left (a system call): the run lasted until then.
        c.ended_at(30);
        assert_eq!(c.run_until(1), Some(30));
        // A TIP.PGD without such a stamp, then the next run: the stamp is not the last one's end.
        c.push(8, 40, false);
        c.ended_at(40);
        c.push(9, 50, false);
        assert_eq!((c.run_until(2), c.run_until(3)), (None, None));
        // Instructions before the stream's first stamp (time 0) have no known start.
        let mut z = ThreadClock::default();
        z.push(0, 0, false);
        z.push(3, 50, true);
        assert_eq!(z.run_until(0), None);
        // A backend's exact runs last as long as their instructions.
        let exact = ThreadClock::from_runs([(0, 5), (10, 30)], 20);
        assert_eq!((exact.run_until(0), exact.run_until(1)), (None, None));
    }

    #[test]
    fn a_run_that_lasted_is_cut_where_another_thread_began() {
        // A: 100 instructions from time 10, lasting until 1010; B: 10 instructions at 500, the
        // time A had reached its instruction 49 (490 of 1000 ticks).
        let a = ThreadClock {
            runs: vec![(0, 10)],
            until: vec![Some(1010)],
            len: 100,
            stop_ip: None,
        };
        let b = ThreadClock::from_runs([(0, 500)], 10);
        for (o, ta, tb) in [
            (GlobalOrder::new(&[a.clone(), b.clone()]), 0, 1),
            (GlobalOrder::new(&[b, a]), 1, 0),
        ] {
            assert_eq!(o.len(), 110);
            // A's run in two pieces, B's whole.
            assert_eq!(o.runs(), (3, 1));
            // A0..48 | B0..9 | A49..99, whichever thread comes first in the list.
            assert_eq!(o.local(48), Some((ta, 48)));
            assert_eq!(o.local(49), Some((tb, 0)));
            assert_eq!(o.local(58), Some((tb, 9)));
            assert_eq!(o.local(59), Some((ta, 49)));
            assert_eq!(o.local(109), Some((ta, 99)));
            for g in 0..110 {
                let (t, n) = o.local(g).unwrap();
                assert_eq!(o.global(t, n), Some(g), "{g}");
                assert_eq!(o.executed_before(t, g), n);
            }
        }
    }

    #[test]
    fn stamps_out_of_order_are_raised_and_empty_threads_kept() {
        let c = ThreadClock::from_runs([(3, 9), (5, 4), (5, 100), (8, 7)], 10);
        assert_eq!(c.runs(), &[(0, 9)]);
        let o = GlobalOrder::new(&[c, ThreadClock::default()]);
        assert_eq!(o.len(), 10);
        assert_eq!(o.threads(), 2);
        assert_eq!(o.global(1, 0), None);
        assert_eq!(o.executed_before(1, 5), 0);
    }
}
