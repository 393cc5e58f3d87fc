//! Real GDB (batch mode) against `ptrewind record`, plus raw-protocol checks of the packet
//! router. Expected values come from the C sources (marker comments give line numbers) and
//! from computing the programs' results independently, never from our own output.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod support;

use support::cbuild::{build_example, cc, example_source, line_of};
use support::gdb::{GdbRun, Server, gdb_session, run_until, wait_until};
use support::rsp::{Raw, packet};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The `continue` after the one that runs to the end: a program stops at its end first (the
/// default stop at exit: the process is still there, its history can be examined), and only
/// this one lets it exit.
const LET_IT_EXIT: &str = "continue";

/// Compiles the examples once per test run (`cc -g -O0`), into the cargo test temp dir.
fn examples() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gdb-examples");
        std::fs::create_dir_all(&dir).unwrap();
        let src = |n: &str| example_source(n).to_string_lossy().into_owned();
        let out = |n: &str| dir.join(n).to_string_lossy().into_owned();
        for p in [
            "crash",
            "recursion",
            "funcptr",
            "switch",
            "signal",
            "setjmp",
            "syscalls",
            "exitcode",
            "fork",
            "exec",
            "attachme",
        ] {
            build_example(&dir, p, &[]);
        }
        build_example(&dir, "threads", &["-pthread"]);
        build_example(&dir, "avx", &["-mavx"]);
        cc([
            "-g",
            "-O0",
            "-fPIC",
            "-shared",
            "-o",
            &out("libshared.so"),
            &src("libshared.c"),
        ]);
        cc([
            "-g",
            "-O0",
            "-o",
            &out("uselib"),
            &src("uselib.c"),
            "-L",
            &dir.to_string_lossy(),
            "-lshared",
            "-Wl,-rpath,$ORIGIN",
        ]);
        dir
    })
}

fn example(name: &str) -> PathBuf {
    examples().join(name)
}

/// The result of one GDB session.
type Run = GdbRun;

/// Runs GDB in batch mode against `ptrewind record -- program args`, with `commands` as
/// `-ex` arguments after connecting. Fails on timeout (both processes are killed).
fn gdb(program: &str, args: &[&str], commands: &[&str]) -> Run {
    let program = example(program);
    let server = Server::start(&program, args);
    gdb_with(server, &program, commands)
}

/// Runs GDB against an already started server.
fn gdb_with(server: Server, program: &Path, commands: &[&str]) -> Run {
    gdb_session(server, program, commands, TIMEOUT)
}

fn factorial(n: u64) -> u64 {
    (1..=n).product()
}

#[test]
fn break_main_continue_backtrace_print() {
    let main_line = line_of("recursion.c", "unsigned long f = factorial(10);");
    let r = gdb(
        "recursion",
        &[],
        &[
            "break main",
            "continue",
            "bt",
            "next",
            "print f",
            "print is_even(4)",
            "continue",
            LET_IT_EXIT,
        ],
    );
    r.expect("Breakpoint 1, main () at ");
    r.expect(&format!("recursion.c:{main_line}"));
    r.expect("#0  main () at ");
    r.expect(&format!("$1 = {}", factorial(10)));
    // An inferior call: GDB writes registers, runs the function to a breakpoint, restores.
    r.expect("$2 = 1");
    r.expect("exited normally");
    assert!(
        r.program_stdout
            .contains(&format!("factorial(10)={}", factorial(10))),
        "{}",
        r.program_stdout
    );
}

#[test]
fn recursion_backtrace_depth() {
    let base_line = line_of("recursion.c", "/* BASE CASE */");
    let r = gdb(
        "recursion",
        &[],
        &[
            &format!("break {base_line}"),
            "continue",
            "bt",
            "print n",
            "kill",
        ],
    );
    r.expect(&format!("recursion.c:{base_line}"));
    // factorial(10) recurses down to n == 1: frames #0..#9 are factorial, #10 is main.
    r.expect("#9  ");
    r.expect("#10 ");
    assert!(r.gdb[r.pos("#10 ")..].contains("main ()"), "{}", r.gdb);
    r.expect("$1 = 1");
}

#[test]
fn step_next_finish() {
    let sum_line = line_of("crash.c", "int total = sum_list(&a);");
    let first_in_sum = line_of("crash.c", "int total = 0;");
    let r = gdb(
        "crash",
        &[],
        &[
            &format!("break {sum_line}"),
            "continue",
            "step",
            "next",
            "info frame",
            "finish",
            "next",
            "print total",
            "kill",
        ],
    );
    r.expect(&format!("crash.c:{sum_line}"));
    // `step` enters sum_list at its first statement.
    r.expect("sum_list (n=0x");
    let step_pos = r.pos(&format!("{first_in_sum}\t    int total = 0;"));
    // `finish` returns to main and prints the value: 1 + 2 + 3.
    let finish_pos = r.pos("Value returned is $1 = 6");
    assert!(finish_pos > step_pos);
    assert!(
        r.gdb[step_pos..finish_pos].contains("in main () at "),
        "{}",
        r.gdb
    );
    r.expect("$2 = 6");
}

