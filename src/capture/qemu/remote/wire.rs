//! The byte level of the GDB remote serial protocol, client side: `$body#cs` framing, checksums,
//! `+`/`-` acknowledgements (with retransmission), run-length decoding, `}` escapes and hex.
//!
//! Everything read is bounded: a packet longer than [`Wire::max_packet`] (before or after
//! run-length expansion) is an error, not an allocation. Reads honour a deadline, and a packet
//! that arrived only in part when the deadline passed stays buffered for the next call.
//!
//! The server side of the same rules lives in the GDB server (`server::rsp`); the capture layer
//! sits below it and keeps its own small copy of the client half.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::RemoteError;

/// The protocol's byte-level rules, shared with the server side.
pub use crate::rsp::{checksum, escape_binary, frame, hex_digit, hex_encode};

/// A byte stream to a GDB stub whose reads can time out (a UNIX or TCP socket).
pub trait Transport: Read + Write {
    /// Sets how long one `read` may block (`None`: forever).
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Closes both directions (the stub sees the end of the connection).
    fn shutdown(&self) -> io::Result<()>;
}

impl Transport for UnixStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }
    fn shutdown(&self) -> io::Result<()> {
        UnixStream::shutdown(self, std::net::Shutdown::Both)
    }
}

impl Transport for std::net::TcpStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        std::net::TcpStream::set_read_timeout(self, timeout)
    }
    fn shutdown(&self) -> io::Result<()> {
        std::net::TcpStream::shutdown(self, std::net::Shutdown::Both)
    }
}

/// Default bound on one packet (after run-length expansion). QEMU 7.2 announces
/// `PacketSize=1000` (4096 bytes); a `qXfer` chunk or `g` reply stays well below this.
pub const DEFAULT_MAX_PACKET: usize = 1 << 20;

/// How many times a packet is sent again after a `-` (or a missing `+`) before giving up.
const RETRANSMITS: u32 = 3;

/// Bytes outside any packet tolerated before a `$` (line noise, stray acks) per read.
const MAX_NOISE: usize = 4096;

/// One packet from the stub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A `$…#cs` packet: its body, run-length expanded (binary escapes still in place).
    Packet(Vec<u8>),
    /// A `%…#cs` notification (non-stop mode), body as for `Packet`.
    Notification(Vec<u8>),
}

/// The framing state of one connection.
#[derive(Debug)]
pub struct Wire<S> {
    stream: S,
    /// Bytes read but not yet consumed.
    buf: Vec<u8>,
    /// Whether both sides acknowledge packets (`+`/`-`); on until `QStartNoAckMode` succeeds.
    acks: bool,
    /// Packets that arrived while waiting for the `+` of one we sent, in order.
    early: VecDeque<Incoming>,
    /// Longest packet accepted (encoded, and after run-length expansion).
    max_packet: usize,
    /// Last packet sent, framed, for retransmission after a `-`.
    last_sent: Vec<u8>,
    /// Packets dropped for a bad checksum (and asked again with `-`).
    bad_checksums: u64,
}

impl<S: Transport> Wire<S> {
    /// Closes the connection (both directions); later sends and receives fail.
    pub fn shutdown(&self) -> io::Result<()> {
        self.stream.shutdown()
    }

    /// A connection over `stream`, acknowledgements on (the protocol's start state).
    pub fn new(stream: S) -> Self {
        Wire {
            stream,
            buf: Vec::new(),
            acks: true,
            early: VecDeque::new(),
            max_packet: DEFAULT_MAX_PACKET,
            last_sent: Vec::new(),
            bad_checksums: 0,
        }
    }

    /// The longest packet accepted.
    pub fn max_packet(&self) -> usize {
        self.max_packet
    }

    /// Sets the longest packet accepted (at least 64 bytes).
    pub fn set_max_packet(&mut self, max: usize) {
        self.max_packet = max.max(64);
    }

    /// Turns acknowledgements off (after the stub accepted `QStartNoAckMode`).
    pub fn disable_acks(&mut self) {
        self.acks = false;
    }

    /// Whether packets are acknowledged.
    pub fn acks(&self) -> bool {
        self.acks
    }

    /// Packets received with a bad checksum so far.
    pub fn bad_checksums(&self) -> u64 {
        self.bad_checksums
    }

    /// The underlying stream.
    pub fn stream(&self) -> &S {
        &self.stream
    }

