//! The packet router: our own connection loop in front of gdbstub's state machine.
//!
//! Every byte from GDB goes through a [`Framer`] first. Complete packets are then
//!
//! 1. offered to the registered interceptors ([`Router::intercept`]), by prefix; an
//!    interceptor may answer the packet itself (gdbstub never sees it) or pass it on;
//! 2. checked for the syntax gdbstub would reject *fatally* (a malformed `m`, `Z`, `H`, ...
//!    ends a gdbstub session), and answered with `E01` if malformed;
//! 3. fed to gdbstub. The reply to `qSupported` is rewritten on its way out to add the
//!    features registered with [`Router::add_qsupported_feature`].
//!
//! Bad checksums are answered with `-` (GDB retransmits), a `-` from GDB makes us resend our
//! last packet, oversized packets are discarded and answered with `E01`. The router tracks
//! what later extensions need but gdbstub keeps private: the general thread (`Hg`), no-ack
//! mode, and the features GDB announced in `qSupported`.

use super::ServerError;
use super::session::{Session, stop_reason};
use crate::target::Notice;
use gdbstub::conn::Connection;
use gdbstub::stub::state_machine::GdbStubStateMachine;
use gdbstub::stub::{DisconnectReason, GdbStubBuilder, MultiThreadStopReason};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Default maximum packet size (advertised as `PacketSize`): large enough for a full `g`
/// reply with AVX and for paging trace data.
pub const DEFAULT_PACKET_SIZE: usize = 0x4000;

/// What an interceptor decided about a packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Intercept {
    /// Let gdbstub handle the packet.
    Pass,
    /// Answer with this reply body (binary allowed: the router escapes `$ # } *`).
    Reply(Vec<u8>),
}

/// Protocol state the router tracks for interceptors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouterState {
    /// The thread id text of the last `Hg` packet (e.g. `p1234.1234`, `0`, `-1`).
    pub general_thread: Option<String>,
    /// The thread id text of the last `Hc` packet.
    pub continue_thread: Option<String>,
    /// The features GDB sent in its `qSupported` packet.
    pub client_features: Vec<String>,
}

/// An interceptor: gets the session, the router state and the packet body (with `}` escapes
/// undone).
pub type PacketHandler = Box<dyn FnMut(&mut Session, &RouterState, &[u8]) -> Intercept>;

/// A complete unit read from the GDB connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A packet with a valid checksum: its body (still escaped).
    Packet(Vec<u8>),
    /// A packet whose checksum did not match (or was not hex).
    BadChecksum,
    /// A packet longer than the maximum: discarded.
    Oversized,
    /// `+`.
    Ack,
    /// `-`.
    Nack,
    /// The interrupt byte 0x03.
    Interrupt,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FramerState {
    Idle,
    Body,
    Checksum1,
    Checksum2,
}

/// Splits the byte stream from GDB into [`Frame`]s. Never allocates more than `max` bytes.
#[derive(Debug)]
pub struct Framer {
    state: FramerState,
    body: Vec<u8>,
    sum: u8,
    first_digit: u8,
    overflow: bool,
    max: usize,
}

fn hex_val(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

impl Framer {
    /// A framer accepting packet bodies of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Framer {
            state: FramerState::Idle,
            body: Vec::new(),
            sum: 0,
            first_digit: 0,
            overflow: false,
            max,
        }
    }

    /// Consumes one byte; returns a frame when one is complete. Bytes outside packets other
    /// than `+`, `-` and 0x03 are ignored.
    pub fn push(&mut self, b: u8) -> Option<Frame> {
        match self.state {
            FramerState::Idle => match b {
                b'$' => {
                    self.start();
                    None
                }
                b'+' => Some(Frame::Ack),
                b'-' => Some(Frame::Nack),
                0x03 => Some(Frame::Interrupt),
                _ => None,
            },
            FramerState::Body => {
                match b {
                    b'#' => self.state = FramerState::Checksum1,
                    // An unescaped '$' cannot be in a body: the previous packet was cut off.
                    b'$' => self.start(),
                    _ => {
                        self.sum = self.sum.wrapping_add(b);
                        if self.body.len() < self.max {
                            self.body.push(b);
                        } else {
                            self.overflow = true;
                        }
                    }
                }
                None
            }
            FramerState::Checksum1 => {
                self.first_digit = b;
                self.state = FramerState::Checksum2;
                None
            }
            FramerState::Checksum2 => {
                self.state = FramerState::Idle;
                let given = hex_val(self.first_digit)
                    .zip(hex_val(b))
                    .map(|(h, l)| h << 4 | l);
                let body = std::mem::take(&mut self.body);
                if self.overflow {
                    Some(Frame::Oversized)
                } else if given != Some(self.sum) {
                    Some(Frame::BadChecksum)
                } else {
                    Some(Frame::Packet(body))
                }
            }
        }
    }

    fn start(&mut self) {
        self.state = FramerState::Body;
        self.body.clear();
        self.sum = 0;
        self.overflow = false;
    }
}

