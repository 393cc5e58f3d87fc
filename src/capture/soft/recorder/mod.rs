//! The software recorder: single-steps a [`StepTarget`], classifies every executed instruction,
//! feeds the [`SoftEncoder`] and writes its packets through a ToPA output ring that a drainer
//! thread empties into a [`TraceStore`].
//!
//! ## What one step observes
//!
//! Before a step the recorder reads RIP and the (cached) instruction there; after it, the stop
//! and the new RIP. From the pair it knows whether the instruction executed and where the flow
//! went:
//!
//! * SIGTRAP with `si_code` `TRAP_TRACE`/`TRAP_BRKPT`: the instruction executed (the BRKPT form
//!   is the trap the kernel reports after a single-stepped system call);
//! * a signal-delivery stop (SIGSEGV at a faulting instruction, or an asynchronous SIGALRM):
//!   the instruction did *not* execute (the kernel reports synchronous signals, the step trap
//!   included, before asynchronous ones, so an asynchronous stop means the signal arrived before
//!   the instruction). The signal is passed with the next step, as the program would receive it;
//! * SIGTRAP with `si_code == SIGTRAP` after passing a signal: the kernel delivered it and the
//!   tracee stands at the first instruction of the handler — an asynchronous transfer
//!   (FUP(the instruction that did not run) + TIP.PGD, then TIP.PGE at the handler);
//! * a REP string instruction that leaves RIP unchanged ran one iteration: it is recorded once,
//!   when RIP finally moves on (a decoder reports it once too);
//! * `PTRACE_EVENT_EXIT`: the last instruction (`exit_group`) executed; the process image is
//!   snapshotted while its memory is still there, then the trace ends cleanly.
//!
//! `rt_sigreturn` needs no special case: it is a SYSCALL (TIP.PGD) after which the kernel
//! returns somewhere else (TIP.PGE at the interrupted IP). A successful `execve` is a SYSCALL
//! too, reported as `PTRACE_EVENT_EXEC`; recording goes on in the new program (TIP.PGE at its
//! first instruction) with the instruction cache emptied.
//!
//! ## Stops inside a restartable system call
//!
//! A process stopped inside an interrupted system call (at attach, or by an interrupt while a
//! blocking call ran) stands *after* its 2-byte `syscall` with RAX = `-ERESTARTSYS`,
//! `-ERESTARTNOINTR`, `-ERESTARTNOHAND` or `-ERESTART_RESTARTBLOCK` and ORIG_RAX = the call.
//! Resumed without a signal handler to run, the kernel restarts it (x86
//! `arch_do_signal_or_restart`): RIP -= 2 and RAX = the call (`restart_syscall` for
//! `-ERESTART_RESTARTBLOCK`), so the next instruction executed is that `syscall` again. The
//! recorder records such a step as the `syscall` at RIP - 2 with those registers before it.
//!
//! ## Block stepping
//!
//! Straight-line code produces no packets, so by default ([`StepMode::Block`]) the recorder
//! runs each run of non-branch instructions at full speed up to a temporary INT3 on the next
//! change-of-flow instruction (or system call), and single-steps only that one. A signal or
//! fault inside the block stops it at an instruction boundary: everything before that IP
//! executed. Block stepping is not used while the [`StateLog`] is on (it needs every
//! instruction's effects), while a signal is to be delivered, or once the process created a
//! thread (threads share the code: a temporary INT3 could trap another thread).
//!
//! ## Limits
//!
//! Every thread is recorded, one at a time (see [`SoftRecorder::step`]); children the program
//! forks run untraced (the target detaches them). Code that
//! is modified without `mmap`/`mprotect`/`munmap`/`mremap` system calls (a JIT writing into
//! RWX memory) is not re-decoded. The execution mode is assumed to be 64-bit user mode (far
//! transfers into 32-bit code get no MODE.Exec). Inside a SIGTRAP handler every step's trap
//! finds SIGTRAP blocked, and the kernel then resets the program's SIGTRAP handler to the
//! default action (as when GDB steps there): a second SIGTRAP (INT3) would kill the program.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::classify::{CachedInsn, DecodeInsnError, InsnCache, InsnClass, cofi};
use super::encoder::{EncoderConfig, EncoderStats, SoftEncoder, Step};
use super::procmaps::{self, SymbolError};
use super::state_log::{StateLog, SuspendedStep};
use super::target::{
    SIGINFO_SIZE, StepStop, StepTarget, TRAP_BRKPT, TRAP_SIGNAL_DELIVERED, TRAP_TRACE,
};
use crate::image::Image;
use crate::ring::{BuildError, Capabilities, IntOn, SharedRing, Topa, TraceSource, Wake};
use crate::store::live::{Gap, TraceStore};
use crate::target::{Gprs, RegMask, TargetError, X86Registers};

mod block;
mod steps;
mod threads;

pub use block::run_to_breakpoint;

