-- pepsi-0009.sql: the automatic replies sent, for RFC 3834's rule of at most one reply to a
-- sender per period (pepsi_stage_vacation::autoreply decides the rest from the message alone).
--
-- One row per (owner, sender), both lower case: when the owner's address last answered
-- that sender, and for which queue row, so that a pass run again after a crash answers the
-- same message again rather than being refused by its own earlier claim. Rows older than
-- the longest period mean nothing and may be deleted.
CREATE TABLE pepsi.autoreply_sent (
    owner        text        NOT NULL,
    sender       text        NOT NULL,
    sent_at      timestamptz NOT NULL DEFAULT now(),
    workqueue_id bigint      NOT NULL,
    PRIMARY KEY (owner, sender)
);
CREATE INDEX autoreply_sent_at_idx ON pepsi.autoreply_sent (sent_at);
