//! LLDB against `ptrewind record` (the live software recording), driving the real `lldb-19`
//! in batch mode, plus the reverse-execution packet exchange of LLDB ≥ 21 over a raw
//! connection (lldb-19 has no reverse execution; see docs/lldb.md).
//!
//! Ground truth is independent of ptrewind: symbol addresses from `nm`, the test programs'
//! sources (values they compute, the fixed path of an assembly routine), and for the trace
//! dump a second decoder: LLDB decodes the served trace with its own libipt, and the result
//! must agree with ptrewind's history (`monitor history` / `pt stats`).
//!
//! Tests that need lldb-19 print "SKIPPED: ..." and pass when it is not installed (CI installs
//! it). Every debugger run is bounded by `timeout`, every wait by a deadline.
//! Set `PTREWIND_SHOW_DEBUGGER=1` to print the debugger output.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

// Symbol addresses from `nm` (for PIE binaries: the link-time address).
use support::cbuild::nm_symbol as symbol;
use support::cbuild::{cc_with, compile_source, have};
use support::gdb::{Server, ptrewind, run_until, wait_until};

/// A shared library and a program that calls it and libc, with a global string to read.
const LIB_C: &str = r#"
int lib_scale(int x) {
    int doubled = x * 2;
    return doubled + 1;
}
"#;

const MAIN_C: &str = r#"
#include <stdio.h>
const char greeting[] = "hello-from-ptrewind";
int lib_scale(int x);
int main(void) {
    int v = lib_scale(20);
    puts(greeting);
    return v == 41 ? 0 : 1;
}
"#;

/// `main` calls `rv_start`, a routine with a fixed path (as in tests/btrace.rs): nop,
/// call rv_leaf (mov, ret), mov, test, jz (not taken), add, then `rv_stop`.
const ASM_C: &str = r#"
__asm__(
    ".text\n"
    ".globl rv_start\n.type rv_start,@function\n"
    "rv_start:\n"
    "  nop\n"
    "  call rv_leaf\n"
    "  mov $1, %eax\n"
    "  test %eax, %eax\n"
    "  jz 1f\n"
    "  add $2, %eax\n"
    "1:\n"
    ".globl rv_stop\n"
    "rv_stop:\n"
    "  nop\n"
    "  ret\n"
    ".size rv_start, .-rv_start\n"
    ".globl rv_leaf\n.type rv_leaf,@function\n"
    "rv_leaf:\n"
    "  mov $5, %ecx\n"
    "  ret\n"
    ".size rv_leaf, .-rv_leaf\n");
int rv_start(void);
int main(void) { return rv_start() == 3 ? 0 : 1; }
"#;

fn tools_ready(need_lldb: bool) -> bool {
    for tool in ["gcc", "nm"] {
        if !have(tool) {
            eprintln!("SKIPPED: {tool} not installed");
            return false;
        }
    }
    if need_lldb && !have("lldb-19") {
        eprintln!("SKIPPED: lldb-19 not installed");
        return false;
    }
    true
}

fn gcc(args: &[&str]) {
    cc_with("gcc", args);
}

/// Builds `libscale.so` and `uselib` (linked against it with an `$ORIGIN` rpath) in `dir`.
fn build_uselib(dir: &Path) -> PathBuf {
    let p = |n: &str| dir.join(n).to_string_lossy().into_owned();
    std::fs::write(dir.join("lib.c"), LIB_C).unwrap();
    std::fs::write(dir.join("main.c"), MAIN_C).unwrap();
    gcc(&[
        "-g",
        "-O0",
        "-fPIC",
        "-shared",
        "-o",
        &p("libscale.so"),
        &p("lib.c"),
    ]);
    gcc(&[
        "-g",
        "-O0",
        "-o",
        &p("uselib"),
        &p("main.c"),
        "-L",
        &p(""),
        "-lscale",
        "-Wl,-rpath,$ORIGIN",
    ]);
    dir.join("uselib")
}

/// Builds `rv` (from [`ASM_C`], not position-independent) in `dir`.
fn build_asm(dir: &Path) -> PathBuf {
    compile_source("gcc", dir, "rv", ASM_C, &["-g", "-O0", "-no-pie"], &[])
}

/// The LLDB command script that adds the `pt` commands.
fn lldb_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("gdb-scripts/ptrewind_lldb.py")
}

/// Starts `ptrewind record --backend soft ARGS --listen 127.0.0.1:0 -- exe`.
fn record(exe: &Path, args: &[&str]) -> Server {
    Server::spawn(
        ptrewind()
            .args(["record", "--backend", "soft"])
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--"])
            .arg(exe),
    )
}

/// Waits (bounded) for the server to end, killing it at the deadline; returns its stderr.
fn finish(mut server: Server) -> String {
    let _ = wait_until(&mut server.child, Instant::now() + Duration::from_secs(60));
    server.stderr.join().unwrap()
}

struct LldbRun {
    stdout: String,
    /// Everything, for assertion messages.
    ctx: String,
}