    /// Writes raw bytes (the `0x03` interrupt byte).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), RemoteError> {
        self.stream
            .write_all(bytes)
            .and_then(|()| self.stream.flush())
            .map_err(|e| RemoteError::io("write to the stub", e))
    }

    /// Sends one packet (`body` already escaped where it carries binary data) and, with
    /// acknowledgements on, waits until `deadline` for its `+`, sending it again after a `-`.
    /// Packets arriving meanwhile are kept for [`recv`](Self::recv).
    pub fn send(&mut self, body: &[u8], deadline: Instant) -> Result<(), RemoteError> {
        let framed = frame(body);
        if framed.len() > self.max_packet + 4 {
            return Err(RemoteError::PacketTooLarge {
                limit: self.max_packet,
                what: "request",
            });
        }
        self.last_sent = framed;
        let mut tries = 0;
        loop {
            let framed = std::mem::take(&mut self.last_sent);
            let sent = self.send_raw(&framed);
            self.last_sent = framed;
            sent?;
            if !self.acks {
                return Ok(());
            }
            match self.wait_ack(deadline)? {
                true => return Ok(()),
                false if tries < RETRANSMITS => tries += 1,
                false => {
                    return Err(RemoteError::Nak {
                        request: lossy(body),
                        tries: tries + 1,
                    });
                }
            }
        }
    }

    /// Waits for `+` (true) or `-` (false); packets before it go to `early`.
    fn wait_ack(&mut self, deadline: Instant) -> Result<bool, RemoteError> {
        loop {
            let mut noise = 0usize;
            while let Some(&b) = self.buf.first() {
                match b {
                    b'+' => {
                        self.buf.remove(0);
                        return Ok(true);
                    }
                    b'-' => {
                        self.buf.remove(0);
                        return Ok(false);
                    }
                    b'$' | b'%' => match self.take_packet()? {
                        Some(Some(p)) => self.early.push_back(p),
                        Some(None) => {}
                        None => break,
                    },
                    _ => {
                        self.buf.remove(0);
                        noise += 1;
                        if noise > MAX_NOISE {
                            return Err(RemoteError::Malformed {
                                what: "bytes outside packets",
                                text: String::new(),
                            });
                        }
                    }
                }
            }
            if !self.fill(deadline, "the acknowledgement of a packet")? {
                return Err(RemoteError::Timeout {
                    waiting_for: "the acknowledgement of a packet".into(),
                });
            }
        }
    }

    /// Receives the next packet or notification; `Ok(None)` when `deadline` passed first (a
    /// partly received packet stays buffered). Stray `+`/`-` and noise between packets are
    /// skipped; a `-` makes the last packet go out again.
    pub fn recv(&mut self, deadline: Option<Instant>) -> Result<Option<Incoming>, RemoteError> {
        if let Some(p) = self.early.pop_front() {
            return Ok(Some(p));
        }
        loop {
            let mut noise = 0usize;
            while let Some(&b) = self.buf.first() {
                match b {
                    b'$' | b'%' => match self.take_packet()? {
                        Some(Some(p)) => return Ok(Some(p)),
                        Some(None) => {}
                        None => break,
                    },
                    b'-' if self.acks && !self.last_sent.is_empty() => {
                        self.buf.remove(0);
                        let framed = std::mem::take(&mut self.last_sent);
                        let sent = self.send_raw(&framed);
                        self.last_sent = framed;
                        sent?;
                    }
                    _ => {
                        self.buf.remove(0);
                        noise += 1;
                        if noise > MAX_NOISE {
                            return Err(RemoteError::Malformed {
                                what: "bytes outside packets",
                                text: String::new(),
                            });
                        }
                    }
                }
            }
            let until = deadline.unwrap_or_else(far_future);
            if !self.fill(until, "a packet")? {
                return Ok(None);
            }
        }
    }

    /// Parses one packet at the start of `buf` (which starts with `$` or `%`).
    /// `None`: incomplete; `Some(None)`: dropped (bad checksum, `-` sent); `Some(Some(p))`.
    fn take_packet(&mut self) -> Result<Option<Option<Incoming>>, RemoteError> {
        let notification = self.buf.first() == Some(&b'%');
        let Some(hash) = memchr::memchr(b'#', &self.buf[1..]).map(|i| i + 1) else {
            if self.buf.len() > self.max_packet + 4 {
                return Err(RemoteError::PacketTooLarge {
                    limit: self.max_packet,
                    what: "reply",
                });
            }
            return Ok(None);
        };
        if self.buf.len() < hash + 3 {
            return Ok(None);
        }
        let body = self.buf[1..hash].to_vec();
        let sum = (hex_digit(self.buf[hash + 1]), hex_digit(self.buf[hash + 2]));
        self.buf.drain(..hash + 3);
        if body.len() > self.max_packet {
            return Err(RemoteError::PacketTooLarge {
                limit: self.max_packet,
                what: "reply",
            });
        }
        let ok = matches!(sum, (Some(h), Some(l)) if (h << 4 | l) == checksum(&body));
        if !ok {
            self.bad_checksums += 1;
            if !self.acks {
                return Err(RemoteError::Checksum { body: lossy(&body) });
            }
            self.send_raw(b"-")?;
            return Ok(Some(None));
        }
        if self.acks && !notification {
            self.send_raw(b"+")?;
        }
        let body = expand_rle(&body, self.max_packet)?;
        Ok(Some(Some(if notification {
            Incoming::Notification(body)
        } else {
            Incoming::Packet(body)
        })))
    }

    /// Reads more bytes until `deadline`; false when it passed with nothing read.
    fn fill(&mut self, deadline: Instant, waiting_for: &str) -> Result<bool, RemoteError> {
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        // A zero timeout means "block forever" to the socket API: round up.
        let wait = (deadline - now).max(Duration::from_millis(1));
        self.stream
            .set_read_timeout(Some(wait))
            .map_err(|e| RemoteError::io("set the socket timeout", e))?;
        let mut chunk = [0u8; 8192];
        match self.stream.read(&mut chunk) {
            Ok(0) => Err(RemoteError::Closed {
                waiting_for: waiting_for.to_string(),
            }),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(Instant::now() < deadline)
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Err(RemoteError::Closed {
                waiting_for: waiting_for.to_string(),
            }),
            Err(e) => Err(RemoteError::io("read from the stub", e)),
        }
    }
}

