//! What the plugin keeps per translated block: where it starts and ends, and what its last
//! instruction is, classified with the flow decoder's own classes (so the encoder and the decoder
//! agree on which instruction reports what).

use std::sync::atomic::{AtomicU64, Ordering};

use iced_x86::{Code, Mnemonic, OpKind};

use crate::capture::soft::classify::decode_insn;
use crate::flow::InsnClass;

/// One translated block (a QEMU TB): a straight run of instructions whose last one alone may
/// change the flow. Blocks that end without a branch (a page boundary, QEMU's size cap, an
/// instruction that ends translation) have a fall-through last instruction.
#[derive(Debug)]
pub struct BlockInfo {
    /// Address of the first instruction.
    pub start: u64,
    /// Address after the last instruction (the fall-through successor).
    pub fallthrough: u64,
    /// Number of instructions.
    pub insns: u32,
    /// Address of the last instruction.
    pub last_ip: u64,
    /// Length of the last instruction.
    pub last_len: u8,
    /// Class of the last instruction ([`InsnClass::Other`] when its bytes do not decode: it
    /// raises #UD, which QEMU turns into SIGILL).
    pub class: InsnClass,
    /// The direct target of a conditional branch, direct jump or direct call.
    pub target: Option<u64>,
    /// Whether the last instruction can fault (memory or stack access, division, #UD, ...):
    /// decides a block interrupted with its last instruction reached.
    pub last_can_fault: bool,
    /// Offset from `start` of every instruction after the first (instruction `i + 1` is at
    /// `start + offsets[i]`): where a block cut short stopped.
    pub offsets: Box<[u32]>,
    /// The precise-mode counter: QEMU adds 1 to it before each instruction after the first
    /// (an inline operation in the translated code), so its growth during one execution is the
    /// index of the last instruction reached.
    reached: AtomicU64,
    /// The counter in a shared file instead (see [`BlockInfo::with_shared_counter`]), and its
    /// index there.
    shared: Option<(&'static AtomicU64, u64)>,
}

impl BlockInfo {
    /// Builds the information of a block from its instruction addresses (`insn_ips`, in order,
    /// at least one) and the bytes of its last instruction.
    pub fn new(insn_ips: &[u64], last_bytes: &[u8]) -> Option<BlockInfo> {
        let (&start, _) = insn_ips.split_first()?;
        let last_ip = *insn_ips.last()?;
        let decoded = decode_insn(last_ip, last_bytes);
        let last_len = match &decoded {
            Some(d) => d.len(),
            None => last_bytes.len().clamp(1, 15) as u8,
        };
        let (class, target, last_can_fault) = match &decoded {
            Some(d) => {
                let target = d
                    .class
                    .has_direct_target()
                    .then(|| d.insn.near_branch_target());
                (d.class, target, can_fault(&d.insn))
            }
            None => (InsnClass::Other, None, true),
        };
        let offsets = insn_ips[1..]
            .iter()
            .map(|ip| ip.wrapping_sub(start) as u32)
            .collect();
        Some(BlockInfo {
            start,
            fallthrough: last_ip + u64::from(last_len),
            insns: insn_ips.len() as u32,
            last_ip,
            last_len,
            class,
            target,
            last_can_fault,
            offsets,
            reached: AtomicU64::new(0),
            shared: None,
        })
    }

    /// Address of instruction `i` (0-based).
    pub fn insn_ip(&self, i: u32) -> u64 {
        match i {
            0 => self.start,
            i => self.start + u64::from(self.offsets[i as usize - 1]),
        }
    }

    /// The index of the instruction at `ip`, if one of this block's starts there.
    pub fn index_of(&self, ip: u64) -> Option<u32> {
        if ip == self.start {
            return Some(0);
        }
        let off = ip.checked_sub(self.start)?;
        let off = u32::try_from(off).ok()?;
        self.offsets.binary_search(&off).ok().map(|i| i as u32 + 1)
    }

    /// Uses `counter` (slot `index` of the recording's shared counter file) instead of the
    /// block's own: it outlives the QEMU process, so a reader can still tell how far the last
    /// block of a thread got when QEMU dies without a word (a fatal signal, SIGKILL).
    pub fn with_shared_counter(mut self, counter: &'static AtomicU64, index: u64) -> Self {
        self.shared = Some((counter, index));
        self
    }

    /// Index of the counter in the shared counter file, if it is there.
    #[inline]
    pub fn counter_index(&self) -> Option<u64> {
        self.shared.map(|(_, i)| i)
    }

