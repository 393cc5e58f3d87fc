//! Hardware Intel PT capture through the perf `intel_pt` PMU.
//!
//! * [`pmu`] — sysfs discovery (`type`, `format/*`, `caps/*`, perf sysctls) and encoding of
//!   [`PtOptions`] into `perf_event_attr.config`;
//! * [`filter`] — `PERF_EVENT_IOC_SET_FILTER` address filters;
//! * [`event`] — the `perf_event_open`/`mmap`/`ioctl` boundary (the only `unsafe` here);
//! * [`PerfPtBackend`] — one event per traced thread, draining side-band records and AUX bytes
//!   into a [`AuxSink`], optionally from a background thread ([`Drainer`]);
//! * [`live`] — the backend as a [`LiveBackend`](crate::capture::LiveBackend) driving a
//!   ptrace process at full speed ([`PerfCapture`]), with the AUX pipeline ([`AuxPipeline`]);
//! * [`probe`] — "can this machine do it?", with an error that names exactly what is missing.
//!
//! The ring logic itself is in [`crate::ring::aux`].

pub mod drainer;
pub mod event;
pub mod filter;
pub mod live;
pub mod pmu;

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use thiserror::Error;

pub use drainer::{DrainSource, Drainer, DrainerResult};
pub use event::{AuxMode, EventSpec, StartMode};
pub use filter::{AddrFilter, FilterAction, FilterError};
pub use live::{AuxPipeline, PerfCapture, PtSource, StoreSink, host_cpu};
pub use pmu::{ConfigError, PmuError, PtCapabilities, PtOptions, SysRoot};

use crate::ring::aux::{
    AuxStats, DataRingReader, RingError, SampleIdLayout, SideRecord, SnapshotInfo, SnapshotReader,
    drain_aux_full,
};
use event::{OpenError, PerfEvent, PerfMmap};

/// Linux capability numbers checked in `CapEff` (`include/uapi/linux/capability.h`).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;

/// Why Intel PT cannot be used here. The `Display` text is meant for the user as is, so that
/// `--backend pt` can fail with it and `--backend auto` can say why it fell back.
#[derive(Debug, Error)]
pub enum PtUnavailable {
    /// No `intel_pt` PMU in sysfs.
    #[error(
        "no intel_pt PMU: {path} does not exist: {}",
        no_pmu_reason(vendor.as_deref(), *hypervisor, *cpu_flag)
    )]
    NoPmu {
        /// The directory looked for.
        path: std::path::PathBuf,
        /// `vendor_id` from `/proc/cpuinfo`.
        vendor: Option<String>,
        /// `/proc/cpuinfo` lists the `hypervisor` flag.
        hypervisor: bool,
        /// `/proc/cpuinfo` lists the `intel_pt` flag.
        cpu_flag: bool,
    },
    /// The PMU exists but its sysfs description is unreadable or malformed.
    #[error("intel_pt PMU description unreadable: {0}")]
    PmuUnreadable(#[from] PmuError),
    /// `perf_event_paranoid` forbids the requested mode for an unprivileged user.
    #[error(
        "perf_event_paranoid is {value}, but tracing {what} without CAP_PERFMON needs ≤ {max}: run `sysctl kernel.perf_event_paranoid={max}` (or grant CAP_PERFMON / run as root)"
    )]
    ParanoidTooHigh {
        /// Current value.
        value: i32,
        /// Highest value that allows the mode.
        max: i32,
        /// `"user space"` or `"kernel and user space"`.
        what: &'static str,
    },
    /// `EACCES`/`EPERM` from `perf_event_open`.
    #[error(
        "perf_event_open({}) denied: {} (perf_event_paranoid = {}; needs ≤ 2 for user-space tracing of your own processes, or CAP_PERFMON / CAP_SYS_ADMIN, and ptrace access to the target)",
        tid, io::Error::from_raw_os_error(*errno), paranoid.map_or("unknown".into(), |p| p.to_string())
    )]
    Permission {
        /// The thread.
        tid: i32,
        /// `EACCES` or `EPERM`.
        errno: i32,
        /// `perf_event_paranoid`, if known.
        paranoid: Option<i32>,
    },
    /// `ENOENT`/`ENODEV` from `perf_event_open`: the kernel has no PMU of that type.
    #[error(
        "perf_event_open({tid}) failed with {}: the kernel does not know PMU type {pmu_type} (intel_pt driver not loaded or sysfs stale)",
        io::Error::from_raw_os_error(*errno)
    )]
    PmuNotFound {
        /// The thread.
        tid: i32,
        /// The error.
        errno: i32,
        /// The type tried.
        pmu_type: u32,
    },
    /// `EOPNOTSUPP` from `perf_event_open`.
    #[error(
        "perf_event_open({tid}) failed with {}: the intel_pt driver refused the event (PT unusable in this configuration, e.g. owned by a hypervisor/VMX, or an unsupported filter/mode)",
        io::Error::from_raw_os_error(*errno)
    )]
    NotSupported {
        /// The thread.
        tid: i32,
        /// The error.
        errno: i32,
    },
    /// `EBUSY`: another PT user (the PMU is exclusive).
    #[error(
        "perf_event_open({tid}) failed with {}: Intel PT is already in use by another event (the intel_pt PMU is exclusive)",
        io::Error::from_raw_os_error(*errno)
    )]
    Busy {
        /// The thread.
        tid: i32,
        /// The error.
        errno: i32,
    },
    /// Any other `perf_event_open` error (`EINVAL`, `E2BIG`, `ESRCH`, ...).
    #[error("perf_event_open({tid}) failed: {}", io::Error::from_raw_os_error(*errno))]
    OpenFailed {
        /// The thread.
        tid: i32,
        /// The error.
        errno: i32,
    },
}

