//! End-to-end tests of the QEMU backend: small C programs run under `qemu-x86_64` with the plugin;
//! each thread's PT stream is decoded by our flow decoder over the recording's image and must
//! equal the plugin's own per-instruction log (test mode) — and, for a static non-PIE program, the
//! ptrace backend's stream. Skipped (with a message) when `qemu-x86_64` is not installed.

mod support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use ptrewind::capture::qemu::Recorded;
use ptrewind::capture::soft::classify::decode_insn;
use ptrewind::capture::soft::{RecordFrom, RecorderConfig, SoftRecorder};
use ptrewind::image::Image;
use ptrewind::packet::{Packet, PacketDecoder};
use ptrewind::target::{PtraceTarget, SpawnOptions};
use support::cbuild::{compile_source, have, nm_symbol};
use support::flow_ips;
use support::qemu::{fold_rep, plugin, qemu_available, record};

/// Compares a thread's decoded stream with its log. The log also has each instruction that
/// faulted (QEMU logs an instruction before executing it; PT reports it as the FUP of the
/// asynchronous transfer, not as executed): those are returned.
fn compare(decoded: &[u64], log: &[u64]) -> Vec<u64> {
    let mut faulted = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < decoded.len() || j < log.len() {
        if i < decoded.len() && j < log.len() && decoded[i] == log[j] {
            i += 1;
            j += 1;
            continue;
        }
        assert!(
            j < log.len() && faulted.len() < 64,
            "decoded stream diverges from the log at decoded[{i}] = {:x?}, log[{j}] = {:x?} \
             (decoded {} insns, log {}); context decoded {:x?} log {:x?}",
            decoded.get(i),
            log.get(j),
            decoded.len(),
            log.len(),
            &decoded[i.saturating_sub(3)..(i + 3).min(decoded.len())],
            &log[j.saturating_sub(3)..(j + 3).min(log.len())],
        );
        faulted.push(log[j]);
        j += 1;
    }
    faulted
}

fn compile(dir: &Path, name: &str, src: &str, flags: &[&str], libs: &[&str]) -> PathBuf {
    let mut f = vec!["-O1", "-g", "-fno-inline"];
    f.extend_from_slice(flags);
    compile_source("cc", dir, name, src, &f, libs)
}

const FLOW_SRC: &str = r#"
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static int sq(int x) { return x * x; }
static int cube(int x) { return x * x * x; }
static int (*ops[2])(int) = { sq, cube };
static int deep(int n) { return n == 0 ? 0 : 1 + deep(n - 1); }
static int sw(int k) {
    switch (k % 7) {
    case 0: return 3; case 1: return k; case 2: return k * 5; case 3: return -k;
    case 4: return k ^ 9; case 5: return k + 11; default: return 1;
    }
}
int main(int argc, char **argv) {
    char a[300], b[300];
    long s = 0;
    memset(a, argc, sizeof a);
    for (int i = 0; i < 2000; i++) {
        s += ops[i & 1](i) + sw(i);
        if (i % 97 == 0) s += deep(100);
        if (i % 500 == 0) { memcpy(b, a, sizeof b); s += b[7]; write(1, ".", 1); }
    }
    printf("%ld\n", s);
    return 0;
}
"#;

#[test]
fn decoded_stream_equals_plugin_log() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "flow", FLOW_SRC, &[], &[]);
    let (rec, status) = record(&exe, &[], true);
    assert!(status.success(), "{status:?}");
    assert_eq!(rec.threads.len(), 1, "one thread");
    let (image, missing) = rec.image().expect("image");
    assert!(missing.is_empty(), "{missing:?}");
    let t = &rec.threads[0];
    let meta = t.meta.as_ref().expect("thread summary");
    assert_eq!(meta.lost, 0);
    let (ips, errors) = flow_ips(&t.trace, &image);
    assert!(errors.is_empty(), "{errors:?}");
    let log = fold_rep(t.insns.as_ref().expect("test-mode log"), &image);
    assert!(log.len() > 100_000, "{} instructions", log.len());
    let faulted = compare(&ips, &log);
    assert!(faulted.is_empty(), "no fault expected: {faulted:x?}");
    assert_eq!(meta.tracer.instructions, ips.len() as u64);
    // Every packet kind the issue asks for is there: TNT, TIP (indirect calls, switch),
    // compressed RETs, PGD/PGE around system calls, PSB+, MODE.Exec, TSC.
    let mut kinds = std::collections::BTreeSet::new();
    let mut dec = PacketDecoder::new(&t.trace);
    while let Some(Ok((_, p))) = dec.next_packet() {
        kinds.insert(match p {
            Packet::ShortTnt(_) | Packet::LongTnt(_) => "tnt",
            Packet::Psb => "psb",
            Packet::Tsc { .. } => "tsc",
            Packet::ModeExec { .. } => "mode",
            other => match other.ip_payload() {
                Some((k, _)) => match k {
                    ptrewind::packet::IpKind::Tip => "tip",
                    ptrewind::packet::IpKind::TipPge => "pge",
                    ptrewind::packet::IpKind::TipPgd => "pgd",
                    ptrewind::packet::IpKind::Fup => "fup",
                },
                None => "other",
            },
        });
    }
    for k in ["tnt", "psb", "tsc", "mode", "tip", "pge", "pgd", "fup"] {
        assert!(kinds.contains(k), "no {k} packet in {kinds:?}");
    }
    assert!(meta.tracer.async_exact + meta.tracer.async_inexact == 0);
}