/// Runs lldb-19 in batch mode against `ptrewind record RECORD_ARGS -- exe`: `target create
/// exe`, `gdb-remote`, then `commands`.
fn run_lldb(exe: &Path, record_args: &[&str], commands: &[String]) -> LldbRun {
    let server = record(exe, record_args);
    let mut c = Command::new("lldb-19");
    c.args(["--batch", "--no-lldbinit"])
        .arg("-o")
        .arg(format!("target create {}", exe.display()))
        .arg("-o")
        .arg(format!("gdb-remote 127.0.0.1:{}", server.port));
    for cmd in commands {
        c.arg("-o").arg(cmd);
    }
    let out = run_until(&mut c, Duration::from_secs(120));
    let server_log = finish(server);
    let stdout = out.stdout;
    let ctx = format!(
        "--- lldb stdout\n{stdout}\n--- lldb stderr\n{}\n--- server\n{server_log}",
        out.stderr
    );
    if std::env::var_os("PTREWIND_SHOW_DEBUGGER").is_some() {
        eprintln!("{ctx}");
    }
    LldbRun { stdout, ctx }
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The text between the echo of `command` and the next `(lldb) ` echo.
fn section<'a>(stdout: &'a str, command: &str) -> &'a str {
    let start = stdout
        .find(&format!("(lldb) {command}\n"))
        .map(|i| i + command.len() + 8)
        .unwrap_or(stdout.len());
    let rest = &stdout[start..];
    &rest[..rest.find("(lldb) ").unwrap_or(rest.len())]
}

