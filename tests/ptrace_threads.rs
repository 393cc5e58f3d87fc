//! The ptrace backend records every thread: one PT stream per thread, each decoding to exactly
//! the instructions the single-stepper saw that thread execute; TSC packets from one global
//! instruction clock that put the threads' instructions back in their exact global order; one
//! state log that rebuilds every thread's registers at any global position. And the live side
//! through real GDB: breakpoints and crashes in workers reported in their thread, every thread
//! listed and readable, a deadlock interrupted with Ctrl-C, hundreds of short-lived threads,
//! SIGKILL from outside.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod support;

use ptrewind::capture::soft::{RecordFrom, RecorderConfig, SoftRecorder, StepTarget, procmaps};
use ptrewind::flow::{FlowConfig, FlowDecoder, Item};
use ptrewind::target::{PtraceTarget, SpawnOptions};
use support::cbuild::compile_source;
use support::gdb::{GdbRun, Server, gdb_session, gdb_session_interrupting, ptrewind};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Main and two workers: deterministic work, a shared counter under a mutex, then join.
/// `crash`: worker 2 writes through a null pointer after its work. `deadlock`: main and worker 1
/// take two mutexes in opposite orders and wait forever. `churn N`: N short-lived threads, one
/// after the other.
const MT_SRC: &str = include_str!("../examples/c/mt_threads.c");

fn program() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| threaded_program("ptrace-threads", "mt", MT_SRC))
}

/// `src` compiled as a debuggable pthread program `name` in the test directory `dir`.
fn threaded_program(dir: &str, name: &str, src: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    compile_source("cc", &dir, name, src, &["-g", "-O0", "-pthread"], &[])
}

fn line_of(marker: &str) -> usize {
    MT_SRC
        .lines()
        .position(|l| l.contains(marker))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("no {marker}"))
}

/// Each instruction's global index from its stream's TSC: the TSC after a (re-)enable and in
/// a PSB+ is the global index of the next instruction, and the stream's instructions are
/// consecutive in the global order until the next TSC.
fn decode_with_global_index(trace: &[u8], image: &ptrewind::image::Image) -> Vec<(u64, u64)> {
    let mut dec = FlowDecoder::new(trace, image, FlowConfig::default());
    let mut out = Vec::new();
    let (mut base, mut k) = (u64::MAX, 0u64);
    while let Some(item) = dec.next_item() {
        if let Item::Insn(i) = item {
            if i.time != base {
                base = i.time;
                k = 0;
            }
            out.push((base + k, i.ip));
            k += 1;
        }
    }
    out
}

