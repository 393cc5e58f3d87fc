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
//! * SYSCALL/SYSENTER leave the traced context: TIP.PGD with the IP suppressed. The first
//!   instruction seen back in user space is announced with TIP.PGE (preceded by MODE.Exec only when
//!   the mode changed or a PSB intervened, as the hardware does);
//! * asynchronous transfers seen from user space (signal delivery, and the kernel entry that
//!   precedes it) are FUP(NLIP of the interrupted flow) + TIP.PGD(suppressed), then TIP.PGE at the
//!   handler — the user-only sequence of SDM Table 36-50;
//! * every `psb_period` bytes, at an instruction boundary, PSB+ restates the state: [TSC],
//!   MODE.Exec, FUP(current IP), PSBEND; Last IP and the return stack restart from empty.
//!
//! The encoder only appends bytes to an internal buffer; the recorder moves them into the output
//! ring (ToPA model) with [`SoftEncoder::take_output`].

use crate::packet::{Encoder, IpKind, Packet, encode_packet};

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
    /// Far JMP/CALL/RET, IRET and other far transfers that stay in user space: TIP.
    FarTransfer,
    /// SYSCALL, SYSENTER, INT n and anything else that enters the kernel synchronously: the flow
    /// leaves the traced context (TIP.PGD, IP suppressed).
    KernelEntry,
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
    /// The address execution continued at in user space (for [`Cofi::KernelEntry`], where the
    /// kernel returned to, which is normally the NLIP).
    pub next_ip: u64,
}

/// Encoder settings, mirroring the `IA32_RTIT_CTL` bits that shape the packet stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderConfig {
    /// RET compression (`DisRETC = 0`).
    pub ret_compression: bool,
    /// Approximate bytes between PSB+ (the hardware's `PSBFreq`: 2^(n+11) bytes).
    pub psb_period: usize,
    /// Emit a TSC packet in each PSB+ and at enables (`TSCEn`).
    pub tsc: bool,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        EncoderConfig {
            ret_compression: true,
            psb_period: 4096,
            tsc: true,
        }
    }
}

/// Capacity of the processor's RET-compression stack (SDM: at least 64 entries).
const RET_STACK_DEPTH: usize = 64;

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
        let ip = self.peek()?;
        self.top = (self.top + RET_STACK_DEPTH - 1) % RET_STACK_DEPTH;
        self.len -= 1;
        Some(ip)
    }
}

/// Whether packet generation is on, from the encoder's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enable {
    /// Tracing is off (before the first step, or after [`SoftEncoder::disable`]).
    Off,
    /// Tracing is on and the last emitted packets describe the flow up to `next`.
    On,
    /// The flow left user space (kernel entry or asynchronous event); the next step is announced
    /// with TIP.PGE.
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
    /// The mode was restated (PSB+) or changed since the last TIP.PGE: emit MODE.Exec before it.
    mode_pending: bool,
    since_psb: usize,
    tsc: u64,
    /// Bytes handed out by `take_output` so far.
    taken: u64,
    stats: EncoderStats,
}

impl SoftEncoder {
    /// An encoder with tracing off; the first [`step`](Self::step) enables it.
    pub fn new(config: EncoderConfig) -> Self {
        SoftEncoder {
            config,
            packets: Encoder::new(),
            out: Vec::with_capacity(64 * 1024),
            tnt_bits: 0,
            tnt_count: 0,
            ret_stack: RetStack::new(),
            state: Enable::Off,
            mode_pending: true,
            since_psb: 0,
            tsc: 0,
            taken: 0,
            stats: EncoderStats::default(),
        }
    }

    /// Sets the time-stamp counter value used by the next TSC packet (the recorder's clock).
    pub fn set_tsc(&mut self, tsc: u64) {
        self.tsc = tsc & ((1 << 56) - 1);
    }

    /// Encodes one executed instruction.
    pub fn step(&mut self, step: Step) {
        match self.state {
            Enable::Off => self.enable_at(step.ip, true),
            Enable::Paused => self.enable_at(step.ip, false),
            Enable::On => {
                if self.since_psb >= self.config.psb_period {
                    self.psb_plus(Some(step.ip));
                }
            }
        }
        self.stats.instructions += 1;
        let nlip = step.ip.wrapping_add(u64::from(step.len));
        match step.cofi {
            Cofi::None | Cofi::DirectJump => {}
            Cofi::Conditional { taken } => self.tnt(taken),
            Cofi::DirectCall => {
                // A zero-length CALL (target == NLIP) is a way to read RIP, not a call: not pushed.
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
                let top = self.ret_stack.pop();
                if self.config.ret_compression && top == Some(step.next_ip) {
                    self.stats.compressed_rets += 1;
                    self.tnt(true);
                } else {
                    self.tip(IpKind::Tip, Some(step.next_ip));
                }
            }
            Cofi::KernelEntry => {
                self.tip(IpKind::TipPgd, None);
                self.state = Enable::Paused;
            }
        }
    }

