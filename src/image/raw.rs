//! Raw binaries at an address, in ptxed's `--raw FILE[:FROM[-TO]]:BASE` syntax.
//!
//! The argument is split exactly as libipt's ptxed does it:
//! 1. `BASE` is everything after the **last** `:`; it must parse as a number, else the argument is
//!    rejected ([`SpecError::MissingBase`]).
//! 2. In what remains, the part after the last `:` is tried as `FROM` or `FROM-TO`. If it does not
//!    parse (e.g. `a:b`), the `:` is part of the file name and the whole file is used.
//! 3. `FROM` and `TO` are file offsets; `TO` is exclusive (ptxed maps `TO - FROM` bytes) and must
//!    be greater than `FROM` ([`SpecError::EmptyRange`]). Without `TO` the section runs to the end
//!    of the file.
//!
//! Numbers follow C's `strtoull(.., 0)` as in ptxed: `0x` hex, leading `0` octal, else decimal.
//! Unlike libipt, which silently shortens a range that runs past the end of the file, loading
//! reports such a range as [`LoadError::FileRange`] so that no requested byte goes missing quietly.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use super::{FileCache, Image, LoadError, Section, SpecError, parse_number};

/// A `--raw FILE[:FROM[-TO]]:BASE` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSpec {
    /// The file.
    pub path: PathBuf,
    /// First file offset mapped.
    pub from: u64,
    /// One past the last file offset mapped; `None` for the end of the file.
    pub to: Option<u64>,
    /// Address of the byte at file offset `from`.
    pub base: u64,
}

impl FromStr for RawSpec {
    type Err = SpecError;

    fn from_str(arg: &str) -> Result<Self, SpecError> {
        let missing_base = || SpecError::MissingBase {
            arg: arg.to_string(),
        };
        let (rest, base) = arg.rsplit_once(':').ok_or_else(missing_base)?;
        let base = parse_number(base).ok_or_else(missing_base)?;
        let (path, from, to) = match rest.rsplit_once(':') {
            Some((path, range)) => match parse_range(range) {
                Some((from, Some(to))) if to <= from => {
                    return Err(SpecError::EmptyRange {
                        arg: arg.to_string(),
                        from,
                        to,
                    });
                }
                Some((from, to)) => (path, from, to),
                None => (rest, 0, None),
            },
            None => (rest, 0, None),
        };
        if path.is_empty() {
            return Err(SpecError::MissingPath {
                arg: arg.to_string(),
            });
        }
        Ok(RawSpec {
            path: PathBuf::from(path),
            from,
            to,
            base,
        })
    }
}

/// `FROM` or `FROM-TO`; `None` if it is neither (then the `:` belongs to the file name).
fn parse_range(s: &str) -> Option<(u64, Option<u64>)> {
    match s.split_once('-') {
        // ptxed reads an empty TO as 0, which then fails the TO > FROM check.
        Some((from, "")) => Some((parse_number(from)?, Some(0))),
        Some((from, to)) => Some((parse_number(from)?, Some(parse_number(to)?))),
        None => Some((parse_number(s)?, None)),
    }
}

impl fmt::Display for RawSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        match self.to {
            Some(to) => write!(f, ":{:#x}-{to:#x}", self.from)?,
            // A `:` in the path would otherwise make its last part read as `FROM`.
            None if self.from != 0 || self.path.to_string_lossy().contains(':') => {
                write!(f, ":{:#x}", self.from)?
            }
            None => {}
        }
        write!(f, ":{:#x}", self.base)
    }
}

impl RawSpec {
    /// Reads the file and returns its selected range as a section at `base`.
    pub fn load(&self) -> Result<Section, LoadError> {
        self.load_cached(&mut FileCache::new())
    }

    /// Like [`RawSpec::load`], sharing the file's bytes through `cache`.
    pub fn load_cached(&self, cache: &mut FileCache) -> Result<Section, LoadError> {
        let bytes = cache.get(&self.path)?;
        let file_len = bytes.len() as u64;
        let to = self.to.unwrap_or(file_len);
        if self.from >= file_len || to > file_len || to <= self.from {
            return Err(LoadError::FileRange {
                path: self.path.clone(),
                from: self.from,
                to,
                file_len,
            });
        }
        Ok(Section {
            addr: self.base,
            bytes,
            // Both are at most the file length, which fits in usize.
            offset: self.from as usize,
            len: (to - self.from) as usize,
            origin: Arc::from(self.path.to_string_lossy().as_ref()),
        })
    }
}

impl Image {
    /// Loads a raw binary per `spec` (see the module docs).
    pub fn load_raw(&mut self, spec: &RawSpec) -> Result<(), LoadError> {
        self.add(spec.load()?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `fuzz/fuzz_targets/text_inputs.rs`: `4:944:0:944` is the file `4:944` from
    /// offset 0; printed without the `:0` it read back as the file `4` from offset 944.
    #[test]
    fn display_parses_back_with_a_colon_in_the_path() {
        for arg in [
            "4:944:0:944",
            "a:5:0:0x1000",
            "a:b:0x1000",
            "x:0x10-0x20:0",
            "plain:7",
        ] {
            let spec: RawSpec = arg.parse().unwrap();
            let printed = spec.to_string();
            assert_eq!(
                printed.parse::<RawSpec>().as_ref(),
                Ok(&spec),
                "{arg} → {printed}"
            );
        }
        let spec: RawSpec = "4:944:0:944".parse().unwrap();
        assert_eq!(spec.path, PathBuf::from("4:944"));
        assert_eq!(spec.to_string(), "4:944:0x0:0x3b0");
    }

    #[test]
    fn ptxed_syntax() {
        let ok = |arg: &str, path: &str, from: u64, to: Option<u64>, base: u64| {
            let spec: RawSpec = arg.parse().unwrap_or_else(|e| panic!("{arg}: {e}"));
            assert_eq!(
                spec,
                RawSpec {
                    path: PathBuf::from(path),
                    from,
                    to,
                    base
                },
                "{arg}"
            );
        };
        ok("f:0x1000", "f", 0, None, 0x1000);
        ok("f:0x10:0x1000", "f", 0x10, None, 0x1000);
        ok("f:0x10-0x20:0x1000", "f", 0x10, Some(0x20), 0x1000);
        ok("f:16-32:4096", "f", 16, Some(32), 4096);
        ok("f:010:0", "f", 8, None, 0);
        ok("a:b:0x1000", "a:b", 0, None, 0x1000);
        ok("a:b:1-2:3", "a:b", 1, Some(2), 3);
        assert!(matches!(
            "f".parse::<RawSpec>(),
            Err(SpecError::MissingBase { .. })
        ));
        assert!(matches!(
            "f:".parse::<RawSpec>(),
            Err(SpecError::MissingBase { .. })
        ));
        assert!(matches!(
            "f:zz".parse::<RawSpec>(),
            Err(SpecError::MissingBase { .. })
        ));
        assert!(matches!(
            "f:0x20-0x10:0".parse::<RawSpec>(),
            Err(SpecError::EmptyRange { .. })
        ));
        assert!(matches!(
            "f:5-5:0".parse::<RawSpec>(),
            Err(SpecError::EmptyRange { .. })
        ));
        assert!(matches!(
            "f:5-:0".parse::<RawSpec>(),
            Err(SpecError::EmptyRange { .. })
        ));
        assert!(matches!(
            ":0x1000".parse::<RawSpec>(),
            Err(SpecError::MissingPath { .. })
        ));
    }
}
