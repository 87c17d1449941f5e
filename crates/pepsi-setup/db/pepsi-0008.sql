-- pepsi-0008.sql: a queue row's history found by its index, and one more file-only option.
--
-- The pipeline page and GET /api/events?workqueue_id= list one row's events: an index on
-- the column instead of a scan of the whole audit log (only rows that name a queue row).
CREATE INDEX event_log_workqueue_idx ON pepsi.event_log (workqueue_id)
    WHERE workqueue_id IS NOT NULL;

-- [pepsi-httpd] CONFIG_DATABASE_URL names a database connection (with its password, as a
-- rule): like every option that names a connection, file, key or program it comes from the
-- configuration file only. The list stays the one of pepsi_conf::config::FILE_ONLY_OPTIONS
-- (a test compares the two); NOT VALID as in pepsi-0004.
ALTER TABLE pepsi.config_override DROP CONSTRAINT config_override_file_only;
ALTER TABLE pepsi.config_override ADD CONSTRAINT config_override_file_only
    CHECK (upper(btrim(option)) <> ALL (ARRAY['PROGRAM', 'HELPER', 'LIBEXEC_DIR', 'DNS_SERVERS', 'KEYS', 'KEY', 'KEY_FILE', 'DATABASE_KEYS', 'TLS_CA_FILE', 'TLS_CERT', 'TLS_KEY', 'ALIAS_FILE', 'MAILDIR_ROOT', 'MAILDIR', 'MAIL_ROOT', 'ROOT', 'SECRETS', 'SECRETS_DIR', 'ALLOW_ROOT_OWNER', 'CREATE_MAILDIR', 'CONFIG_DATABASE_URL']::text[])) NOT VALID;
