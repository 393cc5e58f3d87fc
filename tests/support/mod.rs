//! Shared support code for the integration tests (each `tests/*.rs` binary does `mod support;`
//! and uses a subset, hence the `dead_code` allowances).
//!
//! - [`libipt`]: FFI to Intel's libipt 2.0.5, the differential oracle (packets and instruction
//!   flow); self-contained, so benchmarks can `#[path]`-include it.
//! - [`corpus`]: readers for the real-hardware trace corpus in `shared/corpus` (needs sibling
//!   `libipt`).
//! - [`cbuild`]: compiling the C test programs, `nm` symbol lookups, tool detection.
//! - [`hase`]: the instruction addresses a HASE `.trace` branch list implies (also
//!   `#[path]`-included by the crate's unit tests).
//! - [`gdb`]: child processes with deadlines, GDB in batch mode, `ptrewind record` servers.
//! - [`programs`]: whole runs of `ls`, `sed`, `sort` recorded under QEMU (ls/sed/sort traces).
//! - [`qemu`]: QEMU backend recordings in test mode (the plugin's per-instruction log).
//! - [`rsp`]: a raw remote-protocol client (exact packets, acks, Ctrl-C).
//! - [`synth`]: synthetic PT streams from the encoder (also `#[path]`-included by the crate's
//!   unit tests).
//! - [`hwexec`]: a synthetic perf.data (per thread or per CPU) of a process that calls
//!   `execve` while traced, with both programs' sideband.
//! - [`percpu`]: a synthetic per-CPU perf.data with its per-thread ground truth (also
//!   `#[path]`-included by the crate's unit tests).
//! - [`flow_ips`]: our decoder's instruction addresses and errors for one trace.
#![allow(dead_code)]

pub mod cbuild;
pub mod corpus;
pub mod gdb;
pub mod hase;
pub mod hwexec;
pub mod libipt;
pub mod percpu;
pub mod programs;
pub mod qemu;
pub mod rsp;
pub mod synth;

/// The packet layer, as `synth` names it (`super::packet`; see there).
use ptrewind::packet;

#[allow(unused_imports)]
pub use corpus::{CorpusTrace, all_traces, corpus_dir, require_corpus, trace};
#[allow(unused_imports)]
pub use libipt::{ImageSection, ipt_insn_count, ipt_insns, ipt_packets};

/// Our flow decoder's instruction addresses of `trace` over `image`, and its decode errors (as
/// `offset … ip …: kind` lines).
pub fn flow_ips(trace: &[u8], image: &ptrewind::image::Image) -> (Vec<u64>, Vec<String>) {
    use ptrewind::flow::{EventKind, FlowConfig, FlowDecoder, Item};
    let mut dec = FlowDecoder::new(trace, image, FlowConfig::default());
    let mut ips = Vec::new();
    let mut errors = Vec::new();
    while let Some(item) = dec.next_item() {
        match item {
            Item::Insn(i) => ips.push(i.ip),
            Item::Event(e) => {
                if let EventKind::Error { kind, ip } = &e.kind {
                    errors.push(format!("offset {:#x} ip {ip:x?}: {kind}", e.offset));
                }
            }
        }
    }
    (ips, errors)
}
