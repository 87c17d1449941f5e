//! Interop with the real tools users meet, one test executable: OpenPGP against GnuPG
//! (`openpgp_gpg`) and S/MIME against OpenSSL (`smime_openssl`), both ways each.

mod openpgp_gpg;
mod smime_openssl;