    /// An asynchronous transfer seen from user space (signal delivery, or any kernel entry not
    /// caused by the instruction itself): `resume_ip` is the instruction that would have executed
    /// next; the next [`step`](Self::step) (the handler) is announced with TIP.PGE.
    pub fn async_transfer(&mut self, resume_ip: u64) {
        if self.state != Enable::On {
            return;
        }
        self.flush_tnt();
        self.ip_packet(IpKind::Fup, Some(resume_ip));
        self.ip_packet(IpKind::TipPgd, None);
        self.state = Enable::Paused;
        self.account();
    }

    /// Turns tracing off before the instruction at `ip` (like a WRMSR clearing TraceEn):
    /// FUP(ip) + TIP.PGD(suppressed). Recording resumes with TIP.PGE at the next step.
    pub fn disable(&mut self, ip: u64) {
        if self.state == Enable::On {
            self.async_transfer(ip);
        }
        self.state = Enable::Off;
    }

    /// Flushes pending TNT bits so that everything encoded so far is in the output.
    pub fn flush(&mut self) {
        self.flush_tnt();
        self.account();
    }

    /// Takes the bytes produced since the last call.
    pub fn take_output(&mut self) -> Vec<u8> {
        self.taken += self.out.len() as u64;
        std::mem::replace(&mut self.out, Vec::with_capacity(64 * 1024))
    }

    /// Bytes produced but not yet taken.
    pub fn pending_output(&self) -> &[u8] {
        &self.out
    }

    /// What the encoder has produced so far.
    pub fn stats(&self) -> EncoderStats {
        self.stats
    }

    fn enable_at(&mut self, ip: u64, fresh: bool) {
        if fresh {
            // Tracing begins: PSB+ without FUP (PacketEn is still 0), then MODE.Exec + TIP.PGE.
            self.psb_plus(None);
        }
        if self.mode_pending {
            self.put(&Packet::ModeExec {
                csl: true,
                csd: false,
                iflag: false,
            });
            self.mode_pending = false;
        }
        if self.config.tsc && !fresh {
            self.put(&Packet::Tsc { tsc: self.tsc });
        }
        self.ip_packet(IpKind::TipPge, Some(ip));
        self.state = Enable::On;
        self.account();
    }

    fn psb_plus(&mut self, current_ip: Option<u64>) {
        self.flush_tnt();
        self.packets.psb(&mut self.out);
        self.ret_stack.clear();
        if self.config.tsc {
            self.put(&Packet::Tsc { tsc: self.tsc });
        }
        if let Some(ip) = current_ip {
            self.put(&Packet::ModeExec {
                csl: true,
                csd: false,
                iflag: false,
            });
            self.ip_packet(IpKind::Fup, Some(ip));
        } else {
            // Without PacketEn, PSB+ carries no MODE.Exec: the next TIP.PGE must restate it.
            self.mode_pending = true;
        }
        self.put(&Packet::PsbEnd);
        self.stats.psbs += 1;
        self.since_psb = 0;
        self.account();
    }

    fn tnt(&mut self, taken: bool) {
        self.tnt_bits = (self.tnt_bits << 1) | u64::from(taken);
        self.tnt_count += 1;
        if self.tnt_count == 6 {
            self.flush_tnt();
        }
    }

    fn flush_tnt(&mut self) {
        if self.tnt_count == 0 {
            return;
        }
        let tnt = crate::packet::Tnt {
            bits: self.tnt_bits,
            count: self.tnt_count,
        };
        self.tnt_bits = 0;
        self.tnt_count = 0;
        self.put(&Packet::ShortTnt(tnt));
    }

    fn tip(&mut self, kind: IpKind, ip: Option<u64>) {
        self.flush_tnt();
        self.ip_packet(kind, ip);
    }

    fn ip_packet(&mut self, kind: IpKind, ip: Option<u64>) {
        // Cannot fail: the encoder picks a compression valid against its own Last IP.
        let written = self.packets.ip_packet(kind, ip, &mut self.out);
        debug_assert!(written.is_ok(), "unencodable {kind:?} {ip:?}");
        self.account();
    }

    fn put(&mut self, packet: &Packet) {
        // Every packet built here is valid by construction (TNT counts 1..=6, 56-bit TSC).
        let written = encode_packet(packet, &mut self.out);
        debug_assert!(written.is_ok(), "unencodable {packet:?}");
        self.account();
    }

    /// Keeps the byte counters in step with the output buffer.
    fn account(&mut self) {
        let total = self.taken + self.out.len() as u64;
        self.since_psb += (total - self.stats.bytes) as usize;
        self.stats.bytes = total;
    }
}
