//! Every thread of a recording in the past, with real GDB sessions: a 3-thread C program whose
//! second worker crashes with SIGSEGV, recorded under QEMU (one PT stream per thread, TSC
//! packets from one instruction clock), served as one multi-thread timeline.
//!
//! * `info threads` lists the three threads; the crashed worker is the one selected at the end
//!   and `?` reports the SIGSEGV there;
//! * reverse-continue stops in whichever thread hit a breakpoint last in global order (the
//!   program orders its threads' calls through `pthread_join`, so the order is known);
//! * continuing forward to the end reports the crash in the worker;
//! * reverse-stepi in a worker selected with GDB's `thread N` gives exactly that thread's
//!   instructions from the plugin's per-instruction log (test mode), backwards.
//!
//! Skipped (with a message) without `qemu-x86_64` or GDB.

mod support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ptrewind::capture::qemu::Recorded;
use support::cbuild::{compile_source, have, nm_symbol};
use support::flow_ips;
use support::gdb::{GdbRun, Server, gdb_session};
use support::qemu::{fold_rep, plugin, qemu_available, record_into};

/// Worker A calls `step_a` 100 times and tells main through a pipe; then main calls it 3
/// times; then worker B calls `step_b` 60 times and crashes. QEMU stamps each stream when it
/// returns from the kernel, so main's `read` of the pipe (a system call whichever thread gets
/// there first) puts main's calls after worker A's in the global order; B starts after them.
const SRC: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
volatile long sink;
static int fds[2];
__attribute__((noinline)) void step_a(long i) { sink += i; }
__attribute__((noinline)) void step_b(long i) { sink ^= i; }
__attribute__((noinline)) void crash(int *p) { *p = 1; }
static void *worker_a(void *arg) {
    char c = 1;
    for (long i = 0; i < 100; i++) step_a(i);
    if (write(fds[1], &c, 1) != 1) return 0;
    return arg;
}
static void *worker_b(void *arg) { for (long i = 0; i < 60; i++) step_b(i); crash(arg); return 0; }
int main(void) {
    pthread_t a, b;
    char c;
    if (pipe(fds)) return 2;
    pthread_create(&a, 0, worker_a, 0);
    if (read(fds[0], &c, 1) != 1) return 3;
    for (long i = 0; i < 3; i++) step_a(1000 + i);
    pthread_join(a, 0);
    pthread_create(&b, 0, worker_b, 0);
    pthread_join(b, 0);
    puts("not reached");
    return 0;
}
"#;

fn ready() -> bool {
    if !qemu_available() {
        return false;
    }
    if !have("gdb") {
        eprintln!("gdb not installed: skipping");
        return false;
    }
    true
}

fn build(dir: &Path) -> PathBuf {
    compile_source(
        "cc",
        dir,
        "threads3",
        SRC,
        &["-O1", "-g", "-fno-inline", "-no-pie", "-pthread"],
        &[],
    )
}

/// The thread ids of main, worker A and worker B in a recording of [`SRC`] (the workers told
/// apart by the function their stream runs).
fn tids(recorded: &Recorded, exe: &Path) -> (u32, u32, u32) {
    let (image, _) = recorded.image().expect("image");
    let step_a = nm_symbol(exe, "step_a");
    let step_b = nm_symbol(exe, "step_b");
    let main = recorded
        .threads
        .iter()
        .find(|t| t.tid == t.pid)
        .expect("main thread");
    let runs = |t: &ptrewind::capture::qemu::RecordedThread, f: u64| {
        t.tid != t.pid && flow_ips(&t.trace, &image).0.contains(&f)
    };
    let a = recorded.threads.iter().find(|t| runs(t, step_a));
    let b = recorded.threads.iter().find(|t| runs(t, step_b));
    (main.tid, a.expect("worker A").tid, b.expect("worker B").tid)
}

/// The tids `monitor thread` printed, in order (GDB in batch mode writes monitor output to
/// stderr, apart from the rest: only their order is known).
fn selected(run: &GdbRun) -> Vec<u32> {
    run.gdb
        .lines()
        .filter_map(|l| {
            l.strip_prefix("thread ")?
                .strip_suffix(" selected")?
                .parse()
                .ok()
        })
        .collect()
}

