//! The full past state of a single-stepped recording: per instruction, the registers it changed
//! (old values only) and the old contents of the memory it wrote, so that the registers and
//! memory at any past position can be rebuilt by undoing from the present.
//!
//! ## What is covered
//!
//! * Registers: every field of `user_regs_struct` (GPRs, RIP, RFLAGS, segment selectors and
//!   FS/GS bases) — a diff of the registers before and after each step. Changes made by the
//!   kernel *between* steps (signal delivery sets RIP/RSP/RDI/...) are kept as
//!   [`EntryKind::Event`] entries.
//! * Vector and x87 state (x87 stack and control registers, XMM, MXCSR, the YMM upper halves):
//!   before every instruction that may change it — one that uses any XMM/YMM/ZMM register
//!   (SSE arithmetic also sets MXCSR flags, so reads count), any x87 or MMX instruction, and
//!   the whole-state ones (`LDMXCSR`, `FXRSTOR`, `XRSTOR`, `VZEROUPPER`, `VZEROALL`, `EMMS`)
//!   — and before signal delivery, `rt_sigreturn` and `execve`, the log keeps the old XSAVE
//!   image up to the end of the AVX component ([`StateLog::xstate_at`]). Instructions that
//!   touch none of it cost nothing. Components after AVX (AVX-512, PKRU) are not kept. When
//!   the target cannot read the XSAVE image (or the `PTREWIND_STATE_LOG_NO_VECTOR`
//!   diagnostic knob is set), the vector state before such an instruction is reported as
//!   unknown rather than guessed.
//! * Memory written by instructions: every memory operand iced-x86 reports with Write,
//!   CondWrite, ReadWrite or ReadCondWrite access (implicit stack writes of PUSH/CALL/ENTER
//!   included), its address computed from the registers before the step. Each iteration of a
//!   REP string instruction is one step and writes one element; iterations are merged into
//!   their instruction's entry.
//! * Memory written by system calls: the output buffers of `read`, `pread64`, `readv`-less
//!   single-buffer calls (`recvfrom`, `getrandom`, `readlink`), the stat family (`stat`,
//!   `fstat`, `lstat`, `newfstatat`, `statx`), `clock_gettime`, `gettimeofday`, `uname`,
//!   `getrlimit`/`prlimit64`, `rt_sigaction` and `rt_sigprocmask` old values, and `poll`
//!   descriptors; the thread calls: `clone`/`clone3` thread ids and pidfds, `futex` (the PI
//!   and `WAKE_OP` words; waits and wakes write none), `madvise` dropping pages (those that
//!   held data, from `/proc/PID/pagemap`), a thread's `exit` zeroing its `clear_child_tid`
//!   word (`CLONE_CHILD_CLEARTID` of the `clone` that made it while recorded, or its
//!   `set_tid_address`); the C library's terminal `ioctl`s — snapshotted before the SYSCALL
//!   step from the argument registers.
//!
//! ## What is not (counted in [`StateLogStats`])
//!
//! * Other system calls that write user memory (other `ioctl`s, `readv`, `recvmsg`,
//!   `epoll_wait`, `vfork`'s child running in our memory, ...):
//!   [`StateLogStats::unknown_syscalls`]. The `clear_child_tid` word of a thread created
//!   before recording began (attach), which its `exit` zeroes, is not known.
//! * The signal frame the kernel writes below the stack pointer when it delivers a signal.
//! * Memory operands with VSIB addressing (scatter) or whose size iced-x86 does not give
//!   (the XSAVE family is sized from CPUID leaf 0DH): [`StateLogStats::unknown_writes`].
//! * Writes by other processes to shared memory.
//!
//! Entries with writes of the first and third kinds are listed (by entry), so that the write
//! queries of the `writes` submodule ([`StateLog::rfind_write`], [`StateLog::find_write`], used
//! for write watchpoints) stop at them instead of passing them; a signal frame on an alternate
//! signal stack and writes by other processes cannot be seen at all.

use iced_x86::{
    CpuidFeature, InstructionInfo, InstructionInfoFactory, Mnemonic, OpAccess, Register,
};

use super::classify::{CachedInsn, InsnClass};
use super::target::StepTarget;
use crate::target::regs::{Gprs, gpr, gprs_to_array, set_gpr, zeroed_gprs};

mod writes;

pub use writes::{UnknownWrite, WriteHit, WriteSearch};

/// Every this many entries the log keeps where their memory records start (see `mem_marks`).
const MEM_MARK_EVERY: usize = 256;

/// What an entry of the log undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// One recorded instruction (a position in the instruction stream).
    Instruction,
    /// Iterations of a REP string instruction that a signal interrupted before it completed.
    Partial,
    /// Changes the kernel made between two steps: signal delivery (registers, and the signal
    /// frame it wrote below the stack pointer).
    Event,
}

/// One undo record. Its register values and memory records are the next ones in the log's
/// arrays (the arrays are walked from the end when undoing, so no start offsets are stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    kind: EntryKind,
    reg_len: u8,
    mem_len: u32,
}

/// Size counters of the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateLogStats {
    /// Instruction entries.
    pub instructions: u64,
    /// Register values stored.
    pub registers: u64,
    /// Memory records stored.
    pub memory_records: u64,
    /// Bytes of old memory stored.
    pub memory_bytes: u64,
    /// Bytes the log occupies (entries, positions, register diffs, memory records and data).
    pub total_bytes: u64,
    /// System calls whose memory effects are not known (not in the handled list).
    pub unknown_syscalls: u64,
    /// Memory writes that could not be captured (no size, VSIB, unreadable memory).
    pub unknown_writes: u64,
    /// Signal deliveries recorded (registers and signal frame).
    pub signal_deliveries: u64,
    /// Vector/x87 state snapshots stored (one per instruction that may change that state).
    pub vector_snapshots: u64,
    /// Bytes of vector/x87 state snapshots stored (included in `total_bytes`).
    pub vector_bytes: u64,
    /// Instructions that may change vector/x87 state whose old state could not be kept (the
    /// state before them is reported unknown).
    pub vector_unknown: u64,
}

#[derive(Debug, Default)]
struct Pending {
    before: Option<Gprs>,
    /// Why some memory the step writes is not in the log, if so.
    unknown: Option<UnknownWrite>,
    mem_mark: usize,
    data_mark: usize,
    open: bool,
    /// The vector/x87 state before the step, if the step may change it.
    xstate: Option<Vec<u8>>,
    /// The step may change vector/x87 state that could not be read.
    xstate_unknown: bool,
    /// A `clone`/`clone3` of a thread the kernel will clear a word for when it exits
    /// (`CLONE_CHILD_CLEARTID`): that word's address, bound to the new thread's id when the
    /// call returns it.
    clear_child_tid: Option<u64>,
}

