//! Reverse execution in real GDB (batch mode) against `ptrewind record` (software backend):
//! reverse-stepi against the PCs GDB printed while stepping forward, reverse-continue to the
//! right dynamic instance of a breakpoint, reverse-next/finish/step onto the source lines named
//! by marker comments in the C examples, past variable values computed from the program's
//! data, and the recording's own consistency check. Nothing expected here is copied from our
//! own output.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

mod support;

use support::cbuild::{build_example, compile_source, line_of, nm_symbol};
use support::gdb::{
    GdbRun, Server, gdb_session, gdb_session_interrupting, marker_older_than, ptrewind,
    range_steps, run_until,
};

const TIMEOUT: Duration = Duration::from_secs(90);

/// Compiles the examples this file needs once per test run (`cc -g -O0`).
fn examples() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reverse-examples");
        std::fs::create_dir_all(&dir).unwrap();
        for p in ["crash", "recursion", "signal", "range_step"] {
            build_example(&dir, p, &[]);
        }
        dir
    })
}

fn example(name: &str) -> PathBuf {
    examples().join(name)
}

/// One GDB session's output (GDB's, then the server's stderr).
type Run = GdbRun;

/// Starts `ptrewind record --listen 127.0.0.1:0 EXTRA -- program` (`--backend ptrace` unless
/// EXTRA names one).
fn record(extra: &[&str], program: &Path) -> Server {
    let backend: &[&str] = if extra.contains(&"--backend") {
        &[]
    } else {
        &["--backend", "ptrace"]
    };
    Server::spawn(
        ptrewind()
            .args(["record", "--listen", "127.0.0.1:0"])
            .args(backend)
            .args(extra)
            .arg("--")
            .arg(program),
    )
}

/// Runs GDB in batch mode against `ptrewind record -- program` with `commands`.
fn gdb(program: &str, commands: &[&str]) -> Run {
    let program = example(program);
    gdb_session(record(&[], &program), &program, commands, TIMEOUT)
}

/// The source line numbers GDB printed as the current line (`NN\t...`) in `gdb`, in order.
fn lines_shown(gdb: &str) -> Vec<usize> {
    gdb.lines()
        .filter_map(|l| {
            let (num, _) = l.split_once('\t')?;
            num.trim().parse().ok()
        })
        .collect()
}

