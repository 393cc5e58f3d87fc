//! End-to-end tests of the software PT backend: small C programs are compiled at test time,
//! recorded by single-stepping, and the trace is decoded by two independent decoders (our flow
//! decoder and Intel's libipt) over the process image captured at exit. Both must reproduce the
//! single-stepper's own log of executed IPs exactly, with no decode errors.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ptrewind::capture::soft::procmaps;
use ptrewind::capture::soft::{
    EncoderConfig, Exit, RecordFrom, RecorderConfig, Recording, RingConfig, SoftRecorder,
    StepEvent, StepTarget,
};
use ptrewind::image::Image;
use ptrewind::packet::{Packet, PacketDecoder};
use ptrewind::ring::IntOn;
use ptrewind::target::{PtraceTarget, SpawnOptions};
use support::cbuild::{compile_source, nm_symbol};
use support::flow_ips;
use support::libipt::{ImageSection, OracleItem, ipt_insns};

/// Compiles `src` with `cc -g -O0` into `dir` and returns the executable.
fn compile(dir: &Path, name: &str, src: &str, extra: &[&str]) -> PathBuf {
    compile_source(
        "cc",
        dir,
        name,
        src,
        &["-g", "-O0", "-fno-omit-frame-pointer"],
        extra,
    )
}

fn spawn(exe: &Path, args: &[&str]) -> PtraceTarget {
    let mut cmd = Command::new(exe);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::null());
    PtraceTarget::spawn_command(cmd, &SpawnOptions::default()).expect("spawn traced child")
}

fn config() -> RecorderConfig {
    RecorderConfig {
        log_ips: true,
        capture_image_at_exit: true,
        ..RecorderConfig::default()
    }
}

/// The program's stdout when run natively (untraced): the recorded run must print the same.
fn native_stdout(exe: &Path, args: &[&str]) -> String {
    let out = Command::new(exe).args(args).output().expect("run natively");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn record(exe: &Path, args: &[&str], cfg: RecorderConfig) -> (Recording, String) {
    let mut child = spawn(exe, args);
    let mut stdout = child
        .child_mut()
        .expect("spawned")
        .stdout
        .take()
        .expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).expect("read child stdout");
        s
    });
    let mut rec = SoftRecorder::new(child, cfg).expect("start recorder");
    rec.run(Some(20_000_000)).expect("record");
    let recording = rec.finish().expect("finish");
    let out = reader.join().expect("stdout reader");
    (recording, out)
}

/// libipt's instruction IPs and errors.
fn libipt_ips(trace: &[u8], image: &Image) -> (Vec<u64>, Vec<String>) {
    let sections = ImageSection::all_of(image);
    let run = ipt_insns(trace, None, &sections);
    let mut ips = Vec::new();
    let mut errors = Vec::new();
    for item in &run.items {
        match item {
            OracleItem::Insn(i) => ips.push(i.ip),
            OracleItem::Error(e) => errors.push(format!("{e:?}")),
            OracleItem::Event(_) => {}
        }
    }
    (ips, errors)
}

fn first_mismatch(a: &[u64], b: &[u64]) -> String {
    let i = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let lo = i.saturating_sub(3);
    format!(
        "lengths {} vs {}, first difference at {i}: {:x?} vs {:x?}",
        a.len(),
        b.len(),
        &a[lo..(i + 3).min(a.len())],
        &b[lo..(i + 3).min(b.len())]
    )
}

/// Decodes a recording with both decoders and checks both against the single-stepper's log.
fn check_decodes(name: &str, r: &Recording) {
    let log = r.ip_log.as_ref().expect("ip log enabled");
    let image = r.image.as_ref().expect("image captured at exit");
    assert!(!log.is_empty(), "{name}: nothing recorded");
    assert_eq!(r.stats.lost_bytes, 0, "{name}: trace bytes lost");
    assert!(r.gaps.is_empty(), "{name}: gaps {:?}", r.gaps);
    assert_eq!(r.stats.anomalies, 0, "{name}: unexplained stops");
    assert_eq!(r.encoder.bytes, r.trace.len() as u64, "{name}: bytes lost");

    let (ips, errors) = flow_ips(&r.trace, image);
    assert!(errors.is_empty(), "{name}: flow decoder errors: {errors:?}");
    assert!(
        ips == *log,
        "{name}: flow decoder: {}",
        first_mismatch(&ips, log)
    );

    let (ips, errors) = libipt_ips(&r.trace, image);
    assert!(errors.is_empty(), "{name}: libipt errors: {errors:?}");
    assert!(ips == *log, "{name}: libipt: {}", first_mismatch(&ips, log));
}

