//! pepsi-secure-link: the foundation of the secure-link portal (docs/secure-link.md). A
//! message for an external recipient is kept sealed in the database and replaced by a notice
//! with a link; the recipient proves control of the address with a one-time code and reads
//! the message in the portal.
//!
//! [`seal`] and [`code`] are pure (no I/O): the split-key sealing and the one-time codes.
//! [`store`] keeps messages, codes, sessions and the access log in PostgreSQL. The stage, the
//! portal's pages and the operator tool build on these; this crate never sends mail and
//! never holds a link half beyond the call that was given it. [`admin`] holds what an
//! operator sees and does (list, show, revoke, extend, purge) for the tool `pepsi-secure-link`
//! ([`tool`]) and pepsi-httpd's admin API.

pub mod admin;
pub mod code;
pub mod mail;
pub mod policy;
pub mod seal;
pub mod store;
pub mod tool;
pub mod url;

pub use tool::{command, constants, run};

use base64::Engine as _;

/// The program of the secure-link stage, whose section says where the portal's mail starts.
pub const STAGE_PROGRAM: &str = "pepsi-stage-secure-link";
/// Where the secure-link stage's receipts and the portal's replies start unless the stage's
/// `RECEIPT_STAGE` says otherwise: where new mail starts (the shipped graph's `init`, as
/// vacation's replies and the bounce stage's DSNs).
pub const DEFAULT_RECEIPT_STAGE: &str = "init";

/// base64url without padding: how link ids, link halves and session tokens travel in URLs
/// and cookies.
pub(crate) fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes base64url without padding into exactly `N` bytes.
pub(crate) fn b64_exact<const N: usize>(text: &str) -> Option<[u8; N]> {
    // A bound before decoding: anything longer cannot be N bytes.
    if text.len() > N.div_ceil(3) * 4 {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()?;
    bytes.try_into().ok()
}

/// `N` bytes from the operating system's generator (through aws-lc).
pub(crate) fn random<const N: usize>() -> Result<[u8; N], RandomUnavailable> {
    let mut buf = [0u8; N];
    aws_lc_rs::rand::fill(&mut buf).map_err(|_| RandomUnavailable)?;
    Ok(buf)
}

/// The system's random generator gave no bytes: temporary, nothing was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the system's random generator gave no bytes")]
pub struct RandomUnavailable;
