//! `ptrewind record --backend qemu` (live, the default) with real GDB in batch mode: the program runs
//! under QEMU with the plugin and the gdbstub; breakpoints, stepping and crashes come from the
//! stub, reverse execution from the plugin's trace (PC-only past). Skipped (with a message) when
//! `qemu-x86_64` or `gdb` is missing.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::cbuild::{compile_source, example_source, have, line_of, nm_symbol};
use support::gdb::{
    GdbRun, Server, gdb_session, gdb_session_interrupting, marker_older_than, range_steps,
    run_until, wait_until,
};
use support::qemu::{live_program, live_server};

const PROGRAM: &str = r#"
#include <stdio.h>
volatile int sink;
__attribute__((noinline)) int leaf(int x) { sink = x; return x * 2; }
__attribute__((noinline)) int middle(int x) {
    int s = 0;
    for (int i = 0; i < x; i++) s += leaf(i);
    return s;
}
__attribute__((noinline)) void spin(void) { for (;;) sink++; }
__asm__(".text\n.globl crash_at\n.type crash_at,@function\ncrash_at:\n movl $1, 0\n ret\n");
void crash_at(void);
int main(int argc, char **argv) {
    int r = middle(5);
    printf("r=%d\n", r);
    if (argc > 1 && argv[1][0] == 'c') crash_at();
    if (argc > 1 && argv[1][0] == 's') spin();
    r += middle(3);
    return r & 0x7f;
}
"#;

fn setup() -> Option<(tempfile::TempDir, PathBuf)> {
    live_program("live", PROGRAM, &["-g", "-O0", "-no-pie"])
}

fn session(exe: &Path, args: &[&str], commands: &[String]) -> GdbRun {
    session_interrupting(exe, args, commands, None)
}

/// `interrupt_after_cpu`: send GDB a Ctrl-C once QEMU has used this much CPU time (ticks of
/// `/proc/PID/stat`), i.e. once the program spins.
fn session_interrupting(
    exe: &Path,
    args: &[&str],
    commands: &[String],
    interrupt_after_cpu: Option<u64>,
) -> GdbRun {
    session_with(exe, args, commands, interrupt_after_cpu, &[])
}

/// One live QEMU session at a time in this file: the test programs' threads are scheduled by
/// QEMU on a 2-core machine, and two sessions side by side change which thread runs when
/// (seen: a worker not yet exited at another's crash, 10 breakpoint hits of 16 before a
/// timeout). The timing-dependent outcomes are the product's to handle; the tests check one
/// schedule at a time.
static ONE_SESSION: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `extra`: more `record` options.
fn session_with(
    exe: &Path,
    args: &[&str],
    commands: &[String],
    interrupt_after_cpu: Option<u64>,
    extra: &[&str],
) -> GdbRun {
    // A test that failed while holding it must not fail the others.
    let _one = ONE_SESSION.lock().unwrap_or_else(|e| e.into_inner());
    let server = start_server(exe, args, extra);
    let Some(ticks) = interrupt_after_cpu else {
        return gdb_session(server, exe, commands, Duration::from_secs(120));
    };
    let pid = server.pid;
    let spinning = move || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = s.rsplit_once(')')?.1;
                let f: Vec<&str> = rest.split_whitespace().collect();
                Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
            })
            .is_some_and(|t| t >= ticks)
    };
    gdb_session_interrupting(server, exe, commands, Duration::from_secs(120), spinning)
}

/// A live QEMU recording server of `exe args` (`extra`: more `record` options), its
/// recording directory beside `exe`.
fn start_server(exe: &Path, args: &[&str], extra: &[&str]) -> Server {
    live_server(exe, args, extra)
}

