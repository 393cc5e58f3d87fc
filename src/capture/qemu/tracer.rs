//! Block executions → Intel PT: the per-thread state machine of the QEMU capture.
//!
//! QEMU reports each translated block when it starts executing. [`ThreadTracer`] keeps the
//! previous block and decides, when the next one starts, what the previous block's last
//! instruction did: the next start is the taken or not-taken side of a conditional branch, the
//! target of a direct jump or call, any address after an indirect branch, return or system call,
//! and the fall-through address otherwise. Each decided block goes to the shared
//! [`SoftEncoder`] as one [`SoftEncoder::block`] call, so the packets are exactly those of the
//! single-stepping capture (TNT, TIP, RET compression, FUP/TIP.PGD/TIP.PGE around system calls,
//! MODE.Exec, periodic PSB+).
//!
//! A next start that is none of these is an asynchronous transfer: a fault part-way through the
//! previous block (QEMU abandons the rest of the block and delivers the signal), a signal
//! delivered between blocks, or QEMU restarting an instruction in a block of its own (an atomic
//! operation executed exclusively). Where the block stopped comes from the precise-mode counter
//! (see [`BlockInfo`]): QEMU adds 1 before each instruction after the first, so the growth of
//! the counter during one execution is the index of the last instruction reached. Without it
//! (or when it is out of range) the block is not counted at all and the transfer is counted as
//! inexact in [`TracerStats::async_inexact`] — never counted in full.

use std::sync::atomic::{AtomicU64, Ordering};

use super::block::BlockInfo;
use crate::capture::soft::{Cofi, EncoderConfig, SoftEncoder, Step};
use crate::flow::InsnClass;

/// Settings of a [`ThreadTracer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TracerConfig {
    /// Packet-level settings.
    pub encoder: EncoderConfig,
    /// Use the blocks' reached-instruction counters to find where an interrupted block stopped.
    pub precise: bool,
    /// A TSC packet from the global clock is written after at most this many instructions of
    /// the thread (and whenever the thread comes back from the kernel).
    pub tsc_period: u64,
}

impl Default for TracerConfig {
    fn default() -> Self {
        TracerConfig {
            encoder: EncoderConfig::default(),
            precise: true,
            // 4 K, not 64 K: threads that synchronise only through memory are ordered at
            // that grain (a worker's crash after a flag set by another worker was ordered
            // before that worker's earlier calls, whose run began later: 1 of ~30 sessions
            // of tests/qemu_live.rs every_threads_past_in_a_live_session under load). Costs
            // one TSC packet (8 bytes) and one shared counter update per 4 K instructions.
            tsc_period: 1 << 12,
        }
    }
}

/// What a [`ThreadTracer`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TracerStats {
    /// Block executions reported.
    pub blocks: u64,
    /// Instructions encoded.
    pub instructions: u64,
    /// Asynchronous transfers whose interrupted instruction is known exactly.
    pub async_exact: u64,
    /// Asynchronous transfers where the last instruction of the block was reached and whether
    /// it completed was decided from whether it can fault at all.
    pub async_guessed: u64,
    /// Asynchronous transfers where the position is not known: the block is counted up to its
    /// last reached instruction at most (never in full).
    pub async_inexact: u64,
    /// Blocks cut short because QEMU restarted at one of their instructions (no packet).
    pub restarts: u64,
    /// TSC packets written outside PSB+.
    pub tsc_stamps: u64,
}

/// The guest's signal handlers (from its `rt_sigaction` calls), by signal number: a block
/// that ends in an indirect branch, system call or software interrupt and is followed by a
/// handler's first block may have been interrupted part-way (any successor is legal for it).
#[derive(Debug)]
pub struct SignalHandlers {
    handlers: [AtomicU64; 65],
    /// One bit per handler address ever set (bit `(addr >> 4) % 64`, never cleared): most
    /// addresses are ruled out with one load instead of a scan of the table, which the tracer
    /// would otherwise do for every block after an indirect branch or return.
    filter: AtomicU64,
}

