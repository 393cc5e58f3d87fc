//! ptrewind's QEMU TCG plugin: records every guest thread of a `qemu-x86_64` (user mode, QEMU 7.2,
//! plugin API version 1) run as an Intel PT stream.
//!
//! Load it with `qemu-x86_64 -plugin libptrewind_qemu_plugin.so,out=DIR[,precise=on|off][,log=on]`
//! (`ptrewind record --backend qemu` does). `DIR` must be an existing private directory; the files
//! written there are described in `ptrewind::capture::qemu::output`.
//!
//! * At translation, each block's last instruction is classified from its bytes
//!   ([`BlockInfo`]); the block's information is the execution callback's user data.
//! * At execution, each vCPU (one per guest thread in user mode) feeds its
//!   [`ThreadTracer`], whose encoder output goes through the thread's ToPA ring into its file.
//! * `precise=on` (default) adds QEMU's inline counter before each instruction after a block's
//!   first, so a block cut short by a fault is counted up to the faulting instruction.
//! * `log=on` (test mode) also logs every instruction address QEMU starts executing.
//! * `pause=on` (a live session) maps the pause and watch gates; watchpoints: [`watch`].
//!
//! Only plain `extern "C"` callbacks are used (no closures): they are the fast path.

pub mod ffi;
pub mod watch;

use std::cell::UnsafeCell;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use ptrewind::capture::qemu::output::{self, PluginMeta, Tail, ThreadMeta, ThreadOutput};
use ptrewind::capture::qemu::{BlockInfo, SignalHandlers, ThreadTracer, TracerConfig};

use ffi::*;

/// The plugin API version QEMU checks before installing the plugin.
#[unsafe(no_mangle)]
pub static qemu_plugin_version: c_int = QEMU_PLUGIN_VERSION;

/// Encoder output is moved into the ring once this many bytes are pending.
const WRITE_BATCH: usize = 32 * 1024;
/// vCPU indexes served (QEMU user mode gives each live thread one; indexes are reused).
const MAX_VCPUS: usize = 4096;

struct Config {
    dir: PathBuf,
    precise: bool,
    log: bool,
    exit_stop: bool,
    pause: bool,
}

/// `measure=callbacks`: the block callback returns at once (nothing is recorded). Measures what
/// QEMU's per-block helper call costs by itself (examples/bench_qemu.rs).
static CALLBACKS_ONLY: AtomicBool = AtomicBool::new(false);

/// The exit gate's shared words (`exit_stop=on`; see `output::exit_gate`), null when off.
static EXIT_GATE: AtomicPtr<AtomicU64> = AtomicPtr::new(ptr::null_mut());
/// The process the gate holds (forked children exit freely).
static GATED_PID: AtomicU32 = AtomicU32::new(0);

