//! `ptrewind attach PID`: attach to a running process and serve it to GDB.

use super::CmdResult;
use super::record::{bind, serve};
use ptrewind::server::check_listen_addr;
use ptrewind::target::PtraceTarget;
use std::net::SocketAddr;

/// Arguments of `ptrewind attach`.
#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    /// Address to listen on for GDB (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Allow listening on a non-loopback address (whoever connects controls the process).
    #[arg(long)]
    allow_remote: bool,
    /// The process to attach to (its main thread is debugged; other threads keep running).
    pid: i32,
}

/// Runs `ptrewind attach`.
pub fn run(args: AttachArgs) -> CmdResult {
    check_listen_addr(args.listen, args.allow_remote)?;
    let listener = bind(args.listen)?;
    let target = PtraceTarget::attach(args.pid)?;
    serve(target, listener, "attached to", true, "".as_ref())
}
