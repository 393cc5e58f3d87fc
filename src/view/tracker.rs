//! [`Tracker`]: follows one trace stream's blocks and events, keeps its call stack, adds
//! every stack to a [`CallTree`] and reports frames to a [`CallSink`].
//!
//! # What a call is
//!
//! * A `CALL` (near or far), `SYSCALL`/`SYSENTER` or `INT n` whose next instruction is not the
//!   one after it opens a frame for the function at the target (a `CALL` to the next
//!   instruction, the position-independent-code idiom, is no call; a system call into an
//!   untraced kernel resumes right after itself and is none either). The frame remembers its
//!   return address.
//! * A `RET` (near or far, `IRET`, `SYSRET`) closes frames up to and including the innermost one
//!   whose return address is the return target, as perf's thread stack does; so a `longjmp`-like
//!   return past several frames closes all of them. A return to an address no frame expects
//!   closes the innermost frame only.
//! * A return out of the outermost frame means the trace began inside a deeper function: the
//!   function returned to becomes the new outermost frame, the old one its child (at most
//!   [`MAX_OUTER`] times per segment; beyond that the old root is closed and the new one opened
//!   beside it).
//! * An unconditional `JMP` to the first instruction of another function (a symbol at offset 0)
//!   is a tail call: the frame is closed and one for the new function opened in its place, with
//!   the same return address (PLT stubs become the function they jump to).
//! * An asynchronous branch (interrupt in traced code) opens a frame for its target whose return
//!   address is the interrupted instruction.
//! * Tracing disabled and enabled again (system calls, interrupts, filters) keeps the stack; a
//!   call whose target is not traced opens a frame for the target when the disable names it,
//!   closed when tracing resumes at its return address. Tracing that resumes somewhere other
//!   than where the interrupted instruction or the system call would continue (the kernel
//!   delivered a signal) opens a frame for the handler, returning to where execution was
//!   meant to continue; when tracing later resumes there, the handler's frames are closed.
//! * An overflow or a decode error loses the stack: every frame is closed and a new *segment*
//!   begins at the next instruction.
//!
//! Instructions are attributed to the innermost frame: the `CALL` to the caller, the `RET` to
//! the callee. A frame's instruction count is the number of instructions from its first to its
//! return, inclusive of its callees'.

use super::calltree::*;
use crate::flow::{Event, EventKind, InsnClass};
use crate::image::Symbolizer;

/// A sink that ignores everything (a flame graph without a timeline).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoTimeline;

impl CallSink for NoTimeline {
    fn tick(&mut self, _: u64, _: u64, _: &Functions) {}
    fn open(&mut self, _: u64, _: FuncId, _: &Functions) {}
    fn open_outer(&mut self, _: FuncId, _: &Functions) {}
    fn close(&mut self, _: u64, _: u64, _: u64, _: &Functions) {}
}

/// Counters of one stream's call tracking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrackSummary {
    /// Instructions followed.
    pub insns: u64,
    /// Frames opened (calls, tail calls, interrupts, outer frames).
    pub frames: u64,
    /// Returns to an address no open frame expected (closed the innermost frame only).
    pub unmatched_returns: u64,
    /// Frames that became outermost because the trace returned out of its first function.
    pub outer_frames: u64,
    /// Tail calls (a jump to another function's first instruction).
    pub tail_calls: u64,
    /// Frames opened where tracing resumed somewhere other than where the interrupted code (or
    /// the system call) would have: signal handlers.
    pub async_entries: u64,
    /// Calls not followed because the stack was [`MAX_DEPTH`] deep.
    pub depth_capped: u64,
    /// Times the stack was lost (overflow, decode error) and a new segment began.
    pub resets: u64,
    /// Decode error events.
    pub errors: u64,
    /// The deepest stack seen.
    pub max_depth: usize,
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    node: u32,
    func: FuncId,
    /// The return address (0 for a segment's outermost frame).
    ret: u64,
    /// Instruction number of its first instruction.
    begin: u64,
    self_insns: u64,
}

