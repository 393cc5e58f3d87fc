//! The call tree: which function ran, called from where, for how many instructions.
//!
//! [`Tracker`](super::Tracker) follows one trace stream's blocks and events and keeps its call
//! stack; [`CallTree`] aggregates every stack it saw (a trie of functions with instruction counts, the
//! flame graph's data) and the tracker reports every frame it opens and closes to a
//! [`CallSink`] (the timeline). Memory is bounded by the number of *distinct* call stacks and
//! the stack depth (capped at [`MAX_DEPTH`]), never by the number of instructions or calls.
//!
//! What counts as a call and a return is the tracker's ([`super::tracker`]).

use std::collections::HashMap;

use crate::image::Symbolizer;

/// The deepest call stack followed; deeper calls are counted in
/// [`TrackSummary::depth_capped`](super::TrackSummary::depth_capped)
/// and their instructions go to the frame at this depth.
pub const MAX_DEPTH: usize = 4096;

/// How many times per segment a return out of the outermost frame makes the returned-to
/// function its parent (the timeline reserves that many nanoseconds at each segment start).
pub const MAX_OUTER: u32 = 16;

/// An interned function: the symbol containing a call target, or the bare address when no
/// symbol does.
pub type FuncId = u32;

/// The functions seen: name, entry address and the name as a JSON string (for the timeline).
#[derive(Debug, Default, Clone)]
pub struct Functions {
    by_key: FastMap<u64, FuncId>,
    /// ip → function, for targets already resolved.
    by_ip: FastMap<u64, FuncId>,
    names: Vec<String>,
    keys: Vec<u64>,
}

impl Functions {
    /// The function containing `ip` and whether `ip` is its first byte.
    pub(crate) fn resolve(&mut self, symbols: &Symbolizer, ip: u64) -> FuncId {
        if let Some(&f) = self.by_ip.get(&ip) {
            return f;
        }
        let (key, name) = match symbols.symbol_info(ip) {
            Some(s) => (s.addr, s.name.replace(';', ":")),
            None => (ip, format!("{ip:#x}")),
        };
        let f = match self.by_key.get(&key) {
            Some(&f) => f,
            None => {
                let f = self.names.len() as FuncId;
                self.names.push(name);
                self.keys.push(key);
                self.by_key.insert(key, f);
                f
            }
        };
        self.by_ip.insert(ip, f);
        f
    }

    /// The function's name (`;` replaced by `:`, since folded stacks separate frames with it).
    pub fn name(&self, f: FuncId) -> &str {
        self.names.get(f as usize).map_or("?", String::as_str)
    }

    /// The address the function is keyed by (its symbol's start, or the address called).
    pub fn key(&self, f: FuncId) -> u64 {
        self.keys.get(f as usize).copied().unwrap_or(0)
    }

    /// How many functions were seen.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no function was seen.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// One node of the stack trie: a function called from its parent's stack.
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    /// The parent node ([`NONE`] for a segment's outermost node until it is merged).
    parent: u32,
    func: FuncId,
    /// Instructions executed with this stack innermost.
    pub(super) self_insns: u64,
    /// Frames opened with this stack.
    pub(super) calls: u64,
    first_child: u32,
    next_sibling: u32,
}

/// The trie's root: no function. Its descendants are the merged stacks.
const ROOT: u32 = 0;

/// No node.
const NONE: u32 = u32::MAX;

/// A fast hasher for the small integer keys of the call tree (FxHash's multiply-rotate): the
/// tree is looked up once per call, and SipHash would cost more than the rest of the call.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` with [`FxHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;

/// Every call stack seen, with instruction counts: the flame graph's data, shared by every
/// stream of a recording.
///
/// The stacks of the segment being followed hang from their own outermost node (the trace may
/// still reveal callers of it, see [`MAX_OUTER`]); when the segment ends they are merged into
/// the tree under its root and their nodes reused, so the tree holds the distinct stacks of the
/// whole recording plus those of one segment.
#[derive(Debug, Clone)]
pub struct CallTree {
    pub(super) nodes: Vec<Node>,
    children: FastMap<(u32, FuncId), u32>,
    free: Vec<u32>,
    /// The functions the nodes name.
    pub functions: Functions,
}

impl Default for CallTree {
    fn default() -> Self {
        CallTree {
            nodes: vec![Node {
                parent: NONE,
                func: FuncId::MAX,
                self_insns: 0,
                calls: 0,
                first_child: NONE,
                next_sibling: NONE,
            }],
            children: FastMap::default(),
            free: Vec::new(),
            functions: Functions::default(),
        }
    }
}

/// One distinct call stack of a [`CallTree`] (see [`CallTree::stacks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    /// The functions, outermost first.
    pub frames: Vec<String>,
    /// Instructions executed with exactly this stack (innermost frame running).
    pub self_insns: u64,
    /// Times a frame with this stack was opened.
    pub calls: u64,
}

