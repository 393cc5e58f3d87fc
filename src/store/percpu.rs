//! Per-CPU PT streams split into per-thread streams by the context-switch sideband.
//!
//! perf's default mode (`perf record -e intel_pt//u ./prog`, no `--per-thread`) writes one AUX
//! stream per CPU, with every thread that ran on that CPU interleaved. [`split_per_cpu`] cuts
//! each CPU's stream where its thread changes and gives every thread the concatenation of its
//! pieces from all CPUs as one stream, which the multi-thread history serves like a
//! `--per-thread` recording's.
//!
//! **Where a cut can be.** The traced thread changes only in the kernel's scheduler. With
//! user-only tracing packet generation is off there (PacketEn = 0): the stream shows it as a
//! TIP.PGD (or a PSB+ without FUP, or an OVF) before, and a TIP.PGE (or a PSB+ with FUP, or an
//! OVF's FUP) after. So the stream is read as *regions* — maximal stretches with PacketEn = 1,
//! from the packet that enables to the TIP.PGD that disables — and a whole region belongs to
//! one thread. With kernel tracing perf's per-task events clear and set TraceEn around every
//! switch of a traced task, which shows the same way (FUP + TIP.PGD … TIP.PGE). Consecutive
//! regions of one thread stay together, with the bytes between them, as one *piece*.
//!
//! **Which thread.** Each region gets a TSC range it certainly lies in: the TSC packets inside
//! it (user time of its thread), else the last TSC before it and the first after it (the
//! TSC that TraceEn 0→1 emits when perf's per-task event is scheduled in lands there). The
//! [`Schedule`] gives every thread that may have run on that CPU during the range; the region is
//! attributed when exactly one thread of a traced process (the workload's pid, the pids of
//! ITRACE_START records and their FORK descendants) remains. Otherwise — no switch record
//! covers the range, several threads could have run, or sideband was lost — the region is
//! *unattributed*: counted in [`SplitReport`] with the reason, never given to a thread.
//! MTCs narrow the ranges where the recording's timing parameters make them usable (the
//! TSC:CTC ratio of the AUXTRACE_INFO, an MTC period of at most 8; `MtcBounds`): each MTC's
//! time follows from the last TSC and its TMA, so the MTCs inside a region, or the last before
//! and the first after it, widened by one MTC period, bound it where no TSC does — in a
//! CPU-wide recording (TraceEn set once, a TSC only in each PSB+) the MTCs the processor sends
//! in the kernel between two threads' regions are what tells them apart. An overflow or a gap
//! breaks MTC continuity: no MTC time until the next TSC and TMA. CYC is not used.
//!
//! **Each piece decodes on its own.** A piece starts with a synthetic PSB+ carrying the state
//! the decoder needs at the cut: MODE.Exec, CBR, the time (the last TSC with the TMA after it
//! and the MTCs since — thinned so that no 8-bit MTC wrap is lost — or, when the thread's
//! switch-in is later than that TSC, a TSC of the switch-in time), then the opening TIP.PGE
//! (or the FUP after an OVF, inside the PSB+) re-encoded with its full IP, then the original
//! bytes after it. Why that is exact:
//!
//! * *Last IP* (SDM "IP Compression"): the processor compresses an IP against the last IP
//!   it sent, and a PSB resets that to 0. The opening packet's payload may be compressed
//!   against the previous thread's last IP, so it is re-encoded against the PSB's zero; after
//!   it the decoder's last IP is the same full address the original decoder had after the
//!   original packet, so every later compressed IP of the piece reconstructs identically.
//! * *RET compression* (SDM "Indirect Transfer Compression for Returns"): the processor
//!   compresses only RETs whose CALL was traced after the last PSB, with no overflow and no
//!   PacketEn = 0 period in between. Every cut is in a PacketEn = 0 period, so no compressed
//!   RET of a piece refers to a CALL before it; the decoder clears its return stack at the
//!   piece's PSB (as libipt and perf do at every PSB) and loses nothing.
//! * *Timing*: TMA always directly follows its TSC (SDM), so the pair is copied as it was;
//!   MTCs count the crystal clock modulo 256 periods, and the kept MTCs are close enough for
//!   every step to stay below 256.
//!
//! A region cut short (an invalid packet, an AUX gap, the end of the data, an OVF) ends its
//! piece with an OVF, so the thread's decoder sees the loss and resynchronises at the next
//! piece's PSB.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use super::{ChunkBoundary, TraceStream, TraceStreams};
use crate::packet::time::{TimeState, TimingConfig};
use crate::packet::{Encoder, IpKind, LastIp, Packet, PacketDecoder};
use crate::perf::data::{DataLoss, Schedule, SwitchKind, SwitchScan, TscConversion};

const TSC_MASK: u64 = (1 << 56) - 1;

/// Why a region of a CPU's stream was given to no thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unattributed {
    /// No switch record covers its time: no traced thread is known to have run then.
    NoRecord,
    /// Several traced threads may have run during its time range (`(pid, tid)`).
    Ambiguous(Vec<(u32, u32)>),
    /// Switch records were lost around its time.
    LostSideband,
    /// Its opening IP cannot be reconstructed (a compressed IP with no PSB before it).
    NoIp,
}