impl Default for SignalHandlers {
    fn default() -> Self {
        Self::new()
    }
}

impl SignalHandlers {
    /// No handlers.
    pub const fn new() -> Self {
        SignalHandlers {
            handlers: [const { AtomicU64::new(0) }; 65],
            filter: AtomicU64::new(0),
        }
    }

    fn filter_bit(addr: u64) -> u64 {
        1 << ((addr >> 4) & 63)
    }

    /// Signal `sig` is now handled at `addr` (0 or 1: default or ignored).
    pub fn set(&self, sig: u64, addr: u64) {
        if let Some(h) = self.handlers.get(sig as usize) {
            if addr > 1 {
                // Set before the handler (bits are never cleared, so a stale bit only costs a scan).
                self.filter
                    .fetch_or(Self::filter_bit(addr), Ordering::Relaxed);
            }
            h.store(if addr > 1 { addr } else { 0 }, Ordering::Relaxed);
        }
    }

    /// Whether some signal is handled at `addr`.
    #[inline]
    pub fn contains(&self, addr: u64) -> bool {
        addr > 1
            && self.filter.load(Ordering::Relaxed) & Self::filter_bit(addr) != 0
            && self
                .handlers
                .iter()
                .any(|h| h.load(Ordering::Relaxed) == addr)
    }
}

/// One guest thread's block executions → its PT stream (see the module documentation).
#[derive(Debug)]
pub struct ThreadTracer<'b> {
    enc: SoftEncoder,
    config: TracerConfig,
    clock: &'b AtomicU64,
    handlers: Option<&'b SignalHandlers>,
    prev: Option<&'b BlockInfo>,
    prev_reached: u64,
    unsynced: u64,
    /// The clock when the running block's system call entered the kernel
    /// ([`at_system_call`](Self::at_system_call)), written before that block's TIP.PGD once the
    /// block is decided (when the thread is back from the kernel, often much later).
    entry_stamp: Option<u64>,
    stats: TracerStats,
}

impl<'b> ThreadTracer<'b> {
    /// A tracer stamping its stream from `clock`, the instruction counter shared by every thread.
    pub fn new(config: TracerConfig, clock: &'b AtomicU64) -> Self {
        ThreadTracer {
            enc: SoftEncoder::new(config.encoder),
            config,
            clock,
            handlers: None,
            prev: None,
            prev_reached: 0,
            unsynced: 0,
            entry_stamp: None,
            stats: TracerStats::default(),
        }
    }

    /// Consult `handlers` (see [`SignalHandlers`]).
    pub fn with_handlers(mut self, handlers: &'b SignalHandlers) -> Self {
        self.handlers = Some(handlers);
        self
    }

    /// Block `b` starts executing on this thread.
    #[inline]
    pub fn on_block(&mut self, b: &'b BlockInfo) {
        if let Some(p) = self.prev
            && !self.resolve_fast(p, b.start)
        {
            self.resolve(p, Some(b.start));
        }
        self.prev = Some(b);
        if self.config.precise {
            self.prev_reached = b.reached();
        }
        self.stats.blocks += 1;
    }

    /// The running block's system call is entering the kernel (QEMU's system-call callback):
    /// takes the clock now, so the stream can say when this thread left user space. Without
    /// that stamp, a run of instructions would be known only by when it began, and another
    /// thread's work that truly came later (a flag this thread set, then a system call) could
    /// be ordered before it ([`GlobalOrder`](crate::history::GlobalOrder) spreads a run over
    /// the clock until its end stamp).
    pub fn at_system_call(&mut self) {
        if self.enc.is_tracing() && self.prev.is_some() && self.entry_stamp.is_none() {
            self.entry_stamp = Some(self.sync_clock());
        }
    }

    /// The thread stops being traced here (it exits, the process dies or `execve` replaces it):
    /// the last block is decided without a successor, and the stream ends with TIP.PGD.
    pub fn finish(&mut self) {
        if let Some(p) = self.prev.take() {
            self.resolve(p, None);
        }
        self.enc.finish(None);
        self.enc.flush();
    }

