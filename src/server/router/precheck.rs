//! Pre-checks: what the router answers itself before gdbstub sees a packet. gdbstub picks a
//! command by name prefix and treats an argument it cannot parse as the end of the session
//! (and ends it on some well-formed but unexpected requests too); a packet that would do so is
//! answered here with a [`Refusal`] instead. Each rule names the fuzz finding or gdbstub
//! behaviour it stands for; `fuzz/fuzz_targets/rsp.rs` runs them against gdbstub itself.

use super::super::GdbStubAdapter;

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

/// One part of a thread id as gdbstub parses it: `-1` (all), `0` (any) or a non-zero id.
fn is_id_part(s: &[u8]) -> bool {
    s == b"-1" || s == b"0" || is_nonzero_id(s)
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

/// A hex number of at most `bits` bits (gdbstub's `decode_hex` into that type).
fn is_hex_of(s: &[u8], bits: u32) -> bool {
    let digits = s.iter().skip_while(|&&b| b == b'0').count();
    is_hex(s)
        && (digits < (bits / 4) as usize
            || (digits == (bits / 4) as usize
                && u64::from_str_radix(std::str::from_utf8(s).unwrap_or("x"), 16)
                    .is_ok_and(|v| bits >= 64 || v >> bits == 0)))
}

/// Host I/O (`vFile:NAME:ARGS`, see `server::host_io`): gdbstub parses these arguments
/// fatally. `pwrite` is never valid (every file we open is read-only) and is answered as
/// unsupported without reaching gdbstub.
fn check_vfile(rest: &[u8]) -> Check {
    let ok = |good: bool| {
        if good {
            Ok(())
        } else {
            Err(Refusal::Malformed)
        }
    };
    // gdbstub's `HostIoOpenFlags` / `HostIoOpenMode` refuse unknown bits.
    const OPEN_FLAGS: u64 = 0xF000_0E0B;
    const OPEN_MODE: u64 = 0o140_777;
    let bits_in = |s: &[u8], known: u64| {
        is_hex_of(s, 32)
            && u64::from_str_radix(std::str::from_utf8(s).unwrap_or("x"), 16)
                .is_ok_and(|v| v & !known == 0)
    };
    let Some((name, args)) = split2(rest, b':') else {
        return Err(Refusal::Unsupported);
    };
    let fields: Vec<&[u8]> = args.splitn(3, |&b| b == b',').collect();
    match name {
        b"open" => ok(fields.len() == 3
            && is_even_hex(fields[0])
            && bits_in(fields[1], OPEN_FLAGS)
            && bits_in(fields[2], OPEN_MODE)),
        b"close" | b"fstat" => ok(is_hex_of(args, 32)),
        b"pread" => ok(fields.len() == 3
            && is_hex_of(fields[0], 32)
            && is_hex_of(fields[1], 64)
            && is_hex_of(fields[2], 64)),
        b"unlink" | b"readlink" => ok(is_even_hex(args)),
        b"setfs" => ok(is_hex_of(args, 64)),
        _ => Err(Refusal::Unsupported),
    }
}

fn split2(s: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|&b| b == sep)?;
    Some((&s[..i], &s[i + 1..]))
}

/// Why the router answers a packet itself instead of handing it to gdbstub.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not a packet gdbstub knows, although it starts like one (e.g. `qCRC:` vs `qC`):
    /// answered with the empty "unsupported" reply.
    #[error("not a packet the server knows")]
    Unsupported,
    /// A known packet with malformed arguments: `E01`.
    #[error("malformed arguments")]
    Malformed,
    /// A well-formed resume or thread selection naming a thread the session does not have:
    /// `E01`.
    #[error("no such thread")]
    NoSuchThread,
    /// A resume with a signal Linux does not have: `E16` (`EINVAL`... as GDB numbers it).
    #[error("no such signal")]
    BadSignal,
}

