//! What the past shows at a position: registers (rebuilt from the recorded state, or PC-only
//! with the register files captured at known positions), memory (the recorded state's undo, or
//! immutable code only), and the write-watchpoint searches over the recorded state.

use crate::capture::PastWrite;
use crate::target::{
    Notice, RegMask, StopEvent, TargetError, TargetResult, WatchKind, X86Registers,
};

use super::Timeline;

/// A register file with every value unknown, in the shape of `like` (its XSAVE size and AVX
/// layout, so the `g` reply has the length the target description promises).
pub(super) fn unknown_registers(like: &X86Registers, pc: u64) -> X86Registers {
    let mut r = like.clone();
    r.gprs = [0; crate::target::regs::gpr::COUNT];
    r.xsave.iter_mut().for_each(|b| *b = 0);
    r.set_pc(pc);
    r.unavailable = RegMask::ALL_BUT_PC;
    r
}

impl Timeline {
    /// The register file at position `n` in the past: from the recorded state if the backend
    /// keeps one (the PC checked against the trace), otherwise PC-only (see the module docs).
    pub(super) fn past_registers(&mut self, n: u64) -> TargetResult<X86Registers> {
        if self.is_live_group() {
            let tid = self.tid();
            return self.live_group_registers(tid);
        }
        if !self.has_state_log() {
            return self.pc_only_registers(n);
        }
        if let Some((at, r)) = &self.regs_at
            && *at == n
        {
            return Ok(r.clone());
        }
        let live = self.live_mut()?;
        let present = live.read_registers()?;
        let thread = live.selected_thread();
        // The history is the main thread's: its PCs say nothing of another thread's.
        let history_thread = thread == live.pid();
        let state = live.recorded_state().ok_or(TargetError::Unsupported(
            "registers in the past without a state log",
        ))?;
        let mut r = state
            .registers_at_thread(thread, n, &present)
            .ok_or(TargetError::Unsupported("position beyond the state log"))?;
        if history_thread
            && let Some(ip) = self.insn_ip(n)
            && ip != r.pc()
        {
            self.checks.pc_mismatches += 1;
            // The trace is authoritative for the PC.
            r.set_pc(ip);
        }
        self.regs_at = Some((n, r.clone()));
        Ok(r)
    }

    /// PC-only registers at `n`: a captured register file if one is known there (and agrees
    /// with the trace's PC), else RIP alone.
    pub(super) fn pc_only_registers(&mut self, n: u64) -> TargetResult<X86Registers> {
        let ip = self.insn_ip(n);
        if let Some(snap) = self.snapshots.get(n) {
            // Offline, the position after the last instruction has no trace PC: the saved
            // registers there are all there is.
            let at_end = ip.is_none() && self.live.is_none() && n == self.len();
            if ip == Some(snap.pc()) || at_end {
                return Ok(snap);
            }
            self.checks.snapshot_mismatches += 1;
        }
        match ip {
            Some(pc) => Ok(unknown_registers(&self.template, pc)),
            None => Err(TargetError::Unexpected {
                pid: 0,
                what: format!("instruction {n} is not in the decoded history"),
            }),
        }
    }

    /// Memory in the past at `n`, PC-only: bytes of immutable code (mapped at `n`) from the
    /// image; anything else is refused.
    pub(super) fn pc_only_memory(&self, n: u64, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        // A saved recording's stack, at the end of the history only (where it was read): the
        // frames there unwind as in the live session.
        if self.live.is_none()
            && n == self.end()
            && let Some(info) = self.offline.as_ref()
            && let Some((base, bytes)) = info
                .memory_at_end
                .iter()
                .find(|(b, m)| addr >= *b && addr < b + m.len() as u64)
        {
            let from = (addr - base) as usize;
            let got = buf.len().min(bytes.len() - from);
            buf[..got].copy_from_slice(&bytes[from..from + got]);
            return Ok(got);
        }
        let want = self.immutable.covered(addr, buf.len(), n);
        let got = if want == 0 {
            0
        } else {
            self.present.read(addr, &mut buf[..want])
        };
        if got == 0 {
            return Err(TargetError::Memory { addr });
        }
        Ok(got)
    }

