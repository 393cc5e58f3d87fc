//! The QEMU capture: programs run under QEMU user-mode emulation (`qemu-x86_64`) with a TCG plugin
//! (the `ptrewind-qemu-plugin` crate) that turns the executed translation blocks into Intel PT,
//! one stream per guest thread.
//!
//! * [`block`] — what is kept per translated block ([`BlockInfo`]);
//! * [`tracer`] — block executions → packets, asynchronous transfers ([`ThreadTracer`]);
//! * [`output`] — the per-thread ToPA ring and files of a recording directory;
//! * [`recording`] — launching QEMU with the plugin and reading a finished recording
//!   ([`QemuRecording`]);
//! * [`live`] — the live backend: the program under QEMU with the plugin and the gdbstub, as a
//!   [`LiveBackend`](crate::capture::LiveBackend) ([`QemuLive`]);
//! * [`remote`] — a GDB remote-protocol client for QEMU's gdbstub: run control, registers,
//!   memory and breakpoints of the program at the present.

pub mod block;
pub mod live;
pub mod output;
pub mod recording;
pub mod remote;
pub mod tracer;

pub use block::BlockInfo;
pub use live::QemuLive;
pub use output::{PluginMeta, ThreadMeta, ThreadOutput};

pub use recording::{QemuConfig, QemuError, QemuRecording, Recorded, RecordedThread};
pub use tracer::{SignalHandlers, ThreadTracer, TracerConfig, TracerStats};
