//! The GDB remote-protocol client (`capture::qemu::remote`) against a real `qemu-x86_64 -g`
//! running a C program built here: breakpoints, registers, memory, threads, a SIGSEGV stop,
//! interrupting a loop, exit status, a killed QEMU, and the launcher's errors.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ptrewind::capture::qemu::remote::{
    Action, BreakKind, LaunchError, QemuLaunch, QemuProcess, Remote, RemoteError, ResumeAction,
    StopReply, ThreadId, gdb_signal,
};
use support::cbuild::{compile_source, have, nm_symbol};

const PROGRAM: &str = r#"
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

volatile long counter;
int exit_code = 3;
char message[16] = "hello qemu";

__attribute__((noinline)) int hit(int x) { return x + 1; }
__attribute__((noinline)) void worker_started(long id) { counter += id; }
void *worker(void *arg) { worker_started(42); return arg; }
__attribute__((noinline)) void spin(void) { for (;;) counter++; }

/* The faulting store has its own symbol, so the test knows the PC the SIGSEGV must stop at. */
__asm__(".text\n.globl crash_at\n.type crash_at,@function\ncrash_at:\n movl $1, 0\n ret\n");
void crash_at(void);

int main(int argc, char **argv) {
    char mode = argc > 1 ? argv[1][0] : 'n';
    hit(1);
    if (mode == 's') crash_at();
    if (mode == 'l') spin();
    if (mode == 'a') abort();
    if (mode == 't') {
        pthread_t t;
        pthread_create(&t, 0, worker, 0);
        pthread_join(t, 0);
    }
    hit(2);
    return exit_code;
}
"#;

const WAIT: Option<Duration> = Some(Duration::from_secs(60));

struct Prog {
    _dir: tempfile::TempDir,
    exe: PathBuf,
}

impl Prog {
    fn sym(&self, name: &str) -> u64 {
        nm_symbol(&self.exe, name)
    }
}