/// Undoes the `}` binary escape (`}` followed by byte XOR 0x20).
pub fn unescape(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut it = body.iter();
    while let Some(&b) = it.next() {
        if b == b'}' {
            if let Some(&n) = it.next() {
                out.push(n ^ 0x20);
            }
        } else {
            out.push(b);
        }
    }
    out
}

/// Frames `body` as `$body#cs`, escaping `$ # } *`.
pub fn encode_packet(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 4);
    out.push(b'$');
    let mut sum = 0u8;
    for &b in body {
        if matches!(b, b'$' | b'#' | b'}' | b'*') {
            out.push(b'}');
            out.push(b ^ 0x20);
            sum = sum.wrapping_add(b'}').wrapping_add(b ^ 0x20);
        } else {
            out.push(b);
            sum = sum.wrapping_add(b);
        }
    }
    out.extend_from_slice(format!("#{sum:02x}").as_bytes());
    out
}

/// Expands run-length encoding (`X*n` = X repeated n-29 more times) in a reply body.
fn expand_rle(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i] == b'*' && i + 1 < body.len() {
            if let Some(&prev) = out.last() {
                let count = body[i + 1].saturating_sub(29);
                out.extend(std::iter::repeat_n(prev, count as usize));
            }
            i += 2;
        } else {
            out.push(body[i]);
            i += 1;
        }
    }
    out
}

fn is_hex(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|b| b.is_ascii_hexdigit())
}

fn is_addr(s: &[u8]) -> bool {
    is_hex(s) && s.len() <= 16
}

fn is_thread_id(s: &[u8]) -> bool {
    fn part(p: &[u8]) -> bool {
        p == b"-1" || is_addr(p)
    }
    match s.strip_prefix(b"p") {
        Some(rest) => match rest.iter().position(|&b| b == b'.') {
            Some(dot) => part(&rest[..dot]) && part(&rest[dot + 1..]),
            None => part(rest),
        },
        None => part(s),
    }
}

fn split2(s: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|&b| b == sep)?;
    Some((&s[..i], &s[i + 1..]))
}

/// Checks the packets whose malformed forms would make gdbstub end the session. Packets not
/// listed are accepted (gdbstub answers unknown ones with an empty reply).
pub fn is_well_formed(body: &[u8]) -> bool {
    let Some((&cmd, rest)) = body.split_first() else {
        return true;
    };
    match cmd {
        b'm' => split2(rest, b',').is_some_and(|(a, l)| is_addr(a) && is_addr(l)),
        b'M' => split2(rest, b',').is_some_and(|(a, rest)| {
            is_addr(a)
                && split2(rest, b':').is_some_and(|(l, data)| {
                    is_addr(l) && data.len() % 2 == 0 && data.iter().all(u8::is_ascii_hexdigit)
                })
        }),
        b'X' => split2(rest, b',').is_some_and(|(a, rest)| {
            is_addr(a) && split2(rest, b':').is_some_and(|(l, _)| is_addr(l))
        }),
        b'p' => is_addr(rest),
        b'P' => {
            split2(rest, b'=').is_some_and(|(n, v)| is_addr(n) && is_hex(v) && v.len() % 2 == 0)
        }
        b'G' => rest.len() % 2 == 0 && rest.iter().all(u8::is_ascii_hexdigit),
        b'Z' | b'z' => {
            let fields: Vec<&[u8]> = rest
                .split(|&b| b == b';')
                .next()
                .unwrap_or(&[])
                .split(|&b| b == b',')
                .collect();
            fields.len() == 3
                && matches!(fields[0], b"0" | b"1" | b"2" | b"3" | b"4")
                && is_addr(fields[1])
                && is_addr(fields[2])
        }
        b'H' => rest.len() >= 2 && matches!(rest[0], b'g' | b'c') && is_thread_id(&rest[1..]),
        b'T' => is_thread_id(rest),
        b'c' | b's' => rest.is_empty() || is_addr(rest),
        b'C' | b'S' => {
            let (sig, addr) = split2(rest, b';').unwrap_or((rest, b""));
            is_hex(sig) && sig.len() <= 2 && (addr.is_empty() || is_addr(addr))
        }
        b'v' if rest.starts_with(b"Cont;") => rest[5..].split(|&b| b == b';').all(|action| {
            let (act, tid) = split2(action, b':').unwrap_or((action, b""));
            let act_ok = match act.first() {
                Some(b'c' | b's' | b't') => act.len() == 1,
                Some(b'C' | b'S') => act.len() >= 2 && act.len() <= 3 && is_hex(&act[1..]),
                Some(b'r') => {
                    split2(&act[1..], b',').is_some_and(|(a, b)| is_addr(a) && is_addr(b))
                }
                _ => false,
            };
            act_ok && (tid.is_empty() || is_thread_id(tid))
        }),
        b'q' if rest.starts_with(b"Rcmd,") => {
            let hex = &rest[5..];
            hex.len() % 2 == 0 && hex.iter().all(u8::is_ascii_hexdigit)
        }
        b'q' if rest.starts_with(b"Xfer:") => {
            // qXfer:object:read:annex:offset,length
            let last = rest.rsplit(|&b| b == b':').next().unwrap_or(b"");
            rest.split(|&b| b == b':').count() >= 5
                && split2(last, b',').is_some_and(|(o, l)| is_addr(o) && is_addr(l))
        }
        _ => true,
    }
}