/// The undo log (see the module docs). Layout per entry: 8 bytes, plus 9 bytes per changed
/// register (index + old value), 12 bytes per memory record (address + length) and the old
/// bytes; plus 4 bytes per instruction to find positions; plus, per instruction that may change
/// vector/x87 state, a 16-byte index slot and a diff of the old XSAVE image against the previous
/// snapshot (an 8-byte chunk mask and the changed 16-byte chunks; whole every 64th).
#[derive(Debug)]
pub struct StateLog {
    entries: Vec<Entry>,
    reg_idx: Vec<u8>,
    reg_val: Vec<u64>,
    mem_addr: Vec<u64>,
    mem_len: Vec<u32>,
    data: Vec<u8>,
    /// Registers after the last step (to detect kernel-made changes between steps).
    last_after: Option<Gprs>,
    pending: Pending,
    factory: InstructionInfoFactory,
    stats: StateLogStats,
    /// Entry index of each recorded instruction.
    positions: Vec<u32>,
    syscall_nr: Option<u64>,
    /// Per thread, the word the kernel zeroes when the thread exits (`CLONE_CHILD_CLEARTID`,
    /// `set_tid_address`): its `exit` writes it.
    clear_child_tid: std::collections::HashMap<i32, u64>,
    /// The system call the next `restart_syscall` continues (see [`StateLog::set_restarted_call`]).
    restarted_call: Option<u64>,
    /// Vector-state snapshots: (entry index, start of its record in `vec_data`), ascending
    /// by entry. A record is a 64-bit mask of the 16-byte chunks of the image it stores,
    /// then those chunks: every [`VEC_KEY_EVERY`]-th record stores all of them (a key), the
    /// others only the chunks that differ from the previous snapshot — consecutive snapshots
    /// differ by what one instruction changed, typically one register.
    vec_index: Vec<(u32, usize)>,
    vec_data: Vec<u8>,
    /// The newest snapshot, unencoded (to diff the next one against).
    vec_last: Vec<u8>,
    /// The newest entry whose vector-state change is not known.
    vec_unknown: Option<u32>,
    /// Whether to keep vector state at all (off only through the diagnostic knob).
    log_vector: bool,
    /// Entries whose memory writes are not all in the log, ascending by entry index (the
    /// write queries stop there rather than miss a write).
    unknown: Vec<(u32, UnknownWrite)>,
    /// Index into `mem_addr` of the first memory record of every [`MEM_MARK_EVERY`]-th
    /// entry, so that a query can start in the middle of the log without summing from its end.
    mem_marks: Vec<usize>,
    /// Bytes of the XSAVE image a snapshot keeps (legacy area, header, AVX component).
    vec_keep: usize,
    /// The thread the next entries belong to ([`StateLog::set_thread`]).
    thread: i32,
    /// Registers after the last step of each thread not current now.
    last_after_of: std::collections::HashMap<i32, Gprs>,
    /// `(first entry, thread)` of every run of entries of one thread, ascending.
    runs: Vec<(u32, i32)>,
    /// Per thread, the newest entry whose vector-state change is not known.
    vec_unknown_of: std::collections::HashMap<i32, u32>,
    /// Per thread, where its instructions are in the global order.
    thread_insns: std::collections::HashMap<i32, ThreadInsns>,
    /// The thread of the newest instruction.
    last_insn_thread: Option<i32>,
}

/// Where one thread's instructions are among all threads' ([`StateLog::global_position`]).
#[derive(Debug, Default, Clone)]
struct ThreadInsns {
    /// `(global position, thread position)` of the first instruction of each of its runs.
    runs: Vec<(u64, u64)>,
    /// Its instructions.
    count: u64,
}

/// An entry opened by [`StateLog::before_step`] whose step has not come back yet (a system
/// call waiting while other threads run), taken out of the log until it does
/// ([`StateLog::resume_step`]). Its memory snapshots were taken before the call ran.
#[derive(Debug)]
pub struct SuspendedStep {
    pending: Pending,
    mem_addr: Vec<u64>,
    mem_len: Vec<u32>,
    data: Vec<u8>,
    syscall_nr: Option<u64>,
    thread: i32,
}

impl Default for StateLog {
    fn default() -> Self {
        Self::new()
    }
}

/// Bytes below the stack pointer the kernel may write when it delivers a signal: the 128-byte
/// red zone is skipped, then `rt_sigframe` (siginfo + ucontext, under 1 KiB) and the XSAVE
/// area, aligned down.
fn signal_frame_span() -> u64 {
    128 + 1024 + xsave_area_size() + 64
}

fn reg_value(r: &Gprs, reg: Register) -> Option<u64> {
    use Register::*;
    let full = reg.full_register();
    let v = match full {
        RAX => r.rax,
        RBX => r.rbx,
        RCX => r.rcx,
        RDX => r.rdx,
        RSI => r.rsi,
        RDI => r.rdi,
        RBP => r.rbp,
        RSP => r.rsp,
        R8 => r.r8,
        R9 => r.r9,
        R10 => r.r10,
        R11 => r.r11,
        R12 => r.r12,
        R13 => r.r13,
        R14 => r.r14,
        R15 => r.r15,
        RIP => r.rip,
        _ => {
            return match reg {
                FS => Some(r.fs_base),
                GS => Some(r.gs_base),
                ES | CS | SS | DS => Some(0),
                _ => Option::None,
            };
        }
    };
    Some(match reg.size() {
        4 => v & 0xffff_ffff,
        2 => v & 0xffff,
        1 => v & 0xff,
        _ => v,
    })
}

/// Whether an instruction may change the x87/MMX/SSE/AVX state (see the module docs): any use
/// of a vector register (SSE arithmetic sets MXCSR exception flags even when it only reads),
/// any x87/MMX instruction (they update the status and tag words), and the whole-state ones.
fn touches_vector_state(insn: &iced_x86::Instruction, info: &InstructionInfo) -> bool {
    use Mnemonic::*;
    if info.used_registers().iter().any(|r| {
        let reg = r.register();
        reg.is_xmm() || reg.is_ymm() || reg.is_zmm() || reg.is_st() || reg.is_mm()
    }) {
        return true;
    }
    if matches!(
        insn.mnemonic(),
        Ldmxcsr
            | Vldmxcsr
            | Fxrstor
            | Fxrstor64
            | Xrstor
            | Xrstor64
            | Xrstors
            | Xrstors64
            | Vzeroupper
            | Vzeroall
            | Emms
            | Femms
    ) {
        return true;
    }
    insn.cpuid_features().iter().any(|f| {
        matches!(
            f,
            CpuidFeature::FPU
                | CpuidFeature::FPU287
                | CpuidFeature::FPU287XL_ONLY
                | CpuidFeature::FPU387
                | CpuidFeature::FPU387SL_ONLY
                | CpuidFeature::MMX
        )
    })
}