/// Records the three-thread program with a short time slice (many switches), stops it part
/// way, and checks the capture against the single-stepper's own per-thread logs:
/// * every thread's stream decodes to exactly its executed instructions;
/// * merging the streams by their TSC gives exactly the global order the state log keeps
///   (every global index once, owned by the thread that executed it);
/// * the state log rebuilds every live thread's RIP at 60 global positions from its present
///   registers (each thread's next instruction there).
#[test]
fn every_thread_stream_is_exact_and_tsc_gives_the_global_order() {
    let exe = program();
    let target =
        PtraceTarget::spawn(&OsString::from(exe), &[], &SpawnOptions::default()).expect("spawn");
    let config = RecorderConfig {
        log_ips: true,
        state_log: true,
        time_slice: 37,
        record_from: RecordFrom::Main,
        ..RecorderConfig::default()
    };
    let mut rec = SoftRecorder::new(target, config).expect("recorder");
    // Part way: until both workers exist, then a little more (every thread has work left).
    for _ in 0..200 {
        if rec.live_threads().len() >= 3 {
            break;
        }
        rec.run(Some(500)).expect("run");
    }
    assert_eq!(rec.live_threads().len(), 3, "the workers were not created");
    rec.run(Some(1_500)).expect("run");
    assert!(
        rec.quiesce().expect("quiesce").is_none(),
        "the program ended"
    );
    let (image, _) = procmaps::capture_image(rec.target()).expect("image");
    let mut present = BTreeMap::new();
    for tid in rec.live_threads() {
        rec.target().select_thread(tid).unwrap();
        present.insert(tid, StepTarget::regs(rec.target()).unwrap());
    }
    let recording = rec.finish().expect("finish");
    let stats = recording.stats;
    assert!(
        recording.threads.len() >= 3,
        "{:?}",
        recording.threads.len()
    );
    assert!(stats.switches > 10, "{stats:?}");
    let log = recording.state_log.as_ref().expect("state log");
    assert_eq!(log.len() as u64, stats.recorded);

    // Per thread: decoded == stepped; global indexes from TSC.
    let mut merged: Vec<(u64, i32)> = Vec::new();
    let mut logs: BTreeMap<i32, Vec<u64>> = BTreeMap::new();
    for t in &recording.threads {
        let truth = t.ip_log.clone().expect("ip log");
        let decoded = decode_with_global_index(&t.trace, &image);
        let ips: Vec<u64> = decoded.iter().map(|&(_, ip)| ip).collect();
        if ips != truth {
            let i = ips
                .iter()
                .zip(&truth)
                .position(|(a, b)| a != b)
                .unwrap_or(ips.len().min(truth.len()));
            eprintln!(
                "thread {} first diff at {i}: decoded {:x?} truth {:x?}",
                t.tid,
                &ips[i.saturating_sub(3)..(i + 5).min(ips.len())],
                &truth[i.saturating_sub(3)..(i + 5).min(truth.len())]
            );
            eprintln!(
                "decoded tail {:x?}\ntruth tail {:x?}",
                &ips[ips.len().saturating_sub(6)..],
                &truth[truth.len().saturating_sub(6)..]
            );
        }
        assert_eq!(
            ips.len(),
            truth.len(),
            "thread {}: instruction count",
            t.tid
        );
        assert!(ips == truth, "thread {}: decoded flow differs", t.tid);
        merged.extend(decoded.iter().map(|&(g, _)| (g, t.tid)));
        logs.insert(t.tid, truth);
    }
    merged.sort();
    assert_eq!(merged.len() as u64, stats.recorded);
    for (n, &(g, tid)) in merged.iter().enumerate() {
        assert_eq!(g, n as u64, "global index {n} missing or doubled");
        assert_eq!(
            log.thread_at(n),
            Some(tid),
            "global index {n}: wrong thread"
        );
    }
    assert!(
        logs.values().filter(|l| !l.is_empty()).count() >= 3,
        "three threads executed"
    );

    // Registers per thread at global positions: RIP = that thread's next instruction.
    let total = merged.len();
    let mut before_n: BTreeMap<i32, usize> = BTreeMap::new();
    let mut checked = 0;
    let step = (total / 60).max(1);
    for n in 0..=total {
        if n % step == 0 {
            for (&tid, regs) in &present {
                let done = before_n.get(&tid).copied().unwrap_or(0);
                let want = logs[&tid].get(done).copied().unwrap_or(regs.rip);
                let got = log.registers_at_thread(tid, n, regs).expect("in the log");
                assert_eq!(
                    got.rip, want,
                    "thread {tid} at global {n}: rip {:#x} != {want:#x}",
                    got.rip
                );
                checked += 1;
            }
        }
        if let Some(&(_, tid)) = merged.get(n) {
            *before_n.entry(tid).or_default() += 1;
        }
    }
    assert!(checked >= 60, "{checked}");
}

/// `ptrewind record --backend ptrace` of the test program; the process exits at its end
/// (`--no-stop-at-exit`) unless `extra` asks for `--stop-at-exit`.
fn record(args: &[&str], extra: &[&str]) -> Server {
    let at_exit: &[&str] = if extra.contains(&"--stop-at-exit") {
        &[]
    } else {
        &["--no-stop-at-exit"]
    };
    Server::spawn(
        ptrewind()
            .args(["record", "--backend", "ptrace", "--listen", "127.0.0.1:0"])
            .args(at_exit)
            .args(extra)
            .arg("--")
            .arg(program())
            .args(args),
    )
}

