//! The `pepsi` package: owns every program's `[[bin]]` in `src/bin/`. Each binary is a few
//! lines: a folded program's calls its entry point in [`programs`] (the same one the unified
//! multi-call binary `pepsi` dispatches to), a standalone program's calls `run()` of its
//! crate under `crates/` directly.

pub mod programs;