fn record_cli(rec_dir: &Path, exe: &Path) -> Server {
    let mut cli: Vec<OsString> = ["record", "--backend", "qemu", "--no-live", "--trace-dir"]
        .iter()
        .map(Into::into)
        .collect();
    cli.push(rec_dir.into());
    cli.extend(["--qemu-plugin".into(), plugin().into(), "--".into()]);
    cli.push(exe.into());
    Server::start_cli(&cli)
}

#[test]
fn every_thread_of_a_crashed_recording_in_global_order() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = build(dir.path());
    let rec_dir = dir.path().join("rec");
    let server = record_cli(&rec_dir, &exe);
    let recorded = Recorded::open(&rec_dir).expect("recording kept after the crash");
    assert_eq!(recorded.threads.len(), 3, "main + 2 workers");
    let (main, a, b) = tids(&recorded, &exe);
    let saved = dir.path().join("saved");
    let save_cmd = format!("monitor save {}", saved.display());
    let run = gdb_session(
        server,
        &exe,
        &[
            "echo @threads\\n",
            "info threads",
            "echo @start\\n",
            "monitor thread",
            "break step_a",
            "break step_b",
            "echo @rc1\\n",
            "reverse-continue",
            "monitor thread",
            "delete 2",
            "echo @rc2\\n",
            "reverse-continue",
            "monitor thread",
            "echo @rc3\\n",
            // Main's second and first calls, then worker A's last.
            "reverse-continue 3",
            "monitor thread",
            "monitor calls 3",
            "delete",
            "echo @end\\n",
            "continue",
            "monitor thread",
            &save_cmd,
        ],
        Duration::from_secs(120),
    );
    // `info threads`: three threads of the process.
    let listed = run
        .after("@threads")
        .split("@start")
        .next()
        .unwrap_or("")
        .lines()
        .filter(|l| l.contains("Thread "))
        .count();
    assert_eq!(listed, 3, "{}", run.dump());
    // The replay starts at the end, in the worker that crashed (at the faulting instruction);
    // then the stops: worker B's last step_b, main's last step_a, worker A's last step_a, and
    // the crash again in worker B.
    assert_eq!(selected(&run), [b, b, main, a, b], "{}", run.dump());
    assert!(run.gdb.contains("saved 3 threads"), "{}", run.dump());
    // `monitor calls` shows the selected thread's history: worker A's loop calling step_a.
    let calls = run
        .gdb
        .split(&format!("thread {a} selected\n"))
        .nth(1)
        .and_then(|rest| rest.split(" selected\n").next())
        .unwrap_or_default();
    assert!(
        calls.contains("worker_a") && calls.contains("step_a") && !calls.contains("main"),
        "{}",
        run.dump()
    );
    assert!(
        run.after("@threads").contains("crash ("),
        "the crashed worker's frame: {}",
        run.dump()
    );
    // The last call of either function: worker B's last step_b.
    assert!(
        run.after("@rc1").contains("hit Breakpoint 2, step_b"),
        "{}",
        run.dump()
    );
    // Without step_b: main's last step_a (after worker A's 100, before worker B).
    assert!(
        run.after("@rc2").contains("hit Breakpoint 1, step_a"),
        "{}",
        run.dump()
    );
    // Forward to the end: the crash, reported in worker B.
    let end = run.after("@end");
    assert!(
        end.contains("received signal SIGSEGV"),
        "crash reported: {}",
        run.dump()
    );
    // The saved recording replays every thread the same way: it starts in the crashed
    // worker; main made the last step_a call; forward from there the crash again.
    let run = gdb_session(
        Server::replay(&saved),
        &exe,
        &[
            "monitor thread",
            "break step_a",
            "reverse-continue",
            "monitor thread",
            "echo @end\\n",
            "continue",
            "monitor thread",
            "delete",
            // A thread-specific breakpoint: GDB resumes past main's three calls (stops in
            // another thread) to worker A's last one.
            &format!(
                "python gdb.execute('break step_a thread %d' % [t.num for t in \
                 gdb.selected_inferior().threads() if t.ptid[1] == {a}][0])"
            ),
            "reverse-continue",
            "monitor thread",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(selected(&run), [b, main, b, a], "{}", run.dump());
    assert!(
        run.after("@end").contains("received signal SIGSEGV"),
        "{}",
        run.dump()
    );
}

#[test]
fn reverse_stepi_in_a_selected_worker_follows_its_log() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = build(dir.path());
    let rec_dir = dir.path().join("rec");
    let (recorded, status) = record_into(&rec_dir, &exe, &[], true);
    assert!(!status.success(), "the program crashes");
    let (_, a, _) = tids(&recorded, &exe);
    let (image, _) = recorded.image().expect("image");
    let thread = recorded.threads.iter().find(|t| t.tid == a).expect("A");
    let log = fold_rep(thread.insns.as_ref().expect("test-mode log"), &image);
    let (decoded, errors) = flow_ips(&thread.trace, &image);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        decoded[..],
        log[..decoded.len()],
        "A's stream equals its log"
    );
    // Serve the recording directory; select worker A in GDB by its thread id.
    let mut cli: Vec<OsString> = ["replay", "--listen", "127.0.0.1:0", "--qemu"]
        .iter()
        .map(Into::into)
        .collect();
    cli.push(rec_dir.clone().into());
    let server = Server::start_cli(&cli);
    const STEPS: usize = 12;
    let mut cmds: Vec<String> = vec![
        // GDB resumes "any thread" unless told to step only the selected one.
        "set scheduler-locking step".into(),
        format!(
            "python gdb.execute('thread %d' % [t.num for t in gdb.selected_inferior().threads() \
             if t.ptid[1] == {a}][0])"
        ),
        "printf \"PC %lx\\n\", $pc".into(),
    ];
    for _ in 0..STEPS {
        cmds.push("reverse-stepi".into());
        cmds.push("printf \"PC %lx\\n\", $pc".into());
    }
    // And forward again, in the same thread.
    for _ in 0..2 {
        cmds.push("stepi".into());
        cmds.push("printf \"PC %lx\\n\", $pc".into());
    }
    cmds.push("echo @sel\\n".into());
    cmds.push("monitor thread".into());
    cmds.push("monitor threads".into());
    cmds.push("thread apply all bt 1".into());
    let run = gdb_session(server, &exe, &cmds, Duration::from_secs(120));
    let pcs: Vec<u64> = run
        .tagged("PC")
        .iter()
        .map(|v| u64::from_str_radix(v, 16).expect("hex pc"))
        .collect();
    assert_eq!(pcs.len(), STEPS + 3, "{}", run.dump());
    // A ended normally: it stands at its last instruction, each reverse-stepi goes one of its
    // own instructions back, each stepi one forward.
    let n = decoded.len();
    let mut want: Vec<u64> = (0..=STEPS).map(|k| log[n - 1 - k]).collect();
    want.extend([log[n - STEPS], log[n + 1 - STEPS]]);
    assert_eq!(pcs, want, "{}", run.dump());
    assert_eq!(selected(&run), [a], "{}", run.dump());
    // Each thread's frame at this global position (PC-only past: frame 0 only).
    assert_eq!(
        run.after("@sel").matches("#0 ").count(),
        3,
        "{}",
        run.dump()
    );
}