/// The `Connection` handed to gdbstub: buffers each reply until `flush`, then rewrites the
/// `qSupported` reply if asked to, remembers the last packet for retransmission and watches
/// for the end of the no-ack handshake.
#[derive(Debug)]
pub struct RouterConn {
    stream: TcpStream,
    out: Vec<u8>,
    /// Features to append to the next packet gdbstub sends (its `qSupported` reply).
    rewrite_features: Option<Vec<String>>,
    /// True after gdbstub was handed `QStartNoAckMode`: an `OK` reply switches acks off.
    watch_no_ack: bool,
    no_ack: bool,
    last_packet: Vec<u8>,
}

impl RouterConn {
    fn new(stream: TcpStream) -> Self {
        RouterConn {
            stream,
            out: Vec::new(),
            rewrite_features: None,
            watch_no_ack: false,
            no_ack: false,
            last_packet: Vec::new(),
        }
    }

    /// True once no-ack mode is in force.
    pub fn no_ack(&self) -> bool {
        self.no_ack
    }

    /// Sends `+` unless in no-ack mode.
    pub fn ack(&mut self) -> std::io::Result<()> {
        if !self.no_ack {
            Write::write_all(&mut self.stream, b"+")?;
        }
        Ok(())
    }

    /// Sends `-` unless in no-ack mode.
    pub fn nack(&mut self) -> std::io::Result<()> {
        if !self.no_ack {
            Write::write_all(&mut self.stream, b"-")?;
        }
        Ok(())
    }

    /// Sends a packet with this body (escaped and checksummed here).
    pub fn send_packet(&mut self, body: &[u8]) -> std::io::Result<()> {
        let pkt = encode_packet(body);
        Write::write_all(&mut self.stream, &pkt)?;
        self.last_packet = pkt;
        Write::flush(&mut self.stream)
    }

    /// Sends a console-output (`O`) packet; only valid while the target runs.
    pub fn send_console(&mut self, text: &str) -> std::io::Result<()> {
        let mut body = Vec::with_capacity(1 + 2 * text.len());
        body.push(b'O');
        for b in text.bytes() {
            body.extend_from_slice(format!("{b:02x}").as_bytes());
        }
        self.send_packet(&body)
    }

    fn resend_last(&mut self) -> std::io::Result<()> {
        if !self.last_packet.is_empty() {
            let pkt = self.last_packet.clone();
            Write::write_all(&mut self.stream, &pkt)?;
        }
        Ok(())
    }

