//! The code of a live process, read through procfs.
//!
//! [`ProcessSnapshot::capture`] parses `/proc/PID/maps`; [`ProcessImage::read`] then reads every
//! executable mapping (including `[vdso]`, and `[vsyscall]` where the kernel lets it be read)
//! through `/proc/PID/mem`. Reading the live process rather than the files is what makes JIT code,
//! relocated text and breakpoints-in-place come out right; when one file is mapped at several
//! addresses with identical contents, the sections share one buffer.
//!
//! Opening `/proc/PID/mem` needs ptrace-attach permission on the process (same user and, with Yama,
//! `ptrace_scope` 0 or being its ancestor, or `CAP_SYS_PTRACE`); failures name the pid and the file.
//! A mapping that cannot be read (the execute-only `[vsyscall]` page on current kernels) is listed
//! in [`ProcessImage::unreadable`], never dropped silently.

use std::collections::HashMap;
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Image, LoadError, MmapRecord, Section, SectionBytes, Segments};

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapEntry {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `r` permission.
    pub read: bool,
    /// `w` permission.
    pub write: bool,
    /// `x` permission.
    pub exec: bool,
    /// `s` (shared) rather than `p` (private).
    pub shared: bool,
    /// File offset of `start` (page offset for anonymous mappings).
    pub offset: u64,
    /// Device, as printed (`major:minor` in hex).
    pub dev: String,
    /// Inode; 0 for anonymous and pseudo mappings.
    pub inode: u64,
    /// Path or pseudo name (`[vdso]`, `[heap]`, `/x (deleted)` ...); `None` for anonymous memory.
    pub path: Option<String>,
}

impl MapEntry {
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// True for an empty mapping (never produced by the kernel).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if the mapping is backed by a file (a path and a non-zero inode).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.as_deref().is_some_and(|p| p.starts_with('/'))
    }

    /// The permissions as the kernel prints them (`r-xp`, `rw-s`).
    pub fn perms(&self) -> String {
        let flag = |set: bool, c: char| if set { c } else { '-' };
        [
            flag(self.read, 'r'),
            flag(self.write, 'w'),
            flag(self.exec, 'x'),
            if self.shared { 's' } else { 'p' },
        ]
        .iter()
        .collect()
    }

    /// The path for messages (`[anon]` for anonymous memory).
    pub fn name(&self) -> &str {
        self.path.as_deref().unwrap_or("[anon]")
    }

    /// Parses one line of `/proc/PID/maps`; `None` if malformed.
    pub fn parse_line(line: &str) -> Option<MapEntry> {
        let mut rest = line;
        let mut field = || {
            let t = rest.trim_start_matches(' ');
            let end = t.find(' ').unwrap_or(t.len());
            let (f, r) = t.split_at(end);
            rest = r;
            f
        };
        let range = field();
        let perms = field().as_bytes();
        let offset = field();
        let dev = field().to_string();
        let inode = field();
        let (start, end) = range.split_once('-')?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        if perms.len() != 4 || end < start || dev.is_empty() {
            return None;
        }
        // The path is the rest of the line after the padding; it may itself contain spaces.
        let path = rest.trim_start_matches(' ');
        Some(MapEntry {
            start,
            end,
            read: perms[0] == b'r',
            write: perms[1] == b'w',
            exec: perms[2] == b'x',
            shared: perms[3] == b's',
            offset: u64::from_str_radix(offset, 16).ok()?,
            dev,
            inode: inode.parse().ok()?,
            path: (!path.is_empty()).then(|| path.to_string()),
        })
    }
}

/// Parses the text of a `/proc/PID/maps` file; `source` names it in errors.
pub fn parse_maps(text: &str, source: &Path) -> Result<Vec<MapEntry>, LoadError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            MapEntry::parse_line(l).ok_or_else(|| LoadError::Maps {
                path: source.to_path_buf(),
                line: i + 1,
                text: l.to_string(),
            })
        })
        .collect()
}

/// Parses the text of a `/proc/PID/maps` file, skipping lines that do not parse, for callers
/// that only look for particular mappings ([`parse_maps`] reports such lines instead).
pub fn parse_maps_lenient(text: &str) -> impl Iterator<Item = MapEntry> + '_ {
    text.lines().filter_map(MapEntry::parse_line)
}

