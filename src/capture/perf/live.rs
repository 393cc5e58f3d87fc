//! The hardware backend as a [`LiveBackend`]: the process runs at full speed under ptrace with
//! ordinary INT3 breakpoints while the CPU traces it through the perf `intel_pt` PMU
//! ([`PerfPtBackend`]); the AUX area is drained into the [`TraceStore`] the history worker
//! indexes.
//!
//! ## The AUX pipeline ([`AuxPipeline`])
//!
//! While the process runs, a [`Drainer`] thread owns the backend and moves AUX bytes into the
//! store whenever the kernel wakes it (at `aux_watermark`) or every [`DRAIN_PERIOD`], so the AUX
//! area does not fill. When the process stops (a ptrace stop schedules the task out, which makes
//! the `intel_pt` driver publish `aux_head` for everything traced up to the stop), the drainer is
//! stopped and the stop *waits for the drain*: the backend is drained on the server thread until
//! a drain brings nothing new, at most [`STOP_DRAIN_BOUND`]; past the bound the stop is reported
//! anyway and the problem is kept for `monitor stats` ("the trace at this stop may be incomplete
//! ..."). Only then is the history asked to index the stop.
//!
//! The pipeline is generic over the [`PtSource`] it drains, so the very code the live backend
//! runs is tested with simulated perf mmap pages (see the tests): only the system calls behind
//! [`PerfPtBackend`] are not exercised on a machine without Intel PT.
//!
//! ## Where a stop sits in the history
//!
//! A stop ends the trace where the task left user space: a single step (`#DB` after the
//! instruction) and an INT3 breakpoint (a software interrupt from the breakpoint address) both
//! end with FUP at the stop PC and TIP.PGD, so the instruction at the stop PC is not in the
//! history and the stop is at position `len` — the same convention the software backend uses
//! when it closes the trace at a stop. The code image is captured without breakpoints (the
//! ptrace target shows original bytes), so the decoder walks the original instructions. Because
//! only the index knows `len` here, a stop's registers are keyed at their position before the
//! process runs again, and each one is checked against the history's PC when it is served (a
//! mismatch is counted by `monitor stats` and the register file is not used). On this machine
//! this convention is exercised with a simulated CPU (see the tests), not with Intel PT.
//!
//! ## What the past shows
//!
//! A hardware trace gives the PC at every position and nothing else: the past is served PC-only
//! (see [`crate::timeline`]), with the full register file at every position where the
//! process stopped (and where recording started). Instructions are not counted by anything but
//! the trace, so the history check of the software backend does not apply.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use super::{AuxSink, DrainSource, Drainer, PerfPtBackend, PerfPtConfig, PerfPtError, StartMode};
use crate::capture::backend::{LiveBackend, ptrace_present_state};
use crate::flow::{Cpu, CpuVendor, Errata, FlowConfig};
use crate::ring::aux::{AuxFlags, AuxStats, SideRecord};
use crate::store::live::{TraceStore, append_bytes};
use crate::target::{PtraceTarget, Resume, StopEvent, Target, TargetResult};

/// The CPU this process runs on, from `/proc/cpuinfo` (vendor, family, model, stepping): the
/// errata a live hardware trace is decoded with.
pub fn host_cpu() -> Cpu {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim().to_string())
    };
    let num = |name: &str| field(name).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
    Cpu {
        vendor: if field("vendor_id").as_deref() == Some("GenuineIntel") {
            CpuVendor::Intel
        } else {
            CpuVendor::Unknown
        },
        family: num("cpu family") as u16,
        model: num("model") as u8,
        stepping: num("stepping") as u8,
    }
}

/// How often the background drainer looks at the AUX area when the kernel does not wake it.
pub const DRAIN_PERIOD: Duration = Duration::from_millis(20);

/// How long a stop waits for the AUX area to stop growing before it is reported anyway.
pub const STOP_DRAIN_BOUND: Duration = Duration::from_secs(2);

