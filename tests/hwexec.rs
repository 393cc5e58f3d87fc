//! A hardware (perf.data) recording of a process that calls `execve` while traced is decoded
//! against each program's code: the exec is placed in the thread's trace by its sideband time
//! (`store::exec_cut`), a PSB opens the new program's period there, and each period's image
//! comes from the `MMAP2` records before and after the exec. Checked on a synthetic perf.data
//! built by the encoder (no Intel PT here), per thread and per CPU, against the instructions it
//! was built from: `decode --perf`, and `replay --perf` through real GDB (`monitor insns`,
//! memory and reverse-stepi on both sides of the exec). An exec whose place TSC packets do not
//! pin down is said, and the trace ends before it: nothing is decoded against the wrong code.

mod support;

use std::path::Path;
use std::time::Duration;

use support::gdb::{Server, gdb_session, ptrewind};
use support::hwexec::{self, CODE_A, CODE_B, Variant};

const TIMEOUT: Duration = Duration::from_secs(90);

/// A directory with the two programs and the perf.data of `v` naming them.
fn recording(v: Variant) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("progA");
    let b = dir.path().join("progB");
    std::fs::write(&a, CODE_A).unwrap();
    std::fs::write(&b, CODE_B).unwrap();
    let perf = dir.path().join("perf.data");
    let bytes = hwexec::perf_data(v, a.to_str().unwrap(), b.to_str().unwrap());
    std::fs::write(&perf, bytes).unwrap();
    (dir, perf)
}

/// `ptrewind decode --perf FILE`: the instruction addresses, stderr, and the exit status.
fn decode(perf: &Path) -> (Vec<u64>, String, Option<i32>) {
    let out = ptrewind()
        .args(["decode", "--perf"])
        .arg(perf)
        .output()
        .unwrap();
    let ips = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("0x"))
        .map(|h| u64::from_str_radix(h, 16).unwrap())
        .collect();
    (
        ips,
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

#[test]
fn decode_per_thread_switches_program_at_the_exec() {
    let (_dir, perf) = recording(Variant::default());
    let (ips, err, code) = decode(&perf);
    assert_eq!(ips, hwexec::truth(), "{err}");
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("execve of process 300 (progB)"), "{err}");
}

#[test]
fn decode_per_cpu_switches_program_at_the_exec() {
    let (_dir, perf) = recording(Variant {
        per_cpu: true,
        ..Variant::default()
    });
    let (ips, err, code) = decode(&perf);
    assert_eq!(ips, hwexec::truth(), "{err}");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("split by context switches into 1 thread"),
        "{err}"
    );
}

/// The exec lies after A's first region, but TSC packets do not say whether before or after
/// its second: that is said, the exit status is 2, and only what certainly ran A is decoded.
#[test]
fn an_exec_that_cannot_be_placed_ends_the_trace_before_it() {
    for per_cpu in [false, true] {
        let (_dir, perf) = recording(Variant {
            per_cpu,
            ambiguous: true,
            ..Variant::default()
        });
        let (ips, err, code) = decode(&perf);
        assert_eq!(ips, hwexec::truth_before_ambiguity(), "{err}");
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("cannot be placed"), "{err}");
        assert!(
            err.contains("2 places in the trace fit its time and mappings"),
            "{err}"
        );
    }
}

/// The same recording with no TSC but its PSBs' (a CPU-wide recording sets TraceEn once)
/// and MTCs around every region: the MTC times before and after A's second region put the
/// exec after it, in the one place that fits, and both programs decode whole — per thread
/// and per CPU.
#[test]
fn mtc_times_place_an_exec_between_timestamps() {
    for per_cpu in [false, true] {
        let (_dir, perf) = recording(Variant {
            per_cpu,
            ambiguous: true,
            mtc: true,
            ..Variant::default()
        });
        let (ips, err, code) = decode(&perf);
        assert_eq!(ips, hwexec::truth(), "per CPU {per_cpu}: {err}");
        assert_eq!(code, Some(0), "per CPU {per_cpu}: {err}");
        assert!(err.contains("execve of process 300 (progB)"), "{err}");
    }
}

/// `replay --perf` serves the history across the exec: every instruction in order, the new
/// program's bytes at the end, the old program's at the start (its period's code), and
/// reverse-stepi through the new program.
#[test]
fn replay_serves_both_programs() {
    for (per_cpu, migrate_at_exec) in [(false, false), (true, false), (true, true)] {
        let (_dir, perf) = recording(Variant {
            per_cpu,
            migrate_at_exec,
            ..Variant::default()
        });
        let mut cmd = ptrewind();
        cmd.args(["replay", "--listen", "127.0.0.1:0", "--perf"])
            .arg(&perf);
        let truth = hwexec::truth();
        let back = format!("reverse-stepi {}", truth.len() - 3);
        let cmds = [
            "nosharedlibrary",
            "symbol-file",
            "maintenance flush register-cache",
            "monitor insns 0 end",
            r#"printf "PC %lx\n", $pc"#,
            r#"printf "BYTE %x\n", *(unsigned char *)$pc"#,
            "reverse-stepi",
            r#"printf "PC %lx\n", $pc"#,
            "reverse-stepi",
            r#"printf "PC %lx\n", $pc"#,
            &back,
            r#"printf "PC %lx\n", $pc"#,
            r#"printf "BYTE %x\n", *(unsigned char *)$pc"#,
        ];
        let r = gdb_session(
            Server::spawn(&mut cmd),
            Path::new("/bin/true"),
            &cmds,
            TIMEOUT,
        );
        // GDB prints `monitor` output on stderr, which the session collects after stdout.
        let served: Vec<u64> = r
            .gdb
            .lines()
            .filter_map(|l| l.split_once(" 0x"))
            .filter(|(n, _)| n.trim().parse::<u64>().is_ok())
            .filter_map(|(_, a)| u64::from_str_radix(a.trim(), 16).ok())
            .collect();
        assert_eq!(served, truth, "per_cpu {per_cpu}: {}", r.dump());
        // The period the history starts in is named when the cursor gets there, with where
        // the next program starts (`next_insn`, found at its PSB when indexed).
        r.expect("progA (instructions 0..5, before its exec)");
        // At the end: B's `jne` at 0x1005 (A has the `jne .`'s offset byte there); back two
        // instructions: B's `nop`, `jne`; back to the first instruction: A's `jne .` at 0x1000.
        assert_eq!(
            r.tagged("PC"),
            ["1005", "1004", "1005", "1000"],
            "per_cpu {per_cpu}: {}",
            r.dump()
        );
        assert_eq!(
            r.tagged("BYTE"),
            ["75", "75"],
            "per_cpu {per_cpu}: {}",
            r.dump()
        );
    }
}