/// LLDB on the same kind of recording: the crash is the stop reason in the worker, and `thread
/// trace dump instructions` of another worker selected by its thread id is that worker's own
/// decoded stream (its last instructions, newest first).
#[test]
fn lldb_dumps_each_threads_own_trace() {
    if !qemu_available() {
        return;
    }
    if !have("lldb-19") {
        eprintln!("lldb-19 not installed: skipping");
        return;
    }
    use support::gdb::{run_until, wait_until};
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = build(dir.path());
    let rec_dir = dir.path().join("rec");
    let mut cli: Vec<OsString> = [
        "record",
        "--once",
        "--backend",
        "qemu",
        "--no-live",
        "--trace-dir",
    ]
    .iter()
    .map(Into::into)
    .collect();
    cli.push(rec_dir.clone().into());
    cli.extend(["--qemu-plugin".into(), plugin().into(), "--".into()]);
    cli.push(exe.clone().into());
    let mut server = Server::start_cli(&cli);
    let recorded = Recorded::open(&rec_dir).expect("recording");
    let (_, a, b) = tids(&recorded, &exe);
    let (image, _) = recorded.image().expect("image");
    let worker_a = recorded.threads.iter().find(|t| t.tid == a).expect("A");
    let (decoded, _) = flow_ips(&worker_a.trace, &image);
    let mut c = std::process::Command::new("lldb-19");
    c.args(["--batch", "--no-lldbinit"])
        .arg("-o")
        .arg(format!("target create {}", exe.display()))
        .arg("-o")
        .arg(format!("gdb-remote 127.0.0.1:{}", server.port))
        .args(["-o", "thread list", "-o", "process trace start"])
        .arg("-o")
        .arg(format!("script lldb.process.SetSelectedThreadByID({a})"))
        .args(["-o", "thread trace dump instructions -c 6"]);
    let out = run_until(&mut c, Duration::from_secs(120));
    let _ = wait_until(
        &mut server.child,
        std::time::Instant::now() + Duration::from_secs(30),
    );
    let ctx = format!(
        "--- lldb\n{}\n{}\n--- server\n{}",
        out.stdout,
        out.stderr,
        server.stderr.join().unwrap_or_default()
    );
    // The crashed worker is the stopped thread, with the signal.
    assert!(
        out.stdout
            .lines()
            .any(|l| l.contains(&format!("tid = {b}")) && l.contains("SIGSEGV")),
        "{ctx}"
    );
    // "    N: 0xADDR    mnemonic": worker A's instructions, newest first.
    let dump = out.stdout.split("thread #").last().unwrap_or_default();
    let got: Vec<(usize, u64)> = dump
        .lines()
        .filter_map(|l| {
            let (n, rest) = l.trim().split_once(": 0x")?;
            let addr = rest.split_whitespace().next()?;
            Some((n.parse().ok()?, u64::from_str_radix(addr, 16).ok()?))
        })
        .collect();
    // (LLDB numbers trace items, events included: only the addresses are compared.)
    let got: Vec<u64> = got.into_iter().map(|(_, addr)| addr).collect();
    let want: Vec<u64> = decoded.iter().rev().take(6).copied().collect();
    assert_eq!(got, want, "{ctx}");
    assert!(dump.contains(&format!("tid = {a}")), "{ctx}");
}

