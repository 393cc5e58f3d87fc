//! Interactive latency as a debugger user sees it: real GDB, timing each `reverse-stepi` from
//! GDB's Python (`time.perf_counter` around `gdb.execute`), against recordings of 10^6, 10^7 and
//! 10^8 instructions; GDB's own `record full` at the size it reaches is the baseline, timed by
//! the same script in the same run.
//!
//! ```text
//! cargo build --release --workspace && \
//! cargo run --release --example bench_gdb_latency -- [--steps 1000] [--sizes 1e6,1e7,1e8]
//!                                                    [--full-size 1e6] [--no-full]
//!                                                    [--ptrewind PATH]... [--poll-us LIST]
//!                                                    [--no-lldb]
//! ```
//!
//! `--ptrewind PATH` (repeatable) times that `ptrewind` binary (its QEMU plugin next to it)
//! instead of the workspace's, e.g. an older build as a before/after comparison in one run.
//! `--poll-us LIST` (default `default,0`): each server is run once per value, with
//! `PTREWIND_POLL_US` set to it (`default`: unset), i.e. with the server's default poll window
//! for the debugger's next packet and with none (it blocks in `read` after every reply).
//!
//! For each size a small C program (a loop of calls and data-dependent branches, no system
//! calls) is recorded to completion under `ptrewind record --backend qemu` and served to GDB
//! (PC-only past). GDB then takes `--steps` reverse-stepi at the end of the recording, and as many
//! again after `monitor goto` to the middle of the history (a position whose segment no step has
//! touched: the first step there pays the cold decode). The baseline runs the same program under
//! GDB with `record full` from `main` to the loop's end (`--full-size` instructions; GDB records
//! about 10^5–10^6 instructions/s, so larger sizes take minutes) and times the same steps.
//! Before GDB, a raw remote-protocol client times the server alone on the same recording: `bs`
//! (one reverse step) at the end and after `monitor goto` to the middle, and a refused one-byte
//! memory read (`m0,1`) as the floor of one round trip over loopback (the server still decodes,
//! dispatches and answers it). Then the floor of any remote stub (`canned-stub`): GDB takes
//! `LEARN_STEPS` reverse-stepi through a proxy that learns the server's replies, and then
//! `--steps` more against a stub that only plays those replies back (see `mod canned`); this
//! leaves the server `LEARN_STEPS` instructions before the end. GDB has one breakpoint of the user's (`done`, as in the
//! `record full` session) and is timed first with its defaults (`end,gdb-defaults`): seven
//! packets per `reverse-stepi` on this target (that breakpoint and the dynamic linker's
//! inserted and removed, the step, the register file, the thread list: `tests/round_trips.rs`
//! counts them). Then with `gdb-scripts/ptrewind.py` loaded, as `ptrewind gdb` and the IDE
//! setups run it (`end`, `middle`): breakpoints stay inserted while stopped, three packets per
//! step.
//! Then GDB disconnects and lldb-19 (when installed; `--no-lldb` skips it) connects to the
//! same server, imports `gdb-scripts/ptrewind_lldb.py` and times as many `pt reverse-stepi`
//! (`lldb,pt-reverse-stepi`): the helper's reverse step, two `bs` and LLDB's own
//! `thread step-inst`, so that LLDB shows a stop it saw itself.
//! Printed per series: median, 99th percentile and max in milliseconds, and the ratio of
//! `record full`'s median to it.
//!
//! Needs `gdb`, `cc` and `qemu-x86_64`, and the workspace built in release mode (the `ptrewind`
//! binary and the QEMU plugin next to this example's directory).

// Shared with the tests, which use more of them: the raw protocol client, and the `ptrewind`
// server starter (port from its listening line, output collected on threads, ended with
// SIGTERM if a run fails), as in bench_qemu_watch.
#[allow(dead_code)]
#[path = "../tests/support/gdb.rs"]
mod gdb;
#[allow(dead_code)]
#[path = "../tests/support/rsp.rs"]
mod rsp;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The traced program: `loop N` runs N iterations of a loop with a call and a branch that depends
/// on the data; `done` marks the end for `record full`.
const PROGRAM: &str = include_str!("c/latency_loop.c");