    /// The encoder (its output is taken by the caller).
    #[inline]
    pub fn encoder(&mut self) -> &mut SoftEncoder {
        &mut self.enc
    }

    /// The block executing now (not decided yet) and its counter's value when it started.
    #[inline]
    pub fn in_flight(&self) -> Option<(&'b BlockInfo, u64)> {
        self.prev.map(|p| (p, self.prev_reached))
    }

    /// What was seen so far.
    pub fn stats(&self) -> TracerStats {
        TracerStats {
            instructions: self.enc.stats().instructions,
            ..self.stats
        }
    }

    /// Advances the global clock by this thread's unsynchronised instructions; returns its value.
    #[inline]
    fn sync_clock(&mut self) -> u64 {
        let n = std::mem::take(&mut self.unsynced);
        self.clock.fetch_add(n, Ordering::Relaxed).wrapping_add(n)
    }

    /// [`resolve`](Self::resolve) for the common case, with the same result: a legal
    /// successor that is not a signal handler (so the counter need not be consulted), tracing
    /// on, and at most a TNT bit to write ([`SoftEncoder::block_fast`]). Returns false, having
    /// changed nothing, otherwise.
    #[inline]
    fn resolve_fast(&mut self, p: &'b BlockInfo, next: u64) -> bool {
        let cofi = match p.class {
            InsnClass::CondBranch if next == p.fallthrough => Cofi::Conditional { taken: false },
            InsnClass::CondBranch if Some(next) == p.target => Cofi::Conditional { taken: true },
            InsnClass::Other | InsnClass::Ptwrite | InsnClass::Special if next == p.fallthrough => {
                Cofi::None
            }
            InsnClass::DirectJump if Some(next) == p.target => Cofi::DirectJump,
            InsnClass::DirectCall if Some(next) == p.target => Cofi::DirectCall,
            InsnClass::Return => Cofi::Return,
            _ => return false,
        };
        if self.handlers.is_some_and(|h| h.contains(next)) {
            return false;
        }
        let n = u64::from(p.insns);
        let step = Step {
            ip: p.last_ip,
            len: p.last_len,
            cofi,
            next_ip: next,
        };
        if !self.enc.block_fast(n, step) {
            return false;
        }
        self.unsynced += n;
        if self.unsynced >= self.config.tsc_period {
            let t = self.sync_clock();
            self.enc.tsc_now(t);
            self.stats.tsc_stamps += 1;
        }
        true
    }

    fn resolve(&mut self, p: &'b BlockInfo, next: Option<u64>) {
        let n = p.insns;
        let reached = self
            .config
            .precise
            .then(|| p.reached().wrapping_sub(self.prev_reached));
        // The counter is consulted when the successor is not a legal one, or when it is a
        // signal handler (any successor is legal after an indirect branch): QEMU's inline
        // additions are not atomic, so threads running the same block at once can lose each
        // other's increments, and a low count alone proves nothing.
        // Without the counter, entering a handler is taken as an interruption at an unknown
        // place (never counting the block in full).
        let cut = reached.is_none_or(|d| d.saturating_add(1) < u64::from(n))
            && next.is_some_and(|x| self.handlers.is_some_and(|h| h.contains(x)));
        let entry = self.entry_stamp.take();
        let executed = match successor(p, next).filter(|_| !cut) {
            Some(cofi) => {
                let was_tracing = self.enc.is_tracing();
                self.stamp_at(p.start);
                if let (Some(t), true, Cofi::KernelEntry | Cofi::SoftwareInterrupt) =
                    (entry, was_tracing, cofi)
                {
                    // When the thread left user space, not when it came back (now).
                    self.enc.tsc_now(t);
                    self.stats.tsc_stamps += 1;
                }
                self.enc.block(
                    p.start,
                    u64::from(n),
                    Step {
                        ip: p.last_ip,
                        len: p.last_len,
                        cofi,
                        next_ip: next.unwrap_or(p.fallthrough),
                    },
                );
                u64::from(n)
            }
            None => self.interrupted(p, next, reached),
        };
        self.unsynced += executed;
        if self.unsynced >= self.config.tsc_period && self.enc.is_tracing() {
            let t = self.sync_clock();
            self.enc.tsc_now(t);
            self.stats.tsc_stamps += 1;
        }
    }

