//! fork and exec while the ptrace backend records, through real GDB (issue 12 §5): the default
//! GDB behaviour (`follow-fork-mode parent`, `detach-on-fork on`) — the parent is recorded, the
//! child runs free to its normal end with its output, never stopped by a breakpoint it inherited
//! — and an exec, after which the new program is recorded and runs to its own exit status.
//! Expected values come from the C sources (`examples/c/forkexec.c`, `newimage.c`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

mod support;

use support::cbuild::{build_example, have, line_of};
use support::gdb::{GdbRun, Server, gdb_session, run_until, wait_until};

const TIMEOUT: Duration = Duration::from_secs(60);

fn examples() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fork-exec-examples");
        std::fs::create_dir_all(&dir).expect("examples dir");
        build_example(&dir, "forkexec", &[]);
        build_example(&dir, "newimage", &[]);
        build_example(&dir, "mt_fork", &["-pthread"]);
        build_example(&dir, "thread_exec", &["-pthread"]);
        build_example(&dir, "vforkexec", &[]);
        build_example(&dir, "spawn", &[]);
        build_example(&dir, "fork_nowait", &[]);
        dir
    })
}

/// `ptrewind record -- NAME [newimage]` (a program of examples/c, given the path of
/// `newimage` to exec when `exec_arg`) with `commands` in GDB.
fn example_session(name: &str, exec_arg: bool, commands: &[&str]) -> GdbRun {
    let program = examples().join(name);
    let newimage = examples().join("newimage");
    let newimage = newimage.to_str().expect("utf-8 path");
    let args: &[&str] = if exec_arg { &[newimage] } else { &[] };
    let server = Server::start(&program, args);
    gdb_session(server, &program, commands, TIMEOUT)
}

/// Asserts that the program printed each of `lines`.
fn expect_program_output(r: &GdbRun, lines: &[&str]) {
    for line in lines {
        assert!(
            r.program_stdout.contains(line),
            "missing {line:?} in the program's output {:?}\n{}",
            r.program_stdout,
            r.dump()
        );
    }
}

/// `ptrewind record -- forkexec newimage` with `commands` in GDB.
fn session(commands: &[&str]) -> GdbRun {
    example_session("forkexec", true, commands)
}

/// What `forkexec` prints when child, parent and the exec'd program all ran to their end.
const FORKEXEC_OUTPUT: &[&str] = &[
    "child computed 15",
    "parent saw 6 -> 18",
    "new image from-exec 42",
];

/// What every run shows: the child ran its own calls of `shared_work` (5 → 15, exit status
/// 2 * 3 = 6) without being stopped, the parent saw that status, and the exec'd program ran to
/// its end (argc 2 → 42, exit status 5) — so it was recorded through to its end without the
/// exec being mistaken for a signal. (The SIGTRAP GDB shows before that is the stop at the
/// program's end, the default.)
fn check_program_ran_fully(r: &GdbRun) {
    expect_program_output(r, FORKEXEC_OUTPUT);
    // A child killed by an inherited INT3 would have exit status 0 for the parent, which
    // would then print "parent saw 0 -> 0".
    r.expect("exited with code 05");
}

/// Recording (the state log on: every instruction single-stepped) with a breakpoint in the
/// function parent and child both call: only the parent's call stops (x = 6, after the child
/// ended); the child, detached, runs free.
#[test]
fn forked_child_runs_free_past_a_breakpoint_it_shares_and_exec_is_recorded() {
    let shared = line_of("forkexec.c", "/* SHARED LINE */");
    let r = session(&[
        "break shared_work",
        "continue",
        "print x",
        "delete",
        "continue",
        "monitor stats",
        "continue",
    ]);
    r.expect(&format!("forkexec.c:{shared}"));
    r.expect("$1 = 6");
    // GDB was told of the fork (fork-events) and detached the child itself.
    r.expect("[Detaching after fork from child process");
    // GDB was told of the exec (exec-events) and loaded the new program.
    r.expect("is executing new program: ");
    // The stop at the end is the new program's exit: recorded through the exec, nothing lost.
    r.expect("the program is exiting");
    r.expect("recorder anomalies       0");
    r.expect("lost bytes               0");
    check_program_ran_fully(&r);
}

