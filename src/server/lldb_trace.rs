//! LLDB's Intel PT trace packets (`jLLDBTraceSupported`, `jLLDBTraceStart`, `jLLDBTraceStop`,
//! `jLLDBTraceGetState`, `jLLDBTraceGetBinaryData`). (`qHostInfo` / `qProcessInfo`, which
//! LLDB also needs, are built into [`super::Router`].)
//!
//! Shapes follow LLDB's own schema code (`lldb/source/Utility/TraceGDBRemotePackets.cpp`,
//! `TraceIntelPTGDBRemotePackets.cpp`, LLDB ≥ 16 layout, the one in the installed lldb-19),
//! and lldb-server's handlers (`GDBRemoteCommunicationServerLLGS.cpp`):
//!
//! - `jLLDBTraceSupported` → `{"name":"intel-pt","description":…}`; the name selects LLDB's
//!   `intel-pt` trace plug-in.
//! - `jLLDBTraceStart:{"type":"intel-pt","tids":[…]?,"iptTraceSize":N,"enableTsc":b,
//!   "psbPeriod":N|null,"perCpuTracing":b?,"processBufferSizeLimit":N?,
//!   "disableCgroupTracing":b?}` → `OK`. Without `tids` the whole process is traced, threads
//!   created later included ([`LldbTraceServer::thread_created`]).
//! - `jLLDBTraceStop:{"type":"intel-pt","tids":[…]?}` → `OK`.
//! - `jLLDBTraceGetState:{"type":"intel-pt"}` → `{"tracedThreads":[{"tid":T,"binaryData":
//!   [{"kind":"iptTrace","size":S}]}],"processBinaryData":[{"kind":"procfsCpuInfo","size":N}],
//!   "usingCgroupFiltering":false,"warnings":[…]?}`. `usingCgroupFiltering` is required by
//!   LLDB's parser; `cpus` (per-CPU tracing) and `tscPerfZeroConversion` (TSC → ns; we have
//!   no TSC) are optional and omitted.
//! - `jLLDBTraceGetBinaryData:{"type":"intel-pt","kind":K,"tid":T|null,"cpuId":C|null}` →
//!   the raw bytes (binary reply; the router escapes `# $ } *`, LLDB's client undoes it).
//!
//! The CPU: LLDB does not look at the host CPU. For a live process its intel-pt plug-in
//! fetches the `procfsCpuInfo` process data from the server and parses `vendor_id`,
//! `cpu family`, `model` and `stepping` out of it (`TraceIntelPT::GetCPUInfoForLiveProcess`),
//! then calls libipt's `pt_cpu_errata`, which fails for a non-Intel vendor or an unknown
//! model. So on an AMD host we serve a `/proc/cpuinfo` text describing the provider's
//! [`PtCpu`](super::btrace::PtCpu) ([`PtCpu::proc_cpuinfo`](super::btrace::PtCpu::proc_cpuinfo)), never the host's.
//!
//! Errors are `E<code>;<hex message>`, which LLDB's client shows as the message.
//!
//! Protocol wrinkle: LLDB's client classifies any `jLLDBTraceGetBinaryData` reply that starts
//! with `E` and two hex digits as an error. A trace that starts at a PSB (`02 82`) never does,
//! but one cut from a wrapped ring can; such a trace is sent with one leading PAD byte (`00`,
//! which PT decoders skip) and its size in `jLLDBTraceGetState` counts that byte.

use super::btrace::{PtTraceProvider, StartOptions};
use super::rsp;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The trace plug-in name; must equal LLDB's plug-in name.
pub const TRACE_TYPE: &str = "intel-pt";

/// Binary data kind: a thread's PT trace.
pub const KIND_IPT_TRACE: &str = "iptTrace";

/// Binary data kind: the process's `/proc/cpuinfo` text.
pub const KIND_PROCFS_CPUINFO: &str = "procfsCpuInfo";

/// Buffer size used when a start request has no `iptTraceSize` (LLDB's own default, 4 KiB).
pub const DEFAULT_IPT_TRACE_SIZE: u64 = 4096;

