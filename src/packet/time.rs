//! Approximate timestamps from TSC, TMA, MTC, CYC and CBR packets (reference §4): the time
//! of the flow decoder's instructions and of `ptrewind view`, and the MTC times that narrow
//! where a region of a per-CPU stream lies (`store::percpu`, `store::exec_cut`).
//!
//! The model is deliberately simple and documented:
//!
//! * A TSC packet sets the time (its 56 bits are extended with the previous value's top byte,
//!   wrapping forward at 2^56).
//! * A TMA after it anchors the crystal clock: `base = TSC − FC − (CTC mod 2^N)·R`.
//! * Each MTC advances the crystal-clock count by `(v − last) mod 256` periods of 2^N CTC ticks and
//!   sets `time = base + ctc·R` (never backwards). Without a TMA or without the TSC:CTC ratio `R`
//!   the MTC is ignored.
//! * CYC packets add core cycles since the last TSC/MTC, converted to TSC ticks as
//!   `cycles · max_nonturbo_ratio / CBR` (the CBR estimate of §4.4 (a)).
//!
//! Instructions get the time current when the packet that explained them was read; so a run of
//! instructions between two timing packets shares one timestamp (resolution = MTC period, or CYC
//! granularity with cycle-accurate tracing).

/// Timing parameters from the recording (perf's AUXTRACE_INFO or sysfs).
#[derive(Debug, Clone, Copy)]
pub struct TimingConfig {
    /// MTCFreq N: an MTC every 2^N crystal-clock ticks.
    pub mtc_freq: u8,
    /// TSC ticks per crystal-clock tick as numerator / denominator (CPUID.15H EBX / EAX); a zero
    /// denominator disables MTC-based time.
    pub ctc_ratio: (u32, u32),
    /// Maximum non-turbo ratio (`MSR_PLATFORM_INFO[15:8]`); 0 disables CYC-based time.
    pub max_nonturbo_ratio: u8,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            mtc_freq: 3,
            ctc_ratio: (0, 0),
            max_nonturbo_ratio: 0,
        }
    }
}

/// The time state.
#[derive(Debug, Clone, Default)]
pub struct TimeState {
    cfg_mtc_freq: u8,
    ratio: (u32, u32),
    nonturbo: u8,
    tsc: u64,
    have_tsc: bool,
    /// TSC at the crystal-clock anchor, and CTC ticks counted since it.
    base: u64,
    ctc: u64,
    last_mtc: u8,
    have_tma: bool,
    /// Time at the last TSC/MTC.
    reference: u64,
    cycles: u64,
    cbr: u8,
    now: u64,
}

impl TimeState {
    /// A fresh state for `cfg`.
    pub fn new(cfg: TimingConfig) -> Self {
        TimeState {
            cfg_mtc_freq: cfg.mtc_freq.min(15),
            ratio: cfg.ctc_ratio,
            nonturbo: cfg.max_nonturbo_ratio,
            ..Default::default()
        }
    }