/// The child process's pid in GDB's "[Detaching after fork from child process N]" or
/// "[Attaching after … fork to child … N.N]" line.
fn gdb_child_pid(r: &GdbRun, after: &str) -> i32 {
    let rest = &r.gdb[r.pos(after) + after.len()..];
    let digits: String = rest
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no pid after {after:?}\n{}", r.dump()))
}

/// `catch fork` stops at the fork (GDB names the child), and with GDB's defaults the parent
/// goes on being recorded: its own call stops, the child — detached by GDB's `D;PID` — runs
/// free with its output, and the exec'd program runs to its end.
#[test]
fn catch_fork_stops_and_gdb_detaches_the_child() {
    let r = session(&[
        "catch fork",
        "break shared_work",
        "continue",
        "echo AT-CATCH\n",
        "info inferiors",
        "continue",
        "print x",
        "delete",
        "continue",
        "continue",
    ]);
    r.expect("Catchpoint 1 (forked process ");
    let caught = gdb_child_pid(&r, "Catchpoint 1 (forked process ");
    let detached = gdb_child_pid(&r, "[Detaching after fork from child process ");
    assert_eq!(caught, detached, "{}", r.dump());
    assert_ne!(caught, r.pid, "{}", r.dump());
    // Stopped at the fork: one inferior (the child is not GDB's yet), the parent's call next.
    assert!(r.after("AT-CATCH").contains("$1 = 6"), "{}", r.dump());
    check_program_ran_fully(&r);
}

/// GDB's `set follow-fork-mode child` (with `detach-on-fork on`) reaches the server through
/// the fork event: GDB detaches the parent (`D;PID`), which runs free to its exec; the child
/// is recorded from the fork on, its calls (5, then 2) stop, reverse-continue finds them again
/// (2, then 5) in the child's history, which decodes exactly and goes on back into the
/// parent's past before the fork (to `main`, where recording started); the server's last line
/// names the child.
#[test]
fn gdb_follow_fork_mode_child_records_the_child() {
    let r = session(&[
        "set follow-fork-mode child",
        "break shared_work",
        "continue",
        "print x",
        "continue",
        "print x",
        "delete",
        "continue",
        "echo AT-END\n",
        "break shared_work",
        "reverse-continue",
        "print x",
        "reverse-continue",
        "print x",
        "monitor stats",
        "delete",
        "reverse-continue",
        "echo AT-START\n",
        "info symbol $pc",
        "continue",
        "continue",
    ]);
    r.expect("[Attaching after ");
    r.expect("[Detaching after fork from parent process ");
    let child = gdb_child_pid(&r, "fork to child ");
    assert_ne!(child, r.pid, "{}", r.dump());
    let before_end = &r.gdb[..r.pos("AT-END")];
    let (a, b) = (before_end.find("$1 = 5"), before_end.find("$2 = 2"));
    assert!(
        a.is_some() && b.is_some() && a < b,
        "the child's calls 5 then 2 not seen\n{}",
        r.dump()
    );
    let after_end = r.after("AT-END");
    let (a, b) = (after_end.find("$3 = 2"), after_end.find("$4 = 5"));
    assert!(
        a.is_some() && b.is_some() && a < b,
        "reverse-continue did not find the child's calls 2 then 5\n{}",
        r.dump()
    );
    r.expect("execs / forks followed   0 / 1");
    r.expect("decode errors            0");
    r.expect("history check            ok");
    // The parent's past before the fork stays reachable in the child's history: back to
    // where recording started, in `main`.
    assert!(
        r.after("AT-START").contains("main in section .text"),
        "{}",
        r.dump()
    );
    r.expect(&format!(
        "[Inferior 2 (process {child}) exited with code 06]"
    ));
    expect_program_output(&r, FORKEXEC_OUTPUT);
    assert!(
        r.server
            .contains(&format!("ptrewind: process {child} exited with status 6")),
        "the server's last line does not name the child\n{}",
        r.dump()
    );
}

