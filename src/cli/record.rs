//! `ptrewind record`.

use super::CmdResult;

/// Arguments of `ptrewind record`.
#[derive(clap::Args, Debug)]
pub struct RecordArgs {}

/// Runs `ptrewind record`.
pub fn run(_args: RecordArgs) -> CmdResult {
    Err("not implemented yet".into())
}
