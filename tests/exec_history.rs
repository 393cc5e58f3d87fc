//! An exec keeps the old program's history (issue 12 §5). `exec_first` (static, non-PIE, no
//! libc) does some work and execve's `exec_second`, which is loaded at the same addresses with
//! other code there. The history before the exec must be decoded against the first program's
//! code — decoded against the present (second) program it is silently wrong — and what the
//! past shows there (PCs, instructions) must be the first program's.
//!
//! Ground truth: GDB single-stepping both programs natively (`catch exec`, one `stepi` at a
//! time) lists every executed PC; the decoded history must equal it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;

mod support;

use ptrewind::capture::soft::{RecorderConfig, SoftRecorder};
use ptrewind::flow::FlowConfig;
use ptrewind::history::History;
use ptrewind::image::{ElfSpec, Image};
use ptrewind::target::{PtraceTarget, SpawnOptions};
use support::cbuild::{build_example, have, nm_symbol};
use support::flow_ips;
use support::gdb::{Server, gdb_session};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The two programs, built once: `(first, second)`.
fn programs() -> &'static (PathBuf, PathBuf) {
    static P: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    P.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("exec-history");
        std::fs::create_dir_all(&dir).expect("dir");
        let flags = ["-static", "-nostdlib", "-no-pie", "-fno-stack-protector"];
        build_example(&dir, "code_remap", &flags);
        build_example(&dir, "thread_remap", &["-pthread"]);
        (
            build_example(&dir, "exec_first", &flags),
            build_example(&dir, "exec_second", &flags),
        )
    })
}

/// A program's code from its ELF file (non-PIE: at its link-time addresses).
fn elf_code(exe: &Path) -> Image {
    let mut image = Image::new();
    image
        .load_elf(&ElfSpec::new(exe, None))
        .expect("load the ELF file");
    image
}

/// The address of the first `syscall` instruction (0f 05) at or after `from` in `code`.
fn syscall_at_or_after(code: &Image, from: u64) -> u64 {
    let mut bytes = [0u8; 64];
    let n = code.read(from, &mut bytes);
    let i = bytes[..n]
        .windows(2)
        .position(|w| w == [0x0f, 0x05])
        .expect("a syscall instruction");
    from + i as u64
}

/// The PCs of `monitor insns` lines ("N 0xPC") in GDB's output, in order.
fn monitor_insns_pcs(gdb: &str) -> Vec<u64> {
    gdb.lines()
        .filter_map(|l| {
            let (n, pc) = l.split_once(" 0x")?;
            n.parse::<u64>().ok()?;
            u64::from_str_radix(pc.trim(), 16).ok()
        })
        .collect()
}

/// Every PC `program ARGS` executes (through its exec, if any), from its entry up to (not
/// including) `stop`, by GDB single-stepping it natively. At an exec GDB's `stepi` shows the
/// new program's first PC twice (the exec's own step trap comes back before anything ran):
/// once.
fn ground_truth(program: &Path, args: &[&Path], stop: u64) -> Vec<u64> {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("pcs.txt");
    let script = dir.path().join("steps.py");
    std::fs::write(
        &script,
        format!(
            "import gdb\n\
             gdb.execute('set pagination off')\n\
             gdb.execute('catch exec')\n\
             gdb.execute('starti', to_string=True)\n\
             pcs = []\n\
             while len(pcs) < 100000:\n\
             \x20   pc = int(gdb.parse_and_eval('$pc')) & 0xffffffffffffffff\n\
             \x20   if pc == {stop}:\n\
             \x20       break\n\
             \x20   if not pcs or pcs[-1] != pc:\n\
             \x20       pcs.append(pc)\n\
             \x20   gdb.execute('stepi', to_string=True)\n\
             open({out:?}, 'w').write('\\n'.join('%x' % p for p in pcs))\n\
             gdb.execute('kill')\n"
        ),
    )
    .expect("script");
    let run = Command::new("gdb")
        .args(["-nx", "-batch", "-x"])
        .arg(&script)
        .arg("--args")
        .arg(program)
        .args(args)
        .output()
        .expect("run gdb");
    let text = std::fs::read_to_string(&out).unwrap_or_else(|_| {
        panic!(
            "the single-step ground truth failed: {}",
            String::from_utf8_lossy(&run.stderr)
        )
    });
    text.lines()
        .map(|l| u64::from_str_radix(l, 16).expect("hex pc"))
        .collect()
}