    /// The current estimate in TSC ticks.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        self.now
    }

    fn set(&mut self, t: u64) {
        self.reference = self.reference.max(t);
        self.cycles = 0;
        self.now = self.reference;
    }

    /// A TSC packet.
    pub fn tsc(&mut self, low56: u64) {
        let t = crate::packet::extend_tsc(self.have_tsc.then_some(self.tsc), low56);
        // A TSC is authoritative: the reference is reset even if it went back slightly.
        self.tsc_extended(t);
    }

    /// A TSC packet whose value the caller has already extended to 64 bits (with a hint of
    /// its own, e.g. perf's sample times).
    pub fn tsc_extended(&mut self, t: u64) {
        self.tsc = t;
        self.have_tsc = true;
        self.have_tma = false;
        self.reference = t;
        self.cycles = 0;
        self.now = t;
    }

    /// MTC continuity is lost (an overflow, a gap in the data): MTCs give no time until the
    /// next TSC and TMA.
    pub fn lose_anchor(&mut self) {
        self.have_tma = false;
    }

    /// Whether the next MTC gives a time (a TSC and its TMA were seen, the TSC:CTC ratio is
    /// known, and continuity was not lost since).
    pub fn mtc_anchored(&self) -> bool {
        self.have_tma
    }

    /// TSC ticks per MTC period (`2^N · R`, rounded up), 0 when MTCs give no time: how far the
    /// time of an MTC can be from the instant its packet was generated.
    pub fn mtc_period_ticks(&self) -> u64 {
        if self.ratio.1 == 0 {
            return 0;
        }
        ((self.ratio.0 as u64) << self.cfg_mtc_freq).div_ceil(self.ratio.1 as u64)
    }

    /// A TMA packet (directly after a TSC).
    pub fn tma(&mut self, ctc: u16, fc: u16) {
        if !self.have_tsc || self.ratio.1 == 0 {
            return;
        }
        let n = self.cfg_mtc_freq as u32;
        let rem = (ctc as u64) & ((1u64 << n) - 1);
        let r_ticks = rem * self.ratio.0 as u64 / self.ratio.1 as u64;
        self.base = self.tsc.saturating_sub(fc as u64).saturating_sub(r_ticks);
        self.last_mtc = ((ctc as u64 >> n) & 0xff) as u8;
        self.ctc = 0;
        self.have_tma = true;
    }

    /// An MTC packet.
    pub fn mtc(&mut self, v: u8) {
        if self.mtc_unsettled(v) {
            self.set(self.mtc_time());
        }
    }

    /// [`Self::mtc`] without the time computed: for a run of MTC and CYC packets read with
    /// nothing between them that needs the time, closed by [`Self::settle`]. `true` when the
    /// MTC moves the clock (it is anchored).
    #[inline(always)]
    pub fn mtc_unsettled(&mut self, v: u8) -> bool {
        if !self.have_tma {
            return false;
        }
        let d = v.wrapping_sub(self.last_mtc) as u64;
        self.last_mtc = v;
        self.ctc += d << self.cfg_mtc_freq;
        // What `set` does to the cycles; the rest waits for `settle`.
        self.cycles = 0;
        true
    }

    /// The time of the crystal-clock count so far.
    fn mtc_time(&self) -> u64 {
        self.base + self.ctc * self.ratio.0 as u64 / self.ratio.1.max(1) as u64
    }

    /// The time after a run of [`Self::mtc_unsettled`] and [`Self::cyc_unsettled`] calls
    /// (`mtc`: one of the MTCs moved the clock; `cyc`: there was a CYC): what the last of the
    /// equivalent [`Self::mtc`] and [`Self::cyc`] calls leaves. Only the last MTC's time is
    /// computed, because an MTC's time never decreases within a run (the count only grows),
    /// so it is the largest; the CYCs before it were reset by it. The divisions are then
    /// done once per run instead of once per packet.
    pub fn settle(&mut self, mtc: bool, cyc: bool) {
        if mtc {
            let cycles = self.cycles;
            self.set(self.mtc_time());
            self.cycles = cycles;
        }
        if cyc {
            self.apply_cycles();
        }
    }

    /// A CBR packet.
    pub fn cbr(&mut self, ratio: u8) {
        self.cbr = ratio;
    }

    /// A CYC packet.
    pub fn cyc(&mut self, cycles: u64) {
        self.cyc_unsettled(cycles);
        self.apply_cycles();
    }

    /// [`Self::cyc`] without the time computed (see [`Self::settle`]).
    #[inline(always)]
    pub fn cyc_unsettled(&mut self, cycles: u64) {
        self.cycles = self.cycles.saturating_add(cycles);
    }

    /// The time of the cycles counted since the last TSC or MTC.
    fn apply_cycles(&mut self) {
        if self.cbr != 0 && self.nonturbo != 0 {
            let ticks = self.cycles.saturating_mul(self.nonturbo as u64) / self.cbr as u64;
            self.now = self.reference.saturating_add(ticks);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs of MTC and CYC packets applied with `*_unsettled` and one `settle` give the time
    /// of the same packets applied one by one, with TSC, TMA and CBR packets between the runs
    /// (which leave MTCs unanchored, anchor them, and change the CYC conversion).
    #[test]
    fn settled_runs_equal_packet_by_packet() {
        let cfg = TimingConfig {
            mtc_freq: 3,
            ctc_ratio: (7, 3),
            max_nonturbo_ratio: 12,
        };
        let (mut each, mut runs) = (TimeState::new(cfg), TimeState::new(cfg));
        let mut rng = crate::test_rng::XorShift::new(0x2545_f491_4f6c_dd1d);
        let mut next = move |n: u64| rng.below(n);
        let mut tsc = 1_000_000u64;
        for round in 0..2_000 {
            match next(4) {
                0 => {
                    tsc += next(100_000);
                    each.tsc(tsc);
                    runs.tsc(tsc);
                }
                1 => {
                    let (ctc, fc) = (next(1 << 16) as u16, next(512) as u16);
                    each.tma(ctc, fc);
                    runs.tma(ctc, fc);
                }
                2 => {
                    let ratio = next(40) as u8;
                    each.cbr(ratio);
                    runs.cbr(ratio);
                }
                _ => {}
            }
            let (mut mtc, mut cyc) = (false, false);
            for _ in 0..next(12) {
                if next(2) == 0 {
                    let v = next(256) as u8;
                    each.mtc(v);
                    mtc |= runs.mtc_unsettled(v);
                } else {
                    let c = next(5_000);
                    each.cyc(c);
                    runs.cyc_unsettled(c);
                    cyc = true;
                }
            }
            runs.settle(mtc, cyc);
            assert_eq!(runs.now(), each.now(), "after run {round}");
        }
    }
}
