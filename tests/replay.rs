//! PC-only reverse execution in real GDB (batch mode): the path the hardware backend and
//! `ptrewind replay` serve, exercised through `ptrewind record --state-log off` (a live process
//! recorded without a state log), `ptrewind replay DIR` (a `monitor save` directory) and
//! `ptrewind replay --pt` (a real hardware trace from the corpus).
//!
//! Ground truth is never our own output: the PCs GDB printed while single-stepping the live
//! program (ASLR is off, the program deterministic, so a separate run retraces them), the
//! values GDB printed at live stops, `nm` for symbol addresses, and for the hardware trace the
//! corpus's ground-truth branch list with instruction boundaries from `objdump -d`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

mod support;

use support::cbuild::{build_example, nm_symbol};
use support::gdb::{GdbRun, Server, gdb_session, ptrewind};
use support::synth::tsc_stream;

const TIMEOUT: Duration = Duration::from_secs(90);

/// `examples/c/recursion.c`, built once per test run.
fn recursion() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("replay-examples");
        std::fs::create_dir_all(&dir).unwrap();
        build_example(&dir, "recursion", &[])
    })
}

/// `ptrewind record EXTRA -- program` (`--backend ptrace` unless EXTRA names one).
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

fn replay(args: &[&std::ffi::OsStr]) -> Server {
    Server::spawn(
        ptrewind()
            .args(["replay", "--listen", "127.0.0.1:0"])
            .args(args),
    )
}

/// GDB prints `monitor` output and error messages on stderr, which the session collects
/// after stdout: the `monitor where` lines, in order.
fn where_lines(r: &GdbRun) -> Vec<&str> {
    r.gdb
        .lines()
        .filter(|l| {
            (l.starts_with("replaying: instruction")
                || l.starts_with("at the present: instruction"))
                && l.contains(" of ")
        })
        .collect()
}

/// The `x` command after `mark` printed no value: its output line is at most the address,
/// followed directly by the `NOVALUE` marker echoed after it (the error went to stderr).
#[track_caller]
fn assert_no_value(r: &GdbRun, mark: &str) {
    let line = first_line(r.after(mark));
    let rest = line.split_once(":\t").map_or(line, |(_, rest)| rest);
    assert!(rest.starts_with("NOVALUE"), "{line:?}\n{}", r.dump());
}

/// The first line of `text` (GDB's output of one command).
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// The instruction number in a `monitor where` line ("... instruction N of M ...").
fn where_insn(line: &str) -> u64 {
    line.split_whitespace()
        .skip_while(|w| *w != "instruction")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no instruction number in {line:?}"))
}

