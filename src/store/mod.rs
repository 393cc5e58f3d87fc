//! The trace store: PT bytes drained from a ring or read from files (raw streams, perf.data).

pub mod live;