impl std::fmt::Display for Unattributed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unattributed::NoRecord => write!(f, "no context-switch record covers its time"),
            Unattributed::Ambiguous(threads) => {
                let tids: Vec<String> = threads.iter().map(|t| t.1.to_string()).collect();
                write!(f, "threads {} may each have run then", tids.join(", "))
            }
            Unattributed::LostSideband => write!(f, "sideband records were lost around it"),
            Unattributed::NoIp => write!(f, "its first IP cannot be reconstructed"),
        }
    }
}

/// A region of a CPU's stream that no thread got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnattributedRegion {
    /// The CPU.
    pub cpu: u32,
    /// Offsets in the CPU's stream.
    pub from: u64,
    /// End offset (exclusive).
    pub to: u64,
    /// Why.
    pub why: Unattributed,
}

/// What [`split_per_cpu`] could not attribute or read, and what it did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitReport {
    /// Regions (PacketEn = 1 stretches) found in all CPU streams.
    pub regions: u64,
    /// Regions given to a thread.
    pub attributed: u64,
    /// Regions given to no thread, with the reason.
    pub unattributed: Vec<UnattributedRegion>,
    /// Places where a CPU's stream could not be read on (`(cpu, offset, what)`: an invalid
    /// packet, a truncated packet, an AUX gap); reading resumed at the next PSB.
    pub damage: Vec<(u32, u64, String)>,
    /// OVF packets (the processor lost trace data).
    pub overflows: u64,
    /// Bytes of the CPU streams skipped before their first PSB or after damage.
    pub skipped_bytes: u64,
    /// Switch records that could not be placed (no time, CPU or thread in their sample_id).
    pub unplaced_switches: usize,
    /// Switch records out of time order on their CPU (see [`Schedule::out_of_order`]).
    pub out_of_order_switches: usize,
    /// Switch records that contradict the records before them ([`Schedule::inconsistent`]).
    pub inconsistent_switches: usize,
    /// Lost sideband records (`PERF_RECORD_LOST`).
    pub lost_sideband: u64,
}

impl SplitReport {
    /// One line per kind of problem, for a user (empty when there is none).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.unattributed.is_empty() {
            let mut by_reason: BTreeMap<String, (usize, u64)> = BTreeMap::new();
            for u in &self.unattributed {
                let e = by_reason.entry(u.why.to_string()).or_default();
                e.0 += 1;
                e.1 += u.to - u.from;
            }
            for (why, (n, bytes)) in by_reason {
                out.push(format!(
                    "{n} region(s) of the per-CPU trace ({bytes} bytes) given to no thread: {why}"
                ));
            }
        }
        for (cpu, offset, what) in &self.damage {
            out.push(format!("cpu{cpu} stream offset {offset:#x}: {what}"));
        }
        if self.overflows > 0 {
            out.push(format!(
                "{} overflow(s) (OVF): the processor lost trace data there",
                self.overflows
            ));
        }
        if self.unplaced_switches > 0 {
            out.push(format!(
                "{} context-switch record(s) without time, CPU or thread ignored",
                self.unplaced_switches
            ));
        }
        if self.out_of_order_switches > 0 {
            out.push(format!(
                "{} context-switch record(s) out of time order on their CPU (sorted)",
                self.out_of_order_switches
            ));
        }
        if self.inconsistent_switches > 0 {
            out.push(format!(
                "{} context-switch record(s) contradict the records before them",
                self.inconsistent_switches
            ));
        }
        if self.lost_sideband > 0 {
            out.push(format!(
                "{} sideband record(s) lost by the kernel",
                self.lost_sideband
            ));
        }
        out
    }
}

/// Where one piece of a thread's stream came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The CPU.
    pub cpu: u32,
    /// First byte of the CPU stream copied (after the re-encoded opening packet).
    pub from: u64,
    /// End of the copied bytes in the CPU stream (exclusive).
    pub to: u64,
    /// Offset of the piece (its synthetic PSB+) in the thread's stream.
    pub stream_offset: u64,
    /// Regions of the CPU stream in the piece.
    pub regions: u64,
}

/// One thread's stream made of its pieces of the CPU streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitThread {
    /// The thread's process.
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// The stream (label `tidN`, no CPU).
    pub stream: TraceStream<'static>,
    /// Its pieces, in stream order.
    pub pieces: Vec<Piece>,
}

/// The result of [`split_per_cpu`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadSplit {
    /// The threads, by thread id.
    pub threads: Vec<SplitThread>,
    /// What was not attributed or not readable.
    pub report: SplitReport,
}

/// Why per-CPU streams cannot be split at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// There is no stream with a CPU.
    #[error("the trace has no per-CPU stream")]
    NotPerCpu,
    /// No perf time ↔ TSC conversion (AUXTRACE_INFO without `cap_user_time_zero`, no
    /// TIME_CONV record): switch records cannot be compared with the trace's TSC packets.
    #[error(
        "the perf.data has no perf-time to TSC conversion (AUXTRACE_INFO time_zero or \
         TIME_CONV), so its context switches cannot be placed in the trace"
    )]
    NoConversion,
    /// No context-switch record at all (recorded without switch events, e.g. `perf record
    /// --no-switch-events` or an old kernel).
    #[error(
        "the perf.data has no context-switch records (PERF_RECORD_SWITCH_CPU_WIDE or \
         PERF_RECORD_SWITCH with a time and CPU: recorded without switch events?), so the \
         threads of its per-CPU streams cannot be told apart"
    )]
    NoSwitches,
}

/// How a region starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Opening {
    /// A TIP.PGE at this IP.
    Pge(u64),
    /// An OVF followed by a FUP at this IP: tracing resumed there.
    Fup(u64),
    /// A PSB+ with a FUP: copied as it is.
    Psb,
}