/// The path of process `pid`'s maps file, `/proc/PID/maps`.
pub fn maps_path(pid: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/maps"))
}

/// The address-space layout of a process at one moment: what to save with a recording so that
/// its image can be rebuilt later (from the files, or from saved bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSnapshot {
    /// The process id.
    pub pid: i32,
    /// Every mapping, in address order.
    pub mappings: Vec<MapEntry>,
}

fn hint_for(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::PermissionDenied => {
            " (reading another process needs ptrace permission: the same user and \
             /proc/sys/kernel/yama/ptrace_scope 0 or being its parent, or CAP_SYS_PTRACE)"
        }
        ErrorKind::NotFound => " (no such process)",
        _ => "",
    }
}

impl ProcessSnapshot {
    /// Reads `/proc/PID/maps`.
    pub fn capture(pid: i32) -> Result<Self, LoadError> {
        let path = maps_path(pid);
        let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Process {
            pid,
            hint: hint_for(source.kind()),
            path: path.clone(),
            source,
        })?;
        Ok(ProcessSnapshot {
            pid,
            mappings: parse_maps(&text, &path)?,
        })
    }

    /// The executable mappings.
    pub fn executable(&self) -> impl Iterator<Item = &MapEntry> {
        self.mappings.iter().filter(|m| m.exec)
    }

    /// The mappings as perf `MMAP2`-style records, so that a saved snapshot can be turned back
    /// into an image from the files with [`Image::from_mmaps`] (anonymous memory is named
    /// `//anon`, as perf names it).
    pub fn to_mmap_records(&self) -> Vec<MmapRecord> {
        self.mappings
            .iter()
            .map(|m| MmapRecord {
                pid: self.pid as u32,
                tid: self.pid as u32,
                addr: m.start,
                len: m.len(),
                pgoff: m.offset,
                filename: m.path.clone().unwrap_or_else(|| "//anon".to_string()),
                exec: m.exec,
            })
            .collect()
    }

    /// The lowest address at which `path` is mapped (its load base, for [`super::ElfSpec`]).
    pub fn base_of(&self, path: &Path) -> Option<u64> {
        let path = path.to_str()?;
        self.mappings
            .iter()
            .filter(|m| m.path.as_deref() == Some(path))
            .map(|m| m.start)
            .min()
    }
}

/// A mapping whose bytes could not be read.
#[derive(Debug, Clone)]
pub struct UnreadableMapping {
    /// The mapping.
    pub mapping: MapEntry,
    /// First address that could not be read.
    pub at: u64,
    /// The error.
    pub error: String,
}

/// The code of a live process.
#[derive(Debug, Clone)]
pub struct ProcessImage {
    /// The bytes read.
    pub image: Image,
    /// The layout the bytes were read from.
    pub snapshot: ProcessSnapshot,
    /// Mappings (or their tails) that could not be read.
    pub unreadable: Vec<UnreadableMapping>,
}

impl ProcessImage {
    /// Reads the executable mappings of process `pid`.
    pub fn read(pid: i32) -> Result<Self, LoadError> {
        Self::read_with(pid, Segments::Executable)
    }

    /// Reads the executable mappings (or, with [`Segments::AllLoadable`], every readable one).
    pub fn read_with(pid: i32, which: Segments) -> Result<Self, LoadError> {
        let snapshot = ProcessSnapshot::capture(pid)?;
        Self::read_snapshot(snapshot, which)
    }

