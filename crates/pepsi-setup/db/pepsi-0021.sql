-- pepsi-0021.sql: the placeholder a purged post leaves (docs/archive.md, "Purge").
--
-- A post purged under replies leaves a placeholder with its Message-ID so that its thread
-- keeps its shape. Such a placeholder is marked purged: a later post with the same
-- Message-ID is then a duplicate, never archived in the purged post's place (at its URL,
-- under its replies).
ALTER TABLE pepsi.archive_placeholder
    ADD COLUMN IF NOT EXISTS purged boolean NOT NULL DEFAULT false;
