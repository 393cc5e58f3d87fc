//! Every way ptrewind can be ended leaves nothing behind: ended by SIGTERM, SIGHUP or SIGINT
//! (waiting for a debugger, with one connected while the program runs, while QEMU records to
//! the end), or by its GDB vanishing, it exits non-zero saying why, the program it started is
//! killed (one it attached to is detached, running), no QEMU is left, and the temporary
//! directories it made (QEMU's recording, sockets, GDB's script) are gone. Each test points
//! `TMPDIR` at a directory of its own and checks it is empty at the end.

mod support;

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::cbuild::{build_example, have, nm_symbol};
use support::gdb::{Server, ptrewind, run_until, wait_until};
use support::qemu::{plugin, qemu_available};
use support::rsp::Raw;

/// A test's private `TMPDIR` (inside a directory that also holds the test program).
struct Scratch {
    _root: tempfile::TempDir,
    tmp: PathBuf,
    exe: PathBuf,
}

/// `attachme` (a minute of `tick()` calls 1 ms apart) built in a fresh directory, with an
/// empty `TMPDIR`.
fn scratch() -> Scratch {
    let root = tempfile::tempdir().expect("tempdir");
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir tmp");
    // Not PIE: `tick`'s address is the symbol's (a breakpoint in an attached process).
    let exe = build_example(root.path(), "attachme", &["-no-pie"]);
    Scratch {
        _root: root,
        tmp,
        exe,
    }
}

/// What is left in `dir`.
fn left_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read TMPDIR")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

fn send(pid: i32, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).expect("send the signal");
}

/// Whether process `pid` is gone within 5 s (a dead child of a dead parent is reaped by init;
/// a zombie counts as gone).
fn gone(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat) if stat_state(&stat) == Some('Z') => return true,
            Ok(_) => {}
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The state letter of a `/proc/PID/stat` line.
fn stat_state(stat: &str) -> Option<char> {
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// Sends `sig` to the server and waits (at most 20 s) for it to end: its exit status and
/// stderr.
fn end_with(server: Server, sig: Signal) -> (ExitStatus, String) {
    let Server {
        mut child,
        stderr,
        reaper: _reaper,
        ..
    } = server;
    send(child.id() as i32, sig);
    let status = wait_until(&mut child, Instant::now() + Duration::from_secs(20));
    let stderr = stderr.join().expect("stderr reader");
    let status = status.unwrap_or_else(|| panic!("ptrewind did not end on {sig}: {stderr}"));
    (status, stderr)
}

/// `record --backend qemu` (live) of `exe`, recording into a temporary directory of `tmp`.
fn qemu_server(s: &Scratch, extra: &[&str]) -> Server {
    let mut cmd = ptrewind();
    cmd.env("TMPDIR", &s.tmp)
        .args(["record", "--backend", "qemu", "--listen", "127.0.0.1:0"])
        .arg("--qemu-plugin")
        .arg(plugin())
        .args(extra)
        .arg("--")
        .arg(&s.exe);
    Server::spawn(&mut cmd)
}

/// Checks the end: exit code 128 + `sig`, the message naming the signal and `what` became of
/// the program, the program (QEMU for the QEMU backend) gone, `TMPDIR` empty.
fn check_end(s: &Scratch, status: ExitStatus, stderr: &str, sig: Signal, pid: i32, what: &str) {
    assert_eq!(status.code(), Some(128 + sig as i32), "{stderr}");
    let said = format!("ptrewind: ended by {sig}; {what}");
    assert!(stderr.contains(&said), "no {said:?} in: {stderr}");
    assert!(gone(pid), "process {pid} is left: {stderr}");
    assert_eq!(left_in(&s.tmp), Vec::<String>::new(), "{stderr}");
}

#[test]
fn sigterm_ends_a_waiting_qemu_server_and_removes_its_recording() {
    if !qemu_available() {
        return;
    }
    let s = scratch();
    let server = qemu_server(&s, &[]);
    let pid = server.pid;
    // The recording directory exists while the session does.
    let made = left_in(&s.tmp);
    assert!(
        made.len() == 1 && made[0].starts_with("ptrewind-qemu-"),
        "{made:?}"
    );
    // Private: the trace shows everything the program did.
    let mode = std::fs::metadata(s.tmp.join(&made[0]))
        .expect("recording directory")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o700
    );
    let (status, stderr) = end_with(server, Signal::SIGTERM);
    check_end(
        &s,
        status,
        &stderr,
        Signal::SIGTERM,
        pid,
        &format!("process {pid} killed"),
    );
}

