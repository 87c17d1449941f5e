//! The `pepsi` package: owns every program's `[[bin]]` in `src/bin/`. Each binary is a few
//! lines: a folded program's calls its entry point in [`programs`] (the same one the unified
//! multi-call binary `pepsi` dispatches to), a standalone program's calls `run()` of its
//! crate under `crates/` directly. [`checks`] is the table of every program's configuration
//! parser, which the configuration tools run over a candidate configuration; [`manual`] renders
//! every program's manual page from its command line.

pub mod checks;
pub mod manual;
pub mod programs;
