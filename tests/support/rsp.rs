//! A raw GDB remote-protocol client for tests that need exact packets (malformed, oversized,
//! interleaved with Ctrl-C) rather than a real debugger.

use std::io::{Read, Write};
use std::net::TcpStream;

/// `$body#checksum`.
pub fn packet(body: &str) -> Vec<u8> {
    let sum = body.bytes().fold(0u8, |a, b| a.wrapping_add(b));
    format!("${body}#{sum:02x}").into_bytes()
}

/// A connection speaking the remote protocol byte by byte.
pub struct Raw {
    /// The connection.
    pub s: TcpStream,
    /// Bytes read but not consumed yet.
    pub buf: Vec<u8>,
}

impl Raw {
    /// Connects to `127.0.0.1:port` (reads time out after `timeout`, failing the test).
    pub fn connect(port: u16, timeout: std::time::Duration) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to ptrewind");
        s.set_read_timeout(Some(timeout)).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s, buf: Vec::new() }
    }

    /// Sends raw bytes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// The next byte from the server (fails on EOF or timeout).
    pub fn byte(&mut self) -> u8 {
        if self.buf.is_empty() {
            let mut tmp = [0u8; 4096];
            let n = self.s.read(&mut tmp).unwrap();
            assert!(n > 0, "connection closed");
            self.buf.extend_from_slice(&tmp[..n]);
        }
        self.buf.remove(0)
    }

    /// Sends `body` as a packet, checks the `+` and returns the reply (acknowledged).
    pub fn ask(&mut self, body: &str) -> String {
        self.send(&packet(body));
        assert_eq!(self.ack(), b'+', "no ack for {body}");
        let r = self.reply();
        self.send(b"+");
        r
    }

    /// Reads one packet (skipping acks) and checks its checksum; returns the body.
    pub fn reply(&mut self) -> String {
        while self.byte() != b'$' {}
        let mut body = Vec::new();
        loop {
            let b = self.byte();
            if b == b'#' {
                break;
            }
            body.push(b);
        }
        let cs = [self.byte(), self.byte()];
        let sum = body.iter().fold(0u8, |a, b| a.wrapping_add(*b));
        assert_eq!(
            u8::from_str_radix(std::str::from_utf8(&cs).unwrap(), 16).unwrap(),
            sum,
            "bad checksum from server"
        );
        // Undo run-length encoding (`X*n`: n - 29 more copies of X).
        let mut out = Vec::new();
        let mut i = 0;
        while i < body.len() {
            if body[i] == b'*' && i + 1 < body.len() && !out.is_empty() {
                let prev = *out.last().unwrap();
                out.extend(std::iter::repeat_n(prev, usize::from(body[i + 1] - 29)));
                i += 2;
            } else {
                out.push(body[i]);
                i += 1;
            }
        }
        // Undo the binary escape (`}` then byte ^ 0x20).
        let mut plain = Vec::new();
        let mut it = out.into_iter();
        while let Some(b) = it.next() {
            if b == b'}' {
                plain.push(it.next().expect("dangling escape") ^ 0x20);
            } else {
                plain.push(b);
            }
        }
        String::from_utf8_lossy(&plain).into_owned()
    }

    /// The next byte, expected to be an ack.
    pub fn ack(&mut self) -> u8 {
        self.byte()
    }
}