fn no_pmu_reason(vendor: Option<&str>, hypervisor: bool, cpu_flag: bool) -> String {
    let vendor_text = vendor.unwrap_or("unknown vendor");
    match (vendor, hypervisor, cpu_flag) {
        (Some(v), _, _) if v != "GenuineIntel" => format!(
            "the CPU vendor is {v}; Intel Processor Trace exists only on Intel CPUs (AMD and other CPUs have no intel_pt PMU)"
        ),
        (_, true, false) => format!(
            "this {vendor_text} CPU runs under a hypervisor that does not expose Intel PT to the guest (CPUID.(EAX=07H,ECX=0):EBX[25] is clear in the VM; KVM needs PT passthrough and most cloud VMs hide it)"
        ),
        (_, _, false) => format!(
            "this {vendor_text} CPU does not report Intel PT (/proc/cpuinfo has no intel_pt flag)"
        ),
        (_, _, true) => "the CPU reports intel_pt but the kernel has no intel_pt PMU driver (CONFIG_PERF_EVENTS_INTEL_PT?)".into(),
    }
}

/// Maps a `perf_event_open` errno to the user-facing reason.
pub fn classify_open_error(err: OpenError, pmu_type: u32, paranoid: Option<i32>) -> PtUnavailable {
    let OpenError { tid, errno } = err;
    match errno {
        libc::EACCES | libc::EPERM => PtUnavailable::Permission {
            tid,
            errno,
            paranoid,
        },
        libc::ENOENT | libc::ENODEV => PtUnavailable::PmuNotFound {
            tid,
            errno,
            pmu_type,
        },
        libc::EOPNOTSUPP => PtUnavailable::NotSupported { tid, errno },
        libc::EBUSY => PtUnavailable::Busy { tid, errno },
        _ => PtUnavailable::OpenFailed { tid, errno },
    }
}

/// What [`probe_at`] should check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeRequest {
    /// User space only (`exclude_kernel = 1`, paranoid ≤ 2) rather than kernel too (≤ 1).
    pub user_only: bool,
    /// Open (and close) a disabled trial event on the calling thread.
    pub try_open: bool,
}

impl Default for ProbeRequest {
    fn default() -> Self {
        Self {
            user_only: true,
            try_open: true,
        }
    }
}