/// `set detach-on-fork off`: GDB keeps both processes and resumes the parent alone, so — as
/// natively — the child stays stopped where `fork` returned in it: GDB lists it, reads its
/// own registers (RAX = 0, fork's result in the child) and code; `continue` in it runs it,
/// not recorded, to its end, which GDB is told (`[Inferior 2 (process C) exited with code
/// 06]`); the parent, recorded, then sees that status at its breakpoint and the session ends
/// with the exec'd program's exit — no "Remote communication error".
#[test]
fn detach_on_fork_off_keeps_the_child_stopped_until_gdb_runs_it() {
    let after_fork = line_of("forkexec.c", "int status = 0;");
    let r = session(&[
        "set detach-on-fork off",
        &format!("break forkexec.c:{after_fork}"),
        "continue",
        "echo INFERIORS\n",
        "info inferiors",
        "inferior 2",
        "echo CHILD-REGS\n",
        "info registers rax",
        "x/i $pc-2",
        "continue",
        "echo CHILD-ENDED\n",
        "info inferiors",
        "inferior 1",
        "break shared_work",
        "continue",
        "print x",
        "delete",
        "continue",
        "continue",
    ]);
    r.expect("ptrewind: the debugger keeps both processes of the fork (detach-on-fork off)");
    let child = gdb_child_pid(&r, "[New inferior 2 (process ");
    assert_ne!(child, r.pid, "{}", r.dump());
    let inferiors = r.after("INFERIORS");
    assert!(
        inferiors.contains(&format!("process {}", r.pid))
            && inferiors.contains(&format!("process {child}")),
        "{}",
        r.dump()
    );
    // The child's own registers: fork returned 0 in it, just after the `syscall`.
    let regs = r.after("CHILD-REGS");
    assert!(regs.contains("rax            0x0"), "{}", r.dump());
    assert!(regs.contains("syscall"), "{}", r.dump());
    r.expect(&format!(
        "[Inferior 2 (process {child}) exited with code 06]"
    ));
    let ended = r.after("CHILD-ENDED");
    assert!(ended.contains("<null>"), "{}", r.dump());
    assert!(ended.contains("$1 = 6"), "{}", r.dump());
    r.expect(&format!(
        "[Inferior 1 (process {}) exited with code 05]",
        r.pid
    ));
    assert!(
        !r.gdb.contains("Remote communication error"),
        "{}",
        r.dump()
    );
    expect_program_output(&r, FORKEXEC_OUTPUT);
}

/// `set detach-on-fork off` with a parent that ends without waiting: after the recorded
/// parent's exit GDB stays connected for the child it keeps (stopped, not recorded), reads
/// its registers, runs it to its end (exit status 3) and ends the session cleanly; `info
/// inferiors` then shows both processes gone.
#[test]
fn detach_on_fork_off_child_outlives_the_recorded_parent() {
    let parent_line = line_of("fork_nowait.c", "/* PARENT LINE */");
    let r = example_session(
        "fork_nowait",
        false,
        &[
            "set detach-on-fork off",
            &format!("break fork_nowait.c:{parent_line}"),
            "continue",
            "continue",
            "continue",
            "echo AFTER-PARENT\n",
            "info inferiors",
            "inferior 2",
            "info registers rax",
            "continue",
            "echo AT-END\n",
            "info inferiors",
        ],
    );
    let child = gdb_child_pid(&r, "[New inferior 2 (process ");
    r.expect(&format!("[Inferior 1 (process {}) exited normally]", r.pid));
    let after = r.after("AFTER-PARENT");
    assert!(after.contains(&format!("process {child}")), "{}", r.dump());
    assert!(after.contains("rax            0x0"), "{}", r.dump());
    r.expect(&format!(
        "[Inferior 2 (process {child}) exited with code 03]"
    ));
    // The rows of `info inferiors`: both without a process.
    let rows: Vec<&str> = r
        .after("AT-END")
        .lines()
        .filter(|l| l.trim_start_matches(['*', ' ']).starts_with(['1', '2']))
        .collect();
    assert!(
        rows.len() == 2 && rows.iter().all(|l| l.contains("<null>")),
        "{}",
        r.dump()
    );
    assert!(
        !r.gdb.contains("Remote communication error"),
        "{}",
        r.dump()
    );
    expect_program_output(&r, &["parent of fork_nowait", "child of fork_nowait"]);
}

