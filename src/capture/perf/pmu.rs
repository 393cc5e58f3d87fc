//! Discovery of the `intel_pt` PMU from sysfs and encoding of trace options into
//! `perf_event_attr.config`.
//!
//! ABI sources:
//! * `/sys/bus/event_source/devices/intel_pt/type` — the dynamic PMU type for
//!   `perf_event_attr.type` (decimal, `%d`).
//! * `/sys/bus/event_source/devices/intel_pt/format/<term>` — `config:N`, `config:N-M`,
//!   `config1:...` (the `PMU_FORMAT_ATTR` strings of `arch/x86/events/intel/pt.c`; a term may list
//!   several comma-separated ranges, filled low bits first, as perf's `pmu_format_value` does).
//! * `/sys/bus/event_source/devices/intel_pt/caps/<cap>` — CPUID leaf 0x14 capabilities, printed
//!   by `pt_cap_show` with `"%x\n"`, i.e. **hexadecimal** (e.g. `mtc_periods` = `249` = 0x249).
//! * `/proc/sys/kernel/perf_event_paranoid`, `/proc/sys/kernel/perf_event_mlock_kb`.
//!
//! Option validation mirrors the kernel's `pt_event_valid()`: an option whose capability is
//! missing, or a period/threshold whose bit is clear in the capability bitmap, is refused here
//! with an error naming the capability, instead of an anonymous `EINVAL` from
//! `perf_event_open`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Where sysfs and procfs live: `/` on a real system, a temporary directory in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysRoot {
    root: PathBuf,
}

impl Default for SysRoot {
    fn default() -> Self {
        Self::new("/")
    }
}

impl SysRoot {
    /// A root directory under which `sys/bus/event_source/...` and `proc/...` are looked up.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// `<root>/sys/bus/event_source/devices/intel_pt`.
    pub fn intel_pt_dir(&self) -> PathBuf {
        self.root.join("sys/bus/event_source/devices/intel_pt")
    }

    /// `<root>/proc/sys/kernel/perf_event_paranoid`.
    pub fn paranoid_path(&self) -> PathBuf {
        self.root.join("proc/sys/kernel/perf_event_paranoid")
    }

    /// `<root>/proc/sys/kernel/perf_event_mlock_kb`.
    pub fn mlock_kb_path(&self) -> PathBuf {
        self.root.join("proc/sys/kernel/perf_event_mlock_kb")
    }

    /// `<root>/proc/cpuinfo`.
    pub fn cpuinfo_path(&self) -> PathBuf {
        self.root.join("proc/cpuinfo")
    }

    /// `<root>/proc/<pid>/task` (the thread ids of a process).
    pub fn task_dir(&self, pid: i32) -> PathBuf {
        self.root.join(format!("proc/{pid}/task"))
    }

    /// `<root>/proc/self/status` (for `CapEff`).
    pub fn self_status_path(&self) -> PathBuf {
        self.root.join("proc/self/status")
    }
}

/// Errors reading or parsing the PMU description.
#[derive(Debug, Error)]
pub enum PmuError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file's content did not parse.
    #[error("cannot parse {path}: {content:?}: {why}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Its (trimmed) content.
        content: String,
        /// What was wrong.
        why: &'static str,
    },
}

/// Which `perf_event_attr` word a format term lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConfigWord {
    /// `attr.config`.
    Config,
    /// `attr.config1`.
    Config1,
    /// `attr.config2`.
    Config2,
    /// `attr.config3`.
    Config3,
}

impl fmt::Display for ConfigWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigWord::Config => "config",
            ConfigWord::Config1 => "config1",
            ConfigWord::Config2 => "config2",
            ConfigWord::Config3 => "config3",
        })
    }
}

/// One sysfs format term: the word and the bit ranges (inclusive, low bits of the value first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatField {
    /// The attr word.
    pub word: ConfigWord,
    /// Inclusive `(lo, hi)` bit ranges, in file order.
    pub ranges: Vec<(u8, u8)>,
}