/// Granule of the vector-snapshot diff (one XMM register, one x87 register slot).
const VEC_CHUNK: usize = 16;
/// Every this many vector snapshots one is stored whole, bounding the decode work.
const VEC_KEY_EVERY: usize = 64;

/// Bytes of the XSAVE image a vector snapshot keeps: the legacy area and XSAVE header, plus
/// the AVX component (CPUID.(EAX=0DH,ECX=2): EAX size, EBX offset) when the processor has it
/// and it lies within the first 1 KiB (64 chunks, the width of a record's mask — where the
/// kernel's standard layout puts it). That is everything GDB is shown (x87, SSE, YMM upper
/// halves).
fn vector_keep_len() -> usize {
    const LEGACY_AND_HEADER: usize = 576;
    #[cfg(target_arch = "x86_64")]
    {
        let r = std::arch::x86_64::__cpuid_count(0xd, 2);
        if r.eax == 256
            && r.ebx as usize >= LEGACY_AND_HEADER
            && r.ebx as usize + 256 <= 64 * VEC_CHUNK
        {
            return r.ebx as usize + 256;
        }
    }
    LEGACY_AND_HEADER
}

fn is_xsave(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Xsave | Xsave64 | Xsavec | Xsavec64 | Xsaveopt | Xsaveopt64 | Xsaves | Xsaves64
    )
}

/// Bytes an XSAVE of the features enabled in XCR0 writes at most (CPUID.(EAX=0DH,ECX=0):EBX);
/// the compacted forms (XSAVEC/XSAVES) write no more than that. iced-x86 gives these
/// instructions no operand size (it depends on XCR0), and the dynamic loader's lazy-binding
/// trampoline uses them on every first call through the PLT.
fn xsave_area_size() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 0DH exists on every processor with XSAVE (which the instruction implies).
        let r = std::arch::x86_64::__cpuid_count(0xd, 0);
        u64::from(r.ebx)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// Address ranges `(start, len)` an instruction or system call writes.
type WriteRanges = Vec<(u64, u64)>;

/// Memory a system call writes, from its number and argument registers (see the module docs).
fn syscall_writes(r: &Gprs) -> Option<WriteRanges> {
    let (a0, a1, a2, a3, a4) = (r.rdi, r.rsi, r.rdx, r.r10, r.r8);
    const STAT: u64 = 144;
    Some(match r.rax {
        0 | 17 => vec![(a1, a2)],              // read, pread64 (fd, buf, count)
        4..=6 => vec![(a1, STAT)],             // stat/fstat/lstat (…, statbuf)
        262 => vec![(a2, STAT)],               // newfstatat (dirfd, path, statbuf, flags)
        332 => vec![(a4, 256)],                // statx (…, statxbuf)
        45 => vec![(a1, a2)],                  // recvfrom (fd, buf, len, …) — addr/addrlen too
        318 => vec![(a0, a1)],                 // getrandom (buf, len, flags)
        89 => vec![(a1, a2)],                  // readlink (path, buf, size)
        267 => vec![(a2, a3)],                 // readlinkat (dirfd, path, buf, size)
        228 => vec![(a1, 16)],                 // clock_gettime (clk, tp)
        96 => vec![(a0, 16), (a1, 8)],         // gettimeofday (tv, tz)
        63 => vec![(a0, 390)],                 // uname (utsname)
        97 => vec![(a1, 16)],                  // getrlimit (res, rlim)
        302 => vec![(a3, 16)],                 // prlimit64 (pid, res, new, old)
        13 => vec![(a2, 24 + a3)],             // rt_sigaction (sig, act, oldact, sigsetsize)
        14 => vec![(a2, a3)],                  // rt_sigprocmask (how, set, oldset, sigsetsize)
        7 => vec![(a0, a1.saturating_mul(8))], // poll (fds, nfds, timeout): revents
        // No user-memory output: write, close, mmap (fresh pages), munmap, mprotect, brk,
        // lseek, exit_group, getpid, kill, tgkill, rt_sigreturn (restores registers),
        // sched_yield, nanosleep's NULL rem is common, openat, dup, pipe2 (2 ints); fork (the
        // child's memory is a copy; vfork's child runs in ours, unrecorded: not listed). `exit`
        // and `set_tid_address` depend on the log's per-thread state: `StateLog::before_step`.
        1 | 3 | 8 | 9 | 10 | 11 | 12 | 15 | 24 | 39 | 57 | 62 | 110 | 186 | 200 | 231 | 234
        | 257 | 32 | 33 | 37 | 38 | 21 | 102 | 104 | 107 | 108 | 273 | 334 => vec![],
        22 | 293 => vec![(a0, 8)], // pipe, pipe2 (fds[2])
        35 | 230 => vec![(if r.rax == 35 { a1 } else { a3 }, 16)], // nanosleep, clock_nanosleep rem
        202 => return futex_writes(a1, a0, a4),
        16 => return ioctl_writes(a1, a2),
        _ => return None,
    })
}

/// Memory `madvise(addr, len, advice)` changes: `MADV_DONTNEED`, `MADV_FREE` and
/// `MADV_REMOVE` drop pages, which then read as zeros (anonymous) or as their file's bytes —
/// glibc does this to the unused part of a thread's stack as the thread exits, so every
/// worker's end used to stop a watchpoint search. Only the pages that hold data (resident or
/// swapped) can change; the others are not read. The other advice values change no contents.
fn madvise_writes<T: StepTarget + ?Sized>(target: &mut T, r: &Gprs) -> Option<WriteRanges> {
    match r.rdx {
        4 | 8 | 9 => target.resident_ranges(r.rdi, r.rsi),
        // NORMAL, RANDOM, SEQUENTIAL, WILLNEED; DONTFORK … POPULATE_WRITE
        0..=3 | 10..=23 => Some(Vec::new()),
        _ => None,
    }
}