/// A run of sequential instructions, as [`Tracker::block`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The first instruction's address.
    pub start: u64,
    /// How many instructions.
    pub count: u32,
    /// The class of the last one.
    pub class: InsnClass,
    /// The address after the last one (a call's return address).
    pub next: u64,
    /// The flow decoder's timestamp (TSC ticks, 0 without timing).
    pub time: u64,
}

/// What the last block's final instruction leaves to resolve at the next instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    None,
    /// A call: a frame opens at the next instruction unless it is `ret` itself.
    Call {
        ret: u64,
    },
    /// A return: frames close up to the one expecting the next instruction.
    Ret,
    /// An unconditional jump: a tail call if it lands on another function's entry.
    Jump,
}

/// Follows one stream's instruction flow and keeps its call stack (see the module docs).
#[derive(Debug)]
pub struct Tracker<'s> {
    symbols: &'s Symbolizer,
    stack: Vec<Frame>,
    n: u64,
    pending: Pending,
    /// Calls beyond [`MAX_DEPTH`] still open.
    capped_open: u64,
    outer_levels: u32,
    /// Where execution resumes after the current disable (the interrupted instruction, or
    /// the instruction after a system call), if known.
    resume: Option<u64>,
    /// Instructions interrupted (asynchronous disables, signal deliveries) that execution has
    /// not resumed at yet, newest last; bounded.
    interrupted: Vec<u64>,
    summary: TrackSummary,
}

/// How many interrupted instructions [`Tracker`] remembers (nested signal handlers).
const MAX_INTERRUPTED: usize = 64;

impl<'s> Tracker<'s> {
    /// A tracker naming functions with `symbols`.
    pub fn new(symbols: &'s Symbolizer) -> Self {
        Tracker {
            symbols,
            stack: Vec::new(),
            n: 0,
            pending: Pending::None,
            capped_open: 0,
            outer_levels: 0,
            resume: None,
            interrupted: Vec::new(),
            summary: TrackSummary::default(),
        }
    }

    fn remember_interrupted(&mut self, ip: u64) {
        if self.interrupted.len() >= MAX_INTERRUPTED {
            self.interrupted.remove(0);
        }
        self.interrupted.push(ip);
    }

    /// Forgets `ip` (and what was interrupted after it) if it was interrupted; true if it was.
    fn forget_interrupted(&mut self, ip: u64) -> bool {
        match self.interrupted.iter().rposition(|&x| x == ip) {
            Some(i) => {
                self.interrupted.truncate(i);
                true
            }
            None => false,
        }
    }

    /// Instructions followed so far.
    pub fn insns(&self) -> u64 {
        self.n
    }

    /// The counters so far.
    pub fn summary(&self) -> TrackSummary {
        TrackSummary {
            insns: self.n,
            ..self.summary
        }
    }

    fn open(&mut self, tree: &mut CallTree, sink: &mut impl CallSink, ip: u64, ret: u64) {
        if self.stack.len() >= MAX_DEPTH {
            self.capped_open += 1;
            self.summary.depth_capped += 1;
            return;
        }
        let func = tree.functions.resolve(self.symbols, ip);
        let node = match self.stack.last() {
            Some(top) => tree.child(top.node, func),
            None => {
                self.outer_levels = 0;
                tree.segment_root(func)
            }
        };
        tree.nodes[node as usize].calls += 1;
        self.stack.push(Frame {
            node,
            func,
            ret,
            begin: self.n,
            self_insns: 0,
        });
        self.summary.frames += 1;
        self.summary.max_depth = self.summary.max_depth.max(self.stack.len());
        sink.open(self.n, func, &tree.functions);
    }

