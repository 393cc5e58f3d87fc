//! The trace store: PT bytes drained from a ring or read from files (raw streams, perf.data).
//!
//! A [`TraceFile`] maps a file into memory; [`TraceStreams`] looks at its bytes and presents them as
//! one or more named PT streams ([`TraceStream`]): a raw PT file is one stream (`raw`), a perf.data
//! file has one stream per CPU (or thread) built from its `PERF_RECORD_AUXTRACE` payloads
//! ([`perf_data`]). Each stream remembers where its bytes came from (chunk boundaries with file
//! and AUX offsets) and where data was lost, so that packet offsets can be reported against the
//! file and decoders know where to resynchronise.

pub mod live;
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
    /// The file looks like perf.data but its header is unusable.
    #[error(transparent)]
    PerfData(#[from] PerfDataError),
}

/// The bytes of a trace file: memory-mapped when it is a regular file, read into memory when it
/// is a pipe or another stream (perf's pipe mode is meant for `perf record -o - | ...`).
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

impl TraceFile {
    /// Maps `path` read-only (or reads it, when it is not a regular file).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        let mut file = File::open(&path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        // An empty file cannot be mapped, and pipes and character devices cannot be mapped.
        let bytes = if !meta.is_file() || meta.len() == 0 {
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).map_err(io)?;
            Backing::Owned(bytes)
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

    /// Reads a whole stream (e.g. stdin) into memory; `name` is what [`TraceFile::path`] reports.
    pub fn from_reader(
        name: impl Into<PathBuf>,
        mut reader: impl Read,
    ) -> Result<Self, StoreError> {
        let path = name.into();
        let mut bytes = Vec::new();
        reader
            .read_to_end(&mut bytes)
            .map_err(|source| StoreError::Io {
                path: path.clone(),
                source,
            })?;
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
    fn empty_file_maps_to_no_bytes() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let trace = TraceFile::open(file.path()).unwrap();
        assert!(trace.bytes().is_empty());
        assert_eq!(trace.source().unwrap().streams[0].data.len(), 0);
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