fn packets(trace: &[u8]) -> Vec<Packet> {
    let mut d = PacketDecoder::new(trace);
    let mut v = Vec::new();
    while let Some(p) = d.next_packet() {
        v.push(p.expect("valid packet").1);
    }
    v
}

const LOOPS: &str = r#"
#include <stdio.h>
static int add(int a, int b) { return a + b; }
static int sub(int a, int b) { return a - b; }
int main(int argc, char **argv) {
    int n = argc > 1 ? 10000 : 300;
    int s = 0;
    for (int i = 0; i < n; i++) {
        if (i % 3 == 0) s = add(s, i); else s = sub(s, 1);
    }
    printf("%d\n", s);
    return s == 12345;
}
"#;

const RECURSION_AND_POINTERS: &str = r#"
#include <stdio.h>
#include <string.h>
static int depth(int n) { return n == 0 ? 0 : 1 + depth(n - 1); }
static int twice(int x) { return 2 * x; }
static int square(int x) { return x * x; }
static int (*ops[])(int) = { twice, square };
static int jump_table(int k) {
    switch (k) {
    case 0: return 10; case 1: return 11; case 2: return 12; case 3: return 13;
    case 4: return 14; case 5: return 15; case 6: return 16; case 7: return 17;
    default: return -1;
    }
}
int main(void) {
    int r = depth(100);
    for (int i = 0; i < 10; i++) r += ops[i & 1](i) + jump_table(i);
    char a[300], b[300];
    memset(a, 'x', sizeof a);
    memcpy(b, a, sizeof a);
    printf("%d %c\n", r, b[299]);
    return 0;
}
"#;

const SETJMP_SIGNALS: &str = r#"
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
static jmp_buf jb;
static sigjmp_buf sjb;
static volatile int usr1, alarms;
static void deep(int n) { if (n == 0) longjmp(jb, 7); deep(n - 1); }
static void on_usr1(int sig) { usr1 += sig; }
static void on_segv(int sig) { (void)sig; siglongjmp(sjb, 1); }
static void on_alarm(int sig) { (void)sig; alarms++; }
int main(void) {
    int v = setjmp(jb);
    if (v == 0) deep(10);
    signal(SIGUSR1, on_usr1);
    raise(SIGUSR1);
    signal(SIGSEGV, on_segv);
    if (sigsetjmp(sjb, 1) == 0) { *(volatile int *)8 = 1; }
    /* An asynchronous signal arriving between two user-mode instructions. */
    signal(SIGALRM, on_alarm);
    struct itimerval it;
    memset(&it, 0, sizeof it);
    it.it_value.tv_usec = 2000;
    setitimer(ITIMER_REAL, &it, 0);
    volatile unsigned long spin = 0;
    while (!alarms) spin++;
    printf("%d %d %d\n", v, usr1, alarms);
    return 0;
}
"#;

#[test]
fn loops_and_libc_calls_decode_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "loops", LOOPS, &[]);
    let (r, out) = record(&exe, &[], config());
    assert_eq!(out, native_stdout(&exe, &[]));
    assert_eq!(r.exit, Some(Exit::Code(0)));
    check_decodes("loops", &r);
    // Recording started at main: the first logged IP is main's address.
    let log = r.ip_log.as_ref().expect("log");
    let main = nm_symbol(&exe, "main");
    assert_eq!(log[0] & 0xfff, main & 0xfff, "first IP {:#x}", log[0]);
    // The trace starts PSB, TSC, PSBEND, MODE.Exec, TIP.PGE(main) and ends with a TIP.PGD
    // (the exit_group system call).
    let p = packets(&r.trace);
    assert!(matches!(p[0], Packet::Psb));
    assert!(matches!(p[4], Packet::TipPge(_)), "{:?}", &p[..5]);
    assert!(matches!(p.last(), Some(Packet::TipPgd(_))));
    assert!(r.encoder.compressed_rets > 300, "{:?}", r.encoder);
}