/// GDB's exec events: `catch exec` stops at the new program's first instruction, GDB names
/// the new executable and loads its symbols, so a breakpoint on a function only the new program
/// has resolves and is hit with its argument (argc 2), with a backtrace into the new `main`;
/// the old program's breakpoint (pending in the new one) stops nothing after the exec.
#[test]
fn catch_exec_loads_the_new_program_and_its_breakpoints_hit() {
    let newimage = examples().join("newimage");
    let work = line_of("newimage.c", "/* NEW LINE */");
    let r = session(&[
        "catch exec",
        "break shared_work",
        "continue",
        "continue",
        "echo AT-EXEC\n",
        "info inferiors",
        "break new_image_work",
        "continue",
        "print x",
        "bt",
        "continue",
        "continue",
    ]);
    r.expect(&format!("is executing new program: {}", newimage.display()));
    r.expect(&format!("Catchpoint 1 (exec'd {})", newimage.display()));
    let after = r.after("AT-EXEC");
    assert!(after.contains("newimage"), "info inferiors: {}", r.dump());
    assert!(
        after.contains(&format!("newimage.c:{work}")) && after.contains("$1 = 2"),
        "the new program's breakpoint was not hit\n{}",
        r.dump()
    );
    assert!(after.contains("in main ("), "{}", r.dump());
    // shared_work's address in the old program is code of the new one's `main` (the same
    // PIE base): only the new program's breakpoint stops after the exec.
    assert!(!after.contains("Breakpoint 2,"), "{}", r.dump());
    check_program_ran_fully(&r);
}

/// `ptrewind record -- mt_fork` (a process with two threads forks) with `commands` in GDB.
fn mt_session(commands: &[&str]) -> GdbRun {
    example_session("mt_fork", false, commands)
}

/// What the two-thread program prints when parent, worker and child all ran to their end: the
/// child's status 3 * 7 = 21 seen by the parent, the worker woken after it ('a' + 1 = 98).
fn check_mt_program_ran_fully(r: &GdbRun) {
    expect_program_output(r, &["child of two threads 21", "parent saw 21, worker 98"]);
}

/// A fork of a process with two threads is reported too: `catch fork` stops in the forking
/// thread with both threads listed; GDB detaches the child, which runs free, and the parent's
/// two threads are recorded to their end.
#[test]
fn fork_of_a_multi_threaded_process_is_caught() {
    let r = mt_session(&[
        "catch fork",
        "continue",
        "echo AT-CATCH\n",
        "info threads",
        "continue",
        "continue",
    ]);
    r.expect("Catchpoint 1 (forked process ");
    let caught = gdb_child_pid(&r, "Catchpoint 1 (forked process ");
    let detached = gdb_child_pid(&r, "[Detaching after fork from child process ");
    assert_eq!(caught, detached, "{}", r.dump());
    let threads = r.after("AT-CATCH");
    assert!(
        threads.contains("* 1    Thread") && threads.contains("  2    Thread"),
        "{}",
        r.dump()
    );
    r.expect("exited normally");
    check_mt_program_ran_fully(&r);
}

/// `set follow-fork-mode child` at a fork of a process with two threads (the other one
/// waiting in `read`): every thread of the parent is detached and runs free (the worker is
/// woken later and the parent ends normally), the child — one thread — is recorded: its call
/// stops with its argument, reverse-continue from its end finds it again, the history decodes
/// exactly.
#[test]
fn follow_fork_mode_child_in_a_multi_threaded_process() {
    let child_line = line_of("mt_fork.c", "/* CHILD LINE */");
    let r = mt_session(&[
        "set follow-fork-mode child",
        "break child_work",
        "continue",
        "print x",
        "echo THREADS\n",
        "info threads",
        "echo END-THREADS\n",
        "continue",
        "echo AT-END\n",
        "reverse-continue",
        "print x",
        "monitor stats",
        "delete",
        "continue",
        "continue",
    ]);
    r.expect("[Detaching after fork from parent process ");
    let child = gdb_child_pid(&r, "fork to child ");
    r.expect(&format!("mt_fork.c:{child_line}"));
    r.expect("$1 = 3");
    let threads = &r.after("THREADS")[..r.after("THREADS").find("END-THREADS").unwrap_or(0)];
    assert_eq!(
        threads.matches(" Thread ").count(),
        1,
        "the child has one thread\n{}",
        r.dump()
    );
    assert!(r.after("AT-END").contains("$2 = 3"), "{}", r.dump());
    r.expect("execs / forks followed   0 / 1");
    r.expect("decode errors            0");
    r.expect("history check            ok");
    r.expect(&format!(
        "[Inferior 2 (process {child}) exited with code 025]"
    ));
    check_mt_program_ran_fully(&r);
}

