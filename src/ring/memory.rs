//! A model of physical memory for the output schemes.
//!
//! The SDM describes both output schemes in terms of *physical addresses*: IA32_RTIT_OUTPUT_BASE
//! holds a physical address, every ToPA entry holds the physical base of a region or of the next
//! table (SDM §33.2.7.2, Table 33-3), and the processor reads table entries from memory at
//! `proc_trace_table_base + proc_trace_table_offset`. [`Memory`] gives those addresses a meaning:
//! it is a set of disjoint, individually allocated blocks ("RAM") plus a list of restricted ranges
//! (the SMRR ranges of SDM §33.2.7.4). Tables are ordinary memory: an entry is the little-endian
//! `u64` at its address, so tests can build tables from raw words exactly as the kernel does.
//!
//! Addresses that no block covers are *unbacked*: real hardware would store to (or read) whatever
//! lies there, the model cannot, so touching them is reported as an error by the output schemes
//! (a model-only condition, documented as such where it is raised).

use std::collections::BTreeMap;
use std::ops::Range;

/// Why a [`Memory`] operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// The block would overlap an existing block.
    #[error("block {start:#x}..{end:#x} overlaps an existing block")]
    Overlap {
        /// First address of the refused block.
        start: u64,
        /// One past the last address of the refused block.
        end: u64,
    },
    /// Part of the range is not covered by a single block.
    #[error("{len} bytes at {addr:#x} are not backed by one allocated block")]
    Unbacked {
        /// First address of the access.
        addr: u64,
        /// Length of the access.
        len: u64,
    },
    /// The request is empty, overflows the address space or its alignment is not a power of two.
    #[error("invalid allocation request: {len} bytes aligned to {align}")]
    BadRequest {
        /// Requested length.
        len: u64,
        /// Requested alignment.
        align: u64,
    },
}

#[derive(Debug, Clone)]
struct Block {
    start: u64,
    bytes: Vec<u8>,
}

/// Physical memory: disjoint allocated blocks addressed by physical address, plus restricted
/// (SMRR) ranges.
#[derive(Debug, Clone)]
pub struct Memory {
    blocks: Vec<Block>,
    /// Block start → index into `blocks`.
    index: BTreeMap<u64, usize>,
    restricted: Vec<Range<u64>>,
    /// Next address [`Memory::alloc`] tries.
    next_free: u64,
}

impl Default for Memory {
    fn default() -> Self {
        Self::new()
    }
}

/// A cached location of a byte range inside one block, so the writer's hot path avoids the
/// address lookup (see [`Memory::locate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    pub(crate) block: usize,
    pub(crate) offset: usize,
}

impl Memory {
    /// Where [`Memory::alloc`] starts placing blocks: 4 GiB, so models exercise addresses above
    /// 32 bits like real ToPA buffers do.
    pub const ALLOC_START: u64 = 0x1_0000_0000;

    /// Empty memory.
    pub fn new() -> Self {
        Memory {
            blocks: Vec::new(),
            index: BTreeMap::new(),
            restricted: Vec::new(),
            next_free: Self::ALLOC_START,
        }
    }

    /// Adds a zero-filled block at `start..start + len`.
    pub fn add_block(&mut self, start: u64, len: u64) -> Result<(), MemoryError> {
        let end = start
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(MemoryError::BadRequest { len, align: 1 })?;
        let size = usize::try_from(len).map_err(|_| MemoryError::BadRequest { len, align: 1 })?;
        if let Some((_, &i)) = self.index.range(..end).next_back() {
            let b = &self.blocks[i];
            if b.start + b.bytes.len() as u64 > start {
                return Err(MemoryError::Overlap { start, end });
            }
        }
        self.index.insert(start, self.blocks.len());
        self.blocks.push(Block {
            start,
            bytes: vec![0; size],
        });
        self.next_free = self.next_free.max(end);
        Ok(())
    }

    /// Allocates a zero-filled block of `len` bytes aligned to `align` (a power of two) above
    /// every block allocated so far, and returns its physical address.
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<u64, MemoryError> {
        if !align.is_power_of_two() || len == 0 {
            return Err(MemoryError::BadRequest { len, align });
        }
        let start = self
            .next_free
            .checked_add(align - 1)
            .map(|a| a & !(align - 1))
            .ok_or(MemoryError::BadRequest { len, align })?;
        self.add_block(start, len)?;
        Ok(start)
    }

