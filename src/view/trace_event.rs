//! The timeline: every call as a slice on its stream's track, written as Chrome/Perfetto
//! trace-event JSON (the "JSON Object Format": `{"traceEvents": [...], ...}`), streamed while the
//! trace is decoded.
//!
//! Each closed frame becomes one complete event (`"ph": "X"`) with its start and duration in
//! microseconds (to the nanosecond) and its instruction counts in `args`; events are written
//! when the frame closes, so a callee comes before its caller in the file (viewers sort by
//! start time). Within a track every slice start and end is a distinct nanosecond and callees
//! lie inside their callers, so the nesting is unambiguous for any viewer.
//!
//! # Time
//!
//! [`Clock`] says where times come from, and the JSON says it in `otherData.time`:
//!
//! * **TSC** (every stream has a TSC packet, and its time moves while instructions run, see
//!   [`first_tsc`]): the flow decoder's timestamps (TSC, refined by
//!   MTC and CYC where the trace has them; see [`crate::packet::time`]). A run of instructions
//!   between two timing updates shares one timestamp, so inside such a window the time of a call
//!   is interpolated by its instruction number between the window's start and the next update
//!   (at most [`WINDOW_RECORDS`] calls wait for that update; past it they are placed with the
//!   previous window's rate). Ticks become nanoseconds with perf's `time_mult`/`time_shift` when
//!   the recording has them, else at the maximum non-turbo ratio × 100 MHz, else one tick is
//!   shown as one nanosecond (said in `otherData.clock`). Zero is the earliest TSC of all
//!   streams.
//! * **instructions** (no timing packets): one instruction is shown as one microsecond, so a
//!   slice's start is its first instruction's number.
//!
//! Either way the clock of a track only moves forwards: every call boundary is at least 1 ns
//! after the previous one, and a segment's first frame starts [`MAX_OUTER`] ns after the
//! previous boundary, room for the frames the trace later shows it was called from.

use std::io::Write;

use super::calltree::{CallSink, FuncId, Functions, MAX_OUTER};
use crate::packet::time::TimingConfig;
use crate::packet::{Packet, PacketDecoder};

/// How many call boundaries wait for the next timing update before they are placed with the
/// previous rate (bounds the timeline's memory on traces with sparse timing).
pub const WINDOW_RECORDS: usize = 1 << 14;

/// How TSC ticks become nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TscConversion {
    /// perf's `time_mult` and `time_shift` (from the recording's AUXTRACE_INFO):
    /// `ns = ticks · mult >> shift`.
    PerfTime {
        /// `time_mult`.
        mult: u32,
        /// `time_shift`.
        shift: u16,
    },
    /// The TSC runs at the maximum non-turbo ratio × 100 MHz.
    NonTurboRatio(u8),
    /// Unknown frequency: one tick is shown as one nanosecond.
    Unknown,
}

impl TscConversion {
    /// `ticks` in nanoseconds.
    pub fn ns(self, ticks: u64) -> u64 {
        match self {
            TscConversion::PerfTime { mult, shift } => {
                ((ticks as u128 * mult as u128) >> shift.min(127)).min(u64::MAX as u128) as u64
            }
            TscConversion::NonTurboRatio(r) if r > 0 => {
                (ticks as u128 * 10 / r as u128).min(u64::MAX as u128) as u64
            }
            _ => ticks,
        }
    }

    fn describe(self) -> String {
        match self {
            TscConversion::PerfTime { mult, shift } => {
                format!("TSC to ns with perf's time_mult {mult} and time_shift {shift}")
            }
            TscConversion::NonTurboRatio(r) if r > 0 => {
                format!("TSC at the maximum non-turbo ratio {r} x 100 MHz")
            }
            _ => "TSC frequency unknown: one tick is shown as one nanosecond".to_string(),
        }
    }
}

/// Where the timeline's times come from (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// One instruction is one microsecond.
    Instructions,
    /// The trace's timestamps, from the earliest TSC `origin`.
    Tsc {
        /// The earliest TSC of all streams (time zero).
        origin: u64,
        /// Ticks to nanoseconds.
        conversion: TscConversion,
    },
}