/// The recorder marks the exec (the old program's code read before the call, a PSB where the
/// new address space starts); decoded with one image per period the trace gives exactly the
/// executed PCs of both programs, through the history's random access too. Decoded against
/// the present program alone (what a single image gives), the first program's part is wrong.
#[test]
fn each_period_decodes_against_its_own_program() {
    if !have("gdb") {
        eprintln!("skipped: no gdb for the ground truth");
        return;
    }
    let (first, second) = programs();
    let marker = nm_symbol(second, "second_marker");
    let truth = ground_truth(first, &[second], marker);
    let second_start = nm_symbol(second, "_start");
    let boundary = truth
        .iter()
        .position(|&pc| pc == second_start)
        .expect("the second program's entry in the ground truth") as u64;

    let target = PtraceTarget::spawn(
        &first.clone().into_os_string(),
        &[second.clone().into_os_string()],
        &SpawnOptions::default(),
    )
    .expect("spawn");
    let cfg = RecorderConfig {
        log_ips: true,
        capture_image_at_exit: true,
        ..RecorderConfig::default()
    };
    let mut rec = SoftRecorder::new(target, cfg).expect("recorder");
    rec.run(Some(1_000_000)).expect("record");
    let recording = rec.finish().expect("finish");
    assert!(recording.gaps.is_empty(), "no bytes lost");
    assert_eq!(recording.stats.execs, 1);
    let ips = recording.ip_log.clone().expect("ip log");
    // The recording runs on to the second program's exit; the ground truth stops at its marker.
    assert_eq!(&ips[..truth.len()], &truth[..], "the recorder's own log");
    let [period] = &recording.exec_periods[..] else {
        panic!("one exec period: {:?}", recording.exec_periods);
    };
    assert_eq!(period.next_insn, boundary, "the period ends at the exec");

    // The code at exit is the second program's, the period's the first's.
    let present = recording.image.clone().expect("image at exit");
    let mut bytes = [0u8; 1];
    let first_work = nm_symbol(first, "first_work");
    assert_eq!(period.image.read(first_work, &mut bytes), 1);
    assert_eq!(bytes, [0x55], "push %rbp: first_work in the first program");
    assert_eq!(present.read(first_work, &mut bytes), 1);
    assert_ne!(bytes, [0x55], "the second program has other code there");

    let mut periods = period.image.first_period();
    periods.push_period(period.next_stream_offset, Arc::new(present.clone()));
    let (decoded, errors) = flow_ips(&recording.trace, &periods);
    assert!(errors.is_empty(), "decode errors: {errors:?}");
    assert_eq!(decoded, ips, "each period against its own program");

    // What one image (the present program's) gives: not the first program's history.
    let (single, _) = flow_ips(&recording.trace, &present);
    assert_ne!(
        single.get(..boundary as usize),
        Some(&ips[..boundary as usize]),
        "decoded against the second program, the first program's part cannot be right"
    );

    // The history's random access, in both periods.
    let mut h = History::build(&recording.trace, &periods, FlowConfig::default());
    assert_eq!(h.len(), ips.len() as u64);
    for n in [
        0,
        boundary - 1,
        boundary,
        boundary + 1,
        ips.len() as u64 - 1,
    ] {
        let got = h.insn(&recording.trace, &periods, n).map(|(ip, _)| ip);
        assert_eq!(got, Some(ips[n as usize]), "instruction {n}");
    }
}