    fn close_top(&mut self, tree: &mut CallTree, sink: &mut impl CallSink) {
        if let Some(f) = self.stack.pop() {
            let insns = self.n - f.begin;
            sink.close(self.n, insns, f.self_insns, &tree.functions);
            if self.stack.is_empty() {
                tree.merge_segment(f.node);
            }
        }
    }

    /// Closes every frame (the stack is lost or the stream ends).
    fn close_all(&mut self, tree: &mut CallTree, sink: &mut impl CallSink) {
        while !self.stack.is_empty() {
            self.close_top(tree, sink);
        }
        self.capped_open = 0;
        self.pending = Pending::None;
        self.resume = None;
        self.interrupted.clear();
    }

    /// A return to `target`.
    fn ret_to(&mut self, tree: &mut CallTree, sink: &mut impl CallSink, target: u64) {
        if self.capped_open > 0 {
            self.capped_open -= 1;
            return;
        }
        // The innermost frame expecting `target` (not the outermost: it has no caller here).
        if let Some(i) = self.stack.iter().skip(1).rposition(|f| f.ret == target) {
            let i = i + 1;
            while self.stack.len() > i {
                self.close_top(tree, sink);
            }
            return;
        }
        match self.stack.len() {
            0 => {}
            1 => self.return_out_of_root(tree, sink, target),
            _ => {
                self.summary.unmatched_returns += 1;
                self.close_top(tree, sink);
            }
        }
    }

    /// The outermost frame returns to `target`: the trace began inside it.
    fn return_out_of_root(&mut self, tree: &mut CallTree, sink: &mut impl CallSink, target: u64) {
        let func = tree.functions.resolve(self.symbols, target);
        if self.outer_levels >= MAX_OUTER {
            // Enough guessing about what was running before the trace: a new root beside it.
            self.close_top(tree, sink);
            self.open(tree, sink, target, 0);
            self.summary.unmatched_returns += 1;
            return;
        }
        self.outer_levels += 1;
        let old = self.stack[0];
        let node = tree.segment_root(func);
        tree.put_under(old.node, node);
        tree.nodes[node as usize].calls += 1;
        // Outer frames begin where the segment began.
        self.stack.insert(
            0,
            Frame {
                node,
                func,
                ret: 0,
                begin: old.begin,
                self_insns: 0,
            },
        );
        self.summary.frames += 1;
        self.summary.outer_frames += 1;
        sink.open_outer(func, &tree.functions);
        self.close_top(tree, sink);
    }

    /// Resolves what the previous instruction left pending, now that the next one is `ip`.
    fn resolve(&mut self, tree: &mut CallTree, sink: &mut impl CallSink, ip: u64) {
        let pending = std::mem::replace(&mut self.pending, Pending::None);
        if self.stack.is_empty() {
            // A segment's first instruction: its function is the outermost frame.
            self.open(tree, sink, ip, 0);
            return;
        }
        match pending {
            Pending::None => {}
            Pending::Call { ret } => {
                if ip != ret {
                    self.open(tree, sink, ip, ret);
                }
            }
            Pending::Ret => self.ret_to(tree, sink, ip),
            Pending::Jump => {
                if self.capped_open > 0 {
                    return;
                }
                let Some(top) = self.stack.last().copied() else {
                    return;
                };
                let Some(s) = self.symbols.symbol_info(ip) else {
                    return;
                };
                // A jump to another function's first byte; `.cold` parts are the same
                // function's code moved out of line, not a call.
                if s.addr == ip && tree.functions.key(top.func) != ip && !s.name.contains(".cold") {
                    self.summary.tail_calls += 1;
                    self.close_top(tree, sink);
                    self.open(tree, sink, ip, top.ret);
                }
            }
        }
    }