#[test]
fn reverse_stepi_retraces_forward_pcs() {
    const N: usize = 60;
    let mut cmds: Vec<String> = vec!["break factorial".into(), "continue".into()];
    cmds.push(r#"printf "FWD %lx\n", $pc"#.into());
    for _ in 0..N {
        cmds.push("stepi".into());
        cmds.push(r#"printf "FWD %lx\n", $pc"#.into());
    }
    for _ in 0..N {
        cmds.push("reverse-stepi".into());
        cmds.push(r#"printf "REV %lx\n", $pc"#.into());
    }
    // One more than recorded since the breakpoint would be... still in history: the
    // instructions of main before the first factorial call were recorded too.
    let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
    let r = gdb("recursion", &refs);
    let fwd = r.tagged("FWD");
    let rev = r.tagged("REV");
    assert_eq!(fwd.len(), N + 1, "{}", r.dump());
    assert_eq!(rev.len(), N, "{}", r.dump());
    // The N stepis went through calls into deeper factorial instances and back: the PCs must
    // not be a trivial straight line.
    let distinct: std::collections::BTreeSet<&String> = fwd.iter().collect();
    assert!(distinct.len() > 10, "{}", r.dump());
    let mut expected: Vec<String> = fwd[..N].to_vec();
    expected.reverse();
    assert_eq!(rev, expected, "{}", r.dump());
}

#[test]
fn reverse_continue_stops_at_previous_dynamic_instance() {
    // factorial(10) recurses with n = 10, 9, 8, ...: the k-th hit of a breakpoint in it has
    // n = 11 - k.
    const K: usize = 5;
    let mut cmds: Vec<String> = vec!["break factorial".into()];
    for _ in 0..K {
        cmds.push("continue".into());
    }
    cmds.push(r#"printf "LIVE %d\n", n"#.into());
    cmds.push("reverse-continue".into());
    cmds.push(r#"printf "BACK1 %d\n", n"#.into());
    cmds.push("reverse-continue".into());
    cmds.push(r#"printf "BACK2 %d\n", n"#.into());
    // Forward again, in the replayed past: the next instance, then the present.
    cmds.push("continue".into());
    cmds.push(r#"printf "FWD1 %d\n", n"#.into());
    cmds.push("continue".into());
    cmds.push(r#"printf "FWD2 %d\n", n"#.into());
    let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
    let r = gdb("recursion", &refs);
    let n = |tag: &str| -> Vec<String> { r.tagged(tag) };
    assert_eq!(n("LIVE"), vec![(11 - K).to_string()], "{}", r.dump());
    assert_eq!(n("BACK1"), vec![(12 - K).to_string()], "{}", r.dump());
    assert_eq!(n("BACK2"), vec![(13 - K).to_string()], "{}", r.dump());
    assert_eq!(n("FWD1"), vec![(12 - K).to_string()], "{}", r.dump());
    // Replaying forward from there reaches instance K again (still in the history).
    assert_eq!(n("FWD2"), vec![(11 - K).to_string()], "{}", r.dump());
}

#[test]
fn reverse_finish_next_step_land_on_source_lines() {
    let call_line = line_of("crash.c", "return crash_here(p);");
    let p_line = line_of("crash.c", "int *p = NULL;");
    let fflush_line = line_of("crash.c", "fflush(stdout);");
    let printf_line = line_of("crash.c", "printf(\"total=%d\\n\", total);");
    let sum_end = line_of("crash.c", "return total;") + 1;
    let r = gdb(
        "crash",
        &[
            "continue",
            "echo MARK-FINISH\\n",
            "reverse-finish",
            "echo MARK-NEXT\\n",
            "reverse-next",
            "reverse-next",
            "reverse-next",
            "reverse-next",
            "echo MARK-STEP\\n",
            "reverse-step",
            "bt",
            "echo MARK-FWD\\n",
            "next",
            "next",
        ],
    );
    r.expect("Program received signal SIGSEGV");
    let after = |mark: &str| -> Vec<usize> {
        let i = r
            .gdb
            .find(mark)
            .unwrap_or_else(|| panic!("no {mark}\n{}", r.dump()));
        lines_shown(&r.gdb[i..])
    };
    // reverse-finish goes back to the call in main.
    assert_eq!(
        after("MARK-FINISH").first(),
        Some(&call_line),
        "{}",
        r.dump()
    );
    // reverse-finish stops in the middle of the call line, so the first reverse-next goes to
    // the start of that line; the next three show p = NULL, fflush, printf (stepping back over
    // the calls into libc).
    let nexts = after("MARK-NEXT");
    let shown: Vec<usize> = nexts
        .iter()
        .copied()
        .filter(|&l| l != call_line)
        .take(3)
        .collect();
    assert_eq!(
        shown,
        vec![p_line, fflush_line, printf_line],
        "{}",
        r.dump()
    );
    // reverse-step from the printf line steps back into sum_list's last line.
    assert_eq!(after("MARK-STEP").first(), Some(&sum_end), "{}", r.dump());
    r.expect("#0  sum_list (n=0x0)");
    // Forward again in the replayed past: next over sum_list returns to main's printf line.
    let fwd = after("MARK-FWD");
    assert!(fwd.contains(&printf_line), "{}", r.dump());
}

#[test]
fn from_the_crash_back_to_the_faulting_function_and_past_values() {
    let add_line = line_of("crash.c", "total += n->value;");
    let r = gdb(
        "crash",
        &[
            "continue",
            "break crash_here",
            "reverse-continue",
            r#"printf "P %lx\n", (unsigned long)p"#,
            &format!("break {add_line}"),
            "reverse-continue",
            r#"printf "TOTAL %d\n", total"#,
            r#"printf "VALUE %d\n", n->value"#,
            "reverse-continue",
            r#"printf "TOTAL %d\n", total"#,
            "monitor stats",
        ],
    );
    r.expect("Program received signal SIGSEGV");
    r.expect("Breakpoint 1, crash_here (p=0x0)");
    assert_eq!(r.tagged("P"), vec!["0"], "{}", r.dump());
    // The list is 1 -> 2 -> 3 (crash.c main): at the last visit of the += line, total holds
    // 1 + 2 and n->value is 3; one visit earlier total was 1. total ends up 6 (overwritten).
    assert_eq!(r.tagged("TOTAL"), vec!["3", "1"], "{}", r.dump());
    assert_eq!(r.tagged("VALUE"), vec!["3"], "{}", r.dump());
}

fn stat(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no {key:?} in stats:\n{text}"))
}

/// `monitor stats` reported a passing history check, and `monitor where` says GDB is replaying
/// the last of `history` instructions.
#[track_caller]
fn expect_checked_at_last(r: &Run, history: u64) {
    assert!(
        stat(&r.gdb, "history check").starts_with("ok"),
        "{}",
        r.dump()
    );
    r.expect(&format!(
        "replaying: instruction {} of {}",
        history - 1,
        history
    ));
}

#[test]
fn monitor_stats_history_matches_recording() {
    let r = gdb(
        "crash",
        &[
            "continue",
            "monitor stats",
            "reverse-stepi",
            "monitor where",
        ],
    );
    assert_eq!(stat(&r.gdb, "lost bytes"), "0", "{}", r.dump());
    let recorded: u64 = stat(&r.gdb, "recorded instructions").parse().unwrap();
    let history: u64 = stat(&r.gdb, "history instructions").parse().unwrap();
    assert!(recorded > 1000, "{}", r.dump());
    assert_eq!(recorded, history, "{}", r.dump());
    expect_checked_at_last(&r, history);
}

#[test]
fn backend_pt_fails_with_probe_message_and_auto_falls_back() {
    let probe = ptrewind::capture::perf::probe();
    let out = ptrewind()
        .args(["record", "--backend", "pt", "--", "/bin/true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    if let Err(why) = &probe {
        assert!(stderr.contains(&why.to_string()), "{stderr}");
        // auto: falls back, says why, and serves (we only wait for the listening line).
        let server = record(&["--backend", "auto"], &example("recursion"));
        let mut child = server.child;
        // (`auto` may pick QEMU: its temporary recording directory goes with a SIGTERM.)
        support::gdb::terminate(&mut child);
        let text = server.stderr.join().unwrap();
        // QEMU when it is installed, else the ptrace backend; either way saying which.
        assert!(
            text.contains("recording under QEMU")
                || text.contains("recording with the software backend"),
            "{text}"
        );
        assert!(text.contains(&why.to_string()), "{text}");
    }
}

#[test]
fn ptrewind_gdb_runs_gdb_with_the_pt_commands() {
    let program = example("recursion");
    let mut cmd = ptrewind();
    cmd.args(["gdb", "--backend", "ptrace", "--batch"])
        .args([
            "--ex",
            "break factorial",
            "--ex",
            "continue",
            "--ex",
            "continue",
        ])
        .args([
            "--ex",
            "continue",
            "--ex",
            "pt where",
            "--ex",
            "pt calls 10",
        ])
        .args([
            "--ex",
            "pt history 10",
            "--ex",
            "pt goto begin",
            "--ex",
            "pt where",
        ])
        .arg("--")
        .arg(&program);
    let run = run_until(&mut cmd, TIMEOUT);
    let text = format!("{}{}", run.stdout, run.stderr);
    assert!(run.status.is_some(), "ptrewind gdb timed out:\n{text}");
    // No warning at connection: the maps file comes through host I/O, the libraries are read
    // locally (`set sysroot`).
    for warning in [
        "unable to open /proc file",
        "from remote target",
        "can be slow",
    ] {
        assert!(!text.contains(warning), "{warning}\n{text}");
    }
    // Three hits of factorial: n = 10, 9, 8.
    assert!(text.contains("factorial (n=8)"), "{text}");
    // The call history: main, then factorial nested three deep (indented by two per level).
    let calls: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\tinst "))
        .map(|l| l.split('\t').nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        calls,
        vec!["main", "  factorial", "    factorial", "      factorial"],
        "{text}"
    );
    // The branch history names the call site in main and its source line.
    let call_line = line_of("recursion.c", "unsigned long f = factorial(10);");
    assert!(text.contains("-> 0x"), "{text}");
    assert!(text.contains("factorial at recursion.c:"), "{text}");
    let call_site = text
        .lines()
        .find(|l| l.contains(" main+") && l.ends_with(&format!("at recursion.c:{call_line}")));
    assert!(call_site.is_some(), "{text}");
    // goto begin: instruction 0 is main's first instruction.
    assert!(text.contains("replaying: instruction 0 of"), "{text}");
    assert!(text.contains("#0  main () at"), "{text}");
}

#[test]
fn software_watchpoint_reverse_continue_stops_at_the_last_write() {
    // GDB single-steps (forward and backward) and compares the value itself: every `bs` must
    // give the right past memory. total goes 0 -> 1 -> 3 -> 6 over the list 1 -> 2 -> 3.
    let r = gdb(
        "crash",
        &[
            "set can-use-hw-watchpoints 0",
            "break sum_list",
            "continue",
            "next",
            "watch total",
            "continue",
            "continue",
            "continue",
            "delete 1",
            r#"printf "LIVE %d\n", total"#,
            "reverse-continue",
            r#"printf "BACK %d\n", total"#,
            "reverse-continue",
            r#"printf "BACK %d\n", total"#,
        ],
    );
    assert_eq!(r.tagged("LIVE"), vec!["6"], "{}", r.dump());
    r.expect("Old value = 3\nNew value = 6");
    // Going back over `total += 3` the watchpoint triggers with the value before it.
    r.expect("Old value = 6\nNew value = 3");
    assert_eq!(r.tagged("BACK"), vec!["3", "1"], "{}", r.dump());
}

#[test]
fn monitor_save_writes_a_recording_that_decodes_to_the_history() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reverse-saved");
    let _ = std::fs::remove_dir_all(&dir);
    let r = gdb(
        "crash",
        &[
            "continue",
            &format!("monitor save {}", dir.display()),
            "monitor stats",
        ],
    );
    let recorded: u64 = stat(&r.gdb, "recorded instructions").parse().unwrap();
    let readme = std::fs::read_to_string(dir.join("README")).unwrap();
    let cmd = readme
        .lines()
        .find_map(|l| l.trim().strip_prefix("ptrewind "))
        .expect("README has the decode command");
    let args: Vec<&str> = cmd.split_whitespace().collect();
    let out = ptrewind().args(&args).arg("--stats").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let insns: u64 = text
        .split_whitespace()
        .skip_while(|w| *w != "insns")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no insns count in {text}"));
    assert_eq!(insns, recorded, "{text}\n{}", r.dump());
    assert!(text.contains("errors 0"), "{text}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    // Registers at the end are the crash point's: RIP inside crash_here, RAX/RDI... not
    // checked; the start is main's first instruction (recording starts at main).
    let start_rip = manifest["registers_at_start"]["rip"]
        .as_str()
        .unwrap()
        .to_string();
    let main_off = nm_symbol(&example("crash"), "main");
    let rip = u64::from_str_radix(start_rip.trim_start_matches("0x"), 16).unwrap();
    assert_eq!(
        rip & 0xfff,
        main_off & 0xfff,
        "start rip {start_rip}, main at {main_off:#x}"
    );
}

#[test]
fn record_off_gap_bounds_reverse_execution() {
    // factorial's k-th breakpoint hit has n = 11 - k. The second hit is reached untraced: its
    // registers and memory changes are unknown, so reverse execution stops where recording
    // resumed (at that hit) instead of showing a wrong past.
    let r = gdb(
        "recursion",
        &[
            "break factorial",
            "continue",
            "monitor record off",
            "continue",
            "monitor record on",
            "continue",
            r#"printf "LIVE %d\n", n"#,
            "reverse-continue",
            r#"printf "BACK %d\n", n"#,
            "reverse-continue",
            r#"printf "BACK %d\n", n"#,
            "monitor goto 0",
            "monitor stats",
        ],
    );
    assert_eq!(r.tagged("LIVE"), vec!["8"], "{}", r.dump());
    assert_eq!(r.tagged("BACK"), vec!["9", "9"], "{}", r.dump());
    r.expect("No more reverse-execution history.");
    r.expect("is before an untraced run");
    assert!(
        stat(&r.gdb, "history check").starts_with("ok"),
        "{}",
        r.dump()
    );
}

#[test]
fn reverse_continue_into_a_signal_handler_restores_its_frame() {
    let after_raise = line_of("signal.c", "printf(\"hits=%d\\n\", (int)hits);");
    let handler_line = line_of("signal.c", "/* HANDLER LINE */");
    let r = gdb(
        "signal",
        &[
            &format!("break {after_raise}"),
            "continue",
            "continue",
            r#"printf "LIVE %d\n", hits"#,
            "break on_usr1",
            "reverse-continue",
            r#"printf "BACK %d %d\n", hits, sig"#,
            "bt",
        ],
    );
    r.expect("Program received signal SIGUSR1");
    // The handler adds the signal number (SIGUSR1) once; before it ran, hits was 0.
    assert_eq!(
        r.tagged("LIVE"),
        vec![libc::SIGUSR1.to_string()],
        "{}",
        r.dump()
    );
    assert_eq!(
        r.tagged("BACK"),
        vec![format!("0 {}", libc::SIGUSR1)],
        "{}",
        r.dump()
    );
    r.expect(&format!("signal.c:{handler_line}"));
    // The signal frame the kernel wrote (and the stack under it) is rebuilt: GDB unwinds
    // through it back to main.
    r.expect("<signal handler called>");
    r.expect("in main () at ");
}

#[test]
fn ptrewind_gdb_does_not_hang_when_gdb_never_connects() {
    let run = run_until(
        ptrewind()
            .args(["gdb", "--backend", "ptrace", "--gdb", "/bin/false", "--"])
            .arg(example("recursion")),
        Duration::from_secs(30),
    );
    let text = run.stderr;
    let status = run
        .status
        .unwrap_or_else(|| panic!("ptrewind gdb hung:\n{text}"));
    // /bin/false's status is passed on.
    assert_eq!(status.code(), Some(1), "{text}");
}

// --- Background indexing of a live recording (pipeline) ---

/// A loop of about 250 000 instructions, compiled next to the other examples.
fn long_loop_example() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = examples();
        compile_source(
            "cc",
            dir,
            "long_loop",
            "volatile long sink;\n\
             static long f0(long x) { return x + 1; }\n\
             static long f1(long x) { return x ^ 3; }\n\
             long (*tab[2])(long) = { f0, f1 };\n\
             void done(long v) { sink = v; }\n\
             int main(void) {\n\
             \x20 long sum = 0;\n\
             \x20 for (long i = 0; i < 12000; i++) sum = tab[(i ^ (i >> 2)) & 1](sum + i);\n\
             \x20 done(sum);\n\
             \x20 return 0;\n\
             }\n",
            &["-g", "-O0"],
            &[],
        );
    });
    "long_loop"
}

#[test]
fn history_is_indexed_in_the_background_while_the_target_runs() {
    let r = gdb(
        long_loop_example(),
        &[
            "break done",
            "continue",
            "monitor stats",
            "reverse-stepi",
            "monitor where",
        ],
    );
    let num = |key: &str| -> u64 {
        let v = stat(&r.gdb, key);
        v.split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{key}: {v:?}\n{}", r.dump()))
    };
    let recorded = num("recorded instructions");
    assert!(recorded > 150_000, "{}", r.dump());
    // The worker applied updates while the loop ran (a stop-time index of this trace is one
    // update), and had indexed part of the trace before the stop asked for anything.
    assert!(num("index updates") > 1, "{}", r.dump());
    let early = num("indexed at last stop");
    assert!(early > 0 && early <= recorded, "{}", r.dump());
    assert!(num("sync points (PSB)") > 1, "{}", r.dump());
    assert_eq!(num("decode lag (bytes)"), 0, "{}", r.dump());
    assert_eq!(num("history instructions"), recorded, "{}", r.dump());
    assert_eq!(num("lost bytes"), 0, "{}", r.dump());
    expect_checked_at_last(&r, recorded);
}

// ---- Vector/x87 registers at past positions (branch `pastregs`) ----

/// `examples/c/avx.c` built with `-mavx` (once per test run).
fn avx_example() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reverse-examples-avx");
        std::fs::create_dir_all(&dir).unwrap();
        build_example(&dir, "avx", &["-mavx"])
    })
}

/// Like [`gdb`], for the AVX example, with `env` set for the ptrewind server only.
fn gdb_avx(env: &[(&str, &str)], commands: &[String]) -> Run {
    let program = avx_example();
    let server = Server::spawn(
        ptrewind()
            .args([
                "record",
                "--backend",
                "ptrace",
                "--listen",
                "127.0.0.1:0",
                "--",
            ])
            .arg(program)
            .envs(env.iter().copied()),
    );
    gdb_session(server, program, commands, TIMEOUT)
}

/// GDB commands printing one `TAG:<pc> <ymm0 as 8 ints> <xmm1 as 4 ints> <mxcsr>` line.
fn print_vector_state(cmds: &mut Vec<String>, tag: &str) {
    cmds.push(format!("echo {tag}:"));
    cmds.push("output/x $pc".into());
    cmds.push("echo \\040".into());
    cmds.push("output $ymm0.v8_int32".into());
    cmds.push("echo \\040".into());
    cmds.push("output $xmm1.v4_int32".into());
    cmds.push("echo \\040".into());
    cmds.push("output $mxcsr".into());
    cmds.push("echo \\n".into());
}

fn tagged_lines(run: &Run, tag: &str) -> Vec<String> {
    let prefix = format!("{tag}:");
    run.gdb
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .collect()
}

#[test]
fn reverse_stepi_over_avx_restores_past_ymm_values() {
    // Stop in the second iteration of the AVX loop (acc is non-zero), step forward across
    // more than one iteration while ymm0/xmm1 change, then step back: every past position
    // must show exactly the vector values GDB printed there on the way forward.
    const N: usize = 40;
    let avx_line = line_of("avx.c", "/* AVX LINE */");
    let mut cmds: Vec<String> = vec![
        format!("break {avx_line}"),
        "continue".into(),
        "continue".into(),
    ];
    print_vector_state(&mut cmds, "FWD");
    for _ in 0..N {
        cmds.push("stepi".into());
        print_vector_state(&mut cmds, "FWD");
    }
    for _ in 0..N {
        cmds.push("reverse-stepi".into());
        print_vector_state(&mut cmds, "REV");
    }
    cmds.push("info registers xmm0".into());
    let r = gdb_avx(&[], &cmds);
    let fwd = tagged_lines(&r, "FWD");
    let rev = tagged_lines(&r, "REV");
    assert_eq!(fwd.len(), N + 1, "{}", r.dump());
    assert_eq!(rev.len(), N, "{}", r.dump());
    // The test can only fail if the vector state actually changed along the way.
    let ymm: std::collections::BTreeSet<&str> = fwd
        .iter()
        .map(|l| l.split_once(' ').map_or("", |(_, rest)| rest))
        .collect();
    assert!(ymm.len() >= 3, "vector state did not change:\n{}", r.dump());
    assert!(!r.gdb.contains("<unavailable>"), "{}", r.dump());
    let mut expected = fwd[..N].to_vec();
    expected.reverse();
    assert_eq!(rev, expected, "{}", r.dump());
    r.expect("xmm0");
}

#[test]
fn vector_state_the_log_does_not_cover_is_unavailable() {
    // The diagnostic knob makes the state log keep no vector snapshots (as if the XSAVE image
    // could not be read): past vector registers must then be `<unavailable>`, never the
    // present values, while the general-purpose registers the log does cover stay readable.
    let avx_line = line_of("avx.c", "/* AVX LINE */");
    let mut cmds: Vec<String> = vec![
        format!("break {avx_line}"),
        "continue".into(),
        "continue".into(),
    ];
    for _ in 0..12 {
        cmds.push("stepi".into());
    }
    print_vector_state(&mut cmds, "PRESENT");
    for _ in 0..10 {
        cmds.push("reverse-stepi".into());
    }
    cmds.push("p $ymm0.v8_int32".into());
    cmds.push("info registers xmm1".into());
    cmds.push(r#"printf "RSP %lx\n", $rsp"#.into());
    cmds.push(r#"printf "PC %lx\n", $pc"#.into());
    let r = gdb_avx(&[("PTREWIND_STATE_LOG_NO_VECTOR", "1")], &cmds);
    let present = tagged_lines(&r, "PRESENT");
    assert_eq!(present.len(), 1, "{}", r.dump());
    assert!(!present[0].contains("unavailable"), "{}", r.dump());
    r.expect("= <unavailable>");
    assert!(
        r.gdb
            .lines()
            .any(|l| l.starts_with("xmm1") && l.contains("<unavailable>")),
        "{}",
        r.dump()
    );
    assert_eq!(r.tagged("RSP").len(), 1, "{}", r.dump());
    assert_eq!(r.tagged("PC").len(), 1, "{}", r.dump());
}

/// `ptrewind attach` records from the attach point (where the process usually sits inside
/// `usleep`'s interrupted `clock_nanosleep`, which the kernel restarts): reverse execution goes
/// back to an earlier `tick`, the history check passes, and `detach` leaves the process running.
#[test]
fn attach_records_from_the_attach_point_and_detaches() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reverse-attach");
    std::fs::create_dir_all(&dir).unwrap();
    let program = build_example(&dir, "attachme", &[]);
    let mut victim = std::process::Command::new(&program)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = victim.id();
    std::thread::sleep(Duration::from_millis(100));
    let server =
        Server::spawn(ptrewind().args(["attach", "--listen", "127.0.0.1:0", &pid.to_string()]));
    let r = gdb_session(
        server,
        &program,
        &[
            "break tick",
            "continue",
            "printf \"COUNTER %d\\n\", counter",
            "continue",
            "printf \"COUNTER %d\\n\", counter",
            "reverse-continue",
            "printf \"COUNTER %d\\n\", counter",
            "monitor stats",
            "detach",
        ],
        TIMEOUT,
    );
    std::thread::sleep(Duration::from_millis(100));
    let alive = victim.try_wait().unwrap().is_none();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let _ = victim.kill();
    let _ = victim.wait();
    let counters: Vec<i64> = r
        .tagged("COUNTER")
        .iter()
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(counters.len(), 3, "{}", r.dump());
    let k = counters[0];
    assert_eq!(counters, vec![k, k + 1, k], "{}", r.dump());
    assert!(
        stat(&r.gdb, "history check").starts_with("ok"),
        "{}",
        r.dump()
    );
    assert!(!r.gdb.contains("ERROR"), "{}", r.dump());
    r.expect(&format!("process {pid}) detached"));
    assert!(r.server.contains("detached from process"), "{}", r.server);
    assert!(alive, "the attached process died\n{}", r.dump());
    assert!(status.contains("TracerPid:\t0\n"), "{status}");
}

/// Attach, set a write watchpoint at once, run to `tick`, then reverse-continue: no write to
/// the counter was recorded before, so GDB meets the start of the history with its usual
/// message. The first recorded instruction is the kernel's `restart_syscall` of the
/// `clock_nanosleep` the attach interrupted; the state log knows it writes what
/// `clock_nanosleep` writes (before, the search stopped there with a SIGTRAP: "system call
/// 219 ... not all recorded").
#[test]
fn attach_watch_reverse_continue_reaches_the_start_of_history() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reverse-attach-watch");
    std::fs::create_dir_all(&dir).unwrap();
    let program = build_example(&dir, "attachme", &[]);
    let mut victim = std::process::Command::new(&program)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = victim.id();
    std::thread::sleep(Duration::from_millis(100));
    let server =
        Server::spawn(ptrewind().args(["attach", "--listen", "127.0.0.1:0", &pid.to_string()]));
    let r = gdb_session(
        server,
        &program,
        &[
            "watch counter",
            "break tick",
            "continue",
            "echo REVERSE\\n",
            "reverse-continue",
            "monitor where",
            "detach",
        ],
        TIMEOUT,
    );
    let _ = victim.kill();
    let _ = victim.wait();
    let after = r.after("REVERSE");
    assert!(
        after.contains("No more reverse-execution history."),
        "{}",
        r.dump()
    );
    assert!(!after.contains("SIGTRAP"), "{}", r.dump());
    assert!(!r.gdb.contains("not all recorded"), "{}", r.dump());
    assert!(r.gdb.contains("instruction 0 of"), "{}", r.dump());
}

// ---- Native write watchpoints (Z2) from the state log ----

/// `examples/c/watch.c` (once per test run).
fn watch_example() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build_example(examples(), "watch", &[]))
}

/// The values `total` takes in `examples/c/watch.c`, from its statements (W1..W4): `= 1`,
/// `+= 10`, `*= 3`, `-= 4`, starting from 0.
fn watch_totals() -> Vec<i64> {
    let mut v = vec![0i64];
    for op in [|_: i64| 1, |t| t + 10, |t| t * 3, |t| t - 4] {
        let last = *v.last().unwrap();
        v.push(op(last));
    }
    v
}

/// Every watchpoint report GDB printed: (old value, new value, source line shown after it).
fn watch_reports(gdb: &str) -> Vec<(String, String, usize)> {
    let lines: Vec<&str> = gdb.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(old) = l.strip_prefix("Old value = ") else {
            continue;
        };
        let Some(new) = lines
            .get(i + 1)
            .and_then(|l| l.strip_prefix("New value = "))
        else {
            continue;
        };
        let line = lines[i + 2..]
            .iter()
            .take(3)
            .find_map(|l| l.split_once('\t')?.0.trim().parse().ok())
            .unwrap_or(0);
        out.push((old.to_string(), new.to_string(), line));
    }
    out
}

