//! pepsi-common against a real PostgreSQL, in one test binary (one link instead of one per
//! file): the stage contract, batching and fusion, the mail log, the configuration overlay,
//! the retry of serialization failures and group admission, one module each.

mod admission;
mod batch_fusion;
mod config_overlay;
mod db_retry;
mod mail_log;
mod stage_contract;