/// Error code used in LLDB error replies (LLDB shows the message, not the code).
const ERR: u8 = 0x01;

type Reply = Result<Vec<u8>, String>;

/// The trace as sent to LLDB: with a leading PAD if it would otherwise look like an error
/// reply (see the module docs).
fn lldb_safe_trace(data: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    match data {
        [b'E', a, b, ..] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => {
            let mut padded = Vec::with_capacity(data.len() + 1);
            padded.push(0x00);
            padded.extend_from_slice(data);
            std::borrow::Cow::Owned(padded)
        }
        _ => std::borrow::Cow::Borrowed(data),
    }
}

/// LLDB's trace packets as a state machine over a [`PtTraceProvider`].
#[derive(Clone, Debug, Default)]
pub struct LldbTraceServer {
    /// Options of a running process-wide trace (applied to new threads too).
    process: Option<StartOptions>,
    /// Traced threads and the buffer size the provider reported.
    threads: BTreeMap<u32, u64>,
}

fn field<'a>(obj: &'a Value, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn u64_field(obj: &Value, key: &str) -> Result<Option<u64>, String> {
    match field(obj, key) {
        None => Ok(None),
        // LLDB writes some 64-bit numbers as strings ("JSONUINT64"); accept both.
        Some(Value::String(s)) => {
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => s.parse().ok(),
            };
            parsed
                .map(Some)
                .ok_or_else(|| format!("\"{key}\" is not a number: \"{s}\""))
        }
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("\"{key}\" is not an unsigned integer")),
    }
}

fn bool_field(obj: &Value, key: &str) -> Result<bool, String> {
    match field(obj, key) {
        None => Ok(false),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| format!("\"{key}\" is not a boolean")),
    }
}

fn tids_field(obj: &Value) -> Result<Option<Vec<u32>>, String> {
    match field(obj, "tids") {
        None => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| format!("invalid thread id {t} in \"tids\""))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err("\"tids\" is not an array".into()),
    }
}

/// Parses a JSON request body and checks its `"type"`.
fn request(body: &[u8]) -> Result<Value, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("malformed JSON request: {e}"))?;
    if !value.is_object() {
        return Err("malformed JSON request: not an object".into());
    }
    match value.get("type").and_then(Value::as_str) {
        Some(TRACE_TYPE) => Ok(value),
        Some(other) => Err(format!("Unsupported tracing type '{other}'")),
        None => Err("missing value at TraceRequest.type".into()),
    }
}

impl LldbTraceServer {
    /// Nothing traced.
    pub fn new() -> Self {
        Self::default()
    }

    /// True if this module answers `packet`.
    pub fn handles(packet: &[u8]) -> bool {
        packet.starts_with(b"jLLDBTrace")
    }

