//! What a `reverse-stepi` costs GDB in round trips: real GDB 13 with `set debug remote 1`
//! around a few reverse steps, the packets it sends counted per step. Each packet is a round
//! trip over the connection, which is most of what a step costs as GDB sees it
//! (docs/benchmarks.md, "Reverse-stepi from a real GDB client"); these tests pin the ones the
//! server can avoid.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

mod support;

use support::cbuild::cc;
use support::gdb::{GdbRun, Server, gdb_session};
use support::qemu::{plugin, qemu_available};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A loop of calls and data-dependent branches (the program of `bench_gdb_latency`).
const PROGRAM: &str = include_str!("../examples/c/latency_loop.c");

const STEPS: usize = 3;

fn compile(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("loop.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = dir.join("loop");
    cc([
        "-O1",
        "-g",
        "-no-pie",
        "-o",
        exe.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    exe
}

/// Runs `before`, then `STEPS` reverse-stepi with remote debugging on; returns the packets GDB
/// sent during them (the text after `Sending packet: $`, up to the `#`). GDB prints its remote
/// log on stderr, apart from its stdout, so the steps are taken together and the counts
/// divided by `STEPS`.
fn steps(server: Server, exe: &Path, before: &[&str]) -> (GdbRun, Vec<String>) {
    let mut cmds: Vec<String> = before.iter().map(|s| s.to_string()).collect();
    // One step first: what GDB sends only on the first resume after a stop is not per step.
    cmds.push("reverse-stepi".into());
    cmds.push("set debug remote 1".into());
    for _ in 0..STEPS {
        cmds.push("reverse-stepi".into());
    }
    cmds.push("set debug remote 0".into());
    cmds.push("echo END\\n".into());
    cmds.push("info threads".into());
    cmds.push("kill".into());
    let run = gdb_session(server, exe, &cmds, TIMEOUT);
    let packets: Vec<String> = run
        .gdb
        .lines()
        .filter_map(|l| l.split_once("Sending packet: $").map(|x| x.1))
        .map(|p| p.rsplit_once('#').map_or(p, |x| x.0).to_string())
        .collect();
    (run, packets)
}

/// A QEMU recording of `exe` (PC-only past), served.
fn qemu_server(dir: &Path, exe: &Path) -> Server {
    let mut cli: Vec<OsString> = ["record", "--backend", "qemu", "--no-live", "--trace-dir"]
        .iter()
        .map(Into::into)
        .collect();
    cli.push(dir.join("rec").into());
    cli.extend(["--qemu-plugin".into(), plugin().into(), "--".into()]);
    cli.push(exe.into());
    cli.push("200".into());
    Server::start_cli(&cli)
}

/// `source gdb-scripts/ptrewind.py`, as `ptrewind gdb` and the IDE setups (docs/vscode.md,
/// docs/clion.md) load it.
fn source_script() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gdb-scripts/ptrewind.py");
    format!("source {}", script.display())
}

/// How many of `packets` start with `prefix`.
fn count(packets: &[String], prefix: &str) -> usize {
    packets.iter().filter(|x| x.starts_with(prefix)).count()
}

/// The checks every target shares: one `bs` per step, the thread list read once per step
/// through `qXfer:threads:read` (not `qfThreadInfo` + `qsThreadInfo`), `info threads` still
/// right.
fn check_common(run: &GdbRun, packets: &[String]) {
    assert_eq!(count(packets, "bs"), STEPS, "{packets:?}\n{}", run.dump());
    assert_eq!(
        count(packets, "qXfer:threads:read:"),
        STEPS,
        "the thread list in one read per step: {packets:?}\n{}",
        run.dump()
    );
    assert_eq!(
        count(packets, "qfThreadInfo") + count(packets, "qsThreadInfo"),
        0,
        "{packets:?}\n{}",
        run.dump()
    );
    assert!(
        run.after("END").contains("* 1    Thread "),
        "info threads lists the thread\n{}",
        run.dump()
    );
}

#[test]
fn live_ptrace_reverse_stepi_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path());
    let server = Server::start(&exe, &["200"]);
    let (run, packets) = steps(server, &exe, &["break done", "continue"]);
    check_common(&run, &packets);
    // The stop reply expedites rbp/rsp/rip (the state log knows them): no `g`. GDB reads the
    // stack once per stop to unwind (one `m`), and inserts and removes its breakpoints
    // (`done` and the dynamic linker's) around each resume.
    assert_eq!(count(&packets, "g"), 0, "{packets:?}\n{}", run.dump());
    assert_eq!(count(&packets, "m"), STEPS, "{packets:?}\n{}", run.dump());
    let rest = packets.len() - count(&packets, "Z0") - count(&packets, "z0");
    assert_eq!(rest, 3 * STEPS, "bs, m, qXfer: {packets:?}\n{}", run.dump());
}

#[test]
fn qemu_pc_only_reverse_stepi_round_trips() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path());
    let (run, packets) = steps(qemu_server(dir.path(), &exe), &exe, &[]);
    check_common(&run, &packets);
    // PC-only: GDB reads the register file once per stop (`g`: every register but rip is
    // unavailable, so it never reads memory near a made-up stack pointer).
    assert_eq!(count(&packets, "g"), STEPS, "{packets:?}\n{}", run.dump());
    assert_eq!(count(&packets, "m"), 0, "{packets:?}\n{}", run.dump());
    let rest = packets.len() - count(&packets, "Z0") - count(&packets, "z0");
    assert_eq!(rest, 3 * STEPS, "bs, g, qXfer: {packets:?}\n{}", run.dump());
}

/// The checks of a session with the script loaded: no `Z0`/`z0`, and per step exactly the
/// three packets GDB sends for itself at a stop: `bs`, the read of the frame's state (`read`:
/// `m` for the stack, `g` for the register file) and the thread list.
fn check_three(run: &GdbRun, packets: &[String], read: &str) {
    check_common(run, packets);
    let breakpoints = count(packets, "Z0") + count(packets, "z0");
    assert_eq!(breakpoints, 0, "{packets:?}\n{}", run.dump());
    assert_eq!(count(packets, read), STEPS, "{packets:?}\n{}", run.dump());
    assert_eq!(packets.len(), 3 * STEPS, "{packets:?}\n{}", run.dump());
}

/// With `gdb-scripts/ptrewind.py` loaded, GDB keeps its breakpoints inserted while the program
/// is stopped: no `Z0`/`z0` around a step, so a reverse-stepi is three round trips (the step,
/// the stack read, the thread list), the user's breakpoint and the dynamic linker's
/// notwithstanding. (That breakpoints behave as without the setting — stepped over forward
/// and backward, reverse-continued to — is `tests/session.rs`' comparison of GDB with and
/// without the script, `gdb_mi_reverse_commands_as_cpptools_sends_them`.)
#[test]
fn live_ptrace_with_script_keeps_breakpoints_inserted() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path());
    let server = Server::start(&exe, &["200"]);
    let script = source_script();
    let (run, packets) = steps(server, &exe, &[script.as_str(), "break done", "continue"]);
    check_three(&run, &packets, "m");
}

/// The same on a QEMU recording (PC-only past): the step, the register file, the thread list.
#[test]
fn qemu_pc_only_with_script_keeps_breakpoints_inserted() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path());
    let script = source_script();
    let (run, packets) = steps(qemu_server(dir.path(), &exe), &exe, &[script.as_str()]);
    check_three(&run, &packets, "g");
}