/// A source of Intel PT bytes the pipeline drains: the perf backend, or a simulation of its
/// mmap pages in tests.
pub trait PtSource: DrainSource {
    /// Turns tracing on or off (`PERF_EVENT_IOC_ENABLE`/`DISABLE`).
    fn set_tracing(&mut self, on: bool) -> Result<(), PerfPtError>;
    /// Counters of the AUX/data rings.
    fn aux_stats(&self) -> AuxStats;
}

impl PtSource for PerfPtBackend {
    fn set_tracing(&mut self, on: bool) -> Result<(), PerfPtError> {
        if on { self.enable() } else { self.disable() }
    }

    fn aux_stats(&self) -> AuxStats {
        self.stats()
    }
}

/// A [`AuxSink`] that appends to a [`TraceStore`] (one traced thread) and counts the AUX
/// records that say trace was lost.
#[derive(Debug, Clone)]
pub struct StoreSink {
    store: TraceStore,
    /// `PERF_RECORD_AUX` records flagged `TRUNCATED` (the AUX area was full: trace lost).
    pub truncated: u64,
    /// `PERF_RECORD_AUX` records flagged `PARTIAL` (gaps in the trace).
    pub partial: u64,
}

impl StoreSink {
    /// A sink into `store`.
    pub fn new(store: TraceStore) -> Self {
        StoreSink {
            store,
            truncated: 0,
            partial: 0,
        }
    }
}

impl AuxSink for StoreSink {
    fn trace(&mut self, _tid: i32, bytes: &[u8]) {
        append_bytes(&self.store, bytes);
    }

    fn side_record(&mut self, _tid: i32, record: &SideRecord) {
        if let SideRecord::Aux { flags, .. } = record {
            if flags.0 & AuxFlags::TRUNCATED != 0 {
                self.truncated += 1;
            }
            if flags.0 & AuxFlags::PARTIAL != 0 {
                self.partial += 1;
            }
        }
    }
}

enum PipeState<B: PtSource> {
    /// Drained on the server thread (the process is stopped).
    Stopped(B),
    /// Drained by a background thread (the process runs).
    Running(Drainer<StoreSink, B>),
    /// Only while switching (or after the drainer thread was lost).
    Gone,
}

/// Moves AUX bytes into the store: in the background while the process runs, to completion at
/// every stop (see the module docs).
pub struct AuxPipeline<B: PtSource> {
    state: PipeState<B>,
    sink: Option<StoreSink>,
    /// Trace bytes moved, by the drainer thread and at stops.
    pub bytes: u64,
    /// Drains done at stops (on the server thread).
    pub stop_drains: u64,
    /// Errors met while draining, described (the first few).
    pub errors: Vec<String>,
    /// Errors met in total.
    pub error_count: u64,
    truncated: u64,
    partial: u64,
}

impl<B: PtSource> std::fmt::Debug for AuxPipeline<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuxPipeline")
            .field("bytes", &self.bytes)
            .field("stop_drains", &self.stop_drains)
            .field("errors", &self.error_count)
            .finish_non_exhaustive()
    }
}

impl<B: PtSource> AuxPipeline<B> {
    /// A stopped pipeline from `source` into `store`.
    pub fn new(source: B, store: TraceStore) -> Self {
        AuxPipeline {
            state: PipeState::Stopped(source),
            sink: Some(StoreSink::new(store)),
            bytes: 0,
            stop_drains: 0,
            errors: Vec::new(),
            error_count: 0,
            truncated: 0,
            partial: 0,
        }
    }

    fn note_error(&mut self, e: String) {
        self.error_count += 1;
        if self.errors.len() < 8 {
            self.errors.push(e);
        }
    }

    /// The process is about to run: the drainer thread takes over.
    pub fn start(&mut self) {
        let state = std::mem::replace(&mut self.state, PipeState::Gone);
        self.state = match (state, self.sink.take()) {
            (PipeState::Stopped(src), Some(sink)) => {
                PipeState::Running(super::drainer::spawn_drainer(src, sink, DRAIN_PERIOD))
            }
            (other, sink) => {
                self.sink = sink;
                other
            }
        };
    }

