//! `qXfer:siginfo:read`: the `siginfo_t` of the signal a thread is stopped with, which GDB
//! shows as `$_siginfo` (a fault's address in `_sifields._sigfault.si_addr`, a signal's sender
//! in `_sifields._kill`), as gdbserver serves it. gdbstub does not serve this object, so the
//! router answers it from [`Target::stop_siginfo`](crate::target::Target::stop_siginfo).

use super::super::GdbStubAdapter;
use super::super::btrace::resolve_thread;
use super::super::rsp::{parse_qxfer_read, qxfer_chunk};
use super::{Intercept, Router, RouterState};

/// The feature announced in the `qSupported` reply.
pub(super) const FEATURE: &str = "qXfer:siginfo:read+";

/// The reply to one `qXfer:siginfo:read::OFFSET,LENGTH` request, for GDB's general thread
/// (`Hg`; the stop's thread after a stop reply). `E01` when that thread did not stop with a
/// signal (or the cursor is in the past), as gdbserver answers when `PTRACE_GETSIGINFO`
/// fails; GDB then says "Unable to read siginfo".
fn reply(session: &mut GdbStubAdapter, state: &RouterState, body: &[u8]) -> Vec<u8> {
    let req = match parse_qxfer_read(body) {
        Ok(r) if r.object == b"siginfo" && r.annex.is_empty() => r,
        _ => return b"E00".to_vec(),
    };
    let target = session.target_mut();
    let ids = target.thread_ids();
    let current = u32::try_from(target.tid()).unwrap_or(0);
    let Ok(tid) = resolve_thread(state.general_thread.as_deref(), current, |t| {
        i32::try_from(t).is_ok_and(|t| ids.contains(&t))
    }) else {
        return b"E01".to_vec();
    };
    match target.stop_siginfo(tid as i32) {
        Some(info) => {
            qxfer_chunk(&info, req.offset, req.length).unwrap_or_else(|_| b"E01".to_vec())
        }
        None => b"E01".to_vec(),
    }
}

/// Registers the `qXfer:siginfo:read` object on `router`.
pub(super) fn register(router: &mut Router) {
    router.intercept(b"qXfer:siginfo:read:", |session, state, body| {
        Intercept::Reply(reply(session, state, body))
    });
    router.add_qsupported_feature(FEATURE);
}