fn gdb_watch(extra: &[&str], commands: &[&str]) -> Run {
    let program = watch_example();
    gdb_session(record(extra, program), program, commands, TIMEOUT)
}

#[test]
fn native_watchpoint_reverse_continue_stops_before_each_write() {
    // Default GDB settings: `watch` makes a hardware watchpoint (Z2), served natively.
    let w: Vec<usize> = ["/* W1 */", "/* W2 */", "/* W3 */", "/* W4 */"]
        .iter()
        .map(|m| line_of("watch.c", m))
        .collect();
    let done_call = line_of("watch.c", "    done();");
    let r = gdb_watch(
        &[],
        &[
            "break done",
            "continue",
            "watch total",
            "reverse-continue",
            "reverse-continue",
            "reverse-continue",
            "reverse-continue",
            r#"printf "BACK %ld\n", total"#,
            "reverse-continue",
            "continue",
            "continue",
            "continue",
            "continue",
            r#"printf "FWD %ld\n", total"#,
            // Single instructions over the write report it too, both ways.
            "reverse-stepi",
            "stepi",
        ],
    );
    let t = watch_totals();
    let reports = watch_reports(&r.gdb);
    assert_eq!(reports.len(), 10, "{}", r.dump());
    // Backward: each write is found, the state shown is the one before it (GDB's "new" value
    // is the older one), and the line shown is the write's own.
    for (k, (old, new, line)) in reports.iter().take(4).enumerate() {
        let i = 4 - k;
        assert_eq!(
            (old.as_str(), new.as_str(), *line),
            (
                t[i].to_string().as_str(),
                t[i - 1].to_string().as_str(),
                w[i - 1]
            ),
            "reverse stop {k}\n{}",
            r.dump()
        );
    }
    assert_eq!(r.tagged("BACK"), vec![t[0].to_string()], "{}", r.dump());
    r.expect("No more reverse-execution history.");
    // Forward replay in the past: stops after each write, on the statement that follows it.
    let next = [w[1], w[2], w[3], done_call];
    for (k, (old, new, line)) in reports.iter().skip(4).take(4).enumerate() {
        assert_eq!(
            (old.as_str(), new.as_str()),
            (t[k].to_string().as_str(), t[k + 1].to_string().as_str()),
            "forward stop {k}\n{}",
            r.dump()
        );
        assert!(
            *line > w[k] && *line <= next[k],
            "forward stop {k}\n{}",
            r.dump()
        );
    }
    assert_eq!(r.tagged("FWD"), vec![t[4].to_string()], "{}", r.dump());
    let (s3, s4) = (t[3].to_string(), t[4].to_string());
    assert_eq!(
        reports[8],
        (s4.clone(), s3.clone(), w[3]),
        "reverse-stepi\n{}",
        r.dump()
    );
    assert_eq!((&reports[9].0, &reports[9].1), (&s3, &s4), "{}", r.dump());
    assert!(!r.gdb.contains("Could not insert"), "{}", r.dump());
}

