//! `next` over a one-line loop as a GDB user sees it: real GDB timing `next` from its Python
//! (`time.perf_counter` around `gdb.execute`), live under `ptrewind record` with each backend,
//! with GDB's range stepping (`vCont;r`: one stop for the line) and without it (`set
//! range-stepping off`: one stop per instruction, what GDB did before ptrewind offered range
//! steps), beside GDB alone on the same program (its own ptrace, no recording) as the baseline,
//! all in one run.
//!
//! ```text
//! cargo build --release --workspace && \
//! cargo run --release --example bench_range_step -- [--iters 1000] [--reps 3]
//!                                                   [--backends ptrace,qemu]
//!                                                   [--ptrewind PATH]
//! ```
//!
//! The program runs `--iters` iterations of `for (…) s += i * 3 + 1;`, all on one line (about 8
//! instructions an iteration at `-O0`). GDB stops at the line (`break`, `continue`), then times
//! one `next`, which ends at the line after the loop. Printed per backend and mode: the best and
//! the median of `--reps` sessions in milliseconds, the instructions stepped (`monitor stats`),
//! and the ratios: per-instruction stops against range steps, range steps against GDB alone.
//!
//! Needs `gdb`, `cc` (and `qemu-x86_64` for the QEMU backend), and the workspace built in
//! release mode (the `ptrewind` binary and the QEMU plugin next to this example's directory).

// The `ptrewind` server starter shared with the tests (port from its listening line, output
// collected on threads, ended with SIGTERM if a run fails), as in bench_gdb_latency.
#[allow(dead_code)]
#[path = "../tests/support/gdb.rs"]
mod gdb;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PROGRAM: &str = r#"
#include <stdio.h>
#include <stdlib.h>
volatile long sink;
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000, s = 0;
    for (long i = 0; i < n; i++) s += i * 3 + 1; /* LOOP */
    sink = s;
    printf("%ld\n", s);
    return 0;
}
"#;

/// GDB Python: `timed_next()` times one `next` and prints one `NEXT` line with the line it
/// ended at.
const SCRIPT: &str = r#"
import gdb, time
def timed_next():
    t0 = time.perf_counter()
    gdb.execute("next", to_string=True)
    dt = time.perf_counter() - t0
    line = gdb.selected_frame().find_sal().line
    print("NEXT ms=%.3f line=%d" % (dt * 1e3, line))
"#;

/// One timed `next`: milliseconds, the line it ended at, the instructions ptrewind stepped in
/// range steps (0 without ptrewind or without range steps).
fn parse(text: &str) -> Option<(f64, u32, u64)> {
    let l = text.lines().find_map(|l| l.strip_prefix("NEXT "))?;
    let get = |k: &str| {
        l.split_whitespace()
            .find_map(|f| f.strip_prefix(k).map(str::to_string))
    };
    let insns = text
        .lines()
        .find_map(|l| l.strip_prefix("range steps"))
        .and_then(|v| v.split('(').nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    Some((
        get("ms=")?.parse().ok()?,
        get("line=")?.parse().ok()?,
        insns,
    ))
}

/// One session: `backend` `None` is GDB alone.
fn session(
    ptrewind: &Path,
    backend: Option<&str>,
    range: bool,
    prog: &Path,
    iters: u64,
    script: &Path,
    loop_line: usize,
) -> (f64, u32, u64) {
    let mut cmd = gdb::gdb_batch();
    cmd.arg("-x").arg(script);
    cmd.args(["-ex", &format!("break {loop_line}")]);
    let server = backend.map(|b| {
        gdb::Server::spawn_within(
            Command::new(ptrewind)
                .args(["record", "--backend", b, "--listen", "127.0.0.1:0", "--"])
                .arg(prog)
                .arg(iters.to_string()),
            Duration::from_secs(120),
        )
    });
    match &server {
        Some(s) => {
            cmd.arg(prog)
                .args(["-ex", &format!("target remote 127.0.0.1:{}", s.port)])
                .args(["-ex", "continue"]);
        }
        None => {
            cmd.args(["-ex", "run"]);
        }
    }
    if !range {
        cmd.args(["-ex", "set range-stepping off"]);
    }
    cmd.args(["-ex", "python timed_next()"]);
    if server.is_some() {
        cmd.args(["-ex", "monitor stats"]);
    }
    cmd.args(["-ex", "kill"]);
    if server.is_none() {
        cmd.arg("--args").arg(prog).arg(iters.to_string());
    }
    let out = cmd.stdin(Stdio::null()).output().expect("run gdb");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let log = server.map(|s| {
        let gdb::Server {
            mut child,
            stderr,
            reaper,
            ..
        } = s;
        let _ = gdb::wait_until(&mut child, Instant::now() + Duration::from_secs(10));
        drop(reaper);
        stderr.join().unwrap_or_default()
    });
    parse(&text).unwrap_or_else(|| {
        eprintln!(
            "--- gdb:\n{text}\n--- ptrewind:\n{}",
            log.unwrap_or_default()
        );
        panic!("GDB did not time the next");
    })
}

fn main() {
    let mut iters = 1000u64;
    let mut reps = 3usize;
    let mut backends = vec!["ptrace".to_string(), "qemu".to_string()];
    // Another build (e.g. main's, copied aside) to compare with in alternating runs.
    let mut ptrewind = gdb::release_dir().join("ptrewind");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iters" => iters = args.next().and_then(|v| v.parse().ok()).expect("--iters N"),
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            "--backends" => {
                backends = args
                    .next()
                    .expect("--backends LIST")
                    .split(',')
                    .map(str::to_string)
                    .collect()
            }
            "--ptrewind" => ptrewind = args.next().expect("--ptrewind PATH").into(),
            other => panic!("unknown argument {other}"),
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("loop.c");
    std::fs::write(&src, PROGRAM).expect("write source");
    let loop_line = PROGRAM
        .lines()
        .position(|l| l.contains("/* LOOP */"))
        .expect("loop line")
        + 1;
    let prog = dir.path().join("loop");
    let st = Command::new("cc")
        .args(["-O0", "-g", "-o"])
        .arg(&prog)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let script = dir.path().join("next.py");
    std::fs::write(&script, SCRIPT).expect("write script");
    assert!(
        ptrewind.exists(),
        "build the workspace in release mode first ({})",
        ptrewind.display()
    );
    let best_median = |xs: &mut Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        (xs[0], xs[xs.len() / 2])
    };
    let run = |backend: Option<&str>, range: bool| {
        let mut ms = Vec::new();
        let mut insns = 0;
        for _ in 0..reps {
            let (t, line, n) = session(&ptrewind, backend, range, &prog, iters, &script, loop_line);
            assert_eq!(line as usize, loop_line + 1, "next ended elsewhere");
            ms.push(t);
            insns = n;
        }
        let (best, median) = best_median(&mut ms);
        (best, median, insns)
    };
    println!("next over a one-line loop of {iters} iterations, {reps} sessions each (ms)");
    let (native, native_median, _) = run(None, true);
    println!("  gdb alone (its own ptrace)      best {native:9.1}  median {native_median:9.1}");
    for b in &backends {
        let (on, on_median, insns) = run(Some(b), true);
        let (off, off_median, _) = run(Some(b), false);
        println!(
            "  {b:<7} range steps             best {on:9.1}  median {on_median:9.1}  \
             ({insns} instructions stepped)"
        );
        println!("  {b:<7} one stop per instruction best {off:9.1}  median {off_median:9.1}");
        println!(
            "  {b:<7} per-instruction / range steps {:.1}x; range steps / gdb alone {:.1}x",
            off / on,
            on / native
        );
    }
}
