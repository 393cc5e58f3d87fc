//! GDB's branch tracing over the remote protocol (`record btrace pt`), with ptrewind as the
//! target: the `Qbtrace:*` / `Qbtrace-conf:*` packets and the `qXfer:btrace:read` /
//! `qXfer:btrace-conf:read` documents, as gdbserver serves them (GDB 13
//! `gdbserver/server.cc` `handle_btrace_general_set`, `handle_btrace_conf_general_set`,
//! `handle_qxfer_btrace*`; `gdbserver/linux-low.cc` `read_btrace`, `read_btrace_conf`).
//!
//! GDB does all the decoding and replay itself (with its own libipt): the stub only switches
//! tracing on and off per thread and hands out the raw trace bytes plus the CPU they must be
//! decoded for. [`BtraceServer`] is a pure state machine: it gets the packet body, the general
//! thread (`Hg`) already resolved by the caller ([`resolve_thread`]) and a
//! [`PtTraceProvider`] that owns the actual trace, and returns the reply body.
//!
//! ## Reads
//!
//! | annex | reply |
//! |---|---|
//! | `all` | everything the provider holds for the thread, oldest byte first |
//! | `new` | like `all` if the provider's write head moved since the last `all`/`new` read, otherwise a `<pt>` document without `<raw>` (GDB keeps what it has) |
//! | `delta` | an error, like gdbserver for PT: the trace is a ring and GDB cannot stitch PT deltas anyway (`btrace_stitch_trace` refuses PT), so it falls back to `new` |
//!
//! gdbserver never answers `E.Overflow.` for PT (that is a BTS delta condition); neither do we.
//! Bytes the provider lost (ring overflow) are reported by [`TraceSnapshot::lost`] and kept
//! in [`BtraceServer::lost_bytes`]: the document itself has no field for them, and PT
//! decoders resynchronise at the next PSB.
//!
//! The document is built when GDB reads offset 0 and cached: GDB pages through it with
//! increasing offsets, and rebuilding a `new` document in the middle would lose the data.

use super::rsp::{self, ThreadSel};
use crate::store::live::TraceStore;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The `qSupported` features for btrace, exactly the names GDB 13's `remote_protocol_features`
/// knows (all default to disabled in GDB, so they must be advertised). BTS is not offered.
pub const QSUPPORTED_FEATURES: &[&str] = &[
    "Qbtrace:off+",
    "Qbtrace:pt+",
    "Qbtrace-conf:pt:size+",
    "qXfer:btrace:read+",
    "qXfer:btrace-conf:read+",
];

/// GDB's default `record btrace pt buffer-size` (16 KiB), used until GDB configures one.
pub const DEFAULT_PT_BUFFER_SIZE: u64 = 16 * 1024;

/// The CPU a trace is to be decoded for (libipt's `struct pt_cpu`): decoders pick errata
/// workarounds from it. One CPU description for the whole crate: [`crate::flow::Cpu`], named
/// here as the btrace and LLDB trace packets know it.
pub use crate::flow::{Cpu as PtCpu, CpuVendor};

/// The CPU as the trace packets describe it.
impl PtCpu {
    /// The identity reported for traces from the software backend (ptrace single-stepping
    /// that encodes PT packets): Intel family 6 model 0x7a (Goldmont Plus), stepping 1.
    ///
    /// Why this model: a reported CPU must be one libipt knows, because
    /// `pt_cpu_errata` fails with "unknown cpu" for any other Intel model, and both GDB
    /// (`btrace_compute_ftrace_pt`) and LLDB (`CreateInstructionDecoder`) then refuse to
    /// decode. LLDB additionally rejects a non-Intel vendor the same way, so "no CPU" is not an
    /// option for LLDB. Among the models libipt 2.0.5 knows, 0x7a (like 0x86, 0x96, 0x9c)
    /// enables a single erratum workaround, APL11 ("OVF may be followed by TIP.PGD"), which
    /// only acts right after an OVF packet; the software encoder never emits OVF (it stops
    /// the tracee rather than overflow). Every other known model enables workarounds that are
    /// triggered by packet patterns a correct trace can contain: BDM70 (FUP/MODE.Exec inside
    /// the PSB+ before a TIP.PGE), SKD022 (FUP + TIP.PGD at a VMLAUNCH/VMRESUME), SKL014
    /// (TIP.PGD without IP), SKD007/SKD010/APL12 (around OVF), BDM64 (TSX aborts), SKL168
    /// (CYC). With 0x7a, libipt decodes our traces purely by the architectural rules.
    /// Checked by calling the installed libipt 2.0.5's `pt_cpu_errata` for every family-6
    /// model; `tests/btrace.rs` (`software_cpu_is_known_to_libipt_with_only_apl11`) keeps
    /// checking this model against the libipt GDB and LLDB load.
    pub const SOFTWARE: PtCpu = PtCpu {
        vendor: CpuVendor::Intel,
        family: 6,
        model: 0x7a,
        stepping: 1,
    };

    /// The `<cpu …/>` element of GDB's `<pt-config>`, or `None` for a non-Intel vendor
    /// (gdbserver only emits it for Intel). Numbers are decimal, as gdbserver prints them.
    pub fn gdb_xml(&self) -> Option<String> {
        match self.vendor {
            CpuVendor::Intel => Some(format!(
                "<cpu vendor=\"GenuineIntel\" family=\"{}\" model=\"{}\" stepping=\"{}\"/>",
                self.family, self.model, self.stepping
            )),
            CpuVendor::Unknown => None,
        }
    }