#[test]
fn native_watchpoint_live_and_a_buffer_written_by_read() {
    let t = watch_totals();
    let r = gdb_watch(
        &[],
        &[
            "break main",
            "continue",
            "watch total",
            "continue",
            "continue",
            "watch buf[1]",
            "continue",
            "continue",
            r#"printf "LIVE %d\n", 'watch.c'::buf[1]"#,
            "continue",
            "reverse-continue",
            "reverse-continue",
            r#"printf "PAST %d\n", 'watch.c'::buf[1]"#,
            "x/i $pc",
            "delete",
            "rwatch total",
            "reverse-continue",
        ],
    );
    let reports = watch_reports(&r.gdb);
    let values: Vec<(String, String)> = reports
        .iter()
        .map(|(o, n, _)| (o.clone(), n.clone()))
        .collect();
    let e = i32::from(b"hello"[1]);
    let pair = |a: String, b: String| (a, b);
    assert_eq!(
        values,
        vec![
            // Live: total = 1, total += 10, total *= 3, then read() fills buf, total -= 4.
            pair(t[0].to_string(), t[1].to_string()),
            pair(t[1].to_string(), t[2].to_string()),
            pair(t[2].to_string(), t[3].to_string()),
            pair("0 '\\000'".into(), format!("{e} 'e'")),
            pair(t[3].to_string(), t[4].to_string()),
            // Back over total -= 4, then to the read system call that wrote buf.
            pair(t[4].to_string(), t[3].to_string()),
            pair(format!("{e} 'e'"), "0 '\\000'".into()),
        ],
        "{}",
        r.dump()
    );
    assert_eq!(r.tagged("LIVE"), vec![e.to_string()], "{}", r.dump());
    assert_eq!(r.tagged("PAST"), vec!["0"], "{}", r.dump());
    // The write is the read system call itself.
    assert!(
        r.gdb
            .lines()
            .any(|l| l.starts_with("=> ") && l.contains("syscall")),
        "{}",
        r.dump()
    );
    // Read watchpoints are not recorded: refused, not silently never triggered.
    r.expect("Could not insert hardware watchpoint");
}