/// Where recording starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordFrom {
    /// At `main` (from the executable's symbol table): the dynamic loader and libc start-up run
    /// untraced at full speed up to a temporary breakpoint. A stripped executable (no `main`
    /// symbol) is recorded from its entry point ([`SoftRecorder::start_address`] says where).
    Main,
    /// At the executable's ELF entry point (`_start`), after the dynamic loader.
    Entry,
    /// At the first user instruction after `execve` (the dynamic loader's entry).
    Exec,
    /// Not automatically: call [`SoftRecorder::record_on`].
    OnDemand,
}

/// Stops a [`SoftRecorder::run`] from another thread.
#[derive(Debug, Clone)]
pub struct Interrupter(Arc<AtomicBool>);

impl Interrupter {
    /// Asks the running recorder to return at the next instruction boundary.
    pub fn interrupt(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// How the recorder advances the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepMode {
    /// Single-step every instruction.
    Single,
    /// Run each run of straight-line instructions (no change of flow, so no packets) at full
    /// speed up to a temporary INT3 on the next change-of-flow instruction, which is then
    /// single-stepped. The recorded flow is the same; it is faster by about the average block
    /// length. Used only while the [`StateLog`] is off (it needs every instruction's effects),
    /// no signal is pending, and the process has not created threads (which share the code
    /// and would hit the temporary INT3).
    Block,
}

/// Straight-line instructions below which a block is single-stepped instead.
const MIN_BLOCK: usize = 3;
/// Longest straight-line run decoded ahead.
const MAX_BLOCK: usize = 256;

/// The ToPA output table the encoder writes through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    /// Output region sizes (each 4 KiB << n), in table order; the table is circular.
    pub region_sizes: Vec<u64>,
    /// Which regions raise a PMI (wake the drainer) when they fill.
    pub int_on: IntOn,
    /// The modelled processor's output capabilities.
    pub caps: Capabilities,
}

impl Default for RingConfig {
    /// 8 × 64 KiB, circular, PMI on every region.
    fn default() -> Self {
        RingConfig {
            region_sizes: vec![64 * 1024; 8],
            int_on: IntOn::Every,
            caps: Capabilities::default(),
        }
    }
}

/// Recorder settings.
#[derive(Debug, Clone)]
pub struct RecorderConfig {
    /// Packet-level settings.
    pub encoder: EncoderConfig,
    /// The output ring.
    pub ring: RingConfig,
    /// Where recording starts.
    pub record_from: RecordFrom,
    /// Keep the IP of every recorded instruction (ground truth for tests).
    pub log_ips: bool,
    /// Keep per-instruction register diffs and overwritten memory (see [`StateLog`]).
    pub state_log: bool,
    /// How to advance the target in [`SoftRecorder::run`].
    pub step_mode: StepMode,
    /// Snapshot the executable mappings when the process exits (see [`Recording::image`]).
    pub capture_image_at_exit: bool,
    /// Encoder output is written to the ring in batches of at least this many bytes (a real
    /// processor also buffers internally); everything is written out at pauses and the end.
    pub write_batch: usize,
    /// With several threads: steps one thread takes before the next one runs.
    pub time_slice: u64,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            encoder: EncoderConfig::default(),
            ring: RingConfig::default(),
            record_from: RecordFrom::Main,
            log_ips: false,
            state_log: false,
            step_mode: StepMode::Block,
            capture_image_at_exit: true,
            write_batch: 4096,
            time_slice: 1000,
        }
    }
}

/// Why recording failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Controlling the target failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The instruction at an IP could not be read or decoded.
    #[error(transparent)]
    Decode(#[from] DecodeInsnError),
    /// The start address could not be found.
    #[error("cannot find the recording start: {0}")]
    Symbol(#[from] SymbolError),
    /// The output ring could not be built.
    #[error("cannot build the output ring: {0}")]
    Ring(#[from] BuildError),
    /// The process exited before reaching the recording start.
    #[error("process exited ({0:?}) before reaching {1:#x}")]
    ExitedEarly(StepStop, u64),
    /// The drainer thread panicked.
    #[error("drainer thread panicked")]
    Drainer,
}

/// How the process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with a status.
    Code(i32),
    /// Killed by a signal.
    Signal(Signal),
}

/// What one [`SoftRecorder::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepEvent {
    /// The instruction at `ip` executed (and was encoded if recording is on).
    Executed {
        /// Its address.
        ip: u64,
    },
    /// One iteration of a REP string instruction; it is recorded when it completes.
    Iteration {
        /// Its address.
        ip: u64,
    },
    /// A signal stopped the process before the instruction at `ip`; it is delivered with the
    /// next step.
    Signal {
        /// The signal.
        signal: Signal,
        /// The instruction that did not execute.
        ip: u64,
    },
    /// A signal was delivered to its handler, which starts at `handler`.
    HandlerEntered {
        /// The interrupted IP (the instruction that did not execute).
        from: u64,
        /// The handler's first instruction.
        handler: u64,
    },
    /// The process is exiting and stays stopped at its end, still alive (only with
    /// [`SoftRecorder::set_stop_at_exit`]); its last instruction is recorded.
    Exiting,
    /// The process ended.
    Exited(Exit),
    /// No instruction ran: every thread waits in a system call (or a stop of the recorder's
    /// own was collected). Step again.
    Idle,
}

