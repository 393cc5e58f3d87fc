//! The QEMU backend against native execution, QEMU without the plugin, the ptrace backend and
//! GDB's `record full`, all in one run (see docs/benchmarks.md, "QEMU backend").
//!
//! ```text
//! cargo build --release && cargo run --release --example bench_qemu
//! ```
//!
//! Workloads: `sort` of 200 000 lines, `md5sum` of 50 MB, a qsort of 1 000 000 ints, a
//! 4-thread program and 1 000 000 `getppid` system calls (the last three C, built here with
//! `cc -O2`). For each: wall time natively, under
//! `qemu-x86_64` alone and under `qemu-x86_64` with the ptrewind plugin (CPU time, user + system,
//! of each run, and wall-clock time on a second line: the machine is shared) (the trace written to a
//! recording directory and kept until the figures are read); instructions are the plugin's count.
//! The ptrace backend and GDB `record full` run a small version of each workload (they are
//! 10⁴–10⁶× slower) and report their own wall-clock rate. Needs GNU time (`/usr/bin/time`). Options: `--small` (1/10 sizes, for a quick check), `--qemu-only` (no ptrace/GDB rows),
//! `--only PREFIX` (the workloads whose name starts with PREFIX), `--plugin PATH` (another build of
//! the plugin), `--versus OLD` (side by side instead: per workload, `--rounds N` rounds (default
//! 3) of the plugin at `OLD` then this one (`--plugin`, or the build's), alternating, each
//! round with a native run; CPU and wall seconds of every run, the ratios to native, and
//! whether the two plugins wrote the same stream files; `--args-new ,K=V` adds plugin
//! arguments to the new plugin's runs, `--args-old` to the old one's).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use ptrewind::capture::qemu::Recorded;
use ptrewind::capture::qemu::recording::find_plugin;
use ptrewind::capture::soft::{RecordFrom, RecorderConfig, SoftRecorder};
use ptrewind::target::{PtraceTarget, SpawnOptions};

const QSORT_SRC: &str = r#"
#include <stdio.h>
#include <stdlib.h>
static int cmp(const void *a, const void *b) { int x = *(const int *)a, y = *(const int *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int *v = malloc(n * sizeof *v);
    unsigned s = 12345;
    for (long i = 0; i < n; i++) { s = s * 1103515245 + 12345; v[i] = (int)(s >> 1); }
    qsort(v, n, sizeof *v, cmp);
    printf("%d %d\n", v[0], v[n - 1]);
    return 0;
}
"#;

/// One cheap system call after another: what the plugin costs per call (its stamp of the clock
/// at each call's entry, session 19).
const SYSCALLS_SRC: &str = r#"
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000, s = 0;
    for (long i = 0; i < n; i++) s += syscall(SYS_getppid);
    return s == 0;
}
"#;

const THREADS_SRC: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
static long iters;
static void *work(void *p) {
    unsigned long s = (unsigned long)p + 1, acc = 0;
    for (long i = 0; i < iters; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; acc += (s & 7) ? s % 97 : s % 13; }
    return (void *)acc;
}
int main(int argc, char **argv) {
    iters = argc > 1 ? atol(argv[1]) : 20000000;
    pthread_t t[4];
    long sum = 0;
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, work, (void *)i);
    for (int i = 0; i < 4; i++) { void *r; pthread_join(t[i], &r); sum += (long)r; }
    printf("%ld\n", sum);
    return 0;
}
"#;

/// One run of a command, measured by GNU `time`.
#[derive(Clone, Copy)]
struct Run {
    /// CPU seconds, user + system (the machine is shared: this is what the run itself cost).
    cpu: f64,
    /// Wall-clock seconds (on a busy machine this also measures the other processes).
    wall: f64,
    /// Peak RSS in KiB.
    rss: u64,
}

/// CPU and wall time, peak RSS (KiB) and exit status of `cmd` (stdout discarded), measured by
/// GNU `time` (a small parent, so the child's peak RSS is its own, not a copy of this
/// process's).
fn measure(cmd: &mut Command) -> (Run, i32) {
    let out = tempfile::NamedTempFile::new().expect("tempfile");
    let mut timed = Command::new("/usr/bin/time");
    timed
        .args(["-f", "%U %S %M %e", "-o"])
        .arg(out.path())
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdout(Stdio::null());
    let status = timed
        .status()
        .unwrap_or_else(|e| panic!("cannot run /usr/bin/time {cmd:?}: {e}"));
    let text = std::fs::read_to_string(out.path()).unwrap_or_default();
    let f: Vec<f64> = text
        .lines()
        .last()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let run = match f.as_slice() {
        [u, s, m, e] => Run {
            cpu: u + s,
            wall: *e,
            rss: *m as u64,
        },
        _ => panic!("unexpected /usr/bin/time output {text:?}"),
    };
    (run, status.code().unwrap_or(-1))
}

