//! Capture backends: the hardware `intel_pt` PMU (perf AUX area), the software encoder that
//! single-steps a target under ptrace and emits the packets a CPU would, and a program running
//! under QEMU user mode (driven through QEMU's gdbstub) — each behind the one [`LiveBackend`]
//! trait the timeline drives.

pub mod backend;
pub mod perf;
pub mod qemu;
pub mod soft;

pub use backend::{ExecBoundary, LiveBackend, PastWrite, RecordedState};
