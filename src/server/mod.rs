//! The GDB remote-protocol server (gdbstub) with reverse execution, btrace and LLDB trace packets.
//!
//! Layers, outermost first:
//!
//! - [`Router`] owns the TCP connection and runs gdbstub's state machine itself
//!   (`GdbStubStateMachine`), so it can look at every packet first: interceptors registered
//!   with [`Router::intercept`] answer packets gdbstub does not know (`Qbtrace:*`,
//!   `qXfer:btrace:read`, `jLLDBTrace*`, ...), [`Router::add_qsupported_feature`] extends the
//!   `qSupported` reply, malformed packets are answered instead of killing the session.
//!   Built in for LLDB: `qHostInfo`, `qProcessInfo`, `qMemoryRegionInfo`, `qShlibInfoAddr`
//!   (where its dynamic-loader plug-in finds `r_debug`), and `X09` as the reply to `k`.
//! - [`GdbStubAdapter`] implements gdbstub's `Target` over a ptrewind [`crate::target::Target`]:
//!   registers with GDB's `amd64-linux` description ([`arch`]), memory, software
//!   breakpoints, step/continue with signals, `qXfer:exec-file`, `qXfer:auxv`,
//!   `qXfer:libraries-svr4` ([`svr4`]), read-only host I/O ([`host_io`]) and `monitor` commands
//!   ([`MonitorRegistry`]).
//!
//! - [`RecordingTarget`]: reverse execution (gdbstub's `ReverseStep`/`ReverseCont` through
//!   [`crate::target::ReverseExecution`]) over a [`crate::timeline::Timeline`], for a live
//!   process recorded by a capture backend or for a recording replayed with no process;
//!   [`register_monitors`] adds the timeline's `monitor` commands.
//!
//! ```no_run
//! use ptrewind::server::{Router, GdbStubAdapter, Intercept};
//! use ptrewind::target::{PtraceTarget, SpawnOptions};
//! let target = PtraceTarget::spawn(&"/bin/true".into(), &[], &SpawnOptions::default())?;
//! let mut session = GdbStubAdapter::new(Box::new(target));
//! let mut router = Router::default();
//! router.add_qsupported_feature("Qbtrace:off+");
//! router.intercept(b"Qbtrace:", |_session, _state, _packet| Intercept::Reply(b"E.not recording".to_vec()));
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let (stream, _) = listener.accept()?;
//! let outcome = router.serve(stream, &mut session)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod alloc;
pub mod arch;
pub mod btrace;
pub mod host_io;
pub mod lldb_trace;
pub mod monitor;
mod recording;
pub mod recording_monitors;
pub mod router;
pub use crate::rsp;
mod adapter;
pub mod svr4;
pub mod tracing;
pub mod view_monitor;

pub use adapter::{GdbStubAdapter, gdb_to_linux_signal, linux_to_gdb_signal, stop_reason};
pub use monitor::{MonitorHandler, MonitorRegistry};
pub use recording::{RecordingTarget, Successor, install_stop_query};
pub use recording_monitors::register_monitors;
pub use router::{Intercept, OnDisconnect, PacketHandler, Router, RouterState, ServeOutcome};

use crate::target::TargetError;
use std::net::SocketAddr;

/// Errors that end a served session.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The connection failed.
    #[error("connection: {0}")]
    Io(std::io::Error),
    /// gdbstub gave up on the session (a protocol error it cannot recover from).
    #[error("GDB protocol: {0}")]
    Protocol(String),
    /// Controlling the target failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The listen address is not allowed.
    #[error(
        "refusing to listen on {0}: it is not a loopback address and anyone who can reach it \
         could control the debugged program; pass --allow-remote to do it anyway"
    )]
    NonLoopback(SocketAddr),
}

/// Checks a listen address: loopback addresses are always allowed, others only with
/// `allow_remote` (a GDB server gives whoever connects full control over the program).
pub fn check_listen_addr(addr: SocketAddr, allow_remote: bool) -> Result<(), ServerError> {
    if addr.ip().is_loopback() || allow_remote {
        Ok(())
    } else {
        Err(ServerError::NonLoopback(addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_address_policy() {
        assert!(check_listen_addr("127.0.0.1:0".parse().unwrap(), false).is_ok());
        assert!(check_listen_addr("[::1]:1234".parse().unwrap(), false).is_ok());
        assert!(check_listen_addr("0.0.0.0:1234".parse().unwrap(), false).is_err());
        assert!(check_listen_addr("192.168.1.2:1234".parse().unwrap(), false).is_err());
        assert!(check_listen_addr("0.0.0.0:1234".parse().unwrap(), true).is_ok());
    }
}
