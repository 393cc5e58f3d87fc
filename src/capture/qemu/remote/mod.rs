//! A GDB remote-protocol *client* for QEMU's user-mode gdbstub (`qemu-x86_64 -g SOCKET prog`):
//! run control, registers, memory, breakpoints and threads of a program running under QEMU, at
//! the present.
//!
//! * [`wire`] — framing, checksums, acknowledgements, run-length decoding, escapes, hex;
//! * [`stop`] — thread ids and stop replies;
//! * [`regs`] — the register layout from the stub's target description;
//! * [`launch`] — starting `qemu-x86_64` on a UNIX socket in a private directory;
//! * [`Remote`] — the requests (`qSupported`, `?`, `g`/`G`/`p`/`P`, `m`/`M`/`X`, `Z`/`z`,
//!   `vCont`, `qfThreadInfo`, `Hg`, `qXfer`…) with typed errors and a timeout on every reply.
//!
//! What QEMU 7.2's user-mode stub does (measured; see `docs/qemu-gdbstub.md`): acknowledgements cannot
//! be turned off, `X` and watchpoints (`Z2`–`Z4`) are not offered, `p`/`P` answer only once the
//! target description was read, a thread resumed at a breakpoint hits it again, a `0x03` byte is
//! not read while the guest runs (the stub reads its socket only inside a stop: [`launch`]
//! interrupts with `SIGINT` instead), and a stop is not all-stop — the other guest threads keep
//! running and may report stops of their own, which [`Remote`] queues (see
//! [`Remote::pending_stops`]).

pub mod launch;
pub mod regs;
pub mod stop;
pub mod wire;

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use thiserror::Error;

pub use launch::{LaunchError, QemuLaunch, QemuProcess};
pub use regs::{RegInfo, RegLayout, Registers};
pub use stop::{StopReason, StopReply, ThreadId, WatchKind, gdb_signal};
pub use wire::Transport;

use wire::{Incoming, Wire, escape_binary, hex_decode, hex_encode, lossy, unescape_binary};

/// What went wrong talking to the stub.
#[derive(Debug, Error)]
pub enum RemoteError {
    /// A socket operation failed.
    #[error("cannot {op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// No reply in time.
    #[error("the gdbstub did not answer in time (waiting for {waiting_for})")]
    Timeout {
        /// What was expected.
        waiting_for: String,
    },
    /// The stub closed the connection (QEMU exited or was killed).
    #[error("the gdbstub closed the connection (waiting for {waiting_for})")]
    Closed {
        /// What was expected.
        waiting_for: String,
    },
    /// The stub refused a packet with `-` every time it was sent.
    #[error("the gdbstub rejected `{request}` {tries} times (bad checksum on its side)")]
    Nak {
        /// The request.
        request: String,
        /// How many times it was sent.
        tries: u32,
    },
    /// A packet with a wrong checksum when acknowledgements are off (cannot be asked again).
    #[error("packet with a bad checksum from the gdbstub: {body}")]
    Checksum {
        /// The packet body.
        body: String,
    },
    /// A packet over the size bound.
    #[error("{what} longer than {limit} bytes")]
    PacketTooLarge {
        /// The bound.
        limit: usize,
        /// Which packet.
        what: &'static str,
    },
    /// A reply that does not parse.
    #[error("malformed {what} from the gdbstub: `{text}`")]
    Malformed {
        /// What was being parsed.
        what: &'static str,
        /// The offending text (truncated).
        text: String,
    },
    /// An `Enn` reply.
    #[error("the gdbstub answered `{request}` with error {code}")]
    ErrorReply {
        /// The request.
        request: String,
        /// The error text after `E`.
        code: String,
    },
    /// An empty reply: the stub does not implement the request.
    #[error("the gdbstub does not support `{request}`")]
    Unsupported {
        /// The request.
        request: String,
    },
    /// The target description is unusable.
    #[error("target description: {0}")]
    Description(String),
    /// A request that needs a stopped target was made while it runs.
    #[error("`{request}` needs the program stopped, but it is running")]
    Running {
        /// The request.
        request: String,
    },
}

impl RemoteError {
    fn io(op: &'static str, source: io::Error) -> Self {
        RemoteError::Io { op, source }
    }

    /// Whether the connection is gone (the process exited, was killed, or QEMU died).
    pub fn is_disconnect(&self) -> bool {
        matches!(self, RemoteError::Closed { .. })
            || matches!(self, RemoteError::Io { source, .. }
                if matches!(source.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset))
    }
}

