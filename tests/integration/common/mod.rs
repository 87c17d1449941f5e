//! pepsi-contract against a real PostgreSQL: the stage contract, batching and fusion, the mail
//! log, the configuration overlay, the retry of serialization failures and group admission,
//! one module each. They live here, not in pepsi-contract, because a fresh database with the
//! schema comes from pepsi-testkit, which links pepsi-setup, which links pepsi-contract: as
//! pepsi-contract's own tests they made a dependency cycle (`structure` checks there is none).

mod admission;
mod batch_fusion;
mod config_overlay;
mod db_retry;
mod mail_log;
mod stage_contract;
