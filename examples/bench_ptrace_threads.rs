//! Measures the ptrace backend's per-thread overhead: instructions recorded per second with 1,
//! 2 and 4 threads doing the same total work, each as a ratio against 1 thread in the same run.
//!
//! ```text
//! cargo run --release --example bench_ptrace_threads [-- TOTAL_ITERATIONS]
//! ```
//!
//! A C program splits a fixed number of loop iterations over N threads (created after `main`
//! starts recording, joined at the end). The recorder runs it to its end twice per thread
//! count: with the state log (every instruction single-stepped, as `record` does by default)
//! and without it (straight-line runs at full speed when there is one thread). Time is wall
//! time of the whole recording; instructions are the recorder's own count.

use std::ffi::OsString;
use std::process::Command;
use std::time::Instant;

use ptrewind::capture::soft::{RecorderConfig, SoftRecorder};
use ptrewind::target::{PtraceTarget, SpawnOptions};

const SRC: &str = r#"
#include <pthread.h>
#include <stdlib.h>
static long per;
static void *worker(void *arg) {
    long s = (long)arg;
    for (long i = 0; i < per; i++) { s = s * 31 + i; if (s & 1) s ^= i; }
    return (void *)s;
}
int main(int argc, char **argv) {
    long threads = atol(argv[1]), total = atol(argv[2]);
    per = total / threads;
    pthread_t t[16];
    long sum = 0;
    if (threads == 1) return (int)(long)worker(0) & 1;
    for (long i = 0; i < threads; i++) pthread_create(&t[i], 0, worker, (void *)i);
    for (long i = 0; i < threads; i++) { void *r; pthread_join(t[i], &r); sum += (long)r; }
    return (int)(sum & 1);
}
"#;

fn record(exe: &std::path::Path, threads: u32, total: u64, state_log: bool) -> (u64, f64, u64) {
    let args: Vec<OsString> = vec![threads.to_string().into(), total.to_string().into()];
    let target = PtraceTarget::spawn(&exe.as_os_str().to_owned(), &args, &SpawnOptions::default())
        .expect("spawn");
    let config = RecorderConfig {
        state_log,
        ..RecorderConfig::default()
    };
    let start = Instant::now();
    let mut rec = SoftRecorder::new(target, config).expect("recorder");
    rec.run(None).expect("run");
    let secs = start.elapsed().as_secs_f64();
    let r = rec.finish().expect("finish");
    (r.stats.recorded, secs, r.stats.switches)
}

fn main() {
    let total: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(40_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let c = dir.path().join("mt.c");
    std::fs::write(&c, SRC).expect("write source");
    let exe = dir.path().join("mt");
    let ok = Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&exe)
        .arg(&c)
        .status()
        .expect("cc")
        .success();
    assert!(ok, "cc failed");
    for state_log in [true, false] {
        println!(
            "state log {}: threads | instructions | seconds | instructions/s | vs 1 thread | switches",
            if state_log { "on" } else { "off" }
        );
        let mut base = None;
        for threads in [1u32, 2, 4] {
            let (insns, secs, switches) = record(&exe, threads, total, state_log);
            let rate = insns as f64 / secs;
            let b = *base.get_or_insert(rate);
            println!(
                "  {threads} | {insns} | {secs:.3} | {:.0} | {:.2} | {switches}",
                rate,
                rate / b
            );
        }
    }
}