    /// A `/proc/cpuinfo`-style text for one processor, as LLDB's intel-pt plug-in parses it
    /// (`TraceIntelPT::GetCPUInfoForLiveProcess`): it needs `vendor_id`, `cpu family`,
    /// `model` and `stepping` (decimal), and only returns once a later unrelated line is seen,
    /// hence the trailing lines.
    pub fn proc_cpuinfo(&self) -> String {
        let vendor = match self.vendor {
            CpuVendor::Intel => "GenuineIntel",
            CpuVendor::Unknown => "Unknown",
        };
        format!(
            "processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {}\nmodel\t\t: {}\n\
             model name\t: ptrewind Intel PT trace\nstepping\t: {}\nmicrocode\t: 0x0\n\
             flags\t\t: fpu tsc intel_pt\n\n",
            self.family, self.model, self.stepping
        )
    }
}

/// How a client asked for tracing to be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartOptions {
    /// Requested trace buffer size in bytes (a hint; the provider reports what it uses).
    pub buffer_size: u64,
    /// Whether timestamps (TSC packets) were requested (LLDB `enableTsc`).
    pub enable_tsc: bool,
    /// Requested PSB period exponent (LLDB `psbPeriod`), if any.
    pub psb_period: Option<u64>,
}

/// The trace a provider holds for one thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSnapshot<'a> {
    /// The trace bytes, oldest first, ending at the last byte written.
    pub data: Cow<'a, [u8]>,
    /// Total bytes ever written for this thread (monotonic, like perf's `aux_head`): tells
    /// whether anything new arrived since an earlier read.
    pub head: u64,
    /// Bytes written but no longer held (overwritten or dropped by the ring).
    pub lost: u64,
}

/// Where trace bytes come from: a hardware (perf `intel_pt`) or software recording, or a
/// stored trace.
pub trait PtTraceProvider {
    /// Starts tracing thread `tid`; returns the buffer size in bytes actually used. Starting
    /// a thread that the provider already traces is not an error (it may record from the
    /// start). The error text is shown to the user.
    fn start(&mut self, tid: u32, options: &StartOptions) -> Result<u64, String>;
    /// Stops tracing `tid`.
    fn stop(&mut self, tid: u32) -> Result<(), String>;
    /// The trace held for `tid`.
    fn snapshot(&mut self, tid: u32) -> Result<TraceSnapshot<'_>, String>;
    /// The CPU the trace must be decoded for.
    fn cpu(&self) -> PtCpu;
}

/// A provider serving fixed, already recorded traces (one byte string per thread), e.g. a
/// trace read from a file, or a known trace in tests.
#[derive(Clone, Debug)]
pub struct FixedTraceProvider {
    traces: BTreeMap<u32, Vec<u8>>,
    active: BTreeMap<u32, u64>,
    cpu: PtCpu,
}

impl FixedTraceProvider {
    /// A provider with no traces, decoding as `cpu`.
    pub fn new(cpu: PtCpu) -> Self {
        FixedTraceProvider {
            traces: BTreeMap::new(),
            active: BTreeMap::new(),
            cpu,
        }
    }

    /// Sets the trace served for `tid` (replacing any earlier one).
    pub fn set_trace(&mut self, tid: u32, trace: Vec<u8>) {
        self.traces.insert(tid, trace);
    }

    /// True while `tid` is started.
    pub fn is_active(&self, tid: u32) -> bool {
        self.active.contains_key(&tid)
    }
}

impl PtTraceProvider for FixedTraceProvider {
    fn start(&mut self, tid: u32, options: &StartOptions) -> Result<u64, String> {
        if options.enable_tsc {
            return Err("this trace has no timestamps (TSC); start tracing without TSC".into());
        }
        if !self.traces.contains_key(&tid) {
            return Err(format!("no trace is available for thread {tid}"));
        }
        let size = options.buffer_size.max(1);
        self.active.insert(tid, size);
        Ok(size)
    }

    fn stop(&mut self, tid: u32) -> Result<(), String> {
        self.active
            .remove(&tid)
            .map(|_| ())
            .ok_or_else(|| format!("thread {tid} is not traced"))
    }

    fn snapshot(&mut self, tid: u32) -> Result<TraceSnapshot<'_>, String> {
        if !self.active.contains_key(&tid) {
            return Err(format!("thread {tid} is not traced"));
        }
        let data = self.traces.get(&tid).map_or(&[][..], Vec::as_slice);
        Ok(TraceSnapshot {
            data: Cow::Borrowed(data),
            head: data.len() as u64,
            lost: 0,
        })
    }

    fn cpu(&self) -> PtCpu {
        self.cpu
    }
}

/// A provider over live [`TraceStore`]s (one per thread), the stores a recorder's drainer
/// fills (e.g. `SoftRecorder::store()`). Everything stored is served; the head is the stream
/// offset (stored + lost bytes), so `new` reads see growth and losses are reported.
///
/// Starting and stopping only mark the thread: turning the recorder itself on and off belongs
/// to whoever drives it, which can ask [`TraceStoreProvider::is_active`]. A snapshot is only
/// complete up to the current stop if the recorder has written out its pending packets and the
/// ring was drained before the debugger reads it.
///
/// By default everything stored is served. A provider made with
/// [`TraceStoreProvider::from_enable`] serves a *view* instead: only the trace recorded after
/// the debugger started tracing the thread, from the first PSB at or after the store's length
/// at that moment (a decoder can only start at a PSB; a recorder that closes the trace at every
/// stop reopens it with a PSB+ on the next resume, so that PSB is where the program resumed).
#[derive(Clone, Debug)]
pub struct TraceStoreProvider {
    stores: BTreeMap<u32, TraceStore>,
    /// Finds the trace of a thread not attached (one that started after the session did).
    lookup: Option<StoreLookup>,
    /// Per traced thread: the buffer size and, for views, the store length at the start.
    active: BTreeMap<u32, (u64, usize)>,
    from_enable: bool,
    /// A view with no PSB after the enable point starts at the last PSB before it.
    psb_before: bool,
    cpu: PtCpu,
}