#[test]
fn sighup_with_a_debugger_connected_while_the_program_runs_under_qemu() {
    if !qemu_available() {
        return;
    }
    let s = scratch();
    let server = qemu_server(&s, &[]);
    let pid = server.pid;
    let mut gdb = Raw::connect(server.port, Duration::from_secs(20));
    assert!(gdb.ask("?").starts_with('T'), "stopped at the start");
    // Running (a minute of sleeps): the server waits for the program, not for the debugger.
    gdb.send(&support::rsp::packet("c"));
    assert_eq!(gdb.ack(), b'+');
    std::thread::sleep(Duration::from_millis(300));
    let (status, stderr) = end_with(server, Signal::SIGHUP);
    check_end(
        &s,
        status,
        &stderr,
        Signal::SIGHUP,
        pid,
        &format!("process {pid} killed"),
    );
    // The debugger's connection was closed, not left hanging.
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut gdb.s, &mut rest);
}

/// `--once`: the debugger vanishing ends the session like `kill` would (exit 0): QEMU killed,
/// the recording removed.
#[test]
fn a_vanished_debugger_ends_a_once_session_under_qemu_cleanly() {
    if !qemu_available() {
        return;
    }
    let s = scratch();
    let mut server = qemu_server(&s, &["--once"]);
    let pid = server.pid;
    let mut gdb = Raw::connect(server.port, Duration::from_secs(20));
    assert!(gdb.ask("?").starts_with('T'), "stopped at the start");
    gdb.send(&support::rsp::packet("c"));
    assert_eq!(gdb.ack(), b'+');
    std::thread::sleep(Duration::from_millis(300));
    let closed = Instant::now();
    drop(gdb);
    let status = wait_until(&mut server.child, Instant::now() + Duration::from_secs(20));
    let stderr = server.stderr.join().expect("stderr");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
    // Not a timing measure: a kill of the running program used to wait out the 10 s deadline
    // of a `k` packet QEMU's stub does not read while the guest runs.
    assert!(
        closed.elapsed() < Duration::from_secs(5),
        "took {:?}: {stderr}",
        closed.elapsed()
    );
    assert!(
        stderr.contains(&format!("debugger disconnected; process {pid} killed")),
        "{stderr}"
    );
    assert!(gone(pid), "QEMU is left: {stderr}");
    assert_eq!(left_in(&s.tmp), Vec::<String>::new(), "{stderr}");
}

#[test]
fn sigint_and_sigterm_end_the_ptrace_backend_and_kill_the_program() {
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        let s = scratch();
        let mut cmd = ptrewind();
        cmd.env("TMPDIR", &s.tmp)
            .args([
                "record",
                "--backend",
                "ptrace",
                "--listen",
                "127.0.0.1:0",
                "--",
            ])
            .arg(&s.exe);
        let server = Server::spawn(&mut cmd);
        let pid = server.pid;
        let mut gdb = Raw::connect(server.port, Duration::from_secs(20));
        assert!(gdb.ask("?").starts_with('T'), "stopped at main");
        if sig == Signal::SIGTERM {
            // Running and recording.
            gdb.send(&support::rsp::packet("c"));
            assert_eq!(gdb.ack(), b'+');
            std::thread::sleep(Duration::from_millis(300));
        }
        let (status, stderr) = end_with(server, sig);
        check_end(
            &s,
            status,
            &stderr,
            sig,
            pid,
            &format!("process {pid} killed"),
        );
    }
}

