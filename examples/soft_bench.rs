//! Measures the software PT backend: recording slowdown against native execution, single steps
//! per second, trace bytes per instruction and state-log bytes per instruction.
//!
//! ```text
//! cargo run --example soft_bench [-- ITERATIONS]
//! ```
//!
//! A small C program (a loop with a call) is compiled with `cc -O0` and timed by itself around
//! its loop (CLOCK_MONOTONIC), once natively and once under the recorder (with and without the
//! state log), so process start-up is excluded from both sides.

use std::process::{Command, Stdio};
use std::time::Instant;

use ptrewind::capture::soft::{RecorderConfig, SoftRecorder, StepMode};
use ptrewind::target::{PtraceTarget, SpawnOptions};

const SRC: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static long f(long x) { return x * 3 + 1; }
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    long s = 0;
    for (long i = 0; i < n; i++) { s += f(i); if (s & 1) s ^= i; }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%ld %ld\n", s, (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec));
    return 0;
}
"#;

fn loop_ns(stdout: &str) -> f64 {
    stdout
        .split_whitespace()
        .nth(1)
        .and_then(|t| t.parse::<f64>().ok())
        .expect("program prints its loop time")
}

fn main() {
    let iterations: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let c = dir.path().join("bench.c");
    std::fs::write(&c, SRC).expect("write source");
    let exe = dir.path().join("bench");
    let ok = Command::new("cc")
        .args(["-O0", "-o"])
        .arg(&exe)
        .arg(&c)
        .status()
        .expect("cc")
        .success();
    assert!(ok, "cc failed");
    let arg = iterations.to_string();

    // Native: best of 5 (the loop is short; take the least disturbed run).
    let native = (0..5)
        .map(|_| {
            let out = Command::new(&exe).arg(&arg).output().expect("run");
            loop_ns(&String::from_utf8_lossy(&out.stdout))
        })
        .fold(f64::INFINITY, f64::min);
    println!("iterations: {iterations}");
    println!("native loop: {:.3} ms", native / 1e6);

    for (state_log, mode) in [
        (false, StepMode::Single),
        (false, StepMode::Block),
        (true, StepMode::Single),
    ] {
        let mut cmd = Command::new(&exe);
        cmd.arg(&arg).stdout(Stdio::piped());
        let mut child = PtraceTarget::spawn_command(cmd, &SpawnOptions::default()).expect("spawn");
        let mut out = child
            .child_mut()
            .expect("spawned")
            .stdout
            .take()
            .expect("stdout");
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut out, &mut s).expect("read");
            s
        });
        let config = RecorderConfig {
            state_log,
            step_mode: mode,
            capture_image_at_exit: false,
            ..RecorderConfig::default()
        };
        let start = Instant::now();
        let mut rec = SoftRecorder::new(child, config).expect("recorder");
        rec.run(None).expect("record");
        let r = rec.finish().expect("finish");
        let wall = start.elapsed().as_secs_f64();
        let recorded_loop = loop_ns(&reader.join().expect("reader"));
        let insns = r.stats.recorded as f64;
        println!(
            "recorded ({mode:?} stepping, state log {}): loop {:.1} ms, slowdown {:.0}x; {} \
             instructions ({} single steps, {} blocks) in {:.2} s wall from main = {:.0} insns/s; \
             trace {} bytes = {:.3} bytes/insn; lost {}",
            if state_log { "on" } else { "off" },
            recorded_loop / 1e6,
            recorded_loop / native,
            r.stats.recorded,
            r.stats.single_steps,
            r.stats.blocks,
            wall,
            insns / wall,
            r.trace.len(),
            r.trace.len() as f64 / insns,
            r.stats.lost_bytes
        );
        if let Some(log) = &r.state_log {
            let s = log.stats();
            println!(
                "  state log: {} bytes = {:.1} bytes/insn ({} register values, {} memory \
                 records, {} bytes of old memory; unknown syscalls {}, unknown writes {})",
                s.total_bytes,
                s.total_bytes as f64 / insns,
                s.registers,
                s.memory_records,
                s.memory_bytes,
                s.unknown_syscalls,
                s.unknown_writes
            );
        }
    }
}
