//! Capture of a program running under QEMU user mode (`qemu-x86_64`).
//!
//! * [`remote`] — a GDB remote-protocol client for QEMU's gdbstub: run control, registers,
//!   memory and breakpoints of the program at the present.

pub mod remote;