const THREADS_SRC: &str = r#"
#include <pthread.h>
#include <stdio.h>
static long work(long seed) {
    long s = seed;
    for (long i = 0; i < 20000 + seed * 1000; i++) s = s * 31 + (i % 7 ? i : -i);
    return s;
}
static void *run(void *p) { return (void *)work((long)p); }
int main(void) {
    pthread_t t[4];
    long total = 0;
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, run, (void *)i);
    for (int i = 0; i < 4; i++) { void *r; pthread_join(t[i], &r); total += (long)r; }
    printf("%ld\n", total);
    return 0;
}
"#;

#[test]
fn every_thread_has_its_own_exact_stream() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "threads", THREADS_SRC, &["-pthread"], &[]);
    let (rec, status) = record(&exe, &[], true);
    assert!(status.success(), "{status:?}");
    assert_eq!(rec.threads.len(), 5, "main + 4 workers");
    let (image, _) = rec.image().expect("image");
    let work = nm_symbol(&exe, "work");
    let mut tscs_seen = 0;
    for t in &rec.threads {
        let (ips, errors) = flow_ips(&t.trace, &image);
        assert!(errors.is_empty(), "thread {}: {errors:?}", t.tid);
        let log = fold_rep(t.insns.as_ref().expect("log"), &image);
        assert!(compare(&ips, &log).is_empty(), "thread {}", t.tid);
        let meta = t.meta.as_ref().expect("summary");
        assert_eq!(meta.lost, 0);
        tscs_seen += meta.tracer.tsc_stamps;
        // Main returns from `main` (its `exit_group` ends the process, and QEMU runs the
        // plugin's atexit on it); the workers exited before.
        assert_eq!(meta.ended_process, t.tid == t.pid, "thread {}", t.tid);
        if t.tid != t.pid {
            // A worker ran `work` (PIE: compare the offset inside the page).
            assert!(
                ips.iter().any(|ip| ip & 0xfff == work & 0xfff),
                "thread {} never in work",
                t.tid
            );
        }
    }
    assert!(
        tscs_seen > 5,
        "TSC stamps from the global clock: {tscs_seen}"
    );
}

const FAULT_SRC: &str = r#"
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
static sigjmp_buf env;
static volatile int hits;
static void on_segv(int sig) { (void)sig; hits++; siglongjmp(env, 1); }
/* Several instructions before and after the faulting store, in one block. */
__attribute__((noinline)) long poke(long *p, long a, long b) {
    long x = a * 3 + b;
    long y = x ^ (a << 2);
    *p = y;
    x += y * 7;
    return x - b;
}
int main(int argc, char **argv) {
    long ok = 0;
    if (argc > 1) {
        poke((long *)8, 1, 2); /* no handler: dies of SIGSEGV */
        return 0;
    }
    signal(SIGSEGV, on_segv);
    for (int i = 0; i < 3; i++) {
        if (sigsetjmp(env, 1) == 0) ok += poke((long *)16, i, 5);
        else ok += poke(&ok, i, 1);
    }
    printf("%ld %d\n", ok, hits);
    return 0;
}
"#;

/// The address of the store in `poke` that faults (the only instruction of `poke` writing
/// through its first argument).
fn store_in_poke(exe: &Path, image: &Image, base: u64) -> u64 {
    let poke = base + nm_symbol(exe, "poke");
    let mut ip = poke;
    for _ in 0..20 {
        let mut b = [0u8; 15];
        let n = image.read(ip, &mut b);
        let i = decode_insn(ip, &b[..n]).expect("decodable poke");
        if i.insn.mnemonic() == iced_x86::Mnemonic::Mov
            && i.insn.op0_kind() == iced_x86::OpKind::Memory
            && i.insn.memory_base() == iced_x86::Register::RDI
        {
            return ip;
        }
        ip = i.nlip();
    }
    panic!("no store through rdi in poke");
}

