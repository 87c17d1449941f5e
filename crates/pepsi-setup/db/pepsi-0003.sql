-- pepsi-0003.sql: DKIM signing keys kept in the database.
--
-- One row per key: the private key of `selector._domainkey.domain`, PEM text (PKCS#8 RSA or
-- Ed25519, or PKCS#1 RSA). pepsi-stage-dkim-sign reads the enabled rows when a stage
-- section says DATABASE_KEYS = yes. Only the operator's config role writes this table; the
-- pipeline role reads it (the signing stages), the ingress has no access at all, so nothing
-- that processes mail can plant or swap a key. A change notifies config_changed
-- (procedures.sql), so the dispatcher replaces the signing workers and they load the new keys.
--
-- The CHECKs mirror pepsi_outbound::keys: a lower-case dotted domain of letters, digits and
-- hyphens without a trailing dot (signing_domain), a selector of such labels that may also
-- hold underscores (valid_selector), and PEM armour around the key. Whether the key inside
-- parses is decided by the stage, which skips a row it cannot use and logs why.
CREATE TABLE pepsi.signing_key (
    domain       text NOT NULL
                 CHECK (domain ~ '^[a-z0-9-]+(\.[a-z0-9-]+)+$'),
    selector     text NOT NULL
                 CHECK (selector ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'),
    private_key  text NOT NULL
                 CHECK (private_key ~ '^\s*-----BEGIN ([A-Z0-9]+ )?PRIVATE KEY-----'
                        AND private_key ~ '-----END ([A-Z0-9]+ )?PRIVATE KEY-----\s*$'),
    enabled      boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (domain, selector)
);