/// The first TSC packet's value in `trace` (as the flow decoder's time model reads it), if the
/// trace's time moves while instructions run: after it, a timing update the model uses
/// (another TSC; an MTC when `timing` has the TSC:CTC ratio and a TMA came; a CYC when `timing`
/// has the non-turbo ratio) followed by a packet that explains instructions (TNT, TIP, FUP). A
/// trace whose instructions all share one timestamp gives `None`: it has no clock to show.
pub fn first_tsc(trace: &[u8], timing: &TimingConfig) -> Option<u64> {
    let mut dec = PacketDecoder::new(trace);
    let mut first: Option<u64> = None;
    let (mut tma, mut moved) = (false, false);
    while let Some(r) = dec.next_packet() {
        // An invalid byte moves the decoder on; keep looking.
        let Ok((_, p)) = r else { continue };
        if first.is_none() {
            if let Packet::Tsc { tsc } = p {
                first = Some(tsc & ((1 << 56) - 1));
            }
            continue;
        }
        match p {
            Packet::Tsc { .. } => moved = true,
            Packet::Tma { .. } => tma = true,
            Packet::Mtc { .. } if tma && timing.ctc_ratio.1 != 0 => moved = true,
            Packet::Cyc { .. } if timing.max_nonturbo_ratio != 0 => moved = true,
            Packet::ShortTnt(_)
            | Packet::LongTnt(_)
            | Packet::Tip(_)
            | Packet::TipPge(_)
            | Packet::Fup(_)
                if moved =>
            {
                return first;
            }
            _ => {}
        }
    }
    None
}

