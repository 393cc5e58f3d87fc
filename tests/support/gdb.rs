//! Driving debuggers and the `ptrewind` binary from tests: child processes with deadlines
//! (killed, never waited for forever), their output collected on threads, GDB in batch mode,
//! and `ptrewind record` servers whose port and pid are read from their stderr.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Collects a child's pipe on a thread; lines are also forwarded to `tx` as they arrive.
pub fn collect(
    pipe: impl Read + Send + 'static,
    tx: Option<mpsc::Sender<String>>,
) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if let Some(tx) = &tx {
                let _ = tx.send(line.clone());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    })
}

/// Reads a child's pipe to its end on a thread, as text (invalid UTF-8, such as binary packet
/// bytes in a debugger's protocol log, is replaced, not a reason to stop reading).
pub fn collect_all(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = pipe.read_to_end(&mut all);
        String::from_utf8_lossy(&all).into_owned()
    })
}

/// Waits for `child` until `deadline`; kills it and returns `None` on timeout.
pub fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ends a `ptrewind` server the way a user would (SIGTERM: it kills its program and removes
/// its temporary directories, which SIGKILL would leave in /tmp) and reaps it; SIGKILL if it
/// has not ended within 10 s.
pub fn terminate(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    wait_until(child, Instant::now() + Duration::from_secs(10))
}

/// A child process run to its end or to a deadline.
pub struct Finished {
    /// The exit status; `None` if it was killed at the deadline.
    pub status: Option<ExitStatus>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Runs `cmd` (stdin from /dev/null, output collected) and kills it if it has not finished
/// within `timeout`.
pub fn run_until(cmd: &mut Command, timeout: Duration) -> Finished {
    run_interrupting(cmd, timeout, || false)
}

/// [`run_until`], sending the child one SIGINT (as a terminal's Ctrl-C would) as soon as
/// `ready()` returns true (polled every 20 ms).
pub fn run_interrupting(
    cmd: &mut Command,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Finished {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()));
    let out = collect_all(child.stdout.take().expect("piped stdout"));
    let err = collect_all(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + timeout;
    let mut interrupted = false;
    while !interrupted && Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if ready() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
            interrupted = true;
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let status = wait_until(&mut child, deadline);
    Finished {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// `gdb -batch -nx` with confirmations and paging off; add `-ex` commands and run it with
/// [`run_until`].
pub fn gdb_batch() -> Command {
    let mut cmd = Command::new("gdb");
    cmd.args([
        "-batch",
        "-nx",
        "-ex",
        "set confirm off",
        "-ex",
        "set pagination off",
    ]);
    cmd
}

/// The `target/<profile>` directory of a running benchmark example
/// (`target/release/examples/NAME` → `target/release`): where the workspace's `ptrewind` and
/// its QEMU plugin are.
pub fn release_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// A `ready` for [`gdb_session_interrupting`]: true once the file `marker` (made by a GDB
/// `shell touch` right before the command to interrupt) has existed for `delay`.
pub fn marker_older_than(marker: PathBuf, delay: Duration) -> impl FnMut() -> bool {
    move || {
        std::fs::metadata(&marker)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|e| e > delay))
    }
}

/// Every `monitor stats` report of range steps in GDB's output, in order: the range steps
/// counted and the instructions stepped in them. (The stats are not ordered with GDB's own
/// output.)
pub fn range_steps(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("range steps"))
        .filter_map(|v| {
            let mut nums = v
                .split(|c: char| !c.is_ascii_digit())
                .filter(|w| !w.is_empty())
                .map(|w| w.parse::<u64>().ok());
            Some((nums.next()??, nums.next()??))
        })
        .collect()
}

/// A `Command` for the `ptrewind` binary under test.
pub fn ptrewind() -> Command {
    // Set for integration tests only (benchmarks include this module too).
    let Some(exe) = option_env!("CARGO_BIN_EXE_ptrewind") else {
        panic!("the ptrewind binary is only known to integration tests");
    };
    Command::new(exe)
}

/// A `ptrewind record` server with its port and pid read from stderr.
pub struct Server {
    /// The `ptrewind` process.
    pub child: Child,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// The debugged process.
    pub pid: i32,
    /// Collects ptrewind's stderr.
    pub stderr: JoinHandle<String>,
    /// Collects ptrewind's stdout (the debugged program's, which it inherits).
    pub stdout: JoinHandle<String>,
    /// ptrewind's stderr lines up to the listening line (also in `stderr`, which is only
    /// complete once the server has ended).
    pub early: Vec<String>,
    /// Kills the server if the test ends (or panics) while it still runs.
    pub reaper: Reaper,
}

/// Kills a `ptrewind` child that a test left running — a failed assertion must not leave a
/// server (and the program it debugs) behind. A field of [`Server`] rather than a `Drop` on
/// `Server` itself, so that tests can still move `child`, `stderr` and `stdout` out of it.
pub struct Reaper {
    pid: i32,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // Only a process that is still our child (alive or a zombie, so its pid cannot have
        // been reused) is killed; one that a test already waited for is left alone.
        let ours = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| {
                let after_name = &stat[stat.rfind(')')? + 2..];
                after_name.split(' ').nth(1)?.parse::<u32>().ok()
            })
            == Some(std::process::id());
        if ours {
            // SIGTERM first: ptrewind then kills its program and removes its temporary
            // directories (SIGKILL would leave them in /tmp); SIGKILL if it has not ended
            // within 5 s.
            use nix::sys::signal::{Signal, kill};
            use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
            let pid = nix::unistd::Pid::from_raw(self.pid);
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(10)),
                    _ => return,
                }
            }
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
        }
    }
}

