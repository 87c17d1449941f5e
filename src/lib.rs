//! The `pepsi` package: owns every program's `[[bin]]` in `src/bin/`. Each binary is a few
//! lines calling `run()` of its crate under `crates/`; the unified multi-call binary will
//! collect those entry points here (`pepsi::programs`).
