//! A message's trace: the ids that join its spans (`ids`), the one wire format by which a
//! Pepsi process hands a finished span to its host's `pepsi-telemetry-client` (`wire`), the
//! non-blocking sender every process uses for it (`emit`), the attribute names the client
//! exports them under (`attr`), and the row the receiver stores each in (`row`).
//!
//! The trace context rides in the row's `state.trace` (`crate::state::Trace`), so a trace
//! survives process hops, retries and a dispatcher's takeover. Nothing here may block or fail
//! a message: a span that cannot be handed over is counted and dropped.

pub mod attr;
pub mod emit;
pub mod ids;
pub mod privacy;
pub mod row;
pub mod wire;

pub use emit::Emitter;
pub use ids::{SpanId, TraceId};
pub use row::SpanRow;
pub use wire::{CounterDelta, CountersRecord, Datagram, SpanKind, SpanOutcome, SpanRecord};