/// Counters of a recording.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecorderStats {
    /// ptrace single steps taken.
    pub single_steps: u64,
    /// Straight-line blocks run to a temporary breakpoint ([`StepMode::Block`]).
    pub blocks: u64,
    /// Instructions executed while recording (encoded).
    pub recorded: u64,
    /// Instructions executed while not recording.
    pub unrecorded: u64,
    /// REP iterations that did not complete their instruction.
    pub rep_iterations: u64,
    /// Signal-delivery stops seen.
    pub signal_stops: u64,
    /// Signals delivered to a handler.
    pub handlers_entered: u64,
    /// Stops the recorder could not explain and resolved by looking at RIP (counted, never
    /// silent).
    pub anomalies: u64,
    /// Steps that re-executed a system call interrupted at a stop (the kernel's restart).
    pub syscall_restarts: u64,
    /// Times the recorder drained the ring itself because the drainer had not kept up.
    pub inline_drains: u64,
    /// ToPA PMIs raised.
    pub pmis: u64,
    /// Bytes the output ring lost (overwritten or dropped) — 0 unless the ring is too small
    /// for one batch.
    pub lost_bytes: u64,
    /// Instructions in the decode cache (distinct addresses since the last invalidation).
    pub decoded_instructions: u64,
    /// Successful `execve` calls (recording continues in the new program).
    pub execs: u64,
    /// Forks after which the recording went on in the child (the target follows forked
    /// children, see `PtraceTarget::set_follow_fork_child`).
    pub forks_followed: u64,
    /// Successful clone/clone3 calls (threads and children run untraced).
    pub clones: u64,
    /// Of those, clones sharing the address space with a running task (threads): block
    /// stepping is off from the first one on.
    pub thread_clones: u64,
    /// Threads recorded besides the main thread (each with its own stream).
    pub threads: u64,
    /// Threads that ended while the process went on.
    pub threads_ended: u64,
    /// Threads that vanished without their end being seen (killed while stopped): their
    /// stream ends at their last recorded instruction.
    pub threads_lost: u64,
    /// Switches from one thread to another.
    pub switches: u64,
    /// Steps that waited in a system call while other threads ran.
    pub blocked_steps: u64,
    /// Times the stepped thread vanished under a ptrace request between two steps (killed
    /// from outside while stopped): the instruction it stood at is not counted as executed,
    /// since whether it ran is unknown.
    pub killed_between_steps: u64,
}

/// A finished recording.
#[derive(Debug)]
pub struct Recording {
    /// The trace bytes, in stream order.
    pub trace: Vec<u8>,
    /// Where bytes were lost (empty for a complete trace).
    pub gaps: Vec<Gap>,
    /// Recorder counters.
    pub stats: RecorderStats,
    /// Encoder counters.
    pub encoder: EncoderStats,
    /// IPs of the recorded instructions, in execution order, if [`RecorderConfig::log_ips`].
    pub ip_log: Option<Vec<u64>>,
    /// The executable mappings at exit, if captured.
    pub image: Option<Image>,
    /// How the process ended (`None` if it was still running when recording finished).
    pub exit: Option<Exit>,
    /// The state log, if enabled.
    pub state_log: Option<StateLog>,
    /// The address spaces left through `execve`, in order (see [`ExecPeriod`]).
    pub exec_periods: Vec<ExecPeriod>,
    /// Every thread's stream (the main thread first; `trace` and `ip_log` repeat its): the
    /// streams carry TSC packets from one global clock (see [`SoftRecorder::thread_stores`]).
    pub threads: Vec<ThreadTrace>,
}

/// A period of the main thread's code that ended: through a successful `execve` (another
/// program), or a `munmap` / `mmap(MAP_FIXED)` over executable code (`dlclose`, a JIT freeing
/// code: other code may be mapped at the same addresses next). Its code is read just before
/// the system call runs (after it, that code is gone); the encoder opens the next period with
/// a PSB+.
#[derive(Debug, Clone)]
pub struct ExecPeriod {
    /// What ended it: `exec`, or `munmap START-END` / `mmap START-END`.
    pub cause: String,
    /// The code of the program before the `execve` (every readable, executable mapping as it
    /// was when the call was made; empty if it could not be read).
    pub image: Arc<Image>,
    /// The old program's `/proc/PID/maps` text (for its symbols).
    pub maps: String,
    /// The old program's executable (`/proc/PID/exe`), if it could be read.
    pub exe: Option<std::path::PathBuf>,
    /// Number of the new program's first instruction in the main thread's history (the
    /// instructions before it, the `execve` included, ran in this address space).
    pub next_insn: u64,
    /// Stream offset of the PSB that opens the new address space in the main thread's stream.
    pub next_stream_offset: u64,
    /// The same in every other thread's stream that existed then (a stream that had ended
    /// lies wholly before: its end); a thread created later has none (it lies after).
    pub thread_offsets: Vec<(i32, u64)>,
}

