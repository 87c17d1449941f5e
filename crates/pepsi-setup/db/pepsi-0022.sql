-- pepsi-0022.sql: the sender's handle on a secure link (docs/secure-link.md, "The sender's
-- page").
--
-- The sender of a secured message receives a manage link carrying a random token; with it
-- the sender sees the access log, revokes the link, or sends the recipient a new one. The
-- row keeps sha256 of the token (manage_hash), never the token, and the link's half of the
-- key wrapped under a key derived from the token (manage_wrap: a 12-byte nonce, then the 32
-- sealed bytes and their 16-byte tag), so that a resend from the sender's page can re-seal
-- the message. A dump of the table still reads nothing: it holds neither the token nor the
-- link half.
ALTER TABLE pepsi.secure_link_message
    ADD COLUMN IF NOT EXISTS manage_hash bytea CHECK (length(manage_hash) = 32),
    ADD COLUMN IF NOT EXISTS manage_wrap bytea CHECK (length(manage_wrap) = 60);