    fn process_out(&mut self) -> std::io::Result<()> {
        let out = std::mem::take(&mut self.out);
        let mut i = 0;
        let mut sent = Vec::with_capacity(out.len() + 64);
        while i < out.len() {
            if out[i] != b'$' {
                sent.push(out[i]);
                i += 1;
                continue;
            }
            let Some(hash) = out[i..].iter().position(|&b| b == b'#').map(|p| i + p) else {
                sent.extend_from_slice(&out[i..]);
                break;
            };
            let end = (hash + 3).min(out.len());
            let mut pkt = out[i..end].to_vec();
            let body = &out[i + 1..hash];
            if let Some(features) = self.rewrite_features.take() {
                let mut plain = expand_rle(&unescape(body));
                for f in features {
                    plain.push(b';');
                    plain.extend_from_slice(f.as_bytes());
                }
                pkt = encode_packet(&plain);
            }
            if self.watch_no_ack {
                self.watch_no_ack = false;
                if body == b"OK" {
                    self.no_ack = true;
                }
            }
            sent.extend_from_slice(&pkt);
            self.last_packet = pkt;
            i = end;
        }
        Write::write_all(&mut self.stream, &sent)?;
        Write::flush(&mut self.stream)
    }
}

impl Connection for RouterConn {
    type Error = std::io::Error;

    fn write(&mut self, byte: u8) -> Result<(), Self::Error> {
        if self.out.is_empty() && (byte == b'+' || byte == b'-') {
            // An ack is sent before the reply is built; for a resume the reply (the stop)
            // may come much later, and GDB waits for the ack before it may interrupt.
            return Write::write_all(&mut self.stream, &[byte]);
        }
        self.out.push(byte);
        Ok(())
    }

    fn write_all(&mut self, buf: &[u8]) -> Result<(), Self::Error> {
        self.out.extend_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Self::Error> {
        self.process_out()
    }
}

/// How a served session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeOutcome {
    /// The program exited with this status.
    Exited(i32),
    /// The program was killed by this (Linux) signal.
    Killed(i32),
    /// GDB detached; the program runs on untraced.
    Detached,
    /// GDB killed the program (`kill`).
    KilledByDebugger,
    /// GDB closed the connection; a program we started was killed, an attached one detached.
    ConnectionClosed,
}

/// Receives target notices (e.g. to print them on the CLI's stderr).
pub type NoticeSink = Box<dyn FnMut(&Notice)>;

type Sm<'a> = GdbStubStateMachine<'a, Session, RouterConn>;

fn conn<'s>(sm: &'s mut Sm<'_>) -> &'s mut RouterConn {
    match sm {
        GdbStubStateMachine::Idle(s) => s.borrow_conn(),
        GdbStubStateMachine::Running(s) => s.borrow_conn(),
        GdbStubStateMachine::CtrlCInterrupt(s) => s.borrow_conn(),
        GdbStubStateMachine::Disconnected(s) => s.borrow_conn(),
    }
}

fn gs_err<E: std::fmt::Display>(e: E) -> ServerError {
    ServerError::Protocol(e.to_string())
}

/// The packet router and connection loop. Configure it, then call [`Router::serve`].
pub struct Router {
    handlers: Vec<(Vec<u8>, PacketHandler)>,
    features: Vec<String>,
    packet_size: usize,
    state: RouterState,
    framer: Framer,
    notice_sink: Option<NoticeSink>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field(
                "intercepts",
                &self
                    .handlers
                    .iter()
                    .map(|(p, _)| String::from_utf8_lossy(p))
                    .collect::<Vec<_>>(),
            )
            .field("features", &self.features)
            .field("packet_size", &self.packet_size)
            .field("state", &self.state)
            .finish()
    }
}

impl Default for Router {
    fn default() -> Self {
        Self::new(DEFAULT_PACKET_SIZE)
    }
}

impl Router {
    /// A router whose gdbstub uses a packet buffer of `packet_size` bytes.
    pub fn new(packet_size: usize) -> Self {
        let packet_size = packet_size.max(1024);
        Router {
            handlers: Vec::new(),
            features: Vec::new(),
            packet_size,
            state: RouterState::default(),
            // Room for "$", "#xx" and the slack gdbstub needs in its own buffer.
            framer: Framer::new(packet_size - 8),
            notice_sink: None,
        }
    }

    /// Answers packets starting with `prefix` (after un-escaping) with `handler` before
    /// gdbstub sees them. The first matching handler that does not [`Intercept::Pass`] wins.
    pub fn intercept(
        &mut self,
        prefix: &[u8],
        handler: impl FnMut(&mut Session, &RouterState, &[u8]) -> Intercept + 'static,
    ) {
        self.handlers.push((prefix.to_vec(), Box::new(handler)));
    }

