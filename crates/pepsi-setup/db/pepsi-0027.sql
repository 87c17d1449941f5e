-- pepsi-0027.sql: what pepsi-telemetry keeps of the traces and metrics its clients export
-- (docs/telemetry.md).
--
-- pepsi-telemetry writes both tables under its own role (schema::privilege_matrix): it adds
-- rows, reads them and deletes those past its RETENTION, and may touch nothing else; in
-- particular neither the queue nor the key store. pepsi-httpd reads them for a message's
-- journey and the pipeline page's per-stage latencies.

-- One span of a trace: the ingress's transaction, a stage pass, a delivery attempt, or a
-- pass cut short (a worker killed mid-pass). The pepsi.* attributes the receiver knows are
-- lifted into columns; every attribute is kept in `attributes` as well.
CREATE TABLE IF NOT EXISTS pepsi.telemetry_span (
    trace_id        bytea NOT NULL CHECK (octet_length(trace_id) = 16),
    span_id         bytea NOT NULL CHECK (octet_length(span_id) = 8),
    parent_span_id  bytea CHECK (parent_span_id IS NULL OR octet_length(parent_span_id) = 8),
    name            text NOT NULL,
    -- The resource's service.name and host.name: which program family and which host.
    service         text,
    host            text,
    -- pepsi.stage, pepsi.queue_id, pepsi.message_id, pepsi.outcome.
    stage           text,
    queue_id        bigint,
    message_id      text,
    outcome         text,
    start_time      timestamptz NOT NULL,
    end_time        timestamptz NOT NULL,
    attributes      jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(attributes) = 'object'),
    -- OTLP status: 0 unset, 1 ok, 2 error.
    status_code     smallint NOT NULL DEFAULT 0,
    status_message  text,
    received_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trace_id, span_id)
);

CREATE INDEX IF NOT EXISTS telemetry_span_queue_idx
    ON pepsi.telemetry_span (queue_id) WHERE queue_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS telemetry_span_message_idx
    ON pepsi.telemetry_span (message_id) WHERE message_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS telemetry_span_stage_idx
    ON pepsi.telemetry_span (stage, end_time) WHERE stage IS NOT NULL;
CREATE INDEX IF NOT EXISTS telemetry_span_end_idx ON pepsi.telemetry_span (end_time);

-- One data point of a metric: a sum or a gauge has `value`; a histogram has `count`, `sum`
-- and its buckets (`bounds`, and `bucket_counts` with one more entry than `bounds`).
CREATE TABLE IF NOT EXISTS pepsi.telemetry_metric (
    metric_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name            text NOT NULL,
    service         text,
    host            text,
    kind            text NOT NULL CHECK (kind IN ('sum', 'gauge', 'histogram')),
    unit            text,
    attributes      jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(attributes) = 'object'),
    time            timestamptz NOT NULL,
    value           double precision,
    count           bigint,
    sum             double precision,
    bounds          double precision[],
    bucket_counts   bigint[],
    received_at     timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS telemetry_metric_name_idx ON pepsi.telemetry_metric (name, time);
CREATE INDEX IF NOT EXISTS telemetry_metric_time_idx ON pepsi.telemetry_metric (time);
