//! Files inside a recording directory, opened without trusting its contents.
//!
//! A recording directory (`monitor save DIR`, `ptrewind replay DIR`) may sit where other local
//! users can write (`/tmp`), or may have been prepared by someone else. Its files are therefore
//! opened relative to a descriptor of the directory (`openat`), by plain file name only (no `/`,
//! no `..`), never through a symbolic link (`O_NOFOLLOW`), and only when they are regular files
//! (checked with `fstat` on the opened descriptor, so nothing can be swapped in between). Files
//! are written only as new files (`O_CREAT | O_EXCL`): a name that already exists is first
//! unlinked — which removes a planted link, never its target — and if something re-appears in
//! its place before the create, the create fails instead of writing through it.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// Errors of [`RecordingDir`], each naming the file.
#[derive(Debug, thiserror::Error)]
pub enum DirFileError {
    /// The name is not a plain file name of the directory (`a/b`, `..`, empty, absolute).
    #[error("{dir}: {name:?} is not a file name in the recording directory")]
    NotAName {
        /// The directory.
        dir: PathBuf,
        /// The name asked for.
        name: String,
    },
    /// The name is a symbolic link: never followed.
    #[error("{0}: is a symbolic link (files of a recording are never followed through links)")]
    Symlink(PathBuf),
    /// The name is not a regular file (a directory, a device, a FIFO, a socket).
    #[error("{0}: not a regular file")]
    NotRegular(PathBuf),
    /// The file is larger than the caller's limit.
    #[error("{path}: {size} bytes, more than the limit of {limit}")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The directory already exists and belongs to another user.
    #[error("{0}: owned by another user (refusing to write a recording into it)")]
    ForeignOwner(PathBuf),
    /// An operating-system error.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// An open directory whose files are read and written safely (see the [module docs](self)).
#[derive(Debug)]
pub struct RecordingDir {
    path: PathBuf,
    fd: OwnedFd,
}

fn errno_io(path: PathBuf, e: Errno) -> DirFileError {
    DirFileError::Io {
        path,
        source: std::io::Error::from(e),
    }
}

impl RecordingDir {
    /// Opens an existing directory for reading. `path` itself may be a link (the user named
    /// it); what is inside is never followed.
    pub fn open(path: &Path) -> Result<Self, DirFileError> {
        let fd = openat(
            nix::fcntl::AT_FDCWD,
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno_io(path.to_path_buf(), e))?;
        Ok(RecordingDir {
            path: path.to_path_buf(),
            fd,
        })
    }

    /// Creates the directory (and its parents) if needed and opens it for writing. An existing
    /// directory — or a link to one — that belongs to another user is refused: in a shared
    /// place such as `/tmp` it may have been prepared to catch the recording.
    pub fn create(path: &Path) -> Result<Self, DirFileError> {
        let io = |source| DirFileError::Io {
            path: path.to_path_buf(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(link) => {
                use std::os::unix::fs::MetadataExt as _;
                // The entry itself (a link planted in /tmp belongs to whoever planted it) and
                // what it leads to.
                let me = nix::unistd::geteuid().as_raw();
                let target = std::fs::metadata(path).map_err(io)?;
                if link.uid() != me || target.uid() != me {
                    return Err(DirFileError::ForeignOwner(path.to_path_buf()));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path).map_err(io)?;
            }
            Err(e) => return Err(io(e)),
        }
        Self::open(path)
    }

    /// The directory's path (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `dir/name`, after checking that `name` is one plain file name.
    fn checked(&self, name: &str) -> Result<PathBuf, DirFileError> {
        let mut parts = Path::new(name).components();
        match (parts.next(), parts.next()) {
            (Some(Component::Normal(n)), None) if n == std::ffi::OsStr::new(name) => {
                Ok(self.path.join(name))
            }
            _ => Err(DirFileError::NotAName {
                dir: self.path.clone(),
                name: name.to_string(),
            }),
        }
    }

    /// Opens `name` for reading: a regular file of the directory, not through a link.
    pub fn open_file(&self, name: &str) -> Result<File, DirFileError> {
        let path = self.checked(name)?;
        // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
        let fd = openat(
            self.fd.as_fd(),
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ELOOP => DirFileError::Symlink(path.clone()),
            e => errno_io(path.clone(), e),
        })?;
        let st = fstat(&fd).map_err(|e| errno_io(path.clone(), e))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(DirFileError::NotRegular(path));
        }
        Ok(File::from(fd))
    }