    /// Appends `feature` (e.g. `Qbtrace:pt+`) to gdbstub's `qSupported` reply.
    pub fn add_qsupported_feature(&mut self, feature: impl Into<String>) {
        self.features.push(feature.into());
    }

    /// Called with every [`Notice`] from the target (they are also sent to GDB's console).
    pub fn on_notice(&mut self, sink: impl FnMut(&Notice) + 'static) {
        self.notice_sink = Some(Box::new(sink));
    }

    /// The protocol state seen so far.
    pub fn state(&self) -> &RouterState {
        &self.state
    }

    /// Serves one GDB connection until the program exits, GDB detaches/kills, or the
    /// connection closes (the program is then killed).
    pub fn serve(
        &mut self,
        stream: TcpStream,
        session: &mut Session,
    ) -> Result<ServeOutcome, ServerError> {
        let _ = stream.set_nodelay(true);
        let writer = stream.try_clone().map_err(ServerError::Io)?;
        let stub = GdbStubBuilder::new(RouterConn::new(writer))
            .packet_buffer_size(self.packet_size)
            .build()
            .map_err(gs_err)?;
        let mut sm: Sm<'_> = stub.run_state_machine(session).map_err(gs_err)?;
        let mut reader = stream;
        let mut buf = vec![0u8; 8192];
        let mut idle_polls = 0u32;
        loop {
            sm = match sm {
                GdbStubStateMachine::Disconnected(d) => {
                    return self.finish(d.get_reason(), session);
                }
                GdbStubStateMachine::CtrlCInterrupt(c) => {
                    session.target_mut().interrupt()?;
                    c.interrupt_handled(session, None::<MultiThreadStopReason<u64>>)
                        .map_err(gs_err)?
                }
                GdbStubStateMachine::Idle(i) => {
                    let n = read_some(&mut reader, &mut buf)?;
                    if n == 0 {
                        return self.connection_closed(session);
                    }
                    self.feed(GdbStubStateMachine::Idle(i), session, &buf[..n])?
                }
                GdbStubStateMachine::Running(mut r) => {
                    let stop = session.target_mut().wait(false)?;
                    self.forward_notices(r.borrow_conn(), session)?;
                    if let Some(ev) = stop {
                        idle_polls = 0;
                        let tid = session.target().tid();
                        r.report_stop(session, stop_reason(tid, ev))
                            .map_err(gs_err)?
                    } else {
                        // Back off from 0 to 10 ms so single steps are answered at once while
                        // a long-running program does not spin.
                        let timeout = idle_polls.min(10) as i32;
                        idle_polls += 1;
                        if poll_readable(&reader, timeout)? {
                            let n = read_some(&mut reader, &mut buf)?;
                            if n == 0 {
                                return self.connection_closed(session);
                            }
                            self.feed(GdbStubStateMachine::Running(r), session, &buf[..n])?
                        } else {
                            GdbStubStateMachine::Running(r)
                        }
                    }
                }
            };
        }
    }

    fn forward_notices(
        &mut self,
        conn: &mut RouterConn,
        session: &mut Session,
    ) -> Result<(), ServerError> {
        for notice in session.target_mut().take_notices() {
            if let Some(sink) = self.notice_sink.as_mut() {
                sink(&notice);
            }
            conn.send_console(&format!("ptrewind: {notice}\n"))
                .map_err(ServerError::Io)?;
        }
        Ok(())
    }

    fn finish(
        &mut self,
        reason: DisconnectReason,
        session: &mut Session,
    ) -> Result<ServeOutcome, ServerError> {
        let t = session.target_mut();
        Ok(match reason {
            DisconnectReason::TargetExited(code) => ServeOutcome::Exited(i32::from(code)),
            DisconnectReason::TargetTerminated(sig) => {
                ServeOutcome::Killed(super::session::gdb_to_linux_signal(sig.0).unwrap_or(0))
            }
            DisconnectReason::Kill => {
                t.kill()?;
                ServeOutcome::KilledByDebugger
            }
            DisconnectReason::Disconnect => {
                if t.has_exited() {
                    ServeOutcome::Detached
                } else {
                    t.detach()?;
                    ServeOutcome::Detached
                }
            }
        })
    }

