//! `ptrewind record --backend qemu`: runs the program under `qemu-x86_64` with the ptrewind plugin
//! to its end (or death), keeps the recording directory, and serves the recording to GDB/LLDB
//! like `ptrewind replay` (PC-only past).

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::record::{RecordArgs, Served, Started, bind};
use ptrewind::capture::qemu::recording::find_plugin;
use ptrewind::capture::qemu::{QemuConfig, QemuLive, QemuRecording, Recorded};
use ptrewind::flow::FlowConfig;
use ptrewind::server::RecordingTarget;
use ptrewind::server::check_listen_addr;
use ptrewind::timeline::{FatalSignal, OfflineInfo, OfflineRecording, ThreadRecording, Timeline};

/// The plugin to load: `--qemu-plugin`, else beside this executable or in its target directory.
fn plugin(arg: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = arg {
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate ptrewind: {e}"))?;
    find_plugin(&exe).ok_or_else(|| {
        format!(
            "the QEMU plugin libptrewind_qemu_plugin.so is not beside {} (build it with \
             `cargo build`, or give --qemu-plugin PATH)",
            exe.display()
        )
    })
}

fn human(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.2} G", n / 1e9),
        n if n >= 1e6 => format!("{:.1} M", n / 1e6),
        n if n >= 1e3 => format!("{:.1} k", n / 1e3),
        n => format!("{n:.0} "),
    }
}

/// Records `program` under QEMU to its end and returns the served recording target.
pub(crate) fn start(args: &RecordArgs, program: &OsString, prog_args: &[OsString]) -> Started {
    check_listen_addr(args.listen(), args.allow_remote())?;
    let mut config = QemuConfig::new(plugin(args.qemu_plugin.as_deref())?);
    config.dir = args.trace_dir.clone();
    if args.qemu_live {
        return start_live(args, &config, program, prog_args);
    }
    let started = Instant::now();
    let mut rec = match QemuRecording::spawn(&config, Path::new(program), prog_args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ptrewind: --backend qemu: {e}");
            return Ok(Err(ExitCode::from(2)));
        }
    };
    eprintln!(
        "ptrewind: recording every thread under QEMU into {} (process {})",
        rec.dir().display(),
        rec.pid()
    );
    // Ctrl-C reaches the program (same process group); ptrewind keeps the recording.
    // SAFETY: setting SIGINT's disposition to ignore in this process; no handler runs.
    let old = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let progress = std::io::stderr().is_terminal();
    let status = loop {
        match rec.child_mut().try_wait() {
            Ok(Some(_)) | Err(_) => break rec.wait(),
            Ok(None) => {}
        }
        std::thread::sleep(Duration::from_millis(200));
        if progress {
            let (insns, bytes) = rec.progress();
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            eprint!(
                "\r\x1b[Kptrewind: {}instructions, {}instructions/s, {}B of trace",
                human(insns as f64),
                human(insns as f64 / secs),
                human(bytes as f64)
            );
        }
    };
    if progress {
        eprintln!();
    }
    // SAFETY: restoring the disposition saved above.
    unsafe { libc::signal(libc::SIGINT, old) };
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ptrewind: --backend qemu: {e}");
            return Ok(Err(ExitCode::from(2)));
        }
    };
    let recorded = rec.read()?;
    let secs = started.elapsed().as_secs_f64();
    let (insns, bytes, lost) = recorded.totals();
    eprintln!(
        "ptrewind: program ended ({status}); {} thread(s), {} instructions in {secs:.2} s \
         ({}instructions/s), {} bytes of trace, {lost} bytes lost",
        recorded.threads.len(),
        insns,
        human(insns as f64 / secs.max(1e-3)),
        bytes
    );
    for t in &recorded.threads {
        if t.meta.is_none() {
            eprintln!(
                "ptrewind: note: thread {} of process {}: its stream ended without the plugin's \
                 summary (QEMU died of a signal); the trace is kept up to its last write",
                t.tid, t.pid
            );
        }
    }
    let signal = std::os::unix::process::ExitStatusExt::signal(&status);
    let target = match serve_target(&recorded, args.thread, signal) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ptrewind: cannot replay the QEMU recording: {e}");
            return Ok(Err(ExitCode::from(2)));
        }
    };
    let listener = bind(args.listen())?;
    Ok(Ok((target, listener, Served::Replay)))
}

