//! Capture backends: the hardware `intel_pt` PMU (perf AUX area) and the software encoder that
//! single-steps a target under ptrace and emits the packets a CPU would; and a program running
//! under QEMU user mode, driven through QEMU's gdbstub.

pub mod perf;
pub mod qemu;
pub mod soft;