fn fault_case(die: bool, precise: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "fault", FAULT_SRC, &["-no-pie"], &[]);
    let args: &[&str] = if die { &["die"] } else { &[] };
    let (rec, status) = record(&exe, args, precise);
    if die {
        use std::os::unix::process::ExitStatusExt;
        assert!(
            status.signal() == Some(11) || status.code() == Some(139),
            "{status:?}"
        );
    } else {
        assert!(status.success(), "{status:?}");
    }
    let (image, _) = rec.image().expect("image");
    let store = store_in_poke(&exe, &image, 0);
    let t = &rec.threads[0];
    if die {
        // QEMU 7.2 runs no plugin code when the guest dies: the stream was completed from the
        // thread's tail file.
        assert!(t.meta.is_none());
        assert!(
            t.completed
                .as_deref()
                .is_some_and(|c| c.contains("stopped at")),
            "{:?}",
            t.completed
        );
    }
    let (ips, errors) = flow_ips(&t.trace, &image);
    assert!(errors.is_empty(), "{errors:?}");
    let log = fold_rep(t.insns.as_ref().expect("log"), &image);
    let faults = if die { 1 } else { 3 };
    if precise {
        // Exactly the faulting stores are in the log and not in the stream: the instructions
        // after them in their block were not counted.
        let faulted = compare(&ips, &log);
        assert_eq!(faulted, vec![store; faults], "{:?}", t.meta);
        if let Some(meta) = &t.meta {
            assert_eq!(meta.tracer.async_exact, faults as u64, "{meta:?}");
        }
    } else {
        // Without the counters an interrupted block is not counted at all (never in full): the
        // log has the block's instructions up to the faulting store, the stream none of them.
        let faulted = compare(&ips, &log);
        let poke = nm_symbol(&exe, "poke");
        assert_eq!(faulted.iter().filter(|&&a| a == store).count(), faults);
        assert!(
            faulted.iter().all(|&a| (poke..=store).contains(&a)),
            "{faulted:x?}"
        );
        let meta = t.meta.as_ref().expect("summary");
        assert_eq!(meta.tracer.async_inexact, faults as u64, "{meta:?}");
    }
}

#[test]
fn fault_mid_block_with_handler_and_siglongjmp() {
    if !qemu_available() {
        return;
    }
    fault_case(false, true);
}

#[test]
fn fault_mid_block_kills_the_program() {
    if !qemu_available() {
        return;
    }
    fault_case(true, true);
}

#[test]
fn fault_without_precise_counters_is_never_counted_in_full() {
    if !qemu_available() {
        return;
    }
    fault_case(false, false);
}

const STATIC_SRC: &str = r#"
#include <unistd.h>
static unsigned long mix(unsigned long x) { return (x ^ (x >> 7)) * 0x9e3779b97f4a7c15ul; }
static unsigned long rec(int n) { return n == 0 ? 1 : mix(rec(n - 1)) + n; }
int main(void) {
    unsigned long s = 0;
    for (int i = 0; i < 300; i++) s += (i & 3) ? rec(i % 80) : mix(i);
    char c = '0' + (s & 7);
    write(1, &c, 1);
    return 0;
}
"#;