    /// Marks `range` as restricted memory (an SMRR range, SDM §33.2.7.4). Trace output must not
    /// go there; reads of it return all ones.
    pub fn restrict(&mut self, range: Range<u64>) {
        self.restricted.push(range);
    }

    /// The first restricted address inside `start..start + len`, if any.
    pub fn first_restricted(&self, start: u64, len: u64) -> Option<u64> {
        let end = start.saturating_add(len);
        self.restricted
            .iter()
            .filter(|r| r.start < end && start < r.end)
            .map(|r| r.start.max(start))
            .min()
    }

    pub(crate) fn locate(&self, addr: u64, len: u64) -> Option<Location> {
        let (_, &i) = self.index.range(..=addr).next_back()?;
        let b = &self.blocks[i];
        let offset = addr - b.start;
        let end = offset.checked_add(len)?;
        (end <= b.bytes.len() as u64).then_some(Location {
            block: i,
            offset: usize::try_from(offset).ok()?,
        })
    }

    /// Copies `bytes` to a location found by [`Memory::locate`]. The caller guarantees the
    /// range lies inside the block (it was located with at least this length).
    pub(crate) fn write_at(&mut self, loc: Location, bytes: &[u8]) {
        let b = &mut self.blocks[loc.block].bytes;
        b[loc.offset..loc.offset + bytes.len()].copy_from_slice(bytes);
    }

    /// The bytes at `addr..addr + len`, or `None` if they are not inside one block.
    pub fn read(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let loc = self.locate(addr, len)?;
        let len = usize::try_from(len).ok()?;
        Some(&self.blocks[loc.block].bytes[loc.offset..loc.offset + len])
    }

    /// Mutable access to `addr..addr + len`, or `None` if they are not inside one block.
    pub fn read_mut(&mut self, addr: u64, len: u64) -> Option<&mut [u8]> {
        let loc = self.locate(addr, len)?;
        let len = usize::try_from(len).ok()?;
        Some(&mut self.blocks[loc.block].bytes[loc.offset..loc.offset + len])
    }

    /// Writes `bytes` at `addr`.
    pub fn write(&mut self, addr: u64, bytes: &[u8]) -> Result<(), MemoryError> {
        let len = bytes.len() as u64;
        let dst = self
            .read_mut(addr, len)
            .ok_or(MemoryError::Unbacked { addr, len })?;
        dst.copy_from_slice(bytes);
        Ok(())
    }

    /// Reads the little-endian `u64` at `addr` (a ToPA entry). Restricted memory reads as all
    /// ones (SDM Table 33-5); unbacked memory is `None`.
    pub fn read_u64(&self, addr: u64) -> Option<u64> {
        if self.first_restricted(addr, 8).is_some() {
            return Some(u64::MAX);
        }
        let b = self.read(addr, 8)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        Some(u64::from_le_bytes(w))
    }

    /// Writes `value` little-endian at `addr` (e.g. a raw ToPA entry).
    pub fn write_u64(&mut self, addr: u64, value: u64) -> Result<(), MemoryError> {
        self.write(addr, &value.to_le_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_aligns_and_never_overlaps() {
        let mut m = Memory::new();
        let a = m.alloc(100, 4096).unwrap();
        let b = m.alloc(8192, 8192).unwrap();
        assert_eq!(a % 4096, 0);
        assert_eq!(b % 8192, 0);
        assert!(b >= a + 100);
        assert!(m.add_block(a + 50, 10).is_err());
        assert!(m.read(a + 90, 20).is_none(), "crosses the end of a block");
        m.write_u64(a + 8, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(m.read_u64(a + 8), Some(0x1122_3344_5566_7788));
        assert_eq!(m.read(a + 8, 1), Some(&[0x88u8][..]));
    }

    #[test]
    fn restricted_reads_as_ones() {
        let mut m = Memory::new();
        let a = m.alloc(4096, 4096).unwrap();
        m.restrict(a + 16..a + 32);
        assert_eq!(m.read_u64(a + 8), Some(0));
        assert_eq!(m.read_u64(a + 16), Some(u64::MAX));
        assert_eq!(m.first_restricted(a, 4096), Some(a + 16));
        assert_eq!(m.first_restricted(a + 32, 100), None);
    }
}