/// Real GDB: continue to a breakpoint in the second program, reverse-continue to the first
/// program's `first_work`, replay forward to its execve, step into the second program and back:
/// every PC and every instruction GDB shows is the first program's before the exec (checked
/// against the ELF files' bytes), and the history equals the single-step ground truth.
#[test]
fn gdb_reverses_across_the_exec_into_the_first_program() {
    if !have("gdb") {
        eprintln!("skipped: no gdb");
        return;
    }
    let (first, second) = programs();
    let (first_code, second_code) = (elf_code(first), elf_code(second));
    let marker = nm_symbol(second, "second_marker");
    let second_start = nm_symbol(second, "_start");
    let first_work = nm_symbol(first, "first_work");
    let execve = syscall_at_or_after(&first_code, nm_symbol(first, "sys3"));
    // The test means something only if the second program has other code at these addresses.
    for at in [first_work, execve] {
        let (mut a, mut b) = ([0u8; 2], [0u8; 2]);
        first_code.read(at, &mut a);
        second_code.read(at, &mut b);
        assert_ne!(a, b, "both programs have the same bytes at {at:#x}");
    }
    let truth = ground_truth(first, &[second], marker);
    let boundary = truth.iter().position(|&pc| pc == second_start).unwrap();
    assert_eq!(truth[boundary - 1], execve);

    let second_arg = second.to_str().expect("utf-8 path");
    let server = Server::start(first, &[second_arg]);
    let r = gdb_session(
        server,
        first,
        &[
            format!("break *{marker:#x}"),
            "continue".into(),
            "echo AT-MARKER\\n".into(),
            "p/x $pc".into(),
            "delete".into(),
            format!("break *{first_work:#x}"),
            "reverse-continue".into(),
            "echo AT-FIRST-WORK\\n".into(),
            "p/x $pc".into(),
            "x/i $pc".into(),
            "monitor history 3".into(),
            "delete".into(),
            format!("break *{execve:#x}"),
            "continue".into(),
            "echo AT-EXECVE\\n".into(),
            "p/x $pc".into(),
            "x/i $pc".into(),
            "stepi".into(),
            "echo IN-SECOND\\n".into(),
            "p/x $pc".into(),
            "x/i $pc".into(),
            "reverse-stepi".into(),
            "echo BACK-IN-FIRST\\n".into(),
            "p/x $pc".into(),
            "x/i $pc".into(),
            "monitor insns 0 end".into(),
            "monitor stats".into(),
            "kill".into(),
        ],
        TIMEOUT,
    );
    assert_eq!(r.hex_after("AT-MARKER"), marker, "{}", r.dump());
    assert_eq!(r.hex_after("AT-FIRST-WORK"), first_work, "{}", r.dump());
    let shown = r.after("AT-FIRST-WORK");
    assert!(
        shown.contains("push   %rbp"),
        "x/i shows the first program's instruction: {}",
        r.dump()
    );
    assert_eq!(r.hex_after("AT-EXECVE"), execve, "{}", r.dump());
    assert!(r.after("AT-EXECVE").contains("syscall"), "{}", r.dump());
    assert_eq!(r.hex_after("IN-SECOND"), second_start, "{}", r.dump());
    assert!(
        r.after("IN-SECOND").contains("xor    %ebp,%ebp"),
        "{}",
        r.dump()
    );
    assert_eq!(r.hex_after("BACK-IN-FIRST"), execve, "{}", r.dump());
    assert!(r.after("BACK-IN-FIRST").contains("syscall"), "{}", r.dump());
    // The whole history, PC by PC, equals the ground truth.
    // (GDB prints monitor output on stderr, after its stdout: the lines "N 0xPC".)
    let listed = monitor_insns_pcs(&r.gdb);
    assert_eq!(
        listed,
        truth,
        "the history against the ground truth\n{}",
        r.dump()
    );
    // Crossing the exec in the past is said, with whose code is shown and whose symbols GDB has.
    let first_name = first.display().to_string();
    let second_name = second.display().to_string();
    let before = format!(
        "ptrewind: now in the history of {first_name} (instructions 0..{boundary}, before its exec)"
    );
    let after = format!(
        "ptrewind: now in the history of {second_name} (from instruction {boundary}, after the exec)"
    );
    // (Console output comes on GDB's stderr, after its stdout: the order among themselves.)
    // Into the first program (reverse-continue), into the second (stepi), back (reverse-stepi).
    let b1 = r.pos(&before);
    let a = b1 + r.gdb[b1..].find(&after).expect("the notice of the stepi");
    assert!(r.gdb[a..].contains(&before), "{}", r.dump());
    r.expect(&format!("(in GDB: file {first_name})"));
    // `monitor history` at first_work names the first program's functions and lines.
    r.expect(&format!(
        "-> {first_work:#014x} first_work at exec_first.c:"
    ));
    // (Only the server's lines: GDB's own symbols may be the second program's once it is
    // told about the exec.)
    let server_lines = r
        .gdb
        .lines()
        .filter(|l| l.starts_with(' ') && l.contains(" 0x0000"));
    assert!(
        server_lines.clone().count() >= 4 && !server_lines.clone().any(|l| l.contains("second_")),
        "{}",
        r.dump()
    );
    r.expect("decode errors            0");
    r.expect("history check            ok");
}