fn cmds(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn breakpoints_step_reverse_step_and_reverse_continue() {
    let Some((_dir, exe)) = setup() else { return };
    let leaf = nm_symbol(&exe, "leaf");
    let run = session(
        &exe,
        &[],
        &cmds(&[
            "break leaf",
            "continue",
            "continue",
            "echo @hit2\\n",
            "p x",
            "p/x $pc",
            "stepi",
            "echo @stepped\\n",
            "p/x $pc",
            "reverse-stepi",
            "echo @back1\\n",
            "p/x $pc",
            "reverse-stepi",
            "echo @back2\\n",
            "p/x $pc",
            "info registers rax",
            "reverse-continue",
            "echo @rc\\n",
            "p/x $pc",
            "monitor stats",
            "delete",
            "continue",
            "echo @live\\n",
            "continue",
            "echo @atexit\\n",
            "continue",
            "echo @end\\n",
        ]),
    );
    let g = &run.gdb;
    let after = |mark: &str| g.split_once(mark).map(|x| x.1).unwrap_or("");
    assert!(after("@hit2").contains("$1 = 1"), "{}", run.dump());
    // The breakpoint (after leaf's prologue) and the instruction after it.
    let bp = after("@hit2")
        .lines()
        .find_map(|l| l.strip_prefix("$2 = 0x"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no pc: {}", run.dump()));
    assert!(bp > leaf && bp < leaf + 16, "{}", run.dump());
    let stepped = run.hex_after("@stepped");
    assert!(stepped > bp, "{}", run.dump());
    // One instruction back: the breakpoint's instruction again (from the trace).
    assert_eq!(run.hex_after("@back1"), bp, "{}", run.dump());
    // One more: the last instruction of the prologue, before the breakpoint.
    let back2 = run.hex_after("@back2");
    assert!(back2 > leaf && back2 < bp, "{}", run.dump());
    // PC-only past: other registers are unavailable, not the present's values.
    assert!(
        after("@back2").contains("rax            <unavailable>"),
        "{}",
        run.dump()
    );
    // Reverse-continue: the previous call's hit of the breakpoint (leaf(0)).
    assert!(after("@back2").contains("Breakpoint 1"), "{}", run.dump());
    assert_eq!(run.hex_after("@rc"), bp, "{}", run.dump());
    assert!(after("@rc").contains("backend                  qemu"));
    // Forward again: replay stops at the end of the history (the live stop), then the program
    // runs on live to its end (r = 20 + 6 = 26).
    assert!(
        after("@rc").contains("No more reverse-execution history"),
        "{}",
        run.dump()
    );
    // The program stops at its exit (the default), then exits.
    assert!(
        after("@atexit").contains("the program is exiting")
            || after("@live").contains("the program is exiting"),
        "{}",
        run.dump()
    );
    assert!(
        after("@atexit").contains("exited with code 032"),
        "{}",
        run.dump()
    );
    assert!(run.program_stdout.contains("r=20"), "{}", run.dump());
}

#[test]
fn crash_stop_and_reverse_from_it() {
    let Some((_dir, exe)) = setup() else { return };
    let crash = nm_symbol(&exe, "crash_at");
    let main = nm_symbol(&exe, "main");
    let run = session(
        &exe,
        &["crash"],
        &cmds(&[
            "continue",
            "echo @crash\\n",
            "p/x $pc",
            "reverse-stepi",
            "echo @back\\n",
            "p/x $pc",
            "kill",
        ]),
    );
    let g = &run.gdb;
    assert!(
        g.contains("Program received signal SIGSEGV"),
        "{}",
        run.dump()
    );
    // The faulting store, not counted as executed: one step back is the call in main.
    assert_eq!(run.hex_after("@crash"), crash, "{}", run.dump());
    let back = run.hex_after("@back");
    assert!(
        back > main && back < main + 0x80,
        "{back:#x}: {}",
        run.dump()
    );
}

#[test]
fn ctrl_c_stops_a_spinning_program_and_reverse_works_from_there() {
    let Some((_dir, exe)) = setup() else { return };
    let spin = nm_symbol(&exe, "spin");
    let run = session_interrupting(
        &exe,
        &["spin"],
        &cmds(&[
            "continue",
            "echo @int\\n",
            "p/x $pc",
            "reverse-stepi",
            "echo @back\\n",
            "p/x $pc",
            "monitor stats",
            "kill",
        ]),
        Some(60),
    );
    let g = &run.gdb;
    assert!(
        g.contains("Program received signal SIGINT"),
        "{}",
        run.dump()
    );
    let at = run.hex_after("@int");
    assert!((spin..spin + 0x20).contains(&at), "{at:#x}: {}", run.dump());
    let back = run.hex_after("@back");
    assert!(
        (spin..spin + 0x20).contains(&back),
        "{back:#x}: {}",
        run.dump()
    );
    assert_ne!(back, at, "{}", run.dump());
}

/// The program dies of its SIGSEGV under GDB: GDB is told, and the recording directory keeps
/// every thread's stream (the plugin's tail completes it) after the session.
#[test]
fn the_recording_survives_the_crash() {
    let Some((_dir, exe)) = setup() else { return };
    let run = session(
        &exe,
        &["crash"],
        &cmds(&["continue", "continue", "echo @after\\n"]),
    );
    assert!(
        run.gdb.contains("Program terminated with signal SIGSEGV"),
        "{}",
        run.dump()
    );
    let dir = run
        .server
        .lines()
        .find_map(|l| l.split_once("every thread recorded into ").map(|x| x.1))
        .and_then(|rest| rest.split(';').next())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("no recording directory: {}", run.dump()));
    let rec = ptrewind::capture::qemu::Recorded::open(&dir).expect("recording directory");
    let main = rec.thread(None).expect("main thread recorded");
    assert!(main.trace.len() > 100, "{}", run.dump());
    assert_eq!(dir, exe.with_file_name("recording"));
}

/// A PIE, dynamically linked program live under QEMU, through many stops: breakpoints by name
/// at relocated addresses, real frames live (`bt`), and reverse-continue after each further
/// stop lands on the previous hit (the history is extended at every stop, its provisional end
/// rewritten, not rebuilt).
#[test]
fn pie_dynamic_program_many_stops_and_reverse() {
    if !have("qemu-x86_64") || !have("gdb") {
        eprintln!("skipped: qemu-x86_64 (package qemu-user) or gdb not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_source(
        "cc",
        dir.path(),
        "pie",
        PROGRAM,
        &["-g", "-O0", "-pie", "-fPIE"],
        &[],
    );
    let mut commands = cmds(&["break leaf", "continue", "bt", "echo @first\\n", "p/x $pc"]);
    for i in 0..5 {
        commands.extend(cmds(&["continue"]));
        commands.push(format!("echo @c{i}\\n"));
        commands.extend(cmds(&["p/x $pc"]));
    }
    commands.extend(cmds(&[
        "reverse-continue",
        "echo @rc1\\n",
        "p/x $pc",
        "reverse-continue",
        "echo @rc2\\n",
        "p/x $pc",
        "monitor stats",
        "delete",
        "continue",
        "continue",
        "continue",
    ]));
    let run = session(&exe, &[], &commands);
    let g = &run.gdb;
    // Live frames: leaf called from middle from main.
    let first = g.split_once("@first").map(|x| x.0).unwrap_or("");
    assert!(
        first.contains("in middle (x=5)") && first.contains("in main ("),
        "{}",
        run.dump()
    );
    let bp = run.hex_after("@first");
    let leaf_link = nm_symbol(&exe, "leaf");
    assert_ne!(bp & !0xfff, leaf_link & !0xfff, "relocated: {}", run.dump());
    for i in 0..5 {
        assert_eq!(run.hex_after(&format!("@c{i}")), bp, "{}", run.dump());
    }
    // 6 hits: leaf(0..4) of middle(5), leaf(0) of middle(3); back twice = the 4th hit.
    assert_eq!(run.hex_after("@rc1"), bp, "{}", run.dump());
    assert_eq!(run.hex_after("@rc2"), bp, "{}", run.dump());
    assert_eq!(g.matches("Breakpoint 1, leaf").count(), 8, "{}", run.dump());
    let stats = run.after("@rc2");
    assert!(
        stats.contains("index complete           yes"),
        "{}",
        run.dump()
    );
    assert!(
        stats.contains("decode errors            0"),
        "{}",
        run.dump()
    );
    assert!(
        stats.contains("provisional bytes (rewritten at the next stop)"),
        "{}",
        run.dump()
    );
    // Forward: replay to the live stop, then the program runs on to its end (r = 20 + 6),
    // where it stops (the default) before it exits.
    assert!(g.contains("the program is exiting"), "{}", run.dump());
    assert!(
        g.contains("No more reverse-execution history"),
        "{}",
        run.dump()
    );
    assert!(g.contains("exited with code 032"), "{}", run.dump());
}

/// The stop at the exit under QEMU (the default): the plugin holds the program at its `exit_group`, GDB sees a
/// trap at the SYSCALL in `_exit` with the call's registers and the program's memory, reverse
/// execution works from there, replay forward returns to the end, and a further continue ends
/// the program with its exit code.
#[test]
fn stop_at_exit_is_a_place_in_history() {
    let Some((_dir, exe)) = setup() else { return };
    let run = session_with(
        &exe,
        &[],
        &cmds(&[
            "continue",
            "echo @exit\\n",
            "x/i $pc",
            "p $rdi",
            "p $rax",
            "p sink",
            "info registers rbx",
            "break leaf",
            "reverse-continue",
            "echo @rc\\n",
            "p/x $pc",
            "continue",
            "echo @fwd\\n",
            "continue",
            "echo @end\\n",
        ]),
        None,
        &[],
    );
    let g = &run.gdb;
    let leaf = nm_symbol(&exe, "leaf");
    let at_exit = run.after("@exit");
    assert!(
        g.contains("Program received signal SIGTRAP"),
        "{}",
        run.dump()
    );
    assert!(g.contains("the program is exiting"), "{}", run.dump());
    // At the exit_group call: not executed yet, its number and argument (r = 26).
    assert!(at_exit.contains("syscall"), "{}", run.dump());
    assert!(at_exit.contains("$1 = 26"), "{}", run.dump());
    assert!(at_exit.contains("$2 = 231"), "{}", run.dump());
    // Memory of the held program: the last leaf(x) stored x = 2.
    assert!(at_exit.contains("$3 = 2"), "{}", run.dump());
    assert!(
        at_exit.contains("rbx            <unavailable>"),
        "{}",
        run.dump()
    );
    // Reverse from the end: the last call of leaf.
    let rc = run.hex_after("@rc");
    assert!(rc > leaf && rc < leaf + 16, "{}", run.dump());
    // Forward: the end of the history again, then the exit itself.
    assert!(
        run.after("@rc")
            .contains("No more reverse-execution history"),
        "{}",
        run.dump()
    );
    assert!(
        run.after("@fwd").contains("exited with code 032"),
        "{}",
        run.dump()
    );
    assert!(run.program_stdout.contains("r=20"), "{}", run.dump());
}

/// A fork under QEMU: the child runs on without the debugger (QEMU 7.2's gdbstub does not
/// follow forks) and the debugger is told so once, with where the child's trace is; the
/// parent's session goes on.
#[test]
fn a_fork_is_said_and_the_parent_goes_on() {
    const FORKS: &str = r#"
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
__attribute__((noinline)) int child_work(int x) { return x * 3; }
__attribute__((noinline)) int parent_work(int x) { return x + 1; }
int main(void) {
    pid_t p = fork();
    if (p == 0) { printf("child %d\n", child_work(2)); fflush(stdout); _exit(0); }
    int st;
    waitpid(p, &st, 0);
    printf("parent %d\n", parent_work(5));
    return 0;
}
"#;
    let Some((_dir, exe)) = live_program("forks", FORKS, &["-g", "-O0", "-no-pie"]) else {
        return;
    };
    let run = session(
        &exe,
        &[],
        &cmds(&[
            "break child_work",
            "break parent_work",
            "continue",
            "echo @parent\\n",
            "bt 1",
            "continue",
            "continue",
        ]),
    );
    let said = run.gdb.matches("the program forked child process").count();
    assert_eq!(said, 1, "{}", run.dump());
    assert!(
        run.gdb.contains("runs on without the debugger"),
        "{}",
        run.dump()
    );
    // The child's breakpoint is not the debugger's: the first stop is the parent's.
    assert!(
        run.after("@parent").contains("parent_work (x=5)"),
        "{}",
        run.dump()
    );
    assert!(run.program_stdout.contains("child 6"), "{}", run.dump());
    assert!(run.program_stdout.contains("parent 6"), "{}", run.dump());
}

/// `detach` at a breakpoint: QEMU's stub lets the program go (it wants `D;PID` once the
/// multiprocess extension is on) and the program runs to its end on its own.
#[test]
fn detach_lets_the_program_run_to_its_end() {
    let Some((_dir, exe)) = setup() else { return };
    let run = session(
        &exe,
        &[],
        &cmds(&["break middle", "continue", "detach", "echo @detached\\n"]),
    );
    assert!(run.gdb.contains(") detached]"), "{}", run.dump());
    assert!(!run.gdb.contains("Remote failure"), "{}", run.dump());
    assert!(run.program_stdout.contains("r=20"), "{}", run.dump());
}

/// `kill` while the program is held at its exit: QEMU is killed (no `k` is sent to the stub,
/// which cannot answer there), the server reports the kill and no QEMU process is left.
#[test]
fn kill_at_the_held_exit() {
    let Some((_dir, exe)) = setup() else { return };
    let run = session_with(&exe, &[], &cmds(&["continue", "kill"]), None, &[]);
    assert!(run.gdb.contains("the program is exiting"), "{}", run.dump());
    assert!(run.gdb.contains("killed"), "{}", run.dump());
    assert!(
        run.server.contains("killed by the debugger"),
        "{}",
        run.dump()
    );
    let exe = exe.to_string_lossy().into_owned();
    let left = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains("qemu-x86_64") && cmd.contains(&exe)
        });
    assert!(!left, "a QEMU process is left: {}", run.dump());
}

const BUSY: &str = r#"
volatile unsigned sink;
__attribute__((noinline)) void mark(int i) { sink += i; }
int main(void) {
    unsigned s = 1;
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 300000; i++) { s = s * 1103515245 + 12345; if (s & 0x10000) sink++; }
        mark(round);
    }
    return 0;
}
"#;