#[test]
fn static_program_same_stream_as_ptrace_backend() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(
        dir.path(),
        "static",
        STATIC_SRC,
        &["-static", "-no-pie"],
        &[],
    );
    let main = nm_symbol(&exe, "main");
    // QEMU.
    let (rec, status) = record(&exe, &[], true);
    assert!(status.success());
    let (image, _) = rec.image().expect("image");
    let (qips, errors) = flow_ips(&rec.threads[0].trace, &image);
    assert!(errors.is_empty(), "{errors:?}");
    // ptrace, from main.
    let mut cmd = std::process::Command::new(&exe);
    cmd.stdout(Stdio::null());
    let child = PtraceTarget::spawn_command(cmd, &SpawnOptions::default()).expect("spawn");
    let cfg = RecorderConfig {
        record_from: RecordFrom::Main,
        ..RecorderConfig::default()
    };
    let mut r = SoftRecorder::new(child, cfg).expect("recorder");
    r.run(Some(5_000_000)).expect("run");
    let soft = r.finish().expect("finish");
    let (pips, errors) = flow_ips(&soft.trace, soft.image.as_ref().expect("image"));
    assert!(errors.is_empty(), "{errors:?}");
    // Same addresses from main to main's return (libc start-up and exit depend on the CPU
    // QEMU emulates, which differs from the host's: compare the program's own part).
    let from = qips
        .iter()
        .position(|&ip| ip == main)
        .expect("main in qemu stream");
    let q = &qips[from..];
    let (exit, exit_) = (nm_symbol(&exe, "exit"), nm_symbol(&exe, "_exit"));
    let until = |s: &[u64]| {
        s.iter()
            .position(|&ip| ip == exit || ip == exit_)
            .unwrap_or(s.len())
    };
    let (q, p) = (&q[..until(q)], &pips[..until(&pips)]);
    assert!(q.len() > 10_000, "{}", q.len());
    assert_eq!(q.len(), p.len());
    assert!(q == p, "streams differ");
}

const CRASH_SRC: &str = r#"
#include <pthread.h>
#include <stdio.h>
int counter;
__attribute__((noinline)) void step(int i) { counter += i; }
__attribute__((noinline)) void crash(int *p) { *p = counter; }
static void *worker(void *arg) {
    for (int i = 0; i < 50; i++) step(i);
    crash((int *)arg);
    return 0;
}
int main(void) {
    pthread_t t;
    for (int i = 0; i < 10; i++) step(i);
    pthread_create(&t, 0, worker, 0);
    pthread_join(t, 0);
    puts("not reached");
    return 0;
}
"#;

/// `record --backend qemu` of a program whose worker thread crashes: the recording survives the
/// crash and GDB reverse-executes the worker's thread to a breakpoint.
#[test]
fn gdb_reverse_on_a_worker_that_crashed() {
    if !qemu_available() || !have("gdb") {
        return;
    }
    use support::gdb::{Server, gdb_session};
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(
        dir.path(),
        "crash",
        CRASH_SRC,
        &["-pthread", "-no-pie", "-O0"],
        &[],
    );
    // First the whole recording, to learn the worker's thread id from the directory.
    let rec_dir = dir.path().join("rec");
    let mut cli: Vec<OsString> = ["record", "--backend", "qemu", "--no-live", "--trace-dir"]
        .iter()
        .map(Into::into)
        .collect();
    cli.push(rec_dir.clone().into());
    cli.extend(["--qemu-plugin".into(), plugin().into(), "--".into()]);
    cli.push(exe.clone().into());
    let server = Server::start_cli(&cli);
    let recorded = Recorded::open(&rec_dir).expect("recording kept after the crash");
    assert_eq!(recorded.threads.len(), 2, "main + worker");
    let run = gdb_session(
        server,
        &exe,
        &[
            "info threads",
            "break step",
            "reverse-continue",
            "monitor where",
        ],
        std::time::Duration::from_secs(60),
    );
    assert!(
        run.server.contains("QEMU recording") || run.server.contains("replaying"),
        "{}",
        run.dump()
    );
    // Every thread is served: GDB stops at the last call of `step` in global order, the
    // worker's (it calls `step` after main's calls, before crashing). With libc's symbols
    // found, `step` may have a second location there: "Breakpoint 1.1".
    assert!(
        run.gdb.contains("Breakpoint 1, step") || run.gdb.contains("Breakpoint 1.1, step"),
        "{}",
        run.dump()
    );
    assert!(
        run.gdb.matches("Thread ").count() >= 2,
        "info threads lists main and the worker: {}",
        run.dump()
    );
    assert!(
        run.gdb.contains("in step+") && run.gdb.contains("replaying: instruction"),
        "{}",
        run.dump()
    );
    // The worker's stream ends at the crash: the faulting store in `crash` is its last
    // (not executed) instruction, announced by FUP.
    let worker = recorded
        .threads
        .iter()
        .find(|t| t.tid != t.pid)
        .expect("worker");
    let (image, _) = recorded.image().expect("image");
    let (ips, errors) = flow_ips(&worker.trace, &image);
    assert!(errors.is_empty(), "{errors:?}");
    let crash = nm_symbol(&exe, "crash");
    assert!(
        ips.iter()
            .rev()
            .take(20)
            .any(|&ip| (crash..crash + 32).contains(&ip)),
        "worker stream ends in crash: {:x?}",
        &ips[ips.len().saturating_sub(20)..]
    );
}

