//! Small readers for /proc/PID files: auxv and maps (parsed by [`crate::image::procfs`]).

use super::{TargetError, TargetResult};
use crate::image::procfs::{self, MapEntry};
use std::path::PathBuf;

/// Reads the raw auxiliary vector of a process.
pub fn read_auxv(pid: i32) -> TargetResult<Vec<u8>> {
    let path = PathBuf::from(format!("/proc/{pid}/auxv"));
    std::fs::read(&path).map_err(|source| TargetError::Io { path, source })
}

/// Reads and parses /proc/PID/maps. Lines that do not parse are skipped (the kernel's format
/// is fixed; a skipped line would mean a kernel we do not know).
pub fn read_maps(pid: i32) -> TargetResult<Vec<MapEntry>> {
    let path = procfs::maps_path(pid);
    let text = std::fs::read_to_string(&path).map_err(|source| TargetError::Io { path, source })?;
    Ok(procfs::parse_maps_lenient(&text).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_maps_line(line: &str) -> Option<MapEntry> {
        MapEntry::parse_line(line)
    }

    #[test]
    fn parses_maps_lines() {
        let m = parse_maps_line(
            "555555554000-555555555000 r--p 00000000 08:01 1234                       /tmp/a b",
        )
        .unwrap();
        assert_eq!(m.start, 0x5555_5555_4000);
        assert_eq!(m.end, 0x5555_5555_5000);
        assert_eq!(m.perms(), "r--p");
        assert_eq!(m.path.as_deref(), Some("/tmp/a b"));
        let anon = parse_maps_line("7ffff7fc1000-7ffff7fc5000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(anon.path, None);
        assert!(parse_maps_line("garbage").is_none());
    }

    #[test]
    fn reads_own_maps_and_auxv() {
        let pid = std::process::id() as i32;
        assert!(!read_maps(pid).unwrap().is_empty());
        assert_eq!(read_auxv(pid).unwrap().len() % 16, 0);
    }
}
