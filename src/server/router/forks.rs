//! Fork, vfork and exec events towards GDB (`fork-events+`, `vfork-events+`, `exec-events+`,
//! multiprocess ids): what gdbstub 0.7 gets wrong or leaves out.
//!
//! gdbstub reports a `fork:` stop, but names the child with the parent's pid, treats every
//! `D` as the end of the session and ignores the process part of `Hg`. After a fork stop GDB
//! (`follow_fork_inferior`, remote.c `follow_fork`) takes the breakpoints out of the child
//! (`Hg pCHILD.CHILD`, `z0`…), then detaches the side it does not follow with `D;PID`, and
//! goes on with the other. So while a fork is held the router
//!
//! * answers `D;PID` for either side by settling the fork ([`Target::resolve_fork`]), and
//!   `vKill;PID` for the held child (it is killed with the program);
//! * answers `Hg`/`Hc` naming the child itself, and the breakpoint packets GDB sends for the
//!   child (the held child's copy of memory has none of our int3s, so there is nothing to do),
//!   so the parent's breakpoints are not touched;
//! * notes which process a `vCont` resumes: with the fork unsettled (GDB's `detach-on-fork
//!   off`) a resume of the parent alone keeps the child stopped for GDB, whose registers and
//!   memory (`g`, `p`, `m` with the child as the general thread) are then the child's own,
//!   and a `vCont` of the child alone runs it, not recorded, to its end (its `W`/`X` with
//!   `;process:PID`); any other resume keeps the side it names and detaches the other
//!   ([`GdbStubAdapter`]'s resume);
//! * after the recorded process ended, serves the child GDB keeps ([`after_exit_reply`]):
//!   GDB stays connected while it has a live inferior.
//!
//! [`Target::resolve_fork`]: crate::target::Target::resolve_fork

use super::super::GdbStubAdapter;
use super::super::arch::GdbRegisters;
use super::super::rsp::{hex_encode, parse_hex_u64};
use super::{Intercept, Router, RouterState};
use crate::target::{HeldChildReply, HeldChildRequest, Notice, StopEvent};
use gdbstub::arch::Registers;

/// The pid of a `pPID.TID` (or `pPID`) thread id, hex; `None` for other forms.
fn pid_of(id: &[u8]) -> Option<i32> {
    let rest = id.strip_prefix(b"p")?;
    let pid = rest.split(|&b| b == b'.').next()?;
    i32::from_str_radix(std::str::from_utf8(pid).ok()?, 16)
        .ok()
        .filter(|&p| p > 0)
}

/// Settles which events this connection's debugger gets, from the features it sent in
/// `qSupported`, before gdbstub answers it: forks (`fork-events+` with `multiprocess+`),
/// vforks only to a debugger that also learns of the exec a vfork child makes (GDB; lldb-19
/// asks for vfork events but not exec events), execs. Returns the features the router adds
/// to gdbstub's reply (gdbstub knows no exec events).
pub(super) fn negotiate(session: &mut GdbStubAdapter, client: &[String]) -> Option<String> {
    let has = |f: &str| client.iter().any(|c| c == f);
    let forks = has("fork-events+") && has("multiprocess+");
    let vforks = forks && has("vfork-events+") && has("exec-events+");
    let on = session.target_mut().report_forks(forks, vforks);
    session.set_fork_events(on, on && vforks);
    session
        .target_mut()
        .report_execs(has("exec-events+"))
        .then(|| "exec-events+".to_string())
}

/// The stop reply the router writes itself, for the stops gdbstub gets wrong (a fork's child
/// pid) or lacks (exec), after the session's bookkeeping for them; `None` for the others.
pub(super) fn own_stop_reply(
    session: &mut GdbStubAdapter,
    ev: StopEvent,
    tid: i32,
    multiprocess: bool,
) -> Option<Vec<u8>> {
    let pid = session.target().pid();
    match ev {
        StopEvent::Forked { child, vfork } => {
            session.fork_reported(vfork);
            Some(fork_stop_reply(pid, tid, child, vfork))
        }
        StopEvent::Exec => {
            session.forget_breakpoints();
            match session.target().exec_path() {
                Some(path) => Some(exec_stop_reply(
                    pid,
                    tid,
                    path.as_os_str().as_encoded_bytes(),
                    multiprocess,
                )),
                None => {
                    // GDB needs a name: a plain trap, and the user is told.
                    session.notices.push(Notice::Exec { path: None });
                    None
                }
            }
        }
        _ => None,
    }
}

/// The stop reply of an exec (GDB's `exec-events`): the thread, and the new executable's
/// path in hex. `multiprocess`: thread ids as `pPID.TID`.
fn exec_stop_reply(pid: i32, tid: i32, path: &[u8], multiprocess: bool) -> Vec<u8> {
    let thread = if multiprocess {
        format!("p{pid:x}.{tid:x}")
    } else {
        format!("{tid:x}")
    };
    format!(
        "T05thread:{thread};exec:{};",
        super::super::rsp::hex_encode(path)
    )
    .into_bytes()
}

