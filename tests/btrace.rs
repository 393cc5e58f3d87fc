//! GDB's `record btrace pt` and LLDB's `process trace start` against the ptrewind server,
//! driving the real debuggers in batch mode.
//!
//! No recording backend is wired into the server's resume path yet, so each session serves a
//! trace fixed in advance, of two kinds. (1) A *known* one: the test
//! program runs a hand-written assembly routine whose path is fixed, and the test encodes the
//! Intel PT packets for exactly that path by hand (PSB+, MODE.Exec, TIP.PGE at the start, one
//! TNT-8 byte for the compressed RET and the not-taken JZ, FUP + TIP.PGD where the thread
//! stops), independent of ptrewind's encoder. It is served through
//! [`FixedTraceProvider`]; the debugger decodes it with its own libipt, reading code from the
//! live process through the server. (2) One recorded by ptrewind's software backend
//! (`SoftRecorder`) from `bt_start` to `bt_stop` in a first run of the same non-PIE program,
//! served for a second run at the same addresses. The ground truth is the assembly source: the
//! decoded instruction and function-call history must be exactly that path (and, for (2), the
//! IPs the recorder stepped through).
//!
//! GDB 13: `record btrace pt` (Qbtrace:pt, qXfer:btrace:read all/delta/new),
//! `record instruction-history`, `record function-call-history`, `record goto`,
//! `reverse-stepi` in GDB's own replay. LLDB 19: `process trace start` (jLLDBTraceSupported,
//! jLLDBTraceStart), `thread trace dump info|instructions|function-calls`
//! (jLLDBTraceGetState, jLLDBTraceGetBinaryData for the trace and the CPU description).
//! Set `PTREWIND_SHOW_DEBUGGER=1` to print the debugger output and packet logs.

use ptrewind::capture::soft::recorder::run_to_breakpoint;
use ptrewind::capture::soft::{RecordFrom, RecorderConfig, SoftRecorder};
use ptrewind::server::btrace::{FixedTraceProvider, PtCpu};
use ptrewind::server::{GdbStubAdapter, Router, tracing};
use ptrewind::target::{PtraceTarget, SpawnOptions, Target};
use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

use support::cbuild::{compile_source, have, nm_symbol};
use support::gdb::{Finished, Server, gdb_batch, run_until, wait_until};

/// How long one debugger session may take before it is killed.
const DEBUGGER_TIMEOUT: Duration = Duration::from_secs(120);

/// `main` calls `bt_start`, a routine with a fixed path: nop, call bt_leaf (mov, ret),
/// mov, test, jz (not taken), add, then `bt_stop`.
const PROGRAM: &str = r#"
__asm__(
    ".text\n"
    ".globl bt_start\n.type bt_start,@function\n"
    "bt_start:\n"
    "  nop\n"
    "  call bt_leaf\n"
    "  mov $1, %eax\n"
    "  test %eax, %eax\n"
    "  jz 1f\n"
    "  add $2, %eax\n"
    "1:\n"
    ".globl bt_stop\n"
    "bt_stop:\n"
    "  nop\n"
    "  ret\n"
    ".size bt_start, .-bt_start\n"
    ".globl bt_leaf\n.type bt_leaf,@function\n"
    "bt_leaf:\n"
    "  mov $5, %ecx\n"
    "  ret\n"
    ".size bt_leaf, .-bt_leaf\n");
int bt_start(void);
int main(void) { return bt_start() == 3 ? 0 : 1; }
"#;

/// The mnemonics of the path from `bt_start` up to (not including) `bt_stop`.
const PATH: &[&str] = &["nop", "call", "mov", "ret", "mov", "test", "je", "add"];

fn build_program(dir: &Path) -> PathBuf {
    compile_source("gcc", dir, "bt", PROGRAM, &["-O0", "-g", "-no-pie"], &[])
}

/// Symbol address from `nm` (the program is not position independent).
fn symbol(exe: &Path, name: &str) -> u64 {
    nm_symbol(exe, name)
}