#[test]
fn deep_recursion_function_pointers_jump_table_decode_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "rec", RECURSION_AND_POINTERS, &[]);
    let (r, out) = record(&exe, &[], config());
    assert_eq!(out, native_stdout(&exe, &[]));
    assert_eq!(r.exit, Some(Exit::Code(0)));
    check_decodes("recursion", &r);
    // depth(100) returns through more than 64 frames: some RETs cannot be compressed.
    assert!(r.encoder.uncompressed_rets >= 36, "{:?}", r.encoder);
}

#[test]
fn setjmp_longjmp_and_signals_decode_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "sig", SETJMP_SIGNALS, &[]);
    let (r, out) = record(&exe, &[], config());
    assert_eq!(out, "7 10 1\n");
    assert_eq!(r.exit, Some(Exit::Code(0)));
    // SIGUSR1, SIGSEGV and SIGALRM were each delivered to a handler.
    assert!(r.stats.handlers_entered >= 3, "{:?}", r.stats);
    // The fault and the timer hit user-mode instructions: FUP + TIP.PGD.
    assert!(r.encoder.async_transfers >= 2, "{:?}", r.encoder);
    check_decodes("signals", &r);
}

#[test]
fn small_ring_is_drained_without_loss_and_periodic_psbs_decode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "loops", LOOPS, &[]);
    let cfg = RecorderConfig {
        ring: RingConfig {
            region_sizes: vec![4096, 4096],
            int_on: IntOn::Last,
            ..RingConfig::default()
        },
        // No RET compression: every RET is a TIP, so the trace is several times the ring.
        encoder: EncoderConfig {
            psb_period: 256,
            ret_compression: false,
            // The minimal MODE.Exec placement must decode too.
            mode_exec_on_every_pge: false,
            ..EncoderConfig::default()
        },
        write_batch: 2048,
        ..config()
    };
    let (r, _) = record(&exe, &["long"], cfg);
    assert!(r.trace.len() > 3 * 8192, "trace {} bytes", r.trace.len());
    assert!(r.stats.pmis > 0, "{:?}", r.stats);
    assert!(r.encoder.psbs > 20, "{:?}", r.encoder);
    check_decodes("small ring", &r);
}

#[test]
fn record_from_entry_and_exec() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "loops", LOOPS, &[]);
    let (r, _) = record(
        &exe,
        &[],
        RecorderConfig {
            record_from: RecordFrom::Entry,
            ..config()
        },
    );
    let log = r.ip_log.as_ref().expect("log");
    assert_eq!(log[0] & 0xfff, nm_symbol(&exe, "_start") & 0xfff);
    check_decodes("from entry", &r);

    // From exec: the dynamic loader is recorded too (its first IP is not in the executable).
    let (r, _) = record(
        &exe,
        &[],
        RecorderConfig {
            record_from: RecordFrom::Exec,
            ..config()
        },
    );
    assert!(r.stats.recorded > 50_000, "{:?}", r.stats);
    check_decodes("from exec", &r);
}

#[test]
fn record_on_and_off_on_demand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "loops", LOOPS, &[]);
    let child = spawn(&exe, &[]);
    let mut rec = SoftRecorder::new(
        child,
        RecorderConfig {
            record_from: RecordFrom::OnDemand,
            ..config()
        },
    )
    .expect("recorder");
    assert!(!rec.is_recording());
    // Untraced up to main (the breakpoint helper), then 1000 recorded steps, 500 unrecorded,
    // then recording to the end.
    let main = procmaps::symbol_address(rec.target().pid(), "main").expect("main");
    ptrewind::capture::soft::recorder::run_to_breakpoint(rec.target(), main).expect("to main");
    rec.record_on();
    rec.run(Some(1000)).expect("steps");
    rec.record_off().expect("off");
    rec.run(Some(500)).expect("steps");
    rec.record_on();
    rec.run(None).expect("run to exit");
    let r = rec.finish().expect("finish");
    assert_eq!(r.stats.unrecorded, 500);
    let p = packets(&r.trace);
    let psbs = p.iter().filter(|p| matches!(p, Packet::Psb)).count();
    assert!(psbs >= 2, "re-enabling starts a new PSB+");
    check_decodes("on demand", &r);
}