#[test]
fn native_watchpoint_is_refused_without_a_state_log() {
    // PC-only: what an instruction wrote is not known, so Z2 is refused and GDB says so; the
    // session goes on.
    let r = gdb_watch(
        &["--state-log", "off"],
        &[
            "break done",
            "continue",
            "watch total",
            "reverse-continue",
            "delete 2",
            "reverse-continue",
            "info registers rip",
        ],
    );
    r.expect("Could not insert hardware watchpoint 2.");
    assert!(!r.gdb.contains("Old value"), "{}", r.dump());
    r.expect("No more reverse-execution history.");
    r.expect("rip");
}

#[test]
fn native_watchpoint_stops_at_a_system_call_whose_writes_are_unknown() {
    // sysinfo(2) is not in the state log's list of system calls with known output buffers: it
    // may have written `total` (it did not, but the log cannot tell), so reverse-continue must
    // stop there and say why rather than pass it.
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let program = BUILT.get_or_init(|| {
        compile_source(
            "cc",
            examples(),
            "watch_unknown",
            "#include <sys/sysinfo.h>\n\
             long total;\n\
             struct sysinfo si;\n\
             int main(void) {\n\
             \x20 total = 5;\n\
             \x20 sysinfo(&si);\n\
             \x20 total = 7;\n\
             \x20 return 0; /* END */\n\
             }\n",
            &["-g", "-O0"],
            &[],
        )
    });
    let r = gdb_session(
        record(&[], program),
        program,
        &[
            "break 8",
            "continue",
            "watch total",
            "reverse-continue",
            "reverse-continue",
            "x/i $pc",
            "reverse-continue",
            r#"printf "BACK %ld\n", total"#,
            // Forward in the past: after total = 5, then the system call again.
            "continue",
            "continue",
            "x/i $pc",
        ],
        TIMEOUT,
    );
    let reports = watch_reports(&r.gdb);
    let values: Vec<(&str, &str, usize)> = reports
        .iter()
        .map(|(o, n, l)| (o.as_str(), n.as_str(), *l))
        .collect();
    assert_eq!(
        values,
        vec![("7", "5", 7), ("5", "0", 5), ("0", "5", 6)],
        "{}",
        r.dump()
    );
    let notices = r
        .gdb
        .matches("its memory writes are not all recorded (system call 99")
        .count();
    assert_eq!(notices, 2, "{}", r.dump());
    assert_eq!(
        r.gdb.matches("Program received signal SIGTRAP").count(),
        2,
        "{}",
        r.dump()
    );
    assert!(
        r.gdb
            .lines()
            .any(|l| l.starts_with("=> ") && l.contains("syscall")),
        "{}",
        r.dump()
    );
    assert_eq!(r.tagged("BACK"), vec!["0"], "{}", r.dump());
}