/// The PT packets of the path, encoded by hand from the SDM layouts.
/// With `jz_taken` the JZ bit says "taken" (a path the program did not run; for the control).
fn known_trace(start: u64, stop: u64, jz_taken: bool) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend(std::iter::repeat_n([0x02u8, 0x82], 8).flatten()); // PSB
    t.extend([0x02, 0x23]); // PSBEND
    t.extend([0x99, 0x01]); // MODE.Exec: CS.L = 1 (64-bit)
    t.push(0x71); // TIP.PGE, IPBytes = 011 (6 bytes, sign-extended)
    t.extend(&start.to_le_bytes()[..6]);
    // TNT-8 with two bits, oldest first: RET compressed (taken = 1), JZ not taken (0).
    // Stop bit at byte bit 3, B1 at bit 2, B2 at bit 1, bit 0 = 0.
    t.push(if jz_taken { 0b0000_1110 } else { 0b0000_1100 });
    t.push(0x7d); // FUP, IPBytes = 011: the breakpoint at bt_stop traps before it executes
    t.extend(&stop.to_le_bytes()[..6]);
    t.push(0x01); // TIP.PGD, IP suppressed: tracing stops (the thread entered the kernel)
    t
}

struct Served {
    debugger: Finished,
    outcome: String,
}

/// Starts `exe` under the ptrewind server with a known trace for its thread, runs
/// `debugger(port)` and serves it until it disconnects.
/// With `record_from_start` the server starts recording before the debugger connects.
fn serve_with(
    exe: &Path,
    trace: impl FnOnce(u32) -> Vec<u8>,
    record_from_start: bool,
    debugger: impl FnOnce(u16) -> Command,
) -> Served {
    let target = PtraceTarget::spawn(&exe.as_os_str().to_owned(), &[], &SpawnOptions::default())
        .expect("spawn");
    let tid = u32::try_from(target.tid()).unwrap();
    let mut provider = FixedTraceProvider::new(PtCpu::SOFTWARE);
    provider.set_trace(tid, trace(tid));
    let mut session = GdbStubAdapter::new(Box::new(target));
    let mut router = Router::default();
    let hub = tracing::install(&mut router, Box::new(provider));
    if record_from_start {
        let hub = &mut *hub.borrow_mut();
        hub.btrace
            .start_recording(tid, hub.provider.as_mut())
            .unwrap();
    }

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut cmd = debugger(port);
    let child = std::thread::spawn(move || run_until(&mut cmd, DEBUGGER_TIMEOUT));
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("debugger did not connect: {e}"),
        }
    };
    stream.set_nonblocking(false).unwrap();
    let outcome = format!("{:?}", router.serve(stream, &mut session));
    let debugger = child.join().unwrap();
    Served { debugger, outcome }
}

/// Parses `record instruction-history` lines: `N\t0xADDR <sym+off>:\tmnemonic operands`.
fn history(text: &str) -> Vec<(u64, String, String)> {
    text.lines()
        .filter_map(|l| {
            let (idx, rest) = l.split_once('\t')?;
            idx.trim().parse::<u64>().ok()?;
            let rest = rest.trim_start_matches("=> ");
            let (loc, insn) = rest.split_once(":\t")?;
            let addr = loc.split_whitespace().next()?;
            let addr = u64::from_str_radix(addr.strip_prefix("0x")?, 16).ok()?;
            let sym = loc.split('<').nth(1)?.trim_end_matches('>').to_string();
            let mnemonic = insn.split_whitespace().next()?.to_string();
            Some((addr, sym, mnemonic))
        })
        .collect()
}

struct GdbRun {
    stdout: String,
    stderr: String,
    /// Everything, for assertion messages.
    ctx: String,
}

