//! What a new user meets around a recording: the program check before recording, warnings
//! printed once, symbol names in `monitor history` (checked against GDB's `info symbol`), and
//! the GDB/MI commands VS Code's C/C++ extension sends for its reverse buttons.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::cbuild::{compile_source, have};
use support::gdb::{Server, gdb_session, ptrewind, run_until, wait_until};

const TIMEOUT: Duration = Duration::from_secs(120);

/// `ptrewind record --backend ptrace` (the live recording these checks are about; `auto` may
/// pick QEMU, which records the whole run first) on `exe`.
fn ptrace_server(exe: &Path) -> Server {
    Server::spawn(
        ptrewind()
            .args([
                "record",
                "--backend",
                "ptrace",
                "--listen",
                "127.0.0.1:0",
                "--",
            ])
            .arg(exe),
    )
}

/// Calls into libc through the PLT (snprintf's formatting internals, qsort with a callback,
/// puts).
const LIBC_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
int main(void) {
    char buf[64];
    int v[5] = {5, 3, 9, 1, 7};
    snprintf(buf, sizeof buf, "%d-%s-%x", 42, "abc", 255);
    qsort(v, 5, sizeof v[0], cmp);
    puts(buf);
    return v[0] == 1 ? 0 : 1;
}
"#;

/// GDB Python: every address `monitor history` names, asked to GDB's `info symbol` in the same
/// session; prints `SAME n DIFF m` and each difference. GDB drops a clone suffix (`.part.0`
/// shows as `.part`): a name equal up to a trailing `.N` counts as the same.
const COMPARE_PY: &str = r#"
import gdb, re
out = gdb.execute("monitor history 3000", to_string=True)
seen = set(); same = diff = plt = 0
for m in re.finditer(r"(0x[0-9a-f]+) (\S+)", out):
    addr, sym = int(m.group(1), 16), m.group(2)
    mm = re.match(r"(.*?)(?:\+(\d+))?$", sym)
    name, off = mm.group(1), int(mm.group(2) or 0)
    if addr in seen:
        continue
    seen.add(addr)
    g = gdb.execute("info symbol %#x" % addr, to_string=True).strip()
    gm = re.match(r"(\S+)(?: \+ (\d+))? in section", g)
    gname, goff = (gm.group(1), int(gm.group(2) or 0)) if gm else ("??", 0)
    if (gname, goff) in ((name, off), (re.sub(r"\.\d+$", "", name), off)):
        same += 1
        plt += name.endswith("@plt")
    else:
        diff += 1
        print("DIFF %#x ours %s+%d gdb %s" % (addr, name, off, g))
print("PLT %d" % plt)
print("SAME %d DIFF %d" % (same, diff))
"#;