/// GDB's own `record btrace pt` over the remote protocol on a finished recording: each
/// thread's instruction count (`info record` after `thread N`, read with `Hg`) is that
/// thread's decoded stream.
#[test]
fn gdb_btrace_reads_each_threads_trace() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = build(dir.path());
    let rec_dir = dir.path().join("rec");
    let server = record_cli(&rec_dir, &exe);
    let recorded = Recorded::open(&rec_dir).expect("recording");
    let (image, _) = recorded.image().expect("image");
    let mut cmds: Vec<String> = vec!["record btrace pt".into()];
    for t in &recorded.threads {
        cmds.push(format!(
            "python gdb.execute('thread %d' % [t.num for t in gdb.selected_inferior().threads() \
             if t.ptid[1] == {}][0])",
            t.tid
        ));
        cmds.push("info record".into());
    }
    let run = gdb_session(server, &exe, &cmds, Duration::from_secs(120));
    for t in &recorded.threads {
        let (decoded, _) = flow_ips(&t.trace, &image);
        let line = run
            .gdb
            .lines()
            .find(|l| l.starts_with("Recorded ") && l.contains(&format!(".{})", t.tid)))
            .unwrap_or_else(|| panic!("no `info record` for {}: {}", t.tid, run.dump()));
        let n: usize = line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert_eq!(n, decoded.len(), "thread {}: {}", t.tid, run.dump());
    }
}

