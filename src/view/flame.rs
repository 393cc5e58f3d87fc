//! The flame graph: the call tree's folded stacks rendered to an interactive SVG by the
//! `inferno` crate (Brendan Gregg's flamegraph.pl in Rust: hover for counts, click to zoom,
//! Ctrl-F to search).

use std::io::Write;

use super::calltree::CallTree;

/// What the flame graph says about itself.
#[derive(Debug, Clone, Default)]
pub struct FlameOptions {
    /// The title at the top.
    pub title: String,
    /// A line under the title (the source of the recording, the time it covers ...).
    pub subtitle: Option<String>,
}

/// Writes the flame graph of `tree` (instructions by call stack) as SVG to `out`.
///
/// A tree without any instruction still gives a valid SVG, saying so.
pub fn write_flamegraph(
    tree: &CallTree,
    opts: &FlameOptions,
    out: impl Write,
) -> std::io::Result<()> {
    let lines = tree.folded();
    let mut o = inferno::flamegraph::Options::default();
    o.title = opts.title.clone();
    o.subtitle = opts.subtitle.clone();
    o.count_name = "instructions".to_string();
    o.name_type = "Function:".to_string();
    // Colour by name (the same function has the same colour everywhere), warm palette.
    o.hash = true;
    o.colors =
        inferno::flamegraph::color::Palette::Basic(inferno::flamegraph::color::BasicPalette::Hot);
    o.image_width = Some(1600);
    o.font_size = 13;
    o.frame_height = 18;
    o.min_width = 0.1;
    o.notes = "ptrewind view: instructions executed, by call stack".to_string();
    if lines.is_empty() {
        // inferno refuses empty input; one explicit frame says why the graph is empty.
        let empty = ["(no instructions decoded) 1"];
        return inferno::flamegraph::from_lines(&mut o, empty.iter().copied(), out);
    }
    inferno::flamegraph::from_lines(&mut o, lines.iter().map(String::as_str), out)
}
