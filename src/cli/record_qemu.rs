//! `ptrewind record --backend qemu`: runs the program under `qemu-x86_64` with the ptrewind plugin,
//! live through QEMU's gdbstub, or (`--no-live`) to its end (or death) and then serves the
//! recording to GDB/LLDB like `ptrewind replay` (PC-only past). A temporary recording
//! directory goes with the session (`--no-live`: once read); one named with `--trace-dir`
//! stays.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ptrewind::capture::qemu::recording::find_plugin;
use ptrewind::capture::qemu::{QemuConfig, QemuLive, QemuRecording, Recorded};
use ptrewind::flow::FlowConfig;
use ptrewind::server::{RecordingTarget, Successor};
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

/// What `record --backend qemu` was asked (the `record` command's options that concern it;
/// `record` binds the listener and serves the target).
#[derive(Debug, Clone, Default)]
pub(crate) struct QemuOptions {
    /// `--qemu-plugin`.
    pub(crate) qemu_plugin: Option<PathBuf>,
    /// `--trace-dir`.
    pub(crate) trace_dir: Option<PathBuf>,
    /// `--qemu-live`.
    pub(crate) qemu_live: bool,
    /// `--thread` (replay of a finished recording).
    pub(crate) thread: Option<u32>,
    /// Stop at the program's exit (live; the default, off with `--no-stop-at-exit`).
    pub(crate) stop_at_exit: bool,
    /// The program shares the debugger's terminal (`ptrewind gdb`): a Ctrl-C reaches it
    /// directly.
    pub(crate) shared_terminal: bool,
    /// `--follow-fork child`: serve the first forked child's recording (`--no-live` only).
    pub(crate) follow_fork_child: bool,
}

/// The target to serve and whether it is a live program (else a replay of a finished
/// recording), or the exit code after a printed error.
pub(crate) type QemuStarted =
    Result<Result<(RecordingTarget, bool), ExitCode>, Box<dyn std::error::Error + Send + Sync>>;

/// Records `program` under QEMU (to its end, or live with `qemu_live`) and returns the
/// recording target to serve.
pub(crate) fn start(args: &QemuOptions, program: &OsString, prog_args: &[OsString]) -> QemuStarted {
    let mut config = QemuConfig::new(plugin(args.qemu_plugin.as_deref())?);
    config.dir = args.trace_dir.clone();
    if args.qemu_live {
        if args.follow_fork_child {
            eprintln!(
                "ptrewind: --follow-fork child needs --no-live under QEMU: QEMU 7.2's gdbstub \
                 stays with the parent (a forked child runs on without it, recorded); with \
                 --no-live the child's recording is served once the program has ended"
            );
            return Ok(Err(ExitCode::from(2)));
        }
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
        "ptrewind: recording every thread under QEMU into {} (process {}){}",
        rec.dir().display(),
        rec.pid(),
        if rec.keeps_dir() {
            ""
        } else {
            " (a temporary directory, removed once read; --trace-dir DIR keeps it)"
        }
    );
    // Ctrl-C reaches the program (same process group); ptrewind keeps the recording.
    let sigint_was_ignored = super::signals::ignore_sigint(true);
    let progress = std::io::stderr().is_terminal();
    let status = loop {
        if let Some(sig) = super::signals::received() {
            return Ok(Err(end_recording_on_signal(rec, sig, progress)));
        }
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
    super::signals::ignore_sigint(sigint_was_ignored);
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
    let which = if args.follow_fork_child {
        ServeProcess::FirstChild
    } else {
        ServeProcess::Launched
    };
    let target = match serve_target(&recorded, which, args.thread, signal, rec.keeps_dir()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ptrewind: cannot replay the QEMU recording: {e}");
            return Ok(Err(ExitCode::from(2)));
        }
    };
    Ok(Ok((target, false)))
}