/// Forward debugging: breakpoints in the executable, in our shared library and in libc
/// resolve and hit; backtrace through the library call; registers, memory and variables;
/// `process kill` reports the SIGKILL exit LLDB expects.
#[test]
fn lldb_forward_debugging_with_shared_libraries_and_kill() {
    if !tools_ready(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_uselib(dir.path());
    // Not recording: the session starts at the dynamic loader's first instruction, before
    // any library is loaded, so LLDB must follow the loader's rendezvous to see them.
    let run = run_lldb(
        &exe,
        &["--record-from", "none"],
        &strs(&[
            "breakpoint set -n main",
            "breakpoint set -n lib_scale",
            "breakpoint set -n puts",
            "continue",
            "register read rip rsp rbp",
            "memory read -f s -c 1 &greeting",
            "continue",
            "bt",
            "frame variable",
            "continue",
            "register read rdi",
            "process kill",
        ]),
    );
    let (out, ctx) = (&run.stdout, &run.ctx);
    // The shared-library breakpoints were pending, then resolved when the loader reported
    // the libraries (qShlibInfoAddr + qXfer:libraries-svr4).
    assert!(out.contains("1 location added to breakpoint 2"), "{ctx}");
    assert!(out.contains("1 location added to breakpoint 3"), "{ctx}");
    // Stop 1: main. ASLR is off, so the PIE executable sits at 0x555555554000.
    let main = 0x5555_5555_4000 + symbol(&exe, "main");
    let regs = section(out, "register read rip rsp rbp");
    let rip = regs
        .split("rip = 0x")
        .nth(1)
        .and_then(|r| u64::from_str_radix(&r[..16], 16).ok())
        .unwrap_or_else(|| panic!("no rip\n{ctx}"));
    // LLDB puts the breakpoint after main's prologue: within the first bytes of main.
    assert!((main..main + 32).contains(&rip), "rip {rip:#x}\n{ctx}");
    assert!(regs.contains("uselib`main"), "{ctx}");
    assert!(regs.contains("rsp = 0x00007fff"), "{ctx}");
    assert!(
        section(out, "memory read -f s -c 1 &greeting").contains("\"hello-from-ptrewind\""),
        "{ctx}"
    );
    // Stop 2: in the library, called from main (the unwinder crossed the PLT-resolved call).
    let bt = section(out, "bt");
    assert!(bt.contains("frame #0: "), "{ctx}");
    assert!(bt.contains("libscale.so`lib_scale(x=20)"), "{ctx}");
    assert!(
        bt.contains("frame #1: ") && bt.contains("uselib`main"),
        "{ctx}"
    );
    assert!(
        section(out, "frame variable").contains("(int) x = 20"),
        "{ctx}"
    );
    // Stop 3: libc's puts, first argument = the greeting's address.
    assert!(out.contains("stop reason = breakpoint 3.1"), "{ctx}");
    assert!(out.contains("`puts") || out.contains("_IO_puts"), "{ctx}");
    let rdi = section(out, "register read rdi");
    assert!(rdi.contains("greeting"), "{ctx}");
    // `k` is answered with X09: LLDB reports the kill as an exit by signal 9.
    assert!(out.contains("exited with status = 9"), "{ctx}");
    assert!(
        !run.ctx.contains("unexpected response to k packet"),
        "{ctx}"
    );
    assert!(ctx.contains("killed by the debugger"), "{ctx}");
}

/// The end of the program is a stop (the default stop at exit): LLDB shows it as a SIGTRAP
/// at the exit system call, with the server's word on it; the history is there (`monitor
/// where` answers at the end of it, a backtrace unwinds through libc's exit path), and a
/// further continue lets the program exit. LLDB's batch mode stops running `-o` commands at a
/// signal stop, as it does at any: the rest are `-k` commands, which it runs there.
#[test]
fn lldb_program_end_is_a_stop_and_a_further_continue_exits() {
    if !tools_ready(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_uselib(dir.path());
    let server = record(&exe, &[]);
    let mut c = Command::new("lldb-19");
    c.args(["--batch", "--no-lldbinit"])
        .arg("-o")
        .arg(format!("target create {}", exe.display()))
        .arg("-o")
        .arg(format!("gdb-remote 127.0.0.1:{}", server.port))
        .args(["-o", "process continue"])
        .args(["-k", "bt"])
        .args(["-k", "process plugin packet monitor where"])
        .args(["-k", "process continue"]);
    let out = run_until(&mut c, Duration::from_secs(120));
    let server_log = finish(server);
    let ctx = format!(
        "--- lldb stdout\n{}\n--- lldb stderr\n{}\n--- server\n{server_log}",
        out.stdout, out.stderr
    );
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(
        all.contains("the program is exiting: it stays stopped at its end"),
        "{ctx}"
    );
    let bt = section(&out.stdout, "bt");
    assert!(bt.contains("stop reason = signal SIGTRAP"), "{ctx}");
    assert!(bt.contains("exit"), "{ctx}");
    assert!(
        bt.contains("uselib`main") || bt.contains("__libc_start"),
        "{ctx}"
    );
    let where_ = section(&out.stdout, "process plugin packet monitor where");
    assert!(where_.contains("at the present: instruction"), "{ctx}");
    assert!(out.stdout.contains("exited with status = 0"), "{ctx}");
    assert!(server_log.contains("exited with status 0"), "{ctx}");
}

/// `command script import gdb-scripts/ptrewind_lldb.py`, then the `pt` commands print the
/// server's monitor output; errors are reported as LLDB errors.
#[test]
fn lldb_python_pt_commands() {
    if !tools_ready(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_asm(dir.path());
    let script = lldb_script();
    let stop = symbol(&exe, "rv_stop");
    let run = run_lldb(
        &exe,
        &[],
        &[
            format!("command script import {}", script.display()),
            format!("breakpoint set -a {stop:#x}"),
            "continue".into(),
            "pt where".into(),
            "pt stats".into(),
            "pt history 3".into(),
            "pt goto".into(),
            "process kill".into(),
        ],
    );
    let (out, ctx) = (&run.stdout, &run.ctx);
    let where_ = section(out, "pt where");
    assert!(where_.contains("at the present: instruction"), "{ctx}");
    assert!(where_.contains(&format!("pc {stop:#x}")), "{ctx}");
    assert!(!where_.contains("packet:"), "LLDB's trailer leaked\n{ctx}");
    let stats = section(out, "pt stats");
    assert!(stats.contains("history check            ok"), "{ctx}");
    // The last branches before the stop (ptrewind pads addresses: parse them): the call
    // into rv_leaf and its ret back into rv_start, after the 5-byte call.
    let targets: Vec<u64> = section(out, "pt history 3")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("-> 0x")?.split_whitespace().next())
        .filter_map(|a| u64::from_str_radix(a, 16).ok())
        .collect();
    let start = symbol(&exe, "rv_start");
    assert_eq!(
        targets[targets.len().saturating_sub(2)..],
        [symbol(&exe, "rv_leaf"), start + 6],
        "{ctx}"
    );
    assert!(
        run.ctx.contains("usage: pt goto N|begin|end"),
        "missing usage error\n{ctx}"
    );
}

/// `pt reverse-stepi` selects the thread once (`Hc`) for its two reverse steps (the one the
/// user asked for and the one its refresh takes back with LLDB's own step forward), then
/// LLDB steps: `Hc`, `bs`, `bs`, `vCont;s`. Counted in LLDB's packet log; the position is the
/// one a single reverse step of GDB's reaches (`lldb_pt_reverse_commands_stop_where_gdb_does`).
#[test]
fn lldb_pt_reverse_stepi_selects_the_thread_once() {
    if !tools_ready(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_asm(dir.path());
    let stop = symbol(&exe, "rv_stop");
    let log = dir.path().join("packets.log");
    let run = run_lldb(
        &exe,
        &[],
        &[
            format!("command script import {}", lldb_script().display()),
            format!("breakpoint set -a {stop:#x}"),
            "continue".into(),
            format!("log enable -f {} gdb-remote packets", log.display()),
            "pt reverse-stepi".into(),
            "log disable gdb-remote packets".into(),
            "process kill".into(),
        ],
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    // The packets sent, from the helper's thread selection to LLDB's step.
    let sent: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once("send packet: $").map(|x| x.1))
        .map(|p| p.rsplit_once('#').map_or(p, |x| x.0))
        .collect();
    let at = sent.iter().rposition(|p| p.starts_with("Hc"));
    let step = sent.iter().rposition(|p| p.starts_with("vCont;s"));
    let (Some(at), Some(step)) = (at, step) else {
        panic!("no Hc or no step in {sent:?}\n{}", run.ctx);
    };
    assert!(at < step, "{sent:?}\n{}", run.ctx);
    let reverse: Vec<&str> = sent[at + 1..step]
        .iter()
        .copied()
        .filter(|p| p.starts_with('b') || p.starts_with('H'))
        .collect();
    assert_eq!(reverse, ["bs", "bs"], "{sent:?}\n{}", run.ctx);
    assert_eq!(
        sent.iter().filter(|p| p.starts_with("Hc")).count(),
        1,
        "one thread selection: {sent:?}\n{}",
        run.ctx
    );
    // The stop replies list the threads (LLDB's `QListThreadsInStopReply`), so LLDB asks for
    // no thread list after its step; its register reads name their thread in a suffix
    // (`QThreadSuffixSupported`), so it selects none with `Hg` either.
    assert!(
        !sent[step..]
            .iter()
            .any(|p| p.starts_with("qfThreadInfo") || p.starts_with("Hg")),
        "thread list or selection after the stop: {sent:?}\n{}",
        run.ctx
    );
    assert!(
        sent.iter()
            .any(|p| p.starts_with('p') && p.contains(";thread:")),
        "no register read with a thread suffix: {sent:?}\n{}",
        run.ctx
    );
    let replies: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once("read packet: $").map(|x| x.1))
        .filter(|p| p.starts_with('T'))
        .collect();
    assert!(
        replies.iter().any(|p| p.contains(";threads:")),
        "no thread list in the stop replies: {replies:?}\n{}",
        run.ctx
    );
}

/// A program whose calls and values say where a reverse command must stop.
const REV_C: &str = r#"
#include <stdio.h>
int add(int a, int b) {
    int s = a + b; /* ADD */
    return s;
}
int twice(int x) {
    int y = add(x, x); /* CALL */
    return y; /* RET */
}
int main(void) {
    int t = 0;
    t += twice(1); /* FIRST */
    t += twice(2); /* SECOND */
    printf("t=%d\n", t); /* PRINT */
    return t == 6 ? 0 : 1;
}
"#;

/// `pt reverse-*` (gdb-scripts/ptrewind_lldb.py) in lldb-19, which has no reverse execution
/// of its own: raw `bc`/`bs` packets, then LLDB's frame view is refreshed (the way CodeLLDB's
/// reverse buttons work). GDB is the reference: the same commands in GDB against another
/// recording of the same program must stop at the same PCs, one after the other; LLDB's
/// variables at the reverse-continue stops say which call of `add` it reached.
#[test]
fn lldb_pt_reverse_commands_stop_where_gdb_does() {
    if !tools_ready(true) || !have("gdb") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_source("gcc", dir.path(), "rev", REV_C, &["-g", "-O0"], &[]);
    // REV_C starts with a newline: line N of the file is element N - 1.
    let line = |marker: &str| {
        REV_C
            .lines()
            .position(|l| l.contains(marker))
            .expect("marker")
            + 1
    };
    let steps = [
        "reverse-stepi",
        "reverse-next",
        "reverse-next",
        "reverse-step",
        "reverse-step",
        "reverse-finish",
        "continue",
        "break add",
        "reverse-continue",
        "reverse-continue",
        "reverse-finish",
        "reverse-continue",
    ];
    // GDB: the PC after each command.
    let mut gdb_cmds = vec![format!("break {}", line("PRINT")), "continue".into()];
    for s in steps {
        gdb_cmds.push(s.to_string());
        gdb_cmds.push("printf \"PC %lx\\n\", $pc".into());
    }
    let g = support::gdb::gdb_session(record(&exe, &[]), &exe, &gdb_cmds, Duration::from_secs(120));
    let gdb_pcs = g.tagged("PC");
    // LLDB: the same commands through `pt`, and LLDB's own registers afterwards.
    let mut cmds = vec![
        format!("command script import {}", lldb_script().display()),
        format!("breakpoint set -l {}", line("PRINT")),
        "continue".into(),
    ];
    for s in steps {
        cmds.push(match s {
            "continue" => "continue".into(),
            "break add" => "breakpoint set -n add".into(),
            other => format!("pt {other}"),
        });
        cmds.push("register read rip".into());
        if s == "reverse-continue" {
            cmds.push("frame variable a".into());
        }
    }
    cmds.push("process kill".into());
    let run = run_lldb(&exe, &[], &cmds);
    let (out, ctx) = (&run.stdout, &run.ctx);
    let lldb_pcs: Vec<String> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("rip = 0x"))
        .filter_map(|l| l.split_whitespace().next())
        .map(|h| format!("{:x}", u64::from_str_radix(h, 16).unwrap()))
        .collect();
    assert_eq!(gdb_pcs.len(), steps.len(), "{}", g.dump());
    assert_eq!(lldb_pcs.len(), steps.len(), "{ctx}");
    // All but the last: at the start of the history there is no instruction to step back to
    // for the refresh, and LLDB keeps its last view (the helper says so, checked below).
    let n = steps.len() - 1;
    assert_eq!(
        lldb_pcs[..n],
        gdb_pcs[..n],
        "LLDB and GDB stop apart\n{ctx}\n{}",
        g.dump()
    );
    // The two reverse-continue stops in add: add(2, 2) first, then add(1, 1).
    let values: Vec<&str> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("(int) a = "))
        .collect();
    assert_eq!(values[..2], ["2", "1"], "{ctx}");
    // The last reverse-continue meets the start of the history (GDB: its usual message).
    g.expect("No more reverse-execution history.");
    assert!(
        out.contains("reached the start of the recorded history"),
        "{ctx}"
    );
}