#[test]
fn shared_library_breakpoints() {
    let shared_line = line_of("libshared.c", "/* SHARED LINE */");
    let call_line = line_of("uselib.c", "int v = shared_scale(20);");
    let r = gdb(
        "uselib",
        &[],
        &[
            "break shared_scale",
            "continue",
            "bt",
            "info sharedlibrary",
            "finish",
            "break puts",
            "continue",
            "continue",
            LET_IT_EXIT,
        ],
    );
    r.expect("Breakpoint 1, shared_scale (x=20) at ");
    r.expect(&format!("libshared.c:{shared_line}"));
    r.expect(&format!("uselib.c:{call_line}"));
    r.expect("libshared.so");
    r.expect("libc.so.6");
    r.expect("Value returned is $1 = 41");
    // puts lives in libc: resolved through libraries-svr4 as well.
    let bp2 = r.pos("Breakpoint 2, ");
    let line_end = r.gdb[bp2..].find('\n').unwrap() + bp2;
    assert!(
        r.gdb[bp2..line_end].contains("puts"),
        "{}",
        &r.gdb[bp2..line_end]
    );
    r.expect("exited normally");
}

/// GDB reads the program's files through host I/O (`vFile:`): the maps file it reads at every
/// connection (it warned "unable to open /proc file" when the server had no host I/O) and,
/// with its default sysroot `target:`, the shared libraries, which then load with symbols and
/// give a backtrace through libc. Writing and deleting files are refused.
#[test]
fn host_io_serves_the_programs_files_read_only() {
    let program = example("uselib");
    let server = Server::start(&program, &[]);
    let pid = server.pid;
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hostio-maps-{pid}"));
    let _ = std::fs::remove_file(&out);
    let get = format!("remote get /proc/{pid}/task/{pid}/maps {}", out.display());
    let put = format!(
        "remote put {} /tmp/ptrewind-hostio-{pid}",
        program.display()
    );
    let delete = format!("remote delete {}", program.display());
    let r = gdb_with(
        server,
        &program,
        &[
            "break shared_scale",
            "continue",
            "echo LIBS\\n",
            "info sharedlibrary",
            &get,
            &put,
            &delete,
            "break puts",
            "continue",
            "echo BT\\n",
            "bt",
            "kill",
        ],
    );
    assert!(!r.gdb.contains("unable to open /proc file"), "{}", r.dump());
    assert!(
        !r.gdb.contains("Remote I/O error: No such file"),
        "{}",
        r.dump()
    );
    let libs = r.after("LIBS");
    for lib in ["libshared.so", "libc.so.6"] {
        let line = libs
            .lines()
            .find(|l| l.contains(lib))
            .unwrap_or_else(|| panic!("no {lib}\n{}", r.dump()));
        assert!(
            line.contains("Yes") && line.contains("target:/"),
            "{line}\n{}",
            r.dump()
        );
    }
    let maps = std::fs::read_to_string(&out).unwrap_or_else(|e| panic!("{e}\n{}", r.dump()));
    assert!(
        maps.contains("libshared.so") && maps.contains("[stack]"),
        "{maps}"
    );
    assert!(maps.ends_with('\n'), "{maps}");
    // GDB prints errors on stderr, collected after stdout: one per refused request.
    assert_eq!(
        r.gdb
            .matches("Remote I/O error: Read-only file system")
            .count(),
        2,
        "{}",
        r.dump()
    );
    assert!(std::path::Path::new(&program).exists());
    assert!(!std::path::Path::new(&format!("/tmp/ptrewind-hostio-{pid}")).exists());
    let bt = r.after("BT");
    assert!(bt.starts_with("#0 ") && bt.contains("puts"), "{}", r.dump());
    assert!(bt.contains("in main ()"), "{}", r.dump());
    let _ = std::fs::remove_file(&out);
}

#[test]
fn crash_reports_sigsegv_at_the_right_line() {
    let crash_line = line_of("crash.c", "/* CRASH LINE */");
    let r = gdb("crash", &[], &["continue", "bt", "continue", LET_IT_EXIT]);
    let sig = r.pos("Program received signal SIGSEGV, Segmentation fault.");
    let at = r.pos("crash_here (p=0x0) at ");
    assert!(at > sig);
    r.expect(&format!("crash.c:{crash_line}"));
    r.expect("in main () at ");
    // Passing the signal on kills the program.
    r.expect("Program terminated with signal SIGSEGV");
    assert!(r.server.contains("killed by signal 11"), "{}", r.server);
}

