//! # ptrewind
//!
//! Record-and-replay debugging over Intel Processor Trace.
//!
//! The library is organised along the one-way data flow of a recording:
//!
//! ```text
//! capture ──▶ ring ──▶ store ──▶ packet ──▶ flow ──▶ history ──▶ timeline ──▶ server
//! (perf AUX   (ToPA     (trace    (bytes →   (packets  (indexed   (positions,  (GDB/LLDB
//!  or ptrace   model /   bytes,    packets)   + image   history)   both-way     remote
//!  encoder)    AUX ring) perf.data)           → insns)             stepping)    protocol)
//! ```
//!
//! The [`timeline`] drives a live capture backend through the one [`capture::LiveBackend`]
//! trait and knows no debugger protocol; the [`server`] only adapts it to GDB and LLDB.
//!
//! [`view`] draws a recording (a flame graph and a call timeline) from the flow decoder's
//! output; the server's `monitor view` and the `ptrewind view` command use it.
//!
//! [`rsp`] holds the GDB remote protocol's byte-level rules (framing, checksums, escapes, hex):
//! the server speaks the protocol to debuggers and the QEMU backend speaks it to QEMU's gdbstub.
//!
//! [`image`] (the traced program's code) and [`target`] (ptrace control of a live process) sit
//! beside the flow: the decoder reads code from an image, the server drives a target.
//! See `docs/architecture.md` for the threads and where to add a packet, a backend or a protocol
//! extension. The library never prints; the `ptrewind` binary is a thin CLI over it.
#![warn(missing_docs)]

pub mod capture;
pub mod flow;
pub mod history;
pub mod image;
pub mod packet;
pub mod perf;
pub mod ring;
pub mod rsp;
pub mod server;
pub mod store;
pub mod target;
pub mod timeline;
pub mod view;

#[cfg(test)]
mod test_rng;