/// How a [`TraceStoreProvider`] finds the trace of a thread it was not given (`None`: not
/// recorded).
#[derive(Clone)]
pub struct StoreLookup(pub std::rc::Rc<dyn Fn(u32) -> Option<TraceStore>>);

impl std::fmt::Debug for StoreLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreLookup")
    }
}

impl TraceStoreProvider {
    /// No stores yet; traces decode as `cpu`.
    pub fn new(cpu: PtCpu) -> Self {
        TraceStoreProvider {
            stores: BTreeMap::new(),
            lookup: None,
            active: BTreeMap::new(),
            from_enable: false,
            psb_before: false,
            cpu,
        }
    }

    /// No stores yet; serves each thread's trace only from the point where tracing was
    /// started for it (see the type docs). For a debugger that turns tracing on while the
    /// program is already being recorded (GDB's `record btrace pt` against `ptrewind record`).
    pub fn from_enable(cpu: PtCpu) -> Self {
        TraceStoreProvider {
            from_enable: true,
            ..Self::new(cpu)
        }
    }

    /// [`from_enable`](Self::from_enable) for a recorder that does not start a PSB+ where the
    /// program resumes (the QEMU plugin writes PSBs by the amount of trace): while no PSB
    /// follows the enable point, the view starts at the last PSB before it (so it also shows
    /// some instructions from before tracing was started, rather than none).
    pub fn from_enable_or_last_psb(cpu: PtCpu) -> Self {
        TraceStoreProvider {
            psb_before: true,
            ..Self::from_enable(cpu)
        }
    }

    /// Serves `store` (a shared handle) as the trace of `tid`.
    pub fn attach(&mut self, tid: u32, store: TraceStore) {
        self.stores.insert(tid, store);
    }

    /// Asks `lookup` for the trace of a thread that was not attached when tracing is started
    /// for it (a live process's threads come and go).
    pub fn set_lookup(&mut self, lookup: StoreLookup) {
        self.lookup = Some(lookup);
    }

    /// True while a debugger wants `tid` traced.
    pub fn is_active(&self, tid: u32) -> bool {
        self.active.contains_key(&tid)
    }
}

impl PtTraceProvider for TraceStoreProvider {
    fn start(&mut self, tid: u32, options: &StartOptions) -> Result<u64, String> {
        if !self.stores.contains_key(&tid)
            && let Some(store) = self.lookup.as_ref().and_then(|f| (f.0)(tid))
        {
            self.stores.insert(tid, store);
        }
        let Some(store) = self.stores.get(&tid) else {
            return Err(format!("thread {tid} is not being recorded"));
        };
        let base = if self.from_enable { store.len() } else { 0 };
        self.active.insert(tid, (options.buffer_size, base));
        Ok(options.buffer_size)
    }

    fn stop(&mut self, tid: u32) -> Result<(), String> {
        self.active
            .remove(&tid)
            .map(|_| ())
            .ok_or_else(|| format!("thread {tid} is not traced"))
    }

    fn snapshot(&mut self, tid: u32) -> Result<TraceSnapshot<'_>, String> {
        let (store, &(_, base)) = self
            .stores
            .get(&tid)
            .zip(self.active.get(&tid))
            .ok_or_else(|| format!("thread {tid} is not traced"))?;
        // Two separate reads: a drain in between can only make `lost` (and so the head) newer
        // than `data`, which at worst makes the next `new` read return the data again.
        let psb_before = self.psb_before;
        let data = store.with_bytes(|b| {
            let base = base.min(b.len());
            let start = if base == 0 {
                0
            } else {
                // Nothing before the first PSB can be decoded; until the program resumes
                // there is none, and the view is empty (or starts at the last PSB before).
                match find_psb(&b[base..]) {
                    Some(i) => base + i,
                    None if psb_before => rfind_psb(&b[..base]).unwrap_or(b.len()),
                    None => b.len(),
                }
            };
            b[start..].to_vec()
        });
        let lost = store.lost();
        Ok(TraceSnapshot {
            head: data.len() as u64 + lost,
            data: Cow::Owned(data),
            lost,
        })
    }

    fn cpu(&self) -> PtCpu {
        self.cpu
    }
}

/// The PSB packet: `02 82` eight times (SDM 33.4.2.18), unique in a packet stream.
const PSB: [u8; 16] = [
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
];

/// Offset of the first PSB in `bytes`.
fn find_psb(bytes: &[u8]) -> Option<usize> {
    bytes.windows(PSB.len()).position(|w| w == PSB)
}

/// Offset of the last PSB in `bytes`.
fn rfind_psb(bytes: &[u8]) -> Option<usize> {
    bytes.windows(PSB.len()).rposition(|w| w == PSB)
}

/// Why the general thread cannot be used for a btrace packet (gdbserver's messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadError {
    /// `Hg-1` (all threads) or unparsable: btrace packets act on one thread.
    MustSelectSingle,
    /// `Hg` named a thread the target does not have.
    NoSuchThread,
}

impl ThreadError {
    fn message(self) -> &'static str {
        match self {
            ThreadError::MustSelectSingle => "Must select a single thread.",
            ThreadError::NoSuchThread => "No such thread.",
        }
    }
}

