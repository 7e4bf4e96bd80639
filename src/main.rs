use clap::Parser;

fn main() {
    let cli = seistomo::cli::Cli::parse();
    if let Err(e) = seistomo::cli::run(cli) {
        // One line: the error and its causes, joined.
        let msg = format!("{e:#}").replace('\n', " ");
        eprintln!("seistomo: error: {msg}");
        std::process::exit(1);
    }
}
