//! Every guest thread's stream in a live QEMU session, as the stores the history reads: the
//! bytes the plugin wrote to the thread's stream file (read on from where the last stop stopped
//! reading) and, after them, a provisional completion at the place the thread is stopped at
//! ([`complete_at_pc`]), rewritten at the next stop.
//!
//! Where a thread is stopped is exact for every thread at a stop: the one that reported it sits
//! in the gdbstub at its PC; the others wait at the pause gate at the start of a block the tail
//! file announces and none of which has run (their PC is that block's start), at a system
//! call's return, or inside a system call (their PC is after the `SYSCALL`, as QEMU keeps it).
//! A thread that ended (the plugin wrote its summary) has its whole stream in the file.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::complete_at_pc;
use crate::capture::qemu::output::{TailState, stream_path};
use crate::image::Image;
use crate::store::live::TraceStore;

/// One guest thread's stream as its store holds it.
#[derive(Debug)]
pub(super) struct LiveStream {
    /// The guest (= host) thread id.
    pub(super) tid: u32,
    pub(super) store: TraceStore,
    /// The stream file, once it exists (read on from `written`).
    file: Option<File>,
    /// Bytes of the stream file in the store (the store's bytes after them are provisional).
    pub(super) written: u64,
    /// The stream ended (the plugin's summary, or the process gone) and is in the store whole.
    pub(super) finished: bool,
}

/// What one stop did with a stream.
#[derive(Debug, Default, Clone)]
pub(super) struct Synced {
    /// Stream-file bytes read.
    pub(super) read: u64,
    /// Provisional bytes written after them.
    pub(super) provisional: u64,
    /// How the stream was completed (`None`: it was not).
    pub(super) note: Option<String>,
}

impl LiveStream {
    pub(super) fn new(tid: u32, store: TraceStore) -> LiveStream {
        LiveStream {
            tid,
            store,
            file: None,
            written: 0,
            finished: false,
        }
    }

    /// Reads the bytes the plugin wrote since the last stop. `Ok(None)`: no stream file yet.
    fn read_new(&mut self, dir: &Path, pid: u32) -> Result<Option<Vec<u8>>, String> {
        let path = stream_path(dir, pid, self.tid, "pt");
        if self.file.is_none() {
            match File::open(&path) {
                Ok(f) => self.file = Some(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(format!("opening {}: {e}", path.display())),
            }
        }
        let mut bytes = Vec::new();
        if let Some(f) = self.file.as_mut() {
            // The file only grows, and only its thread (held now) writes it.
            f.read_to_end(&mut bytes)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
        }
        Ok(Some(bytes))
    }

    /// The thread ended (its summary is written, so is its whole stream): the rest of the file
    /// goes into the store, replacing the provisional bytes, and the stream is done.
    pub(super) fn finish_from_file(&mut self, dir: &Path, pid: u32) -> Result<Synced, String> {
        let bytes = self.read_new(dir, pid)?.unwrap_or_default();
        let read = bytes.len() as u64;
        self.rewrite(&bytes, read);
        self.finished = true;
        self.file = None;
        Ok(Synced {
            read,
            provisional: 0,
            note: None,
        })
    }

    /// The whole stream as the recording directory's reader completed it (the process is
    /// gone): the store is rewritten from the end of the bytes it already had from the file.
    pub(super) fn finish_with(&mut self, trace: &[u8], note: Option<String>) -> Synced {
        let from = usize::try_from(self.written)
            .unwrap_or(usize::MAX)
            .min(trace.len());
        self.store.rewrite_from(from, &trace[from..]);
        self.written = trace.len() as u64;
        self.finished = true;
        self.file = None;
        Synced {
            read: (trace.len() - from) as u64,
            provisional: 0,
            note,
        }
    }

    /// The stream up to where the thread is stopped: the new bytes of its file, then
    /// [`complete_at_pc`] at `pc` (`None`: where it is is unknown, and the block its tail file
    /// says was running is not counted), stamped with the clock `now`.
    pub(super) fn sync_at(
        &mut self,
        dir: &Path,
        pid: u32,
        pc: Option<u64>,
        now: Option<u64>,
        image: &Image,
    ) -> Result<Synced, String> {
        let Some(mut bytes) = self.read_new(dir, pid)? else {
            // Nothing executed yet (stopped before its first block).
            return Ok(Synced::default());
        };
        let read = bytes.len() as u64;
        let written = self.written + read;
        let tail = std::fs::read(stream_path(dir, pid, self.tid, "tail"))
            .ok()
            .and_then(|d| TailState::read(&d));
        let note = match tail {
            Some(tail) => {
                let at = pc.or(tail.in_flight.map(|b| b.0));
                at.map(|at| complete_at_pc(written, &mut bytes, &tail, at, now, image))
            }
            None => None,
        };
        self.rewrite(&bytes, read);
        Ok(Synced {
            read,
            provisional: bytes.len() as u64 - read,
            note: Some(note.unwrap_or_else(|| {
                "no tail file (or no running block): the stream ends at its last write, not \
                 closed at a PC"
                    .into()
            })),
        })
    }

    /// Puts `bytes` (the first `read` of them from the file) after the file bytes already in
    /// the store, dropping the last stop's provisional ones.
    fn rewrite(&mut self, bytes: &[u8], read: u64) {
        let from = usize::try_from(self.written).unwrap_or(usize::MAX);
        self.store.rewrite_from(from, bytes);
        self.written += read;
    }
}

/// The thread ids of process `pid`'s stream files in `dir`.
pub(super) fn stream_tids(dir: &Path, pid: u32) -> Vec<u32> {
    let prefix = format!("{pid}-");
    let mut tids: Vec<u32> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name();
                    let name = name.to_str()?;
                    name.strip_prefix(&prefix)?
                        .strip_suffix(".pt")?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    tids
}

/// Processes other than `pid` whose streams the plugin writes into `dir`: children the
/// program forked (QEMU runs them too, with the plugin; its gdbstub does not follow them).
pub(super) fn forked_pids(dir: &Path, pid: u32) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name();
                    name.to_str()?.strip_suffix(".maps")?.parse().ok()
                })
                .filter(|&p| p != pid)
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    pids
}