/// The code read before a system call that may end a period (see [`ExecPeriod`]).
#[derive(Debug)]
struct PendingPeriod {
    /// The system call number it was read for.
    nr: u64,
    cause: String,
    image: Arc<Image>,
    maps: String,
    exe: Option<std::path::PathBuf>,
}

/// One thread's part of a [`Recording`].
#[derive(Debug)]
pub struct ThreadTrace {
    /// The thread id.
    pub tid: i32,
    /// Its trace bytes.
    pub trace: Vec<u8>,
    /// IPs of its recorded instructions, if [`RecorderConfig::log_ips`].
    pub ip_log: Option<Vec<u64>>,
}

/// Every thread's output ring and store (for the drainer thread).
type Streams = Arc<Mutex<Vec<(SharedRing<Topa>, TraceStore)>>>;

/// One thread's share of a recording: its encoder and stream, and its stop state.
struct Lane {
    tid: i32,
    encoder: SoftEncoder,
    ring: SharedRing<Topa>,
    store: TraceStore,
    /// Registers at the current stop (valid until the next resume).
    regs: Option<Gprs>,
    /// The signal its next step delivers.
    pending_signal: Option<Signal>,
    /// The `siginfo_t` of the signal it stopped with, until its next step.
    stop_siginfo: Option<[u8; SIGINFO_SIZE]>,
    ip_log: Option<Vec<u64>>,
    /// A step begun and not yet collected (a system call waiting for another thread).
    in_flight: Option<InFlight>,
    /// Stamp the stream with the global clock before its next instruction (switched in).
    stamp_due: bool,
    /// We sent it `SIGSTOP` to collect a step in flight: that stop is ours, whenever it
    /// shows (the step may come back first, the `SIGSTOP` then stops the next one).
    sigstop_sent: bool,
    /// Its instructions recorded.
    recorded: u64,
    /// Its `execve` just succeeded: the kernel still reports the single step of that system
    /// call when it returns to user space, as a trap before the new program's first
    /// instruction has run (GDB's `stepi` after `catch exec` shows the same PC twice).
    exec_trap_due: bool,
    /// The registers the current step started from, as they were (before any restart of an
    /// interrupted system call is modelled).
    step_origin: Option<Gprs>,
    /// Its vector/x87 state (XSAVE image) read just before it steps its own `exit` system
    /// call: with the registers before that call, the register file it ends with (see
    /// [`SoftRecorder::exited_registers`]).
    exit_xstate: Option<Vec<u8>>,
    /// Where its last recorded instruction went (the next one's address): where its stream
    /// ends if it vanishes before another step is recorded.
    next_ip: Option<u64>,
}

impl Lane {
    fn new(tid: i32, config: &RecorderConfig) -> Result<Lane, RecordError> {
        let topa = Topa::circular(
            config.ring.caps,
            &config.ring.region_sizes,
            config.ring.int_on.clone(),
        )?;
        Ok(Lane {
            tid,
            encoder: SoftEncoder::new(config.encoder),
            ring: SharedRing::new(topa),
            store: TraceStore::new(),
            regs: None,
            pending_signal: None,
            stop_siginfo: None,
            ip_log: config.log_ips.then(Vec::new),
            in_flight: None,
            stamp_due: false,
            sigstop_sent: false,
            exec_trap_due: false,
            step_origin: None,
            exit_xstate: None,
            next_ip: None,
            recorded: 0,
        })
    }
}

/// A step in flight: what [`SoftRecorder::finish_step`] needs when it comes back.
struct InFlight {
    ip: u64,
    insn: Option<CachedInsn>,
    before: Gprs,
    signal: Option<Signal>,
    log: Option<SuspendedStep>,
}

/// Single-steps a target and records its flow as Intel PT packets (see the module docs).
pub struct SoftRecorder<T: StepTarget> {
    target: T,
    config: RecorderConfig,
    /// Stop at the exit event ([`StepEvent::Exiting`]) instead of letting the process go.
    stop_at_exit: bool,
    /// Stopped at the exit event (with `stop_at_exit`).
    at_exit: bool,
    /// The thread being stepped: its encoder, stream and stop state.
    lane: Lane,
    /// The other threads, in round-robin order.
    parked: Vec<Lane>,
    /// Threads that ended (their streams stay part of the recording).
    ended_lanes: Vec<Lane>,
    /// The register file each thread that ended by its own `exit` ended with (with the state
    /// log on): what its past registers are rebuilt from once it has no present ones. `None`
    /// for a thread id the kernel reused for a later thread that also exited: which of them a
    /// past position belongs to is not known here, so neither is given (PC-only, not wrong).
    exited_regs: HashMap<i32, Option<X86Registers>>,
    /// Every thread's output ring and store, for the drainer.
    streams: Streams,
    /// The main thread's store.
    main_store: TraceStore,
    /// Steps of the current thread since it was switched in.
    slice_used: u64,
    drainer: Option<JoinHandle<()>>,
    drainer_stop: Arc<AtomicBool>,
    cache: InsnCache,
    recording: bool,
    finished: bool,
    block_stepping_allowed: bool,
    breakpoint_hit: Option<u64>,
    start_address: Option<u64>,
    interrupt: Arc<AtomicBool>,
    state_log: Option<StateLog>,
    image: Option<Image>,
    /// The code read just before the main thread's `execve` system call runs (see
    /// [`ExecPeriod`]); taken when the exec succeeds.
    exec_image: Option<PendingPeriod>,
    /// The address spaces left through `execve`, in order.
    exec_periods: Vec<ExecPeriod>,
    exit: Option<Exit>,
    stats: RecorderStats,
    /// Instructions stepped so far, readable from other threads (progress displays).
    steps: Arc<AtomicU64>,
    /// The threads besides the main one that existed when the recorder was made (see
    /// [`threads_at_start`](Self::threads_at_start)).
    threads_at_start: Vec<i32>,
}