/// A live program for the ptrace backend: main calls `step_a` 3 times, then starts worker A
/// (100 `step_a` calls, then a pipe write to B, then it waits for a reply that never comes)
/// and worker B (waits for A's byte, 60 `step_b` calls, then writes through a null pointer).
/// The pipe orders the threads' calls; every thread is alive at the crash.
const LIVE_SRC: &str = r#"
#include <pthread.h>
#include <unistd.h>
volatile long sink;
static int ab[2], ba[2];
__attribute__((noinline)) void step_a(long i) { sink += i; }
__attribute__((noinline)) void step_b(long i) { sink ^= i; }
__attribute__((noinline)) void crash(int *p) { *p = 1; }
static void *worker_a(void *arg) {
    char c = 1;
    for (long i = 0; i < 100; i++)
        step_a(i);
    if (write(ab[1], &c, 1) != 1) return 0;
    if (read(ba[0], &c, 1) != 1) return 0;
    return arg;
}
static void *worker_b(void *arg) {
    char c;
    if (read(ab[0], &c, 1) != 1) return 0;
    for (long i = 0; i < 60; i++) step_b(i);
    crash(arg);
    return 0;
}
int main(void) {
    pthread_t a, b;
    if (pipe(ab) || pipe(ba)) return 2;
    for (long i = 0; i < 3; i++) step_a(1000 + i);
    pthread_create(&a, 0, worker_a, 0);
    pthread_create(&b, 0, worker_b, 0);
    pthread_join(b, 0);
    return 0;
}
"#;

/// The values `print` showed after each `echo MARK` line, as `$N = VALUE` → `VALUE`.
fn printed_after<'a>(run: &'a GdbRun, mark: &str) -> &'a str {
    run.after(mark)
        .lines()
        .find_map(|l| {
            l.strip_prefix('$')
                .and_then(|r| r.split_once(" = "))
                .map(|x| x.1)
        })
        .unwrap_or_else(|| panic!("nothing printed after {mark}\n{}", run.dump()))
}

