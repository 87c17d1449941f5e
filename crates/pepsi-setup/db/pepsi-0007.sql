-- pepsi-0007.sql: what the SMTP ingress counts, for pepsi-httpd's /metrics.
--
-- Each pepsi-ingress process counts in memory and adds what it counted since its last
-- flush every STATS_INTERVAL (and when it stops) with one statement, so several ingress
-- processes add up and a restart loses nothing already flushed. `counter` is one of
-- sessions, messages, recipients, connections_refused and refused; `reason` is empty, or
-- for a refusal the command and the enhanced status code it was refused with
-- (`RCPT 5.1.1`), or why a connection was turned away: a small, bounded set.
CREATE TABLE pepsi.ingress_stats (
    counter     text NOT NULL CHECK (counter ~ '^[a-z_]{1,40}$'),
    reason      text NOT NULL DEFAULT '' CHECK (length(reason) <= 80),
    value       bigint NOT NULL DEFAULT 0 CHECK (value >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (counter, reason)
);