/// The decoder state a piece's synthetic PSB+ must restore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Timing {
    /// The last TSC (extended to 64 bits).
    tsc: Option<u64>,
    /// The TMA right after it.
    tma: Option<(u16, u16)>,
    /// MTCs since that TMA, thinned (see the module docs).
    mtcs: Vec<u8>,
    cbr: Option<u8>,
    mode: Option<Packet>,
}

impl Timing {
    fn mtc(&mut self, v: u8) {
        if self.tma.is_none() {
            return;
        }
        let n = self.mtcs.len();
        if n >= 2 {
            let (a, b) = (self.mtcs[n - 2], self.mtcs[n - 1]);
            // `b` can go when the step a → v is the sum of a → b → v (no wrap lost).
            let (ab, bv) = (b.wrapping_sub(a) as u32, v.wrapping_sub(b) as u32);
            if ab + bv < 256 {
                self.mtcs[n - 1] = v;
                return;
            }
        }
        self.mtcs.push(v);
    }
}

/// One PacketEn = 1 stretch of a CPU stream.
#[derive(Debug, Clone)]
pub(super) struct Region {
    pub(super) opening: Opening,
    /// Offset of the opening packet (the PSB for [`Opening::Psb`]).
    pub(super) start: u64,
    /// First byte copied verbatim: after the opening packet, or the PSB itself.
    pub(super) body: u64,
    /// End (exclusive): after the TIP.PGD, the OVF, or where damage cut it.
    pub(super) end: u64,
    /// Whether it was cut short by damage (its piece gets an OVF appended).
    cut: bool,
    /// The decoder state at the opening packet.
    timing: Timing,
    /// TSCs inside the region: first and last.
    inside: Option<(u64, u64)>,
    /// The last TSC before the region and the first after it.
    before: Option<u64>,
    after: Option<u64>,
    /// The same from MTCs (their times from the last TSC and its TMA; see
    /// [`MtcBounds`]): the first and last inside, the last before, the first after.
    mtc_inside: Option<(u64, u64)>,
    mtc_before: Option<u64>,
    mtc_after: Option<u64>,
}

/// How MTC packets narrow a region's time range: each MTC's time follows from the last TSC,
/// its TMA and the MTCs since (`packet::time`, reference §4.3), accurate to within
/// `slack` TSC ticks (one MTC period: the packet goes out at its crystal-clock tick, and the
/// conversion rounds). MTCs are sent while tracing is on, also while packet generation is off
/// in the kernel — exactly where threads switch, so an MTC there separates the regions before
/// and after the switch where the next TSC may be far away (a CPU-wide recording sets TraceEn
/// once; only its PSBs carry TSCs).
#[derive(Debug, Clone, Copy)]
pub(super) struct MtcBounds {
    pub(super) slack: u64,
}

impl MtcBounds {
    /// The bounds for a recording's timing parameters, or `None` when its MTCs give no time:
    /// no TSC:CTC ratio, or an MTC period N above 8 (a TMA then lacks CTC bits an MTC needs,
    /// which only a guess would supply).
    pub(super) fn new(timing: &TimingConfig) -> Option<Self> {
        if timing.mtc_freq > 8 {
            return None;
        }
        let slack = TimeState::new(*timing).mtc_period_ticks();
        (slack > 0).then_some(MtcBounds { slack })
    }
}

/// Reads one CPU stream into regions.
pub(super) struct Scanner<'a> {
    data: &'a [u8],
    pub(super) regions: Vec<Region>,
    /// Every TSC packet: its offset and extended value (for the exec cut, `super::exec_cut`).
    pub(super) tscs: Vec<(u64, u64)>,
    /// Every MTC that gave a time (with an MTC model): its offset and time.
    pub(super) mtcs: Vec<(u64, u64)>,
    /// Every PSB+ without a FUP (tracing off at it): the PSB's offset and the end of its
    /// PSBEND.
    pub(super) bare_psbs: Vec<(u64, u64)>,
    /// The open region, if PacketEn = 1.
    open: Option<Region>,
    last_ip: LastIp,
    timing: Timing,
    /// Extended TSC of the last TSC packet (also across segments: a lower bound).
    last_tsc: Option<u64>,
    /// The time model of the MTCs (`None`: they are not used).
    mtc: Option<(MtcBounds, TimeState)>,
    /// Time of the last MTC that gave one (a lower bound for what follows, as `last_tsc`).
    last_mtc_time: Option<u64>,
    /// Regions still waiting for their first MTC time after them.
    waiting_mtc_after: usize,
    /// Inside PSB+: its start, the FUP it had, the TSC it had.
    psb: Option<(u64, Option<u64>, Option<u64>)>,
    /// After an OVF, until tracing resumes.
    after_ovf: bool,
    /// Regions still waiting for their first TSC after them.
    waiting_after: usize,
    previous_was_tsc: bool,
    cpu: u32,
    report: SplitReport,
}