/// Stops far apart in a branchy program (hundreds of KB of trace between them): each stop reads
/// only the stream bytes written since the previous one (`monitor stats`: less than the whole
/// trace), the history stays complete and exact enough for reverse-continue to land on the
/// previous hit, with no decode error.
#[test]
fn stops_read_only_the_new_part_of_the_stream() {
    if !have("qemu-x86_64") || !have("gdb") {
        eprintln!("skipped: qemu-x86_64 (package qemu-user) or gdb not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_source(
        "cc",
        dir.path(),
        "busy",
        BUSY,
        &["-g", "-O1", "-no-pie"],
        &[],
    );
    let mark = nm_symbol(&exe, "mark");
    let run = session(
        &exe,
        &[],
        &cmds(&[
            "break mark",
            "continue",
            "continue",
            "continue",
            "echo @third\\n",
            "p/x $pc",
            "monitor stats",
            "reverse-continue",
            "echo @rc\\n",
            "p/x $pc",
            "monitor stats",
            "kill",
        ]),
    );
    let field = |text: &str, key: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {key:?}: {}", run.dump()))
    };
    let third = run.after("@third");
    let total = field(third, "trace bytes              ");
    let read = field(third, "trace read at last stop ");
    assert!(total > 100_000, "{}", run.dump());
    assert!(
        read > 0 && read < total,
        "read {read} of {total}: {}",
        run.dump()
    );
    assert!(
        third.contains("index complete           yes"),
        "{}",
        run.dump()
    );
    assert!(
        third.contains("decode errors            0"),
        "{}",
        run.dump()
    );
    let bp = run.hex_after("@third");
    assert!((mark..mark + 16).contains(&bp), "{}", run.dump());
    assert_eq!(run.hex_after("@rc"), bp, "{}", run.dump());
    assert!(
        run.after("@rc").contains("decode errors            0"),
        "{}",
        run.dump()
    );
}

/// Main and two workers: deterministic work under a mutex, then join. `crash`: worker 2
/// writes through a null pointer in `boom`. `deadlock`: main and worker 1 take two mutexes in
/// opposite orders and wait forever.
/// (The program of tests/ptrace_threads.rs, which also has a `churn N` mode.)
const MT_PROGRAM: &str = include_str!("../examples/c/mt_threads.c");

fn setup_mt() -> Option<(tempfile::TempDir, PathBuf)> {
    live_program("mt", MT_PROGRAM, &["-g", "-O0", "-pthread"])
}

/// Every thread live: a breakpoint reached in a worker is reported in that worker, `info
/// threads` lists them all with their own frames, another thread's registers and backtrace
/// are read, the worker's crash is reported in it; reverse-stepi from there moves the worker
/// back in its own history (its PC, not the main thread's), and the main thread, which has not
/// run since (it waits in its join), shows its present frame there.
#[test]
fn every_thread_live_breakpoint_and_crash_in_a_worker() {
    let Some((_dir, exe)) = setup_mt() else {
        return;
    };
    let run = session(
        &exe,
        &["crash"],
        &cmds(&[
            "break boom",
            "continue",
            "echo @boom\\n",
            "info threads",
            "thread 1",
            "bt 1",
            "delete",
            "continue",
            "echo @crashed\\n",
            "info threads",
            "bt 2",
            "printf \"PC %lx\\n\", $pc",
            "reverse-stepi",
            "echo @back\\n",
            "printf \"PC %lx\\n\", $pc",
            "info threads",
            "kill",
        ]),
    );
    let boom = run.after("@boom");
    assert!(
        run.gdb.contains("hit Breakpoint 1, boom ()"),
        "{}",
        run.dump()
    );
    // Main (waiting in the join) and the worker at the breakpoint, each with its own frame.
    assert!(
        boom.contains("* 2    Thread") || boom.contains("* 3    Thread"),
        "{}",
        run.dump()
    );
    assert!(boom.contains("boom () at"), "{}", run.dump());
    assert!(boom.contains("  1    Thread"), "{}", run.dump());
    assert!(boom.contains("[Switching to thread 1"), "{}", run.dump());
    let crashed = run.after("@crashed");
    assert!(
        run.gdb.contains("received signal SIGSEGV"),
        "{}",
        run.dump()
    );
    assert!(crashed.contains("#0  boom () at"), "{}", run.dump());
    assert!(crashed.contains("worker (arg=0x2)"), "{}", run.dump());
    // The worker's own past: one instruction back in `boom` (the store before it), in the
    // worker; the main thread beside it where it waits.
    let pcs: Vec<u64> = run
        .tagged("PC")
        .iter()
        .map(|v| u64::from_str_radix(v, 16).expect("hex pc"))
        .collect();
    assert_eq!(pcs.len(), 2, "{}", run.dump());
    let boom_at = nm_symbol(&exe, "boom");
    assert!(
        pcs[1] < pcs[0] && pcs[1] >= boom_at,
        "{pcs:x?} (boom at {boom_at:#x})\n{}",
        run.dump()
    );
    let back = run.after("@back");
    assert!(
        back.contains("* 2    Thread") || back.contains("* 3    Thread"),
        "{}",
        run.dump()
    );
    assert!(back.contains("boom () at"), "{}", run.dump());
    assert!(back.contains("  1    Thread"), "{}", run.dump());
    assert!(!back.contains("Could not read registers"), "{}", run.dump());
}