#[test]
fn state_log_rebuilds_past_registers_and_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = r#"
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <string.h>
unsigned char buf[64];
unsigned char rnd[32];
void done(void) {}
static void on_usr1(int sig) { buf[63] = (unsigned char)sig; }
int main(void) {
    signal(SIGUSR1, on_usr1);
    raise(SIGUSR1);
    for (int i = 0; i < 64; i++) buf[i] = (unsigned char)(i * 7);
    memset(buf + 8, 0xab, 16);
    /* One single step per REP iteration: each writes one element. */
    unsigned char *p = buf + 40;
    unsigned long n = 20;
    __asm__ volatile("rep stosb" : "+D"(p), "+c"(n) : "a"(0x5a) : "memory");
    int fd = open("/dev/urandom", O_RDONLY);
    read(fd, rnd, sizeof rnd);
    close(fd);
    for (int i = 0; i < 32; i++) buf[i] ^= rnd[i];
    done();
    return 0;
}
"#;
    let exe = compile(dir.path(), "state", src, &[]);
    let child = spawn(&exe, &[]);
    let mut rec = SoftRecorder::new(
        child,
        RecorderConfig {
            state_log: true,
            ..config()
        },
    )
    .expect("recorder");
    let pid = rec.target().pid();
    let buf = procmaps::symbol_address(pid, "buf").expect("buf");
    let rnd = procmaps::symbol_address(pid, "rnd").expect("rnd");
    let done = procmaps::symbol_address(pid, "done").expect("done");
    // The stack below main's frame: calls, the signal frame of SIGUSR1's delivery, and
    // system-call output buffers are all written there.
    let stack_top = rec.current_regs().expect("regs").rsp;
    const STACK: usize = 16 * 1024;
    let stack = stack_top - STACK as u64;
    let read_mem = |rec: &mut SoftRecorder<PtraceTarget>| {
        let mut m = vec![0u8; 96 + STACK];
        rec.target()
            .read_memory(buf, &mut m[..64])
            .expect("read buf");
        rec.target()
            .read_memory(rnd, &mut m[64..96])
            .expect("read rnd");
        rec.target()
            .read_memory(stack, &mut m[96..])
            .expect("read stack");
        m
    };
    // Ground truth: registers and memory observed directly at chosen positions.
    let mut truth = Vec::new();
    let mut last = StepEvent::Executed { ip: 0 };
    loop {
        let regs = rec.current_regs().expect("regs");
        if regs.rip == done {
            break;
        }
        let pos = rec.stats().recorded as usize;
        if pos % 37 == 0 && !matches!(last, StepEvent::Iteration { .. }) {
            truth.push((pos, regs, read_mem(&mut rec)));
        }
        last = rec.step().expect("step");
    }
    let present_regs = rec.current_regs().expect("regs");
    let present_mem = read_mem(&mut rec);
    let log = rec.state_log().expect("state log enabled");
    assert_eq!(log.len(), rec.stats().recorded as usize);
    assert!(truth.len() > 10);
    for (pos, regs, mem) in &truth {
        let rebuilt = log.registers_at(*pos, &present_regs).expect("in range");
        assert_eq!(rebuilt, *regs, "registers at position {pos}");
        let mut b = present_mem[..64].to_vec();
        assert!(log.memory_at(*pos, buf, &mut b));
        assert_eq!(b, mem[..64], "buf at position {pos}");
        let mut r = present_mem[64..96].to_vec();
        assert!(log.memory_at(*pos, rnd, &mut r));
        assert_eq!(
            r,
            mem[64..96],
            "rnd at position {pos} (read() output snapshot)"
        );
        let mut st = present_mem[96..].to_vec();
        assert!(log.memory_at(*pos, stack, &mut st));
        if st != mem[96..] {
            let i = st
                .iter()
                .zip(&mem[96..])
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "stack differs at position {pos}, address {:#x}",
                stack + i as u64
            );
        }
    }
    let stats = log.stats();
    assert_eq!(stats.unknown_writes, 0, "{stats:?}");
    assert_eq!(stats.signal_deliveries, 1, "{stats:?}");
    rec.run(None).expect("run to exit");
    let r = rec.finish().expect("finish");
    check_decodes("state log", &r);
}