/// Builds the program, serves it with the trace `make_trace(start, stop)` and runs GDB's
/// `record btrace pt` session over it, with `extra` commands at the end.
fn run_gdb(exe: &Path, trace: Vec<u8>, record_from_start: bool, extra: &[&str]) -> GdbRun {
    let exe_for_gdb = exe.to_path_buf();
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let served = serve_with(
        exe,
        |_| trace,
        record_from_start,
        move |port| {
            let mut c = gdb_batch();
            c.args(["-ex", "set debug remote 1"])
                // Not GDB's default (16 KiB): GDB must send Qbtrace-conf:pt:size and show the
                // size read back from qXfer:btrace-conf.
                .args(["-ex", "set record btrace pt buffer-size 65536"])
                .arg("-ex")
                .arg(format!("file {}", exe_for_gdb.display()))
                .arg("-ex")
                .arg(format!("target remote 127.0.0.1:{port}"))
                .args(["-ex", "break *bt_start", "-ex", "continue"]);
            if !record_from_start {
                c.args(["-ex", "record btrace pt"]);
            }
            c.args(["-ex", "break *bt_stop", "-ex", "continue"])
                .args(["-ex", "info record"])
                .args(["-ex", "record instruction-history 1,20"])
                .args(["-ex", "record function-call-history"]);
            for e in &extra {
                c.arg("-ex").arg(e);
            }
            c.args(["-ex", "record stop", "-ex", "kill"]);
            c
        },
    );
    let Finished { stdout, stderr, .. } = served.debugger;
    let tail: Vec<&str> = stderr.lines().rev().take(60).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    let ctx = format!(
        "server: {}\n--- gdb stdout ---\n{stdout}\n--- gdb stderr (tail) ---\n{}",
        served.outcome,
        tail.join("\n")
    );
    if std::env::var_os("PTREWIND_SHOW_DEBUGGER").is_some() {
        eprintln!("{ctx}");
    }
    GdbRun {
        stdout,
        stderr,
        ctx,
    }
}

fn gdb_ready() -> bool {
    if have("gdb") && have("gcc") && have("nm") {
        return true;
    }
    eprintln!("SKIPPED: gdb, gcc or nm not installed");
    false
}

#[test]
fn gdb_record_btrace_pt_decodes_the_served_trace() {
    if !gdb_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_program(dir.path());
    let (start, stop, leaf) = (
        symbol(&exe, "bt_start"),
        symbol(&exe, "bt_stop"),
        symbol(&exe, "bt_leaf"),
    );
    let GdbRun {
        stdout,
        stderr,
        ctx,
    } = run_gdb(
        &exe,
        // 3000 leading PAD bytes make the document larger than GDB's 0x1000-byte reads, so it
        // is paged out in several qXfer chunks.
        [vec![0u8; 3000], known_trace(start, stop, false)].concat(),
        false,
        &[
            // Client-side replay from our trace: go to instruction 3 (in bt_leaf), step back.
            "record goto 3",
            "p/x $pc",
            "reverse-stepi",
            "p/x $pc",
            "record goto end",
        ],
    );

    // The btrace features were advertised and GDB used them.
    assert!(
        stderr.contains("Qbtrace:pt+"),
        "qSupported lacks Qbtrace:pt+\n{ctx}"
    );
    assert!(stderr.contains("Sending packet: $Qbtrace:pt"), "{ctx}");
    assert!(stderr.contains("qXfer:btrace:read:"), "{ctx}");
    let paged = stderr.lines().any(|l| {
        l.split("qXfer:btrace:read:").nth(1).is_some_and(|r| {
            let offset = r.split(':').nth(1).and_then(|o| o.split(',').next());
            offset.is_some_and(|o| o != "0")
        })
    });
    assert!(
        paged,
        "the btrace document was not read in several chunks\n{ctx}"
    );
    assert!(
        stdout.contains("Recording format: Intel Processor Trace."),
        "{ctx}"
    );
    assert!(
        stdout.contains("Recorded 8 instructions in 3 functions (0 gaps)"),
        "{ctx}"
    );
    assert!(
        !stdout.contains("decode error") && !stderr.contains("decode error"),
        "{ctx}"
    );

    // Instruction history = the path of the assembly source, at the right addresses.
    let h = history(&stdout);
    let mnemonics: Vec<&str> = h.iter().map(|(_, _, m)| m.as_str()).collect();
    assert_eq!(mnemonics, PATH, "{ctx}");
    assert_eq!(h[0].0, start, "{ctx}");
    assert_eq!(h[2].0, leaf, "{ctx}");
    assert!(
        h[2].1.starts_with("bt_leaf") && h[3].1.starts_with("bt_leaf"),
        "{ctx}"
    );
    // Back in bt_start right after the 5-byte call; the 3-byte add ends at bt_stop.
    assert_eq!(h[4].0, start + 1 + 5, "{ctx}");
    assert_eq!(h[7].0 + 3, stop, "{ctx}");

    // Function-call history: bt_start, bt_leaf, back in bt_start.
    let calls: Vec<&str> = stdout
        .lines()
        .filter_map(|l| {
            let (idx, f) = l.split_once('\t')?;
            idx.trim().parse::<u64>().ok()?;
            Some(f.trim())
        })
        .filter(|f| !f.contains(':'))
        .collect();
    assert_eq!(calls, ["bt_start", "bt_leaf", "bt_start"], "{ctx}");

    // Replay: instruction 3 is bt_leaf's first; one step back is the call.
    assert!(stdout.contains(&format!("$1 = {leaf:#x}")), "{ctx}");
    assert!(stdout.contains(&format!("$2 = {:#x}", start + 1)), "{ctx}");
}

