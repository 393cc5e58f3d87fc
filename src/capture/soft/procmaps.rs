//! `/proc/PID/maps`, ELF symbol lookup (where `main` and the entry point are at run time) and
//! snapshots of a live process's executable mappings as an [`Image`].

use std::path::PathBuf;

use object::{Object, ObjectSegment, ObjectSymbol};

use super::target::StepTarget;
use crate::image::procfs::{self, MapEntry};
use crate::image::{Image, Section};
use crate::target::TargetError;

/// Why a run-time address could not be found.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The executable is not a parsable ELF file.
    #[error("cannot parse {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// The symbol is not in the symbol tables.
    #[error("symbol `{name}` not found in {path}")]
    NoSymbol {
        /// The symbol.
        name: String,
        /// The file.
        path: PathBuf,
    },
    /// The executable is not mapped (cannot compute the load bias).
    #[error("{path} is not mapped in process {pid}")]
    NotMapped {
        /// The file.
        path: PathBuf,
        /// The process.
        pid: i32,
    },
}

/// Parses the text of `/proc/PID/maps`; malformed lines are skipped.
pub fn parse_maps(text: &str) -> Vec<MapEntry> {
    procfs::parse_maps_lenient(text).collect()
}

/// The mappings of process `pid`.
pub fn read_maps(pid: i32) -> Result<Vec<MapEntry>, SymbolError> {
    let path = procfs::maps_path(pid);
    let text = std::fs::read_to_string(&path).map_err(|source| SymbolError::Io { path, source })?;
    Ok(parse_maps(&text))
}

/// The executable of process `pid` (`/proc/PID/exe`).
pub fn exe_path(pid: i32) -> Result<PathBuf, SymbolError> {
    let path = PathBuf::from(format!("/proc/{pid}/exe"));
    std::fs::read_link(&path).map_err(|source| SymbolError::Io { path, source })
}

/// Run-time addresses of the executable's entry point and of a symbol in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExeAddresses {
    /// Load bias (0 for a non-PIE executable).
    pub bias: u64,
    /// The ELF entry point plus the bias.
    pub entry: u64,
}

/// The load bias and entry point of process `pid`'s executable.
pub fn exe_addresses(pid: i32) -> Result<(PathBuf, ExeAddresses, Vec<u8>), SymbolError> {
    let path = exe_path(pid)?;
    let data = std::fs::read(&path).map_err(|source| SymbolError::Io {
        path: path.clone(),
        source,
    })?;
    let file = object::File::parse(&*data).map_err(|e| SymbolError::Parse {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let bias = if file.kind() == object::ObjectKind::Dynamic {
        // PIE: the mapping of file offset 0 holds the lowest loadable segment.
        let lowest = file
            .segments()
            .map(|s| s.address() & !0xfff)
            .min()
            .unwrap_or(0);
        let maps = read_maps(pid)?;
        let path_str = path.to_string_lossy();
        let first = maps
            .iter()
            .find(|m| m.offset == 0 && m.path.as_deref() == Some(path_str.as_ref()))
            .ok_or_else(|| SymbolError::NotMapped {
                path: path.clone(),
                pid,
            })?;
        first.start.wrapping_sub(lowest)
    } else {
        0
    };
    let entry = file.entry().wrapping_add(bias);
    Ok((path, ExeAddresses { bias, entry }, data))
}

/// The run-time address of symbol `name` (from `.symtab`, else `.dynsym`) in process `pid`'s
/// executable.
pub fn symbol_address(pid: i32, name: &str) -> Result<u64, SymbolError> {
    let (path, addrs, data) = exe_addresses(pid)?;
    let file = object::File::parse(&*data).map_err(|e| SymbolError::Parse {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let found = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.is_definition() && s.name() == Ok(name))
        .map(|s| s.address());
    match found {
        Some(a) => Ok(a.wrapping_add(addrs.bias)),
        None => Err(SymbolError::NoSymbol {
            name: name.to_owned(),
            path,
        }),
    }
}

/// Snapshots every readable, executable mapping of the target (the executable, libraries,
/// `[vdso]`) into an [`Image`], reading the bytes from the live process. Mappings that cannot
/// be read (`[vsyscall]`) are skipped and returned by name.
pub fn capture_image<T: StepTarget + ?Sized>(
    target: &mut T,
) -> Result<(Image, Vec<String>), TargetError> {
    let pid = target.pid();
    let maps = read_maps(pid).map_err(|e| TargetError::Unexpected {
        pid,
        what: e.to_string(),
    })?;
    let mut image = Image::new();
    let mut skipped = Vec::new();
    for m in maps.iter().filter(|m| m.exec && m.read) {
        let len = (m.end - m.start) as usize;
        let mut bytes = vec![0u8; len];
        let n = target.read_memory(m.start, &mut bytes).unwrap_or_default();
        if n == 0 {
            skipped.push(m.path.clone().unwrap_or_default());
            continue;
        }
        bytes.truncate(n);
        let origin = m.path.as_deref().unwrap_or("[anon]");
        if image.add(Section::new(m.start, bytes, origin)).is_err() {
            skipped.push(m.path.clone().unwrap_or_default());
        }
    }
    Ok((image, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let text = "555555554000-555555555000 r--p 00000000 fd:01 123 /tmp/a b\n\
                    555555555000-555555556000 r-xp 00001000 fd:01 123 /tmp/a b\n\
                    7ffff7fc1000-7ffff7fc3000 r-xp 00000000 00:00 0 [vdso]\n\
                    7ffff7fc3000-7ffff7fc4000 rw-p 00000000 00:00 0\n\
                    garbage\n";
        let m = parse_maps(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].path.as_deref(), Some("/tmp/a b"));
        assert!(!m[0].exec && m[1].exec && m[1].read);
        assert_eq!(m[1].offset, 0x1000);
        assert_eq!(m[2].path.as_deref(), Some("[vdso]"));
        assert_eq!(m[3].path, None);
    }
}