#[test]
fn exit_code_and_verbatim_arguments() {
    // No shell: `$HOME`, spaces and `;` reach the program unchanged.
    let arg = "a b $HOME;x";
    let code = arg.len() + 2; // strlen(argv[1]) + argc
    let program = example("exitcode");
    // The capture flags are accepted (`ptrewind record` records with the software backend).
    let server = Server::start_cli(&[
        "record".into(),
        "--backend".into(),
        "soft".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--".into(),
        program.clone().into(),
        arg.into(),
    ]);
    let r = gdb_with(server, &program, &["continue", LET_IT_EXIT]);
    // GDB prints the status in octal with a leading 0.
    r.expect(&format!("exited with code 0{code:o}]"));
    // Stopped at its end first (a trap), with a word from the server (on GDB's stderr).
    r.expect("the program is exiting: it stays stopped at its end");
    assert!(
        r.pos("Program received signal SIGTRAP") < r.pos(&format!("exited with code 0{code:o}]")),
        "{}",
        r.dump()
    );
    assert!(
        r.server.contains(&format!("exited with status {code}")),
        "{}",
        r.server
    );
}

#[test]
fn monitor_commands() {
    let r = gdb(
        "switch",
        &[],
        &[
            "monitor help",
            "monitor pid",
            "monitor maps",
            "monitor bogus",
            "kill",
        ],
    );
    r.expect("help");
    r.expect("pid ");
    r.expect("maps ");
    // `monitor pid` prints the pid ptrewind announced.
    assert!(
        r.gdb.lines().any(|l| l.trim() == r.pid.to_string()),
        "pid {} not printed:\n{}",
        r.pid,
        r.gdb
    );
    // `monitor maps` lists the executable.
    r.expect("/switch\n");
    r.expect("unknown monitor command 'bogus'");
    // GDB shows the real pid, not a placeholder.
    r.expect(&format!("process {}", r.pid));
}

#[test]
fn signal_handler_receives_the_signal() {
    let handler_line = line_of("signal.c", "/* HANDLER LINE */");
    let r = gdb(
        "signal",
        &[],
        &[
            "break on_usr1",
            "continue",
            "continue",
            "bt",
            "continue",
            LET_IT_EXIT,
        ],
    );
    let sig = r.pos("Program received signal SIGUSR1");
    let bp = r.pos("Breakpoint 1, on_usr1 (sig=10) at ");
    assert!(bp > sig);
    r.expect(&format!("signal.c:{handler_line}"));
    r.expect("<signal handler called>");
    r.expect("exited normally");
    assert!(r.program_stdout.contains("hits=10"), "{}", r.program_stdout);
}

#[test]
fn avx_registers() {
    let avx_line = line_of("avx.c", "/* AVX LINE */");
    let r = gdb(
        "avx",
        &[],
        &[
            &format!("break {avx_line}"),
            "continue",
            "continue",
            "print $ymm0.v8_float",
            "print $rip == $pc",
            "info registers fs_base",
            "kill",
        ],
    );
    // After one loop iteration acc = data[0..8] = {0, ..., 7}; GCC -O0 keeps acc in ymm0
    // right after the add was stored back (the breakpoint is at the loop line).
    r.expect("= {0, 1, 2, 3, 4, 5, 6, 7}");
    r.expect("= 1");
    r.expect("fs_base        0x7");
}

#[test]
fn fork_and_vfork_children_are_detached_and_reported() {
    let after_line = line_of("fork.c", "/* AFTER LINE */");
    let r = gdb(
        "fork",
        &[],
        &[
            "break after_children",
            "continue",
            "print a",
            "print b",
            "continue",
            LET_IT_EXIT,
        ],
    );
    // GDB is told of the fork and the vfork (fork events) and detaches both children itself.
    r.expect("[Detaching after fork from child process");
    r.expect("[Detaching after vfork from child process");
    // The parent is still debugged: the breakpoint after the children works, and the
    // children ran (fork child exit status 7, /bin/true 0).
    r.expect(&format!("fork.c:{after_line}"));
    r.expect("$1 = 7");
    r.expect("$2 = 0");
    r.expect("exited normally");
}

