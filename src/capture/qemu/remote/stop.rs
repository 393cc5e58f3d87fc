//! Thread ids and stop replies as a stub sends them (`T`, `S`, `W`, `X`, `O`).

use std::fmt;

use super::RemoteError;
use super::wire::{hex_decode, lossy, parse_hex_u64};

/// A thread as the protocol names it: `[p<pid>.]<tid>`, where `-1` means all and `0` any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadId {
    /// The process (`p<pid>.` with the multiprocess extension), if given.
    pub pid: Option<i64>,
    /// The thread: QEMU user mode uses the guest's (= host's) TID.
    pub tid: i64,
}

impl ThreadId {
    /// Every thread (`-1`).
    pub const ALL: ThreadId = ThreadId { pid: None, tid: -1 };
    /// Any thread (`0`).
    pub const ANY: ThreadId = ThreadId { pid: None, tid: 0 };

    /// A thread without a process part.
    pub fn new(tid: i64) -> Self {
        ThreadId { pid: None, tid }
    }

    /// Parses `p1.361e`, `361e`, `-1`, `p1.-1`.
    pub fn parse(text: &[u8]) -> Result<Self, RemoteError> {
        fn num(t: &[u8]) -> Result<i64, RemoteError> {
            if t == b"-1" {
                return Ok(-1);
            }
            let v = parse_hex_u64(t, "thread id")?;
            i64::try_from(v).map_err(|_| RemoteError::Malformed {
                what: "thread id",
                text: lossy(t),
            })
        }
        match text.strip_prefix(b"p") {
            Some(rest) => match rest.iter().position(|&b| b == b'.') {
                Some(dot) => Ok(ThreadId {
                    pid: Some(num(&rest[..dot])?),
                    tid: num(&rest[dot + 1..])?,
                }),
                // `p<pid>` alone means every thread of that process.
                None => Ok(ThreadId {
                    pid: Some(num(rest)?),
                    tid: -1,
                }),
            },
            None => Ok(ThreadId::new(num(text)?)),
        }
    }

    /// The protocol text: `p<pid>.<tid>` when `multiprocess` and a pid is known, else `<tid>`.
    pub fn encode(&self, multiprocess: bool) -> String {
        fn part(v: i64) -> String {
            if v < 0 {
                "-1".to_string()
            } else {
                format!("{v:x}")
            }
        }
        match (multiprocess, self.pid) {
            (true, Some(pid)) => format!("p{}.{}", part(pid), part(self.tid)),
            _ => part(self.tid),
        }
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "p{pid}.{}", self.tid),
            None => write!(f, "{}", self.tid),
        }
    }
}

/// Why a thread stopped with a signal, from the stop reply's `reason:` fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// No reason field: a signal, a single step, or a breakpoint from a stub that does not
    /// say `swbreak` (QEMU 7.2 does not).
    Signal,
    /// `swbreak:` — a software breakpoint, PC at the breakpoint.
    SwBreak,
    /// `hwbreak:` — a hardware breakpoint.
    HwBreak,
    /// `watch:`/`rwatch:`/`awatch:` with the data address.
    Watch {
        /// Which kind (`watch`, `rwatch`, `awatch`).
        kind: WatchKind,
        /// The address accessed.
        addr: u64,
    },
    /// `library:`, `replaylog:`, `fork:`… — named, not acted upon here.
    Other(String),
}

/// The access a watchpoint reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchKind {
    /// Write (`watch`, Z2).
    Write,
    /// Read (`rwatch`, Z3).
    Read,
    /// Any access (`awatch`, Z4).
    Access,
}

/// A stop reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReply {
    /// `S sig` / `T sig …`: a thread stopped with GDB signal number `signal`.
    Signal {
        /// GDB's signal number (5 = SIGTRAP, 11 = SIGSEGV, 2 = SIGINT).
        signal: u8,
        /// The thread (`thread:` field), when given.
        thread: Option<ThreadId>,
        /// The `reason` field.
        reason: StopReason,
        /// Expedited registers `(regnum, raw bytes)`.
        registers: Vec<(u32, Vec<u8>)>,
    },
    /// `W status[;process:pid]`: the process exited normally.
    Exited {
        /// Exit status (low 8 bits).
        status: u8,
        /// The process, if given.
        pid: Option<i64>,
    },
    /// `X sig[;process:pid]`: the process was terminated by a signal.
    Terminated {
        /// GDB's signal number.
        signal: u8,
        /// The process, if given.
        pid: Option<i64>,
    },
}