/// Resolves the general thread text the router recorded from `Hg` (`None` if GDB never sent
/// one). "Any thread" (`0`, `pPID.0`) and no `Hg` at all mean `current`, like gdbserver.
pub fn resolve_thread(
    general: Option<&str>,
    current: u32,
    exists: impl Fn(u32) -> bool,
) -> Result<u32, ThreadError> {
    let Some(text) = general else {
        return Ok(current);
    };
    match rsp::parse_thread_id(text.as_bytes()) {
        Ok(ThreadSel::Any) => Ok(current),
        Ok(ThreadSel::All) | Err(_) => Err(ThreadError::MustSelectSingle),
        Ok(ThreadSel::Thread { tid, .. }) => u32::try_from(tid)
            .ok()
            .filter(|&t| exists(t))
            .ok_or(ThreadError::NoSuchThread),
    }
}

#[derive(Clone, Debug)]
struct ThreadTrace {
    /// Buffer size the provider reported.
    size: u64,
    /// Provider head at the last `all`/`new` read.
    last_head: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Object {
    Btrace,
    Conf,
}

#[derive(Clone, Debug)]
struct Cached {
    object: Object,
    tid: u32,
    annex: Vec<u8>,
    doc: Vec<u8>,
}

/// GDB's btrace packets as a state machine. See the module docs.
#[derive(Clone, Debug)]
pub struct BtraceServer {
    pt_size: u64,
    threads: BTreeMap<u32, ThreadTrace>,
    cache: Option<Cached>,
    lost: u64,
}

impl Default for BtraceServer {
    fn default() -> Self {
        Self::new()
    }
}

impl BtraceServer {
    /// No thread traced, buffer size [`DEFAULT_PT_BUFFER_SIZE`].
    pub fn new() -> Self {
        BtraceServer {
            pt_size: DEFAULT_PT_BUFFER_SIZE,
            threads: BTreeMap::new(),
            cache: None,
            lost: 0,
        }
    }

    /// True if this module answers `packet` (so a router can route it here).
    pub fn handles(packet: &[u8]) -> bool {
        packet.starts_with(b"Qbtrace:")
            || packet.starts_with(b"Qbtrace-conf:")
            || packet.starts_with(b"qXfer:btrace:")
            || packet.starts_with(b"qXfer:btrace-conf:")
    }

    /// The buffer size new threads get (`Qbtrace-conf:pt:size`).
    pub fn pt_buffer_size(&self) -> u64 {
        self.pt_size
    }

    /// The threads with branch tracing on, with their buffer sizes.
    pub fn traced_threads(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.threads.iter().map(|(&t, s)| (t, s.size))
    }

    /// Trace bytes the provider reported lost at the most recent read (see module docs).
    pub fn lost_bytes(&self) -> u64 {
        self.lost
    }

    /// Starts tracing `tid` on the server's own initiative (recording from the program's
    /// start, before any debugger asked). GDB then finds the thread traced when it connects
    /// (`qXfer:btrace-conf:read` reports `<pt size=…/>`) and switches to record-btrace by
    /// itself ("Target is recording using Intel Processor Trace"). Starting a thread that is
    /// already traced is a no-op.
    pub fn start_recording(
        &mut self,
        tid: u32,
        provider: &mut dyn PtTraceProvider,
    ) -> Result<(), String> {
        if self.threads.contains_key(&tid) {
            return Ok(());
        }
        self.start_thread(tid, provider)
    }

    /// Starts tracing `tid` (not traced yet) with the configured buffer size.
    fn start_thread(&mut self, tid: u32, provider: &mut dyn PtTraceProvider) -> Result<(), String> {
        let options = StartOptions {
            buffer_size: self.pt_size,
            enable_tsc: false,
            psb_period: None,
        };
        let size = provider.start(tid, &options)?;
        self.threads.insert(
            tid,
            ThreadTrace {
                size,
                last_head: None,
            },
        );
        Ok(())
    }

    /// Forgets a thread that exited (its tracing ends with it).
    pub fn forget_thread(&mut self, tid: u32) {
        self.threads.remove(&tid);
        if self.cache.as_ref().is_some_and(|c| c.tid == tid) {
            self.cache = None;
        }
    }

    /// Answers a btrace packet (un-escaped body). `thread` is the general thread resolved with
    /// [`resolve_thread`]. Returns `None` for packets that are not btrace packets.
    pub fn handle(
        &mut self,
        packet: &[u8],
        thread: Result<u32, ThreadError>,
        provider: &mut dyn PtTraceProvider,
    ) -> Option<Vec<u8>> {
        let reply = if let Some(op) = packet.strip_prefix(b"Qbtrace:") {
            self.general_set(op, thread, provider)
        } else if let Some(opt) = packet.strip_prefix(b"Qbtrace-conf:") {
            self.conf_set(opt)
        } else if packet.starts_with(b"qXfer:btrace:") || packet.starts_with(b"qXfer:btrace-conf:")
        {
            self.qxfer(packet, thread, provider)
        } else {
            return None;
        };
        Some(reply.unwrap_or_else(|msg| rsp::gdb_error(&msg)))
    }

    fn general_set(
        &mut self,
        op: &[u8],
        thread: Result<u32, ThreadError>,
        provider: &mut dyn PtTraceProvider,
    ) -> Result<Vec<u8>, String> {
        match op {
            b"pt" | b"off" => {}
            b"bts" => {
                return Err("ptrewind does not support Intel BTS; use 'record btrace pt'.".into());
            }
            _ => return Err("Bad Qbtrace operation.  Use pt or off.".into()),
        }
        let tid = thread.map_err(|e| e.message().to_string())?;
        if op == b"pt" {
            if self.threads.contains_key(&tid) {
                return Err("Btrace already enabled.".into());
            }
            self.start_thread(tid, provider)?;
        } else {
            if !self.threads.contains_key(&tid) {
                return Err("Branch tracing not enabled.".into());
            }
            provider
                .stop(tid)
                .map_err(|e| format!("Could not disable branch tracing: {e}"))?;
            self.forget_thread(tid);
        }
        Ok(b"OK".to_vec())
    }