    /// Enables tracing at `ip`; when that re-enables it (back from the kernel), stamps the
    /// stream with the global clock right after the TIP.PGE.
    #[inline]
    fn stamp_at(&mut self, ip: u64) {
        if self.enc.is_tracing() {
            return;
        }
        self.enc.enter(ip);
        let t = self.sync_clock();
        self.enc.tsc_now(t);
        self.stats.tsc_stamps += 1;
    }

    /// `p` did not run to a legal successor; returns the instructions counted.
    fn interrupted(&mut self, p: &'b BlockInfo, next: Option<u64>, reached: Option<u64>) -> u64 {
        let n = p.insns;
        // QEMU restarting inside the block (an exclusive atomic step): the instructions before
        // the restart point ran, and the flow goes on there without any packet.
        if let Some(k) = next.and_then(|x| p.index_of(x)) {
            self.stamp_at(p.start);
            self.enc.straight(p.start, u64::from(k));
            self.stats.restarts += 1;
            return u64::from(k);
        }
        let Some(d) = reached.filter(|&d| d < u64::from(n)) else {
            // Unknown position: count nothing of the block.
            self.leave_stamp();
            self.enc.async_transfer(p.start);
            self.stats.async_inexact += 1;
            return 0;
        };
        let d = d as u32;
        if d + 1 < n {
            // Instruction `d` faulted: the ones before it ran.
            self.cut_at(p, d);
            self.stats.async_exact += 1;
            return u64::from(d);
        }
        // The last instruction was reached.
        match p.class {
            InsnClass::DirectJump | InsnClass::DirectCall => {
                // It completed (a near JMP cannot fault; the CALL's push is assumed to have
                // succeeded) and the transfer came at its target.
                let target = p.target.unwrap_or(p.fallthrough);
                let cofi = if p.class == InsnClass::DirectJump {
                    Cofi::DirectJump
                } else {
                    Cofi::DirectCall
                };
                self.stamp_at(p.start);
                self.enc.block(
                    p.start,
                    u64::from(n),
                    Step {
                        ip: p.last_ip,
                        len: p.last_len,
                        cofi,
                        next_ip: target,
                    },
                );
                self.leave_stamp();
                self.enc.async_transfer(target);
                if p.class == InsnClass::DirectJump {
                    self.stats.async_exact += 1;
                } else {
                    self.stats.async_guessed += 1;
                }
                u64::from(n)
            }
            InsnClass::Other | InsnClass::Special | InsnClass::Ptwrite if !p.last_can_fault => {
                // It cannot fault, so it completed: a signal between blocks.
                self.stamp_at(p.start);
                self.enc.straight(p.start, u64::from(n));
                self.leave_stamp();
                self.enc.async_transfer(p.fallthrough);
                self.stats.async_exact += 1;
                u64::from(n)
            }
            InsnClass::CondBranch => {
                // Completed, but which way is unknown: do not count it.
                self.cut_at(p, d);
                self.stats.async_inexact += 1;
                u64::from(d)
            }
            _ => {
                // It can fault and the flow did not go on after it: it faulted.
                self.cut_at(p, d);
                self.stats.async_guessed += 1;
                u64::from(d)
            }
        }
    }

    /// Instructions `0..d` of `p` ran and instruction `d` did not.
    fn cut_at(&mut self, p: &BlockInfo, d: u32) {
        if d > 0 {
            self.stamp_at(p.start);
            self.enc.straight(p.start, u64::from(d));
        }
        self.leave_stamp();
        self.enc.async_transfer(p.insn_ip(d));
    }