impl<'a> Scanner<'a> {
    /// A scanner of CPU `cpu`'s stream `data`; `tsc_hint` gives the top bits of its first TSC;
    /// `timing` lets MTCs narrow region times where it makes them usable ([`MtcBounds`]).
    pub(super) fn new(cpu: u32, data: &'a [u8], tsc_hint: u64, timing: &TimingConfig) -> Self {
        Scanner {
            mtc: MtcBounds::new(timing).map(|b| (b, TimeState::new(*timing))),
            last_mtc_time: None,
            waiting_mtc_after: 0,
            data,
            regions: Vec::new(),
            tscs: Vec::new(),
            mtcs: Vec::new(),
            bare_psbs: Vec::new(),
            open: None,
            last_ip: LastIp::new(),
            timing: Timing::default(),
            last_tsc: Some(tsc_hint & !TSC_MASK).filter(|&t| t != 0),
            psb: None,
            after_ovf: false,
            waiting_after: 0,
            previous_was_tsc: false,
            cpu,
            report: SplitReport::default(),
        }
    }

    fn extend_tsc(&self, low: u64) -> u64 {
        crate::packet::extend_tsc(self.last_tsc, low)
    }

    fn open_region(&mut self, opening: Opening, start: u64, body: u64) {
        let mut timing = self.timing.clone();
        timing.tsc = self.last_tsc;
        self.open = Some(Region {
            opening,
            start,
            body,
            end: body,
            cut: false,
            timing,
            inside: None,
            before: self.last_tsc,
            after: None,
            mtc_inside: None,
            mtc_before: self.last_mtc_time,
            mtc_after: None,
        });
    }

    fn close_region(&mut self, end: u64, cut: bool) {
        if let Some(mut r) = self.open.take() {
            r.end = end.max(r.body);
            r.cut = cut;
            self.regions.push(r);
        }
    }

    /// An MTC (value `v`): its time, where the model gives one, bounds the open region from
    /// inside and the closed ones still waiting from after.
    fn mtc_seen(&mut self, off: u64, v: u8) {
        let Some((_, time)) = &mut self.mtc else {
            return;
        };
        if !time.mtc_anchored() {
            return;
        }
        time.mtc(v);
        let t = time.now();
        self.last_mtc_time = Some(t);
        self.mtcs.push((off, t));
        if let Some(r) = &mut self.open {
            r.mtc_inside = Some(r.mtc_inside.map_or((t, t), |(a, _)| (a, t)));
        }
        for r in &mut self.regions[self.waiting_mtc_after..] {
            r.mtc_after.get_or_insert(t);
        }
        self.waiting_mtc_after = self.regions.len();
    }

    /// MTC continuity is lost (an overflow, damage, a gap): no MTC time until the next TSC
    /// and TMA.
    fn lose_mtc_anchor(&mut self) {
        if let Some((_, time)) = &mut self.mtc {
            time.lose_anchor();
        }
    }

    fn tsc_seen(&mut self, t: u64) {
        for r in &mut self.regions[self.waiting_after..] {
            r.after.get_or_insert(t);
        }
        self.waiting_after = self.regions.len();
    }