impl Refusal {
    /// The reply body sent instead of gdbstub's.
    pub fn reply(self) -> &'static [u8] {
        match self {
            Refusal::Unsupported => b"",
            Refusal::Malformed | Refusal::NoSuchThread => b"E01",
            Refusal::BadSignal => b"E16",
        }
    }
}

/// What a pre-check decided: `Ok` hands the packet to gdbstub.
pub type Check = Result<(), Refusal>;

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
    let ok = |good: bool| {
        if good {
            Ok(())
        } else {
            Err(Refusal::Malformed)
        }
    };
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
                Err(Refusal::Unsupported)
            } else if name == b"bs" && resume_all {
                Err(Refusal::Malformed)
            } else {
                Ok(())
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
                None => Err(Refusal::Malformed),
                Some(_) => Err(Refusal::Unsupported),
            };
        }
    }
    if let Some(rest) = body.strip_prefix(b"QEnvironmentReset") {
        return if rest.is_empty() {
            Ok(())
        } else {
            Err(Refusal::Unsupported)
        };
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
                None => Err(Refusal::Malformed),
                Some(_) => Err(Refusal::Unsupported),
            };
        }
    }
    if let Some(rest) = body.strip_prefix(b"qSupported") {
        // gdbstub needs `:` and no empty feature (see `normalize_qsupported`).
        return match rest.split_first() {
            Some((b':', features)) => ok(features.split(|&b| b == b';').all(|f| !f.is_empty())),
            None => Err(Refusal::Malformed),
            Some(_) => Err(Refusal::Unsupported),
        };
    }
    if let Some(rest) = body.strip_prefix(b"qAttached") {
        return match rest.split_first() {
            None => Ok(()),
            Some((b':', pid)) => ok(is_nonzero_id(pid)),
            Some(_) => Err(Refusal::Unsupported),
        };
    }
    if let Some(rest) = body.strip_prefix(b"qRcmd") {
        return match rest.split_first() {
            Some((b',', hex)) => ok(is_even_hex(hex)),
            _ => Err(Refusal::Unsupported),
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
        return checked.map_or(Ok(()), ok);
    }
    if let Some(rest) = body.strip_prefix(b"vFile:") {
        return check_vfile(rest);
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
            return Ok(());
        }
        let Some(actions) = rest.strip_prefix(b";") else {
            return Err(Refusal::Malformed);
        };
        return ok(actions.split(|&b| b == b';').all(|action| {
            // `act:` with an empty thread is malformed (found by `fuzz/fuzz_targets/rsp.rs`:
            // `vCont;c:` ended the session); no `:` at all means every thread.
            let (act, tid, has_tid) = match split2(action, b':') {
                Some((act, tid)) => (act, tid, true),
                None => (action, &b""[..], false),
            };
            // No `t` (stop); a step and a range step (`rSTART,END`) need one thread.
            let (act_ok, needs_one_thread) = match act.first() {
                Some(b'c') => (act.len() == 1, false),
                Some(b's') => (act.len() == 1, true),
                Some(b'r') => (
                    split2(&act[1..], b',').is_some_and(|(a, b)| is_addr(a) && is_addr(b)),
                    true,
                ),
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
        return Ok(());
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
            // (`p<pid>.0` needs a valid pid — `-1`, `0` or a non-zero id, nothing else: found
            // by `fuzz/fuzz_targets/rsp.rs`, `Hgp0Hg….0` and then `Hgpp0.0` ended the
            // session.)
            Some((b'g', tid)) => {
                thread_kind(tid) == Some(true)
                    || tid == b"0"
                    || tid
                        .strip_prefix(b"p")
                        .and_then(|r| r.strip_suffix(b".0"))
                        .is_some_and(is_id_part)
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
        _ => Ok(()),
    }
}

/// The thread ids of the session (gdbstub's view: `list_active_threads`).
fn session_threads(session: &mut GdbStubAdapter) -> Vec<usize> {
    use gdbstub::target::ext::base::multithread::MultiThreadBase as _;
    let mut tids = Vec::new();
    let _ = session.list_active_threads(&mut |t| tids.push(t.get()));
    tids
}

/// Whether a specific thread id (`<tid>` or `p<pid>.<tid>`, hex, as [`thread_kind`] accepts
/// with `Some(true)`) names a thread of the session.
fn thread_exists(session: &mut GdbStubAdapter, id: &[u8]) -> bool {
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
        .is_some_and(|sig| sig == 0 || super::super::gdb_to_linux_signal(sig).is_some())
}

/// The error reply for a well-formed resume or thread selection that names a thread the
/// session does not have, or a signal Linux does not have (gdbstub would pass the thread id
/// to a target that ignores it and drop the signal: the program would resume as if asked
/// correctly). Checked after [`check_packet`].
pub(super) fn check_threads_and_signals(session: &mut GdbStubAdapter, body: &[u8]) -> Check {
    if let Some(actions) = body.strip_prefix(b"vCont;") {
        for action in actions.split(|&b| b == b';') {
            let (act, tid) = split2(action, b':').unwrap_or((action, b""));
            if matches!(act.first(), Some(b'C' | b'S')) && !signal_ok(&act[1..]) {
                return Err(Refusal::BadSignal);
            }
            if thread_kind(tid) == Some(true) && !thread_exists(session, tid) {
                return Err(Refusal::NoSuchThread);
            }
        }
        return Ok(());
    }
    match body.split_first() {
        Some((b'C' | b'S', rest)) => {
            let sig = split2(rest, b';').map_or(rest, |(sig, _)| sig);
            if signal_ok(sig) {
                Ok(())
            } else {
                Err(Refusal::BadSignal)
            }
        }
        Some((b'H', rest)) if rest.len() > 1 => {
            let tid = &rest[1..];
            if thread_kind(tid) == Some(true) && !thread_exists(session, tid) {
                Err(Refusal::NoSuchThread)
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

/// Whether the last `Hc` (`continue_thread`) selected every thread: a step then is one
/// gdbstub refuses fatally (`s`/`bs` after `Hc-1`).
pub(super) fn resume_all_selected(continue_thread: &str) -> bool {
    thread_kind(continue_thread.as_bytes()) == Some(false)
        && continue_thread != "0"
        && !continue_thread.ends_with(".0")
}

#[cfg(test)]
mod tests {
    use super::*;

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
                Err(Refusal::Unsupported),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn steps_of_all_threads_are_refused() {
        assert_eq!(check_packet(b"s", true), Err(Refusal::Malformed));
        assert_eq!(check_packet(b"S05", true), Err(Refusal::Malformed));
        assert_eq!(check_packet(b"bs", true), Err(Refusal::Malformed));
        assert_eq!(check_packet(b"c", true), Ok(()));
        assert_eq!(check_packet(b"s", false), Ok(()));
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
            assert_eq!(check_packet(&normalize_qsupported(b), false), Ok(()));
        }
    }

    #[test]
    fn host_io_packets_are_checked() {
        for (body, want) in [
            (&b"vFile:open:2f70726f63,0,0"[..], Ok(())),
            (b"vFile:open:2f70726f63,0,1c0", Ok(())),
            (b"vFile:open:2f70726f6,0,0", Err(Refusal::Malformed)),
            (b"vFile:open:2f70726f63,4,0", Err(Refusal::Malformed)),
            (b"vFile:open:2f70726f63,0", Err(Refusal::Malformed)),
            (
                b"vFile:open:2f70726f63,100000000,0",
                Err(Refusal::Malformed),
            ),
            (b"vFile:open:2f70726f63,0,200000", Err(Refusal::Malformed)),
            (b"vFile:pread:0,3fff,0", Ok(())),
            (b"vFile:pread:0,3fff", Err(Refusal::Malformed)),
            (b"vFile:pread:100000000,1,0", Err(Refusal::Malformed)),
            (
                b"vFile:pread:0,1,10000000000000000",
                Err(Refusal::Malformed),
            ),
            (b"vFile:pread:0,1,ffffffffffffffff", Ok(())),
            (b"vFile:close:0", Ok(())),
            (b"vFile:close:", Err(Refusal::Malformed)),
            (b"vFile:fstat:ffffffff", Ok(())),
            (b"vFile:fstat:zz", Err(Refusal::Malformed)),
            (b"vFile:setfs:0", Ok(())),
            (b"vFile:readlink:2f7", Err(Refusal::Malformed)),
            (b"vFile:readlink:2f70", Ok(())),
            (b"vFile:unlink:2f70", Ok(())),
            (b"vFile:pwrite:0,0,abc", Err(Refusal::Unsupported)),
            (b"vFile:openx:2f70,0,0", Err(Refusal::Unsupported)),
            (b"vFile:open", Err(Refusal::Unsupported)),
            (b"vFile:", Err(Refusal::Unsupported)),
        ] {
            assert_eq!(check_packet(body, false), want, "{body:?}");
        }
    }

    /// Found by the long `rsp` fuzzing run (docs/fuzzing.md): gdbstub's vCont parser rejects
    /// pid 0 with "any thread", fatally.
    #[test]
    fn vcont_any_thread_of_any_process_is_refused() {
        for body in [&b"vCont;c:p0"[..], b"vCont;c:p0.0", b"vCont;C05:p0"] {
            assert_eq!(
                check_packet(body, false),
                Err(Refusal::Malformed),
                "{body:?}"
            );
        }
        for body in [
            &b"vCont;c:p0.1"[..],
            b"vCont;c:p1092",
            b"vCont;c:p1092.0",
            b"vCont;c:0",
        ] {
            assert_eq!(check_packet(body, false), Ok(()), "{body:?}");
        }
    }

    /// gdbstub's thread-id parser (`ThreadId::try_from`, `IdKind::try_from` in gdbstub 0.7,
    /// `protocol/common/thread_id.rs`), as a model: `p<pid>[.<tid>[.ignored…]]` or `<tid>`,
    /// each part `-1`, `0` or a non-zero hex number fitting a `usize`. `Some((pid, tid))` with
    /// 0 = any, -1 = all.
    fn gdbstub_thread_id(s: &[u8]) -> Option<(Option<i64>, i64)> {
        fn part(p: &[u8]) -> Option<i64> {
            match p {
                b"-1" => Some(-1),
                b"0" => Some(0),
                _ => {
                    let hex = std::str::from_utf8(p).ok()?;
                    if hex.is_empty()
                        || !hex
                            .bytes()
                            .all(|b| b.is_ascii_hexdigit() || b == b'x' || b == b'X')
                    {
                        return None;
                    }
                    let v = u64::from_str_radix(&hex.replace(['x', 'X'], "0"), 16).ok()?;
                    (v != 0).then_some(1)
                }
            }
        }
        match s.strip_prefix(b"p") {
            Some(rest) => {
                let mut it = rest.split(|&b| b == b'.');
                let pid = part(it.next()?)?;
                let tid = match it.next() {
                    Some(t) => part(t)?,
                    None => -1,
                };
                Some((Some(pid), tid))
            }
            None => Some((None, part(s)?)),
        }
    }

    /// Every thread id of up to 5 characters over `p . - 0 1 x`, after `Hg`, `Hc` and `T`:
    /// whatever the pre-check hands to gdbstub, gdbstub's parser reads, and `Hg`/`T` name
    /// one thread or "any" (`Hg` with "all" ends a gdbstub session). `Hgpp0.0` (the fuzz
    /// finding) is among them.
    #[test]
    fn thread_ids_passed_on_are_ones_gdbstub_parses() {
        let alphabet = b"p.-01x";
        let mut ids: Vec<Vec<u8>> = vec![Vec::new()];
        let mut all = Vec::new();
        for _ in 0..5 {
            ids = ids
                .iter()
                .flat_map(|id| {
                    alphabet.iter().map(move |&c| {
                        let mut n = id.clone();
                        n.push(c);
                        n
                    })
                })
                .collect();
            all.extend(ids.iter().cloned());
        }
        assert_eq!(check_packet(b"Hgpp0.0", false), Err(Refusal::Malformed));
        let mut passed = 0;
        for id in &all {
            for cmd in [&b"Hg"[..], b"Hc", b"T"] {
                let body = [cmd, id.as_slice()].concat();
                if check_packet(&body, false).is_err() {
                    continue;
                }
                passed += 1;
                let parsed = gdbstub_thread_id(id);
                let text = String::from_utf8_lossy(&body);
                let (_, tid) = parsed.unwrap_or_else(|| panic!("{text}: gdbstub cannot parse it"));
                if cmd != b"Hc" {
                    assert_ne!(tid, -1, "{text}: all threads");
                }
            }
        }
        assert!(passed > 50, "{passed}");
    }

    /// Found by `fuzz/fuzz_targets/rsp.rs`: gdbstub ends the session on an extended-mode
    /// setting it cannot parse (`QStartupWithShellqXfer:…`); the router must answer instead.
    #[test]
    fn fuzz_found_packets_never_reach_gdbstub_malformed() {
        for (body, want) in [
            (&b"QStartupWithShell:1"[..], Ok(())),
            (b"QStartupWithShell:0", Ok(())),
            (b"QDisableRandomization:1", Ok(())),
            (b"QEnvironmentReset", Ok(())),
            (b"QEnvironmentHexEncoded:413d31", Ok(())),
            (b"QEnvironmentUnset:41", Ok(())),
            (b"QSetWorkingDir:", Ok(())),
            (b"QSetWorkingDir:2f746d70", Ok(())),
            (
                b"QStartupWithShellqXfer:QStartupWithShell:10,fff",
                Err(Refusal::Unsupported),
            ),
            (b"QStartupWithShell:2", Err(Refusal::Malformed)),
            (b"QStartupWithShell", Err(Refusal::Malformed)),
            (b"QDisableRandomization:", Err(Refusal::Malformed)),
            (b"QEnvironmentResetX", Err(Refusal::Unsupported)),
            (b"QEnvironmentHexEncoded:4131", Err(Refusal::Malformed)),
            (b"QEnvironmentHexEncoded:413", Err(Refusal::Malformed)),
            (b"QEnvironmentHexEncoded", Err(Refusal::Malformed)),
            (b"QEnvironmentUnset:zz", Err(Refusal::Malformed)),
            (b"QSetWorkingDir:2", Err(Refusal::Malformed)),
            (b"QSetWorkingDirX", Err(Refusal::Unsupported)),
            (b"Hgp0.0", Ok(())),
            (b"Hgp1a.0", Ok(())),
            (b"Hgp0Hg`\xf6.0", Err(Refusal::Malformed)),
            (b"Hgx.0", Err(Refusal::Malformed)),
            (b"Hgp1.2.0", Err(Refusal::Malformed)),
            (b"vCont;c:", Err(Refusal::Malformed)),
            (b"vCont;c:p1.1;s:", Err(Refusal::Malformed)),
            (b"vCont;c", Ok(())),
            (b"vCont;c:p1.-1", Ok(())),
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
            b"vCont;r401000,401010:p1.1;c:p1.-1",
            b"vCont;C0b:1",
            b"vCont?",
            b"qRcmd,68656c70",
            b"qXfer:features:read:target.xml:0,ffb",
            b"qSupported:multiprocess+",
            b"?",
        ] {
            assert_eq!(
                check_packet(good, false),
                Ok(()),
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
            b"vCont;r1,2",
            b"vCont;r1,2:-1",
            b"vCont;r1:1",
            b"vCont;r1,:1",
            b"vCont;rx,2:1",
            b"vCont;r1,11111111111111111:1",
        ] {
            assert_eq!(
                check_packet(bad, false),
                Err(Refusal::Malformed),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