/// Memory `clone(flags, stack, parent_tid, child_tid, tls)` and `clone3(args, size)` write in
/// this address space: the new thread's id at `parent_tid` (`CLONE_PARENT_SETTID`) and, for a
/// thread sharing the memory (`CLONE_VM`), at `child_tid` (`CLONE_CHILD_SETTID`); a pidfd
/// (`CLONE_PIDFD`) at `pidfd` (`clone3`) or `parent_tid` (`clone`). 32 bits each. Every
/// `pthread_create` is one (glibc's `clone3`), so each used to stop a watchpoint search.
/// Also the word the kernel zeroes when that thread exits (`CLONE_CHILD_CLEARTID`), if any.
fn clone_writes<T: StepTarget + ?Sized>(
    target: &mut T,
    r: &Gprs,
) -> Option<(WriteRanges, Option<u64>)> {
    const CLONE_VM: u64 = 0x100;
    const CLONE_CHILD_CLEARTID: u64 = 0x0020_0000;
    const CLONE_PIDFD: u64 = 0x1000;
    const CLONE_PARENT_SETTID: u64 = 0x0010_0000;
    const CLONE_CHILD_SETTID: u64 = 0x0100_0000;
    let (flags, pidfd, child_tid, parent_tid) = if r.rax == 435 {
        // struct clone_args: flags, pidfd, child_tid, parent_tid, … (u64 each).
        if r.rsi < 32 {
            return None;
        }
        let mut a = [0u8; 32];
        if target.read_memory(r.rdi, &mut a).ok()? < a.len() {
            return None;
        }
        let word =
            |k: usize| u64::from_le_bytes(a[k * 8..k * 8 + 8].try_into().unwrap_or_default());
        (word(0), word(1), word(2), word(3))
    } else {
        (r.rdi, r.rdx, r.r10, r.rdx)
    };
    let mut out = Vec::new();
    if flags & CLONE_PIDFD != 0 {
        out.push((pidfd, 4));
    }
    if flags & CLONE_PARENT_SETTID != 0 && !(r.rax == 56 && flags & CLONE_PIDFD != 0) {
        out.push((parent_tid, 4));
    }
    if flags & CLONE_CHILD_SETTID != 0 && flags & CLONE_VM != 0 {
        out.push((child_tid, 4));
    }
    let clear = (flags & CLONE_CHILD_CLEARTID != 0 && flags & CLONE_VM != 0 && child_tid != 0)
        .then_some(child_tid);
    Some((out, clear))
}

/// Memory `futex(uaddr, op, val, timeout, uaddr2, val3)` writes: the wait and wake operations
/// (what every lock, condition variable and `pthread_join` uses) write none — the futex word
/// changes by the other threads' own instructions — while the PI operations set the owner's id
/// in `uaddr` and `FUTEX_WAKE_OP` changes `uaddr2`, a 32-bit word each. Without this every
/// `futex` ended a watchpoint search in a multi-thread program.
fn futex_writes(op: u64, uaddr: u64, uaddr2: u64) -> Option<WriteRanges> {
    // FUTEX_CMD_MASK: without FUTEX_PRIVATE_FLAG (128) and FUTEX_CLOCK_REALTIME (256).
    Some(match op & !0x180 {
        // WAIT, WAKE, FD, REQUEUE, CMP_REQUEUE, WAIT_BITSET, WAKE_BITSET
        0..=4 | 9 | 10 => vec![],
        5 => vec![(uaddr2, 4)],                   // WAKE_OP
        6..=8 | 13 => vec![(uaddr, 4)],           // LOCK_PI, UNLOCK_PI, TRYLOCK_PI, LOCK_PI2
        11 | 12 => vec![(uaddr, 4), (uaddr2, 4)], // WAIT_REQUEUE_PI, CMP_REQUEUE_PI
        _ => return None,
    })
}

/// Memory `ioctl(fd, request, arg)` writes, for the requests the C library makes on its own:
/// `isatty` before buffering stdout (`TCGETS`, the kernel's 36-byte `struct termios`), the
/// terminal size and pending input; any other request is unknown.
fn ioctl_writes(request: u64, arg: u64) -> Option<WriteRanges> {
    Some(match request & 0xffff_ffff {
        0x5401 => vec![(arg, 36)],         // TCGETS
        0x5413 => vec![(arg, 8)],          // TIOCGWINSZ
        0x540f | 0x541b => vec![(arg, 4)], // TIOCGPGRP, FIONREAD
        _ => return None,
    })
}

impl StateLog {
    /// An empty log.
    pub fn new() -> Self {
        StateLog {
            entries: Vec::new(),
            reg_idx: Vec::new(),
            reg_val: Vec::new(),
            mem_addr: Vec::new(),
            mem_len: Vec::new(),
            data: Vec::new(),
            last_after: None,
            pending: Pending::default(),
            factory: InstructionInfoFactory::new(),
            stats: StateLogStats::default(),
            positions: Vec::new(),
            syscall_nr: None,
            clear_child_tid: std::collections::HashMap::new(),
            restarted_call: None,
            vec_index: Vec::new(),
            vec_data: Vec::new(),
            vec_last: Vec::new(),
            vec_unknown: None,
            // Diagnostic/test knob: behave as if the XSAVE image could not be read, so that
            // the "unknown vector state" path can be exercised on any machine.
            log_vector: std::env::var_os("PTREWIND_STATE_LOG_NO_VECTOR").is_none(),
            unknown: Vec::new(),
            mem_marks: Vec::new(),
            vec_keep: vector_keep_len(),
            thread: 0,
            last_after_of: std::collections::HashMap::new(),
            runs: Vec::new(),
            vec_unknown_of: std::collections::HashMap::new(),
            thread_insns: std::collections::HashMap::new(),
            last_insn_thread: None,
        }
    }

    /// Instructions of thread `tid` in the log.
    pub fn thread_len(&self, tid: i32) -> u64 {
        self.thread_insns.get(&tid).map_or(0, |t| t.count)
    }

    /// The global position of thread `tid`'s instruction number `n` (its own count); `n` equal
    /// to the thread's count (its present) is the global end. `None` beyond that.
    pub fn global_position(&self, tid: i32, n: u64) -> Option<u64> {
        let end = self.positions.len() as u64;
        let Some(t) = self.thread_insns.get(&tid) else {
            return (n == 0).then_some(end);
        };
        if n >= t.count {
            return (n == t.count).then_some(end);
        }
        let i = t.runs.partition_point(|&(_, local)| local <= n) - 1;
        let (global, local) = t.runs[i];
        Some(global + (n - local))
    }

    /// How many instructions of thread `tid` come before global position `g` (the thread's
    /// own position at that moment).
    pub fn thread_position(&self, tid: i32, g: u64) -> u64 {
        let Some(t) = self.thread_insns.get(&tid) else {
            return 0;
        };
        let i = t.runs.partition_point(|&(global, _)| global < g);
        if i == 0 {
            return 0;
        }
        let (global, local) = t.runs[i - 1];
        let run_len = t.runs.get(i).map_or(t.count, |&(_, next)| next) - local;
        local + (g - global).min(run_len)
    }

    /// Makes `tid` the thread the next entries belong to. Entries of all threads are kept in
    /// one log in the order they executed (memory is shared, so undoing memory is undoing
    /// every thread's writes newest first); registers are rebuilt per thread
    /// ([`registers_at_thread`](Self::registers_at_thread)). A log that never calls this has
    /// one thread, 0.
    pub fn set_thread(&mut self, tid: i32) {
        if tid == self.thread {
            return;
        }
        if let Some(last) = self.last_after.take() {
            self.last_after_of.insert(self.thread, last);
        }
        self.last_after = self.last_after_of.remove(&tid);
        self.thread = tid;
    }