#[test]
fn clear_errors_for_bad_programs_and_missing_qemu() {
    use support::gdb::ptrewind;
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").expect("write");
    let arm = dir.path().join("arm.elf");
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2;
    h[5] = 1;
    h[18] = 183; // EM_AARCH64
    std::fs::write(&arm, &h).expect("write");
    let run = |prog: &Path, path_env: Option<&str>| {
        let mut cmd = ptrewind();
        cmd.args(["record", "--backend", "qemu", "--no-live", "--qemu-plugin"])
            .arg(plugin())
            .arg("--")
            .arg(prog);
        if let Some(p) = path_env {
            cmd.env("PATH", p);
        }
        let out = cmd.output().expect("run ptrewind");
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    if qemu_available() {
        let (st, err) = run(&script, None);
        assert_eq!(st.code(), Some(2), "{err}");
        assert!(
            err.contains("not an ELF executable") && err.contains("script"),
            "{err}"
        );
        let (st, err) = run(&arm, None);
        assert_eq!(st.code(), Some(2), "{err}");
        assert!(err.contains("AArch64") && err.contains("x86-64"), "{err}");
    }
    let (st, err) = run(
        Path::new("/bin/true"),
        Some(dir.path().to_str().expect("utf8")),
    );
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("qemu-user"), "{err}");
}

const PIE_SRC: &str = r#"
#include <stdio.h>
volatile int sink;
__attribute__((noinline)) int leaf(int x) { sink = x; return x * 2; }
int main(void) {
    int s = 0;
    for (int i = 0; i < 4; i++) s += leaf(i);
    printf("s=%d\n", s);
    return 0;
}
"#;

