//! Seeing a recording: the call tree of a trace, rendered as a flame graph (SVG) and as a
//! timeline of calls (Chrome/Perfetto trace-event JSON).
//!
//! The call tree is built once, while the flow decoder streams each trace: a [`Tracker`] per
//! stream follows calls and returns (see [`tracker`] for what counts as one) and feeds both
//! outputs at the same time:
//!
//! * the [`CallTree`], a trie of the distinct call stacks with the instructions each executed —
//!   the folded stacks [`write_flamegraph`] hands to `inferno`;
//! * the [`TraceEvents`], which writes one slice per call to its JSON output as the call closes
//!   ([`trace_event`] says where times come from).
//!
//! Memory is bounded by the number of distinct call stacks, the stack depth and the calls
//! waiting for a timing update ([`trace_event::WINDOW_RECORDS`]) — not by the trace's length.
//! This layer sits above `flow` (and `image` for symbols); nothing below imports it, and it
//! never prints: progress goes to a callback, results are returned.
//!
//! ```no_run
//! # fn demo(trace: &[u8], image: &ptrewind::image::Image, symbols: &ptrewind::image::Symbolizer)
//! # -> std::io::Result<()> {
//! use ptrewind::view::{Clock, TrackInput, View, TscConversion, write_flamegraph, FlameOptions};
//! let clock = Clock::for_traces([trace], &Default::default(), TscConversion::Unknown);
//! let mut view = View::new(Some(std::fs::File::create("calls.json")?), clock);
//! view.add_track(
//!     &TrackInput::new("prog", "thread 1", trace, image, symbols),
//!     &mut |_offset| {},
//! );
//! let done = view.finish(Default::default())?;
//! write_flamegraph(&done.tree, &FlameOptions::default(), std::fs::File::create("flame.svg")?)?;
//! # Ok(()) }
//! ```

pub mod calltree;
pub mod flame;
pub mod trace_event;
pub mod tracker;

pub use calltree::{CallSink, CallTree, FuncId, Functions, Stack};
pub use flame::{FlameOptions, write_flamegraph};
pub use trace_event::{Clock, TraceEventSummary, TraceEvents, TscConversion};
pub use tracker::{NoTimeline, Run, TrackSummary, Tracker};

use std::io::Write;

use crate::flow::{BlockItem, FlowConfig, FlowDecoder, FlowStats};
use crate::image::{Image, Symbolizer};

/// One trace stream to add to a [`View`]: a track of the timeline.
#[derive(Debug, Clone)]
pub struct TrackInput<'a> {
    /// The process name shown in the timeline.
    pub process: &'a str,
    /// The track's name (thread, CPU or stream label).
    pub name: &'a str,
    /// Process id in the timeline (1 when unknown).
    pub pid: u32,
    /// Track id in the timeline (unique per track of a view).
    pub tid: u32,
    /// The Intel PT bytes.
    pub trace: &'a [u8],
    /// The code the trace ran.
    pub image: &'a Image,
    /// Function names.
    pub symbols: &'a Symbolizer,
    /// How to decode the trace (errata, timing).
    pub flow: FlowConfig,
}

impl<'a> TrackInput<'a> {
    /// A track with pid 1, tid 1 and the default decoder configuration.
    pub fn new(
        process: &'a str,
        name: &'a str,
        trace: &'a [u8],
        image: &'a Image,
        symbols: &'a Symbolizer,
    ) -> Self {
        TrackInput {
            process,
            name,
            pid: 1,
            tid: 1,
            trace,
            image,
            symbols,
            flow: FlowConfig::default(),
        }
    }
}

/// What [`View::add_track`] saw in one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrackReport {
    /// The call tracking counters.
    pub calls: TrackSummary,
    /// The flow decoder's counters (instructions, events, errors).
    pub flow: FlowStats,
}

/// The finished view: the call tree (for the flame graph), what each track saw, and the
/// timeline's writer.
#[derive(Debug)]
pub struct Finished<W> {
    /// Every call stack, with instruction counts.
    pub tree: CallTree,
    /// Per track: its name and counters, in the order added.
    pub tracks: Vec<(String, TrackReport)>,
    /// The timeline's writer (flushed) and counters, when there was a timeline.
    pub timeline: Option<(W, TraceEventSummary)>,
}

/// Builds the call tree of one or more streams and, optionally, streams their timeline.
#[derive(Debug)]
pub struct View<W: Write> {
    tree: CallTree,
    timeline: Option<TraceEvents<W>>,
    tracks: Vec<(String, TrackReport)>,
}

