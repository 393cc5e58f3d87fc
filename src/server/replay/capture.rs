//! What the reverse-execution core ([`Recorder`](super::Recorder)) needs from a live capture
//! backend, as one small trait ([`LiveCapture`]), and the helpers every backend shares: putting
//! drained bytes into the [`TraceStore`] and knowing which code cannot have changed.
//!
//! A backend provides the live process (a [`PtraceTarget`]), a trace store the history is
//! indexed from, forward execution (traced or not) and, optionally, state beyond the PC at past
//! positions (the software backend's [`StateLog`]). Everything else — the cursor, `bs`/`bc`,
//! breakpoints, replaying forward, the hand-over to the live process at the present, the monitor
//! commands — is the core's and the same for every backend.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;

use crate::capture::soft::{Regs, StateLog};
use crate::flow::FlowConfig;
use crate::ring::{Drain, DrainReport, OutputState, Run};
use crate::store::live::TraceStore;
use crate::target::{PtraceTarget, Resume, StopEvent, TargetResult};

/// A live process recorded by a capture backend (software single-stepping or hardware Intel
/// PT), as the reverse-execution core drives it.
pub trait LiveCapture {
    /// The backend, as `monitor stats` names it.
    fn backend(&self) -> &'static str;

    /// Whether the trace comes from the CPU (decoders then apply the host CPU's errata) rather
    /// than from the software encoder.
    fn is_hardware(&self) -> bool {
        false
    }

    /// How the trace is decoded (a hardware trace: with the errata of the CPU it runs on).
    fn flow_config(&self) -> FlowConfig {
        FlowConfig::default()
    }

    /// The live process: registers, memory and INT3 breakpoints at the present.
    fn ptrace(&mut self) -> &mut PtraceTarget;

    /// The store the trace is drained into (a shared handle).
    fn store(&self) -> TraceStore;

    /// Instructions the backend itself counted while recording, to check the decoded history
    /// against; `None` when it cannot count them (hardware: only the trace knows).
    fn recorded(&self) -> Option<u64>;

    /// Registers and overwritten memory of every recorded instruction, if the backend keeps
    /// them (the software backend's state log). Without it, the past is served PC-only.
    fn state_log(&self) -> Option<&StateLog> {
        None
    }

    /// The general-purpose registers at the present.
    fn present_gprs(&mut self) -> TargetResult<Regs>;

    /// Write watchpoints for forward runs from the present: `[addr, addr + len)` ranges the
    /// backend stops after a write to ([`StopEvent::Watch`]). Returns `false` when it cannot
    /// see writes (the core then refuses watchpoints: a run that never stops would be wrong).
    fn set_watches(&mut self, _ranges: &[(u64, u64)]) -> bool {
        false
    }

    /// Starts a forward run from the present; `record`: whether it is traced. Breakpoints are
    /// the ones in the ptrace target (INT3) for a run at full speed, or `bps` given to
    /// [`wait`](Self::wait) for a backend that stops after every instruction.
    fn resume(&mut self, how: Resume, record: bool) -> TargetResult<()>;

    /// Runs the forward run on until it stops (`Ok(None)`: still running, after a slice when
    /// `block` is false). `interrupt` is set when GDB asked for a stop.
    fn wait(
        &mut self,
        block: bool,
        bps: &BTreeSet<u64>,
        interrupt: &AtomicBool,
    ) -> TargetResult<Option<StopEvent>>;

    /// Interrupts a run at full speed (the software backend's stepping loop checks the flag
    /// itself).
    fn interrupt(&mut self) -> TargetResult<()>;

    /// Called at every stop: makes the store hold the trace of everything executed up to the
    /// stop PC (closing the trace there, draining buffers). `Err` says why the trace may be
    /// incomplete (it is shown by `monitor stats`).
    fn sync_at_stop(&mut self, exited: bool) -> Result<(), String>;

    /// Backend-specific `monitor stats` lines (`line(key, value)`).
    fn stats(&self, line: &mut dyn FnMut(&str, String));
}

/// Appends `bytes`, which directly follow what `store` holds, as one drain (the hardware
/// backend's AUX copies, a trace file for offline replay).
pub fn append_bytes(store: &TraceStore, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    // The stream end is everything stored plus everything accounted as lost.
    let start = store.len() as u64 + store.lost();
    let len = bytes.len();
    store.append(&Drain {
        data: bytes.to_vec(),
        runs: vec![Run {
            stream_offset: start,
            data_offset: 0,
            len,
        }],
        report: DrainReport {
            start,
            end: start + len as u64,
            present: len as u64,
            overwritten: 0,
            dropped: 0,
            state: OutputState::Tracing,
        },
    });
}

/// Address ranges whose bytes cannot have changed while they were mapped: mappings that are
/// executable, not writable and backed by a file (or the `[vdso]`), each with the first history
/// position it was mapped at. A read of the past inside them is served from the code image;
/// anything else is refused without a state log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImmutableCode {
    /// `(start, end, mapped from position)`, sorted.
    ranges: Vec<(u64, u64, u64)>,
}