/// A PIE, dynamically linked program recorded to its end and replayed: GDB places the program
/// and its libraries where QEMU's loader put them (the auxiliary vector and the svr4 library
/// list are made from the recorded mappings), so the end is in libc's `_exit` and a breakpoint
/// by name is set at the relocated address and reached by reverse-continue.
#[test]
fn gdb_replays_a_pie_dynamic_program_relocated() {
    if !qemu_available() || !have("gdb") {
        return;
    }
    use support::gdb::{Server, gdb_session};
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(
        dir.path(),
        "pie",
        PIE_SRC,
        &["-g", "-O0", "-pie", "-fPIE"],
        &[],
    );
    let link_leaf = nm_symbol(&exe, "leaf");
    let mut cli: Vec<OsString> = ["record", "--backend", "qemu", "--no-live", "--trace-dir"]
        .iter()
        .map(Into::into)
        .collect();
    cli.push(dir.path().join("rec").into());
    cli.extend(["--qemu-plugin".into(), plugin().into(), "--".into()]);
    cli.push(exe.clone().into());
    let server = Server::start_cli(&cli);
    let run = gdb_session(
        server,
        &exe,
        &[
            "info sharedlibrary",
            "echo @end\\n",
            "p/x $pc",
            "break leaf",
            "reverse-continue",
            "echo @bp\\n",
            "p/x $pc",
            "info symbol $pc",
        ],
        std::time::Duration::from_secs(60),
    );
    let g = &run.gdb;
    // Both libraries found and read at their recorded places.
    assert!(
        g.lines()
            .any(|l| l.contains("libc.so.6") && l.contains("Yes")),
        "{}",
        run.dump()
    );
    assert!(
        g.lines()
            .any(|l| l.contains("ld-linux-x86-64.so.2") && l.contains("Yes")),
        "{}",
        run.dump()
    );
    // The end of the history is in libc's exit path, named.
    // (GDB first reads the libraries through the server's Host I/O: "Reading … from remote
    // target...".)
    assert!(
        g.lines()
            .find(|l| !l.starts_with("Reading "))
            .is_some_and(|l| l.contains("_exit (")),
        "{}",
        run.dump()
    );
    run.expect("Breakpoint 1, leaf");
    let pc = run.hex_after("@bp");
    // Relocated: GDB names the stop in `leaf` of the program, the address is not the
    // link-time one, and the bias keeps the offset within the page.
    let off: u64 = run
        .after("@bp")
        .split_once("leaf + ")
        .and_then(|x| x.1.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no symbol at the stop: {}", run.dump()));
    assert!(off < 16, "{}", run.dump());
    assert_ne!(pc, link_leaf + off, "{}", run.dump());
    assert_eq!(pc & 0xfff, (link_leaf + off) & 0xfff, "{}", run.dump());
}

/// GDB's own `record btrace pt` and LLDB's `thread trace dump instructions` on a QEMU
/// recording: both debuggers decode the plugin's stream with their libipt (GDB: exactly the
/// instructions ptrewind recorded, and real frames in the past from the trace's calls), and
/// LLDB's newest instruction is the program's last, the `exit_group` SYSCALL.
#[test]
fn btrace_and_lldb_trace_dump_on_a_qemu_recording() {
    if !qemu_available() || !have("gdb") {
        return;
    }
    use support::gdb::{Server, gdb_session, run_until};
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "pie", PIE_SRC, &["-g", "-O0"], &[]);
    let start = |rec: &str| {
        let mut cli: Vec<OsString> = ["record", "--backend", "qemu", "--no-live", "--trace-dir"]
            .iter()
            .map(Into::into)
            .collect();
        cli.push(dir.path().join(rec).into());
        cli.extend(["--qemu-plugin".into(), plugin().into(), "--".into()]);
        cli.push(exe.clone().into());
        Server::start_cli(&cli)
    };
    let run = gdb_session(
        start("rec1"),
        &exe,
        &[
            "record btrace pt",
            "info record",
            "break leaf",
            "reverse-continue",
            "echo @bt\\n",
            "bt",
        ],
        std::time::Duration::from_secs(60),
    );
    let recorded: u64 = run
        .server
        .split_once(" instructions in ")
        .and_then(|x| x.0.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no instruction count: {}", run.dump()));
    assert!(
        run.gdb
            .contains(&format!("Recorded {recorded} instructions in ")),
        "{}",
        run.dump()
    );
    assert!(run.gdb.contains("(0 gaps)"), "{}", run.dump());
    let bt = run.after("@bt");
    assert!(bt.contains("#0  leaf ("), "{}", run.dump());
    assert!(bt.contains(" in main ("), "{}", run.dump());

    if !have("lldb-19") {
        eprintln!("SKIPPED (LLDB part): lldb-19 not installed");
        return;
    }
    let mut server = start("rec2");
    let mut lldb = std::process::Command::new("lldb-19");
    lldb.arg("--batch")
        .args(["-o", &format!("gdb-remote 127.0.0.1:{}", server.port)])
        .args(["-o", "process trace start"])
        .args(["-o", "thread trace dump instructions -c 4"])
        .args(["-o", "thread trace dump info"])
        .args(["-o", "kill"])
        .arg(&exe);
    let out = run_until(&mut lldb, std::time::Duration::from_secs(60));
    let _ = server.child.kill();
    let _ = server.child.wait();
    let text = format!("{}{}", out.stdout, out.stderr);
    let first = text
        .split_once("thread trace dump instructions")
        .and_then(|x| {
            x.1.lines()
                .find(|l| l.trim_start().starts_with(char::is_numeric))
        })
        .unwrap_or_else(|| panic!("no instructions: {text}"));
    assert!(first.contains("syscall"), "{text}");
    assert!(text.contains("Number of individual errors: 0"), "{text}");
}

const SPIN_SRC: &str = r#"
volatile int sink;
__attribute__((noinline)) void tick(int i) { sink = i; }
int main(void) { for (int i = 0;; i++) tick(i); }
"#;

/// The QEMU process is killed (SIGKILL) while `record --backend qemu` records a program that
/// never ends: the recording up to that point is kept (the plugin's tail file completes the
/// stream), ptrewind says how it ended and serves it, and GDB reverse-executes it.
#[test]
fn a_killed_guest_keeps_its_recording_and_it_is_served() {
    if !qemu_available() || !have("gdb") {
        return;
    }
    use support::gdb::{Server, gdb_session};
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "spin", SPIN_SRC, &["-O0", "-no-pie"], &[]);
    let tick = nm_symbol(&exe, "tick");
    // The killer: finds the QEMU process running this program once it has run ~0.3 s of CPU.
    let target = exe.to_string_lossy().into_owned();
    let killer = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
            for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd);
                if !cmd.contains("qemu-x86_64") || !cmd.contains(&target) {
                    continue;
                }
                let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        let f: Vec<String> = s
                            .rsplit_once(')')?
                            .1
                            .split_whitespace()
                            .map(String::from)
                            .collect();
                        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
                    })
                    .unwrap_or(0);
                if ticks >= 30 {
                    // SAFETY: kill(2) on the QEMU process this test started (by its path).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return true;
                }
            }
        }
        false
    });
    let mut cli: Vec<OsString> = ["record", "--backend", "qemu", "--no-live", "--trace-dir"]
        .iter()
        .map(Into::into)
        .collect();
    cli.push(dir.path().join("rec").into());
    cli.extend(["--qemu-plugin".into(), plugin().into(), "--".into()]);
    cli.push(exe.clone().into());
    let server = Server::start_cli(&cli);
    assert!(killer.join().expect("killer"), "QEMU was never killed");
    let run = gdb_session(
        server,
        &exe,
        &[
            "echo @end\\n",
            "p/x $pc",
            "break tick",
            "reverse-continue",
            "echo @rc\\n",
            "p/x $pc",
            "reverse-continue",
            "echo @rc2\\n",
            "p/x $pc",
        ],
        std::time::Duration::from_secs(60),
    );
    assert!(run.server.contains("signal: 9 (SIGKILL)"), "{}", run.dump());
    assert!(
        run.server
            .contains("its stream ended without the plugin's summary"),
        "{}",
        run.dump()
    );
    // The history ends inside the loop (main or tick), and reverse-continue finds tick's
    // earlier calls.
    let end = run.hex_after("@end");
    let main = nm_symbol(&exe, "main");
    assert!(
        (tick..tick + 0x20).contains(&end) || (main..main + 0x40).contains(&end),
        "{end:#x}: {}",
        run.dump()
    );
    let rc = run.hex_after("@rc");
    assert!((tick..tick + 16).contains(&rc), "{}", run.dump());
    assert_eq!(run.hex_after("@rc2"), rc, "{}", run.dump());
}