/// GDB: a breakpoint in a worker is reached and reported in that thread; `info threads` lists
/// all three; another thread's registers and backtrace are readable; the worker's crash is
/// reported in the worker; the server keeps the recording and says so.
#[test]
fn gdb_worker_breakpoint_and_crash_in_their_thread() {
    let shared = line_of("SHARED LINE");
    let r = gdb_session(
        record(&["crash"], &[]),
        program(),
        &[
            "break work if id == 2",
            "continue",
            "echo AT-WORK\\n",
            "info threads",
            "print id",
            "thread 1",
            "bt 1",
            "print $pc != 0",
            "delete",
            "continue",
            "echo CRASHED\\n",
            "info threads",
            "bt 2",
            "monitor stats",
            "continue",
        ],
        TIMEOUT,
    );
    let at_work = r.after("AT-WORK");
    assert!(
        at_work.contains("3 Thread") || at_work.matches("    Thread ").count() >= 3,
        "three threads\n{}",
        r.dump()
    );
    assert!(
        r.gdb.contains("hit Breakpoint 1, work (id=2"),
        "{}",
        r.dump()
    );
    r.expect("$1 = 2");
    r.expect("[Switching to thread 1 ");
    r.expect("$2 = 1");
    let crashed = r.after("CRASHED");
    assert!(
        r.gdb.contains("received signal SIGSEGV"),
        "no SIGSEGV\n{}",
        r.dump()
    );
    assert!(crashed.contains("#0  boom () at"), "{}", r.dump());
    assert!(crashed.contains("worker (arg=0x2)"), "{}", r.dump());
    assert!(crashed.contains("threads recorded"), "{}", r.dump());
    assert!(
        r.gdb.contains("terminated with signal SIGSEGV"),
        "{}",
        r.dump()
    );
    let _ = shared;
}

/// GDB: main and a worker deadlock; `continue` never returns by itself, Ctrl-C stops it with
/// SIGINT, every thread is listed where it waits, and the program can be killed.
#[test]
fn gdb_deadlock_interrupted_with_ctrl_c() {
    let start = Instant::now();
    let r = gdb_session_interrupting(
        record(&["deadlock"], &[]),
        program(),
        &[
            "continue",
            "echo INTERRUPTED\\n",
            "info threads",
            "thread apply all bt 8",
            "kill",
        ],
        TIMEOUT,
        || start.elapsed() > Duration::from_secs(4),
    );
    r.expect("received signal SIGINT");
    let after = r.after("INTERRUPTED");
    assert!(
        after.contains("MAIN BLOCKS") || after.contains("main ("),
        "{}",
        r.dump()
    );
    assert!(after.contains("worker (arg=0x1)"), "{}", r.dump());
}

/// 300 threads created and joined one after the other: each is recorded (own stream), the
/// program runs to its normal end, and `monitor stats` counts them.
#[test]
fn hundreds_of_short_lived_threads() {
    let done = line_of("CHURN DONE");
    let r = gdb_session(
        record(&["churn", "300"], &[]),
        program(),
        &[
            &format!("break {done}"),
            "continue",
            "print total",
            "monitor stats",
            "continue",
        ],
        TIMEOUT,
    );
    r.expect(&format!("$1 = {}", 300 * 299));
    assert!(
        r.gdb.contains("threads recorded         300"),
        "{}",
        r.dump()
    );
    r.expect("threads ended            300");
    r.expect("exited normally");
}

/// SIGKILL from outside while every thread waits (a deadlock), with the end of the program kept
/// (`--stop-at-exit`): GDB gets a stop at the end, every thread is listed, `monitor stats`
/// answers and counts the threads whose last system call never came back, and a further
/// `continue` reports the SIGKILL. Nothing hangs.
#[test]
fn sigkill_from_outside_with_threads_keeps_the_recording() {
    let server = record(&["deadlock"], &["--stop-at-exit"]);
    let pid = server.pid;
    let start = Instant::now();
    let mut killed = false;
    let r = gdb_session_interrupting(
        server,
        program(),
        &[
            "continue",
            "echo AT-END\\n",
            "info threads",
            "monitor stats",
            "continue",
        ],
        TIMEOUT,
        || {
            if !killed && start.elapsed() > Duration::from_secs(4) {
                // SAFETY: kill(2) with a pid we started (through ptrewind) and a signal number.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                killed = true;
            }
            false
        },
    );
    let at_end = r.after("AT-END");
    // The end is said as what it is: the signal the program dies of, not a trap.
    r.expect("the program was killed by signal 9 (SIGKILL): it stays stopped at its end");
    assert!(
        r.pos("received signal SIGKILL") < r.pos("AT-END"),
        "{}",
        r.dump()
    );
    assert!(at_end.matches("Thread ").count() >= 3, "{}", r.dump());
    assert!(
        at_end.contains("threads recorded         2"),
        "{}",
        r.dump()
    );
    assert!(
        at_end.contains("threads lost             2"),
        "{}",
        r.dump()
    );
    r.expect("Program terminated with signal SIGKILL");
    // Every thread's stream is whole at the stop at the exit: the threads' histories agree
    // with the state log (else the past falls back to the main thread's positions).
    assert!(!r.gdb.contains("the threads' streams hold"), "{}", r.dump());
}