/// `exit_group` of the gated process: publishes the call and waits until ptrewind releases it
/// (ptrewind serves the program's end meanwhile; QEMU dies with ptrewind, PR_SET_PDEATHSIG).
fn hold_at_exit(num: i64, args: [u64; 6]) {
    use output::exit_gate as g;
    let base = EXIT_GATE.load(Ordering::Acquire);
    if base.is_null() || real_getpid() != GATED_PID.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: the gate mapping holds `g::SIZE / 8` words and is never unmapped.
    let word = |i: usize| unsafe { &*base.add(i) };
    if word(g::STATE).load(Ordering::Acquire) == g::RELEASED {
        // Opened beforehand (the debugger detached): nobody serves the end, exit at once.
        return;
    }
    word(g::TID).store(u64::from(gettid()), Ordering::Relaxed);
    word(g::NUM).store(num as u64, Ordering::Relaxed);
    for (i, a) in args.iter().enumerate() {
        word(g::ARGS + i).store(*a, Ordering::Relaxed);
    }
    word(g::STATE).store(g::WAITING, Ordering::Release);
    while word(g::STATE).load(Ordering::Acquire) != g::RELEASED {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The pause gate's shared words (`pause=on`; see `output::pause_gate`), null when off.
static PAUSE_GATE: AtomicPtr<AtomicU64> = AtomicPtr::new(ptr::null_mut());

/// How long a thread waits for another's breakpoint claim before it runs anyway.
/// A claim held that long is normally one whose thread reached the stub (a claim for a block
/// that did not lead to the breakpoint ends at the claimer's next block): the others must not
/// follow it there before ptrewind closes the gate, which took more than 20 ms under load
/// (two threads in the stub ended a session). The bound stays because a thread waiting inside
/// its block holds up QEMU's exclusive sections.
const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// A test knob (environment `PTREWIND_QEMU_TEST_CLAIM_DELAY_US`, read at install; 0 otherwise):
/// microseconds a thread sleeps between finding the pause gate open and claiming the stub.
/// It widens the window in which ptrewind may stop the program in another thread meanwhile,
/// so a test can show that a claim is checked against the gate again
/// (`tests/qemu_watch.rs`); without that second check two threads entered the stub.
static TEST_CLAIM_DELAY_US: AtomicU64 = AtomicU64::new(0);

/// Sleeps [`TEST_CLAIM_DELAY_US`] (tests only).
fn test_claim_delay() {
    let us = TEST_CLAIM_DELAY_US.load(Ordering::Relaxed);
    if us != 0 {
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
}

/// Whether the block after `b` may start at a breakpoint of the pause file's list, or one lies
/// inside `b` or at its start (`base`: the mapping, `n` breakpoints).
fn may_reach_breakpoint(
    base: *mut AtomicU64,
    n: u64,
    b: Option<&BlockInfo>,
    ret_to: Option<u64>,
) -> bool {
    let Some(b) = b else { return false };
    // At its start too: a thread that came to the block while the breakpoint was out of QEMU
    // (a step over it) runs it without QEMU's check. A block ending in `ret` may lead to the
    // return address its thread's innermost call pushed (`ret_to`): where GDB's `finish` and
    // `next` over a call put their breakpoint, which another thread returning from the same
    // function reaches too.
    breakpoints(base, n).any(|bp| {
        (bp >= b.start && bp <= b.fallthrough) || b.target == Some(bp) || ret_to == Some(bp)
    })
}

/// The first `n` addresses of the pause file's breakpoint list (`base`: the mapping).
fn breakpoints(base: *mut AtomicU64, n: u64) -> impl Iterator<Item = u64> {
    use output::pause_gate as g;
    (0..(n as usize).min(g::MAX_BPS)).map(move |k| {
        // SAFETY: breakpoint words lie inside the mapping.
        unsafe { &*base.add(g::BPS + k) }.load(Ordering::Relaxed)
    })
}

/// Whether `pc` is a breakpoint of the pause file's list (`base`: the mapping).
fn listed_breakpoint(base: *mut AtomicU64, pc: u64) -> bool {
    use output::pause_gate as g;
    // SAFETY: the count word lies inside the mapping.
    let n = unsafe { &*base.add(g::NBPS) }.load(Ordering::Acquire);
    breakpoints(base, n).any(|bp| bp == pc)
}

/// Publishes that thread `tid` waits at the pause gate in slot `i` (its vCPU index, below
/// `MAX_SLOTS`), at guest PC `pc` (0: a system call's return): the PC first, then the thread,
/// which ptrewind reads first.
fn publish_slot(base: *mut AtomicU64, i: usize, tid: u64, pc: u64) {
    use output::pause_gate as g;
    // SAFETY: slot words of an index below `MAX_SLOTS` lie inside the mapping.
    unsafe { &*base.add(g::SLOTS + 2 * i + 1) }.store(pc, Ordering::Relaxed);
    // SAFETY: as above.
    unsafe { &*base.add(g::SLOTS + 2 * i) }.store(tid, Ordering::Release);
}

/// Empties slot `i` (the thread runs on).
fn clear_slot(base: *mut AtomicU64, i: usize) {
    use output::pause_gate as g;
    // SAFETY: slot words of an index below `MAX_SLOTS` lie inside the mapping.
    unsafe { &*base.add(g::SLOTS + 2 * i) }.store(0, Ordering::Release);
}

/// Blocks translated with a breakpoint callback on an instruction after their first (the
/// leaked [`BlockInfo`]'s address; see [`on_breakpoint_insn`]). Read only by a thread the pause
/// gate holds at such a block's start.
static BLOCKS_WITH_BREAKPOINTS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashSet<usize>>,
> = std::sync::LazyLock::new(Default::default);

/// Whether the block `b` was translated with a breakpoint callback inside it (after its first
/// instruction) for a breakpoint still listed.
fn breakpoint_inside(base: *mut AtomicU64, b: Option<&BlockInfo>) -> bool {
    let Some(b) = b else { return false };
    let key = b as *const BlockInfo as usize;
    let has = BLOCKS_WITH_BREAKPOINTS
        .lock()
        .map(|l| l.contains(&key))
        .unwrap_or(false);
    has && b
        .offsets
        .iter()
        .any(|&off| listed_breakpoint(base, b.start + u64::from(off)))
}

/// Whether the block `b` starts at a breakpoint of the pause file's list (`base`: the mapping).
fn starts_at_breakpoint(base: *mut AtomicU64, b: Option<&BlockInfo>) -> bool {
    b.is_some_and(|b| held_at_breakpoint(base, b.start))
}

/// Whether a thread held right before `pc` stays there: `pc` is a listed breakpoint, or the
/// list is being rewritten (briefly incomplete then: the hold outlasts the rewrite).
fn held_at_breakpoint(base: *mut AtomicU64, pc: u64) -> bool {
    use output::pause_gate as g;
    // SAFETY: the busy word lies inside the mapping.
    let busy = unsafe { &*base.add(g::BPS_BUSY) }.load(Ordering::Acquire) != 0;
    busy || listed_breakpoint(base, pc)
}

/// The pause gate (`pause=on`, a live session): waits while ptrewind holds this thread (the
/// debugger has another one stopped in QEMU's gdbstub) or another thread has claimed the
/// next breakpoint, and claims it when the block `b` about to run may lead to one (so two
/// threads do not reach the gdbstub at once: QEMU 7.2 would read the debugger's packets from
/// both). Publishes where it waits: `b`'s start (0 at a system call's return). Never waits
/// inside a translation (no QEMU lock is held).
#[inline]
fn pause_point(vcpu: c_uint, tid: u32, b: Option<&BlockInfo>, ret_to: Option<u64>) {
    let base = PAUSE_GATE.load(Ordering::Relaxed);
    if base.is_null() {
        return;
    }
    pause_point_gated(base, vcpu, tid, b, ret_to);
}

/// [`pause_point`] with a gate (live sessions). Kept out of line: inlined, its body made the
/// block callback of every recording slower (qsort 1 M: 2.50 → 2.91 CPU seconds).
#[cold]
#[inline(never)]
fn pause_point_gated(
    base: *mut AtomicU64,
    vcpu: c_uint,
    tid: u32,
    b: Option<&BlockInfo>,
    ret_to: Option<u64>,
) {
    use output::pause_gate as g;
    // SAFETY: the gate mapping holds `g::SIZE / 8` words and is never unmapped.
    let word = |i: usize| unsafe { &*base.add(i) };
    let me = u64::from(tid);
    let (gate, claim) = (word(g::GATE), word(g::CLAIM));
    let wants = {
        let n = word(g::NBPS).load(Ordering::Relaxed);
        n != 0 && may_reach_breakpoint(base, n, b, ret_to)
    };
    if gate.load(Ordering::Acquire) == 0 && claim.load(Ordering::Acquire) == 0 && !wants {
        report_deferred_watch(vcpu, tid);
        return;
    }
    if getpid() != GATED_PID.load(Ordering::Relaxed) {
        return;
    }
    let slot = (vcpu as usize) < g::MAX_SLOTS;
    let mut published = false;
    let mut claim_wait: Option<std::time::Instant> = None;
    // A pulse from here on lets this block run (one block: the next one waits again).
    let pulse = word(g::PULSE);
    let pulse_at = pulse.load(Ordering::Acquire);
    // A block with a listed breakpoint inside, translated while it was out of QEMU (QEMU's own
    // check is only at block starts then): a held thread runs on to the breakpoint's callback
    // and waits there, right before it, instead of here (a pulse or the next continue would
    // run the whole block, the breakpoint unseen).
    let mut runs_to_breakpoint = None;
    // Held: ptrewind has the program stopped (another thread is in the stub) and has not let
    // this thread run (its own step, or a pulse since this block was reached). A pulse does not
    // move a thread waiting at a block that starts at a breakpoint of the list: it came there
    // while the debugger had that breakpoint out of QEMU (GDB lifts them all while the program
    // is stopped and steps the stopped thread over its own), so running the block would pass
    // the breakpoint unseen; it waits there until the program runs on and ptrewind reports the
    // hit (the list keeps the lifted ones until then). One pulse per step is QEMU's exclusive
    // work at the step's start, which this thread has left its block for already.
    let held = || {
        let gw = gate.load(Ordering::Acquire);
        gw != 0
            && gw != g::encode(Some(tid))
            && (pulse.load(Ordering::Acquire) == pulse_at || starts_at_breakpoint(base, b))
    };
    loop {
        let held_now = held();
        if held_now && *runs_to_breakpoint.get_or_insert_with(|| breakpoint_inside(base, b)) {
            break;
        }
        if !held_now && wants {
            test_claim_delay();
        }
        let cw = claim.load(Ordering::Acquire);
        let claimed = cw != 0
            && cw != me
            && claim_wait
                .get_or_insert_with(std::time::Instant::now)
                .elapsed()
                < CLAIM_WAIT;
        if !held_now && !claimed {
            if !wants {
                if cw == me {
                    let _ = claim.compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed);
                }
                break;
            }
            if cw == me
                || claim
                    .compare_exchange(cw, me, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                // The gate again, now that the claim is ours: the program may have stopped
                // in another thread between the gate check above and the claim (ptrewind
                // closes the gate, then clears the stopped thread's claim — a claim taken
                // after that clearing finds the gate closed here). Seen under load: this
                // thread ran on into a breakpoint and entered the stub while another
                // thread's stop was being served.
                if !held() {
                    break;
                }
                let _ = claim.compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
            continue;
        }
        if slot && !published {
            publish_slot(base, vcpu as usize, me, b.map_or(0, |b| b.start));
            published = true;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    if published {
        clear_slot(base, vcpu as usize);
    }
    report_deferred_watch(vcpu, tid);
}

/// A watchpoint hit this thread made while the pause gate held it is reported once it runs
/// freely (at a block start or system call return after a continue, not in a step's pulse: the
/// stop comes at the end of that block).
#[inline]
fn report_deferred_watch(vcpu: c_uint, tid: u32) {
    let Some(deferred) = WATCH_DEFERRED.get(vcpu as usize) else {
        return;
    };
    if deferred.load(Ordering::Relaxed) && watch::stepping() == 0 {
        deferred.store(false, Ordering::Relaxed);
        // Not if a step of this thread reported it meanwhile (ptrewind cleared the slot).
        if watch::has_hit(vcpu, tid) {
            stop_for_watch(vcpu, tid);
        }
    }
}

/// Per vCPU index: its thread hit a watchpoint while it had to wait (see [`stop_for_watch`]).
/// A plain array, not a thread-local: in a shared library every thread-local access is a
/// `__tls_get_addr` call, and this flag is read at every block start of a live session.
static WATCH_DEFERRED: [AtomicBool; MAX_VCPUS] = [const { AtomicBool::new(false) }; MAX_VCPUS];

/// Marks `vcpu`'s hit as waiting.
fn defer_watch(vcpu: c_uint) {
    if let Some(d) = WATCH_DEFERRED.get(vcpu as usize) {
        d.store(true, Ordering::Relaxed);
    }
}

/// Whether this is the process the gates serve (a forked child runs free).
fn is_gated_process() -> bool {
    getpid() == GATED_PID.load(Ordering::Relaxed)
}

/// A watchpoint hit of thread `tid` (published in its hit slot): makes QEMU's gdbstub report
/// it. The thread claims the stub (the others wait at their next block, as for a breakpoint)
/// and sends itself `SIGTRAP`, which QEMU takes at the end of the running block. A thread that
/// ptrewind single-steps sends nothing: the step's stop reports the hit (a queued signal would
/// stop it again after the next resume). A thread the pause gate holds (the program is stopped
/// in another thread, which is in the stub), let out of its block during another thread's
/// step, or meeting another thread's claim (that one may be about to reach a breakpoint) waits
/// until it may go: two threads in the stub at once would both read the debugger's packets.
fn stop_for_watch(vcpu: c_uint, tid: u32) {
    use output::pause_gate as g;
    let base = PAUSE_GATE.load(Ordering::Relaxed);
    if !base.is_null() {
        // SAFETY: the gate mapping holds `g::SIZE / 8` words and is never unmapped.
        let word = |i: usize| unsafe { &*base.add(i) };
        let gate = word(g::GATE).load(Ordering::Acquire);
        if gate == g::encode(Some(tid)) {
            return;
        }
        let step = watch::stepping();
        let me = u64::from(tid);
        if gate != 0 || (step != 0 && step != me) {
            defer_watch(vcpu);
            return;
        }
        test_claim_delay();
        // Another thread about to reach a breakpoint claimed the stub: report later.
        if let Err(owner) =
            word(g::CLAIM).compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
            && owner != me
        {
            defer_watch(vcpu);
            return;
        }
        // The gate again, now that the claim is ours: the program may have stopped in another
        // thread between the gate check above and the claim (ptrewind closes the gate, then
        // clears the claim of the thread that stopped, so a claim taken after that finds the
        // gate closed here). Seen: the signal sent then, this thread entered the stub while
        // the other thread's stop was being served; two threads reading the debugger's
        // socket wedged the session.
        if word(g::GATE).load(Ordering::Acquire) != 0 || watch::stepping() != 0 {
            let _ = word(g::CLAIM).compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed);
            defer_watch(vcpu);
            return;
        }
    }
    // SAFETY: tgkill(2) to this very thread; QEMU's handler queues the signal for the guest.
    unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid(),
            tid as libc::c_int,
            libc::SIGTRAP,
        );
    }
}

/// Gives up this thread's breakpoint claim (it enters a system call: it may wait there).
fn release_claim(tid: u32) {
    let base = PAUSE_GATE.load(Ordering::Relaxed);
    if base.is_null() || tid == 0 {
        return;
    }
    // SAFETY: the claim word lies inside the mapping, which is never unmapped.
    let claim = unsafe { &*base.add(output::pause_gate::CLAIM) };
    let _ = claim.compare_exchange(u64::from(tid), 0, Ordering::AcqRel, Ordering::Relaxed);
}

static CONFIG: OnceLock<Config> = OnceLock::new();
/// The global instruction clock every stream's TSC packets come from: a `u64` in the shared
/// mapping of the recording's `clock` file (so ptrewind reads progress, and forked children
/// share it), or this fallback when the file cannot be mapped.
static CLOCK_FALLBACK: AtomicU64 = AtomicU64::new(0);
static CLOCK: AtomicPtr<AtomicU64> = AtomicPtr::new(ptr::null_mut());

fn clock() -> &'static AtomicU64 {
    let p = CLOCK.load(Ordering::Relaxed);
    // SAFETY: a non-null CLOCK points into a shared mapping that is never unmapped.
    unsafe { p.as_ref() }.unwrap_or(&CLOCK_FALLBACK)
}

/// The shared counter file (precise mode) and the next free slot in it.
static COUNTERS: AtomicPtr<AtomicU64> = AtomicPtr::new(ptr::null_mut());
static NEXT_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Creates `DIR/name` (new, private, never through a link) of `len` bytes and maps it shared
/// read-write; the mapping is never unmapped (translated code keeps pointers into it), and
/// `extra` adds mmap flags (`MAP_NORESERVE` for a sparse file).
fn map_shared_file(
    dir: &std::path::Path,
    name: &str,
    len: u64,
    extra: libc::c_int,
) -> Result<*mut AtomicU64, String> {
    use std::os::fd::AsRawFd;
    let path = dir.join(name);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.set_len(len)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: a shared read-write mapping of `len` bytes of a file we just created privately;
    // the fd may be closed afterwards, the mapping stays.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | extra,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "mmap {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(p as *mut AtomicU64)
}

/// Maps `DIR/counters` shared (a sparse file) for the blocks' reached-instruction counters.
fn map_counters(dir: &std::path::Path) -> Result<(), String> {
    let p = map_shared_file(
        dir,
        output::COUNTERS_FILE,
        output::COUNTER_SLOTS * 8,
        libc::MAP_NORESERVE,
    )?;
    COUNTERS.store(p, Ordering::Relaxed);
    Ok(())
}

/// A fresh slot of the shared counter file, if any is left.
fn shared_counter() -> Option<(&'static AtomicU64, u64)> {
    let base = COUNTERS.load(Ordering::Relaxed);
    if base.is_null() {
        return None;
    }
    let i = NEXT_COUNTER.fetch_add(1, Ordering::Relaxed);
    // SAFETY: `i` is below the mapping's slot count; the mapping lives forever.
    (i < output::COUNTER_SLOTS).then(|| (unsafe { &*base.add(i as usize) }, i))
}

/// Maps `DIR/clock` (8 bytes) shared and points CLOCK at it.
fn map_clock(dir: &std::path::Path) -> Result<(), String> {
    let p = map_shared_file(dir, output::CLOCK_FILE, 8, 0)?;
    CLOCK.store(p, Ordering::Relaxed);
    Ok(())
}

/// Host address minus guest address of code (QEMU's `guest_base`), from the first translation.
static GUEST_BASE: AtomicI64 = AtomicI64::new(i64::MIN);
/// Whether this process has written its first memory-map snapshot.
static MAPS_DONE_FOR: AtomicU32 = AtomicU32::new(0);
/// The guest's signal handlers, from its rt_sigaction calls.
static HANDLERS: SignalHandlers = SignalHandlers::new();
static WARNED: AtomicBool = AtomicBool::new(false);

struct Vcpu {
    index: u32,
    tid: u32,
    tracer: ThreadTracer<'static>,
    out: Option<ThreadOutput>,
    tail: Option<Tail>,
    log: Option<BufWriter<std::fs::File>>,
    done: bool,
    /// This thread ended the process: QEMU ran the plugin's `atexit` on it (its `exit_group`,
    /// or the fatal signal it took).
    ended_process: bool,
    /// An executable file mapping in progress: (length, offset, path).
    pending: Option<(u64, u64, String)>,
}

/// One vCPU's state. The block callback takes it without any lock: a lock per block was the
/// largest single cost of the callback (an uncontended `cmpxchg` + `xchg` per block, ≈ 11 % of a
/// qsort run's CPU time). The rare callbacks (system calls, vCPU exit, atexit, a reused index)
/// take the `busy` flag, because QEMU may run them on another thread at the same time (see
/// [`Slot::with`]).
struct Slot {
    /// The process the state belongs to: after `fork`, the child sees its parent's states and
    /// must not touch them (they belong to threads that do not exist in the child).
    pid: AtomicU32,
    /// Held by whoever runs one of the rare callbacks on this state.
    busy: AtomicBool,
    vcpu: UnsafeCell<Vcpu>,
}

// SAFETY: the `Vcpu` is only reached through `Slot::with` (under `busy`) and `Slot::on_own_thread`
// (whose contract excludes every other access); the other fields are atomic.
unsafe impl Sync for Slot {}

impl Slot {
    /// Runs `f` on the state, holding `busy`. Needed because some callbacks can run on another
    /// thread while this vCPU's thread is in a system call: `atexit` (from the `exit_group` of
    /// any thread), the vCPU's own exit (outside QEMU's exclusive sections), the system-call
    /// callbacks of this vCPU.
    fn with<R>(&self, f: impl FnOnce(&mut Vcpu) -> R) -> R {
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        // SAFETY: `busy` is held, which excludes every other `with`; `on_own_thread` never runs
        // at the same time (see its contract).
        let r = f(unsafe { &mut *self.vcpu.get() });
        self.busy.store(false, Ordering::Release);
        r
    }

    /// The state, for the block and instruction callbacks, without taking `busy`.
    ///
    /// # Safety
    ///
    /// The caller is a block or instruction execution callback of this slot's vCPU. Those run
    /// on the vCPU's own host thread (QEMU user mode runs each vCPU on one thread), so they
    /// never overlap each other or this vCPU's system-call and exit callbacks (same thread, one
    /// after the other). The callbacks of other threads that touch this state are excluded by
    /// QEMU: `atexit` runs after `qemu_plugin_user_exit` stopped every vCPU
    /// (`start_exclusive`), unregistered the callbacks and flushed the translated blocks, so no
    /// block callback runs again; a vCPU index is reused (`vcpu_init` on the cloning thread)
    /// only after the old vCPU left QEMU's CPU list under `clone_lock`, so its thread runs no
    /// more blocks.
    #[allow(clippy::mut_from_ref)]
    unsafe fn on_own_thread(&self) -> &mut Vcpu {
        // SAFETY: see the function's contract.
        unsafe { &mut *self.vcpu.get() }
    }
}

static SLOTS: [AtomicPtr<Slot>; MAX_VCPUS] = [const { AtomicPtr::new(ptr::null_mut()) }; MAX_VCPUS];

/// This process's id, cached: `getpid` is a system call (glibc does not cache it), far too
/// slow for every block. Updated in a forked child before it runs any block.
static PID: AtomicU32 = AtomicU32::new(0);

fn getpid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => real_getpid(),
        p => p,
    }
}

