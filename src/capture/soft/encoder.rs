//! The software PT encoder: turns executed instructions, as a single-stepper observes them, into the
//! packets a processor tracing user space (`IA32_RTIT_CTL.USR = 1, OS = 0`) would emit.
//!
//! The recorder classifies each executed instruction into its SDM change-of-flow category
//! ([`Cofi`], SDM Table 33-1) and reports where execution went next; this module owns every
//! packet-level decision, so that what it writes is decodable by any PT decoder (ours, libipt, GDB):
//!
//! * conditional branches become TNT bits, packed into short TNTs (six bits) as Skylake and later
//!   processors do; a pending TNT is flushed before any other packet, so TIPs are never deferred
//!   (deferral is optional for the processor, so this is a valid subset of its behaviour);
//! * indirect jumps and calls become TIPs, IP-compressed against Last IP with the shortest valid
//!   encoding (the packet layer's [`Encoder`]);
//! * near returns are compressed into a taken TNT bit when the target matches the NLIP pushed by the
//!   matching CALL on a 64-entry return stack (SDM "Indirect Transfer Compression for Returns"): the
//!   stack is emptied at each PSB, the oldest entry is dropped when full, zero-length CALLs are not
//!   pushed, and an uncompressed RET still pops — exactly the model decoders keep;
//! * SYSCALL/SYSENTER leave the traced context: TIP.PGD with the IP suppressed, no FUP (a
//!   synchronous far transfer to CPL 0, SDM Table 36-50; libipt `syscall-sysret-cpl_3`). The first
//!   instruction seen back in user space is announced with TIP.PGE;
//! * software interrupts (INT n, INT3, INT1, INTO) are FUP(CLIP, the INT itself) + TIP.PGD
//!   (suppressed) — SDM Table 36-23 gives the CLIP as the FUP IP of a software interrupt, and the
//!   target is in the kernel, so the TIP becomes a TIP.PGD. A decoder cannot tell this from an
//!   asynchronous event at the same IP (reference §7.17), so, as with hardware, the INT itself is
//!   not part of the decoded instruction stream;
//! * asynchronous transfers seen from user space (signal delivery after a fault, a timer or a
//!   `kill`) are FUP(the IP that did not execute yet) + TIP.PGD(suppressed), then TIP.PGE at the
//!   handler — the user-only sequence of SDM Table 36-50;
//! * every `psb_period` bytes, at an instruction boundary, PSB+ restates the state: \[TSC\],
//!   MODE.Exec, FUP(current IP), PSBEND; Last IP and the return stack restart from empty.
//!
//! Placement of MODE.Exec and TSC follows what a processor tracing with `USR = 1, OS = 0` does:
//!
//! * MODE.Exec directly precedes the TIP.PGE it applies to (SDM: "MODE.Exec always immediately
//!   precedes the TIP or TIP.PGE"). The SDM generates it for "any scenario that can generate a
//!   TIP.PGE, such that the mode may have changed since the last MODE.Exec": with `OS = 0`
//!   every TIP.PGE follows time spent outside the traced context, where it may have, so by
//!   default every TIP.PGE gets one ([`EncoderConfig::mode_exec_on_every_pge`]); with that off,
//!   only a TIP.PGE after a PSB+ without MODE.Exec (tracing was off at the PSB) gets one — the
//!   minimum a decoder needs, since the 64-bit user mode never changes across a kernel entry;
//! * TSC is emitted only where the processor initialises its time: inside each PSB+ (and so at
//!   the TraceEn 0→1 of [`SoftEncoder::step`] after [`SoftEncoder::new`] or
//!   [`SoftEncoder::disable`], which starts with PSB+). With `USR`-only tracing TraceEn stays set
//!   across kernel entries, so a TIP.PGE after a system call gets no TSC of its own. Between
//!   PSBs, time is not tracked (no MTC/CYC: the software clock has no crystal).
//!
//! The encoder only appends bytes to an internal buffer; the recorder moves them into the output
//! ring (ToPA model) with [`SoftEncoder::take_output`].

use crate::packet::{Encoder, IpKind, Packet, Tnt, encode_packet};

/// The change-of-flow category of one executed instruction (SDM Table 33-1), as the recorder saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cofi {
    /// Not a change of flow instruction.
    None,
    /// Jcc, J*CXZ, LOOP*: one TNT bit.
    Conditional {
        /// Whether the branch was taken.
        taken: bool,
    },
    /// JMP rel: no packet.
    DirectJump,
    /// CALL rel: no packet; pushes its NLIP on the return stack (unless zero-length).
    DirectCall,
    /// JMP r/m: TIP.
    IndirectJump,
    /// CALL r/m: TIP; pushes its NLIP.
    IndirectCall,
    /// Near RET: compressed TNT bit or TIP.
    Return,
    /// Far JMP/CALL/RET, IRET and other far transfers that stay in user space: TIP (no FUP).
    FarTransfer,
    /// SYSCALL, SYSENTER: a synchronous far transfer into the kernel. The flow leaves the traced
    /// context: TIP.PGD with the IP suppressed, no FUP.
    KernelEntry,
    /// INT n, INT3, INT1, INTO: FUP(CLIP) + TIP.PGD(suppressed) (SDM Tables 36-23 and 36-50).
    SoftwareInterrupt,
}