    /// The traced threads.
    pub fn traced_threads(&self) -> impl Iterator<Item = u32> + '_ {
        self.threads.keys().copied()
    }

    /// True while a process-wide trace is running.
    pub fn is_process_traced(&self) -> bool {
        self.process.is_some()
    }

    /// Call when the target gets a new thread: under process tracing it is traced too.
    /// Returns the provider's error if starting failed (the thread then stays untraced).
    pub fn thread_created(
        &mut self,
        tid: u32,
        provider: &mut dyn PtTraceProvider,
    ) -> Result<(), String> {
        if let Some(options) = self.process {
            let size = provider.start(tid, &options)?;
            self.threads.insert(tid, size);
        }
        Ok(())
    }

    /// Call when a thread exits.
    pub fn thread_exited(&mut self, tid: u32) {
        self.threads.remove(&tid);
    }

    /// Answers a `jLLDBTrace*` packet (un-escaped body). `live_threads` are the target's
    /// current threads. Returns `None` for other packets.
    pub fn handle(
        &mut self,
        packet: &[u8],
        live_threads: &[u32],
        provider: &mut dyn PtTraceProvider,
    ) -> Option<Vec<u8>> {
        let reply = if packet == b"jLLDBTraceSupported" {
            Ok(json!({
                "name": TRACE_TYPE,
                "description": "Intel Processor Trace recorded by ptrewind (per-thread, \
                                user space; hardware intel_pt or software encoding)",
            })
            .to_string()
            .into_bytes())
        } else if let Some(body) = packet.strip_prefix(b"jLLDBTraceStart:") {
            self.start(body, live_threads, provider)
        } else if let Some(body) = packet.strip_prefix(b"jLLDBTraceStop:") {
            self.stop(body, provider)
        } else if let Some(body) = packet.strip_prefix(b"jLLDBTraceGetState:") {
            self.get_state(body, provider)
        } else if let Some(body) = packet.strip_prefix(b"jLLDBTraceGetBinaryData:") {
            self.get_binary_data(body, provider)
        } else if Self::handles(packet) {
            Err(format!(
                "unsupported trace packet '{}'",
                String::from_utf8_lossy(&packet[..packet.len().min(40)])
            ))
        } else {
            return None;
        };
        Some(reply.unwrap_or_else(|msg| rsp::lldb_error(ERR, &msg)))
    }

    fn start(
        &mut self,
        body: &[u8],
        live_threads: &[u32],
        provider: &mut dyn PtTraceProvider,
    ) -> Reply {
        let req = request(body)?;
        let tids = tids_field(&req)?;
        let options = StartOptions {
            buffer_size: u64_field(&req, "iptTraceSize")?.unwrap_or(DEFAULT_IPT_TRACE_SIZE),
            enable_tsc: bool_field(&req, "enableTsc")?,
            psb_period: u64_field(&req, "psbPeriod")?,
        };
        // Validated for shape; we trace per thread and have no cgroups to filter.
        u64_field(&req, "processBufferSizeLimit")?;
        bool_field(&req, "disableCgroupTracing")?;
        if bool_field(&req, "perCpuTracing")? {
            return Err(
                "ptrewind traces per thread; per-cpu tracing (--per-cpu-tracing) is not supported"
                    .into(),
            );
        }
        match tids {
            None => {
                if self.process.is_some() {
                    return Err("Process currently traced. Stop process tracing first".into());
                }
                // Start every live thread not traced yet.
                let untraced = live_threads
                    .iter()
                    .copied()
                    .filter(|tid| !self.threads.contains_key(tid));
                self.threads
                    .extend(start_all(provider, untraced, &options)?);
                self.process = Some(options);
            }
            Some(tids) => {
                for &tid in &tids {
                    if !live_threads.contains(&tid) {
                        return Err(format!("Thread {tid} does not exist"));
                    }
                    if self.threads.contains_key(&tid) {
                        return Err(format!("Thread {tid} already traced"));
                    }
                }
                self.threads
                    .extend(start_all(provider, tids.iter().copied(), &options)?);
            }
        }
        Ok(b"OK".to_vec())
    }

    fn stop(&mut self, body: &[u8], provider: &mut dyn PtTraceProvider) -> Reply {
        let req = request(body)?;
        let tids = match tids_field(&req)? {
            None => {
                if self.process.is_none() && self.threads.is_empty() {
                    return Err("Process not currently traced".into());
                }
                self.process = None;
                self.threads.keys().copied().collect()
            }
            Some(tids) => {
                if let Some(t) = tids.iter().find(|t| !self.threads.contains_key(t)) {
                    return Err(format!("Thread {t} not currently traced"));
                }
                tids
            }
        };
        let mut errors = Vec::new();
        for tid in tids {
            if let Err(e) = provider.stop(tid) {
                errors.push(format!("thread {tid}: {e}"));
            }
            self.threads.remove(&tid);
        }
        if errors.is_empty() {
            Ok(b"OK".to_vec())
        } else {
            Err(format!("stopping the trace failed: {}", errors.join("; ")))
        }
    }

    fn get_state(&mut self, body: &[u8], provider: &mut dyn PtTraceProvider) -> Reply {
        request(body)?;
        let mut traced = Vec::new();
        let mut warnings = Vec::new();
        for &tid in self.threads.keys() {
            match provider.snapshot(tid) {
                Ok(snap) => {
                    if snap.lost > 0 {
                        warnings.push(format!(
                            "thread {tid}: {} trace bytes were lost (the trace buffer overflowed); \
                             the oldest history is missing",
                            snap.lost
                        ));
                    }
                    traced.push(json!({
                        "tid": tid,
                        "binaryData": [{
                            "kind": KIND_IPT_TRACE,
                            "size": lldb_safe_trace(&snap.data).len(),
                        }],
                    }));
                }
                Err(e) => warnings.push(format!("thread {tid}: trace unavailable: {e}")),
            }
        }
        let cpuinfo_len = provider.cpu().proc_cpuinfo().len();
        let mut state = json!({
            "tracedThreads": traced,
            "processBinaryData": [{"kind": KIND_PROCFS_CPUINFO, "size": cpuinfo_len}],
            "usingCgroupFiltering": false,
        });
        if !warnings.is_empty() {
            state["warnings"] = json!(warnings);
        }
        Ok(state.to_string().into_bytes())
    }

    fn get_binary_data(&mut self, body: &[u8], provider: &mut dyn PtTraceProvider) -> Reply {
        let req = request(body)?;
        let kind = req
            .get("kind")
            .and_then(Value::as_str)
            .ok_or("missing value at TraceGetBinaryDataRequest.kind")?;
        if u64_field(&req, "cpuId")?.is_some() {
            return Err("per-cpu trace data is not available: ptrewind traces per thread".into());
        }
        let tid = u64_field(&req, "tid")?;
        match kind {
            KIND_PROCFS_CPUINFO => Ok(provider.cpu().proc_cpuinfo().into_bytes()),
            KIND_IPT_TRACE => {
                let tid = tid
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or("\"iptTrace\" data needs a \"tid\"")?;
                if !self.threads.contains_key(&tid) {
                    return Err(format!("Thread {tid} not currently traced"));
                }
                let snap = provider.snapshot(tid)?;
                Ok(lldb_safe_trace(&snap.data).into_owned())
            }
            other => Err(format!("Unsupported trace binary data kind: {other}")),
        }
    }
}

