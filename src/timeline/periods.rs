//! Periods of code: a history that crosses an `execve` ran several programs, often at the same
//! addresses (two non-PIE executables, or PIE at the same base with ASLR off), and a `munmap` or
//! `mmap(MAP_FIXED)` over code (a JIT, `dlclose` + `dlopen`) lets other code appear at the same
//! addresses. Each period of the history is decoded against its own code
//! ([`Image::push_period`]: the image is the first period's, with one period per later one,
//! starting at the PSB the recorder put right after the system call), and what the past shows
//! in an earlier period comes from that period's code; before an exec, never from the present
//! process, whose memory is the new program's.

use std::sync::Arc;

use super::Timeline;
use crate::capture::ExecBoundary;
use crate::image::{Image, Symbolizer};
use crate::target::{Notice, TargetError, TargetResult};

/// The image a history is decoded against: the present code alone, or, after execs, the first
/// program's code with a period per later program, the present one last.
pub(super) fn compose(bounds: &[ExecBoundary], present: &Arc<Image>) -> Arc<Image> {
    let Some(first) = bounds.first() else {
        return Arc::clone(present);
    };
    let mut root = first.image.first_period();
    let next_images = bounds[1..]
        .iter()
        .map(|b| &b.image)
        .chain(std::iter::once(present));
    for (b, image) in bounds.iter().zip(next_images) {
        root.push_period(b.next_offset, Arc::clone(image));
    }
    Arc::new(root)
}

/// [`compose`] for the stream of thread `tid` (not the main one): each boundary at the offset
/// in its own stream ([`ExecBoundary::thread_offsets`]); a thread that started after a
/// boundary starts in the code after it.
pub(super) fn compose_for_thread(
    bounds: &[ExecBoundary],
    present: &Arc<Image>,
    tid: i32,
) -> Arc<Image> {
    let after: Vec<&Arc<Image>> = bounds[1.min(bounds.len())..]
        .iter()
        .map(|b| &b.image)
        .chain(std::iter::once(present))
        .collect();
    let Some(first) = bounds.first() else {
        return Arc::clone(present);
    };
    let mut start = &first.image;
    let mut periods: Vec<(u64, &Arc<Image>)> = Vec::new();
    for (i, b) in bounds.iter().enumerate() {
        match b.thread_offsets.iter().find(|(t, _)| *t == tid) {
            Some(&(_, offset)) => periods.push((offset, after[i])),
            // Not there yet at this boundary: its stream starts in the code after it.
            None if periods.is_empty() => start = after[i],
            None => {}
        }
    }
    if periods.is_empty() {
        return Arc::clone(start);
    }
    let mut root = start.first_period();
    for (offset, image) in periods {
        root.push_period(offset, Arc::clone(image));
    }
    Arc::new(root)
}

/// What a saved or live recording knows of one earlier address space, for `monitor stats` and
/// `monitor history`-like displays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeriodInfo {
    /// Number of its first instruction in the history.
    pub first_insn: u64,
    /// Number of the first instruction after it (the next program's first), or `None` for the
    /// present address space.
    pub end_insn: Option<u64>,
}

impl Timeline {
    /// The earlier address space (index into the exec boundaries) that history position `n`
    /// lies in, or `None` if it lies in the present one.
    pub(super) fn earlier_period(&self, n: u64) -> Option<usize> {
        let i = self.exec_bounds.partition_point(|b| b.next_insn <= n);
        (i < self.exec_bounds.len()).then_some(i)
    }

    /// The code of the address space history position `n` lies in.
    pub(super) fn code_at(&self, n: u64) -> &Image {
        match self.earlier_period(n) {
            Some(i) => &self.exec_bounds[i].image,
            None => &self.present,
        }
    }

    /// Symbols of earlier period `i`, from its mappings when it ended (read on first use).
    pub(super) fn period_symbols(&mut self, i: usize) -> &Symbolizer {
        if self.period_symbols.len() < self.exec_bounds.len() {
            self.period_symbols.resize(self.exec_bounds.len(), None);
        }
        let maps = &self.exec_bounds[i].maps;
        self.period_symbols[i]
            .get_or_insert_with(|| super::inspect::symbolizer_from_maps(maps, None))
    }

