use clap::Parser;

fn main() {
    let cli = seistomo::cli::Cli::parse();
    if let Err(e) = seistomo::cli::run(cli) {
        // One line: the error and its causes, joined. A closed stderr is ignored
        // (src/console.rs): the exit status still says what happened.
        let msg = format!("{e:#}").replace('\n', " ");
        seistomo::ui::console::err(format_args!("seistomo: error: {msg}"));
        std::process::exit(1);
    }
}