/// What `qSupported` announced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// `PacketSize` (the stub's receive buffer), if announced.
    pub packet_size: Option<usize>,
    /// `multiprocess+`: thread ids carry `p<pid>.`.
    pub multiprocess: bool,
    /// `qXfer:features:read+`: a target description.
    pub xfer_features: bool,
    /// `qXfer:auxv:read+`.
    pub xfer_auxv: bool,
    /// `qXfer:exec-file:read+`.
    pub xfer_exec_file: bool,
    /// `QStartNoAckMode+`.
    pub no_ack_mode: bool,
    /// `swbreak+`: breakpoint stops say `swbreak`.
    pub swbreak: bool,
    /// `hwbreak+`.
    pub hwbreak: bool,
    /// Every feature as announced.
    pub raw: Vec<String>,
}

impl Features {
    fn parse(reply: &[u8]) -> Self {
        let mut f = Features::default();
        for item in String::from_utf8_lossy(reply).split(';') {
            match item {
                "multiprocess+" => f.multiprocess = true,
                "qXfer:features:read+" => f.xfer_features = true,
                "qXfer:auxv:read+" => f.xfer_auxv = true,
                "qXfer:exec-file:read+" => f.xfer_exec_file = true,
                "QStartNoAckMode+" => f.no_ack_mode = true,
                "swbreak+" => f.swbreak = true,
                "hwbreak+" => f.hwbreak = true,
                _ => {
                    if let Some(v) = item.strip_prefix("PacketSize=") {
                        f.packet_size = usize::from_str_radix(v, 16).ok();
                    }
                }
            }
            if !item.is_empty() {
                f.raw.push(item.to_string());
            }
        }
        f
    }
}

/// Which `vCont` actions the stub accepts (`vCont?`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VContSupport {
    /// `c`.
    pub cont: bool,
    /// `C sig`.
    pub cont_signal: bool,
    /// `s`.
    pub step: bool,
    /// `S sig`.
    pub step_signal: bool,
    /// `t` (stop a thread; non-stop mode).
    pub stop: bool,
    /// `r start,end` (range step).
    pub range: bool,
}

/// One `vCont` action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Continue.
    Continue,
    /// Continue delivering GDB signal `n`.
    ContinueSignal(u8),
    /// Single-step.
    Step,
    /// Single-step delivering GDB signal `n`.
    StepSignal(u8),
}

/// An action for one thread, or (`thread: None`) for every thread no other action names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeAction {
    /// What to do.
    pub action: Action,
    /// Which thread.
    pub thread: Option<ThreadId>,
}

/// `Z`/`z` kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakKind {
    /// `Z0`: software breakpoint.
    Software,
    /// `Z1`: hardware breakpoint.
    Hardware,
    /// `Z2`: write watchpoint.
    Write,
    /// `Z3`: read watchpoint.
    Read,
    /// `Z4`: access watchpoint.
    Access,
}

impl BreakKind {
    fn code(self) -> u8 {
        match self {
            BreakKind::Software => 0,
            BreakKind::Hardware => 1,
            BreakKind::Write => 2,
            BreakKind::Read => 3,
            BreakKind::Access => 4,
        }
    }
}

/// Connection settings.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// How long a reply may take (requests made while stopped).
    pub timeout: Duration,
    /// Upper bound on a `qXfer` object (auxv, target description).
    pub max_xfer: usize,
    /// Upper bound on console output (`O` packets) kept; more is counted, not kept.
    pub max_output: usize,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            timeout: Duration::from_secs(10),
            max_xfer: 16 << 20,
            max_output: 1 << 20,
        }
    }
}

/// A connection to a GDB stub, set up (`qSupported`, acknowledgement mode, `vCont?`, target
/// description, `?`).
#[derive(Debug)]
pub struct Remote<S> {
    wire: Wire<S>,
    opts: RemoteOptions,
    features: Features,
    vcont: VContSupport,
    layout: RegLayout,
    /// Number of registers (from 0) a `g` reply carries, once seen.
    g_count: Option<usize>,
    /// The thread register and memory requests apply to, when known: the last `Hg`'s, or the
    /// thread of the last stop reply (QEMU's `gdb_handlesig` makes the reporting thread the
    /// current one), so that a step's register reads need no `Hg` of their own.
    g_thread: Option<ThreadId>,
    /// Whether `X` works (`None`: not tried yet).
    x_packet: Option<bool>,
    /// Stop replies that arrived while a request was answered, oldest first.
    pending: VecDeque<StopReply>,
    /// The stop reply of `?` at connection.
    initial_stop: StopReply,
    /// A resume was sent and its stop not yet received.
    running: bool,
    /// Console output (`O` packets) received while running.
    output: Vec<u8>,
    /// Console output bytes dropped beyond `max_output`.
    output_dropped: u64,
}

