//! Small, pure helpers for the GDB remote serial protocol (RSP), on both of its sides: the
//! server's packet handlers in front of gdbstub (`server::btrace`, `server::lldb_trace`,
//! `server::router`) and the QEMU backend's client of QEMU's gdbstub
//! (`capture::qemu::remote`).
//!
//! This is the one home of the protocol's byte-level rules: checksums and `$…#cs` framing
//! ([`checksum`], [`frame`], [`encode_packet`]), `}` escaping both ways ([`escape_binary`],
//! [`unescape`]), hex, number and thread-id parsing, `qXfer:…:read` requests and their chunked
//! `m`/`l` replies, and the error-reply conventions of GDB and LLDB. Handlers return
//! *unescaped* reply bodies; the server's router escapes and frames them with these helpers.

use std::fmt;

/// A malformed packet field. Carries what was wrong and the offending text, so the error
/// reply can say why the packet was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RspError {
    /// What was being parsed.
    pub what: &'static str,
    /// The offending text (lossily decoded, truncated to 64 bytes).
    pub text: String,
}

impl RspError {
    fn new(what: &'static str, text: &[u8]) -> Self {
        let cut = &text[..text.len().min(64)];
        RspError {
            what,
            text: String::from_utf8_lossy(cut).into_owned(),
        }
    }
}

impl fmt::Display for RspError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed {}: '{}'", self.what, self.text)
    }
}

impl std::error::Error for RspError {}

/// Lower-case hex encoding, two digits per byte (the `<raw>` element of GDB's btrace XML,
/// `qProcessInfo` triples, LLDB error strings).
pub fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// The value of one hex digit (either case).
pub fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes an even-length string of hex digit pairs.
pub fn hex_decode(text: &[u8]) -> Result<Vec<u8>, RspError> {
    if text.len() % 2 != 0 {
        return Err(RspError::new("hex string (odd length)", text));
    }
    text.chunks_exact(2)
        .map(|p| match (hex_digit(p[0]), hex_digit(p[1])) {
            (Some(h), Some(l)) => Ok(h << 4 | l),
            _ => Err(RspError::new("hex string", text)),
        })
        .collect()
}

/// Parses a hexadecimal number as GDB sends it: bare digits, or with a `0x`/`0X` prefix (GDB
/// formats `Qbtrace-conf:pt:size` with `0x%x`; gdbserver parses it with `strtoul(…, 16)`,
/// which accepts both). At most 16 digits; no sign, no whitespace.
pub fn parse_hex_u64(text: &[u8]) -> Result<u64, RspError> {
    let digits = text
        .strip_prefix(b"0x")
        .or_else(|| text.strip_prefix(b"0X"))
        .unwrap_or(text);
    if digits.is_empty() || digits.len() > 16 {
        return Err(RspError::new("hex number", text));
    }
    digits.iter().try_fold(0u64, |acc, &b| {
        hex_digit(b)
            .map(|d| acc << 4 | u64::from(d))
            .ok_or_else(|| RspError::new("hex number", text))
    })
}

/// A thread selection as written in `H`, `T` and `vCont` packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadSel {
    /// `0` (or `pPID.0`): any thread, the stub picks.
    Any,
    /// `-1` (or `pPID.-1`, `pPID`): all threads.
    All,
    /// One thread, optionally qualified by its process (`pPID.TID`).
    Thread {
        /// The process id, if the multiprocess syntax was used.
        pid: Option<u64>,
        /// The thread id.
        tid: u64,
    },
}

