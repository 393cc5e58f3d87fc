//! The trace store: PT bytes drained from a ring or read from files (raw streams, perf.data).
//!
//! A [`TraceFile`] maps a file into memory; [`TraceStreams`] looks at its bytes and presents them as
//! one or more named PT streams ([`TraceStream`]): a raw PT file is one stream (`raw`), a perf.data
//! file has one stream per CPU (or thread) built from its `PERF_RECORD_AUXTRACE` payloads
//! ([`perf_data`]). Each stream remembers where its bytes came from (chunk boundaries with file
//! and AUX offsets) and where data was lost, so that packet offsets can be reported against the
//! file and decoders know where to resynchronise.

pub mod dirfile;
pub mod exec_cut;
pub mod live;
pub mod percpu;
pub mod view;

/// The perf.data reader lives in the shared perf base ([`crate::perf::data`]); kept here under
/// its old name for the store's users.
pub use crate::perf::data as perf_data;

pub use view::{AppendListener, TraceView};

use std::borrow::Cow;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use perf_data::{DataLoss, PerfData, PerfDataError, PerfScan};

/// The most a trace read from a pipe or socket (`perf record -o - | ptrewind dump -`) may hold:
/// 1 GiB. Regular files are memory-mapped and have no limit; a larger piped trace must be saved
/// to a file first. Devices (`/dev/zero`) are refused outright.
pub const MAX_PIPE_INPUT: u64 = 1 << 30;

/// Errors opening or interpreting a trace file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file could not be opened, stat'ed or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file holds no bytes at all.
    #[error("{path}: empty file (0 bytes): no trace to read")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file is a device or a directory, not a file or a pipe.
    #[error("{path}: {kind}, not a trace file (give a regular file, or a pipe)")]
    NotAFile {
        /// The file.
        path: PathBuf,
        /// What it is (`a character device`, ...).
        kind: &'static str,
    },
    /// A pipe delivered more than [`MAX_PIPE_INPUT`] bytes.
    #[error(
        "{path}: more than {limit} bytes read from a pipe (the limit for piped input); save \
         the trace to a file and give the file"
    )]
    PipeTooLarge {
        /// The pipe.
        path: PathBuf,
        /// The limit, [`MAX_PIPE_INPUT`].
        limit: u64,
    },
    /// The file looks like perf.data but its header is unusable.
    #[error(transparent)]
    PerfData(#[from] PerfDataError),
}

/// The bytes of a trace file: memory-mapped when it is a regular file, read into memory when it
/// is a pipe or a socket (perf's pipe mode is meant for `perf record -o - | ...`), at most
/// [`MAX_PIPE_INPUT`] bytes. Devices, directories and empty files are refused.
#[derive(Debug)]
pub struct TraceFile {
    path: PathBuf,
    bytes: Backing,
}