    /// The process stopped: stops the drainer thread and drains on this thread until nothing
    /// new arrives (at most `bound`). `Err` says why the trace may be incomplete.
    pub fn stop(&mut self, bound: Duration) -> Result<u64, String> {
        let state = std::mem::replace(&mut self.state, PipeState::Gone);
        let (mut src, mut sink) = match state {
            PipeState::Running(d) => match d.stop() {
                Some(r) => {
                    self.bytes += r.bytes;
                    for e in r.errors {
                        self.note_error(e.to_string());
                    }
                    (r.backend, r.sink)
                }
                None => {
                    self.note_error("the AUX drainer thread panicked".into());
                    return Err("the AUX drainer thread panicked: the trace is lost".into());
                }
            },
            PipeState::Stopped(src) => match self.sink.take() {
                Some(sink) => (src, sink),
                None => {
                    self.state = PipeState::Stopped(src);
                    return Err("the trace store is gone".into());
                }
            },
            PipeState::Gone => return Err("the AUX pipeline is gone".into()),
        };
        let start = Instant::now();
        let mut moved = 0;
        let mut result = Ok(());
        loop {
            self.stop_drains += 1;
            match src.drain_once(&mut sink) {
                Ok(0) => break,
                Ok(n) => moved += n,
                Err(e) => {
                    let text = e.to_string();
                    self.note_error(text.clone());
                    result = Err(format!("draining the AUX area at the stop: {text}"));
                    break;
                }
            }
            if start.elapsed() >= bound {
                result = Err(format!(
                    "the trace at this stop may be incomplete: the AUX area was still growing \
                     after {bound:?} of draining ({moved} bytes)"
                ));
                break;
            }
        }
        self.bytes += moved;
        let (t, p) = (sink.truncated, sink.partial);
        if t > self.truncated || p > self.partial {
            result = result.and(Err(format!(
                "the kernel reported lost trace: {t} truncated and {p} partial AUX records so far"
            )));
        }
        self.truncated = t;
        self.partial = p;
        self.state = PipeState::Stopped(src);
        self.sink = Some(sink);
        result.map(|()| moved)
    }

    /// The source, while stopped.
    pub fn source_mut(&mut self) -> Option<&mut B> {
        match &mut self.state {
            PipeState::Stopped(s) => Some(s),
            _ => None,
        }
    }

    /// The source, while stopped.
    pub fn source(&self) -> Option<&B> {
        match &self.state {
            PipeState::Stopped(s) => Some(s),
            _ => None,
        }
    }

    /// AUX records flagged `TRUNCATED` and `PARTIAL` seen at the last stop.
    pub fn lost_records(&self) -> (u64, u64) {
        (self.truncated, self.partial)
    }
}

impl<B: PtSource> Drop for AuxPipeline<B> {
    fn drop(&mut self) {
        // Ends the drainer thread (it would otherwise poll until the process exits).
        if let PipeState::Running(d) = std::mem::replace(&mut self.state, PipeState::Gone) {
            let _ = d.stop();
        }
    }
}

/// The hardware backend of a live recording (see the module docs).
pub struct PerfCapture<B: PtSource = PerfPtBackend> {
    ptrace: PtraceTarget,
    store: TraceStore,
    pipe: AuxPipeline<B>,
    /// Whether the event is enabled (recording on).
    tracing: bool,
    running: bool,
}

impl<B: PtSource> std::fmt::Debug for PerfCapture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerfCapture")
            .field("pipe", &self.pipe)
            .field("tracing", &self.tracing)
            .finish_non_exhaustive()
    }
}

