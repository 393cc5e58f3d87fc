//! [`ImmutableCode`]: the address ranges whose bytes cannot have changed while they were
//! mapped (read-only, executable, file-backed code), each with the history position it was
//! mapped from — where a read of the past can be served from a code image.

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
        let ranges = super::procfs::parse_maps_lenient(text)
            .filter(|m| {
                let fixed = m.read && !m.write && m.exec;
                let path = m.path.as_deref().unwrap_or("");
                fixed && (path.starts_with('/') || path == "[vdso]")
            })
            .map(|m| (m.start, m.end))
            .collect();
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
}