fn real_getpid() -> u32 {
    std::process::id()
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn config() -> Option<&'static Config> {
    CONFIG.get()
}

fn warn(msg: &str) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("ptrewind-qemu-plugin: {msg}");
    }
}

fn new_vcpu(index: u32) -> Vcpu {
    let precise = config().is_some_and(|c| c.precise);
    Vcpu {
        index,
        tid: 0,
        tracer: ThreadTracer::new(
            TracerConfig {
                precise,
                ..TracerConfig::default()
            },
            clock(),
        )
        .with_handlers(&HANDLERS),
        out: None,
        tail: None,
        log: None,
        done: false,
        ended_process: false,
        pending: None,
    }
}

/// The live state of `vcpu` in this process.
fn slot(vcpu: c_uint) -> Option<&'static Slot> {
    let p = SLOTS.get(vcpu as usize)?.load(Ordering::Acquire);
    // SAFETY: slots are leaked boxes, never freed.
    let s = unsafe { p.as_ref()? };
    (s.pid.load(Ordering::Relaxed) == getpid()).then_some(s)
}

fn install_slot(vcpu: c_uint) {
    let Some(cell) = SLOTS.get(vcpu as usize) else {
        warn(&format!(
            "vCPU index {vcpu} above {MAX_VCPUS}: thread not recorded"
        ));
        return;
    };
    if let Some(old) = slot(vcpu) {
        old.with(|v| finish(v, "replaced"));
    }
    let s = Box::leak(Box::new(Slot {
        pid: AtomicU32::new(getpid()),
        busy: AtomicBool::new(false),
        vcpu: UnsafeCell::new(new_vcpu(vcpu)),
    }));
    cell.store(s, Ordering::Release);
}

