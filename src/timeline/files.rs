//! The program's files as a debugger reads them through host I/O (GDB's `vFile:` packets):
//! the maps file of the recorded process, made from what the backend or the recording knows
//! (for a QEMU guest or a replay, the host's `/proc` describes another process or none), and
//! for a saved recording the executable and shared libraries it keeps, so that GDB with its
//! default sysroot `target:` loads the very files that ran, even on another machine.
//!
//! `monitor save` copies every file with an executable mapping, the executable and the files
//! the loader's library list names (`file-N-NAME` in the recording directory); the manifest
//! says which paths the program knew each one by (`/lib/x86_64-linux-gnu/libc.so.6` and
//! `/usr/lib/x86_64-linux-gnu/libc.so.6` are one file). Replay opens them through
//! [`RecordingDir`]: plain names, never through a symbolic link.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Timeline;
use crate::store::dirfile::RecordingDir;
use crate::target::TargetFile;
use crate::target::files::is_proc_maps;

/// The largest program file a recording saves or serves (libraries are a few MiB).
pub const MAX_PROGRAM_FILE: u64 = 1 << 30;

/// The executable and libraries saved with a recording.
#[derive(Debug, Clone, Default)]
pub struct SavedFiles {
    /// The recording directory.
    pub dir: Option<PathBuf>,
    /// `(path the program knew, file name in the directory)`; several paths may share a file.
    pub paths: Vec<(PathBuf, String)>,
}

impl SavedFiles {
    /// The saved file's name for `path`.
    pub fn name_of(&self, path: &Path) -> Option<&str> {
        self.paths
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, n)| n.as_str())
    }

    /// The distinct file names, in order.
    pub fn names(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (_, n) in &self.paths {
            if !out.contains(&n.as_str()) {
                out.push(n);
            }
        }
        out
    }

    /// Reads the saved file `name` (through [`RecordingDir`]: never a link, never outside).
    pub fn read_name(&self, name: &str) -> io::Result<Vec<u8>> {
        let dir = self
            .dir
            .as_deref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let files = RecordingDir::open(dir).map_err(io::Error::other)?;
        files.read(name, MAX_PROGRAM_FILE).map_err(io::Error::other)
    }

    /// The manifest's `files` array.
    pub fn to_json(&self) -> serde_json::Value {
        self.paths
            .iter()
            .map(|(p, n)| serde_json::json!({"path": p.display().to_string(), "file": n}))
            .collect()
    }

    /// Reads the manifest's `files` array (absent in older recordings: no files).
    pub fn from_json(v: &serde_json::Value, dir: &Path) -> Result<Self, String> {
        let mut paths = Vec::new();
        for (i, f) in v
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let bad = |what: &str| format!("manifest.json: files {i}: {what}");
            let path = f["path"].as_str().ok_or_else(|| bad("no path"))?;
            let name = f["file"].as_str().ok_or_else(|| bad("no file"))?;
            if !path.starts_with('/') {
                return Err(bad("the path is not absolute"));
            }
            paths.push((PathBuf::from(path), name.to_string()));
        }
        Ok(SavedFiles {
            dir: Some(dir.to_path_buf()),
            paths,
        })
    }
}

/// The `name="…"` attributes of a `qXfer:libraries-svr4` list, unescaped.
pub fn library_names(xml: &str) -> Vec<String> {
    xml.split("name=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(|n| {
            n.replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&")
        })
        .filter(|n| n.starts_with('/'))
        .collect()
}

/// The program files worth saving: every file with an executable mapping in `maps`, the
/// executable and the libraries the loader lists. Returns `(path, the same file's canonical
/// path)` for every path that exists, so that aliases through symbolic links share one copy.
pub fn program_files(
    maps: &str,
    exe: Option<&Path>,
    libraries_xml: Option<&str>,
) -> Vec<(PathBuf, PathBuf)> {
    let mut wanted: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let perms = f.nth(1).unwrap_or("");
        let path = line
            .splitn(6, char::is_whitespace)
            .nth(5)
            .unwrap_or("")
            .trim();
        if perms.contains('x') && path.starts_with('/') && !path.ends_with(" (deleted)") {
            wanted.push(PathBuf::from(path));
        }
    }
    wanted.extend(exe.map(Path::to_path_buf));
    wanted.extend(
        libraries_xml
            .map(library_names)
            .unwrap_or_default()
            .into_iter()
            .map(PathBuf::from),
    );
    let mut out: Vec<(PathBuf, PathBuf)> = Vec::new();
    for p in wanted {
        if out.iter().any(|(q, _)| *q == p) {
            continue;
        }
        if let Ok(c) = std::fs::canonicalize(&p) {
            out.push((p, c));
        }
    }
    out
}

