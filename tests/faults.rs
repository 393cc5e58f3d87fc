//! Fault injection: what happens to a recording when something goes wrong underneath it — the
//! program killed from outside mid-step, threads exiting while the main thread is stepped, the
//! output ring overflowing, the disk filling up during `monitor save`, the debugger vanishing
//! in the middle of a packet. Each must end in a counted loss or a clear error, never a hang or
//! a silently incomplete recording. All fast (seconds).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod support;

use support::cbuild::{build_example, compile_source};
use support::gdb::{Server, gdb_session, ptrewind, wait_until};
use support::rsp::{Raw, packet};

const TIMEOUT: Duration = Duration::from_secs(90);

fn examples_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fault-examples");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `examples/c/attachme.c` (runs for a minute).
fn long_running() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_example(&examples_dir(), "attachme", &[]))
}

/// `examples/c/recursion.c`.
fn recursion() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_example(&examples_dir(), "recursion", &[]))
}

/// `ptrewind record --backend soft` of `program`.
fn record(extra: &[&str], program: &Path) -> Server {
    Server::spawn(
        ptrewind()
            .args(["record", "--backend", "soft", "--listen", "127.0.0.1:0"])
            .args(extra)
            .arg("--")
            .arg(program),
    )
}

/// Waits (at most 20 s) for the server to exit; returns its stderr.
fn server_end(mut server: Server) -> String {
    let status = wait_until(&mut server.child, Instant::now() + Duration::from_secs(20));
    let text = server.stderr.join().unwrap();
    assert!(status.is_some(), "ptrewind did not exit: {text}");
    text
}