#[test]
fn server_ptrace_target_drives_the_recorder() {
    use ptrewind::target::{PtraceTarget, SpawnOptions};
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "sig", SETJMP_SIGNALS, &[]);
    let target = PtraceTarget::spawn(&exe.clone().into_os_string(), &[], &SpawnOptions::default())
        .expect("server target");
    let mut rec = SoftRecorder::new(target, config()).expect("recorder");
    // This target reports no exit event: snapshot the code at main (libraries are loaded).
    let (image, _) = procmaps::capture_image(rec.target()).expect("image");
    rec.run(Some(20_000_000)).expect("record");
    let mut r = rec.finish().expect("finish");
    assert_eq!(r.exit, Some(Exit::Code(0)));
    assert!(r.stats.handlers_entered >= 3, "{:?}", r.stats);
    // The exit_group system call is the last recorded instruction (it executed).
    let log = r.ip_log.as_ref().expect("log");
    let last = *log.last().expect("non-empty");
    let mut b = [0u8; 2];
    assert_eq!(image.read(last, &mut b), 2);
    assert_eq!(b, [0x0f, 0x05], "last instruction is a SYSCALL");
    r.image = Some(image);
    check_decodes("server target", &r);
}

#[test]
fn single_and_block_stepping_record_the_same_flow() {
    use ptrewind::capture::soft::StepMode;
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "rec", RECURSION_AND_POINTERS, &[]);
    let single = RecorderConfig {
        step_mode: StepMode::Single,
        ..config()
    };
    let (a, _) = record(&exe, &[], single.clone());
    let (b, _) = record(&exe, &[], config());
    assert_eq!(a.stats.blocks, 0);
    assert!(b.stats.blocks > 100, "{:?}", b.stats);
    assert!(
        b.stats.single_steps < a.stats.single_steps / 2,
        "{:?}",
        b.stats
    );
    assert!(a.ip_log == b.ip_log, "IP logs differ");
    check_decodes("single-stepped", &a);
    check_decodes("block-stepped", &b);
    // Signals arriving while a block runs at full speed, and while single-stepping.
    let exe = compile(dir.path(), "sig", SETJMP_SIGNALS, &[]);
    let (r, out) = record(&exe, &[], single);
    assert_eq!(out, "7 10 1\n");
    check_decodes("signals, single-stepped", &r);
}

#[test]
fn threads_are_recorded_and_the_main_thread_decodes_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = r#"
#include <pthread.h>
#include <stdio.h>
static long result;
static void *worker(void *arg) {
    long s = 0;
    for (long i = 0; i < 100000; i++) s += i ^ (long)arg;
    result = s;
    return 0;
}
int main(void) {
    pthread_t t;
    pthread_create(&t, 0, worker, (void *)3);
    long s = 0;
    for (int i = 0; i < 200; i++) s += i;
    pthread_join(t, 0);
    printf("%ld %ld\n", s, result);
    return 0;
}
"#;
    let exe = compile(dir.path(), "threads", src, &["-pthread"]);
    let (r, out) = record(&exe, &[], config());
    assert_eq!(out, native_stdout(&exe, &[]));
    assert_eq!(r.exit, Some(Exit::Code(0)));
    assert_eq!(r.stats.clones, 1, "{:?}", r.stats);
    assert_eq!(r.stats.thread_clones, 1, "{:?}", r.stats);
    // The one ptrace task type follows every thread: the worker has its own stream.
    assert_eq!(r.threads.len(), 2, "{:?}", r.stats);
    assert!(r.threads.iter().all(|t| !t.trace.is_empty()));
    check_decodes("threads", &r);
}

#[test]
fn exec_replaces_the_program_and_recording_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = r#"
#include <unistd.h>
int main(void) {
    execl("/bin/sh", "sh", "-c", "exit 3", (char *)0);
    return 1;
}
"#;
    let exe = compile(dir.path(), "exec", src, &[]);
    let (r, _) = record(&exe, &[], config());
    // The exec'd shell ran to its own exit status: the exec was not mistaken for a SIGTRAP
    // of the program's own (which would have killed it).
    assert_eq!(r.exit, Some(Exit::Code(3)));
    assert_eq!(r.stats.execs, 1, "{:?}", r.stats);
    // The shell was recorded too: far more instructions than the caller's few.
    assert!(r.stats.recorded > 10_000, "{:?}", r.stats);
}