    /// A TSC packet from the clock right before an asynchronous transfer ends the run (a fault,
    /// a signal): when the thread left it.
    fn leave_stamp(&mut self) {
        if self.enc.is_tracing() {
            let t = self.sync_clock();
            self.enc.tsc_now(t);
            self.stats.tsc_stamps += 1;
        }
    }
}

/// The change of flow of `p`'s last instruction if execution legally went on at `next` (`None`:
/// the thread ended, legal only after a system call or software interrupt).
#[inline]
fn successor(p: &BlockInfo, next: Option<u64>) -> Option<Cofi> {
    match p.class {
        InsnClass::SysCall => return Some(Cofi::KernelEntry),
        InsnClass::SoftInt => return Some(Cofi::SoftwareInterrupt),
        _ => {}
    }
    let x = next?;
    match p.class {
        InsnClass::Other | InsnClass::Ptwrite | InsnClass::Special => {
            (x == p.fallthrough).then_some(Cofi::None)
        }
        InsnClass::CondBranch => {
            if x == p.fallthrough {
                Some(Cofi::Conditional { taken: false })
            } else if Some(x) == p.target {
                Some(Cofi::Conditional { taken: true })
            } else {
                None
            }
        }
        InsnClass::DirectJump => (Some(x) == p.target).then_some(Cofi::DirectJump),
        InsnClass::DirectCall => (Some(x) == p.target).then_some(Cofi::DirectCall),
        InsnClass::IndirectJump => Some(Cofi::IndirectJump),
        InsnClass::IndirectCall => Some(Cofi::IndirectCall),
        InsnClass::Return => Some(Cofi::Return),
        InsnClass::FarCall | InsnClass::FarJump | InsnClass::FarReturn => Some(Cofi::FarTransfer),
        InsnClass::SysCall | InsnClass::SoftInt => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{FlowConfig, FlowDecoder, Item};
    use crate::image::{Image, Section};

    /// Code at 0x1000: a loop whose block ends in `jne` back to 0x1000, then a fall-through into
    /// a block of three `mov [rdi], eax` (each can fault) ending in `ret`-less `nop`s.
    ///
    /// 0x1000: nop; nop; dec ecx (ff c9); jne 0x1000 (75 f9)
    /// 0x1006: mov [rdi], eax (89 07) x3 at 0x1006, 0x1008, 0x100a; nop at 0x100c
    fn image() -> Image {
        let code = [
            0x90, 0x90, 0xff, 0xc9, 0x75, 0xfa, 0x89, 0x07, 0x89, 0x07, 0x89, 0x07, 0x90, 0x90,
        ];
        let mut img = Image::new();
        img.add(Section::new(0x1000, code.to_vec(), "test"))
            .expect("section");
        img
    }

    fn decode(trace: &[u8], image: &Image) -> Vec<u64> {
        let mut dec = FlowDecoder::new(trace, image, FlowConfig::default());
        let mut ips = Vec::new();
        while let Some(item) = dec.next_item() {
            if let Item::Insn(i) = item {
                ips.push(i.ip);
            }
        }
        ips
    }

    #[test]
    fn loop_then_fault_mid_block_is_cut_at_the_faulting_instruction() {
        let img = image();
        let lp = BlockInfo::new(&[0x1000, 0x1001, 0x1002, 0x1004], &[0x75, 0xfa]).expect("b");
        assert_eq!(lp.target, Some(0x1000));
        let st = BlockInfo::new(&[0x1006, 0x1008, 0x100a, 0x100c], &[0x90]).expect("b");
        let clock = AtomicU64::new(0);
        let mut t = ThreadTracer::new(TracerConfig::default(), &clock);
        // Two iterations of the loop, then the fall-through.
        for _ in 0..2 {
            t.on_block(&lp);
            lp.note_reached(3);
        }
        t.on_block(&st);
        // The second store faults: instructions 0 and 1 reached.
        st.note_reached(1);
        // Not a legal successor of `st` (its fall-through is 0x100d): a signal handler.
        let elsewhere = BlockInfo::new(&[0x1001], &[0x90]).expect("b");
        t.on_block(&elsewhere);
        t.finish();
        let s = t.stats();
        // The fault, and the end of the thread after the handler's NOP.
        assert_eq!(s.async_exact, 2, "{s:?}");
        let trace = t.encoder().take_output();
        let ips = decode(&trace, &img);
        // loop x2 (8), the store block cut after 1 instruction (0x1006), then the handler's
        // NOP (it cannot fault, so it completed before the thread ended).
        let mut expected = vec![0x1000, 0x1001, 0x1002, 0x1004];
        expected.extend_from_within(..);
        expected.extend([0x1006, 0x1001]);
        assert_eq!(ips, expected);
        assert_eq!(t.stats().instructions, 10);
    }

    /// The clock taken at a system call's entry is written before its TIP.PGD, not the later
    /// clock of when the block is decided (the thread's return from the kernel).
    #[test]
    fn a_system_call_is_stamped_when_it_enters_the_kernel() {
        // 0x2000: nop; syscall. 0x2003: jmp 0x2000.
        let mut img = Image::new();
        img.add(Section::new(
            0x2000,
            vec![0x90, 0x0f, 0x05, 0xeb, 0xfb],
            "s",
        ))
        .expect("section");
        let call = BlockInfo::new(&[0x2000, 0x2001], &[0x0f, 0x05]).expect("b");
        let back = BlockInfo::new(&[0x2003], &[0xeb, 0xfb]).expect("b");
        let clock = AtomicU64::new(0);
        let mut t = ThreadTracer::new(TracerConfig::default(), &clock);
        t.on_block(&call);
        t.on_block(&back);
        t.on_block(&call);
        // Other threads run 100 instructions, then this one enters the kernel, where it stays
        // while others run 1000 more.
        clock.fetch_add(100, Ordering::Relaxed);
        t.at_system_call();
        let entered = clock.load(Ordering::Relaxed);
        clock.fetch_add(1000, Ordering::Relaxed);
        t.on_block(&back);
        t.finish();
        let trace = t.encoder().take_output();
        assert_eq!(
            decode(&trace, &img),
            vec![0x2000, 0x2001, 0x2003, 0x2000, 0x2001, 0x2003]
        );
        let c = crate::history::ThreadClock::from_trace(&trace, &img, &FlowConfig::default());
        // The decoder dates the blocks that have no packet of their own by the next timing
        // packet: the stamp either ends the run before the call or starts the call's own run.
        let ends: Vec<_> = (0..c.runs().len()).filter_map(|k| c.run_until(k)).collect();
        assert!(
            ends.contains(&entered) || c.runs().iter().any(|&(_, t)| t == entered),
            "{:?} {ends:?}",
            c.runs()
        );
        // Back from the kernel: stamped after the others' 1000.
        assert!(c.end_time() > entered + 1000, "{:?}", c.runs());
    }

    #[test]
    fn restart_inside_the_block_counts_up_to_it_without_packets() {
        let img = image();
        let st = BlockInfo::new(&[0x1006, 0x1008, 0x100a, 0x100c], &[0x90]).expect("b");
        let rest = BlockInfo::new(&[0x100a, 0x100c], &[0x90]).expect("b");
        let next = BlockInfo::new(&[0x100d], &[0x90]).expect("b");
        let clock = AtomicU64::new(0);
        let mut t = ThreadTracer::new(TracerConfig::default(), &clock);
        t.on_block(&st);
        st.note_reached(2);
        t.on_block(&rest);
        rest.note_reached(1);
        t.on_block(&next);
        t.finish();
        assert_eq!(t.stats().restarts, 1);
        let trace = t.encoder().take_output();
        assert_eq!(
            decode(&trace, &img),
            vec![0x1006, 0x1008, 0x100a, 0x100c, 0x100d]
        );
    }
}