/// A deadline far enough away to mean "wait as long as it takes".
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

/// Expands run-length encoding: `X*n` stands for `X` repeated `n - 29 + 1` times in all.
/// The result is bounded by `max`.
pub fn expand_rle(body: &[u8], max: usize) -> Result<Vec<u8>, RemoteError> {
    if !body.contains(&b'*') {
        return Ok(body.to_vec());
    }
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if b == b'*' {
            let (Some(&prev), Some(&count)) = (out.last(), body.get(i + 1)) else {
                return Err(RemoteError::Malformed {
                    what: "run-length encoding",
                    text: lossy(body),
                });
            };
            if count < 29 {
                return Err(RemoteError::Malformed {
                    what: "run-length count",
                    text: lossy(body),
                });
            }
            let n = usize::from(count - 29);
            if out.len() + n > max {
                return Err(RemoteError::PacketTooLarge {
                    limit: max,
                    what: "reply (run-length expanded)",
                });
            }
            out.extend(std::iter::repeat_n(prev, n));
            i += 2;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Ok(out)
}

/// Undoes [`escape_binary`] (binary replies such as `qXfer` data). A trailing lone `}` is
/// malformed.
pub fn unescape_binary(data: &[u8]) -> Result<Vec<u8>, RemoteError> {
    let mut out = Vec::with_capacity(data.len());
    let mut it = data.iter();
    while let Some(&b) = it.next() {
        if b == b'}' {
            match it.next() {
                Some(&e) => out.push(e ^ 0x20),
                None => {
                    return Err(RemoteError::Malformed {
                        what: "binary escape at the end of a reply",
                        text: lossy(data),
                    });
                }
            }
        } else {
            out.push(b);
        }
    }
    Ok(out)
}

/// Decodes hex digit pairs; `what` names the field in the error.
pub fn hex_decode(text: &[u8], what: &'static str) -> Result<Vec<u8>, RemoteError> {
    crate::rsp::hex_decode(text).map_err(|_| RemoteError::Malformed {
        what,
        text: lossy(text),
    })
}

/// Parses a big-endian hex number of at most 16 digits (stop-reply fields, thread ids).
pub fn parse_hex_u64(text: &[u8], what: &'static str) -> Result<u64, RemoteError> {
    crate::rsp::parse_hex_u64(text).map_err(|_| RemoteError::Malformed {
        what,
        text: lossy(text),
    })
}

/// A packet body as text for error messages: lossy UTF-8, at most 80 bytes.
pub fn lossy(body: &[u8]) -> String {
    let cut = &body[..body.len().min(80)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if body.len() > cut.len() {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Wire<UnixStream>, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Wire::new(a), b)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(2)
    }

    fn read_some(s: &mut UnixStream) -> Vec<u8> {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = [0u8; 256];
        match s.read(&mut buf) {
            Ok(n) => buf[..n].to_vec(),
            Err(_) => Vec::new(),
        }
    }

    #[test]
    fn frames_and_checksums() {
        assert_eq!(frame(b"g"), b"$g#67");
        assert_eq!(frame(b""), b"$#00");
        assert_eq!(checksum(b"OK"), 0x9a);
    }

    #[test]
    fn receives_and_acks_a_packet_split_across_reads() {
        let (mut w, mut peer) = pair();
        peer.write_all(b"+$O").unwrap();
        assert_eq!(
            w.recv(Some(Instant::now() + Duration::from_millis(50)))
                .unwrap(),
            None,
            "incomplete packet: timeout, not an error"
        );
        peer.write_all(b"K#9a").unwrap();
        assert_eq!(
            w.recv(Some(soon())).unwrap(),
            Some(Incoming::Packet(b"OK".to_vec()))
        );
        assert_eq!(read_some(&mut peer), b"+");
    }

    #[test]
    fn bad_checksum_is_nakked_and_the_resend_accepted() {
        let (mut w, mut peer) = pair();
        peer.write_all(b"$OK#00$OK#9a").unwrap();
        assert_eq!(
            w.recv(Some(soon())).unwrap(),
            Some(Incoming::Packet(b"OK".to_vec()))
        );
        assert_eq!(read_some(&mut peer), b"-+");
        assert_eq!(w.bad_checksums(), 1);
    }

    #[test]
    fn send_retransmits_after_nak_and_gives_up() {
        let (mut w, mut peer) = pair();
        peer.write_all(b"-+").unwrap();
        w.send(b"g", soon()).unwrap();
        assert_eq!(read_some(&mut peer), b"$g#67$g#67");
        peer.write_all(b"----").unwrap();
        let err = w.send(b"g", soon()).unwrap_err();
        assert!(matches!(err, RemoteError::Nak { tries: 4, .. }), "{err}");
    }

    #[test]
    fn packet_before_the_ack_is_kept() {
        let (mut w, mut peer) = pair();
        peer.write_all(b"$T05thread:p01.10;#00").unwrap(); // bad checksum on purpose
        let sum = checksum(b"T05thread:p01.10;");
        peer.write_all(format!("$T05thread:p01.10;#{sum:02x}+").as_bytes())
            .unwrap();
        w.send(b"m0,1", soon()).unwrap();
        assert_eq!(
            w.recv(Some(soon())).unwrap(),
            Some(Incoming::Packet(b"T05thread:p01.10;".to_vec()))
        );
    }

    #[test]
    fn ack_timeout_and_closed_connection_are_errors() {
        let (mut w, peer) = pair();
        let err = w
            .send(b"g", Instant::now() + Duration::from_millis(30))
            .unwrap_err();
        assert!(matches!(err, RemoteError::Timeout { .. }), "{err}");
        drop(peer);
        let err = w.recv(Some(soon())).unwrap_err();
        assert!(matches!(err, RemoteError::Closed { .. }), "{err}");
    }

    #[test]
    fn oversized_packet_is_refused_without_buffering_it_all() {
        let (mut w, mut peer) = pair();
        w.set_max_packet(100);
        peer.write_all(b"$").unwrap();
        peer.write_all(&[b'a'; 300]).unwrap();
        let err = w.recv(Some(soon())).unwrap_err();
        assert!(matches!(err, RemoteError::PacketTooLarge { .. }), "{err}");
    }

    #[test]
    fn run_length_and_escapes() {
        // "0* " is '0' and 3 more: 0000.
        assert_eq!(expand_rle(b"0* ", 100).unwrap(), b"0000");
        assert_eq!(expand_rle(b"ab", 100).unwrap(), b"ab");
        assert!(expand_rle(b"*a", 100).is_err());
        assert!(expand_rle(b"0*\x10", 100).is_err());
        assert!(matches!(
            expand_rle(b"0*~", 10),
            Err(RemoteError::PacketTooLarge { .. })
        ));
        let data = [0u8, b'#', b'$', b'}', b'*', 0xff];
        let esc = escape_binary(&data);
        assert!(!esc.contains(&b'#') && !esc.contains(&b'$') && !esc.contains(&b'*'));
        assert_eq!(unescape_binary(&esc).unwrap(), data);
        assert!(unescape_binary(b"ab}").is_err());
    }

    #[test]
    fn hex_helpers() {
        assert_eq!(hex_encode(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(hex_decode(b"00aB10", "t").unwrap(), [0, 0xab, 0x10]);
        assert!(hex_decode(b"0", "t").is_err());
        assert!(hex_decode(b"zz", "t").is_err());
        assert_eq!(parse_hex_u64(b"361e", "t").unwrap(), 0x361e);
        assert!(parse_hex_u64(b"", "t").is_err());
        assert!(parse_hex_u64(b"11112222333344445", "t").is_err());
    }
}