/// GDB's `record btrace pt` for a worker started after the session began, asked in the live
/// past: the thread's trace is found (it was "not being recorded": the threads of a live
/// past had lost their ids), and main's too after `thread 1`.
#[test]
fn btrace_of_a_later_thread_in_the_live_past() {
    let Some((_dir, exe)) = setup_mt() else {
        return;
    };
    let run = session(
        &exe,
        &[],
        &cmds(&[
            "break work",
            "continue",
            "continue",
            "reverse-stepi",
            "record btrace pt",
            "info record",
            "thread 1",
            "info record",
            "kill",
        ]),
    );
    assert!(!run.gdb.contains("not being recorded"), "{}", run.dump());
    let recorded: Vec<&str> = run
        .gdb
        .lines()
        .filter(|l| l.starts_with("Recorded ") && !l.starts_with("Recorded 0 "))
        .collect();
    assert_eq!(recorded.len(), 2, "{}", run.dump());
    assert!(recorded[1].contains("for thread 1 "), "{}", run.dump());
    assert!(!recorded[0].contains("for thread 1 "), "{}", run.dump());
}

/// `monitor save` in a live multi-thread session saves every thread (it used to save the main
/// thread's history alone, without a word), at the present and again from the past, and
/// `ptrewind replay DIR` serves them all: `break work` + reverse-continue stops in each of the
/// three threads, the workers' calls latest first, then main's, as in the live session.
#[test]
fn a_live_save_keeps_every_thread() {
    let Some((dir, exe)) = setup_mt() else {
        return;
    };
    let at_present = dir.path().join("saved-present");
    let from_past = dir.path().join("saved-past");
    let tid = "python print(\"TID\", gdb.selected_thread().ptid[1])";
    let live = session(
        &exe,
        &["crash"],
        &[
            "continue".to_string(),
            format!("monitor save {}", at_present.display()),
            "break work".into(),
            "reverse-continue".into(),
            tid.into(),
            "printf \"PC %lx\\n\", $pc".into(),
            format!("monitor save {}", from_past.display()),
            tid.into(),
            "printf \"PC %lx\\n\", $pc".into(),
            "kill".into(),
        ],
    );
    // (GDB prints monitor output on stderr, after the rest.)
    assert_eq!(
        live.gdb.matches("saved 3 threads to").count(),
        2,
        "{}",
        live.dump()
    );
    // Saving from the past leaves the session where it was: the thread stays selected, at
    // the call of `work`.
    let at = live.tagged("TID");
    assert_eq!(at.len(), 2, "{}", live.dump());
    assert_eq!(at[0], at[1], "{}", live.dump());
    let pcs = live.tagged("PC");
    assert!(pcs.len() == 2 && pcs[0] == pcs[1], "{}", live.dump());
    for saved in [&at_present, &from_past] {
        let run = gdb_session(
            Server::replay(saved),
            &exe,
            &cmds(&[
                "info threads",
                "break work",
                "reverse-continue",
                tid,
                "reverse-continue",
                tid,
                "reverse-continue",
                tid,
            ]),
            Duration::from_secs(120),
        );
        let tids: Vec<i64> = run
            .tagged("TID")
            .iter()
            .map(|t| t.parse().expect("a thread id"))
            .collect();
        assert_eq!(tids.len(), 3, "{}", run.dump());
        let main = i64::from(live.pid);
        assert!(
            tids[0] != main && tids[1] != main && tids[0] != tids[1],
            "{tids:?}\n{}",
            run.dump()
        );
        assert_eq!(tids[2], main, "{tids:?}\n{}", run.dump());
    }
    // `ptrewind view DIR` draws every saved thread as a track of its own.
    let out = dir.path().join("view");
    let view = std::process::Command::new(env!("CARGO_BIN_EXE_ptrewind"))
        .arg("view")
        .arg(&at_present)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run ptrewind view");
    let said = String::from_utf8_lossy(&view.stderr);
    assert!(view.status.success(), "{said}");
    let timeline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("timeline.json")).expect("timeline.json"))
            .expect("JSON");
    let events = timeline["traceEvents"]
        .as_array()
        .or(timeline.as_array())
        .expect("trace events");
    let tracks: std::collections::BTreeSet<i64> =
        events.iter().filter_map(|e| e["tid"].as_i64()).collect();
    assert_eq!(tracks.len(), 3, "{tracks:?}\n{said}");
}

/// Every thread's past in a live session: from a worker's crash, GDB's reverse-finish (the
/// ptrewind script's, PC-only) goes back to the call in that worker; `break work` +
/// reverse-continue stops at each thread's call of `work` latest first in global order (the
/// two workers', each in its thread, then main's, which ran before the workers were created);
/// forward again to the present; a breakpoint for thread 1 only skips the workers'
/// hits and stops in main; `monitor history` shows the selected thread's own branches.
#[test]
fn every_threads_past_in_a_live_session() {
    let Some((_dir, exe)) = setup_mt() else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gdb-scripts/ptrewind.py");
    let tid = "python print(\"TID\", gdb.selected_thread().ptid[1])";
    let mut commands = vec![format!("source {}", script.display())];
    commands.extend(cmds(&[
        "continue",
        tid,
        "reverse-finish",
        "echo @finish\\n",
        "x/i $pc",
        "monitor history 2",
        "echo @finish-end\\n",
        "break work",
        "reverse-continue",
        tid,
        "reverse-continue",
        tid,
        "reverse-continue",
        tid,
        "echo @main\\n",
        "info threads",
        "echo @main-end\\n",
        "reverse-continue",
        "echo @start\\n",
        "delete",
        "continue",
        "echo @present\\n",
        "info threads",
        "break work thread 1",
        "reverse-continue",
        tid,
        "echo @t1\\n",
        "info threads",
        "kill",
    ]));
    let run = session(&exe, &["crash"], &commands);
    let main = i64::from(run.pid);
    let tids: Vec<i64> = run
        .tagged("TID")
        .iter()
        .map(|t| t.parse().expect("a thread id"))
        .collect();
    assert_eq!(tids.len(), 5, "{}", run.dump());
    // The crash in a worker; the two workers' `work` calls come first going back (which of
    // them ran it later depends on how QEMU scheduled them), each in its own thread, then
    // main's, which ran before either worker existed.
    let crashed = tids[0];
    assert!(crashed != main, "{tids:?}\n{}", run.dump());
    assert!(
        tids[1] != tids[2] && tids[1] != main && tids[2] != main,
        "{tids:?}\n{}",
        run.dump()
    );
    assert!(
        tids[1] == crashed || tids[2] == crashed,
        "{tids:?}\n{}",
        run.dump()
    );
    assert_eq!(tids[3], main, "{tids:?}\n{}", run.dump());
    // reverse-finish in the crashed worker: at its call of boom.
    let finish = run.after("@finish");
    let finish = &finish[..finish.find("@finish-end").unwrap_or(finish.len())];
    assert!(
        finish.contains("call") && finish.contains("<boom>"),
        "{}",
        run.dump()
    );
    assert!(run.gdb.contains("in worker ("), "{}", run.dump());
    // `monitor history` (GDB prints it on stderr, after the rest): the worker's own branches,
    // back into `worker` (which main never runs).
    assert!(
        run.gdb
            .lines()
            .any(|l| l.trim_start().starts_with("-> ") && l.contains(" worker+")),
        "{}",
        run.dump()
    );
    // At main's call only main had started.
    let at_main = run.after("@main");
    let at_main = &at_main[..at_main.find("@main-end").unwrap_or(at_main.len())];
    assert!(at_main.contains("* 1    Thread"), "{}", run.dump());
    assert!(at_main.contains("work ("), "{}", run.dump());
    assert_eq!(at_main.matches("Thread ").count(), 1, "{}", run.dump());
    assert!(
        run.after("@start")
            .contains("No more reverse-execution history"),
        "{}",
        run.dump()
    );
    // Forward to the present: the crashed worker in boom again.
    assert!(
        run.after("@present").contains("boom () at"),
        "{}",
        run.dump()
    );
    // Thread 1's breakpoint: the workers' later hits are passed, main's stops.
    assert_eq!(tids[4], main, "{}", run.dump());
    assert!(run.after("@t1").contains("* 1    Thread"), "{}", run.dump());
    assert!(
        run.gdb.contains("Thread 1 hit Breakpoint 2, work ("),
        "{}",
        run.dump()
    );
}