/// Decodes `dec` to its end, feeding `tracker` (and through it `tree` and `sink`).
fn follow(
    dec: &mut FlowDecoder<'_>,
    tracker: &mut Tracker<'_>,
    tree: &mut CallTree,
    sink: &mut impl CallSink,
    progress: &mut dyn FnMut(u64),
) {
    let mut k = 0u32;
    loop {
        if k & 0xfff == 0 {
            progress(dec.offset());
        }
        k = k.wrapping_add(1);
        let Some(item) = dec.next_block() else { break };
        match item {
            BlockItem::Block(b) => {
                let last = b.lens().last().copied().unwrap_or(0);
                let next = b.end.wrapping_add(u64::from(last));
                let run = Run {
                    start: b.start,
                    count: b.count,
                    class: b.class,
                    next,
                    time: b.time,
                };
                tracker.block(tree, sink, run);
            }
            BlockItem::Event(e) => tracker.event(tree, sink, &e),
        }
    }
    tracker.finish(tree, sink);
    progress(dec.offset());
}

impl<W: Write> View<W> {
    /// A view writing its timeline to `timeline` (none: only the call tree) with times from
    /// `clock` (see [`Clock::for_traces`]).
    pub fn new(timeline: Option<W>, clock: Clock) -> Self {
        View {
            tree: CallTree::default(),
            timeline: timeline.map(|w| TraceEvents::new(w, clock)),
            tracks: Vec::new(),
        }
    }

    /// Decodes one stream and adds its calls to the tree and, as a track, to the timeline.
    /// `progress` is called now and then with the trace offset reached.
    pub fn add_track(
        &mut self,
        input: &TrackInput<'_>,
        progress: &mut dyn FnMut(u64),
    ) -> TrackReport {
        let mut dec = FlowDecoder::new(input.trace, input.image, input.flow.clone());
        let mut tracker = Tracker::new(input.symbols);
        match &mut self.timeline {
            Some(tl) => {
                tl.begin_track(input.pid, input.tid, input.process, input.name);
                follow(&mut dec, &mut tracker, &mut self.tree, tl, progress);
                tl.end_track(&self.tree.functions);
            }
            None => follow(
                &mut dec,
                &mut tracker,
                &mut self.tree,
                &mut NoTimeline,
                progress,
            ),
        }
        let report = TrackReport {
            calls: tracker.summary(),
            flow: dec.stats(),
        };
        self.tracks.push((input.name.to_string(), report));
        report
    }

    /// Leaves calls of fewer than `n` instructions out of the timeline (they still count in
    /// their caller and in the call tree).
    pub fn set_min_slice_insns(&mut self, n: u64) {
        if let Some(tl) = &mut self.timeline {
            tl.set_min_insns(n);
        }
    }

    /// The call tree so far.
    pub fn tree(&self) -> &CallTree {
        &self.tree
    }

    /// Ends the timeline document (its `otherData` is `other` plus the clock, and each track's
    /// counters) and returns the tree, the tracks' counters and the writer.
    pub fn finish(
        self,
        mut other: serde_json::Map<String, serde_json::Value>,
    ) -> std::io::Result<Finished<W>> {
        let tracks: Vec<serde_json::Value> = self
            .tracks
            .iter()
            .map(|(name, r)| {
                serde_json::json!({
                    "name": name,
                    "instructions": r.calls.insns,
                    "frames": r.calls.frames,
                    "max_depth": r.calls.max_depth,
                    "tail_calls": r.calls.tail_calls,
                    "outer_frames": r.calls.outer_frames,
                    "unmatched_returns": r.calls.unmatched_returns,
                    "depth_capped": r.calls.depth_capped,
                    "stack_resets": r.calls.resets,
                    "decode_errors": r.flow.errors,
                })
            })
            .collect();
        other.insert("tracks".into(), tracks.into());
        other
            .entry("generator")
            .or_insert_with(|| format!("ptrewind {}", env!("CARGO_PKG_VERSION")).into());
        let timeline = match self.timeline {
            Some(tl) => Some(tl.finish(other)?),
            None => None,
        };
        Ok(Finished {
            tree: self.tree,
            tracks: self.tracks,
            timeline,
        })
    }
}

/// An output file written under a temporary name beside `path` and renamed over it once
/// complete: nobody sees half a file, and an existing symbolic link at `path` is replaced,
/// never written through. Dropped without [`OutputFile::commit`], the temporary file is
/// removed.
#[derive(Debug)]
pub struct OutputFile {
    path: std::path::PathBuf,
    tmp: std::path::PathBuf,
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl OutputFile {
    /// Creates the temporary file (exclusively: an existing file or link of that name is an
    /// error, not followed).
    pub fn create(path: &std::path::Path) -> std::io::Result<Self> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = path.file_name().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}: not a file name", path.display()),
            )
        })?;
        let tmp = path.with_file_name(format!(
            ".{}.{}-{}.tmp",
            name.to_string_lossy(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        Ok(OutputFile {
            path: path.to_path_buf(),
            tmp,
            file: Some(std::io::BufWriter::with_capacity(1 << 16, file)),
        })
    }

    /// Flushes the file and renames it to its final path.
    pub fn commit(mut self) -> std::io::Result<()> {
        if let Some(mut f) = self.file.take() {
            f.flush()?;
            drop(f);
            std::fs::rename(&self.tmp, &self.path)?;
        }
        Ok(())
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.file {
            Some(f) => f.write(buf),
            None => Err(std::io::Error::other("output file already committed")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.file {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
