-- pepsi-0016.sql: mailing lists (docs/lists.md): mailing_list and the 23 list_* tables.
--
-- A list is an address of one of our domains (`mailing_list.address`, lower-case); its
-- command addresses are the same local part with a suffix (`-join`, `-leave`, `-request`,
-- `-owner`, `-bounces`, `-confirm+<token>`) and are never stored. Everyone a list knows is a
-- row of list_member with a role: a member receives posts, an owner and a moderator run the
-- list, a nonmember row carries a rule for one sender who is not subscribed. Tokens (emailed
-- confirmations, member links, one-click unsubscribes) are stored as SHA-256 hashes, never
-- as the token itself, so a read of the database cannot act for anyone.
--
-- pepsi-list, the list stage and pepsi-httpd write these tables; the ingress reads
-- mailing_list to accept RCPT for existing lists only. Deleting a list deletes everything it
-- holds (ON DELETE CASCADE); `pepsi-list forget <address>` deletes one person everywhere.

CREATE TABLE pepsi.mailing_list (
    list_id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The posting address, lower-case: `local@domain` of one of our local domains.
    address             text NOT NULL UNIQUE
                            CHECK (address = lower(address) AND address ~ '^[a-z0-9][a-z0-9._-]*@[^@[:space:]]+$'
                                   AND address !~ '-(join|subscribe|leave|unsubscribe|request|owner|bounces|confirm)@'
                                   -- `<name>-confirm+<24-character token>` within a local
                                   -- part's 64 octets (pepsi_contract::list::MAX_NAME_LEN).
                                   AND length(split_part(address, '@', 1)) <= 31),
    display_name        text NOT NULL DEFAULT '' CHECK (length(display_name) <= 200),
    description         text NOT NULL DEFAULT '' CHECK (length(description) <= 4000),
    -- Put before a post's subject unless it is already there, e.g. `[team]`.
    subject_prefix      text NOT NULL DEFAULT '' CHECK (length(subject_prefix) <= 60),
    -- Shown on the public list pages and in the list of lists.
    advertised          boolean NOT NULL DEFAULT true,
    -- What a post from a member does (a member row's own moderation_action wins).
    member_action       text NOT NULL DEFAULT 'accept'
                            CHECK (member_action IN ('accept', 'hold', 'reject', 'discard', 'defer')),
    -- What a post from anyone else does (a nonmember row's moderation_action wins).
    nonmember_action    text NOT NULL DEFAULT 'hold'
                            CHECK (nonmember_action IN ('accept', 'hold', 'reject', 'discard', 'defer')),
    -- Subscriptions: confirmed by the subscriber (double opt-in), then also approved by a
    -- moderator, or open to anyone who confirms. No subscription is ever unconfirmed.
    subscription_policy text NOT NULL DEFAULT 'confirm'
                            CHECK (subscription_policy IN ('confirm', 'confirm_then_approve', 'closed')),
    -- Where replies go: the sender, the list, or reply_to_address.
    reply_goes_to       text NOT NULL DEFAULT 'sender'
                            CHECK (reply_goes_to IN ('sender', 'list', 'explicit')),
    reply_to_address    text CHECK (reply_to_address IS NULL OR reply_to_address LIKE '%_@_%'),
    -- From rewriting when the From domain publishes DMARC p=reject or p=quarantine: munge
    -- the From, wrap the post in a message of the list's, or leave it (none).
    dmarc_mitigation    text NOT NULL DEFAULT 'munge_from'
                            CHECK (dmarc_mitigation IN ('munge_from', 'wrap', 'none')),
    -- The largest post accepted (bytes); larger ones are held.
    max_message_size    bigint NOT NULL DEFAULT 1048576 CHECK (max_message_size > 0),
    -- Who may read the archive: everyone, members only, nobody (not archived).
    archive_policy      text NOT NULL DEFAULT 'private'
                            CHECK (archive_policy IN ('public', 'private', 'none')),
    -- Bounce processing (docs/lists.md): a hard bounce scores 1, a soft one 0.5 per day;
    -- at the threshold delivery is disabled, warnings_count warnings go out warning_interval
    -- apart, then the member is removed. Scores older than bounce_info_stale_after restart.
    bounce_score_threshold  numeric(6,2) NOT NULL DEFAULT 5.0 CHECK (bounce_score_threshold > 0),
    bounce_info_stale_after interval NOT NULL DEFAULT '7 days',
    bounce_warnings         integer NOT NULL DEFAULT 3 CHECK (bounce_warnings >= 0),
    bounce_warning_interval interval NOT NULL DEFAULT '7 days',
    -- Digests: sent when the collected posts reach digest_size_threshold bytes or when
    -- digest_period has passed since the first of them.
    digests_enabled     boolean NOT NULL DEFAULT true,
    digest_size_threshold bigint NOT NULL DEFAULT 30720 CHECK (digest_size_threshold > 0),
    digest_period       interval NOT NULL DEFAULT '1 day',
    -- Subscription bombing: at most this many confirmation requests per address and per
    -- client (IP address or API token) in confirm_window; more are refused, not sent.
    confirm_limit_per_address integer NOT NULL DEFAULT 3 CHECK (confirm_limit_per_address > 0),
    confirm_limit_per_client  integer NOT NULL DEFAULT 10 CHECK (confirm_limit_per_client > 0),
    confirm_window      interval NOT NULL DEFAULT '1 hour',
    -- How long an emailed confirmation (or a held post) waits before it expires.
    pending_lifetime    interval NOT NULL DEFAULT '3 days',
    held_lifetime       interval NOT NULL DEFAULT '14 days',
    -- Emergency moderation: every post is held, members' too.
    emergency           boolean NOT NULL DEFAULT false,
    -- The largest number of recipients one fan-out row carries.
    fanout_batch        integer NOT NULL DEFAULT 100 CHECK (fanout_batch BETWEEN 1 AND 1000),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK ((reply_goes_to = 'explicit') = (reply_to_address IS NOT NULL))
);

-- Everyone a list knows, by role. A person may be a member and a moderator at once (two
-- rows); a nonmember row exists only to carry a posting rule.
CREATE TABLE pepsi.list_member (
    member_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id            bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address            text NOT NULL CHECK (address = lower(address) AND address LIKE '%_@_%'),
    display_name       text NOT NULL DEFAULT '' CHECK (length(display_name) <= 200),
    role               text NOT NULL CHECK (role IN ('member', 'owner', 'moderator', 'nonmember')),
    -- This sender's posting rule; NULL: the list's member_action / nonmember_action.
    moderation_action  text CHECK (moderation_action IN ('accept', 'hold', 'reject', 'discard', 'defer')),
    -- Whether posts are delivered to this member, and why not.
    delivery_status    text NOT NULL DEFAULT 'enabled'
                           CHECK (delivery_status IN ('enabled', 'by_bounces', 'by_user', 'by_moderator')),
    -- How the subscription came about (audit): mail, web, operator (pepsi-list), import.
    subscribed_via     text NOT NULL DEFAULT 'operator'
                           CHECK (subscribed_via IN ('mail', 'web', 'operator', 'import', 'api')),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (list_id, address, role)
);
CREATE INDEX list_member_address_idx ON pepsi.list_member (address);
-- The fan-out reads a list's enabled members in member_id order, a batch at a time.
CREATE INDEX list_member_fanout_idx ON pepsi.list_member (list_id, member_id)
    WHERE role = 'member' AND delivery_status = 'enabled';

-- A member's own choices; a member without a row has the defaults.
CREATE TABLE pepsi.list_member_preference (
    member_id            bigint PRIMARY KEY REFERENCES pepsi.list_member ON DELETE CASCADE,
    delivery_mode        text NOT NULL DEFAULT 'regular'
                             CHECK (delivery_mode IN ('regular', 'mime_digest', 'plain_digest')),
    receive_own_postings boolean NOT NULL DEFAULT true,
    -- Skip a post when this member is already a To/Cc recipient of it.
    receive_list_copy    boolean NOT NULL DEFAULT true,
    acknowledge_posts    boolean NOT NULL DEFAULT false,
    hide_address         boolean NOT NULL DEFAULT true,
    preferred_language   text NOT NULL DEFAULT 'en' CHECK (preferred_language ~ '^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$'),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

-- Requests waiting for an emailed confirmation (double opt-in, unsubscribing by mail from
-- another address) or for a moderator (confirm_then_approve).
CREATE TABLE pepsi.list_pending (
    pending_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address        text NOT NULL CHECK (address = lower(address) AND address LIKE '%_@_%'),
    display_name   text NOT NULL DEFAULT '',
    kind           text NOT NULL CHECK (kind IN ('subscribe', 'unsubscribe')),
    -- Waiting for the person (confirm) or, once confirmed, for a moderator (approve).
    waiting_for    text NOT NULL DEFAULT 'confirm' CHECK (waiting_for IN ('confirm', 'approve')),
    token_hash     bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    requested_via  text NOT NULL CHECK (requested_via IN ('mail', 'web', 'operator', 'api')),
    -- The client that asked (an IP address, or `token:<id>` for the API), for the limits.
    client         text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX list_pending_list_address_idx ON pepsi.list_pending (list_id, address);
CREATE INDEX list_pending_expires_idx ON pepsi.list_pending (expires_at);

-- Posts held for a moderator: the message itself, since its queue row has finished.
CREATE TABLE pepsi.list_held_message (
    held_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    sender         text NOT NULL,
    mail_from      text NOT NULL,
    subject        text NOT NULL DEFAULT '',
    message_id     text NOT NULL DEFAULT '',
    -- Why it was held (`nonmember`, `emergency`, `size`, `header filter X-Spam`, ...).
    reason         text NOT NULL,
    headers        bytea NOT NULL,
    body           bytea NOT NULL,
    held_at        timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX list_held_message_list_idx ON pepsi.list_held_message (list_id, held_at);

-- What moderators decided, kept after the held message is gone.
CREATE TABLE pepsi.list_moderation_decision (
    decision_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    -- What was decided about: a held post or a pending subscription.
    subject_kind   text NOT NULL CHECK (subject_kind IN ('post', 'subscription')),
    sender         text NOT NULL,
    message_id     text NOT NULL DEFAULT '',
    action         text NOT NULL CHECK (action IN ('approve', 'reject', 'discard', 'ban', 'defer', 'expire')),
    moderator      text NOT NULL,
    reason         text NOT NULL DEFAULT '',
    decided_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX list_moderation_decision_list_idx ON pepsi.list_moderation_decision (list_id, decided_at);

-- Addresses that may neither subscribe nor post: an exact address, or a pattern (a POSIX
-- regular expression when it starts with ^). list_id NULL: every list.
CREATE TABLE pepsi.list_ban (
    ban_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id        bigint REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    pattern        text NOT NULL CHECK (length(pattern) BETWEEN 3 AND 500),
    reason         text NOT NULL DEFAULT '',
    created_by     text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX list_ban_pattern_idx ON pepsi.list_ban (COALESCE(list_id, 0), pattern);

-- Header filters, tried in position order: the first whose header matches its pattern
-- (a POSIX regular expression, case-insensitive) decides.
CREATE TABLE pepsi.list_header_filter (
    filter_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    position       integer NOT NULL,
    header         text NOT NULL CHECK (header ~ '^[!-9;-~]+$'),
    pattern        text NOT NULL CHECK (length(pattern) BETWEEN 1 AND 500),
    action         text NOT NULL CHECK (action IN ('accept', 'hold', 'reject', 'discard', 'defer')),
    UNIQUE (list_id, position)
);

-- Content filters: MIME types and file extensions removed from posts (or the post held or
-- rejected when that would leave nothing), HTML alternatives collapsed.
CREATE TABLE pepsi.list_content_filter (
    list_id               bigint PRIMARY KEY REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    filter_types          text[] NOT NULL DEFAULT '{}',
    pass_types            text[] NOT NULL DEFAULT '{}',
    filter_extensions     text[] NOT NULL DEFAULT '{}',
    pass_extensions       text[] NOT NULL DEFAULT '{}',
    collapse_alternatives boolean NOT NULL DEFAULT false,
    -- What happens to a post with nothing left.
    empty_action          text NOT NULL DEFAULT 'reject'
                              CHECK (empty_action IN ('hold', 'reject', 'discard')),
    updated_at            timestamptz NOT NULL DEFAULT now()
);

-- Every bounce and complaint received for a list's delivery (VERP), as read.
CREATE TABLE pepsi.list_bounce_event (
    event_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address        text NOT NULL,
    -- hard (5.x.x), soft (4.x.x), policy (5.7.x: a refusal of the content, not counted),
    -- complaint (an ARF feedback report: an unsubscribe request).
    kind           text NOT NULL CHECK (kind IN ('hard', 'soft', 'policy', 'complaint')),
    status         text NOT NULL DEFAULT '',
    diagnostic     text NOT NULL DEFAULT '',
    report_message_id text NOT NULL DEFAULT '',
    received_at    timestamptz NOT NULL DEFAULT now(),
    processed_at   timestamptz
);
CREATE INDEX list_bounce_event_unprocessed_idx ON pepsi.list_bounce_event (list_id) WHERE processed_at IS NULL;

-- The running score per member address and the steps taken.
CREATE TABLE pepsi.list_bounce_score (
    list_id          bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address          text NOT NULL,
    score            numeric(8,2) NOT NULL DEFAULT 0 CHECK (score >= 0),
    -- The day of the last counted bounce (a soft bounce counts once per day).
    last_bounce_on   date,
    disabled_at      timestamptz,
    warnings_sent    integer NOT NULL DEFAULT 0,
    last_warning_at  timestamptz,
    PRIMARY KEY (list_id, address)
);

-- A digest being collected (sent_at NULL) or sent: volume and number as Mailman counts.
CREATE TABLE pepsi.list_digest (
    digest_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    volume         integer NOT NULL DEFAULT 1,
    number         integer NOT NULL,
    opened_at      timestamptz NOT NULL DEFAULT now(),
    size           bigint NOT NULL DEFAULT 0,
    sent_at        timestamptz,
    UNIQUE (list_id, volume, number)
);
CREATE UNIQUE INDEX list_digest_open_idx ON pepsi.list_digest (list_id) WHERE sent_at IS NULL;

-- The posts of a digest, as delivered to the list.
CREATE TABLE pepsi.list_digest_message (
    digest_id      bigint NOT NULL REFERENCES pepsi.list_digest ON DELETE CASCADE,
    position       integer NOT NULL,
    sender         text NOT NULL,
    subject        text NOT NULL DEFAULT '',
    headers        bytea NOT NULL,
    body           bytea NOT NULL,
    added_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (digest_id, position)
);

-- A list's own texts (welcome, goodbye, footer, confirmation, held notice, ...) per
-- language; a missing one is the built-in text.
CREATE TABLE pepsi.list_template (
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    name           text NOT NULL CHECK (name IN ('welcome', 'goodbye', 'footer', 'confirm_subscribe',
                       'confirm_unsubscribe', 'held_notice', 'reject_notice', 'digest_header',
                       'digest_footer', 'bounce_warning', 'help')),
    language       text NOT NULL DEFAULT 'en',
    body           text NOT NULL CHECK (length(body) <= 20000),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (list_id, name, language)
);

-- Other addresses under which the list may be addressed in To or Cc (a post that names
-- none of them nor the list is held as an implicit destination).
CREATE TABLE pepsi.list_acceptable_alias (
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    alias          text NOT NULL CHECK (length(alias) BETWEEN 3 AND 500),
    PRIMARY KEY (list_id, alias)
);

-- Automatic responses sent per address and day (held notices, command replies), so a loop
-- or a forged sender gets at most a few.
CREATE TABLE pepsi.list_autoresponse (
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address        text NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('held_notice', 'command', 'reject_notice', 'acknowledge')),
    day            date NOT NULL DEFAULT current_date,
    count          integer NOT NULL DEFAULT 0,
    PRIMARY KEY (list_id, address, kind, day)
);

-- Confirmation requests counted per address or client and window (subscription bombing).
CREATE TABLE pepsi.list_confirm_rate (
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    key_kind       text NOT NULL CHECK (key_kind IN ('address', 'client')),
    key            text NOT NULL,
    window_start   timestamptz NOT NULL,
    count          integer NOT NULL DEFAULT 0,
    PRIMARY KEY (list_id, key_kind, key, window_start)
);

-- Commands received by mail (-join, -leave, -request, -confirm) and what they did.
CREATE TABLE pepsi.list_command_log (
    command_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    sender         text NOT NULL,
    command        text NOT NULL,
    result         text NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now()
);

-- Every post accepted by a list: the loop check and the statistics read it, the fan-out
-- counts on it.
CREATE TABLE pepsi.list_post (
    post_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    message_id     text NOT NULL DEFAULT '',
    sender         text NOT NULL,
    subject        text NOT NULL DEFAULT '',
    -- The queue row the post arrived as, which makes the stage's pass idempotent.
    workqueue_id   bigint NOT NULL,
    size           bigint NOT NULL,
    recipients     integer NOT NULL DEFAULT 0,
    posted_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (list_id, workqueue_id)
);
CREATE INDEX list_post_message_id_idx ON pepsi.list_post (list_id, message_id);

-- A post's fan-out in progress: members after last_member_id still get their rows.
CREATE TABLE pepsi.list_fanout (
    post_id        bigint PRIMARY KEY REFERENCES pepsi.list_post ON DELETE CASCADE,
    last_member_id bigint NOT NULL DEFAULT 0,
    rows_made      integer NOT NULL DEFAULT 0,
    finished_at    timestamptz
);

-- What happened to a list and its members (subscribed, unsubscribed, disabled by bounces,
-- removed, settings changed), by whom.
CREATE TABLE pepsi.list_event_log (
    event_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id        bigint REFERENCES pepsi.mailing_list ON DELETE SET NULL,
    address        text NOT NULL DEFAULT '',
    event          text NOT NULL,
    detail         jsonb NOT NULL DEFAULT '{}',
    actor          text NOT NULL,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX list_event_log_list_idx ON pepsi.list_event_log (list_id, at);

-- RFC 8058 one-click unsubscribe tokens, one per member (the List-Unsubscribe URL carries
-- it): a POST with it unsubscribes, a GET only shows a page.
CREATE TABLE pepsi.list_unsubscribe_token (
    member_id      bigint PRIMARY KEY REFERENCES pepsi.list_member ON DELETE CASCADE,
    token_hash     bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- Emailed links to a member's page (preferences, unsubscribe) and a moderator's pages:
-- no password, a short life, used within it any number of times.
CREATE TABLE pepsi.list_member_link (
    token_hash     bytea PRIMARY KEY CHECK (length(token_hash) = 32),
    address        text NOT NULL CHECK (address = lower(address) AND address LIKE '%_@_%'),
    list_id        bigint REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX list_member_link_expires_idx ON pepsi.list_member_link (expires_at);

-- DMARC policies of From domains as last looked up (the mitigation is decided per post's
-- From domain), with their time to live.
CREATE TABLE pepsi.list_dmarc_policy (
    domain         text PRIMARY KEY CHECK (domain = lower(domain)),
    policy         text NOT NULL CHECK (policy IN ('none', 'quarantine', 'reject', 'absent')),
    fetched_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