    /// Scans `data[from..to]` (one stretch without AUX gaps).
    pub(super) fn scan(&mut self, from: usize, to: usize) {
        let base = from as u64;
        let mut dec = PacketDecoder::with_base_offset(&self.data[from..to], base);
        // Decoding starts at a PSB: before one, Last IP and the packet boundaries are unknown.
        let start = dec.sync_forward();
        let first = start.map_or(to as u64, |s| s);
        self.report.skipped_bytes += first - base;
        self.last_ip = LastIp::new();
        self.timing.tma = None;
        self.timing.mtcs.clear();
        self.lose_mtc_anchor();
        self.after_ovf = false;
        self.psb = None;
        while let Some(item) = dec.next_packet() {
            let (off, p) = match item {
                Ok(x) => x,
                Err(e) => {
                    let at = e.to_string();
                    let off = match e {
                        crate::packet::PacketError::Truncated { offset, .. }
                        | crate::packet::PacketError::Invalid { offset, .. } => offset,
                    };
                    self.report.damage.push((self.cpu, off, at));
                    self.close_region(off, true);
                    self.psb = None;
                    let resumed = dec.sync_forward();
                    self.report.skipped_bytes += resumed.unwrap_or(to as u64) - off;
                    self.last_ip = LastIp::new();
                    self.timing.tma = None;
                    self.timing.mtcs.clear();
                    self.lose_mtc_anchor();
                    continue;
                }
            };
            let next = dec.offset();
            // PAD may stand between a TSC and its TMA (the processor pads PSB+ packets).
            let was_tsc = match p {
                Packet::Pad => self.previous_was_tsc,
                _ => std::mem::replace(&mut self.previous_was_tsc, false),
            };
            match p {
                Packet::Psb => {
                    self.last_ip.reset();
                    self.psb = Some((off, None, None));
                }
                Packet::PsbEnd => {
                    if let Some((psb_off, fup, tsc)) = self.psb.take() {
                        if fup.is_none() {
                            self.bare_psbs.push((psb_off, next));
                        }
                        match (fup, self.open.is_some()) {
                            (Some(_), true) => {
                                if let Some(t) = tsc {
                                    self.inside(t);
                                }
                            }
                            (Some(_), false) => {
                                // Tracing is on at the PSB: the region starts with it.
                                self.open_region(Opening::Psb, psb_off, psb_off);
                                if let Some(r) = &mut self.open {
                                    r.timing = Timing::default();
                                    r.before = tsc.or(r.before);
                                }
                                if let Some(t) = tsc {
                                    self.inside(t);
                                }
                                self.after_ovf = false;
                            }
                            (None, true) => {
                                // Tracing went off without a TIP.PGD (a lost one).
                                self.close_region(psb_off, false);
                                if let Some(t) = tsc {
                                    self.tsc_seen(t);
                                }
                            }
                            (None, false) => {
                                if let Some(t) = tsc {
                                    self.tsc_seen(t);
                                }
                            }
                        }
                    }
                }
                Packet::Fup(pl) => {
                    let ip = self.last_ip.apply(pl).ok().flatten();
                    if let Some(psb) = &mut self.psb {
                        psb.1 = ip.or(Some(0));
                    } else if self.after_ovf && self.open.is_none() {
                        self.after_ovf = false;
                        match ip {
                            Some(ip) => self.open_region(Opening::Fup(ip), off, next),
                            None => self.unreadable_opening(off),
                        }
                    }
                }
                Packet::TipPge(pl) => {
                    let ip = self.last_ip.apply(pl).ok().flatten();
                    self.close_region(off, false);
                    self.after_ovf = false;
                    match ip {
                        Some(ip) => self.open_region(Opening::Pge(ip), off, next),
                        None => self.unreadable_opening(off),
                    }
                }
                Packet::TipPgd(pl) => {
                    let _ = self.last_ip.apply(pl);
                    self.close_region(next, false);
                }
                Packet::Tip(pl) => {
                    let _ = self.last_ip.apply(pl);
                }
                Packet::Ovf => {
                    self.report.overflows += 1;
                    self.close_region(next, false);
                    self.last_ip = LastIp::new();
                    self.after_ovf = true;
                    self.timing.tma = None;
                    self.timing.mtcs.clear();
                    self.lose_mtc_anchor();
                }
                Packet::Tsc { tsc } => {
                    let t = self.extend_tsc(tsc);
                    self.last_tsc = Some(t);
                    self.tscs.push((off, t));
                    self.timing.tma = None;
                    self.timing.mtcs.clear();
                    if let Some((_, time)) = &mut self.mtc {
                        time.tsc_extended(t);
                    }
                    self.previous_was_tsc = true;
                    if let Some(psb) = &mut self.psb {
                        psb.2 = Some(t);
                    } else if self.open.is_some() {
                        self.inside(t);
                    } else {
                        self.tsc_seen(t);
                    }
                }
                Packet::Tma { ctc, fc } if was_tsc => {
                    self.timing.tma = Some((ctc, fc));
                    if let Some((_, time)) = &mut self.mtc {
                        time.tma(ctc, fc);
                    }
                }
                Packet::Mtc { ctc } => {
                    self.timing.mtc(ctc);
                    self.mtc_seen(off, ctc);
                }
                Packet::Cbr { ratio } => self.timing.cbr = Some(ratio),
                Packet::ModeExec { .. } => self.timing.mode = Some(p),
                _ => {}
            }
        }
        // The end of the stretch (an AUX gap or the end of the data) cuts an open region.
        let cut = to < self.data.len();
        self.close_region(to as u64, cut);
        if cut {
            self.report
                .damage
                .push((self.cpu, to as u64, "AUX data lost here (gap)".to_string()));
        }
    }

    fn inside(&mut self, t: u64) {
        if let Some(r) = &mut self.open {
            r.inside = Some(r.inside.map_or((t, t), |(a, _)| (a, t)));
        }
    }

    fn unreadable_opening(&mut self, off: u64) {
        self.report.unattributed.push(UnattributedRegion {
            cpu: self.cpu,
            from: off,
            to: off,
            why: Unattributed::NoIp,
        });
        self.report.regions += 1;
    }
}

/// An attributed run of regions of one CPU, before it is put into its thread's stream.
struct PendingPiece {
    thread: (u32, u32),
    cpu: u32,
    /// Start of the thread's run on the CPU (TSC; 0 when unknown), for ordering and time.
    run_start: u64,
    first: Region,
    end: u64,
    cut: bool,
    /// The largest TSC inside the piece.
    max_tsc: Option<u64>,
    regions: u64,
    cpu_stream: usize,
}