impl<S: Transport> Remote<S> {
    /// Sets up the connection over `stream`.
    pub fn connect(stream: S, opts: RemoteOptions) -> Result<Self, RemoteError> {
        let mut wire = Wire::new(stream);
        let deadline = Instant::now() + opts.timeout;
        // Whatever the stub sent before the handshake (a `+`) is skipped by the framing.
        wire.send(
            b"qSupported:multiprocess+;swbreak+;hwbreak+;vContSupported+;xmlRegisters=i386",
            deadline,
        )?;
        let reply = recv_reply(&mut wire, deadline, "qSupported")?;
        let features = Features::parse(&reply);
        if let Some(size) = features.packet_size {
            // Replies to `m` are bounded by the request; keep a generous margin anyway.
            wire.set_max_packet(wire.max_packet().max(size * 4));
        }
        let mut remote = Remote {
            wire,
            opts,
            features,
            vcont: VContSupport::default(),
            layout: RegLayout::default(),
            g_count: None,
            g_thread: None,
            x_packet: None,
            pending: VecDeque::new(),
            initial_stop: StopReply::Exited {
                status: 0,
                pid: None,
            },
            running: false,
            output: Vec::new(),
            output_dropped: 0,
        };
        if remote.features.no_ack_mode && remote.request(b"QStartNoAckMode")? == b"OK" {
            remote.wire.disable_acks();
        }
        remote.vcont = remote.query_vcont()?;
        if !remote.features.xfer_features {
            return Err(RemoteError::Description(
                "the gdbstub offers no target description (qXfer:features:read)".into(),
            ));
        }
        let root = remote.read_feature_file("target.xml")?;
        let layout = {
            let mut fetch = |annex: &str| remote.read_feature_file(annex);
            RegLayout::from_target_xml(&root, &mut fetch)?
        };
        for needed in ["rip", "rsp"] {
            if layout.by_name(needed).is_none() {
                return Err(RemoteError::Description(format!(
                    "no register {needed} (architecture {:?}): not an x86-64 target",
                    layout.architecture
                )));
            }
        }
        remote.layout = layout;
        remote.initial_stop = remote.halt_reason()?;
        Ok(remote)
    }

    /// What `qSupported` announced.
    pub fn features(&self) -> &Features {
        &self.features
    }

    /// Which `vCont` actions the stub accepts.
    pub fn vcont_support(&self) -> VContSupport {
        self.vcont
    }

    /// The register layout from the target description.
    pub fn layout(&self) -> &RegLayout {
        &self.layout
    }

    /// The stop reply the stub gave at connection (`?`).
    pub fn initial_stop(&self) -> &StopReply {
        &self.initial_stop
    }

    /// Whether a resume is outstanding (no stop reply received since).
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Stop replies queued: reported by threads other than the one a reply was awaited from
    /// (QEMU user mode does not stop the other threads when one stops).
    pub fn pending_stops(&self) -> usize {
        self.pending.len()
    }

    /// Packets the stub sent with a bad checksum (each asked again).
    pub fn bad_checksums(&self) -> u64 {
        self.wire.bad_checksums()
    }

    /// Takes the console output (`O` packets) received so far, and how many bytes were dropped.
    pub fn take_output(&mut self) -> (Vec<u8>, u64) {
        (
            std::mem::take(&mut self.output),
            std::mem::take(&mut self.output_dropped),
        )
    }

    /// Sends `body` and returns its reply (stop replies that arrive meanwhile are queued).
    pub fn request(&mut self, body: &[u8]) -> Result<Vec<u8>, RemoteError> {
        if self.running {
            return Err(RemoteError::Running {
                request: lossy(body),
            });
        }
        let deadline = Instant::now() + self.opts.timeout;
        self.wire.send(body, deadline)?;
        loop {
            let reply = recv_reply(&mut self.wire, deadline, &lossy(body))?;
            if StopReply::looks_like(&reply) {
                // Another thread stopped (or the process exited) while this one was stopped.
                let stop = self.stop_reply(&reply)?;
                self.pending.push_back(stop);
                continue;
            }
            return Ok(reply);
        }
    }

