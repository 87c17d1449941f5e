-- pepsi-0020.sql: the secure-link portal (docs/secure-link.md): the five secure_link_* tables.
--
-- A message for an external recipient may be kept here and replaced by a notice with a link.
-- It is stored sealed: ChaCha20-Poly1305 under a key derived (HKDF-SHA256) from two random
-- halves, db_half here and a link half that only the link carries (pepsi_secure_link::seal).
-- A dump of these tables alone therefore reads no message. The link is
-- /{link_id}/{generation}#{link half}; a resend re-seals under fresh halves and bumps
-- generation, so only the latest link opens the message.

CREATE TABLE IF NOT EXISTS pepsi.secure_link_message (
    message_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Public and random (16 bytes, base64url without padding): it names the message in the
    -- link and in the operator tool, and gives nothing away.
    link_id     text NOT NULL UNIQUE CHECK (link_id ~ '^[A-Za-z0-9_-]{22}$'),
    sender      text NOT NULL CHECK (octet_length(sender) BETWEEN 1 AND 320),
    recipient   text NOT NULL CHECK (octet_length(recipient) BETWEEN 3 AND 320),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz,
    revoked_by  text CHECK (octet_length(revoked_by) <= 320),
    -- Purged: the sealed parts are gone; the row and its access log stay for the sender.
    purged_at   timestamptz,
    -- Bumped by a resend; links, codes and sessions of an older generation are refused.
    generation  integer NOT NULL DEFAULT 1 CHECK (generation >= 1),
    -- The sealed message (the whole RFC 5322 message, its subject included): the AEAD nonce,
    -- the ciphertext with its tag, and the database's half of the key.
    nonce       bytea CHECK (length(nonce) = 12),
    ciphertext  bytea,
    db_half     bytea CHECK (length(db_half) = 32),
    -- The plaintext's size in bytes, for listings.
    size        bigint NOT NULL CHECK (size >= 0),
    CHECK ((purged_at IS NULL) = (nonce IS NOT NULL AND ciphertext IS NOT NULL AND db_half IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS secure_link_message_expires_idx
    ON pepsi.secure_link_message (expires_at) WHERE purged_at IS NULL;
CREATE INDEX IF NOT EXISTS secure_link_message_sender_idx
    ON pepsi.secure_link_message (lower(sender), created_at);

-- One-time codes mailed to the recipient: sha256 of link id and code, never the code. A
-- newer code replaces the older ones of its message; five wrong tries lock a code.
CREATE TABLE IF NOT EXISTS pepsi.secure_link_code (
    code_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    bigint NOT NULL REFERENCES pepsi.secure_link_message ON DELETE CASCADE,
    generation    integer NOT NULL CHECK (generation >= 1),
    code_hash     bytea NOT NULL CHECK (length(code_hash) = 32),
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    attempts_left smallint NOT NULL DEFAULT 5 CHECK (attempts_left BETWEEN 0 AND 5),
    used_at       timestamptz
);
CREATE INDEX IF NOT EXISTS secure_link_code_message_idx
    ON pepsi.secure_link_code (message_id, created_at DESC);

-- A session after a correct code: sha256 of its token, never the token.
CREATE TABLE IF NOT EXISTS pepsi.secure_link_session (
    session_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id  bigint NOT NULL REFERENCES pepsi.secure_link_message ON DELETE CASCADE,
    generation  integer NOT NULL CHECK (generation >= 1),
    token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS secure_link_session_message_idx
    ON pepsi.secure_link_session (message_id);

-- What happened to a message, for its sender and the operator: never a code, a token or a
-- link half. client_key names the client as the rate limits do (an address, IPv6 by /64).
CREATE TABLE IF NOT EXISTS pepsi.secure_link_access (
    access_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id  bigint NOT NULL REFERENCES pepsi.secure_link_message ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT now(),
    event       text NOT NULL CHECK (event IN ('created', 'code_sent', 'code_wrong', 'code_locked',
                    'session_opened', 'opened', 'attachment_downloaded', 'reply_sent', 'revoked',
                    'extended', 'resent', 'purged')),
    client_key  text CHECK (octet_length(client_key) <= 100),
    detail      text CHECK (octet_length(detail) <= 500)
);
CREATE INDEX IF NOT EXISTS secure_link_access_message_idx
    ON pepsi.secure_link_access (message_id, at);

-- When a message leaves by secure link: per recipient or sender domain, always, never, or
-- as the encrypt stage's fallback when encryption is required and no key is found; and for
-- how long the link lives.
CREATE TABLE IF NOT EXISTS pepsi.secure_link_policy (
    policy_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope      text NOT NULL CHECK (scope IN ('recipient_domain', 'sender_domain')),
    domain     text NOT NULL CHECK (domain = lower(domain) AND octet_length(domain) BETWEEN 1 AND 253),
    mode       text NOT NULL CHECK (mode IN ('always', 'never', 'fallback')),
    lifetime   interval NOT NULL DEFAULT '30 days'
                   CHECK (lifetime > interval '0' AND lifetime <= interval '365 days'),
    UNIQUE (scope, domain)
);