impl<T: StepTarget> std::fmt::Debug for SoftRecorder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftRecorder")
            .field("pid", &self.target.pid())
            .field("recording", &self.recording)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<T: StepTarget> Drop for SoftRecorder<T> {
    fn drop(&mut self) {
        // Without finish(): stop the drainer thread so it does not outlive the recorder.
        for l in std::iter::once(&self.lane)
            .chain(self.parked.iter())
            .chain(self.ended_lanes.iter())
        {
            l.ring.close();
        }
        self.drainer_stop.store(true, Ordering::Release);
        if let Some(h) = self.drainer.take() {
            let _ = h.join();
        }
    }
}

fn drain_into(ring: &SharedRing<Topa>, store: &TraceStore) -> u64 {
    // Drain and append under the ring lock, so drains by the drainer thread and by the recorder
    // reach the store in stream order.
    ring.with(|r| {
        if r.pending() == 0 {
            return 0;
        }
        let d = r.drain();
        store.append(&d);
        d.report.lost()
    })
}

impl<T: StepTarget> SoftRecorder<T> {
    /// Takes control of a target stopped at its first instruction (after `execve`), runs it to
    /// the configured start and, unless [`RecordFrom::OnDemand`], turns recording on there.
    pub fn new(mut target: T, config: RecorderConfig) -> Result<Self, RecordError> {
        let start = match config.record_from {
            RecordFrom::Main => match procmaps::symbol_address(target.pid(), "main") {
                Ok(a) => Some(a),
                // A stripped executable: start at its entry point instead.
                Err(SymbolError::NoSymbol { .. }) => {
                    Some(procmaps::exe_addresses(target.pid())?.1.entry)
                }
                Err(e) => return Err(e.into()),
            },
            RecordFrom::Entry => Some(procmaps::exe_addresses(target.pid())?.1.entry),
            RecordFrom::Exec | RecordFrom::OnDemand => None,
        };
        if let Some(addr) = start {
            run_to_breakpoint(&mut target, addr)?;
        }
        let start_address = match start {
            Some(a) => Some(a),
            None => target.regs().ok().map(|r| r.rip),
        };
        let main_tid = target.pid();
        let lane = Lane::new(main_tid, &config)?;
        let streams: Streams = Arc::new(Mutex::new(vec![(lane.ring.clone(), lane.store.clone())]));
        let main_store = lane.store.clone();
        let drainer_stop = Arc::new(AtomicBool::new(false));
        let drainer = {
            // Woken by the main thread's ring (PMI) or every 50 ms; drains every thread's ring
            // (the recorder also drains a ring itself when a write would not fit).
            let main_ring = lane.ring.clone();
            let streams = Arc::clone(&streams);
            let stop = Arc::clone(&drainer_stop);
            std::thread::Builder::new()
                .name("soft-pt-drainer".into())
                .spawn(move || {
                    loop {
                        let wake = main_ring.wait_for_data(Duration::from_millis(50));
                        let all = streams.lock().map(|v| v.clone()).unwrap_or_default();
                        for (ring, store) in &all {
                            drain_into(ring, store);
                        }
                        if matches!(wake, Wake::Closed | Wake::Ended)
                            || stop.load(Ordering::Acquire)
                        {
                            break;
                        }
                    }
                })
                .ok()
        };
        let mut me = SoftRecorder {
            lane,
            parked: Vec::new(),
            ended_lanes: Vec::new(),
            exited_regs: HashMap::new(),
            streams,
            main_store,
            slice_used: 0,
            state_log: config.state_log.then(|| {
                let mut log = StateLog::new();
                log.set_thread(main_tid);
                log
            }),
            target,
            config,
            drainer,
            drainer_stop,
            cache: InsnCache::new(),
            recording: false,
            finished: false,
            block_stepping_allowed: true,
            breakpoint_hit: None,
            start_address,
            interrupt: Arc::new(AtomicBool::new(false)),
            image: None,
            exec_image: None,
            exec_periods: Vec::new(),
            exit: None,
            stop_at_exit: false,
            at_exit: false,
            stats: RecorderStats::default(),
            steps: Arc::new(AtomicU64::new(0)),
            threads_at_start: Vec::new(),
        };
        // Threads the program created before the recording start (constructors), or all of
        // a process attached to.
        for tid in me.target.threads() {
            if tid != main_tid {
                me.add_lane(tid)?;
                me.threads_at_start.push(tid);
            }
        }
        me.target.take_new_threads();
        if me.config.record_from != RecordFrom::OnDemand {
            me.record_on();
        }
        Ok(me)
    }

