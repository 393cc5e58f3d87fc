//! `ptrewind`: the command-line front end. A thin layer over the library; all printing happens here.

mod cli;

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