    fn connection_closed(&mut self, session: &mut Session) -> Result<ServeOutcome, ServerError> {
        let attached = session.is_attached();
        let t = session.target_mut();
        if t.has_exited() {
            return Ok(ServeOutcome::ConnectionClosed);
        }
        if attached {
            // Leave a process we did not start running, as GDB does on disconnect.
            if t.detach().is_err() {
                t.interrupt()?;
                t.wait(true)?;
                if !t.has_exited() {
                    t.detach()?;
                }
            }
        } else {
            t.kill()?;
        }
        Ok(ServeOutcome::ConnectionClosed)
    }

    /// Feeds bytes received from GDB through the framer, interceptors and gdbstub.
    fn feed<'a>(
        &mut self,
        mut sm: Sm<'a>,
        session: &mut Session,
        bytes: &[u8],
    ) -> Result<Sm<'a>, ServerError> {
        for &b in bytes {
            if matches!(sm, GdbStubStateMachine::Disconnected(_)) {
                break;
            }
            let Some(frame) = self.framer.push(b) else {
                continue;
            };
            sm = match frame {
                Frame::Ack => sm,
                Frame::Nack => {
                    conn(&mut sm).resend_last().map_err(ServerError::Io)?;
                    sm
                }
                Frame::Interrupt => feed_raw(sm, session, &[0x03])?,
                Frame::BadChecksum => {
                    conn(&mut sm).nack().map_err(ServerError::Io)?;
                    sm
                }
                Frame::Oversized => {
                    let c = conn(&mut sm);
                    c.ack().map_err(ServerError::Io)?;
                    c.send_packet(b"E01").map_err(ServerError::Io)?;
                    sm
                }
                Frame::Packet(body) => self.dispatch(sm, session, &body)?,
            };
        }
        Ok(sm)
    }

    fn dispatch<'a>(
        &mut self,
        mut sm: Sm<'a>,
        session: &mut Session,
        body: &[u8],
    ) -> Result<Sm<'a>, ServerError> {
        let plain = unescape(body);
        for (prefix, handler) in &mut self.handlers {
            if !plain.starts_with(prefix) {
                continue;
            }
            if let Intercept::Reply(reply) = handler(session, &self.state, &plain) {
                let c = conn(&mut sm);
                c.ack().map_err(ServerError::Io)?;
                c.send_packet(&reply).map_err(ServerError::Io)?;
                return Ok(sm);
            }
        }
        // gdbstub ends the session on `bs` after `Hc-1`; answer with an error instead.
        let reverse_step_all = body == b"bs"
            && self
                .state
                .continue_thread
                .as_deref()
                .is_some_and(|t| t == "-1" || t.ends_with(".-1"));
        if reverse_step_all || !is_well_formed(body) {
            let c = conn(&mut sm);
            c.ack().map_err(ServerError::Io)?;
            c.send_packet(b"E01").map_err(ServerError::Io)?;
            return Ok(sm);
        }
        if let Some(features) = plain.strip_prefix(b"qSupported") {
            self.state.client_features = features
                .strip_prefix(b":")
                .unwrap_or(b"")
                .split(|&b| b == b';')
                .filter(|f| !f.is_empty())
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect();
            if !self.features.is_empty() {
                conn(&mut sm).rewrite_features = Some(self.features.clone());
            }
        } else if let Some(thread) = plain.strip_prefix(b"Hg") {
            self.state.general_thread = Some(String::from_utf8_lossy(thread).into_owned());
        } else if let Some(thread) = plain.strip_prefix(b"Hc") {
            self.state.continue_thread = Some(String::from_utf8_lossy(thread).into_owned());
        } else if plain == b"QStartNoAckMode" {
            conn(&mut sm).watch_no_ack = true;
        }
        let sum = body.iter().fold(0u8, |a, &b| a.wrapping_add(b));
        let mut raw = Vec::with_capacity(body.len() + 4);
        raw.push(b'$');
        raw.extend_from_slice(body);
        raw.extend_from_slice(format!("#{sum:02x}").as_bytes());
        feed_raw(sm, session, &raw)
    }
}

