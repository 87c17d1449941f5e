//! The JSON API's handlers, one module per resource: `session` (login, logout, who am I),
//! `queue` (list, show, the actions one by one and in bulk), `accounts` (mailboxes),
//! `settings` (aliases, catch-alls, local domains) and `logs` (the mail log and the event
//! log). docs/api.md and docs/api.openapi.yaml describe every route.

pub mod accounts;
pub mod logs;
pub mod queue;
pub mod session;
pub mod settings;