/// GDB Python: `lat(label, n)` times n reverse-stepi and prints one `LAT` line.
const SCRIPT: &str = r#"
import gdb, time
def lat(label, n):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        gdb.execute("reverse-stepi", to_string=True)
        ts.append(time.perf_counter() - t0)
    pc = int(gdb.parse_and_eval("$pc"))
    ts.sort()
    print("LAT %s n=%d median=%.4f p99=%.4f max=%.4f pc=%#x" % (
        label, n, ts[n // 2] * 1e3, ts[min(n - 1, int(n * 0.99))] * 1e3, ts[-1] * 1e3, pc))
"#;

/// LLDB commands (after `command script import` of the helper and `gdb-remote`): time
/// `N` `pt reverse-stepi` (the helper's reverse step: `bs` twice and LLDB's own `thread
/// step-inst`, so LLDB shows a stop it saw) through LLDB's Python and print one `LAT` line.
const LLDB_SCRIPT: &str = r#"script import time; ci = lldb.debugger.GetCommandInterpreter(); res = lldb.SBCommandReturnObject(); ts = []
script exec("for _ in range(N):\n    t0 = time.perf_counter(); ci.HandleCommand('pt reverse-stepi', res); ts.append(time.perf_counter() - t0)")
script ts.sort(); print("LAT lldb,pt-reverse-stepi n=%d median=%.4f p99=%.4f max=%.4f ok=%s" % (len(ts), ts[len(ts) // 2] * 1e3, ts[min(len(ts) - 1, int(len(ts) * 0.99))] * 1e3, ts[-1] * 1e3, res.Succeeded()))
"#;

/// Instructions per loop iteration of PROGRAM at -O1 with GCC 12 (measured: 5 000 000 iterations
/// recorded 85.1 M instructions; the printed counts are the recorded ones).
const INSNS_PER_ITER: f64 = 17.0;

struct Series {
    label: String,
    median: f64,
    p99: f64,
    max: f64,
}

fn parse_lat(out: &str) -> Vec<Series> {
    out.lines()
        .filter_map(|l| l.strip_prefix("LAT "))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let label = it.next()?.to_string();
            let get = |k: &str| -> Option<f64> {
                it.clone()
                    .find_map(|f| f.strip_prefix(k).and_then(|v| v.parse().ok()))
            };
            Some(Series {
                label,
                median: get("median=")?,
                p99: get("p99=")?,
                max: get("max=")?,
            })
        })
        .collect()
}

/// Sends `body` and returns the reply, acknowledged; console output (`O…` packets, as `qRcmd`
/// sends before its `OK`) is skipped.
fn ask(c: &mut rsp::Raw, body: &str) -> String {
    c.send(&rsp::packet(body));
    loop {
        // `reply` skips the ack before the packet.
        let r = c.reply();
        c.send(b"+");
        if !(r.starts_with('O') && r != "OK") {
            return r;
        }
    }
}

fn parse_size(s: &str) -> u64 {
    s.parse::<f64>()
        .map(|v| v as u64)
        .unwrap_or_else(|_| panic!("bad size {s}"))
}

/// The floor of any remote stub: GDB served by replies learned from ptrewind and then played back
/// with no work at all (no history, no decoding, no dispatch beyond a hash lookup).
///
/// A learning session runs GDB through a proxy to the real server and keeps, for each request
/// GDB sent, the frames the server answered with. A second GDB session with the same commands
/// then talks to a stub that only looks the request up and writes those frames back, polling for
/// the next request for up to 1 ms after each reply as the server does. Every `bs` is answered
/// with the last stop the server reported, so GDB stays at one PC and sends the requests it sent
/// there (memory reads around it, the register file, the thread list); requests it did not send
/// while learning are counted and answered as unsupported (`E01` for memory reads). Both sides
/// frame packets with the server's own `Framer`.
mod canned {
    use ptrewind::rsp;
    use ptrewind::server::router::{Frame, Framer};
    use std::collections::HashMap;
    use std::io::{ErrorKind, Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::sync::{Arc, Mutex};
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    /// Longest packet body kept (the server's replies are at most its `PacketSize`).
    const MAX_BODY: usize = 1 << 20;

    /// Packets in the order the proxy saw them: (from GDB?, escaped body).
    type Log = Vec<(bool, Vec<u8>)>;

    /// Request body (escaped) → the server's frames in answer, `$…#cs` each (a `qRcmd`'s
    /// console output included).
    pub type Replies = HashMap<Vec<u8>, Vec<u8>>;

    /// The packet bodies in `bytes`, through the server's own framer (acks and interrupts
    /// skipped; a packet with a bad checksum would not be learned).
    fn packets(framer: &mut Framer, bytes: &[u8]) -> Vec<Vec<u8>> {
        bytes
            .iter()
            .filter_map(|&b| match framer.push(b) {
                Some(Frame::Packet(body)) => Some(body),
                _ => None,
            })
            .collect()
    }

    /// A proxy on a new loopback port to the server at `server`: returns the port and a thread
    /// that ends with GDB's connection and gives what it learned.
    pub fn learn(server: u16) -> (u16, JoinHandle<Replies>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let handle = std::thread::spawn(move || {
            let (gdb, _) = listener.accept().expect("GDB connects to the proxy");
            let srv = TcpStream::connect(("127.0.0.1", server)).expect("connect to ptrewind");
            gdb.set_nodelay(true).ok();
            srv.set_nodelay(true).ok();
            // Logged before forwarding, so a reply is always logged before the request GDB
            // sends after reading it.
            let log: Arc<Mutex<Log>> = Arc::default();
            let pump = |mut from: TcpStream, mut to: TcpStream, is_gdb: bool| {
                let log = Arc::clone(&log);
                std::thread::spawn(move || {
                    let mut framer = Framer::new(MAX_BODY);
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        let done = packets(&mut framer, &buf[..n]);
                        log.lock()
                            .expect("log")
                            .extend(done.into_iter().map(|b| (is_gdb, b)));
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Write);
                })
            };
            let up = pump(
                gdb.try_clone().expect("clone"),
                srv.try_clone().expect("clone"),
                true,
            );
            let down = pump(srv.try_clone().expect("clone"), gdb, false);
            up.join().expect("proxy thread");
            // The server keeps the connection open after GDB's `disconnect`: end its side here.
            let _ = srv.shutdown(Shutdown::Both);
            down.join().expect("proxy thread");
            let log = std::mem::take(&mut *log.lock().expect("log"));
            let mut replies = Replies::new();
            let mut request: Option<Vec<u8>> = None;
            for (is_gdb, body) in log {
                if is_gdb {
                    replies.insert(body.clone(), Vec::new());
                    request = Some(body);
                } else if let Some(r) = &request {
                    replies
                        .get_mut(r)
                        .expect("request logged")
                        .extend(rsp::frame(&body));
                }
            }
            replies
        });
        (port, handle)
    }

    /// What the canned stub saw.
    pub struct Served {
        /// Requests answered from the learned replies.
        pub answered: u64,
        /// `bs` requests among them.
        pub steps: u64,
        /// Requests that were not learned (answered as unsupported).
        pub missed: Vec<String>,
    }

    /// Blocks until `s` is ready for `events` (`POLLIN`, `POLLOUT`), or is closed.
    fn wait(s: &TcpStream, events: libc::c_short) {
        let mut p = libc::pollfd {
            fd: s.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd for a descriptor `s` keeps open across the call.
        unsafe { libc::poll(&mut p, 1, -1) };
    }

    /// Writes all of `bytes` to the non-blocking `s`, waiting while its send buffer is full;
    /// false once the connection is gone.
    fn send(s: &mut TcpStream, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            match s.write(bytes) {
                Ok(0) => return false,
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => wait(s, libc::POLLOUT),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// The canned stub on a new loopback port, for one connection.
    pub fn serve(replies: Replies) -> (u16, JoinHandle<Served>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the canned stub");
        let port = listener.local_addr().expect("stub address").port();
        let handle = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("GDB connects to the stub");
            s.set_nodelay(true).ok();
            let mut served = Served {
                answered: 0,
                steps: 0,
                missed: Vec::new(),
            };
            let mut framer = Framer::new(MAX_BODY);
            let mut acks = true;
            let mut buf = [0u8; 65536];
            // Non-blocking throughout: no system call per request beyond the server's own.
            s.set_nonblocking(true).expect("non-blocking socket");
            loop {
                // As the server does: try (yielding) for up to 1 ms, then block until readable.
                let t0 = Instant::now();
                let n = loop {
                    match s.read(&mut buf) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            if t0.elapsed() > Duration::from_millis(1) {
                                wait(&s, libc::POLLIN);
                            } else {
                                std::thread::yield_now();
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => break 0,
                    }
                };
                if n == 0 {
                    return served;
                }
                for b in packets(&mut framer, &buf[..n]) {
                    let mut out = if acks { b"+".to_vec() } else { Vec::new() };
                    match replies.get(&b) {
                        Some(r) => {
                            served.answered += 1;
                            served.steps += u64::from(b == b"bs");
                            out.extend_from_slice(r);
                        }
                        None => {
                            served.missed.push(String::from_utf8_lossy(&b).into_owned());
                            let unsupported: &[u8] = if b.first() == Some(&b'm') {
                                b"E01"
                            } else {
                                b""
                            };
                            out.extend(rsp::frame(unsupported));
                        }
                    }
                    if !send(&mut s, &out) {
                        return served;
                    }
                    if b == b"QStartNoAckMode" {
                        acks = false;
                    }
                }
            }
        });
        (port, handle)
    }
}

/// ptrewind: records `prog iters` under QEMU, serves it, runs GDB's series; returns the
/// instruction count and the series.
#[allow(clippy::too_many_arguments)]
fn ours(
    ptrewind: &Path,
    poll_us: Option<u64>,
    with_lldb: bool,
    prog: &Path,
    iters: u64,
    script: &Path,
    steps: usize,
) -> (u64, Vec<Series>) {
    // What `ptrewind gdb` and the IDE setups load (it keeps breakpoints inserted while stopped).
    let user_script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gdb-scripts/ptrewind.py");
    let t0 = Instant::now();
    let mut cmd = Command::new(ptrewind);
    if let Some(us) = poll_us {
        cmd.env("PTREWIND_POLL_US", us.to_string());
    }
    let server = gdb::Server::spawn_within(
        cmd.args([
            "record",
            "--backend",
            "qemu",
            "--no-live",
            "--listen",
            "127.0.0.1:0",
            "--",
        ])
        .arg(prog)
        .arg(iters.to_string()),
        std::time::Duration::from_secs(600),
    );
    // "ptrewind: program ended (…); N thread(s), INSNS instructions in …"
    let insns = server
        .early
        .iter()
        .find_map(|line| line.split_once(" thread(s), "))
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .unwrap_or(0u64);
    let port = server.port;
    let ready = t0.elapsed();
    let half = insns / 2;
    // First a raw client (no GDB): the server's own cost of a reverse step, against the same
    // round trip for a one-byte memory read it refuses (the transport floor).
    let mut series = Vec::new();
    {
        let mut c = rsp::Raw::connect(port, std::time::Duration::from_secs(60));
        ask(&mut c, "qSupported:swbreak+;hwbreak+");
        ask(&mut c, "?");
        let mut time = |c: &mut rsp::Raw, label: &str, body: &str, want: &str| {
            let mut ts: Vec<f64> = (0..steps)
                .map(|_| {
                    let t0 = Instant::now();
                    let r = ask(c, body);
                    let dt = t0.elapsed().as_secs_f64() * 1e3;
                    assert!(r.starts_with(want), "reply {r:?} to {body}");
                    dt
                })
                .collect();
            ts.sort_by(f64::total_cmp);
            series.push(Series {
                label: label.to_string(),
                median: ts[steps / 2],
                p99: ts[(steps * 99 / 100).min(steps - 1)],
                max: ts[steps - 1],
            });
        };
        time(&mut c, "raw-m-floor", "m0,1", "E");
        time(&mut c, "raw-bs-end", "bs", "T05");
        let goto: String = format!("goto {half}")
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect();
        ask(&mut c, &format!("qRcmd,{goto}"));
        time(&mut c, "raw-bs-middle", "bs", "T05");
    }
    series.extend(canned_floor(port, prog, script, &user_script, steps));
    let out = gdb_connected(script, prog, port)
        .args(["-ex", &format!("python lat('end,gdb-defaults', {steps})")])
        .arg("-ex")
        .arg(format!("source {}", user_script.display()))
        .args(["-ex", &format!("python lat('end', {steps})")])
        .args(["-ex", &format!("monitor goto {half}")])
        .args(["-ex", "maintenance flush register-cache"])
        .args(["-ex", &format!("python lat('middle', {steps})")])
        // LLDB goes on from here when it is installed; the server keeps the recording for it.
        .args(["-ex", if with_lldb { "disconnect" } else { "kill" }])
        .stdin(Stdio::null())
        .output()
        .expect("run gdb");
    let lldb_out = with_lldb.then(|| {
        let lldb_script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("gdb-scripts/ptrewind_lldb.py");
        let cmds = format!(
            "command script import {}\ngdb-remote 127.0.0.1:{port}\n{}kill\n",
            lldb_script.display(),
            LLDB_SCRIPT.replace("range(N)", &format!("range({steps})"))
        );
        let file = script.with_file_name("lldb-cmds");
        std::fs::write(&file, cmds).expect("write lldb commands");
        Command::new("lldb-19")
            .args(["--batch", "--no-lldbinit", "-s"])
            .arg(&file)
            .arg(prog)
            .stdin(Stdio::null())
            .output()
            .expect("run lldb-19")
    });
    // GDB's `kill` ended the replay; the server ends with SIGTERM otherwise.
    let gdb::Server {
        mut child,
        stderr,
        reaper,
        ..
    } = server;
    let _ = gdb::wait_until(
        &mut child,
        Instant::now() + std::time::Duration::from_secs(10),
    );
    drop(reaper);
    let log = stderr.join().unwrap_or_default();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let gdb = parse_lat(&text);
    if gdb.len() != 3 {
        eprintln!("--- gdb:\n{text}\n--- ptrewind:\n{log}");
        panic!("GDB did not time the three series");
    }
    let lldb = lldb_out.map(|out| {
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        let series = parse_lat(&text);
        if series.len() != 1 || !text.contains("ok=True") {
            eprintln!("--- lldb:\n{text}\n--- ptrewind:\n{log}");
            panic!("LLDB did not time its series");
        }
        series
    });
    eprintln!(
        "  recorded and indexed {insns} instructions; served after {:.2} s",
        ready.as_secs_f64()
    );
    series.extend(gdb);
    series.extend(lldb.into_iter().flatten());
    (insns, series)
}

/// GDB in batch mode with the timing script, connected to the stub at `port`, with a breakpoint of
/// the user's, as `record full`'s session has (there it stops the program at the loop's end).
fn gdb_connected(script: &Path, prog: &Path, port: u16) -> Command {
    let mut cmd = gdb::gdb_batch();
    cmd.arg("-x")
        .arg(script)
        .arg(prog)
        .args(["-ex", &format!("target remote 127.0.0.1:{port}")])
        .args(["-ex", "break done"]);
    cmd
}

/// Reverse-stepi that GDB learns from the server before the canned stub answers in its place.
const LEARN_STEPS: usize = 50;

/// GDB's reverse-stepi against the canned stub (see [`canned`]) after learning its replies from
/// the server at `port`: the series `canned-stub`, the cost of GDB and the transport alone.
/// Leaves the server `LEARN_STEPS` instructions before where it was.
fn canned_floor(
    port: u16,
    prog: &Path,
    script: &Path,
    user_script: &Path,
    steps: usize,
) -> Vec<Series> {
    // The same commands in both sessions, so that GDB sends the same requests.
    let session = |port: u16, label: &str, n: usize| {
        let out = gdb_connected(script, prog, port)
            .arg("-ex")
            .arg(format!("source {}", user_script.display()))
            .args(["-ex", &format!("python lat('{label}', {n})")])
            .args(["-ex", "disconnect"])
            .stdin(Stdio::null())
            .output()
            .expect("run gdb");
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
    };
    let (proxy, learned) = canned::learn(port);
    let text = session(proxy, "learn", LEARN_STEPS);
    let replies = learned.join().expect("the proxy");
    assert!(
        replies.contains_key(b"bs".as_slice()),
        "GDB sent no `bs` through the proxy:\n{text}"
    );
    let (stub, served) = canned::serve(replies);
    let text = session(stub, "canned-stub", steps);
    let served = served.join().expect("the canned stub");
    let series = parse_lat(&text);
    if series.len() != 1 || served.steps != steps as u64 {
        eprintln!("--- gdb against the canned stub:\n{text}");
        panic!(
            "the canned stub answered {} `bs` for {steps} reverse-stepi",
            served.steps
        );
    }
    eprintln!(
        "  canned stub: {} requests answered ({:.2} per reverse-stepi), {} not learned {:?}",
        served.answered,
        served.answered as f64 / steps as f64,
        served.missed.len(),
        &served.missed[..served.missed.len().min(8)]
    );
    series
}

/// GDB `record full` from `main` to `done`, then the same series at the end of the record log.
fn full(prog: &Path, iters: u64, script: &Path, steps: usize) -> (u64, Vec<Series>, f64) {
    let t0 = Instant::now();
    // `--args` goes last: everything after it is the program's command line.
    let out = gdb::gdb_batch()
        .arg("-x")
        .arg(script)
        .args(["-ex", "break main", "-ex", "run", "-ex", "record full"])
        .args(["-ex", "set record full insn-number-max unlimited"])
        .args(["-ex", "break done", "-ex", "continue"])
        .args(["-ex", "info record"])
        .args(["-ex", &format!("python lat('full', {steps})")])
        .args(["-ex", "kill"])
        .arg("--args")
        .arg(prog)
        .arg(iters.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("run gdb");
    let secs = t0.elapsed().as_secs_f64();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    // "Log contains N instructions."
    let insns = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Log contains "))
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let series = parse_lat(&text);
    if series.len() != 1 {
        eprintln!("--- gdb:\n{text}");
        panic!("GDB record full did not time the series");
    }
    (insns, series, secs)
}

fn main() {
    let mut steps = 1000usize;
    let mut sizes = vec![1_000_000u64, 10_000_000, 100_000_000];
    let mut full_size = 1_000_000u64;
    let mut with_full = true;
    let mut with_lldb = true;
    let mut binaries: Vec<PathBuf> = Vec::new();
    // The server's poll window (`PTREWIND_POLL_US`; `None`: its default).
    let mut polls: Vec<Option<u64>> = vec![None, Some(0)];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--steps" => steps = args.next().and_then(|v| v.parse().ok()).expect("--steps N"),
            "--sizes" => {
                sizes = args
                    .next()
                    .expect("--sizes LIST")
                    .split(',')
                    .map(parse_size)
                    .collect()
            }
            "--full-size" => full_size = parse_size(&args.next().expect("--full-size N")),
            "--no-full" => with_full = false,
            "--no-lldb" => with_lldb = false,
            "--poll-us" => {
                polls = args
                    .next()
                    .expect("--poll-us LIST")
                    .split(',')
                    .map(|v| match v {
                        "default" => None,
                        us => Some(us.parse().expect("--poll-us: microseconds or `default`")),
                    })
                    .collect()
            }
            "--ptrewind" => binaries.push(PathBuf::from(args.next().expect("--ptrewind PATH"))),
            other => panic!("unknown argument {other}"),
        }
    }
    let with_lldb = with_lldb
        && Command::new("lldb-19")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !with_lldb {
        println!("(no LLDB series: --no-lldb, or lldb-19 is not installed)");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("loop.c");
    std::fs::write(&src, PROGRAM).expect("write source");
    let prog = dir.path().join("loop");
    let st = Command::new("cc")
        .args(["-O1", "-g", "-no-pie", "-o"])
        .arg(&prog)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let script = dir.path().join("lat.py");
    std::fs::write(&script, SCRIPT).expect("write script");
    if binaries.is_empty() {
        binaries.push(gdb::release_dir().join("ptrewind"));
    }
    for b in &binaries {
        assert!(
            b.exists(),
            "build the workspace in release mode first ({})",
            b.display()
        );
    }

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average at start: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let baseline = if with_full {
        let iters = (full_size as f64 / INSNS_PER_ITER) as u64;
        let (n, s, secs) = full(&prog, iters, &script, steps);
        let s = s.into_iter().next().expect("one series");
        println!(
            "{:<28} {:>12} insns  median {:>8.4} ms  p99 {:>8.4} ms  max {:>8.4} ms  (recorded in {secs:.1} s)",
            "GDB record full, end", n, s.median, s.p99, s.max
        );
        Some(s.median)
    } else {
        None
    };
    for size in sizes {
        for (ptrewind, poll_us) in binaries
            .iter()
            .flat_map(|b| polls.iter().map(move |&p| (b, p)))
        {
            if binaries.len() > 1 {
                println!("{}:", ptrewind.display());
            }
            let poll = match poll_us {
                None => "poll window: the default".to_string(),
                Some(us) => format!("PTREWIND_POLL_US={us}"),
            };
            println!("{poll}:");
            let iters = (size as f64 / INSNS_PER_ITER) as u64;
            let (n, series) = ours(ptrewind, poll_us, with_lldb, &prog, iters, &script, steps);
            for s in series {
                let ratio = baseline
                    .map(|b| format!("  {:.2}x record full's median", b / s.median))
                    .unwrap_or_default();
                println!(
                    "{:<28} {:>12} insns  median {:>8.4} ms  p99 {:>8.4} ms  max {:>8.4} ms{ratio}",
                    format!("ptrewind, {}", s.label),
                    n,
                    s.median,
                    s.p99,
                    s.max
                );
            }
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average at end: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
}