/// One instruction the target executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Address of the instruction.
    pub ip: u64,
    /// Its length in bytes.
    pub len: u8,
    /// Its change-of-flow category.
    pub cofi: Cofi,
    /// The address execution continued at in user space (for [`Cofi::KernelEntry`] and
    /// [`Cofi::SoftwareInterrupt`], where the kernel returned to: the NLIP, a signal handler, or
    /// the interrupted IP after `rt_sigreturn`; the encoder does not use it for those, since the
    /// next step's IP is announced with TIP.PGE anyway).
    pub next_ip: u64,
}

impl Step {
    /// The address of the next instruction in memory (NLIP).
    pub fn nlip(&self) -> u64 {
        self.ip.wrapping_add(u64::from(self.len))
    }
}

/// Encoder settings, mirroring the `IA32_RTIT_CTL` bits that shape the packet stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderConfig {
    /// RET compression (`DisRETC = 0`).
    pub ret_compression: bool,
    /// Approximate bytes between PSB+ (the hardware's `PSBFreq`: 2^(n+11) bytes). A PSB+ is
    /// emitted at the first instruction boundary once this many bytes were written since the
    /// previous one.
    pub psb_period: usize,
    /// Emit a TSC packet in each PSB+ (`TSCEn`).
    pub tsc: bool,
    /// Precede every TIP.PGE with MODE.Exec (see the module docs); when false, only the first
    /// TIP.PGE after a PSB+ without MODE.Exec gets one.
    pub mode_exec_on_every_pge: bool,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        EncoderConfig {
            ret_compression: true,
            psb_period: 4096,
            tsc: true,
            mode_exec_on_every_pge: true,
        }
    }
}

/// Capacity of the processor's RET-compression stack (SDM: at least 64 entries).
pub const RET_STACK_DEPTH: usize = 64;

/// TNT bits per short TNT packet (TNT-8 carries up to six).
const SHORT_TNT_BITS: u8 = 6;

/// A fixed ring of the last 64 pushed NLIPs; pushing onto a full stack drops the oldest entry.
#[derive(Debug, Clone)]
struct RetStack {
    entries: [u64; RET_STACK_DEPTH],
    top: usize,
    len: usize,
}

impl RetStack {
    fn new() -> Self {
        RetStack {
            entries: [0; RET_STACK_DEPTH],
            top: 0,
            len: 0,
        }
    }

    fn clear(&mut self) {
        self.len = 0;
    }

    fn push(&mut self, ip: u64) {
        self.top = (self.top + 1) % RET_STACK_DEPTH;
        self.entries[self.top] = ip;
        self.len = (self.len + 1).min(RET_STACK_DEPTH);
    }

    fn peek(&self) -> Option<u64> {
        (self.len > 0).then(|| self.entries[self.top])
    }

    fn pop(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let ip = self.entries[self.top];
        self.top = (self.top + RET_STACK_DEPTH - 1) % RET_STACK_DEPTH;
        self.len -= 1;
        Some(ip)
    }
}

/// Whether packet generation is on, from the encoder's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enable {
    /// TraceEn = 0 (before the first step, or after [`SoftEncoder::disable`]): the next step
    /// starts with PSB+ and TIP.PGE.
    Off,
    /// PacketEn = 1: the packets written so far describe the flow up to the last step.
    On,
    /// TraceEn = 1 but the flow left user space (kernel entry or asynchronous event); the next
    /// step is announced with TIP.PGE.
    Paused,
}

/// Counters of what the encoder has produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncoderStats {
    /// Instructions encoded.
    pub instructions: u64,
    /// PSB+ sequences emitted.
    pub psbs: u64,
    /// RETs compressed into TNT bits.
    pub compressed_rets: u64,
    /// RETs sent as TIP.
    pub uncompressed_rets: u64,
    /// Transitions into the kernel (TIP.PGD) for system calls and software interrupts.
    pub kernel_entries: u64,
    /// Asynchronous transfers (FUP + TIP.PGD).
    pub async_transfers: u64,
    /// Bytes produced so far.
    pub bytes: u64,
}

/// Turns executed instructions into Intel PT packets (see the module documentation).
#[derive(Debug, Clone)]
pub struct SoftEncoder {
    config: EncoderConfig,
    packets: Encoder,
    out: Vec<u8>,
    tnt_bits: u64,
    tnt_count: u8,
    ret_stack: RetStack,
    state: Enable,
    /// No MODE.Exec has been emitted since the last PSB: the next TIP.PGE needs one.
    mode_pending: bool,
    /// Value of `stats.bytes` at the last PSB.
    psb_at: u64,
    tsc: u64,
    /// Bytes removed from `out` by [`SoftEncoder::take_output`] / [`SoftEncoder::consume_output`].
    taken: u64,
    stats: EncoderStats,
}

