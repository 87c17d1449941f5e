//! The stage programs whose sections the setup's tasks find and change, by the names their
//! sections' PROGRAM gives them.

pub const DKIM_PROGRAM: &str = "pepsi-stage-dkim-sign";
pub const INTERNET_PROGRAM: &str = "pepsi-stage-relay-to-internet";
pub const SMARTHOST_PROGRAM: &str = "pepsi-stage-relay-to-smarthost";
pub const MAILDIR_PROGRAM: &str = "pepsi-stage-relay-to-maildir";
pub const LMTP_PROGRAM: &str = "pepsi-stage-relay-to-lmtp";
pub const LIST_PROGRAM: &str = "pepsi-stage-list";
pub const VACATION_PROGRAM: &str = "pepsi-stage-vacation";
pub const WHITELIST_PROGRAM: &str = "pepsi-stage-check-whitelist";
pub const DETECT_LANGUAGE_PROGRAM: &str = "pepsi-stage-detect-language";
pub const BLOCK_LANGUAGE_PROGRAM: &str = "pepsi-stage-block-language";
pub const MILTER_PROGRAM: &str = "pepsi-stage-milter";
pub const ENCRYPT_PROGRAM: &str = "pepsi-stage-encrypt";