    /// Gives thread `old`'s entries and counts to `new`: the process followed a forked child,
    /// whose history before the fork is the parent thread's (same code, same memory), so the
    /// whole past is served as the child's.
    pub fn rename_thread(&mut self, old: i32, new: i32) {
        if self.thread == old {
            self.thread = new;
        }
        for run in &mut self.runs {
            if run.1 == old {
                run.1 = new;
            }
        }
        if let Some(v) = self.last_after_of.remove(&old) {
            self.last_after_of.insert(new, v);
        }
        if let Some(v) = self.vec_unknown_of.remove(&old) {
            self.vec_unknown_of.insert(new, v);
        }
        if let Some(v) = self.thread_insns.remove(&old) {
            self.thread_insns.insert(new, v);
        }
        if self.last_insn_thread == Some(old) {
            self.last_insn_thread = Some(new);
        }
    }

    /// Takes the open entry out of the log while its step is in flight (see [`SuspendedStep`]);
    /// `None` if no entry is open.
    pub fn suspend_step(&mut self) -> Option<SuspendedStep> {
        if !self.pending.open {
            return None;
        }
        let mem_addr = self.mem_addr.split_off(self.pending.mem_mark);
        let mem_len = self.mem_len.split_off(self.pending.mem_mark);
        let data = self.data.split_off(self.pending.data_mark);
        let pending = std::mem::take(&mut self.pending);
        Some(SuspendedStep {
            pending,
            mem_addr,
            mem_len,
            data,
            syscall_nr: self.syscall_nr.take(),
            thread: self.thread,
        })
    }

    /// Puts a suspended entry back as the open one (its step came back): the next
    /// [`after_step`](Self::after_step) closes it.
    pub fn resume_step(&mut self, step: SuspendedStep) {
        self.set_thread(step.thread);
        let mut pending = step.pending;
        pending.mem_mark = self.mem_addr.len();
        pending.data_mark = self.data.len();
        self.mem_addr.extend(step.mem_addr);
        self.mem_len.extend(step.mem_len);
        self.data.extend(step.data);
        self.pending = pending;
        self.syscall_nr = step.syscall_nr;
    }

    /// The thread entry `entry` belongs to.
    fn thread_of(&self, entry: u32) -> i32 {
        let i = self.runs.partition_point(|&(first, _)| first <= entry);
        i.checked_sub(1).map_or(self.thread, |i| self.runs[i].1)
    }

    /// Size counters.
    pub fn stats(&self) -> StateLogStats {
        let mut s = self.stats;
        s.instructions = self.positions.len() as u64;
        s.registers = self.reg_val.len() as u64;
        s.memory_records = self.mem_addr.len() as u64;
        s.memory_bytes = self.data.len() as u64;
        s.total_bytes = (self.entries.len() * std::mem::size_of::<Entry>()
            + self.reg_idx.len()
            + self.reg_val.len() * 8
            + self.mem_addr.len() * 12
            + self.data.len()
            + self.positions.len() * 4
            + self.vec_index.len() * std::mem::size_of::<(u32, usize)>()
            + self.vec_data.len()
            + self.unknown.len() * std::mem::size_of::<(u32, UnknownWrite)>()
            + self.mem_marks.len() * std::mem::size_of::<usize>()) as u64;
        s.vector_snapshots = self.vec_index.len() as u64;
        s.vector_bytes = self.vec_data.len() as u64;
        s
    }

    /// Keeps the vector/x87 state before the step in progress (once per step).
    fn snapshot_xstate<T: StepTarget + ?Sized>(&mut self, target: &mut T) {
        if self.pending.xstate.is_some() || self.pending.xstate_unknown {
            return;
        }
        let image = if self.log_vector {
            target.xstate()
        } else {
            None
        };
        match image {
            Some(mut x) => {
                x.truncate(self.vec_keep);
                self.pending.xstate = Some(x);
            }
            None => self.pending.xstate_unknown = true,
        }
    }

    /// Rewrites `xsave` (the present XSAVE image, as `PTRACE_GETREGSET NT_X86_XSTATE`
    /// returns it) into the image before the instruction at `position`. Returns `false` if
    /// the vector/x87 state there is not known (an instruction since then may have changed it
    /// and its old state was not kept), or `position` is beyond the log; `xsave` is then
    /// unspecified.
    pub fn xstate_at(&self, position: usize, xsave: &mut [u8]) -> bool {
        self.xstate_at_thread(None, position, xsave)
    }

    /// [`xstate_at`](Self::xstate_at) for thread `thread` (`None`: a single-thread log).
    pub fn xstate_at_thread(&self, thread: Option<i32>, position: usize, xsave: &mut [u8]) -> bool {
        if position > self.positions.len() {
            return false;
        }
        let first = match self.positions.get(position) {
            Some(&e) => e,
            None => self.entries.len() as u32,
        };
        let unknown = match thread {
            None => self.vec_unknown,
            Some(t) => self.vec_unknown_of.get(&t).copied(),
        };
        if unknown.is_some_and(|u| u >= first) {
            return false;
        }
        // The oldest snapshot (of this thread) at or after `first` holds the whole state
        // before it.
        let mut i = self.vec_index.partition_point(|&(e, _)| e < first);
        if let Some(t) = thread {
            while i < self.vec_index.len() && self.thread_of(self.vec_index[i].0) != t {
                i += 1;
            }
        }
        if i < self.vec_index.len() {
            let snap = self.vector_snapshot(i);
            let n = snap.len().min(xsave.len());
            xsave[..n].copy_from_slice(&snap[..n]);
        }
        true
    }

    /// Appends the snapshot taken before entry `entry` (see `vec_index`).
    fn push_vector_snapshot(&mut self, entry: u32, mut image: Vec<u8>) {
        image.resize(self.vec_keep, 0);
        let key = self.vec_index.len() % VEC_KEY_EVERY == 0 || self.vec_last.len() != image.len();
        let start = self.vec_data.len();
        self.vec_data.extend_from_slice(&[0; 8]);
        let mut mask = 0u64;
        for (c, chunk) in image.chunks(VEC_CHUNK).enumerate() {
            let lo = c * VEC_CHUNK;
            if key || self.vec_last.get(lo..lo + chunk.len()) != Some(chunk) {
                mask |= 1 << c;
                self.vec_data.extend_from_slice(chunk);
            }
        }
        self.vec_data[start..start + 8].copy_from_slice(&mask.to_le_bytes());
        self.vec_index.push((entry, start));
        self.vec_last = image;
    }