/// The timeline of a QEMU recording (PC-only past): every thread of the first process, or the
/// one `tid` names. `signal`: the signal that killed QEMU (the program crashed).
pub(crate) fn serve_target(
    recorded: &Recorded,
    tid: Option<u32>,
    signal: Option<i32>,
) -> Result<RecordingTarget, Box<dyn std::error::Error + Send + Sync>> {
    let first = recorded.thread(tid).ok_or_else(|| match tid {
        Some(t) => format!("no thread {t} in {}", recorded.dir.display()),
        None => format!("no thread recorded in {}", recorded.dir.display()),
    })?;
    // The code from the recorded mappings, every missing file reported once, as `decode --qemu`.
    let (image, symbols) = super::decode::qemu_image(recorded, &[], &[])?;
    let exe = recorded.launch.as_ref().map(|l| l.program.clone());
    let one = |thread: &ptrewind::capture::qemu::RecordedThread| OfflineRecording {
        trace: thread.trace.clone(),
        image: image.clone(),
        immutable: None,
        symbols: symbols.clone(),
        registers_at_start: None,
        registers_at_end: None,
        registers_at: Vec::new(),
        instructions: thread.meta.as_ref().map(|m| m.tracer.instructions),
        flow: FlowConfig::default(),
        info: OfflineInfo {
            pid: i32::try_from(thread.pid).unwrap_or(1),
            tid: i32::try_from(thread.tid).ok(),
            exe: exe.clone(),
            source: format!(
                "QEMU recording {} [thread {}]",
                recorded.dir.display(),
                thread.tid
            ),
            ..OfflineInfo::default()
        },
    };
    if tid.is_some() {
        return Ok(RecordingTarget::new(Timeline::offline(one(first))?));
    }
    // Every thread of the process the recording started with (a child process's threads
    // would need their own image and are not served).
    let threads: Vec<ThreadRecording> = recorded
        .threads
        .iter()
        .filter(|t| t.pid == first.pid && !t.trace.is_empty())
        .map(|t| ThreadRecording {
            tid: i32::try_from(t.tid).unwrap_or(1),
            recording: one(t),
        })
        .collect();
    let others = recorded
        .threads
        .iter()
        .filter(|t| t.pid != first.pid)
        .count();
    if others > 0 {
        eprintln!(
            "ptrewind: {others} thread(s) of other processes (children) are recorded in {} but \
             not served",
            recorded.dir.display()
        );
    }
    let fatal = signal.map(|signal| FatalSignal { signal, tid: None });
    let timeline = Timeline::offline_threads(threads, fatal)?;
    for why in timeline.skipped_threads() {
        eprintln!("ptrewind: warning: not served: {why}");
    }
    eprintln!(
        "ptrewind: serving {} thread(s) ({}); thread {} selected",
        timeline.thread_ids().len(),
        timeline
            .thread_ids()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        timeline.tid()
    );
    Ok(RecordingTarget::new(timeline))
}

/// `--qemu-live`: the program under QEMU with the plugin and the gdbstub, served live (present
/// from the gdbstub, PC-only past from the main thread's trace; see
/// `ptrewind::capture::qemu::live`).
fn start_live(
    args: &RecordArgs,
    config: &QemuConfig,
    program: &OsString,
    prog_args: &[OsString],
) -> Started {
    let live = match QemuLive::spawn(config, Path::new(program), prog_args, |_| {}) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ptrewind: --backend qemu: {e}");
            return Ok(Err(ExitCode::from(2)));
        }
    };
    eprintln!(
        "ptrewind: running under QEMU with its gdbstub; every thread recorded into {}; the \
         main thread's history is served (PC-only past)",
        live.dir().display()
    );
    let listener = bind(args.listen())?;
    let target = RecordingTarget::new(Timeline::live(Box::new(live), true)?);
    Ok(Ok((target, listener, Served::Started)))
}