/// The thread the program creates is recorded too: a breakpoint in it is reached and reported
/// in that thread, `info threads` lists both, and the main thread goes on to the join.
#[test]
fn threads_are_followed_and_breakpoints_in_them_reached() {
    let joined = line_of("threads.c", "/* JOINED LINE */");
    let r = gdb(
        "threads",
        &[],
        &[
            "break worker",
            &format!("break {joined}"),
            "continue",
            "echo IN-WORKER\n",
            "info threads",
            "print (long)arg",
            "continue",
            "echo JOINED\n",
            "info threads",
            "print (long)result",
            "continue",
            LET_IT_EXIT,
        ],
    );
    let in_worker = r.after("IN-WORKER");
    assert!(
        r.gdb.contains("Thread 2 hit Breakpoint 1, worker"),
        "the worker's breakpoint is not reported in thread 2\n{}",
        r.dump()
    );
    // Both threads, the worker selected.
    assert!(
        in_worker.contains("* 2    Thread") && in_worker.contains("  1    Thread"),
        "{}",
        r.dump()
    );
    r.expect("$1 = 100");
    r.expect(&format!("threads.c:{joined}"));
    r.expect(&format!("$2 = {}", (1..=100).sum::<i64>()));
    r.expect("exited normally");
    assert!(
        !r.server.contains("follows only the main thread"),
        "{}",
        r.dump()
    );
}

#[test]
fn exec_is_reported() {
    let r = gdb("exec", &[], &["continue", LET_IT_EXIT]);
    // GDB's exec events: GDB names the new program and loads it.
    r.expect("is executing new program: ");
    r.expect("exited normally");
}

#[test]
fn attach_break_and_detach() {
    let tick_line = line_of("attachme.c", "/* TICK LINE */");
    let program = example("attachme");
    let mut victim = Command::new(&program).spawn().unwrap();
    let pid = victim.id();
    std::thread::sleep(Duration::from_millis(100));
    let server = Server::start_cli(&["attach".into(), pid.to_string().into()]);
    assert_eq!(server.pid, pid as i32);
    let r = gdb_with(
        server,
        &program,
        &[
            "break tick",
            "continue",
            "print counter > 0",
            "bt",
            "detach",
        ],
    );
    let alive = victim.try_wait().unwrap().is_none();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let _ = victim.kill();
    let _ = victim.wait();
    r.expect("Breakpoint 1, tick () at ");
    r.expect(&format!("attachme.c:{tick_line}"));
    r.expect("$1 = 1");
    r.expect("in main () at ");
    r.expect(&format!("process {pid}) detached"));
    assert!(r.server.contains("detached from process"), "{}", r.server);
    // Detached: still running and no longer traced.
    assert!(alive, "the attached process died\n{}", r.gdb);
    assert!(status.contains("TracerPid:\t0\n"), "{status}");
}

#[test]
fn non_loopback_listen_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_ptrewind"))
        .args(["record", "--listen", "0.0.0.0:0", "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-remote"), "{err}");
    assert!(err.contains("0.0.0.0"), "{err}");
}

/// A program that does not exist is said in one line before a backend is chosen (the choice's
/// paragraph about Intel PT and QEMU used to come first and bury it), for a path and a name
/// looked up in PATH.
#[test]
fn missing_program_is_an_error() {
    for (program, why) in [
        ("/nonexistent/program", "no such file"),
        ("ptrewind-no-such-program", "not found in PATH"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ptrewind"))
            .args(["record", "--", program])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.trim_end(),
            format!("ptrewind: cannot start {program}: {why}"),
            "{err}"
        );
    }
}

#[test]
fn gdbs_spelling_of_an_option_is_said_not_started() {
    // `-ex` after `--batch` ends ptrewind's options: it used to be taken for the program, a
    // backend was chosen for it and the start failed with "cannot start -ex".
    let out = Command::new(env!("CARGO_BIN_EXE_ptrewind"))
        .args(["gdb", "--batch", "-ex", "info threads", "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`-ex` is not a program"), "{err}");
    assert!(err.contains("--ex CMD"), "{err}");
    assert!(!err.contains("backend"), "{err}");
    // One line of prose, not the source's indentation (a lost line continuation).
    assert!(!err.contains("  "), "{err}");
}

// ---------------------------------------------------------------------------------------
// Raw protocol against the router (library API, no GDB).