/// The stop reply of a fork (or vfork): the parent's thread, the child named by its own pid.
fn fork_stop_reply(pid: i32, tid: i32, child: i32, vfork: bool) -> Vec<u8> {
    let kind = if vfork { "vfork" } else { "fork" };
    format!("T05thread:p{pid:x}.{tid:x};{kind}:p{child:x}.{child:x};").into_bytes()
}

/// The reply to a register or memory packet (`g`, `p`, `m`; writes `G`, `P`, `M`, `X` are
/// refused) aimed at the held fork child: its own registers and memory, read from it.
fn held_child_read(session: &mut GdbStubAdapter, body: &[u8]) -> Vec<u8> {
    let t = session.target_mut();
    match body.first() {
        Some(b'g') | Some(b'p') => {
            let Ok(HeldChildReply::Registers(regs)) = t.held_child(HeldChildRequest::Registers)
            else {
                return b"E01".to_vec();
            };
            if body[0] == b'g' {
                let regs = GdbRegisters {
                    regs: *regs,
                    written: Vec::new(),
                };
                let mut out = Vec::new();
                regs.gdb_serialize(|b| match b {
                    Some(b) => out.extend_from_slice(format!("{b:02x}").as_bytes()),
                    None => out.extend_from_slice(b"xx"),
                });
                return out;
            }
            let Ok(num) = parse_hex_u64(&body[1..]) else {
                return b"E01".to_vec();
            };
            let mut out = None;
            regs.gdb_layout(|n, bytes| {
                if n as u64 == num {
                    out = Some(hex_encode(bytes).into_bytes());
                }
            });
            out.unwrap_or_else(|| b"E01".to_vec())
        }
        Some(b'm') => {
            let mut parts = body[1..].splitn(2, |&b| b == b',');
            let (Some(Ok(addr)), Some(Ok(len))) = (
                parts.next().map(parse_hex_u64),
                parts.next().map(parse_hex_u64),
            ) else {
                return b"E01".to_vec();
            };
            let len = len.min(0x4000) as usize;
            match t.held_child(HeldChildRequest::Memory { addr, len }) {
                Ok(HeldChildReply::Memory(bytes)) => hex_encode(&bytes).into_bytes(),
                // EFAULT, as for the recorded process.
                _ => b"E0e".to_vec(),
            }
        }
        // Its memory and registers are not written: it is not recorded, and GDB's own
        // breakpoints in it are kept by the router (`z`/`Z`), not inserted.
        _ => b"E01".to_vec(),
    }
}

/// Runs the held fork child the debugger resumes alone, not recorded, to its end, and returns
/// its exit as the stop reply (`W`/`X` with `;process:PID`); a step is refused (`E01`). The
/// console notice is the session's, sent before the reply.
fn resume_held_child(session: &mut GdbStubAdapter, child: i32, step: bool) -> Vec<u8> {
    if step {
        session.notices.push(Notice::HeldChildStepRefused { child });
        return b"E01".to_vec();
    }
    session.notices.push(Notice::HeldChildRuns { child });
    let ended = session.target_mut().held_child(HeldChildRequest::RunToEnd);
    session.kept_child = None;
    if !session.gone_pids.contains(&child) {
        session.gone_pids.push(child);
    }
    match ended {
        Ok(HeldChildReply::Ended(StopEvent::Exited(code))) => {
            format!("W{:02x};process:{child:x}", code & 0xff).into_bytes()
        }
        Ok(HeldChildReply::Ended(StopEvent::Killed(sig))) => format!(
            "X{:02x};process:{child:x}",
            super::super::adapter::linux_to_gdb_signal(sig)
        )
        .into_bytes(),
        _ => b"E01".to_vec(),
    }
}

/// A `vCont` that resumes only the kept fork child (every action names its pid): whether it
/// steps. `None` when the packet resumes anything else.
fn resumes_kept_child_only(body: &[u8], child: i32) -> Option<bool> {
    let mut step = false;
    let mut any = false;
    for action in body.strip_prefix(b"vCont;")?.split(|&b| b == b';') {
        let mut parts = action.splitn(2, |&b| b == b':');
        let kind = parts.next()?;
        if pid_of(parts.next()?) != Some(child) {
            return None;
        }
        any = true;
        step |= matches!(kind.first(), Some(b's' | b'S' | b'r'));
    }
    any.then_some(step)
}