/// A plain file name for the saved copy of `path`: `file-N-BASENAME`, other characters `_`.
pub fn saved_name(n: usize, path: &Path) -> String {
    let base: String = path
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._+-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("file-{n}-{base}")
}

fn enoent() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

impl Timeline {
    /// The recorded process's maps (`/proc/PID/maps` text): the backend's for a live process
    /// (a QEMU guest's, not QEMU's), the saved one for a replay; `None` when unknown.
    pub fn maps_text(&mut self) -> Option<String> {
        let text = match self.live.as_mut() {
            Some(live) => live.maps(),
            None => self.offline.as_ref()?.maps.clone(),
        };
        (!text.is_empty()).then_some(text)
    }

    /// A file as the recorded program sees it, for the debugger's host I/O: the process's maps
    /// file from [`Timeline::maps_text`]; for a replay, the files saved with the recording, and
    /// never the host's `/proc` (it describes other processes; for a live process the backend's
    /// maps, empty while it knows none). `None`: the host's file is the program's (a live
    /// process's other files, or a file the recording did not keep).
    pub fn target_file(&mut self, path: &Path) -> Option<io::Result<TargetFile>> {
        let (pid, tids) = (self.pid(), self.thread_ids());
        if is_proc_maps(path, pid, &tids) {
            return match self.maps_text() {
                Some(mut text) => {
                    // As the kernel writes it (a saved recording keeps the lines only).
                    if !text.ends_with('\n') {
                        text.push('\n');
                    }
                    Some(Ok(TargetFile::Bytes(Arc::from(text.into_bytes()))))
                }
                None if self.live.is_none() => Some(Err(enoent())),
                // Nothing known yet (QEMU before the guest's first block: the plugin has not
                // written the loader's mappings): no mapping rather than the host's file,
                // which would be QEMU's own.
                None => Some(Ok(TargetFile::Bytes(Arc::from(Vec::new())))),
            };
        }
        let info = self.offline.as_ref()?;
        if let Some(name) = info.files.name_of(path) {
            return Some(
                info.files
                    .read_name(name)
                    .map(|b| TargetFile::Bytes(Arc::from(b))),
            );
        }
        path.starts_with("/proc").then(|| Err(enoent()))
    }

    /// The target of a symbolic link as the recorded program sees it: for a replay,
    /// `/proc/PID/exe` is the recorded executable and the rest of `/proc` does not exist.
    /// `None`: the host's link.
    pub fn target_link(&mut self, path: &Path) -> Option<io::Result<PathBuf>> {
        if self.live.is_some() {
            // A program under QEMU is not the host process (whose `exe` is QEMU): the
            // backend's executable is the program's.
            let exe_link = PathBuf::from(format!("/proc/{}/exe", self.pid()));
            if path != exe_link {
                return None;
            }
            return self.exec_path().map(Ok);
        }
        let info = self.offline.as_ref()?;
        if !path.starts_with("/proc") {
            return None;
        }
        let exe_link = PathBuf::from(format!("/proc/{}/exe", info.pid));
        Some(match &info.exe {
            Some(exe) if path == exe_link => Ok(exe.clone()),
            _ => Err(enoent()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names_are_unescaped_absolute_paths() {
        let xml = r#"<library-list-svr4 version="1.0" main-lm="0x1"><library name="/lib/a&amp;b.so" lm="0x2" l_addr="0x0" l_ld="0x3"/><library name="linux-vdso.so.1" lm="0x4"/></library-list-svr4>"#;
        assert_eq!(library_names(xml), vec!["/lib/a&b.so".to_string()]);
    }

    #[test]
    fn program_files_are_executable_mappings_and_aliases() {
        let maps = "\
00400000-00401000 r--p 00000000 08:01 1 /bin/true
00401000-00402000 r-xp 00001000 08:01 1 /bin/true
7f0000000000-7f0000001000 r--p 00000000 08:01 2 /usr/lib/locale/locale-archive
7ffd00000000-7ffd00001000 r-xp 00000000 00:00 0 [vdso]
7f0000002000-7f0000003000 r-xp 00000000 08:01 3 /tmp/gone (deleted)";
        let files = program_files(maps, Some(Path::new("/bin/true")), None);
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files[0].0, PathBuf::from("/bin/true"));
        assert_eq!(files[0].1, std::fs::canonicalize("/bin/true").unwrap());
    }

    #[test]
    fn saved_names_are_plain() {
        assert_eq!(
            saved_name(3, Path::new("/usr/lib/libc.so.6")),
            "file-3-libc.so.6"
        );
        assert_eq!(saved_name(0, Path::new("/x/a b\n")), "file-0-a_b_");
        assert_eq!(saved_name(1, Path::new("/")), "file-1-");
    }
}