impl Vcpu {
    /// Creates the thread's stream and tail files (on its own thread: the file names carry its
    /// id).
    fn open(&mut self) {
        let Some(c) = config() else { return };
        if self.tid == 0 {
            self.tid = gettid();
        }
        let path = output::stream_path(&c.dir, getpid(), self.tid, "pt");
        match ThreadOutput::create(path.clone()) {
            Ok(o) => self.out = Some(o),
            Err(e) => {
                warn(&format!("cannot create {}: {e}", path.display()));
                self.done = true;
                return;
            }
        }
        let tail = output::stream_path(&c.dir, getpid(), self.tid, "tail");
        match Tail::create(&tail) {
            Ok(t) => self.tail = Some(t),
            Err(e) => warn(&format!(
                "cannot create {}: {e} (a crash would lose the stream's end)",
                tail.display()
            )),
        }
    }

    /// Moves the encoder's pending bytes through the ring into the stream file.
    fn flush(&mut self) {
        if self.out.is_none() {
            self.open();
        }
        let Vcpu {
            tracer, out, tail, ..
        } = self;
        if let Some(out) = out {
            tracer.encoder().consume_output(|b| out.write(b));
            // Nothing stays in the ring: what is not in the file is in the tail file.
            out.drain();
            if let Some(t) = tail {
                t.reset(out.bytes());
            }
        }
    }

