//! Files as the debugged program sees them, for the debugger's host I/O (GDB's `vFile:`
//! packets): GDB reads `/proc/PID/task/PID/maps` (the vDSO's range) and, with its default
//! sysroot `target:`, the executable and the shared libraries through them.
//!
//! Read-only by design: a debugger may look at the program's files, never change them.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An open file of the target, read-only.
#[derive(Debug)]
pub enum TargetFile {
    /// A regular file of this machine, opened read-only.
    Host(File),
    /// Contents known in full: a `/proc` file made from what was recorded, or a file saved
    /// with a recording.
    Bytes(Arc<[u8]>),
}

/// What `fstat` says about a [`TargetFile`] (the fields GDB's host I/O carries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStat {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Type and permission bits (`S_IFREG | 0o444` for contents known in full).
    pub mode: u32,
    /// Hard links.
    pub nlink: u64,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Preferred I/O block size.
    pub blksize: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Last access, modification and status change (seconds since the epoch).
    pub times: [i64; 3],
}

impl TargetFile {
    /// Reads up to `buf.len()` bytes at `offset`; 0 at the end of the file.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        match self {
            TargetFile::Host(f) => f.read_at(buf, offset),
            TargetFile::Bytes(b) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(b.len());
                let n = buf.len().min(b.len() - start);
                buf[..n].copy_from_slice(&b[start..start + n]);
                Ok(n)
            }
        }
    }

    /// The whole file, up to `limit` bytes (a `/proc` file says size 0: read to its end).
    pub fn read_to_end(&self, limit: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while out.len() < limit {
            let n = self.read_at(&mut buf, out.len() as u64)?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n.min(limit - out.len())]);
        }
        Ok(out)
    }

    /// The file's status.
    pub fn stat(&self) -> io::Result<FileStat> {
        match self {
            TargetFile::Host(f) => {
                let m = f.metadata()?;
                Ok(FileStat {
                    dev: m.dev(),
                    ino: m.ino(),
                    mode: m.mode(),
                    nlink: m.nlink(),
                    uid: m.uid(),
                    gid: m.gid(),
                    size: m.size(),
                    blksize: m.blksize(),
                    blocks: m.blocks(),
                    times: [m.atime(), m.mtime(), m.ctime()],
                })
            }
            TargetFile::Bytes(b) => Ok(FileStat {
                mode: libc::S_IFREG | 0o444,
                nlink: 1,
                size: b.len() as u64,
                blksize: 4096,
                blocks: (b.len() as u64).div_ceil(512),
                ..FileStat::default()
            }),
        }
    }
}

/// Opens a file of this machine read-only for a debugger: `O_NONBLOCK` so that a FIFO cannot
/// hang the server, and regular files only (a device such as `/dev/zero` or a directory is
/// refused with `ENODEV`/`EISDIR`). Symbolic links are followed, as the program's own `open`
/// would.
pub fn open_host_file(path: &Path) -> io::Result<TargetFile> {
    let f = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)?;
    let t = f.metadata()?.file_type();
    if t.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    if !t.is_file() {
        return Err(io::Error::from_raw_os_error(libc::ENODEV));
    }
    Ok(TargetFile::Host(f))
}

/// The target of a symbolic link of this machine.
pub fn read_host_link(path: &Path) -> io::Result<PathBuf> {
    std::fs::read_link(path)
}

/// If `path` is the maps file of process `pid` (`/proc/PID/maps`, `/proc/PID/task/TID/maps`
/// for one of `tids`), true. GDB reads the thread's file to find the vDSO.
pub fn is_proc_maps(path: &Path, pid: i32, tids: &[i32]) -> bool {
    let Some(rest) = path
        .to_str()
        .and_then(|p| p.strip_prefix(&format!("/proc/{pid}/")))
    else {
        return false;
    };
    if rest == "maps" {
        return true;
    }
    rest.strip_prefix("task/")
        .and_then(|r| r.strip_suffix("/maps"))
        .and_then(|t| t.parse::<i32>().ok())
        .is_some_and(|t| t == pid || tids.contains(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_maps_paths() {
        let p = |s: &str| is_proc_maps(Path::new(s), 42, &[43]);
        assert!(p("/proc/42/maps"));
        assert!(p("/proc/42/task/42/maps"));
        assert!(p("/proc/42/task/43/maps"));
        assert!(!p("/proc/42/task/44/maps"));
        assert!(!p("/proc/421/maps"));
        assert!(!p("/proc/42/smaps"));
        assert!(!p("/proc/42/task/42/maps/x"));
        assert!(!p("/proc/self/maps"));
    }

    #[test]
    fn bytes_files_read_and_stat() {
        let f = TargetFile::Bytes(Arc::from(&b"hello"[..]));
        let mut buf = [0; 4];
        assert_eq!(f.read_at(&mut buf, 3).unwrap(), 2);
        assert_eq!(&buf[..2], b"lo");
        assert_eq!(f.read_at(&mut buf, 9).unwrap(), 0);
        assert_eq!(f.read_at(&mut buf, u64::MAX).unwrap(), 0);
        let s = f.stat().unwrap();
        assert_eq!((s.size, s.mode & libc::S_IFMT), (5, libc::S_IFREG));
    }

    #[test]
    fn host_files_are_regular_files_only() {
        let err = |p: &str| {
            open_host_file(Path::new(p))
                .err()
                .and_then(|e| e.raw_os_error())
        };
        assert_eq!(err("/dev/zero"), Some(libc::ENODEV));
        assert_eq!(err("/"), Some(libc::EISDIR));
        assert_eq!(err("/nonexistent/ptrewind"), Some(libc::ENOENT));
        assert!(open_host_file(Path::new("/proc/self/maps")).is_ok());
    }
}