/// Records `bt_start` → `bt_stop` of one run of `exe` with ptrewind's software backend
/// (ptrace single-stepping encoder). Returns the trace and the IPs the recorder executed.
fn record_with_soft_backend(exe: &Path, start: u64, stop: u64) -> (Vec<u8>, Vec<u64>) {
    let target = PtraceTarget::spawn(&exe.as_os_str().to_owned(), &[], &SpawnOptions::default())
        .expect("spawn");
    let config = RecorderConfig {
        record_from: RecordFrom::OnDemand,
        log_ips: true,
        capture_image_at_exit: false,
        ..RecorderConfig::default()
    };
    let mut rec = SoftRecorder::new(target, config).expect("recorder");
    run_to_breakpoint(rec.target(), start).expect("run to bt_start");
    rec.record_on();
    for _ in 0..100 {
        if rec.current_regs().expect("regs").rip == stop {
            break;
        }
        rec.step().expect("step");
    }
    assert_eq!(
        rec.current_regs().unwrap().rip,
        stop,
        "did not reach bt_stop"
    );
    rec.record_off().expect("record off");
    // Dropping the recorder's target kills the recorded process.
    let recording = rec.finish().expect("finish");
    assert!(recording.gaps.is_empty(), "{:?}", recording.gaps);
    (recording.trace, recording.ip_log.unwrap_or_default())
}

/// End to end with the software backend: a trace recorded by ptrewind's encoder from a real
/// run (a first process), served for a second run of the same non-PIE program at the same
/// addresses, decodes in GDB (its libipt, our CPU identity) to exactly the executed path.
#[test]
fn gdb_decodes_a_trace_recorded_by_the_software_backend() {
    if !gdb_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_program(dir.path());
    let (start, stop) = (symbol(&exe, "bt_start"), symbol(&exe, "bt_stop"));
    let (trace, ips) = record_with_soft_backend(&exe, start, stop);
    let GdbRun { stdout, ctx, .. } = run_gdb(&exe, trace, false, &[]);
    let ctx = format!("recorded ips: {ips:x?}\n{ctx}");
    assert!(
        stdout.contains("Recorded 8 instructions in 3 functions (0 gaps)"),
        "{ctx}"
    );
    let h = history(&stdout);
    let mnemonics: Vec<&str> = h.iter().map(|(_, _, m)| m.as_str()).collect();
    assert_eq!(mnemonics, PATH, "{ctx}");
    // The decoded addresses are the ones the recorder single-stepped through.
    let decoded: Vec<u64> = h.iter().map(|(a, _, _)| *a).collect();
    assert_eq!(decoded, ips, "{ctx}");
}

/// The server records from the start: GDB notices on connect (btrace-conf says PT) and
/// switches to record-btrace without `record btrace pt`.
#[test]
fn gdb_adopts_a_recording_started_by_the_server() {
    if !gdb_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_program(dir.path());
    let (start, stop) = (symbol(&exe, "bt_start"), symbol(&exe, "bt_stop"));
    let GdbRun {
        stdout,
        stderr,
        ctx,
    } = run_gdb(&exe, known_trace(start, stop, false), true, &[]);
    assert!(stderr.contains("qXfer:btrace-conf:read::0,"), "{ctx}");
    assert!(!stderr.contains("Sending packet: $Qbtrace:pt"), "{ctx}");
    assert!(
        stdout.contains("Target is recording using Intel Processor Trace"),
        "{ctx}"
    );
    let h = history(&stdout);
    let mnemonics: Vec<&str> = h.iter().map(|(_, _, m)| m.as_str()).collect();
    assert_eq!(mnemonics, PATH, "{ctx}");
}