    /// Adds a watchpoint. A write watchpoint with a state log (it alone knows what each
    /// instruction wrote) and a backend that stops at writes while recording is served in the
    /// past and the present; refused while recording is off (an untraced run is not
    /// single-stepped, a write would pass unseen). Without a state log (a PC-only past), a
    /// backend that checks accesses itself in the running program (QEMU's plugin) serves
    /// watchpoints of every kind at the present only; running through the past with them set
    /// adds a notice that they are not checked there. `false`: refused.
    pub fn add_watch(&mut self, addr: u64, len: u64, kind: WatchKind) -> bool {
        if len != 0 && !self.has_state_log() {
            let mut list = self.live_watches.clone();
            list.push((addr, len, kind));
            if self
                .live
                .as_mut()
                .is_some_and(|l| l.set_live_watches(&list))
            {
                self.live_watches = list;
                return true;
            }
            // GDB's own message names hardware limits: say why (shown at the next stop).
            self.notice_once(Notice::WatchRefused {
                backend: self.backend_label(),
            });
        }
        if len == 0 || !self.has_state_log() || !self.record_wanted || kind != WatchKind::Write {
            return false;
        }
        self.watches.push((addr, len));
        let ranges = self.watches.clone();
        if self.live.as_mut().is_some_and(|l| l.set_watches(&ranges)) {
            return true;
        }
        self.watches.pop();
        false
    }

    /// Removes one watchpoint added with the same range and kind; `false` if there was none.
    pub fn remove_watch(&mut self, addr: u64, len: u64, kind: WatchKind) -> bool {
        if let Some(i) = self
            .live_watches
            .iter()
            .position(|&w| w == (addr, len, kind))
        {
            self.live_watches.remove(i);
            let list = self.live_watches.clone();
            if let Some(l) = self.live.as_mut() {
                l.set_live_watches(&list);
            }
            return true;
        }
        if kind != WatchKind::Write {
            return false;
        }
        let Some(i) = self.watches.iter().position(|&w| w == (addr, len)) else {
            return false;
        };
        self.watches.remove(i);
        let ranges = self.watches.clone();
        if let Some(l) = self.live.as_mut() {
            l.set_watches(&ranges);
        }
        true
    }

    /// A run through the PC-only past with watchpoints of the running program set: they are not
    /// checked there (what was written is not known), which a notice at the stop says.
    pub(super) fn note_unchecked_watches(&mut self) {
        // Once per list of watchpoints (GDB inserts them again at every resume).
        if self.live_watches.is_empty() || self.live_watches_noted == self.live_watches {
            return;
        }
        self.live_watches_noted = self.live_watches.clone();
        self.notice_once(Notice::WatchPastUnchecked {
            backend: self.backend_label(),
        });
    }

    /// The capture backend as watchpoint notices name it (`qemu backend`, …), or `offline
    /// replay`.
    fn backend_label(&self) -> String {
        self.live
            .as_ref()
            .map_or("offline replay".to_string(), |l| {
                format!("{} backend", l.name())
            })
    }

    /// Adds `notice` unless the same one is already waiting.
    fn notice_once(&mut self, notice: Notice) {
        if !self.notices.contains(&notice) {
            self.notices.push(notice);
        }
    }

    /// The recorded state's write search, backward: the last write to a watched range between
    /// `floor` and `before` (see [`RecordedState::rfind_write`](crate::capture::RecordedState::rfind_write)).
    pub(super) fn watch_back(&self, before: u64, floor: u64) -> Option<PastWrite> {
        if self.watches.is_empty() {
            return None;
        }
        let log = self.live.as_ref()?.recorded_state()?;
        log.rfind_write(before, floor, &self.watches)
    }

    /// The state log's write search, forward: the first write to a watched range by the
    /// instructions `from..to`.
    pub(super) fn watch_forward(&self, from: u64, to: u64) -> Option<PastWrite> {
        if self.watches.is_empty() {
            return None;
        }
        let log = self.live.as_ref()?.recorded_state()?;
        log.find_write(from, to, &self.watches)
    }

    /// The stop for a write-search hit at position `at`: a watchpoint trigger, or — where the
    /// log does not know what the instruction wrote — a plain trap with a notice saying why
    /// (the past memory the log shows does not change there, so GDB could not see a change).
    pub(super) fn watch_stop(&mut self, hit: PastWrite, at: u64) -> StopEvent {
        match (hit.addr, hit.unknown) {
            (Some(addr), _) => StopEvent::Watch {
                addr,
                kind: WatchKind::Write,
            },
            (None, why) => {
                self.notices.push(Notice::WatchUncertain {
                    position: at,
                    what: why.unwrap_or_else(|| "unknown".into()),
                });
                StopEvent::Signal(libc::SIGTRAP)
            }
        }
    }
}