    /// A run of instructions (see [`Run`]).
    pub fn block(&mut self, tree: &mut CallTree, sink: &mut impl CallSink, run: Run) {
        let Run {
            start,
            count,
            class,
            next,
            time,
        } = run;
        sink.tick(self.n, time, &tree.functions);
        self.resolve(tree, sink, start);
        if let Some(top) = self.stack.last_mut() {
            top.self_insns += count as u64;
            tree.nodes[top.node as usize].self_insns += count as u64;
        }
        self.n += count as u64;
        self.pending = match class {
            InsnClass::DirectCall
            | InsnClass::IndirectCall
            | InsnClass::FarCall
            | InsnClass::SysCall
            | InsnClass::SoftInt => Pending::Call { ret: next },
            InsnClass::Return | InsnClass::FarReturn => Pending::Ret,
            InsnClass::DirectJump | InsnClass::IndirectJump | InsnClass::FarJump => Pending::Jump,
            _ => Pending::None,
        };
    }

    /// An event of the flow.
    pub fn event(&mut self, tree: &mut CallTree, sink: &mut impl CallSink, e: &Event) {
        match &e.kind {
            EventKind::Overflow { .. } | EventKind::Error { .. } => {
                if matches!(e.kind, EventKind::Error { .. }) {
                    self.summary.errors += 1;
                }
                if !self.stack.is_empty() {
                    self.summary.resets += 1;
                }
                sink.tick(self.n, e.time, &tree.functions);
                self.close_all(tree, sink);
            }
            EventKind::Disabled { ip, asynchronous } => {
                self.resume = None;
                match (self.pending, *ip) {
                    // A call into code that is not traced: its frame opens now, named after
                    // the target the disable gives.
                    (Pending::Call { ret }, Some(target))
                        if target != ret && !self.stack.is_empty() =>
                    {
                        self.pending = Pending::None;
                        sink.tick(self.n, e.time, &tree.functions);
                        self.open(tree, sink, target, ret);
                    }
                    // Interrupted at `x` (which did not run): execution resumes there unless
                    // something else (a signal handler) runs first.
                    (_, Some(x)) if *asynchronous => {
                        self.resume = Some(x);
                        self.remember_interrupted(x);
                    }
                    // A system call into the untraced kernel: back after it.
                    (Pending::Call { ret }, None) => self.resume = Some(ret),
                    _ => {}
                }
            }
            EventKind::Enabled { ip } => {
                let ip = *ip;
                let resume = self.resume.take();
                if let Pending::Call { ret } = self.pending
                    && ret == ip
                {
                    // The call's target ran untraced (a system call into the kernel): no frame.
                    self.pending = Pending::None;
                } else if self.stack.iter().skip(1).any(|f| f.ret == ip) {
                    // Back from an untraced callee, or from a signal handler to the code it
                    // interrupted.
                    self.pending = Pending::None;
                    self.forget_interrupted(ip);
                    sink.tick(self.n, e.time, &tree.functions);
                    self.ret_to(tree, sink, ip);
                } else if self.forget_interrupted(ip) {
                    // Back to interrupted code (the handler's frame closed on its way out).
                    self.pending = Pending::None;
                } else if let Some(r) = resume
                    && r != ip
                    && !self.stack.is_empty()
                {
                    // Not where the interrupted code or the system call would resume: the
                    // kernel started something there (a signal handler). A frame for it,
                    // returning to where execution was meant to resume.
                    self.pending = Pending::None;
                    self.summary.async_entries += 1;
                    self.remember_interrupted(r);
                    sink.tick(self.n, e.time, &tree.functions);
                    self.open(tree, sink, ip, r);
                }
            }
            EventKind::AsyncBranch { from, to } => {
                if self.stack.is_empty() {
                    return;
                }
                sink.tick(self.n, e.time, &tree.functions);
                self.resolve(tree, sink, *from);
                self.open(tree, sink, *to, *from);
            }
            _ => {}
        }
    }