/// Parses a thread id: `TID`, `0`, `-1`, `pPID`, `pPID.TID`, `pPID.0`, `pPID.-1` (ids in hex).
pub fn parse_thread_id(text: &[u8]) -> Result<ThreadSel, RspError> {
    fn id(part: &[u8], whole: &[u8]) -> Result<Option<u64>, RspError> {
        // None = "-1" (all); Some(0) = any.
        if part == b"-1" {
            return Ok(None);
        }
        if part.starts_with(b"0x") || part.starts_with(b"0X") {
            return Err(RspError::new("thread id", whole));
        }
        parse_hex_u64(part)
            .map(Some)
            .map_err(|_| RspError::new("thread id", whole))
    }
    let sel = |t: Option<u64>, pid: Option<u64>| match t {
        None => ThreadSel::All,
        Some(0) => ThreadSel::Any,
        Some(tid) => ThreadSel::Thread { pid, tid },
    };
    match text.strip_prefix(b"p") {
        Some(rest) => {
            let (p, t) = match rest.iter().position(|&b| b == b'.') {
                Some(dot) => (&rest[..dot], Some(&rest[dot + 1..])),
                None => (rest, None),
            };
            let pid = id(p, text)?;
            match (pid, t) {
                // "p-1.x": all processes; only "all threads" makes sense there.
                (None, _) => Ok(ThreadSel::All),
                (Some(pid), None) => Ok(if pid == 0 {
                    ThreadSel::Any
                } else {
                    ThreadSel::All
                }),
                (Some(pid), Some(t)) => Ok(sel(id(t, text)?, Some(pid))),
            }
        }
        None => Ok(sel(id(text, text)?, None)),
    }
}

/// A parsed `qXfer:OBJECT:read:ANNEX:OFFSET,LENGTH` request (body already un-escaped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QxferRead<'a> {
    /// The object, e.g. `btrace`.
    pub object: &'a [u8],
    /// The annex (may be empty).
    pub annex: &'a [u8],
    /// Byte offset into the document.
    pub offset: u64,
    /// Maximum number of document bytes GDB wants in this reply.
    pub length: u64,
}

/// Parses `qXfer:OBJECT:read:ANNEX:OFFSET,LENGTH`. The annex is everything between `read:` and
/// the last `:` (annexes such as `libraries-svr4`'s may contain `;` and `=`).
pub fn parse_qxfer_read(packet: &[u8]) -> Result<QxferRead<'_>, RspError> {
    let bad = || RspError::new("qXfer read request", packet);
    let rest = packet.strip_prefix(b"qXfer:").ok_or_else(bad)?;
    let colon = rest.iter().position(|&b| b == b':').ok_or_else(bad)?;
    let object = &rest[..colon];
    let rest = rest[colon + 1..].strip_prefix(b"read:").ok_or_else(bad)?;
    let last = rest.iter().rposition(|&b| b == b':').ok_or_else(bad)?;
    let annex = &rest[..last];
    let range = &rest[last + 1..];
    let comma = range.iter().position(|&b| b == b',').ok_or_else(bad)?;
    if object.is_empty()
        || range[..comma].starts_with(b"0x")
        || range[comma + 1..].starts_with(b"0x")
    {
        return Err(bad());
    }
    let offset = parse_hex_u64(&range[..comma]).map_err(|_| bad())?;
    let length = parse_hex_u64(&range[comma + 1..]).map_err(|_| bad())?;
    Ok(QxferRead {
        object,
        annex,
        offset,
        length,
    })
}

/// The reply to a `qXfer` read of `doc` at `offset`, at most `length` document bytes:
/// `m<data>` if more data follows this chunk, `l<data>` if the chunk reaches the end (so
/// `l` alone at the end). This is gdbserver's rule (it asks its object for `length + 1` bytes
/// to tell the two apart). An offset past the end is an error: GDB never asks for one, and an
/// empty `l` there would hide a stale cache.
pub fn qxfer_chunk(doc: &[u8], offset: u64, length: u64) -> Result<Vec<u8>, RspError> {
    let start = usize::try_from(offset)
        .ok()
        .filter(|&s| s <= doc.len())
        .ok_or_else(|| RspError {
            what: "qXfer offset (past the end of the document)",
            text: format!("{offset:#x} > {:#x}", doc.len()),
        })?;
    let avail = doc.len() - start;
    let take = usize::try_from(length).map_or(avail, |l| l.min(avail));
    let mut out = Vec::with_capacity(take + 1);
    out.push(if take < avail { b'm' } else { b'l' });
    out.extend_from_slice(&doc[start..start + take]);
    Ok(out)
}

