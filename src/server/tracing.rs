//! Wires the trace packet modules ([`super::btrace`] for GDB, [`super::lldb_trace`] for LLDB)
//! into the [`Router`]: interceptors for their packets and the btrace `qSupported` features.
//!
//! Both protocols share one [`PtTraceProvider`]; only one debugger is connected at a time.

use super::adapter::GdbStubAdapter;
use super::btrace::{self, BtraceServer, PtTraceProvider};
use super::lldb_trace::LldbTraceServer;
use super::router::{Intercept, Router, RouterState};
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

impl TraceHub {
    /// A hub serving `provider` with nothing traced yet, shared by the interceptors.
    fn shared(provider: Box<dyn PtTraceProvider>) -> Rc<RefCell<TraceHub>> {
        Rc::new(RefCell::new(TraceHub {
            provider,
            btrace: BtraceServer::new(),
            lldb: LldbTraceServer::new(),
        }))
    }
}

fn current_tid(session: &GdbStubAdapter) -> u32 {
    // Linux thread ids are positive; a target without one has no thread to trace.
    u32::try_from(session.target().tid()).unwrap_or(0)
}

/// Every thread of the session (positive ids only).
fn session_tids(session: &GdbStubAdapter) -> Vec<u32> {
    session
        .target()
        .thread_ids()
        .into_iter()
        .filter_map(|t| u32::try_from(t).ok())
        .collect()
}

/// Registers the trace interceptors and `qSupported` features on `router`, serving trace
/// from `provider`. Returns the shared state (e.g. to inspect what is traced afterwards).
pub fn install(router: &mut Router, provider: Box<dyn PtTraceProvider>) -> Rc<RefCell<TraceHub>> {
    let hub = TraceHub::shared(provider);
    intercept_gdb(router, &hub);
    intercept_lldb(router, &hub);
    hub
}

/// Registers only LLDB's `jLLDBTrace*` packets, serving trace from `provider`. For a server
/// that already serves reverse execution itself (`ptrewind record`): LLDB, which has no
/// reverse execution before version 21, can still see the recorded instruction and call
/// history through its Intel PT plug-in. GDB's packets are registered separately
/// ([`install_btrace`]), so that GDB is not told a thread is traced (it would enter btrace
/// mode on connect and compete with the server's reverse execution).
pub fn install_lldb(
    router: &mut Router,
    provider: Box<dyn PtTraceProvider>,
) -> Rc<RefCell<TraceHub>> {
    let hub = TraceHub::shared(provider);
    intercept_lldb(router, &hub);
    hub
}

/// Registers only GDB's btrace packets (and their `qSupported` features), serving trace from
/// `provider`, with no thread traced: GDB enters btrace mode only when the user types
/// `record btrace pt`. For `ptrewind record`, with a [`TraceStoreProvider::from_enable`]
/// provider over the live recording, so GDB's trace begins where the user enabled it.
///
/// [`TraceStoreProvider::from_enable`]: super::btrace::TraceStoreProvider::from_enable
pub fn install_btrace(
    router: &mut Router,
    provider: Box<dyn PtTraceProvider>,
) -> Rc<RefCell<TraceHub>> {
    let hub = TraceHub::shared(provider);
    intercept_gdb(router, &hub);
    hub
}

fn intercept_gdb(router: &mut Router, hub: &Rc<RefCell<TraceHub>>) {
    for feature in btrace::QSUPPORTED_FEATURES {
        router.add_qsupported_feature(*feature);
    }

    let gdb = |hub: Rc<RefCell<TraceHub>>| {
        move |session: &mut GdbStubAdapter, state: &RouterState, packet: &[u8]| {
            let tid = current_tid(session);
            // GDB names the thread with `Hg`: any thread of the session.
            let threads = session_tids(session);
            let thread = btrace::resolve_thread(state.general_thread.as_deref(), tid, |t| {
                threads.contains(&t)
            });
            let hub = &mut *hub.borrow_mut();
            match hub.btrace.handle(packet, thread, hub.provider.as_mut()) {
                Some(reply) => Intercept::Reply(reply),
                None => Intercept::Pass,
            }
        }
    };
    router.intercept(b"Qbtrace", gdb(Rc::clone(hub)));
    router.intercept(b"qXfer:btrace", gdb(Rc::clone(hub)));
}

fn intercept_lldb(router: &mut Router, hub: &Rc<RefCell<TraceHub>>) {
    let lldb_hub = Rc::clone(hub);
    router.intercept(b"jLLDBTrace", move |session, _state, packet| {
        let live = session_tids(session);
        let hub = &mut *lldb_hub.borrow_mut();
        match hub.lldb.handle(packet, &live, hub.provider.as_mut()) {
            Some(reply) => Intercept::Reply(reply),
            None => Intercept::Pass,
        }
    });
}
