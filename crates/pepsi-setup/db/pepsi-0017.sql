-- pepsi-0017.sql: mailing lists, second part (docs/lists.md): what the list stage,
-- `pepsi-list maintain` and pepsi-httpd's list pages need beyond pepsi-0016.

-- The list copy (docs/lists.md, "The list copy"): per-member unsubscribe tokens and the
-- personalised footer.
--
-- A list's secret for its one-click unsubscribe tokens, made by pepsi.list_fanout the first
-- time a copy needs a token. A member's token is the lower-case hex of the first 16 bytes
-- of sha256(secret || int8send(member_id)); list_unsubscribe_token keeps sha256(token).
CREATE TABLE IF NOT EXISTS pepsi.list_secret (
    list_id    bigint PRIMARY KEY REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    secret     bytea NOT NULL CHECK (length(secret) = 32),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- 'individual': a plain-text post's footer names the member and carries their own
-- unsubscribe link, which costs one stored body per member instead of one per post.
ALTER TABLE pepsi.mailing_list ADD COLUMN personalize text NOT NULL DEFAULT 'none'
    CHECK (personalize IN ('none', 'individual'));

-- Digests (docs/lists.md, "Digests"): the list stage asks, with the lists it reads, whether
-- a list has an enabled member taking digests; this index holds only such members'
-- preferences, so the question costs nothing while nobody takes digests.
CREATE INDEX IF NOT EXISTS list_member_preference_digest_idx
    ON pepsi.list_member_preference (member_id) WHERE delivery_mode <> 'regular';

-- pepsi-httpd's list pages (docs/lists.md, "On the web"): a one-click unsubscribe
-- (RFC 8058) deletes the member row and with it the token's row, so a repeated POST of the
-- same link is recognised by its member.unsubscribe event, whose detail keeps the token's
-- hash (hex); this index holds only those events.
CREATE INDEX IF NOT EXISTS list_event_log_one_click_idx
    ON pepsi.list_event_log ((detail->>'token_hash'))
    WHERE event = 'member.unsubscribe' AND detail ? 'token_hash';
