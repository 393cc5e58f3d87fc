//! Trace output rings: the SDM's ToPA and single-range output schemes as a software model, and the
//! perf AUX area, each with a writer side and a reader (drainer) side.

pub mod aux;