/// The program is killed with SIGKILL from outside while it is being single-stepped: the
/// debugger gets a stop reply at once (exit by signal 9, or a stop at the end of the history
/// when the end of the program is kept), and if the session goes on, `monitor stats` answers.
/// No hang, and the server says what happened.
#[test]
fn target_killed_from_outside_mid_step() {
    let server = record(&[], long_running());
    let pid = server.pid;
    let mut c = Raw::connect(server.port, Duration::from_secs(20));
    c.ask("qSupported:multiprocess+");
    c.send(&packet("vCont;c"));
    assert_eq!(c.ack(), b'+');
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Console output (`O…`, the server's word on a stop at the end) comes before the stop.
    let stop = loop {
        let reply = c.reply();
        c.send(b"+");
        if !reply.starts_with('O') || reply == "OK" {
            break reply;
        }
    };
    if stop.starts_with('X') {
        assert!(stop.starts_with("X09"), "{stop}");
        drop(c);
        let log = server_end(server);
        assert!(log.contains("killed by signal 9"), "{log}");
    } else {
        assert!(stop.starts_with('T') || stop.starts_with('S'), "{stop}");
        let stats = c.ask(&format!("qRcmd,{}", hex("stats")));
        assert!(!stats.is_empty() && !stats.starts_with('E'), "{stats}");
        // The end agrees with the recorder: the instruction the kill landed after is counted
        // when the PC at the exit event shows it ran (it was left out, and the history, which
        // ends at that PC, had one instruction more than the recorder).
        let text = unhex(stats.strip_prefix('O').unwrap_or(&stats));
        assert!(text.contains("history check            ok"), "{text}");
        assert!(text.contains("decode errors            0"), "{text}");
        c.send(&packet("k"));
        drop(c);
        server_end(server);
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> String {
    let bytes: Vec<u8> = (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Worker threads start and exit while the main thread is single-stepped (and blocks in
/// `pthread_join`): the recording goes on to the program's normal exit, which GDB reports;
/// the program's own check of the workers' results passes.
#[test]
fn threads_exiting_during_steps() {
    let src = r#"
#include <pthread.h>
#include <stdio.h>
static void *worker(void *arg) {
    long n = (long)arg, s = 0;
    for (long i = 0; i < n; i++) s += i;
    return (void *)s;
}
int main(void) {
    long total = 0;
    for (int round = 0; round < 4; round++) {
        pthread_t t[8];
        for (long i = 0; i < 8; i++) pthread_create(&t[i], 0, worker, (void *)(100 + i));
        for (int i = 0; i < 8; i++) { void *r; pthread_join(t[i], &r); total += (long)r; }
    }
    printf("total=%ld\n", total);
    return total == 4 * (4950 + 5050 + 5151 + 5253 + 5356 + 5460 + 5565 + 5671) ? 0 : 1;
}
"#;
    let exe = compile_source(
        "cc",
        &examples_dir(),
        "thread_churn",
        src,
        &["-g", "-O0", "-pthread"],
        &[],
    );
    let r = gdb_session(
        record(&[], &exe),
        &exe,
        // To the end of the program (it stays there: stop at exit), then let it exit.
        &["continue", "continue", "echo END\\n"],
        TIMEOUT,
    );
    r.expect("exited normally");
    assert!(r.program_stdout.contains("total="), "{}", r.dump());
}

/// The output ring overflows (a 4 KiB ring, 64 KiB write batches: every batch laps it before
/// a drain, as a processor's trace output laps a buffer whose drainer is too slow): the loss
/// is counted — a non-zero `lost bytes` in `monitor stats` — and equals what the store's gaps
/// say, instead of a shorter history that looks complete.
#[test]
fn ring_overflow_is_counted_and_shown_by_monitor_stats() {
    use ptrewind::capture::soft::{
        EncoderConfig, RecordFrom, RecorderConfig, RingConfig, SoftCapture, SoftRecorder, StepMode,
    };
    use ptrewind::ring::IntOn;
    use ptrewind::server::{GdbStubAdapter, RecordingTarget, register_monitors};
    use ptrewind::target::{PtraceTarget, Resume, SpawnOptions, StopEvent};
    use ptrewind::timeline::Timeline;

    let src = r#"
static volatile long sink;
static long f(long i) { return i % 7 == 0 ? i / 7 : i + 1; }
int main(void) {
    for (long i = 0; i < 4000; i++) sink += f(i);
    return 0;
}
"#;
    let exe = compile_source("cc", &examples_dir(), "ring_loops", src, &["-O0"], &[]);
    let target =
        PtraceTarget::spawn(&exe.clone().into(), &[], &SpawnOptions::default()).expect("spawn");
    let config = RecorderConfig {
        ring: RingConfig {
            region_sizes: vec![4096],
            int_on: IntOn::Every,
            ..RingConfig::default()
        },
        encoder: EncoderConfig {
            ret_compression: false,
            ..EncoderConfig::default()
        },
        write_batch: 64 * 1024,
        record_from: RecordFrom::Main,
        step_mode: StepMode::Single,
        capture_image_at_exit: false,
        ..RecorderConfig::default()
    };
    let rec = SoftRecorder::new(target, config).expect("recorder");
    let capture = SoftCapture::new(rec);
    let recording = capture.is_recording();
    let rt = RecordingTarget::new(Timeline::live(Box::new(capture), recording).expect("timeline"));
    let mut session = GdbStubAdapter::new(Box::new(rt.clone()));
    register_monitors(session.monitors_mut(), &rt);
    let t = session.target_mut();
    t.resume(Resume::Continue { signal: None }).expect("resume");
    let stop = loop {
        if let Some(ev) = t.wait(true).expect("wait") {
            break ev;
        }
    };
    // The program ran to its end (however the end is presented), not killed.
    assert!(!matches!(stop, StopEvent::Killed(_)), "{stop:?}");
    let stats = session.run_monitor("stats");
    let field = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name:?} in\n{stats}"))
    };
    let lost = field("lost bytes");
    assert!(lost > 0, "no loss counted:\n{stats}");
    assert!(field("gaps") > 0, "{stats}");
}

/// The disk fills up during `monitor save` (a 256 KiB tmpfs: the code sections alone are
/// larger): GDB shows a clear error naming the file and the cause, no `manifest.json` claims a
/// complete recording, the partial files are removed, and the recording itself is intact — a
/// save to a roomy directory afterwards works. Needs root (mount); skipped otherwise.
#[test]
fn disk_full_during_monitor_save() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("disk_full_during_monitor_save: skipped (mounting a small tmpfs needs root)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let small = tmp.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&small)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("disk_full_during_monitor_save: skipped (cannot mount a tmpfs here)");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(small.clone());
    let full = small.join("rec");
    let roomy = tmp.path().join("roomy");
    let program = recursion();
    let cmds = [
        "break factorial".to_string(),
        "continue".into(),
        "echo FULL\\n".into(),
        format!("monitor save {}", full.display()),
        "echo ROOMY\\n".into(),
        format!("monitor save {}", roomy.display()),
    ];
    let r = gdb_session(record(&[], program), program, &cmds, TIMEOUT);
    let after_full = r.after("FULL");
    assert!(
        after_full.contains("No space left on device"),
        "{}",
        r.dump()
    );
    assert!(after_full.contains("nothing saved"), "{}", r.dump());
    assert!(!full.join("manifest.json").exists(), "{}", r.dump());
    let left: Vec<_> = std::fs::read_dir(&full)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "partial files left: {left:?}");
    assert!(r.after("ROOMY").contains("saved "), "{}", r.dump());
    assert!(roomy.join("manifest.json").is_file());
}

/// The debugger vanishes in the middle of a packet, once while the program is stopped and once
/// while it runs: each time the program and its recording are kept (stopped) and the next
/// connection starts clean — its first packets are answered and the program is where it was.
#[test]
fn debugger_disconnecting_mid_packet() {
    let server = record(&[], long_running());
    let timeout = Duration::from_secs(20);
    // Stopped: half a memory read, then gone.
    let mut c = Raw::connect(server.port, timeout);
    c.ask("qSupported:multiprocess+");
    let pc_before = c.ask("p10");
    c.send(b"$m5555555");
    drop(c);
    // Running: resumed, half a packet, gone. The program must be stopped for the next one.
    let mut c = Raw::connect(server.port, timeout);
    c.ask("qSupported:multiprocess+");
    assert_eq!(
        c.ask("p10"),
        pc_before,
        "the program moved while nobody was connected"
    );
    c.send(&packet("vCont;c"));
    assert_eq!(c.ack(), b'+');
    std::thread::sleep(Duration::from_millis(300));
    c.send(b"$qRcmd,7374");
    drop(c);
    let mut c = Raw::connect(server.port, timeout);
    c.ask("qSupported:multiprocess+");
    let stop = c.ask("?");
    assert!(stop.starts_with('T') || stop.starts_with('S'), "{stop}");
    let pc_after = c.ask("p10");
    assert_ne!(pc_after, pc_before, "the program never ran");
    // Stopped, not running: the same PC twice.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(c.ask("p10"), pc_after);
    c.send(&packet("k"));
    drop(c);
    let log = server_end(server);
    assert_eq!(log.matches("are kept (stopped)").count(), 2, "{log}");
}