    /// [`request`](Self::request) expecting `OK` (`Unsupported` for an empty reply).
    pub fn request_ok(&mut self, body: &[u8]) -> Result<(), RemoteError> {
        let reply = self.request(body)?;
        check_ok(body, &reply)
    }

    /// `?`: why the target is stopped.
    pub fn halt_reason(&mut self) -> Result<StopReply, RemoteError> {
        if self.running {
            return Err(RemoteError::Running {
                request: "?".into(),
            });
        }
        let deadline = Instant::now() + self.opts.timeout;
        self.wire.send(b"?", deadline)?;
        let reply = recv_reply(&mut self.wire, deadline, "?")?;
        error_reply("?", &reply)?;
        StopReply::parse(&reply)
    }

    fn query_vcont(&mut self) -> Result<VContSupport, RemoteError> {
        let reply = self.request(b"vCont?")?;
        let mut v = VContSupport::default();
        if let Some(list) = reply.strip_prefix(b"vCont") {
            for a in list.split(|&b| b == b';') {
                match a {
                    b"c" => v.cont = true,
                    b"C" => v.cont_signal = true,
                    b"s" => v.step = true,
                    b"S" => v.step_signal = true,
                    b"t" => v.stop = true,
                    b"r" => v.range = true,
                    _ => {}
                }
            }
        }
        Ok(v)
    }

    /// Reads a `qXfer` object completely (`annex` may be empty).
    pub fn read_xfer(&mut self, object: &str, annex: &str) -> Result<Vec<u8>, RemoteError> {
        let chunk = self.packet_size().saturating_sub(16).max(32);
        let mut out = Vec::new();
        loop {
            let req = format!("qXfer:{object}:read:{annex}:{:x},{chunk:x}", out.len());
            let reply = self.request(req.as_bytes())?;
            let (&kind, data) = match reply.split_first() {
                Some(x) => x,
                None => return Err(RemoteError::Unsupported { request: req }),
            };
            if kind == b'E' {
                error_reply(&req, &reply)?;
            }
            let data = unescape_binary(data)?;
            match kind {
                b'l' => {
                    out.extend_from_slice(&data);
                    return Ok(out);
                }
                b'm' if !data.is_empty() => {
                    out.extend_from_slice(&data);
                    if out.len() > self.opts.max_xfer {
                        return Err(RemoteError::PacketTooLarge {
                            limit: self.opts.max_xfer,
                            what: "qXfer object",
                        });
                    }
                }
                _ => {
                    return Err(RemoteError::Malformed {
                        what: "qXfer reply",
                        text: lossy(&reply),
                    });
                }
            }
        }
    }

    fn read_feature_file(&mut self, annex: &str) -> Result<String, RemoteError> {
        let bytes = self.read_xfer("features", annex)?;
        String::from_utf8(bytes)
            .map_err(|_| RemoteError::Description(format!("{annex} is not UTF-8")))
    }

    /// The auxiliary vector (`qXfer:auxv:read`), raw.
    pub fn auxv(&mut self) -> Result<Vec<u8>, RemoteError> {
        if !self.features.xfer_auxv {
            return Err(RemoteError::Unsupported {
                request: "qXfer:auxv:read".into(),
            });
        }
        self.read_xfer("auxv", "")
    }