#[derive(Debug)]
enum Backing {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// What a file that is neither regular nor a pipe/socket is, for [`StoreError::NotAFile`].
fn not_a_file(ft: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt as _;
    if ft.is_file() || ft.is_fifo() || ft.is_socket() {
        None
    } else if ft.is_char_device() {
        Some("a character device")
    } else if ft.is_block_device() {
        Some("a block device")
    } else if ft.is_dir() {
        Some("a directory")
    } else {
        Some("not a regular file")
    }
}

impl TraceFile {
    /// Maps `path` read-only (or reads it, when it is a pipe; see [`TraceFile`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| StoreError::Io {
            path: path.clone(),
            source,
        })?;
        Self::from_file(path, file)
    }

    /// The trace on standard input (`-`): mapped when it is a redirected regular file, read
    /// when it is a pipe, refused when it is a terminal or another device.
    pub fn stdin() -> Result<Self, StoreError> {
        use std::os::fd::AsFd as _;
        let path = PathBuf::from("-");
        let fd = std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| StoreError::Io {
                path: path.clone(),
                source,
            })?;
        Self::from_file(path, File::from(fd))
    }

    /// [`TraceFile::open`] on an opened file; `path` names it in messages.
    fn from_file(path: PathBuf, file: File) -> Result<Self, StoreError> {
        let io = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        let meta = file.metadata().map_err(io)?;
        if let Some(kind) = not_a_file(meta.file_type()) {
            return Err(StoreError::NotAFile { path, kind });
        }
        let bytes = if !meta.is_file() {
            Backing::Owned(read_bounded(&path, file, MAX_PIPE_INPUT)?)
        } else if meta.len() == 0 {
            // An empty file cannot be mapped, and there is nothing to decode.
            return Err(StoreError::Empty { path });
        } else {
            // SAFETY: the mapping is read-only and private to this process, and it lives as long
            // as `self` (every borrow of `bytes()` is tied to it). What Rust cannot rule out is
            // another process truncating or rewriting the file while it is mapped: that would
            // change the bytes under a shared borrow or raise SIGBUS. Trace files are written
            // once and then only read, so we accept that, as every mmap-based reader does.
            Backing::Mapped(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Ok(TraceFile { path, bytes })
    }

    /// Reads a whole stream into memory (at most [`MAX_PIPE_INPUT`] bytes; an empty stream is
    /// an error); `name` is what [`TraceFile::path`] reports.
    pub fn from_reader(name: impl Into<PathBuf>, reader: impl Read) -> Result<Self, StoreError> {
        let path = name.into();
        let bytes = read_bounded(&path, reader, MAX_PIPE_INPUT)?;
        Ok(TraceFile {
            path,
            bytes: Backing::Owned(bytes),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Backing::Mapped(map) => map,
            Backing::Owned(bytes) => bytes,
        }
    }

    /// Interprets the file ([`TraceStreams::from_bytes`]).
    pub fn source(&self) -> Result<TraceStreams<'_>, StoreError> {
        TraceStreams::from_bytes(self.bytes())
    }
}

/// Reads `reader` to its end, failing beyond `limit` bytes ([`MAX_PIPE_INPUT`]) or when it is
/// empty.
fn read_bounded(path: &Path, reader: impl Read, limit: u64) -> Result<Vec<u8>, StoreError> {
    let mut bytes = Vec::new();
    reader
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(StoreError::PipeTooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    if bytes.is_empty() {
        return Err(StoreError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

/// Where a stream's bytes came from: one contiguous piece of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkBoundary {
    /// Offset of the chunk's first byte in the stream.
    pub stream_offset: u64,
    /// Offset of the chunk's first byte in the file.
    pub file_offset: u64,
    /// AUX area offset of the chunk's first byte (perf.data), or `None` for raw files.
    pub aux_offset: Option<u64>,
    /// Size in bytes.
    pub size: u64,
}

/// One PT byte stream of a trace source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceStream<'data> {
    /// A short name: `raw`, `cpu0`, `tid1234`, ...
    pub label: String,
    /// CPU of a per-CPU perf stream.
    pub cpu: Option<u32>,
    /// Thread of a perf stream.
    pub tid: Option<u32>,
    /// The PT bytes (borrowed from the file unless several chunks were concatenated).
    pub data: Cow<'data, [u8]>,
    /// The pieces of the file the bytes came from, in stream order.
    pub chunks: Vec<ChunkBoundary>,
    /// Places where data was lost (perf AUX gaps and TRUNCATED/PARTIAL flags).
    pub losses: Vec<DataLoss>,
}

impl TraceStream<'_> {
    /// The chunk containing stream offset `offset`.
    pub fn chunk_at(&self, offset: u64) -> Option<&ChunkBoundary> {
        let i = self
            .chunks
            .partition_point(|c| c.stream_offset + c.size <= offset);
        self.chunks.get(i).filter(|c| c.stream_offset <= offset)
    }

    /// Maps a stream offset to a file offset.
    pub fn file_offset(&self, offset: u64) -> Option<u64> {
        let chunk = self.chunk_at(offset)?;
        Some(chunk.file_offset + (offset - chunk.stream_offset))
    }
}

/// The container format of a trace file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFormat {
    /// Raw PT bytes (an AUX area dump, a ToPA drain, an extracted stream).
    RawPt,
    /// A perf.data file.
    PerfData {
        /// Written in pipe mode.
        pipe: bool,
    },
}

/// A trace file interpreted as PT streams.
#[derive(Debug, Clone)]
pub struct TraceStreams<'data> {
    /// The container format.
    pub format: SourceFormat,
    /// The streams, in a stable order (by CPU, then thread, for perf.data).
    pub streams: Vec<TraceStream<'data>>,
    /// For perf.data: what the scan found besides the streams (record counts, malformed records,
    /// the framing error that ended the scan, losses that match no stream).
    pub perf: Option<PerfScan>,
}