#[test]
fn router_intercepts_extends_qsupported_and_survives_bad_packets() {
    use ptrewind::server::{GdbStubAdapter, Intercept, Router, ServeOutcome};
    use ptrewind::target::{PtraceTarget, SpawnOptions};

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // ptrace ties the tracee to the thread that started it: start and serve on one thread.
    let server = std::thread::spawn(move || {
        let target = PtraceTarget::spawn(&"/bin/true".into(), &[], &SpawnOptions::default())
            .expect("spawn /bin/true");
        let mut session = GdbStubAdapter::new(Box::new(target));
        let mut router = Router::default();
        router.add_qsupported_feature("Qbtrace:pt+");
        router.intercept(b"Qptrewind.test", |session, state, body| {
            let text = format!(
                "intercepted:{}:{}:{}",
                String::from_utf8_lossy(body),
                state.general_thread.as_deref().unwrap_or("none"),
                session.target().pid() > 0
            );
            Intercept::Reply(text.into_bytes())
        });
        router.intercept(b"qSupported", |_, _, _| Intercept::Pass);
        let (stream, _) = listener.accept().unwrap();
        router.serve(stream, &mut session)
    });
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    let mut c = Raw { s, buf: Vec::new() };

    c.send(&packet(
        "qSupported:multiprocess+;swbreak+;xmlRegisters=i386",
    ));
    assert_eq!(c.ack(), b'+');
    let supported = c.reply();
    assert!(supported.contains("PacketSize="), "{supported}");
    assert!(
        supported.contains("qXfer:libraries-svr4:read+"),
        "{supported}"
    );
    assert!(supported.ends_with(";Qbtrace:pt+"), "{supported}");
    c.send(b"+");

    c.send(&packet("Hg0"));
    assert_eq!(c.ack(), b'+');
    assert_eq!(c.reply(), "OK");
    c.send(b"+");

    // An intercepted packet (with a `}` escape: `}]` is `}`) never reaches gdbstub.
    c.send(&packet("Qptrewind.test:}]"));
    assert_eq!(c.ack(), b'+');
    assert_eq!(c.reply(), "intercepted:Qptrewind.test:}:0:true");
    c.send(b"+");

    // Bad checksum: NAK, nothing else.
    c.send(b"$g#00");
    assert_eq!(c.ack(), b'-');

    // Malformed packets gdbstub would choke on: an error reply, the session survives.
    for bad in [
        "mzz,10",
        "m",
        "Z0,zz,1",
        "Hx",
        "p12345678901234567890",
        "vCont;q",
    ] {
        c.send(&packet(bad));
        assert_eq!(c.ack(), b'+', "{bad}");
        assert_eq!(c.reply(), "E01", "{bad}");
        c.send(b"+");
    }

    // Oversized packet: discarded with an error reply.
    let huge = "X".repeat(64 * 1024);
    c.send(&packet(&huge));
    assert_eq!(c.ack(), b'+');
    assert_eq!(c.reply(), "E01");
    c.send(b"+");

    // A NAK makes the server resend its last packet.
    c.send(b"-");
    assert_eq!(c.reply(), "E01");

    // Still alive: the stop reason names the real pid (multiprocess thread id).
    c.send(&packet("?"));
    assert_eq!(c.ack(), b'+');
    let stop = c.reply();
    assert!(stop.starts_with("T05"), "{stop}");
    c.send(b"+");

    // Registers: the whole amd64-linux set, hex.
    c.send(&packet("g"));
    assert_eq!(c.ack(), b'+');
    let g = c.reply();
    assert!(
        g.len() == 2 * 560 || g.len() == 2 * 816,
        "g reply has {} hex digits",
        g.len()
    );
    c.send(b"+");

    c.send(&packet("vKill;1"));
    assert_eq!(c.ack(), b'+');
    assert_eq!(c.reply(), "OK");
    c.send(b"+");
    drop(c);
    let outcome = server.join().unwrap().expect("serve failed");
    assert_eq!(outcome, ServeOutcome::KilledByDebugger);
}

#[test]
fn router_interrupt_stops_a_running_program() {
    use ptrewind::server::{GdbStubAdapter, Router, ServeOutcome};
    use ptrewind::target::{PtraceTarget, SpawnOptions};

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let args = ["30".into()];
        let target = PtraceTarget::spawn(&"/bin/sleep".into(), &args, &SpawnOptions::default())
            .expect("spawn /bin/sleep");
        let mut session = GdbStubAdapter::new(Box::new(target));
        let (stream, _) = listener.accept().unwrap();
        Router::default().serve(stream, &mut session)
    });
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    let mut c = Raw { s, buf: Vec::new() };
    c.send(&packet("qSupported:multiprocess+"));
    assert_eq!(c.ack(), b'+');
    c.reply();
    c.send(b"+");
    c.send(&packet("vCont;c"));
    assert_eq!(c.ack(), b'+');
    std::thread::sleep(Duration::from_millis(200));
    c.send(&[0x03]);
    let stop = c.reply();
    // GDB signal 2 = SIGINT, with the thread of the stopped process.
    assert!(stop.starts_with("T02thread:"), "{stop}");
    c.send(b"+");
    // The process is stopped, not gone: registers can be read.
    c.send(&packet("g"));
    assert_eq!(c.ack(), b'+');
    assert!(c.reply().len() > 100);
    c.send(b"+");
    // Closing the connection kills the program we started.
    drop(c);
    let outcome = server.join().unwrap().expect("serve failed");
    assert_eq!(outcome, ServeOutcome::ConnectionClosed);
}

