//! Source-level reverse stepping from the decoded call/return structure alone: where
//! `reverse-finish` and `reverse-next` go in the selected thread's own history, for a past
//! without a stack pointer (PC-only: QEMU and hardware recordings), where GDB cannot unwind and
//! so cannot do them itself.
//!
//! Calls and returns are told apart by the instruction at each change of flow (read from the
//! code image); a call is matched with the return that ends it by nesting depth, walking
//! backwards. Asynchronous transfers (signals) are not calls: a handler's frames are walked
//! through like any code at the same depth.

use iced_x86::{Decoder, DecoderOptions, FlowControl};

use super::Timeline;

/// How many instructions one backward window decodes.
const WINDOW: u64 = 100_000;
/// How far back a search goes at most (instructions).
const LIMIT: u64 = 20_000_000;

/// What an instruction does to the call depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Call,
    Return,
    Other,
}

/// One instruction of the walk: position, address, length and kind.
type Step = (u64, u64, Kind);

impl Timeline {
    fn kind_at(&self, n: u64, ip: u64, len: u8) -> Kind {
        let mut bytes = [0u8; 16];
        let n = self
            .code_at(n)
            .read(ip, &mut bytes[..usize::from(len).min(16)]);
        if n == 0 {
            return Kind::Other;
        }
        let mut d = Decoder::with_ip(64, &bytes[..n], ip, DecoderOptions::NONE);
        match d.decode().flow_control() {
            FlowControl::Call | FlowControl::IndirectCall => Kind::Call,
            FlowControl::Return => Kind::Return,
            _ => Kind::Other,
        }
    }

    /// Walks the selected thread's instructions backwards from before `from`, calling `f` with
    /// each one and the call depth relative to `from`'s frame *after* it (a callee's
    /// instructions have depth > 0; the call that entered `from`'s function has depth -1),
    /// until `f` returns true; the position `f` accepted.
    fn walk_back(&mut self, from: u64, mut f: impl FnMut(Step, i64) -> bool) -> Option<u64> {
        let mut depth = 0i64;
        let mut end = from;
        let floor = from.saturating_sub(LIMIT);
        while end > floor {
            let start = end.saturating_sub(WINDOW).max(floor);
            let mut window: Vec<(u64, u64, u8)> = Vec::with_capacity((end - start) as usize);
            self.for_each_insn(start, end, |n, ip, len| window.push((n, ip, len)));
            for &(n, ip, len) in window.iter().rev() {
                let kind = self.kind_at(n, ip, len);
                match kind {
                    // Walking back over a return enters the callee it left.
                    Kind::Return => depth += 1,
                    Kind::Call => depth -= 1,
                    Kind::Other => {}
                }
                // A call's own depth is its caller's: the callee begins after it.
                if f((n, ip, kind), depth) {
                    return Some(n);
                }
            }
            if window.is_empty() {
                break;
            }
            end = start;
        }
        None
    }

    /// `reverse-finish` in the selected thread: the position of the call instruction that
    /// entered the function at the cursor.
    pub fn reverse_finish_target(&mut self) -> Result<u64, String> {
        let from = self.position();
        self.walk_back(from, |(_, _, kind), depth| kind == Kind::Call && depth < 0)
            .ok_or_else(|| {
                "the call into this function is not in the recorded history (recording began \
                 inside it)"
                    .to_string()
            })
    }

    /// `reverse-next` in the selected thread: the beginning of the source line the cursor is
    /// in when it is inside it, else of the line executed before it in the same function
    /// (calls made meanwhile are stepped over); the call into the function when there is no
    /// earlier line in it. Needs line information.
    pub fn reverse_next_target(&mut self) -> Result<u64, String> {
        let from = self.position();
        let pc = self
            .cursor_pc()
            .ok_or("no instruction at the cursor (the end of a finished recording?)")?;
        let line_of = |t: &mut Timeline, ip: u64| t.symbolizer().line(ip);
        let here = line_of(self, pc).ok_or_else(|| format!("no line information for {pc:#x}"))?;
        // First the rest of the cursor's own line run, then the previous line's.
        let mut want = here;
        let mut moved_in_line = false;
        let mut best: Option<u64> = None;
        let mut ips: Vec<(u64, u64, i64)> = Vec::new();
        self.walk_back(from, |(n, ip, kind), depth| {
            if depth < 0 && kind == Kind::Call {
                ips.push((n, ip, depth));
                return true;
            }
            if depth == 0 {
                ips.push((n, ip, depth));
            }
            // Enough to decide: a line run of the same frame ended twice.
            ips.len() > 100_000
        });
        // `ips`: the frame's own instructions going back (and possibly the entering call).
        let mut i = 0;
        while i < ips.len() {
            let (n, ip, depth) = ips[i];
            if depth < 0 {
                // Back at the call into this function: stop there (in the caller).
                return Ok(best.unwrap_or(n));
            }
            let line = line_of(self, ip);
            if line.as_ref() == Some(&want) {
                best = Some(n);
                moved_in_line = true;
            } else if moved_in_line || best.is_some() {
                // The run of `want` ended (going back): its first instruction is the target.
                return best.ok_or_else(|| "no earlier line".to_string());
            } else if let Some(l) = line {
                // The cursor was at the start of its line: the previous line is wanted.
                want = l;
                best = Some(n);
                moved_in_line = true;
            }
            i += 1;
        }
        best.ok_or_else(|| "no earlier line of this function in the recorded history".into())
    }
}
