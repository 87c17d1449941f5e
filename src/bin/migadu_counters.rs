//! `migadu_counters`, its own executable in both builds (its row in
//! `pepsi::programs` says why).

/// The service allocates and frees per request on every runtime thread; glibc's malloc paid
/// for that in arena locks and fast-bin consolidation (docs/perf.md, migadu_counters).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    pepsi::programs::migadu_counters::main()
}