impl FormatField {
    /// Parses `config:10`, `config:24-27`, `config1:0-31`, `config:0-7,32-35` (trailing newline
    /// allowed).
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        let text = text.trim();
        let (word, ranges) = text.split_once(':').ok_or("missing ':'")?;
        let word = match word {
            "config" => ConfigWord::Config,
            "config1" => ConfigWord::Config1,
            "config2" => ConfigWord::Config2,
            "config3" => ConfigWord::Config3,
            _ => return Err("unknown attr word (expected config, config1, config2, config3)"),
        };
        let mut out = Vec::new();
        for r in ranges.split(',') {
            let (lo, hi) = match r.split_once('-') {
                Some((a, b)) => (a, b),
                None => (r, r),
            };
            let lo: u8 = lo.trim().parse().map_err(|_| "bad bit number")?;
            let hi: u8 = hi.trim().parse().map_err(|_| "bad bit number")?;
            if lo > hi || hi > 63 {
                return Err("bit range out of order or beyond bit 63");
            }
            out.push((lo, hi));
        }
        Ok(Self { word, ranges: out })
    }

    /// Total width in bits.
    pub fn width(&self) -> u32 {
        self.ranges
            .iter()
            .map(|&(lo, hi)| (hi - lo) as u32 + 1)
            .sum()
    }

    /// The bits of `value` scattered into the ranges, or `None` if `value` does not fit.
    pub fn encode(&self, value: u64) -> Option<u64> {
        let width = self.width();
        if width < 64 && value >> width != 0 {
            return None;
        }
        let mut out = 0u64;
        let mut v = value;
        for &(lo, hi) in &self.ranges {
            let w = (hi - lo) as u32 + 1;
            let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
            out |= (v & mask) << lo;
            v = v.checked_shr(w).unwrap_or(0);
        }
        Some(out)
    }
}

/// What was discovered about the `intel_pt` PMU and the perf sysctls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtCapabilities {
    /// The sysfs directory read.
    pub dir: PathBuf,
    /// `perf_event_attr.type` for `intel_pt`.
    pub pmu_type: u32,
    /// Format terms by name.
    pub formats: BTreeMap<String, FormatField>,
    /// Capabilities by name (hex values from `caps/*`).
    pub caps: BTreeMap<String, u64>,
    /// `perf_event_paranoid`, if readable.
    pub paranoid: Option<i32>,
    /// `perf_event_mlock_kb`, if readable.
    pub mlock_kb: Option<u64>,
}

fn read_trimmed(path: &Path) -> Result<String, PmuError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| PmuError::Io {
            path: path.to_owned(),
            source,
        })
}

