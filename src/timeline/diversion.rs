//! Function calls made by the debugger at the present, run outside the recording (see
//! [`Diversion`]).

use super::Timeline;
use crate::target::X86Registers;

/// A function call made by the debugger (GDB's `print f(1)`, LLDB's `expression f(1)`): the
/// debugger sets the registers to call the function with a return address where it puts a
/// breakpoint (GDB: on the stack, LLDB: the program's entry point), continues, and restores
/// the registers when that breakpoint is hit. Such a run is not the program's: it runs untraced (nothing enters
/// the trace or the state log, the history keeps its length), and the stack below the stack
/// pointer it used is put back when the registers come back, so the past reads as before.
/// Writes the called function makes elsewhere (globals, heap) stay, as in a native session,
/// and are not in the state log.
#[derive(Debug, Clone)]
pub(super) struct Diversion {
    /// The registers before the call; their return ends the diversion.
    pub(super) saved: X86Registers,
    /// The stack below the saved stack pointer, as it was: `(address, bytes)`.
    pub(super) stack: (u64, Vec<u8>),
}

/// How much of the stack below the stack pointer a diversion saves and puts back.
const DIVERSION_STACK: u64 = 64 << 10;

impl Timeline {
    /// At a resume of the live process: true (and a diversion starts) if the debugger set up
    /// a function call since the last stop — the PC changed, and a breakpoint is at the
    /// return address on the stack. A second resume inside a diversion (the called
    /// function stopped at a user breakpoint and the user continued) ends it: recording
    /// goes on from there.
    pub(super) fn divert_if_called(&mut self) -> bool {
        if self.diversion.is_some() {
            self.end_diversion();
            return false;
        }
        let Some(saved) = self.regs_before_write.take() else {
            return false;
        };
        let Some(live) = self.live.as_mut() else {
            return false;
        };
        let Ok(now) = live.read_registers() else {
            return false;
        };
        let mut ret = [0u8; 8];
        if !matches!(
            live.read_memory(now.gprs[crate::target::regs::gpr::RSP], &mut ret),
            Ok(8)
        ) {
            return false;
        }
        let ret = u64::from_le_bytes(ret);
        // GDB returns to a breakpoint it puts on the stack (x86-64 Linux), LLDB to one at the
        // program's entry point: either way a breakpoint at the return address, and a PC that
        // the debugger moved.
        if now.pc() == saved.pc() || !self.bps.contains(&ret) {
            return false;
        }
        let sp = saved.gprs[crate::target::regs::gpr::RSP];
        let low = sp.saturating_sub(DIVERSION_STACK);
        let mut stack = vec![0u8; (sp - low) as usize];
        let got = live.read_memory(low, &mut stack).unwrap_or(0);
        // Keep the part next to the stack pointer that could be read.
        let keep = stack.split_off(stack.len() - got.min(stack.len()));
        let _ = stack;
        let start = sp - keep.len() as u64;
        self.diversion = Some(Diversion {
            saved,
            stack: (start, keep),
        });
        self.diversions += 1;
        true
    }

    /// Ends the diversion: the stack below the saved stack pointer is put back, and the
    /// registers of this position are the saved ones again (a stop inside the call keyed its
    /// own there).
    pub(super) fn end_diversion(&mut self) {
        let Some(d) = self.diversion.take() else {
            return;
        };
        if let Some(live) = self.live.as_mut() {
            let _ = live.write_memory(d.stack.0, &d.stack.1);
        }
        let n = self.len();
        self.pending_snapshot = None;
        self.snapshots.insert(n, d.saved);
        self.regs_at = None;
    }
}