    /// Keeps the tail file up to date after a block (see `output::Tail`).
    #[inline]
    fn mirror(&mut self) {
        let Vcpu { tracer, tail, .. } = self;
        if let Some(t) = tail {
            let in_flight = tracer.in_flight();
            let enc = tracer.encoder();
            t.mirror(enc.pending_output());
            t.set_state(enc.is_tracing(), in_flight, enc.pending_tnt());
        }
    }

    fn write_meta(&mut self, end: &str) {
        let Some(c) = config() else { return };
        self.flush();
        let Some(out) = &mut self.out else { return };
        out.drain();
        let meta = ThreadMeta {
            pid: getpid(),
            tid: self.tid,
            vcpu: self.index,
            bytes: out.bytes(),
            lost: out.lost(),
            gaps: out.gaps().to_vec(),
            end: end.to_string(),
            ended_process: self.ended_process,
            tracer: self.tracer.stats(),
            error: out.error().map(str::to_string),
        };
        let path = output::stream_path(&c.dir, meta.pid, meta.tid, "json");
        if let Err(e) = output::write_json(&path, &meta) {
            warn(&format!("cannot write {}: {e}", path.display()));
        }
        if let Some(log) = &mut self.log {
            let _ = log.flush();
        }
    }
}

fn finish(v: &mut Vcpu, end: &str) {
    if v.done {
        return;
    }
    v.tracer.finish();
    v.write_meta(end);
    v.done = true;
}

/// Appends the process's memory map to `PID.maps` (one `write`, so concurrent snapshots do not
/// interleave).
fn snapshot_maps(reason: &str) {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let base = GUEST_BASE.load(Ordering::Relaxed);
    let mut text = format!(
        "# snapshot {reason} guest_base={}\n",
        if base == i64::MIN { 0 } else { base }
    );
    text.push_str(&maps);
    append_maps(&text);
}

/// Appends `text` to this process's `PID.maps`.
fn append_maps(text: &str) {
    let Some(c) = config() else { return };
    let path = c.dir.join(format!("{}.maps", getpid()));
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path);
    match file {
        Ok(mut f) => {
            let _ = f.write_all(text.as_bytes());
        }
        Err(e) => warn(&format!("cannot write {}: {e}", path.display())),
    }
}

/// Reads a `u64` of guest memory without risking a fault (through `process_vm_readv` on this
/// process; guest addresses are host addresses plus QEMU's guest base).
fn read_guest_u64(addr: u64) -> Option<u64> {
    let base = GUEST_BASE.load(Ordering::Relaxed);
    let host = addr.wrapping_add(if base == i64::MIN { 0 } else { base as u64 });
    let mut v = 0u64;
    let local = libc::iovec {
        iov_base: (&mut v as *mut u64).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: host as *mut c_void,
        iov_len: 8,
    };
    // SAFETY: reads 8 bytes of our own address space into `v`; a bad address fails with EFAULT
    // instead of faulting.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == 8).then_some(v)
}

