//! The software PT backend: a ptrace single-stepper that encodes the executed flow into the packets
//! a CPU would emit, written through the ToPA output model.

pub mod encoder;

pub use encoder::{Cofi, EncoderConfig, EncoderStats, SoftEncoder, Step};