    /// Decodes snapshot `i`: from the key at or before it, applies the records up to it.
    fn vector_snapshot(&self, i: usize) -> Vec<u8> {
        let mut image = vec![0u8; self.vec_keep];
        for j in i - i % VEC_KEY_EVERY..=i {
            let Some(&(_, start)) = self.vec_index.get(j) else {
                break;
            };
            let end = self
                .vec_index
                .get(j + 1)
                .map_or(self.vec_data.len(), |&(_, s)| s);
            let Some(record) = self.vec_data.get(start..end) else {
                break;
            };
            let (mask, mut chunks) = record.split_at(8.min(record.len()));
            let mut m = [0u8; 8];
            m[..mask.len()].copy_from_slice(mask);
            let mask = u64::from_le_bytes(m);
            for (c, dst) in image.chunks_mut(VEC_CHUNK).enumerate() {
                if mask & (1 << c) == 0 {
                    continue;
                }
                let Some((src, rest)) = chunks.split_at_checked(dst.len()) else {
                    break;
                };
                dst.copy_from_slice(src);
                chunks = rest;
            }
        }
        image
    }

    /// Number of recorded instructions (positions `0..len`; position `len` is the present).
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// Whether no instruction was recorded.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// The system call number of the step in progress, if it is a SYSCALL.
    pub fn syscall_nr(&self) -> Option<u64> {
        self.syscall_nr
    }

    fn push_mem<T: StepTarget + ?Sized>(&mut self, target: &mut T, addr: u64, len: u64) {
        if len == 0 {
            return;
        }
        // A garbage length (the system call will fail with EFAULT) must not allocate gigabytes.
        let Ok(len32) = u32::try_from(len) else {
            self.stats.unknown_writes += 1;
            self.pending
                .unknown
                .get_or_insert(UnknownWrite::Unreadable { addr });
            return;
        };
        if len32 > 64 << 20 {
            self.stats.unknown_writes += 1;
            self.pending
                .unknown
                .get_or_insert(UnknownWrite::Unreadable { addr });
            return;
        }
        let start = self.data.len();
        self.data.resize(start + len32 as usize, 0);
        let n = target
            .read_memory(addr, &mut self.data[start..])
            .unwrap_or(0);
        // Unreadable (the write will fault, or the buffer is partly unmapped): keep what could
        // be read; a write cannot succeed where nothing is mapped.
        self.data.truncate(start + n);
        if n == 0 {
            return;
        }
        if (n as u64) < len {
            self.stats.unknown_writes += 1;
            self.pending
                .unknown
                .get_or_insert(UnknownWrite::Unreadable {
                    addr: addr.wrapping_add(n as u64),
                });
        }
        // Extend the previous record of the same step when contiguous (REP STOS/MOVS
        // iterations, pushes of adjacent slots): its data is the last in `data`.
        if self.mem_addr.len() > self.pending.mem_mark
            && let (Some(&a), Some(l)) = (self.mem_addr.last(), self.mem_len.last_mut())
            && a.wrapping_add(u64::from(*l)) == addr
            && let Some(sum) = l.checked_add(n as u32)
        {
            *l = sum;
            return;
        }
        self.mem_addr.push(addr);
        self.mem_len.push(n as u32);
    }

    fn open(&mut self, before: &Gprs) {
        if !self.pending.open {
            self.pending = Pending {
                before: Some(*before),
                unknown: None,
                mem_mark: self.mem_addr.len(),
                data_mark: self.data.len(),
                open: true,
                xstate: None,
                xstate_unknown: false,
                clear_child_tid: None,
            };
        }
    }

    /// Says which system call the next step's `restart_syscall` (219) continues: the kernel
    /// restarts it from its restart block with the original arguments, which are still in the
    /// registers, so it writes what that call writes (attaching to a process in `usleep`
    /// interrupts `clock_nanosleep` this way). `None` for any other step.
    pub fn set_restarted_call(&mut self, nr: Option<u64>) {
        self.restarted_call = nr;
    }

    /// Called before a step: records kernel-made register changes since the last step, and
    /// snapshots the memory the instruction (or system call) is about to write.
    pub fn before_step<T: StepTarget + ?Sized>(
        &mut self,
        target: &mut T,
        before: &Gprs,
        insn: &CachedInsn,
    ) {
        if let Some(last) = self.last_after
            && !self.pending.open
        {
            self.push_reg_diff(&last, before, EntryKind::Event);
        }
        self.open(before);
        self.syscall_nr = None;
        if insn.class == InsnClass::SysCall {
            self.syscall_nr = Some(before.rax);
            // rt_sigreturn restores the vector state from the signal frame; execve resets it.
            if matches!(before.rax, 15 | 59 | 322) {
                self.snapshot_xstate(target);
            }
            let call = match self.restarted_call.take() {
                Some(nr) if before.rax == 219 => Gprs { rax: nr, ..*before },
                _ => *before,
            };
            let writes = match call.rax {
                28 => madvise_writes(target, &call),
                56 | 435 => clone_writes(target, &call).map(|(writes, clear)| {
                    self.pending.clear_child_tid = clear;
                    writes
                }),
                // The thread's own exit: the kernel zeroes its `clear_child_tid` word (and
                // wakes the `pthread_join` waiting on it).
                60 => Some(
                    self.clear_child_tid
                        .remove(&self.thread)
                        .map_or_else(Vec::new, |a| vec![(a, 4)]),
                ),
                218 => {
                    self.clear_child_tid.insert(self.thread, call.rdi);
                    Some(Vec::new())
                }
                _ => syscall_writes(&call),
            };
            match writes {
                Some(ranges) => {
                    for (addr, len) in ranges {
                        if addr != 0 {
                            self.push_mem(target, addr, len);
                        }
                    }
                }
                None => {
                    self.stats.unknown_syscalls += 1;
                    self.pending.unknown = Some(UnknownWrite::Syscall { nr: before.rax });
                }
            }
            return;
        }
        let info = self.factory.info(&insn.insn);
        let vector = touches_vector_state(&insn.insn, info);
        let mut writes: Vec<(u64, u64)> = Vec::new();
        let mut unknown = 0;
        for m in info.used_memory() {
            if !matches!(
                m.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            ) {
                continue;
            }
            let mut size = m.memory_size().size() as u64;
            if size == 0 && is_xsave(insn.insn.mnemonic()) {
                size = xsave_area_size();
            }
            if size == 0 && insn.rep_string {
                // iced-x86 sizes a REP string operand as unknown (the count is dynamic); one
                // single step runs one iteration, which writes one element at [RDI].
                size = insn.insn.memory_size().element_size() as u64;
            }
            if size == 0 || m.vsib_size() != 0 {
                unknown += 1;
                continue;
            }
            match m.virtual_address(0, |reg, _, _| reg_value(before, reg)) {
                Some(addr) => writes.push((addr, size)),
                None => unknown += 1,
            }
        }
        self.stats.unknown_writes += unknown;
        if unknown > 0 {
            self.pending
                .unknown
                .get_or_insert(UnknownWrite::Operand { ip: before.rip });
        }
        for (addr, len) in writes {
            self.push_mem(target, addr, len);
        }
        if vector {
            self.snapshot_xstate(target);
        }
    }

