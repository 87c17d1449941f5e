-- pepsi-0002.sql: the mailbox account store the SMTP ingress authenticates against.
--
-- Two tables, so that the privilege boundary is a table boundary: every component that
-- needs to know whether an address is a mailbox may read mailbox_account; only the ingress
-- may read mailbox_password, the Argon2id hashes. A stage that is compromised therefore
-- learns which mailboxes exist and nothing that would let it log in as one.

-- One row per mailbox. The address is the login name and is stored lower-case.
CREATE TABLE pepsi.mailbox_account (
    address     text PRIMARY KEY
                CHECK (address = lower(address) AND address LIKE '_%@_%'),
    enabled     boolean NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The password of a mailbox, as a PHC string of Argon2id ($argon2id$v=19$m=…,t=…,p=…$…).
-- No row: the mailbox cannot authenticate.
CREATE TABLE pepsi.mailbox_password (
    address        text PRIMARY KEY
                   REFERENCES pepsi.mailbox_account (address) ON UPDATE CASCADE ON DELETE CASCADE,
    password_hash  text NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