// --- Ctrl-C while the recorded program blocks in a system call ---

/// Sleeps in `clock_nanosleep` for 3 s between two writes.
const NAP_C: &str = "#include <stdio.h>\n\
                     #include <unistd.h>\n\
                     volatile int before, after;\n\
                     int main(void) {\n\
                     \x20 before = 1;\n\
                     \x20 sleep(3);\n\
                     \x20 after = 1; /* AFTER LINE */\n\
                     \x20 printf(\"woke after=%d\\n\", after);\n\
                     \x20 return 0;\n\
                     }\n";

fn nap_example() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        compile_source("cc", examples(), "nap", NAP_C, &["-g", "-O0"], &[]);
    });
    "nap"
}

/// GDB's Ctrl-C (`\x03`) reaches a recorded program that is blocked inside a system call while
/// the recorder single-steps it: the stop is reported as SIGINT inside the sleep, the history up
/// to there is complete and can be walked backwards, and continuing restarts the interrupted
/// sleep, which then finishes normally under recording.
#[test]
fn ctrl_c_during_a_blocking_system_call_stops_and_resumes() {
    let program = example(nap_example());
    let server = record(&[], &program);
    let pid = server.pid;
    // Interrupt once the tracee sits in clock_nanosleep (x86-64 syscall 230), seen from /proc.
    let in_sleep = move || {
        std::fs::read_to_string(format!("/proc/{pid}/syscall"))
            .map(|s| s.starts_with("230 "))
            .unwrap_or(false)
    };
    let after_line = 1 + NAP_C
        .lines()
        .position(|l| l.contains("/* AFTER LINE */"))
        .expect("marker");
    let r = gdb_session_interrupting(
        server,
        &program,
        &[
            "continue",
            "bt",
            "monitor stats",
            "reverse-stepi",
            "reverse-stepi",
            "print before",
            &format!("break nap.c:{after_line}"),
            "continue",
            "continue",
            "print after",
            // To the end of the program (it stays there), then let it exit.
            "continue",
            "continue",
        ],
        TIMEOUT,
        in_sleep,
    );
    let sigint = r.pos("Program received signal SIGINT");
    let nanosleep = r.pos("clock_nanosleep");
    assert!(nanosleep > sigint, "{}", r.dump());
    r.expect("in main () at ");
    // The recorded history ends exactly at the interrupted instruction.
    assert!(
        stat(&r.gdb, "history check").starts_with("ok"),
        "{}",
        r.dump()
    );
    r.expect("$1 = 1");
    // Forward: replay to the present (end of history), then live through the restarted sleep
    // to the breakpoint after it.
    r.expect("No more reverse-execution history.");
    let bp = r.pos(&format!("nap.c:{after_line}"));
    assert!(bp > sigint, "{}", r.dump());
    r.expect("$2 = 0");
    r.expect("exited normally");
    assert!(r.program_stdout.contains("woke after=1"), "{}", r.dump());
}