fn cpuinfo_facts(root: &SysRoot) -> (Option<String>, bool, bool) {
    let Ok(text) = std::fs::read_to_string(root.cpuinfo_path()) else {
        return (None, false, false);
    };
    let mut vendor = None;
    let mut hyper = false;
    let mut pt = false;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        match k.trim() {
            "vendor_id" if vendor.is_none() => vendor = Some(v.trim().to_owned()),
            "flags" => {
                for f in v.split_whitespace() {
                    hyper |= f == "hypervisor";
                    pt |= f == "intel_pt";
                }
            }
            _ => {}
        }
    }
    (vendor, hyper, pt)
}

/// True if `CapEff` in `<root>/proc/self/status` has CAP_PERFMON or CAP_SYS_ADMIN.
fn has_perf_capability(root: &SysRoot) -> bool {
    let Ok(text) = std::fs::read_to_string(root.self_status_path()) else {
        return false;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_PERFMON | 1 << CAP_SYS_ADMIN) != 0)
}

/// Probes the machine for Intel PT: PMU present, description readable, perf sysctls allow it,
/// and (with `try_open`) the kernel accepts a disabled event on the calling thread.
pub fn probe_at(root: &SysRoot, req: ProbeRequest) -> Result<PtCapabilities, PtUnavailable> {
    let dir = root.intel_pt_dir();
    if !dir.exists() {
        let (vendor, hypervisor, cpu_flag) = cpuinfo_facts(root);
        return Err(PtUnavailable::NoPmu {
            path: dir,
            vendor,
            hypervisor,
            cpu_flag,
        });
    }
    let caps = PtCapabilities::discover(root)?;
    if let Some(value) = caps.paranoid
        && !has_perf_capability(root)
    {
        let (max, what) = if req.user_only {
            (2, "user space")
        } else {
            (1, "kernel and user space")
        };
        if value > max {
            return Err(PtUnavailable::ParanoidTooHigh { value, max, what });
        }
    }
    if req.try_open {
        let config = caps
            .encode_config(&PtOptions::default())
            .unwrap_or_default();
        let attr = event::build_attr(&EventSpec {
            pmu_type: caps.pmu_type,
            config,
            exclude_kernel: req.user_only,
            start: StartMode::Manual,
            aux_watermark: 0,
        });
        PerfEvent::open(&attr, 0)
            .map_err(|e| classify_open_error(e, caps.pmu_type, caps.paranoid))?;
    }
    Ok(caps)
}

/// [`probe_at`] on the real `/sys` and `/proc`, user-space tracing, with a trial open.
pub fn probe() -> Result<PtCapabilities, PtUnavailable> {
    probe_at(&SysRoot::default(), ProbeRequest::default())
}

/// Configuration of [`PerfPtBackend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfPtConfig {
    /// Trace packet options.
    pub options: PtOptions,
    /// Full (stream everything) or snapshot (flight recorder).
    pub mode: AuxMode,
    /// Data ring = 2^n pages (side-band records).
    pub data_pages_log2: u8,
    /// AUX area = 2^n pages (each thread).
    pub aux_pages_log2: u8,
    /// `aux_watermark` in bytes (`None` = kernel default, half the AUX area).
    pub aux_watermark: Option<u32>,
    /// Address filters (validated against `caps/num_address_ranges`).
    pub filters: Vec<AddrFilter>,
    /// How the events start.
    pub start: StartMode,
    /// Trace user space only (`exclude_kernel = 1`). Kernel tracing needs paranoid ≤ 1.
    pub user_only: bool,
    /// Where sysfs/procfs are.
    pub sys_root: SysRoot,
}

impl Default for PerfPtConfig {
    fn default() -> Self {
        Self {
            options: PtOptions::default(),
            mode: AuxMode::Full,
            data_pages_log2: 3,
            aux_pages_log2: 7,
            aux_watermark: None,
            filters: Vec::new(),
            start: StartMode::AfterMmap,
            user_only: true,
            sys_root: SysRoot::default(),
        }
    }
}