    /// Called before a step that delivers a signal: snapshots the stack below `before.rsp`
    /// where the kernel will write the signal frame (a handler on an alternate signal stack is
    /// not covered).
    pub fn before_signal<T: StepTarget + ?Sized>(&mut self, target: &mut T, before: &Gprs) {
        self.open(before);
        // The handler starts with a fresh x87/SSE state (the old one goes to the frame).
        self.snapshot_xstate(target);
        let span = signal_frame_span();
        self.push_mem(target, before.rsp.wrapping_sub(span), span);
    }

    /// Called when a signal was delivered to its handler (the instruction did not execute):
    /// keeps the snapshots and the register changes as an [`EntryKind::Event`].
    pub fn signal_delivered(&mut self, handler_regs: &Gprs) {
        self.stats.signal_deliveries += 1;
        self.close(handler_regs, EntryKind::Event);
        self.last_after = Some(*handler_regs);
    }

    /// The current thread's registers changed from `before` to `after` without an instruction
    /// of its own: another thread of the process called `execve`, and the kernel ended this
    /// (main) thread and gave its id to the exec'ing one, which goes on in the new program. Kept
    /// as an [`EntryKind::Event`], so undoing it brings back this thread's registers from
    /// before.
    pub fn register_jump(&mut self, before: &Gprs, after: &Gprs) {
        if self.pending.open {
            return;
        }
        self.open(before);
        self.close(after, EntryKind::Event);
        self.last_after = Some(*after);
    }

    /// Called after a step that executed: closes the instruction's entry when `complete` (a
    /// REP iteration that left RIP in place keeps it open).
    pub fn after_step(&mut self, after: &Gprs, complete: bool) {
        self.last_after = Some(*after);
        if let Some(addr) = self.pending.clear_child_tid.take()
            && complete
            && let Ok(child) = i32::try_from(after.rax as i64)
            && child > 0
        {
            self.clear_child_tid.insert(child, addr);
        }
        if complete {
            self.close(after, EntryKind::Instruction);
        }
    }

    /// Called when the step did not execute the instruction (a signal stopped it first): drops
    /// the snapshots taken for it. Completed REP iterations stay, as an [`EntryKind::Partial`]
    /// entry.
    pub fn cancel_step(&mut self) {
        if !self.pending.open {
            return;
        }
        let Some(before) = self.pending.before else {
            return;
        };
        match self.last_after {
            // Some iterations of a REP instruction completed since `before`.
            Some(last) if last != before && self.mem_addr.len() > self.pending.mem_mark => {
                // The cancelled step's own snapshots were pushed last and cannot be told apart
                // from the iterations' here; keeping them is harmless (undoing a write that did
                // not happen restores the value that is still there).
                self.close(&last, EntryKind::Partial);
            }
            _ => {
                self.mem_addr.truncate(self.pending.mem_mark);
                self.mem_len.truncate(self.pending.mem_mark);
                self.data.truncate(self.pending.data_mark);
                self.pending = Pending::default();
            }
        }
    }

    fn close(&mut self, after: &Gprs, kind: EntryKind) {
        let Some(before) = self.pending.before else {
            return;
        };
        let reg_len = self.push_regs(&before, after);
        let mem_len = (self.mem_addr.len() - self.pending.mem_mark) as u32;
        let entry = self.entries.len() as u32;
        if kind == EntryKind::Instruction {
            let global = self.positions.len() as u64;
            let t = self.thread_insns.entry(self.thread).or_default();
            if self.last_insn_thread != Some(self.thread) {
                t.runs.push((global, t.count));
                self.last_insn_thread = Some(self.thread);
            }
            t.count += 1;
            self.positions.push(entry);
        }
        if let Some(x) = self.pending.xstate.take() {
            self.push_vector_snapshot(entry, x);
        } else if self.pending.xstate_unknown {
            self.stats.vector_unknown += 1;
            self.vec_unknown = Some(entry);
            self.vec_unknown_of.insert(self.thread, entry);
        }
        if let Some(why) = self.pending.unknown {
            self.unknown.push((entry, why));
        }
        let mem_start = self.pending.mem_mark;
        self.push_entry(
            Entry {
                kind,
                reg_len,
                mem_len,
            },
            mem_start,
        );
        self.pending = Pending::default();
    }

    /// Pushes the old values of the registers that differ; returns how many.
    fn push_regs(&mut self, old: &Gprs, new: &Gprs) -> u8 {
        let o = gprs_to_array(old);
        let n = gprs_to_array(new);
        let mut count = 0;
        for i in 0..gpr::COUNT {
            if o[i] != n[i] {
                self.reg_idx.push(i as u8);
                self.reg_val.push(o[i]);
                count += 1;
            }
        }
        count
    }

    fn push_reg_diff(&mut self, old: &Gprs, new: &Gprs, kind: EntryKind) {
        if old == new {
            return;
        }
        let reg_len = self.push_regs(old, new);
        let mem_start = self.mem_addr.len();
        self.push_entry(
            Entry {
                kind,
                reg_len,
                mem_len: 0,
            },
            mem_start,
        );
    }

    /// Appends an entry whose memory records start at `mem_start` in `mem_addr`.
    fn push_entry(&mut self, entry: Entry, mem_start: usize) {
        if self.entries.len() % MEM_MARK_EVERY == 0 {
            self.mem_marks.push(mem_start);
        }
        if self.runs.last().map(|r| r.1) != Some(self.thread) {
            self.runs.push((self.entries.len() as u32, self.thread));
        }
        self.entries.push(entry);
    }

    /// Rebuilds the state before the instruction at `position` (0 = the first recorded
    /// instruction; [`len`](Self::len) = the present) from the present state: `regs` (the
    /// current registers) are rewritten in place, and every memory range to restore is passed
    /// to `restore_memory(addr, old_bytes)` newest first — apply them in that order over the
    /// current memory (later calls win).
    ///
    /// Returns `false` if `position` is beyond the log.
    pub fn undo_to(
        &self,
        position: usize,
        regs: &mut Gprs,
        restore_memory: impl FnMut(u64, &[u8]),
    ) -> bool {
        self.undo_to_thread(position, None, regs, restore_memory)
    }