impl StopReply {
    /// Whether `body` is shaped like a stop reply (`T`/`S`/`W`/`X` followed by two hex digits;
    /// replies to other requests — hex, `OK`, `Enn`, `m…`/`l…` — never are).
    pub fn looks_like(body: &[u8]) -> bool {
        match body {
            [b'S', a, b] => a.is_ascii_hexdigit() && b.is_ascii_hexdigit(),
            [b'T' | b'W' | b'X', a, b, rest @ ..] => {
                a.is_ascii_hexdigit()
                    && b.is_ascii_hexdigit()
                    && (rest.is_empty() || rest.contains(&b':') || rest.first() == Some(&b';'))
            }
            _ => false,
        }
    }

    /// Parses a stop reply body.
    pub fn parse(body: &[u8]) -> Result<Self, RemoteError> {
        let bad = |what| RemoteError::Malformed {
            what,
            text: lossy(body),
        };
        let (&kind, rest) = body.split_first().ok_or_else(|| bad("empty stop reply"))?;
        let code = rest.get(..2).ok_or_else(|| bad("stop reply code"))?;
        let code = u8::try_from(parse_hex_u64(code, "stop reply code")?)
            .map_err(|_| bad("stop reply code"))?;
        let fields = &rest[2..];
        let process = || -> Result<Option<i64>, RemoteError> {
            for f in fields.split(|&b| b == b';') {
                if let Some(p) = f.strip_prefix(b"process:") {
                    return Ok(Some(
                        i64::try_from(parse_hex_u64(p, "process id")?)
                            .map_err(|_| bad("process id"))?,
                    ));
                }
            }
            Ok(None)
        };
        match kind {
            b'S' => Ok(StopReply::Signal {
                signal: code,
                thread: None,
                reason: StopReason::Signal,
                registers: Vec::new(),
            }),
            b'W' => Ok(StopReply::Exited {
                status: code,
                pid: process()?,
            }),
            b'X' => Ok(StopReply::Terminated {
                signal: code,
                pid: process()?,
            }),
            b'T' => {
                let mut thread = None;
                let mut reason = StopReason::Signal;
                let mut registers = Vec::new();
                for f in fields.split(|&b| b == b';').filter(|f| !f.is_empty()) {
                    let colon = f
                        .iter()
                        .position(|&b| b == b':')
                        .ok_or_else(|| bad("stop reply field without ':'"))?;
                    let (name, value) = (&f[..colon], &f[colon + 1..]);
                    match name {
                        b"thread" => thread = Some(ThreadId::parse(value)?),
                        b"swbreak" => reason = StopReason::SwBreak,
                        b"hwbreak" => reason = StopReason::HwBreak,
                        b"watch" | b"rwatch" | b"awatch" => {
                            let kind = match name {
                                b"watch" => WatchKind::Write,
                                b"rwatch" => WatchKind::Read,
                                _ => WatchKind::Access,
                            };
                            reason = StopReason::Watch {
                                kind,
                                addr: parse_hex_u64(value, "watchpoint address")?,
                            };
                        }
                        n if !n.is_empty() && n.iter().all(u8::is_ascii_hexdigit) => {
                            let regnum = u32::try_from(parse_hex_u64(n, "register number")?)
                                .map_err(|_| bad("register number"))?;
                            registers.push((regnum, hex_decode(value, "register value")?));
                        }
                        // `core:`, `library:`, `fork:` …: the reason text is kept for the
                        // ones that change why the thread stopped; `core` does not.
                        b"core" => {}
                        n => reason = StopReason::Other(lossy(n)),
                    }
                }
                Ok(StopReply::Signal {
                    signal: code,
                    thread,
                    reason,
                    registers,
                })
            }
            _ => Err(bad("stop reply kind")),
        }
    }

    /// The stopped thread, for a signal stop that names it.
    pub fn thread(&self) -> Option<ThreadId> {
        match self {
            StopReply::Signal { thread, .. } => *thread,
            _ => None,
        }
    }

    /// Whether the process is gone (exited or terminated).
    pub fn is_exit(&self) -> bool {
        matches!(
            self,
            StopReply::Exited { .. } | StopReply::Terminated { .. }
        )
    }
}

