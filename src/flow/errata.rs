//! The processor a trace was recorded on, and the Intel PT errata the flow decoder works around.
//!
//! Some processors emit packet sequences the architecture does not allow. A decoder that knows the
//! processor can recognise them and decode what really executed; libipt calls this set
//! `struct pt_errata` and computes it from the CPU with `pt_cpu_errata`. [`Errata::for_cpu`] gives
//! the same set for the same family/model as libipt 2.0.5 (a test compares the two for every
//! model). An unknown CPU, or one that is not Intel's, gets no workaround at all, as in libipt: a
//! workaround reinterprets packets, and applying one to a CPU without the erratum would mis-decode
//! a correct trace.
//!
//! What each workaround does in [`FlowDecoder`](super::FlowDecoder) (reference:
//! `../shared/docs/intel-pt-packets.md` §3.8 and §7):
//!
//! | erratum | symptom | workaround |
//! |---|---|---|
//! | BDM70 | a PSB+ right before a TIP.PGE holds FUP and MODE.Exec although tracing is off | while tracing is off, a PSB+ FUP followed (after PSBEND, through PAD/timing/PIP/MODE/VMCS/MNT only) by a TIP.PGE is ignored: the PSB says "disabled" |
//! | BDM64 | a TSX abort right after a branch may log a wrong TIP target | an abort FUP that cannot be reached without trace from where the trace left the decoder (the branch target) is taken as the place execution really went |
//! | SKD007 | an OVF overwrites the tail of a multi-byte CYC | a 2-byte CYC whose second byte is `02` and that is followed by `F3` is dropped, and decoding restarts at its second byte (the OVF) |
//! | SKD010 | the FUP (or TIP.PGE) after an OVF is missing | a TIP after the OVF resumes tracing at its target; a TIP.PGD after it continues disabled |
//! | SKD022 | a VM entry that clears TraceEn sends FUP + TIP.PGD | a FUP+TIP.PGD whose FUP is at VMLAUNCH/VMRESUME is a synchronous disable after that instruction |
//! | SKL014 | a direct JMP/CALL leaving the IP filter gives a TIP.PGD without IP | with [`FlowConfig::ip_filter`](super::FlowConfig::ip_filter) set, such a TIP.PGD binds to the first direct branch whose target lies outside every filter range |
//! | APL11 | an OVF may be followed by a TIP.PGD | accepted: tracing continues disabled |
//! | APL12 | an OVF may be followed by a FUP although tracing is off | a FUP after an OVF is ignored when the packets after it show tracing is off (a TIP.PGE or TraceStop before any TNT/TIP/TIP.PGD, or a PSB+ without FUP) |
//! | SKL168 | a CYC (and maybe an MTC) before a PSB is dropped | nothing to do: the time model (see [`time`](crate::packet::time)) does not calibrate on MTC/CYC, and the PSB+'s TSC resets the time |
//! | SKZ84 | TMA packets in a VMX guest with TSC offsetting/scaling are corrupt, plus a bogus byte | a TMA with reserved bits set is skipped with the byte after it (8 bytes), as libipt's packet decoder does |

use std::fmt;
use std::str::FromStr;

/// Processor vendor, as far as Intel PT cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuVendor {
    /// Not known: no errata apply.
    #[default]
    Unknown,
    /// GenuineIntel.
    Intel,
}

/// The processor a trace was recorded on (CPUID family/model/stepping, already combined with the
/// extended family/model fields the way `/proc/cpuinfo` and perf print them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cpu {
    /// Vendor.
    pub vendor: CpuVendor,
    /// Display family (6 for every Core/Atom with Intel PT).
    pub family: u16,
    /// Display model.
    pub model: u8,
    /// Stepping.
    pub stepping: u8,
}

/// A `--cpu` or perf `HEADER_CPUID` string that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad CPU {text:?}: {reason}")]
pub struct CpuParseError {
    /// The text.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Cpu {
    /// An Intel CPU.
    pub fn intel(family: u16, model: u8, stepping: u8) -> Self {
        Cpu {
            vendor: CpuVendor::Intel,
            family,
            model,
            stepping,
        }
    }