/// A worker's past, then the program's end, in one session. `thread 1` at a worker's hit,
/// then `reverse-stepi`: main steps, as GDB selected it (GDB resumes "any thread" of the
/// process and names its choice with `Hg`; the worker stepped, first in the list). Back to
/// the present and on to the held exit: only main is listed there — the workers ended while
/// the program ran on, and the list of the last stop, where they lived, used to stay (GDB:
/// "Could not read registers; remote failure reply 'E05'" in `info threads`).
#[test]
fn the_selected_thread_steps_back_and_ended_workers_leave_the_list() {
    let Some((_dir, exe)) = setup_mt() else {
        return;
    };
    let tid = "python print(\"TID\", gdb.selected_thread().ptid[1])";
    let run = session(
        &exe,
        &[],
        &cmds(&[
            "break work",
            "continue",
            "continue",
            tid,
            "thread 1",
            "reverse-stepi",
            tid,
            "reverse-continue",
            "delete",
            "continue",
            "continue",
            "echo @end\\n",
            "info threads",
            "echo @end-end\\n",
            "kill",
        ]),
    );
    let main = i64::from(run.pid);
    let tids: Vec<i64> = run
        .tagged("TID")
        .iter()
        .map(|t| t.parse().expect("a thread id"))
        .collect();
    assert_eq!(tids.len(), 2, "{}", run.dump());
    assert_ne!(
        tids[0],
        main,
        "the second hit is a worker's\n{}",
        run.dump()
    );
    assert_eq!(tids[1], main, "{}", run.dump());
    assert!(run.gdb.contains("the program is exiting"), "{}", run.dump());
    let end = run.after("@end");
    let end = &end[..end.find("@end-end").unwrap_or(end.len())];
    assert!(!end.contains("Could not read registers"), "{}", run.dump());
    assert!(end.contains("* 1    Thread"), "{}", run.dump());
    assert_eq!(end.matches("Thread ").count(), 1, "{}", run.dump());
}

/// Two threads reaching one breakpoint again and again: every `continue` GDB makes is a step
/// over the breakpoint (its breakpoints out of QEMU, the other threads held) and a continue.
/// The breakpoint (`break hit`, after the prologue) lies inside the block that starts the
/// function. The held threads used to be let go for a millisecond every 6 ms of the step, and
/// passed the breakpoint unseen many times (10–14 of the 20 hits reported in most runs); then
/// each ran only the block it waited at, and still passed it now and then (5 of 400 hits in 20
/// runs): a block translated while GDB had the breakpoint out of QEMU has no check of it. Now
/// the plugin keeps the lifted breakpoints listed until the program runs on, holds a thread
/// right before one inside such a block (and at a block that starts at one) through the
/// step's pulses, and ptrewind reports the hit there: every hit is seen (measured: 20 of 20
/// hits in each of 90 sessions, 80 of them beside one or two busy loops on the 2 cores; a hit
/// was reported from the gate in about half of them, then stepped over from there). Two
/// sessions with GDB's defaults, and one with its breakpoints kept inserted at stops, as
/// `gdb-scripts/ptrewind.py` sets it (only the stepped-over breakpoint is lifted then).
#[test]
fn breakpoints_reached_by_two_threads_are_not_passed_during_step_overs() {
    let Some((dir, built)) = setup_mt() else {
        return;
    };
    for k in 0..3 {
        let mut commands = Vec::new();
        if k == 2 {
            commands.push("set breakpoint always-inserted on".to_string());
        }
        commands.push("break hit".to_string());
        commands.extend(std::iter::repeat_n("continue".to_string(), 21));
        // Each session records beside its own copy of the program.
        let exe = dir.path().join(format!("session{k}")).join("mt");
        std::fs::create_dir(exe.parent().unwrap()).unwrap();
        std::fs::copy(&built, &exe).unwrap();
        let run = session_with(&exe, &["hits"], &commands, None, &["--no-stop-at-exit"]);
        let hits = run.gdb.matches("hit Breakpoint 1, hit (").count();
        assert_eq!(hits, 20, "{}", run.dump());
        assert!(run.gdb.contains("exited normally"), "{}", run.dump());
        assert!(!run.server.contains("did not answer"), "{}", run.dump());
    }
}

/// A program killed from outside with SIGKILL under QEMU (no stop can hold it: QEMU itself
/// dies): the debugger sees the signal as a stop at the end of the recorded history and the
/// session goes on over a replay of the recording (reverse execution from there), which is
/// kept — in a temporary directory the end of the session used to remove — and serves the
/// history again with `ptrewind replay --qemu`.
#[test]
fn a_program_killed_from_outside_keeps_its_recording() {
    let source = std::fs::read_to_string(example_source("range_step.c")).unwrap();
    let Some((dir, exe)) = live_program("range_step", &source, &["-g", "-O0"]) else {
        return;
    };
    let spin = line_of("range_step.c", "@spin");
    let marker = dir.path().join("in-the-spin");
    // No --trace-dir: a temporary recording directory.
    let server = Server::start_cli(&[
        "record".into(),
        "--backend".into(),
        "qemu".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--qemu-plugin".into(),
        support::qemu::plugin().into(),
        "--".into(),
        exe.clone().into(),
        "spin".into(),
    ]);
    let pid = server.pid;
    let commands = cmds(&[
        &format!("break {spin}"),
        "continue",
        "delete",
        &format!("shell touch {}", marker.display()),
        "continue",
        "echo @killed\\n",
        "info line *$pc",
        "reverse-stepi",
        "echo @back\\n",
        "info line *$pc",
        "info threads",
        "kill",
    ]);
    // SIGKILL once GDB has been in the last continue for a second (never an interrupt).
    let mut in_continue = marker_older_than(marker, Duration::from_secs(1));
    let mut killed = false;
    let ready = move || {
        if !killed && in_continue() {
            // SAFETY: kill(2) on the recorded process's pid; no memory is shared.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed = true;
        }
        false
    };
    let run = gdb_session_interrupting(server, &exe, &commands, Duration::from_secs(120), ready);
    assert!(
        run.gdb.contains("Program received signal SIGKILL"),
        "{}",
        run.dump()
    );
    for mark in ["@killed", "@back"] {
        assert!(
            run.after(mark).contains(&format!("Line {spin} of")),
            "{mark}: {}",
            run.dump()
        );
    }
    assert!(
        run.gdb.contains("the session goes on over a replay"),
        "{}",
        run.dump()
    );
    let kept = run
        .gdb
        .lines()
        .find_map(|l| {
            l.split_once("recording up to there, in ")?
                .1
                .split_whitespace()
                .next()
        })
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no directory said: {}", run.dump()));
    assert!(run.gdb.contains("(kept, not removed"), "{}", run.dump());
    assert!(
        kept.is_dir(),
        "{} was removed: {}",
        kept.display(),
        run.dump()
    );
    let replay = Server::start_cli(&[
        "replay".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--qemu".into(),
        kept.clone().into(),
    ]);
    let again = gdb_session(
        replay,
        &exe,
        &cmds(&["echo @end\\n", "info line *$pc"]),
        Duration::from_secs(120),
    );
    let _ = std::fs::remove_dir_all(&kept);
    assert!(
        again.after("@end").contains(&format!("Line {spin} of")),
        "{}",
        again.dump()
    );
}

