//! Every integration test of the root package, in one test binary: one module per area,
//! each a former `tests/<area>.rs` of its own, and `support` for what they share.
//!
//! One binary links the whole stack once instead of once per area (`docs/perf.md`, "test
//! suite build and run time"). Tests are named
//! `<area>::<test>` (`cargo nextest run -E 'test(/^system_delivery::/)'`, or `cargo test
//! --test integration system_delivery::`). nextest runs each test in a process of its
//! own; `cargo test` runs them on threads of one process, so no test may rely on
//! process-wide state (environment, working directory, umask): each gets what it needs
//! through the programs' arguments and environment.

mod support;

mod archive;
mod archive_tool;
mod chaos;
mod common;
mod config_tool;
mod counters_api;
mod counters_ctl;
mod counters_notify;
mod counters_ops;
mod counters_redis_modes;
mod crypto;
mod db_sessions;
mod dispatch;
mod failure_bouncer;
mod ha;
mod ha_postgres;
mod harness;
mod helper_auto_pay;
mod httpd;
mod httpd_archive;
mod httpd_archive_api;
mod httpd_config;
mod httpd_graph;
mod httpd_journey;
mod httpd_lists;
mod httpd_pipeline;
mod httpd_secretary;
mod httpd_secure_links;
mod httpd_setup;
mod ingress_lists;
mod ingress_local;
mod ingress_metrics;
mod ingress_msgauth;
mod ingress_smtp;
mod ingress_tls;
mod list_bounces;
mod list_digest;
mod list_directory;
mod list_filters;
mod list_moderation;
mod list_tool;
mod list_web;
mod lmtp_delivery;
mod maildir_delivery;
mod make_run;
mod manual;
mod milter;
mod package;
mod package_setup;
mod parsers_fuzz;
mod queue_tool;
mod relay_internet;
mod relay_smarthost;
mod relay_smarthost_oauth;
mod secure_link;
mod secure_link_tool;
mod sendmail;
mod settings;
mod setup;
mod setup_apply;
mod setup_apply_acme;
mod setup_apply_oauth;
mod setup_check_dns;
mod smtp_client;
mod stage_aliases;
mod stage_arc;
mod stage_auto_pay;
mod stage_bounce;
mod stage_count;
mod stage_dkim_sign;
mod stage_language;
mod stage_list;
mod stage_list_copy;
mod stage_routing;
mod stage_secretary;
mod stage_secure_link;
mod stage_srs;
mod stage_vacation;
mod stage_whitelist;
mod stage_worker;
mod status;
mod structure;
mod system_archive_web;
mod system_auto_pay;
mod system_delivery;
mod system_list_bounces;
mod system_list_lifecycle;
mod system_lists;
mod system_lists_web;
mod system_remote;
mod system_secretary_web;
mod system_secure_link_web;
mod system_telemetry;
mod telemetry_client;
mod telemetry_receiver;
mod unibin;
mod whitelist_tool;