/// A stop in a PC-only past expedites the PC and nothing the position does not know: GDB would
/// take an expedited 0 for rsp/rbp and read memory near address 0 around every reverse-stepi
/// (four extra round trips per step).
#[test]
fn a_pc_only_stop_reply_expedites_only_known_registers() {
    if !qemu_available() {
        return;
    }
    use support::gdb::Server;
    use support::rsp::Raw;
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "pie", PIE_SRC, &["-O0"], &[]);
    let mut cli: Vec<OsString> = ["record", "--backend", "qemu", "--no-live", "--trace-dir"]
        .iter()
        .map(Into::into)
        .collect();
    cli.push(dir.path().join("rec").into());
    cli.extend(["--qemu-plugin".into(), plugin().into(), "--".into()]);
    cli.push(exe.into());
    let mut server = Server::start_cli(&cli);
    let mut c = Raw::connect(server.port, std::time::Duration::from_secs(30));
    let supported = c.ask("qSupported:multiprocess+;swbreak+");
    let stops: Vec<String> = (0..3).map(|_| c.ask("bs")).collect();
    let _ = server.child.kill();
    let _ = server.child.wait();
    assert!(supported.contains("ReverseStep+"), "{supported}");
    for stop in &stops {
        assert!(stop.starts_with('T'), "{stop}");
        assert!(stop.contains(";10:"), "the PC is expedited: {stop}");
        assert!(
            !stop.contains(";06:") && !stop.contains(";07:"),
            "rbp/rsp are unknown in a PC-only past and must not be expedited: {stop}"
        );
    }
}

/// The `&str`s of `v`.
fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A program whose child does its own work: the child calls `child_work` (never the parent),
/// the parent `parent_work` after waiting for it.
const FORK_SRC: &str = r#"
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
__attribute__((noinline)) int child_work(int x) { int s = 0; for (int i = 0; i < x; i++) s += i * 3; return s; }
__attribute__((noinline)) int parent_work(int x) { return x + 1; }
int main(void) {
    pid_t p = fork();
    if (p == 0) { printf("child %d\n", child_work(20)); fflush(stdout); _exit(3); }
    int st;
    waitpid(p, &st, 0);
    printf("parent %d pid %d\n", parent_work(5), (int)p);
    return 0;
}
"#;