/// `monitor save` keeps both programs' code (the manifest's `exec_periods`: where the second
/// program starts, the first program's sections and mappings), and `ptrewind replay` of the
/// directory decodes each part against its own program: reverse-continue finds the first
/// program's `first_work`, `x/i` shows its instruction, and the history equals the ground truth.
#[test]
fn a_saved_recording_keeps_both_programs() {
    if !have("gdb") {
        eprintln!("skipped: no gdb");
        return;
    }
    let (first, second) = programs();
    let marker = nm_symbol(second, "second_marker");
    let first_work = nm_symbol(first, "first_work");
    let truth = ground_truth(first, &[second], marker);
    let second_start = nm_symbol(second, "_start");
    let boundary = truth.iter().position(|&pc| pc == second_start).unwrap() as u64;
    let dir = tempfile::tempdir().expect("tempdir");
    let saved = dir.path().join("rec");
    let server = Server::start(first, &[second.to_str().expect("utf-8 path")]);
    let live = gdb_session(
        server,
        first,
        &[
            format!("break *{marker:#x}"),
            "continue".into(),
            format!("monitor save {}", saved.display()),
            "kill".into(),
        ],
        TIMEOUT,
    );
    live.expect("saved ");

    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(saved.join("manifest.json")).expect("manifest"))
            .expect("json");
    let periods = manifest["exec_periods"].as_array().expect("exec_periods");
    assert_eq!(periods.len(), 1, "{manifest:#}");
    assert_eq!(periods[0]["next_insn"].as_u64(), Some(boundary));
    let first_path = first.to_str().unwrap();
    assert_eq!(periods[0]["exe"].as_str(), Some(first_path));
    // The first program's code section, byte for byte as its ELF file has it.
    let code = elf_code(first);
    let text = periods[0]["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .find(|s| s["origin"].as_str() == Some(first_path))
        .unwrap_or_else(|| panic!("no section of {first_path}: {manifest:#}"));
    let addr = u64::from_str_radix(text["addr"].as_str().unwrap().trim_start_matches("0x"), 16)
        .expect("addr");
    let bytes = std::fs::read(saved.join(text["file"].as_str().unwrap())).expect("section file");
    let mut want = vec![0u8; 0x100];
    code.read(addr, &mut want);
    assert_eq!(&bytes[..0x100], &want[..], "the first program's code");
    // The present program's sections are the second program's.
    assert!(
        manifest["sections"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["origin"].as_str() == second.to_str()),
        "{manifest:#}"
    );

    let replay = Server::replay(&saved);
    let r = gdb_session(
        replay,
        first,
        &[
            format!("break *{first_work:#x}"),
            "reverse-continue".into(),
            "echo AT-FIRST-WORK\\n".into(),
            "p/x $pc".into(),
            "x/i $pc".into(),
            "monitor insns 0 end".into(),
            "monitor stats".into(),
            "kill".into(),
        ],
        TIMEOUT,
    );
    assert_eq!(r.hex_after("AT-FIRST-WORK"), first_work, "{}", r.dump());
    assert!(
        r.after("AT-FIRST-WORK").contains("push   %rbp"),
        "{}",
        r.dump()
    );
    let listed = monitor_insns_pcs(&r.gdb);
    assert_eq!(listed, truth, "the replayed history\n{}", r.dump());
    r.expect("decode errors            0");
}