extern "C" fn on_vcpu_init(_id: qemu_plugin_id_t, vcpu: c_uint) {
    install_slot(vcpu);
}

extern "C" fn on_vcpu_exit(_id: qemu_plugin_id_t, vcpu: c_uint) {
    if let Some(s) = slot(vcpu) {
        s.with(|v| finish(v, "exit"));
    }
}

extern "C" fn on_tb_exec(vcpu: c_uint, udata: *mut c_void) {
    if CALLBACKS_ONLY.load(Ordering::Relaxed) {
        return;
    }
    let Some(s) = slot(vcpu) else { return };
    // SAFETY: the block execution callback of `vcpu`.
    let v = unsafe { s.on_own_thread() };
    if v.done {
        return;
    }
    if v.out.is_none() {
        let pid = getpid();
        if MAPS_DONE_FOR.swap(pid, Ordering::Relaxed) != pid {
            snapshot_maps("start");
        }
        v.open();
    }
    // SAFETY: `udata` is the leaked `BlockInfo` registered with this block at translation.
    let b: &'static BlockInfo = unsafe { &*(udata as *const BlockInfo) };
    v.tracer.on_block(b);
    if v.tracer.encoder().pending_output().len() >= WRITE_BATCH {
        v.flush();
    }
    v.mirror();
    let tid = v.tid;
    // A block ending in `ret` returns, as far as the trace knows, to its innermost call's
    // return address (the encoder's RET-compression stack: emptied at each PSB, when nothing
    // is predicted). Only a live session (a pause gate) asks.
    let ret_to = if b.class == ptrewind::flow::InsnClass::Return
        && !PAUSE_GATE.load(Ordering::Relaxed).is_null()
    {
        v.tracer.encoder().predicted_return()
    } else {
        None
    };
    // After the block is announced (the tail file says it is running, none of it executed).
    pause_point(vcpu, tid, Some(b), ret_to);
}

/// Right before a breakpoint inside a block translated while the debugger had it out of QEMU
/// (`udata`: its address): while the pause gate holds this thread, it waits here, its slot
/// naming the breakpoint, pulses or not; ptrewind reports the hit when the program runs on
/// (QEMU, which checks breakpoints at block starts only, would not). Running freely it goes
/// on: QEMU's own check serves blocks translated while the breakpoint is in.
extern "C" fn on_breakpoint_insn(vcpu: c_uint, udata: *mut c_void) {
    use output::pause_gate as g;
    let base = PAUSE_GATE.load(Ordering::Relaxed);
    if base.is_null() || !is_gated_process() {
        return;
    }
    let Some(s) = slot(vcpu) else { return };
    // SAFETY: the instruction execution callback of `vcpu`.
    let v = unsafe { s.on_own_thread() };
    if v.done {
        return;
    }
    let (tid, pc) = (v.tid, udata as u64);
    // SAFETY: the gate mapping holds `g::SIZE / 8` words and is never unmapped.
    let word = |i: usize| unsafe { &*base.add(i) };
    let held = || {
        let gw = word(g::GATE).load(Ordering::Acquire);
        gw != 0 && gw != g::encode(Some(tid)) && held_at_breakpoint(base, pc)
    };
    let i = vcpu as usize;
    if i >= g::MAX_SLOTS || !held() {
        return;
    }
    publish_slot(base, i, u64::from(tid), pc);
    while held() {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    clear_slot(base, i);
}

extern "C" fn on_insn_exec(vcpu: c_uint, udata: *mut c_void) {
    let Some(s) = slot(vcpu) else { return };
    // SAFETY: the instruction execution callback of `vcpu`.
    let v = unsafe { s.on_own_thread() };
    if v.done {
        return;
    }
    if v.log.is_none() {
        let Some(c) = config() else { return };
        if v.tid == 0 {
            v.tid = gettid();
        }
        let path = output::stream_path(&c.dir, getpid(), v.tid, "insns");
        match output::create_private(&path) {
            Ok(f) => v.log = Some(BufWriter::with_capacity(1 << 16, f)),
            Err(e) => {
                warn(&format!("cannot create {}: {e}", path.display()));
                return;
            }
        }
    }
    if let Some(log) = &mut v.log {
        // Written at once (test mode only): the log must survive QEMU dying of a signal.
        let _ = log.write_all(&(udata as u64).to_le_bytes());
        let _ = log.flush();
    }
}

extern "C" fn on_tb_trans(_id: qemu_plugin_id_t, tb: *mut qemu_plugin_tb) {
    let Some(c) = config() else { return };
    // SAFETY: `tb` is valid for the duration of this callback; every index is below n_insns.
    unsafe {
        let n = qemu_plugin_tb_n_insns(tb);
        if n == 0 {
            return;
        }
        let mut ips = Vec::with_capacity(n);
        for i in 0..n {
            let insn = qemu_plugin_tb_get_insn(tb, i);
            ips.push(qemu_plugin_insn_vaddr(insn));
        }
        let last = qemu_plugin_tb_get_insn(tb, n - 1);
        let data = qemu_plugin_insn_data(last) as *const u8;
        let size = qemu_plugin_insn_size(last);
        let bytes: &[u8] = if data.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(data, size)
        };
        if GUEST_BASE.load(Ordering::Relaxed) == i64::MIN {
            let first = qemu_plugin_tb_get_insn(tb, 0);
            let h = qemu_plugin_insn_haddr(first) as u64;
            GUEST_BASE.store(h.wrapping_sub(ips[0]) as i64, Ordering::Relaxed);
        }
        let Some(mut info) = BlockInfo::new(&ips, bytes) else {
            return;
        };
        if c.precise
            && let Some((counter, index)) = shared_counter()
        {
            info = info.with_shared_counter(counter, index);
        }
        watch::instrument(tb, &ips);
        // Blocks live as long as QEMU may run them; a re-translation makes a new one.
        let info: &'static BlockInfo = Box::leak(Box::new(info));
        let gate = PAUSE_GATE.load(Ordering::Relaxed);
        if !gate.is_null() {
            let mut inside = false;
            for (i, &ip) in ips.iter().enumerate().skip(1) {
                if listed_breakpoint(gate, ip) {
                    qemu_plugin_register_vcpu_insn_exec_cb(
                        qemu_plugin_tb_get_insn(tb, i),
                        on_breakpoint_insn,
                        QEMU_PLUGIN_CB_R_REGS,
                        ip as *mut c_void,
                    );
                    inside = true;
                }
            }
            if inside && let Ok(mut l) = BLOCKS_WITH_BREAKPOINTS.lock() {
                l.insert(info as *const BlockInfo as usize);
            }
        }
        for (i, &ip) in ips.iter().enumerate() {
            let insn = qemu_plugin_tb_get_insn(tb, i);
            if c.log {
                qemu_plugin_register_vcpu_insn_exec_cb(
                    insn,
                    on_insn_exec,
                    QEMU_PLUGIN_CB_NO_REGS,
                    ip as *mut c_void,
                );
            }
            if c.precise && i > 0 {
                qemu_plugin_register_vcpu_insn_exec_inline(
                    insn,
                    QEMU_PLUGIN_INLINE_ADD_U64,
                    info.reached_counter() as *mut c_void,
                    1,
                );
            }
        }
        qemu_plugin_register_vcpu_tb_exec_cb(
            tb,
            on_tb_exec,
            QEMU_PLUGIN_CB_NO_REGS,
            info as *const BlockInfo as *mut c_void,
        );
    }
}