impl Server {
    /// Starts `ptrewind record --backend ptrace --listen 127.0.0.1:0 -- program args` (the
    /// tests' default: exact registers and memory in the past; `auto` would pick QEMU).
    pub fn start(program: &Path, args: &[&str]) -> Server {
        let mut cli: Vec<OsString> = [
            "record",
            "--backend",
            "ptrace",
            "--listen",
            "127.0.0.1:0",
            "--",
        ]
        .iter()
        .map(Into::into)
        .collect();
        cli.push(program.into());
        cli.extend(args.iter().map(Into::into));
        Server::start_cli(&cli)
    }

    /// `ptrewind replay DIR` on a loopback port (a `monitor save` directory).
    pub fn replay(dir: &Path) -> Server {
        Server::spawn(
            ptrewind()
                .args(["replay", "--listen", "127.0.0.1:0"])
                .arg(dir),
        )
    }

    /// Starts `ptrewind` with arguments `cli`, which must make it print its listening line.
    pub fn start_cli(cli: &[OsString]) -> Server {
        Server::spawn(ptrewind().args(cli))
    }

    /// Starts the prepared `ptrewind` command `cmd` (see [`ptrewind`]; arguments and
    /// environment already set), which must make it print its listening line within 30 s.
    pub fn spawn(cmd: &mut Command) -> Server {
        Server::spawn_within(cmd, Duration::from_secs(30))
    }

    /// [`Server::spawn`], waiting up to `timeout` for the listening line (a recording run to
    /// its end first, as the benchmarks' large ones, takes longer).
    pub fn spawn_within(cmd: &mut Command, timeout: Duration) -> Server {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run ptrewind");
        let (tx, rx) = mpsc::channel();
        let stderr = collect(child.stderr.take().unwrap(), Some(tx));
        let stdout = collect(child.stdout.take().unwrap(), None);
        let deadline = Instant::now() + timeout;
        let (mut port, mut pid, mut early) = (None, None, Vec::new());
        while port.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "ptrewind printed no listening line: {}",
                    stderr.join().unwrap()
                );
            };
            // "ptrewind: started process PID; listening on 127.0.0.1:PORT"
            let rest = line
                .strip_prefix("ptrewind: started process ")
                .or_else(|| line.strip_prefix("ptrewind: attached to process "))
                .or_else(|| line.strip_prefix("ptrewind: replaying process "));
            if let Some(rest) = rest {
                let (p, addr) = rest.split_once("; listening on ").unwrap();
                pid = Some(p.parse().unwrap());
                port = Some(addr.rsplit(':').next().unwrap().parse().unwrap());
            }
            early.push(line);
        }
        let reaper = Reaper {
            pid: child.id() as i32,
        };
        Server {
            child,
            port: port.unwrap(),
            pid: pid.unwrap(),
            stderr,
            stdout,
            early,
            reaper,
        }
    }
}

