//! Writes the manual page of every program (`pepsi::manual`) and the hand-written pages of
//! `man/` into DIR/man<section>/: `cargo run --example pepsi-man -- DIR` (`make man`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: pepsi-man DIR   (writes DIR/man1, DIR/man7, DIR/man8)");
        return ExitCode::from(2);
    };
    match pepsi::manual::write_all(std::path::Path::new(&dir)) {
        Ok(files) => {
            println!("{} manual pages in {}", files.len(), dir.to_string_lossy());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "pepsi-man: cannot write the pages into {}: {e}",
                dir.to_string_lossy()
            );
            ExitCode::from(1)
        }
    }
}