fn build() -> Option<Prog> {
    if !have("qemu-x86_64") {
        eprintln!("skipped: qemu-x86_64 not installed (package qemu-user)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_source(
        "cc",
        dir.path(),
        "qprog",
        PROGRAM,
        &["-g", "-O0", "-no-pie", "-pthread"],
        &[],
    );
    Some(Prog { _dir: dir, exe })
}

fn start(exe: &Path, mode: &str) -> (QemuProcess, Remote<std::os::unix::net::UnixStream>) {
    let mut l = QemuLaunch::new(exe, [mode]);
    l.stdout = Some(Stdio::null());
    l.launch().expect("launch qemu")
}

fn pc(r: &mut Remote<std::os::unix::net::UnixStream>, t: Option<ThreadId>) -> u64 {
    r.read_register_u64(t, "rip").unwrap()
}

fn signal_stop(s: &StopReply) -> (u8, ThreadId) {
    match s {
        StopReply::Signal {
            signal,
            thread: Some(t),
            ..
        } => (*signal, *t),
        other => panic!("expected a signal stop with a thread, got {other:?}"),
    }
}

/// Continues past a breakpoint at the current PC: QEMU re-reports a breakpoint at the PC a
/// thread resumes from, so it is lifted for one step (as GDB does).
fn step_over(r: &mut Remote<std::os::unix::net::UnixStream>, t: ThreadId, bp: u64) {
    assert!(r.remove_breakpoint(BreakKind::Software, bp, 1).unwrap());
    r.step(Some(t)).unwrap();
    let (sig, _) = signal_stop(&r.wait(WAIT).unwrap().unwrap());
    assert_eq!(sig, gdb_signal::TRAP);
    assert_ne!(pc(r, Some(t)), bp);
    assert!(r.insert_breakpoint(BreakKind::Software, bp, 1).unwrap());
}

#[test]
fn breakpoint_registers_memory_and_exit_status() {
    let Some(p) = build() else { return };
    let (mut proc, mut r) = start(&p.exe, "n");
    // Stopped at the first instruction: the dynamic loader's entry, the stub's thread named.
    let (sig, main) = signal_stop(r.initial_stop());
    assert_eq!(sig, gdb_signal::TRAP);
    assert_eq!(
        main.tid,
        i64::from(proc.pid()),
        "the main thread's id is QEMU's pid"
    );
    assert!(r.layout().by_name("fs_base").is_some() && r.layout().by_name("xmm0").is_some());

    // The auxiliary vector names the program's entry (AT_ENTRY = 9).
    let auxv = r.auxv().unwrap();
    let entry = auxv
        .chunks_exact(16)
        .find(|e| u64::from_le_bytes(e[..8].try_into().unwrap()) == 9)
        .map(|e| u64::from_le_bytes(e[8..].try_into().unwrap()));
    assert_eq!(entry, Some(p.sym("_start")));

    let hit = p.sym("hit");
    assert!(r.insert_breakpoint(BreakKind::Software, hit, 1).unwrap());
    r.cont().unwrap();
    let (sig, t) = signal_stop(&r.wait(WAIT).unwrap().unwrap());
    assert_eq!((sig, t), (gdb_signal::TRAP, main));
    let regs = r.read_registers(Some(t)).unwrap();
    let layout = r.layout().clone();
    assert_eq!(regs.u64(&layout, "rip"), Some(hit));
    assert_eq!(regs.u64(&layout, "rdi"), Some(1), "hit(1)'s argument");
    let rsp = regs.u64(&layout, "rsp").unwrap();
    // The return address on the stack points into main.
    let ret = u64::from_le_bytes(r.read_memory(rsp, 8).unwrap().try_into().unwrap());
    let main_sym = p.sym("main");
    assert!(
        ret > main_sym && ret < main_sym + 0x200,
        "return address {ret:#x} not in main {main_sym:#x}"
    );
    assert_ne!(
        r.read_register_u64(Some(t), "fs_base").unwrap(),
        0,
        "TLS set up by the loader"
    );

    // Memory: read a string, write it and the exit code, read back.
    let msg = p.sym("message");
    assert_eq!(r.read_memory(msg, 10).unwrap(), b"hello qemu");
    r.write_memory(msg, b"#$}*patched").unwrap();
    assert_eq!(r.read_memory(msg, 11).unwrap(), b"#$}*patched");
    r.write_memory(p.sym("exit_code"), &7u32.to_le_bytes())
        .unwrap();
    // A big read crosses several packets.
    let text = r.read_memory(main_sym & !0xfff, 10_000).unwrap();
    assert_eq!(text.len(), 10_000);
    // Breakpoints do not show in memory (QEMU's are in the translator).
    assert_ne!(r.read_memory(hit, 1).unwrap(), [0xcc]);
    // Unmapped memory is an error reply.
    assert!(matches!(
        r.read_memory(8, 4),
        Err(RemoteError::ErrorReply { .. })
    ));
    // QEMU 7.2 user mode has no watchpoints: reported as unsupported, not as an error.
    assert!(
        !r.insert_breakpoint(BreakKind::Write, p.sym("counter"), 8)
            .unwrap()
    );

    // Writing a register: rdi = 41 makes hit's argument 41 (checked through rax at the second
    // stop would need the return; the value read back suffices).
    r.write_register(Some(t), "rdi", &41u64.to_le_bytes())
        .unwrap();
    assert_eq!(r.read_register_u64(Some(t), "rdi").unwrap(), 41);

    step_over(&mut r, t, hit);
    r.cont().unwrap();
    let (_, t2) = signal_stop(&r.wait(WAIT).unwrap().unwrap());
    assert_eq!(pc(&mut r, Some(t2)), hit);
    assert_eq!(r.read_register_u64(Some(t2), "rdi").unwrap(), 2, "hit(2)");
    assert!(r.remove_breakpoint(BreakKind::Software, hit, 1).unwrap());
    r.cont().unwrap();
    assert_eq!(
        r.wait(WAIT).unwrap(),
        Some(StopReply::Exited {
            status: 7,
            pid: None
        }),
        "the exit code written into the program's memory"
    );
    let status = proc.wait_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(status.code(), Some(7));
}

#[test]
fn second_thread_is_listed_and_stops_with_its_own_id() {
    let Some(p) = build() else { return };
    let (_proc, mut r) = start(&p.exe, "t");
    let (_, main) = signal_stop(r.initial_stop());
    let ws = p.sym("worker_started");
    assert!(r.insert_breakpoint(BreakKind::Software, ws, 1).unwrap());
    r.cont().unwrap();
    let (sig, t) = signal_stop(&r.wait(WAIT).unwrap().unwrap());
    assert_eq!(sig, gdb_signal::TRAP);
    assert_ne!(t, main, "the worker thread stopped");
    assert_eq!(pc(&mut r, Some(t)), ws);
    assert_eq!(r.read_register_u64(Some(t), "rdi").unwrap(), 42);
    let threads = r.threads().unwrap();
    assert!(
        threads.contains(&main) && threads.contains(&t),
        "{threads:?}"
    );
    // QEMU's `qC` names the process's first thread, not the one that stopped: the stop
    // reply's `thread:` is what says which thread stopped.
    assert_eq!(r.current_thread().unwrap(), main);
    // The main thread (in pthread_join, not stopped by QEMU's stub) has its own registers.
    let main_pc = pc(&mut r, Some(main));
    assert_ne!(main_pc, ws);
    // Its fs_base differs from the worker's (each thread has its own TLS block).
    let fs_main = r.read_register_u64(Some(main), "fs_base").unwrap();
    let fs_worker = r.read_register_u64(Some(t), "fs_base").unwrap();
    assert_ne!(fs_main, fs_worker);
    assert!(r.remove_breakpoint(BreakKind::Software, ws, 1).unwrap());
    r.cont().unwrap();
    assert_eq!(
        r.wait(WAIT).unwrap(),
        Some(StopReply::Exited {
            status: 3,
            pid: None
        })
    );
}

#[test]
fn sigsegv_stops_at_the_faulting_instruction_and_terminates() {
    let Some(p) = build() else { return };
    let (mut proc, mut r) = start(&p.exe, "s");
    r.cont().unwrap();
    let (sig, t) = signal_stop(&r.wait(WAIT).unwrap().unwrap());
    assert_eq!(sig, gdb_signal::SEGV);
    assert_eq!(pc(&mut r, Some(t)), p.sym("crash_at"));
    // Delivering the signal kills the program: the stub says so before QEMU exits.
    r.resume(&[ResumeAction {
        action: Action::ContinueSignal(gdb_signal::SEGV),
        thread: Some(t),
    }])
    .unwrap();
    assert_eq!(
        r.wait(WAIT).unwrap(),
        Some(StopReply::Terminated {
            signal: gdb_signal::SEGV,
            pid: None
        })
    );
    assert!(proc.wait_timeout(Duration::from_secs(30)).is_some());
}

#[test]
fn interrupting_a_loop_and_a_killed_qemu() {
    let Some(p) = build() else { return };
    let (mut proc, mut r) = start(&p.exe, "l");
    let spin = p.sym("spin");
    for round in 0..2 {
        r.cont().unwrap();
        // Running: nothing to report yet.
        assert_eq!(r.wait(Some(Duration::from_millis(200))).unwrap(), None);
        proc.interrupt().unwrap();
        let (sig, t) = signal_stop(&r.wait(WAIT).unwrap().unwrap());
        assert_eq!(sig, gdb_signal::INT, "round {round}");
        let at = pc(&mut r, Some(t));
        assert!(
            (spin..spin + 0x40).contains(&at),
            "round {round}: pc {at:#x} not in spin {spin:#x}"
        );
    }
    let counter = p.sym("counter");
    let c1 = u64::from_le_bytes(r.read_memory(counter, 8).unwrap().try_into().unwrap());
    assert!(c1 > 0, "the loop ran");
    // QEMU is killed from outside while the program runs: the connection's end is reported as
    // such, and the process is reaped.
    r.cont().unwrap();
    proc.kill();
    let err = r.wait(WAIT).unwrap_err();
    assert!(err.is_disconnect(), "{err}");
}

#[test]
fn abort_is_a_sigabrt_stop_then_termination() {
    let Some(p) = build() else { return };
    let (_proc, mut r) = start(&p.exe, "a");
    r.cont().unwrap();
    let (sig, t) = signal_stop(&r.wait(WAIT).unwrap().unwrap());
    assert_eq!(sig, gdb_signal::ABRT);
    r.resume(&[ResumeAction {
        action: Action::ContinueSignal(sig),
        thread: Some(t),
    }])
    .unwrap();
    assert!(matches!(
        r.wait(WAIT).unwrap(),
        Some(StopReply::Terminated {
            signal: gdb_signal::ABRT,
            ..
        })
    ));
}

#[test]
fn launch_errors_are_clear() {
    let Some(p) = build() else { return };
    // Not an ELF file.
    let script = p.exe.with_file_name("script.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let err = QemuLaunch::new(&script, Vec::<String>::new())
        .launch()
        .unwrap_err();
    assert!(matches!(err, LaunchError::NotElf { .. }), "{err}");
    // No QEMU.
    let mut l = QemuLaunch::new(&p.exe, Vec::<String>::new());
    l.qemu = "qemu-x86_64-not-installed".into();
    let err = l.launch().unwrap_err();
    assert!(err.to_string().contains("qemu-user"), "{err}");
    // QEMU refuses its arguments and exits before the connection: its message is in the error.
    let mut l = QemuLaunch::new(&p.exe, Vec::<String>::new());
    l.qemu_args = vec!["-plugin".into(), "/nonexistent/plugin.so".into()];
    l.capture_stderr = true;
    let err = l.launch().unwrap_err();
    match &err {
        LaunchError::ExitedEarly { stderr, .. } => {
            assert!(
                stderr.as_deref().is_some_and(|s| s.contains("plugin")),
                "{err}"
            )
        }
        other => panic!("expected ExitedEarly, got {other}"),
    }
}