/// The past of a multi-thread recording (before per-thread histories: positions are the main
/// thread's, every thread shown at that moment): from a worker's breakpoint, back to the start
/// of the recording, the shared counter both workers add to is 0 again (memory undone across
/// threads in their global order) and the worker is shown where it was then (being created);
/// forward again to the present, the counter and the worker's place are back.
#[test]
fn gdb_past_of_every_thread_at_the_main_threads_positions() {
    let r = gdb_session(
        record(&[], &[]),
        program(),
        &[
            "break work if id == 2",
            "continue",
            "delete",
            "break mt.c:25 if id == 2",
            "continue",
            "echo PRESENT\\n",
            "print shared",
            "thread 1",
            "delete",
            "reverse-continue",
            "echo START\\n",
            "print shared",
            "info threads",
            "echo START-END\\n",
            "continue",
            "echo BACK\\n",
            "print shared",
            "info threads",
            "kill",
        ],
        TIMEOUT,
    );
    let present: i64 = r
        .after("PRESENT")
        .lines()
        .find_map(|l| l.strip_prefix("$1 = "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no shared value\n{}", r.dump()));
    assert!(present > 0, "worker 1 has added its share\n{}", r.dump());
    let start = r.after("START");
    let start = &start[..start.find("START-END").unwrap_or(start.len())];
    r.expect("No more reverse-execution history");
    assert!(start.contains("$2 = 0"), "{}", r.dump());
    assert!(
        start.contains("* 1    Thread") && start.contains("main ("),
        "{}",
        r.dump()
    );
    assert!(!start.contains("worker (arg=0x2) at"), "{}", r.dump());
    let back = r.after("BACK");
    assert!(back.contains(&format!("$3 = {present}")), "{}", r.dump());
    assert!(back.contains("worker (arg=0x2) at"), "{}", r.dump());
}

/// GDB: both workers have run and exited (main past the join); reverse-continue to a
/// breakpoint in `work` stops in a worker's past, where that exited thread's registers are
/// exact (rebuilt from the registers it ended with): `id` and `n` (read through the frame
/// pointer), `$rdi` (the argument, untouched by the -O0 prologue) and the backtrace to the
/// worker's call are the program's, nothing unavailable.
#[test]
fn gdb_exited_workers_registers_in_the_past_are_exact() {
    let joined = line_of("JOINED");
    let r = gdb_session(
        record(&[], &[]),
        program(),
        &[
            format!("break mt.c:{joined}"),
            "continue".into(),
            "info threads".into(),
            "delete".into(),
            "break work".into(),
            "reverse-continue".into(),
            "echo PAST\\n".into(),
            "print id".into(),
            "print n".into(),
            "print $rdi == id".into(),
            "print n == 300 * id".into(),
            "info registers rdi rbp".into(),
            "bt 2".into(),
            "kill".into(),
        ],
        TIMEOUT,
    );
    let past = r.after("PAST");
    assert!(
        r.gdb.contains("hit Breakpoint 2, work (id="),
        "{}",
        r.dump()
    );
    assert!(!past.contains("unavailable"), "{}", r.dump());
    let id = ["1", "2"]
        .into_iter()
        .find(|id| past.contains(&format!("$1 = {id}\n")))
        .unwrap_or_else(|| panic!("no worker id\n{}", r.dump()));
    assert!(past.contains("$3 = 1"), "{}", r.dump());
    assert!(past.contains("$4 = 1"), "{}", r.dump());
    // The frame chain (rbp, rsp and the stack then) leads back to the worker's own call.
    assert!(
        past.contains(&format!("worker (arg=0x{id}) at")),
        "{}",
        r.dump()
    );
}

/// GDB stopped at a breakpoint on `work`'s one-line loop (in whichever worker reaches it
/// first), then `commands`, then two continues; no stop was a signal (in particular no SIGTRAP
/// in a thread GDB did not step) and the program exited normally.
fn at_the_work_loop(commands: &[&str]) -> GdbRun {
    let lp = format!("break {}", line_of("acc = acc * 31 + i;"));
    let all: Vec<&str> = [lp.as_str(), "continue"]
        .into_iter()
        .chain(commands.iter().copied())
        .chain(["continue", "continue"])
        .collect();
    let r = gdb_session(record(&[], &[]), program(), &all, TIMEOUT);
    assert!(!r.gdb.contains("received signal"), "{}", r.dump());
    r.expect("exited normally");
    r
}

/// GDB: `next` in a worker over `work`'s one-line loop (a range step) while the other worker
/// runs in its turns: the step ends in the thread GDB stepped, never as a SIGTRAP in another
/// one (reported so once: the recorder's turn passed to the other worker in the middle of a
/// step, and that worker's instruction ended the step), and the other worker's hit of the same
/// breakpoint meanwhile is reported in it.
#[test]
fn gdb_next_in_a_worker_while_the_other_runs() {
    let r = at_the_work_loop(&["next", "next", "next", "next"]);
    for id in [1, 2] {
        assert!(
            r.gdb.contains(&format!("hit Breakpoint 1, work (id={id}")),
            "worker {id}: {}",
            r.dump()
        );
    }
}

/// GDB with `scheduler-locking step`: `next` over `work`'s one-line loop in a worker (a range
/// step with no `c` for the others) runs that worker alone — the recorder's turn does not pass
/// to the other threads, one of which reaches the same breakpoint once it runs — and the
/// program runs on normally afterwards.
#[test]
fn gdb_scheduler_locked_next_runs_the_stepped_thread_alone() {
    let r = at_the_work_loop(&[
        "set scheduler-locking step",
        "echo LOCKED\\n",
        "next",
        "next",
        "echo RUN\\n",
        "set scheduler-locking off",
    ]);
    let locked = r.after("LOCKED");
    let locked = &locked[..locked.find("RUN").unwrap_or(locked.len())];
    assert!(!locked.contains("hit Breakpoint"), "{}", r.dump());
    assert!(
        r.after("RUN").contains("hit Breakpoint 1, work (id="),
        "{}",
        r.dump()
    );
}

/// Each position `monitor threads` gave thread `tid` (its instructions executed), in order,
/// with whether it was the selected thread.
fn positions_of(text: &str, tid: &str) -> Vec<(bool, u64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l
                .trim_start_matches(['*', ' '])
                .strip_prefix(&format!("thread {tid}: instruction "))?;
            Some((
                l.starts_with('*'),
                rest.split_whitespace().next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// GDB's default scheduler locking resumes the whole process for a reverse step (`Hc pPID.0`,
/// "any thread") after setting its general thread (`Hg`) to the thread the user selected:
/// `thread 1` at a worker's crash, then `reverse-stepi`, steps main one instruction back in
/// its own history, twice, and GDB stays in it. Before, the first thread listed (the crashed
/// worker) stepped and GDB switched to it ("Thread 2 received signal SIGTRAP"). `info threads`
/// first makes GDB read every thread's registers, so `thread 1` sends nothing and the `Hg`
/// comes only right before the resume.
#[test]
fn reverse_stepi_steps_the_thread_gdb_selected() {
    let r = gdb_session(
        record(&["crash"], &[]),
        program(),
        &[
            "continue",
            "info threads",
            "thread 1",
            "echo BEFORE\\n",
            r#"printf "PC %lx\n", $pc"#,
            "reverse-stepi",
            "echo AFTER\\n",
            r#"printf "PC %lx\n", $pc"#,
            "monitor threads",
            "reverse-stepi",
            "echo AGAIN\\n",
            "monitor threads",
            "info threads",
            "kill",
        ],
        TIMEOUT,
    );
    let main_tid = r
        .gdb
        .split("Thread ")
        .filter_map(|s| s.split_once(['.', ' ']))
        .find_map(|(pid, rest)| {
            let tid: String = rest.chars().take_while(char::is_ascii_digit).collect();
            (tid == pid).then_some(tid)
        })
        .unwrap_or_else(|| panic!("no main thread\n{}", r.dump()));
    let before = r.after("BEFORE");
    let before = &before[..before.find("AFTER").unwrap_or(before.len())];
    let after = r.after("AFTER");
    let after = &after[..after.find("AGAIN").unwrap_or(after.len())];
    let again = r.after("AGAIN");
    for text in [after, again] {
        assert!(!text.contains("Switching to Thread"), "{}", r.dump());
        assert!(!text.contains("received signal"), "{}", r.dump());
    }
    let pc = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("PC "))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no PC\n{}", r.dump()))
    };
    assert_ne!(pc(before), pc(after), "{}", r.dump());
    // GDB prints the monitor replies on another stream than the echoes: in order, but not
    // between the marks.
    let positions = positions_of(&r.gdb, &main_tid);
    let [(true, first), (true, second)] = positions[..] else {
        panic!(
            "main selected at two positions: {positions:?}\n{}",
            r.dump()
        );
    };
    assert_eq!(second + 1, first, "{}", r.dump());
    assert!(again.contains("* 1    Thread"), "{}", r.dump());
}

/// `monitor threads` at the present of a live process lists every thread of the recording:
/// the crashed worker (selected, at the end of its history, in `boom`), main with its present
/// PC, and worker 1, running or already ended. Before, the present showed the selected thread
/// alone, with "pc unknown".
#[test]
fn monitor_threads_at_the_present_lists_every_thread() {
    let r = gdb_session(
        record(&["crash"], &[]),
        program(),
        &["continue", "monitor threads", "kill"],
        TIMEOUT,
    );
    let lines: Vec<&str> = r
        .gdb
        .lines()
        .filter(|l| l.trim_start_matches(['*', ' ']).starts_with("thread "))
        .collect();
    assert_eq!(lines.len(), 3, "{}", r.dump());
    let tids: std::collections::BTreeSet<&str> = lines
        .iter()
        .filter_map(|l| l.trim_start_matches(['*', ' ']).split([' ', ':']).nth(1))
        .collect();
    assert_eq!(tids.len(), 3, "{}", r.dump());
    assert!(!r.gdb.contains("pc unknown"), "{}", r.dump());
    let selected: Vec<&&str> = lines.iter().filter(|l| l.starts_with('*')).collect();
    assert!(
        matches!(selected[..], [l] if l.contains("(at its end), pc 0x") && l.contains(" in boom")),
        "{}",
        r.dump()
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(": at the present, pc 0x") && !l.starts_with('*')),
        "{}",
        r.dump()
    );
}

/// Three workers that sleep in turns, then worker 1 writes through a null pointer.
const SLEEPERS_SRC: &str = r#"
#include <pthread.h>
#include <unistd.h>
volatile int counter[3];
int *bad;
void *w(void *a) {
    long id = (long)a;
    for (int i = 0; i < 15; i++) { counter[id]++; usleep(20000); }
    if (id == 1) *bad = 42;
    return 0;
}
int main(void) {
    pthread_t t[3];
    for (long i = 0; i < 3; i++) pthread_create(&t[i], 0, w, (void *)i);
    for (int i = 0; i < 3; i++) pthread_join(t[i], 0);
    return 0;
}
"#;

/// `ptrewind attach` to a process whose workers already run (they sleep): at the start of the
/// history every thread is listed, with its registers — they existed before the first
/// recorded instruction, waiting in `clock_nanosleep`/`futex`. Before, a thread was listed in
/// the past only from its own first recorded instruction, so the start of an attached
/// process's history showed main alone.
#[test]
fn attached_threads_exist_from_the_start_of_the_history() {
    let program = threaded_program("ptrace-threads-attach", "sleepers", SLEEPERS_SRC);
    let mut victim = std::process::Command::new(&program)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let server = Server::spawn(ptrewind().args([
        "attach",
        "--listen",
        "127.0.0.1:0",
        &victim.id().to_string(),
    ]));
    let r = gdb_session(
        server,
        &program,
        &[
            "continue",
            "echo CRASHED\\n",
            "reverse-continue",
            "echo START\\n",
            "info threads",
            "thread apply all print $pc != 0",
            "echo START-END\\n",
            "kill",
        ],
        TIMEOUT,
    );
    let _ = victim.kill();
    let _ = victim.wait();
    assert!(r.gdb.contains("received signal SIGSEGV"), "{}", r.dump());
    r.expect("No more reverse-execution history");
    let start = r.after("START");
    let start = &start[..start.find("START-END").unwrap_or(start.len())];
    assert_eq!(start.matches("  Thread ").count(), 4, "{}", r.dump());
    assert_eq!(start.matches("= 1").count(), 4, "{}", r.dump());
    assert!(!start.contains("Could not read registers"), "{}", r.dump());
}

/// A worker faults at a known address while main waits in its join.
const FAULT_SRC: &str = r#"
#include <pthread.h>
void *w(void *a) { (void)a; *(volatile int *)0xdead000 = 1; return 0; }
int main(void) { pthread_t t; pthread_create(&t, 0, w, 0); pthread_join(t, 0); return 0; }
"#;

/// GDB's `$_siginfo` (`qXfer:siginfo:read`) at a worker's crash: the kernel's `siginfo_t` of
/// the fault — signal, `SEGV_MAPERR`, the faulting address — for the thread that got it; none
/// for main, which stopped without a signal, nor in the past ("Unable to read siginfo", as
/// gdbserver answers). Before, every read was "Unable to read siginfo".
#[test]
fn siginfo_of_a_fault_is_the_kernels() {
    let program = threaded_program("ptrace-threads-siginfo", "fault", FAULT_SRC);
    let server = Server::spawn(
        ptrewind()
            .args(["record", "--backend", "ptrace", "--listen", "127.0.0.1:0"])
            .arg("--")
            .arg(&program),
    );
    let r = gdb_session(
        server,
        &program,
        &[
            "continue",
            r#"printf "SIGNO %d CODE %d ADDR %p\n", $_siginfo.si_signo, $_siginfo.si_code, $_siginfo._sifields._sigfault.si_addr"#,
            "thread 1",
            "print $_siginfo.si_signo",
            "thread 2",
            "reverse-stepi",
            "print $_siginfo.si_signo",
            "kill",
        ],
        TIMEOUT,
    );
    assert_eq!(
        r.tagged("SIGNO"),
        ["11 CODE 1 ADDR 0xdead000"],
        "{}",
        r.dump()
    );
    // GDB prints the errors on another stream than the echoes: counted, not placed.
    assert_eq!(
        r.gdb.matches("Unable to read siginfo").count(),
        2,
        "main's and the past's\n{}",
        r.dump()
    );
    assert!(!r.gdb.contains("$1 = "), "{}", r.dump());
}

/// `watch` + `reverse-continue` from the end of a multi-thread program: each worker's write of
/// the shared counter, latest first, then the start of the history — no stop on the way. The
/// system calls of threads (`clone3` writing the new thread's id, `futex` in every lock and
/// join, `madvise` freeing an exiting worker's stack, `ioctl(TCGETS)` from stdio) are known
/// writes now; each used to stop the search with "its memory writes are not all recorded".
#[test]
fn watch_reverse_continue_passes_the_system_calls_of_threads() {
    let r = gdb_session(
        record(&[], &["--stop-at-exit"]),
        program(),
        &[
            "continue",
            "watch shared",
            "reverse-continue",
            "reverse-continue",
            "reverse-continue",
            "kill",
        ],
        TIMEOUT,
    );
    assert!(r.gdb.contains("the program is exiting"), "{}", r.dump());
    assert!(!r.gdb.contains("not all recorded"), "{}", r.dump());
    assert_eq!(
        r.gdb.matches("hit Hardware watchpoint 1: shared").count(),
        2,
        "{}",
        r.dump()
    );
    assert!(r.gdb.contains("worker (arg=0x2)"), "{}", r.dump());
    assert!(r.gdb.contains("worker (arg=0x1)"), "{}", r.dump());
    r.expect("No more reverse-execution history");
}