/// One GDB batch session against a [`Server`], both run to their end.
pub struct GdbRun {
    /// GDB's stdout followed by its stderr.
    pub gdb: String,
    /// ptrewind's stderr.
    pub server: String,
    /// The debugged program's stdout (inherited by ptrewind).
    pub program_stdout: String,
    /// The debugged process.
    pub pid: i32,
}

impl GdbRun {
    /// GDB's and the server's output, for failure messages.
    pub fn dump(&self) -> String {
        format!("--- gdb:\n{}\n--- server:\n{}", self.gdb, self.server)
    }

    /// Fails unless GDB's output contains `needle`.
    #[track_caller]
    pub fn expect(&self, needle: &str) {
        assert!(
            self.gdb.contains(needle),
            "GDB output lacks {needle:?}\n{}",
            self.dump()
        );
    }

    /// Position of `needle` in GDB's output (fails if absent).
    #[track_caller]
    pub fn pos(&self, needle: &str) -> usize {
        self.expect(needle);
        self.gdb.find(needle).unwrap()
    }

    /// Values printed by `printf "TAG %lx\n", ...` lines, in order.
    pub fn tagged(&self, tag: &str) -> Vec<String> {
        let prefix = format!("{tag} ");
        self.gdb
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }

    /// GDB's output after the line `mark` (printed with `echo mark\n`).
    #[track_caller]
    pub fn after(&self, mark: &str) -> &str {
        let i = self
            .gdb
            .find(&format!("{mark}\n"))
            .unwrap_or_else(|| panic!("no {mark}\n{}", self.dump()));
        &self.gdb[i + mark.len() + 1..]
    }

    /// The first hexadecimal value GDB printed (`$N = 0x…`, e.g. `p/x $pc`) after the line
    /// `mark`; fails if there is none.
    #[track_caller]
    pub fn hex_after(&self, mark: &str) -> u64 {
        self.after(mark)
            .lines()
            .find_map(|l| l.split_once(" = 0x").map(|x| x.1))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or_else(|| panic!("no hex value after {mark}: {}", self.dump()))
    }
}

/// Runs GDB in batch mode connected to `server`, with `commands` as `-ex` arguments after
/// `target remote` and `program` as its file; fails if GDB has not finished within `timeout`
/// or the server has not exited 10 s after GDB (both are killed then).
pub fn gdb_session<S: AsRef<std::ffi::OsStr>>(
    server: Server,
    program: &Path,
    commands: &[S],
    timeout: Duration,
) -> GdbRun {
    gdb_session_interrupting(server, program, commands, timeout, || false)
}

/// [`gdb_session`], sending GDB a SIGINT (Ctrl-C: GDB interrupts the running target) once
/// `ready()` returns true.
pub fn gdb_session_interrupting<S: AsRef<std::ffi::OsStr>>(
    mut server: Server,
    program: &Path,
    commands: &[S],
    timeout: Duration,
    ready: impl FnMut() -> bool,
) -> GdbRun {
    let mut cmd = gdb_batch();
    cmd.arg("-ex")
        .arg(format!("target remote 127.0.0.1:{}", server.port));
    for c in commands {
        cmd.arg("-ex").arg(c);
    }
    cmd.arg(program);
    let g = run_interrupting(&mut cmd, timeout, ready);
    let server_status = wait_until(&mut server.child, Instant::now() + Duration::from_secs(10));
    let gdb_text = format!("{}{}", g.stdout, g.stderr);
    let server_text = server.stderr.join().unwrap();
    let program_stdout = server.stdout.join().unwrap();
    assert!(
        g.status.is_some(),
        "gdb timed out after {timeout:?}\n--- gdb:\n{gdb_text}\n--- server:\n{server_text}"
    );
    assert!(
        server_status.is_some(),
        "ptrewind did not exit after gdb\n--- gdb:\n{gdb_text}\n--- server:\n{server_text}"
    );
    GdbRun {
        gdb: gdb_text,
        server: server_text,
        program_stdout,
        pid: server.pid,
    }
}
