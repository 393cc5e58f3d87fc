//! Wires the trace packet modules ([`super::btrace`] for GDB, [`super::lldb_trace`] for LLDB)
//! into the [`Router`]: interceptors for their packets, the btrace `qSupported` features, and
//! LLDB's `qHostInfo` / `qProcessInfo` (gdbstub answers those only if the target implements
//! its host/process-info extensions, which [`Session`] does not).
//!
//! Both protocols share one [`PtTraceProvider`]; only one debugger is connected at a time.

use super::btrace::{self, BtraceServer, PtTraceProvider};
use super::lldb_trace::{self, LldbTraceServer, ProcessInfo};
use super::router::{Intercept, Router, RouterState};
use super::session::Session;
use std::cell::RefCell;
use std::rc::Rc;

/// The trace state shared by the interceptors.
pub struct TraceHub {
    /// Where the trace bytes come from.
    pub provider: Box<dyn PtTraceProvider>,
    /// GDB's btrace state.
    pub btrace: BtraceServer,
    /// LLDB's trace state.
    pub lldb: LldbTraceServer,
}

impl std::fmt::Debug for TraceHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceHub")
            .field("btrace", &self.btrace)
            .field("lldb", &self.lldb)
            .finish_non_exhaustive()
    }
}

fn current_tid(session: &Session) -> u32 {
    // Linux thread ids are positive; a target without one has no thread to trace.
    u32::try_from(session.target().tid()).unwrap_or(0)
}

/// Registers the trace interceptors and `qSupported` features on `router`, serving trace
/// from `provider`. Returns the shared state (e.g. to inspect what is traced afterwards).
pub fn install(router: &mut Router, provider: Box<dyn PtTraceProvider>) -> Rc<RefCell<TraceHub>> {
    let hub = Rc::new(RefCell::new(TraceHub {
        provider,
        btrace: BtraceServer::new(),
        lldb: LldbTraceServer::new(),
    }));
    for feature in btrace::QSUPPORTED_FEATURES {
        router.add_qsupported_feature(*feature);
    }

    let gdb = |hub: Rc<RefCell<TraceHub>>| {
        move |session: &mut Session, state: &RouterState, packet: &[u8]| {
            let tid = current_tid(session);
            // The session debugs one thread (see `crate::target::Target`).
            let thread = btrace::resolve_thread(state.general_thread.as_deref(), tid, |t| t == tid);
            let hub = &mut *hub.borrow_mut();
            match hub.btrace.handle(packet, thread, hub.provider.as_mut()) {
                Some(reply) => Intercept::Reply(reply),
                None => Intercept::Pass,
            }
        }
    };
    router.intercept(b"Qbtrace", gdb(Rc::clone(&hub)));
    router.intercept(b"qXfer:btrace", gdb(Rc::clone(&hub)));

    let lldb_hub = Rc::clone(&hub);
    router.intercept(b"jLLDBTrace", move |session, _state, packet| {
        let live = [current_tid(session)];
        let hub = &mut *lldb_hub.borrow_mut();
        match hub.lldb.handle(packet, &live, hub.provider.as_mut()) {
            Some(reply) => Intercept::Reply(reply),
            None => Intercept::Pass,
        }
    });

    router.intercept(b"qHostInfo", |_session, _state, packet| {
        if packet == b"qHostInfo" {
            Intercept::Reply(lldb_trace::host_info_reply())
        } else {
            Intercept::Pass
        }
    });
    router.intercept(b"qProcessInfo", |session, _state, packet| {
        if packet != b"qProcessInfo" {
            return Intercept::Pass;
        }
        let pid = u32::try_from(session.target().pid()).unwrap_or(0);
        let info = process_info(pid);
        Intercept::Reply(lldb_trace::process_info_reply(&info))
    });
    hub
}

/// The ids `qProcessInfo` reports, from `/proc/PID/status`; our own ids if that cannot be read
/// (we spawned the process, or attached to it with the same credentials).
fn process_info(pid: u32) -> ProcessInfo {
    let mut info = ProcessInfo {
        pid,
        parent_pid: std::process::id(),
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        euid: nix::unistd::geteuid().as_raw(),
        egid: nix::unistd::getegid().as_raw(),
    };
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        for line in status.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let nums: Vec<u32> = value
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            match (key, nums.as_slice()) {
                ("PPid", [ppid, ..]) => info.parent_pid = *ppid,
                ("Uid", [real, effective, ..]) => (info.uid, info.euid) = (*real, *effective),
                ("Gid", [real, effective, ..]) => (info.gid, info.egid) = (*real, *effective),
                _ => {}
            }
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_info_reads_proc_status() {
        let me = std::process::id();
        let info = process_info(me);
        assert_eq!(info.pid, me);
        assert_eq!(info.uid, nix::unistd::getuid().as_raw());
        assert_eq!(info.egid, nix::unistd::getegid().as_raw());
        assert_eq!(info.parent_pid, nix::unistd::getppid().as_raw() as u32);
    }
}
