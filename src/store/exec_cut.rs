//! Where an `execve` falls in one thread's hardware trace, and a synthetic PSB+ there.
//!
//! A trace that crosses an `execve` ran two programs, often at the same addresses; its code is
//! an image per address space, each later one starting at the trace offset of a PSB
//! ([`crate::image::Image::push_period`]). The software and QEMU backends put a PSB+ right after
//! the system call. A processor does not: this module finds the place in a recorded thread
//! stream (perf per-thread mode, or a thread of [`super::percpu::split_per_cpu`]) and makes
//! one.
//!
//! **Where.** The exec runs in the kernel. With user-only tracing the stream shows the
//! `execve` as a TIP.PGD (PacketEn 1 → 0) and the new program's first instruction as the next
//! TIP.PGE; so the exec lies in one of the stream's *gaps* between two regions (PacketEn = 1
//! stretches, as [`super::percpu`] reads them; also before the first region or after the last).
//! The sideband gives its time: the `PERF_RECORD_COMM` with the exec flag, whose sample time
//! converted to TSC is `T`. A gap fits when the last TSC packet before it is at most `T` and
//! the first TSC packet after it (inside or after the next region) is at least `T`; where the
//! recording makes MTC times usable (`percpu::MtcBounds`), the last MTC before the gap less
//! one MTC period and the first after it plus one period narrow both sides the same way (CYC
//! is not used). Several gaps may fit — the gaps between the last timestamp before the exec
//! and the first after it — and then the exec is *ambiguous*: the thread's stream is cut
//! at the first gap that fits (everything before it certainly ran the old program) and the cut
//! is reported, never guessed.
//!
//! **The PSB.** The region after the exec's gap opens with a TIP.PGE whose IP may be
//! compressed against the old program's last IP. The stream is rewritten with a synthetic PSB+
//! (MODE.Exec, CBR, the last TSC with its TMA and MTCs) and the TIP.PGE re-encoded with its full
//! IP, exactly as the per-CPU split opens a piece (its module docs say why that is exact: the
//! cut is in a PacketEn = 0 period, so neither Last IP nor RET compression reaches across it).
//! Where a PSB+ without FUP already directly precedes the TIP.PGE (a piece of the per-CPU split
//! starts there), that PSB opens the period and nothing is inserted.

use super::percpu::{MtcBounds, Opening, Region, Scanner, write_opening};
use crate::packet::time::TimingConfig;

/// Where one exec was placed in a thread's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecPlace {
    /// Before the thread's first traced instruction: the whole stream is the new program's
    /// (or a later one's).
    BeforeTrace,
    /// After its last traced instruction: the whole stream is the old program's.
    AfterTrace,
    /// In a gap inside the stream: the new program's code starts at the PSB at this offset of
    /// [`ExecCut::data`].
    At {
        /// Offset of the PSB that opens the new address space.
        psb_offset: u64,
    },
    /// Several gaps fit its time and code (or none does: the times or mappings contradict
    /// each other): the stream was cut at [`ExecCut::truncated_at`].
    Ambiguous {
        /// How many gaps fit its time and the code on both sides.
        fitting: usize,
        /// How many gaps fit its time.
        by_time: usize,
    },
    /// The trace includes kernel code, so the exec lies inside a region (the kernel's
    /// `execve` and the return to the new program are traced without a gap), which TSC
    /// packets do not pin down: the stream was cut at [`ExecCut::truncated_at`].
    InKernelTrace,
}

/// A thread's stream rewritten with a PSB at each exec ([`cut_at_execs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecCut {
    /// The stream: the original bytes, a synthetic PSB+ where a period starts, cut short at an
    /// ambiguous exec.
    pub data: Vec<u8>,
    /// One place per exec, in the order they were given.
    pub places: Vec<ExecPlace>,
    /// Where the stream was cut because an exec could not be placed (its offset in `data`,
    /// i.e. `data.len()`), and how many bytes of the original were left out.
    pub truncated_at: Option<(u64, u64)>,
    /// The trace includes kernel code (a region opens at a kernel address).
    pub kernel: bool,
}

/// One exec to place: its time and what code each side of it had.
pub struct ExecAt<'f> {
    /// The exec's time (TSC).
    pub tsc: u64,
    /// Whether the program before the exec had code mapped at an address (its `MMAP` records).
    pub old_code: &'f dyn Fn(u64) -> bool,
    /// Whether the program after it had code mapped at an address.
    pub new_code: &'f dyn Fn(u64) -> bool,
    /// Whether the program before it had any user code mapped at all. Without, no user code
    /// of the trace can be its (the kernel's code is the same on both sides): the whole
    /// trace is the new program's, whatever the times say.
    pub old_has_code: bool,
}

