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
use super::arch::GdbRegId;
pub use super::rsp::{encode_packet, unescape};
use super::rsp::{frame, hex_digit, hex_encode};
use super::session::{Session, stop_reason};
use crate::target::regs::gpr;
use crate::target::{Notice, StopEvent};
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
                let given = hex_digit(self.first_digit)
                    .zip(hex_digit(b))
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

fn is_even_hex(s: &[u8]) -> bool {
    s.len() % 2 == 0 && s.iter().all(u8::is_ascii_hexdigit)
}

/// A hex number gdbstub can decode into a 64-bit integer.
fn is_addr(s: &[u8]) -> bool {
    is_hex(s) && s.iter().skip_while(|&&b| b == b'0').count() <= 16
}

/// A non-zero hex number (gdbstub's `Pid`/`Tid` are non-zero).
fn is_nonzero_id(s: &[u8]) -> bool {
    is_addr(s) && s.iter().any(|&b| b != b'0')
}

/// `-1`, `0`, `<id>`, `p<id>`, `p<id>.<id>` with ids as in [`is_nonzero_id`].
fn is_thread_id(s: &[u8]) -> bool {
    thread_kind(s).is_some()
}

/// The thread part of a thread id: `Some(true)` for one specific thread, `Some(false)` for
/// "all" (`-1`) or "any" (`0`) — which gdbstub refuses, fatally, where it needs one thread
/// (`Hg`, `T`, a `vCont` step) — and `None` if it does not parse.
fn thread_kind(s: &[u8]) -> Option<bool> {
    fn part(p: &[u8]) -> Option<bool> {
        if p == b"-1" || p == b"0" {
            Some(false)
        } else {
            is_nonzero_id(p).then_some(true)
        }
    }
    match s.strip_prefix(b"p") {
        Some(rest) => match rest.iter().position(|&b| b == b'.') {
            Some(dot) => {
                part(&rest[..dot])?;
                part(&rest[dot + 1..])
            }
            // `p<pid>` alone means all threads of the process.
            None => part(rest).map(|_| false),
        },
        None => part(s),
    }
}

fn split2(s: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|&b| b == sep)?;
    Some((&s[..i], &s[i + 1..]))
}

/// What the router does with a packet before gdbstub sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Hand it to gdbstub.
    Pass,
    /// Not a packet gdbstub knows, although it starts like one (e.g. `qCRC:` vs `qC`):
    /// answer with the empty "unsupported" reply.
    Unsupported,
    /// A known packet with malformed arguments: answer `E01`.
    Malformed,
}

/// Rewrites the valid `qSupported` forms gdbstub rejects: no feature list at all
/// (`qSupported`) or empty entries (`qSupported:a;;b`). Other packets are returned as is.
pub fn normalize_qsupported(body: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let Some(rest) = body.strip_prefix(b"qSupported") else {
        return body.into();
    };
    let features: Vec<&[u8]> = match rest.split_first() {
        None => Vec::new(),
        Some((b':', list)) => list
            .split(|&b| b == b';')
            .filter(|f| !f.is_empty())
            .collect(),
        Some(_) => return body.into(),
    };
    if !features.is_empty() && features.len() == rest[1..].split(|&b| b == b';').count() {
        return body.into();
    }
    let mut out = b"qSupported:".to_vec();
    if features.is_empty() {
        // The default: GDB did not offer multiprocess.
        out.extend_from_slice(b"multiprocess-");
    } else {
        out.extend_from_slice(&features.join(&b';'));
    }
    out.into()
}

/// `:annex:offset,length` of a `qXfer:...:read` packet.
fn qxfer_args(rest: &[u8], annex_ok: impl Fn(&[u8]) -> bool) -> bool {
    let Some(rest) = rest.strip_prefix(b":") else {
        return false;
    };
    let Some((annex, range)) = split2(rest, b':') else {
        return false;
    };
    let range = range.split(|&b| b == b':').next().unwrap_or(b"");
    annex_ok(annex) && split2(range, b',').is_some_and(|(o, l)| is_addr(o) && is_addr(l))
}