/// An exec called by a thread other than the main one (the main thread waits in `pause`):
/// the kernel ends the main thread first — its exit event is not the program's end — and the
/// process goes on in the new program under the main thread's id. GDB gets the exec stop with
/// one thread, the new program's breakpoint is hit and the program ends with its own status.
#[test]
fn exec_from_a_thread_goes_on_in_the_new_program() {
    let program = examples().join("thread_exec");
    let newimage = examples().join("newimage");
    let newimage = newimage.to_str().expect("utf-8 path");
    let server = Server::start(&program, &[newimage]);
    let r = gdb_session(
        server,
        &program,
        &[
            "catch exec",
            "continue",
            "echo AT-EXEC\n",
            "info threads",
            "break new_image_work",
            "continue",
            "print x",
            "continue",
            "continue",
        ],
        TIMEOUT,
    );
    let before = &r.gdb[..r.pos("AT-EXEC")];
    assert!(before.contains("Catchpoint 1 (exec'd "), "{}", r.dump());
    // The main thread's end inside the exec is no stop at the program's end.
    assert!(!before.contains("the program is exiting"), "{}", r.dump());
    let after = r.after("AT-EXEC");
    assert_eq!(after.matches(" Thread ").count(), 1, "{}", r.dump());
    assert!(after.contains("$1 = 2"), "{}", r.dump());
    r.expect("exited with code 05");
    assert!(
        r.program_stdout.contains("new image from-thread 42"),
        "{}",
        r.dump()
    );
}

/// An exec by a thread other than the main one, in the history: the main thread's stream —
/// the history served — goes on with the new program (the exec'ing thread goes on under the
/// main thread's id), its part before the exec decoded against the first program (a period,
/// as at the main thread's own exec). Reverse-continue from the new program's breakpoint
/// reaches the start, where the PC and the code are the first program's as seen there before
/// running; the history decodes without error and its length equals the recorded count.
/// (Before: the main history ended at the exec, was decoded against the new program — 3
/// decode errors, a history check mismatch of 1612 instructions — and reverse execution from
/// the new program went into the dead main thread's past.)
#[test]
fn exec_from_a_thread_keeps_the_first_programs_history() {
    let program = examples().join("thread_exec");
    let newimage = examples().join("newimage");
    let newimage = newimage.to_str().expect("utf-8 path");
    let server = Server::start(&program, &[newimage]);
    let r = gdb_session(
        server,
        &program,
        &[
            "echo START\n",
            "p/x $pc",
            "x/2i $pc",
            "echo END-START\n",
            "catch exec",
            "continue",
            "break new_image_work",
            "continue",
            "print x",
            "delete",
            "reverse-continue",
            "echo BACK\n",
            "p/x $pc",
            "x/2i $pc",
            "echo END-BACK\n",
            "monitor stats",
            // Replayed to the present, then the stop at the end, then the exit.
            "continue",
            "continue",
            "continue",
        ],
        TIMEOUT,
    );
    r.expect("$2 = 2");
    let start = r.after("START");
    let start = &start[..start.find("END-START").unwrap_or(0)];
    let back = r.after("BACK");
    let back = &back[..back.find("END-BACK").unwrap_or(0)];
    // The same PC and instructions (GDB names them with the symbols it has; compare the
    // addresses and the instruction text).
    let insns = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.contains(":\t"))
            .map(|l| {
                let (addr, insn) = l.split_once(":\t").unwrap_or_default();
                let addr = addr
                    .trim_start_matches("=> ")
                    .split(' ')
                    .next()
                    .unwrap_or("");
                format!("{addr} {insn}")
            })
            .collect()
    };
    assert_eq!(r.hex_after("START"), r.hex_after("BACK"), "{}", r.dump());
    assert_eq!(insns(start).len(), 2, "{}", r.dump());
    assert_eq!(insns(start), insns(back), "{}", r.dump());
    r.expect("code periods ended       1 (exec 1,");
    r.expect("decode errors            0");
    // Both threads' streams decode, each against its own periods (the exec'ing thread's
    // stream, wholly before the exec, against the first program).
    r.expect("history check            ok: the 2 threads' histories hold");
    assert!(
        !r.gdb.contains("may be incomplete"),
        "a thread's history was left out\n{}",
        r.dump()
    );
    r.expect("exited with code 05");
}

/// `ptrewind record -- vforkexec newimage` (vfork, then exec in the child) with `commands`.
fn vfork_session(commands: &[&str]) -> GdbRun {
    example_session("vforkexec", true, commands)
}

/// What the vfork program prints when child and parent ran to their end: the exec'd program's
/// line, and the parent's after the child's exit status 5.
fn check_vfork_program_ran_fully(r: &GdbRun) {
    expect_program_output(r, &["new image from-vfork 42", "vfork parent saw 5 -> 10"]);
}

