//! `ptrewind attach PID`: attach to a running process, record it with the software backend
//! from the attach point on and serve it to GDB with reverse execution (`--no-record`: forward
//! debugging only).

use super::CmdResult;
use super::record::{Served, bind, serve, serve_recording};
use ptrewind::capture::soft::{RecordFrom, RecorderConfig, SoftRecorder, StepMode};
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
    /// Do not record: serve forward debugging only (the process runs at full speed).
    #[arg(long)]
    no_record: bool,
    /// End when the debugger's connection closes (detaching from the process). By default the
    /// process and its recording are kept, stopped, for a debugger to connect again.
    #[arg(long)]
    once: bool,
    /// Let the process exit (or die) at once. By default it stops at its end, still alive, so
    /// that its history can be examined from there; a further continue lets it exit.
    #[arg(long)]
    no_stop_at_exit: bool,
    /// The process to attach to (its main thread is debugged; other threads keep running).
    pid: i32,
}

/// Runs `ptrewind attach`.
pub fn run(args: AttachArgs) -> CmdResult {
    check_listen_addr(args.listen, args.allow_remote)?;
    let listener = bind(args.listen)?;
    let target = PtraceTarget::attach(args.pid)?;
    if args.no_record {
        return serve(target, listener, Served::Attached, "".as_ref(), args.once);
    }
    // Recording starts at the attach stop (which may be inside an interrupted system call:
    // the recorder records its restart as the `syscall` instruction executing again).
    let config = RecorderConfig {
        record_from: RecordFrom::OnDemand,
        state_log: true,
        step_mode: StepMode::Single,
        capture_image_at_exit: false,
        ..RecorderConfig::default()
    };
    let mut recorder =
        SoftRecorder::new(target, config).map_err(|e| format!("cannot start recording: {e}"))?;
    recorder.record_on();
    let target = super::record::soft_recording(recorder, !args.no_stop_at_exit)?;
    serve_recording(target, listener, Served::Attached, "".as_ref(), args.once)
}