    /// The target. The recorder forgets the registers it read at this stop, since the caller
    /// may change them.
    pub fn target(&mut self) -> &mut T {
        self.lane.regs = None;
        &mut self.target
    }

    /// The target, read-only.
    pub fn target_ref(&self) -> &T {
        &self.target
    }

    /// Where the target stood when the recorder took over (after running to the configured
    /// start): `main`, the entry point, or the first instruction after `execve`.
    pub fn start_address(&self) -> Option<u64> {
        self.start_address
    }

    /// Whether recording is on.
    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// Whether the process has ended.
    pub fn exit(&self) -> Option<Exit> {
        self.exit
    }

    /// Counters so far.
    pub fn stats(&self) -> RecorderStats {
        let mut s = self.stats;
        s.decoded_instructions = self.cache.len() as u64;
        s
    }

    /// The store the drainer fills (a shared handle: readable while recording runs).
    pub fn store(&self) -> TraceStore {
        self.main_store.clone()
    }

    /// The address spaces the main thread left through `execve` so far, in order (see
    /// [`ExecPeriod`]).
    pub fn exec_periods(&self) -> &[ExecPeriod] {
        &self.exec_periods
    }

    /// The state log, if enabled.
    pub fn state_log(&self) -> Option<&StateLog> {
        self.state_log.as_ref()
    }

    /// Turns recording on: the next executed instruction starts a PSB+ and TIP.PGE
    /// (`monitor record on`). Does nothing after [`finish`](Self::finish).
    pub fn record_on(&mut self) {
        self.recording = !self.finished;
    }

    /// Turns recording off before the current instruction: FUP + TIP.PGD, everything encoded
    /// so far is written to the ring (`monitor record off`).
    pub fn record_off(&mut self) -> Result<(), RecordError> {
        if self.recording && self.exit.is_none() {
            let ip = self.current_regs()?.rip;
            self.lane.encoder.disable(ip);
            self.recording = false;
            self.write_out(true);
        }
        Ok(())
    }

    /// Makes the store hold every byte encoded so far: writes pending encoder output to the ring
    /// and drains the ring on this thread (a debugger stop must see the trace up to the PC).
    /// Returns the bytes lost by that drain (also counted in [`RecorderStats::lost_bytes`]).
    pub fn sync_store(&mut self) -> u64 {
        self.write_out(true);
        let mut lost = 0;
        for l in std::iter::once(&self.lane)
            .chain(self.parked.iter())
            .chain(self.ended_lanes.iter())
        {
            lost += drain_into(&l.ring, &l.store);
        }
        self.stats.lost_bytes += lost;
        lost
    }

    /// The signal the next step delivers (the one that stopped the process, if any).
    pub fn pending_signal(&self) -> Option<Signal> {
        self.lane.pending_signal
    }

    /// The `siginfo_t` of the signal thread `tid` stopped with (GDB's `$_siginfo`), while it
    /// is stopped there; `None` for a thread that did not stop with a signal.
    pub fn stop_siginfo(&self, tid: i32) -> Option<[u8; SIGINFO_SIZE]> {
        std::iter::once(&self.lane)
            .chain(self.parked.iter())
            .find(|l| l.tid == tid)
            .and_then(|l| l.stop_siginfo)
    }

    /// Replaces the signal the next step delivers: a debugger may suppress the signal that
    /// stopped the program (`signal 0`) or send another one.
    pub fn set_pending_signal(&mut self, signal: Option<Signal>) {
        self.lane.pending_signal = signal;
    }

    /// The register file thread `tid` ended with, if it ended by its own `exit` while recorded
    /// with the state log on: its general-purpose registers as the state log has them after
    /// its last instruction (the `exit` system call), and its vector/x87 state read just
    /// before that call (marked unavailable if it could not be read). With the state log,
    /// its registers at any earlier position are rebuilt from these exactly.
    pub fn exited_registers(&self, tid: i32) -> Option<&X86Registers> {
        self.exited_regs.get(&tid).and_then(Option::as_ref)
    }

    /// The registers at the current stop.
    pub fn current_regs(&mut self) -> Result<Gprs, RecordError> {
        if let Some(r) = self.lane.regs {
            return Ok(r);
        }
        // A debugger may have selected another thread to read its registers.
        if self.target.current_thread() != self.lane.tid {
            self.target.select_thread(self.lane.tid)?;
        }
        let r = self.target.regs()?;
        self.lane.regs = Some(r);
        Ok(r)
    }

    /// Whether the process stays stopped at its exit event ([`StepEvent::Exiting`]) rather
    /// than being let go at once: the end of the program is then a place where its registers
    /// and memory can still be read. The target must report the exit event
    /// ([`StepStop::Exiting`]).
    pub fn set_stop_at_exit(&mut self, on: bool) {
        self.stop_at_exit = on;
    }

