//! `ptrewind decode`.

use super::CmdResult;

/// Arguments of `ptrewind decode`.
#[derive(clap::Args, Debug)]
pub struct DecodeArgs {}

/// Runs `ptrewind decode`.
pub fn run(_args: DecodeArgs) -> CmdResult {
    Err("not implemented yet".into())
}
