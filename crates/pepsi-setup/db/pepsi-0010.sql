-- pepsi-0010.sql: mailbox quotas (pepsi_contract::quota, docs/quota.md).
--
-- quota_limit: the limits of one mailbox (scope `alice@example.test`) or of all the
-- mailboxes of a domain together (scope `@example.test`), in comparison form (lower case).
-- A mailbox without a row has the delivery stage's QUOTA / QUOTA_MESSAGES; NULL is no limit.
CREATE TABLE pepsi.quota_limit (
    scope      text        PRIMARY KEY
               CHECK (scope = lower(scope) AND scope ~ '^([^@[:space:]]+)?@[^@[:space:]]+$'),
    storage    bigint      CHECK (storage > 0),
    messages   bigint      CHECK (messages > 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (storage IS NOT NULL OR messages IS NOT NULL)
);

-- quota_usage: what a mailbox held when the Maildir delivery (or pepsi-quota recalc) last
-- measured it through the writer's maildirsize, and under which limits. The ingress reads
-- it to refuse RCPT to a full mailbox; the delivery sums it per domain for domain limits.
CREATE TABLE pepsi.quota_usage (
    mailbox        text        PRIMARY KEY
                   CHECK (mailbox = lower(mailbox) AND mailbox ~ '^[^@[:space:]]+@[^@[:space:]]+$'),
    domain         text        GENERATED ALWAYS AS (substring(mailbox FROM '@([^@]*)$')) STORED,
    storage        bigint      NOT NULL CHECK (storage >= 0),
    messages       bigint      NOT NULL CHECK (messages >= 0),
    storage_limit  bigint,
    messages_limit bigint,
    measured_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX quota_usage_domain_idx ON pepsi.quota_usage (domain);