/// `finish` and `next` in one thread while another keeps calling the function with the
/// breakpoint: every step is answered, the other thread's hits interrupt a `next` as GDB
/// expects, and the program runs to its end. Before the breakpoints were taken out of QEMU
/// during steps, a held thread let run one block for QEMU's work at a step could enter the
/// gdbstub beside the stepped thread: GDB failed its `finish_step_over` assertion or the stub
/// stopped answering (4 of 9 sessions on this machine).
#[test]
fn next_in_one_thread_while_another_hits_the_breakpoint() {
    let Some((dir, built)) = setup_mt() else {
        return;
    };
    let mut commands = vec![
        "break hit".to_string(),
        "continue".to_string(),
        "finish".to_string(),
        "echo @next\\n".to_string(),
    ];
    commands.extend(std::iter::repeat_n("next".to_string(), 8));
    commands.extend(["delete".to_string(), "continue".to_string()]);
    let mut whole = 0;
    // Three sessions: the other thread's hit interrupts a `next` in about one in three.
    for k in 0..3 {
        let exe = dir.path().join(format!("session{k}")).join("mt");
        std::fs::create_dir(exe.parent().unwrap()).unwrap();
        std::fs::copy(&built, &exe).unwrap();
        let run = session_with(&exe, &["hits"], &commands, None, &["--no-stop-at-exit"]);
        // The failures this fixed: GDB's assertion, the stub that stopped answering.
        assert!(!run.gdb.contains("internal-error"), "{}", run.dump());
        assert!(!run.server.contains("did not answer"), "{}", run.dump());
        if run
            .server
            .contains("are inside QEMU 7.2's user-mode gdbstub at the same time")
        {
            // A race that remains (docs/qemu-gdbstub.md, "limits of that"), 2 sessions in
            // about 60 here: two threads stopped together, detected and said, the session
            // ended cleanly with its recording kept.
            continue;
        }
        assert!(
            !run.gdb.contains("Remote connection closed"),
            "{}",
            run.dump()
        );
        // Each `next` shows where it stopped: a line of the stepped thread, or the other
        // thread's hit and its line.
        let lines = run
            .after("@next")
            .lines()
            .filter(|l| {
                l.split_once('\t')
                    .is_some_and(|(n, _)| n.trim().parse::<u32>().is_ok())
            })
            .count();
        assert!(lines >= 8, "{lines} lines: {}", run.dump());
        assert!(run.gdb.contains("exited normally"), "{}", run.dump());
        whole += 1;
    }
    assert!(whole >= 1, "neither session ran to its end");
}

/// Ctrl-C interrupts a deadlocked multi-thread program under QEMU: SIGINT is reported, every
/// thread is listed where it waits, and the program can be killed.
#[test]
fn a_deadlock_is_interrupted_with_ctrl_c() {
    let Some((_dir, exe)) = setup_mt() else {
        return;
    };
    // Interrupted a second after the third thread's stream appears (the deadlock is reached
    // within milliseconds of guest time).
    let server = start_server(&exe, &["deadlock"], &[]);
    let dir = exe.with_file_name("recording");
    let mut seen: Option<std::time::Instant> = None;
    let ready = move || {
        let streams = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".pt"))
                    .count()
            })
            .unwrap_or(0);
        if streams >= 3 && seen.is_none() {
            seen = Some(std::time::Instant::now());
        }
        seen.is_some_and(|t| t.elapsed() > Duration::from_secs(1))
    };
    let run = gdb_session_interrupting(
        server,
        &exe,
        &cmds(&[
            "continue",
            "echo @int\\n",
            "info threads",
            "thread apply all bt 8",
            "kill",
        ]),
        Duration::from_secs(120),
        ready,
    );
    assert!(run.gdb.contains("received signal SIGINT"), "{}", run.dump());
    let int = run.after("@int");
    assert!(int.contains("3    Thread"), "{}", run.dump());
    assert!(int.contains("worker (arg=0x1)"), "{}", run.dump());
    assert!(int.contains(" in main ("), "{}", run.dump());
}

/// Without Intel PT, `record` with no `--backend` (auto) debugs the program under QEMU, says
/// so and why in one line (naming `--backend ptrace` for an exact past), and the session works
/// end to end: a breakpoint, reverse-stepi into the PC-only past, the stop at the exit.
#[test]
fn auto_records_under_qemu_without_intel_pt() {
    let Some((_dir, exe)) = setup() else { return };
    if ptrewind::capture::perf::probe().is_ok() {
        eprintln!("skipped: Intel PT is available, auto picks it");
        return;
    }
    // (Only the recording directory is chosen: inside the test's temporary directory.)
    let server = Server::start_cli(&[
        "record".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--trace-dir".into(),
        exe.with_file_name("recording").into(),
        "--".into(),
        exe.clone().into(),
    ]);
    let run = gdb_session(
        server,
        &exe,
        &cmds(&[
            "break leaf",
            "continue",
            "echo @hit\\n",
            "p x",
            "reverse-stepi",
            "echo @back\\n",
            "info registers rax",
            "monitor stats",
            "delete",
            "continue",
            "continue",
            "continue",
        ]),
        Duration::from_secs(120),
    );
    assert!(
        run.server.contains("Intel PT is not available")
            && run.server.contains("recording under QEMU")
            && run
                .server
                .contains("--backend ptrace gives exact registers"),
        "{}",
        run.dump()
    );
    assert!(run.after("@hit").contains("$1 = 0"), "{}", run.dump());
    let back = run.after("@back");
    assert!(
        back.contains("rax            <unavailable>"),
        "{}",
        run.dump()
    );
    assert!(
        back.contains("backend                  qemu"),
        "{}",
        run.dump()
    );
    assert!(run.gdb.contains("exited with code 032"), "{}", run.dump());
}

/// `auto` keeps the ptrace backend when an option only it has is given, and says why.
#[test]
fn auto_keeps_ptrace_for_its_own_options() {
    let Some((_dir, exe)) = setup() else { return };
    if ptrewind::capture::perf::probe().is_ok() {
        return;
    }
    let mut server = Server::start_cli(&[
        "record".into(),
        "--state-log".into(),
        "off".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--".into(),
        exe.into(),
    ]);
    let _ = server.child.kill();
    let _ = server.child.wait();
    let text = server.stderr.join().unwrap();
    assert!(
        text.contains("an option of the ptrace backend was given")
            && text.contains("recording with the software backend"),
        "{text}"
    );
}

