//! Watchpoints of a live QEMU session, served by the plugin (QEMU 7.2's user-mode gdbstub has
//! no `Z2`–`Z4`).
//!
//! ptrewind writes the watched ranges into the plugin's shared watch file
//! ([`output::WATCH_FILE`]) at a stop; QEMU's gdbstub drops its translations at every stop, so
//! the blocks run afterwards are translated again with memory callbacks (or, once the list is
//! empty, without them: no cost). An access
//! to a watched range is published by the plugin in the accessing vCPU's hit slot, and the
//! thread sends itself `SIGTRAP`, which QEMU's gdbstub reports in that thread at the end of the
//! translated block the access was in. At that stop ([`QemuLive::take_watch_hit`]) the hit
//! slot of the stopped thread turns the stop into a watchpoint stop of the kind of the
//! watchpoint hit.

use std::os::unix::fs::FileExt;

use super::super::output::{self, watch_gate as w};
use super::QemuLive;
use crate::target::{Notice, WatchKind};

/// The watchpoints of a session and the plugin's watch file.
#[derive(Debug, Default)]
pub(super) struct Watches {
    /// `(addr, len, kind)`, as the debugger inserted them.
    list: Vec<(u64, u64, WatchKind)>,
    file: Option<std::fs::File>,
    /// Notices for the debugger (where a watchpoint stop landed), taken at the stop.
    pub(super) notices: Vec<Notice>,
    /// A watchpoint was set once (the plugin may have published hits).
    ever: bool,
}

/// The plugin's kind bits of a watchpoint kind.
fn kind_bits(kind: WatchKind) -> u64 {
    match kind {
        WatchKind::Write => w::WRITE,
        WatchKind::Read => w::READ,
        WatchKind::Access => w::WRITE | w::READ,
    }
}

impl QemuLive {
    /// The plugin's watch file, opened once.
    fn watch_file(&mut self) -> Result<&std::fs::File, String> {
        if self.watches.file.is_none() {
            let path = self.rec.dir().join(output::WATCH_FILE);
            let f = std::fs::File::options()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| format!("no watch gate ({}): {e}", path.display()))?;
            self.watches.file = Some(f);
        }
        self.watches
            .file
            .as_ref()
            .ok_or_else(|| "no watch gate".to_string())
    }

    /// Sets the watchpoints for the running program (at a stop): tells the plugin. `false` (nothing changed) if the plugin cannot take them: too
    /// many, no watch file, or the program is held at its exit (the stub cannot answer there).
    pub(super) fn set_plugin_watches(&mut self, list: &[(u64, u64, WatchKind)]) -> bool {
        if list.len() > w::MAX_WATCHES || self.at_exit.is_some() || self.exited {
            return false;
        }
        let mut words = Vec::with_capacity(3 * w::MAX_WATCHES);
        for &(addr, len, kind) in list {
            words.extend([addr, len, kind_bits(kind)]);
        }
        words.resize(3 * w::MAX_WATCHES, 0);
        let bytes = |ws: &[u64]| -> Vec<u8> { ws.iter().flat_map(|x| x.to_ne_bytes()).collect() };
        let written = self.watch_file().and_then(|f| {
            // The count last: the plugin reads it first.
            f.write_all_at(&bytes(&[0]), 0)
                .and_then(|()| f.write_all_at(&bytes(&words), (w::WATCHES * 8) as u64))
                .and_then(|()| f.write_all_at(&bytes(&[list.len() as u64]), 0))
                .map_err(|e| format!("watch gate: {e}"))
        });
        if let Err(e) = written {
            self.stop_errors.push(e);
            return false;
        }
        // No flush is needed: QEMU's user-mode gdbstub drops every translated block at each
        // stop (`gdb_handlesig`: `tb_flush`, run when the program resumes), and watchpoints
        // are only set at a stop, so every block runs translated again with the new list.
        self.watches.list = list.to_vec();
        self.watches.ever |= !list.is_empty();
        true
    }

    /// Tells the plugin which thread a single step runs (`0`: none): the other threads' hits
    /// wait until the program is continued (they are let out of their blocks in pulses during a
    /// step). Nothing to tell before the first watchpoint.
    pub(super) fn publish_step(&mut self, tid: u32) {
        if !self.watches.ever {
            return;
        }
        let written = self.watch_file().and_then(|f| {
            f.write_all_at(&u64::from(tid).to_ne_bytes(), (w::STEP * 8) as u64)
                .map_err(|e| format!("watch gate: {e}"))
        });
        if let Err(e) = written {
            self.stop_errors.push(e);
        }
    }

    /// The watchpoint hit thread `tid` reported at its stop at `pc`, if any (cleared: each hit
    /// is reported once): the lowest watched address accessed and the kind of the watchpoint
    /// hit. When the stop is not right after the accessing instruction (it ends the translated
    /// block), a notice says which instruction it was.
    pub(super) fn take_watch_hit(&mut self, tid: i64, pc: u64) -> Option<(u64, WatchKind)> {
        let (addr, kind, insn) = self.read_watch_hit(tid)?;
        let bytes = self.remote.read_memory(insn, 15).unwrap_or_default();
        let next = crate::capture::soft::classify::decode_insn(insn, &bytes)
            .map(|d| insn + d.insn.len() as u64);
        if next != Some(pc) {
            self.watches
                .notices
                .push(Notice::WatchStopAfterBlock { insn, stop: pc });
        }
        Some((addr, kind))
    }

    /// [`take_watch_hit`](Self::take_watch_hit)'s hit slot: address, kind, the accessing
    /// instruction.
    fn read_watch_hit(&mut self, tid: i64) -> Option<(u64, WatchKind, u64)> {
        // Once any watchpoint was set, a hit is taken even if the list is empty now (GDB
        // removes its watchpoints at every stop, and a second thread's stop reply may be
        // handled after that): a hit left in its slot would hide that thread's next hits.
        if !self.watches.ever {
            return None;
        }
        let tid = u64::try_from(tid).ok()?;
        let f = self.watch_file().ok()?;
        let mut raw = vec![0u8; w::HIT_WORDS * w::MAX_SLOTS * 8];
        f.read_exact_at(&mut raw, (w::HITS * 8) as u64).ok()?;
        let word =
            |i: usize| u64::from_ne_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let slot = (0..w::MAX_SLOTS).find(|&s| word(w::HIT_WORDS * s) == tid)?;
        let (addr, access) = (word(w::HIT_WORDS * slot + 1), word(w::HIT_WORDS * slot + 2));
        let insn = word(w::HIT_WORDS * slot + 3);
        let at = ((w::HITS + w::HIT_WORDS * slot) * 8) as u64;
        let _ = f.write_all_at(&0u64.to_ne_bytes(), at);
        // The watchpoint hit: the one containing the address whose kind includes the access
        // (a write to an `awatch`ed location is an access stop, to a `watch`ed one a write).
        let kind = self
            .watches
            .list
            .iter()
            .find(|&&(a, len, k)| {
                addr >= a && addr < a.saturating_add(len) && kind_bits(k) & access != 0
            })
            .map_or(
                if access == w::READ {
                    WatchKind::Read
                } else {
                    WatchKind::Write
                },
                |&(_, _, k)| k,
            );
        Some((addr, kind, insn))
    }
}
