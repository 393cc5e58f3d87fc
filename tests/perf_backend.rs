//! Integration tests of the hardware (perf `intel_pt`) backend: the real probe on this machine,
//! fake sysfs trees for discovery/validation/config encoding, the real `perf_event_open`/`mmap`
//! path driven through a fake PMU description, filter validation, and simulated rings through
//! the public API.

use std::fs;
use std::path::Path;
use std::sync::atomic::Ordering;

use ptrewind::capture::perf::pmu::{ConfigWord, FormatField};
use ptrewind::capture::perf::{
    AuxMode, AuxSink, ChannelSink, ConfigError, FilterError, PerfPtBackend, PerfPtConfig,
    PerfPtError, ProbeRequest, PtOptions, PtUnavailable, StartMode, SysRoot, TraceChunk, filter,
    plan, probe, probe_at,
};
use ptrewind::ring::aux::{
    AuxFlags, AuxStats, DataRingReader, PerfMmapPage, SampleIdLayout, SideRecord, SnapshotLoss,
    SnapshotReader, drain_aux_full,
};
use tempfile::TempDir;

/// The format strings of `arch/x86/events/intel/pt.c` (`PMU_FORMAT_ATTR`).
const KERNEL_FORMATS: &[(&str, &str)] = &[
    ("pt", "config:0"),
    ("cyc", "config:1"),
    ("pwr_evt", "config:4"),
    ("fup_on_ptw", "config:5"),
    ("mtc", "config:9"),
    ("tsc", "config:10"),
    ("noretcomp", "config:11"),
    ("ptw", "config:12"),
    ("branch", "config:13"),
    ("mtc_period", "config:14-17"),
    ("cyc_thresh", "config:19-22"),
    ("psb_period", "config:24-27"),
    ("event", "config:31"),
    ("notnt", "config:55"),
];

/// Caps of a Skylake-class part as `pt_cap_show` prints them (`%x`).
const SKYLAKE_CAPS: &[(&str, &str)] = &[
    ("max_subleaf", "1"),
    ("cr3_filtering", "1"),
    ("psb_cyc", "1"),
    ("ip_filtering", "1"),
    ("mtc", "1"),
    ("ptwrite", "1"),
    ("power_event_trace", "1"),
    ("topa_output", "1"),
    ("topa_multiple_entries", "1"),
    ("single_range_output", "1"),
    ("payloads_lip", "0"),
    ("num_address_ranges", "2"),
    ("mtc_periods", "249"),
    ("cycle_thresholds", "3fff"),
    ("psb_periods", "3f"),
];

struct FakeSys {
    dir: TempDir,
}

impl FakeSys {
    fn new() -> Self {
        Self {
            dir: TempDir::new().unwrap(),
        }
    }

