//! [`RegisterFiles`]: the complete register files known at history positions (where recording
//! started, every stop of the live process, a saved recording's start, stops and end) — what
//! PC-only replay serves in full.
//!
//! GDB stops a program very often (every `stepi`, every step of a `next` or of a software
//! watchpoint), so the store is compact: the XSAVE image, by far the largest part, is shared
//! with the previous entry when it did not change.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::target::regs::gpr;
use crate::target::{RegMask, X86Registers};

#[derive(Debug, Clone)]
struct Entry {
    gprs: [u64; gpr::COUNT],
    xsave: Arc<Vec<u8>>,
    ymm_hi_offset: Option<usize>,
    unavailable: RegMask,
}

/// Register files by history position.
#[derive(Debug, Clone, Default)]
pub struct RegisterFiles {
    entries: BTreeMap<u64, Entry>,
    /// The XSAVE image of the last insertion, shared by later equal ones.
    last_xsave: Option<Arc<Vec<u8>>>,
}

impl RegisterFiles {
    /// Keeps `regs` as the register file at position `n` (replacing any earlier one there).
    pub fn insert(&mut self, n: u64, regs: X86Registers) {
        let xsave = match &self.last_xsave {
            Some(last) if **last == regs.xsave => Arc::clone(last),
            _ => Arc::new(regs.xsave),
        };
        self.last_xsave = Some(Arc::clone(&xsave));
        self.entries.insert(
            n,
            Entry {
                gprs: regs.gprs,
                xsave,
                ymm_hi_offset: regs.ymm_hi_offset,
                unavailable: regs.unavailable,
            },
        );
    }

    /// The register file at position `n`, if known.
    pub fn get(&self, n: u64) -> Option<X86Registers> {
        self.entries.get(&n).map(|e| X86Registers {
            gprs: e.gprs,
            xsave: (*e.xsave).clone(),
            ymm_hi_offset: e.ymm_hi_offset,
            unavailable: e.unavailable,
        })
    }

    /// Keeps the register file `other` has at `from` as the one at `n` (its XSAVE image still
    /// shared); `false` if `other` has none at `from`.
    pub fn insert_from(&mut self, other: &RegisterFiles, from: u64, n: u64) -> bool {
        let Some(e) = other.entries.get(&from) else {
            return false;
        };
        self.entries.insert(n, e.clone());
        true
    }

    /// Forgets the register file at the lowest position.
    pub fn pop_first(&mut self) {
        self.entries.pop_first();
    }

    /// The PC of the register file at `n`, if known.
    pub fn pc(&self, n: u64) -> Option<u64> {
        self.entries.get(&n).map(|e| e.gprs[gpr::RIP])
    }

    /// Whether a register file is known at `n`.
    pub fn contains(&self, n: u64) -> bool {
        self.entries.contains_key(&n)
    }

    /// How many positions have one.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The positions, ascending.
    pub fn positions(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.keys().copied()
    }

    /// Distinct XSAVE images kept (the rest are shared).
    pub fn distinct_xsave_images(&self) -> usize {
        let mut seen: Vec<*const Vec<u8>> = self
            .entries
            .values()
            .map(|e| Arc::as_ptr(&e.xsave))
            .collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(rip: u64, x: u8) -> X86Registers {
        let mut r = X86Registers::default();
        r.gprs[gpr::RIP] = rip;
        r.xsave = vec![x; 1024];
        r
    }

    #[test]
    fn equal_xsave_images_are_shared_and_values_come_back() {
        let mut f = RegisterFiles::default();
        f.insert(0, regs(0x10, 1));
        f.insert(5, regs(0x20, 1));
        f.insert(9, regs(0x30, 2));
        f.insert(12, regs(0x40, 2));
        assert_eq!(f.distinct_xsave_images(), 2);
        f.insert(5, regs(0x21, 1));
        assert_eq!(f.len(), 4);
        assert_eq!(f.get(5), Some(regs(0x21, 1)));
        assert_eq!(f.get(9), Some(regs(0x30, 2)));
        assert_eq!(f.pc(0), Some(0x10));
        assert!(f.get(1).is_none() && !f.contains(1));
        assert_eq!(f.positions().collect::<Vec<_>>(), vec![0, 5, 9, 12]);
        let mut g = RegisterFiles::default();
        assert!(g.insert_from(&f, 9, 100) && !g.insert_from(&f, 1, 101));
        assert_eq!(g.get(100), Some(regs(0x30, 2)));
        f.pop_first();
        assert_eq!(f.positions().next(), Some(5));
    }
}
