//! LLDB trace packets (jLLDBTrace*) — in progress.