struct Workload {
    name: &'static str,
    program: PathBuf,
    args: Vec<OsString>,
    small_args: Vec<OsString>,
}

fn cc(dir: &Path, name: &str, src: &str, extra: &[&str]) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).expect("write");
    let exe = dir.join(name);
    let st = Command::new("cc")
        .args(["-O2", "-g", "-o"])
        .arg(&exe)
        .arg(&c)
        .args(extra)
        .status()
        .expect("cc");
    assert!(st.success());
    exe
}

fn which(tool: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .expect("sh");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn ptrace_rate(w: &Workload) -> Result<(u64, f64), String> {
    let mut cmd = Command::new(&w.program);
    cmd.args(&w.small_args).stdout(Stdio::null());
    let child =
        PtraceTarget::spawn_command(cmd, &SpawnOptions::default()).map_err(|e| e.to_string())?;
    let cfg = RecorderConfig {
        record_from: RecordFrom::Exec,
        capture_image_at_exit: false,
        ..RecorderConfig::default()
    };
    let t0 = Instant::now();
    // The ptrace and GDB rates are wall-clock (tracer and tracee together).
    let mut r = SoftRecorder::new(child, cfg).map_err(|e| e.to_string())?;
    r.run(Some(3_000_000)).map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    let rec = r.finish().map_err(|e| e.to_string())?;
    Ok((rec.encoder.instructions, secs))
}

fn gdb_rate(w: &Workload) -> Result<(u64, f64), String> {
    let t0 = Instant::now();
    let mut cmd = Command::new("timeout");
    cmd.args(["120", "gdb", "-batch", "-nx", "-ex", "set pagination off"])
        .args(["-ex", "starti", "-ex", "record full"])
        .args(["-ex", "set record full insn-number-max unlimited"])
        .args(["-ex", "set record full stop-at-limit off"])
        .args(["-ex", "continue", "-ex", "info record", "--args"])
        .arg(&w.program)
        .args(&w.small_args)
        // GDB 13's record full stops at the rseq system call in the dynamic loader otherwise.
        .env("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
        .stdin(Stdio::null());
    let out = cmd.output().map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let n = text
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Log contains ")?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .ok_or_else(|| {
            text.lines()
                .find(|l| l.contains("not support") || l.contains("error") || l.contains("fail"))
                .unwrap_or("no `info record` count")
                .trim()
                .to_string()
        })?;
    if let Some(l) = text
        .lines()
        .find(|l| l.contains("support") || l.contains("failed to record"))
    {
        println!("  ({}: gdb record full stopped: {})", w.name, l.trim());
    }
    Ok((n, secs))
}

/// The stream files of a recording directory, contents only (sorted: process and thread ids
/// differ from run to run).
fn stream_contents(dir: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .expect("recording")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pt"))
        .map(|p| std::fs::read(p).expect("stream"))
        .collect();
    v.sort();
    v
}