/// After the recorded process ended (its `W`/`X` sent), the debugger may still keep the held
/// fork child (GDB's `detach-on-fork off`: it stays connected while it has a live inferior):
/// the reply to its packet `body` about that child; `selected` tracks its `Hg`.
pub(super) fn after_exit_reply(
    session: &mut GdbStubAdapter,
    selected: &mut bool,
    body: &[u8],
) -> Vec<u8> {
    let Some(child) = session.target().held_fork_child() else {
        return Vec::new();
    };
    let names_child = |rest: &[u8]| pid_of(rest) == Some(child);
    let pid_arg = |rest: &[u8]| {
        std::str::from_utf8(rest)
            .ok()
            .and_then(|h| i32::from_str_radix(h, 16).ok())
    };
    match body {
        [b'H', b'g', rest @ ..] => {
            *selected = names_child(rest);
            b"OK".to_vec()
        }
        [b'H', ..] => b"OK".to_vec(),
        [b'g' | b'p' | b'm' | b'G' | b'P' | b'M' | b'X', ..] if *selected => {
            held_child_read(session, body)
        }
        _ if body.starts_with(b"vCont?") => b"vCont;c;C;s;S".to_vec(),
        _ if body.starts_with(b"vCont;") => match resumes_kept_child_only(body, child) {
            Some(step) => resume_held_child(session, child, step),
            None => b"E01".to_vec(),
        },
        _ if body.starts_with(b"vKill;") && pid_arg(&body[6..]) == Some(child) => {
            let _ = session.target_mut().held_child(HeldChildRequest::Kill);
            b"OK".to_vec()
        }
        _ if body.starts_with(b"D;") && pid_arg(&body[2..]) == Some(child) => {
            let _ = session.target_mut().held_child(HeldChildRequest::Detach);
            b"OK".to_vec()
        }
        _ if body.starts_with(b"T") => {
            if names_child(&body[1..]) {
                b"OK".to_vec()
            } else {
                b"E01".to_vec()
            }
        }
        _ if body == b"qfThreadInfo" => format!("mp{child:x}.{child:x}").into_bytes(),
        _ if body == b"qsThreadInfo" => b"l".to_vec(),
        _ if body.starts_with(b"qXfer:threads:read::") => format!(
            "l<?xml version=\"1.0\"?>\n<threads><thread id=\"p{child:x}.{child:x}\"/></threads>"
        )
        .into_bytes(),
        _ if body == b"?" => format!("T05thread:p{child:x}.{child:x};").into_bytes(),
        _ => Vec::new(),
    }
}

/// Which process the debugger's general thread (`Hg`) is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Selected {
    /// The recorded process (or no process named).
    Process,
    /// The child of the held fork.
    HeldChild,
    /// A process detached at a fork.
    Gone,
}