/// Control: the same session with the JZ bit flipped (taken) must decode to a different
/// path, so the history above really comes from the served bytes.
#[test]
fn gdb_history_follows_the_trace_bits() {
    if !gdb_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_program(dir.path());
    let (start, stop) = (symbol(&exe, "bt_start"), symbol(&exe, "bt_stop"));
    let GdbRun { stdout, ctx, .. } = run_gdb(&exe, known_trace(start, stop, true), false, &[]);
    let h = history(&stdout);
    let mnemonics: Vec<&str> = h.iter().map(|(_, _, m)| m.as_str()).collect();
    assert_eq!(mnemonics, &PATH[..7], "{ctx}");
    assert!(
        stdout.contains("Recorded 7 instructions in 3 functions (0 gaps)"),
        "{ctx}"
    );
}

fn lldb_ready() -> bool {
    if gdb_ready() && have("lldb-19") {
        return true;
    }
    eprintln!("SKIPPED: lldb-19 not installed");
    false
}

#[test]
fn lldb_decodes_the_known_trace() {
    if !lldb_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_program(dir.path());
    let (start, stop) = (symbol(&exe, "bt_start"), symbol(&exe, "bt_stop"));
    lldb_session(dir.path(), &exe, known_trace(start, stop, false));
}

#[test]
fn lldb_decodes_a_trace_recorded_by_the_software_backend() {
    if !lldb_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_program(dir.path());
    let (start, stop) = (symbol(&exe, "bt_start"), symbol(&exe, "bt_stop"));
    let (trace, _) = record_with_soft_backend(&exe, start, stop);
    lldb_session(dir.path(), &exe, trace);
}

