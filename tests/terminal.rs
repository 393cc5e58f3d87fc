//! `ptrewind gdb` in a real terminal: a tmux pane runs it, keys are typed with `send-keys`
//! (Ctrl-C included) and the screen is read back with `capture-pane`. Skipped when tmux or GDB
//! is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

use support::cbuild::{compile_source, have};

/// A program that reads a line from the terminal, then runs until interrupted, through a loop
/// with a conditional branch (so its history grows by whole iterations).
const SPIN: &str = r#"
#include <stdio.h>
volatile unsigned long counter;
int main(void) {
    char line[64];
    printf("name? ");
    fflush(stdout);
    if (fgets(line, sizeof line, stdin))
        printf("hello %s", line);
    fflush(stdout);
    while (counter < ~0ul)
        counter++;
    return 0;
}
"#;

/// A tmux server of our own (its socket in a temp dir), killed when dropped.
struct Tmux {
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmux {
    /// Starts a detached 200x50 session running `argv` (no shell involved).
    fn start(argv: &[&str]) -> Tmux {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("tmux.sock");
        let t = Tmux { socket, _dir: dir };
        let mut cmd = t.cmd();
        cmd.args([
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            "200",
            "-y",
            "50",
        ]);
        cmd.args(argv);
        let out = cmd.output().expect("run tmux");
        assert!(
            out.status.success(),
            "tmux new-session failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Keep the pane (and its text) when the command ends, to check how it ended.
        let _ = t
            .cmd()
            .args(["set-option", "-g", "remain-on-exit", "on"])
            .output();
        t
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&self.socket);
        c
    }

    /// Types `keys` (tmux key names, e.g. `C-c`, `Enter`, or literal text).
    fn keys(&self, keys: &[&str]) {
        let out = self
            .cmd()
            .arg("send-keys")
            .args(keys)
            .output()
            .expect("tmux send-keys");
        assert!(out.status.success(), "tmux send-keys {keys:?} failed");
    }

    /// The pane's whole text, scroll-back included.
    fn screen(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-J", "-S", "-"])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the screen after byte `from` contains `needle`; returns the position after
    /// it. Fails with the screen after 60 s.
    #[track_caller]
    fn wait_for(&self, from: usize, needle: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.screen();
            if let Some(i) = s.get(from..).and_then(|t| t.find(needle)) {
                return from + i + needle.len();
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} on the screen after position {from}:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// True once the pane's command has ended.
    fn dead(&self) -> bool {
        let out = self
            .cmd()
            .args(["display-message", "-p", "#{pane_dead}"])
            .output()
            .expect("tmux display-message");
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").output();
    }
}

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_ptrewind")
}

fn build(dir: &Path) -> PathBuf {
    compile_source("cc", dir, "spin", SPIN, &["-g", "-O0"], &[])
}

/// Ctrl-C typed in `ptrewind gdb`'s terminal interrupts the program as in native GDB
/// ("Program received signal SIGINT") and the session goes on: the program still reads the
/// terminal, reverse-stepi moves back,
/// continue replays to the present and runs live again, a second Ctrl-C stops it again, and
/// `quit` ends ptrewind (the program is killed, nothing is left running).
#[test]
fn ctrl_c_in_ptrewind_gdb_interrupts_and_the_session_goes_on() {
    let tmux_ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !tmux_ok || !have("gdb") {
        eprintln!("skipped: tmux or gdb missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prog = build(dir.path());
    let prog = prog.to_str().unwrap();
    let t = Tmux::start(&[
        exe(),
        "gdb",
        "--backend",
        "ptrace",
        "--ex",
        "set pagination off",
        "--ex",
        "set confirm off",
        "--",
        prog,
    ]);
    let mut at = t.wait_for(0, "(gdb) ");
    t.keys(&["continue", "Enter"]);
    at = t.wait_for(at, "Continuing.");
    at = t.wait_for(at, "name? ");
    t.keys(&["terminal", "Enter"]);
    at = t.wait_for(at, "hello terminal");
    std::thread::sleep(Duration::from_millis(300));
    t.keys(&["C-c"]);
    at = t.wait_for(at, "Program received signal SIGINT, Interrupt.");
    at = t.wait_for(at, "(gdb) ");
    t.keys(&["pt where", "Enter"]);
    at = t.wait_for(at, "at the present: instruction ");
    at = t.wait_for(at, "(gdb) ");
    t.keys(&["reverse-stepi", "Enter"]);
    at = t.wait_for(at, "(gdb) ");
    t.keys(&["pt where", "Enter"]);
    at = t.wait_for(at, "replaying: instruction ");
    at = t.wait_for(at, "(gdb) ");
    // Forward: replays to the present (GDB's usual end-of-history stop), then runs live.
    t.keys(&["continue", "Enter"]);
    at = t.wait_for(at, "No more reverse-execution history.");
    at = t.wait_for(at, "(gdb) ");
    t.keys(&["continue", "Enter"]);
    at = t.wait_for(at, "Continuing.");
    std::thread::sleep(Duration::from_millis(300));
    // No stale copy of the first Ctrl-C stops it again by itself.
    assert!(
        !t.screen()[at..].contains("Program received"),
        "stopped without a Ctrl-C:\n{}",
        t.screen()
    );
    t.keys(&["C-c"]);
    at = t.wait_for(at, "Program received signal SIGINT, Interrupt.");
    at = t.wait_for(at, "(gdb) ");
    t.keys(&["quit", "Enter"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !t.dead() {
        assert!(
            Instant::now() < deadline,
            "ptrewind gdb did not end:\n{}",
            t.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let screen = t.screen();
    let tail = &screen[at..];
    assert!(
        !screen.contains("Remote communication error"),
        "the connection broke:\n{screen}"
    );
    assert!(
        tail.contains(" killed"),
        "ptrewind did not end the session normally:\n{screen}"
    );
}

/// A long recording reports its progress on ptrewind's terminal (instructions, rate, trace
/// bytes) every few seconds while the program runs, and says nothing when stderr is not a
/// terminal (the same run with stderr piped).
#[test]
fn record_reports_progress_on_a_terminal_only() {
    let tmux_ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !tmux_ok || !have("gdb") {
        eprintln!("skipped: tmux or gdb missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = "volatile unsigned long n;\nint main(void) { while (n < ~0ul) n++; return 0; }\n";
    let prog = compile_source("cc", dir.path(), "loop", src, &["-g", "-O0"], &[]);
    // Runs GDB against PORT: continue, and Ctrl-C (SIGINT to GDB) once `done` says so.
    fn drive(prog: &Path, port: u16, mut done: impl FnMut() -> bool) -> support::gdb::Finished {
        let mut gdb = support::gdb::gdb_batch();
        gdb.arg("-ex")
            .arg(format!("target remote 127.0.0.1:{port}"))
            .arg("-ex")
            .arg("continue")
            .arg(prog);
        support::gdb::run_interrupting(&mut gdb, Duration::from_secs(90), &mut done)
    }
    // A terminal: ptrewind record in a tmux pane, on a fixed free port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let t = Tmux::start(&[
        exe(),
        "record",
        "--backend",
        "soft",
        "--listen",
        &listen,
        "--",
        prog.to_str().unwrap(),
    ]);
    t.wait_for(0, "listening on");
    // Not a terminal: the same with stderr piped, at the same time.
    let piped = support::gdb::Server::spawn(
        support::gdb::ptrewind()
            .args([
                "record",
                "--backend",
                "ptrace",
                "--listen",
                "127.0.0.1:0",
                "--",
            ])
            .arg(&prog),
    );
    let piped_port = piped.port;
    let p = prog.clone();
    // The piped run is interrupted after 7 s; the terminal's once its first progress line is
    // on the screen (a few seconds of recording, more on a loaded machine), or after 60 s.
    let other = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(7);
        drive(&p, piped_port, || Instant::now() >= deadline)
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let g = drive(&prog, port, || {
        Instant::now() >= deadline
            || t.screen()
                .lines()
                .any(|l| l.starts_with("ptrewind: recording: ") && l.ends_with(" of trace"))
    });
    let _ = other.join();
    assert!(g.status.is_some(), "gdb timed out: {}", g.stderr);
    let screen = t.screen();
    let line = screen
        .lines()
        .find(|l| l.starts_with("ptrewind: recording: "))
        .unwrap_or_else(|| panic!("no progress line:\n{screen}"));
    assert!(
        line.contains(" instructions (") && line.contains("/s), ") && line.ends_with(" of trace"),
        "{line}"
    );
    let mut child = piped.child;
    let _ = support::gdb::wait_until(&mut child, Instant::now() + Duration::from_secs(30));
    let err = piped.stderr.join().unwrap();
    assert!(err.contains("debugger connected"), "{err}");
    assert!(!err.contains("ptrewind: recording:"), "{err}");
}