pub(super) fn register(router: &mut Router) {
    router.intercept(b"D;", |session, _state, body| {
        let Some(pid) = std::str::from_utf8(&body[2..])
            .ok()
            .and_then(|h| i32::from_str_radix(h, 16).ok())
        else {
            return Intercept::Pass;
        };
        if session.target().held_fork_child().is_none() {
            // A process let go at a fork (GDB detaches a vfork parent once the followed child
            // has exec'd or exited): nothing more to do.
            if session.gone_pids.contains(&pid) {
                return Intercept::Reply(b"OK".to_vec());
            }
            return Intercept::Pass;
        }
        match session.settle_fork(pid) {
            Ok(Some(_)) => Intercept::Reply(b"OK".to_vec()),
            Ok(None) => Intercept::Pass,
            Err(_) => Intercept::Reply(b"E01".to_vec()),
        }
    });
    router.intercept(b"vKill;", |session, _state, body| {
        // GDB's `kill` at an unsettled fork kills the child first (`vKill;CHILD`), then the
        // parent: gdbstub would end the session at the first. The held child goes with the
        // program (`PtraceTarget::kill`); a process already let go is not ours to kill.
        let pid = std::str::from_utf8(&body[6..])
            .ok()
            .and_then(|h| i32::from_str_radix(h, 16).ok());
        match pid {
            Some(p) if session.target().held_fork_child() == Some(p) => {
                let _ = session.target_mut().held_child(HeldChildRequest::Kill);
                session.kept_child = None;
                Intercept::Reply(b"OK".to_vec())
            }
            Some(p) if session.gone_pids.contains(&p) => Intercept::Reply(b"OK".to_vec()),
            _ => Intercept::Pass,
        }
    });
    // The process of the debugger's general thread: breakpoint packets for the others are
    // answered here.
    let selected = std::rc::Rc::new(std::cell::Cell::new(Selected::Process));
    let sel = selected.clone();
    router.intercept(b"H", move |session, _state, body| {
        let kind = body.get(1).copied();
        let pid = pid_of(body.get(2..).unwrap_or(b""));
        if kind == Some(b'c') {
            session.resumed_pid = pid;
        }
        // The held child, or a side of a fork detached since (GDB with `detach-on-fork off`
        // still lists it and takes its breakpoints out).
        let held = pid.is_some() && session.target().held_fork_child() == pid;
        let gone = pid.is_some_and(|p| session.gone_pids.contains(&p));
        if kind == Some(b'g') {
            sel.set(if gone {
                Selected::Gone
            } else if held {
                Selected::HeldChild
            } else {
                Selected::Process
            });
        }
        if held || gone {
            Intercept::Reply(b"OK".to_vec())
        } else {
            Intercept::Pass
        }
    });
    for prefix in [&b"z"[..], b"Z"] {
        let sel = selected.clone();
        router.intercept(prefix, move |session, _state: &RouterState, body| {
            let remove = body.first() == Some(&b'z');
            match sel.get() {
                // The held child's breakpoints as the debugger sees them: they become the
                // process's if the child is followed (`GdbStubAdapter::settle_fork`).
                Selected::HeldChild if session.target().held_fork_child().is_some() => {
                    let addr = body
                        .get(3..)
                        .and_then(|b| b.split(|&c| c == b',').next())
                        .and_then(|h| std::str::from_utf8(h).ok())
                        .and_then(|h| u64::from_str_radix(h, 16).ok());
                    let software = body.get(1) == Some(&b'0');
                    if let (true, Some(set), Some(addr)) =
                        (software, session.child_breakpoints.as_mut(), addr)
                    {
                        if remove {
                            set.remove(&addr);
                        } else {
                            set.insert(addr);
                        }
                    }
                    Intercept::Reply(b"OK".to_vec())
                }
                // Nothing of ours is in a detached process's memory. An insertion there (GDB
                // keeping both sides, `detach-on-fork off`) goes to the one breakpoint list:
                // both sides have the same code at the same addresses, and GDB inserts each
                // location in every process at once.
                Selected::Gone if remove => Intercept::Reply(b"OK".to_vec()),
                _ => Intercept::Pass,
            }
        });
    }
    // The registers and memory of the held child are its own.
    for prefix in [&b"g"[..], b"p", b"m", b"G", b"P", b"M", b"X"] {
        let sel = selected.clone();
        router.intercept(prefix, move |session, _state: &RouterState, body| {
            if sel.get() == Selected::HeldChild && session.target().held_fork_child().is_some() {
                Intercept::Reply(held_child_read(session, body))
            } else {
                Intercept::Pass
            }
        });
    }
    router.intercept(b"vCont;", |session: &mut GdbStubAdapter, _state, body| {
        // `vCont;c:pPID.-1` (GDB resumes one process); the first action naming one counts.
        session.resumed_pid = body
            .split(|&b| b == b';')
            .filter_map(|a| a.splitn(2, |&b| b == b':').nth(1))
            .find_map(pid_of);
        // The kept child resumed alone: it runs to its end, not recorded.
        if let Some(child) = session.kept_child
            && session.target().held_fork_child() == Some(child)
            && let Some(step) = resumes_kept_child_only(body, child)
        {
            return Intercept::Reply(resume_held_child(session, child, step));
        }
        Intercept::Pass
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_id_pids() {
        assert_eq!(pid_of(b"p1a2b.1a2b"), Some(0x1a2b));
        assert_eq!(pid_of(b"p10.-1"), Some(0x10));
        assert_eq!(pid_of(b"p-1.-1"), None);
        assert_eq!(pid_of(b"1a2b"), None);
        assert_eq!(
            fork_stop_reply(0x10, 0x10, 0x2a, false),
            b"T05thread:p10.10;fork:p2a.2a;".to_vec()
        );
        assert_eq!(
            fork_stop_reply(0x10, 0x11, 0x2a, true),
            b"T05thread:p10.11;vfork:p2a.2a;".to_vec()
        );
        assert_eq!(
            exec_stop_reply(0x10, 0x11, b"/x", true),
            b"T05thread:p10.11;exec:2f78;".to_vec()
        );
        assert_eq!(
            exec_stop_reply(0x10, 0x11, b"/x", false),
            b"T05thread:11;exec:2f78;".to_vec()
        );
    }

    #[test]
    fn a_resume_of_the_kept_child_alone() {
        assert_eq!(
            resumes_kept_child_only(b"vCont;c:p2a.-1", 0x2a),
            Some(false)
        );
        assert_eq!(resumes_kept_child_only(b"vCont;s:p2a.2a", 0x2a), Some(true));
        assert_eq!(resumes_kept_child_only(b"vCont;c:p10.-1", 0x2a), None);
        assert_eq!(
            resumes_kept_child_only(b"vCont;s:p10.10;c:p2a.-1", 0x2a),
            None
        );
        assert_eq!(resumes_kept_child_only(b"vCont;c", 0x2a), None);
    }
}
