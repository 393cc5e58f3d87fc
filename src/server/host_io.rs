//! GDB's host I/O (`vFile:setfs/open/pread/fstat/close/readlink`), read-only, over the
//! target's view of its files ([`Target::open_file`](crate::target::Target::open_file)).
//!
//! GDB reads `/proc/PID/task/PID/maps` through host I/O at every connection (to find the
//! vDSO) and warned "unable to open /proc file" while the server had none; with its default
//! sysroot `target:` it then also reads the executable and the shared libraries this way, as
//! from gdbserver. Writing, creating and unlinking are refused with `EROFS`: a debugger may
//! look at the program's files, never change them through us.

use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use gdbstub::target::ext::host_io::{
    FsKind, HostIo, HostIoClose, HostIoCloseOps, HostIoErrno, HostIoError, HostIoFstat,
    HostIoFstatOps, HostIoOpen, HostIoOpenFlags, HostIoOpenMode, HostIoOpenOps, HostIoPread,
    HostIoPreadOps, HostIoReadlink, HostIoReadlinkOps, HostIoResult, HostIoSetfs, HostIoSetfsOps,
    HostIoStat, HostIoUnlink, HostIoUnlinkOps,
};

use super::GdbStubAdapter;
use crate::target::TargetFile;

/// How many files a debugger may hold open at once (GDB holds one or two).
pub const MAX_OPEN_FILES: usize = 64;

/// The files a debugger opened, by descriptor (the index).
#[derive(Debug, Default)]
pub struct OpenFiles {
    slots: Vec<Option<TargetFile>>,
}

impl OpenFiles {
    /// Stores `file` under the lowest free descriptor; `None` when [`MAX_OPEN_FILES`] are open.
    pub fn insert(&mut self, file: TargetFile) -> Option<u32> {
        let fd = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.slots.len() < MAX_OPEN_FILES => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => return None,
        };
        self.slots[fd] = Some(file);
        u32::try_from(fd).ok()
    }

    /// The open file `fd`.
    pub fn get(&self, fd: u32) -> Option<&TargetFile> {
        self.slots.get(fd as usize)?.as_ref()
    }

    /// Closes `fd`; false if it was not open.
    pub fn close(&mut self, fd: u32) -> bool {
        self.slots
            .get_mut(fd as usize)
            .and_then(Option::take)
            .is_some()
    }

    /// Closes every file (the debugger went away).
    pub fn clear(&mut self) {
        self.slots.clear();
    }
}

fn errno<E>(e: HostIoErrno) -> HostIoError<E> {
    HostIoError::Errno(e)
}

/// A system error as one of the errno values the protocol carries.
fn io_errno<E>(e: &std::io::Error) -> HostIoError<E> {
    let n = match e.raw_os_error() {
        Some(libc::EPERM) => HostIoErrno::EPERM,
        Some(libc::ENOENT) => HostIoErrno::ENOENT,
        Some(libc::EINTR) => HostIoErrno::EINTR,
        Some(libc::EBADF) => HostIoErrno::EBADF,
        Some(libc::EACCES) => HostIoErrno::EACCES,
        Some(libc::EFAULT) => HostIoErrno::EFAULT,
        Some(libc::EBUSY) => HostIoErrno::EBUSY,
        Some(libc::EEXIST) => HostIoErrno::EEXIST,
        Some(libc::ENODEV) => HostIoErrno::ENODEV,
        Some(libc::ENOTDIR) => HostIoErrno::ENOTDIR,
        Some(libc::EISDIR) => HostIoErrno::EISDIR,
        Some(libc::EINVAL) => HostIoErrno::EINVAL,
        Some(libc::ENFILE) => HostIoErrno::ENFILE,
        Some(libc::EMFILE) => HostIoErrno::EMFILE,
        Some(libc::EFBIG) => HostIoErrno::EFBIG,
        Some(libc::ENOSPC) => HostIoErrno::ENOSPC,
        Some(libc::ESPIPE) => HostIoErrno::ESPIPE,
        Some(libc::EROFS) => HostIoErrno::EROFS,
        Some(libc::ENAMETOOLONG) => HostIoErrno::ENAMETOOLONG,
        Some(libc::ELOOP) => HostIoErrno::ENOENT,
        Some(_) => HostIoErrno::EUNKNOWN,
        // Not a system error: a recording's file that could not be read.
        None => HostIoErrno::EIO,
    };
    HostIoError::Errno(n)
}

fn path_of(name: &[u8]) -> Result<&Path, HostIoErrno> {
    if name.is_empty() || name.contains(&0) {
        return Err(HostIoErrno::ENOENT);
    }
    Ok(Path::new(std::ffi::OsStr::from_bytes(name)))
}

impl HostIo for GdbStubAdapter {
    fn support_open(&mut self) -> Option<HostIoOpenOps<'_, Self>> {
        Some(self)
    }

    fn support_close(&mut self) -> Option<HostIoCloseOps<'_, Self>> {
        Some(self)
    }

    fn support_pread(&mut self) -> Option<HostIoPreadOps<'_, Self>> {
        Some(self)
    }

    fn support_fstat(&mut self) -> Option<HostIoFstatOps<'_, Self>> {
        Some(self)
    }

    fn support_unlink(&mut self) -> Option<HostIoUnlinkOps<'_, Self>> {
        Some(self)
    }

    fn support_readlink(&mut self) -> Option<HostIoReadlinkOps<'_, Self>> {
        Some(self)
    }

    fn support_setfs(&mut self) -> Option<HostIoSetfsOps<'_, Self>> {
        Some(self)
    }
}

