//! What a live watchpoint costs under QEMU (see docs/benchmarks.md, "Live watchpoints under
//! QEMU"): a store-heavy loop run to its end in a live session (`ptrewind record --backend qemu`
//! and GDB 13 in batch mode), in one run, alternating:
//!
//! * `none` — no watchpoint (blocks are translated without memory callbacks);
//! * `watch` — `watch target`, a variable the loop does not write: every load and store goes
//!   through the plugin's memory callback, one stop at the end (`target = s`);
//! * `deleted` — a watchpoint set (one `stepi`) and deleted: no watchpoint, but the blocks stay
//!   instrumented for the rest of the session (see docs/qemu-gdbstub.md for why);
//! * `qemu` — `qemu-x86_64` alone, no plugin, no debugger (for scale).
//!
//! ```text
//! cargo build --release && cargo build --release --example bench_qemu_watch
//! target/release/examples/bench_qemu_watch [ITERATIONS] [ROUNDS] [PLUGIN]
//! ```
//!
//! The loop does one store and one load per iteration (about 8 instructions); ITERATIONS
//! defaults to 20 000 000, ROUNDS to 3, PLUGIN to the one beside the `ptrewind` binary (build
//! it with plain `cargo build --release`: a plugin built as a dependency of an example measured
//! slower, see docs/benchmarks.md). Times are wall-clock seconds of whole sessions (start-up
//! included, about 0.3 s), the median of the rounds; ratios are against `none` of the same run.

#[path = "../tests/support/cbuild.rs"]
#[allow(dead_code)]
mod cbuild;
// The tests' `ptrewind` server starter (port from its listening line, output collected on
// threads, ended with SIGTERM if a run fails), shared with bench_gdb_latency.
#[path = "../tests/support/gdb.rs"]
#[allow(dead_code)]
mod gdb;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LOOP_SRC: &str = r#"
#include <stdio.h>
#include <stdlib.h>
volatile long target;
long arr[1024];
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000000, s = 0;
    for (long i = 0; i < n; i++) { arr[i & 1023] = i; s += arr[(i * 7) & 1023]; }
    target = s;
    printf("%ld\n", s);
    return 0;
}
"#;

/// One live session of `prog iters` with GDB running `commands`; its wall-clock seconds and
/// GDB's output.
fn session(dir: &Path, plugin: &Path, prog: &Path, iters: u64, commands: &[&str]) -> (f64, String) {
    let t0 = Instant::now();
    let mut server = gdb::Server::spawn(
        Command::new(dir.join("ptrewind"))
            .args(["record", "--backend", "qemu", "--no-stop-at-exit"])
            .arg("--qemu-plugin")
            .arg(plugin)
            .args(["--listen", "127.0.0.1:0", "--"])
            .arg(prog)
            .arg(iters.to_string()),
    );
    let mut gdb = Command::new("gdb");
    gdb.args(["-batch", "-nx", "-ex", "set confirm off"])
        .arg("-ex")
        .arg(format!("target remote 127.0.0.1:{}", server.port));
    for c in commands {
        gdb.arg("-ex").arg(c);
    }
    let out = gdb.arg(prog).output().expect("run gdb");
    let _ = server.child.wait();
    let secs = t0.elapsed().as_secs_f64();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (secs, text)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iters: u64 = args
        .get(1)
        .map_or(20_000_000, |s| s.parse().expect("ITERATIONS"));
    let rounds: usize = args.get(2).map_or(3, |s| s.parse().expect("ROUNDS"));
    let dir = gdb::release_dir();
    let plugin = args
        .get(3)
        .map_or_else(|| dir.join("libptrewind_qemu_plugin.so"), PathBuf::from);
    let tmp = tempfile::tempdir().expect("tempdir");
    let prog = cbuild::compile_source(
        "cc",
        tmp.path(),
        "loop",
        LOOP_SRC,
        &["-O1", "-g", "-no-pie"],
        &[],
    );
    println!(
        "load average: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let variants: [(&str, &[&str]); 3] = [
        ("none", &["continue"]),
        ("watch", &["watch target", "continue", "continue"]),
        ("deleted", &["watch target", "stepi", "delete", "continue"]),
    ];
    let mut times = vec![Vec::new(); variants.len() + 1];
    for _ in 0..rounds {
        for (i, (name, cmds)) in variants.iter().enumerate() {
            let (secs, out) = session(&dir, &plugin, &prog, iters, cmds);
            assert!(
                out.contains("exited normally"),
                "{name}: the program did not run to its end:\n{out}"
            );
            if *name == "watch" {
                assert!(
                    out.contains("Hardware watchpoint 1: target") && out.contains("New value"),
                    "watch: no stop at the write:\n{out}"
                );
            }
            times[i].push(secs);
        }
        let t0 = Instant::now();
        let st = Command::new("qemu-x86_64")
            .arg(&prog)
            .arg(iters.to_string())
            .stdout(Stdio::null())
            .status()
            .expect("qemu-x86_64");
        assert!(st.success());
        times[variants.len()].push(t0.elapsed().as_secs_f64());
        std::thread::sleep(Duration::from_millis(100));
    }
    let base = median(times[0].clone());
    println!("{iters} iterations (1 store + 1 load each), median of {rounds} rounds, wall seconds");
    for (i, name) in variants
        .iter()
        .map(|v| v.0)
        .chain(["qemu (no plugin, no debugger)"])
        .enumerate()
    {
        let m = median(times[i].clone());
        println!(
            "{name:<30} {m:>7.2} s  {:>6.2}× none   (rounds: {})",
            m / base,
            times[i]
                .iter()
                .map(|t| format!("{t:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    println!(
        "load average: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}