    /// The end of the stream: every open frame closes after the last instruction.
    pub fn finish(&mut self, tree: &mut CallTree, sink: &mut impl CallSink) -> TrackSummary {
        self.close_all(tree, sink);
        self.summary()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::trace_event::{Clock, TraceEvents};

    /// Feeds blocks `(start, count, class, next)` and returns the folded stacks and the
    /// timeline's JSON (instruction clock).
    fn run(
        blocks: &[(u64, u32, InsnClass, u64)],
        events: &[(usize, Event)],
    ) -> (Vec<String>, serde_json::Value, TrackSummary) {
        let syms = Symbolizer::new();
        let mut tree = CallTree::default();
        let mut tl = TraceEvents::new(Vec::new(), Clock::Instructions);
        tl.begin_track(1, 1, "p", "t");
        let mut t = Tracker::new(&syms);
        for (i, &(start, count, class, next)) in blocks.iter().enumerate() {
            for (_, e) in events.iter().filter(|(at, _)| *at == i) {
                t.event(&mut tree, &mut tl, e);
            }
            t.block(
                &mut tree,
                &mut tl,
                Run {
                    start,
                    count,
                    class,
                    next,
                    time: 0,
                },
            );
        }
        let summary = t.finish(&mut tree, &mut tl);
        tl.end_track(&tree.functions);
        let (bytes, _) = tl.finish(Default::default()).unwrap();
        (
            tree.folded(),
            serde_json::from_slice(&bytes).unwrap(),
            summary,
        )
    }

    /// (name, ts ns, end ns, insns) of every slice.
    fn slices(json: &serde_json::Value) -> Vec<(String, u64, u64, u64)> {
        let ns = |v: &serde_json::Value| (v.as_f64().unwrap() * 1000.0).round() as u64;
        let mut out: Vec<_> = json["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                let ts = ns(&e["ts"]);
                (
                    e["name"].as_str().unwrap().to_string(),
                    ts,
                    ts + ns(&e["dur"]),
                    e["args"]["insns"].as_u64().unwrap(),
                )
            })
            .collect();
        out.sort_by_key(|s| (s.1, std::cmp::Reverse(s.2)));
        out
    }

    /// Depth of each slice (sorted by start), asserting proper nesting.
    fn depths(s: &[(String, u64, u64, u64)]) -> Vec<usize> {
        let mut stack: Vec<u64> = Vec::new();
        let mut out = Vec::new();
        for (name, b, e, _) in s {
            while stack.last().is_some_and(|&end| end <= *b) {
                stack.pop();
            }
            if let Some(&end) = stack.last() {
                assert!(
                    *e <= end,
                    "{name} [{b},{e}) overlaps its parent ending at {end}"
                );
            }
            out.push(stack.len());
            stack.push(*e);
        }
        out
    }

    const MAIN: u64 = 0x1000;
    const REC: u64 = 0x2000;

    /// main calls rec(3); rec(d) calls rec(d-1) until d = 0.
    fn recursion(depth: u32) -> Vec<(u64, u32, InsnClass, u64)> {
        let mut b = vec![(MAIN, 3, InsnClass::DirectCall, MAIN + 0x10)];
        for _ in 0..depth {
            b.push((REC, 2, InsnClass::DirectCall, REC + 8));
        }
        b.push((REC, 5, InsnClass::Return, 0));
        for _ in 0..depth {
            b.push((REC + 8, 3, InsnClass::Return, 0));
        }
        b.push((MAIN + 0x10, 2, InsnClass::Other, 0));
        b
    }