/// Escapes binary data for an RSP packet body: `#`, `$`, `}` and `*` become `}` followed by
/// the byte XOR 0x20. The router does this for handler replies; this standalone form is for
/// callers that frame packets themselves and for testing.
pub fn escape_binary(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + data.len() / 16);
    for &b in data {
        if matches!(b, b'#' | b'$' | b'}' | b'*') {
            out.push(b'}');
            out.push(b ^ 0x20);
        } else {
            out.push(b);
        }
    }
    out
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

/// The packet checksum: the sum of the (escaped) body bytes modulo 256.
pub fn checksum(escaped_body: &[u8]) -> u8 {
    escaped_body.iter().fold(0u8, |a, &b| a.wrapping_add(b))
}

/// Frames an already escaped body as `$body#cs`.
pub fn frame(escaped_body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(escaped_body.len() + 4);
    out.push(b'$');
    out.extend_from_slice(escaped_body);
    out.extend_from_slice(format!("#{:02x}", checksum(escaped_body)).as_bytes());
    out
}

/// Frames `body` as `$body#cs`, escaping `$ # } *`.
pub fn encode_packet(body: &[u8]) -> Vec<u8> {
    frame(&escape_binary(body))
}

/// A GDB error reply with text: `E.` followed by the message (the form gdbserver uses for
/// btrace errors; GDB prints the text after `E.`).
pub fn gdb_error(message: &str) -> Vec<u8> {
    let mut out = b"E.".to_vec();
    out.extend_from_slice(message.as_bytes());
    out
}