    /// [`undo_to`](Self::undo_to) where `regs` are thread `thread`'s: only that thread's
    /// register changes are undone (`None`: every entry's), memory is undone for all threads.
    pub fn undo_to_thread(
        &self,
        position: usize,
        thread: Option<i32>,
        regs: &mut Gprs,
        mut restore_memory: impl FnMut(u64, &[u8]),
    ) -> bool {
        if position > self.positions.len() {
            return false;
        }
        let first = match self.positions.get(position) {
            Some(&e) => e as usize,
            None => self.entries.len(),
        };
        // The entry being built (a REP instruction mid-way) is not part of any position.
        let mut reg_end = self.reg_val.len();
        let mut mem_end = self.pending_mem_start();
        let mut data_end = self.pending_data_start();
        // The run of the entry being undone (walked backwards with it).
        let mut run = self.runs.len();
        for (idx, e) in self.entries[first..].iter().enumerate().rev() {
            let index = (first + idx) as u32;
            while run > 0 && self.runs[run - 1].0 > index {
                run -= 1;
            }
            let owner = run.checked_sub(1).map_or(self.thread, |r| self.runs[r].1);
            let reg_start = reg_end - usize::from(e.reg_len);
            if thread.is_none_or(|t| t == owner) {
                for i in reg_start..reg_end {
                    set_gpr(regs, usize::from(self.reg_idx[i]), self.reg_val[i]);
                }
            }
            reg_end = reg_start;
            let mem_start = mem_end - e.mem_len as usize;
            for m in (mem_start..mem_end).rev() {
                let len = self.mem_len[m] as usize;
                let d = &self.data[data_end - len..data_end];
                restore_memory(self.mem_addr[m], d);
                data_end -= len;
            }
            mem_end = mem_start;
        }
        true
    }

    /// Thread `thread`'s registers before the instruction at (global) `position`, given its
    /// present registers.
    pub fn registers_at_thread(
        &self,
        thread: i32,
        position: usize,
        present: &Gprs,
    ) -> Option<Gprs> {
        let mut r = *present;
        self.undo_to_thread(position, Some(thread), &mut r, |_, _| {})
            .then_some(r)
    }

    /// The thread that executed the instruction at `position`.
    pub fn thread_at(&self, position: usize) -> Option<i32> {
        self.positions.get(position).map(|&e| self.thread_of(e))
    }

    fn pending_mem_start(&self) -> usize {
        if self.pending.open {
            self.pending.mem_mark
        } else {
            self.mem_addr.len()
        }
    }

    fn pending_data_start(&self) -> usize {
        if self.pending.open {
            self.pending.data_mark
        } else {
            self.data.len()
        }
    }

    /// The registers before the instruction at `position`, given the present registers.
    pub fn registers_at(&self, position: usize, present: &Gprs) -> Option<Gprs> {
        let mut r = *present;
        self.undo_to(position, &mut r, |_, _| {}).then_some(r)
    }

    /// Memory at `addr..addr + buf.len()` before the instruction at `position`: `buf` must
    /// hold the present contents on entry and holds the past contents on return.
    pub fn memory_at(&self, position: usize, addr: u64, buf: &mut [u8]) -> bool {
        let mut scratch = zeroed_gprs();
        let end = addr + buf.len() as u64;
        self.undo_to(position, &mut scratch, |a, old| {
            let a_end = a + old.len() as u64;
            if a_end <= addr || a >= end {
                return;
            }
            let lo = a.max(addr);
            let hi = a_end.min(end);
            let dst = (lo - addr) as usize..(hi - addr) as usize;
            let src = (lo - a) as usize..(hi - a) as usize;
            buf[dst].copy_from_slice(&old[src]);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(nr: u64, args: [u64; 5]) -> Gprs {
        Gprs {
            rax: nr,
            rdi: args[0],
            rsi: args[1],
            rdx: args[2],
            r10: args[3],
            r8: args[4],
            ..crate::target::regs::zeroed_gprs()
        }
    }

    /// `futex`: waits and wakes (private or not, with or without a clock) write nothing; the
    /// PI operations write the futex word, `FUTEX_WAKE_OP` the second word; an unknown
    /// operation stays unknown.
    #[test]
    fn futex_writes_by_operation() {
        let (u, u2) = (0x1000, 0x2000);
        for op in [0, 1, 128, 129, 9 | 128 | 256, 10 | 128, 3, 4] {
            assert_eq!(
                syscall_writes(&call(202, [u, op, 1, 0, u2])),
                Some(vec![]),
                "op {op}"
            );
        }
        assert_eq!(
            syscall_writes(&call(202, [u, 5 | 128, 1, 1, u2])),
            Some(vec![(u2, 4)])
        );
        for op in [6, 7 | 128, 8, 13] {
            assert_eq!(
                syscall_writes(&call(202, [u, op, 0, 0, u2])),
                Some(vec![(u, 4)])
            );
        }
        assert_eq!(
            syscall_writes(&call(202, [u, 11, 0, 0, u2])),
            Some(vec![(u, 4), (u2, 4)])
        );
        assert_eq!(syscall_writes(&call(202, [u, 77, 0, 0, u2])), None);
    }

    /// `ioctl`: the C library's terminal queries write their structures; others are unknown.
    #[test]
    fn ioctl_writes_by_request() {
        let a = 0x7fff_0000;
        assert_eq!(
            syscall_writes(&call(16, [1, 0x5401, a, 0, 0])),
            Some(vec![(a, 36)])
        );
        assert_eq!(
            syscall_writes(&call(16, [1, 0x5413, a, 0, 0])),
            Some(vec![(a, 8)])
        );
        assert_eq!(
            syscall_writes(&call(16, [0, 0x541b, a, 0, 0])),
            Some(vec![(a, 4)])
        );
        assert_eq!(syscall_writes(&call(16, [3, 0xc018_4800, a, 0, 0])), None);
    }

    /// The diff-encoded vector snapshots decode to exactly the images pushed, across key
    /// boundaries, with images that change one chunk, several, or none between snapshots.
    #[test]
    fn vector_snapshots_round_trip() {
        let mut log = StateLog::new();
        log.vec_keep = 832;
        let mut image = vec![0u8; 832];
        let mut pushed = Vec::new();
        let mut seed = 0x1234_5678u32;
        for i in 0..200u32 {
            // A small xorshift PRNG picks which bytes change.
            for _ in 0..(i % 4) {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                image[seed as usize % 832] = seed as u8 | 1;
            }
            log.push_vector_snapshot(i * 2, image.clone());
            pushed.push(image.clone());
        }
        for (i, want) in pushed.iter().enumerate() {
            assert_eq!(&log.vector_snapshot(i), want, "snapshot {i}");
        }
        // Diffs keep far less than whole images.
        assert!(log.vec_data.len() < pushed.len() * 832 / 4);
    }
}
