-- pepsi-0024.sql: the confirm-to-send secretary and auto-pay (docs/secretary.md,
-- docs/auto-pay.md).
--
-- A mailbox whose owner turned the secretary on (the `secretary` setting) keeps mail from
-- senders it does not trust: the queue row waits, paused at the secretary stage, and a
-- secretary_held row says why and until when. A sender whose domain authenticated the
-- message is asked to confirm, at most once per period (secretary_challenge); confirming (a
-- link, a reply, or a paid postage order) releases every message of that sender to that
-- mailbox and puts the sender on the mailbox's whitelist, with origin `confirmed` or `paid`.
-- The tables keep sha256 of a challenge's token, never the token: the link and the reply
-- carry it, and a dump of the tables confirms nobody.

ALTER TABLE pepsi.whitelist DROP CONSTRAINT whitelist_origin_check;
ALTER TABLE pepsi.whitelist ADD CONSTRAINT whitelist_origin_check
    CHECK (origin IN ('owner', 'sent', 'replied', 'confirmed', 'paid'));

CREATE TABLE IF NOT EXISTS pepsi.secretary_challenge (
    challenge_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The owner's mailbox (extension removed, lower case) and the sender asked (the From
    -- address of the message that drew the challenge, lower case).
    -- Both in the whitelist's form, which a confirmation writes them into.
    mailbox       text NOT NULL CHECK (octet_length(mailbox) BETWEEN 3 AND 320
                  AND mailbox = lower(mailbox) AND mailbox ~ '^[^@[:space:]]+@[^@[:space:]]+$'),
    sender        text NOT NULL CHECK (octet_length(sender) BETWEEN 3 AND 320
                  AND sender = lower(sender) AND sender ~ '^[^@[:space:]]+@[^@[:space:]]+$'),
    token_hash    bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- Past it the link and a reply confirm nothing (the held mail expires on its own clock).
    expires_at    timestamptz NOT NULL,
    confirmed_at  timestamptz,
    confirmed_by  text CHECK (confirmed_by IN ('link', 'reply', 'postage')),
    -- Postage: the order at the operator's Taler merchant backend, its taler://pay/ URI and
    -- its amount (CURRENCY:VALUE), when the mailbox offers to be paid instead.
    order_id      text CHECK (octet_length(order_id) BETWEEN 1 AND 200),
    pay_uri       text CHECK (octet_length(pay_uri) BETWEEN 1 AND 2000),
    amount        text CHECK (octet_length(amount) BETWEEN 3 AND 64),
    paid_at       timestamptz,
    CHECK ((confirmed_at IS NULL) = (confirmed_by IS NULL))
);
CREATE INDEX IF NOT EXISTS secretary_challenge_pair_idx
    ON pepsi.secretary_challenge (mailbox, sender, created_at DESC);

CREATE TABLE IF NOT EXISTS pepsi.secretary_held (
    held_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The paused queue row (one recipient: the stage splits a message first).
    queue_id      bigint NOT NULL UNIQUE,
    mailbox       text NOT NULL CHECK (octet_length(mailbox) BETWEEN 3 AND 320),
    -- The From address (lower case) and the envelope sender ('' for <>).
    sender        text NOT NULL CHECK (octet_length(sender) <= 320),
    mail_from     text NOT NULL CHECK (octet_length(mail_from) <= 320),
    subject       text NOT NULL DEFAULT '' CHECK (char_length(subject) <= 200),
    size          bigint NOT NULL CHECK (size >= 0),
    -- Why it is held: `challenged` (a challenge went out, or one did within the period),
    -- `unauthenticated` (neither SPF nor DKIM passed aligned with the From domain),
    -- `automated` (a list, bulk or automatic message), `limited` (the mailbox's open
    -- challenges are at their limit).
    reason        text NOT NULL CHECK (reason IN ('challenged', 'unauthenticated', 'automated', 'limited')),
    challenge_id  bigint REFERENCES pepsi.secretary_challenge ON DELETE SET NULL,
    status        text NOT NULL DEFAULT 'held'
                  CHECK (status IN ('held', 'released', 'discarded', 'expired')),
    held_at       timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    decided_at    timestamptz,
    -- Who decided: link, reply, postage, owner:<login or role>, expiry.
    decided_by    text CHECK (octet_length(decided_by) <= 400),
    -- The owner's last digest that listed it.
    digested_at   timestamptz,
    CHECK ((status = 'held') = (decided_at IS NULL))
);
CREATE INDEX IF NOT EXISTS secretary_held_mailbox_idx
    ON pepsi.secretary_held (mailbox, held_at DESC);
CREATE INDEX IF NOT EXISTS secretary_held_pair_idx
    ON pepsi.secretary_held (mailbox, sender) WHERE status = 'held';

-- The owner's page of held mail (pepsi-httpd, /secretary/held/{token}): each digest carries
-- a fresh link, good for a week; the table keeps sha256 of its token.
CREATE TABLE IF NOT EXISTS pepsi.secretary_owner_link (
    link_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    mailbox     text NOT NULL CHECK (octet_length(mailbox) BETWEEN 3 AND 320),
    token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS secretary_owner_link_expires_idx
    ON pepsi.secretary_owner_link (expires_at);

-- Postage our users' outgoing mail paid (pepsi-stage-auto-pay through
-- pepsi-helper-auto-pay), and what was refused. One row per (login, merchant, order): a
-- challenge seen twice is paid once.
CREATE TABLE IF NOT EXISTS pepsi.auto_pay_payment (
    payment_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    login         text NOT NULL CHECK (octet_length(login) BETWEEN 1 AND 320),
    -- The address whose challenge asked for the payment (a recipient's secretary).
    payee         text NOT NULL CHECK (octet_length(payee) <= 320),
    merchant      text NOT NULL CHECK (octet_length(merchant) BETWEEN 1 AND 300),
    order_id      text NOT NULL CHECK (octet_length(order_id) BETWEEN 1 AND 200),
    currency      text NOT NULL CHECK (currency ~ '^[A-Z][A-Z0-9]{0,11}$'),
    value         numeric(30, 8) NOT NULL CHECK (value >= 0),
    -- `paid`, or `refused` (over a limit, unknown payee, malformed request) or `failed`
    -- (the wallet said no), with the reason.
    status        text NOT NULL CHECK (status IN ('paid', 'refused', 'failed')),
    reason        text CHECK (octet_length(reason) <= 1000),
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (login, merchant, order_id)
);
CREATE INDEX IF NOT EXISTS auto_pay_payment_login_idx
    ON pepsi.auto_pay_payment (login, created_at DESC);