impl<'data> TraceStreams<'data> {
    /// Detects the format by magic: "PERFILE2" is perf.data, anything else is raw PT.
    ///
    /// Fails only when a perf.data header is unusable; problems further in the file are reported
    /// in [`TraceStreams::perf`] together with the streams read up to them.
    pub fn from_bytes(bytes: &'data [u8]) -> Result<Self, StoreError> {
        if !PerfData::is_perf_data(bytes) {
            return Ok(TraceStreams {
                format: SourceFormat::RawPt,
                streams: vec![TraceStream {
                    label: "raw".to_string(),
                    cpu: None,
                    tid: None,
                    data: Cow::Borrowed(bytes),
                    chunks: vec![ChunkBoundary {
                        stream_offset: 0,
                        file_offset: 0,
                        aux_offset: None,
                        size: bytes.len() as u64,
                    }],
                    losses: Vec::new(),
                }],
                perf: None,
            });
        }
        let perf = PerfData::parse(bytes)?;
        let aux = perf.aux_streams();
        // Per-CPU streams of one CPU but different threads would share `cpuN`: disambiguate.
        let labels: Vec<String> = aux.streams.iter().map(|s| s.label()).collect();
        let streams = aux
            .streams
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let duplicate = labels.iter().filter(|l| **l == labels[i]).count() > 1;
                let label = match (duplicate, s.key.tid) {
                    (true, Some(tid)) => format!("{}.tid{tid}", labels[i]),
                    _ => labels[i].clone(),
                };
                TraceStream {
                    label,
                    cpu: s.key.cpu,
                    tid: s.key.tid,
                    chunks: s
                        .chunks
                        .iter()
                        .map(|c| ChunkBoundary {
                            stream_offset: c.stream_offset,
                            file_offset: c.file_offset,
                            aux_offset: Some(c.aux_offset),
                            size: c.size,
                        })
                        .collect(),
                    data: s.data,
                    losses: s.losses,
                }
            })
            .collect();
        Ok(TraceStreams {
            format: SourceFormat::PerfData {
                pipe: perf.is_pipe(),
            },
            streams,
            perf: Some(aux.scan),
        })
    }

    /// The stream labelled `label`.
    pub fn stream(&self, label: &str) -> Option<&TraceStream<'data>> {
        self.streams.iter().find(|s| s.label == label)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_bytes_are_one_stream() {
        let bytes = [0x02, 0x82, 0x02, 0x82];
        let source = TraceStreams::from_bytes(&bytes).unwrap();
        assert_eq!(source.format, SourceFormat::RawPt);
        assert_eq!(source.streams.len(), 1);
        assert_eq!(source.streams[0].label, "raw");
        assert_eq!(&source.streams[0].data[..], &bytes);
        assert_eq!(source.streams[0].file_offset(3), Some(3));
        assert_eq!(source.streams[0].file_offset(4), None);
    }

    #[test]
    fn empty_files_and_streams_are_errors() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = TraceFile::open(file.path()).unwrap_err();
        assert!(matches!(err, StoreError::Empty { .. }), "{err}");
        assert!(err.to_string().contains("empty file"), "{err}");
        let err = TraceFile::from_reader("-", &b""[..]).unwrap_err();
        assert!(matches!(err, StoreError::Empty { .. }), "{err}");
    }

    /// `/dev/zero` would be read until memory runs out: devices are refused at once.
    #[test]
    fn devices_and_directories_are_refused() {
        for (path, kind) in [("/dev/zero", "character device"), ("/", "directory")] {
            let err = TraceFile::open(path).unwrap_err();
            assert!(matches!(err, StoreError::NotAFile { .. }), "{err}");
            assert!(err.to_string().contains(kind), "{err}");
        }
    }

    /// A pipe is read up to the limit, then refused (the limit is checked on a reader that
    /// never ends, like `cat /dev/zero |`).
    #[test]
    fn endless_streams_stop_at_the_limit() {
        let err = read_bounded(Path::new("-"), std::io::repeat(0), 1 << 16).unwrap_err();
        assert!(matches!(err, StoreError::PipeTooLarge { .. }), "{err}");
        assert!(
            err.to_string().contains("save the trace to a file"),
            "{err}"
        );
    }

    #[test]
    fn mapped_and_read_files_agree() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, b"PERFILE2").unwrap();
        let mapped = TraceFile::open(file.path()).unwrap();
        assert!(matches!(mapped.bytes, Backing::Mapped(_)));
        let read = TraceFile::from_reader("-", &b"PERFILE2"[..]).unwrap();
        assert_eq!(mapped.bytes(), read.bytes());
        assert_eq!(read.path(), Path::new("-"));
    }

    #[test]
    fn missing_file_is_an_io_error() {
        let err = TraceFile::open("/nonexistent/ptrewind/trace").unwrap_err();
        assert!(matches!(err, StoreError::Io { .. }));
    }

    #[test]
    fn bad_perf_header_is_an_error() {
        let err = TraceStreams::from_bytes(b"PERFILE2\x05\0\0\0\0\0\0\0").unwrap_err();
        assert!(matches!(err, StoreError::PerfData(_)));
    }
}