/// An in-memory "recorded" target: a fixed list of PCs, the cursor at the end (the live
/// point). Exercises the reverse-execution plumbing of the server without a recorder.
struct FakeReplay {
    pcs: Vec<u64>,
    pos: usize,
    breakpoints: Vec<u64>,
    pending: Option<ptrewind::target::StopEvent>,
}

impl ptrewind::target::Breakpoints for FakeReplay {
    fn add_breakpoint(&mut self, addr: u64) -> ptrewind::target::TargetResult<()> {
        self.breakpoints.push(addr);
        Ok(())
    }
    fn remove_breakpoint(&mut self, addr: u64) -> ptrewind::target::TargetResult<bool> {
        let before = self.breakpoints.len();
        self.breakpoints.retain(|&a| a != addr);
        Ok(before != self.breakpoints.len())
    }
    fn breakpoint_addrs(&self) -> Vec<u64> {
        self.breakpoints.clone()
    }
}

impl ptrewind::target::ReverseExecution for FakeReplay {
    fn resume_reverse(
        &mut self,
        how: ptrewind::target::ReverseResume,
    ) -> ptrewind::target::TargetResult<()> {
        use ptrewind::target::{ReverseResume, StopEvent};
        self.pending = Some(match how {
            ReverseResume::Step if self.pos == 0 => StopEvent::HistoryEnd { at_begin: true },
            ReverseResume::Step => {
                self.pos -= 1;
                StopEvent::Step
            }
            ReverseResume::Continue => loop {
                if self.pos == 0 {
                    break StopEvent::HistoryEnd { at_begin: true };
                }
                self.pos -= 1;
                if self.breakpoints.contains(&self.pcs[self.pos]) {
                    break StopEvent::Breakpoint {
                        pc: self.pcs[self.pos],
                    };
                }
            },
        });
        Ok(())
    }
}

impl ptrewind::target::Target for FakeReplay {
    fn pid(&self) -> i32 {
        4242
    }
    fn exec_path(&self) -> Option<PathBuf> {
        None
    }
    fn read_registers(&mut self) -> ptrewind::target::TargetResult<ptrewind::target::X86Registers> {
        let mut regs = ptrewind::target::X86Registers {
            xsave: vec![0; 512],
            ..Default::default()
        };
        regs.set_pc(self.pcs[self.pos]);
        Ok(regs)
    }
    fn write_registers(
        &mut self,
        _: &ptrewind::target::X86Registers,
    ) -> ptrewind::target::TargetResult<()> {
        Err(ptrewind::target::TargetError::Unsupported(
            "writing history",
        ))
    }
    fn read_memory(&self, _addr: u64, buf: &mut [u8]) -> ptrewind::target::TargetResult<usize> {
        buf.fill(0x90);
        Ok(buf.len())
    }
    fn write_memory(&mut self, addr: u64, _: &[u8]) -> ptrewind::target::TargetResult<()> {
        Err(ptrewind::target::TargetError::Memory { addr })
    }
    fn resume(&mut self, _: ptrewind::target::Resume) -> ptrewind::target::TargetResult<()> {
        self.pending = Some(ptrewind::target::StopEvent::HistoryEnd { at_begin: false });
        Ok(())
    }
    fn wait(
        &mut self,
        _block: bool,
    ) -> ptrewind::target::TargetResult<Option<ptrewind::target::StopEvent>> {
        Ok(self.pending.take())
    }
    fn interrupt(&mut self) -> ptrewind::target::TargetResult<()> {
        Ok(())
    }
    fn kill(&mut self) -> ptrewind::target::TargetResult<()> {
        Ok(())
    }
    fn detach(&mut self) -> ptrewind::target::TargetResult<()> {
        Ok(())
    }
    fn has_exited(&self) -> bool {
        false
    }
    fn auxv(&self) -> ptrewind::target::TargetResult<Vec<u8>> {
        Ok(Vec::new())
    }
    fn support_breakpoints(&mut self) -> Option<&mut dyn ptrewind::target::Breakpoints> {
        Some(self)
    }
    fn support_reverse(&mut self) -> Option<&mut dyn ptrewind::target::ReverseExecution> {
        Some(self)
    }
}

