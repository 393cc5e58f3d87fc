//! What a search looks for: the [`IpMatch`] trait, the breakpoint set ([`BreakpointSet`]) and
//! the closure adapter ([`MatchFn`]). Both the segment walk ([`super::segment`]) and the scans
//! ([`super::search`]) take one; neither imports the other for it.

/// Decides which instruction addresses a search stops at.
pub trait IpMatch {
    /// Whether the instruction at `ip` is a hit.
    fn matches(&mut self, ip: u64) -> bool;

    /// Whether some instruction in the address range `start ..= end` may be a hit. Returning
    /// `false` lets a search skip a whole run of instructions without looking at each one; the
    /// default (always `true`) looks at every instruction.
    fn may_match_range(&self, start: u64, end: u64) -> bool {
        let _ = (start, end);
        true
    }

    /// Whether some instruction of a block of code may be a hit: the block's instructions start
    /// at `start` and have the lengths `lens` (each one follows the previous). Searches ask this
    /// once per block of the decoder's block cache and keep the answer for the whole search, so
    /// a `false` lets them pass over every later run of that block without handing it out of the
    /// decoder; it must therefore give the same answer for the same block throughout a search.
    /// The default asks [`may_match_range`](Self::may_match_range) for the block's address
    /// range.
    fn may_match_insns(&self, start: u64, lens: &[u8]) -> bool {
        let last = lens[..lens.len().saturating_sub(1)]
            .iter()
            .fold(start, |ip, &l| ip.wrapping_add(l as u64));
        self.may_match_range(start, last)
    }

    /// Every address that can match, when the matcher is a finite set of addresses. Searches then
    /// skip, without decoding, every segment whose [code summary](super::CodeSummary) rules all of them
    /// out. The default (`None`) decodes every segment.
    fn addresses(&self) -> Option<&[u64]> {
        None
    }

    /// An independent copy for another thread, so a long search can decode several segments at
    /// once. The default (`None`) keeps the search on the calling thread.
    fn fork(&self) -> Option<Box<dyn IpMatch + Send>> {
        None
    }
}

impl IpMatch for Box<dyn IpMatch + Send> {
    fn matches(&mut self, ip: u64) -> bool {
        (**self).matches(ip)
    }
    fn may_match_range(&self, start: u64, end: u64) -> bool {
        (**self).may_match_range(start, end)
    }
    fn may_match_insns(&self, start: u64, lens: &[u8]) -> bool {
        (**self).may_match_insns(start, lens)
    }
    fn addresses(&self) -> Option<&[u64]> {
        (**self).addresses()
    }
    fn fork(&self) -> Option<Box<dyn IpMatch + Send>> {
        (**self).fork()
    }
}

/// An [`IpMatch`] from a closure over the instruction address (looks at every instruction).
#[derive(Debug, Clone, Copy)]
pub struct MatchFn<F>(pub F);

impl<F: FnMut(u64) -> bool> IpMatch for MatchFn<F> {
    fn matches(&mut self, ip: u64) -> bool {
        (self.0)(ip)
    }
}

/// A set of breakpoint addresses. Searches with it pass over every run of a block of code none of
/// whose instructions starts at a breakpoint, so a reverse-continue costs less than decoding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BreakpointSet {
    pub(super) sorted: Vec<u64>,
}

impl BreakpointSet {
    /// A set of the given addresses (duplicates are dropped).
    pub fn new(addrs: impl IntoIterator<Item = u64>) -> Self {
        let mut sorted: Vec<u64> = addrs.into_iter().collect();
        sorted.sort_unstable();
        sorted.dedup();
        BreakpointSet { sorted }
    }

    /// The addresses, sorted.
    pub fn addrs(&self) -> &[u64] {
        &self.sorted
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
}

impl IpMatch for BreakpointSet {
    #[inline]
    fn matches(&mut self, ip: u64) -> bool {
        self.sorted.binary_search(&ip).is_ok()
    }

    #[inline]
    fn may_match_range(&self, start: u64, end: u64) -> bool {
        if end < start {
            // The run wrapped around the address space (16/32-bit code): be conservative.
            return !self.sorted.is_empty();
        }
        let i = self.sorted.partition_point(|&a| a < start);
        i < self.sorted.len() && self.sorted[i] <= end
    }

    /// Exact: whether one of the block's instructions starts at a breakpoint (a breakpoint in
    /// the middle of an instruction is never hit).
    fn may_match_insns(&self, start: u64, lens: &[u8]) -> bool {
        let Some((_, before_last)) = lens.split_last() else {
            return false;
        };
        let last = before_last
            .iter()
            .fold(start, |ip, &l| ip.wrapping_add(l as u64));
        // Only a block whose address range holds a breakpoint is looked at per instruction.
        if !self.may_match_range(start, last) {
            return false;
        }
        let mut ip = start;
        lens.iter().any(|&l| {
            let hit = self.sorted.binary_search(&ip).is_ok();
            ip = ip.wrapping_add(l as u64);
            hit
        })
    }

    fn addresses(&self) -> Option<&[u64]> {
        Some(&self.sorted)
    }

    fn fork(&self) -> Option<Box<dyn IpMatch + Send>> {
        Some(Box::new(self.clone()))
    }
}

/// `&mut dyn IpMatch` as an [`IpMatch`] (for the shared search code).
pub(super) struct DynMatch<'m>(pub(super) &'m mut dyn IpMatch);

impl IpMatch for DynMatch<'_> {
    #[inline]
    fn matches(&mut self, ip: u64) -> bool {
        self.0.matches(ip)
    }
    #[inline]
    fn may_match_range(&self, start: u64, end: u64) -> bool {
        self.0.may_match_range(start, end)
    }
    #[inline]
    fn may_match_insns(&self, start: u64, lens: &[u8]) -> bool {
        self.0.may_match_insns(start, lens)
    }
}