/// The live ptrace backend serves every thread's past from its per-thread streams (one global
/// order from their TSC packets) with each thread's registers and all memory rebuilt exactly
/// by the state log: after worker B's crash, reverse-continue stops at B's last `step_b`, then
/// (another breakpoint) at worker A's last `step_a` — in whichever thread hit last in global
/// order; the arguments and the shared variable are the values of that moment; every thread's
/// backtrace is readable there; reverse-finish and reverse-next move within the selected
/// thread; `monitor calls` shows the selected thread's own calls; a write watchpoint going back
/// from worker A's start stops at main's three writes, latest first, then at the start of the
/// history (main's thread creations between are known writes, not stops); continuing forward
/// comes back to the present.
#[test]
fn live_ptrace_session_serves_every_threads_past() {
    if !have("gdb") {
        eprintln!("gdb not installed: skipping");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile_source(
        "cc",
        dir.path(),
        "live3",
        LIVE_SRC,
        &["-O0", "-g", "-no-pie", "-pthread"],
        &[],
    );
    let server = Server::spawn(
        support::gdb::ptrewind()
            .args(["record", "--backend", "ptrace", "--no-stop-at-exit"])
            .args(["--listen", "127.0.0.1:0", "--"])
            .arg(&exe),
    );
    let run = gdb_session(
        server,
        &exe,
        &[
            "continue",
            "echo @crash\\n",
            "info threads",
            "break step_b",
            "reverse-continue",
            "echo @b-i\\n",
            "print i",
            "echo @b-sink\\n",
            "print sink",
            "echo @b-all\\n",
            "thread apply all bt",
            "echo @b-end\\n",
            "delete",
            "break step_a",
            "reverse-continue",
            "echo @a-i\\n",
            "print i",
            "echo @a-sink\\n",
            "print sink",
            "reverse-finish",
            "echo @a-caller\\n",
            "print i",
            "delete",
            "reverse-next",
            "reverse-next",
            "echo @a-prev\\n",
            "print i",
            "echo @a-frame\\n",
            "frame",
            "echo @a-calls\\n",
            "monitor calls 4",
            "monitor stats",
            "echo @a-threads\\n",
            "info threads",
            "echo @a-end\\n",
            "break worker_a",
            "reverse-continue",
            "delete",
            "watch sink",
            "reverse-continue",
            "echo @w\\n",
            "print sink",
            "reverse-continue",
            "echo @w1\\n",
            "print sink",
            "frame",
            "reverse-continue",
            "echo @w2\\n",
            "print sink",
            "frame",
            "reverse-continue",
            "echo @w3\\n",
            "print sink",
            "frame",
            "echo @w-end\\n",
            "delete",
            "continue",
            "echo @present\\n",
            "print sink",
            "continue",
        ],
        Duration::from_secs(120),
    );
    let a_sum = |n: i64| (0..n).sum::<i64>() + 1000 + 1001 + 1002;
    let b_xor = |n: i64| (0..n).fold(a_sum(100), |s, i| s ^ i);
    assert!(
        run.after("@crash").contains("received signal SIGSEGV") || run.gdb.contains("SIGSEGV"),
        "{}",
        run.dump()
    );
    // B's last step_b, in B, with B's argument and the shared variable of that moment.
    assert!(
        run.gdb.contains("hit Breakpoint 1, step_b (i=59)"),
        "{}",
        run.dump()
    );
    assert_eq!(printed_after(&run, "@b-i"), "59", "{}", run.dump());
    assert_eq!(
        printed_after(&run, "@b-sink"),
        b_xor(59).to_string(),
        "{}",
        run.dump()
    );
    // Every thread's backtrace there: main joining, A waiting in its read, B in step_b.
    let all = run.after("@b-all");
    let all = &all[..all.find("@b-end").unwrap_or(all.len())];
    for want in ["step_b (i=59)", "worker_b (", "worker_a (", "main ()"] {
        assert!(all.contains(want), "no {want} in\n{all}\n{}", run.dump());
    }
    // Worker A's last step_a: after main's three in global order, so A's (i=99) is hit
    // first going back, in A.
    assert!(
        run.gdb.contains("hit Breakpoint 2, step_a (i=99)"),
        "{}",
        run.dump()
    );
    assert_eq!(printed_after(&run, "@a-i"), "99", "{}", run.dump());
    assert_eq!(
        printed_after(&run, "@a-sink"),
        a_sum(99).to_string(),
        "{}",
        run.dump()
    );
    // reverse-finish: back in worker_a's loop at the call (its i still 99); reverse-next twice:
    // to the start of that line, then back over the loop's increment to where the call before
    // (i=98) returned, in the same thread.
    assert_eq!(printed_after(&run, "@a-caller"), "99", "{}", run.dump());
    assert_eq!(printed_after(&run, "@a-prev"), "98", "{}", run.dump());
    assert!(
        run.after("@a-frame").starts_with("#0  worker_a ("),
        "{}",
        run.dump()
    );
    // `monitor calls` (GDB writes monitor output to stderr, after the rest): the selected
    // thread's own calls only.
    let calls: Vec<&str> = run.gdb.lines().filter(|l| l.contains("\tinst ")).collect();
    assert!(
        calls.iter().any(|l| l.contains("step_a"))
            && !calls
                .iter()
                .any(|l| l.contains("step_b") || l.contains("main")),
        "A's own calls\n{}",
        run.dump()
    );
    // `monitor stats` in the past checks every thread's history against the state log.
    assert!(
        run.gdb.contains("ok: the 3 threads' histories hold"),
        "{}",
        run.dump()
    );
    let threads = run.after("@a-threads");
    let threads = &threads[..threads.find("@a-end").unwrap_or(threads.len())];
    assert_eq!(
        threads.lines().filter(|l| l.contains("Thread ")).count(),
        3,
        "{}",
        run.dump()
    );
    assert!(
        threads
            .lines()
            .any(|l| l.starts_with('*') && l.contains("worker_a")),
        "A selected\n{}",
        run.dump()
    );
    // A watchpoint from worker A's start, going back: main's writes in step_a(1002), (1001)
    // and (1000), each shown with the value before it, then the start of the history. Main's
    // `clone3`s between (it created A and B after its writes) write only the new threads' ids;
    // they used to stop the search as writes the log did not know.
    let main_tid = run.pid;
    let w = run.after("@a-end");
    let w = &w[..w.find("@w-end").unwrap_or(w.len())];
    assert!(
        w.contains(&format!("[Switching to Thread {main_tid}.{main_tid}]")),
        "{}",
        run.dump()
    );
    assert!(!w.contains("not all recorded"), "{}", run.dump());
    let first = run.after("@a-end");
    let first = &first[..first.find("@w\n").unwrap_or(first.len())];
    assert!(first.contains("step_a (i=1002)"), "{}", run.dump());
    assert_eq!(printed_after(&run, "@w"), "2001", "{}", run.dump());
    for (mark, value, frame) in [
        ("@w1", "1000", "step_a (i=1001)"),
        ("@w2", "0", "step_a (i=1000)"),
        ("@w3", "0", "main ()"),
    ] {
        assert_eq!(printed_after(&run, mark), value, "{mark}\n{}", run.dump());
        assert!(
            run.after(mark)
                .lines()
                .find(|l| l.starts_with("#0  "))
                .is_some_and(|l| l.contains(frame)),
            "{mark}\n{}",
            run.dump()
        );
    }
    // Forward to the end of the past: the present again, where B crashed.
    assert!(
        run.gdb.contains("No more reverse-execution history"),
        "{}",
        run.dump()
    );
    assert_eq!(
        printed_after(&run, "@present"),
        b_xor(60).to_string(),
        "{}",
        run.dump()
    );
}

/// reverse-finish and reverse-next in a PC-only multi-thread past (a QEMU recording: no stack
/// pointer, GDB cannot unwind): with ptrewind's GDB script, GDB's own commands are done by the
/// server from the decoded calls and returns, in the selected thread. From worker B's last
/// `step_b`: reverse-finish stops at the call instruction in `worker_b`; reverse-next goes back
/// to the start of that one-line function's line (its first instruction); reverse-step is
/// refused with the reason. reverse-finish and reverse-next run from a sourced command file:
/// done, they are not errors, so the rest of the file runs (GDB stops a script at an error).
#[test]
fn reverse_finish_and_next_in_a_pc_only_thread() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = build(dir.path());
    let rec_dir = dir.path().join("rec");
    let (_recorded, status) = record_into(&rec_dir, &exe, &[], true);
    assert!(!status.success(), "the program crashes");
    let mut cli: Vec<OsString> = ["replay", "--listen", "127.0.0.1:0", "--qemu"]
        .iter()
        .map(Into::into)
        .collect();
    cli.push(rec_dir.into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gdb-scripts/ptrewind.py");
    let commands = dir.path().join("back.gdb");
    std::fs::write(
        &commands,
        "echo @finish\\n\nreverse-finish\nprintf \"PC %lx\\n\", $pc\nx/i $pc\n\
         echo @next\\n\nreverse-next\nprintf \"PC %lx\\n\", $pc\necho @sourced-to-the-end\\n\n",
    )
    .expect("write the command file");
    let run = gdb_session(
        Server::start_cli(&cli),
        &exe,
        &[
            format!("source {}", script.display()),
            "break step_b".into(),
            "reverse-continue".into(),
            "delete".into(),
            format!("source {}", commands.display()),
            "echo @step\\n".into(),
            "reverse-step".into(),
            "printf \"PC %lx\\n\", $pc".into(),
            "monitor thread".into(),
        ],
        Duration::from_secs(120),
    );
    let pcs: Vec<u64> = run
        .tagged("PC")
        .iter()
        .map(|v| u64::from_str_radix(v, 16).expect("hex pc"))
        .collect();
    assert_eq!(pcs.len(), 3, "{}", run.dump());
    let worker_b = nm_symbol(&exe, "worker_b");
    // The call to step_b inside worker_b.
    let finish = run.after("@finish");
    assert!(
        pcs[0] > worker_b && finish.contains("call") && finish.contains("step_b"),
        "{}",
        run.dump()
    );
    assert!(finish.contains("in worker_b"), "{}", run.dump());
    // worker_b is one line: reverse-next goes back to its first instruction.
    assert_eq!(pcs[1], worker_b, "{}", run.dump());
    // reverse-step is refused (the position stays).
    assert_eq!(pcs[2], pcs[1], "{}", run.dump());
    assert!(
        run.gdb.contains("reverse-step needs the stack pointer"),
        "{}",
        run.dump()
    );
    assert!(
        !run.gdb.contains("not meaningful in the outermost frame"),
        "{}",
        run.dump()
    );
    // Both were done without an error, so the sourced file ran to its end.
    assert!(run.gdb.contains("@sourced-to-the-end"), "{}", run.dump());
}