#[test]
fn sigterm_detaches_an_attached_process_and_leaves_it_running() {
    let s = scratch();
    let mut victim = Command::new(&s.exe)
        .stdout(Stdio::null())
        .spawn()
        .expect("start attachme");
    let pid = victim.id() as i32;
    std::thread::sleep(Duration::from_millis(100));
    let mut cmd = ptrewind();
    cmd.env("TMPDIR", &s.tmp)
        .args(["attach", "--listen", "127.0.0.1:0"])
        .arg(pid.to_string());
    let server = Server::spawn(&mut cmd);
    // Stopped at a breakpoint in `tick` (recorded on the way): its INT3 must go with the
    // detach, or the next call would kill the program with SIGTRAP.
    let mut gdb = Raw::connect(server.port, Duration::from_secs(20));
    let tick = nm_symbol(&s.exe, "tick");
    assert_eq!(gdb.ask(&format!("Z0,{tick:x},1")), "OK");
    let stop = gdb.ask("c");
    assert!(stop.starts_with("T05"), "{stop}");
    let (status, stderr) = end_with(server, Signal::SIGTERM);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "ptrewind: ended by SIGTERM; detached from process {pid}"
        )),
        "{stderr}"
    );
    // Running on its own: not traced, not stopped, not dead.
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut state, mut tracer) = (None, None);
    while Instant::now() < deadline {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        state = stat_state(&stat);
        tracer = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:").map(|v| v.trim().to_string()));
        if matches!(state, Some('S' | 'R')) && tracer.as_deref() == Some("0") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // A few hundred more calls of `tick`.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        victim.try_wait().expect("try_wait").is_none(),
        "the attached program died: {stderr}"
    );
    assert!(
        matches!(state, Some('S' | 'R')) && tracer.as_deref() == Some("0"),
        "state {state:?}, tracer {tracer:?}: {stderr}"
    );
    let _ = victim.kill();
    let _ = victim.wait();
    assert_eq!(left_in(&s.tmp), Vec::<String>::new());
}

/// SIGTERM while QEMU records a program to its end (`--no-live`): QEMU is killed, the
/// temporary recording removed. SIGKILL cannot be handled: the directory stays, but QEMU still
/// dies with ptrewind (it used to run the program to its end, recording for nobody).
#[test]
fn sigterm_while_qemu_records_to_the_end() {
    if !qemu_available() {
        return;
    }
    for sig in [Signal::SIGTERM, Signal::SIGKILL] {
        let s = scratch();
        let mut child = ptrewind()
            .env("TMPDIR", &s.tmp)
            .args(["record", "--backend", "qemu", "--no-live", "--qemu-plugin"])
            .arg(plugin())
            .arg("--")
            .arg(&s.exe)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run ptrewind");
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = support::gdb::collect(child.stderr.take().expect("stderr"), Some(tx));
        // "ptrewind: recording every thread under QEMU into DIR (process PID) ..."
        let qemu = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("the recording line");
            if let Some(rest) = line.split_once("(process ").map(|(_, r)| r) {
                break rest
                    .split(')')
                    .next()
                    .and_then(|p| p.parse::<i32>().ok())
                    .expect("QEMU's pid");
            }
        };
        std::thread::sleep(Duration::from_millis(300));
        send(child.id() as i32, sig);
        let status = wait_until(&mut child, Instant::now() + Duration::from_secs(20));
        // QEMU shares the stderr pipe: its end is also QEMU's.
        let stderr = stderr.join().expect("stderr");
        let status = status.unwrap_or_else(|| panic!("ptrewind did not end: {stderr}"));
        assert!(gone(qemu), "QEMU is left after {sig}: {stderr}");
        if sig == Signal::SIGKILL {
            assert_eq!(status.signal(), Some(libc::SIGKILL));
            continue;
        }
        assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "ptrewind: ended by SIGTERM while recording under QEMU; QEMU (process {qemu}) \
                 killed, the recording was removed from"
            )),
            "{stderr}"
        );
        assert_eq!(left_in(&s.tmp), Vec::<String>::new(), "{stderr}");
    }
}