/// Classifies packets whose malformed forms would make gdbstub end the session: gdbstub
/// picks a command by name prefix and treats a failed argument parse as fatal, and it also
/// ends the session on some well-formed but unexpected requests (`Hg-1`, `T-1`, `vCont;t`,
/// a step of "all threads" such as `s` after `Hc-1`). Packets not listed pass (gdbstub
/// answers unknown ones with an empty reply). `body` is the escaped packet body;
/// `resume_all` says whether the last `Hc` selected all threads.
pub fn check_packet(body: &[u8], resume_all: bool) -> Check {
    use Check::{Malformed, Pass, Unsupported};
    let ok = |good: bool| if good { Pass } else { Malformed };
    // Commands without arguments: a longer packet with the same start is another packet.
    for name in [
        &b"qfThreadInfo"[..],
        b"qsThreadInfo",
        b"QStartNoAckMode",
        b"qC",
        b"bc",
        b"bs",
    ] {
        if let Some(rest) = body.strip_prefix(name) {
            return if !rest.is_empty() {
                Unsupported
            } else if name == b"bs" && resume_all {
                Malformed
            } else {
                Pass
            };
        }
    }
    // Extended-mode settings (found by `fuzz/fuzz_targets/rsp.rs`: `QStartupWithShellX`
    // ended the session). gdbstub accepts exactly `:0`/`:1`, an empty `QEnvironmentReset`, and
    // hex after `:` for the others.
    for name in [&b"QStartupWithShell"[..], b"QDisableRandomization"] {
        if let Some(rest) = body.strip_prefix(name) {
            return match rest.first() {
                Some(b':') => ok(rest == b":0" || rest == b":1"),
                None => Malformed,
                Some(_) => Unsupported,
            };
        }
    }
    if let Some(rest) = body.strip_prefix(b"QEnvironmentReset") {
        return if rest.is_empty() { Pass } else { Unsupported };
    }
    for name in [
        &b"QEnvironmentHexEncoded"[..],
        b"QEnvironmentUnset",
        b"QSetWorkingDir",
    ] {
        if let Some(rest) = body.strip_prefix(name) {
            return match rest.split_first() {
                Some((b':', hex)) if name == b"QEnvironmentHexEncoded" => ok(is_even_hex(hex)
                    && crate::server::rsp::hex_decode(hex).is_ok_and(|kv| kv.contains(&b'='))),
                Some((b':', hex)) => ok(is_even_hex(hex)),
                None => Malformed,
                Some(_) => Unsupported,
            };
        }
    }
    if let Some(rest) = body.strip_prefix(b"qSupported") {
        // gdbstub needs `:` and no empty feature (see `normalize_qsupported`).
        return match rest.split_first() {
            Some((b':', features)) => ok(features.split(|&b| b == b';').all(|f| !f.is_empty())),
            None => Malformed,
            Some(_) => Unsupported,
        };
    }
    if let Some(rest) = body.strip_prefix(b"qAttached") {
        return match rest.split_first() {
            None => Pass,
            Some((b':', pid)) => ok(is_nonzero_id(pid)),
            Some(_) => Unsupported,
        };
    }
    if let Some(rest) = body.strip_prefix(b"qRcmd") {
        return match rest.split_first() {
            Some((b',', hex)) => ok(is_even_hex(hex)),
            _ => Unsupported,
        };
    }
    if let Some(rest) = body.strip_prefix(b"qXfer:") {
        let empty = |a: &[u8]| a.is_empty();
        let annex_any = |_: &[u8]| true;
        let exec_annex = |a: &[u8]| a.is_empty() || is_nonzero_id(a);
        // The objects gdbstub parses (others are unknown to it and answered empty).
        type AnnexCheck<'f> = &'f dyn Fn(&[u8]) -> bool;
        let objects: [(&[u8], AnnexCheck<'_>); 6] = [
            (b"features:read", &annex_any),
            (b"auxv:read", &empty),
            (b"exec-file:read", &exec_annex),
            (b"libraries-svr4:read", &empty),
            (b"libraries:read", &empty),
            (b"memory-map:read", &empty),
        ];
        let checked = objects
            .iter()
            .find_map(|(name, annex_ok)| rest.strip_prefix(*name).map(|r| qxfer_args(r, annex_ok)));
        return checked.map_or(Pass, ok);
    }
    if let Some(rest) = body.strip_prefix(b"vKill") {
        return ok(rest.strip_prefix(b";").is_some_and(is_nonzero_id));
    }
    if let Some(rest) = body.strip_prefix(b"vAttach") {
        return ok(rest.strip_prefix(b";").is_some_and(is_nonzero_id));
    }
    if let Some(rest) = body.strip_prefix(b"vRun") {
        return ok(rest
            .strip_prefix(b";")
            .is_some_and(|r| r.split(|&b| b == b';').all(is_even_hex)));
    }
    if let Some(rest) = body.strip_prefix(b"vCont") {
        if rest == b"?" {
            return Pass;
        }
        let Some(actions) = rest.strip_prefix(b";") else {
            return Malformed;
        };
        return ok(actions.split(|&b| b == b';').all(|action| {
            // `act:` with an empty thread is malformed (found by `fuzz/fuzz_targets/rsp.rs`:
            // `vCont;c:` ended the session); no `:` at all means every thread.
            let (act, tid, has_tid) = match split2(action, b':') {
                Some((act, tid)) => (act, tid, true),
                None => (action, &b""[..], false),
            };
            // No `t` (stop) or `r` (range step, not offered); a step needs one thread.
            let (act_ok, needs_one_thread) = match act.first() {
                Some(b'c') => (act.len() == 1, false),
                Some(b's') => (act.len() == 1, true),
                Some(b'C') => (act.len() >= 2 && act.len() <= 3 && is_hex(&act[1..]), false),
                Some(b'S') => (act.len() >= 2 && act.len() <= 3 && is_hex(&act[1..]), true),
                _ => (false, false),
            };
            // `p0` / `p0.0` (any thread of any process) ended the session in gdbstub's vCont
            // parser (found by `fuzz/fuzz_targets/rsp.rs`: `vCont;c:p0`).
            let tid_ok = if needs_one_thread {
                thread_kind(tid) == Some(true)
            } else {
                !has_tid || (is_thread_id(tid) && tid != b"p0" && tid != b"p0.0")
            };
            act_ok && tid_ok
        }));
    }
    let Some((&cmd, rest)) = body.split_first() else {
        return Pass;
    };
    match cmd {
        b'?' | b'g' | b'k' | b'!' => ok(rest.is_empty()),
        b'D' => ok(rest.is_empty() || rest.strip_prefix(b";").is_some_and(is_nonzero_id)),
        b'R' => ok(rest.len() == 2),
        b'm' => ok(split2(rest, b',').is_some_and(|(a, l)| is_addr(a) && is_addr(l))),
        b'M' => ok(split2(rest, b',').is_some_and(|(a, rest)| {
            is_addr(a)
                && split2(rest, b':').is_some_and(|(l, data)| is_addr(l) && is_even_hex(data))
        })),
        b'X' => ok(split2(rest, b',').is_some_and(|(a, rest)| {
            is_addr(a) && split2(rest, b':').is_some_and(|(l, _)| is_addr(l))
        })),
        b'p' => ok(is_addr(rest)),
        b'P' => {
            ok(split2(rest, b'=').is_some_and(|(n, v)| is_addr(n) && is_hex(v) && is_even_hex(v)))
        }
        b'G' => ok(is_even_hex(rest)),
        b'Z' | b'z' => {
            let fields: Vec<&[u8]> = rest.split(|&b| b == b',').collect();
            ok(fields.len() == 3
                && matches!(fields[0], b"0" | b"1" | b"2" | b"3" | b"4")
                && is_addr(fields[1])
                && is_addr(fields[2]))
        }
        b'H' => ok(match rest.split_first() {
            // `Hg` needs one thread (`0` = any is fine: gdbstub picks one), `Hc` any form.
            // (`p<pid>.0` needs a valid pid: found by `fuzz/fuzz_targets/rsp.rs`, `Hgp0Hg….0`
            // ended the session.)
            Some((b'g', tid)) => {
                thread_kind(tid) == Some(true)
                    || tid == b"0"
                    || tid
                        .strip_prefix(b"p")
                        .and_then(|r| r.strip_suffix(b".0"))
                        .is_some_and(|pid| thread_kind(pid).is_some() && !pid.contains(&b'.'))
            }
            Some((b'c', tid)) => is_thread_id(tid),
            _ => false,
        }),
        b'T' => ok(thread_kind(rest) == Some(true)),
        b'c' => ok(rest.is_empty() || is_addr(rest)),
        b's' => ok(!resume_all && (rest.is_empty() || is_addr(rest))),
        b'C' | b'S' => {
            let (sig, addr) = split2(rest, b';').unwrap_or((rest, b""));
            ok(is_hex(sig)
                && sig.len() <= 2
                && (addr.is_empty() || is_addr(addr))
                && !(cmd == b'S' && resume_all))
        }
        _ => Pass,
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
    /// A body that replaces the next packet gdbstub sends (its reply to `k`).
    replace_reply: Option<Vec<u8>>,
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
            replace_reply: None,
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
        self.send_packet(format!("O{}", hex_encode(text.as_bytes())).as_bytes())
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
            if let Some(reply) = self.replace_reply.take() {
                pkt = encode_packet(&reply);
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
    /// GDB closed the connection; a program we started was killed, an attached one detached
    /// ([`OnDisconnect::End`]).
    ConnectionClosed,
    /// GDB closed the connection and the program and its recording were kept, stopped, for
    /// the next debugger ([`OnDisconnect::Keep`]; call [`Router::serve`] again).
    Kept,
}

/// What happens to the program when the debugger's connection closes without `detach` or
/// `kill` (GDB crashed, `disconnect`, the network went away).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnDisconnect {
    /// Kill a program we started, detach from an attached one; the session is over.
    #[default]
    End,
    /// Stop the program (if it runs) and keep it and its recording, so that a debugger can
    /// connect again (like gdbserver without `--once`).
    Keep,
}

/// Receives target notices (e.g. to print them on the CLI's stderr).
pub type NoticeSink = Box<dyn FnMut(&Notice)>;

/// LLDB's `qMemoryRegionInfo` reply for `addr`: the mapping that contains it (with
/// permissions and the hex-encoded file name), or the unmapped gap around it.
pub fn memory_region_info(maps: &[crate::target::MemoryMapping], addr: u64) -> String {
    if let Some(m) = maps.iter().find(|m| m.start <= addr && addr < m.end) {
        let perms: String = m.perms.chars().take(3).filter(|&c| c != '-').collect();
        let mut out = format!(
            "start:{:x};size:{:x};permissions:{perms};",
            m.start,
            m.end - m.start
        );
        if !m.name.is_empty() && !m.name.starts_with('[') {
            out.push_str(&format!("name:{};", hex_encode(m.name.as_bytes())));
        }
        return out;
    }
    let start = maps
        .iter()
        .map(|m| m.end)
        .filter(|&e| e <= addr)
        .max()
        .unwrap_or(0);
    let end = maps
        .iter()
        .map(|m| m.start)
        .filter(|&s| s > addr)
        .min()
        .unwrap_or(u64::MAX);
    format!("start:{start:x};size:{:x};", end - start)
}

/// The `qHostInfo` / `qProcessInfo` reply (LLDB's format: hex pid, hex-encoded triple).
fn lldb_info(pid: Option<i32>) -> String {
    let triple = hex_encode(b"x86_64-pc-linux-gnu");
    let mut out = String::new();
    if let Some(pid) = pid {
        out.push_str(&format!("pid:{pid:x};"));
    }
    out.push_str(&format!(
        "triple:{triple};ostype:linux;vendor:pc;endian:little;ptrsize:8;"
    ));
    out
}

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
    on_disconnect: OnDisconnect,
    /// Whether the program runs (gdbstub's `Running` state, until its stop was taken): what a
    /// connection lost mid-write must stop.
    running: bool,
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
            .field("on_disconnect", &self.on_disconnect)
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
        let mut router = Router {
            handlers: Vec::new(),
            features: Vec::new(),
            packet_size,
            state: RouterState::default(),
            // Room for "$", "#xx" and the slack gdbstub needs in its own buffer.
            framer: Framer::new(packet_size - 8),
            notice_sink: None,
            on_disconnect: OnDisconnect::default(),
            running: false,
        };
        // LLDB's host/process queries. gdbstub 0.7 writes `pid:` in decimal where LLDB reads
        // hex, and has no `ostype`, which LLDB needs to pick its Linux dynamic loader.
        router.intercept(b"qHostInfo", |_, _, body| {
            if body != b"qHostInfo" {
                return Intercept::Pass;
            }
            Intercept::Reply(lldb_info(None).into_bytes())
        });
        router.intercept(b"qMemoryRegionInfo:", |session, _, body| {
            let hex = &body[b"qMemoryRegionInfo:".len()..];
            let addr = std::str::from_utf8(hex)
                .ok()
                .and_then(|h| u64::from_str_radix(h, 16).ok());
            match (addr, crate::target::read_maps(session.target().pid())) {
                (Some(addr), Ok(maps)) => {
                    Intercept::Reply(memory_region_info(&maps, addr).into_bytes())
                }
                _ => Intercept::Reply(b"E01".to_vec()),
            }
        });
        // Where LLDB's POSIX dynamic loader finds `r_debug` (see `svr4::shlib_info_addr`).
        router.intercept(b"qShlibInfoAddr", |session, _, body| {
            if body != b"qShlibInfoAddr" {
                return Intercept::Pass;
            }
            match super::svr4::shlib_info_addr(session.target()) {
                Some(addr) => Intercept::Reply(format!("{addr:x}").into_bytes()),
                None => Intercept::Reply(b"E01".to_vec()),
            }
        });
        router.intercept(b"qProcessInfo", |session, _, body| {
            if body != b"qProcessInfo" {
                return Intercept::Pass;
            }
            Intercept::Reply(lldb_info(Some(session.target().pid())).into_bytes())
        });
        router
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

    /// What a closed connection does to the program (default [`OnDisconnect::End`]).
    pub fn set_on_disconnect(&mut self, on: OnDisconnect) {
        self.on_disconnect = on;
    }

    /// The protocol state seen so far.
    pub fn state(&self) -> &RouterState {
        &self.state
    }

    /// Serves one GDB connection until the program exits, GDB detaches/kills, or the
    /// connection closes or fails (then see [`OnDisconnect`]: the program is killed or
    /// detached, or kept stopped for the next connection, [`ServeOutcome::Kept`]).
    pub fn serve(
        &mut self,
        stream: TcpStream,
        session: &mut Session,
    ) -> Result<ServeOutcome, ServerError> {
        self.running = false;
        match self.serve_connection(stream, session) {
            // A reset or a write to a closed socket is the debugger going away, like EOF.
            Err(ServerError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                let running = self.running;
                self.connection_closed(session, running)
            }
            r => r,
        }
    }

    fn serve_connection(
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
        // A new connection starts with a clean slate (a previous one may have ended mid-packet).
        self.framer = Framer::new(self.packet_size - 8);
        self.state = RouterState::default();
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
                    self.running = false;
                    let n = read_some(&mut reader, &mut buf)?;
                    if n == 0 {
                        return self.connection_closed(session, false);
                    }
                    self.feed(GdbStubStateMachine::Idle(i), session, &buf[..n])?
                }
                GdbStubStateMachine::Running(mut r) => {
                    self.running = true;
                    let stop = session.target_mut().wait(false)?;
                    self.running = stop.is_none();
                    self.forward_notices(r.borrow_conn(), session)?;
                    if let Some(ev) = stop {
                        idle_polls = 0;
                        let tid = session.target().tid();
                        // The registers are the stop thread's (GDB may have selected another
                        // one before resuming); a target that cannot select keeps its own.
                        let _ = session.target_mut().select_thread(tid);
                        // Expedite rbp, rsp and rip (as gdbserver does) so GDB can identify
                        // the frame without fetching every register after each step.
                        let expedited = match ev {
                            StopEvent::Exited(_) | StopEvent::Killed(_) => None,
                            _ => session.target_mut().read_registers().ok(),
                        };
                        match expedited {
                            Some(regs) => {
                                let values: Vec<(GdbRegId, [u8; 8])> =
                                    [(6, gpr::RBP), (7, gpr::RSP), (16, gpr::RIP)]
                                        .iter()
                                        .map(|&(num, idx)| {
                                            (GdbRegId(num), regs.gprs[idx].to_le_bytes())
                                        })
                                        .collect();
                                let mut iter = values.iter().map(|(id, v)| (*id, &v[..]));
                                r.report_stop_with_regs(session, stop_reason(tid, ev), &mut iter)
                                    .map_err(gs_err)?
                            }
                            None => r
                                .report_stop(session, stop_reason(tid, ev))
                                .map_err(gs_err)?,
                        }
                    } else {
                        // A single step stops within microseconds: yield-spin briefly first,
                        // then back off to 10 ms polls so a long-running program costs no CPU.
                        const SPINS: u32 = 200;
                        let timeout = idle_polls.saturating_sub(SPINS).min(10) as i32;
                        if idle_polls < SPINS {
                            std::thread::yield_now();
                        }
                        idle_polls += 1;
                        if poll_readable(&reader, timeout)? {
                            // Everything GDB sent so far is handled before the program runs
                            // on: a large packet (discarded by the framer beyond the packet
                            // size) must not cost one run slice per read, and a Ctrl-C behind
                            // it must be seen at once.
                            let mut sm = GdbStubStateMachine::Running(r);
                            loop {
                                let n = read_some(&mut reader, &mut buf)?;
                                if n == 0 {
                                    let running = matches!(sm, GdbStubStateMachine::Running(_));
                                    return self.connection_closed(session, running);
                                }
                                sm = self.feed(sm, session, &buf[..n])?;
                                if !matches!(sm, GdbStubStateMachine::Running(_))
                                    || !poll_readable(&reader, 0)?
                                {
                                    break;
                                }
                            }
                            sm
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

    /// The connection closed; `running` says whether the program was running (gdbstub's
    /// `Running` state).
    fn connection_closed(
        &mut self,
        session: &mut Session,
        running: bool,
    ) -> Result<ServeOutcome, ServerError> {
        let attached = session.is_attached();
        let t = session.target_mut();
        if t.has_exited() {
            return Ok(ServeOutcome::ConnectionClosed);
        }
        if self.on_disconnect == OnDisconnect::Keep {
            // Stopped where it is, with its recording; a stop nobody saw is dropped (the
            // next debugger asks `?` and gets where the program is).
            if running {
                let t = session.target_mut();
                t.interrupt()?;
                t.wait(true)?;
            }
            return Ok(if session.target().has_exited() {
                ServeOutcome::ConnectionClosed
            } else {
                ServeOutcome::Kept
            });
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
        let body = &*normalize_qsupported(body);
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
        // gdbstub ends the session on a step of "all threads" (`s`/`bs` after `Hc-1`).
        let resume_all = self.state.continue_thread.as_deref().is_some_and(|t| {
            thread_kind(t.as_bytes()) == Some(false) && t != "0" && !t.ends_with(".0")
        });
        let check = check_packet(body, resume_all);
        if check != Check::Pass {
            let c = conn(&mut sm);
            c.ack().map_err(ServerError::Io)?;
            let reply: &[u8] = if check == Check::Malformed {
                b"E01"
            } else {
                b""
            };
            c.send_packet(reply).map_err(ServerError::Io)?;
            return Ok(sm);
        }
        if let Some(reply) = check_threads_and_signals(session, body) {
            let c = conn(&mut sm);
            c.ack().map_err(ServerError::Io)?;
            c.send_packet(reply).map_err(ServerError::Io)?;
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
        } else if plain == b"k" {
            // gdbstub answers `k` with `OK`. GDB reads no reply to `k` (it uses `vKill`,
            // answered `OK`, when multiprocess is on), but LLDB waits for an exit-status
            // stop reply and reports "unexpected response to k packet: OK" otherwise;
            // lldb-server answers `X09` (terminated by SIGKILL), and so do we.
            conn(&mut sm).replace_reply = Some(b"X09".to_vec());
        }
        feed_raw(sm, session, &frame(body))
    }
}

/// The thread ids of the session (gdbstub's view: `list_active_threads`).
fn session_threads(session: &mut Session) -> Vec<usize> {
    use gdbstub::target::ext::base::multithread::MultiThreadBase as _;
    let mut tids = Vec::new();
    let _ = session.list_active_threads(&mut |t| tids.push(t.get()));
    tids
}

/// Whether a specific thread id (`<tid>` or `p<pid>.<tid>`, hex, as [`thread_kind`] accepts
/// with `Some(true)`) names a thread of the session.
fn thread_exists(session: &mut Session, id: &[u8]) -> bool {
    let hex = |h: &[u8]| {
        std::str::from_utf8(h)
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok())
    };
    let (pid, tid) = match id.strip_prefix(b"p").and_then(|r| split2(r, b'.')) {
        Some((pid, tid)) => (hex(pid), tid),
        None => (None, id),
    };
    let pid_ok = match pid {
        Some(p) => i32::try_from(p).is_ok_and(|p| p == session.target().pid()),
        None => !id.starts_with(b"p"),
    };
    pid_ok && hex(tid).is_some_and(|t| session_threads(session).contains(&t))
}

/// A signal number of a resume packet (`C`/`S`, `vCont;C`/`S`): two hex digits of GDB's
/// numbering. 0 means none; anything else must be a signal Linux has.
fn signal_ok(hex: &[u8]) -> bool {
    std::str::from_utf8(hex)
        .ok()
        .and_then(|h| u8::from_str_radix(h, 16).ok())
        .is_some_and(|sig| sig == 0 || super::session::gdb_to_linux_signal(sig).is_some())
}

/// The error reply for a well-formed resume or thread selection that names a thread the
/// session does not have, or a signal Linux does not have (gdbstub would pass the thread id
/// to a target that ignores it and drop the signal: the program would resume as if asked
/// correctly). `None` when the packet is fine. Checked after [`check_packet`].
fn check_threads_and_signals(session: &mut Session, body: &[u8]) -> Option<&'static [u8]> {
    const NO_THREAD: &[u8] = b"E01";
    const BAD_SIGNAL: &[u8] = b"E16";
    if let Some(actions) = body.strip_prefix(b"vCont;") {
        for action in actions.split(|&b| b == b';') {
            let (act, tid) = split2(action, b':').unwrap_or((action, b""));
            if matches!(act.first(), Some(b'C' | b'S')) && !signal_ok(&act[1..]) {
                return Some(BAD_SIGNAL);
            }
            if thread_kind(tid) == Some(true) && !thread_exists(session, tid) {
                return Some(NO_THREAD);
            }
        }
        return None;
    }
    match body.split_first() {
        Some((b'C' | b'S', rest)) => {
            let sig = split2(rest, b';').map_or(rest, |(sig, _)| sig);
            (!signal_ok(sig)).then_some(BAD_SIGNAL)
        }
        Some((b'H', rest)) if rest.len() > 1 => {
            let tid = &rest[1..];
            (thread_kind(tid) == Some(true) && !thread_exists(session, tid)).then_some(NO_THREAD)
        }
        _ => None,
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
    fn lookalike_packets_are_unsupported_not_errors() {
        for other in [
            &b"qCRC:1000,10"[..],
            b"qfThreadInfoX",
            b"bsx",
            b"qSupportedX",
            b"qAttachedX",
        ] {
            assert_eq!(
                check_packet(other, false),
                Check::Unsupported,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn steps_of_all_threads_are_refused() {
        assert_eq!(check_packet(b"s", true), Check::Malformed);
        assert_eq!(check_packet(b"S05", true), Check::Malformed);
        assert_eq!(check_packet(b"bs", true), Check::Malformed);
        assert_eq!(check_packet(b"c", true), Check::Pass);
        assert_eq!(check_packet(b"s", false), Check::Pass);
    }

    #[test]
    fn qsupported_normalisation() {
        assert_eq!(
            &*normalize_qsupported(b"qSupported"),
            b"qSupported:multiprocess-"
        );
        assert_eq!(
            &*normalize_qsupported(b"qSupported:"),
            b"qSupported:multiprocess-"
        );
        assert_eq!(
            &*normalize_qsupported(b"qSupported:a+;;b-;"),
            b"qSupported:a+;b-"
        );
        assert_eq!(
            &*normalize_qsupported(b"qSupported:a+;b-"),
            b"qSupported:a+;b-"
        );
        assert_eq!(&*normalize_qsupported(b"g"), b"g");
        for b in [&b"qSupported"[..], b"qSupported:", b"qSupported:a+;;b-;"] {
            assert_eq!(check_packet(&normalize_qsupported(b), false), Check::Pass);
        }
    }

    #[test]
    fn memory_region_replies() {
        use crate::target::MemoryMapping;
        let maps = vec![
            MemoryMapping {
                start: 0x1000,
                end: 0x3000,
                perms: "r-xp".into(),
                offset: 0,
                name: "/bin/x".into(),
            },
            MemoryMapping {
                start: 0x5000,
                end: 0x6000,
                perms: "rw-p".into(),
                offset: 0,
                name: "[heap]".into(),
            },
        ];
        assert_eq!(
            memory_region_info(&maps, 0x1800),
            "start:1000;size:2000;permissions:rx;name:2f62696e2f78;"
        );
        assert_eq!(
            memory_region_info(&maps, 0x5000),
            "start:5000;size:1000;permissions:rw;"
        );
        assert_eq!(memory_region_info(&maps, 0x4000), "start:3000;size:2000;");
        assert_eq!(memory_region_info(&maps, 0x10), "start:0;size:1000;");
    }

    #[test]
    fn rle_expansion() {
        // "0* " = '0' followed by 3 more ('space' = 32, 32 - 29 = 3)
        assert_eq!(expand_rle(b"0* 1"), b"00001".to_vec());
        assert_eq!(expand_rle(b"*"), b"*".to_vec());
    }

    /// Found by `fuzz/fuzz_targets/rsp.rs`: gdbstub ends the session on an extended-mode
    /// setting it cannot parse (`QStartupWithShellqXfer:…`); the router must answer instead.
    /// Found by the long `rsp` fuzzing run (docs/fuzzing.md): gdbstub's vCont parser rejects
    /// pid 0 with "any thread", fatally.
    #[test]
    fn vcont_any_thread_of_any_process_is_refused() {
        for body in [&b"vCont;c:p0"[..], b"vCont;c:p0.0", b"vCont;C05:p0"] {
            assert_eq!(check_packet(body, false), Check::Malformed, "{body:?}");
        }
        for body in [
            &b"vCont;c:p0.1"[..],
            b"vCont;c:p1092",
            b"vCont;c:p1092.0",
            b"vCont;c:0",
        ] {
            assert_eq!(check_packet(body, false), Check::Pass, "{body:?}");
        }
    }

    #[test]
    fn fuzz_found_packets_never_reach_gdbstub_malformed() {
        for (body, want) in [
            (&b"QStartupWithShell:1"[..], Check::Pass),
            (b"QStartupWithShell:0", Check::Pass),
            (b"QDisableRandomization:1", Check::Pass),
            (b"QEnvironmentReset", Check::Pass),
            (b"QEnvironmentHexEncoded:413d31", Check::Pass),
            (b"QEnvironmentUnset:41", Check::Pass),
            (b"QSetWorkingDir:", Check::Pass),
            (b"QSetWorkingDir:2f746d70", Check::Pass),
            (
                b"QStartupWithShellqXfer:QStartupWithShell:10,fff",
                Check::Unsupported,
            ),
            (b"QStartupWithShell:2", Check::Malformed),
            (b"QStartupWithShell", Check::Malformed),
            (b"QDisableRandomization:", Check::Malformed),
            (b"QEnvironmentResetX", Check::Unsupported),
            (b"QEnvironmentHexEncoded:4131", Check::Malformed),
            (b"QEnvironmentHexEncoded:413", Check::Malformed),
            (b"QEnvironmentHexEncoded", Check::Malformed),
            (b"QEnvironmentUnset:zz", Check::Malformed),
            (b"QSetWorkingDir:2", Check::Malformed),
            (b"QSetWorkingDirX", Check::Unsupported),
            (b"Hgp0.0", Check::Pass),
            (b"Hgp1a.0", Check::Pass),
            (b"Hgp0Hg`\xf6.0", Check::Malformed),
            (b"Hgx.0", Check::Malformed),
            (b"Hgp1.2.0", Check::Malformed),
            (b"vCont;c:", Check::Malformed),
            (b"vCont;c:p1.1;s:", Check::Malformed),
            (b"vCont;c", Check::Pass),
            (b"vCont;c:p1.-1", Check::Pass),
        ] {
            assert_eq!(
                check_packet(body, false),
                want,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
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
            b"z0,401000,1",
            b"qXfer:exec-file:read:1a2b:0,fff",
            b"qXfer:btrace:read:all:0,fff",
            b"qC",
            b"vKill;1a2b",
            b"D;1a2b",
            b"D",
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
            assert_eq!(
                check_packet(good, false),
                Check::Pass,
                "{}",
                String::from_utf8_lossy(good)
            );
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
            b"qXfer:auxv:read:x:0,10",
            b"vKill;0",
            b"vKill",
            b"D;",
            b"gg",
            b"?x",
            b"Hg-1",
            b"Hgp5",
            b"T-1",
            b"Tp5.0",
            b"vCont;t",
            b"vCont;s",
            b"vCont;s:-1",
            b"vCont;r1,2:1",
        ] {
            assert_eq!(
                check_packet(bad, false),
                Check::Malformed,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