/// An LLDB error reply: `E` + two hex digits + `;` + the message hex-encoded. LLDB's client
/// (`StringExtractorGDBRemote::GetStatus`) reads the code and, after `;`, the hex message,
/// which it shows to the user; this is what lldb-server sends with error strings enabled.
pub fn lldb_error(code: u8, message: &str) -> Vec<u8> {
    format!("E{code:02x};{}", hex_encode(message.as_bytes())).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_roundtrip_and_errors() {
        assert_eq!(hex_encode(&[0x00, 0x7f, 0x80, 0xff]), "007f80ff");
        assert_eq!(
            hex_decode(b"007F80ff").unwrap(),
            vec![0x00, 0x7f, 0x80, 0xff]
        );
        assert!(hex_decode(b"abc").is_err());
        assert!(hex_decode(b"zz").is_err());
        assert_eq!(hex_decode(b"").unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn hex_numbers() {
        assert_eq!(parse_hex_u64(b"4000").unwrap(), 0x4000);
        assert_eq!(parse_hex_u64(b"0x4000").unwrap(), 0x4000);
        assert_eq!(parse_hex_u64(b"ffffffffffffffff").unwrap(), u64::MAX);
        for bad in [&b""[..], b"0x", b"-1", b" 1", b"12g", b"10000000000000000"] {
            assert!(
                parse_hex_u64(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn thread_ids() {
        use ThreadSel::*;
        assert_eq!(parse_thread_id(b"0").unwrap(), Any);
        assert_eq!(parse_thread_id(b"-1").unwrap(), All);
        assert_eq!(
            parse_thread_id(b"1a2b").unwrap(),
            Thread {
                pid: None,
                tid: 0x1a2b
            }
        );
        assert_eq!(
            parse_thread_id(b"p10.11").unwrap(),
            Thread {
                pid: Some(0x10),
                tid: 0x11
            }
        );
        assert_eq!(parse_thread_id(b"p10.0").unwrap(), Any);
        assert_eq!(parse_thread_id(b"p10.-1").unwrap(), All);
        assert_eq!(parse_thread_id(b"p10").unwrap(), All);
        assert_eq!(parse_thread_id(b"p-1").unwrap(), All);
        for bad in [
            &b""[..],
            b"p",
            b"p.1",
            b"px.1",
            b"1.2",
            b"0x10",
            b"p1.",
            b"--1",
        ] {
            assert!(
                parse_thread_id(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn qxfer_parsing() {
        let r = parse_qxfer_read(b"qXfer:btrace:read:all:0,3fb").unwrap();
        assert_eq!(
            (r.object, r.annex, r.offset, r.length),
            (&b"btrace"[..], &b"all"[..], 0, 0x3fb)
        );
        let r = parse_qxfer_read(b"qXfer:btrace-conf:read::1f,ff").unwrap();
        assert_eq!(
            (r.object, r.annex, r.offset, r.length),
            (&b"btrace-conf"[..], &b""[..], 0x1f, 0xff)
        );
        let r = parse_qxfer_read(b"qXfer:libraries-svr4:read:start=1;prev=2:0,10").unwrap();
        assert_eq!(r.annex, b"start=1;prev=2");
        for bad in [
            &b"qXfer:btrace:read:all:0"[..],
            b"qXfer:btrace:read:all",
            b"qXfer:btrace:write:all:0,10",
            b"qXfer::read:all:0,10",
            b"qXfer:btrace:read:all:,10",
            b"qXfer:btrace:read:all:0,",
            b"qXfer:btrace:read:all:0x0,10",
            b"qXfer:btrace:read:all:zz,10",
            b"qXfer:btrace:read:all:0,11111111111111111",
            b"qXfer",
            b"",
        ] {
            assert!(
                parse_qxfer_read(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn qxfer_chunks_follow_gdbserver() {
        let doc = b"0123456789";
        assert_eq!(qxfer_chunk(doc, 0, 4).unwrap(), b"m0123");
        assert_eq!(qxfer_chunk(doc, 4, 4).unwrap(), b"m4567");
        // A chunk that reaches the end exactly is already the last one.
        assert_eq!(qxfer_chunk(doc, 8, 2).unwrap(), b"l89");
        assert_eq!(qxfer_chunk(doc, 8, 100).unwrap(), b"l89");
        assert_eq!(qxfer_chunk(doc, 10, 4).unwrap(), b"l");
        assert_eq!(qxfer_chunk(doc, 0, 0).unwrap(), b"m");
        assert!(qxfer_chunk(doc, 11, 4).is_err());
        assert!(qxfer_chunk(doc, u64::MAX, u64::MAX).is_err());
        assert_eq!(qxfer_chunk(doc, 0, u64::MAX).unwrap(), b"l0123456789");
        // Reassembling chunks of every size gives the document back.
        for len in 1..12u64 {
            let mut got = Vec::new();
            let mut off = 0u64;
            loop {
                let r = qxfer_chunk(doc, off, len).unwrap();
                got.extend_from_slice(&r[1..]);
                off += (r.len() - 1) as u64;
                if r[0] == b'l' {
                    break;
                }
            }
            assert_eq!(got, doc);
        }
    }

    #[test]
    fn escaping_roundtrips_through_the_router() {
        let all: Vec<u8> = (0..=255u8).collect();
        let esc = escape_binary(&all);
        assert!(!esc.iter().any(|&b| matches!(b, b'#' | b'$' | b'*')));
        assert_eq!(esc.len(), 256 + 4);
        assert_eq!(unescape(&esc), all);
        assert_eq!(escape_binary(b"a}b"), b"a}]b");
        assert_eq!(escape_binary(b"#$*"), b"}\x03}\x04}\x0a");
    }

    #[test]
    fn error_replies() {
        assert_eq!(gdb_error("Btrace not enabled."), b"E.Btrace not enabled.");
        assert_eq!(lldb_error(1, "no"), b"E01;6e6f");
        assert_eq!(lldb_error(0xff, ""), b"Eff;");
    }
}