    /// A notice if the cursor's address space is not the one of the last stop reported (see
    /// [`Notice::ExecPeriod`]); `quiet`: the stop itself announced the change (a live exec).
    /// Not between two stops at the present: the process ran on live into the new code (an
    /// exec the debugger was told of, code mapped by the program), nothing of the past shown.
    pub(super) fn period_notice(&mut self, quiet: bool) -> Option<Notice> {
        let pos = self.position();
        let now = self.earlier_period(pos).unwrap_or(self.exec_bounds.len());
        let last = self.shown_period.replace(now);
        let at_present = self.cursor.is_none();
        let was_at_present = std::mem::replace(&mut self.shown_at_present, at_present);
        if last.is_none_or(|l| l == now) || quiet || (at_present && was_at_present) {
            return None;
        }
        let info = self.periods().get(now).copied()?;
        let program = match self.exec_bounds.get(now) {
            Some(b) => b.exe.clone(),
            None => match self.live.as_mut() {
                Some(live) => live.exec_path(),
                None => self.offline.as_ref().and_then(|o| o.exe.clone()),
            },
        };
        Some(Notice::ExecPeriod {
            program,
            started_by: now
                .checked_sub(1)
                .map(|i| self.exec_bounds[i].cause.clone()),
            ended_by: self.exec_bounds.get(now).map(|b| b.cause.clone()),
            first: info.first_insn,
            end: info.end_insn,
        })
    }

    /// The periods of the history, in order (one unless the program called `execve` or
    /// replaced code).
    pub fn periods(&self) -> Vec<PeriodInfo> {
        let mut first = 0;
        let mut out = Vec::with_capacity(self.exec_bounds.len() + 1);
        for b in &self.exec_bounds {
            out.push(PeriodInfo {
                first_insn: first,
                end_insn: Some(b.next_insn),
            });
            first = b.next_insn;
        }
        out.push(PeriodInfo {
            first_insn: first,
            end_insn: None,
        });
        out
    }

    /// Memory at position `pos` of an earlier period `i`. Its code comes from the snapshot
    /// taken when the period ended (the code there was replaced since). Before an exec, the
    /// process that ran there is gone (its memory was replaced, and no state log can undo
    /// that): nothing else is known. Before a munmap/mmap of code, the rest of memory is the
    /// same process's, served as at any past position.
    pub(super) fn earlier_period_memory(
        &mut self,
        i: usize,
        pos: u64,
        addr: u64,
        buf: &mut [u8],
    ) -> TargetResult<usize> {
        match self.period_snapshot(i, addr, buf)? {
            PeriodRead::Served(n) => Ok(n),
            PeriodRead::Elsewhere(next) => {
                self.memory_in_present_space(pos, addr, &mut buf[..next])
            }
        }
    }

    /// What earlier period `i`'s code snapshot says of memory at `addr`: the bytes it has
    /// there, or how many bytes from `addr` on it does not cover (up to its next section,
    /// whose bytes differ from the present's); before an exec nothing else is known (an error).
    pub(super) fn period_snapshot(
        &self,
        i: usize,
        addr: u64,
        buf: &mut [u8],
    ) -> TargetResult<PeriodRead> {
        let n = self.exec_bounds[i].image.read(addr, buf);
        if n > 0 {
            return Ok(PeriodRead::Served(n));
        }
        if self.exec_bounds[i..].iter().any(|b| b.cause == "exec") {
            return Err(TargetError::Memory { addr });
        }
        let next = self.exec_bounds[i]
            .image
            .sections()
            .iter()
            .map(|s| s.addr)
            .find(|&a| a > addr)
            .map_or(buf.len(), |a| (a - addr).min(buf.len() as u64) as usize);
        Ok(PeriodRead::Elsewhere(next))
    }
}

/// See [`Timeline::period_snapshot`].
pub(super) enum PeriodRead {
    /// This many bytes were read from the snapshot.
    Served(usize),
    /// The snapshot has nothing for this many bytes: read them as at any past position.
    Elsewhere(usize),
}