    fn conf_set(&mut self, option: &[u8]) -> Result<Vec<u8>, String> {
        if let Some(value) = option.strip_prefix(b"pt:size=") {
            // gdbserver: strtoul(…, 16), at most UINT_MAX.
            let size = rsp::parse_hex_u64(value)
                .ok()
                .filter(|&s| s <= u64::from(u32::MAX))
                .ok_or("Bad size value.")?;
            self.pt_size = size;
            Ok(b"OK".to_vec())
        } else if option.starts_with(b"bts:size=") {
            Err("ptrewind does not support Intel BTS.".into())
        } else {
            Err("Bad Qbtrace configuration option.".into())
        }
    }

    fn qxfer(
        &mut self,
        packet: &[u8],
        thread: Result<u32, ThreadError>,
        provider: &mut dyn PtTraceProvider,
    ) -> Result<Vec<u8>, String> {
        let req = rsp::parse_qxfer_read(packet).map_err(|e| e.to_string())?;
        let object = match req.object {
            b"btrace" => Object::Btrace,
            b"btrace-conf" => Object::Conf,
            _ => return Err("Unknown qXfer object.".into()),
        };
        let tid = thread.map_err(|e| e.message().to_string())?;
        if req.offset == 0 {
            self.cache = None;
            let doc = match object {
                Object::Btrace => self.btrace_doc(tid, req.annex, provider)?,
                Object::Conf => self.conf_doc(tid, req.annex)?,
            };
            self.cache = Some(Cached {
                object,
                tid,
                annex: req.annex.to_vec(),
                doc,
            });
        }
        let cached = self
            .cache
            .as_ref()
            .filter(|c| c.object == object && c.tid == tid && c.annex == req.annex)
            .ok_or("No document is being read at this offset; read from offset 0 first.")?;
        rsp::qxfer_chunk(&cached.doc, req.offset, req.length).map_err(|e| e.to_string())
    }

    fn btrace_doc(
        &mut self,
        tid: u32,
        annex: &[u8],
        provider: &mut dyn PtTraceProvider,
    ) -> Result<Vec<u8>, String> {
        #[derive(PartialEq)]
        enum Read {
            All,
            New,
        }
        let kind = match annex {
            b"all" => Read::All,
            b"new" => Read::New,
            b"delta" => {
                return Err(
                    "Delta reads are not supported for Intel PT; read 'new' or 'all'.".into(),
                );
            }
            _ => return Err("Bad annex.".into()),
        };
        let cpu = provider.cpu();
        let state = self.threads.get_mut(&tid).ok_or("Btrace not enabled.")?;
        let snap = provider.snapshot(tid)?;
        let changed = state.last_head != Some(snap.head);
        state.last_head = Some(snap.head);
        self.lost = snap.lost;
        let raw: &[u8] = if kind == Read::All || changed {
            &snap.data
        } else {
            &[]
        };
        Ok(btrace_xml(Some(cpu), raw).into_bytes())
    }