    /// Reads perf's `HEADER_CPUID` string for x86, `VENDOR,FAMILY,MODEL,STEPPING` (decimal), e.g.
    /// `GenuineIntel,6,142,10`. A vendor other than GenuineIntel gives [`CpuVendor::Unknown`].
    pub fn from_perf_cpuid(s: &str) -> Result<Self, CpuParseError> {
        let err = |reason| CpuParseError {
            text: s.to_string(),
            reason,
        };
        let parts: Vec<&str> = s.trim().split(',').map(str::trim).collect();
        let [vendor, family, model, stepping] = parts.as_slice() else {
            return Err(err("expected VENDOR,FAMILY,MODEL,STEPPING"));
        };
        let family = family.parse().map_err(|_| err("bad family"))?;
        let model = model.parse().map_err(|_| err("bad model"))?;
        let stepping = stepping.parse().map_err(|_| err("bad stepping"))?;
        Ok(Cpu {
            vendor: if *vendor == "GenuineIntel" {
                CpuVendor::Intel
            } else {
                CpuVendor::Unknown
            },
            family,
            model,
            stepping,
        })
    }
}

/// ptxed's `--cpu FAMILY/MODEL[/STEPPING]` (numbers in C `strtoul(.., 0)` syntax: `0x` hex,
/// leading `0` octal, else decimal); the vendor is Intel.
impl FromStr for Cpu {
    type Err = CpuParseError;

    fn from_str(s: &str) -> Result<Self, CpuParseError> {
        let err = |reason| CpuParseError {
            text: s.to_string(),
            reason,
        };
        let num = |p: &str| crate::image::parse_number(p).ok_or(err("not a number"));
        let parts: Vec<&str> = s.split('/').collect();
        let (f, m, st) = match parts.as_slice() {
            [f, m] => (num(f)?, num(m)?, 0),
            [f, m, st] => (num(f)?, num(m)?, num(st)?),
            _ => return Err(err("expected FAMILY/MODEL[/STEPPING]")),
        };
        let family = u16::try_from(f).map_err(|_| err("family out of range"))?;
        let model = u8::try_from(m).map_err(|_| err("model out of range"))?;
        let stepping = u8::try_from(st).map_err(|_| err("stepping out of range"))?;
        Ok(Cpu::intel(family, model, stepping))
    }
}

impl fmt::Display for Cpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vendor = match self.vendor {
            CpuVendor::Intel => "intel",
            CpuVendor::Unknown => "unknown",
        };
        write!(
            f,
            "{vendor} {}/{:#x}/{}",
            self.family, self.model, self.stepping
        )
    }
}

/// The Intel PT errata of a processor (libipt's `struct pt_errata`). See the [module docs](self)
/// for what each one means to the decoder. `Default` is the empty set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Errata {
    /// BDM70 (same as SKD024, SKL021, KBL021): PSB+ may contain FUP/MODE.Exec before TIP.PGE.
    pub bdm70: bool,
    /// BDM64: a wrong TIP target may be logged before a TSX abort.
    pub bdm64: bool,
    /// SKD007 (SKL049, KBL041): an OVF may replace the tail of a CYC.
    pub skd007: bool,
    /// SKD022 (SKL024, KBL023): a VM entry that clears TraceEn may generate FUP + TIP.PGD.
    pub skd022: bool,
    /// SKD010 (SKD014, SKL033, KBL030): the FUP or TIP.PGE after an OVF may be dropped.
    pub skd010: bool,
    /// SKL014 (KBL014): a TIP.PGD after a direct branch leaving the filter may lack its IP.
    pub skl014: bool,
    /// APL12: an OVF may be followed by a FUP while tracing is off.
    pub apl12: bool,
    /// APL11: an OVF may be followed by a TIP.PGD.
    pub apl11: bool,
    /// SKL168: a CYC (and an MTC) right before a PSB may be dropped.
    pub skl168: bool,
    /// SKZ84: TMA packets are corrupt in a VMX guest with TSC offsetting or scaling.
    pub skz84: bool,
}