/// LLDB 19: `process trace start` at `bt_start`, continue to `bt_stop`, dump the trace; the
/// served trace must decode to [`PATH`].
fn lldb_session(dir: &Path, exe: &Path, trace: Vec<u8>) {
    let (start, stop) = (symbol(exe, "bt_start"), symbol(exe, "bt_stop"));
    let exe = exe.to_path_buf();
    let log = dir.join("lldb-packets.log");
    let exe2 = exe.clone();
    let log2 = log.clone();
    let served = serve_with(
        &exe,
        |_| trace,
        false,
        move |port| {
            let mut c = Command::new("lldb-19");
            c.args(["--batch", "--no-lldbinit"])
                .arg("-o")
                .arg(format!(
                    "log enable -f {} gdb-remote packets",
                    log2.display()
                ))
                .arg("-o")
                .arg(format!("target create {}", exe2.display()))
                .arg("-o")
                .arg(format!("gdb-remote 127.0.0.1:{port}"))
                .arg("-o")
                .arg(format!("breakpoint set -a {start:#x}"))
                .args(["-o", "continue", "-o", "process trace start"])
                .arg("-o")
                .arg(format!("breakpoint set -a {stop:#x}"))
                .args(["-o", "continue"])
                .args(["-o", "thread trace dump info"])
                .args(["-o", "thread trace dump instructions -f"])
                .args(["-o", "thread trace dump function-calls"])
                .args(["-o", "process kill"]);
            c
        },
    );
    let Finished { stdout, stderr, .. } = &served.debugger;
    let packets = std::fs::read_to_string(&log).unwrap_or_default();
    let ctx = format!(
        "server {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- packets\n{packets}",
        served.outcome
    );
    if std::env::var_os("PTREWIND_SHOW_DEBUGGER").is_some() {
        eprintln!("{ctx}");
    }
    // LLDB picked its intel-pt plug-in from jLLDBTraceSupported and started process tracing.
    assert!(packets.contains("jLLDBTraceStart:"), "{ctx}");
    assert!(stdout.contains("Trace technology: intel-pt"), "{ctx}");
    // It fetched our CPU description and trace, and decoded without errors.
    assert!(packets.contains(r#""kind":"procfsCpuInfo""#), "{ctx}");
    assert!(packets.contains(r#""kind":"iptTrace""#), "{ctx}");
    assert!(stdout.contains("Number of individual errors: 0"), "{ctx}");
    // `thread trace dump instructions -f`: "    N: 0xADDR    mnemonic operands" (oldest first).
    let insns: Vec<(u64, String)> = stdout
        .lines()
        .filter_map(|l| {
            let (idx, rest) = l.trim().split_once(": 0x")?;
            idx.parse::<u64>().ok()?;
            let mut f = rest.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            Some((addr, f.next()?.to_string()))
        })
        .collect();
    let mnemonics: Vec<&str> = insns.iter().map(|(_, m)| m.as_str()).collect();
    // LLDB prints AT&T mnemonics with size suffixes.
    assert_eq!(
        mnemonics,
        [
            "nop", "callq", "movl", "retq", "movl", "testl", "je", "addl"
        ],
        "{ctx}"
    );
    assert_eq!(insns[0].0, start, "{ctx}");
    assert_eq!(insns[2].0, symbol(&exe, "bt_leaf"), "{ctx}");
    assert_eq!(insns[7].0 + 3, stop, "{ctx}");
    // Function calls: bt_start calls bt_leaf, then continues in bt_start.
    // (Item numbers are not checked: a TSC packet, as the software encoder emits after PSB,
    // is an item of its own in LLDB's numbering.)
    let tree: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("bt`") && l.contains(" to <"))
        .map(|l| l.split("  [").next().unwrap_or(l).trim())
        .collect();
    assert_eq!(
        tree,
        [
            "bt`bt_start to <+1>",
            "bt`bt_leaf to <+5>",
            "bt`bt_start + 6 to <+15>"
        ],
        "{ctx}"
    );
}

/// The CPU reported for software traces must be one the installed libipt knows (GDB and LLDB
/// refuse to decode otherwise) and must enable no erratum workaround except APL11, which only
/// acts after an OVF packet (see `PtCpu::SOFTWARE`). Asks libipt itself through a tiny C
/// program, so the check follows the libipt that GDB and LLDB load.
#[test]
fn software_cpu_is_known_to_libipt_with_only_apl11() {
    if !have("gcc") || !Path::new("/usr/include/intel-pt.h").exists() {
        eprintln!("SKIPPED: gcc or libipt headers not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cpu = PtCpu::SOFTWARE;
    let src = format!(
        "#include <intel-pt.h>\n#include <stdio.h>\n\
         int main(void) {{ struct pt_cpu c = {{ pcv_intel, {}, {}, {} }}; struct pt_errata e;\n\
         int r = pt_cpu_errata(&e, &c);\n\
         printf(\"%d %d%d%d%d%d%d%d%d%d\\n\", r, e.bdm70, e.bdm64, e.skd007, e.skd022, e.skd010,\n\
         e.skl014, e.apl12, e.apl11, e.skl168); return 0; }}\n",
        cpu.family, cpu.model, cpu.stepping
    );
    let exe = compile_source("gcc", dir.path(), "errata", &src, &[], &["-lipt"]);
    let out = Command::new(&exe).output().unwrap();
    // Status 0 (known CPU); bits: bdm70 bdm64 skd007 skd022 skd010 skl014 apl12 apl11 skl168.
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0 000000010");
}

// ---- GDB's own `record btrace pt` against a live `ptrewind record` session ----

/// Runs `ptrewind record -- exe` and GDB in batch mode against it with `commands`; returns
/// GDB's output (stdout then stderr) and the server's stderr.
fn gdb_against_record(exe: &Path, commands: &[&str]) -> (String, String) {
    use std::process::Stdio;
    let mut server = Server::start(exe, &[]);
    let port = server.port;
    let mut cmd = gdb_batch();
    cmd.arg("-ex")
        .arg(format!("target remote 127.0.0.1:{port}"));
    for c in commands {
        cmd.arg("-ex").arg(c);
    }
    // One file for both streams keeps GDB's stdout (echo) and stderr (monitor output in batch
    // mode) in the order GDB wrote them.
    let log_path = exe.with_extension(format!("gdb-{port}.log"));
    let log = std::fs::File::create(&log_path).expect("create gdb log");
    let status = cmd
        .arg(exe)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup gdb log"))
        .stderr(log)
        .status()
        .expect("gdb runs");
    // GDB kills the process when it exits; the server then ends by itself.
    let _ = wait_until(&mut server.child, Instant::now() + Duration::from_secs(20));
    let server_log = server.stderr.join().unwrap();
    let gdb = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    assert!(
        status.success(),
        "gdb failed: {status}\n{gdb}\n{server_log}"
    );
    if std::env::var_os("PTREWIND_SHOW_DEBUGGER").is_some() {
        eprintln!("--- gdb:\n{gdb}\n--- server:\n{server_log}");
    }
    (gdb, server_log)
}

/// The instruction position `monitor where` printed after the line tagged `tag` (GDB echoes
/// the `echo TAG\n` command output just before the monitor output).
fn present_after(text: &str, tag: &str) -> u64 {
    let mut it = text.lines().skip_while(|l| l.trim() != tag);
    it.next();
    let line = it.next().unwrap_or_default();
    // "at the present: instruction N of N (live), ..."
    line.strip_prefix("at the present: instruction ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no 'monitor where' line after {tag}:\n{text}"))
}

#[test]
fn gdb_record_btrace_pt_on_a_live_recording_equals_ptrewinds_history() {
    if !gdb_ready() {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("btrace-live");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let exe = dir.join("recursion");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/c/recursion.c");
    let out = Command::new("gcc")
        .args(["-g", "-O0", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("gcc");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (gdb, server) = gdb_against_record(
        &exe,
        &[
            "break main",
            "continue",
            // Before `record btrace pt`, GDB must not be recording by itself.
            "info record",
            "echo BEFORE\\n",
            "monitor where",
            "record btrace pt",
            "next",
            "next",
            "info record",
            "echo AFTER\\n",
            "monitor where",
            "set record instruction-history-size unlimited",
            "set record function-call-history-size unlimited",
            "echo INSNS\\n",
            "record instruction-history",
            "echo CALLS\\n",
            "record function-call-history",
            "echo OURS\\n",
            "monitor insns 0 end",
            "echo END\\n",
        ],
    );
    let dump = || format!("--- gdb:\n{gdb}\n--- server:\n{server}");
    assert!(
        gdb.contains("No recording is currently active."),
        "{}",
        dump()
    );
    let from = present_after(&gdb, "BEFORE");
    let to = present_after(&gdb, "AFTER");
    assert!(
        to > from + 100,
        "two `next`s over calls ran {from}..{to}\n{}",
        dump()
    );

    // GDB decoded the whole span with its own libipt, without gaps or errors.
    let span = to - from;
    assert!(
        gdb.contains(&format!("Recorded {span} instructions in ")),
        "{}",
        dump()
    );
    assert!(gdb.contains("(0 gaps)"), "{}", dump());
    for bad in [
        "decode error",
        "Non-contiguous",
        "overflow",
        "warning: Decode",
    ] {
        assert!(!gdb.contains(bad), "GDB reported {bad:?}\n{}", dump());
    }

    // The addresses GDB lists are exactly ptrewind's own history for the same span.
    let section = |a: &str, b: &str| -> Vec<String> {
        gdb.lines()
            .skip_while(|l| l.trim() != a)
            .skip(1)
            .take_while(|l| l.trim() != b)
            .map(str::to_string)
            .collect()
    };
    let gdb_addrs: Vec<u64> = section("INSNS", "CALLS")
        .iter()
        .filter_map(|l| {
            let (_, rest) = l.split_once('\t')?;
            let hex = rest.trim().strip_prefix("0x")?.split_whitespace().next()?;
            u64::from_str_radix(hex.trim_end_matches(':'), 16).ok()
        })
        .collect();
    assert_eq!(gdb_addrs.len() as u64, span, "{}", dump());

    // `N 0xADDR` lines; recording started at `main`, so 0..end covers the span.
    let own: Vec<u64> = section("OURS", "END")
        .iter()
        .filter_map(|l| {
            let (n, hex) = l.trim().split_once(" 0x")?;
            let n: u64 = n.parse().ok()?;
            (from..to)
                .contains(&n)
                .then(|| u64::from_str_radix(hex, 16).ok())?
        })
        .collect();
    assert_eq!(gdb_addrs, own, "{}", dump());

    // The first instruction is the one at the `main` breakpoint, where btrace was enabled.
    let bp = gdb
        .lines()
        .find_map(|l| l.strip_prefix("Breakpoint 1 at 0x"))
        .and_then(|r| u64::from_str_radix(r.split(':').next()?, 16).ok())
        .unwrap_or_else(|| panic!("no breakpoint address\n{}", dump()));
    assert_eq!(gdb_addrs.first(), Some(&bp), "{}", dump());

    // The function-call history names the recursive functions.
    let calls = section("CALLS", "END").join("\n");
    for f in ["factorial", "is_even", "is_odd", "main"] {
        assert!(
            calls.contains(f),
            "{f} missing from the call history\n{}",
            dump()
        );
    }
    let factorials = calls.lines().filter(|l| l.ends_with("\tfactorial")).count();
    assert!(factorials >= 10, "factorial(10) recurses 10 deep:\n{calls}");
}