/// Starts tracing each of `tids` with `options`; returns each thread's buffer size. On a failure
/// the threads started so far are stopped again, so the traced set stays as it was.
fn start_all(
    provider: &mut dyn PtTraceProvider,
    tids: impl Iterator<Item = u32>,
    options: &StartOptions,
) -> Result<Vec<(u32, u64)>, String> {
    let mut started = Vec::new();
    for tid in tids {
        match provider.start(tid, options) {
            Ok(size) => started.push((tid, size)),
            Err(e) => {
                for (t, _) in started {
                    let _ = provider.stop(t);
                }
                return Err(format!("cannot trace thread {tid}: {e}"));
            }
        }
    }
    Ok(started)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::btrace::{FixedTraceProvider, PtCpu};

    const TID: u32 = 500;

    fn provider() -> FixedTraceProvider {
        let mut p = FixedTraceProvider::new(PtCpu::SOFTWARE);
        p.set_trace(TID, vec![0x02, 0x82, b'#', b'}', 0x00]);
        p
    }

    fn send(s: &mut LldbTraceServer, p: &mut FixedTraceProvider, pkt: &str) -> Vec<u8> {
        s.handle(pkt.as_bytes(), &[TID], p).expect("trace packet")
    }

    fn json_reply(s: &mut LldbTraceServer, p: &mut FixedTraceProvider, pkt: &str) -> Value {
        let r = send(s, p, pkt);
        serde_json::from_slice(&r)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&r)))
    }

    /// Decodes an LLDB error reply the way LLDB's client does: `E`, two hex digits, `;`,
    /// hex message.
    fn lldb_message(reply: &[u8]) -> String {
        assert_eq!(reply[0], b'E', "{}", String::from_utf8_lossy(reply));
        assert!(reply[1].is_ascii_hexdigit() && reply[2].is_ascii_hexdigit());
        assert_eq!(reply[3], b';');
        String::from_utf8(rsp::hex_decode(&reply[4..]).unwrap()).unwrap()
    }

    #[test]
    fn supported_names_the_intel_pt_plugin() {
        let (mut s, mut p) = (LldbTraceServer::new(), provider());
        let v = json_reply(&mut s, &mut p, "jLLDBTraceSupported");
        assert_eq!(v["name"], "intel-pt");
        assert!(v["description"].is_string());
    }

    #[test]
    fn process_trace_lifecycle() {
        let (mut s, mut p) = (LldbTraceServer::new(), provider());
        // What `process trace start` sends (LLDB 19, defaults).
        let start = r#"jLLDBTraceStart:{"disableCgroupTracing":false,"enableTsc":false,"iptTraceSize":4096,"perCpuTracing":false,"processBufferSizeLimit":524288000,"psbPeriod":null,"type":"intel-pt"}"#;
        assert_eq!(send(&mut s, &mut p, start), b"OK");
        assert!(s.is_process_traced() && p.is_active(TID));
        assert_eq!(
            lldb_message(&send(&mut s, &mut p, start)),
            "Process currently traced. Stop process tracing first"
        );
        let state = json_reply(&mut s, &mut p, r#"jLLDBTraceGetState:{"type":"intel-pt"}"#);
        assert_eq!(state["usingCgroupFiltering"], false);
        assert_eq!(state["tracedThreads"][0]["tid"], TID);
        assert_eq!(
            state["tracedThreads"][0]["binaryData"][0]["kind"],
            "iptTrace"
        );
        assert_eq!(state["tracedThreads"][0]["binaryData"][0]["size"], 5);
        assert_eq!(state["processBinaryData"][0]["kind"], "procfsCpuInfo");
        let cpuinfo_size = state["processBinaryData"][0]["size"].as_u64().unwrap();
        assert!(state.get("warnings").is_none());
        // Binary data: raw bytes (the router escapes them on the wire).
        let data = send(
            &mut s,
            &mut p,
            &format!(
                r#"jLLDBTraceGetBinaryData:{{"cpuId":null,"kind":"iptTrace","tid":{TID},"type":"intel-pt"}}"#
            ),
        );
        assert_eq!(data, vec![0x02, 0x82, b'#', b'}', 0x00]);
        let cpuinfo = send(
            &mut s,
            &mut p,
            r#"jLLDBTraceGetBinaryData:{"cpuId":null,"kind":"procfsCpuInfo","tid":null,"type":"intel-pt"}"#,
        );
        assert_eq!(cpuinfo.len() as u64, cpuinfo_size);
        assert!(
            String::from_utf8(cpuinfo)
                .unwrap()
                .contains("vendor_id\t: GenuineIntel")
        );
        // New threads join a process trace (this one has no trace available: error surfaces).
        assert!(s.thread_created(TID + 1, &mut p).is_err());
        assert_eq!(
            send(&mut s, &mut p, r#"jLLDBTraceStop:{"type":"intel-pt"}"#),
            b"OK"
        );
        assert!(!p.is_active(TID) && !s.is_process_traced());
        assert_eq!(
            lldb_message(&send(
                &mut s,
                &mut p,
                r#"jLLDBTraceStop:{"type":"intel-pt"}"#
            )),
            "Process not currently traced"
        );
    }

    #[test]
    fn traces_that_look_like_errors_get_a_pad() {
        let mut p = FixedTraceProvider::new(PtCpu::SOFTWARE);
        p.set_trace(TID, b"E0a\x02\x82".to_vec());
        let mut s = LldbTraceServer::new();
        let start = format!(r#"jLLDBTraceStart:{{"type":"intel-pt","tids":[{TID}]}}"#);
        assert_eq!(send(&mut s, &mut p, &start), b"OK");
        let state = json_reply(&mut s, &mut p, r#"jLLDBTraceGetState:{"type":"intel-pt"}"#);
        assert_eq!(state["tracedThreads"][0]["binaryData"][0]["size"], 6);
        let get = format!(
            r#"jLLDBTraceGetBinaryData:{{"type":"intel-pt","kind":"iptTrace","tid":{TID}}}"#
        );
        assert_eq!(send(&mut s, &mut p, &get), b"\x00E0a\x02\x82");
        // Not error-like: unchanged.
        p.set_trace(TID, b"E0g".to_vec());
        assert_eq!(send(&mut s, &mut p, &get), b"E0g");
        p.set_trace(TID, b"E".to_vec());
        assert_eq!(send(&mut s, &mut p, &get), b"E");
    }

    #[test]
    fn thread_trace_lifecycle() {
        let (mut s, mut p) = (LldbTraceServer::new(), provider());
        let start = format!(
            r#"jLLDBTraceStart:{{"enableTsc":false,"iptTraceSize":8192,"psbPeriod":null,"tids":[{TID}],"type":"intel-pt"}}"#
        );
        assert_eq!(send(&mut s, &mut p, &start), b"OK");
        assert_eq!(
            lldb_message(&send(&mut s, &mut p, &start)),
            format!("Thread {TID} already traced")
        );
        assert_eq!(
            lldb_message(&send(
                &mut s,
                &mut p,
                r#"jLLDBTraceStart:{"type":"intel-pt","tids":[9]}"#
            )),
            "Thread 9 does not exist"
        );
        assert_eq!(
            lldb_message(&send(
                &mut s,
                &mut p,
                r#"jLLDBTraceStop:{"type":"intel-pt","tids":[9]}"#
            )),
            "Thread 9 not currently traced"
        );
        assert_eq!(
            send(
                &mut s,
                &mut p,
                &format!(r#"jLLDBTraceStop:{{"type":"intel-pt","tids":[{TID}]}}"#)
            ),
            b"OK"
        );
        assert_eq!(s.traced_threads().count(), 0);
    }

    #[test]
    fn refusals_and_malformed_requests() {
        let (mut s, mut p) = (LldbTraceServer::new(), provider());
        let cases: &[(&str, &str)] = &[
            (
                r#"jLLDBTraceStart:{"type":"intel-bts"}"#,
                "Unsupported tracing type 'intel-bts'",
            ),
            (
                r#"jLLDBTraceStart:{"tids":[1]}"#,
                "missing value at TraceRequest.type",
            ),
            (
                r#"jLLDBTraceStart:{"type":"intel-pt""#,
                "malformed JSON request",
            ),
            (
                r#"jLLDBTraceStart:[]"#,
                "malformed JSON request: not an object",
            ),
            (r#"jLLDBTraceStart:"#, "malformed JSON request"),
            (
                r#"jLLDBTraceStart:{"type":"intel-pt","tids":"x"}"#,
                "\"tids\" is not an array",
            ),
            (
                r#"jLLDBTraceStart:{"type":"intel-pt","tids":[-1]}"#,
                "invalid thread id -1",
            ),
            (
                r#"jLLDBTraceStart:{"type":"intel-pt","iptTraceSize":-5}"#,
                "\"iptTraceSize\" is not an unsigned integer",
            ),
            (
                r#"jLLDBTraceStart:{"type":"intel-pt","enableTsc":1}"#,
                "\"enableTsc\" is not a boolean",
            ),
            (
                r#"jLLDBTraceStart:{"type":"intel-pt","perCpuTracing":true}"#,
                "ptrewind traces per thread",
            ),
            (
                r#"jLLDBTraceStart:{"type":"intel-pt","enableTsc":true}"#,
                "cannot trace thread 500: this trace has no timestamps",
            ),
            (
                r#"jLLDBTraceGetBinaryData:{"type":"intel-pt","kind":"iptTrace","tid":500}"#,
                "Thread 500 not currently traced",
            ),
            (
                r#"jLLDBTraceGetBinaryData:{"type":"intel-pt","kind":"iptTrace"}"#,
                "\"iptTrace\" data needs a \"tid\"",
            ),
            (
                r#"jLLDBTraceGetBinaryData:{"type":"intel-pt","kind":"perfContextSwitchTrace","cpuId":0}"#,
                "per-cpu trace data is not available",
            ),
            (
                r#"jLLDBTraceGetBinaryData:{"type":"intel-pt","kind":"perfContextSwitchTrace"}"#,
                "Unsupported trace binary data kind",
            ),
            (
                r#"jLLDBTraceGetBinaryData:{"type":"intel-pt"}"#,
                "missing value at TraceGetBinaryDataRequest.kind",
            ),
            (r#"jLLDBTraceGetState:"#, "malformed JSON request"),
            ("jLLDBTraceFrobnicate", "unsupported trace packet"),
        ];
        for (pkt, want) in cases {
            let msg = lldb_message(&send(&mut s, &mut p, pkt));
            assert!(msg.starts_with(want), "{pkt}: {msg}");
        }
        // A failed start leaves nothing traced.
        assert_eq!(s.traced_threads().count(), 0);
        assert!(!p.is_active(TID));
        // Non-UTF-8 / binary garbage does not panic.
        let r = s
            .handle(b"jLLDBTraceStart:\xff\xfe}", &[TID], &mut p)
            .unwrap();
        assert!(lldb_message(&r).starts_with("malformed JSON"));
        assert!(s.handle(b"qSupported", &[TID], &mut p).is_none());
        // String-encoded numbers are accepted, as LLDB's JSONUINT64.
        let r = send(
            &mut s,
            &mut p,
            r#"jLLDBTraceStart:{"type":"intel-pt","iptTraceSize":"0x2000","tids":[500]}"#,
        );
        assert_eq!(r, b"OK");
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use crate::server::btrace::{BtraceServer, FixedTraceProvider, PtCpu, ThreadError};
    use proptest::prelude::*;

    fn packet() -> impl Strategy<Value = Vec<u8>> {
        let prefixes = prop::sample::select(vec![
            &b"Qbtrace:"[..],
            b"Qbtrace-conf:pt:size=",
            b"qXfer:btrace:read:",
            b"qXfer:btrace-conf:read:",
            b"jLLDBTraceStart:",
            b"jLLDBTraceStop:",
            b"jLLDBTraceGetState:",
            b"jLLDBTraceGetBinaryData:",
            b"jLLDBTrace",
            b"",
        ]);
        let tails = prop::sample::select(vec![
            &b"pt"[..],
            b"all:0,10",
            b"new:ffffffffffffffff,ffffffffffffffff",
            b":0,0",
            br#"{"type":"intel-pt"}"#,
            br#"{"type":"intel-pt","kind":"iptTrace","tid":7}"#,
            br#"{"type":"intel-pt","tids":[7,8,4294967296]}"#,
        ]);
        (prefixes, tails, prop::collection::vec(any::<u8>(), 0..24)).prop_map(|(p, t, junk)| {
            let mut v = p.to_vec();
            v.extend_from_slice(t);
            v.extend_from_slice(&junk);
            v
        })
    }

    proptest! {
        /// Any sequence of (partly malformed) trace packets gets a reply, never a panic, and
        /// errors always have the client's error shape.
        #[test]
        fn trace_packets_never_panic(packets in prop::collection::vec(packet(), 1..12)) {
            let mut p = FixedTraceProvider::new(PtCpu::SOFTWARE);
            p.set_trace(7, vec![0x02, 0x82, 0x45, 0x30, 0x30]);
            let mut gdb = BtraceServer::new();
            let mut lldb = LldbTraceServer::new();
            for (i, pkt) in packets.iter().enumerate() {
                let thread = if i % 5 == 4 { Err(ThreadError::NoSuchThread) } else { Ok(7) };
                if let Some(r) = gdb.handle(pkt, thread, &mut p) {
                    prop_assert!(r == b"OK" || r.starts_with(b"E.") || r.starts_with(b"m")
                        || r.starts_with(b"l"));
                }
                if let Some(r) = lldb.handle(pkt, &[7], &mut p) {
                    prop_assert!(!r.is_empty() || pkt.starts_with(b"jLLDBTraceGetBinaryData"));
                }
            }
        }

        /// The RSP parsers accept or reject arbitrary bytes without panicking.
        #[test]
        fn rsp_parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
            let _ = rsp::parse_qxfer_read(&bytes);
            let _ = rsp::parse_thread_id(&bytes);
            let _ = rsp::parse_hex_u64(&bytes);
            let _ = rsp::hex_decode(&bytes);
            let doc = b"<doc/>";
            if let Ok(q) = rsp::parse_qxfer_read(&bytes) {
                let _ = rsp::qxfer_chunk(doc, q.offset, q.length);
            }
        }
    }
}