/// By default (stop at exit) the end of the program is a place in the history: a program that
/// exits normally stays stopped at its exit, where GDB can step and continue backwards and the
/// monitor commands work; only a further continue lets it exit.
#[test]
fn a_program_that_exits_stays_at_its_end_for_reverse_execution() {
    let saved = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("saved-at-exit");
    let _ = std::fs::remove_dir_all(&saved);
    let save = format!("monitor save {}", saved.display());
    let cmds = [
        "break factorial",
        "continue",
        "disable 1",
        // Runs to the end: the exit is reported as a stop, not as the end of the session.
        "continue",
        r#"printf "ATEXIT %lx\n", $pc"#,
        "monitor where",
        save.as_str(),
        "reverse-stepi",
        // One instruction back from the end: the exit system call itself.
        r#"printf "BACK %lx\n", $pc"#,
        "x/i $pc",
        "enable 1",
        // Back to the last instance of factorial (n = 1: the base case).
        "reverse-continue",
        r#"printf "LAST %d\n", n"#,
        "monitor history 2",
        // Forward again: to the end of the history, then the program really exits.
        "continue",
        "continue",
        r#"printf "AFTER\n""#,
    ];
    let program = example("recursion");
    let r = gdb_session(
        record(&["--backend", "soft"], &program),
        &program,
        &cmds,
        TIMEOUT,
    );
    r.expect("the program is exiting: it stays stopped at its end");
    let hex = |t: &str| -> Vec<u64> {
        r.tagged(t)
            .iter()
            .map(|v| u64::from_str_radix(v, 16).unwrap())
            .collect()
    };
    let (at_exit, back) = (hex("ATEXIT"), hex("BACK"));
    assert_eq!((at_exit.len(), back.len()), (1, 1), "{}", r.dump());
    // `syscall` is two bytes long, and it is what GDB disassembles there.
    assert_eq!(back[0] + 2, at_exit[0], "{}", r.dump());
    assert!(
        r.gdb
            .lines()
            .any(|l| l.starts_with(&format!("=> {:#x}", back[0])) && l.ends_with("syscall")),
        "{}",
        r.dump()
    );
    assert_eq!(r.tagged("LAST"), vec!["1".to_string()], "{}", r.dump());
    // monitor history: the branches before the cursor, inside factorial.
    r.expect("-> 0x");
    let end = r.pos("No more reverse-execution history");
    let exited = r.pos("exited normally");
    assert!(r.pos("LAST 1") < end && end < exited, "{}", r.dump());
    assert!(r.pos("AFTER") > exited, "{}", r.dump());
    // `monitor save` at the end: the whole history, up to the exit system call.
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(saved.join("manifest.json")).unwrap_or_else(|e| panic!("{e}\n{}", r.dump())),
    )
    .unwrap();
    let end_rip = manifest["registers_at_end"]["rip"]
        .as_str()
        .map(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap());
    assert_eq!(end_rip, Some(at_exit[0]), "{manifest}");
}

