//! `pepsi`: the unified multi-call binary (feature `unibin`). Every folded program is a
//! symlink to it; argv[0] picks the program (`pepsi::programs::multicall`).
fn main() -> std::process::ExitCode {
    // Before anything runs: the stage registry fusion needs exists only in this binary.
    pepsi::programs::install_fusion();
    pepsi::programs::multicall()
}