impl PerfCapture<PerfPtBackend> {
    /// Opens an `intel_pt` event on the stopped process's main thread (enabled at once: the
    /// trace starts when the process next runs) with `config`, and drains it into a new store.
    /// Fails with the probe's reason when Intel PT is not usable here.
    pub fn open(ptrace: PtraceTarget, mut config: PerfPtConfig) -> Result<Self, PerfPtError> {
        config.start = StartMode::AfterMmap;
        let tid = Target::tid(&ptrace);
        let backend = PerfPtBackend::open(&[tid], config)?;
        Ok(Self::with_source(ptrace, backend))
    }
}

impl<B: PtSource> PerfCapture<B> {
    /// A capture of `ptrace` from `source` (tracing on).
    pub fn with_source(ptrace: PtraceTarget, source: B) -> Self {
        let store = TraceStore::new();
        PerfCapture {
            ptrace,
            pipe: AuxPipeline::new(source, store.clone()),
            store,
            tracing: true,
            running: false,
        }
    }
}

impl<B: PtSource> PerfCapture<B> {
    /// Whether the end of the program is a place in the history: when the process exits or
    /// dies it stays stopped at its exit event, still alive ([`StopEvent::Exiting`]); the AUX
    /// area is drained there like at any stop, and the next resume lets it exit.
    pub fn stop_at_exit(mut self, on: bool) -> Self {
        self.ptrace.set_stop_at_exit(on);
        self
    }

    fn target(&mut self) -> &mut PtraceTarget {
        &mut self.ptrace
    }
}

impl<B: PtSource> LiveBackend for PerfCapture<B> {
    ptrace_present_state!(target);

    fn pid(&self) -> i32 {
        Target::pid(&self.ptrace)
    }

    fn name(&self) -> &'static str {
        "pt (hardware Intel PT through perf intel_pt: PC-only past)"
    }

    fn is_hardware(&self) -> bool {
        true
    }

    fn flow_config(&self) -> FlowConfig {
        FlowConfig {
            errata: Errata::for_cpu(&host_cpu()),
            ..FlowConfig::default()
        }
    }

    fn store(&self) -> TraceStore {
        self.store.clone()
    }

    fn recorded(&self) -> Option<u64> {
        None
    }

    fn resume(&mut self, how: Resume, record: bool) -> TargetResult<()> {
        if record != self.tracing
            && let Some(src) = self.pipe.source_mut()
        {
            src.set_tracing(record)
                .map_err(|e| crate::target::TargetError::Unexpected {
                    pid: Target::pid(&self.ptrace),
                    what: format!(
                        "turning Intel PT {}: {e}",
                        if record { "on" } else { "off" }
                    ),
                })?;
            self.tracing = record;
        }
        self.pipe.start();
        self.ptrace.resume(how)?;
        self.running = true;
        Ok(())
    }

    fn wait(
        &mut self,
        block: bool,
        _bps: &BTreeSet<u64>,
        _interrupt: &AtomicBool,
    ) -> TargetResult<Option<StopEvent>> {
        // Breakpoints are INT3s in the process: the ptrace target reports them.
        let ev = self.ptrace.wait(block)?;
        if ev.is_some() {
            self.running = false;
        }
        Ok(ev)
    }

    fn interrupt(&mut self) -> TargetResult<()> {
        if self.running {
            self.ptrace.interrupt()?;
        }
        Ok(())
    }

    fn sync_at_stop(&mut self, _exited: bool) -> Result<(), String> {
        // The stop waits for the drain (bounded): the history must see every traced instruction
        // up to the stop PC.
        self.pipe.stop(STOP_DRAIN_BOUND).map(|_| ())
    }

    fn stats(&self, line: &mut dyn FnMut(&str, String)) {
        line("AUX bytes drained", self.pipe.bytes.to_string());
        line("AUX drains at stops", self.pipe.stop_drains.to_string());
        let (t, p) = self.pipe.lost_records();
        line("AUX truncated records", t.to_string());
        line("AUX partial records", p.to_string());
        if let Some(s) = self.pipe.source() {
            let a = s.aux_stats();
            line("AUX overrun bytes", a.aux_overrun_bytes.to_string());
            line("perf lost records", a.lost_records.to_string());
            line("event re-enables", a.reenables.to_string());
        }
        line("AUX drain errors", self.pipe.error_count.to_string());
        if let Some(e) = self.pipe.errors.last() {
            line("last AUX drain error", e.clone());
        }
    }
}