#[test]
fn reverse_execution_plumbing_with_a_fake_history() {
    use ptrewind::server::{GdbStubAdapter, Router};

    let pcs: Vec<u64> = (0..10).map(|i| 0x401000 + 4 * i).collect();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = FakeReplay {
        pcs: pcs.clone(),
        pos: pcs.len() - 1,
        breakpoints: Vec::new(),
        pending: None,
    };
    let server = std::thread::spawn(move || {
        let mut session = GdbStubAdapter::new(Box::new(fake));
        let (stream, _) = listener.accept().unwrap();
        Router::default().serve(stream, &mut session)
    });
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    let mut c = Raw { s, buf: Vec::new() };
    let mut ask = |c: &mut Raw, body: &str| -> String {
        c.send(&packet(body));
        assert_eq!(c.ack(), b'+', "{body}");
        let r = c.reply();
        c.send(b"+");
        r
    };
    let supported = ask(&mut c, "qSupported:multiprocess+;swbreak+");
    assert!(supported.contains("ReverseStep+"), "{supported}");
    assert!(supported.contains("ReverseContinue+"), "{supported}");
    // `p 10` is rip (register 16 = 0x10): little-endian hex of the PC.
    let rip = |c: &mut Raw, ask: &mut dyn FnMut(&mut Raw, &str) -> String| {
        let hex = ask(c, "p10");
        let bytes: Vec<u8> = (0..8)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        u64::from_le_bytes(bytes.try_into().unwrap())
    };
    assert_eq!(rip(&mut c, &mut ask), pcs[9]);
    assert_eq!(ask(&mut c, "Hc0"), "OK");
    let stop = ask(&mut c, "bs");
    assert!(stop.starts_with("T05"), "{stop}");
    assert_eq!(rip(&mut c, &mut ask), pcs[8]);
    // Reverse-continue to a breakpoint: the PC is the breakpoint address, no +1.
    assert_eq!(ask(&mut c, &format!("Z0,{:x},1", pcs[3])), "OK");
    let stop = ask(&mut c, "bc");
    assert!(stop.contains("swbreak"), "{stop}");
    assert_eq!(rip(&mut c, &mut ask), pcs[3]);
    // Again: the history begins before any other breakpoint.
    let stop = ask(&mut c, "bc");
    assert!(stop.contains("replaylog:begin"), "{stop}");
    assert_eq!(rip(&mut c, &mut ask), pcs[0]);
    // Forward from the past reaches the end of the history.
    let stop = ask(&mut c, "vCont;c");
    assert!(stop.contains("replaylog:end"), "{stop}");
    // `bs` after `Hc-1` is answered with an error (gdbstub would end the session).
    assert_eq!(ask(&mut c, "Hc-1"), "OK");
    assert_eq!(ask(&mut c, "bs"), "E01");
    assert_eq!(ask(&mut c, "vKill;1"), "OK");
    drop(c);
    server.join().unwrap().expect("serve failed");
}

/// Garbage in, errors out: hundreds of random well-framed packets with known command
/// prefixes and random arguments. Every one must get a reply and the session must survive
/// (gdbstub ends a session on a malformed known command unless the router catches it).
#[test]
fn router_survives_random_packets() {
    use ptrewind::server::{GdbStubAdapter, Router};

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = FakeReplay {
        pcs: vec![0x401000, 0x401004],
        pos: 1,
        breakpoints: Vec::new(),
        pending: None,
    };
    let server = std::thread::spawn(move || {
        let mut session = GdbStubAdapter::new(Box::new(fake));
        let (stream, _) = listener.accept().unwrap();
        Router::default().serve(stream, &mut session)
    });
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    let mut c = Raw { s, buf: Vec::new() };
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    const PREFIXES: &[&str] = &[
        "m",
        "M",
        "X",
        "p",
        "P",
        "G",
        "g",
        "Z",
        "z",
        "Z0,",
        "z1,",
        "Hg",
        "Hc",
        "H",
        "T",
        "c",
        "s",
        "C",
        "S",
        "vCont;",
        "vCont?",
        "qRcmd,",
        "qXfer:features:read:target.xml:",
        "qXfer:auxv:read::",
        "qXfer:exec-file:read:",
        "qXfer:libraries-svr4:read::",
        "qC",
        "qfThreadInfo",
        "qsThreadInfo",
        "qAttached",
        "qSupported:",
        "?",
        "bs",
        "bc",
        "qOffsets",
        "qThreadExtraInfo,",
        "vMustReplyEmpty",
        "qTStatus",
        "x",
        "QCatchSyscalls:",
        "qHostInfo",
        "qProcessInfo",
        "qRegisterInfo",
        "vFile:open:",
        "!",
    ];
    const ALPHABET: &[u8] = b"0123456789abcdefABCDEF,:;.-p=xyzXZ+~";
    let mut last = String::new();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for i in 0..5000 {
            let prefix = PREFIXES[(rand() % PREFIXES.len() as u64) as usize];
            let len = (rand() % 24) as usize;
            let mut body = prefix.to_string();
            for _ in 0..len {
                body.push(ALPHABET[(rand() % ALPHABET.len() as u64) as usize] as char);
            }
            last = format!("#{i} {body:?}");
            c.send(&packet(&body));
            assert_eq!(c.ack(), b'+');
            // Console output (`O` + hex, e.g. from qRcmd) precedes the final reply.
            loop {
                let reply = c.reply();
                c.send(b"+");
                let console = reply.len() > 1
                    && reply.starts_with('O')
                    && reply[1..].bytes().all(|b| b.is_ascii_hexdigit());
                if !console {
                    break;
                }
            }
        }
    }));
    if run.is_err() {
        drop(c);
        let result = server.join().unwrap();
        panic!("session broke at packet {last}: server returned {result:?}");
    }
    // Still serving.
    c.send(&packet("p10"));
    assert_eq!(c.ack(), b'+');
    let pc = c.reply();
    assert!(
        ["0010400000000000", "0410400000000000"].contains(&pc.as_str()),
        "{pc}"
    );
    c.send(b"+");
    drop(c);
    server.join().unwrap().expect("serve failed");
}