impl std::fmt::Debug for ExecAt<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecAt").field("tsc", &self.tsc).finish()
    }
}

/// The first IP of a region, when it has one (a PSB+ with FUP: not kept).
fn opening_ip(r: &Region) -> Option<u64> {
    match r.opening {
        Opening::Pge(ip) | Opening::Fup(ip) => Some(ip),
        Opening::Psb => None,
    }
}

/// Whether an address is in the kernel half of the canonical address space.
fn is_kernel(ip: u64) -> bool {
    ip >> 63 == 1
}

/// Places `execs` in thread stream `data` (see the module docs). Execs are handled in time
/// order; after one that cannot be placed the stream ends, and later execs are
/// [`ExecPlace::AfterTrace`].
pub fn cut_at_execs(data: &[u8], execs: &[ExecAt<'_>], timing: &TimingConfig) -> ExecCut {
    let mut places = vec![ExecPlace::AfterTrace; execs.len()];
    if execs.is_empty() {
        return ExecCut {
            data: data.to_vec(),
            places,
            truncated_at: None,
            kernel: false,
        };
    }
    let hint = execs.iter().map(|e| e.tsc).min().unwrap_or(0);
    let mut scanner = Scanner::new(0, data, hint, timing);
    let slack = MtcBounds::new(timing).map(|m| m.slack);
    scanner.scan(0, data.len());
    let regions = &scanner.regions;
    let tscs = &scanner.tscs;
    let n = regions.len();
    // With kernel code in the trace the exec runs inside a region, not in a gap.
    let kernel = regions.iter().filter_map(opening_ip).any(is_kernel);
    // Gap i lies before region i (gap n after the last one). `lo`: the last TSC before it,
    // `hi`: the first TSC after it (TSCs inside the gap bound neither side of it).
    // MTC times narrow both, less and plus their slack (`percpu::MtcBounds`).
    let mtcs = &scanner.mtcs;
    let lo = |i: usize| -> Option<u64> {
        let end = regions[i.checked_sub(1)?].end;
        let k = tscs.partition_point(|&(off, _)| off < end);
        let tsc = k.checked_sub(1).map(|k| tscs[k].1);
        let k = mtcs.partition_point(|&(off, _)| off < end);
        let mtc = k
            .checked_sub(1)
            .zip(slack)
            .map(|(k, s)| mtcs[k].1.saturating_sub(s));
        tsc.max(mtc)
    };
    let hi = |i: usize| -> Option<u64> {
        let start = regions.get(i)?.start;
        let k = tscs.partition_point(|&(off, _)| off < start);
        let tsc = tscs.get(k).map(|t| t.1);
        let k = mtcs.partition_point(|&(off, _)| off < start);
        let mtc = mtcs.get(k).zip(slack).map(|(t, s)| t.1.saturating_add(s));
        [tsc, mtc].into_iter().flatten().min()
    };
    let bounds: Vec<(Option<u64>, Option<u64>)> = (0..=n).map(|i| (lo(i), hi(i))).collect();
    let mut order: Vec<usize> = (0..execs.len()).collect();
    order.sort_by_key(|&k| execs[k].tsc);
    // Regions that open a new address space, and the offset the stream is cut at.
    let mut opens: Vec<usize> = Vec::new();
    let mut cut_offset: Option<u64> = None;
    let mut opened_by: Vec<(usize, usize)> = Vec::new();
    for k in order {
        if cut_offset.is_some() {
            break;
        }
        let e = &execs[k];
        let t = e.tsc;
        if !e.old_has_code {
            // perf's usual recording: tracing starts at the workload's exec (enable on
            // exec), before which perf tracked no mapping of the process.
            places[k] = ExecPlace::BeforeTrace;
            continue;
        }
        if kernel {
            // Only an exec before every TSC of the trace is placed (before it); otherwise
            // the trace ends after the last region that certainly ended before the exec
            // (a TSC at most its time follows it).
            if tscs.first().is_none_or(|&(_, first)| t < first) && !tscs.is_empty() {
                places[k] = ExecPlace::BeforeTrace;
                continue;
            }
            let before = tscs.iter().rev().find(|&&(_, v)| v <= t).map(|t| t.0);
            let end = before.map_or(0, |o| {
                regions
                    .iter()
                    .map(|r| r.end)
                    .filter(|&end| end <= o)
                    .max()
                    .unwrap_or(0)
            });
            cut_offset = Some(end);
            places[k] = ExecPlace::InKernelTrace;
            continue;
        }
        // A gap fits the exec's time, and the code on each side of it: the region before is
        // the old program's (its first IP mapped there), the region after the new one's.
        let time_fits: Vec<usize> = bounds
            .iter()
            .enumerate()
            .filter(|(_, (lo, hi))| lo.is_none_or(|lo| lo <= t) && hi.is_none_or(|hi| t <= hi))
            .map(|(i, _)| i)
            .collect();
        let fits: Vec<usize> = time_fits
            .iter()
            .copied()
            .filter(|&i| {
                let before = i.checked_sub(1).and_then(|j| opening_ip(&regions[j]));
                let after = regions.get(i).and_then(opening_ip);
                before.is_none_or(|ip| (e.old_code)(ip)) && after.is_none_or(|ip| (e.new_code)(ip))
            })
            .collect();
        places[k] = match fits.as_slice() {
            [0] => ExecPlace::BeforeTrace,
            [i] if *i == n => ExecPlace::AfterTrace,
            [i] => {
                opens.push(*i);
                opened_by.push((k, *i));
                ExecPlace::At { psb_offset: 0 }
            }
            _ => {
                // Everything before the first gap that fits ran the old program; with no gap
                // fitting, the regions whose times are all before the exec did.
                let gap = fits
                    .first()
                    .or(time_fits.first())
                    .copied()
                    .unwrap_or_else(|| {
                        (0..=n)
                            .rev()
                            .find(|&i| bounds[i].0.is_some_and(|lo| lo <= t))
                            .unwrap_or(0)
                    });
                cut_offset = Some(match gap.checked_sub(1) {
                    Some(prev) => regions[prev].end,
                    None => regions.first().map_or(data.len() as u64, |r| r.start),
                });
                ExecPlace::Ambiguous {
                    fitting: fits.len(),
                    by_time: time_fits.len(),
                }
            }
        };
    }
    opens.sort_unstable();
    opens.dedup();
    let mut out = Vec::with_capacity(data.len() + 64 * opens.len());
    let mut copied = 0usize;
    let mut psb_at: Vec<(usize, u64)> = Vec::new();
    for &i in &opens {
        let r: &Region = &regions[i];
        if cut_offset.is_some_and(|c| r.start >= c) {
            break;
        }
        let start = r.start as usize;
        if r.opening == Opening::Psb {
            out.extend_from_slice(&data[copied..start]);
            copied = start;
            psb_at.push((i, out.len() as u64));
            continue;
        }
        // A PSB+ without FUP directly before the TIP.PGE opens the period as it is.
        if let Some(&(psb, _)) = scanner.bare_psbs.iter().find(|&&(_, end)| end == r.start) {
            out.extend_from_slice(&data[copied..start]);
            copied = start;
            let from_end = start as u64 - psb;
            psb_at.push((i, out.len() as u64 - from_end));
            continue;
        }
        out.extend_from_slice(&data[copied..start]);
        psb_at.push((i, out.len() as u64));
        write_opening(&mut out, r, 0);
        copied = r.body as usize;
    }
    let end = cut_offset.map_or(data.len(), |c| (c as usize).max(copied));
    out.extend_from_slice(&data[copied..end.min(data.len())]);
    for (k, i) in opened_by {
        places[k] = match psb_at.iter().find(|(j, _)| *j == i) {
            Some(&(_, off)) => ExecPlace::At { psb_offset: off },
            None => ExecPlace::AfterTrace,
        };
    }
    let truncated_at = cut_offset.map(|_| (out.len() as u64, (data.len() - end) as u64));
    ExecCut {
        data: out,
        places,
        truncated_at,
        kernel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{Encoder, IpKind, Packet};

    /// A stream of regions `(tsc before, tsc inside)`, each a TIP.PGE … TIP.PGD at 0x1000.
    fn stream(regions: &[(Option<u64>, Option<u64>)]) -> Vec<u8> {
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        enc.psb(&mut out);
        enc.packet(&Packet::Tsc { tsc: 100 }, &mut out).unwrap();
        enc.packet(&Packet::PsbEnd, &mut out).unwrap();
        for &(before, inside) in regions {
            if let Some(tsc) = before {
                enc.packet(&Packet::Tsc { tsc }, &mut out).unwrap();
            }
            enc.ip_packet(IpKind::TipPge, Some(0x1000), &mut out)
                .unwrap();
            if let Some(tsc) = inside {
                enc.packet(&Packet::Tsc { tsc }, &mut out).unwrap();
            }
            enc.ip_packet(IpKind::TipPgd, None, &mut out).unwrap();
        }
        out
    }

    #[test]
    fn an_exec_between_two_timed_regions_gets_a_psb() {
        let data = stream(&[(None, Some(110)), (None, Some(120)), (None, Some(130))]);
        let any = |_: u64| true;
        let at = |tsc| ExecAt {
            tsc,
            old_code: &any,
            new_code: &any,
            old_has_code: true,
        };
        let cut = cut_at_execs(&data, &[at(125), at(50), at(200)], &TimingConfig::default());
        let ExecPlace::At { psb_offset } = cut.places[0] else {
            panic!("{:?}", cut.places);
        };
        assert_eq!(cut.places[1], ExecPlace::BeforeTrace);
        assert_eq!(cut.places[2], ExecPlace::AfterTrace);
        assert_eq!(cut.data[psb_offset as usize..][..2], [0x02, 0x82]);
        assert_eq!(cut.truncated_at, None);
        assert!(cut.data.len() > data.len());
    }

    #[test]
    fn an_exec_between_untimed_regions_cuts_the_stream() {
        // The second region has no TSC: the exec at 125 may be before or after it.
        let data = stream(&[(None, Some(110)), (None, None), (None, Some(130))]);
        let any = |_: u64| true;
        let exec = ExecAt {
            tsc: 125,
            old_code: &any,
            new_code: &any,
            old_has_code: true,
        };
        let cut = cut_at_execs(&data, &[exec], &TimingConfig::default());
        assert_eq!(
            cut.places,
            [ExecPlace::Ambiguous {
                fitting: 2,
                by_time: 2
            }]
        );
        let (at, dropped) = cut.truncated_at.unwrap();
        assert_eq!(at as usize, cut.data.len());
        assert!(dropped > 0);
        assert!(cut.data.len() < data.len());
    }
}

#[cfg(test)]
mod code_tests {
    use super::*;
    use crate::packet::{Encoder, IpKind, Packet};

    /// perf's usual recording: tracing starts at the workload's exec, whose COMM record comes
    /// after the first PSB's TSC, and no TSC follows: by time the exec could be anywhere, but
    /// the program before it had no code where the trace runs (perf tracks the workload's
    /// mappings from its exec on), so it was before the trace.
    #[test]
    fn the_old_programs_mappings_rule_out_gaps() {
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        enc.psb(&mut out);
        enc.packet(&Packet::Tsc { tsc: 100 }, &mut out).unwrap();
        enc.packet(&Packet::PsbEnd, &mut out).unwrap();
        for ip in [0x4000e8, 0x400100, 0x400200] {
            enc.ip_packet(IpKind::TipPge, Some(ip), &mut out).unwrap();
            enc.ip_packet(IpKind::TipPgd, None, &mut out).unwrap();
        }
        let none = |_: u64| false;
        let program = |ip: u64| (0x400000..0x401000).contains(&ip);
        let cut = cut_at_execs(
            &out,
            &[ExecAt {
                tsc: 150,
                old_code: &none,
                new_code: &program,
                old_has_code: true,
            }],
            &TimingConfig::default(),
        );
        assert_eq!(cut.places, [ExecPlace::BeforeTrace]);
        assert_eq!(cut.data, out);
        // With the old program at the same addresses, nothing tells: the trace ends before
        // the first region.
        let cut = cut_at_execs(
            &out,
            &[ExecAt {
                tsc: 150,
                old_code: &program,
                new_code: &program,
                old_has_code: true,
            }],
            &TimingConfig::default(),
        );
        assert_eq!(
            cut.places,
            [ExecPlace::Ambiguous {
                fitting: 4,
                by_time: 4
            }]
        );
        assert_eq!(cut.truncated_at.map(|t| t.0), Some(cut.data.len() as u64));
        // Kernel code in the trace: the exec is inside a region; the trace ends after the last
        // region that certainly ended before it.
        let mut k = Vec::new();
        let mut enc = Encoder::new();
        enc.psb(&mut k);
        enc.packet(&Packet::Tsc { tsc: 100 }, &mut k).unwrap();
        enc.packet(&Packet::PsbEnd, &mut k).unwrap();
        enc.ip_packet(IpKind::TipPge, Some(0xffff_ffff_8100_0000), &mut k)
            .unwrap();
        enc.ip_packet(IpKind::TipPgd, None, &mut k).unwrap();
        let kept = k.len();
        enc.packet(&Packet::Tsc { tsc: 120 }, &mut k).unwrap();
        enc.ip_packet(IpKind::TipPge, Some(0x4000e8), &mut k)
            .unwrap();
        enc.ip_packet(IpKind::TipPgd, None, &mut k).unwrap();
        let cut = cut_at_execs(
            &k,
            &[ExecAt {
                tsc: 150,
                old_code: &none,
                new_code: &program,
                old_has_code: true,
            }],
            &TimingConfig::default(),
        );
        assert_eq!(cut.places, [ExecPlace::InKernelTrace]);
        assert!(cut.kernel);
        assert_eq!(cut.data.len(), kept, "{:?}", cut.truncated_at);
    }
}
