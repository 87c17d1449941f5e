-- pepsi-0025.sql: outbound transport security (docs/relay-internet.md, "MTA-STS" and
-- "TLS reports").
--
-- mta_sts_policy caches the MTA-STS policy (RFC 8461) of each recipient domain the relay
-- to the internet delivered to: the id its `_mta-sts` TXT record named when it was
-- fetched, what it says, and until when it may be used without the domain's word. A
-- policy is used while it lasts even when the TXT record or the policy host is away
-- (§5.1), so an attacker who blocks the fetch cannot switch enforcement off.
--
-- tls_report_result counts outbound TLS sessions per UTC day, recipient domain, policy and
-- result, in the classes of TLS reporting (RFC 8460 §4.3), for the daily reports to the
-- domains that publish a `_smtp._tls` record.

CREATE TABLE IF NOT EXISTS pepsi.mta_sts_policy (
    domain            text PRIMARY KEY CHECK (octet_length(domain) BETWEEN 1 AND 253
                      AND domain = lower(domain)),
    policy_id         text NOT NULL CHECK (policy_id ~ '^[A-Za-z0-9]{1,32}$'),
    mode              text NOT NULL CHECK (mode IN ('enforce', 'testing', 'none')),
    mx                text[] NOT NULL CHECK (cardinality(mx) <= 100),
    max_age           integer NOT NULL CHECK (max_age BETWEEN 0 AND 31557600),
    -- The policy as served, for the policy-string of a TLS report.
    body              text NOT NULL CHECK (octet_length(body) <= 65536),
    fetched_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL,
    -- The last refresh that failed while this policy stayed in force.
    refresh_error     text CHECK (octet_length(refresh_error) <= 2000),
    refresh_failed_at timestamptz
);

CREATE TABLE IF NOT EXISTS pepsi.tls_report_result (
    day            date NOT NULL,
    -- The recipient domain whose policy applied (or would have).
    domain         text NOT NULL CHECK (octet_length(domain) BETWEEN 1 AND 253),
    policy_type    text NOT NULL CHECK (policy_type IN ('sts', 'tlsa', 'no-policy-found')),
    -- The policy's lines (RFC 8460 §4.4 policy-string); empty without a policy.
    policy_string  text[] NOT NULL DEFAULT '{}',
    -- The MX host and address of the session; empty for a failure before any session
    -- (a policy that could not be fetched).
    mx_host        text NOT NULL DEFAULT '',
    receiving_ip   text NOT NULL DEFAULT '',
    -- `success`, or one of RFC 8460's result types.
    result_type    text NOT NULL CHECK (result_type IN ('success',
                       'starttls-not-supported', 'certificate-host-mismatch',
                       'certificate-expired', 'certificate-not-trusted', 'validation-failure',
                       'tlsa-invalid', 'dnssec-invalid', 'dane-required',
                       'sts-policy-fetch-error', 'sts-policy-invalid', 'sts-webpki-invalid')),
    sessions       bigint NOT NULL DEFAULT 0 CHECK (sessions >= 0),
    -- What the last failure of this kind said.
    detail         text NOT NULL DEFAULT '' CHECK (octet_length(detail) <= 1000),
    PRIMARY KEY (day, domain, policy_type, policy_string, mx_host, receiving_ip, result_type)
);

-- The reports pepsi-tlsrpt sent: one row per day, domain and report address, so a second
-- run of `pepsi-tlsrpt send` for the same day sends nothing twice.
CREATE TABLE IF NOT EXISTS pepsi.tls_report_sent (
    day        date NOT NULL,
    domain     text NOT NULL CHECK (octet_length(domain) BETWEEN 1 AND 253),
    rua        text NOT NULL CHECK (octet_length(rua) BETWEEN 1 AND 2000),
    report_id  text NOT NULL,
    sent_at    timestamptz NOT NULL DEFAULT now(),
    -- The queue row of a mailed report; NULL for an HTTPS one.
    queue_id   bigint,
    PRIMARY KEY (day, domain, rua)
);

-- The reports other senders sent about our domains (to the rua of our `_smtp._tls`
-- record), as pepsi-tlsrpt imported them: the report itself (validated against RFC 8460
-- §4.4) and where it came from.
CREATE TABLE IF NOT EXISTS pepsi.tls_report_received (
    received_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    organization  text NOT NULL CHECK (octet_length(organization) BETWEEN 1 AND 1000),
    report_id     text NOT NULL CHECK (octet_length(report_id) BETWEEN 1 AND 1000),
    start_at      timestamptz NOT NULL,
    end_at        timestamptz NOT NULL,
    report        jsonb NOT NULL,
    source        text NOT NULL CHECK (octet_length(source) <= 2000),
    received_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (organization, report_id)
);
