-- pepsi-0011.sql: per-mailbox trusted senders (pepsi-stage-check-whitelist, docs/whitelist.md).
--
-- One row per (mailbox, sender), both in comparison form (lower case): the mailbox trusts
-- the sender, an address (`bob@example.org`) or a whole domain (`@example.org`). `origin`
-- says how the entry came: `owner` (added by the mailbox's owner or an operator), `sent`
-- (learnt from mail the mailbox sent, authenticated, to that address). Learning never
-- overwrites an owner's entry; `seen_at` is when mail last confirmed it.
CREATE TABLE pepsi.whitelist (
    mailbox  text        NOT NULL
             CHECK (mailbox = lower(mailbox) AND mailbox ~ '^[^@[:space:]]+@[^@[:space:]]+$'),
    sender   text        NOT NULL
             CHECK (sender = lower(sender) AND sender ~ '^([^@[:space:]]+)?@[^@[:space:]]+$'),
    origin   text        NOT NULL CHECK (origin IN ('owner', 'sent')),
    added_at timestamptz NOT NULL DEFAULT now(),
    seen_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (mailbox, sender)
);