/// LLDB's Intel PT plug-in decodes the live recording (served over jLLDBTrace*) with its own
/// libipt; the instruction stream must agree with ptrewind's history: same number of
/// instructions as `pt stats` reports, every branch of `monitor history` present at its
/// place, and the fixed path of the assembly routine at the end.
#[test]
fn lldb_trace_dump_matches_ptrewind_history() {
    if !tools_ready(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_asm(dir.path());
    let script = lldb_script();
    let (start, stop, leaf) = (
        symbol(&exe, "rv_start"),
        symbol(&exe, "rv_stop"),
        symbol(&exe, "rv_leaf"),
    );
    let run = run_lldb(
        &exe,
        &[],
        &[
            format!("command script import {}", script.display()),
            format!("breakpoint set -a {stop:#x}"),
            "continue".into(),
            "process trace start".into(),
            "thread trace dump info".into(),
            "thread trace dump instructions -f -c 100000".into(),
            "pt stats".into(),
            "pt history 40".into(),
            "process kill".into(),
        ],
    );
    let (out, ctx) = (&run.stdout, &run.ctx);
    assert!(
        out.contains("Trace technology: intel-pt"),
        "LLDB did not pick its intel-pt plug-in\n{ctx}"
    );
    assert!(out.contains("Number of individual errors: 0"), "{ctx}");
    // LLDB's decode, oldest first: "  N: 0xADDR    mnemonic ...".
    let insns: Vec<u64> = section(out, "thread trace dump instructions -f -c 100000")
        .lines()
        .filter_map(|l| {
            let (idx, rest) = l.trim().split_once(": 0x")?;
            idx.parse::<u64>().ok()?;
            u64::from_str_radix(rest.split_whitespace().next()?, 16).ok()
        })
        .collect();
    let recorded: usize = section(out, "pt stats")
        .lines()
        .find_map(|l| l.strip_prefix("history instructions"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no history count\n{ctx}"));
    assert!(recorded > 8, "{ctx}");
    assert_eq!(insns.len(), recorded, "LLDB and ptrewind disagree\n{ctx}");
    // The end of the stream is the routine's path, ground truth from the assembly source.
    let path = [
        start,
        start + 1,
        leaf,
        leaf + 5,
        start + 6,
        start + 11,
        start + 13,
        start + 15,
    ];
    assert_eq!(&insns[insns.len() - path.len()..], &path, "{ctx}");
    assert_eq!(path[7] + 3, stop);
    // Every branch ptrewind lists ("N  0xFROM ...\n -> 0xTO ...") is a consecutive pair in
    // LLDB's stream at the same instruction number (ptrewind counts from 0 or 1: accept the
    // pair at N or N-1, but it must be that place, not anywhere).
    let history = section(out, "pt history 40");
    let lines: Vec<&str> = history.lines().collect();
    let mut checked = 0;
    for pair in lines.windows(2) {
        let mut f = pair[0].split_whitespace();
        let (Some(n), Some(from)) = (
            f.next().and_then(|n| n.parse::<usize>().ok()),
            f.next().and_then(|a| a.strip_prefix("0x")),
        ) else {
            continue;
        };
        let Some(to) = pair[1]
            .trim()
            .strip_prefix("-> 0x")
            .and_then(|t| t.split_whitespace().next())
        else {
            continue;
        };
        let (from, to) = (
            u64::from_str_radix(from, 16).unwrap(),
            u64::from_str_radix(to, 16).unwrap(),
        );
        let at = |i: usize| insns.get(i) == Some(&from) && insns.get(i + 1) == Some(&to);
        assert!(
            at(n) || (n > 0 && at(n - 1)),
            "branch {n}: {from:#x} -> {to:#x} not in LLDB's decode there\n{ctx}"
        );
        checked += 1;
    }
    assert!(checked >= 3, "too few branches compared ({checked})\n{ctx}");
}

/// A minimal GDB remote client, speaking like LLDB does.
struct Rsp {
    stream: TcpStream,
    no_ack: bool,
}

impl Rsp {
    fn connect(addr: &str) -> Rsp {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Rsp {
            stream,
            no_ack: false,
        }
    }

    fn send(&mut self, body: &str) {
        let sum = body.bytes().fold(0u8, |a, b| a.wrapping_add(b));
        write!(self.stream, "${body}#{sum:02x}").unwrap();
    }

    /// Reads one reply packet (skipping acks and `O` console packets), acking it.
    fn recv(&mut self) -> String {
        loop {
            let mut byte = [0u8; 1];
            let mut body = Vec::new();
            loop {
                self.stream.read_exact(&mut byte).expect("reply");
                if byte[0] == b'$' {
                    break;
                }
            }
            loop {
                self.stream.read_exact(&mut byte).expect("reply");
                if byte[0] == b'#' {
                    break;
                }
                body.push(byte[0]);
            }
            let mut sum = [0u8; 2];
            self.stream.read_exact(&mut sum).unwrap();
            if !self.no_ack {
                self.stream.write_all(b"+").unwrap();
            }
            let text = expand(&body);
            if text.starts_with('O') && text != "OK" {
                continue;
            }
            return text;
        }
    }

    fn ask(&mut self, body: &str) -> String {
        self.send(body);
        self.recv()
    }

    /// rip from a `p10` (register 16) reply.
    fn pc(&mut self) -> u64 {
        let hex = self.ask("p10");
        let bytes: Vec<u8> = (0..8)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        u64::from_le_bytes(bytes.try_into().unwrap())
    }
}

/// Undoes run-length encoding and `}` escapes in a reply.
fn expand(body: &[u8]) -> String {
    let mut out: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'*' if i + 1 < body.len() => {
                let last = *out.last().unwrap_or(&b'0');
                out.extend(std::iter::repeat_n(last, (body[i + 1] - 29) as usize));
                i += 2;
            }
            b'}' if i + 1 < body.len() => {
                out.push(body[i + 1] ^ 0x20);
                i += 2;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The packets LLDB 21 sends for `process continue --reverse` and its reverse step over a
/// breakpoint (`Hc<thread>` + `bs`, then `bc`), against the live recording: capabilities in
/// `qSupported`, reverse steps along the routine's known path, `replaylog:begin` at the start
/// of the history, forward replay back to the breakpoint, and `k` answered `X09`.
#[test]
fn reverse_protocol_exchange_as_lldb21_sends_it() {
    if !tools_ready(false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_asm(dir.path());
    let (start, stop, leaf, main) = (
        symbol(&exe, "rv_start"),
        symbol(&exe, "rv_stop"),
        symbol(&exe, "rv_leaf"),
        symbol(&exe, "main"),
    );
    let server = record(&exe, &[]);
    let mut c = Rsp::connect(&format!("127.0.0.1:{}", server.port));
    c.send("QStartNoAckMode");
    assert_eq!(c.recv(), "OK");
    c.no_ack = true;
    // LLDB 19/21 send this feature list.
    let features =
        c.ask("qSupported:xmlRegisters=i386,arm,mips,arc;multiprocess+;fork-events+;vfork-events+");
    assert!(features.contains("ReverseContinue+"), "{features}");
    assert!(features.contains("ReverseStep+"), "{features}");
    let stop0 = c.ask("?");
    let thread = stop0
        .split("thread:")
        .nth(1)
        .and_then(|t| t.split(';').next())
        .unwrap_or_else(|| panic!("no thread in {stop0}"))
        .to_string();
    // Forward to rv_stop, as LLDB continues (vCont with all threads of the process).
    let pid = thread.trim_start_matches('p').split('.').next().unwrap();
    assert_eq!(c.ask(&format!("Z0,{stop:x},1")), "OK");
    let hit = c.ask(&format!("vCont;c:p{pid}.-1"));
    assert!(hit.starts_with("T05") && hit.contains("swbreak"), "{hit}");
    assert_eq!(c.pc(), stop);
    // LLDB 21 steps back over the breakpoint it stands on with Hc<thread> + bs.
    assert_eq!(c.ask(&format!("Hc{thread}")), "OK");
    let s1 = c.ask("bs");
    assert!(s1.starts_with("T05"), "{s1}");
    assert!(!s1.contains("replaylog"), "{s1}");
    assert_eq!(c.pc(), start + 15, "one step back from rv_stop is the add");
    let s2 = c.ask("bs");
    assert!(s2.starts_with("T05"), "{s2}");
    assert_eq!(c.pc(), start + 13, "then the jz");
    // Reverse-continue with a breakpoint in rv_leaf: stops at its first instruction.
    assert_eq!(c.ask(&format!("Z0,{leaf:x},1")), "OK");
    let back = c.ask("bc");
    assert!(
        back.starts_with("T05") && !back.contains("replaylog"),
        "{back}"
    );
    assert_eq!(c.pc(), leaf);
    // Without breakpoints, bc runs to the start of the history: replaylog:begin, which LLDB
    // 21 shows as the stop reason "history boundary".
    assert_eq!(c.ask(&format!("z0,{leaf:x},1")), "OK");
    assert_eq!(c.ask(&format!("z0,{stop:x},1")), "OK");
    let begin = c.ask("bc");
    assert!(begin.contains("replaylog:begin"), "{begin}");
    // Recording starts at main (`--record-from main`, the default).
    assert_eq!(c.pc(), main);
    // Forward again (replaying) to the breakpoint.
    assert_eq!(c.ask(&format!("Z0,{stop:x},1")), "OK");
    let again = c.ask(&format!("vCont;c:p{pid}.-1"));
    assert!(again.starts_with("T05"), "{again}");
    assert_eq!(c.pc(), stop);
    // `k`: an exit-status reply, as lldb-server sends.
    assert_eq!(c.ask("k"), "X09");
    drop(c);
    let log = finish(server);
    assert!(log.contains("killed by the debugger"), "{log}");
}

/// Every ```json block of the IDE and LLDB docs is valid JSON (VS Code's launch.json accepts
/// comments, but the snippets are meant to be pasted anywhere).
#[test]
fn docs_json_snippets_parse() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut parsed = 0;
    for name in ["vscode.md", "lldb.md", "clion.md"] {
        let text = std::fs::read_to_string(docs.join(name)).unwrap();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("```json\n") {
            let body = &rest[start + 8..];
            let end = body.find("```").expect("unterminated code block");
            let value: serde_json::Value = serde_json::from_str(&body[..end])
                .unwrap_or_else(|e| panic!("{name}: {e}\n{}", &body[..end]));
            assert!(value.get("type").is_some(), "{name}: no \"type\"");
            parsed += 1;
            rest = &body[end..];
        }
    }
    assert_eq!(
        parsed, 3,
        "expected the cppdbg, CodeLLDB and lldb-dap configurations"
    );
}

/// A Debug Adapter Protocol client for `lldb-dap-19` over its stdin/stdout.
struct Dap {
    child: std::process::Child,
    rx: std::sync::mpsc::Receiver<serde_json::Value>,
    seq: u64,
    /// Every message received, for failure reports.
    log: Vec<serde_json::Value>,
}

impl Dap {
    fn start() -> Dap {
        use std::io::BufRead;
        let mut child = Command::new("lldb-dap-19")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run lldb-dap-19");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = std::io::BufReader::new(out);
            loop {
                let mut len = None;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(n) = line.strip_prefix("Content-Length: ") {
                        len = n.parse::<usize>().ok();
                    }
                }
                let mut body = vec![0; len.expect("Content-Length")];
                if r.read_exact(&mut body).is_err() {
                    return;
                }
                if tx
                    .send(serde_json::from_slice(&body).expect("DAP JSON"))
                    .is_err()
                {
                    return;
                }
            }
        });
        Dap {
            child,
            rx,
            seq: 0,
            log: Vec::new(),
        }
    }

    fn send(&mut self, command: &str, arguments: serde_json::Value) -> u64 {
        self.seq += 1;
        let msg = serde_json::json!({
            "seq": self.seq, "type": "request", "command": command, "arguments": arguments
        });
        let body = msg.to_string();
        let stdin = self.child.stdin.as_mut().unwrap();
        write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        stdin.flush().unwrap();
        self.seq
    }

    /// The next message satisfying `pred` (60 s at most).
    fn wait(&mut self, what: &str, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(m) = self.rx.recv_timeout(left) else {
                let _ = self.child.kill();
                panic!("lldb-dap: no {what}; got:\n{:#?}", self.log);
            };
            self.log.push(m.clone());
            if pred(&m) {
                return m;
            }
        }
    }

    fn response(&mut self, seq: u64) -> serde_json::Value {
        let m = self.wait(&format!("response to {seq}"), |m| {
            m["type"] == "response" && m["request_seq"] == seq
        });
        assert_eq!(m["success"], true, "request {seq} failed: {m}");
        m
    }

    fn event(&mut self, name: &str) -> serde_json::Value {
        self.wait(name, |m| m["type"] == "event" && m["event"] == name)
    }

    fn top_line(&mut self, tid: &serde_json::Value) -> u64 {
        let s = self.send("stackTrace", serde_json::json!({ "threadId": tid }));
        let r = self.response(s);
        r["body"]["stackFrames"][0]["line"]
            .as_u64()
            .expect("a frame line")
    }
}

/// The lldb-dap-19 recipe of docs/vscode.md, run for real: `attach` with `gdb-remote-port`
/// to `ptrewind record`, a source breakpoint, the stop reported to the client, then
/// `pt reverse-next` typed in the debug console (a backquote makes it an LLDB command) and
/// the client's next `stackTrace` shows the earlier line.
#[test]
fn lldb_dap_attach_with_gdb_remote_port_and_reverse_next() {
    if !tools_ready(true) || !have("lldb-dap-19") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_source("gcc", dir.path(), "rev", REV_C, &["-g", "-O0"], &[]);
    let line = |marker: &str| REV_C.lines().position(|l| l.contains(marker)).unwrap() + 1;
    let server = record(&exe, &[]);
    let mut dap = Dap::start();
    let s = dap.send(
        "initialize",
        serde_json::json!({"adapterID": "lldb", "clientID": "ptrewind-test",
            "linesStartAt1": true, "columnsStartAt1": true, "pathFormat": "path"}),
    );
    dap.response(s);
    // The configuration docs/lldb.md gives, with the workspace and port filled in.
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/lldb.md"))
        .unwrap();
    let start = doc
        .find("```json\n{\n  \"name\": \"ptrewind (lldb-dap)\"")
        .expect("lldb-dap config in docs/lldb.md")
        + 8;
    let end = start + doc[start..].find("```").unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    let text = doc[start..end]
        .replace("${workspaceFolder}/build/prog", &exe.to_string_lossy())
        .replace("${workspaceFolder}", root)
        .replace("2345", &server.port.to_string());
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(config["type"], "lldb-dap");
    assert_eq!(config["request"], "attach");
    let args = config.as_object_mut().unwrap();
    args.remove("type");
    args.remove("request");
    args.remove("name");
    let s = dap.send("attach", config);
    dap.response(s);
    dap.event("initialized");
    let s = dap.send(
        "setBreakpoints",
        serde_json::json!({"source": {"path": dir.path().join("rev.c")},
            "breakpoints": [{"line": line("PRINT")}]}),
    );
    let r = dap.response(s);
    assert_eq!(r["body"]["breakpoints"][0]["verified"], true, "{r}");
    let s = dap.send("configurationDone", serde_json::json!({}));
    dap.response(s);
    let stop = dap.event("stopped");
    assert_eq!(stop["body"]["reason"], "breakpoint", "{stop}");
    let tid = stop["body"]["threadId"].clone();
    assert_eq!(dap.top_line(&tid), line("PRINT") as u64);
    let s = dap.send(
        "evaluate",
        serde_json::json!({"expression": "`pt reverse-next", "context": "repl"}),
    );
    let r = dap.response(s);
    let text = r["body"]["result"].as_str().unwrap_or_default().to_string();
    assert!(text.contains("rev.c:"), "{r}");
    assert_eq!(dap.top_line(&tid), line("SECOND") as u64, "{:#?}", dap.log);
    let s = dap.send("disconnect", serde_json::json!({"terminateDebuggee": true}));
    dap.response(s);
    let _ = wait_until(&mut dap.child, Instant::now() + Duration::from_secs(30));
    let log = finish(server);
    assert!(log.contains("killed"), "{log}");
}

/// LLDB allocates memory for expression results with `_M`, which ptrewind serves with an
/// `mmap` system call run directly in the stopped process (no program code runs, nothing is
/// recorded): `memory read -f s &greeting` and an `expression` leave the history length, the
/// call history and the previous instruction exactly as they were. (Without `_M` LLDB called
/// `mmap` in the program, and the recording grew by its instructions and `__mmap` calls.)
#[test]
fn lldb_allocation_leaves_the_history_unchanged() {
    if !tools_ready(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_uselib(dir.path());
    let cmds: Vec<String> = vec![
        format!("command script import {}", lldb_script().display()),
        "breakpoint set -n puts".into(),
        "continue".into(),
        "pt where".into(),
        "pt calls 50".into(),
        "log enable gdb-remote packets".into(),
        "memory read -f s -c 1 &greeting".into(),
        "expression greeting[6]".into(),
        "log disable gdb-remote packets".into(),
        "pt where ".into(),
        "pt calls 50 ".into(),
        "process kill".into(),
    ];
    let run = run_lldb(&exe, &[], &cmds);
    let (out, ctx) = (&run.stdout, &run.ctx);
    assert!(out.contains("\"hello-from-ptrewind\""), "{ctx}");
    assert!(out.contains("(const char) $1 = 'f'"), "{ctx}");
    // LLDB did allocate, through the packet.
    assert!(ctx.contains("send packet: $_M"), "{ctx}");
    assert_eq!(
        section(out, "pt where"),
        section(out, "pt where "),
        "the history changed\n{ctx}"
    );
    assert_eq!(
        section(out, "pt calls 50"),
        section(out, "pt calls 50 "),
        "{ctx}"
    );
    assert!(!section(out, "pt calls 50 ").contains("mmap"), "{ctx}");
}

/// An LLDB `expression` that calls a function of the program runs it as a diversion outside
/// the recording: the result is right and `pt where`, `pt calls` are unchanged; the history
/// check still passes.
#[test]
fn lldb_expression_calls_stay_out_of_the_history() {
    if !tools_ready(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_source("gcc", dir.path(), "rev", REV_C, &["-g", "-O0"], &[]);
    let print = REV_C.lines().position(|l| l.contains("PRINT")).unwrap() + 1;
    let cmds: Vec<String> = vec![
        format!("command script import {}", lldb_script().display()),
        format!("breakpoint set -l {print}"),
        "continue".into(),
        "pt where".into(),
        "pt calls 50".into(),
        "expression (int)twice(21)".into(),
        "pt where ".into(),
        "pt calls 50 ".into(),
        "pt stats".into(),
        "process kill".into(),
    ];
    let run = run_lldb(&exe, &[], &cmds);
    let (out, ctx) = (&run.stdout, &run.ctx);
    assert!(out.contains("(int) $0 = 42"), "{ctx}");
    assert!(section(out, "pt where").contains("at the present"), "{ctx}");
    assert_eq!(section(out, "pt where"), section(out, "pt where "), "{ctx}");
    assert_eq!(
        section(out, "pt calls 50"),
        section(out, "pt calls 50 "),
        "{ctx}"
    );
    let stats = section(out, "pt stats");
    assert!(stats.contains("history check            ok"), "{ctx}");
    assert!(stats.contains("debugger calls           1 "), "{ctx}");
}