    #[inline]
    fn counter(&self) -> &AtomicU64 {
        match self.shared {
            Some((c, _)) => c,
            None => &self.reached,
        }
    }

    /// The counter QEMU's inline operations add to (see [`BlockInfo::reached_counter`]).
    #[inline]
    pub fn reached(&self) -> u64 {
        self.counter().load(Ordering::Relaxed)
    }

    /// Where QEMU's inline `ADD_U64` operations write. The translated code updates it without
    /// atomicity: exact for one thread, a lower-quality hint when threads run the same block at
    /// once (the tracer checks the value is in range).
    pub fn reached_counter(&self) -> *mut u64 {
        self.counter().as_ptr()
    }

    /// Simulates QEMU's inline operations (tests): instruction `i` of this block was reached.
    pub fn note_reached(&self, insns_after_first: u64) {
        self.counter()
            .fetch_add(insns_after_first, Ordering::Relaxed);
    }
}

/// Whether an instruction can raise a synchronous exception in user mode: it touches memory
/// (explicitly or through the stack), divides, is undefined or privileged, or traps on purpose.
pub fn can_fault(insn: &iced_x86::Instruction) -> bool {
    if (0..insn.op_count()).any(|i| {
        matches!(
            insn.op_kind(i),
            OpKind::Memory
                | OpKind::MemorySegSI
                | OpKind::MemorySegESI
                | OpKind::MemorySegRSI
                | OpKind::MemorySegDI
                | OpKind::MemorySegEDI
                | OpKind::MemorySegRDI
                | OpKind::MemoryESDI
                | OpKind::MemoryESEDI
                | OpKind::MemoryESRDI
        )
    }) || insn.stack_pointer_increment() != 0
    {
        return true;
    }
    matches!(insn.code(), Code::Ud2 | Code::Ud0 | Code::INVALID)
        || matches!(
            insn.mnemonic(),
            Mnemonic::Div
                | Mnemonic::Idiv
                | Mnemonic::Ud1
                | Mnemonic::Hlt
                | Mnemonic::In
                | Mnemonic::Out
                | Mnemonic::Insb
                | Mnemonic::Insw
                | Mnemonic::Insd
                | Mnemonic::Outsb
                | Mnemonic::Outsw
                | Mnemonic::Outsd
                | Mnemonic::Cli
                | Mnemonic::Sti
                | Mnemonic::Int
                | Mnemonic::Int1
                | Mnemonic::Int3
                | Mnemonic::Into
                | Mnemonic::Bound
                | Mnemonic::Rdmsr
                | Mnemonic::Wrmsr
                | Mnemonic::Lgdt
                | Mnemonic::Lidt
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_classification() {
        // nop; nop; je +5 at 0x1002
        let b = BlockInfo::new(&[0x1000, 0x1001, 0x1002], &[0x74, 0x05]).expect("block");
        assert_eq!(b.class, InsnClass::CondBranch);
        assert_eq!(b.target, Some(0x1009));
        assert_eq!(b.fallthrough, 0x1004);
        assert_eq!(b.insns, 3);
        assert_eq!(b.insn_ip(2), 0x1002);
        assert_eq!(b.index_of(0x1001), Some(1));
        assert_eq!(b.index_of(0x1003), None);
        assert!(!b.last_can_fault);
        // mov [rax], ecx at the end of a block cut at a page boundary: fall-through, can fault.
        let b = BlockInfo::new(&[0x2ffe], &[0x89, 0x08]).expect("block");
        assert_eq!(b.class, InsnClass::Other);
        assert!(b.last_can_fault);
        assert_eq!(b.fallthrough, 0x3000);
        // ret / call rel32 / syscall / undecodable bytes.
        assert_eq!(
            BlockInfo::new(&[0x10], &[0xc3]).expect("ret").class,
            InsnClass::Return
        );
        let call = BlockInfo::new(&[0x10], &[0xe8, 0x10, 0, 0, 0]).expect("call");
        assert_eq!(
            (call.class, call.target),
            (InsnClass::DirectCall, Some(0x25))
        );
        assert_eq!(
            BlockInfo::new(&[0x10], &[0x0f, 0x05])
                .expect("syscall")
                .class,
            InsnClass::SysCall
        );
        let bad = BlockInfo::new(&[0x10], &[0x0f, 0xff]).expect("ud");
        assert!(bad.last_can_fault);
    }
}