/// Forward PCs from the first hit of `factorial` on, single-stepped live (the ground truth for
/// the runs below: same program, ASLR off, same path).
fn forward_pcs(steps: usize) -> Vec<String> {
    static PCS: OnceLock<Vec<String>> = OnceLock::new();
    PCS.get_or_init(|| {
        let mut cmds: Vec<String> = vec!["break factorial".into(), "continue".into()];
        cmds.push("delete".into());
        cmds.push(r#"printf "FWD %lx\n", $pc"#.into());
        for _ in 0..steps {
            cmds.push("stepi".into());
            cmds.push(r#"printf "FWD %lx\n", $pc"#.into());
        }
        let program = recursion();
        let r = gdb_session(record(&[], program), program, &cmds, TIMEOUT);
        let fwd = r.tagged("FWD");
        assert_eq!(fwd.len(), steps + 1, "{}", r.dump());
        fwd
    })
    .clone()
}

/// Index in `fwd` of the `k`-th (1-based) time the PC is `fwd[0]` (factorial's breakpoint
/// address, reached once per call).
fn kth_hit(fwd: &[String], k: usize) -> usize {
    fwd.iter()
        .enumerate()
        .filter(|(_, pc)| **pc == fwd[0])
        .nth(k - 1)
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("factorial hit {k} not within the forward steps: {fwd:?}"))
}

/// A live recording without a state log: reverse-stepi retraces the live PCs exactly, the
/// registers GDB saw at earlier stops come back in full (not the present's), every other
/// register in the past is unavailable, code reads work and other memory is refused.
#[test]
fn state_log_off_serves_the_past_pc_only() {
    const K: usize = 4;
    let fwd = forward_pcs(80);
    let j = kth_hit(&fwd, K);
    let back = j; // reverse-stepi all the way to the first hit
    let mut cmds: Vec<String> = vec!["break factorial".into()];
    for _ in 0..K {
        cmds.push("continue".into());
        cmds.push("monitor where".into());
        cmds.push(r#"printf "LIVE %lx %lx\n", $rdi, $rsp"#.into());
    }
    cmds.push("monitor past".into());
    // Back to the previous dynamic instance: the stop there had its registers captured.
    cmds.push("reverse-continue".into());
    cmds.push("monitor where".into());
    cmds.push(r#"printf "BACK %lx %lx\n", $rdi, $rsp"#.into());
    cmds.push("echo STACK\\n".into());
    cmds.push("x/gx $rsp".into());
    cmds.push("echo NOVALUE\\n".into());
    // One instruction earlier nobody stopped: only RIP is known.
    cmds.push("reverse-stepi".into());
    cmds.push("echo PAST\\n".into());
    cmds.push("p $rax".into());
    cmds.push("echo RIP\\n".into());
    cmds.push("info registers rip".into());
    cmds.push("echo CODE\\n".into());
    cmds.push("x/i $pc".into());
    cmds.push("echo SP\\n".into());
    cmds.push("x/gx $sp".into());
    cmds.push("echo NOVALUE\\n".into());
    // Forward to the present (no breakpoint in the way), then retrace from there.
    cmds.push("delete".into());
    cmds.push("continue".into());
    cmds.push(r#"printf "PRESENT %lx\n", $rdi"#.into());
    cmds.push(r#"printf "REV %lx\n", $pc"#.into());
    for _ in 0..back {
        cmds.push("reverse-stepi".into());
        cmds.push(r#"printf "REV %lx\n", $pc"#.into());
    }
    cmds.push("monitor stats".into());
    let program = recursion();
    let r = gdb_session(
        record(&["--state-log", "off"], program),
        program,
        &cmds,
        TIMEOUT,
    );
    // factorial(10): the k-th hit has n = 11 - k in rdi.
    let live = r.tagged("LIVE");
    assert_eq!(live.len(), K, "{}", r.dump());
    let rdi = |line: &str| line.split_whitespace().next().unwrap_or("").to_string();
    assert_eq!(rdi(&live[K - 1]), format!("{:x}", 11 - K), "{}", r.dump());
    // reverse-continue lands on hit K-1 at the position the live stop had, with the
    // registers GDB printed there (not the present's n = 11 - K).
    let wheres = where_lines(&r);
    assert_eq!(wheres.len(), K + 1, "{}", r.dump());
    assert!(
        wheres[..K].iter().all(|l| l.starts_with("at the present")),
        "{}",
        r.dump()
    );
    assert!(wheres[K].starts_with("replaying"), "{}", r.dump());
    assert_eq!(
        where_insn(wheres[K]),
        where_insn(wheres[K - 2]),
        "{}",
        r.dump()
    );
    let back = r.tagged("BACK");
    assert_eq!(back, vec![live[K - 2].clone()], "{}", r.dump());
    // Memory in the past is refused even where the address is known.
    let rsp = back[0].split_whitespace().nth(1).unwrap_or("").to_string();
    r.expect(&format!("Cannot access memory at address 0x{rsp}"));
    assert_no_value(&r, "STACK");
    assert!(
        first_line(r.after("PAST")).contains("<unavailable>"),
        "{}",
        r.dump()
    );
    let rip_line = first_line(r.after("RIP"));
    assert!(rip_line.starts_with("rip"), "{}", r.dump());
    let code = first_line(r.after("CODE"));
    assert!(code.starts_with("=> 0x"), "{}", r.dump());
    assert!(code.contains("factorial"), "{}", r.dump());
    // No value is shown for the stack in the past (the error text itself goes to stderr).
    assert_no_value(&r, "SP");
    r.expect("No more reverse-execution history.");
    assert_eq!(
        r.tagged("PRESENT"),
        vec![format!("{:x}", 11 - K)],
        "{}",
        r.dump()
    );
    // Retrace: exactly the live PCs, backwards, from hit K to hit 1.
    let mut expected: Vec<String> = fwd[..=j].to_vec();
    expected.reverse();
    assert_eq!(r.tagged("REV"), expected, "{}", r.dump());
    r.expect("PC-only");
    assert!(!r.gdb.contains("ERROR"), "{}", r.dump());
}

/// `monitor save` from a recording, then `ptrewind replay DIR`: the cursor starts at the end
/// with the saved registers, reverse-stepi retraces the live PCs, the positions where the live
/// process stopped and position 0 have their registers, other positions only RIP, and forward
/// execution ends at the end of the history.
#[test]
fn replay_of_a_saved_recording() {
    const K: usize = 3;
    let fwd = forward_pcs(80);
    let j = kth_hit(&fwd, K);
    // Back to the previous hit, where the live process stopped (its registers were saved), and
    // one instruction further, where it did not.
    let to_stop = j - kth_hit(&fwd, K - 1);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("replay-saved");
    let _ = std::fs::remove_dir_all(&dir);
    let program = recursion();
    let mut cmds: Vec<String> = vec!["break factorial".into()];
    for _ in 0..K {
        cmds.push("continue".into());
        cmds.push(r#"printf "LIVE %lx %lx\n", $rdi, $rsp"#.into());
    }
    cmds.push(format!("monitor save {}", dir.display()));
    let live = gdb_session(record(&[], program), program, &cmds, TIMEOUT);
    let saved = live.tagged("LIVE");
    assert_eq!(saved.len(), K, "{}", live.dump());

    let mut cmds: Vec<String> = vec![
        r#"printf "END %lx %lx\n", $rdi, $rsp"#.into(),
        r#"printf "REV %lx\n", $pc"#.into(),
    ];
    for i in 1..=to_stop + 1 {
        cmds.push("reverse-stepi".into());
        cmds.push(r#"printf "REV %lx\n", $pc"#.into());
        if i == to_stop {
            cmds.push(r#"printf "STOP %lx %lx\n", $rdi, $rsp"#.into());
        }
    }
    cmds.push("echo PAST\\n".into());
    cmds.push("p $rdi".into());
    cmds.push("echo FWD-END\\n".into());
    cmds.push("continue".into());
    cmds.push("echo AGAIN\\n".into());
    cmds.push("continue".into());
    cmds.push("monitor goto 0".into());
    cmds.push("maintenance flush register-cache".into());
    cmds.push(r#"printf "START %lx\n", $pc"#.into());
    cmds.push("echo START-SP\\n".into());
    cmds.push("p/x $rsp".into());
    cmds.push("echo BEGIN\\n".into());
    cmds.push("reverse-stepi".into());
    let args: Vec<&std::ffi::OsStr> = vec![dir.as_os_str()];
    let r = gdb_session(replay(&args), program, &cmds, TIMEOUT);
    // At the end: the registers the live session printed when it saved.
    assert_eq!(r.tagged("END"), vec![saved[K - 1].clone()], "{}", r.dump());
    let mut expected: Vec<String> = fwd[j - to_stop - 1..=j].to_vec();
    expected.reverse();
    assert_eq!(r.tagged("REV"), expected, "{}", r.dump());
    // At the previous hit: the registers GDB printed there live.
    assert_eq!(r.tagged("STOP"), vec![saved[K - 2].clone()], "{}", r.dump());
    assert!(
        first_line(r.after("PAST")).contains("<unavailable>"),
        "{}",
        r.dump()
    );
    // Forward to the end and past it: no live process to resume.
    assert!(
        r.after("FWD-END")
            .contains("No more reverse-execution history."),
        "{}",
        r.dump()
    );
    assert!(
        r.after("AGAIN")
            .contains("No more reverse-execution history."),
        "{}",
        r.dump()
    );
    // Instruction 0 is main's first instruction (recording starts at main), with the saved
    // registers there.
    let start = r.tagged("START");
    assert_eq!(start.len(), 1, "{}", r.dump());
    let pc = u64::from_str_radix(&start[0], 16).unwrap();
    assert_eq!(
        pc & 0xfff,
        nm_symbol(program, "main") & 0xfff,
        "{}",
        r.dump()
    );
    let sp = first_line(r.after("START-SP"));
    assert!(sp.contains("= 0x7ff"), "{}", r.dump());
    assert!(
        r.after("BEGIN")
            .contains("No more reverse-execution history."),
        "{}",
        r.dump()
    );
}

// ---- A real hardware trace (corpus: hase loopy) ----

fn corpus() -> PathBuf {
    support::require_corpus("replay")
        .expect("corpus")
        .join("hase-pt-recordings")
}

/// `ptrewind replay --pt` on a real Intel PT trace: reverse-stepi from the end gives the
/// ground-truth PCs backwards; reverse-continue stops at the right dynamic instances of a
/// breakpoint; code is readable, data is not, registers other than RIP are unavailable.
#[test]
fn replay_of_a_hardware_trace_retraces_the_ground_truth() {
    let dir = corpus();
    let exe = dir.join("loopy-20180404/loopy");
    let pt = dir.join("extracted-aux/loopy-20180404T162955.aux.bin");
    let truth = support::hase::ground_truth(
        &std::fs::read_to_string(dir.join("loopy-20180404/loopy-20180404T162955.trace")).unwrap(),
        &support::hase::objdump_insns(&exe),
    );
    assert!(truth.len() > 40, "{truth:x?}");
    // The loop body's `dec %r8` runs once per iteration: its last two instances.
    let dec = 0x400110u64;
    let dec_hits: Vec<usize> = truth
        .iter()
        .enumerate()
        .filter(|(_, a)| **a == dec)
        .map(|(i, _)| i)
        .collect();
    assert!(dec_hits.len() >= 3, "{truth:x?}");
    let mut cmds: Vec<String> = vec![
        r#"printf "REV %lx\n", $pc"#.into(),
        "echo RAX\\n".into(),
        "p $rax".into(),
        "echo CODE\\n".into(),
        "x/i $pc".into(),
        "echo DATA\\n".into(),
        "x/gx 0x60013c".into(),
        "echo NOVALUE\\n".into(),
        "echo END\\n".into(),
        "continue".into(),
    ];
    for _ in 1..truth.len() {
        cmds.push("reverse-stepi".into());
        cmds.push(r#"printf "REV %lx\n", $pc"#.into());
    }
    cmds.push("echo BEGIN\\n".into());
    cmds.push("reverse-stepi".into());
    cmds.push("monitor goto end".into());
    cmds.push("maintenance flush register-cache".into());
    cmds.push(format!("break *{dec:#x}"));
    for _ in 0..2 {
        cmds.push("reverse-continue".into());
        cmds.push("monitor where".into());
    }
    cmds.push("continue".into());
    cmds.push("monitor where".into());
    cmds.push("monitor goto end".into());
    cmds.push("monitor history 50".into());
    let r = gdb_session(
        replay(&[
            "--pt".as_ref(),
            pt.as_os_str(),
            "--elf".as_ref(),
            exe.as_os_str(),
        ]),
        &exe,
        &cmds,
        TIMEOUT,
    );
    let mut expected: Vec<String> = truth.iter().map(|a| format!("{a:x}")).collect();
    expected.reverse();
    assert_eq!(r.tagged("REV"), expected, "{}", r.dump());
    assert!(
        first_line(r.after("RAX")).contains("<unavailable>"),
        "{}",
        r.dump()
    );
    let code = first_line(r.after("CODE"));
    assert!(
        code.starts_with(&format!("=> {:#x}", truth[truth.len() - 1])) && code.contains("syscall"),
        "{}",
        r.dump()
    );
    assert_no_value(&r, "DATA");
    r.expect("Cannot access memory at address 0x60013c");
    assert!(
        r.after("END")
            .contains("No more reverse-execution history."),
        "{}",
        r.dump()
    );
    assert!(
        r.after("BEGIN")
            .contains("No more reverse-execution history."),
        "{}",
        r.dump()
    );
    // `monitor where` after `goto end`, after each reverse-continue, after the continue
    // forward again (the last two instances, then the last one again), and the final goto.
    let n = dec_hits.len();
    let wheres: Vec<u64> = where_lines(&r).iter().map(|l| where_insn(l)).collect();
    let want: Vec<u64> = [
        truth.len() - 1,
        dec_hits[n - 1],
        dec_hits[n - 2],
        dec_hits[n - 1],
        truth.len() - 1,
    ]
    .iter()
    .map(|&i| i as u64)
    .collect();
    assert_eq!(wheres, want, "{}", r.dump());
    // `monitor history`: the taken branches of the ground-truth list (from and to both in user
    // space; the syscalls' disable/enable pairs continue sequentially).
    let hex = |t: &str| u64::from_str_radix(t.trim_start_matches("0x"), 16).ok();
    let lines: Vec<&str> = r.gdb.lines().collect();
    let listed: Vec<(Option<u64>, Option<u64>)> = lines
        .windows(2)
        .filter_map(|w| {
            let to = w[1].trim().strip_prefix("-> ")?;
            let from = w[0].split_whitespace().nth(1)?;
            Some((hex(from), to.split_whitespace().next().and_then(hex)))
        })
        .collect();
    let branches: Vec<(Option<u64>, Option<u64>)> =
        std::fs::read_to_string(dir.join("loopy-20180404/loopy-20180404T162955.trace"))
            .unwrap()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace().map(hex);
                let (from, to) = (f.next()??, f.next()??);
                (from != 0 && to != 0).then_some((Some(from), Some(to)))
            })
            .collect();
    assert!(!branches.is_empty());
    assert_eq!(listed, branches, "{}", r.dump());
}

/// `ptrewind replay --perf` takes the AUX stream out of the original perf.data file and the
/// code from its MMAP records (the binary found with `--search-dir`, as `decode` does): the
/// history lists exactly the ground-truth instructions, and GDB starts at the last one.
#[test]
fn replay_of_a_perf_data_file_has_the_ground_truth_history() {
    let dir = corpus();
    let exe = dir.join("loopy-20180404/loopy");
    let perf = dir.join("loopy-20180404/loopy-20180404T162955.perf");
    let truth = support::hase::ground_truth(
        &std::fs::read_to_string(dir.join("loopy-20180404/loopy-20180404T162955.trace")).unwrap(),
        &support::hase::objdump_insns(&exe),
    );
    let r = gdb_session(
        replay(&[
            "--perf".as_ref(),
            perf.as_os_str(),
            "--search-dir".as_ref(),
            dir.join("loopy-20180404").as_os_str(),
        ]),
        &exe,
        &[r#"printf "PC %lx\n", $pc"#, "monitor insns 0 end"],
        TIMEOUT,
    );
    let listed: Vec<u64> = r
        .gdb
        .lines()
        .filter_map(|l| {
            let (n, addr) = l.split_once(" 0x")?;
            n.parse::<u64>().ok()?;
            u64::from_str_radix(addr, 16).ok()
        })
        .collect();
    assert_eq!(listed, truth, "{}", r.dump());
    assert_eq!(
        r.tagged("PC"),
        vec![format!("{:x}", truth[truth.len() - 1])],
        "{}",
        r.dump()
    );
}

/// `replay` refuses a trace whose code is not given, and a directory that is not a saved
/// recording.
#[test]
fn replay_refuses_incomplete_inputs() {
    let dir = corpus();
    let pt = dir.join("extracted-aux/loopy-20180404T162955.aux.bin");
    let out = ptrewind()
        .args(["replay", "--listen", "127.0.0.1:0", "--pt"])
        .arg(&pt)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("--elf"), "{text}");
    let out = ptrewind()
        .args(["replay", "--listen", "127.0.0.1:0"])
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("manifest.json"), "{text}");
}

/// The lines of `text` that start with `prefix`, up to the next line that does not.
fn block<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| !l.starts_with(prefix))
        .take_while(|l| l.starts_with(prefix))
        .collect()
}

/// A saved recording of a PIE, dynamically linked program (Debian's gcc default; the example
/// `recursion.c`) replays with the view of the live session at the moment it was saved: the
/// same shared libraries (the saved loader list), the same backtrace (the saved auxv places the
/// executable, the saved stack unwinds), and breakpoints relocated to the same run-time address,
/// which reverse-continue reaches. Before, GDB saw `_start () from ld-linux-x86-64.so.2`,
/// unrelocated breakpoints and no frames.
#[test]
fn replay_of_a_saved_pie_recording_shows_the_live_view() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("replay-saved-pie");
    let _ = std::fs::remove_dir_all(&dir);
    let program = recursion();
    let view = |tag: &str| -> Vec<String> {
        vec![
            format!("echo {tag}-LIBS\\n"),
            "info sharedlibrary".into(),
            format!("echo {tag}-BT\\n"),
            "bt".into(),
            format!("echo {tag}-END\\n"),
        ]
    };
    let mut cmds: Vec<String> = vec!["break factorial".into(), "continue".into()];
    cmds.push("continue".into());
    cmds.extend(view("LIVE"));
    cmds.push(format!("monitor save {}", dir.display()));
    let live = gdb_session(
        record(&["--backend", "ptrace"], program),
        program,
        &cmds,
        TIMEOUT,
    );
    let mut cmds = view("REPLAY");
    cmds.push("break factorial".into());
    cmds.push("echo RC\\n".into());
    cmds.push("reverse-continue".into());
    let r = gdb_session(replay(&[dir.as_os_str()]), program, &cmds, TIMEOUT);
    let section = |run: &GdbRun, tag: &str, from: &str, to: &str| -> String {
        let text = run.after(&format!("{tag}-{from}"));
        let end = text.find(&format!("{tag}-{to}")).unwrap_or(text.len());
        text[..end].to_string()
    };
    let live_libs = section(&live, "LIVE", "LIBS", "BT");
    let replay_libs = section(&r, "REPLAY", "LIBS", "BT");
    assert!(live_libs.contains("libc.so.6"), "{}", live.dump());
    assert_eq!(
        block(&replay_libs, "0x"),
        block(&live_libs, "0x"),
        "{}",
        r.dump()
    );
    let live_bt = section(&live, "LIVE", "BT", "END");
    let replay_bt = section(&r, "REPLAY", "BT", "END");
    assert!(block(&live_bt, "#").len() >= 3, "{}", live.dump());
    assert_eq!(block(&replay_bt, "#"), block(&live_bt, "#"), "{}", r.dump());
    // The breakpoint at the live session's run-time address, reached backwards.
    let bp = |run: &GdbRun| -> String {
        run.gdb
            .lines()
            .find_map(|l| l.strip_prefix("Breakpoint 1 at "))
            .and_then(|l| l.split(':').next())
            .unwrap_or_else(|| panic!("no breakpoint line\n{}", run.dump()))
            .to_string()
    };
    assert_eq!(bp(&r), bp(&live), "{}", r.dump());
    assert!(r.after("RC").contains("Breakpoint 1, "), "{}", r.dump());
    assert!(!r.gdb.contains("_start () from"), "{}", r.dump());
    // Host I/O: no warning in either session, the libraries read through `target:` (the
    // copies saved with the recording) with their symbols.
    for run in [&live, &r] {
        assert!(
            !run.gdb.contains("unable to open /proc file"),
            "{}",
            run.dump()
        );
    }
    assert!(
        block(&replay_libs, "0x")
            .iter()
            .any(|l| l.contains("Yes") && l.contains("target:/") && l.contains("libc.so.6")),
        "{}",
        r.dump()
    );
    saved_files_are_served_from_the_recording(&dir, program, live.pid);
}

/// What the replay server reads for GDB's host I/O: the maps file from `maps.json`, the
/// executable and libraries from the recording's own copies (a copy changed in the directory
/// is what GDB gets), never through a link planted there, and no other process's `/proc`.
fn saved_files_are_served_from_the_recording(saved: &Path, program: &Path, pid: i32) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("replay-saved-pie-files");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(saved).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let files = manifest["files"].as_array().expect("files in the manifest");
    let name_of = |suffix: &str| -> (String, String) {
        files
            .iter()
            .find(|f| f["path"].as_str().unwrap().ends_with(suffix))
            .map(|f| {
                (
                    f["path"].as_str().unwrap().to_string(),
                    f["file"].as_str().unwrap().to_string(),
                )
            })
            .unwrap_or_else(|| panic!("{suffix} not saved: {files:?}"))
    };
    let exe = std::fs::canonicalize(program).unwrap();
    let (exe_path, exe_copy) = name_of(exe.to_str().unwrap());
    // The loader's name for libc (through /lib) and the maps' name share one copy.
    let (libc_path, libc_copy) = name_of("/lib/x86_64-linux-gnu/libc.so.6");
    assert!(
        files
            .iter()
            .filter(|f| f["file"].as_str() == Some(&libc_copy))
            .count()
            >= 2,
        "{files:?}"
    );
    std::fs::write(dir.join(&exe_copy), b"the saved copy").unwrap();
    std::fs::remove_file(dir.join(&libc_copy)).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", dir.join(&libc_copy)).unwrap();
    let out = |n: &str| dir.join(format!("got-{n}"));
    let cmds = vec![
        format!(
            "remote get /proc/{pid}/task/{pid}/maps {}",
            out("maps").display()
        ),
        format!("remote get {exe_path} {}", out("exe").display()),
        "echo LIBC\\n".to_string(),
        format!("remote get {libc_path} {}", out("libc").display()),
        "echo OTHER\\n".to_string(),
        format!("remote get /proc/1/maps {}", out("other").display()),
        "kill".into(),
    ];
    let r = gdb_session(replay(&[dir.as_os_str()]), program, &cmds, TIMEOUT);
    let maps: Vec<String> =
        serde_json::from_slice(&std::fs::read(dir.join("maps.json")).unwrap()).unwrap();
    assert_eq!(
        std::fs::read_to_string(out("maps")).unwrap_or_default(),
        format!("{}\n", maps.join("\n")),
        "{}",
        r.dump()
    );
    assert_eq!(
        std::fs::read(out("exe")).unwrap_or_default(),
        b"the saved copy",
        "{}",
        r.dump()
    );
    assert!(!out("libc").exists(), "{}", r.dump());
    assert!(!out("other").exists(), "{}", r.dump());
    assert!(r.gdb.contains("Remote I/O error"), "{}", r.dump());
}

/// A perf.data record: header (type, misc 0, size) + body.
fn perf_record(kind: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&((8 + body.len()) as u16).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// A pipe-mode perf.data with one attr and one AUXTRACE record per `(tid, cpu, data)`: as
/// `perf record --per-thread -e intel_pt//` writes it, the CPU is -1 and the tid names the
/// thread; per CPU, the CPU is given and the tid is -1.
fn aux_perf_data(streams: &[(u32, u32, Vec<u8>)]) -> Vec<u8> {
    const HEADER_ATTR: u32 = 64;
    const AUXTRACE: u32 = 71;
    let mut out = b"PERFILE2".to_vec();
    out.extend_from_slice(&16u64.to_le_bytes());
    let mut attr = vec![0u8; 112];
    attr[0..4].copy_from_slice(&6u32.to_le_bytes());
    attr[4..8].copy_from_slice(&112u32.to_le_bytes());
    // sample_type TID | TIME | CPU | IDENTIFIER, sample_id_all.
    let st: u64 = (1 << 1) | (1 << 2) | (1 << 7) | (1 << 16);
    attr[24..32].copy_from_slice(&st.to_le_bytes());
    attr[40..48].copy_from_slice(&(1u64 << 18).to_le_bytes());
    attr.extend_from_slice(&7u64.to_le_bytes());
    out.extend(perf_record(HEADER_ATTR, &attr));
    for (idx, (tid, cpu, data)) in streams.iter().enumerate() {
        let mut body = Vec::new();
        body.extend_from_slice(&(data.len() as u64).to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes()); // offset in the AUX area
        body.extend_from_slice(&0x1234u64.to_le_bytes()); // reference
        for v in [idx as u32, *tid, *cpu, 0] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        out.extend(perf_record(AUXTRACE, &body));
        out.extend_from_slice(data);
    }
    out
}

/// `replay --perf` of a perf.data recorded per thread (one AUX stream per thread, TSC timing)
/// serves every thread in the global order of their TSC packets: GDB lists both threads;
/// reverse-continue stops in whichever thread reached a breakpoint last (thread 102's loop,
/// which ran between thread 101's two runs, then thread 101's first run); each thread has its
/// own history (`monitor threads`). A perf.data of per-CPU streams is refused with the reason.
#[test]
fn replay_of_a_per_thread_perf_data_serves_every_thread() {
    let dir = tempfile::tempdir().unwrap();
    // Thread 101: 5 `jne` at TSC 100, 5 more at TSC 300; thread 102: 4 at TSC 200.
    let perf = dir.path().join("perf.data");
    std::fs::write(
        &perf,
        aux_perf_data(&[
            (101, u32::MAX, tsc_stream(0x1000, &[(100, 5), (300, 4)])),
            (102, u32::MAX, tsc_stream(0x2000, &[(200, 3)])),
        ]),
    )
    .unwrap();
    let code = dir.path().join("code.bin");
    // jne . ; ret
    std::fs::write(&code, [0x75, 0xfe, 0xc3]).unwrap();
    let raw = |base: &str| format!("{}:{base}", code.display());
    let server = Server::spawn(
        ptrewind()
            .args(["replay", "--listen", "127.0.0.1:0", "--perf"])
            .arg(&perf)
            .args(["--raw", &raw("0x1000"), "--raw", &raw("0x2000")]),
    );
    let run = gdb_session(
        server,
        Path::new("/bin/true"),
        &[
            "echo @threads\\n",
            "info threads",
            "echo @rc\\n",
            "break *0x2000",
            "reverse-continue",
            "monitor thread",
            "delete",
            "break *0x1000",
            "reverse-continue",
            "monitor thread",
            "monitor threads",
        ],
        TIMEOUT,
    );
    let listed = run.after("@threads");
    let listed = &listed[..listed.find("@rc").unwrap_or(listed.len())];
    assert_eq!(
        listed.lines().filter(|l| l.contains("Thread ")).count(),
        2,
        "{}",
        run.dump()
    );
    // Thread 101 ran last: selected at the end; then thread 102's last `jne`, then thread
    // 101's instruction 4 (its first run, before thread 102's).
    let selected: Vec<&str> = run
        .gdb
        .lines()
        .filter(|l| l.starts_with("thread ") && l.ends_with(" selected"))
        .collect();
    assert_eq!(
        selected,
        ["thread 102 selected", "thread 101 selected"],
        "{}",
        run.dump()
    );
    let rc = run.after("@rc");
    let first = rc.find("[Switching to Thread 1.102]");
    let second = rc.find("[Switching to Thread 1.101]");
    assert!(
        first.is_some() && second.is_some() && first < second,
        "{}",
        run.dump()
    );
    let threads = run.after("thread 101 selected");
    assert!(
        threads.contains("thread 101: instruction 4 of 10")
            && threads.contains("thread 102: instruction 0 of 4"),
        "{}",
        run.dump()
    );
    // Per-CPU streams are not split into threads: refused, naming the way to pick one.
    let cpu = dir.path().join("cpu.data");
    std::fs::write(
        &cpu,
        aux_perf_data(&[
            (u32::MAX, 0, tsc_stream(0x1000, &[(100, 2)])),
            (u32::MAX, 1, tsc_stream(0x2000, &[(200, 2)])),
        ]),
    )
    .unwrap();
    let out = ptrewind()
        .args(["replay", "--listen", "127.0.0.1:0", "--perf"])
        .arg(&cpu)
        .args(["--raw", &raw("0x1000"), "--raw", &raw("0x2000")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    // Per-CPU streams without the sideband to split them (no time conversion, no context
    // switches): refused, naming why and the way to pick one.
    assert!(
        text.contains("cannot be split into threads")
            && text.contains("time")
            && text.contains("--stream"),
        "{text}"
    );
}

/// `replay --perf` of a perf.data recorded per CPU (perf's default mode; built by the
/// encoder: 2 CPUs, 3 threads migrating between them, CPU-wide context-switch records): the
/// streams are split into threads by the switch records and every thread is served with
/// exactly the instructions it executed (`monitor insns` per thread against the ground truth
/// the file was built from); GDB lists the three threads, `thread N` selects one, and
/// reverse-stepi steps back through that thread's own instructions.
#[test]
fn replay_of_a_per_cpu_perf_data_serves_every_thread() {
    use support::percpu::{self, BASES, CODE, Variant};
    let dir = tempfile::tempdir().unwrap();
    let perf = dir.path().join("perf.data");
    std::fs::write(&perf, percpu::perf_data(Variant::default())).unwrap();
    let code = dir.path().join("code.bin");
    std::fs::write(&code, CODE).unwrap();
    let mut cmd = ptrewind();
    cmd.args(["replay", "--listen", "127.0.0.1:0", "--perf"])
        .arg(&perf);
    for base in BASES {
        cmd.args(["--raw", &format!("{}:{base:#x}", code.display())]);
    }
    let truth = percpu::truth();
    // No symbols: GDB would take the raw code for /bin/true's dynamic loader (and its inline
    // frames would swallow the reverse-stepi).
    let mut cmds: Vec<String> = vec![
        "nosharedlibrary".into(),
        "symbol-file".into(),
        "maintenance flush register-cache".into(),
        "echo @threads\\n".into(),
        "info threads".into(),
    ];
    for tid in truth.keys() {
        cmds.push(format!("monitor thread {tid}"));
        cmds.push(format!("echo @insns {tid}\\n"));
        cmds.push("monitor insns 0 end".into());
    }
    cmds.extend(
        [
            "echo @step\\n",
            "set scheduler-locking step",
            "thread 2",
            "monitor thread",
            r#"printf "PC %lx\n", $pc"#,
            "reverse-stepi",
            r#"printf "PC %lx\n", $pc"#,
            "reverse-stepi",
            r#"printf "PC %lx\n", $pc"#,
            "monitor threads",
        ]
        .map(String::from),
    );
    let r = gdb_session(
        Server::spawn(&mut cmd),
        Path::new("/bin/true"),
        &cmds,
        TIMEOUT,
    );
    let listed = r.after("@threads");
    let listed = &listed[..listed.find("@insns").unwrap_or(listed.len())];
    let tids: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("100.")))
        .collect();
    assert_eq!(tids, ["100.101", "100.102", "100.103"], "{}", r.dump());
    // Each thread's `monitor insns` (after its `monitor thread TID`) is its ground truth.
    let mut served: std::collections::BTreeMap<u32, Vec<u64>> = Default::default();
    let mut current = None;
    for line in r.gdb.lines() {
        if let Some(tid) = line
            .strip_prefix("thread ")
            .and_then(|l| l.strip_suffix(" selected"))
        {
            current = tid.parse::<u32>().ok();
        } else if let (Some(tid), Some((n, addr))) = (current, line.split_once(" 0x"))
            && n.parse::<u64>().is_ok()
        {
            if let Ok(a) = u64::from_str_radix(addr, 16) {
                served.entry(tid).or_default().push(a);
            }
        }
    }
    assert_eq!(served, truth, "{}", r.dump());
    // `thread 2` is thread 102 (at its end: its last instruction, 0x2008); reverse-stepi
    // steps back through its own instructions 6 and 5 (0x2004), and the other threads follow
    // the global position (thread 101 has run 9 of its 14 instructions before it).
    assert_eq!(r.tagged("PC"), ["2008", "2004", "2004"], "{}", r.dump());
    let threads = r.after("@step");
    assert!(
        threads.contains("global position 19 of 27")
            && threads.contains("* thread 102: instruction 5 of 8")
            && threads.contains("  thread 101: instruction 9 of 14"),
        "{}",
        r.dump()
    );
    assert!(
        r.server
            .contains("split by context switches into 3 thread(s) (101, 102, 103): 9 of 9"),
        "{}",
        r.dump()
    );

    // Bad inputs: per-CPU streams without switch records, and a perf.data cut inside an
    // AUXTRACE payload, are refused with the reason.
    for (variant, want) in [
        (
            Variant {
                no_switches: true,
                ..Variant::default()
            },
            "no context-switch records",
        ),
        (
            Variant {
                truncate_aux: true,
                ..Variant::default()
            },
            "damaged",
        ),
        (
            Variant {
                cpu_wide: true,
                ..Variant::default()
            },
            "threads of the processes 100, 555: choose one with --pid PID",
        ),
    ] {
        std::fs::write(&perf, percpu::perf_data(variant)).unwrap();
        let out = ptrewind()
            .args(["replay", "--listen", "127.0.0.1:0", "--perf"])
            .arg(&perf)
            .args(["--raw", &format!("{}:0x1000", code.display())])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        assert!(text.contains(want), "{want}: {text}");
        assert!(!text.contains("panicked"), "{text}");
    }
}

/// quipper's real per-CPU perf.data (user + kernel, `echo` on CPUs 3 and 0, no code images in
/// the corpus): its two streams split into the one traced thread, then the replay stops with
/// the missing code named.
#[test]
fn replay_of_a_per_cpu_perf_data_without_code_says_what_is_missing() {
    let perf = corpus()
        .parent()
        .unwrap()
        .join("quipper-perfdata-intel_pt/perf.data.intel_pt-4.14");
    let out = ptrewind()
        .args(["replay", "--listen", "127.0.0.1:0", "--once", "--perf"])
        .arg(&perf)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(
            "per-CPU stream(s) cpu0, cpu3 split by context switches into 1 thread(s) (3174)"
        ),
        "{text}"
    );
    assert!(
        text.contains("no code for /usr/bin/coreutils (pid 3174)"),
        "{text}"
    );
    assert!(text.contains("no code for the trace"), "{text}");
}