/// Errors of the hardware backend.
#[derive(Debug, Error)]
pub enum PerfPtError {
    /// Intel PT is not usable here (the message says why).
    #[error(transparent)]
    Unavailable(#[from] PtUnavailable),
    /// A requested option is not supported by the CPU or kernel.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An address filter is invalid for `intel_pt`.
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// No thread to trace.
    #[error("no thread ids to trace")]
    NoThreads,
    /// The threads of a process could not be listed.
    #[error("cannot list the threads of process {pid} (/proc/{pid}/task): {source}")]
    Threads {
        /// The process.
        pid: i32,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The thread is already traced.
    #[error("thread {0} is already traced")]
    DuplicateThread(i32),
    /// A mapping failed (`EPERM`/`ENOMEM` here usually means the perf mlock budget).
    #[error(
        "mmap of the {what} ({len} bytes) for thread {tid} failed: {source} (perf_event_mlock_kb / RLIMIT_MEMLOCK limit the AUX size; try fewer aux pages)"
    )]
    Mmap {
        /// The thread.
        tid: i32,
        /// Which mapping.
        what: &'static str,
        /// Size requested.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An ioctl failed.
    #[error("{what} ioctl on thread {tid} failed: {source}")]
    Ioctl {
        /// The thread.
        tid: i32,
        /// Which ioctl.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The ring contents were inconsistent.
    #[error("thread {tid}: {source}")]
    Ring {
        /// The thread.
        tid: i32,
        /// The ring error.
        #[source]
        source: RingError,
    },
}

/// The thread ids of `pid`, sorted, from `<root>/proc/<pid>/task`.
pub fn threads_of(root: &SysRoot, pid: i32) -> Result<Vec<i32>, PerfPtError> {
    let dir = root.task_dir(pid);
    let err = |source| PerfPtError::Threads { pid, source };
    let mut tids = Vec::new();
    for e in std::fs::read_dir(&dir).map_err(err)? {
        let e = e.map_err(err)?;
        if let Some(tid) = e.file_name().to_str().and_then(|n| n.parse().ok()) {
            tids.push(tid);
        }
    }
    tids.sort_unstable();
    Ok(tids)
}

/// Where drained trace goes. Keep it small so the trace store can implement it.
pub trait AuxSink {
    /// Raw Intel PT bytes of thread `tid`, in order (oldest first).
    fn trace(&mut self, tid: i32, bytes: &[u8]);
    /// A side-band record of thread `tid`'s event (AUX, ITRACE_START, LOST, ...).
    fn side_record(&mut self, tid: i32, record: &SideRecord) {
        let _ = (tid, record);
    }
    /// A snapshot of thread `tid` was taken (snapshot mode), after its bytes.
    fn snapshot(&mut self, tid: i32, info: &SnapshotInfo) {
        let _ = (tid, info);
    }
}

/// Appends every thread's bytes to one vector (only meaningful for a single traced thread).
impl AuxSink for Vec<u8> {
    fn trace(&mut self, _tid: i32, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Keeps one byte stream per thread.
impl AuxSink for BTreeMap<i32, Vec<u8>> {
    fn trace(&mut self, tid: i32, bytes: &[u8]) {
        self.entry(tid).or_default().extend_from_slice(bytes);
    }
}

/// Any closure `FnMut(tid, bytes)` is a sink for trace bytes (side-band records are ignored).
impl<F: FnMut(i32, &[u8])> AuxSink for F {
    fn trace(&mut self, tid: i32, bytes: &[u8]) {
        self(tid, bytes)
    }
}

/// A chunk sent by [`ChannelSink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceChunk {
    /// Trace bytes.
    Trace {
        /// The thread.
        tid: i32,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// A side-band record.
    Side {
        /// The thread.
        tid: i32,
        /// The record.
        record: SideRecord,
    },
}

/// Sends chunks over a channel (to a store thread). Sends to a closed channel are counted in
/// `dropped_bytes`/`dropped_records`, not ignored.
#[derive(Debug)]
pub struct ChannelSink {
    /// The channel.
    pub tx: mpsc::Sender<TraceChunk>,
    /// Trace bytes that could not be sent because the receiver was gone.
    pub dropped_bytes: u64,
    /// Side-band records that could not be sent because the receiver was gone.
    pub dropped_records: u64,
}

impl ChannelSink {
    /// A sink over `tx`.
    pub fn new(tx: mpsc::Sender<TraceChunk>) -> Self {
        Self {
            tx,
            dropped_bytes: 0,
            dropped_records: 0,
        }
    }
}

impl AuxSink for ChannelSink {
    fn trace(&mut self, tid: i32, bytes: &[u8]) {
        let chunk = TraceChunk::Trace {
            tid,
            bytes: bytes.to_vec(),
        };
        if self.tx.send(chunk).is_err() {
            self.dropped_bytes += bytes.len() as u64;
        }
    }
    fn side_record(&mut self, tid: i32, record: &SideRecord) {
        let chunk = TraceChunk::Side {
            tid,
            record: record.clone(),
        };
        if self.tx.send(chunk).is_err() {
            self.dropped_records += 1;
        }
    }
}

struct ThreadStream {
    event: PerfEvent,
    map: PerfMmap,
    data: DataRingReader,
    snap: SnapshotReader,
    stats: AuxStats,
    /// Tracing has started (explicit enable, or ITRACE_START seen after enable_on_exec).
    started: bool,
    /// The user disabled it; snapshots must not re-enable.
    user_disabled: bool,
}

/// The hardware Intel PT backend: one `intel_pt` event per traced thread.
pub struct PerfPtBackend {
    caps: PtCapabilities,
    spec: EventSpec,
    config: PerfPtConfig,
    filter: Option<std::ffi::CString>,
    streams: BTreeMap<i32, ThreadStream>,
}

impl std::fmt::Debug for PerfPtBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerfPtBackend")
            .field("pmu_type", &self.caps.pmu_type)
            .field("config", &format_args!("{:#x}", self.spec.config))
            .field("mode", &self.config.mode)
            .field("threads", &self.streams.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Validates `config` against the PMU and returns the event spec and filter string, without
/// opening anything (what [`PerfPtBackend::open`] does first).
pub fn plan(
    caps: &PtCapabilities,
    config: &PerfPtConfig,
) -> Result<(EventSpec, Option<std::ffi::CString>), PerfPtError> {
    let cfg = caps.encode_config(&config.options)?;
    let filter = if config.filters.is_empty() {
        None
    } else {
        filter::validate_for_intel_pt(
            &config.filters,
            caps.num_address_ranges(),
            config.user_only,
        )?;
        Some(filter::ioctl_string(&config.filters)?)
    };
    Ok((
        EventSpec {
            pmu_type: caps.pmu_type,
            config: cfg,
            exclude_kernel: config.user_only,
            start: config.start,
            aux_watermark: config.aux_watermark.unwrap_or(0),
        },
        filter,
    ))
}

impl PerfPtBackend {
    /// Probes the PMU under `config.sys_root`, validates the options and filters, and opens,
    /// maps, filters and (per [`StartMode`]) enables one event per thread in `tids`.
    pub fn open(tids: &[i32], config: PerfPtConfig) -> Result<Self, PerfPtError> {
        if tids.is_empty() {
            return Err(PerfPtError::NoThreads);
        }
        let caps = probe_at(
            &config.sys_root,
            ProbeRequest {
                user_only: config.user_only,
                try_open: false,
            },
        )?;
        let (spec, filter) = plan(&caps, &config)?;
        let mut this = Self {
            caps,
            spec,
            config,
            filter,
            streams: BTreeMap::new(),
        };
        for &tid in tids {
            this.add_thread(tid)?;
        }
        Ok(this)
    }

    /// [`PerfPtBackend::open`] on every thread listed in `/proc/<pid>/task` (under
    /// `config.sys_root`). Threads created later are not followed automatically (per-task AUX
    /// events cannot be inherited): the tracer adds them with [`PerfPtBackend::add_thread`] when
    /// it sees the clone.
    pub fn open_process(pid: i32, config: PerfPtConfig) -> Result<Self, PerfPtError> {
        let tids = threads_of(&config.sys_root, pid)?;
        Self::open(&tids, config)
    }

    /// Starts tracing a thread created after `open` (per-task events are not inherited).
    pub fn add_thread(&mut self, tid: i32) -> Result<(), PerfPtError> {
        if self.streams.contains_key(&tid) {
            return Err(PerfPtError::DuplicateThread(tid));
        }
        let attr = event::build_attr(&self.spec);
        let event = PerfEvent::open(&attr, tid)
            .map_err(|e| classify_open_error(e, self.caps.pmu_type, self.caps.paranoid))?;
        let map = PerfMmap::map(
            &event,
            self.config.data_pages_log2,
            self.config.aux_pages_log2,
            self.config.mode,
        )
        .map_err(|e| PerfPtError::Mmap {
            tid,
            what: e.what,
            len: e.len,
            source: e.source,
        })?;
        if let Some(f) = &self.filter {
            event.set_filter(f).map_err(|source| PerfPtError::Ioctl {
                tid,
                what: "PERF_EVENT_IOC_SET_FILTER",
                source,
            })?;
        }
        let started = self.spec.start == StartMode::AfterMmap;
        if started {
            event.enable().map_err(|source| PerfPtError::Ioctl {
                tid,
                what: "PERF_EVENT_IOC_ENABLE",
                source,
            })?;
        }
        self.streams.insert(
            tid,
            ThreadStream {
                event,
                map,
                data: DataRingReader::new(SampleIdLayout {
                    sample_type: event::SIDEBAND_SAMPLE_TYPE,
                }),
                snap: SnapshotReader::new(),
                stats: AuxStats::default(),
                started,
                user_disabled: false,
            },
        );
        Ok(())
    }

    /// Drains and closes the event of a thread that exited; returns its final stats.
    pub fn remove_thread<S: AuxSink + ?Sized>(
        &mut self,
        tid: i32,
        sink: &mut S,
    ) -> Result<Option<AuxStats>, PerfPtError> {
        let Some(mut s) = self.streams.remove(&tid) else {
            return Ok(None);
        };
        let _ = s.event.disable();
        s.user_disabled = true;
        drain_stream(tid, &mut s, self.config.mode, sink)?;
        Ok(Some(s.stats))
    }

    /// The traced threads.
    pub fn threads(&self) -> Vec<i32> {
        self.streams.keys().copied().collect()
    }

    /// The PMU description used.
    pub fn capabilities(&self) -> &PtCapabilities {
        &self.caps
    }

    /// The encoded `attr.config`.
    pub fn attr_config(&self) -> u64 {
        self.spec.config
    }

    /// `PERF_EVENT_IOC_ENABLE` on every thread.
    pub fn enable(&mut self) -> Result<(), PerfPtError> {
        for (&tid, s) in &mut self.streams {
            s.event.enable().map_err(|source| PerfPtError::Ioctl {
                tid,
                what: "PERF_EVENT_IOC_ENABLE",
                source,
            })?;
            s.started = true;
            s.user_disabled = false;
        }
        Ok(())
    }

    /// `PERF_EVENT_IOC_DISABLE` on every thread.
    pub fn disable(&mut self) -> Result<(), PerfPtError> {
        for (&tid, s) in &mut self.streams {
            s.event.disable().map_err(|source| PerfPtError::Ioctl {
                tid,
                what: "PERF_EVENT_IOC_DISABLE",
                source,
            })?;
            s.user_disabled = true;
        }
        Ok(())
    }

    /// Moves everything available into `sink`: side-band records first (they are counted in the
    /// stats), then trace bytes — in full mode everything between `aux_tail` and `aux_head`, in
    /// snapshot mode the whole flight-recorder buffer (the event is disabled around the copy and
    /// re-enabled unless the user disabled it). Returns the trace bytes moved. Per-thread errors
    /// do not stop the other threads; the first one is returned after all were drained.
    pub fn drain_into<S: AuxSink + ?Sized>(&mut self, sink: &mut S) -> Result<u64, PerfPtError> {
        let mut total = 0;
        let mut first_err = None;
        for (&tid, s) in &mut self.streams {
            match drain_stream(tid, s, self.config.mode, sink) {
                Ok(n) => total += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    /// Aggregated counters of all threads (including removed ones is the caller's business:
    /// [`PerfPtBackend::remove_thread`] returns them).
    pub fn stats(&self) -> AuxStats {
        let mut total = AuxStats::default();
        for s in self.streams.values() {
            total.accumulate(&s.stats);
        }
        total
    }

    /// Counters per thread.
    pub fn thread_stats(&self) -> Vec<(i32, AuxStats)> {
        self.streams.iter().map(|(&t, s)| (t, s.stats)).collect()
    }

    /// Disables every event, drains the rest into `sink`, unmaps and closes. Returns the final
    /// counters.
    pub fn close<S: AuxSink + ?Sized>(mut self, sink: &mut S) -> Result<AuxStats, PerfPtError> {
        for s in self.streams.values_mut() {
            let _ = s.event.disable();
            s.user_disabled = true;
        }
        let r = self.drain_into(sink);
        let stats = self.stats();
        r.map(|_| stats)
    }

    /// Moves the backend into a background thread that drains into `sink` whenever an event's
    /// fd becomes readable (the kernel wakes pollers at `aux_watermark`) or every `period`.
    pub fn spawn_drainer<S: AuxSink + Send + 'static>(
        self,
        sink: S,
        period: Duration,
    ) -> Drainer<S> {
        drainer::spawn_drainer(self, sink, period)
    }

    fn wait_readable(&self, period: Duration) {
        let fds: Vec<_> = self.streams.values().map(|s| s.event.raw_fd()).collect();
        if fds.is_empty() {
            std::thread::sleep(period);
        } else {
            // An interrupted or failed poll only shortens the wait; the drain that follows
            // reads the rings regardless.
            let _ = event::poll_readable(&fds, period);
        }
    }
}

fn drain_stream<S: AuxSink + ?Sized>(
    tid: i32,
    s: &mut ThreadStream,
    mode: AuxMode,
    sink: &mut S,
) -> Result<u64, PerfPtError> {
    let ring_err = |source| PerfPtError::Ring { tid, source };
    let truncated_before = s.stats.truncated;
    let aux_records_before = s.stats.aux_records;
    let mut saw_start = false;
    let data_result = s
        .data
        .read(s.map.page(), &s.map.data(), &mut s.stats, |rec| {
            saw_start |= matches!(rec, SideRecord::ItraceStart { .. });
            sink.side_record(tid, rec);
        });
    if saw_start && !s.user_disabled {
        s.started = true;
    }
    if s.stats.aux_records > aux_records_before {
        s.snap.note_aux_record();
    }
    let moved = match mode {
        AuxMode::Full => {
            let page = s.map.page();
            let was_full = page
                .aux_head
                .load(Ordering::Acquire)
                .wrapping_sub(page.aux_tail.load(Ordering::Relaxed))
                >= page.aux_size.load(Ordering::Relaxed);
            let n = drain_aux_full(page, &s.map.aux(), None, &mut s.stats, |b| {
                sink.trace(tid, b)
            })
            .map_err(ring_err)?;
            // When the AUX area has no free space, perf_aux_output_begin() sets the event's
            // pending_disable and the kernel disables it; space alone does not restart it. Once the
            // drain has freed the area, re-enable an event that is meant to be running (ENABLE on a
            // running event is a no-op).
            if (was_full || s.stats.truncated > truncated_before) && s.started && !s.user_disabled {
                s.event.enable().map_err(|source| PerfPtError::Ioctl {
                    tid,
                    what: "PERF_EVENT_IOC_ENABLE",
                    source,
                })?;
                s.stats.reenables += 1;
            }
            n
        }
        AuxMode::Snapshot => {
            if !s.started {
                0
            } else {
                let running = !s.user_disabled;
                if running {
                    s.event.disable().map_err(|source| PerfPtError::Ioctl {
                        tid,
                        what: "PERF_EVENT_IOC_DISABLE",
                        source,
                    })?;
                }
                let info = s
                    .snap
                    .take(s.map.page(), &s.map.aux(), None, &mut s.stats, |b| {
                        sink.trace(tid, b)
                    });
                if running {
                    s.event.enable().map_err(|source| PerfPtError::Ioctl {
                        tid,
                        what: "PERF_EVENT_IOC_ENABLE",
                        source,
                    })?;
                }
                let info = info.map_err(ring_err)?;
                sink.snapshot(tid, &info);
                info.bytes
            }
        }
    };
    data_result.map_err(ring_err)?;
    Ok(moved)
}
