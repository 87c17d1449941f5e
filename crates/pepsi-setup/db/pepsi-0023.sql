-- pepsi-0023.sql: an archive import counts the messages it skipped as too long apart from
-- those that failed (docs/archive.md, "Import"), as its progress and --json report them.
ALTER TABLE pepsi.archive_import
    ADD COLUMN IF NOT EXISTS too_long integer NOT NULL DEFAULT 0;
