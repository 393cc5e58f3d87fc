//! The perf ABI shared by every layer that reads perf output: the kernel's record types, flags
//! and `sample_id` trailer ([`abi`], from `perf-event-open-sys`'s bindings where the kernel
//! defines them), and the perf.data file reader ([`data`]). It imports nothing else of the
//! crate, so the ring reader (`ring::aux`), the trace store and the sideband image
//! (`image::perf_maps`) all point down to it.

pub mod abi;
pub mod data;