#[test]
fn interrupt_stops_a_run_which_can_resume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "loops", LOOPS, &[]);
    let mut rec = SoftRecorder::new(spawn(&exe, &["long"]), config()).expect("recorder");
    let stop = rec.interrupter();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        stop.interrupt();
    });
    let first = rec.run(None).expect("run until interrupted");
    t.join().expect("interrupter thread");
    assert_eq!(first, None, "interrupted before the program could finish");
    let at = rec.stats().recorded;
    assert!(at > 0);
    assert_eq!(rec.run(None).expect("resume"), Some(Exit::Code(0)));
    let r = rec.finish().expect("finish");
    assert!(r.stats.recorded > at);
    check_decodes("interrupted", &r);
}

#[test]
fn fatal_fault_ends_the_trace_at_the_faulting_instruction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = r#"
#include <stdio.h>
int main(void) {
    volatile int *p = (int *)16;
    for (int i = 0; i < 10; i++) if (i == 7) *p = i;
    return 0;
}
"#;
    let exe = compile(dir.path(), "segv", src, &[]);
    let (r, _) = record(&exe, &[], config());
    assert_eq!(
        r.exit,
        Some(Exit::Signal(nix::sys::signal::Signal::SIGSEGV))
    );
    // The trace ends with FUP(faulting instruction) + TIP.PGD: the store never executed.
    let p = packets(&r.trace);
    let n = p.len();
    assert!(matches!(p[n - 2], Packet::Fup(_)), "{:?}", &p[n - 3..]);
    assert!(matches!(p[n - 1], Packet::TipPgd(_)));
    check_decodes("fatal fault", &r);
}

#[test]
fn int3_is_a_software_interrupt_reported_at_its_ip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = r#"
#include <signal.h>
#include <stdio.h>
static volatile int traps;
static void on_trap(int sig) { (void)sig; traps++; }
int main(void) {
    signal(SIGTRAP, on_trap);
    /* One INT3 only: every single-step trap taken inside the SIGTRAP handler (where SIGTRAP is
       blocked) makes the kernel reset the handler to SIG_DFL (force_sig), as under GDB. */
    __asm__ volatile("int3");
    printf("%d\n", traps);
    return 0;
}
"#;
    let exe = compile(dir.path(), "int3", src, &[]);
    let (r, out) = record(&exe, &[], config());
    assert_eq!(out, "1\n", "{:?} {:?}", r.exit, r.stats);
    assert_eq!(r.exit, Some(Exit::Code(0)));
    assert_eq!(r.stats.handlers_entered, 1, "{:?}", r.stats);
    // Each INT3 is FUP(its own IP) + TIP.PGD (SDM Table 36-23: CLIP for software interrupts).
    // Decoders treat that like an asynchronous event at the INT3, so they report every logged
    // instruction except the INT3s themselves.
    let image = r.image.as_ref().expect("image");
    let log = r.ip_log.as_ref().expect("log");
    let expected: Vec<u64> = log
        .iter()
        .copied()
        .filter(|&ip| {
            let mut b = [0u8; 1];
            image.read(ip, &mut b);
            b[0] != 0xcc
        })
        .collect();
    assert_eq!(log.len() - expected.len(), 1);
    let (ips, errors) = flow_ips(&r.trace, image);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(ips == expected, "flow: {}", first_mismatch(&ips, &expected));
    let (ips, errors) = libipt_ips(&r.trace, image);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(
        ips == expected,
        "libipt: {}",
        first_mismatch(&ips, &expected)
    );
}

#[test]
fn loss_is_counted_when_one_write_exceeds_the_ring() {
    // A 4 KiB ring and 64 KiB write batches: each batch laps the ring within one write, so
    // bytes are overwritten before any drain. They must be counted, never silently dropped.
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "loops", LOOPS, &[]);
    let cfg = RecorderConfig {
        ring: RingConfig {
            region_sizes: vec![4096],
            int_on: IntOn::Every,
            ..RingConfig::default()
        },
        encoder: EncoderConfig {
            ret_compression: false,
            ..EncoderConfig::default()
        },
        write_batch: 64 * 1024,
        ..config()
    };
    let (r, _) = record(&exe, &["long"], cfg);
    assert!(r.stats.lost_bytes > 0, "{:?}", r.stats);
    assert_eq!(
        r.trace.len() as u64 + r.stats.lost_bytes,
        r.encoder.bytes,
        "stored + lost = produced"
    );
    assert!(!r.gaps.is_empty());
    assert_eq!(
        r.gaps.iter().map(|g| g.lost).sum::<u64>(),
        r.stats.lost_bytes
    );
}