/// Splits the per-CPU streams of `source` into one stream per thread, by `scan`'s context
/// switches (see the module docs). Streams without a CPU are left out. Fails only when the
/// split cannot be made at all; everything not attributed is in [`ThreadSplit::report`].
pub fn split_per_cpu(
    source: &TraceStreams<'_>,
    scan: &SwitchScan,
) -> Result<ThreadSplit, SplitError> {
    let cpu_streams: Vec<(usize, u32)> = source
        .streams
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((i, s.cpu?)))
        .collect();
    if cpu_streams.is_empty() {
        return Err(SplitError::NotPerCpu);
    }
    let conv: TscConversion = scan.conversion.ok_or(SplitError::NoConversion)?;
    // ITRACE_START alone says who ran when tracing started, not when that thread stopped:
    // without switch records nothing ends a run.
    if !scan
        .switches
        .iter()
        .any(|s| s.kind != SwitchKind::ItraceStart)
    {
        return Err(SplitError::NoSwitches);
    }
    let schedule = Schedule::new(scan, &conv);
    let timing = source
        .perf
        .as_ref()
        .map_or_else(TimingConfig::default, |p| p.timing());
    let mtc = MtcBounds::new(&timing);
    let traced = traced_pids(source, scan);
    let mut report = SplitReport {
        unplaced_switches: scan.unplaced.len(),
        out_of_order_switches: schedule.out_of_order.len(),
        inconsistent_switches: schedule.inconsistent.len(),
        lost_sideband: scan.lost.iter().map(|l| l.lost.max(1)).sum(),
        ..SplitReport::default()
    };
    let mut pending: Vec<PendingPiece> = Vec::new();
    for &(index, cpu) in &cpu_streams {
        let stream = &source.streams[index];
        let hint = scan
            .switches
            .iter()
            .find(|s| s.cpu == cpu)
            .map_or(0, |s| conv.perf_time_to_tsc(s.time));
        let mut scanner = Scanner::new(cpu, &stream.data, hint, &timing);
        // AUX gaps split the stream into stretches read separately.
        let mut cuts: Vec<usize> = stream
            .losses
            .iter()
            .filter_map(|l| l.stream_offset)
            .filter(|&o| o > 0 && (o as usize) < stream.data.len())
            .map(|o| o as usize)
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut from = 0usize;
        for to in cuts.into_iter().chain([stream.data.len()]) {
            scanner.scan(from, to);
            from = to;
        }
        merge_report(&mut report, scanner.report);
        let mut current: Option<PendingPiece> = None;
        for region in scanner.regions {
            report.regions += 1;
            let attribution = attribute(&schedule, cpu, &region, traced.as_ref(), mtc);
            let (thread, run_start) = match attribution {
                Ok(x) => x,
                Err(why) => {
                    report.unattributed.push(UnattributedRegion {
                        cpu,
                        from: region.start,
                        to: region.end,
                        why,
                    });
                    if let Some(p) = current.take() {
                        pending.push(p);
                    }
                    continue;
                }
            };
            report.attributed += 1;
            let max_in = region.inside.map(|(_, b)| b);
            match &mut current {
                Some(p) if p.thread == thread && !p.cut => {
                    p.end = region.end;
                    p.cut = region.cut;
                    p.max_tsc = p.max_tsc.max(max_in);
                    p.regions += 1;
                }
                _ => {
                    if let Some(p) = current.take() {
                        pending.push(p);
                    }
                    current = Some(PendingPiece {
                        thread,
                        cpu,
                        run_start,
                        end: region.end,
                        cut: region.cut,
                        max_tsc: max_in,
                        regions: 1,
                        first: region,
                        cpu_stream: index,
                    });
                }
            }
        }
        if let Some(p) = current.take() {
            pending.push(p);
        }
    }
    // A thread runs on one CPU at a time: its runs on different CPUs are disjoint in time, so
    // ordering pieces by the start of their run (then by position in their CPU's stream)
    // puts them in execution order.
    pending.sort_by_key(|p| (p.thread.1, p.run_start, p.cpu, p.first.start));
    let mut threads: Vec<SplitThread> = Vec::new();
    let mut floor = 0u64;
    for p in pending {
        if threads.last().is_none_or(|t| t.tid != p.thread.1) {
            threads.push(SplitThread {
                pid: p.thread.0,
                tid: p.thread.1,
                stream: TraceStream {
                    label: format!("tid{}", p.thread.1),
                    cpu: None,
                    tid: Some(p.thread.1),
                    data: Cow::Owned(Vec::new()),
                    chunks: Vec::new(),
                    losses: Vec::new(),
                },
                pieces: Vec::new(),
            });
            floor = 0;
        }
        let Some(t) = threads.last_mut() else {
            continue;
        };
        floor = append_piece(t, &p, &source.streams[p.cpu_stream], floor);
    }
    Ok(ThreadSplit { threads, report })
}

fn merge_report(into: &mut SplitReport, from: SplitReport) {
    into.regions += from.regions;
    into.unattributed.extend(from.unattributed);
    into.damage.extend(from.damage);
    into.overflows += from.overflows;
    into.skipped_bytes += from.skipped_bytes;
}

/// The processes whose threads the trace can show: with a per-task recording (perf writes
/// the workload's pid as the tid of a per-CPU AUXTRACE record), that pid, the pids of the
/// ITRACE_START records and, through FORK records, their descendants. `None` (every process)
/// for a CPU-wide recording.
fn traced_pids(source: &TraceStreams<'_>, scan: &SwitchScan) -> Option<BTreeSet<u32>> {
    let mut pids: BTreeSet<u32> = source
        .streams
        .iter()
        .filter(|s| s.cpu.is_some())
        .filter_map(|s| s.tid)
        .collect();
    if pids.is_empty() {
        return None;
    }
    pids.extend(
        scan.switches
            .iter()
            .filter(|s| s.kind == SwitchKind::ItraceStart)
            .map(|s| s.pid),
    );
    loop {
        let before = pids.len();
        for &(pid, ppid) in &scan.forks {
            if pids.contains(&ppid) {
                pids.insert(pid);
            }
        }
        if pids.len() == before {
            break;
        }
    }
    Some(pids)
}

/// The TSC range `region` certainly lies in, or at least meets (an instant inside it):
/// the TSCs inside it; else the MTC times inside it, widened by the MTC slack; else the
/// latest of the last TSC and the last MTC time (less the slack) before it, to the earliest
/// of the first TSC and the first MTC time (plus the slack) after it. Any of these contains
/// an instant of the region, so a thread whose run does not meet it did not run the region;
/// the narrower, the fewer threads meet it.
fn time_range(region: &Region, mtc: Option<MtcBounds>) -> (u64, u64) {
    if let Some(range) = region.inside {
        return range;
    }
    let slack = mtc.map(|m| m.slack);
    if let (Some(slack), Some((a, b))) = (slack, region.mtc_inside) {
        return (a.saturating_sub(slack), b.saturating_add(slack));
    }
    let mut lo = region.before.unwrap_or(0);
    let mut hi = region.after.unwrap_or(u64::MAX);
    if let Some(slack) = slack {
        if let Some(t) = region.mtc_before {
            lo = lo.max(t.saturating_sub(slack));
        }
        if let Some(t) = region.mtc_after {
            hi = hi.min(t.saturating_add(slack));
        }
    }
    (lo, hi.max(lo))
}