/// GDB's own `record btrace pt` in a live QEMU session: the plugin's PSBs are far apart, so
/// the view starts at the last PSB before the point tracing was started; GDB's libipt decodes
/// it without gaps, and `monitor history` shows the branches before the stop.
#[test]
fn live_btrace_and_monitor_history() {
    let Some((_dir, exe)) = setup() else { return };
    let run = session(
        &exe,
        &[],
        &cmds(&[
            "break leaf",
            "continue",
            "record btrace pt",
            "continue",
            "echo @hist\\n",
            "monitor history 4",
            "echo @btrace\\n",
            "info record",
            "record function-call-history",
            "kill",
        ]),
    );
    assert!(run.after("@hist").contains("-> "), "{}", run.dump());
    assert!(run.after("@hist").contains("leaf"), "{}", run.dump());
    let b = run.after("@btrace");
    let n: u64 = b
        .split("Recorded ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no instruction count: {}", run.dump()));
    assert!(n > 0, "{}", run.dump());
    assert!(b.contains("(0 gaps)"), "{}", run.dump());
    assert!(b.contains("leaf"), "{}", run.dump());
}

/// GDB's `record btrace pt` in a live session, turned on at a worker's breakpoint: every
/// thread's own trace (the worker's, then main's after `thread 1`), not only the threads that
/// existed when the session started (the worker's used to be refused: "thread N is not being
/// recorded").
#[test]
fn live_btrace_of_every_thread() {
    let Some((_dir, exe)) = setup_mt() else {
        return;
    };
    let run = session(
        &exe,
        &["crash"],
        &cmds(&[
            "break boom",
            "continue",
            "record btrace pt",
            // The last `Hg` names main, whose registers GDB reads here.
            "delete",
            "thread 1",
            "p $pc",
            "continue",
            "python print(\"TID\", gdb.selected_thread().ptid[1])",
            "echo @worker\\n",
            "info record",
            "record function-call-history",
            "echo @worker-end\\n",
            "thread 1",
            "echo @main\\n",
            "info record",
            "kill",
        ]),
    );
    assert!(!run.gdb.contains("Could not enable"), "{}", run.dump());
    let recorded = |mark: &str| -> (u64, String) {
        let text = run.after(mark);
        let line = text
            .lines()
            .find(|l| l.starts_with("Recorded "))
            .unwrap_or_else(|| panic!("no Recorded line after {mark}\n{}", run.dump()));
        let n = line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        (n, line.to_string())
    };
    let pid = run.pid;
    let (worker_n, worker) = recorded("@worker");
    let (main_n, main) = recorded("@main");
    assert!(worker_n > 0 && main_n > 0, "{}", run.dump());
    assert!(
        worker.contains("(0 gaps)") && main.contains("(0 gaps)"),
        "{}",
        run.dump()
    );
    assert!(
        main.contains(&format!("(Thread {pid}.{pid})")),
        "{}",
        run.dump()
    );
    // The crashed worker's own trace: GDB reads it right after the stop that reported that
    // thread, without an `Hg` (it takes the stop's thread for the general one, as gdbserver
    // makes it), and the server used to answer for the thread of the last `Hg`: the other
    // worker's trace, or "No such thread" once that one had ended.
    // (GDB labels the data with the thread it asked for, whichever thread's it is: the
    // worker's trace is the one that ends in `boom`.)
    let crashed = run.tagged("TID");
    assert_eq!(crashed.len(), 1, "{}", run.dump());
    assert!(
        worker.contains(&format!("(Thread {pid}.{})", crashed[0])),
        "{}",
        run.dump()
    );
    let history = run.after("@worker");
    let history = &history[..history.find("@worker-end").unwrap_or(history.len())];
    let last = history
        .lines()
        .rfind(|l| l.trim().starts_with(char::is_numeric));
    assert!(
        last.is_some_and(|l| l.trim_end().ends_with("\tboom") || l.trim_end().ends_with(" boom")),
        "{}",
        run.dump()
    );
}

/// LLDB live under QEMU sees the program, not QEMU: lldb-19 names the main executable after
/// the host's `/proc/PID/exe` of the process id the stub gives (QEMU's), and used to load
/// `qemu-x86_64` in the program's place (`b main` resolved in QEMU's own symbols, frames named
/// `qemu-x86_64`); QEMU now runs from an unlinked copy, so LLDB keeps the program it was
/// given. Breakpoints by name in the program and in a worker thread, backtraces with the
/// program's symbols and source, every thread listed.
#[test]
fn lldb_sees_the_program_not_qemu() {
    let Some((_dir, exe)) = setup_mt() else {
        return;
    };
    if !have("lldb-19") {
        eprintln!("SKIPPED: lldb-19 not installed");
        return;
    }
    let mut server = start_server(&exe, &["crash"], &[]);
    let mut lldb = std::process::Command::new("lldb-19");
    lldb.args(["--batch", "--no-lldbinit"])
        .arg("-o")
        .arg(format!("target create {}", exe.display()))
        .arg("-o")
        .arg(format!("gdb-remote 127.0.0.1:{}", server.port));
    for c in [
        "image list",
        "breakpoint set -n main",
        "breakpoint set -n boom",
        "process continue",
        "bt",
        "process continue",
        "bt",
        "thread list",
        "process kill",
    ] {
        lldb.arg("-o").arg(c);
    }
    let out = run_until(&mut lldb, Duration::from_secs(120));
    let _ = wait_until(
        &mut server.child,
        std::time::Instant::now() + Duration::from_secs(30),
    );
    let text = format!(
        "{}{}\n--- server\n{}",
        out.stdout,
        out.stderr,
        server.stderr.join().unwrap_or_default()
    );
    let images = text.split("(lldb) image list").nth(1).unwrap_or("");
    let first = images.lines().find(|l| l.contains("[  0]")).unwrap_or("");
    assert!(
        first.trim_end().ends_with(&format!("{}", exe.display())),
        "{first}\n{text}"
    );
    assert!(!text.contains("qemu-x86_64`"), "{text}");
    assert!(text.contains("Breakpoint 1: where = mt`main"), "{text}");
    assert!(text.contains("Breakpoint 2: where = mt`boom"), "{text}");
    assert!(text.contains("mt`main(argc=2"), "{text}");
    // The worker's breakpoint, in the worker, with its caller.
    assert!(text.contains("stop reason = breakpoint 2.1"), "{text}");
    assert!(text.contains("mt`worker(arg=0x0000000000000002)"), "{text}");
    assert!(text.contains("at mt.c:"), "{text}");
}

/// `uselib` and its `libshared.so` (examples/c), built in `dir`: the library is mapped by the
/// dynamic loader after the program's first instruction.
fn build_uselib(dir: &Path) -> PathBuf {
    use support::cbuild::{cc, example_source};
    let lib = dir.join("libshared.so");
    cc([
        "-g".as_ref(),
        "-O0".as_ref(),
        "-fPIC".as_ref(),
        "-shared".as_ref(),
        "-o".as_ref(),
        lib.as_os_str(),
        example_source("libshared.c").as_os_str(),
    ]);
    let exe = dir.join("uselib");
    cc([
        "-g".as_ref(),
        "-O0".as_ref(),
        "-o".as_ref(),
        exe.as_os_str(),
        example_source("uselib.c").as_os_str(),
        "-L".as_ref(),
        dir.as_os_str(),
        "-lshared".as_ref(),
        "-Wl,-rpath,$ORIGIN".as_ref(),
    ]);
    exe
}