    fn root(&self) -> SysRoot {
        SysRoot::new(self.dir.path())
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.dir.path().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    fn remove(&self, rel: &str) {
        fs::remove_file(self.dir.path().join(rel)).unwrap();
    }

    /// A complete intel_pt PMU with the given type, formats, caps and paranoid value.
    fn intel_pt(
        type_: &str,
        formats: &[(&str, &str)],
        caps: &[(&str, &str)],
        paranoid: i32,
    ) -> Self {
        let s = Self::new();
        let d = "sys/bus/event_source/devices/intel_pt";
        s.write(&format!("{d}/type"), &format!("{type_}\n"));
        for (k, v) in formats {
            s.write(&format!("{d}/format/{k}"), &format!("{v}\n"));
        }
        for (k, v) in caps {
            s.write(&format!("{d}/caps/{k}"), &format!("{v}\n"));
        }
        s.write(
            "proc/sys/kernel/perf_event_paranoid",
            &format!("{paranoid}\n"),
        );
        s.write("proc/sys/kernel/perf_event_mlock_kb", "516\n");
        s.write("proc/self/status", "Name:\tx\nCapEff:\t0000000000000000\n");
        s
    }

    fn skylake() -> Self {
        Self::intel_pt("8", KERNEL_FORMATS, SKYLAKE_CAPS, 2)
    }

    fn set_cap(&self, cap: &str, value: &str) {
        self.write(
            &format!("sys/bus/event_source/devices/intel_pt/caps/{cap}"),
            &format!("{value}\n"),
        );
    }
}

const NO_OPEN: ProbeRequest = ProbeRequest {
    user_only: true,
    try_open: false,
};

fn caps_of(sys: &FakeSys) -> ptrewind::capture::perf::PtCapabilities {
    probe_at(&sys.root(), NO_OPEN).unwrap()
}

fn encode(sys: &FakeSys, opts: PtOptions) -> Result<u64, ConfigError> {
    caps_of(sys).encode_config(&opts)
}

// ---------------------------------------------------------------------------------------------
// The real machine.

#[test]
fn real_probe_reports_exactly_what_is_missing() {
    let pmu_dir = Path::new("/sys/bus/event_source/devices/intel_pt");
    let result = probe();
    if pmu_dir.exists() {
        // A machine with Intel PT: either usable, or refused for a named reason.
        if let Err(e) = result {
            assert!(!matches!(e, PtUnavailable::NoPmu { .. }), "{e}");
        }
        return;
    }
    let err = result.expect_err("no intel_pt PMU directory, yet probe succeeded");
    let msg = err.to_string();
    assert!(
        msg.starts_with("no intel_pt PMU: /sys/bus/event_source/devices/intel_pt does not exist"),
        "{msg}"
    );
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let PtUnavailable::NoPmu {
        vendor,
        hypervisor,
        cpu_flag,
        ..
    } = &err
    else {
        panic!("wrong variant: {err:?}");
    };
    // Independent ground truth from /proc/cpuinfo.
    let flags_line = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or("");
    assert_eq!(
        *hypervisor,
        flags_line.split_whitespace().any(|f| f == "hypervisor")
    );
    assert_eq!(
        *cpu_flag,
        flags_line.split_whitespace().any(|f| f == "intel_pt")
    );
    if cpuinfo.contains("AuthenticAMD") {
        assert_eq!(vendor.as_deref(), Some("AuthenticAMD"));
        assert!(msg.contains("AMD"), "{msg}");
    } else if *hypervisor && !*cpu_flag {
        assert!(msg.contains("hypervisor"), "{msg}");
    }
    // The backend refuses with the same reason.
    let e = PerfPtBackend::open(&[std::process::id() as i32], PerfPtConfig::default()).unwrap_err();
    assert!(
        matches!(e, PerfPtError::Unavailable(PtUnavailable::NoPmu { .. })),
        "{e}"
    );
    assert_eq!(e.to_string(), msg);
}

// ---------------------------------------------------------------------------------------------
// Probe against fake trees.

#[test]
fn probe_without_pmu_names_amd_or_hypervisor() {
    let sys = FakeSys::new();
    sys.write(
        "proc/cpuinfo",
        "vendor_id\t: AuthenticAMD\nflags\t\t: fpu svm hypervisor\n",
    );
    let e = probe_at(&sys.root(), NO_OPEN).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("AuthenticAMD") && msg.contains("only on Intel CPUs"),
        "{msg}"
    );

    let sys = FakeSys::new();
    sys.write(
        "proc/cpuinfo",
        "vendor_id\t: GenuineIntel\nflags\t\t: fpu vmx hypervisor\n",
    );
    let msg = probe_at(&sys.root(), NO_OPEN).unwrap_err().to_string();
    assert!(
        msg.contains("hypervisor that does not expose Intel PT"),
        "{msg}"
    );

    let sys = FakeSys::new();
    sys.write(
        "proc/cpuinfo",
        "vendor_id\t: GenuineIntel\nflags\t\t: fpu intel_pt\n",
    );
    let msg = probe_at(&sys.root(), NO_OPEN).unwrap_err().to_string();
    assert!(msg.contains("no intel_pt PMU driver"), "{msg}");
}

#[test]
fn probe_reads_type_formats_caps_and_sysctls() {
    let sys = FakeSys::skylake();
    let caps = caps_of(&sys);
    assert_eq!(caps.pmu_type, 8);
    assert_eq!(caps.paranoid, Some(2));
    assert_eq!(caps.mlock_kb, Some(516));
    assert_eq!(caps.formats.len(), KERNEL_FORMATS.len());
    assert_eq!(
        caps.formats["psb_period"],
        FormatField {
            word: ConfigWord::Config,
            ranges: vec![(24, 27)]
        }
    );
    // caps are hexadecimal (pt_cap_show uses %x).
    assert_eq!(caps.cap("mtc_periods"), 0x249);
    assert_eq!(caps.cap("cycle_thresholds"), 0x3fff);
    assert_eq!(caps.cap("psb_periods"), 0x3f);
    assert_eq!(caps.num_address_ranges(), 2);
    sys.set_cap("ip_filtering", "0");
    assert_eq!(caps_of(&sys).num_address_ranges(), 0);
}

