-- pepsi-0015.sql: the options that decide where a stage connects are file-only.
--
-- A stage that logs in somewhere (the smarthost relay's AUTH_USERNAME / AUTH_PASSWORD, the
-- count stage's AUTH_TOKEN) sends its credential to whatever HOST, PORT and URL name, over
-- whatever TLS and TLS_SERVER_NAME allow. Whoever could write a config_override row could
-- otherwise point the stage at a host of their own (or turn TLS off) and receive the secret
-- of a secrets.d fragment they cannot read (security review 2026-12-04, finding 2). Like
-- every option that names a program, file, key or trust anchor, they come from the
-- configuration file only, in every section. The list stays the one of
-- pepsi_conf::config::FILE_ONLY_OPTIONS (a test compares the two); NOT VALID as in
-- pepsi-0004 (a row stored before stays, and the loader ignores it and says so).
ALTER TABLE pepsi.config_override DROP CONSTRAINT config_override_file_only;
ALTER TABLE pepsi.config_override ADD CONSTRAINT config_override_file_only
    CHECK (upper(btrim(option)) <> ALL (ARRAY['PROGRAM', 'HELPER', 'LIBEXEC_DIR', 'DNS_SERVERS', 'KEYS', 'KEY', 'KEY_FILE', 'DATABASE_KEYS', 'TLS_CA_FILE', 'TLS_CERT', 'TLS_KEY', 'ALIAS_FILE', 'MAILDIR_ROOT', 'MAILDIR', 'MAIL_ROOT', 'ROOT', 'SECRETS', 'SECRETS_DIR', 'ALLOW_ROOT_OWNER', 'CREATE_MAILDIR', 'CONFIG_DATABASE_URL', 'HOST', 'PORT', 'URL', 'TLS', 'TLS_SERVER_NAME']::text[])) NOT VALID;
