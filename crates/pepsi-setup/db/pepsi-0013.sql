-- pepsi-0013.sql: the end-to-end cryptography key store (docs/crypto.md).
--
-- Five tables outside the message state machine, managed by pepsi-keys and read by the
-- crypto stages: our identities (crypto_identity), correspondents' keys (peer_key), who
-- already holds our key (peer_has_own_key), the CAs an S/MIME signature must reach
-- (ca_trust), and key discovery in flight or settled (key_request). Addresses are stored
-- lower-case; fingerprints upper-case hex.
--
-- crypto_identity.private_wrapped is the one column that matters: AES-256-GCM under a
-- key-encryption key that only a secrets.d fragment holds (pepsi-keymat), and readable by
-- the crypto role alone (pepsi-setup replaces every other role's table grant with a
-- column grant that leaves it out).

CREATE TABLE pepsi.crypto_identity (
    identity_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    address           text NOT NULL CHECK (address = lower(address) AND address LIKE '%_@_%'),
    scheme            text NOT NULL CHECK (scheme IN ('openpgp', 'smime')),
    -- What the key pair is for: an OpenPGP key signs and encrypts (both); an S/MIME
    -- deployment may keep separate signing and encryption certificates.
    capability        text NOT NULL DEFAULT 'both' CHECK (capability IN ('sign', 'encrypt', 'both')),
    fingerprint       text NOT NULL CHECK (fingerprint ~ '^[0-9A-F]{16,128}$'),
    -- OpenPGP: the certificate, binary. S/MIME: the certificate then its chain, DER each.
    public_key        bytea NOT NULL,
    -- Version byte, 96-bit nonce, ciphertext and tag (pepsi-keymat); NULL once purged.
    private_wrapped   bytea,
    -- Which key-encryption key sealed private_wrapped (`[crypto] KEK` names it).
    kek_id            text,
    status            text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'retired', 'revoked')),
    -- The key the stages use for the address and scheme; older ones still decrypt.
    is_primary        boolean NOT NULL DEFAULT false,
    -- Offered to others (Autocrypt header, WKD); a key not yet published still decrypts.
    published         boolean NOT NULL DEFAULT true,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz,
    revoked_at        timestamptz,
    private_purged_at timestamptz,
    UNIQUE (scheme, fingerprint),
    CHECK ((private_wrapped IS NULL) = (kek_id IS NULL)),
    CHECK (private_wrapped IS NOT NULL OR private_purged_at IS NOT NULL),
    CHECK (NOT is_primary OR status = 'active')
);
CREATE UNIQUE INDEX crypto_identity_primary_idx
    ON pepsi.crypto_identity (address, scheme) WHERE is_primary;
CREATE INDEX crypto_identity_address_idx ON pepsi.crypto_identity (address);

CREATE TABLE pepsi.peer_key (
    peer_key_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    address              text NOT NULL CHECK (address = lower(address) AND address LIKE '%_@_%'),
    scheme               text NOT NULL CHECK (scheme IN ('openpgp', 'smime')),
    fingerprint          text NOT NULL CHECK (fingerprint ~ '^[0-9A-F]{16,128}$'),
    public_key           bytea NOT NULL,
    -- Where it came from: an operator's import, an Autocrypt header or gossip, a signed
    -- message's certificate, or a discovery method.
    source               text NOT NULL CHECK (source IN ('import', 'autocrypt', 'gossip',
                             'signature', 'wkd', 'openpgpkey', 'smimea', 'keyserver')),
    dnssec_validated     boolean NOT NULL DEFAULT false,
    -- The last validity verdict (valid, expired, revoked, unusable) and when it was made.
    verdict              text NOT NULL DEFAULT 'valid'
                             CHECK (verdict IN ('valid', 'expired', 'revoked', 'unusable')),
    verdict_at           timestamptz NOT NULL DEFAULT now(),
    -- A discovered key is looked up again after this; an imported one never expires here.
    cache_until          timestamptz,
    -- Autocrypt Level 1 peer state (source autocrypt): the newest Date seen with and without
    -- a header, and the peer's preference.
    last_seen            timestamptz,
    autocrypt_timestamp  timestamptz,
    prefer_encrypt       text CHECK (prefer_encrypt IN ('mutual', 'nopreference')),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (address, scheme, source)
);
CREATE INDEX peer_key_address_idx ON pepsi.peer_key (address);

CREATE TABLE pepsi.peer_has_own_key (
    address          text NOT NULL CHECK (address = lower(address)),
    -- Which of our identities they proved to hold (crypto_identity.fingerprint).
    fingerprint      text NOT NULL,
    proven_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (address, fingerprint)
);

CREATE TABLE pepsi.ca_trust (
    fingerprint   text PRIMARY KEY CHECK (fingerprint ~ '^[0-9A-F]{64}$'),
    subject       text NOT NULL,
    certificate   bytea NOT NULL,
    not_after     timestamptz,
    note          text,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pepsi.key_request (
    address          text PRIMARY KEY CHECK (address = lower(address) AND address LIKE '%_@_%'),
    -- The methods asked (wkd, openpgpkey, smimea, keyserver) and, per method, what it
    -- answered: {"wkd": {"result": "none", "detail": "...", "at": "..."}}.
    methods_asked    text[] NOT NULL,
    methods_replied  jsonb NOT NULL DEFAULT '{}',
    status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'found', 'none')),
    requested_at     timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    settled_at       timestamptz,
    -- Settled without a key: no new lookup for the address before this (the negative
    -- cache); a message that needs the key meanwhile bounces at once.
    negative_until   timestamptz,
    CHECK (status = 'pending' OR settled_at IS NOT NULL),
    CHECK (negative_until IS NULL OR status = 'none')
);
CREATE INDEX key_request_due_idx ON pepsi.key_request (next_attempt_at) WHERE status = 'pending';

-- The rows parked for a key (state.keydisc.waiting lists the addresses), so that
-- keydisc_release finds them without scanning every paused row.
CREATE INDEX workqueue_keydisc_idx ON pepsi.workqueue
    USING gin ((state -> 'keydisc' -> 'waiting')) WHERE status = 'paused';