/// Code replaced at the same address without an exec (a JIT, `dlclose` + `dlopen`):
/// `code_remap` copies two different functions in turn into a fresh executable mapping at
/// 0x70000000, calls and unmaps each. The recorder ends a period at each munmap of code (its
/// bytes read just before), so reverse-continue to 0x70000000 finds both calls and `x/i` shows
/// the code of each; the history equals the single-step ground truth. (One image would have
/// nothing at 0x70000000: the present process has unmapped it.)
#[test]
fn code_replaced_at_the_same_address_keeps_its_history() {
    if !have("gdb") {
        eprintln!("skipped: no gdb");
        return;
    }
    let program = programs().0.with_file_name("code_remap");
    let marker = nm_symbol(&program, "remap_marker");
    let truth = ground_truth(&program, &[], marker);
    // Where both calls of the mapped code return to (a breakpoint at 0x70000000 itself cannot
    // be inserted: nothing is mapped there at the present).
    let ret_site = truth
        .windows(2)
        .find(|w| w[0] >= 0x7000_0000 && w[1] < 0x7000_0000)
        .map(|w| w[1])
        .expect("a return from the mapped code");
    let server = Server::start(&program, &[]);
    let r = gdb_session(
        server,
        &program,
        &[
            format!("break *{marker:#x}"),
            "continue".into(),
            "delete".into(),
            format!("break *{ret_site:#x}"),
            "reverse-continue".into(),
            "reverse-stepi".into(),
            "reverse-stepi".into(),
            "echo SECOND-CALL\\n".into(),
            "p/x $pc".into(),
            "x/i $pc".into(),
            "reverse-continue".into(),
            "reverse-stepi".into(),
            "reverse-stepi".into(),
            "echo FIRST-CALL\\n".into(),
            "p/x $pc".into(),
            "x/i $pc".into(),
            "monitor insns 0 end".into(),
            "monitor stats".into(),
            "kill".into(),
        ],
        TIMEOUT,
    );
    assert_eq!(r.hex_after("SECOND-CALL"), 0x7000_0002, "{}", r.dump());
    assert!(
        r.after("SECOND-CALL").contains("add    $0x2,%eax"),
        "{}",
        r.dump()
    );
    assert_eq!(r.hex_after("FIRST-CALL"), 0x7000_0000, "{}", r.dump());
    assert!(
        r.after("FIRST-CALL").contains("mov    $0x1,%eax"),
        "{}",
        r.dump()
    );
    let listed = monitor_insns_pcs(&r.gdb);
    assert_eq!(
        listed,
        truth,
        "the history against the ground truth\n{}",
        r.dump()
    );
    r.expect("before the code was replaced (munmap 0x70000000-0x70001000)");
    r.expect("decode errors            0");
    r.expect("history check            ok");
}

/// Code replaced at the same address by another thread than the main one
/// (`examples/c/thread_remap.c`): the main thread calls `mov $1,%eax; ret` mapped at
/// 0x70000000, a second thread unmaps it and maps `xor %eax,%eax; add $2,%eax; ret` there, the
/// main thread calls that. The period ends at the second thread's `munmap` too (the code read
/// just before it; the main thread's stream gets the boundary, before its next instruction),
/// so reverse-continue to 0x70000000 finds both calls, and at the first `x/i` shows `mov` and
/// `stepi` goes to its `ret` at +5 (decoded against the present code, the first call would be
/// `xor`/`add`, the step landing at +2; memory in the threads' past showed the zeros the
/// second thread's copy overwrote).
#[test]
fn code_replaced_by_another_thread_keeps_the_main_threads_history() {
    if !have("gdb") {
        eprintln!("skipped: no gdb");
        return;
    }
    let program = programs().0.with_file_name("thread_remap");
    let server = Server::start(&program, &[]);
    let r = gdb_session(
        server,
        &program,
        &[
            "break remap_marker",
            "continue",
            "delete",
            // Mapped at the present (the second code), so GDB can insert it.
            "break *0x70000000",
            "reverse-continue",
            "echo SECOND-CALL\\n",
            "p/x $pc",
            "x/i $pc",
            "reverse-continue",
            "echo FIRST-CALL\\n",
            "p/x $pc",
            "x/i $pc",
            "stepi",
            "echo FIRST-NEXT\\n",
            "p/x $pc",
            "delete",
            "monitor stats",
            "kill",
        ],
        TIMEOUT,
    );
    // Said once, going back into the first period; not at the live stop at the marker
    // after running across the replacement (it was: "… (from instruction N, after the code
    // was replaced …)"), nor anywhere else: no stop lands in the later period coming from
    // the earlier one.
    assert_eq!(
        r.gdb.matches("now in the history of").count(),
        1,
        "{}",
        r.dump()
    );
    assert!(!r.gdb.contains("(from instruction"), "{}", r.dump());
    assert_eq!(r.hex_after("SECOND-CALL"), 0x7000_0000, "{}", r.dump());
    assert!(
        r.after("SECOND-CALL").contains("xor    %eax,%eax"),
        "{}",
        r.dump()
    );
    assert_eq!(r.hex_after("FIRST-CALL"), 0x7000_0000, "{}", r.dump());
    assert!(
        r.after("FIRST-CALL").contains("mov    $0x1,%eax"),
        "{}",
        r.dump()
    );
    assert_eq!(r.hex_after("FIRST-NEXT"), 0x7000_0005, "{}", r.dump());
    r.expect("code periods ended       1 (exec 0, code unmapped or mapped over 1)");
    r.expect("decode errors            0");
    r.expect("history check            ok");
}
