//! Framing, both ways: the byte stream from the debugger split into [`Frame`]s (packets with
//! their checksums checked, acks, the interrupt byte; oversized packets discarded without
//! growing a buffer), and [`RouterConn`], the connection gdbstub writes its replies to, which
//! re-frames them on the way out (features added to the `qSupported` reply, the reply to `k`
//! replaced, the last packet kept for a `-`, the no-ack handshake watched).

use super::super::rsp::{encode_packet, hex_digit, hex_encode, unescape};
use gdbstub::conn::Connection;
use std::io::Write;
use std::net::TcpStream;

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
pub(super) fn expand_rle(body: &[u8]) -> Vec<u8> {
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

/// The `Connection` handed to gdbstub: buffers each reply until `flush`, then rewrites the
/// `qSupported` reply if asked to, remembers the last packet for retransmission and watches
/// for the end of the no-ack handshake.
#[derive(Debug)]
pub struct RouterConn {
    stream: TcpStream,
    out: Vec<u8>,
    /// Features to append to the next packet gdbstub sends (its `qSupported` reply).
    pub(super) rewrite_features: Option<Vec<String>>,
    /// True after gdbstub was handed `QStartNoAckMode`: an `OK` reply switches acks off.
    pub(super) watch_no_ack: bool,
    no_ack: bool,
    last_packet: Vec<u8>,
    /// A body that replaces the next packet gdbstub sends (its reply to `k`).
    pub(super) replace_reply: Option<Vec<u8>>,
    /// Fields appended to the next packet gdbstub sends if it is a `T` stop reply
    /// (`threads:…;` after `QListThreadsInStopReply`).
    pub(super) stop_reply_suffix: Option<Vec<u8>>,
    /// Drop gdbstub's next reply, ack included: it answers a packet of the router's own (the
    /// `Hg` a `;thread:` suffix stands for), not the client's.
    pub(super) swallow_reply: bool,
}

impl RouterConn {
    pub(super) fn new(stream: TcpStream) -> Self {
        RouterConn {
            stream,
            out: Vec::new(),
            rewrite_features: None,
            watch_no_ack: false,
            no_ack: false,
            last_packet: Vec::new(),
            replace_reply: None,
            stop_reply_suffix: None,
            swallow_reply: false,
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

    pub(super) fn resend_last(&mut self) -> std::io::Result<()> {
        if !self.last_packet.is_empty() {
            let pkt = self.last_packet.clone();
            Write::write_all(&mut self.stream, &pkt)?;
        }
        Ok(())
    }

    fn process_out(&mut self) -> std::io::Result<()> {
        let out = std::mem::take(&mut self.out);
        if std::mem::take(&mut self.swallow_reply) {
            return Ok(());
        }
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
            if let Some(suffix) = self.stop_reply_suffix.take() {
                let mut plain = expand_rle(&unescape(body));
                if plain.first() == Some(&b'T') {
                    if plain.last() != Some(&b';') {
                        plain.push(b';');
                    }
                    plain.extend_from_slice(&suffix);
                    pkt = encode_packet(&plain);
                }
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
            if self.swallow_reply {
                return Ok(());
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A `RouterConn` over one end of a loopback connection, and the other end.
    fn conn_pair() -> (RouterConn, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (RouterConn::new(server), client)
    }

    /// What gdbstub writes, through `process_out`, as the client reads it.
    fn sent(conn: &mut RouterConn, client: &mut TcpStream, out: &[u8]) -> Vec<u8> {
        use std::io::Read;
        Connection::write_all(conn, out).unwrap();
        Connection::flush(conn).unwrap();
        client
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        // One packet: up to its `#` and two checksum digits.
        while got
            .iter()
            .position(|&b| b == b'#')
            .is_none_or(|hash| got.len() < hash + 3)
        {
            let n = client.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed");
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    #[test]
    fn thread_list_is_added_to_stop_replies_only() {
        let (mut conn, mut client) = conn_pair();
        // A stop reply: the fields follow the existing ones.
        conn.stop_reply_suffix = Some(b"threads:1f,20;".to_vec());
        assert_eq!(
            sent(&mut conn, &mut client, &encode_packet(b"T05thread:p1f.1f;")),
            encode_packet(b"T05thread:p1f.1f;threads:1f,20;")
        );
        assert!(conn.stop_reply_suffix.is_none());
        // Any other reply (an exit) goes out unchanged, and the fields are dropped.
        conn.stop_reply_suffix = Some(b"threads:1f;".to_vec());
        assert_eq!(
            sent(&mut conn, &mut client, &encode_packet(b"W00")),
            encode_packet(b"W00")
        );
        assert!(conn.stop_reply_suffix.is_none());
        assert_eq!(
            sent(&mut conn, &mut client, &encode_packet(b"T05")),
            encode_packet(b"T05")
        );
    }

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
}
