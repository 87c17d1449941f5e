-- pepsi-0001.sql: the first schema patch of Pepsi.
--
-- Released patches are never edited. A later schema change adds pepsi-0002.sql, which
-- migrates an existing database forward in place. Stored functions and triggers live in
-- procedures.sql, which pepsi-setup re-applies on every run.

CREATE SCHEMA IF NOT EXISTS pepsi;

-- One row per applied patch; pepsi-setup reads it to decide what to apply.
CREATE TABLE pepsi.schema_patch (
    patch_name  text PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TYPE pepsi.workqueue_status AS ENUM ('pending', 'running', 'paused', 'failed', 'timeout');

-- Message bodies, shared by every row split off one message. A row of workqueue_body is
-- released by a trigger when the last workqueue row referencing it goes.
CREATE TABLE pepsi.workqueue_body (
    body_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    body        bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The message queue: one row per message in flight. raw message = headers || CRLF || body.
CREATE TABLE pepsi.workqueue (
    workqueue_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stage         text NOT NULL DEFAULT 'init',
    status        pepsi.workqueue_status NOT NULL DEFAULT 'pending',
    mail_from     text NOT NULL,
    rcpt_to       text[] NOT NULL CHECK (cardinality(rcpt_to) > 0),
    headers       bytea NOT NULL,
    body_id       bigint NOT NULL REFERENCES pepsi.workqueue_body (body_id),
    state         jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(state) = 'object'),
    timeout       timestamptz,
    received_at   timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    -- Who submitted the message, for fair sharing among senders.
    auth_user     text,
    client_addr   inet,
    -- The authenticated account, else the client address (IPv6 by /64), else nothing.
    sender_key    text GENERATED ALWAYS AS (
        CASE
            WHEN auth_user IS NOT NULL AND auth_user <> '' THEN 'auth:' || lower(auth_user)
            WHEN client_addr IS NULL THEN ''
            WHEN family(client_addr) = 6 THEN 'net:' || host(network(set_masklen(client_addr, 64))) || '/64'
            ELSE 'ip:' || host(client_addr)
        END
    ) STORED
);

CREATE INDEX workqueue_claim_idx ON pepsi.workqueue (stage, workqueue_id) WHERE status = 'pending';
-- The dispatcher's fair share walks the distinct senders pending at a stage, then each one's
-- oldest rows.
CREATE INDEX workqueue_fair_idx ON pepsi.workqueue (stage, sender_key, workqueue_id) WHERE status = 'pending';
CREATE INDEX workqueue_paused_idx ON pepsi.workqueue (timeout) WHERE status = 'paused';
CREATE INDEX workqueue_running_idx ON pepsi.workqueue (workqueue_id) WHERE status = 'running';
CREATE INDEX workqueue_body_idx ON pepsi.workqueue (body_id);

-- Tokens of clones already spawned: a clone whose token is here is never created again, even
-- after the clone itself has been delivered and deleted. Pruned by clone_token_gc.
CREATE TABLE pepsi.clone_token (
    token       text PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Cumulative pipeline statistics; pepsi-dispatch is the only writer.
CREATE TABLE pepsi.stage_stats (
    stage          text PRIMARY KEY,
    messages       bigint NOT NULL DEFAULT 0,
    processing_ms  bigint NOT NULL DEFAULT 0,
    kills          bigint NOT NULL DEFAULT 0,
    crashes        bigint NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pepsi.dispatch_stats (
    id                      integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    stages_total            bigint NOT NULL DEFAULT 0,
    messages_total          bigint NOT NULL DEFAULT 0,
    messages_failed         bigint NOT NULL DEFAULT 0,
    serialization_failures  bigint NOT NULL DEFAULT 0,
    updated_at              timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pepsi.dispatch_stats (id) VALUES (1);

-- The administrator-managed configuration overlay. Bootstrap sections (PATHS, DATABASE) and
-- listener sections are structurally excluded: a compromised database must not be able to
-- retarget the database connection or move a listening socket.
CREATE TABLE pepsi.config_override (
    scope       text NOT NULL CHECK (scope = 'global' OR scope ~ '^(domain|address):.+$'),
    section     text NOT NULL CHECK (
        upper(section) NOT IN ('PATHS', 'DATABASE') AND upper(section) NOT LIKE 'LISTENER%'
    ),
    option      text NOT NULL CHECK (option <> ''),
    value       text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    updated_by  text NOT NULL DEFAULT current_user,
    PRIMARY KEY (scope, section, option)
);

-- Per-address settings, written by account owners themselves (by e-mail); a privilege
-- boundary apart from config_override.
CREATE TABLE pepsi.settings (
    address     text NOT NULL,
    name        text NOT NULL,
    value       jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (address, name)
);

-- Resolved MX-host addresses with per-address connect health.
CREATE TABLE pepsi.dns_address (
    host          text NOT NULL,
    address       inet NOT NULL,
    expires_at    timestamptz NOT NULL,
    last_success  timestamptz,
    last_failure  timestamptz,
    failures      integer NOT NULL DEFAULT 0,
    PRIMARY KEY (host, address)
);

-- Append-only audit log of administrative actions.
CREATE TABLE pepsi.event_log (
    event_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    actor         text NOT NULL DEFAULT current_user,
    action        text NOT NULL,
    workqueue_id  bigint,
    detail        jsonb NOT NULL DEFAULT '{}'::jsonb
);

-- Append-only log of what happened to each message (delivered, bounced, dropped).
CREATE TABLE pepsi.mail_log (
    log_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    workqueue_id  bigint,
    stage         text,
    event         text NOT NULL,
    mail_from     text,
    rcpt_to       text[],
    detail        jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX mail_log_at_idx ON pepsi.mail_log (at);
