-- pepsi-0019.sql: the lists' archive (docs/archive.md): the nine archive_* tables.
--
-- A post is known by its list and its url_id, the lower-case hex of the first 16 bytes of
-- sha256 of its normalised Message-ID (pepsi_archive::url): the id of its page, and the key
-- a reply's References find it by. A Message-ID referenced but not archived is a
-- placeholder under the same key until its message arrives. Whether a list is archived, and
-- who may read it, is mailing_list.archive_policy (pepsi-0016): public, private (members
-- only) or none (not archived).

-- A thread: a root (a message or a placeholder) and everything below it.
CREATE TABLE IF NOT EXISTS pepsi.archive_thread (
    thread_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id       bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    root_url_id   text NOT NULL,
    subject       text NOT NULL DEFAULT '',
    first_date    timestamptz NOT NULL,
    last_date     timestamptz NOT NULL,
    message_count integer NOT NULL DEFAULT 0 CHECK (message_count >= 0)
);
CREATE INDEX IF NOT EXISTS archive_thread_list_idx
    ON pepsi.archive_thread (list_id, last_date DESC);

-- One archived post. `search` holds the subject (weight A), the author (B) and the text of
-- the text/plain parts (C); a purged post leaves no row here (archive_placeholder may keep
-- its Message-ID for the thread).
CREATE TABLE IF NOT EXISTS pepsi.archive_message (
    archive_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id            bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    url_id             text NOT NULL CHECK (url_id ~ '^[0-9a-f]{32}$'),
    message_id         text NOT NULL CHECK (octet_length(message_id) BETWEEN 1 AND 998),
    -- The post had no Message-ID: message_id was made from a hash of the post.
    message_id_made    boolean NOT NULL DEFAULT false,
    from_address       text NOT NULL DEFAULT '',
    from_name          text NOT NULL DEFAULT '',
    subject            text NOT NULL DEFAULT '',
    -- The Date field, else the time archived.
    date               timestamptz NOT NULL,
    in_reply_to        text,
    message_references text[] NOT NULL DEFAULT '{}' CHECK (cardinality(message_references) <= 100),
    thread_id          bigint NOT NULL REFERENCES pepsi.archive_thread,
    -- The url_id of the parent: a message or a placeholder of the same list.
    parent_url_id      text,
    search             tsvector NOT NULL,
    size               bigint NOT NULL CHECK (size >= 0),
    archived_at        timestamptz NOT NULL,
    UNIQUE (list_id, url_id)
);
CREATE INDEX IF NOT EXISTS archive_message_date_idx ON pepsi.archive_message (list_id, date);
CREATE INDEX IF NOT EXISTS archive_message_thread_idx ON pepsi.archive_message (thread_id, date);
CREATE INDEX IF NOT EXISTS archive_message_parent_idx
    ON pepsi.archive_message (list_id, parent_url_id);
CREATE INDEX IF NOT EXISTS archive_message_from_idx ON pepsi.archive_message (lower(from_address));
CREATE INDEX IF NOT EXISTS archive_message_search_idx
    ON pepsi.archive_message USING gin (search);

-- A Message-ID referenced by an archived post but not archived itself (not received yet,
-- never sent to the list, or purged): the thread shows it as a gap. Replaced by the message
-- when it arrives.
CREATE TABLE IF NOT EXISTS pepsi.archive_placeholder (
    list_id       bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    url_id        text NOT NULL CHECK (url_id ~ '^[0-9a-f]{32}$'),
    message_id    text NOT NULL CHECK (octet_length(message_id) BETWEEN 1 AND 998),
    thread_id     bigint NOT NULL REFERENCES pepsi.archive_thread ON DELETE CASCADE,
    parent_url_id text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (list_id, url_id)
);
CREATE INDEX IF NOT EXISTS archive_placeholder_thread_idx
    ON pepsi.archive_placeholder (thread_id);

-- The post's bytes (header block, CRLF, body), apart so that listing never reads them.
CREATE TABLE IF NOT EXISTS pepsi.archive_body (
    archive_id bigint PRIMARY KEY REFERENCES pepsi.archive_message ON DELETE CASCADE,
    raw        bytea NOT NULL
);

-- The post's leaf parts, by mail-parser's part number, for the attachments' downloads.
CREATE TABLE IF NOT EXISTS pepsi.archive_part (
    archive_id   bigint NOT NULL REFERENCES pepsi.archive_message ON DELETE CASCADE,
    part_index   integer NOT NULL CHECK (part_index >= 0),
    content_type text NOT NULL,
    file_name    text,
    size         bigint NOT NULL CHECK (size >= 0),
    PRIMARY KEY (archive_id, part_index)
);

-- Posts per list and month (of their date, UTC), for the month view.
CREATE TABLE IF NOT EXISTS pepsi.archive_month (
    list_id       bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    month         date NOT NULL CHECK (extract(day FROM month) = 1),
    message_count integer NOT NULL DEFAULT 0 CHECK (message_count >= 0),
    PRIMARY KEY (list_id, month)
);

-- A member's login link to a private archive: sha256 of the token, never the token.
CREATE TABLE IF NOT EXISTS pepsi.archive_reader (
    reader_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id    bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address    text NOT NULL,
    token_hash bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at    timestamptz
);
CREATE INDEX IF NOT EXISTS archive_reader_expires_idx ON pepsi.archive_reader (expires_at);

-- One import of an mbox into a list's archive.
CREATE TABLE IF NOT EXISTS pepsi.archive_import (
    import_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id     bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    file_name   text NOT NULL,
    started_by  text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    read        integer NOT NULL DEFAULT 0,
    archived    integer NOT NULL DEFAULT 0,
    duplicates  integer NOT NULL DEFAULT 0,
    failed      integer NOT NULL DEFAULT 0
);

-- What was done to an archive beyond archiving: purges, imports, reindexing; who did it.
-- A purge's detail names the url_id and counts, never the purged address or content.
CREATE TABLE IF NOT EXISTS pepsi.archive_event_log (
    event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id  bigint REFERENCES pepsi.mailing_list ON DELETE SET NULL,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text NOT NULL,
    event    text NOT NULL,
    detail   jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS archive_event_log_list_idx ON pepsi.archive_event_log (list_id, at);