    #[test]
    fn recursion_nests_with_inclusive_counts() {
        let (folded, json, sum) = run(&recursion(3), &[]);
        assert_eq!(
            folded,
            [
                "0x1000 5",
                "0x1000;0x2000 5",
                "0x1000;0x2000;0x2000 5",
                "0x1000;0x2000;0x2000;0x2000 5",
                "0x1000;0x2000;0x2000;0x2000;0x2000 5",
            ]
        );
        assert_eq!(sum.frames, 5);
        assert_eq!(sum.max_depth, 5);
        assert_eq!(sum.insns, 5 + 3 * 5 + 5);
        let s = slices(&json);
        let names: Vec<_> = s.iter().map(|x| (x.0.as_str(), x.3)).collect();
        // rec(0) runs 5; each level above adds 5 of its own.
        assert_eq!(
            names,
            [
                ("0x1000", 25),
                ("0x2000", 20),
                ("0x2000", 15),
                ("0x2000", 10),
                ("0x2000", 5)
            ]
        );
        assert_eq!(depths(&s), [0, 1, 2, 3, 4]);
        // Instruction clock: a slice starts at its first instruction's number (µs).
        assert_eq!(s[1].1 / 1000, 3);
        assert_eq!(s[4].1 / 1000, 3 + 2 * 3);
        assert_eq!(json["otherData"]["time"], "instructions");
    }

    #[test]
    fn return_out_of_the_first_function_makes_its_caller_outermost() {
        // The trace begins inside rec, which returns to main, which calls rec again.
        let blocks = [
            (REC + 8, 3, InsnClass::Return, 0),
            (MAIN + 0x10, 2, InsnClass::DirectCall, MAIN + 0x20),
            (REC, 4, InsnClass::Return, 0),
            (MAIN + 0x20, 1, InsnClass::Other, 0),
        ];
        let (folded, json, sum) = run(&blocks, &[]);
        assert_eq!(sum.outer_frames, 1);
        assert_eq!(folded, ["0x1010 3", "0x1010;0x2000 4", "0x1010;0x2008 3"]);
        let s = slices(&json);
        assert_eq!(depths(&s), [0, 1, 1]);
        assert_eq!(s[0].0, "0x1010");
        assert_eq!(s[0].3, 10);
    }

    #[test]
    fn an_error_ends_the_stack_and_starts_a_segment() {
        let mut blocks = recursion(2);
        blocks.truncate(3); // main → rec → rec, no returns
        blocks.push((MAIN, 1, InsnClass::Other, 0));
        let err = Event {
            offset: 0,
            time: 0,
            kind: EventKind::Overflow { resume: None },
        };
        let (folded, json, sum) = run(&blocks, &[(3, err)]);
        assert_eq!(sum.resets, 1);
        assert!(folded.contains(&"0x1000 4".to_string()), "{folded:?}");
        let s = slices(&json);
        assert_eq!(depths(&s), [0, 1, 2, 0]);
    }

    #[test]
    fn calls_to_the_next_instruction_and_untraced_syscalls_open_no_frame() {
        let blocks = [
            (MAIN, 2, InsnClass::DirectCall, MAIN + 7),
            (MAIN + 7, 2, InsnClass::SysCall, MAIN + 12),
            (MAIN + 12, 1, InsnClass::Other, 0),
        ];
        let dis = Event {
            offset: 0,
            time: 0,
            kind: EventKind::Disabled {
                ip: None,
                asynchronous: false,
            },
        };
        let en = Event {
            offset: 0,
            time: 0,
            kind: EventKind::Enabled { ip: MAIN + 12 },
        };
        let (folded, _, sum) = run(&blocks, &[(2, dis), (2, en)]);
        assert_eq!(folded, ["0x1000 5"]);
        assert_eq!(sum.frames, 1);
    }

    #[test]
    fn a_call_into_untraced_code_is_a_frame_until_tracing_resumes_at_its_return() {
        let blocks = [
            (MAIN, 2, InsnClass::IndirectCall, MAIN + 8),
            (MAIN + 8, 1, InsnClass::Other, 0),
        ];
        let dis = Event {
            offset: 0,
            time: 0,
            kind: EventKind::Disabled {
                ip: Some(0x9000),
                asynchronous: false,
            },
        };
        let en = Event {
            offset: 0,
            time: 0,
            kind: EventKind::Enabled { ip: MAIN + 8 },
        };
        let (_, json, _) = run(&blocks, &[(1, dis), (1, en)]);
        let s = slices(&json);
        assert_eq!(
            s.iter().map(|x| (x.0.as_str(), x.3)).collect::<Vec<_>>(),
            [("0x1000", 3), ("0x9000", 0)]
        );
        assert_eq!(depths(&s), [0, 1]);
    }