impl Errata {
    /// The errata of `cpu`, for the same family/model lists as libipt 2.0.5's `pt_cpu_errata`
    /// (family 6 only; the stepping does not matter). Empty for an unknown vendor or model.
    pub fn for_cpu(cpu: &Cpu) -> Self {
        let mut e = Errata::default();
        if cpu.vendor != CpuVendor::Intel || cpu.family != 6 {
            return e;
        }
        match cpu.model {
            // Broadwell.
            0x3d | 0x47 | 0x4f | 0x56 => {
                e.bdm70 = true;
                e.bdm64 = true;
            }
            // Skylake, Kaby Lake, Coffee Lake, Comet Lake client cores.
            0x4e | 0x5e | 0x8e | 0x9e | 0xa5 | 0xa6 => {
                e.bdm70 = true;
                e.skd007 = true;
                e.skd022 = true;
                e.skd010 = true;
                e.skl014 = true;
                e.skl168 = true;
            }
            // Skylake server, Cannon Lake, Ice Lake, Tiger Lake, Rocket Lake, ...
            0x55 | 0x66 | 0x6a | 0x6c | 0x7d | 0x7e | 0x8c | 0x8d | 0x8f | 0xa7 | 0xa8 => {
                e.bdm70 = true;
                e.skd022 = true;
                e.skl014 = true;
                e.skz84 = matches!(cpu.model, 0x55 | 0x6a | 0x6c | 0x8f);
            }
            // Alder Lake, Raptor Lake.
            0x97 | 0x9a | 0xbf => {
                e.bdm70 = true;
                e.skd022 = true;
                e.skl014 = true;
                e.apl11 = true;
            }
            // Goldmont (Apollo Lake, Denverton).
            0x5c | 0x5f => {
                e.apl12 = true;
                e.apl11 = true;
            }
            // Goldmont Plus, Tremont.
            0x7a | 0x86 | 0x96 | 0x9c => e.apl11 = true,
            _ => {}
        }
        e
    }

    /// Whether no workaround is enabled.
    pub fn is_empty(&self) -> bool {
        *self == Errata::default()
    }

    /// The names of the enabled errata, in the order of libipt's `struct pt_errata`.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.bdm70, "bdm70"),
            (self.bdm64, "bdm64"),
            (self.skd007, "skd007"),
            (self.skd022, "skd022"),
            (self.skd010, "skd010"),
            (self.skl014, "skl014"),
            (self.apl12, "apl12"),
            (self.apl11, "apl11"),
            (self.skl168, "skl168"),
            (self.skz84, "skz84"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxed_and_perf_cpu_strings() {
        assert_eq!("6/0x5e/3".parse::<Cpu>(), Ok(Cpu::intel(6, 0x5e, 3)));
        assert_eq!("6/94".parse::<Cpu>(), Ok(Cpu::intel(6, 94, 0)));
        assert!("6".parse::<Cpu>().is_err());
        assert!("6/300".parse::<Cpu>().is_err());
        assert_eq!(
            Cpu::from_perf_cpuid("GenuineIntel,6,142,10"),
            Ok(Cpu::intel(6, 142, 10))
        );
        let amd = Cpu::from_perf_cpuid("AuthenticAMD,23,1,2").unwrap();
        assert_eq!(amd.vendor, CpuVendor::Unknown);
        assert!(Errata::for_cpu(&amd).is_empty());
        assert!(Cpu::from_perf_cpuid("GenuineIntel,6").is_err());
    }

    #[test]
    fn unknown_cpus_have_no_errata() {
        assert!(Errata::for_cpu(&Cpu::default()).is_empty());
        assert!(Errata::for_cpu(&Cpu::intel(6, 0x01, 0)).is_empty());
        assert!(Errata::for_cpu(&Cpu::intel(15, 0x5e, 0)).is_empty());
        assert_eq!(
            Errata::for_cpu(&Cpu::intel(6, 0x3d, 4)).names(),
            ["bdm70", "bdm64"]
        );
    }
}