const SYS_MMAP: i64 = 9;
const SYS_RT_SIGACTION: i64 = 13;
const SYS_CLONE: i64 = 56;
const SYS_FORK: i64 = 57;
const SYS_VFORK: i64 = 58;
const SYS_EXECVE: i64 = 59;
const SYS_EXIT: i64 = 60;
const SYS_EXECVEAT: i64 = 322;
const SYS_EXIT_GROUP: i64 = 231;
const SYS_CLONE3: i64 = 435;
const PROT_EXEC: u64 = 4;
const MAP_ANONYMOUS: u64 = 0x20;

#[allow(clippy::too_many_arguments)]
extern "C" fn on_syscall(
    _id: qemu_plugin_id_t,
    vcpu: c_uint,
    num: i64,
    a1: u64,
    a2: u64,
    a3: u64,
    a4: u64,
    a5: u64,
    a6: u64,
    _a7: u64,
    _a8: u64,
) {
    let Some(s) = slot(vcpu) else { return };
    // When the thread leaves user space (its stream says so once the call's block is decided,
    // at its return): what orders it against the threads that run while it is in the kernel.
    s.with(|v| {
        if !v.done {
            v.tracer.at_system_call();
        }
    });
    if !PAUSE_GATE.load(Ordering::Relaxed).is_null() {
        release_claim(s.with(|v| v.tid));
    }
    match num {
        SYS_MMAP if a3 & PROT_EXEC != 0 && a4 & MAP_ANONYMOUS == 0 => {
            // Guest and host file descriptors are the same in QEMU user mode.
            let path = std::fs::read_link(format!("/proc/self/fd/{}", a5 as i32))
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            s.with(|v| v.pending = Some((a2, a6, path)));
        }
        SYS_EXECVE | SYS_EXECVEAT => {
            // The process image may be replaced without any exit callback: end the stream
            // (the SYSCALL's TIP.PGD) and save it now. A failed execve goes on with TIP.PGE.
            s.with(|v| {
                if !v.done {
                    v.tracer.finish();
                    v.write_meta("exec");
                }
            });
        }
        SYS_EXIT => {
            // A thread's own exit waits while the program is stopped (all-stop, as at a system
            // call's return): it is still there for the debugger, registers and all, and goes
            // once the program runs again.
            if !PAUSE_GATE.load(Ordering::Relaxed).is_null() {
                let tid = s.with(|v| v.tid);
                pause_point(vcpu, if tid == 0 { gettid() } else { tid }, None, None);
            }
            s.with(|v| finish(v, "exit"))
        }
        SYS_EXIT_GROUP => hold_at_exit(num, [a1, a2, a3, a4, a5, a6]),
        SYS_RT_SIGACTION if a2 != 0 => {
            if let Some(h) = read_guest_u64(a2) {
                HANDLERS.set(a1, h);
            }
        }
        _ => {}
    }
}

extern "C" fn on_syscall_ret(_id: qemu_plugin_id_t, vcpu: c_uint, num: i64, ret: i64) {
    if !PAUSE_GATE.load(Ordering::Relaxed).is_null()
        && let Some(s) = slot(vcpu)
    {
        // A signal that came during the call reaches the gdbstub before the next block.
        let tid = s.with(|v| v.tid);
        pause_point(vcpu, if tid == 0 { gettid() } else { tid }, None, None);
    }
    match num {
        SYS_MMAP => {
            let Some(s) = slot(vcpu) else { return };
            let pending = s.with(|v| v.pending.take());
            if let Some((len, off, path)) = pending
                && ret >= 0
            {
                append_maps(&format!("# mmap {ret:#x} {len:#x} {off:#x} {path}\n"));
            }
        }
        SYS_FORK | SYS_VFORK | SYS_CLONE | SYS_CLONE3 if ret == 0 => {
            // In a forked child the vCPU's state still belongs to the parent: start afresh.
            let Some(cell) = SLOTS.get(vcpu as usize) else {
                return;
            };
            let p = cell.load(Ordering::Acquire);
            // SAFETY: slots are leaked boxes, never freed.
            let Some(old) = (unsafe { p.as_ref() }) else {
                return;
            };
            if old.pid.load(Ordering::Relaxed) != real_getpid() {
                PID.store(real_getpid(), Ordering::Relaxed);
                install_slot(vcpu);
                snapshot_maps("fork");
                MAPS_DONE_FOR.store(getpid(), Ordering::Relaxed);
            }
        }
        _ => {}
    }
}

extern "C" fn on_atexit(_id: qemu_plugin_id_t, _udata: *mut c_void) {
    // QEMU runs `atexit` on the thread that ends the process (`preexit_cleanup` from its
    // `exit_group` or from the fatal signal's `dump_core_and_abort`): the one a debugger should
    // show at the end. Other threads can look alike there (stopped part-way through a block).
    let ender = gettid();
    for cell in SLOTS.iter() {
        let p = cell.load(Ordering::Acquire);
        // SAFETY: slots are leaked boxes, never freed.
        let Some(s) = (unsafe { p.as_ref() }) else {
            continue;
        };
        if s.pid.load(Ordering::Relaxed) == getpid() {
            s.with(|v| {
                v.ended_process = v.tid == ender;
                finish(v, "process-exit");
            });
        }
    }
}