    /// Reads the mappings listed in `snapshot` from the live process `snapshot.pid`.
    pub fn read_snapshot(snapshot: ProcessSnapshot, which: Segments) -> Result<Self, LoadError> {
        let pid = snapshot.pid;
        let mem_path = PathBuf::from(format!("/proc/{pid}/mem"));
        let mem = File::open(&mem_path).map_err(|source| LoadError::Process {
            pid,
            hint: hint_for(source.kind()),
            path: mem_path.clone(),
            source,
        })?;
        let mut image = Image::new();
        let mut unreadable = Vec::new();
        // Identical copies of one file range (the same library mapped twice) share a buffer.
        let mut shared: HashMap<(String, u64, u64, u64), Vec<SectionBytes>> = HashMap::new();
        let mut any_read = false;
        for m in &snapshot.mappings {
            let wanted = match which {
                Segments::Executable => m.exec,
                Segments::AllLoadable => m.exec || m.read,
            };
            if !wanted || m.is_empty() {
                continue;
            }
            let (bytes, failure) = read_range(&mem, m.start, m.len());
            if let Some(error) = failure {
                unreadable.push(UnreadableMapping {
                    mapping: m.clone(),
                    at: m.start + bytes.len() as u64,
                    error,
                });
            }
            if bytes.is_empty() {
                continue;
            }
            any_read = true;
            let mut bytes = SectionBytes::from(bytes);
            if m.is_file() {
                let key = (m.dev.clone(), m.inode, m.offset, bytes.len() as u64);
                let copies = shared.entry(key).or_default();
                match copies.iter().find(|c| ***c == *bytes) {
                    Some(same) => bytes = same.clone(),
                    None => copies.push(bytes.clone()),
                }
            }
            image.add(Section::new(m.start, bytes, m.name()))?;
        }
        let wanted_any = snapshot.mappings.iter().any(|m| m.exec);
        if !any_read && wanted_any {
            // Nothing at all could be read: report it as a failure of the process, not a list.
            let first = unreadable
                .first()
                .map(|u| {
                    format!(
                        ": first failure at {:#x} ({}): {}",
                        u.at,
                        u.mapping.name(),
                        u.error
                    )
                })
                .unwrap_or_default();
            return Err(LoadError::Process {
                pid,
                path: mem_path,
                source: std::io::Error::other(format!(
                    "no executable mapping could be read{first}"
                )),
                // Right after exec the kernel has not mapped the program yet.
                hint: " (has the process finished exec?)",
            });
        }
        Ok(ProcessImage {
            image,
            snapshot,
            unreadable,
        })
    }
}

/// Reads `len` bytes at `addr`; on failure returns the bytes read so far and the error.
fn read_range(mem: &File, addr: u64, len: u64) -> (Vec<u8>, Option<String>) {
    let Ok(len) = usize::try_from(len) else {
        return (
            Vec::new(),
            Some(format!("mapping of {len:#x} bytes is too large")),
        );
    };
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match mem.read_at(&mut buf[done..], addr + done as u64) {
            Ok(0) => {
                buf.truncate(done);
                return (buf, Some("end of file".to_string()));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                buf.truncate(done);
                return (buf, Some(e.to_string()));
            }
        }
    }
    (buf, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234                       /usr/bin/my prog
55d0c0a01000-55d0c0a02000 r-xp 00001000 08:01 1234                       /usr/bin/my prog
7ffd1a9e0000-7ffd1a9e2000 r-xp 00000000 00:00 0                          [vdso]
7f0000000000-7f0000001000 rw-p 00000000 00:00 0 
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";
        let maps = parse_maps(text, Path::new("test")).unwrap();
        assert_eq!(maps.len(), 5);
        assert_eq!(maps[1].start, 0x55d0c0a01000);
        assert_eq!(maps[1].offset, 0x1000);
        assert!(maps[1].exec && maps[1].read && !maps[1].write && !maps[1].shared);
        assert_eq!(maps[1].path.as_deref(), Some("/usr/bin/my prog"));
        assert!(maps[1].is_file());
        assert_eq!(maps[2].path.as_deref(), Some("[vdso]"));
        assert!(!maps[2].is_file());
        assert_eq!(maps[3].path, None);
        assert!(maps[4].exec && !maps[4].read);
        let err = parse_maps("zz-1 r-xp 0 0 0\n", Path::new("bad")).unwrap_err();
        assert!(matches!(err, LoadError::Maps { line: 1, .. }));
        assert_eq!(maps[1].perms(), "r-xp");
        assert_eq!(maps[3].perms(), "rw-p");
        assert_eq!(maps[4].perms(), "--xp");
        let lenient: Vec<_> = parse_maps_lenient(&format!("garbage\n{text}")).collect();
        assert_eq!(lenient, maps);
    }
}
