//! The `privmix` command line.

fn main() {
    eprintln!("privmix: no subcommands yet");
    std::process::exit(2);
}