impl HostIoOpen for GdbStubAdapter {
    fn open(
        &mut self,
        filename: &[u8],
        flags: HostIoOpenFlags,
        _mode: HostIoOpenMode,
    ) -> HostIoResult<u32, Self> {
        let writes = HostIoOpenFlags::O_WRONLY
            | HostIoOpenFlags::O_RDWR
            | HostIoOpenFlags::O_APPEND
            | HostIoOpenFlags::O_CREAT
            | HostIoOpenFlags::O_TRUNC
            | HostIoOpenFlags::O_EXCL;
        if flags.intersects(writes) {
            return Err(errno(HostIoErrno::EROFS));
        }
        let path = path_of(filename).map_err(errno)?;
        let file = self
            .target_mut()
            .open_file(path)
            .map_err(|e| io_errno(&e))?;
        self.host_files
            .insert(file)
            .ok_or(errno(HostIoErrno::EMFILE))
    }
}

impl HostIoClose for GdbStubAdapter {
    fn close(&mut self, fd: u32) -> HostIoResult<(), Self> {
        if self.host_files.close(fd) {
            Ok(())
        } else {
            Err(errno(HostIoErrno::EBADF))
        }
    }
}

impl HostIoPread for GdbStubAdapter {
    fn pread(
        &mut self,
        fd: u32,
        count: usize,
        offset: u64,
        buf: &mut [u8],
    ) -> HostIoResult<usize, Self> {
        let file = self.host_files.get(fd).ok_or(errno(HostIoErrno::EBADF))?;
        // `buf` is the packet buffer: a larger count than fits is served in part, as a short
        // read (GDB asks again from where it ended).
        let n = count.min(buf.len());
        file.read_at(&mut buf[..n], offset)
            .map_err(|e| io_errno(&e))
    }
}

impl HostIoFstat for GdbStubAdapter {
    fn fstat(&mut self, fd: u32) -> HostIoResult<HostIoStat, Self> {
        let file = self.host_files.get(fd).ok_or(errno(HostIoErrno::EBADF))?;
        let s = file.stat().map_err(|e| io_errno(&e))?;
        // The protocol's fields are 32 bits wide (times, ids) where they are not 64.
        let narrow = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let time = |t: i64| u32::try_from(t.max(0)).unwrap_or(u32::MAX);
        Ok(HostIoStat {
            st_dev: narrow(s.dev),
            st_ino: narrow(s.ino),
            st_mode: HostIoOpenMode::from_bits_truncate(s.mode),
            st_nlink: narrow(s.nlink),
            st_uid: s.uid,
            st_gid: s.gid,
            st_rdev: 0,
            st_size: s.size,
            st_blksize: s.blksize,
            st_blocks: s.blocks,
            st_atime: time(s.times[0]),
            st_mtime: time(s.times[1]),
            st_ctime: time(s.times[2]),
        })
    }
}

impl HostIoUnlink for GdbStubAdapter {
    fn unlink(&mut self, _filename: &[u8]) -> HostIoResult<(), Self> {
        Err(errno(HostIoErrno::EROFS))
    }
}

impl HostIoReadlink for GdbStubAdapter {
    fn readlink(&mut self, filename: &[u8], buf: &mut [u8]) -> HostIoResult<usize, Self> {
        let path = path_of(filename).map_err(errno)?;
        let target = self
            .target_mut()
            .read_link(path)
            .map_err(|e| io_errno(&e))?;
        let bytes = target.as_os_str().as_bytes();
        // A link longer than a reply can carry is an error, not a truncated path.
        let out = buf
            .get_mut(..bytes.len())
            .ok_or(errno(HostIoErrno::ENAMETOOLONG))?;
        out.copy_from_slice(bytes);
        Ok(bytes.len())
    }
}

impl HostIoSetfs for GdbStubAdapter {
    fn setfs(&mut self, fs: FsKind) -> HostIoResult<(), Self> {
        // One process is debugged: its file system and ours are the one the target serves.
        match fs {
            FsKind::Stub => Ok(()),
            FsKind::Pid(pid) if pid.get() as i32 == self.target().pid() => Ok(()),
            FsKind::Pid(_) => Err(errno(HostIoErrno::EINVAL)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn descriptors_are_reused_and_bounded() {
        let mut f = OpenFiles::default();
        let file = || TargetFile::Bytes(Arc::from(&b"x"[..]));
        assert_eq!(f.insert(file()), Some(0));
        assert_eq!(f.insert(file()), Some(1));
        assert!(f.close(0));
        assert!(!f.close(0));
        assert!(f.get(0).is_none());
        assert_eq!(f.insert(file()), Some(0));
        for _ in 2..MAX_OPEN_FILES {
            assert!(f.insert(file()).is_some());
        }
        assert_eq!(f.insert(file()), None);
        assert!(!f.close(9999));
    }
}