    /// The number of single steps so far, as a counter other threads can read while the
    /// recorder runs (progress displays).
    pub fn step_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.steps)
    }

    /// Executes one instruction (or delivers a pending signal) and records it.
    ///
    /// With several threads, one thread runs at a time (the others stay stopped), in turns of
    /// [`RecorderConfig::time_slice`] steps: the order of all their instructions is known. A
    /// thread whose step does not come back at once (a system call waiting for another thread)
    /// is left in the kernel and collected later; meanwhile the others run. When every thread
    /// waits, the step returns [`StepEvent::Idle`].
    pub fn step(&mut self) -> Result<StepEvent, RecordError> {
        if let Some(e) = self.exit {
            return Ok(StepEvent::Exited(e));
        }
        if self.at_exit {
            return Ok(StepEvent::Exiting);
        }
        self.adopt_new_threads()?;
        let single = self.parked.is_empty() && self.lane.in_flight.is_none();
        let stepped = if single {
            self.step_lane()
        } else {
            self.step_threads()
        };
        match stepped {
            Err(RecordError::Target(TargetError::Sys {
                source: nix::Error::ESRCH,
                ..
            })) if single => self.vanished_between_steps(),
            other => other,
        }
    }

    /// The process's only thread vanished under a ptrace request (`ESRCH`): it was killed from
    /// outside while stopped, between the stop of one step and the start of the next. Its end
    /// is collected as a step's would be: the end of the program is kept (a stop at its exit
    /// event) or reported, the trace ends after the last recorded instruction, and the
    /// instruction in progress, whose outcome is unknown, is counted as such rather than
    /// recorded. (With several threads a lost thread is already counted by the thread
    /// scheduler; the process's end follows from the others.)
    fn vanished_between_steps(&mut self) -> Result<StepEvent, RecordError> {
        self.stats.killed_between_steps += 1;
        self.discard_state_entry();
        self.lane.regs = None;
        let tid = self.lane.tid;
        let stop = self
            .target
            .step_poll(tid, true)?
            .ok_or_else(|| TargetError::Unexpected {
                pid: tid,
                what: "no end reported after the thread vanished".into(),
            })?;
        if self.recording {
            // FUP + TIP.PGD where the last recorded instruction went: a decoder runs the
            // straight-line instructions up to there (a TIP.PGD alone would leave those after
            // the last branch undecodable).
            let next = self.lane.next_ip;
            self.lane.encoder.finish(next);
        }
        match stop {
            // The trace is closed already: nothing more to say about the instruction.
            StepStop::Exiting => self.at_exit_event(None),
            StepStop::Exited(_) | StepStop::Killed(_) => self.ended(stop, None),
            other => Err(TargetError::Unexpected {
                pid: tid,
                what: format!("after the thread vanished: {other:?}"),
            }
            .into()),
        }
    }

    /// The debugger breakpoint a block-stepped [`run`](Self::run) stopped at (targets that
    /// manage breakpoints report them, see [`StepStop::Breakpoint`]); taking it lets the next
    /// `run` go on. Single steps (the state log on, a signal pending, threads) do not look for
    /// breakpoints: a caller that needs them compares the PC after each [`step`](Self::step).
    pub fn take_breakpoint_hit(&mut self) -> Option<u64> {
        self.breakpoint_hit.take()
    }

    /// A handle that makes a [`run`](Self::run) in progress on another thread return at the next
    /// instruction boundary (a debugger's interrupt). The request is consumed by that return.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter(Arc::clone(&self.interrupt))
    }

    /// Runs until the process ends, until `limit` instructions executed, until
    /// [`Interrupter::interrupt`] is called, or until a debugger breakpoint is reached
    /// ([`take_breakpoint_hit`](Self::take_breakpoint_hit)). Returns the exit,
    /// if any. Uses block stepping when [`RecorderConfig::step_mode`] allows it (see
    /// [`StepMode`]).
    pub fn run(&mut self, limit: Option<u64>) -> Result<Option<Exit>, RecordError> {
        let mut n = 0u64;
        while self.exit.is_none() && !self.at_exit {
            if self.interrupt.swap(false, Ordering::AcqRel) || self.breakpoint_hit.is_some() {
                break;
            }
            let remaining = limit.map_or(u64::MAX, |l| l.saturating_sub(n));
            if remaining == 0 {
                break;
            }
            n += self.advance(remaining)?;
        }
        Ok(self.exit)
    }

    /// Executes at least one step and at most `max` instructions; returns how many
    /// instructions executed.
    pub fn advance(&mut self, max: u64) -> Result<u64, RecordError> {
        if self.config.step_mode == StepMode::Block
            && self.block_stepping_allowed
            && self.state_log.is_none()
            && self.lane.pending_signal.is_none()
            && self.exit.is_none()
            && max > 1
            && let Some(n) = self.run_block(max)?
        {
            return Ok(n);
        }
        Ok(match self.step()? {
            StepEvent::Executed { .. } => 1,
            _ => 0,
        })
    }

    /// Ends the recording: writes out pending packets (ending with TIP.PGD if the process is
    /// still running and recording was on), stops the drainer, and returns everything.
    ///
    /// The recorder stays usable as a handle on the target ([`target`](Self::target),
    /// [`step`](Self::step) without recording); recording cannot be turned on again.
    pub fn finish(&mut self) -> Result<Recording, RecordError> {
        if self.exit.is_none() && self.recording {
            let ip = self.current_regs().ok().map(|r| r.rip);
            self.lane.encoder.finish(ip);
        }
        if self.exit.is_none() {
            // The other threads' streams pause where they stand (they did at their switch-out;
            // a step in flight never came back for the recording).
            let batch = self.config.write_batch;
            for lane in self.parked.iter_mut() {
                let at = lane.in_flight.as_ref().map(|f| f.ip);
                end_lane_stream(lane, at, self.recording, batch, &mut self.stats);
            }
        }
        self.recording = false;
        self.finished = true;
        self.lane.encoder.flush();
        self.write_out(true);
        let lanes: Vec<&Lane> = std::iter::once(&self.lane)
            .chain(self.parked.iter())
            .chain(self.ended_lanes.iter())
            .collect();
        for l in &lanes {
            l.ring.close();
        }
        self.drainer_stop.store(true, Ordering::Release);
        let joined = self.drainer.take().map(|h| h.join());
        let mut lost = 0;
        for l in std::iter::once(&self.lane)
            .chain(self.parked.iter())
            .chain(self.ended_lanes.iter())
        {
            drain_into(&l.ring, &l.store);
            lost += l.store.lost();
        }
        if matches!(joined, Some(Err(_))) {
            return Err(RecordError::Drainer);
        }
        self.stats.lost_bytes = lost;
        self.stats.pmis = self.main_lane().ring.with(|r| r.pmi_count());
        let stats = self.stats();
        let main = self.target.pid();
        let mut threads: Vec<ThreadTrace> = std::iter::once(&mut self.lane)
            .chain(self.parked.iter_mut())
            .chain(self.ended_lanes.iter_mut())
            .map(|l| ThreadTrace {
                tid: l.tid,
                trace: l.store.to_vec(),
                ip_log: l.ip_log.take(),
            })
            .collect();
        threads.sort_by_key(|t| (t.tid != main, t.tid));
        let main_lane = self.main_lane();
        let (trace, gaps, encoder) = (
            main_lane.store.to_vec(),
            main_lane.store.gaps(),
            main_lane.encoder.stats(),
        );
        let ip_log = threads
            .first()
            .filter(|t| t.tid == main)
            .and_then(|t| t.ip_log.clone());
        Ok(Recording {
            trace,
            gaps,
            stats,
            encoder,
            ip_log,
            image: self.image.take(),
            exec_periods: self.exec_periods.clone(),
            exit: self.exit,
            state_log: self.state_log.take(),
            threads,
        })
    }

    /// The main thread's lane (wherever it is now).
    fn main_lane(&self) -> &Lane {
        let main = self.target.pid();
        std::iter::once(&self.lane)
            .chain(self.parked.iter())
            .chain(self.ended_lanes.iter())
            .find(|l| l.tid == main)
            .unwrap_or(&self.lane)
    }

    /// Moves encoder output into the ring (in batches unless `force`), draining the ring on
    /// this thread first if the drainer has not made room.
    fn write_out(&mut self, force: bool) {
        write_lane(
            &mut self.lane,
            force,
            self.config.write_batch,
            &mut self.stats,
        );
    }
}

