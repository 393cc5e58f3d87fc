//! `ptrewind dump`.

use super::CmdResult;

/// Arguments of `ptrewind dump`.
#[derive(clap::Args, Debug)]
pub struct DumpArgs {}

/// Runs `ptrewind dump`.
pub fn run(_args: DumpArgs) -> CmdResult {
    Err("not implemented yet".into())
}
