-- pepsi-0006.sql: the administrative surface of pepsi-httpd, and the mail log's lookups.
--
-- Three credential tables: administrator accounts (Argon2id password hashes), their browser
-- sessions, and the bearer tokens automation authenticates with. A session row and a token
-- row hold only the SHA-256 digest of the secret the client presents (the session cookie,
-- the secret half of a token), so a backup of this database holds no usable credential.
-- Sessions are rows, not process memory: a restart of pepsi-httpd logs nobody out and two
-- pepsi-httpd processes agree about who is logged in. pepsi-setup grants these tables to the
-- pepsi-httpd role alone: a component that could read admin_session could mint itself an
-- administrative session.

-- One row per administrator. The name is the login; lower-case letters, digits, `.`, `_`
-- and `-`, so it is safe in logs and the event log's actor column.
CREATE TABLE pepsi.admin_account (
    name           text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    password_hash  text NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    enabled        boolean NOT NULL DEFAULT true,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- One row per live browser session: the SHA-256 of the cookie's secret. Idle and absolute
-- expiry are decided by pepsi-httpd from last_seen_at and created_at (its configuration),
-- and expired rows are deleted by it.
CREATE TABLE pepsi.admin_session (
    digest        bytea PRIMARY KEY CHECK (octet_length(digest) = 32),
    admin         text NOT NULL
                  REFERENCES pepsi.admin_account (name) ON UPDATE CASCADE ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    client_addr   inet
);
CREATE INDEX admin_session_admin_idx ON pepsi.admin_session (admin);

-- One row per API token. A token is `pepsi_<token_id>_<secret>`: token_id (public, 16 hex
-- digits) finds the row, the SHA-256 of the secret half is compared with digest.
CREATE TABLE pepsi.api_token (
    token_id      text PRIMARY KEY CHECK (token_id ~ '^[0-9a-f]{16}$'),
    digest        bytea NOT NULL CHECK (octet_length(digest) = 32),
    admin         text NOT NULL
                  REFERENCES pepsi.admin_account (name) ON UPDATE CASCADE ON DELETE CASCADE,
    label         text NOT NULL DEFAULT '' CHECK (length(label) <= 200),
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz,
    last_used_at  timestamptz
);
CREATE INDEX api_token_admin_idx ON pepsi.api_token (admin);

-- The mail log is searched by message (the API's workqueue_id filter) besides by time.
CREATE INDEX mail_log_workqueue_idx ON pepsi.mail_log (workqueue_id);