/// vfork events: `catch vfork` stops at the vfork (the parent's registers those after the
/// call), GDB detaches the child, which execs and runs free; the parent stays stopped in the
/// call until then, GDB is told the vfork is done (`vforkdone`) and puts its breakpoints back,
/// so the parent's breakpoint after the child's end is hit with its status.
#[test]
fn catch_vfork_then_the_parent_waits_for_vforkdone() {
    let after = line_of("vforkexec.c", "/* AFTER LINE */");
    let r = vfork_session(&[
        "catch vfork",
        "break after_spawn",
        "continue",
        "echo AT-CATCH\n",
        "print $rax",
        "continue",
        "print status",
        "continue",
        "continue",
    ]);
    r.expect("Catchpoint 1 (vforked process ");
    let caught = gdb_child_pid(&r, "Catchpoint 1 (vforked process ");
    let detached = gdb_child_pid(&r, "[Detaching after vfork from child process ");
    assert_eq!(caught, detached, "{}", r.dump());
    // vfork's result in the parent: the child's pid, already at the catchpoint.
    assert!(
        r.after("AT-CATCH").contains(&format!("$1 = {caught}")),
        "{}",
        r.dump()
    );
    r.expect(&format!("vforkexec.c:{after}"));
    r.expect("$2 = 5");
    r.expect("exited normally");
    check_vfork_program_ran_fully(&r);
}