fn parse_args(argc: c_int, argv: *const *const c_char) -> Result<Config, String> {
    let mut dir = None;
    let mut precise = true;
    let mut log = false;
    let mut exit_stop = false;
    let mut pause = false;
    for i in 0..argc.max(0) as usize {
        // SAFETY: QEMU passes `argc` valid NUL-terminated strings.
        let arg = unsafe { CStr::from_ptr(*argv.add(i)) }.to_string_lossy();
        let (k, v) = arg
            .split_once('=')
            .ok_or_else(|| format!("argument {arg:?} is not KEY=VALUE"))?;
        let flag = |v: &str| match v {
            "on" | "true" | "yes" => Ok(true),
            "off" | "false" | "no" => Ok(false),
            _ => Err(format!("{k}={v}: expected on or off")),
        };
        match k {
            "out" => dir = Some(PathBuf::from(v)),
            "precise" => precise = flag(v)?,
            "log" => log = flag(v)?,
            "exit_stop" => exit_stop = flag(v)?,
            "pause" => pause = flag(v)?,
            "measure" if v == "callbacks" => CALLBACKS_ONLY.store(true, Ordering::Relaxed),
            _ => {
                return Err(format!(
                    "unknown argument {k:?} (known: out, precise, log, exit_stop, pause, measure=callbacks)"
                ));
            }
        }
    }
    let dir = dir.ok_or("missing out=DIR (the recording directory)")?;
    let md = std::fs::symlink_metadata(&dir).map_err(|e| format!("out={}: {e}", dir.display()))?;
    if !md.is_dir() {
        return Err(format!("out={}: not a directory", dir.display()));
    }
    Ok(Config {
        dir,
        precise,
        log,
        exit_stop,
        pause,
    })
}

/// Whether this QEMU (plugin API versions `min..=cur`) can run the plugin (built for
/// [`QEMU_PLUGIN_VERSION`]); the error names both.
fn check_api(min: c_int, cur: c_int) -> Result<(), String> {
    if (min..=cur).contains(&QEMU_PLUGIN_VERSION) {
        return Ok(());
    }
    Err(format!(
        "plugin API version {QEMU_PLUGIN_VERSION} is not supported by this QEMU (it supports \
         versions {min} to {cur}); this plugin is built for QEMU 7.2's API version \
         {QEMU_PLUGIN_VERSION}"
    ))
}

/// Called by QEMU when it loads the plugin.
///
/// # Safety
///
/// QEMU passes a valid `info` for the duration of the call and `argc` valid C strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn qemu_plugin_install(
    id: qemu_plugin_id_t,
    info: *const qemu_info_t,
    argc: c_int,
    argv: *const *const c_char,
) -> c_int {
    // SAFETY: see the function's contract.
    let info = unsafe { &*info };
    if let Err(e) = check_api(info.version_min, info.version_cur) {
        eprintln!("ptrewind-qemu-plugin: {e}");
        return 1;
    }
    // SAFETY: target_name is a NUL-terminated string owned by QEMU.
    let target = unsafe { CStr::from_ptr(info.target_name) }
        .to_string_lossy()
        .into_owned();
    if info.system_emulation || target != "x86_64" {
        eprintln!(
            "ptrewind-qemu-plugin: only x86_64 user-mode emulation is supported (this is {}{})",
            target,
            if info.system_emulation {
                ", system emulation"
            } else {
                ""
            }
        );
        return 1;
    }
    let config = match parse_args(argc, argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ptrewind-qemu-plugin: {e}");
            return 1;
        }
    };
    let meta = PluginMeta {
        api_version: QEMU_PLUGIN_VERSION,
        qemu_api: (info.version_min, info.version_cur),
        target,
        precise: config.precise,
        log_insns: config.log,
    };
    if let Err(e) = map_clock(&config.dir) {
        eprintln!("ptrewind-qemu-plugin: {e}");
        return 1;
    }
    if config.precise
        && let Err(e) = map_counters(&config.dir)
    {
        eprintln!("ptrewind-qemu-plugin: {e}");
        return 1;
    }
    if config.exit_stop {
        match map_shared_file(&config.dir, output::EXIT_FILE, output::exit_gate::SIZE, 0) {
            Ok(p) => EXIT_GATE.store(p, Ordering::Release),
            Err(e) => {
                eprintln!("ptrewind-qemu-plugin: {e}");
                return 1;
            }
        }
        GATED_PID.store(real_getpid(), Ordering::Relaxed);
    }
    if config.pause {
        if let Some(us) = std::env::var_os("PTREWIND_QEMU_TEST_CLAIM_DELAY_US")
            .and_then(|v| v.to_str()?.parse().ok())
        {
            TEST_CLAIM_DELAY_US.store(us, Ordering::Relaxed);
        }
        match map_shared_file(&config.dir, output::PAUSE_FILE, output::pause_gate::SIZE, 0) {
            Ok(p) => PAUSE_GATE.store(p, Ordering::Release),
            Err(e) => {
                eprintln!("ptrewind-qemu-plugin: {e}");
                return 1;
            }
        }
        GATED_PID.store(real_getpid(), Ordering::Relaxed);
        if let Err(e) = watch::map(&config.dir) {
            eprintln!("ptrewind-qemu-plugin: {e}");
            return 1;
        }
    }
    PID.store(real_getpid(), Ordering::Relaxed);
    let _ = output::write_json(&config.dir.join(output::PLUGIN_FILE), &meta);
    if CONFIG.set(config).is_err() {
        return 1;
    }
    // SAFETY: registering plain callbacks with the id QEMU gave us.
    unsafe {
        qemu_plugin_register_vcpu_init_cb(id, on_vcpu_init);
        qemu_plugin_register_vcpu_exit_cb(id, on_vcpu_exit);
        qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
        qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
        qemu_plugin_register_vcpu_syscall_ret_cb(id, on_syscall_ret);
        qemu_plugin_register_atexit_cb(id, on_atexit, ptr::null_mut());
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_mismatch_names_both_versions() {
        assert_eq!(check_api(1, 1), Ok(()));
        assert_eq!(check_api(0, 2), Ok(()));
        let e = check_api(2, 4).unwrap_err();
        assert!(
            e.contains("plugin API version 1 is not supported") && e.contains("versions 2 to 4"),
            "{e}"
        );
    }
}
