//! The software PT backend: a ptrace single-stepper that encodes the executed flow into the packets
//! a CPU would emit, written through the ToPA output model.
//!
//! * [`encoder`] — instructions → packets ([`SoftEncoder`]);
//! * [`classify`] — decoding and classifying instructions from the live process ([`InsnCache`]);
//! * [`target`] — what the recorder needs from a process ([`StepTarget`]), implemented by the
//!   one ptrace task type, [`PtraceTarget`](crate::target::PtraceTarget);
//! * [`recorder`] — the single-stepping recorder ([`SoftRecorder`]) with its output ring and
//!   drainer;
//! * [`state_log`] — per-instruction undo records for reverse execution ([`StateLog`]);
//! * [`procmaps`] — `/proc/PID/maps`, `main`/entry lookup, image snapshots;
//! * [`live`] — the recorder as a [`LiveBackend`](crate::capture::LiveBackend) ([`SoftCapture`]).

//!
//! # Example
//!
//! ```no_run
//! use std::process::Command;
//! use ptrewind::capture::soft::{RecorderConfig, SoftRecorder};
//! use ptrewind::target::{PtraceTarget, SpawnOptions};
//!
//! let child = PtraceTarget::spawn_command(Command::new("./a.out"), &SpawnOptions::default())?;
//! // Runs the dynamic loader untraced to `main`, then records until the process exits.
//! let mut recorder = SoftRecorder::new(child, RecorderConfig::default())?;
//! recorder.run(None)?;
//! let recording = recorder.finish()?;
//! assert_eq!(recording.stats.lost_bytes, 0);
//! // `recording.trace` is an Intel PT stream (user-only, as `intel_pt//u` would give) and
//! // `recording.image` the process's code at exit: decode them with `crate::flow::FlowDecoder`.
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod classify;
pub mod encoder;
pub mod live;
pub mod procmaps;
pub mod recorder;
pub mod state_log;
pub mod target;

pub use classify::{CachedInsn, InsnCache, InsnClass};
pub use encoder::{Cofi, EncoderConfig, EncoderStats, SoftEncoder, Step};
pub use live::SoftCapture;
pub use recorder::{
    ExecPeriod, Exit, Interrupter, RecordError, RecordFrom, RecorderConfig, RecorderStats,
    Recording, RingConfig, SoftRecorder, StepEvent, StepMode, ThreadTrace,
};
pub use state_log::{EntryKind, StateLog, StateLogStats, SuspendedStep, UnknownWrite, WriteHit};
pub use target::{SigInfo, StepStop, StepTarget};