/// The PC GDB resumes from after the `vforkdone` it was told of: GDB's infrun log line
/// `resume_1: … at 0xPC` after `status->kind = VFORK_DONE`.
fn pc_at_vforkdone(gdb_output: &str) -> Option<u64> {
    let after = &gdb_output[gdb_output.find("status->kind = VFORK_DONE")?..];
    let line = after.lines().find(|l| l.contains("resume_1:"))?;
    let hex = line.rsplit(" at 0x").next()?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// `vforkdone` is reported where a native debugger sees it: the parent inside the `vfork`
/// call, at the PC after the `syscall` (the catchpoint's), not one instruction later (before,
/// a recorder's step of the parent went on past the event and, as the stop was taken, the
/// parent had often run its next instruction with GDB's breakpoints out). Ground truth: GDB's
/// own native run of the same program and commands. The history stays exact across it.
#[test]
fn vforkdone_is_reported_where_a_native_debugger_sees_it() {
    let commands = [
        "catch vfork",
        "PLACEHOLDER",
        "echo CATCH-PC\n",
        "print/x $pc",
        "set debug infrun 1",
        "continue",
        "set debug infrun 0",
        "delete",
        "monitor stats",
        "continue",
        "continue",
    ];
    let program = examples().join("vforkexec");
    let newimage = examples().join("newimage");
    let newimage = newimage.to_str().expect("utf-8 path");
    // Natively (GDB runs the program itself; ASLR off, as ptrewind runs it).
    let mut native = support::gdb::gdb_batch();
    for c in commands {
        let c = if c == "PLACEHOLDER" { "run" } else { c };
        if !c.starts_with("monitor") {
            native.arg("-ex").arg(c);
        }
    }
    native.arg("--args").arg(&program).arg(newimage);
    let native = run_until(&mut native, TIMEOUT);
    let native_out = format!("{}{}", native.stdout, native.stderr);
    let native_pc = pc_at_vforkdone(&native_out)
        .unwrap_or_else(|| panic!("no vforkdone resume in GDB's native run:\n{native_out}"));
    let commands: Vec<&str> = commands
        .iter()
        .map(|&c| if c == "PLACEHOLDER" { "continue" } else { c })
        .collect();
    let r = vfork_session(&commands);
    let catch_pc = r.hex_after("CATCH-PC");
    let ours = pc_at_vforkdone(&r.gdb).unwrap_or_else(|| panic!("no vforkdone\n{}", r.dump()));
    assert_eq!(ours, native_pc, "{}\n--- native\n{native_out}", r.dump());
    assert_eq!(ours, catch_pc, "{}", r.dump());
    r.expect("decode errors            0");
    r.expect("history check            ok");
    check_vfork_program_ran_fully(&r);
}

/// `set follow-fork-mode child` at a vfork: GDB follows the child (the parent stays held in
/// the call), the child execs — GDB loads the new program (`catch exec`) and detaches the vfork
/// parent, which then runs free to its end — and the new program's breakpoint is hit in the
/// recorded child.
#[test]
fn follow_fork_mode_child_at_a_vfork_follows_the_exec() {
    let r = vfork_session(&[
        "set follow-fork-mode child",
        "catch exec",
        "continue",
        "break new_image_work",
        "continue",
        "print x",
        "continue",
        "continue",
    ]);
    r.expect("[Attaching after ");
    r.expect("vfork to child ");
    let child = gdb_child_pid(&r, "vfork to child ");
    r.expect("[Detaching vfork parent process ");
    r.expect(&format!("process {child} is executing new program: "));
    r.expect("Catchpoint 1 (exec'd ");
    r.expect("$1 = 2");
    r.expect(&format!(
        "[Inferior 2 (process {child}) exited with code 05]"
    ));
    assert!(
        !r.gdb.contains("detach-on-fork off"),
        "GDB's vfork follow is no refusal\n{}",
        r.dump()
    );
    check_vfork_program_ran_fully(&r);
}

/// `posix_spawn` (glibc clones with `CLONE_VM | CLONE_VFORK` on a stack of its own): with
/// `follow-fork-mode child` the child is recorded from the clone through its exec into the new
/// program, whose breakpoint is hit; the parent, detached after the exec, sees the status.
#[test]
fn posix_spawn_child_is_followed_through_its_exec() {
    let r = example_session(
        "spawn",
        true,
        &[
            "set follow-fork-mode child",
            // Only the new program has it: pending until the exec.
            "set breakpoint pending on",
            "break new_image_work",
            "continue",
            "print x",
            "continue",
            "continue",
        ],
    );
    let child = gdb_child_pid(&r, "vfork to child ");
    r.expect(&format!("process {child} is executing new program: "));
    r.expect("$1 = 2");
    r.expect(&format!(
        "[Inferior 2 (process {child}) exited with code 05]"
    ));
    expect_program_output(&r, &["new image from-spawn 42", "spawn parent saw 5"]);
}

/// `kill` at a fork catchpoint: GDB kills the unsettled child first (`vKill;CHILD`, answered
/// by the server: the held child goes with the program), then the program; the session ends
/// normally and no process is left running.
#[test]
fn kill_at_a_fork_catchpoint_kills_the_held_child_too() {
    let r = session(&["catch fork", "continue", "kill"]);
    let child = gdb_child_pid(&r, "Catchpoint 1 (forked process ");
    r.expect(&format!("[Inferior 1 (process {}) killed]", r.pid));
    assert!(r.server.contains("killed by the debugger"), "{}", r.dump());
    // Gone, or a zombie nobody has reaped yet: not running.
    let state = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
    let running = state
        .rsplit(") ")
        .next()
        .and_then(|rest| rest.chars().next())
        .is_some_and(|c| c != 'Z' && c != 'X');
    assert!(!running, "child {child} still runs: {state}\n{}", r.dump());
}

/// LLDB asks for fork events too (`fork-events+`): with its `follow-fork-mode child` it takes
/// its breakpoints out of the parent only and detaches it (`D;PID`), trusting the child's copy
/// of memory to hold them — so the server gives the followed child the breakpoints the parent
/// had at the fork: both of the child's calls stop.
#[test]
fn lldb_follow_fork_mode_child_keeps_the_breakpoints() {
    if !have("lldb-19") {
        eprintln!("SKIPPED: lldb-19 not installed");
        return;
    }
    let dir = examples();
    let program = dir.join("forkexec");
    let newimage = dir.join("newimage");
    let newimage = newimage.to_str().expect("utf-8 path");
    let mut server = Server::start(&program, &[newimage]);
    let mut c = std::process::Command::new("lldb-19");
    c.args(["--batch", "--no-lldbinit"])
        .args(["-o", "settings set target.process.follow-fork-mode child"])
        .arg("-o")
        .arg(format!("target create {}", program.display()))
        .arg("-o")
        .arg(format!("gdb-remote 127.0.0.1:{}", server.port))
        .args([
            "-o",
            "b shared_work",
            "-o",
            "c",
            "-o",
            "p x",
            "-o",
            "c",
            "-o",
            "p x",
        ])
        .args(["-o", "c", "-k", "process kill"]);
    let out = run_until(&mut c, TIMEOUT);
    let _ = wait_until(&mut server.child, std::time::Instant::now() + TIMEOUT);
    let log = server.stderr.join().unwrap_or_default();
    let stdout = server.stdout.join().unwrap_or_default();
    let ctx = format!(
        "--- lldb\n{}\n{}\n--- server\n{log}\n--- program\n{stdout}",
        out.stdout, out.stderr
    );
    let (a, b) = (
        out.stdout.find("shared_work(x=5)"),
        out.stdout.find("shared_work(x=2)"),
    );
    assert!(a.is_some() && b.is_some() && a < b, "{ctx}");
    assert!(
        out.stdout.contains("(int) 5") && out.stdout.contains("(int) 2"),
        "{ctx}"
    );
    assert!(stdout.contains("parent saw 6 -> 18"), "{ctx}");
}

/// Unrecorded full-speed runs put the breakpoints into memory as INT3: the forked child's copy
/// of them is taken out before it is let go, so it is not killed by a SIGTRAP it cannot handle.
#[test]
fn forked_child_does_not_inherit_inserted_breakpoints() {
    let shared = line_of("forkexec.c", "/* SHARED LINE */");
    let r = session(&[
        "monitor record off",
        "break shared_work",
        "continue",
        "print x",
        "delete",
        "continue",
        "continue",
    ]);
    r.expect(&format!("forkexec.c:{shared}"));
    r.expect("$1 = 6");
    check_program_ran_fully(&r);
}

/// `record --follow-fork child` (GDB's `set follow-fork-mode child` does not reach the server:
/// it reports no fork events): the recording goes on in the child, whose own calls of
/// `shared_work` (5, then 2) stop; the parent, detached, runs untraced to its exec. Reverse
/// execution goes back from the child's end over its calls to the instruction after the
/// `fork`, where the child's RAX (fork's result) is 0; the history decodes exactly.
#[test]
fn follow_fork_child_records_the_child_and_reverses_to_the_fork() {
    let dir = examples();
    let program = dir.join("forkexec");
    let newimage = dir.join("newimage");
    let server = Server::start_cli(&[
        "record".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--follow-fork".into(),
        "child".into(),
        "--".into(),
        program.clone().into(),
        newimage.into(),
    ]);
    let shared = line_of("forkexec.c", "/* SHARED LINE */");
    let r = gdb_session(
        server,
        &program,
        &[
            "break shared_work",
            "continue",
            "print x",
            "continue",
            "print x",
            "delete",
            "continue",
            "echo AT-END\n",
            "break shared_work",
            "reverse-continue",
            "print x",
            "reverse-continue",
            "print x",
            "delete",
            "reverse-finish",
            "echo AFTER-FORK\n",
            "reverse-stepi",
            "reverse-stepi",
            "reverse-stepi",
            "reverse-stepi",
            "reverse-stepi",
            "reverse-stepi",
            "reverse-stepi",
            "monitor stats",
            "continue",
            "continue",
            "continue",
        ],
        TIMEOUT,
    );
    r.expect("following the child (--follow-fork child)");
    r.expect(&format!("forkexec.c:{shared}"));
    // Forward: the child's calls, in order.
    let before_end = &r.gdb[..r.pos("AT-END")];
    let (a, b) = (before_end.find("$1 = 5"), before_end.find("$2 = 2"));
    assert!(
        a.is_some() && b.is_some() && a < b,
        "the child's calls 5 then 2 not seen\n{}",
        r.dump()
    );
    // Backward from the end: 2 then 5.
    let after_end = r.after("AT-END");
    let (a, b) = (after_end.find("$3 = 2"), after_end.find("$4 = 5"));
    assert!(
        a.is_some() && b.is_some() && a < b,
        "reverse-continue did not find the child's calls 2 then 5\n{}",
        r.dump()
    );
    r.expect("execs / forks followed   0 / 1");
    r.expect("decode errors            0");
    r.expect("history check            ok");
    // The child ran to its end (exit status 6, so the untraced parent printed 18 and went on to
    // its exec); reverse-stepping back from the child's first call reached the code before
    // the `if (child == 0)` test at line 12 without leaving the recording.
    let fork_test = line_of("forkexec.c", "if (child == 0) {");
    assert!(
        r.after("AFTER-FORK").contains(&format!("{fork_test}\t")),
        "{}",
        r.dump()
    );
    expect_program_output(&r, FORKEXEC_OUTPUT);
    r.expect("exited with code 06");
}