/// GDB's signal numbers for the ones a debugger session meets (`gdb/signals.def`; the common
/// ones equal Linux's, the rest do not — SIGUSR1 is 30, SIGCHLD 20 — so stops are compared
/// with these, never with `libc` values).
pub mod gdb_signal {
    /// SIGHUP.
    pub const HUP: u8 = 1;
    /// SIGINT (an interrupt).
    pub const INT: u8 = 2;
    /// SIGQUIT.
    pub const QUIT: u8 = 3;
    /// SIGILL.
    pub const ILL: u8 = 4;
    /// SIGTRAP (breakpoint, single step).
    pub const TRAP: u8 = 5;
    /// SIGABRT.
    pub const ABRT: u8 = 6;
    /// SIGFPE.
    pub const FPE: u8 = 8;
    /// SIGKILL.
    pub const KILL: u8 = 9;
    /// SIGBUS.
    pub const BUS: u8 = 10;
    /// SIGSEGV.
    pub const SEGV: u8 = 11;
    /// SIGTERM.
    pub const TERM: u8 = 15;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_ids() {
        let t = ThreadId::parse(b"p01.361e").unwrap();
        assert_eq!(
            t,
            ThreadId {
                pid: Some(1),
                tid: 0x361e
            }
        );
        assert_eq!(t.encode(true), "p1.361e");
        assert_eq!(t.encode(false), "361e");
        assert_eq!(ThreadId::parse(b"-1").unwrap(), ThreadId::ALL);
        assert_eq!(ThreadId::parse(b"p1.-1").unwrap().tid, -1);
        assert_eq!(ThreadId::parse(b"p5").unwrap().tid, -1);
        assert_eq!(ThreadId::ALL.encode(true), "-1");
        assert!(ThreadId::parse(b"pzz.1").is_err());
        assert!(ThreadId::parse(b"").is_err());
        assert!(ThreadId::parse(b"ffffffffffffffff").is_err());
    }

    #[test]
    fn stop_replies() {
        assert_eq!(
            StopReply::parse(b"T05thread:p01.3958;").unwrap(),
            StopReply::Signal {
                signal: 5,
                thread: Some(ThreadId {
                    pid: Some(1),
                    tid: 0x3958
                }),
                reason: StopReason::Signal,
                registers: vec![],
            }
        );
        let r = StopReply::parse(b"T0b06:0011223344556677;thread:2a;core:1;swbreak:;").unwrap();
        let StopReply::Signal {
            signal,
            thread,
            reason,
            registers,
        } = r
        else {
            panic!()
        };
        assert_eq!(
            (signal, thread, reason),
            (11, Some(ThreadId::new(42)), StopReason::SwBreak)
        );
        assert_eq!(
            registers,
            vec![(6, vec![0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77])]
        );
        assert_eq!(
            StopReply::parse(b"T05watch:601040;thread:1;").unwrap(),
            StopReply::Signal {
                signal: 5,
                thread: Some(ThreadId::new(1)),
                reason: StopReason::Watch {
                    kind: WatchKind::Write,
                    addr: 0x601040
                },
                registers: vec![],
            }
        );
        assert_eq!(
            StopReply::parse(b"W03").unwrap(),
            StopReply::Exited {
                status: 3,
                pid: None
            }
        );
        assert_eq!(
            StopReply::parse(b"X09;process:1f").unwrap(),
            StopReply::Terminated {
                signal: 9,
                pid: Some(31)
            }
        );
        assert!(matches!(
            StopReply::parse(b"S02").unwrap(),
            StopReply::Signal { signal: 2, .. }
        ));
        for bad in [
            &b""[..],
            b"T",
            b"T5",
            b"Tzz",
            b"Q05",
            b"T05thread",
            b"T05thread:zz;",
        ] {
            assert!(StopReply::parse(bad).is_err(), "{:?}", lossy(bad));
        }
    }

    #[test]
    fn shape_test_separates_stop_replies_from_other_replies() {
        for s in [
            &b"T05thread:p01.1;"[..],
            b"S05",
            b"W00",
            b"X0b",
            b"W03;process:1",
        ] {
            assert!(StopReply::looks_like(s), "{}", lossy(s));
        }
        for s in [
            &b"OK"[..],
            b"E14",
            b"",
            b"00ff",
            b"mp01.1",
            b"l",
            b"Sx5",
            b"S055",
        ] {
            assert!(!StopReply::looks_like(s), "{}", lossy(s));
        }
    }
}
