//! The JSON API's handlers, one module per resource: `session` (login, logout, who am I),
//! `queue` (list, show, the actions one by one and in bulk), `accounts` (mailboxes),
//! `settings` (aliases, catch-alls, local domains, every per-address setting), `config`
//! (the configuration's overrides and effective values), `lists` (mailing lists), `archive`
//! (a list's archive: summary, search, a post, purge, export), `logs` (the mail log and the
//! event log), `journey` (a message's spans from the telemetry), `pipeline` (the live stage
//! graph), `secure_links` (secure links: list, show, revoke, extend), `secretary` (held
//! mail: list, release, discard; auto-pay's payments) and `setup` (the first
//! administrator, the setup tasks and their progress).
//! docs/api.md and docs/api.openapi.yaml describe every route.

pub mod accounts;
pub mod archive;
pub mod config;
pub mod journey;
pub mod lists;
pub mod logs;
pub mod pipeline;
pub mod queue;
pub mod secretary;
pub mod secure_links;
pub mod session;
pub mod settings;
pub mod setup;