impl ImmutableCode {
    /// From `/proc/PID/maps` lines (`start-end perms offset dev inode path`).
    pub fn from_maps(text: &str) -> Self {
        let mut ranges = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(range), Some(perms)) = (f.first(), f.get(1)) else {
                continue;
            };
            let path = f.get(5).copied().unwrap_or("");
            let p = perms.as_bytes();
            let fixed = p.len() >= 3 && p[0] == b'r' && p[1] != b'w' && p[2] == b'x';
            if !fixed || !(path.starts_with('/') || path == "[vdso]") {
                continue;
            }
            let Some((a, b)) = range.split_once('-') else {
                continue;
            };
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                ranges.push((a, b));
            }
        }
        ImmutableCode::from_ranges(ranges)
    }

    /// From explicit `[start, end)` ranges, mapped since position 0.
    pub fn from_ranges(ranges: Vec<(u64, u64)>) -> Self {
        let mut ranges: Vec<(u64, u64, u64)> = ranges
            .into_iter()
            .filter(|&(a, b)| a < b)
            .map(|(a, b)| (a, b, 0))
            .collect();
        ranges.sort_unstable();
        ImmutableCode { ranges }
    }

    /// The mappings changed at history position `at`: ranges of `now` that were mapped before
    /// keep their position, new ones are valid from `at` on, unmapped ones are dropped (the
    /// image no longer has their bytes).
    pub fn remapped(&self, now: ImmutableCode, at: u64) -> ImmutableCode {
        let ranges = now
            .ranges
            .into_iter()
            .map(|(a, b, _)| {
                let from = self
                    .ranges
                    .iter()
                    .find(|&&(x, y, _)| x == a && y == b)
                    .map_or(at, |&(_, _, f)| f);
                (a, b, from)
            })
            .collect();
        ImmutableCode { ranges }
    }

    /// How many bytes from `addr` on (at most `len`) lie in one range that was mapped at
    /// history position `pos`.
    pub fn covered(&self, addr: u64, len: usize, pos: u64) -> usize {
        self.ranges
            .iter()
            .find(|&&(a, b, from)| addr >= a && addr < b && from <= pos)
            .map_or(0, |&(_, b, _)| (b - addr).min(len as u64) as usize)
    }

    /// The ranges `(start, end, mapped from position)`, sorted.
    pub fn ranges(&self) -> &[(u64, u64, u64)] {
        &self.ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immutable_code_is_read_only_file_backed_executable() {
        let maps = "00400000-00401000 r-xp 00000000 fd:01 12 /bin/loopy\n\
                    00600000-00601000 rwxp 00000000 fd:01 12 /bin/loopy\n\
                    7f0000000000-7f0000001000 r-xp 00000000 00:00 0\n\
                    7ffff7fc1000-7ffff7fc3000 r-xp 00000000 00:00 0 [vdso]\n\
                    7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]\n";
        let c = ImmutableCode::from_maps(maps);
        assert_eq!(
            c.ranges(),
            &[(0x400000, 0x401000, 0), (0x7ffff7fc1000, 0x7ffff7fc3000, 0)]
        );
        assert_eq!(c.covered(0x400ff8, 16, 0), 8);
        assert_eq!(c.covered(0x400000, 16, 0), 16);
        assert_eq!(c.covered(0x600000, 8, 0), 0);
        assert_eq!(c.covered(0x7f0000000000, 8, 0), 0);
        assert_eq!(c.covered(0x7ffffffde000, 8, 0), 0);
        // A library mapped at position 100 (and the vdso unmapped): its code is no answer for
        // a read before 100.
        let later = c.remapped(
            ImmutableCode::from_maps(
                "00400000-00401000 r-xp 00000000 fd:01 12 /bin/loopy\n\
                 7f0000100000-7f0000200000 r-xp 00000000 fd:01 13 /lib/libx.so\n",
            ),
            100,
        );
        assert_eq!(
            later.ranges(),
            &[
                (0x400000, 0x401000, 0),
                (0x7f0000100000, 0x7f0000200000, 100)
            ]
        );
        assert_eq!(later.covered(0x7f0000100000, 4, 99), 0);
        assert_eq!(later.covered(0x7f0000100000, 4, 100), 4);
        assert_eq!(later.covered(0x400000, 4, 0), 4);
    }

    #[test]
    fn appended_bytes_follow_the_stream() {
        let store = TraceStore::new();
        append_bytes(&store, &[1, 2, 3]);
        append_bytes(&store, &[]);
        append_bytes(&store, &[4]);
        assert_eq!(store.to_vec(), vec![1, 2, 3, 4]);
        assert_eq!(store.lost(), 0);
        assert!(store.gaps().is_empty());
    }
}
