//! The names under which a span or a metric point carries Pepsi's facts, as OpenTelemetry
//! attributes: one definition for the client that sets them (`pepsi-telemetry-client`), the
//! receiver that lifts them into columns (`pepsi-telemetry`) and the pages that read them.
//! Pure: names only.

/// The resource's `service.name` of every span and metric a Pepsi host exports.
pub const SERVICE_NAME: &str = "pepsi";
/// OpenTelemetry's resource attribute for the service.
pub const RESOURCE_SERVICE: &str = "service.name";
/// OpenTelemetry's resource attribute for the host that ran the span.
pub const RESOURCE_HOST: &str = "host.name";
/// The program that ran the span (`pepsi-ingress`, `pepsi-stage-route`, `pepsi-dispatch`).
pub const PROGRAM: &str = "pepsi.program";
/// OpenTelemetry's process id attribute.
pub const PID: &str = "process.pid";
/// The stage section a pass ran (`route`, `local`); absent on the ingress's span.
pub const STAGE: &str = "pepsi.stage";
/// The `pepsi.workqueue` row (an integer).
pub const QUEUE_ID: &str = "pepsi.queue_id";
/// The message's Message-ID field body, the one header field that leaves a host.
pub const MESSAGE_ID: &str = "pepsi.message_id";
/// How the span ended: `accepted` (ingress), `advanced`, `paused`, `finished`, `failed`,
/// `deferred` (a temporary failure), `interrupted` (the worker died mid-pass), `abandoned`
/// (the row was taken over before the pass could commit).
pub const OUTCOME: &str = "pepsi.outcome";
/// The stage an advance handed the row to.
pub const NEXT_STAGE: &str = "pepsi.next_stage";
/// Milliseconds between the dispatcher's claim of the row and the pass's start.
pub const DISPATCH_WAIT_MS: &str = "pepsi.dispatch_wait_ms";
/// The error a failed or deferred pass reported.
pub const ERROR: &str = "pepsi.error";
/// How many recipients the row had.
pub const RCPT_COUNT: &str = "pepsi.rcpt_count";
/// The envelope sender; only when the client's ADDRESSES is on.
pub const MAIL_FROM: &str = "pepsi.mail_from";
/// The envelope recipients (a string array); only when the client's ADDRESSES is on.
pub const RCPT_TO: &str = "pepsi.rcpt_to";
/// The stage this span was fused into (a hop run inside another stage's pass).
pub const FUSED_INTO: &str = "pepsi.fused_into";
/// The message's size in octets (the ingress).
pub const SIZE: &str = "pepsi.size";