/// The thread of `region` and the start of its run, or why there is none.
fn attribute(
    schedule: &Schedule,
    cpu: u32,
    region: &Region,
    traced: Option<&BTreeSet<u32>>,
    mtc: Option<MtcBounds>,
) -> Result<((u32, u32), u64), Unattributed> {
    let (lo, hi) = time_range(region, mtc);
    let mut found: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    let mut unknown = false;
    for run in schedule.runs_during(cpu, lo, hi) {
        match run.thread {
            None => unknown = true,
            Some((_, u32::MAX)) => unknown = true,
            // The idle task runs no user code.
            Some((_, 0)) => {}
            Some(t) if traced.is_none_or(|p| p.contains(&t.0)) => {
                let start = found.entry(t).or_insert(run.start);
                *start = (*start).min(run.start);
            }
            Some(_) => {}
        }
    }
    if unknown {
        return Err(Unattributed::LostSideband);
    }
    let mut it = found.into_iter();
    match (it.next(), it.next()) {
        (None, _) => Err(Unattributed::NoRecord),
        (Some(one), None) => Ok(one),
        (Some(a), Some(b)) => {
            let mut all = vec![a.0, b.0];
            all.extend(it.map(|(t, _)| t));
            Err(Unattributed::Ambiguous(all))
        }
    }
}

/// Appends piece `p` (of CPU stream `cpu_stream`) to thread `t`'s stream: the synthetic
/// PSB+, the re-encoded opening, the original bytes, and an OVF if it was cut short.
/// `floor` is the latest time of the thread's pieces before (its time must not go back from
/// one piece to the next: its global order assumes its own times never decrease); returns the
/// latest time after this piece.
fn append_piece(
    t: &mut SplitThread,
    p: &PendingPiece,
    cpu_stream: &TraceStream<'_>,
    floor: u64,
) -> u64 {
    let out = t.stream.data.to_mut();
    let piece_offset = out.len() as u64;
    let mut latest = floor;
    let r = &p.first;
    let mut enc = Encoder::new();
    if let Some(tsc) = write_opening(out, r, p.run_start.max(floor)) {
        latest = latest.max(tsc);
    }
    let body_offset = out.len() as u64;
    let (from, to) = (r.body as usize, (p.end as usize).min(cpu_stream.data.len()));
    out.extend_from_slice(&cpu_stream.data[from.min(to)..to]);
    if p.cut {
        let _ = enc.packet(&Packet::Ovf, out);
    }
    let end_offset = out.len() as u64;
    // Where the copied bytes are in the file.
    for c in &cpu_stream.chunks {
        let (lo, hi) = (
            c.stream_offset.max(from as u64),
            (c.stream_offset + c.size).min(to as u64),
        );
        if lo < hi {
            t.stream.chunks.push(ChunkBoundary {
                stream_offset: body_offset + (lo - from as u64),
                file_offset: c.file_offset + (lo - c.stream_offset),
                aux_offset: c.aux_offset.map(|a| a + (lo - c.stream_offset)),
                size: hi - lo,
            });
        }
    }
    // A cut at an AUX loss keeps the loss, now at the end of the piece.
    if p.cut {
        for loss in &cpu_stream.losses {
            if loss.stream_offset == Some(p.end) {
                t.stream.losses.push(DataLoss {
                    stream_offset: Some(end_offset),
                    ..*loss
                });
            }
        }
    }
    t.pieces.push(Piece {
        cpu: p.cpu,
        from: from as u64,
        to: to as u64,
        stream_offset: piece_offset,
        regions: p.regions,
    });
    latest.max(p.max_tsc.unwrap_or(0))
}