    fn conf_doc(&self, tid: u32, annex: &[u8]) -> Result<Vec<u8>, String> {
        if !annex.is_empty() {
            return Err("Bad annex.".into());
        }
        Ok(btrace_conf_xml(self.threads.get(&tid).map(|t| t.size)).into_bytes())
    }
}

/// The btrace document for PT data: `<pt-config>` with the CPU (if Intel) and `<raw>` with
/// the bytes in hex (omitted when there are none), as gdbserver's `read_btrace` writes it.
pub fn btrace_xml(cpu: Option<PtCpu>, raw: &[u8]) -> String {
    let mut s = String::with_capacity(200 + raw.len() * 2);
    s.push_str(
        "<!DOCTYPE btrace SYSTEM \"btrace.dtd\">\n<btrace version=\"1.0\">\n<pt>\n<pt-config>\n",
    );
    if let Some(cpu) = cpu.and_then(|c| c.gdb_xml()) {
        s.push_str(&cpu);
        s.push('\n');
    }
    s.push_str("</pt-config>\n");
    if !raw.is_empty() {
        s.push_str("<raw>\n");
        s.push_str(&rsp::hex_encode(raw));
        s.push_str("\n</raw>\n");
    }
    s.push_str("</pt>\n</btrace>\n");
    s
}

/// The btrace configuration document: `<pt size="0x…"/>` for a traced thread, empty
/// otherwise (an empty one tells GDB on connect that nothing is being recorded).
pub fn btrace_conf_xml(pt_size: Option<u64>) -> String {
    let mut s = String::from(
        "<!DOCTYPE btrace-conf SYSTEM \"btrace-conf.dtd\">\n<btrace-conf version=\"1.0\">\n",
    );
    if let Some(size) = pt_size {
        let _ = writeln!(s, "<pt size=\"{size:#x}\"/>");
    }
    s.push_str("</btrace-conf>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const TID: u32 = 100;

    fn provider(trace: &[u8]) -> FixedTraceProvider {
        let mut p = FixedTraceProvider::new(PtCpu::SOFTWARE);
        p.set_trace(TID, trace.to_vec());
        p
    }

    /// A provider whose trace grows (to test `new`).
    struct Growing {
        data: Vec<u8>,
        on: bool,
    }
    impl PtTraceProvider for Growing {
        fn start(&mut self, _tid: u32, o: &StartOptions) -> Result<u64, String> {
            self.on = true;
            Ok(o.buffer_size)
        }
        fn stop(&mut self, _tid: u32) -> Result<(), String> {
            self.on = false;
            Err("device busy".into())
        }
        fn snapshot(&mut self, _tid: u32) -> Result<TraceSnapshot<'_>, String> {
            Ok(TraceSnapshot {
                data: Cow::Borrowed(&self.data),
                head: self.data.len() as u64 + 7,
                lost: 7,
            })
        }
        fn cpu(&self) -> PtCpu {
            PtCpu {
                vendor: CpuVendor::Unknown,
                family: 0x17,
                model: 1,
                stepping: 0,
            }
        }
    }

    fn send(s: &mut BtraceServer, p: &mut dyn PtTraceProvider, pkt: &[u8]) -> String {
        String::from_utf8(s.handle(pkt, Ok(TID), p).expect("btrace packet")).unwrap()
    }

    /// Reads a whole document the way GDB does (chunks until `l`).
    fn read_doc(
        s: &mut BtraceServer,
        p: &mut dyn PtTraceProvider,
        obj: &str,
        annex: &str,
        chunk: u64,
    ) -> Result<String, String> {
        let mut doc = String::new();
        let mut off = 0u64;
        loop {
            let r = send(
                s,
                p,
                format!("qXfer:{obj}:read:{annex}:{off:x},{chunk:x}").as_bytes(),
            );
            match r.as_bytes().first() {
                Some(b'm') => {
                    doc.push_str(&r[1..]);
                    off += (r.len() - 1) as u64;
                }
                Some(b'l') => {
                    doc.push_str(&r[1..]);
                    return Ok(doc);
                }
                _ => return Err(r),
            }
        }
    }

    #[test]
    fn feature_names_are_gdb13s() {
        // Each feature must be one GDB 13 knows (remote.c remote_protocol_features).
        for f in QSUPPORTED_FEATURES {
            let name = f.strip_suffix('+').unwrap();
            assert!(
                [
                    "Qbtrace:off",
                    "Qbtrace:bts",
                    "Qbtrace:pt",
                    "qXfer:btrace:read",
                    "qXfer:btrace-conf:read",
                    "Qbtrace-conf:bts:size",
                    "Qbtrace-conf:pt:size"
                ]
                .contains(&name)
            );
        }
        assert!(!QSUPPORTED_FEATURES.iter().any(|f| f.contains("bts")));
    }

    #[test]
    fn enable_read_disable() {
        let trace = [0x02, 0x82, 0x02, 0x82, 0x23, 0x7d, 0x00, 0xff];
        let mut p = provider(&trace);
        let mut s = BtraceServer::new();
        assert_eq!(send(&mut s, &mut p, b"Qbtrace-conf:pt:size=0x10000"), "OK");
        assert_eq!(send(&mut s, &mut p, b"Qbtrace:pt"), "OK");
        assert!(p.is_active(TID));
        assert_eq!(
            send(&mut s, &mut p, b"Qbtrace:pt"),
            "E.Btrace already enabled."
        );
        let conf = read_doc(&mut s, &mut p, "btrace-conf", "", 0x1000).unwrap();
        assert_eq!(
            conf,
            "<!DOCTYPE btrace-conf SYSTEM \"btrace-conf.dtd\">\n<btrace-conf version=\"1.0\">\n\
             <pt size=\"0x10000\"/>\n</btrace-conf>\n"
        );
        for chunk in [1u64, 7, 0x3fb] {
            let mut fresh = BtraceServer::new();
            let mut p = provider(&trace);
            send(&mut fresh, &mut p, b"Qbtrace:pt");
            let doc = read_doc(&mut fresh, &mut p, "btrace", "all", chunk).unwrap();
            assert_eq!(
                doc,
                "<!DOCTYPE btrace SYSTEM \"btrace.dtd\">\n<btrace version=\"1.0\">\n<pt>\n\
                 <pt-config>\n<cpu vendor=\"GenuineIntel\" family=\"6\" model=\"122\" stepping=\"1\"/>\n\
                 </pt-config>\n<raw>\n02820282237d00ff\n</raw>\n</pt>\n</btrace>\n"
            );
        }
        assert_eq!(send(&mut s, &mut p, b"Qbtrace:off"), "OK");
        assert!(!p.is_active(TID));
        assert_eq!(
            send(&mut s, &mut p, b"Qbtrace:off"),
            "E.Branch tracing not enabled."
        );
        assert_eq!(
            send(&mut s, &mut p, b"qXfer:btrace:read:all:0,100"),
            "E.Btrace not enabled."
        );
        // Not traced any more: the conf document is empty.
        let conf = read_doc(&mut s, &mut p, "btrace-conf", "", 0x1000).unwrap();
        assert!(!conf.contains("<pt"));
    }

    #[test]
    fn trace_store_provider_serves_what_the_drainer_stored() {
        use crate::ring::{Capabilities, IntOn, Topa, TraceSink, TraceSource};
        let mut ring = Topa::circular(Capabilities::default(), &[4096], IntOn::Every).unwrap();
        let store = TraceStore::new();
        let mut p = TraceStoreProvider::new(PtCpu::SOFTWARE);
        p.attach(TID, store.clone());
        let mut s = BtraceServer::new();
        assert_eq!(send(&mut s, &mut p, b"Qbtrace:pt"), "OK");
        assert!(p.is_active(TID));
        ring.write(&[0x02, 0x82, 0x02, 0x82]);
        store.append(&ring.drain());
        let doc = read_doc(&mut s, &mut p, "btrace", "new", 0x100).unwrap();
        assert!(doc.contains("<raw>\n02820282\n</raw>"), "{doc}");
        // Nothing new: no <raw>.
        let doc = read_doc(&mut s, &mut p, "btrace", "new", 0x100).unwrap();
        assert!(!doc.contains("<raw>"), "{doc}");
        ring.write(&[0x00]);
        store.append(&ring.drain());
        let doc = read_doc(&mut s, &mut p, "btrace", "new", 0x100).unwrap();
        assert!(doc.contains("<raw>\n0282028200\n</raw>"), "{doc}");
        // A thread without a store cannot be started.
        assert_eq!(
            s.handle(b"Qbtrace:pt", Ok(TID + 1), &mut p).unwrap(),
            format!("E.thread {} is not being recorded", TID + 1).into_bytes()
        );
        assert_eq!(send(&mut s, &mut p, b"Qbtrace:off"), "OK");
        assert!(!p.is_active(TID));
    }

    #[test]
    fn view_from_enable_starts_at_the_first_psb_after_the_enable_point() {
        use crate::ring::{Capabilities, IntOn, Topa, TraceSink, TraceSource};
        let mut ring = Topa::circular(Capabilities::default(), &[4096], IntOn::Every).unwrap();
        let store = TraceStore::new();
        let mut p = TraceStoreProvider::from_enable(PtCpu::SOFTWARE);
        p.attach(TID, store.clone());
        let mut s = BtraceServer::new();
        // Recorded before GDB enables tracing: a PSB and a packet GDB must never see.
        ring.write(&PSB);
        ring.write(&[0x00, 0x11]);
        store.append(&ring.drain());
        assert_eq!(send(&mut s, &mut p, b"Qbtrace:pt"), "OK");
        // Stopped: nothing after the enable point yet.
        let doc = read_doc(&mut s, &mut p, "btrace", "all", 0x1000).unwrap();
        assert!(!doc.contains("<raw>"), "{doc}");
        // Bytes before the next PSB (the tail of a closed trace) cannot start a decode.
        ring.write(&[0x00, 0x22]);
        ring.write(&PSB);
        ring.write(&[0x00, 0x33]);
        store.append(&ring.drain());
        let doc = read_doc(&mut s, &mut p, "btrace", "new", 0x1000).unwrap();
        let want = format!("<raw>\n{}0033\n</raw>", "0282".repeat(8));
        assert!(doc.contains(&want), "{doc}");
        // Re-enabling moves the view to the new present.
        assert_eq!(send(&mut s, &mut p, b"Qbtrace:off"), "OK");
        assert_eq!(send(&mut s, &mut p, b"Qbtrace:pt"), "OK");
        let doc = read_doc(&mut s, &mut p, "btrace", "all", 0x1000).unwrap();
        assert!(!doc.contains("<raw>"), "{doc}");
    }

    #[test]
    fn server_started_recording_is_visible_to_gdb() {
        let mut p = provider(&[0x02, 0x82]);
        let mut s = BtraceServer::new();
        assert!(s.start_recording(7, &mut p).is_err());
        s.start_recording(TID, &mut p).unwrap();
        s.start_recording(TID, &mut p).unwrap();
        let conf = read_doc(&mut s, &mut p, "btrace-conf", "", 0x100).unwrap();
        assert!(conf.contains("<pt size=\"0x4000\"/>"), "{conf}");
        assert_eq!(
            send(&mut s, &mut p, b"Qbtrace:pt"),
            "E.Btrace already enabled."
        );
        assert_eq!(s.traced_threads().collect::<Vec<_>>(), vec![(TID, 0x4000)]);
    }

    #[test]
    fn new_and_delta_follow_gdbserver() {
        let mut p = Growing {
            data: vec![0x02, 0x82],
            on: false,
        };
        let mut s = BtraceServer::new();
        assert_eq!(send(&mut s, &mut p, b"Qbtrace:pt"), "OK");
        assert!(p.on);
        // delta: an error, so GDB falls back to `new`.
        assert!(send(&mut s, &mut p, b"qXfer:btrace:read:delta:0,100").starts_with("E."));
        // First `new`: the head moved since enabling: full data.
        let doc = read_doc(&mut s, &mut p, "btrace", "new", 0x100).unwrap();
        assert!(doc.contains("<raw>\n0282\n</raw>"), "{doc}");
        // A non-Intel CPU: no <cpu> element, as gdbserver.
        assert!(doc.contains("<pt-config>\n</pt-config>"), "{doc}");
        assert_eq!(s.lost_bytes(), 7);
        // Second `new` without new data: a <pt> without <raw>.
        let doc = read_doc(&mut s, &mut p, "btrace", "new", 0x100).unwrap();
        assert!(!doc.contains("<raw>") && doc.contains("<pt>"), "{doc}");
        // `all` always has the data.
        let doc = read_doc(&mut s, &mut p, "btrace", "all", 0x100).unwrap();
        assert!(doc.contains("<raw>\n0282\n</raw>"));
        p.data.push(0x00);
        let doc = read_doc(&mut s, &mut p, "btrace", "new", 0x100).unwrap();
        assert!(doc.contains("<raw>\n028200\n</raw>"));
        // A provider that fails to stop: the error text reaches GDB, tracing stays on.
        assert_eq!(
            send(&mut s, &mut p, b"Qbtrace:off"),
            "E.Could not disable branch tracing: device busy"
        );
    }

    #[test]
    fn new_document_is_cached_across_chunks() {
        let trace: Vec<u8> = (0..200u8).collect();
        let mut p = provider(&trace);
        let mut s = BtraceServer::new();
        send(&mut s, &mut p, b"Qbtrace:pt");
        // Paging a `new` document in small chunks must not re-evaluate "new" per chunk.
        let doc = read_doc(&mut s, &mut p, "btrace", "new", 16).unwrap();
        assert!(doc.contains(&rsp::hex_encode(&trace)));
        // A later offset of a different annex has no cached document.
        assert!(send(&mut s, &mut p, b"qXfer:btrace:read:all:10,10").starts_with("E."));
        assert!(send(&mut s, &mut p, b"qXfer:btrace-conf:read::10,10").starts_with("E."));
    }

    #[test]
    fn errors_and_malformed_packets_never_panic() {
        let mut p = provider(&[0x02, 0x82]);
        let mut s = BtraceServer::new();
        let cases: &[(&[u8], &str)] = &[
            (b"Qbtrace:bts", "E.ptrewind does not support Intel BTS"),
            (b"Qbtrace:xyz", "E.Bad Qbtrace operation."),
            (b"Qbtrace:", "E.Bad Qbtrace operation."),
            (b"Qbtrace-conf:pt:size=", "E.Bad size value."),
            (b"Qbtrace-conf:pt:size=zz", "E.Bad size value."),
            (b"Qbtrace-conf:pt:size=100000000", "E.Bad size value."),
            (
                b"Qbtrace-conf:bts:size=0x1000",
                "E.ptrewind does not support Intel BTS.",
            ),
            (
                b"Qbtrace-conf:pt:foo=1",
                "E.Bad Qbtrace configuration option.",
            ),
            (b"qXfer:btrace:read:all:0", "E.malformed qXfer"),
            (b"qXfer:btrace:read:all:zz,1", "E.malformed qXfer"),
            (b"qXfer:btrace:write:all:0,1", "E.malformed qXfer"),
            (b"qXfer:btrace-conf:read:x:0,10", "E.Bad annex."),
            (b"qXfer:btrace:read:all:0,100", "E.Btrace not enabled."),
        ];
        for (pkt, want) in cases {
            let got = send(&mut s, &mut p, pkt);
            assert!(
                got.starts_with(want),
                "{}: {got}",
                String::from_utf8_lossy(pkt)
            );
        }
        send(&mut s, &mut p, b"Qbtrace:pt");
        assert_eq!(
            send(&mut s, &mut p, b"qXfer:btrace:read:some:0,100"),
            "E.Bad annex."
        );
        // Offsets past the end of a cached document.
        let doc_len = read_doc(&mut s, &mut p, "btrace", "all", 0x1000)
            .unwrap()
            .len();
        let past = format!("qXfer:btrace:read:all:{:x},10", doc_len + 1);
        assert!(send(&mut s, &mut p, past.as_bytes()).starts_with("E."));
        // Thread selection errors.
        for (err, want) in [
            (
                ThreadError::MustSelectSingle,
                "E.Must select a single thread.",
            ),
            (ThreadError::NoSuchThread, "E.No such thread."),
        ] {
            for pkt in [
                &b"Qbtrace:pt"[..],
                b"Qbtrace:off",
                b"qXfer:btrace:read:all:0,10",
            ] {
                let r = s.handle(pkt, Err(err), &mut p).unwrap();
                assert_eq!(r, want.as_bytes());
            }
        }
        // Not ours.
        assert!(
            s.handle(b"qXfer:features:read:target.xml:0,10", Ok(TID), &mut p)
                .is_none()
        );
        assert!(s.handle(b"Qbtracex", Ok(TID), &mut p).is_none());
        // Provider refusal (no trace for this thread) reaches GDB as E.text.
        let r = s.handle(b"Qbtrace:pt", Ok(7), &mut p).unwrap();
        assert_eq!(r, b"E.no trace is available for thread 7");
    }

    #[test]
    fn thread_resolution() {
        let exists = |t: u32| t == 42 || t == 43;
        assert_eq!(resolve_thread(None, 42, exists), Ok(42));
        assert_eq!(resolve_thread(Some("0"), 42, exists), Ok(42));
        assert_eq!(resolve_thread(Some("p2a.0"), 42, exists), Ok(42));
        assert_eq!(resolve_thread(Some("p2a.2b"), 42, exists), Ok(43));
        assert_eq!(resolve_thread(Some("2b"), 42, exists), Ok(43));
        assert_eq!(
            resolve_thread(Some("p2a.2c"), 42, exists),
            Err(ThreadError::NoSuchThread)
        );
        assert_eq!(
            resolve_thread(Some("100000000"), 42, exists),
            Err(ThreadError::NoSuchThread)
        );
        assert_eq!(
            resolve_thread(Some("-1"), 42, exists),
            Err(ThreadError::MustSelectSingle)
        );
        assert_eq!(
            resolve_thread(Some("p2a"), 42, exists),
            Err(ThreadError::MustSelectSingle)
        );
        assert_eq!(
            resolve_thread(Some("junk"), 42, exists),
            Err(ThreadError::MustSelectSingle)
        );
    }

    #[test]
    fn cpuinfo_text_has_what_lldb_parses() {
        let text = PtCpu::SOFTWARE.proc_cpuinfo();
        // Re-implements LLDB's reading rules independently: "key : value" lines.
        let field = |k: &str| {
            text.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(key, _)| key.trim() == k)
                .map(|(_, v)| v.trim().to_string())
        };
        assert_eq!(field("vendor_id").as_deref(), Some("GenuineIntel"));
        assert_eq!(field("cpu family").as_deref(), Some("6"));
        assert_eq!(field("model").as_deref(), Some("122"));
        assert_eq!(field("stepping").as_deref(), Some("1"));
        // LLDB only returns after one more line that matches none of the keys.
        let last_key = text
            .lines()
            .position(|l| l.starts_with("stepping"))
            .unwrap();
        assert!(
            text.lines()
                .nth(last_key + 1)
                .is_some_and(|l| l.contains(':'))
        );
    }
}