/// `--versus`: the old and new plugin alternating on one workload.
fn versus(w: &Workload, d: &Path, plugins: (&Path, &Path), extra: (&str, &str), rounds: usize) {
    let run = |plugin: &Path, extra: &str, tag: &str| {
        let dir = d.join(format!("vs-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("mkdir");
        let mut arg = OsString::from(plugin);
        arg.push(",out=");
        arg.push(&dir);
        arg.push(extra);
        let (r, st) = measure(
            Command::new("qemu-x86_64")
                .arg("-plugin")
                .arg(&arg)
                .arg(&w.program)
                .args(&w.args),
        );
        assert_eq!(st, 0, "{} under {} failed", w.name, plugin.display());
        (r, dir)
    };
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or("?")
            .to_string()
    };
    println!("{} (load {} at the start)", w.name, load());
    let (mut olds, mut news, mut natives) = (Vec::new(), Vec::new(), Vec::new());
    let mut same = true;
    for round in 0..rounds {
        let (native, _) = measure(Command::new(&w.program).args(&w.args));
        let (o, od) = run(plugins.0, extra.0, "old");
        let (n, nd) = run(plugins.1, extra.1, "new");
        let equal = stream_contents(&od) == stream_contents(&nd);
        same &= equal;
        println!(
            "  round {round}: native {:.2}s/{:.2}s  old {:.2}s/{:.2}s ({:.1}x/{:.1}x)  new {:.2}s/{:.2}s ({:.1}x/{:.1}x)  new/old cpu {:.3} wall {:.3}  streams {}  load {}",
            native.cpu,
            native.wall,
            o.cpu,
            o.wall,
            o.cpu / native.cpu,
            o.wall / native.wall,
            n.cpu,
            n.wall,
            n.cpu / native.cpu,
            n.wall / native.wall,
            n.cpu / o.cpu,
            n.wall / o.wall,
            if equal { "identical" } else { "differ" },
            load()
        );
        olds.push(o);
        news.push(n);
        natives.push(native);
    }
    let median = |v: &[Run], f: fn(&Run) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let (nc, nw) = (median(&natives, |r| r.cpu), median(&natives, |r| r.wall));
    let (oc, ow) = (median(&olds, |r| r.cpu), median(&olds, |r| r.wall));
    let (c, wl) = (median(&news, |r| r.cpu), median(&news, |r| r.wall));
    println!(
        "  median: native {nc:.2}s/{nw:.2}s  old {oc:.2}s/{ow:.2}s ({:.1}x/{:.1}x)  new {c:.2}s/{wl:.2}s ({:.1}x/{:.1}x)  new/old cpu {:.3} wall {:.3}  streams {}",
        oc / nc,
        ow / nw,
        c / nc,
        wl / nw,
        c / oc,
        wl / ow,
        if same {
            "identical in every round"
        } else {
            "differ (expected for several threads)"
        }
    );
}

fn main() {
    let small = std::env::args().any(|a| a == "--small");
    // `--qemu-only`: skip the ptrace backend and GDB `record full` (minutes of the run).
    let qemu_only = std::env::args().any(|a| a == "--qemu-only");
    // `--only PREFIX`: the workloads whose name starts with PREFIX (e.g. `qsort`).
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let scale = if small { 10 } else { 1 };
    let exe = std::env::current_exe().expect("exe");
    // `--plugin PATH`: another build of the plugin (e.g. an older one, to compare in one session).
    let plugin = match args.iter().position(|a| a == "--plugin") {
        Some(i) => PathBuf::from(args.get(i + 1).expect("--plugin PATH")),
        None => find_plugin(&exe).expect("build the plugin first: cargo build --release"),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    // Inputs.
    let lines = d.join("lines.txt");
    let mut text = String::new();
    let mut s: u64 = 42;
    for _ in 0..200_000 / scale {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push_str(&format!("{:016x} line {}\n", s, s % 1000));
    }
    std::fs::write(&lines, &text).expect("write");
    let small_lines = d.join("small.txt");
    std::fs::write(&small_lines, &text[..text.len().min(2_000)]).expect("write");
    let blob = d.join("blob.bin");
    let mut data = vec![0u8; 50_000_000 / scale];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2654435761) >> 13) as u8;
    }
    std::fs::write(&blob, &data).expect("write");
    let small_blob = d.join("small.bin");
    std::fs::write(&small_blob, &data[..4096]).expect("write");
    // Children start as copies of this process: keep it small, or their peak RSS is ours.
    drop(data);
    drop(text);
    let qsort = cc(d, "qsort", QSORT_SRC, &[]);
    let threads = cc(d, "threads4", THREADS_SRC, &["-pthread"]);
    let syscalls = cc(d, "syscalls", SYSCALLS_SRC, &[]);
    let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
    let workloads = [
        Workload {
            name: "sort 200k lines",
            program: which("sort"),
            args: vec![lines.clone().into()],
            small_args: vec![small_lines.clone().into()],
        },
        Workload {
            name: "md5sum 50 MB",
            program: which("md5sum"),
            args: vec![blob.clone().into()],
            small_args: vec![small_blob.clone().into()],
        },
        Workload {
            name: "qsort 1M ints",
            program: qsort.clone(),
            args: os(&[&(1_000_000 / scale).to_string()]),
            small_args: os(&["300"]),
        },
        Workload {
            name: "4 threads",
            program: threads.clone(),
            args: os(&[&(20_000_000 / scale).to_string()]),
            small_args: os(&["2000"]),
        },
        Workload {
            name: "1M system calls",
            program: syscalls,
            args: os(&[&(1_000_000 / scale).to_string()]),
            small_args: os(&["2000"]),
        },
    ];
    println!(
        "load average: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "{:<16} {:>13} {:>5} {:>8} {:>8} {:>9} {:>8} {:>10} {:>9} {:>9} {:>9} {:>6} {:>12} {:>12}",
        "workload",
        "instructions",
        "time",
        "native",
        "plugin",
        "Minsn/s",
        "slowdn",
        "qemu-only",
        "cb-only",
        "imprecise",
        "B/insn",
        "lost",
        "peak RSS MiB",
        "native MiB"
    );
    if let Some(i) = args.iter().position(|a| a == "--versus") {
        let old = PathBuf::from(args.get(i + 1).expect("--versus PATH"));
        let opt = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1).cloned())
        };
        let rounds = opt("--rounds").map_or(3, |r| r.parse().expect("--rounds N"));
        let extra = (
            opt("--args-old").unwrap_or_default(),
            opt("--args-new").unwrap_or_default(),
        );
        for w in &workloads {
            if only.as_deref().is_none_or(|o| w.name.starts_with(o)) {
                versus(w, d, (&old, &plugin), (&extra.0, &extra.1), rounds);
            }
        }
        return;
    }
    let mut soft_rows = Vec::new();
    for w in &workloads {
        if only.as_deref().is_some_and(|o| !w.name.starts_with(o)) {
            continue;
        }
        let (native, _) = measure(Command::new(&w.program).args(&w.args));
        let (qemu, _) = measure(Command::new("qemu-x86_64").arg(&w.program).args(&w.args));
        let rec_dir = d.join(format!("rec-{}", w.name.split(' ').next().unwrap_or("w")));
        std::fs::create_dir(&rec_dir).expect("mkdir");
        let mut plugin_arg = OsString::from(&plugin);
        plugin_arg.push(",out=");
        plugin_arg.push(&rec_dir);
        let (full, status) = measure(
            Command::new("qemu-x86_64")
                .arg("-plugin")
                .arg(&plugin_arg)
                .arg(&w.program)
                .args(&w.args),
        );
        assert_eq!(status, 0, "{} under the plugin failed", w.name);
        // The same callbacks doing nothing (QEMU's own cost of one helper call per block plus
        // the precise mode's inline counters), and the plugin without precise mode.
        let variant = |extra: &str, name: &str| {
            let dir = d.join(format!(
                "{name}-{}",
                w.name.split(' ').next().unwrap_or("w")
            ));
            std::fs::create_dir(&dir).expect("mkdir");
            let mut arg = OsString::from(&plugin);
            arg.push(",out=");
            arg.push(&dir);
            arg.push(extra);
            let (run, st) = measure(
                Command::new("qemu-x86_64")
                    .arg("-plugin")
                    .arg(&arg)
                    .arg(&w.program)
                    .args(&w.args),
            );
            assert_eq!(st, 0, "{} under the plugin ({extra}) failed", w.name);
            let _ = std::fs::remove_dir_all(&dir);
            run
        };
        let cb = variant(",measure=callbacks", "cb");
        let imprecise = variant(",precise=off", "imprecise");
        let rec = Recorded::open(&rec_dir).expect("recording");
        let (insns, bytes, lost) = rec.totals();
        // One line of CPU-time figures, one of wall-clock figures (an encoding thread on a
        // spare core would lower the second, not the first).
        type Pick = fn(Run) -> f64;
        let columns: [(&str, Pick); 2] = [("cpu", |r| r.cpu), ("wall", |r| r.wall)];
        for (kind, t) in columns {
            let first = kind == "cpu";
            println!(
                "{:<16} {:>13} {:>5} {:>7.3}s {:>7.3}s {:>9.0} {:>7.2}x {:>9.2}x {:>8.2}x {:>8.2}x {:>9} {:>6} {:>12} {:>12}",
                if first { w.name } else { "" },
                if first {
                    insns.to_string()
                } else {
                    String::new()
                },
                kind,
                t(native),
                t(full),
                insns as f64 / t(full) / 1e6,
                t(full) / t(native),
                t(qemu) / t(native),
                t(cb) / t(native),
                t(imprecise) / t(native),
                if first {
                    format!("{:.3}", bytes as f64 / insns.max(1) as f64)
                } else {
                    String::new()
                },
                if first {
                    lost.to_string()
                } else {
                    String::new()
                },
                if first {
                    format!("{:.1}", full.rss as f64 / 1024.0)
                } else {
                    String::new()
                },
                if first {
                    format!("{:.1}", native.rss as f64 / 1024.0)
                } else {
                    String::new()
                },
            );
        }
        let _ = std::fs::remove_dir_all(&rec_dir);
        let native_rate = insns as f64 / native.cpu;
        soft_rows.push((w, native_rate));
    }
    if qemu_only {
        return;
    }
    println!();
    println!(
        "{:<16} {:>14} {:>12} {:>14} {:>14} {:>12} {:>14}",
        "small workload",
        "ptrace insns",
        "ptrace k/s",
        "ptrace slowdn",
        "gdb insns",
        "gdb k/s",
        "gdb slowdn"
    );
    for (w, native_rate) in soft_rows {
        let p = ptrace_rate(w);
        let g = gdb_rate(w);
        let fmt = |r: &Result<(u64, f64), String>| match r {
            Ok((n, s)) => (
                n.to_string(),
                format!("{:.1}", *n as f64 / s / 1e3),
                format!("{:.0}x", native_rate / (*n as f64 / s)),
            ),
            Err(e) => (format!("failed: {e}"), "-".into(), "-".into()),
        };
        let (pn, pr, ps) = fmt(&p);
        let (gn, gr, gs) = fmt(&g);
        println!(
            "{:<16} {pn:>14} {pr:>12} {ps:>14} {gn:>14} {gr:>12} {gs:>14}",
            w.name
        );
    }
}