    /// Reads the whole of `name` (see [`RecordingDir::open_file`]); at most `limit` bytes.
    pub fn read(&self, name: &str, limit: u64) -> Result<Vec<u8>, DirFileError> {
        let path = self.checked(name)?;
        let file = self.open_file(name)?;
        let io = |source| DirFileError::Io {
            path: path.clone(),
            source,
        };
        let size = file.metadata().map_err(io)?.len();
        if size > limit {
            return Err(DirFileError::TooLarge { path, size, limit });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        // `take`: a file growing while it is read still stops at the limit.
        file.take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > limit {
            return Err(DirFileError::TooLarge {
                size: bytes.len() as u64,
                path,
                limit,
            });
        }
        Ok(bytes)
    }

    /// Whether `name` exists in the directory (as anything, links included, not followed).
    pub fn exists(&self, name: &str) -> Result<bool, DirFileError> {
        let path = self.checked(name)?;
        match nix::sys::stat::fstatat(
            self.fd.as_fd(),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(_) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(errno_io(path, e)),
        }
    }

    /// Removes `name` if it exists (a link is removed, never its target).
    pub fn remove(&self, name: &str) -> Result<(), DirFileError> {
        let path = self.checked(name)?;
        match unlinkat(self.fd.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(Errno::EISDIR) => Err(DirFileError::NotRegular(path)),
            Err(e) => Err(errno_io(path, e)),
        }
    }

    /// Creates `name` as a new regular file (mode 0644 before the umask), replacing a file or
    /// link of that name: the old entry is unlinked, then the file is created with
    /// `O_CREAT | O_EXCL | O_NOFOLLOW`, so it is never written through a link.
    pub fn create_file(&self, name: &str) -> Result<File, DirFileError> {
        let path = self.checked(name)?;
        self.remove(name)?;
        let fd = openat(
            self.fd.as_fd(),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| errno_io(path, e))?;
        Ok(File::from(fd))
    }

    /// Writes `bytes` to the new file `name` ([`RecordingDir::create_file`]) and flushes it to
    /// the file system, so that a full disk is reported here rather than lost at close.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), DirFileError> {
        use std::io::Write as _;
        let path = self.checked(name)?;
        let mut file = self.create_file(name)?;
        let io = |source| DirFileError::Io {
            path: path.clone(),
            source,
        };
        file.write_all(bytes).map_err(io)?;
        file.sync_all().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn names_must_be_plain() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RecordingDir::open(tmp.path()).unwrap();
        for bad in ["", "..", ".", "a/b", "/etc/passwd", "../x", "a/", "./a"] {
            assert!(
                matches!(dir.read(bad, 10), Err(DirFileError::NotAName { .. })),
                "{bad:?}"
            );
            assert!(
                matches!(dir.create_file(bad), Err(DirFileError::NotAName { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn reads_refuse_links_devices_and_fifos() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(outside.path(), b"secret").unwrap();
        symlink(outside.path(), tmp.path().join("trace.pt")).unwrap();
        symlink("/dev/zero", tmp.path().join("zero")).unwrap();
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        nix::unistd::mkfifo(&tmp.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::write(tmp.path().join("ok"), b"fine").unwrap();
        let dir = RecordingDir::open(tmp.path()).unwrap();
        assert!(matches!(
            dir.read("trace.pt", 100),
            Err(DirFileError::Symlink(_))
        ));
        assert!(matches!(
            dir.read("zero", 100),
            Err(DirFileError::Symlink(_))
        ));
        assert!(matches!(
            dir.read("sub", 100),
            Err(DirFileError::NotRegular(_))
        ));
        // Returns at once (O_NONBLOCK), refused as not regular.
        assert!(matches!(
            dir.read("fifo", 100),
            Err(DirFileError::NotRegular(_))
        ));
        assert_eq!(dir.read("ok", 100).unwrap(), b"fine");
        assert!(matches!(
            dir.read("ok", 3),
            Err(DirFileError::TooLarge { size: 4, .. })
        ));
    }

    #[test]
    fn writes_replace_a_planted_link_and_leave_its_target_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(victim.path(), b"precious").unwrap();
        symlink(victim.path(), tmp.path().join("trace.pt")).unwrap();
        // A dangling link: O_CREAT alone would create its target.
        let target = tmp.path().join("elsewhere");
        symlink(&target, tmp.path().join("manifest.json")).unwrap();
        let dir = RecordingDir::create(tmp.path()).unwrap();
        dir.write("trace.pt", b"new trace").unwrap();
        dir.write("manifest.json", b"{}").unwrap();
        assert_eq!(std::fs::read(victim.path()).unwrap(), b"precious");
        assert!(!target.exists());
        let meta = std::fs::symlink_metadata(tmp.path().join("trace.pt")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(dir.read("trace.pt", 100).unwrap(), b"new trace");
        // A directory in the way is an error, not removed.
        std::fs::create_dir(tmp.path().join("README")).unwrap();
        assert!(matches!(
            dir.write("README", b"x"),
            Err(DirFileError::NotRegular(_))
        ));
    }

    #[test]
    fn create_refuses_a_directory_of_another_user() {
        // Only root can make a directory owned by someone else.
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        assert!(matches!(
            RecordingDir::create(&theirs),
            Err(DirFileError::ForeignOwner(_))
        ));
        // A link of ours to it is refused too.
        let link = tmp.path().join("link");
        symlink(&theirs, &link).unwrap();
        assert!(matches!(
            RecordingDir::create(&link),
            Err(DirFileError::ForeignOwner(_))
        ));
        let fresh = tmp.path().join("new/deeper");
        let d = RecordingDir::create(&fresh).unwrap();
        d.write("x", b"1").unwrap();
        assert_eq!(std::fs::read(fresh.join("x")).unwrap(), b"1");
    }
}