/// LLDB (lldb-19) over the same server: connect, break in the executable, backtrace,
/// registers. Skipped with a message when lldb-19 is not installed.
#[test]
fn lldb_breaks_and_backtraces() {
    if Command::new("lldb-19").arg("--version").output().is_err() {
        eprintln!("lldb-19 not installed: skipping");
        return;
    }
    let crash_line = line_of("crash.c", "/* CRASH LINE */");
    let program = example("crash");
    let mut server = Server::start(&program, &[]);
    let mut lldb = Command::new("lldb-19");
    lldb.arg("-b")
        .args(["-o", &format!("gdb-remote 127.0.0.1:{}", server.port)])
        .args([
            "-o",
            "b crash_here",
            "-o",
            "c",
            "-o",
            "bt",
            "-o",
            "register read rip",
        ])
        .args(["-o", "process kill"])
        .arg(&program);
    let lldb = run_until(&mut lldb, TIMEOUT);
    let status = lldb.status;
    let server_status = wait_until(&mut server.child, Instant::now() + Duration::from_secs(10));
    let text = format!("{}{}", lldb.stdout, lldb.stderr);
    let server_text = server.stderr.join().unwrap();
    assert!(
        status.is_some() && server_status.is_some(),
        "timeout\n{text}\n{server_text}"
    );
    assert!(text.contains("stop reason = breakpoint 1.1"), "{text}");
    assert!(text.contains(&format!("crash.c:{crash_line}")), "{text}");
    assert!(text.contains("crash`main at crash.c:"), "{text}");
    assert!(text.contains("rip = 0x"), "{text}");
}

/// acc as funcptr.c computes it: acc = table[i % 3](acc, i + 2) for i in 0..9.
fn funcptr_values() -> Vec<i64> {
    let ops: [fn(i64, i64) -> i64; 3] = [|a, b| a + b, |a, b| a - b, |a, b| a * b];
    let mut acc = 1;
    let mut values = vec![acc];
    for i in 0..9 {
        acc = ops[i % 3](acc, i as i64 + 2);
        values.push(acc);
    }
    values
}

#[test]
fn recurring_breakpoint_and_software_watchpoint() {
    let values = funcptr_values();
    let r = gdb(
        "funcptr",
        &[],
        &[
            "break op_add",
            "continue",
            "continue",
            "continue",
            "delete",
            "break main",
            // Software watchpoints single-step the program and compare after each step.
            "set can-use-hw-watchpoints 0",
            "up",
            "watch acc",
            "continue",
            "continue",
            "delete",
            "continue",
            LET_IT_EXIT,
        ],
    );
    // op_add runs for i = 0, 3, 6: with a = acc before the call, b = i + 2.
    for i in [0usize, 3, 6] {
        r.expect(&format!("op_add (a={}, b={})", values[i], i + 2));
    }
    assert_eq!(
        r.gdb.matches("Breakpoint 1, op_add").count(),
        3,
        "{}",
        r.gdb
    );
    // The watchpoint, set during the third op_add call (i = 6), sees the next two changes.
    r.expect(&format!(
        "Old value = {}\nNew value = {}",
        values[6], values[7]
    ));
    r.expect(&format!(
        "Old value = {}\nNew value = {}",
        values[7], values[8]
    ));
    r.expect("exited normally");
    assert!(
        r.program_stdout.contains(&format!("acc={}", values[9])),
        "{}",
        r.program_stdout
    );
}