/// Writes the synthetic PSB+ and re-encoded opening packet that let region `r` decode on its
/// own (see the module docs); nothing for a region that opens with its own PSB+. `bound`: the
/// earliest time the region can have started (the thread's switch-in, the latest time of the
/// thread's earlier pieces; 0 when unknown). Returns the time written, if any.
pub(super) fn write_opening(out: &mut Vec<u8>, r: &Region, bound: u64) -> Option<u64> {
    if r.opening == Opening::Psb {
        return None;
    }
    let mut enc = Encoder::new();
    let timing = &r.timing;
    let mut written = None;
    enc.psb(out);
    if let Some(mode) = &timing.mode {
        let _ = enc.packet(mode, out);
    }
    if let Some(ratio) = timing.cbr {
        let _ = enc.packet(&Packet::Cbr { ratio }, out);
    }
    // The last TSC with its TMA and MTCs, unless the thread's switch-in (or its previous
    // piece) is later: then that time, alone (the MTCs after the stale TSC would count
    // from it). With an MTC model the MTCs since that TSC may reach past the bound: then they
    // are kept, since the time at the opening is theirs (a TSC of the bound, without a TMA,
    // would leave the piece's MTCs without time).
    let mtc_time = r
        .mtc_before
        .filter(|_| timing.tma.is_some() && !timing.mtcs.is_empty());
    let exact = timing
        .tsc
        .filter(|&tsc| tsc >= bound || mtc_time.is_some_and(|m| m >= bound));
    match exact {
        Some(tsc) => {
            written = Some(mtc_time.map_or(tsc, |m| m.max(tsc)));
            let _ = enc.packet(
                &Packet::Tsc {
                    tsc: tsc & TSC_MASK,
                },
                out,
            );
            if let Some((ctc, fc)) = timing.tma {
                let _ = enc.packet(&Packet::Tma { ctc, fc }, out);
            }
        }
        None if bound > 0 => {
            written = Some(bound);
            let _ = enc.packet(
                &Packet::Tsc {
                    tsc: bound & TSC_MASK,
                },
                out,
            );
        }
        None => {}
    }
    if let Opening::Fup(ip) = r.opening {
        let _ = enc.ip_packet(IpKind::Fup, Some(ip), out);
    }
    let _ = enc.packet(&Packet::PsbEnd, out);
    if exact.is_some() && timing.tma.is_some() {
        for &ctc in &timing.mtcs {
            let _ = enc.packet(&Packet::Mtc { ctc }, out);
        }
    }
    if let Opening::Pge(ip) = r.opening {
        let _ = enc.ip_packet(IpKind::TipPge, Some(ip), out);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A processor pads PSB+ packets: a PAD between a TSC and its TMA must not lose the TMA
    /// (nor, with it, the MTCs after it), or a piece's time falls back to the bare TSC.
    #[test]
    fn a_pad_between_tsc_and_tma_keeps_the_tma() {
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        enc.psb(&mut out);
        enc.packet(&Packet::Tsc { tsc: 1000 }, &mut out).unwrap();
        enc.packet(&Packet::Pad, &mut out).unwrap();
        enc.packet(&Packet::Tma { ctc: 7, fc: 3 }, &mut out)
            .unwrap();
        enc.packet(&Packet::PsbEnd, &mut out).unwrap();
        enc.packet(&Packet::Mtc { ctc: 9 }, &mut out).unwrap();
        enc.ip_packet(IpKind::TipPge, Some(0x1000), &mut out)
            .unwrap();
        enc.ip_packet(IpKind::TipPgd, None, &mut out).unwrap();
        let mut s = Scanner::new(0, &out, 0, &TimingConfig::default());
        s.scan(0, out.len());
        assert_eq!(s.regions.len(), 1);
        let t = &s.regions[0].timing;
        assert_eq!(t.tma, Some((7, 3)));
        assert_eq!(t.mtcs, [9]);
    }

    /// MTC times bound the regions around them, from the TSC and TMA before; an OVF breaks
    /// MTC continuity (the next MTC may have skipped any number of periods), so the MTCs
    /// after it give no time until the next TSC and TMA — a region there keeps only its TSC
    /// bounds rather than a wrong, narrower range.
    #[test]
    fn mtc_times_bound_regions_until_an_overflow() {
        let timing = TimingConfig {
            mtc_freq: 0,
            ctc_ratio: (2, 1),
            max_nonturbo_ratio: 0,
        };
        let region = |enc: &mut Encoder, out: &mut Vec<u8>| {
            enc.ip_packet(IpKind::TipPge, Some(0x1000), out).unwrap();
            enc.ip_packet(IpKind::TipPgd, None, out).unwrap();
        };
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        enc.psb(&mut out);
        enc.packet(&Packet::Tsc { tsc: 1000 }, &mut out).unwrap();
        enc.packet(&Packet::Tma { ctc: 500, fc: 0 }, &mut out)
            .unwrap();
        enc.packet(&Packet::PsbEnd, &mut out).unwrap();
        // CTC 510 (TSC 1020), the region, CTC 515 (TSC 1030).
        enc.packet(
            &Packet::Mtc {
                ctc: (510 % 256) as u8,
            },
            &mut out,
        )
        .unwrap();
        region(&mut enc, &mut out);
        enc.packet(
            &Packet::Mtc {
                ctc: (515 % 256) as u8,
            },
            &mut out,
        )
        .unwrap();
        enc.packet(&Packet::Ovf, &mut out).unwrap();
        enc.packet(&Packet::Mtc { ctc: 7 }, &mut out).unwrap();
        region(&mut enc, &mut out);
        enc.packet(&Packet::Mtc { ctc: 9 }, &mut out).unwrap();
        let mut s = Scanner::new(0, &out, 0, &timing);
        s.scan(0, out.len());
        assert_eq!(s.regions.len(), 2);
        let slack = MtcBounds::new(&timing).map(|m| m.slack);
        assert_eq!(slack, Some(2));
        let (a, b) = (&s.regions[0], &s.regions[1]);
        assert_eq!((a.mtc_before, a.mtc_after), (Some(1020), Some(1030)));
        assert_eq!(time_range(a, MtcBounds::new(&timing)), (1018, 1032));
        // After the OVF: the last good MTC time stays a lower bound; nothing after it counts.
        assert_eq!((b.mtc_before, b.mtc_after), (Some(1030), None));
        assert_eq!(time_range(b, MtcBounds::new(&timing)), (1028, u64::MAX));
        // Without the ratio the MTCs give no time at all.
        let none = TimingConfig {
            ctc_ratio: (0, 0),
            ..timing
        };
        assert!(MtcBounds::new(&none).is_none());
        let mut s = Scanner::new(0, &out, 0, &none);
        s.scan(0, out.len());
        assert!(
            s.regions
                .iter()
                .all(|r| r.mtc_before.is_none() && r.mtc_after.is_none())
        );
        assert_eq!(time_range(&s.regions[0], None), (1000, u64::MAX));
    }
}