    #[test]
    fn a_signal_handler_is_a_frame_inside_the_interrupted_function() {
        const HANDLER: u64 = 0x3000;
        const RESTORER: u64 = 0x4000;
        let ev = |kind| Event {
            offset: 0,
            time: 0,
            kind,
        };
        let blocks = [
            (MAIN, 4, InsnClass::Other, 0),
            // interrupted at MAIN + 8; the kernel runs the handler, which returns to the
            // restorer, whose rt_sigreturn resumes main at MAIN + 8
            (HANDLER, 3, InsnClass::Return, 0),
            (RESTORER, 2, InsnClass::SysCall, RESTORER + 9),
            (MAIN + 8, 2, InsnClass::Other, 0),
        ];
        let events = [
            (
                1,
                ev(EventKind::Disabled {
                    ip: Some(MAIN + 8),
                    asynchronous: true,
                }),
            ),
            (1, ev(EventKind::Enabled { ip: HANDLER })),
            (
                3,
                ev(EventKind::Disabled {
                    ip: None,
                    asynchronous: false,
                }),
            ),
            (3, ev(EventKind::Enabled { ip: MAIN + 8 })),
        ];
        let (folded, json, sum) = run(&blocks, &events);
        assert_eq!(sum.async_entries, 1);
        assert_eq!(
            sum.unmatched_returns, 1,
            "the handler returns to the restorer"
        );
        // The restorer's two instructions run in main's frame again.
        assert_eq!(folded, ["0x1000 8", "0x1000;0x3000 3"]);
        let s = slices(&json);
        assert_eq!(depths(&s), [0, 1]);
        assert_eq!(s[1].3, 3);
    }

    #[test]
    fn interrupts_resuming_where_they_struck_change_nothing() {
        let ev = |kind| Event {
            offset: 0,
            time: 0,
            kind,
        };
        // Interrupted at the callee's first instruction, and inside it.
        let blocks = recursion(1);
        let events = [
            (
                2,
                ev(EventKind::Disabled {
                    ip: Some(REC),
                    asynchronous: true,
                }),
            ),
            (2, ev(EventKind::Enabled { ip: REC })),
            (
                3,
                ev(EventKind::Disabled {
                    ip: Some(REC + 8),
                    asynchronous: true,
                }),
            ),
            (3, ev(EventKind::Enabled { ip: REC + 8 })),
        ];
        let (with, _, sum) = run(&blocks, &events);
        let (without, _, _) = run(&recursion(1), &[]);
        assert_eq!(with, without);
        assert_eq!(sum.async_entries, 0);
    }

    /// Memory follows the distinct stacks: the same calls again after each of many stack
    /// losses add no node.
    #[test]
    fn segments_merge_into_the_same_stacks() {
        let syms = Symbolizer::new();
        let mut tree = CallTree::default();
        let mut t = Tracker::new(&syms);
        let overflow = Event {
            offset: 0,
            time: 0,
            kind: EventKind::Overflow { resume: None },
        };
        let mut nodes = Vec::new();
        for _ in 0..50 {
            for (start, count, class, next) in recursion(3) {
                let run = Run {
                    start,
                    count,
                    class,
                    next,
                    time: 0,
                };
                t.block(&mut tree, &mut NoTimeline, run);
            }
            t.event(&mut tree, &mut NoTimeline, &overflow);
            nodes.push(tree.node_count());
        }
        t.finish(&mut tree, &mut NoTimeline);
        // The root and the five stacks of one round.
        assert!(nodes.iter().all(|&n| n == 6), "{nodes:?}");
        assert_eq!(tree.total_insns(), 50 * 25);
        assert_eq!(tree.stacks().len(), 5);
        assert_eq!(tree.stacks()[0].calls, 50);
    }