impl Clock {
    /// The clock for a recording made of `traces` (decoded with `timing`): their timestamps
    /// if every one has a TSC and its time moves (see [`first_tsc`]), instruction counts
    /// otherwise.
    pub fn for_traces<'a>(
        traces: impl IntoIterator<Item = &'a [u8]>,
        timing: &TimingConfig,
        conversion: TscConversion,
    ) -> Clock {
        let mut origin: Option<u64> = None;
        for t in traces {
            match first_tsc(t, timing) {
                Some(tsc) => origin = Some(origin.map_or(tsc, |o| o.min(tsc))),
                None => return Clock::Instructions,
            }
        }
        match origin {
            Some(origin) => Clock::Tsc { origin, conversion },
            None => Clock::Instructions,
        }
    }

    /// `otherData.time`: `"tsc"` or `"instructions"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Clock::Instructions => "instructions",
            Clock::Tsc { .. } => "tsc",
        }
    }

    /// `otherData.clock`: how a time was made.
    pub fn describe(&self) -> String {
        match self {
            Clock::Instructions => {
                "no usable timing (no TSC, or the time does not move while instructions run): one instruction is shown as one microsecond".to_string()
            }
            Clock::Tsc { conversion, .. } => conversion.describe(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Rec {
    Open { n: u64, func: FuncId },
    Outer { func: FuncId },
    Close { n: u64, insns: u64, self_insns: u64 },
}

impl Rec {
    fn n(&self) -> Option<u64> {
        match *self {
            Rec::Open { n, .. } | Rec::Close { n, .. } => Some(n),
            Rec::Outer { .. } => None,
        }
    }
}

/// One track's state.
#[derive(Debug, Default)]
struct Track {
    pid: u32,
    tid: u32,
    /// Open slices: function and start (ns).
    open: Vec<(FuncId, u64)>,
    /// Boundaries waiting for the end of the current timing window.
    pending: Vec<Rec>,
    /// The current timing window's start: (ticks, instruction number).
    window: Option<(u64, u64)>,
    /// The previous window's length (ticks, instructions), for placing boundaries early.
    rate: Option<(u64, u64)>,
    /// The last boundary's time (ns); every boundary is later.
    last: u64,
    /// The earliest time an outer frame of the current segment may start.
    floor: u64,
    started: bool,
}

/// Counters of a written timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceEventSummary {
    /// Slices written.
    pub slices: u64,
    /// Calls left out because they ran fewer instructions than the minimum
    /// ([`TraceEvents::set_min_insns`]).
    pub omitted: u64,
    /// Call boundaries placed with the previous window's rate (too many waited for a timing
    /// update, or the track ended before the next one).
    pub estimated: u64,
}

/// Writes the trace-event JSON while the call tree is built (a [`CallSink`]).
#[derive(Debug)]
pub struct TraceEvents<W: Write> {
    out: W,
    clock: Clock,
    error: Option<std::io::Error>,
    first: bool,
    track: Track,
    /// JSON-escaped function names, by [`FuncId`].
    json_names: Vec<Option<String>>,
    pids_named: Vec<u32>,
    summary: TraceEventSummary,
    min_insns: u64,
    /// Reused for each event's text.
    buf: String,
}

impl<W: Write> TraceEvents<W> {
    /// Starts the JSON document on `out`.
    pub fn new(mut out: W, clock: Clock) -> Self {
        let error = out.write_all(b"{\"traceEvents\":[\n").err();
        TraceEvents {
            out,
            clock,
            error,
            first: true,
            track: Track::default(),
            json_names: Vec::new(),
            pids_named: Vec::new(),
            summary: TraceEventSummary::default(),
            min_insns: 0,
            buf: String::new(),
        }
    }

    /// Leaves calls of fewer than `n` instructions out of the document (their instructions
    /// still count in their caller's `insns`): a smaller file for very large traces.
    pub fn set_min_insns(&mut self, n: u64) {
        self.min_insns = n;
    }

    /// The clock in use.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    fn event(&mut self, text: &str) {
        if self.error.is_some() {
            return;
        }
        let sep: &[u8] = if self.first { b"" } else { b",\n" };
        self.first = false;
        if let Err(e) = self
            .out
            .write_all(sep)
            .and_then(|()| self.out.write_all(text.as_bytes()))
        {
            self.error = Some(e);
        }
    }

    /// Starts a track (one thread or trace stream) named `name` in process `pid`; the frames
    /// reported next belong to it.
    pub fn begin_track(&mut self, pid: u32, tid: u32, process: &str, name: &str) {
        let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".into());
        if !self.pids_named.contains(&pid) {
            self.pids_named.push(pid);
            self.event(&format!(
                "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                quote(process)
            ));
        }
        self.event(&format!(
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
            quote(name)
        ));
        self.track = Track {
            pid,
            tid,
            ..Track::default()
        };
    }

    /// Ends the current track: places every waiting boundary and closes what is still open.
    pub fn end_track(&mut self, functions: &Functions) {
        self.place_estimated(functions);
        while let Some((func, begin)) = self.track.open.pop() {
            let end = self.track.last.max(begin) + 1;
            self.track.last = end;
            self.slice(func, begin, end, None, functions);
        }
    }

    /// Finishes the document with `other` as its `otherData` (plus the clock's description);
    /// returns the writer and the counters, or the first write error.
    pub fn finish(
        mut self,
        mut other: serde_json::Map<String, serde_json::Value>,
    ) -> std::io::Result<(W, TraceEventSummary)> {
        other.insert("time".into(), self.clock.kind().into());
        other.insert("clock".into(), self.clock.describe().into());
        other.insert("slices".into(), self.summary.slices.into());
        other.insert(
            "boundaries_placed_by_rate".into(),
            self.summary.estimated.into(),
        );
        other.insert("min_slice_insns".into(), self.min_insns.into());
        other.insert("slices_omitted".into(), self.summary.omitted.into());
        let tail = format!(
            "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{}}}\n",
            serde_json::Value::Object(other)
        );
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.write_all(tail.as_bytes())?;
        self.out.flush()?;
        Ok((self.out, self.summary))
    }

    fn cache_name(&mut self, func: FuncId, functions: &Functions) {
        let i = func as usize;
        if self.json_names.len() <= i {
            self.json_names.resize(i + 1, None);
        }
        if self.json_names[i].is_none() {
            self.json_names[i] = Some(
                serde_json::to_string(functions.name(func)).unwrap_or_else(|_| "\"?\"".into()),
            );
        }
    }

    fn slice(
        &mut self,
        func: FuncId,
        begin: u64,
        end: u64,
        counts: Option<(u64, u64)>,
        functions: &Functions,
    ) {
        use std::fmt::Write as _;
        self.cache_name(func, functions);
        self.summary.slices += 1;
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let name = self.json_names[func as usize].as_deref().unwrap_or("\"?\"");
        let (pid, tid) = (self.track.pid, self.track.tid);
        let dur = end - begin;
        // Writing into a String cannot fail.
        let _ = write!(
            buf,
            "{{\"name\":{name},\"cat\":\"call\",\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"ts\":{}.{:03},\"dur\":{}.{:03},\"args\":",
            begin / 1000,
            begin % 1000,
            dur / 1000,
            dur % 1000
        );
        let _ = match counts {
            Some((insns, own)) => write!(buf, "{{\"insns\":{insns},\"self\":{own}}}}}"),
            None => write!(buf, "{{}}}}"),
        };
        self.event(&buf);
        self.buf = buf;
    }

    /// Places one boundary whose clock time is `ns`.
    fn apply(&mut self, rec: Rec, ns: u64, functions: &Functions) {
        let t = &mut self.track;
        let next = if t.started { ns.max(t.last + 1) } else { ns };
        match rec {
            Rec::Open { func, .. } => {
                let ts = if t.open.is_empty() {
                    // A segment's first frame: leave room before it for its outer frames.
                    let ts = next + MAX_OUTER as u64;
                    t.floor = next;
                    ts
                } else {
                    next
                };
                t.started = true;
                t.last = ts;
                t.open.push((func, ts));
            }
            Rec::Outer { func } => {
                if let Some(&(_, bottom)) = t.open.first() {
                    let ts = bottom.saturating_sub(1).max(t.floor);
                    t.open.insert(0, (func, ts));
                }
            }
            Rec::Close {
                insns, self_insns, ..
            } => {
                t.started = true;
                t.last = next;
                if let Some((func, begin)) = t.open.pop() {
                    if insns < self.min_insns {
                        self.summary.omitted += 1;
                    } else {
                        self.slice(func, begin, next, Some((insns, self_insns)), functions);
                    }
                }
            }
        }
    }

    fn ticks_ns(&self, ticks: u64) -> u64 {
        match self.clock {
            Clock::Tsc { origin, conversion } => conversion.ns(ticks.saturating_sub(origin)),
            Clock::Instructions => 0,
        }
    }

    /// Places the waiting boundaries by interpolation between `(t0, n0)` and `(t1, n1)`.
    fn place_window(&mut self, (t0, n0): (u64, u64), (t1, n1): (u64, u64), f: &Functions) {
        let recs = std::mem::take(&mut self.track.pending);
        let mut at = n0;
        for r in recs {
            at = r.n().unwrap_or(at);
            let ticks = if n1 > n0 && t1 > t0 {
                let k = at.clamp(n0, n1) - n0;
                t0 + ((t1 - t0) as u128 * k as u128 / (n1 - n0) as u128) as u64
            } else {
                t0
            };
            let ns = self.ticks_ns(ticks);
            self.apply(r, ns, f);
        }
    }

    /// Places the waiting boundaries with the previous window's rate.
    fn place_estimated(&mut self, f: &Functions) {
        if self.track.pending.is_empty() {
            return;
        }
        self.summary.estimated += self.track.pending.len() as u64;
        let Some((t0, n0)) = self.track.window else {
            // No time at all on this track yet: everything at time zero (then 1 ns apart).
            let recs = std::mem::take(&mut self.track.pending);
            for r in recs {
                self.apply(r, 0, f);
            }
            return;
        };
        let last_n = self
            .track
            .pending
            .iter()
            .rev()
            .find_map(Rec::n)
            .unwrap_or(n0);
        let t1 = match self.track.rate {
            Some((dt, dn)) if dn > 0 => {
                t0.saturating_add((dt as u128 * (last_n - n0) as u128 / dn as u128) as u64)
            }
            _ => t0,
        };
        self.place_window((t0, n0), (t1, last_n), f);
    }

    fn push(&mut self, rec: Rec, f: &Functions) {
        if let (Clock::Instructions, Some(n)) = (self.clock, rec.n()) {
            self.apply(rec, n.saturating_mul(1000), f);
            return;
        }
        if let Clock::Instructions = self.clock {
            self.apply(rec, 0, f);
            return;
        }
        self.track.pending.push(rec);
        if self.track.pending.len() >= WINDOW_RECORDS {
            self.place_estimated(f);
        }
    }
}

impl<W: Write> CallSink for TraceEvents<W> {
    fn tick(&mut self, n: u64, time: u64, f: &Functions) {
        if matches!(self.clock, Clock::Instructions) || time == 0 {
            return;
        }
        match self.track.window {
            None => {
                self.place_window((time, n), (time, n), f);
                self.track.window = Some((time, n));
            }
            Some((t0, n0)) if time > t0 => {
                self.place_window((t0, n0), (time, n), f);
                self.track.rate = Some((time - t0, n - n0));
                self.track.window = Some((time, n));
            }
            Some((t0, n0)) if time < t0 => {
                // The clock went back (a TSC after an MTC estimate ran ahead): the waiting
                // boundaries stay at the window's time, the track's clock does not go back.
                self.place_window((t0, n0), (t0, n0), f);
                self.track.window = Some((time, n));
            }
            Some(_) => {}
        }
    }

    fn open(&mut self, n: u64, func: FuncId, f: &Functions) {
        self.push(Rec::Open { n, func }, f);
    }

    fn open_outer(&mut self, func: FuncId, f: &Functions) {
        self.push(Rec::Outer { func }, f);
    }

    fn close(&mut self, n: u64, insns: u64, self_insns: u64, f: &Functions) {
        self.push(
            Rec::Close {
                n,
                insns,
                self_insns,
            },
            f,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::Symbolizer;

    #[test]
    fn calls_inside_a_timing_window_are_interpolated_by_instruction() {
        let mut f = Functions::default();
        let syms = Symbolizer::new();
        let (a, b) = (f.resolve(&syms, 0x1000), f.resolve(&syms, 0x2000));
        let clock = Clock::Tsc {
            origin: 5000,
            conversion: TscConversion::NonTurboRatio(20), // 2 GHz: 2 ticks per ns
        };
        let mut tl = TraceEvents::new(Vec::new(), clock);
        tl.begin_track(1, 7, "p", "cpu0");
        tl.tick(0, 5000, &f);
        tl.open(0, a, &f);
        tl.tick(10, 5000, &f);
        tl.open(10, b, &f);
        tl.tick(20, 5400, &f); // the window [5000, 5400) covers instructions 0..20
        tl.close(30, 20, 20, &f);
        tl.tick(40, 6000, &f);
        tl.close(40, 40, 20, &f);
        tl.end_track(&f);
        let (bytes, sum) = tl.finish(Default::default()).unwrap();
        assert_eq!(sum.slices, 2);
        // The last close comes after the last timing update.
        assert_eq!(sum.estimated, 1);
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let x: Vec<&serde_json::Value> = json["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        // b: opened at instruction 10 of 20 in the window → 200 ticks → 100 ns; closed at 30,
        // halfway through [5400, 6000) → 5700 → 350 ns.
        assert_eq!(x[0]["name"], "0x2000");
        assert_eq!(x[0]["ts"].as_f64(), Some(0.1));
        assert_eq!(x[0]["dur"].as_f64(), Some(0.25));
        // a: the segment's first frame starts MAX_OUTER ns after zero; ends at 6000 → 500 ns.
        assert_eq!(x[1]["ts"].as_f64(), Some(MAX_OUTER as f64 / 1000.0));
        assert_eq!(
            x[1]["dur"].as_f64(),
            Some((500 - MAX_OUTER) as f64 / 1000.0)
        );
        assert_eq!(x[1]["tid"], 7);
        assert_eq!(json["otherData"]["time"], "tsc");
    }

    #[test]
    fn a_clock_needs_time_that_moves_while_instructions_run() {
        let tsc = |v: u8| [0x19, v, 0, 0, 0, 0, 0, 0];
        let tnt = [0x06u8]; // TNT-8 with one taken bit
        let timing = TimingConfig::default();
        let moving = [&tsc(7)[..], &tnt, &tsc(9), &tnt].concat();
        assert_eq!(first_tsc(&moving, &timing), Some(7));
        // A second TSC after the last flow packet: every instruction has the first time.
        let still = [&tsc(7)[..], &tnt, &tnt, &tsc(9)].concat();
        assert_eq!(first_tsc(&still, &timing), None);
        assert_eq!(first_tsc(&tnt, &timing), None);
        assert_eq!(
            Clock::for_traces([&moving[..], &still[..]], &timing, TscConversion::Unknown),
            Clock::Instructions
        );
        assert_eq!(
            Clock::for_traces([&moving[..]], &timing, TscConversion::Unknown),
            Clock::Tsc {
                origin: 7,
                conversion: TscConversion::Unknown
            }
        );
    }
}