/// Ends a recording run to its end (`--no-live`) on the terminating signal `sig`: QEMU is
/// killed and reaped, and the recording directory is removed with `rec` unless the user named
/// it (`--trace-dir`). `progress`: a progress line is open on stderr.
fn end_recording_on_signal(mut rec: QemuRecording, sig: i32, progress: bool) -> ExitCode {
    let pid = rec.pid();
    let _ = rec.child_mut().kill();
    let _ = rec.child_mut().wait();
    let dir = rec.dir().to_path_buf();
    let kept = rec.keeps_dir();
    drop(rec);
    super::signals::say(&format!(
        "{}ptrewind: ended by {} while recording under QEMU; QEMU (process {pid}) killed, the \
         recording {} {}",
        if progress { "\n" } else { "" },
        super::signals::name(sig),
        if kept {
            "is kept in"
        } else {
            "was removed from"
        },
        dir.display()
    ));
    super::signals::exit_code(sig)
}

/// Which process of a QEMU recording to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServeProcess {
    /// The process QEMU was launched with.
    Launched,
    /// This one (`--pid`).
    Pid(u32),
    /// The first process the launched one forked (`--follow-fork child`), else the launched
    /// one.
    FirstChild,
}

/// The timeline of a QEMU recording (PC-only past): every thread of the process `which`
/// chooses, or the one thread `tid` names (of whichever process). The process is served with
/// its own threads and mappings only. `signal`: the signal that killed QEMU (the program
/// crashed; it applies to the launched process). `kept`: the recording directory outlives
/// this session (what is not served can be replayed from it later).
pub(crate) fn serve_target(
    all: &Recorded,
    which: ServeProcess,
    tid: Option<u32>,
    signal: Option<i32>,
    kept: bool,
) -> Result<RecordingTarget, Box<dyn std::error::Error + Send + Sync>> {
    let dir = all.dir.display();
    let launched = all.launched_pid();
    let forked = all.forked_pids();
    let pid = match (tid, which) {
        (Some(t), _) => all.thread(Some(t)).map(|th| th.pid),
        (None, ServeProcess::Pid(p)) => Some(p),
        (None, ServeProcess::FirstChild) => {
            if forked.is_empty() {
                eprintln!(
                    "ptrewind: --follow-fork child: the program forked no process; serving the \
                     program itself"
                );
            }
            forked.first().copied().or(launched)
        }
        (None, ServeProcess::Launched) => launched,
    };
    let list = |pids: &[u32]| {
        pids.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(recorded) = pid.and_then(|p| all.process(p)) else {
        return Err(match (tid, pid) {
            (Some(t), _) => format!("no thread {t} in {dir}"),
            (None, Some(p)) => format!(
                "no process {p} in {dir} (processes recorded: {})",
                list(&all.pids())
            ),
            (None, None) => format!("no thread recorded in {dir}"),
        }
        .into());
    };
    let recorded = &recorded;
    let first = recorded.thread(tid).ok_or_else(|| match tid {
        Some(t) => format!("no thread {t} in {dir}"),
        None => format!(
            "process {} of {dir} has mappings but no stream",
            pid.unwrap_or_default()
        ),
    })?;
    // The code from the recorded mappings, every missing file reported once, as `decode --qemu`.
    let (image, symbols) = super::code::qemu_image(recorded, &[], &[])?;
    let exe = recorded.launch.as_ref().map(|l| l.program.clone());
    // Where the loader put the program and its libraries (GDB places a PIE program by the
    // auxiliary vector and finds libraries by the svr4 list; no process is left to read them).
    let loader = recorded.loader_view(&recorded.mmap_image().elfs);
    let libraries_xml = loader.as_ref().map(|l| {
        ptrewind::server::svr4::LibraryList {
            main_lm: 0,
            objects: l
                .objects
                .iter()
                .enumerate()
                .map(
                    |(i, (path, l_addr, l_ld))| ptrewind::server::svr4::LoadedObject {
                        // No link_map was recorded: distinct made-up addresses identify the entries.
                        lm: 0x1000 * (i as u64 + 1),
                        l_addr: *l_addr,
                        l_ld: *l_ld,
                        name: path.to_string_lossy().into_owned(),
                    },
                )
                .collect(),
        }
        .to_xml()
    });
    let one = |thread: &ptrewind::capture::qemu::RecordedThread| OfflineRecording {
        trace: thread.trace.clone(),
        image: image.clone(),
        exec_boundaries: Vec::new(),
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
            auxv: loader.as_ref().map(|l| l.auxv.clone()),
            libraries_xml: libraries_xml.clone(),
            ..OfflineInfo::default()
        },
    };
    if tid.is_some() {
        return Ok(RecordingTarget::new(Timeline::offline(one(first))?));
    }
    // Every thread of the process.
    let threads: Vec<ThreadRecording> = recorded
        .threads
        .iter()
        .filter(|t| !t.trace.is_empty())
        .map(|t| ThreadRecording {
            tid: i32::try_from(t.tid).unwrap_or(1),
            recording: one(t),
        })
        .collect();
    let others: Vec<u32> = all.pids().into_iter().filter(|&p| p != first.pid).collect();
    if !others.is_empty() {
        let later = if kept {
            format!("`ptrewind replay --qemu {dir} --pid PID` serves one")
        } else {
            "the directory is temporary: with --trace-dir DIR, `ptrewind replay --qemu DIR \
             --pid PID` serves one later"
                .to_string()
        };
        eprintln!(
            "ptrewind: process(es) {} of this run are recorded in {dir} too, not served in this \
             session ({later}{})",
            list(&others),
            if forked.contains(&first.pid) {
                ""
            } else {
                "; `record --no-live --follow-fork child` serves the first child"
            }
        );
    }
    // A fatal signal is the launched process's end (how QEMU itself ended).
    let fatal = signal
        .filter(|_| Some(first.pid) == launched)
        .map(|signal| FatalSignal { signal, tid: None });
    // The thread QEMU ended the process on (the plugin's `atexit` ran there): the faulting
    // thread of a crash, the caller of `exit_group` otherwise.
    let ended_by = recorded
        .threads
        .iter()
        .find(|t| t.meta.as_ref().is_some_and(|m| m.ended_process))
        .and_then(|t| i32::try_from(t.tid).ok());
    let timeline = Timeline::offline_threads(threads, fatal, ended_by)?;
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
    args: &QemuOptions,
    config: &QemuConfig,
    program: &OsString,
    prog_args: &[OsString],
) -> QemuStarted {
    let mut config = config.clone();
    // The end of the program as a place in its history: the plugin holds `exit_group`.
    config.exit_stop = args.stop_at_exit;
    let mut live = match QemuLive::spawn(&config, Path::new(program), prog_args, |_| {}) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ptrewind: --backend qemu: {e}");
            return Ok(Err(ExitCode::from(2)));
        }
    };
    // A temporary directory nobody named goes with the session (`monitor save` keeps a
    // recording); one given with --trace-dir stays.
    let temporary = args.trace_dir.is_none();
    live.remove_dir_at_end(temporary);
    live.terminal_interrupts(args.shared_terminal);
    eprintln!(
        "ptrewind: running under QEMU with its gdbstub; every thread recorded into {}{}; every \
         thread's history is served (PC-only past)",
        live.dir().display(),
        if temporary {
            " (removed at the end; --trace-dir DIR keeps it)"
        } else {
            ""
        }
    );
    // Killed from outside (QEMU itself dies): the session goes on over the kept recording.
    let successor = Successor(std::rc::Rc::new(|dir: &Path, signal: i32| {
        let recorded = Recorded::open(dir).ok()?;
        serve_target(&recorded, ServeProcess::Launched, None, Some(signal), true)
            .ok()?
            .into_timeline()
    }));
    let target =
        RecordingTarget::new(Timeline::live(Box::new(live), true)?).with_successor(successor);
    Ok(Ok((target, true)))
}