/// `--no-stop-at-exit`: the program exits at the first continue that reaches its end, as
/// before stop-at-exit became the default.
#[test]
fn no_stop_at_exit_lets_the_program_exit_at_once() {
    let program = example("recursion");
    let r = gdb_session(
        record(&["--backend", "soft", "--no-stop-at-exit"], &program),
        &program,
        &["continue", r#"printf "AFTER\n""#],
        TIMEOUT,
    );
    r.expect("exited normally");
    assert!(!r.gdb.contains("the program is exiting"), "{}", r.dump());
}

/// `next` over a one-line loop is one range step (GDB's `vCont;r`): one stop, at the next
/// line, instead of one per instruction, at the present and in the replayed past; a
/// breakpoint in the middle of the line ends it there; reverse-next afterwards retraces the
/// lines.
#[test]
fn next_over_a_one_line_loop_is_one_range_step() {
    let line = |m: &str| line_of("range_step.c", m);
    let (lp, after, mid) = (line("@loop"), line("@after */"), line("@mid"));
    let r = gdb(
        "range_step",
        &[
            &format!("break {lp}"),
            "continue",
            "echo MARK-NEXT\\n",
            "next",
            "break *mid_line",
            "next",
            "next",
            "monitor stats",
            "echo MARK-BACK\\n",
            "reverse-next",
            "reverse-next",
            "reverse-next",
            "echo MARK-FWD\\n",
            "next",
            "monitor stats",
        ],
    );
    let from = |mark: &str| -> &str {
        let i = r
            .gdb
            .find(mark)
            .unwrap_or_else(|| panic!("no {mark}\n{}", r.dump()));
        &r.gdb[i..]
    };
    // Forward: the loop line, the next line, the line with the breakpoint inside, its hit.
    assert_eq!(
        lines_shown(from("MARK-NEXT"))[..3],
        [after, mid, mid],
        "{}",
        r.dump()
    );
    r.expect("Breakpoint 2, 0x");
    // GDB sent range steps, and each covered many instructions with one stop: the loop alone
    // is 1000 iterations of several instructions.
    let stats = range_steps(&r.gdb);
    assert_eq!(stats.len(), 2, "{}", r.dump());
    let (steps, insns) = stats[0];
    assert!((1..=6).contains(&steps), "{steps}: {}", r.dump());
    assert!(insns > 5000, "{insns}: {}", r.dump());
    // Back: the start of the breakpoint's line, the line before, the loop.
    assert_eq!(
        lines_shown(from("MARK-BACK"))[..3],
        [mid, after, lp],
        "{}",
        r.dump()
    );
    // Forward in the past over the loop again: one more range step through the history.
    assert_eq!(lines_shown(from("MARK-FWD"))[0], after, "{}", r.dump());
    let (steps2, insns2) = stats[1];
    assert!(steps2 > steps && insns2 > insns + 5000, "{}", r.dump());
    let last = |key: &str| {
        r.gdb
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
            .unwrap_or_default()
            .to_string()
    };
    assert!(last("cursor").ends_with("(replaying)"), "{}", r.dump());
    assert!(last("history check").starts_with("ok"), "{}", r.dump());
}

/// Ctrl-C during a range step that never ends (`next` over a one-line loop waiting for a flag
/// nobody sets) stops the program with SIGINT on that line, and the past is there.
#[test]
fn ctrl_c_ends_a_range_step_that_never_ends() {
    let spin = line_of("range_step.c", "@spin");
    let program = example("range_step");
    let marker = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let marker_path = marker.to_path_buf();
    std::fs::remove_file(&marker_path).unwrap();
    let touched = format!("shell touch {}", marker_path.display());
    // Once GDB has been in the `next` for a second.
    let ready = marker_older_than(marker_path, Duration::from_secs(1));
    let server = Server::spawn(
        ptrewind()
            .args([
                "record",
                "--listen",
                "127.0.0.1:0",
                "--backend",
                "ptrace",
                "--",
            ])
            .arg(&program)
            .arg("spin"),
    );
    let r = gdb_session_interrupting(
        server,
        &program,
        &[
            &format!("break {spin}"),
            "continue",
            "delete",
            &touched,
            "next",
            "echo MARK-INT\\n",
            "info line *$pc",
            "reverse-stepi",
            "echo MARK-BACK\\n",
            "info line *$pc",
            "monitor stats",
            "kill",
        ],
        TIMEOUT,
        ready,
    );
    let _ = marker;
    r.expect("Program received signal SIGINT");
    let at = |mark: &str| {
        let i = r.gdb.find(mark).unwrap_or_else(|| panic!("{}", r.dump()));
        r.gdb[i..].contains(&format!("Line {spin} of"))
    };
    assert!(at("MARK-INT"), "{}", r.dump());
    assert!(at("MARK-BACK"), "{}", r.dump());
    let stats = range_steps(&r.gdb);
    assert!(
        stats.len() == 1 && stats[0].1 > stats[0].0,
        "{stats:?}: {}",
        r.dump()
    );
}