#[test]
fn stripped_executable_is_recorded_from_its_entry_point() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "stripped", LOOPS, &["-s"]);
    let child = spawn(&exe, &[]);
    let mut rec = SoftRecorder::new(child, config()).expect("recorder");
    let start = rec.start_address().expect("start address");
    rec.run(None).expect("record");
    let r = rec.finish().expect("finish");
    assert_eq!(r.ip_log.as_ref().expect("log")[0], start);
    // `_start` is at the ELF entry point; its page offset is the same in the unstripped build.
    let unstripped = compile(dir.path(), "unstripped", LOOPS, &[]);
    assert_eq!(start & 0xfff, nm_symbol(&unstripped, "_start") & 0xfff);
    check_decodes("stripped", &r);
}

#[test]
fn call_through_a_null_pointer_faults_at_address_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = r#"
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
static sigjmp_buf jb;
static void on_segv(int sig) { (void)sig; siglongjmp(jb, 1); }
int main(void) {
    void (*volatile f)(void) = 0;
    signal(SIGSEGV, on_segv);
    if (sigsetjmp(jb, 1) == 0) f();
    puts("recovered");
    return 0;
}
"#;
    let exe = compile(dir.path(), "null", src, &[]);
    let (r, out) = record(&exe, &[], config());
    assert_eq!(out, "recovered\n");
    assert_eq!(r.stats.handlers_entered, 1, "{:?}", r.stats);
    check_decodes("null call", &r);
}

#[test]
fn debugger_breakpoints_of_the_server_target_stop_a_block_stepped_run() {
    use ptrewind::target::{PtraceTarget, SpawnOptions, Target};
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "loops", LOOPS, &[]);
    let target = PtraceTarget::spawn(&exe.clone().into_os_string(), &[], &SpawnOptions::default())
        .expect("server target");
    let mut rec = SoftRecorder::new(target, config()).expect("recorder");
    let (image, _) = procmaps::capture_image(rec.target()).expect("image");
    let add = procmaps::symbol_address(StepTarget::pid(rec.target()), "add").expect("add");
    // A breakpoint inside add's straight-line body (after `push rbp`), as GDB would set one.
    let bp = add + 1;
    rec.target()
        .support_breakpoints()
        .expect("breakpoints")
        .add_breakpoint(bp)
        .expect("add breakpoint");
    let mut hits = 0;
    loop {
        let exit = rec.run(None).expect("run");
        match rec.take_breakpoint_hit() {
            Some(pc) => {
                assert_eq!(pc, bp);
                assert_eq!(rec.current_regs().expect("regs").rip, bp);
                hits += 1;
            }
            None => {
                assert_eq!(exit, Some(Exit::Code(0)));
                break;
            }
        }
    }
    // add() is called for i % 3 == 0, i in 0..300.
    assert_eq!(hits, 100);
    let mut r = rec.finish().expect("finish");
    r.image = Some(image);
    check_decodes("breakpoints", &r);
}

#[test]
fn fork_and_system_keep_block_stepping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = r#"
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    pid_t p = fork();
    if (p == 0) _exit(5);
    int st = 0;
    waitpid(p, &st, 0);
    int rc = system("exit 2");
    long s = 0;
    for (int i = 0; i < 100; i++) s += i;
    printf("%d %d %ld\n", WEXITSTATUS(st), WEXITSTATUS(rc), s);
    return 0;
}
"#;
    let exe = compile(dir.path(), "fork", src, &[]);
    let (r, out) = record(&exe, &[], config());
    assert_eq!(out, "5 2 4950\n");
    assert_eq!(r.exit, Some(Exit::Code(0)));
    // fork() and system()'s vfork-style clone: neither shares memory with a running child.
    assert_eq!(r.stats.clones, 2, "{:?}", r.stats);
    assert_eq!(r.stats.thread_clones, 0, "{:?}", r.stats);
    check_decodes("fork", &r);
}
