//! The software PT backend: a ptrace single-stepper that encodes the executed flow into the packets
//! a CPU would emit, written through the ToPA output model.
//!
//! * [`encoder`] — instructions → packets ([`SoftEncoder`]);
//! * [`classify`] — decoding and classifying instructions from the live process ([`InsnCache`]);
//! * [`target`] — what the recorder needs from a process ([`StepTarget`]) and a minimal
//!   ptrace child ([`PtraceChild`]);
//! * [`recorder`] — the single-stepping recorder ([`SoftRecorder`]) with its output ring and
//!   drainer;
//! * [`state_log`] — per-instruction undo records for reverse execution ([`StateLog`]);
//! * [`server_target`] — [`StepTarget`] for the GDB server's `PtraceTarget`;
//! * [`procmaps`] — `/proc/PID/maps`, `main`/entry lookup, image snapshots.

pub mod classify;
pub mod encoder;
pub mod procmaps;
pub mod recorder;
pub mod server_target;
pub mod state_log;
pub mod target;

pub use classify::{CachedInsn, InsnCache, InsnClass};
pub use encoder::{Cofi, EncoderConfig, EncoderStats, SoftEncoder, Step};
pub use recorder::{
    Exit, RecordError, RecordFrom, RecorderConfig, RecorderStats, Recording, RingConfig,
    SoftRecorder, StepEvent, StepMode,
};
pub use state_log::{StateLog, StateLogStats};
pub use target::{PtraceChild, Regs, SigInfo, StepStop, StepTarget, TargetError};