/// Ends a parked thread's stream and writes it out at once. When recording, the stream ends
/// before `at` if its step is in flight there (a system call that never came back for the
/// recording: its pending TNT bits, FUP + TIP.PGD), else where it paused (a thread parked
/// between steps paused at its switch-out, so that is no packet). Everything still in the encoder goes into the ring
/// now: whoever reads the streams next (the stop at the exit, the end of the recording) must
/// see every instruction the state log holds, or the past falls back to the main thread's
/// positions.
fn end_lane_stream(
    lane: &mut Lane,
    at: Option<u64>,
    recording: bool,
    batch: usize,
    stats: &mut RecorderStats,
) {
    if recording {
        lane.encoder.finish(at);
    }
    lane.encoder.flush();
    write_lane(lane, true, batch, stats);
}

/// Moves `lane`'s encoder output into its ring (in batches of `batch` bytes unless `force`),
/// draining the ring on this thread first if the drainer has not made room.
fn write_lane(lane: &mut Lane, force: bool, batch: usize, stats: &mut RecorderStats) {
    let pending = lane.encoder.pending_output().len();
    if pending == 0 || (!force && pending < batch) {
        return;
    }
    let ring = &lane.ring;
    let store = &lane.store;
    lane.encoder.consume_output(|bytes| {
        let room = ring.with(|r| r.capacity().saturating_sub(r.pending()));
        if bytes.len() as u64 > room {
            stats.inline_drains += 1;
            stats.lost_bytes += drain_into(ring, store);
        }
        ring.write(bytes);
    });
}