fn feed_raw<'a>(
    mut sm: Sm<'a>,
    session: &mut Session,
    bytes: &[u8],
) -> Result<Sm<'a>, ServerError> {
    for &b in bytes {
        sm = match sm {
            GdbStubStateMachine::Idle(i) => i.incoming_data(session, b).map_err(gs_err)?,
            GdbStubStateMachine::Running(r) => r.incoming_data(session, b).map_err(gs_err)?,
            GdbStubStateMachine::CtrlCInterrupt(c) => {
                session.target_mut().interrupt()?;
                let sm = c
                    .interrupt_handled(session, None::<MultiThreadStopReason<u64>>)
                    .map_err(gs_err)?;
                feed_raw(sm, session, &[b])?
            }
            d @ GdbStubStateMachine::Disconnected(_) => return Ok(d),
        };
    }
    Ok(sm)
}

fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> Result<usize, ServerError> {
    loop {
        match stream.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(0),
            Err(e) => return Err(ServerError::Io(e)),
        }
    }
}

fn poll_readable(stream: &TcpStream, timeout_ms: i32) -> Result<bool, ServerError> {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd for the duration of the call and nfds is 1.
    let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if r < 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(ServerError::Io(err));
    }
    Ok(r > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(max: usize, input: &[u8]) -> Vec<Frame> {
        let mut f = Framer::new(max);
        input.iter().filter_map(|&b| f.push(b)).collect()
    }

    #[test]
    fn framer_accepts_valid_and_rejects_bad_checksums() {
        assert_eq!(
            frames(64, b"+$g#67"),
            vec![Frame::Ack, Frame::Packet(b"g".to_vec())]
        );
        assert_eq!(frames(64, b"$g#68"), vec![Frame::BadChecksum]);
        assert_eq!(frames(64, b"$g#zz"), vec![Frame::BadChecksum]);
        assert_eq!(
            frames(64, b"-\x03junk"),
            vec![Frame::Nack, Frame::Interrupt]
        );
    }

    #[test]
    fn framer_discards_oversized_and_recovers() {
        let mut input = b"$".to_vec();
        input.extend(std::iter::repeat_n(b'a', 100));
        input.extend_from_slice(b"#00$g#67");
        assert_eq!(
            frames(16, &input),
            vec![Frame::Oversized, Frame::Packet(b"g".to_vec())]
        );
    }

    #[test]
    fn framer_restarts_on_dollar_in_body() {
        assert_eq!(frames(64, b"$m12$g#67"), vec![Frame::Packet(b"g".to_vec())]);
    }

    #[test]
    fn encode_escapes_and_checksums() {
        assert_eq!(encode_packet(b"OK"), b"$OK#9a".to_vec());
        assert_eq!(
            encode_packet(b"a#b"),
            b"$a}\x03b#"
                .iter()
                .copied()
                .chain(
                    format!(
                        "{:02x}",
                        (b'a' as u32 + b'}' as u32 + 3 + b'b' as u32) as u8
                    )
                    .bytes()
                )
                .collect::<Vec<u8>>()
        );
        assert_eq!(unescape(b"a}\x03b}]"), b"a#b}".to_vec());
    }

    #[test]
    fn rle_expansion() {
        // "0* " = '0' followed by 3 more ('space' = 32, 32 - 29 = 3)
        assert_eq!(expand_rle(b"0* 1"), b"00001".to_vec());
        assert_eq!(expand_rle(b"*"), b"*".to_vec());
    }

    #[test]
    fn well_formedness() {
        for good in [
            &b"m7fff0000,10"[..],
            b"M1000,2:abcd",
            b"X1000,0:",
            b"p10",
            b"P10=0011223344556677",
            b"Z0,401000,1",
            b"z0,401000,1;X1,00",
            b"Hgp1a.1a",
            b"Hc-1",
            b"Hg0",
            b"c",
            b"C0b",
            b"S05;401000",
            b"vCont;s:p1.1;c",
            b"vCont;C0b:1",
            b"vCont?",
            b"qRcmd,68656c70",
            b"qXfer:features:read:target.xml:0,ffb",
            b"qSupported:multiprocess+",
            b"?",
        ] {
            assert!(is_well_formed(good), "{}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"m"[..],
            b"mzz,10",
            b"m11111111111111111,1",
            b"M1000,2:abc",
            b"pxyz",
            b"Z9,1000,1",
            b"Z0,1000",
            b"Hx1",
            b"Hg",
            b"Cxyz",
            b"vCont;q",
            b"qRcmd,6",
            b"qXfer:features:read:target.xml:0",
        ] {
            assert!(!is_well_formed(bad), "{}", String::from_utf8_lossy(bad));
        }
    }
}