fn read_dir_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, PmuError> {
    let rd = std::fs::read_dir(dir).map_err(|source| PmuError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|source| PmuError::Io {
            path: dir.to_owned(),
            source,
        })?;
        if let Some(name) = e.file_name().to_str() {
            out.push((name.to_owned(), e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Reads an optional integer sysctl (`None` if the file is absent or unparsable).
fn read_opt<T: std::str::FromStr>(path: &Path) -> Option<T> {
    read_trimmed(path).ok()?.parse().ok()
}

impl PtCapabilities {
    /// Reads `type`, `format/*`, `caps/*` under `root` plus the perf sysctls. The caller is
    /// expected to have checked that the PMU directory exists (see [`super::probe_at`]); a missing
    /// file here is reported as [`PmuError::Io`] with its path.
    pub fn discover(root: &SysRoot) -> Result<Self, PmuError> {
        let dir = root.intel_pt_dir();
        let type_path = dir.join("type");
        let type_text = read_trimmed(&type_path)?;
        let pmu_type = type_text.parse().map_err(|_| PmuError::Parse {
            path: type_path.clone(),
            content: type_text.clone(),
            why: "expected a decimal PMU type",
        })?;
        let mut formats = BTreeMap::new();
        for (name, path) in read_dir_files(&dir.join("format"))? {
            let text = read_trimmed(&path)?;
            let field = FormatField::parse(&text).map_err(|why| PmuError::Parse {
                path: path.clone(),
                content: text.clone(),
                why,
            })?;
            formats.insert(name, field);
        }
        let mut caps = BTreeMap::new();
        let caps_dir = dir.join("caps");
        if caps_dir.exists() {
            for (name, path) in read_dir_files(&caps_dir)? {
                let text = read_trimmed(&path)?;
                let v = u64::from_str_radix(text.trim_start_matches("0x"), 16).map_err(|_| {
                    PmuError::Parse {
                        path: path.clone(),
                        content: text.clone(),
                        why: "expected a hexadecimal capability (pt_cap_show prints %x)",
                    }
                })?;
                caps.insert(name, v);
            }
        }
        Ok(Self {
            dir,
            pmu_type,
            formats,
            caps,
            paranoid: read_opt(&root.paranoid_path()),
            mlock_kb: read_opt(&root.mlock_kb_path()),
        })
    }

    /// A capability value (0 if the kernel does not export it).
    pub fn cap(&self, name: &str) -> u64 {
        self.caps.get(name).copied().unwrap_or(0)
    }

    /// Number of address filter ranges (`caps/num_address_ranges`, 0 without `ip_filtering`).
    pub fn num_address_ranges(&self) -> u64 {
        if self.cap("ip_filtering") == 0 {
            0
        } else {
            self.cap("num_address_ranges")
        }
    }

    fn set(&self, term: &'static str, value: u64, cfg: &mut u64) -> Result<(), ConfigError> {
        let field = self
            .formats
            .get(term)
            .ok_or(ConfigError::MissingFormat { term })?;
        if field.word != ConfigWord::Config {
            return Err(ConfigError::UnexpectedWord {
                term,
                word: field.word,
            });
        }
        let bits = field.encode(value).ok_or(ConfigError::ValueTooWide {
            term,
            value,
            width: field.width(),
        })?;
        *cfg |= bits;
        Ok(())
    }

    fn need_cap(&self, option: &'static str, cap: &'static str) -> Result<(), ConfigError> {
        if self.cap(cap) == 0 {
            Err(ConfigError::MissingCap { option, cap })
        } else {
            Ok(())
        }
    }

    fn need_bit(
        &self,
        option: &'static str,
        cap: &'static str,
        value: u8,
    ) -> Result<(), ConfigError> {
        let allowed = self.cap(cap);
        if value >= 64 || allowed & (1u64 << value) == 0 {
            Err(ConfigError::ValueNotAllowed {
                option,
                value,
                cap,
                allowed,
            })
        } else {
            Ok(())
        }
    }

    /// Validates `opts` against the capabilities (as the kernel's `pt_event_valid()` would) and
    /// encodes them into `perf_event_attr.config` using the format bit ranges.
    pub fn encode_config(&self, opts: &PtOptions) -> Result<u64, ConfigError> {
        let mut cfg = 0u64;
        // `pt` is the pass-through switch: with it the kernel takes BranchEn from `branch`,
        // without it the kernel forces BranchEn and refuses an explicit `branch` bit.
        if self.formats.contains_key("pt") {
            self.set("pt", 1, &mut cfg)?;
            if opts.branch {
                self.set("branch", 1, &mut cfg)?;
            }
        } else if !opts.branch {
            return Err(ConfigError::MissingFormat { term: "pt" });
        }
        if opts.tsc {
            self.set("tsc", 1, &mut cfg)?;
        }
        if opts.noretcomp {
            self.set("noretcomp", 1, &mut cfg)?;
        }
        if let Some(period) = opts.mtc_period {
            self.need_cap("mtc", "mtc")?;
            self.need_bit("mtc_period", "mtc_periods", period)?;
            self.set("mtc", 1, &mut cfg)?;
            self.set("mtc_period", period.into(), &mut cfg)?;
        }
        if let Some(thresh) = opts.cyc_thresh {
            self.need_cap("cyc", "psb_cyc")?;
            if thresh != 0 {
                self.need_bit("cyc_thresh", "cycle_thresholds", thresh)?;
            }
            self.set("cyc", 1, &mut cfg)?;
            self.set("cyc_thresh", thresh.into(), &mut cfg)?;
        }
        if let Some(period) = opts.psb_period {
            if period != 0 {
                self.need_cap("psb_period", "psb_cyc")?;
                self.need_bit("psb_period", "psb_periods", period)?;
            }
            self.set("psb_period", period.into(), &mut cfg)?;
        }
        if opts.ptw {
            self.need_cap("ptw", "ptwrite")?;
            self.set("ptw", 1, &mut cfg)?;
        }
        if opts.fup_on_ptw {
            if !opts.ptw {
                return Err(ConfigError::FupOnPtwWithoutPtw);
            }
            self.need_cap("fup_on_ptw", "ptwrite")?;
            self.set("fup_on_ptw", 1, &mut cfg)?;
        }
        if opts.pwr_evt {
            self.need_cap("pwr_evt", "power_event_trace")?;
            self.set("pwr_evt", 1, &mut cfg)?;
        }
        Ok(cfg)
    }
}

/// Intel PT trace options (the `intel_pt/.../` terms). `Default` is perf's default minus
/// timing: branch tracing with RET compression, no timing packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtOptions {
    /// `tsc`: TSC packets.
    pub tsc: bool,
    /// `mtc` + `mtc_period=N`: MTC packets every 2^N ART ticks (needs `caps/mtc`, bit N of
    /// `caps/mtc_periods`).
    pub mtc_period: Option<u8>,
    /// `cyc` + `cyc_thresh=N`: cycle-accurate mode (needs `caps/psb_cyc`; N ≠ 0 needs bit N of
    /// `caps/cycle_thresholds`).
    pub cyc_thresh: Option<u8>,
    /// `noretcomp`: disable RET compression (every RET gets a TIP).
    pub noretcomp: bool,
    /// `ptw`: PTWRITE packets (needs `caps/ptwrite`).
    pub ptw: bool,
    /// `fup_on_ptw`: FUP after each PTW (needs `ptw`).
    pub fup_on_ptw: bool,
    /// `pwr_evt`: power event packets (needs `caps/power_event_trace`).
    pub pwr_evt: bool,
    /// `psb_period=N`: PSB about every 2^(N+11) bytes (N ≠ 0 needs `caps/psb_cyc` and bit N of
    /// `caps/psb_periods`).
    pub psb_period: Option<u8>,
    /// `branch`: COFI packets (BranchEn). Turning it off needs the `pt` pass-through term, and
    /// parts where the driver sets `branch_en_always_on` (Broadwell) still refuse it with
    /// `EINVAL` — that is model-specific and not visible in sysfs.
    pub branch: bool,
}

impl Default for PtOptions {
    fn default() -> Self {
        Self {
            tsc: false,
            mtc_period: None,
            cyc_thresh: None,
            noretcomp: false,
            ptw: false,
            fup_on_ptw: false,
            pwr_evt: false,
            psb_period: None,
            branch: true,
        }
    }
}

/// An option the CPU or kernel cannot honour.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The option needs a capability the CPU lacks.
    #[error(
        "intel_pt option `{option}` needs capability `{cap}`, which this CPU does not have (caps/{cap} is 0 or absent)"
    )]
    MissingCap {
        /// The requested option.
        option: &'static str,
        /// The missing capability.
        cap: &'static str,
    },
    /// A period/threshold whose bit is clear in the capability bitmap.
    #[error(
        "intel_pt option `{option}={value}` is not supported: bit {value} is clear in caps/{cap} = {allowed:#x}"
    )]
    ValueNotAllowed {
        /// The option.
        option: &'static str,
        /// The requested value.
        value: u8,
        /// The bitmap capability.
        cap: &'static str,
        /// The bitmap.
        allowed: u64,
    },
    /// The kernel does not export the format term.
    #[error("this kernel's intel_pt PMU has no `format/{term}` term")]
    MissingFormat {
        /// The term.
        term: &'static str,
    },
    /// The term lives outside `attr.config`, which this backend does not expect for it.
    #[error("intel_pt format term `{term}` is in {word}, expected config")]
    UnexpectedWord {
        /// The term.
        term: &'static str,
        /// Where it is.
        word: ConfigWord,
    },
    /// The value does not fit the term's bits.
    #[error("value {value} does not fit the {width}-bit intel_pt term `{term}`")]
    ValueTooWide {
        /// The term.
        term: &'static str,
        /// The value.
        value: u64,
        /// The term's width.
        width: u32,
    },
    /// `fup_on_ptw` without `ptw` (the kernel rejects FUPonPTW without PTWEn).
    #[error("intel_pt option `fup_on_ptw` requires `ptw`")]
    FupOnPtwWithoutPtw,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_format_syntax() {
        assert_eq!(
            FormatField::parse("config:10\n"),
            Ok(FormatField {
                word: ConfigWord::Config,
                ranges: vec![(10, 10)]
            })
        );
        let f = FormatField::parse("config:24-27").unwrap();
        assert_eq!(f.width(), 4);
        assert_eq!(f.encode(0b1011), Some(0b1011 << 24));
        assert_eq!(f.encode(16), None);
        let f = FormatField::parse("config1:0-3,8-11").unwrap();
        assert_eq!(f.word, ConfigWord::Config1);
        assert_eq!(f.width(), 8);
        assert_eq!(f.encode(0xa5), Some(0x5 | (0xa << 8)));
        let f = FormatField::parse("config:0-63").unwrap();
        assert_eq!(f.encode(u64::MAX), Some(u64::MAX));
        for bad in [
            "config",
            "config:",
            "conf:1",
            "config:5-3",
            "config:64",
            "config:x",
        ] {
            assert!(FormatField::parse(bad).is_err(), "{bad}");
        }
    }
}