#[test]
fn probe_paranoid_and_capabilities() {
    let sys = FakeSys::intel_pt("8", KERNEL_FORMATS, SKYLAKE_CAPS, 3);
    let e = probe_at(&sys.root(), NO_OPEN).unwrap_err();
    assert!(
        matches!(
            e,
            PtUnavailable::ParanoidTooHigh {
                value: 3,
                max: 2,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("perf_event_paranoid is 3"), "{msg}");
    assert!(msg.contains("sysctl kernel.perf_event_paranoid=2"), "{msg}");
    assert!(msg.contains("CAP_PERFMON"), "{msg}");

    // Kernel tracing needs ≤ 1.
    let sys = FakeSys::skylake();
    let e = probe_at(
        &sys.root(),
        ProbeRequest {
            user_only: false,
            try_open: false,
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            PtUnavailable::ParanoidTooHigh {
                value: 2,
                max: 1,
                ..
            }
        ),
        "{e:?}"
    );

    // CAP_PERFMON (bit 38) lifts the restriction; so does CAP_SYS_ADMIN (bit 21).
    for capeff in ["0000004000000000", "0000000000200000"] {
        let sys = FakeSys::intel_pt("8", KERNEL_FORMATS, SKYLAKE_CAPS, 3);
        sys.write("proc/self/status", &format!("CapEff:\t{capeff}\n"));
        assert!(probe_at(&sys.root(), NO_OPEN).is_ok(), "{capeff}");
    }
    // CAP_SYS_PTRACE alone (bit 19) does not.
    let sys = FakeSys::intel_pt("8", KERNEL_FORMATS, SKYLAKE_CAPS, 3);
    sys.write("proc/self/status", "CapEff:\t0000000000080000\n");
    assert!(probe_at(&sys.root(), NO_OPEN).is_err());
}

#[test]
fn probe_reports_malformed_sysfs_with_path() {
    let sys = FakeSys::skylake();
    sys.write("sys/bus/event_source/devices/intel_pt/type", "intel\n");
    let msg = probe_at(&sys.root(), NO_OPEN).unwrap_err().to_string();
    assert!(
        msg.contains("intel_pt/type") && msg.contains("decimal"),
        "{msg}"
    );

    let sys = FakeSys::skylake();
    sys.write(
        "sys/bus/event_source/devices/intel_pt/format/tsc",
        "config10\n",
    );
    let msg = probe_at(&sys.root(), NO_OPEN).unwrap_err().to_string();
    assert!(msg.contains("format/tsc"), "{msg}");

    let sys = FakeSys::skylake();
    sys.set_cap("mtc_periods", "xyz");
    let msg = probe_at(&sys.root(), NO_OPEN).unwrap_err().to_string();
    assert!(
        msg.contains("caps/mtc_periods") && msg.contains("hexadecimal"),
        "{msg}"
    );

    let sys = FakeSys::skylake();
    sys.remove("sys/bus/event_source/devices/intel_pt/type");
    let msg = probe_at(&sys.root(), NO_OPEN).unwrap_err().to_string();
    assert!(
        msg.contains("cannot read") && msg.contains("intel_pt/type"),
        "{msg}"
    );
}

// ---------------------------------------------------------------------------------------------
// Config encoding: every option against bit positions computed by hand from the format files.

#[test]
fn config_encoding_of_every_option() {
    let sys = FakeSys::skylake();
    let base = PtOptions::default();
    // pt (bit 0) + branch (bit 13).
    assert_eq!(encode(&sys, base.clone()), Ok(0x0000_2001));
    let cases: Vec<(PtOptions, u64)> = vec![
        (
            PtOptions {
                tsc: true,
                ..base.clone()
            },
            0x2001 | 0x400,
        ),
        (
            PtOptions {
                noretcomp: true,
                ..base.clone()
            },
            0x2001 | 0x800,
        ),
        // mtc (bit 9) + mtc_period=3 at 14-17.
        (
            PtOptions {
                mtc_period: Some(3),
                ..base.clone()
            },
            0x2001 | 0x200 | 0xC000,
        ),
        (
            PtOptions {
                mtc_period: Some(9),
                ..base.clone()
            },
            0x2001 | 0x200 | 0x2_4000,
        ),
        // cyc (bit 1) + cyc_thresh=2 at 19-22.
        (
            PtOptions {
                cyc_thresh: Some(2),
                ..base.clone()
            },
            0x2001 | 0x2 | 0x10_0000,
        ),
        (
            PtOptions {
                cyc_thresh: Some(0),
                ..base.clone()
            },
            0x2001 | 0x2,
        ),
        // psb_period=5 at 24-27.
        (
            PtOptions {
                psb_period: Some(5),
                ..base.clone()
            },
            0x2001 | 0x500_0000,
        ),
        (
            PtOptions {
                ptw: true,
                ..base.clone()
            },
            0x2001 | 0x1000,
        ),
        // fup_on_ptw (bit 5) with ptw (bit 12).
        (
            PtOptions {
                ptw: true,
                fup_on_ptw: true,
                ..base.clone()
            },
            0x2001 | 0x1000 | 0x20,
        ),
        (
            PtOptions {
                pwr_evt: true,
                ..base.clone()
            },
            0x2001 | 0x10,
        ),
        // branch off: pass-through only.
        (
            PtOptions {
                branch: false,
                ..base.clone()
            },
            0x1,
        ),
    ];
    for (opts, want) in cases {
        assert_eq!(encode(&sys, opts.clone()), Ok(want), "{opts:?}");
    }
    let all = PtOptions {
        tsc: true,
        mtc_period: Some(6),
        cyc_thresh: Some(13),
        noretcomp: true,
        ptw: true,
        fup_on_ptw: true,
        pwr_evt: true,
        psb_period: Some(5),
        branch: true,
    };
    // 0:pt 1:cyc 4:pwr 5:fup 9:mtc 10:tsc 11:noretcomp 12:ptw 13:branch, 6<<14, 13<<19, 5<<24.
    let want = 0b11_1110_0011_0011u64 | (6 << 14) | (13 << 19) | (5 << 24);
    assert_eq!(want, 0x0569_BE33);
    assert_eq!(encode(&sys, all), Ok(want));
}

#[test]
fn config_encoding_follows_the_format_files_not_constants() {
    // A hypothetical kernel with the terms elsewhere, one of them split over two ranges.
    let formats = [
        ("pt", "config:0"),
        ("branch", "config:1"),
        ("tsc", "config:40"),
        ("psb_period", "config:2-3,60-61"),
    ];
    let sys = FakeSys::intel_pt("8", &formats, SKYLAKE_CAPS, 2);
    let opts = PtOptions {
        tsc: true,
        psb_period: Some(5), // 0b0101: low two bits → 2-3, high two bits → 60-61
        ..PtOptions::default()
    };
    assert_eq!(
        encode(&sys, opts),
        Ok(0b11 | (1 << 40) | (0b01 << 2) | (0b01 << 60))
    );
    // A term the kernel does not export.
    let opts = PtOptions {
        noretcomp: true,
        ..PtOptions::default()
    };
    assert_eq!(
        encode(&sys, opts),
        Err(ConfigError::MissingFormat { term: "noretcomp" })
    );
    // Without the `pt` pass-through, BranchEn cannot be turned off.
    let sys = FakeSys::intel_pt("8", &[("tsc", "config:10")], SKYLAKE_CAPS, 2);
    assert_eq!(encode(&sys, PtOptions::default()), Ok(0));
    let opts = PtOptions {
        branch: false,
        ..PtOptions::default()
    };
    assert_eq!(
        encode(&sys, opts),
        Err(ConfigError::MissingFormat { term: "pt" })
    );
}

#[test]
fn options_are_validated_against_caps() {
    let sys = FakeSys::skylake();
    // 0x249 has bits 0, 3, 6, 9: a decimal reading (249 = 0b1111_1001) would wrongly allow 4.
    let e = encode(
        &sys,
        PtOptions {
            mtc_period: Some(4),
            ..PtOptions::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        e,
        ConfigError::ValueNotAllowed {
            option: "mtc_period",
            value: 4,
            cap: "mtc_periods",
            allowed: 0x249
        }
    );
    assert!(e.to_string().contains("caps/mtc_periods"), "{e}");
    let e = encode(
        &sys,
        PtOptions {
            psb_period: Some(6),
            ..PtOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(
        e,
        ConfigError::ValueNotAllowed {
            cap: "psb_periods",
            value: 6,
            ..
        }
    ));
    let e = encode(
        &sys,
        PtOptions {
            cyc_thresh: Some(14),
            ..PtOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(
        e,
        ConfigError::ValueNotAllowed {
            cap: "cycle_thresholds",
            ..
        }
    ));
    let e = encode(
        &sys,
        PtOptions {
            mtc_period: Some(16),
            ..PtOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, ConfigError::ValueNotAllowed { .. }), "{e:?}");
    let e = encode(
        &sys,
        PtOptions {
            fup_on_ptw: true,
            ..PtOptions::default()
        },
    )
    .unwrap_err();
    assert_eq!(e, ConfigError::FupOnPtwWithoutPtw);

    // Each option against its missing capability, named in the error.
    let needs: &[(&str, PtOptions, &str)] = &[
        (
            "mtc",
            PtOptions {
                mtc_period: Some(3),
                ..PtOptions::default()
            },
            "mtc",
        ),
        (
            "psb_cyc",
            PtOptions {
                cyc_thresh: Some(1),
                ..PtOptions::default()
            },
            "cyc",
        ),
        (
            "psb_cyc",
            PtOptions {
                psb_period: Some(1),
                ..PtOptions::default()
            },
            "psb_period",
        ),
        (
            "ptwrite",
            PtOptions {
                ptw: true,
                ..PtOptions::default()
            },
            "ptw",
        ),
        (
            "power_event_trace",
            PtOptions {
                pwr_evt: true,
                ..PtOptions::default()
            },
            "pwr_evt",
        ),
    ];
    for (cap, opts, option) in needs {
        let sys = FakeSys::skylake();
        sys.set_cap(cap, "0");
        let e = encode(&sys, opts.clone()).unwrap_err();
        assert_eq!(e, ConfigError::MissingCap { option, cap }, "{cap}");
        assert!(e.to_string().contains(&format!("caps/{cap}")), "{e}");
        // The cap file missing entirely means the same.
        sys.remove(&format!("sys/bus/event_source/devices/intel_pt/caps/{cap}"));
        assert_eq!(
            encode(&sys, opts.clone()).unwrap_err(),
            ConfigError::MissingCap { option, cap }
        );
    }
    // tsc and noretcomp need no capability.
    let sys = FakeSys::intel_pt("8", KERNEL_FORMATS, &[], 2);
    assert_eq!(
        encode(
            &sys,
            PtOptions {
                tsc: true,
                noretcomp: true,
                ..PtOptions::default()
            }
        ),
        Ok(0x2001 | 0xC00)
    );
}

// ---------------------------------------------------------------------------------------------
// Address filters.

#[test]
fn filter_strings_are_validated_against_the_pmu() {
    let sys = FakeSys::skylake();
    let caps = caps_of(&sys);
    let cfg = |text: &str| PerfPtConfig {
        filters: filter::parse_filters(text).unwrap(),
        sys_root: sys.root(),
        ..PerfPtConfig::default()
    };
    let (spec, f) = plan(
        &caps,
        &cfg("filter 0x1000/0x200@/usr/bin/true, stop 0x2000/8@/usr/bin/true"),
    )
    .unwrap();
    assert_eq!(
        f.unwrap().to_str().unwrap(),
        "filter 0x1000/0x200@/usr/bin/true,stop 0x2000/0x8@/usr/bin/true"
    );
    assert_eq!(spec.pmu_type, 8);
    assert!(spec.exclude_kernel);

    let err = |text: &str| plan(&caps, &cfg(text)).unwrap_err();
    let e = err("filter 0x1000/0x10@/a filter 0x2000/0x10@/a filter 0x3000/0x10@/a");
    assert!(
        matches!(
            e,
            PerfPtError::Filter(FilterError::TooMany {
                requested: 3,
                available: 2
            })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("num_address_ranges"));
    let e = err("start 0x1000/0x10@/a");
    assert!(
        matches!(
            e,
            PerfPtError::Filter(FilterError::StartUnsupported { index: 0, .. })
        ),
        "{e}"
    );
    let e = err("filter 0x1000/0x10@/a,stop 0x1000@/a");
    assert!(
        matches!(
            e,
            PerfPtError::Filter(FilterError::ZeroSize { index: 1, .. })
        ),
        "{e}"
    );
    let e = err("filter 0xffffffff81000000/0x1000");
    assert!(
        matches!(
            e,
            PerfPtError::Filter(FilterError::KernelAddressOnUserEvent { .. })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("exclude_kernel"));

    sys.set_cap("ip_filtering", "0");
    let caps = caps_of(&sys);
    let e = plan(&caps, &cfg("filter 0x1000/0x10@/a")).unwrap_err();
    assert!(
        matches!(
            e,
            PerfPtError::Filter(FilterError::TooMany { available: 0, .. })
        ),
        "{e}"
    );
    // The options are validated by plan too.
    let c = PerfPtConfig {
        options: PtOptions {
            ptw: true,
            ..PtOptions::default()
        },
        ..PerfPtConfig::default()
    };
    sys.set_cap("ptwrite", "0");
    assert!(matches!(
        plan(&caps_of(&sys), &c),
        Err(PerfPtError::Config(ConfigError::MissingCap { .. }))
    ));

    assert!(matches!(
        filter::parse_filters("filter 0x1000/0x10@/a b"),
        Err(FilterError::BadAction { .. })
    ));
    assert!(matches!(
        filter::parse_filters("filter 12z/1@/a"),
        Err(FilterError::BadNumber { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// The real syscall path, driven through fake PMU descriptions.

#[test]
fn open_with_unknown_pmu_type_reports_the_kernel_refusal() {
    // A PMU type no kernel registers: perf_event_open must fail (ENOENT from perf_init_event).
    let sys = FakeSys::intel_pt("1000000", KERNEL_FORMATS, SKYLAKE_CAPS, 2);
    let e = PerfPtBackend::open(
        &[0],
        PerfPtConfig {
            sys_root: sys.root(),
            ..PerfPtConfig::default()
        },
    )
    .unwrap_err();
    let PerfPtError::Unavailable(u) = &e else {
        panic!("{e:?}");
    };
    assert!(
        matches!(u, PtUnavailable::PmuNotFound { pmu_type: 1_000_000, errno, .. } if *errno == libc::ENOENT)
            || matches!(u, PtUnavailable::Permission { .. }),
        "{u:?}"
    );
    if let PtUnavailable::PmuNotFound { .. } = u {
        assert!(
            e.to_string().contains("does not know PMU type 1000000"),
            "{e}"
        );
    }
}

#[test]
fn open_maps_the_data_ring_and_reports_the_aux_refusal_of_a_non_aux_pmu() {
    // Describe the software PMU (type 1) with formats that encode to PERF_COUNT_SW_DUMMY (9):
    // pt = bit 0, branch = bit 3. perf_event_open and the data-ring mmap then really succeed on
    // any Linux, and the AUX mmap is refused because the software PMU has no AUX support
    // (rb_alloc_aux: !has_aux(event) → EOPNOTSUPP) — which exercises the whole open/mmap path.
    let sys = FakeSys::intel_pt("1", &[("pt", "config:0"), ("branch", "config:3")], &[], 2);
    let r = PerfPtBackend::open(
        &[0],
        PerfPtConfig {
            sys_root: sys.root(),
            data_pages_log2: 1,
            aux_pages_log2: 1,
            start: StartMode::Manual,
            ..PerfPtConfig::default()
        },
    );
    match r {
        Err(PerfPtError::Mmap { what, source, .. }) => {
            assert_eq!(what, "AUX area");
            assert_eq!(source.raw_os_error(), Some(libc::EOPNOTSUPP), "{source}");
        }
        // Where perf is locked down entirely (paranoid 3 kernels, seccomp), open itself fails.
        Err(PerfPtError::Unavailable(PtUnavailable::Permission { .. })) => {}
        other => panic!("unexpected: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Simulated rings through the public API.

fn put(data: &mut [u8], at: u64, bytes: &[u8]) {
    let n = data.len() as u64;
    for (i, &b) in bytes.iter().enumerate() {
        data[((at + i as u64) % n) as usize] = b;
    }
}

fn aux_rec(off: u64, size: u64, flags: u64) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&11u32.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v.extend_from_slice(&48u16.to_le_bytes());
    for x in [off, size, flags] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]); // pid 1, tid 2
    v.extend_from_slice(&77u64.to_le_bytes()); // time
    v
}

#[test]
fn simulated_full_mode_session_with_wrap_and_truncation() {
    let page = PerfMmapPage::zeroed();
    page.data_size.store(128, Ordering::Relaxed);
    page.aux_size.store(32, Ordering::Relaxed);
    let mut data = vec![0u8; 128];
    let mut aux = vec![0u8; 32];
    // Start both rings near their ends so the first record and chunk straddle the wrap.
    let d0 = 1000 * 128 + 100;
    let a0 = 1000 * 32 + 20;
    page.data_head.store(d0, Ordering::Relaxed);
    page.data_tail.store(d0, Ordering::Relaxed);
    page.aux_head.store(a0, Ordering::Relaxed);
    page.aux_tail.store(a0, Ordering::Relaxed);
    // The "kernel" writes 24 trace bytes (wrapping at 32), then a truncated AUX record.
    let trace: Vec<u8> = (1..=24).collect();
    put(&mut aux, a0, &trace);
    page.aux_head.store(a0 + 24, Ordering::Release);
    put(&mut data, d0, &aux_rec(a0, 24, AuxFlags::TRUNCATED));
    page.data_head.store(d0 + 48, Ordering::Release);

    let mut stats = AuxStats::default();
    let mut sink: Vec<u8> = Vec::new();
    let mut reader = DataRingReader::new(SampleIdLayout {
        sample_type: SampleIdLayout::TID | SampleIdLayout::TIME,
    });
    let mut recs = Vec::new();
    reader
        .read(&page, &data, &mut stats, |r| recs.push(r.clone()))
        .unwrap();
    drain_aux_full(&page, &aux, None, &mut stats, |b| sink.trace(2, b)).unwrap();
    assert_eq!(sink, trace);
    assert_eq!(page.aux_tail.load(Ordering::Acquire), a0 + 24);
    assert_eq!(page.data_tail.load(Ordering::Acquire), d0 + 48);
    assert!(matches!(
        &recs[..],
        [SideRecord::Aux { aux_offset, aux_size: 24, flags, sample: Some(s) }]
            if *aux_offset == a0 && flags.truncated() && s.tid == Some(2) && s.time == Some(77)
    ));
    assert_eq!(
        (stats.truncated, stats.aux_records, stats.aux_bytes_copied),
        (1, 1, 24)
    );
    assert!(stats.any_loss());
}

#[test]
fn simulated_snapshot_keeps_the_newest_bytes() {
    let page = PerfMmapPage::zeroed();
    page.aux_size.store(16, Ordering::Relaxed);
    let mut aux = vec![0u8; 16];
    // intel_pt snapshot semantics: aux_head is the in-buffer position. 40 bytes written.
    let written: Vec<u8> = (1..=40).collect();
    put(&mut aux, 0, &written);
    page.aux_head.store(40 % 16, Ordering::Release);
    let mut snap = SnapshotReader::new();
    let mut stats = AuxStats::default();
    let mut out = Vec::new();
    let info = snap
        .take(&page, &aux, None, &mut stats, |b| out.extend_from_slice(b))
        .unwrap();
    assert_eq!(out, written[24..].to_vec());
    assert!(info.wrapped);
    assert_eq!(info.loss, SnapshotLoss::Unknown);
    assert_eq!(stats.snapshots_possibly_overwritten, 1);
}

#[test]
fn sinks_deliver_and_count() {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut s = ChannelSink::new(tx);
    s.trace(3, &[1, 2, 3]);
    s.side_record(
        3,
        &SideRecord::ItraceStart {
            pid: 1,
            tid: 3,
            sample: None,
        },
    );
    assert_eq!(
        rx.recv().unwrap(),
        TraceChunk::Trace {
            tid: 3,
            bytes: vec![1, 2, 3]
        }
    );
    assert!(matches!(
        rx.recv().unwrap(),
        TraceChunk::Side { tid: 3, .. }
    ));
    drop(rx);
    s.trace(3, &[4, 5]);
    s.side_record(
        3,
        &SideRecord::ItraceStart {
            pid: 1,
            tid: 3,
            sample: None,
        },
    );
    assert_eq!((s.dropped_bytes, s.dropped_records), (2, 1));
    let mut per_thread = std::collections::BTreeMap::<i32, Vec<u8>>::new();
    per_thread.trace(1, &[1]);
    per_thread.trace(2, &[2]);
    per_thread.trace(1, &[3]);
    assert_eq!(per_thread[&1], vec![1, 3]);
    assert_eq!(per_thread[&2], vec![2]);
    let _ = AuxMode::Snapshot;
}

#[test]
fn real_kernel_data_ring_is_read_with_our_page_layout() {
    // A software dummy event on this thread with MMAP side-band records: the kernel writes real
    // records into a real data ring, read through PerfMmapPage + DataRingReader. This checks the
    // control-page layout and the head/tail protocol against the running kernel.
    use ptrewind::capture::perf::event::{self, EventSpec, PerfEvent, PerfMmap};
    let mut attr = event::build_attr(&EventSpec {
        pmu_type: 1, // PERF_TYPE_SOFTWARE
        config: 9,   // PERF_COUNT_SW_DUMMY
        exclude_kernel: true,
        start: StartMode::Manual,
        aux_watermark: 0,
    });
    attr.set_mmap(1);
    attr.set_mmap_data(1);
    let ev = match PerfEvent::open(&attr, 0) {
        Ok(ev) => ev,
        // perf locked down here (no CAP_PERFMON and paranoid 3/seccomp): nothing to check.
        Err(e) if [libc::EACCES, libc::EPERM, libc::ENOSYS].contains(&e.errno) => return,
        Err(e) => panic!("perf_event_open(dummy) failed: errno {}", e.errno),
    };
    let map = PerfMmap::map_data_only(&ev, 2).unwrap();
    let page_size = event::page_size() as u64;
    let page = map.page();
    assert_eq!(page.data_offset.load(Ordering::Relaxed), page_size);
    assert_eq!(page.data_size.load(Ordering::Relaxed), 4 * page_size);
    assert_eq!(page.data_head.load(Ordering::Acquire), 0);
    ev.enable().unwrap();
    // Three file-backed data mappings → PERF_RECORD_MMAP records (type 1) for this thread.
    let file = tempfile::tempfile().unwrap();
    file.set_len(4096).unwrap();
    let maps: Vec<_> = (0..3).map(|_| map_file(&file)).collect();
    ev.disable().unwrap();
    let head = page.data_head.load(Ordering::Acquire);
    assert!(head > 0, "the kernel wrote no records");
    // poll(2) on a perf fd works (readiness depends on the wake-up watermark, so only 0/1).
    let ready = event::poll_readable(&[ev.raw_fd()], std::time::Duration::ZERO).unwrap();
    assert!(ready <= 1);
    let mut stats = AuxStats::default();
    let mut reader = DataRingReader::new(SampleIdLayout {
        sample_type: event::SIDEBAND_SAMPLE_TYPE,
    });
    let mut types = Vec::new();
    let n = reader
        .read(page, &map.data(), &mut stats, |r| {
            if let SideRecord::Other { type_, size, .. } = r {
                types.push((*type_, *size));
            }
        })
        .unwrap();
    assert!(n >= 3, "{types:?}");
    assert_eq!(
        types.iter().filter(|(t, _)| *t == 1).count(),
        3,
        "{types:?}"
    );
    assert!(
        types.iter().all(|&(_, s)| s % 8 == 0),
        "records are u64-aligned: {types:?}"
    );
    assert_eq!(page.data_tail.load(Ordering::Acquire), head);
    assert!(!stats.any_loss(), "{stats:?}");
    drop(maps);
}

/// A read-only shared mapping of `file` (memmap2).
fn map_file(file: &std::fs::File) -> memmap2::Mmap {
    // SAFETY: the temporary file is private to this test and never truncated while mapped.
    unsafe { memmap2::Mmap::map(file) }.unwrap()
}

#[test]
fn threads_of_lists_proc_task() {
    use ptrewind::capture::perf::threads_of;
    // The real /proc for this process includes the calling thread.
    let me = std::process::id() as i32;
    let tids = threads_of(&SysRoot::default(), me).unwrap();
    assert!(tids.contains(&me), "{tids:?}");
    // A fake tree.
    let sys = FakeSys::new();
    for t in ["42", "7", "100"] {
        fs::create_dir_all(sys.dir.path().join(format!("proc/42/task/{t}"))).unwrap();
    }
    assert_eq!(threads_of(&sys.root(), 42).unwrap(), vec![7, 42, 100]);
    let e = threads_of(&sys.root(), 43).unwrap_err();
    assert!(e.to_string().contains("/proc/43/task"), "{e}");
}

#[test]
fn perf_event_open_errors_are_explained() {
    use ptrewind::capture::perf::classify_open_error;
    use ptrewind::capture::perf::event::OpenError;
    let c = |errno| classify_open_error(OpenError { tid: 42, errno }, 8, Some(3));
    for errno in [libc::EACCES, libc::EPERM] {
        let e = c(errno);
        assert!(
            matches!(
                e,
                PtUnavailable::Permission {
                    tid: 42,
                    paranoid: Some(3),
                    ..
                }
            ),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("perf_event_paranoid = 3") && msg.contains("CAP_PERFMON"),
            "{msg}"
        );
    }
    let e = c(libc::ENOENT);
    assert!(
        matches!(e, PtUnavailable::PmuNotFound { pmu_type: 8, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("does not know PMU type 8"));
    let e = c(libc::EOPNOTSUPP);
    assert!(matches!(e, PtUnavailable::NotSupported { .. }), "{e:?}");
    assert!(e.to_string().contains("refused"));
    let e = c(libc::EBUSY);
    assert!(e.to_string().contains("already in use"), "{e}");
    let e = c(libc::EINVAL);
    assert!(matches!(e, PtUnavailable::OpenFailed { errno, .. } if errno == libc::EINVAL));
    assert!(e.to_string().contains("Invalid argument"), "{e}");
}

/// The hardware backend's live session stops at the end of the program (no PT machine here: the
/// AUX area is a simulated source, the process a real one under ptrace): the exit is a stop of
/// the timeline (`Exiting`, with the at-exit notice), the AUX data written meanwhile is drained
/// into the store at that stop, the process is still there (its registers readable), and the
/// next resume lets it exit.
#[test]
fn hardware_live_session_stops_at_the_exit() {
    use ptrewind::capture::perf::{AuxSink, DrainSource, PerfCapture, PerfPtError, PtSource};
    use ptrewind::ring::aux::AuxStats;
    use ptrewind::target::{Notice, PtraceTarget, Resume, SpawnOptions, StopEvent};
    use ptrewind::timeline::Timeline;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    /// Hands out `PAYLOAD` once per resume (as a CPU would write trace while the process runs).
    struct Sim {
        pending: Arc<AtomicU64>,
    }
    const PAYLOAD: &[u8] = &[0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82];
    impl DrainSource for Sim {
        fn drain_once(&mut self, sink: &mut dyn AuxSink) -> Result<u64, PerfPtError> {
            if self.pending.swap(0, Ordering::AcqRel) == 0 {
                return Ok(0);
            }
            sink.trace(1, PAYLOAD);
            Ok(PAYLOAD.len() as u64)
        }
        fn wait_ready(&self, period: Duration) {
            std::thread::sleep(period.min(Duration::from_millis(2)));
        }
    }
    impl PtSource for Sim {
        fn set_tracing(&mut self, on: bool) -> Result<(), PerfPtError> {
            if on {
                self.pending.store(1, Ordering::Release);
            }
            Ok(())
        }
        fn aux_stats(&self) -> AuxStats {
            AuxStats::default()
        }
    }
    let pending = Arc::new(AtomicU64::new(1));
    let target = PtraceTarget::spawn(&"/bin/true".into(), &[], &SpawnOptions::default())
        .expect("spawn /bin/true");
    let capture = PerfCapture::with_source(
        target,
        Sim {
            pending: Arc::clone(&pending),
        },
    )
    .stop_at_exit(true);
    let mut t = Timeline::live(Box::new(capture), true).expect("timeline");
    let store = t.trace_store();
    t.resume(Resume::Continue { signal: None }).unwrap();
    assert_eq!(
        t.wait(true).unwrap(),
        Some(StopEvent::Exiting { signal: None })
    );
    assert!(t.take_notices().contains(&Notice::AtExit { signal: None }));
    assert_eq!(store.len(), PAYLOAD.len(), "drained at the exit stop");
    assert!(!t.has_exited());
    let regs = t.read_registers().expect("registers at the exit");
    assert_ne!(regs.pc(), 0);
    t.resume(Resume::Continue { signal: None }).unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Exited(0)));
    assert!(t.has_exited());
}