#[test]
fn a_finished_qemu_recording_is_removed_once_read_unless_named() {
    if !qemu_available() {
        return;
    }
    let s = scratch();
    let quick = build_example(s.tmp.parent().expect("root"), "exitcode", &[]);
    let named = s.tmp.parent().expect("root").join("named");
    for dir in [None, Some(&named)] {
        let mut cmd = ptrewind();
        cmd.env("TMPDIR", &s.tmp)
            .args([
                "record",
                "--backend",
                "qemu",
                "--no-live",
                "--listen",
                "127.0.0.1:0",
            ])
            .arg("--qemu-plugin")
            .arg(plugin());
        if let Some(d) = dir {
            cmd.arg("--trace-dir").arg(d);
        }
        cmd.arg("--").arg(&quick);
        let server = Server::spawn(&mut cmd);
        // Served from memory: the temporary directory is already gone.
        assert_eq!(left_in(&s.tmp), Vec::<String>::new());
        let (status, stderr) = end_with(server, Signal::SIGTERM);
        assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{stderr}");
        assert!(stderr.contains("ptrewind: ended by SIGTERM; replay of process"));
        assert_eq!(left_in(&s.tmp), Vec::<String>::new());
    }
    assert!(
        named.join("launch.json").is_file(),
        "the named recording stays"
    );
}

#[test]
fn ptrewind_gdb_ends_cleanly_when_gdb_vanishes_or_ptrewind_is_terminated() {
    if !qemu_available() || !have("gdb") {
        return;
    }
    // GDB killed outright mid-session; then ptrewind itself sent SIGTERM (from GDB's shell:
    // the shell's parent is GDB, GDB's parent is ptrewind), which closes GDB's connection and
    // is passed on to GDB. The `continue` after it would run the program for a minute on an
    // open connection.
    let cases: [(&str, Option<i32>); 2] = [
        ("kill -KILL $PPID", None),
        (
            "kill -TERM $(ps -o ppid= -p $PPID)",
            Some(128 + libc::SIGTERM),
        ),
    ];
    for (shell, code) in cases {
        let s = scratch();
        let cli: Vec<OsString> = [
            "gdb",
            "--batch",
            "--backend",
            "qemu",
            "--ex",
            "info threads",
            "--ex",
            &format!("shell {shell}"),
            "--ex",
            "continue",
            "--qemu-plugin",
        ]
        .iter()
        .map(Into::into)
        .chain([plugin().into_os_string(), "--".into(), s.exe.clone().into()])
        .collect();
        let started = Instant::now();
        let out = run_until(
            ptrewind().env("TMPDIR", &s.tmp).args(&cli),
            Duration::from_secs(40),
        );
        let status = out
            .status
            .unwrap_or_else(|| panic!("ptrewind gdb hung: {}", out.stderr));
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the program ran on: {}",
            out.stderr
        );
        assert!(!status.success(), "{}", out.stderr);
        if let Some(code) = code {
            assert_eq!(status.code(), Some(code), "{}", out.stderr);
            assert!(
                out.stderr.contains("ptrewind: ended by SIGTERM; process"),
                "{}",
                out.stderr
            );
        }
        // QEMU's pid, from "ptrewind: started process PID; listening on …".
        let qemu: i32 = out
            .stderr
            .split("started process ")
            .nth(1)
            .and_then(|r| r.split(';').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no QEMU pid in: {}", out.stderr));
        assert!(gone(qemu), "QEMU is left: {}", out.stderr);
        assert_eq!(left_in(&s.tmp), Vec::<String>::new(), "{}", out.stderr);
    }
}