    /// The executable's path (`qXfer:exec-file:read`), if the stub offers it (QEMU 7.2 does
    /// not).
    pub fn exec_file(&mut self, pid: Option<i64>) -> Result<String, RemoteError> {
        if !self.features.xfer_exec_file {
            return Err(RemoteError::Unsupported {
                request: "qXfer:exec-file:read".into(),
            });
        }
        let annex = pid.map(|p| format!("{p:x}")).unwrap_or_default();
        let bytes = self.read_xfer("exec-file", &annex)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The stub's receive buffer: what it announced, else GDB's default of 400 bytes.
    fn packet_size(&self) -> usize {
        self.features.packet_size.unwrap_or(400).clamp(64, 1 << 20)
    }

    /// `qfThreadInfo`/`qsThreadInfo`: every thread.
    pub fn threads(&mut self) -> Result<Vec<ThreadId>, RemoteError> {
        let mut out = Vec::new();
        let mut req: &[u8] = b"qfThreadInfo";
        for _ in 0..100_000 {
            let reply = self.request(req)?;
            match reply.split_first() {
                Some((b'l', _)) => return Ok(out),
                Some((b'm', list)) => {
                    for t in list.split(|&b| b == b',').filter(|t| !t.is_empty()) {
                        out.push(ThreadId::parse(t)?);
                    }
                }
                _ => {
                    error_reply(&lossy(req), &reply)?;
                    return Err(RemoteError::Malformed {
                        what: "thread list",
                        text: lossy(&reply),
                    });
                }
            }
            req = b"qsThreadInfo";
        }
        Err(RemoteError::Malformed {
            what: "thread list (does not end)",
            text: String::new(),
        })
    }

    /// `qC`: the stub's current thread. QEMU 7.2 answers with the process's *first* thread,
    /// whichever stopped: a stop reply's `thread:` field is what names the stopped thread.
    pub fn current_thread(&mut self) -> Result<ThreadId, RemoteError> {
        let reply = self.request(b"qC")?;
        match reply.strip_prefix(b"QC") {
            Some(t) => ThreadId::parse(t),
            None => {
                error_reply("qC", &reply)?;
                Err(RemoteError::Malformed {
                    what: "qC reply",
                    text: lossy(&reply),
                })
            }
        }
    }

    /// `Hg`/`Hc`: selects the thread later register (`g`) or legacy resume (`c`) requests apply
    /// to.
    pub fn select_thread(&mut self, op: char, thread: ThreadId) -> Result<(), RemoteError> {
        if op == 'g' && self.g_thread == Some(thread) {
            return Ok(());
        }
        let req = format!("H{op}{}", thread.encode(self.features.multiprocess));
        let r = self.request_ok(req.as_bytes());
        if op == 'g' {
            self.g_thread = r.is_ok().then_some(thread);
        }
        r
    }

    /// A stop reply as received: its thread is the stub's current one from then on.
    fn stop_reply(&mut self, reply: &[u8]) -> Result<StopReply, RemoteError> {
        let stop = StopReply::parse(reply);
        self.g_thread = stop.as_ref().ok().and_then(StopReply::thread);
        stop
    }

    /// The registers a `g` reply carries for `thread` (the current one if `None`): QEMU sends
    /// the core set (general-purpose, rip, eflags, segments, x87, SSE); others need
    /// [`read_register`](Self::read_register).
    pub fn read_registers(&mut self, thread: Option<ThreadId>) -> Result<Registers, RemoteError> {
        if let Some(t) = thread {
            self.select_thread('g', t)?;
        }
        let reply = self.request(b"g")?;
        error_reply("g", &reply)?;
        let raw = hex_decode(&reply, "g reply")?;
        let n = self.layout.g_prefix(raw.len()).ok_or_else(|| {
            RemoteError::Description(format!(
                "a g reply of {} bytes matches no prefix of the described registers",
                raw.len()
            ))
        })?;
        self.g_count = Some(n);
        let mut off = 0;
        let mut values = Vec::with_capacity(n);
        for r in &self.layout.regs[..n] {
            values.push((r.regnum, Some(raw[off..off + r.size()].to_vec())));
            off += r.size();
        }
        Ok(Registers::new(values))
    }

    /// `p`: one register of `thread` by name.
    pub fn read_register(
        &mut self,
        thread: Option<ThreadId>,
        name: &str,
    ) -> Result<Vec<u8>, RemoteError> {
        let info = self.reg(name)?;
        if let Some(t) = thread {
            self.select_thread('g', t)?;
        }
        let req = format!("p{:x}", info.regnum);
        let reply = self.request(req.as_bytes())?;
        error_reply(&req, &reply)?;
        if reply.is_empty() {
            return Err(RemoteError::Unsupported { request: req });
        }
        let v = hex_decode(&reply, "p reply")?;
        if v.len() != info.size() {
            return Err(RemoteError::Malformed {
                what: "register size in p reply",
                text: lossy(&reply),
            });
        }
        Ok(v)
    }

    /// [`read_register`](Self::read_register) as a little-endian integer (registers of at most
    /// 8 bytes).
    pub fn read_register_u64(
        &mut self,
        thread: Option<ThreadId>,
        name: &str,
    ) -> Result<u64, RemoteError> {
        let v = self.read_register(thread, name)?;
        if v.len() > 8 {
            return Err(RemoteError::Description(format!(
                "register {name} has {} bytes",
                v.len()
            )));
        }
        let mut b = [0u8; 8];
        b[..v.len()].copy_from_slice(&v);
        Ok(u64::from_le_bytes(b))
    }

    /// `P`: writes one register of `thread` (raw bytes in target order, exactly its size).
    pub fn write_register(
        &mut self,
        thread: Option<ThreadId>,
        name: &str,
        value: &[u8],
    ) -> Result<(), RemoteError> {
        let info = self.reg(name)?;
        if value.len() != info.size() {
            return Err(RemoteError::Description(format!(
                "register {name} has {} bytes, {} given",
                info.size(),
                value.len()
            )));
        }
        if let Some(t) = thread {
            self.select_thread('g', t)?;
        }
        let req = format!("P{:x}={}", info.regnum, hex_encode(value));
        self.request_ok(req.as_bytes())
    }

    /// `G`: writes every register a `g` reply carries (values for the others are ignored;
    /// missing ones are an error).
    pub fn write_registers(
        &mut self,
        thread: Option<ThreadId>,
        regs: &Registers,
    ) -> Result<(), RemoteError> {
        let n = match self.g_count {
            Some(n) => n,
            None => {
                self.read_registers(thread)?;
                self.g_count.unwrap_or(0)
            }
        };
        let mut raw = Vec::new();
        for r in &self.layout.regs[..n] {
            let v = regs.raw(r.regnum).ok_or_else(|| {
                RemoteError::Description(format!("no value for register {} in G", r.name))
            })?;
            if v.len() != r.size() {
                return Err(RemoteError::Description(format!(
                    "register {} has {} bytes, {} given",
                    r.name,
                    r.size(),
                    v.len()
                )));
            }
            raw.extend_from_slice(v);
        }
        if let Some(t) = thread {
            self.select_thread('g', t)?;
        }
        let mut req = b"G".to_vec();
        req.extend_from_slice(hex_encode(&raw).as_bytes());
        self.request_ok(&req)
    }

    fn reg(&self, name: &str) -> Result<RegInfo, RemoteError> {
        self.layout
            .by_name(name)
            .cloned()
            .ok_or_else(|| RemoteError::Description(format!("no register named {name}")))
    }

    /// `m`: reads up to `len` bytes at `addr`, in chunks the stub accepts. Returns fewer bytes
    /// when a later chunk is unreadable; an error when the first byte is.
    pub fn read_memory(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, RemoteError> {
        let chunk = (self.packet_size().saturating_sub(8) / 2).max(16);
        let mut out = Vec::with_capacity(len.min(1 << 20));
        while out.len() < len {
            let want = chunk.min(len - out.len());
            let at = addr.wrapping_add(out.len() as u64);
            let req = format!("m{at:x},{want:x}");
            let reply = self.request(req.as_bytes())?;
            if let Err(e) = error_reply(&req, &reply) {
                if out.is_empty() {
                    return Err(e);
                }
                break;
            }
            let data = hex_decode(&reply, "m reply")?;
            if data.is_empty() || data.len() > want {
                if out.is_empty() && data.is_empty() {
                    return Err(RemoteError::Unsupported { request: req });
                }
                if data.len() > want {
                    return Err(RemoteError::Malformed {
                        what: "m reply (longer than asked)",
                        text: lossy(&reply),
                    });
                }
                break;
            }
            let short = data.len() < want;
            out.extend_from_slice(&data);
            if short {
                break;
            }
        }
        Ok(out)
    }

    /// Writes `data` at `addr` with `X` (binary) where the stub has it, else `M` (hex).
    pub fn write_memory(&mut self, addr: u64, data: &[u8]) -> Result<(), RemoteError> {
        let room = self.packet_size().saturating_sub(40).max(16);
        let mut done = 0usize;
        while done < data.len() {
            let at = addr.wrapping_add(done as u64);
            if self.x_packet != Some(false) {
                // Escaping at most doubles a byte: take what fits escaped.
                let mut n = 0usize;
                let mut escaped_len = 0usize;
                for &b in &data[done..] {
                    let w = if matches!(b, b'#' | b'$' | b'}' | b'*') {
                        2
                    } else {
                        1
                    };
                    if escaped_len + w > room {
                        break;
                    }
                    escaped_len += w;
                    n += 1;
                }
                let mut req = format!("X{at:x},{n:x}:").into_bytes();
                req.extend_from_slice(&escape_binary(&data[done..done + n]));
                let reply = self.request(&req)?;
                if reply.is_empty() {
                    self.x_packet = Some(false);
                    continue;
                }
                check_ok(&req[..req.len().min(24)], &reply)?;
                self.x_packet = Some(true);
                done += n;
            } else {
                let n = (room / 2).min(data.len() - done);
                let req = format!("M{at:x},{n:x}:{}", hex_encode(&data[done..done + n]));
                self.request_ok(req.as_bytes())?;
                done += n;
            }
        }
        Ok(())
    }

    /// `Z`: inserts a breakpoint or watchpoint. `Ok(false)`: the stub does not support this
    /// kind (empty reply); an `Enn` is an error.
    pub fn insert_breakpoint(
        &mut self,
        kind: BreakKind,
        addr: u64,
        len: u64,
    ) -> Result<bool, RemoteError> {
        self.breakpoint(b'Z', kind, addr, len)
    }

    /// `z`: removes what [`insert_breakpoint`](Self::insert_breakpoint) inserted.
    pub fn remove_breakpoint(
        &mut self,
        kind: BreakKind,
        addr: u64,
        len: u64,
    ) -> Result<bool, RemoteError> {
        self.breakpoint(b'z', kind, addr, len)
    }

    fn breakpoint(
        &mut self,
        op: u8,
        kind: BreakKind,
        addr: u64,
        len: u64,
    ) -> Result<bool, RemoteError> {
        let req = format!("{}{},{addr:x},{len:x}", char::from(op), kind.code());
        let reply = self.request(req.as_bytes())?;
        if reply.is_empty() {
            return Ok(false);
        }
        check_ok(req.as_bytes(), &reply)?;
        Ok(true)
    }

    /// Resumes: `vCont` with `actions` (or `c`/`s`/`C`/`S` when the stub has no `vCont`, for a
    /// single action). Returns once the stub acknowledged; the stop comes from
    /// [`wait`](Self::wait).
    pub fn resume(&mut self, actions: &[ResumeAction]) -> Result<(), RemoteError> {
        if self.running {
            return Err(RemoteError::Running {
                request: "vCont".into(),
            });
        }
        if actions.is_empty() {
            return Err(RemoteError::Description("resume without an action".into()));
        }
        let supported = |a: Action| match a {
            Action::Continue => self.vcont.cont,
            Action::ContinueSignal(_) => self.vcont.cont_signal,
            Action::Step => self.vcont.step,
            Action::StepSignal(_) => self.vcont.step_signal,
        };
        let req = if actions.iter().all(|a| supported(a.action)) {
            let mut req = String::from("vCont");
            for a in actions {
                req.push(';');
                match a.action {
                    Action::Continue => req.push('c'),
                    Action::Step => req.push('s'),
                    Action::ContinueSignal(s) => req.push_str(&format!("C{s:02x}")),
                    Action::StepSignal(s) => req.push_str(&format!("S{s:02x}")),
                }
                if let Some(t) = a.thread {
                    req.push(':');
                    req.push_str(&t.encode(self.features.multiprocess));
                }
            }
            req
        } else if let [a] = actions {
            if let Some(t) = a.thread {
                self.select_thread('c', t)?;
            }
            match a.action {
                Action::Continue => "c".into(),
                Action::Step => "s".into(),
                Action::ContinueSignal(s) => format!("C{s:02x}"),
                Action::StepSignal(s) => format!("S{s:02x}"),
            }
        } else {
            return Err(RemoteError::Unsupported {
                request: "vCont with several actions".into(),
            });
        };
        let deadline = Instant::now() + self.opts.timeout;
        self.wire.send(req.as_bytes(), deadline)?;
        self.running = true;
        Ok(())
    }

    /// Continues every thread.
    pub fn cont(&mut self) -> Result<(), RemoteError> {
        self.resume(&[ResumeAction {
            action: Action::Continue,
            thread: None,
        }])
    }

    /// Single-steps `thread` (the others stay where the stub keeps them).
    pub fn step(&mut self, thread: Option<ThreadId>) -> Result<(), RemoteError> {
        self.resume(&[ResumeAction {
            action: Action::Step,
            thread,
        }])
    }

    /// Waits for a stop: a queued one first, else the next stop reply, for at most `timeout`
    /// (`None`: as long as it takes). `Ok(None)`: nothing yet, still running.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<Option<StopReply>, RemoteError> {
        if let Some(s) = self.pending.pop_front() {
            self.running = false;
            return Ok(Some(s));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            match self.wire.recv(deadline)? {
                None => return Ok(None),
                Some(Incoming::Notification(_)) => continue,
                Some(Incoming::Packet(p)) => {
                    if let Some(hex) = p.strip_prefix(b"O")
                        && !hex.is_empty()
                        && hex.iter().all(u8::is_ascii_hexdigit)
                    {
                        let text = hex_decode(hex, "console output")?;
                        let room = self.opts.max_output.saturating_sub(self.output.len());
                        let keep = text.len().min(room);
                        self.output.extend_from_slice(&text[..keep]);
                        self.output_dropped += (text.len() - keep) as u64;
                        continue;
                    }
                    if StopReply::looks_like(&p) {
                        self.running = false;
                        return self.stop_reply(&p).map(Some);
                    }
                    return Err(RemoteError::Malformed {
                        what: "packet while running (expected a stop reply)",
                        text: lossy(&p),
                    });
                }
            }
        }
    }

    /// Sends the interrupt byte `0x03`. QEMU 7.2 user mode does not read it while the guest
    /// runs; [`QemuProcess::interrupt`] is the interrupt that works there.
    pub fn interrupt(&mut self) -> Result<(), RemoteError> {
        self.wire.send_raw(&[0x03])
    }

    /// `k`: asks the stub to kill the program (QEMU exits). Waits up to the timeout for the
    /// exit reply or the connection to close.
    pub fn kill(&mut self) -> Result<(), RemoteError> {
        let deadline = Instant::now() + self.opts.timeout;
        match self.wire.send(b"k", deadline) {
            Ok(()) => {}
            Err(e) if e.is_disconnect() => return Ok(()),
            Err(e) => return Err(e),
        }
        self.running = false;
        match self.wire.recv(Some(deadline)) {
            Ok(_) => Ok(()),
            Err(e) if e.is_disconnect() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `D` (`D;PID` with the multiprocess extension): detaches; the program runs on without
    /// the stub.
    pub fn detach(&mut self) -> Result<(), RemoteError> {
        // QEMU 7.2's stub answers a bare `D` with `E22` once multiprocess is on: it wants the
        // process it names in its thread ids.
        let pid = if self.features.multiprocess {
            self.threads()?.iter().find_map(|t| t.pid)
        } else {
            None
        };
        self.g_thread = None;
        match pid {
            Some(pid) => self.request_ok(format!("D;{pid:x}").as_bytes())?,
            None => self.request_ok(b"D")?,
        }
        // Close the connection: QEMU 7.2 keeps talking to a detached debugger (at the
        // program's exit it sends `W` and waits for the acknowledgement), and sees the end
        // of the connection as the debugger gone.
        let _ = self.wire.shutdown();
        Ok(())
    }
}

/// Receives the reply to a request (skipping notifications and console output, which belong
/// to running targets).
fn recv_reply<S: Transport>(
    wire: &mut Wire<S>,
    deadline: Instant,
    request: &str,
) -> Result<Vec<u8>, RemoteError> {
    loop {
        match wire.recv(Some(deadline))? {
            Some(Incoming::Packet(p)) => return Ok(p),
            Some(Incoming::Notification(_)) => continue,
            None => {
                return Err(RemoteError::Timeout {
                    waiting_for: format!("the reply to `{request}`"),
                });
            }
        }
    }
}

/// `Err(ErrorReply)` for `Enn` / `E.text` replies.
fn error_reply(request: &str, reply: &[u8]) -> Result<(), RemoteError> {
    match reply {
        [b'E', a, b] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => {
            Err(RemoteError::ErrorReply {
                request: request.to_string(),
                code: lossy(&reply[1..]),
            })
        }
        [b'E', b'.', ..] => Err(RemoteError::ErrorReply {
            request: request.to_string(),
            code: lossy(&reply[2..]),
        }),
        _ => Ok(()),
    }
}

/// `OK` → `Ok`, empty → `Unsupported`, `Enn` → `ErrorReply`, else `Malformed`.
fn check_ok(request: &[u8], reply: &[u8]) -> Result<(), RemoteError> {
    match reply {
        b"OK" => Ok(()),
        [] => Err(RemoteError::Unsupported {
            request: lossy(request),
        }),
        _ => {
            error_reply(&lossy(request), reply)?;
            Err(RemoteError::Malformed {
                what: "reply (expected OK)",
                text: lossy(reply),
            })
        }
    }
}

#[cfg(test)]
mod tests;