/// Under QEMU a forked child runs on without the gdbstub, recorded by the plugin: `record
/// --no-live --follow-fork child` serves the child's recording (its own threads and code:
/// the libraries it inherited come from its fork snapshot), `replay --qemu DIR --pid PID`
/// serves either process afterwards, each with only its own history, and an unknown pid is a
/// clear error.
#[test]
fn a_forked_childs_recording_is_served_by_pid() {
    if !qemu_available() || !have("gdb") {
        return;
    }
    use support::gdb::{Server, gdb_session};
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(
        dir.path(),
        "forks",
        FORK_SRC,
        &["-g", "-O0", "-no-pie"],
        &[],
    );
    let rec = dir.path().join("rec");
    let mut cli: Vec<OsString> = ["record", "--backend", "qemu", "--no-live", "--trace-dir"]
        .iter()
        .map(Into::into)
        .collect();
    cli.push(rec.clone().into());
    cli.extend(["--follow-fork".into(), "child".into()]);
    cli.extend(["--qemu-plugin".into(), plugin().into(), "--".into()]);
    cli.push(exe.clone().into());
    let commands = |marks: &str| -> Vec<String> {
        vec![
            "info threads".into(),
            "break child_work".into(),
            "break parent_work".into(),
            "reverse-continue".into(),
            format!("echo @{marks}\\n"),
            "bt 1".into(),
            "reverse-continue".into(),
            "echo @again\\n".into(),
        ]
    };
    let timeout = std::time::Duration::from_secs(60);
    let child_cmds = commands("child");
    let run = gdb_session(Server::start_cli(&cli), &exe, &refs(&child_cmds), timeout);
    // The parent printed the child's pid; the child's recording is the one served.
    let child: u32 = run
        .program_stdout
        .split("pid ")
        .nth(1)
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no child pid: {}", run.dump()));
    assert!(
        run.server
            .contains(&format!("serving 1 thread(s) ({child})")),
        "{}",
        run.dump()
    );
    assert!(
        run.server.contains("are recorded in") && run.server.contains("--pid PID"),
        "{}",
        run.dump()
    );
    let at = run.after("@child");
    assert!(at.contains("child_work"), "{}", run.dump());
    // No earlier call of either function in the child's history.
    assert!(
        run.after("@child")
            .split("@again")
            .next()
            .is_some_and(|s| s.contains("No more reverse-execution history")),
        "{}",
        run.dump()
    );
    assert!(!run.gdb.contains("parent_work ("), "{}", run.dump());

    // The parent, from the kept directory: only its own history (parent_work, no child_work).
    let parent = std::fs::read_dir(&rec)
        .expect("recording kept")
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".maps")?
                .parse::<u32>()
                .ok()
        })
        .find(|&p| p != child)
        .expect("the parent's mappings");
    let mut replay: Vec<OsString> = ["replay", "--listen", "127.0.0.1:0", "--qemu"]
        .iter()
        .map(Into::into)
        .collect();
    replay.push(rec.clone().into());
    let mut by_pid = replay.clone();
    by_pid.extend(["--pid".into(), parent.to_string().into()]);
    let parent_cmds = commands("parent");
    let run = gdb_session(
        Server::start_cli(&by_pid),
        &exe,
        &refs(&parent_cmds),
        timeout,
    );
    assert!(
        run.server
            .contains(&format!("serving 1 thread(s) ({parent})")),
        "{}",
        run.dump()
    );
    assert!(
        run.after("@parent").contains("parent_work"),
        "{}",
        run.dump()
    );
    assert!(!run.gdb.contains("child_work ("), "{}", run.dump());

    // The child again by --pid, and an unknown pid.
    let mut by_pid = replay.clone();
    by_pid.extend(["--pid".into(), child.to_string().into()]);
    let run = gdb_session(
        Server::start_cli(&by_pid),
        &exe,
        &refs(&child_cmds),
        timeout,
    );
    assert!(run.after("@child").contains("child_work"), "{}", run.dump());
    // `view --qemu` draws each process's threads over that process's own code.
    let out_dir = dir.path().join("view");
    let out = support::gdb::ptrewind()
        .args(["view", "--qemu"])
        .arg(&rec)
        .arg("-o")
        .arg(&out_dir)
        .output()
        .expect("ptrewind view");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let timeline = std::fs::read_to_string(out_dir.join("timeline.json")).expect("timeline");
    let events: serde_json::Value = serde_json::from_str(&timeline).expect("json");
    let slices: Vec<(u64, String)> = events["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| Some((e["tid"].as_u64()?, e["name"].as_str()?.to_string())))
        .filter(|(_, n)| n == "child_work" || n == "parent_work")
        .collect();
    assert!(
        slices.contains(&(u64::from(child), "child_work".into())),
        "{slices:?}"
    );
    assert!(
        slices.contains(&(u64::from(parent), "parent_work".into())),
        "{slices:?}"
    );
    assert!(
        slices
            .iter()
            .all(|(t, n)| (*t == u64::from(child)) == (n == "child_work")),
        "{slices:?}"
    );
    let mut bad = replay;
    bad.extend(["--pid".into(), "1".into()]);
    let out = support::gdb::ptrewind()
        .args(&bad)
        .output()
        .expect("ptrewind");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no process 1 in") && err.contains(&child.to_string()),
        "{err}"
    );
}
