-- pepsi-0004.sql: options the configuration overlay may not set.
--
-- An option that names a program to run (PROGRAM, HELPER, LIBEXEC_DIR), key material or a
-- trust anchor (KEYS, TLS_CA_FILE, DNS_SERVERS, ...), a file or directory (ALIAS_FILE,
-- MAILDIR_ROOT, ...) or a privilege of the setuid Maildir writer (ALLOW_ROOT_OWNER,
-- CREATE_MAILDIR) comes from the configuration file only, in every section: whoever can
-- write a config_override row could otherwise make the system execute a binary or forge
-- verification verdicts. pepsi_conf::config::FILE_ONLY_OPTIONS holds the same list (a test
-- compares the two), and the loader ignores such a row as well.
--
-- NOT VALID: a row stored before this patch stays (the loader ignores it and says so);
-- every new or changed row is checked.
ALTER TABLE pepsi.config_override ADD CONSTRAINT config_override_file_only
    CHECK (upper(btrim(option)) <> ALL (ARRAY['PROGRAM', 'HELPER', 'LIBEXEC_DIR', 'DNS_SERVERS', 'KEYS', 'KEY', 'KEY_FILE', 'DATABASE_KEYS', 'TLS_CA_FILE', 'TLS_CERT', 'TLS_KEY', 'ALIAS_FILE', 'MAILDIR_ROOT', 'MAILDIR', 'MAIL_ROOT', 'ROOT', 'SECRETS', 'SECRETS_DIR', 'ALLOW_ROOT_OWNER', 'CREATE_MAILDIR']::text[])) NOT VALID;