/// The HASE ground truth, shared with the integration tests.
#[cfg(test)]
#[path = "../../../tests/support/hase.rs"]
mod hase_truth;

#[cfg(test)]
mod tests {
    //! The AUX pipeline with simulated perf mmap pages: a producer thread writes a real hardware
    //! trace (the corpus's `loopy`) into the AUX area in small pieces, advancing `aux_head` and
    //! respecting `aux_tail` like the kernel, while the pipeline drains it — in the background,
    //! then at "stops" — into the store the history worker indexes. The history must decode to
    //! the ground-truth instruction flow of the recording.

    use super::*;
    use crate::history::HistoryWorker;
    use crate::image::{ElfSpec, Image};
    use crate::ring::aux::{PerfMmapPage, drain_aux_full};
    use std::path::PathBuf;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};

    /// The simulated mmap: control page and AUX area, shared with the producer.
    struct SimRing {
        page: PerfMmapPage,
        aux: Mutex<Vec<u8>>,
    }

    /// A [`PtSource`] draining the simulated ring with the same [`drain_aux_full`] as the
    /// backend.
    struct SimSource {
        ring: Arc<SimRing>,
        stats: AuxStats,
        enabled: bool,
    }

    impl DrainSource for SimSource {
        fn drain_once(&mut self, sink: &mut dyn AuxSink) -> Result<u64, PerfPtError> {
            let aux = self.ring.aux.lock().unwrap();
            drain_aux_full(&self.ring.page, &*aux, None, &mut self.stats, |b| {
                sink.trace(1, b)
            })
            .map_err(|source| PerfPtError::Ring { tid: 1, source })
        }
        fn wait_ready(&self, period: Duration) {
            std::thread::sleep(period);
        }
    }

    impl PtSource for SimSource {
        fn set_tracing(&mut self, on: bool) -> Result<(), PerfPtError> {
            self.enabled = on;
            Ok(())
        }
        fn aux_stats(&self) -> AuxStats {
            self.stats
        }
    }

    /// Kernel side: writes `bytes` into free AUX space, publishing `aux_head` piece by piece;
    /// waits (spins) for the consumer when the area is full, like a traced task that the
    /// kernel would otherwise truncate.
    fn produce(ring: &SimRing, bytes: &[u8], piece: usize) {
        let size = ring.page.aux_size.load(Ordering::Relaxed);
        let mut done = 0;
        while done < bytes.len() {
            let head = ring.page.aux_head.load(Ordering::Relaxed);
            let tail = ring.page.aux_tail.load(Ordering::Acquire);
            let free = (size - (head - tail)) as usize;
            let n = piece.min(free).min(bytes.len() - done);
            if n == 0 {
                std::thread::yield_now();
                continue;
            }
            {
                let mut aux = ring.aux.lock().unwrap();
                for i in 0..n {
                    aux[((head + i as u64) % size) as usize] = bytes[done + i];
                }
            }
            ring.page.aux_head.store(head + n as u64, Ordering::Release);
            done += n;
        }
    }

    /// The corpus's hase recordings: `PTREWIND_CORPUS`, else `../shared/corpus` or
    /// `../../shared/corpus` from the crate (as `tests/support/corpus.rs` looks for it).
    fn corpus() -> PathBuf {
        let root = std::env::var_os("PTREWIND_CORPUS")
            .map(PathBuf::from)
            .or_else(|| {
                let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
                ["../shared/corpus", "../../shared/corpus"]
                    .iter()
                    .map(|c| manifest.join(c))
                    .find(|c| c.join("README.md").is_file())
            })
            .expect("the trace corpus was not found (set PTREWIND_CORPUS)");
        root.join("hase-pt-recordings")
    }

    use super::hase_truth::{ground_truth, objdump_insns};

    #[test]
    fn simulated_aux_pages_drain_into_the_history() {
        let dir = corpus();
        let pt = std::fs::read(dir.join("extracted-aux/loopy-20180404T162955.aux.bin"))
            .expect("corpus trace (set PTREWIND_CORPUS)");
        let exe = dir.join("loopy-20180404/loopy");
        let truth = ground_truth(
            &std::fs::read_to_string(dir.join("loopy-20180404/loopy-20180404T162955.trace"))
                .unwrap(),
            &objdump_insns(&exe),
        );
        assert!(truth.len() > 30, "{truth:x?}");

        // A 256-byte AUX area: the 1392-byte trace wraps it several times.
        let ring = Arc::new(SimRing {
            page: PerfMmapPage::zeroed(),
            aux: Mutex::new(vec![0; 256]),
        });
        ring.page.aux_size.store(256, Ordering::Relaxed);
        let store = TraceStore::new();
        let mut image = Image::new();
        image.load_elf(&ElfSpec::new(&exe, None)).unwrap();
        let worker = HistoryWorker::spawn_with_window(
            Arc::new(store.clone()),
            Arc::new(image),
            FlowConfig::default(),
            4096,
        )
        .unwrap();
        store.set_listener(Some(worker.notifier().into_listener()));
        let mut pipe = AuxPipeline::new(
            SimSource {
                ring: Arc::clone(&ring),
                stats: AuxStats::default(),
                enabled: true,
            },
            store.clone(),
        );

        // "Run" three times: the producer writes a third of the trace while the drainer thread
        // drains; at each "stop" the rest is drained on this thread.
        let thirds = [0, pt.len() / 3, 2 * pt.len() / 3, pt.len()];
        for w in thirds.windows(2) {
            pipe.start();
            let producer = {
                let ring = Arc::clone(&ring);
                let part = pt[w[0]..w[1]].to_vec();
                std::thread::spawn(move || produce(&ring, &part, 7))
            };
            producer.join().unwrap();
            pipe.stop(Duration::from_secs(5)).unwrap();
            assert_eq!(
                store.len(),
                w[1],
                "everything produced is stored at the stop"
            );
        }
        assert_eq!(store.to_vec(), pt);
        assert_eq!(pipe.bytes, pt.len() as u64);
        assert_eq!(pipe.error_count, 0);
        let n = worker.wait_indexed(Duration::from_secs(10)).unwrap();
        let ips: Vec<u64> =
            worker.with_history(|h, b, img| (0..n).map(|i| h.insn(b, img, i).unwrap().0).collect());
        assert_eq!(ips, truth);
    }

    #[test]
    fn a_stop_reports_a_trace_that_keeps_growing() {
        // A source that always has more: the stop gives up after the bound and says so.
        struct Endless;
        impl DrainSource for Endless {
            fn drain_once(&mut self, sink: &mut dyn AuxSink) -> Result<u64, PerfPtError> {
                sink.trace(1, &[0]);
                Ok(1)
            }
            fn wait_ready(&self, period: Duration) {
                std::thread::sleep(period);
            }
        }
        impl PtSource for Endless {
            fn set_tracing(&mut self, _on: bool) -> Result<(), PerfPtError> {
                Ok(())
            }
            fn aux_stats(&self) -> AuxStats {
                AuxStats::default()
            }
        }
        let store = TraceStore::new();
        let mut pipe = AuxPipeline::new(Endless, store.clone());
        let e = pipe.stop(Duration::from_millis(20)).unwrap_err();
        assert!(e.contains("may be incomplete"), "{e}");
        assert!(!store.is_empty());
        // The pipeline is still usable.
        pipe.start();
        assert!(pipe.stop(Duration::from_millis(5)).is_err());
    }
}
