//! `ptrewind`: the command-line front end. A thin layer over the library; all printing happens here.

mod cli;

// The library's test generator, for the CLI's own randomised tests (which use part of it).
#[cfg(test)]
#[allow(dead_code)]
#[path = "test_rng.rs"]
mod test_rng;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse_args();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("ptrewind: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}