impl SoftEncoder {
    /// An encoder with tracing off; the first [`step`](Self::step) enables it.
    pub fn new(config: EncoderConfig) -> Self {
        SoftEncoder {
            config,
            packets: Encoder::new(),
            out: Vec::with_capacity(16 * 1024),
            tnt_bits: 0,
            tnt_count: 0,
            ret_stack: RetStack::new(),
            state: Enable::Off,
            mode_pending: true,
            psb_at: 0,
            tsc: 0,
            taken: 0,
            stats: EncoderStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EncoderConfig {
        &self.config
    }

    /// Sets the time-stamp counter value used by the next TSC packet (the recorder's clock).
    /// Only bits 55:0 are kept (the TSC packet's width).
    pub fn set_tsc(&mut self, tsc: u64) {
        self.tsc = tsc & ((1 << 56) - 1);
    }

    /// Whether packet generation is currently on (PacketEn = 1): false before the first step,
    /// after [`disable`](Self::disable), and between a kernel entry and the next step.
    #[inline]
    pub fn is_tracing(&self) -> bool {
        self.state == Enable::On
    }

    /// Encodes one executed instruction.
    pub fn step(&mut self, step: Step) {
        self.block(step.ip, 1, step);
    }

    /// Encodes a run of `insns` instructions executed in a row from `start`, of which only the
    /// last, `last`, may change the flow (the others fall through): a basic block as a binary
    /// translator sees it. [`step`](Self::step) is the one-instruction case, so the
    /// single-stepping and the block-driven (QEMU plugin) captures share every packet-level
    /// decision. Tracing is (re-)enabled and a periodic PSB+ placed at `start`, the only
    /// instruction boundary before `last` a block-driven caller can see.
    #[inline]
    pub fn block(&mut self, start: u64, insns: u64, last: Step) {
        self.enter(start);
        self.stats.instructions += insns;
        self.cofi(last);
    }

    /// [`block`](Self::block) for the common case of a block-driven capture, when it writes
    /// nothing but at most a TNT bit: packet generation is on, no PSB+ is due, and the last
    /// instruction is a plain one, a direct jump or call, a conditional branch, or a return
    /// the return stack compresses. Returns false, having changed nothing, in every other case
    /// (the caller then uses [`block`](Self::block)). The result is the same as `block`'s.
    #[inline]
    pub fn block_fast(&mut self, insns: u64, last: Step) -> bool {
        if self.state != Enable::On
            || self.stats.bytes - self.psb_at >= self.config.psb_period as u64
        {
            return false;
        }
        match last.cofi {
            Cofi::None | Cofi::DirectJump => {}
            Cofi::Conditional { taken } => self.tnt(taken),
            Cofi::DirectCall => {
                let nlip = last.nlip();
                if last.next_ip != nlip {
                    self.ret_stack.push(nlip);
                }
            }
            Cofi::Return
                if self.config.ret_compression && self.ret_stack.peek() == Some(last.next_ip) =>
            {
                self.ret_stack.pop();
                self.stats.compressed_rets += 1;
                self.tnt(true);
            }
            _ => return false,
        }
        self.stats.instructions += insns;
        true
    }

    /// Where the next return goes if it returns to the innermost call encoded since the last
    /// PSB (the top of the RET-compression stack), as far as the stack knows: what a capture
    /// that sees a block ending in `ret` before it runs can expect its target to be.
    pub fn predicted_return(&self) -> Option<u64> {
        self.ret_stack.peek()
    }

    /// Encodes `insns` instructions from `start` that executed without changing the flow (a
    /// block cut short: the instruction after them is where an asynchronous transfer or a
    /// restart happened). Nothing is written unless tracing has to be (re-)enabled at `start`.
    pub fn straight(&mut self, start: u64, insns: u64) {
        if insns == 0 {
            return;
        }
        self.enter(start);
        self.stats.instructions += insns;
    }

    /// Writes a TSC packet with `tsc` (bits 55:0) now, when packet generation is on, and makes
    /// it the value of the next PSB+'s TSC as well. A block-driven capture stamps each
    /// thread's stream from one global counter this way, so streams can be ordered.
    pub fn tsc_now(&mut self, tsc: u64) {
        self.set_tsc(tsc);
        if self.state == Enable::On && self.config.tsc {
            self.flush_tnt();
            self.put(&Packet::Tsc { tsc: self.tsc });
        }
    }

    /// The next instruction to execute is at `ip`: enables tracing there if needed (PSB+ and
    /// TIP.PGE, as [`step`](Self::step) would), else places a due periodic PSB+ there.
    #[inline]
    pub fn enter(&mut self, ip: u64) {
        match self.state {
            Enable::Off => self.enable_at(ip, true),
            Enable::Paused => self.enable_at(ip, false),
            Enable::On => {
                if self.stats.bytes - self.psb_at >= self.config.psb_period as u64 {
                    self.psb_plus(Some(ip));
                }
            }
        }
    }

    /// The packets of one executed change-of-flow (or plain) instruction.
    #[inline]
    fn cofi(&mut self, step: Step) {
        let nlip = step.nlip();
        match step.cofi {
            Cofi::None | Cofi::DirectJump => {}
            Cofi::Conditional { taken } => self.tnt(taken),
            Cofi::DirectCall => {
                // A zero-length CALL (target == NLIP) is a way to read RIP, not a call: hardware
                // does not push it, and decoders do not expect it on the stack (SDM, reference
                // §3.3 rule 2).
                if step.next_ip != nlip {
                    self.ret_stack.push(nlip);
                }
            }
            Cofi::IndirectJump | Cofi::FarTransfer => self.tip(IpKind::Tip, Some(step.next_ip)),
            Cofi::IndirectCall => {
                self.ret_stack.push(nlip);
                self.tip(IpKind::Tip, Some(step.next_ip));
            }
            Cofi::Return => {
                // Pop even when not compressing, so later compressed RETs pair with the CALL at
                // the same depth (decoders pop on uncompressed RETs too).
                let top = self.ret_stack.pop();
                if self.config.ret_compression && top == Some(step.next_ip) {
                    self.stats.compressed_rets += 1;
                    self.tnt(true);
                } else {
                    self.stats.uncompressed_rets += 1;
                    self.tip(IpKind::Tip, Some(step.next_ip));
                }
            }
            Cofi::KernelEntry => {
                self.tip(IpKind::TipPgd, None);
                self.stats.kernel_entries += 1;
                self.state = Enable::Paused;
            }
            Cofi::SoftwareInterrupt => {
                self.flush_tnt();
                self.ip_packet(IpKind::Fup, Some(step.ip));
                self.ip_packet(IpKind::TipPgd, None);
                self.stats.kernel_entries += 1;
                self.state = Enable::Paused;
            }
        }
    }

    /// An asynchronous transfer seen from user space (a fault, or a signal delivered between two
    /// instructions): `resume_ip` is the instruction that did not execute (the faulting
    /// instruction's CLIP, or the NLIP of the interrupted flow); the next
    /// [`step`](Self::step) (normally the signal handler) is announced with TIP.PGE. Does nothing
    /// when packet generation is off (the transfer happened while in the kernel already).
    pub fn async_transfer(&mut self, resume_ip: u64) {
        if self.state != Enable::On {
            return;
        }
        self.flush_tnt();
        self.ip_packet(IpKind::Fup, Some(resume_ip));
        self.ip_packet(IpKind::TipPgd, None);
        self.stats.async_transfers += 1;
        self.state = Enable::Paused;
    }

    /// Turns tracing off before the instruction at `ip` (like a WRMSR clearing TraceEn, SDM
    /// Table 36-50): FUP(ip) + TIP.PGD(suppressed) if packet generation was on. The next
    /// [`step`](Self::step) starts a new PSB+ and TIP.PGE. Pending TNT bits are written out.
    pub fn disable(&mut self, ip: u64) {
        if self.state == Enable::On {
            self.flush_tnt();
            self.ip_packet(IpKind::Fup, Some(ip));
            self.ip_packet(IpKind::TipPgd, None);
        }
        self.flush_tnt();
        self.state = Enable::Off;
    }

    /// Ends the trace because the process is gone or recording stops for good. With `Some(ip)`
    /// (killed before the instruction at `ip` executed, or stopped there) this is
    /// [`disable`](Self::disable); with `None` (where execution stood is unknown) a lone
    /// TIP.PGD(suppressed) ends packet generation. Either way the trace ends with a TIP.PGD
    /// (after a final SYSCALL such as `exit_group` it already did, and nothing is added).
    pub fn finish(&mut self, ip: Option<u64>) {
        match ip {
            Some(ip) => self.disable(ip),
            None => {
                if self.state == Enable::On {
                    self.tip(IpKind::TipPgd, None);
                }
                self.flush_tnt();
                self.state = Enable::Off;
            }
        }
    }

    /// The next instruction runs in another address space (a successful `execve` replaced the
    /// program): tracing restarts there with a PSB+ (without FUP: packet generation is off at
    /// it) and MODE.Exec + TIP.PGE, so a decoder can switch images at that PSB
    /// ([`Image::push_period`](crate::image::Image::push_period)). Returns the stream offset
    /// of that PSB. The `syscall` before has already ended packet generation (TIP.PGD); if it
    /// has not, a TIP.PGD ends it here.
    pub fn new_address_space(&mut self) -> u64 {
        if self.state == Enable::On {
            self.tip(IpKind::TipPgd, None);
        }
        self.flush_tnt();
        self.ret_stack.clear();
        self.state = Enable::Off;
        self.taken + self.out.len() as u64
    }

    /// Writes pending TNT bits out so that everything encoded so far is in the output. Like a
    /// processor forcing out a partial TNT, this does not change what the stream means.
    pub fn flush(&mut self) {
        self.flush_tnt();
    }

    /// Takes the bytes produced since the last call.
    pub fn take_output(&mut self) -> Vec<u8> {
        self.taken += self.out.len() as u64;
        std::mem::take(&mut self.out)
    }

    /// Passes the bytes produced since the last call to `f` and forgets them, keeping the buffer
    /// (no allocation per call).
    pub fn consume_output<T>(&mut self, f: impl FnOnce(&[u8]) -> T) -> T {
        let r = f(&self.out);
        self.taken += self.out.len() as u64;
        self.out.clear();
        r
    }

    /// TNT bits decided but not yet written (oldest in the highest of the `count` low bits).
    #[inline]
    pub fn pending_tnt(&self) -> (u64, u8) {
        (self.tnt_bits, self.tnt_count)
    }

    /// Bytes produced but not yet taken.
    #[inline]
    pub fn pending_output(&self) -> &[u8] {
        &self.out
    }

    /// What the encoder has produced so far.
    pub fn stats(&self) -> EncoderStats {
        let mut s = self.stats;
        s.bytes = self.taken + self.out.len() as u64;
        s
    }

    fn enable_at(&mut self, ip: u64, fresh: bool) {
        if fresh {
            // TraceEn 0→1: PSB+ without FUP (PacketEn is still 0 at the PSB), then
            // MODE.Exec + TIP.PGE at the first traced instruction.
            self.psb_plus(None);
        }
        if self.mode_pending || self.config.mode_exec_on_every_pge {
            self.mode_exec();
        }
        self.ip_packet(IpKind::TipPge, Some(ip));
        self.state = Enable::On;
    }

    /// MODE.Exec for 64-bit code (the only mode the recorder traces); it settles a pending
    /// mode change.
    fn mode_exec(&mut self) {
        self.put(&Packet::ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        });
        self.mode_pending = false;
    }

    fn psb_plus(&mut self, current_ip: Option<u64>) {
        self.flush_tnt();
        self.packets.psb(&mut self.out);
        self.ret_stack.clear();
        if self.config.tsc {
            self.put(&Packet::Tsc { tsc: self.tsc });
        }
        if let Some(ip) = current_ip {
            self.mode_exec();
            self.ip_packet(IpKind::Fup, Some(ip));
        } else {
            // Without PacketEn, PSB+ carries no MODE.Exec: the next TIP.PGE must restate it.
            self.mode_pending = true;
        }
        self.put(&Packet::PsbEnd);
        self.stats.psbs += 1;
        self.psb_at = self.taken + self.out.len() as u64;
        self.stats.bytes = self.psb_at;
    }

    #[inline]
    fn tnt(&mut self, taken: bool) {
        self.tnt_bits = (self.tnt_bits << 1) | u64::from(taken);
        self.tnt_count += 1;
        if self.tnt_count == SHORT_TNT_BITS {
            self.flush_tnt();
        }
    }

    fn flush_tnt(&mut self) {
        if self.tnt_count == 0 {
            return;
        }
        let tnt = Tnt::new(self.tnt_bits, self.tnt_count);
        self.tnt_bits = 0;
        self.tnt_count = 0;
        self.put(&Packet::ShortTnt(tnt));
    }

    fn tip(&mut self, kind: IpKind, ip: Option<u64>) {
        self.flush_tnt();
        self.ip_packet(kind, ip);
    }

    fn ip_packet(&mut self, kind: IpKind, ip: Option<u64>) {
        // Cannot fail: the packet encoder picks a compression valid against its own Last IP, and
        // every IP packet here follows a PSB (which makes Last IP known).
        let written = self.packets.ip_packet(kind, ip, &mut self.out);
        debug_assert!(written.is_ok(), "unencodable {kind:?} {ip:?}");
        self.stats.bytes = self.taken + self.out.len() as u64;
    }

    fn put(&mut self, packet: &Packet) {
        // Every packet built here is valid by construction (TNT counts 1..=6, 56-bit TSC).
        let written = encode_packet(packet, &mut self.out);
        debug_assert!(written.is_ok(), "unencodable {packet:?}");
        self.stats.bytes = self.taken + self.out.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{IpCompression, LastIp, PacketDecoder};

    /// A decoded packet, with IPs reconstructed through an independent Last-IP model.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum P {
        Psb,
        PsbEnd,
        Tsc,
        Mode,
        /// TNT outcomes, oldest first.
        Tnt(String),
        Tip(u64),
        Pge(u64),
        Pgd(Option<u64>),
        Fup(u64),
    }

    fn decode(bytes: &[u8]) -> Vec<P> {
        decode_with_compression(bytes)
            .into_iter()
            .map(|(p, _)| p)
            .collect()
    }

    fn decode_with_compression(bytes: &[u8]) -> Vec<(P, Option<IpCompression>)> {
        let mut last = LastIp::new();
        let mut out = Vec::new();
        let mut dec = PacketDecoder::new(bytes);
        while let Some(r) = dec.next_packet() {
            let (_, p) = r.expect("encoder output must decode");
            let item = match p {
                Packet::Psb => {
                    last.reset();
                    (P::Psb, None)
                }
                Packet::PsbEnd => (P::PsbEnd, None),
                Packet::Tsc { .. } => (P::Tsc, None),
                Packet::ModeExec {
                    csl: true,
                    csd: false,
                    ..
                } => (P::Mode, None),
                Packet::ShortTnt(t) | Packet::LongTnt(t) => {
                    let s = (0..t.count)
                        .rev()
                        .map(|i| if t.bits >> i & 1 == 1 { 'T' } else { 'N' })
                        .collect();
                    (P::Tnt(s), None)
                }
                other => {
                    let (kind, payload) = other.ip_payload().expect("unexpected packet");
                    let ip = last.apply(payload).expect("Last IP known");
                    let c = Some(payload.compression);
                    match kind {
                        IpKind::Tip => (P::Tip(ip.expect("TIP with IP")), c),
                        IpKind::TipPge => (P::Pge(ip.expect("PGE with IP")), c),
                        IpKind::TipPgd => (P::Pgd(ip), c),
                        IpKind::Fup => (P::Fup(ip.expect("FUP with IP")), c),
                    }
                }
            };
            out.push(item);
        }
        out
    }

    fn step(ip: u64, len: u8, cofi: Cofi, next_ip: u64) -> Step {
        Step {
            ip,
            len,
            cofi,
            next_ip,
        }
    }

    fn plain(ip: u64) -> Step {
        step(ip, 1, Cofi::None, ip + 1)
    }

    fn no_tsc() -> EncoderConfig {
        EncoderConfig {
            tsc: false,
            psb_period: 1 << 30,
            ..EncoderConfig::default()
        }
    }

    fn run(config: EncoderConfig, steps: &[Step]) -> Vec<P> {
        let mut e = SoftEncoder::new(config);
        for s in steps {
            e.step(*s);
        }
        e.flush();
        decode(&e.take_output())
    }

    const BASE: u64 = 0x5555_5555_1000;

    #[test]
    fn start_is_psb_without_fup_then_mode_and_pge() {
        let mut e = SoftEncoder::new(EncoderConfig::default());
        e.set_tsc(0x1234);
        e.step(plain(BASE));
        let bytes = e.take_output();
        // PSB, TSC, PSBEND, MODE.Exec(64-bit), TIP.PGE(IPBytes 011: sign-extended 48 bits).
        let mut expected = vec![];
        for _ in 0..8 {
            expected.extend_from_slice(&[0x02, 0x82]);
        }
        expected.extend_from_slice(&[0x19, 0x34, 0x12, 0, 0, 0, 0, 0]);
        expected.extend_from_slice(&[0x02, 0x23]);
        expected.extend_from_slice(&[0x99, 0x01]);
        expected.extend_from_slice(&[0x71, 0x00, 0x10, 0x55, 0x55, 0x55, 0x55]);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn tnt_bits_oldest_first_six_per_packet() {
        let pattern = [true, false, false, true, true, true, false, true];
        let mut steps = Vec::new();
        let mut ip = BASE;
        for &taken in &pattern {
            let next = if taken { ip + 0x10 } else { ip + 2 };
            steps.push(step(ip, 2, Cofi::Conditional { taken }, next));
            ip = next;
        }
        let got = run(no_tsc(), &steps);
        assert_eq!(
            &got[4..],
            &[P::Tnt("TNNTTT".into()), P::Tnt("NT".into())],
            "{got:?}"
        );
        // Raw byte check of the bit order: "TNNTTT" = stop bit at 6, B1 at bit 6 of the payload.
        let mut e = SoftEncoder::new(no_tsc());
        for s in &steps[..6] {
            e.step(*s);
        }
        let out = e.take_output();
        // payload (byte >> 1) = 1 TNNTTT = 0b1100111 → byte 0b1100_1110.
        assert_eq!(*out.last().unwrap(), 0b1100_1110);
    }

    #[test]
    fn indirect_branch_tip_uses_shortest_compression() {
        let steps = [
            step(BASE, 2, Cofi::IndirectJump, BASE + 0x40),
            step(BASE + 0x40, 2, Cofi::IndirectJump, BASE + 0x1_2340),
            step(BASE + 0x1_2340, 2, Cofi::IndirectCall, 0x7fff_f7a0_0000),
            step(0x7fff_f7a0_0000, 1, Cofi::None, 0x7fff_f7a0_0001),
        ];
        let mut e = SoftEncoder::new(no_tsc());
        for s in steps {
            e.step(s);
        }
        let got = decode_with_compression(&e.take_output());
        let tips: Vec<_> = got
            .iter()
            .filter(|(p, _)| matches!(p, P::Tip(_)))
            .cloned()
            .collect();
        assert_eq!(
            tips,
            vec![
                (P::Tip(BASE + 0x40), Some(IpCompression::Update16)),
                (P::Tip(BASE + 0x1_2340), Some(IpCompression::Update32)),
                // Upper 16 bits equal, bits 47:32 differ → the 6-byte forms.
                (P::Tip(0x7fff_f7a0_0000), Some(IpCompression::Sext48)),
            ]
        );
    }

    #[test]
    fn matching_ret_is_compressed_mismatched_ret_is_tip() {
        let f = BASE + 0x100;
        let steps = [
            step(BASE, 5, Cofi::DirectCall, f),
            step(f, 1, Cofi::Return, BASE + 5),
            step(BASE + 5, 5, Cofi::DirectCall, f),
            // Return address overwritten: RET goes elsewhere.
            step(f, 1, Cofi::Return, BASE + 0x200),
            step(BASE + 0x200, 1, Cofi::None, BASE + 0x201),
        ];
        let got = run(no_tsc(), &steps);
        assert_eq!(
            &got[4..],
            &[P::Tnt("T".into()), P::Tip(BASE + 0x200)],
            "{got:?}"
        );
    }

    #[test]
    fn ret_compression_can_be_disabled() {
        let f = BASE + 0x100;
        let cfg = EncoderConfig {
            ret_compression: false,
            ..no_tsc()
        };
        let got = run(
            cfg,
            &[
                step(BASE, 5, Cofi::DirectCall, f),
                step(f, 1, Cofi::Return, BASE + 5),
            ],
        );
        assert_eq!(&got[4..], &[P::Tip(BASE + 5)]);
    }

    #[test]
    fn zero_length_call_is_not_pushed() {
        let f = BASE + 0x100;
        let steps = [
            step(BASE, 5, Cofi::DirectCall, f),
            // call $+5 inside f: target == NLIP, not pushed.
            step(f, 5, Cofi::DirectCall, f + 5),
            step(f + 5, 1, Cofi::None, f + 6),
            // The RET pairs with the first CALL and is compressed.
            step(f + 6, 1, Cofi::Return, BASE + 5),
        ];
        let got = run(no_tsc(), &steps);
        assert_eq!(&got[4..], &[P::Tnt("T".into())], "{got:?}");
    }

    #[test]
    fn return_stack_keeps_only_the_newest_64_calls() {
        // 70 nested calls, then 70 returns: the innermost 64 RETs are compressed, the outermost 6
        // are TIPs, since their CALLs fell off the 64-entry stack.
        let depth = 70u64;
        let mut steps = Vec::new();
        let call_site = |d: u64| BASE + d * 0x100;
        for d in 0..depth {
            steps.push(step(call_site(d), 5, Cofi::DirectCall, call_site(d + 1)));
        }
        for d in (0..depth).rev() {
            let at = call_site(d + 1) + 0x50;
            steps.push(step(at, 1, Cofi::Return, call_site(d) + 5));
        }
        let got = run(no_tsc(), &steps);
        let tnt: String = got
            .iter()
            .filter_map(|p| match p {
                P::Tnt(s) => Some(s.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(tnt, "T".repeat(64));
        let tips: Vec<u64> = got
            .iter()
            .filter_map(|p| match p {
                P::Tip(ip) => Some(*ip),
                _ => None,
            })
            .collect();
        let expected: Vec<u64> = (0..6).rev().map(|d| call_site(d) + 5).collect();
        assert_eq!(tips, expected);
    }

    #[test]
    fn syscall_is_pgd_without_fup_then_pge_with_mode() {
        let steps = [
            step(BASE, 2, Cofi::Conditional { taken: false }, BASE + 2),
            step(BASE + 2, 2, Cofi::KernelEntry, BASE + 4),
            step(BASE + 4, 1, Cofi::None, BASE + 5),
            // rt_sigreturn-like: the kernel returns somewhere else.
            step(BASE + 5, 2, Cofi::KernelEntry, BASE + 0x900),
            step(BASE + 0x900, 1, Cofi::None, BASE + 0x901),
        ];
        let got = run(no_tsc(), &steps);
        assert_eq!(
            got,
            vec![
                P::Psb,
                P::PsbEnd,
                P::Mode,
                P::Pge(BASE),
                // The pending TNT bit is forced out before the PGD.
                P::Tnt("N".into()),
                P::Pgd(None),
                P::Mode,
                P::Pge(BASE + 4),
                P::Pgd(None),
                P::Mode,
                P::Pge(BASE + 0x900),
            ]
        );
        // The minimal form: MODE.Exec only where the decoder cannot know the mode.
        let cfg = EncoderConfig {
            mode_exec_on_every_pge: false,
            ..no_tsc()
        };
        let got = run(cfg, &steps);
        let modes = got.iter().filter(|p| **p == P::Mode).count();
        assert_eq!(modes, 1, "{got:?}");
        assert_eq!(got[6], P::Pge(BASE + 4));
    }

    #[test]
    fn software_interrupt_is_fup_clip_and_pgd() {
        let steps = [
            step(BASE, 1, Cofi::None, BASE + 1),
            step(BASE + 1, 1, Cofi::SoftwareInterrupt, BASE + 2),
            step(BASE + 2, 1, Cofi::None, BASE + 3),
        ];
        let got = run(no_tsc(), &steps);
        assert_eq!(
            &got[3..],
            &[
                P::Pge(BASE),
                P::Fup(BASE + 1),
                P::Pgd(None),
                P::Mode,
                P::Pge(BASE + 2)
            ]
        );
    }

    #[test]
    fn async_transfer_is_fup_pgd_then_pge_at_handler() {
        let handler = BASE + 0x4000;
        let mut e = SoftEncoder::new(no_tsc());
        e.step(step(
            BASE,
            2,
            Cofi::Conditional { taken: true },
            BASE + 0x20,
        ));
        // The instruction at BASE + 0x20 faults (or a signal arrives before it).
        e.async_transfer(BASE + 0x20);
        e.step(plain(handler));
        // Back from the handler via rt_sigreturn to the interrupted instruction.
        e.step(step(handler + 1, 2, Cofi::KernelEntry, BASE + 0x20));
        // An asynchronous transfer while already out of context adds nothing.
        e.async_transfer(BASE + 0x20);
        e.step(plain(BASE + 0x20));
        e.flush();
        let got = decode(&e.take_output());
        assert_eq!(
            &got[3..],
            &[
                P::Pge(BASE),
                P::Tnt("T".into()),
                P::Fup(BASE + 0x20),
                P::Pgd(None),
                P::Mode,
                P::Pge(handler),
                P::Pgd(None),
                P::Mode,
                P::Pge(BASE + 0x20),
            ]
        );
    }

    #[test]
    fn disable_and_reenable_restart_with_psb() {
        let mut e = SoftEncoder::new(no_tsc());
        e.step(plain(BASE));
        e.disable(BASE + 1);
        assert!(!e.is_tracing());
        e.step(plain(BASE + 0x80));
        e.finish(Some(BASE + 0x81));
        let got = decode(&e.take_output());
        assert_eq!(
            got,
            vec![
                P::Psb,
                P::PsbEnd,
                P::Mode,
                P::Pge(BASE),
                P::Fup(BASE + 1),
                P::Pgd(None),
                P::Psb,
                P::PsbEnd,
                P::Mode,
                P::Pge(BASE + 0x80),
                P::Fup(BASE + 0x81),
                P::Pgd(None),
            ]
        );
    }

    #[test]
    fn periodic_psb_restates_state_and_resets_ret_stack() {
        let cfg = EncoderConfig {
            psb_period: 64,
            tsc: true,
            ret_compression: true,
            mode_exec_on_every_pge: true,
        };
        let mut e = SoftEncoder::new(cfg);
        let f = BASE + 0x1000;
        e.step(step(BASE, 5, Cofi::DirectCall, f));
        // Enough indirect jumps to pass the PSB period.
        let mut ip = f;
        for i in 0..40u64 {
            let next = f + 0x100 * (i + 1);
            e.step(step(ip, 2, Cofi::IndirectJump, next));
            ip = next;
        }
        // This RET's CALL was before the PSB: it must not be compressed.
        e.step(step(ip, 1, Cofi::Return, BASE + 5));
        e.flush();
        let got = decode(&e.take_output());
        let psbs = got.iter().filter(|p| **p == P::Psb).count();
        assert!(psbs >= 2, "{got:?}");
        assert_eq!(psbs as u64, e.stats().psbs);
        // Each periodic PSB+ is PSB TSC MODE FUP(current IP) PSBEND, and the FUP is the IP of the
        // instruction about to be encoded: the target of the preceding TIP.
        for (i, p) in got.iter().enumerate().skip(1) {
            if *p == P::Psb {
                assert_eq!(got[i + 1], P::Tsc);
                assert_eq!(got[i + 2], P::Mode);
                let P::Fup(fup) = got[i + 3] else {
                    panic!("no FUP in PSB+ at {i}: {got:?}")
                };
                assert_eq!(got[i + 4], P::PsbEnd);
                assert_eq!(got[i - 1], P::Tip(fup));
            }
        }
        assert_eq!(got.last(), Some(&P::Tip(BASE + 5)));
        assert_eq!(e.stats().compressed_rets, 0);
    }

    #[test]
    fn stats_count_bytes_across_takes() {
        let mut e = SoftEncoder::new(EncoderConfig::default());
        e.step(step(BASE, 2, Cofi::IndirectJump, BASE + 0x10));
        let a = e.take_output().len();
        e.step(step(BASE + 0x10, 2, Cofi::IndirectJump, BASE + 0x20));
        let b = e.consume_output(|o| o.len());
        assert_eq!(e.stats().bytes, (a + b) as u64);
        assert_eq!(e.stats().instructions, 2);
    }

    #[test]
    fn block_fast_writes_what_block_writes() {
        // Two encoders fed the same blocks: one always through `block`, the other through
        // `block_fast` where it accepts. Small PSB period, calls and
        // returns to other places, kernel entries and indirect jumps in between.
        let config = EncoderConfig {
            psb_period: 64,
            ..EncoderConfig::default()
        };
        let (mut slow, mut fast) = (SoftEncoder::new(config), SoftEncoder::new(config));
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut calls = Vec::new();
        let mut accepted = 0;
        for i in 0..20_000u64 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let start = 0x40_0000 + (s % 4096) * 16;
            let ip = start + 8;
            let (cofi, next_ip) = match s % 11 {
                0..=3 => (Cofi::Conditional { taken: s & 64 != 0 }, ip + 2),
                4 => (Cofi::None, ip + 2),
                5 => (Cofi::DirectJump, start + 0x100),
                6 => {
                    calls.push(ip + 2);
                    (Cofi::DirectCall, start + 0x200)
                }
                7 | 8 => {
                    // A matching return, or one elsewhere (not compressed).
                    let back = calls.pop().unwrap_or(0x50_0000);
                    (Cofi::Return, if s & 128 != 0 { back } else { back + 4 })
                }
                9 => (Cofi::IndirectJump, start ^ 0x1230),
                _ => (Cofi::KernelEntry, ip + 2),
            };
            let step = Step {
                ip,
                len: 2,
                cofi,
                next_ip,
            };
            let n = 1 + i % 5;
            slow.block(start, n, step);
            if fast.block_fast(n, step) {
                accepted += 1;
            } else {
                fast.block(start, n, step);
            }
        }
        assert!(accepted > 5_000, "fast path taken {accepted} times");
        assert_eq!(fast.pending_tnt(), slow.pending_tnt());
        assert_eq!(fast.stats(), slow.stats());
        assert_eq!(fast.take_output(), slow.take_output());
    }
}