/// `monitor history` names every address as GDB's `info symbol` does: functions inside
/// stripped libc (from its separate debug file when installed, as GDB finds it), PLT entries
/// (`qsort@plt`), aliases (`free`, not `__libc_free`), and nothing past the end of a sized
/// symbol. Before, snprintf's internals showed as `_IO_vfprintf+12403`.
#[test]
fn history_symbols_match_gdb_info_symbol() {
    if !have("gdb") || !have("cc") {
        eprintln!("SKIPPED: gdb or cc missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_source("cc", dir.path(), "libc", LIBC_C, &["-g", "-O0"], &[]);
    let py = dir.path().join("compare.py");
    std::fs::write(&py, COMPARE_PY).unwrap();
    let g = gdb_session(
        ptrace_server(&exe),
        &exe,
        &[
            "break puts".to_string(),
            "continue".into(),
            format!("source {}", py.display()),
        ],
        TIMEOUT,
    );
    let summary = g
        .gdb
        .lines()
        .find_map(|l| l.strip_prefix("SAME "))
        .unwrap_or_else(|| panic!("no comparison\n{}", g.dump()));
    let (same, diff) = summary.split_once(" DIFF ").unwrap();
    let (same, diff): (u32, u32) = (same.parse().unwrap(), diff.parse().unwrap());
    assert_eq!(diff, 0, "{}", g.dump());
    // snprintf, qsort and the loader's lazy binding: hundreds of distinct branch addresses.
    assert!(same > 100, "only {same} addresses compared\n{}", g.dump());
    // Calls through the PLT (snprintf@plt, qsort@plt, puts@plt) were among them.
    let plt: u32 = g.tagged("PLT")[0].parse().unwrap();
    assert!(plt >= 3, "{}", g.dump());
}

/// A text file is refused before anything runs (the system would have run it with
/// /bin/sh, and the shell would have been recorded); a `#!` script is recorded, and ptrewind
/// says that its interpreter is what is recorded.
#[test]
fn programs_that_are_not_elf_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "echo hello\n").unwrap();
    let script = dir.path().join("run.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 3\n").unwrap();
    for p in [&text, &script] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let r = run_until(
        ptrewind()
            .args(["record", "--backend", "soft", "--"])
            .arg(&text),
        TIMEOUT,
    );
    assert_eq!(r.status.and_then(|s| s.code()), Some(2), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("is not an ELF executable (nor a `#!` script)"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("started process"), "{}", r.stderr);
    // The script: the note, then the usual start (the server is killed at once).
    let server = Server::spawn(
        ptrewind()
            .args([
                "record",
                "--backend",
                "soft",
                "--listen",
                "127.0.0.1:0",
                "--",
            ])
            .arg(&script),
    );
    let mut child = server.child;
    let _ = child.kill();
    let _ = child.wait();
    let err = server.stderr.join().unwrap();
    assert!(
        err.contains("is a script: the kernel runs its interpreter `/bin/sh`"),
        "{err}"
    );
}

/// `ptrewind gdb` shares its terminal with GDB: a warning (here: the fork child followed by
/// `--follow-fork child`, and the vfork child detached, neither reported to GDB) is shown
/// once, in GDB's console, not a second time on ptrewind's stderr.
#[test]
fn ptrewind_gdb_prints_each_warning_once() {
    if !have("gdb") || !have("cc") {
        eprintln!("SKIPPED: gdb or cc missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/c/fork.c");
    let exe = dir.path().join("fork");
    support::cbuild::cc([
        "-g".as_ref(),
        "-O0".as_ref(),
        "-pthread".as_ref(),
        "-o".as_ref(),
        exe.as_os_str(),
        src.as_os_str(),
    ]);
    let r = run_until(
        ptrewind()
            .args([
                "gdb",
                "--backend",
                "ptrace",
                "--follow-fork",
                "child",
                "--batch",
                "--ex",
                "continue",
                "--",
            ])
            .arg(&exe),
        TIMEOUT,
    );
    let all = format!("{}{}", r.stdout, r.stderr);
    let n = all.matches("child process ").count();
    assert!(n >= 1, "no fork warning\n{all}");
    let pids: std::collections::HashSet<&str> = all
        .match_indices("child process ")
        .map(|(i, m)| all[i + m.len()..].split(';').next().unwrap_or(""))
        .collect();
    assert_eq!(n, pids.len(), "a fork warning was printed twice\n{all}");
}

/// A program whose calls say where a reverse command must stop.
const REV_C: &str = r#"
#include <stdio.h>
int add(int a, int b) {
    int s = a + b;
    return s;
}
int twice(int x) {
    int y = add(x, x);
    return y;
}
int main(void) {
    int t = 0;
    t += twice(1);
    t += twice(2);
    printf("t=%d\n", t); /* PRINT */
    return t == 6 ? 0 : 1;
}
"#;

/// GDB/MI driven as VS Code's C/C++ extension (MIEngine) drives it for Step Back (`-exec-step
/// --reverse`, `-exec-next --reverse`), Step Out backwards (`-exec-finish --reverse`) and
/// Reverse Continue (`-exec-continue --reverse`): each `*stopped` record is at the PC the same
/// commands reach in GDB's command line against another recording of the program.
#[test]
fn gdb_mi_reverse_commands_as_cpptools_sends_them() {
    if !have("gdb") || !have("cc") {
        eprintln!("SKIPPED: gdb or cc missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_source("cc", dir.path(), "rev", REV_C, &["-g", "-O0"], &[]);
    let print = REV_C.lines().position(|l| l.contains("PRINT")).unwrap() + 1;
    let steps = [
        ("reverse-next", "-exec-next --reverse"),
        ("reverse-next", "-exec-next --reverse"),
        ("reverse-step", "-exec-step --reverse"),
        ("reverse-step", "-exec-step --reverse"),
        ("reverse-finish", "-exec-finish --reverse"),
        ("continue", "-exec-continue"),
        ("break add", "-break-insert add"),
        ("reverse-continue", "-exec-continue --reverse"),
        ("reverse-continue", "-exec-continue --reverse"),
    ];
    // The reference: GDB's CLI, the PC after each command.
    let mut cli = vec![format!("break {print}"), "continue".into()];
    for (c, _) in steps {
        cli.push(c.into());
        cli.push("printf \"PC %lx\\n\", $pc".into());
    }
    let g = gdb_session(ptrace_server(&exe), &exe, &cli, TIMEOUT);
    let want = g.tagged("PC");
    assert_eq!(want.len(), steps.len(), "{}", g.dump());
    // With ptrewind's GDB script (which `ptrewind gdb` loads) reverse-next, reverse-step and
    // reverse-finish are its replacements; where the stack pointer is known they must run GDB's
    // own commands and land where GDB's do.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gdb-scripts/ptrewind.py");
    let mut scripted = vec![format!("source {}", script.display())];
    scripted.extend(cli.iter().cloned());
    let s = gdb_session(ptrace_server(&exe), &exe, &scripted, TIMEOUT);
    assert_eq!(s.tagged("PC"), want, "{}\n{}", s.dump(), g.dump());
    assert!(!s.gdb.contains("ptrewind: reverse-"), "{}", s.dump());

    // GDB/MI over pipes.
    let server = ptrace_server(&exe);
    let mut gdb = Command::new("gdb")
        .args(["--interpreter=mi2", "-nx", "-q"])
        .arg(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run gdb");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = gdb.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut stdin = gdb.stdin.take().unwrap();
    let mut log = String::new();
    let wait_for = |prefix: &str, log: &mut String| -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {prefix} from GDB/MI\n{log}"));
            log.push_str(&line);
            log.push('\n');
            if line.starts_with(prefix) {
                return line;
            }
        }
    };
    let mut send = |cmd: &str, log: &mut String| {
        log.push_str(&format!(">> {cmd}\n"));
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
    };
    for cmd in [
        "-gdb-set confirm off",
        "-gdb-set pagination off",
        &format!("-target-select remote 127.0.0.1:{}", server.port),
        &format!("-break-insert {print}"),
    ] {
        send(cmd, &mut log);
        wait_for("^", &mut log);
    }
    send("-exec-continue", &mut log);
    wait_for("*stopped", &mut log);
    let mut got = Vec::new();
    for (_, mi) in steps {
        send(mi, &mut log);
        if mi.starts_with("-break-insert") {
            wait_for("^done", &mut log);
            let pc = got.last().cloned().unwrap_or_default();
            got.push(pc);
            continue;
        }
        let stop = wait_for("*stopped", &mut log);
        let pc = stop
            .split("frame={addr=\"0x")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_else(|| panic!("no frame address in {stop}\n{log}"));
        got.push(pc.trim_start_matches('0').to_string());
    }
    send("-gdb-exit", &mut log);
    let _ = wait_until(&mut gdb, Instant::now() + Duration::from_secs(30));
    let mut child = server.child;
    let _ = wait_until(&mut child, Instant::now() + Duration::from_secs(30));
    assert_eq!(got, want, "MI and CLI stop apart\n{log}\n{}", g.dump());
    // The last two are the breakpoint in add, reached backwards (twice(2)'s call, then
    // twice(1)'s).
    assert!(log.contains("reason=\"breakpoint-hit\""), "{log}");
}

/// A program with a function the debugger can call.
const CALL_C: &str = r#"
#include <stdio.h>
char greeting[] = "hello, world";
int add(int a, int b) { return a + b; }
int main(void) {
    int t = add(1, 2);
    printf("%s %d\n", greeting, t); /* STOP */
    return 0;
}
"#;

/// GDB's inferior calls (`print add(2, 3)`) run as a diversion outside the recording: the
/// results are right, and the history length, `monitor calls` and the previous instruction
/// are exactly what they were before; recording goes on afterwards (`next`), with the
/// history check passing and the calls counted in `monitor stats`.
#[test]
fn gdb_inferior_calls_stay_out_of_the_history() {
    if !have("gdb") || !have("cc") {
        eprintln!("SKIPPED: gdb or cc missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_source("cc", dir.path(), "call", CALL_C, &["-g", "-O0"], &[]);
    let stop = CALL_C.lines().position(|l| l.contains("STOP")).unwrap() + 1;
    let look = |tag: &str| -> Vec<String> {
        // Monitor output captured by GDB's Python and printed on one tagged line.
        let tagged = |what: &str| {
            format!(
                "python print(\"{tag} \" + gdb.execute(\"monitor {what}\", to_string=True).replace(\"\\n\", \"|\"))"
            )
        };
        vec![
            tagged("where"),
            tagged("calls"),
            "reverse-stepi".into(),
            "printf \"PC %lx\\n\", $pc".into(),
            "stepi".into(),
        ]
    };
    let mut cmds = vec![format!("break {stop}"), "continue".into()];
    cmds.extend(look("BEFORE"));
    cmds.push("print add(2, 3)".into());
    cmds.push("print add(5, 3)".into());
    cmds.extend(look("AFTER"));
    cmds.push("next".into());
    cmds.push("monitor stats".into());
    let g = gdb_session(ptrace_server(&exe), &exe, &cmds, TIMEOUT);
    g.expect("$1 = 5");
    g.expect("$2 = 8");
    let (before, after) = (g.tagged("BEFORE"), g.tagged("AFTER"));
    assert_eq!(before.len(), 2, "{}", g.dump());
    assert!(
        before[0].contains("at the present: instruction"),
        "{}",
        g.dump()
    );
    assert!(before[1].contains("add"), "{}", g.dump());
    // Same position, same history length, same calls.
    assert_eq!(before, after, "{}", g.dump());
    let pcs = g.tagged("PC");
    assert_eq!(pcs.len(), 2, "{}", g.dump());
    assert_eq!(pcs[0], pcs[1], "{}", g.dump());
    g.expect("debugger calls           2 (run outside the recording)");
    g.expect("history check            ok");
}