    /// Random flows (calls, returns anywhere, jumps, every event kind that matters, times
    /// going back and forth): no panic, every instruction attributed once, and the timeline's
    /// slices nest with distinct starts, under both clocks.
    #[test]
    fn random_flows_keep_the_invariants() {
        let mut rng = crate::test_rng::XorShift::new(0x9e37_79b9_7f4a_7c15);
        let mut rnd = move |n: u64| rng.below(n);
        let classes = [
            InsnClass::Other,
            InsnClass::DirectCall,
            InsnClass::IndirectCall,
            InsnClass::Return,
            InsnClass::DirectJump,
            InsnClass::IndirectJump,
            InsnClass::SysCall,
            InsnClass::FarReturn,
            InsnClass::CondBranch,
        ];
        let syms = Symbolizer::new();
        for round in 0..200 {
            let clock = if round % 2 == 0 {
                Clock::Instructions
            } else {
                Clock::Tsc {
                    origin: 1000,
                    conversion: crate::view::TscConversion::Unknown,
                }
            };
            let mut tree = CallTree::default();
            let mut tl = TraceEvents::new(Vec::new(), clock);
            tl.begin_track(1, 1, "p", "t");
            let mut t = Tracker::new(&syms);
            let mut time = 1000u64;
            let mut total = 0u64;
            for _ in 0..rnd(400) {
                let ip = 0x1000 + rnd(32) * 0x10;
                if rnd(8) == 0 {
                    let kind = match rnd(6) {
                        0 => EventKind::Overflow { resume: None },
                        1 => EventKind::Disabled {
                            ip: Some(ip),
                            asynchronous: rnd(2) == 0,
                        },
                        2 => EventKind::Disabled {
                            ip: None,
                            asynchronous: false,
                        },
                        3 => EventKind::Enabled { ip },
                        4 => EventKind::AsyncBranch {
                            from: ip,
                            to: ip + 0x100,
                        },
                        _ => EventKind::Error {
                            kind: crate::flow::FlowErrorKind::NoCode,
                            ip: None,
                        },
                    };
                    t.event(
                        &mut tree,
                        &mut tl,
                        &Event {
                            offset: 0,
                            time,
                            kind,
                        },
                    );
                    continue;
                }
                time = match rnd(4) {
                    0 => time.saturating_sub(rnd(50)),
                    1 => time + rnd(500),
                    _ => time,
                };
                let count = 1 + rnd(6) as u32;
                total += u64::from(count);
                let run = Run {
                    start: ip,
                    count,
                    class: classes[rnd(classes.len() as u64) as usize],
                    next: ip + 5,
                    time,
                };
                t.block(&mut tree, &mut tl, run);
            }
            let sum = t.finish(&mut tree, &mut tl);
            tl.end_track(&tree.functions);
            let (bytes, ts) = tl.finish(Default::default()).unwrap();
            let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(sum.insns, total);
            assert_eq!(tree.total_insns(), total, "round {round}");
            let stacks_total: u64 = tree.stacks().iter().map(|s| s.self_insns).sum();
            assert_eq!(stacks_total, total);
            let sl = slices(&json);
            assert_eq!(sl.len() as u64, ts.slices);
            assert_eq!(ts.slices, sum.frames, "round {round}: one slice per frame");
            depths(&sl);
            for w in sl.windows(2) {
                assert!(w[0].1 < w[1].1, "round {round}: two slices start together");
            }
        }
    }

    #[test]
    fn depth_is_capped() {
        let (_, _, sum) = run(&recursion(MAX_DEPTH as u32 + 10), &[]);
        assert_eq!(sum.max_depth, MAX_DEPTH);
        // main, its call and 4106 recursive calls: 4108 frames.
        assert_eq!(sum.depth_capped, 12);
        assert_eq!(sum.unmatched_returns, 0);
    }
}