impl CallTree {
    fn alloc(&mut self, parent: u32, func: FuncId) -> u32 {
        let node = Node {
            parent,
            func,
            self_insns: 0,
            calls: 0,
            first_child: NONE,
            next_sibling: NONE,
        };
        let n = match self.free.pop() {
            Some(n) => {
                self.nodes[n as usize] = node;
                n
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if parent != NONE {
            self.link(parent, n);
        }
        n
    }

    fn link(&mut self, parent: u32, n: u32) {
        self.nodes[n as usize].parent = parent;
        self.nodes[n as usize].next_sibling = self.nodes[parent as usize].first_child;
        self.nodes[parent as usize].first_child = n;
    }

    /// A segment's outermost node: not under [`ROOT`] until the segment is merged.
    pub(super) fn segment_root(&mut self, func: FuncId) -> u32 {
        self.alloc(NONE, func)
    }

    pub(super) fn child(&mut self, parent: u32, func: FuncId) -> u32 {
        if let Some(&n) = self.children.get(&(parent, func)) {
            return n;
        }
        let n = self.alloc(parent, func);
        self.children.insert((parent, func), n);
        n
    }

    /// Makes `outer` (a fresh segment root) the parent of the segment root `root`.
    pub(super) fn put_under(&mut self, root: u32, outer: u32) {
        self.link(outer, root);
        self.children
            .insert((outer, self.nodes[root as usize].func), root);
    }

    /// Adds the segment whose outermost node is `local` to the stacks under [`ROOT`] and frees
    /// its nodes.
    pub(super) fn merge_segment(&mut self, local: u32) {
        let mut work = vec![(local, ROOT)];
        // Freed only at the end: a reused slot would alias the keys still to be removed.
        let mut freed = Vec::new();
        while let Some((l, shared_parent)) = work.pop() {
            let node = self.nodes[l as usize];
            if node.parent != NONE {
                self.children.remove(&(node.parent, node.func));
            }
            let s = self.child(shared_parent, node.func);
            self.nodes[s as usize].self_insns += node.self_insns;
            self.nodes[s as usize].calls += node.calls;
            let mut c = node.first_child;
            while c != NONE {
                work.push((c, s));
                c = self.nodes[c as usize].next_sibling;
            }
            self.nodes[l as usize].self_insns = 0;
            self.nodes[l as usize].calls = 0;
            freed.push(l);
        }
        self.free.extend(freed);
    }

    /// Total instructions attributed.
    pub fn total_insns(&self) -> u64 {
        self.nodes.iter().map(|n| n.self_insns).sum()
    }

    /// Number of trie nodes in use: the memory the tree holds.
    pub fn node_count(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Every distinct call stack with instructions or calls, merged across segments and
    /// streams, sorted by frames.
    pub fn stacks(&self) -> Vec<Stack> {
        let kids = |n: u32| {
            let mut out = Vec::new();
            let mut c = self.nodes[n as usize].first_child;
            while c != NONE {
                out.push(c);
                c = self.nodes[c as usize].next_sibling;
            }
            out
        };
        let mut merged: std::collections::BTreeMap<Vec<FuncId>, (u64, u64)> = Default::default();
        let mut path: Vec<FuncId> = Vec::new();
        // Iterative depth-first walk: (node, entering?)
        let mut work: Vec<(u32, bool)> = kids(ROOT).into_iter().map(|k| (k, true)).collect();
        while let Some((n, enter)) = work.pop() {
            if !enter {
                path.pop();
                continue;
            }
            let node = self.nodes[n as usize];
            path.push(node.func);
            if node.self_insns > 0 || node.calls > 0 {
                let e = merged.entry(path.clone()).or_default();
                e.0 += node.self_insns;
                e.1 += node.calls;
            }
            work.push((n, false));
            work.extend(kids(n).into_iter().map(|k| (k, true)));
        }
        let mut out: Vec<Stack> = merged
            .into_iter()
            .map(|(p, (s, c))| Stack {
                frames: p
                    .iter()
                    .map(|&f| self.functions.name(f).to_string())
                    .collect(),
                self_insns: s,
                calls: c,
            })
            .collect();
        out.sort_by(|a, b| a.frames.cmp(&b.frames));
        out
    }

    /// The folded-stack lines (`outer;inner COUNT`, Brendan Gregg's format, counting
    /// instructions) of every stack that executed instructions.
    pub fn folded(&self) -> Vec<String> {
        self.stacks()
            .into_iter()
            .filter(|s| s.self_insns > 0)
            .map(|s| format!("{} {}", s.frames.join(";"), s.self_insns))
            .collect()
    }
}

/// Where the [`Tracker`](super::Tracker) reports frames: the timeline. Instruction numbers
/// count from the stream's first instruction; `time` is the flow decoder's timestamp (TSC
/// ticks, 0 without timing packets).
pub trait CallSink {
    /// A block of instructions starting at instruction `n` runs at `time`.
    fn tick(&mut self, n: u64, time: u64, functions: &Functions);
    /// A frame for `func` opens at instruction `n` (its first instruction), innermost.
    fn open(&mut self, n: u64, func: FuncId, functions: &Functions);
    /// A frame for `func` becomes the outermost one (the trace began inside it; see
    /// [`MAX_OUTER`]); it encloses everything of the segment so far.
    fn open_outer(&mut self, func: FuncId, functions: &Functions);
    /// The innermost frame closes before instruction `n`; it ran `insns` instructions
    /// (`self_insns` of them itself).
    fn close(&mut self, n: u64, insns: u64, self_insns: u64, functions: &Functions);
}