#[test]
fn library_symbols_and_maps_are_the_guests() {
    // The server's own symbols (`monitor where`, `monitor history`, the PC-only reverse-next)
    // were read once, at the first query: a library the loader mapped afterwards had none.
    // And `monitor maps` showed QEMU's own mappings rather than the program's.
    if !have("qemu-x86_64") || !have("gdb") {
        eprintln!("skipped: qemu-x86_64 (package qemu-user) or gdb not installed");
        return;
    }
    use support::cbuild::line_of;
    let dir = tempfile::tempdir().unwrap();
    let exe = build_uselib(dir.path());
    let shared_line = line_of("libshared.c", "/* SHARED LINE */");
    let call_line = line_of("uselib.c", "int v = shared_scale(20);");
    let entry_line = line_of("libshared.c", "int shared_scale(int x) {");
    let r = session(
        &exe,
        &[],
        &cmds(&[
            "monitor where",
            "monitor maps",
            "break shared_scale",
            "continue",
            "monitor where",
            "monitor maps",
            "reverse-stepi",
            "monitor where",
            "monitor reverse-finish",
            "monitor where",
            "kill",
        ]),
    );
    // GDB writes monitor output to stderr: the `monitor where` lines in order.
    let wheres: Vec<&str> = r
        .gdb
        .lines()
        .filter(|l| l.starts_with("at the present") || l.starts_with("replaying:"))
        .collect();
    // (`monitor reverse-finish` says where it went, as `monitor where` does after it.)
    assert_eq!(wheres.len(), 5, "{}", r.dump());
    // At the first instruction only the program and the loader are mapped, and the plugin has
    // written nothing yet: the server places them from the auxiliary vector and names the
    // loader's entry as GDB does (`_start`, a label in ld.so's separate debug file; when GDB
    // cannot name it, neither can the server).
    assert!(wheres[0].contains("instruction 0 "), "{}", r.dump());
    let gdbs = r
        .gdb
        .lines()
        .find_map(|l| l.split_once(" in ")?.1.split_once(" () from ").map(|n| n.0))
        .unwrap_or("??");
    assert!(
        wheres[0].ends_with(&format!(" in {gdbs}")),
        "GDB says {gdbs}\n{}",
        r.dump()
    );
    assert!(
        wheres[1].contains("in shared_scale+")
            && wheres[1].ends_with(&format!("at libshared.c:{shared_line}")),
        "{}",
        r.dump()
    );
    assert!(
        wheres[2].contains("in shared_scale+")
            && wheres[2].ends_with(&format!("at libshared.c:{entry_line}")),
        "{}",
        r.dump()
    );
    for w in &wheres[3..] {
        assert!(
            w.contains("in main+") && w.ends_with(&format!("at uselib.c:{call_line}")),
            "{}",
            r.dump()
        );
    }
    let maps: Vec<&str> = r.gdb.lines().filter(|l| l.contains(" r-xp ")).collect();
    assert!(
        maps.iter().any(|l| l.ends_with("/libshared.so")),
        "{}",
        r.dump()
    );
    assert!(
        maps.iter().any(|l| l.ends_with(&*exe.to_string_lossy())),
        "{}",
        r.dump()
    );
    // One copy of each file at each offset: QEMU's own dynamic loader (the same file as the
    // guest's, at a host address) is not the program's.
    let mut placed: Vec<(&str, &str)> = maps
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((*f.get(2)?, *f.last()?))
        })
        .collect();
    let all = placed.len();
    placed.sort_unstable();
    placed.dedup();
    assert_eq!(placed.len(), all, "{}", r.dump());
    // QEMU's own files (the plugin, its gate files) are not the program's.
    assert!(
        !r.gdb.contains("ptrewind_qemu_plugin") && !r.gdb.contains("/recording/"),
        "{}",
        r.dump()
    );
}

/// Under QEMU too, `next` over a one-line loop is one range step (GDB's `vCont;r`): one stop
/// at the next line instead of one per instruction (the backend's steps, not the debugger's,
/// with no stream read in between); a breakpoint in the middle of the line ends it there; and
/// Ctrl-C ends one that never ends, on its line, with the past readable.
#[test]
fn next_over_a_one_line_loop_is_one_range_step() {
    let source = std::fs::read_to_string(example_source("range_step.c")).unwrap();
    let Some((dir, exe)) = live_program("range_step", &source, &["-g", "-O0"]) else {
        return;
    };
    let line = |m: &str| line_of("range_step.c", m);
    let (lp, after, mid, spin) = (
        line("@loop"),
        line("@after */"),
        line("@mid"),
        line("@spin"),
    );
    let marker = dir.path().join("in-the-spin");
    let touched = format!("shell touch {}", marker.display());
    let commands = cmds(&[
        &format!("break {lp}"),
        "continue",
        "echo @next\\n",
        "next",
        "break *mid_line",
        "next",
        "next",
        // Back over the range-stepped lines: each reverse step lands on a position no stop
        // showed, where GDB's frame checks need the stack pointer (kept at each step).
        "echo @rnext\\n",
        "reverse-next",
        "reverse-next",
        "reverse-next",
        "delete",
        &format!("break {spin}"),
        // To the end of the history, then on at the present.
        "continue",
        "continue",
        "delete",
        &touched,
        "next",
        "echo @int\\n",
        "info line *$pc",
        "reverse-stepi",
        "echo @back\\n",
        "info line *$pc",
        "monitor stats",
        "kill",
    ]);
    // Ctrl-C once GDB has been in the spin line's `next` for a second.
    let ready = marker_older_than(marker, Duration::from_secs(1));
    let run = {
        let _one = ONE_SESSION.lock().unwrap_or_else(|e| e.into_inner());
        let server = start_server(&exe, &["spin"], &[]);
        gdb_session_interrupting(server, &exe, &commands, Duration::from_secs(120), ready)
    };
    let shown: Vec<usize> = {
        let i = run.gdb.find("@next").expect("no @next");
        run.gdb[i..]
            .lines()
            .filter_map(|l| l.split_once('\t')?.0.trim().parse().ok())
            .take(3)
            .collect()
    };
    assert_eq!(shown, [after, mid, mid], "{}", run.dump());
    let back: Vec<usize> = {
        let i = run.gdb.find("@rnext").expect("no @rnext");
        run.gdb[i..]
            .lines()
            .filter_map(|l| l.split_once('\t')?.0.trim().parse().ok())
            .take(3)
            .collect()
    };
    // From mid_line to its line's start, then line by line: not back to the loop's
    // breakpoint as if every reverse step had left the frame.
    assert_eq!(back, [mid, after, lp], "{}", run.dump());
    assert!(run.gdb.contains("Breakpoint 2, 0x"), "{}", run.dump());
    assert!(
        run.gdb.contains("Program received signal SIGINT"),
        "{}",
        run.dump()
    );
    for mark in ["@int", "@back"] {
        let i = run.gdb.find(mark).expect("mark");
        assert!(
            run.gdb[i..].contains(&format!("Line {spin} of")),
            "{mark}: {}",
            run.dump()
        );
    }
    // Range steps: a few, over the loop's thousands of instructions and the spin's.
    let stats = range_steps(&run.gdb);
    assert!(
        stats.len() == 1 && (2..=8).contains(&stats[0].0) && stats[0].1 > 5000,
        "{stats:?}: {}",
        run.dump()
    );
}
