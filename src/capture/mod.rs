//! Capture backends: the hardware `intel_pt` PMU (perf AUX area) and the software encoder that
//! single-steps a target under ptrace and emits the packets a CPU would — each behind the one
//! [`LiveBackend`] trait the timeline drives.

pub mod backend;
pub mod perf;
pub mod qemu;
pub mod soft;

pub use backend::{LiveBackend, PastWrite, RecordedState};
