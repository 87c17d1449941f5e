-- pepsi-0026.sql: the online setup's intent queue (`pepsi.setup_task`) and the progress its
-- root-run applier reports (`pepsi.setup_task_log`).
--
-- pepsi-httpd drops privileges before it serves anyone, so the setup pages never act: they
-- write a row that says what should be true, of one of eleven kinds with parameters
-- pepsi-setup-model validates, and `pepsi-setup apply` (root) decides how to make it so.
-- Only the configuration role may INSERT (pepsi-httpd enqueues through its configuration
-- connection) and pepsi-httpd may only SELECT; no role that processes mail may touch either
-- table (schema::privilege_matrix). Who wrote a row is not taken from the row:
-- setup_task_stamp (procedures.sql) forces written_by from current_user and the rest of the
-- applier's columns to their starting values, and the applier refuses a row any other role
-- wrote.

CREATE TABLE IF NOT EXISTS pepsi.setup_task (
    task_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text NOT NULL CHECK (kind IN ('database', 'hostname', 'mail_domains',
                     'tls_files', 'tls_acme', 'dkim_key', 'relay_direct', 'relay_smarthost',
                     'local_delivery', 'mailbox', 'features')),
    params       jsonb NOT NULL DEFAULT '{}'::jsonb
                     CHECK (jsonb_typeof(params) = 'object' AND octet_length(params::text) <= 16384),
    -- The role that inserted the row, from the trigger, never from the writer.
    written_by   name NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- pending → running → done | failed; refused when the row is not the configuration
    -- role's or its parameters are outside its kind. A running task whose applier died is
    -- pending again when the next applier starts.
    status       text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'done', 'failed', 'refused')),
    attempts     integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    started_at   timestamptz,
    finished_at  timestamptz,
    -- What the applier concluded: empty until it finishes, then a line for a person.
    outcome      text NOT NULL DEFAULT '' CHECK (octet_length(outcome) <= 4000)
);

CREATE INDEX IF NOT EXISTS setup_task_open ON pepsi.setup_task (task_id)
    WHERE status IN ('pending', 'running');

-- The lines a task printed while it ran, in order: the applier's own steps and the output of
-- the programs it ran (certbot, say), so a page can follow a task without holding a
-- connection to the applier.
CREATE TABLE IF NOT EXISTS pepsi.setup_task_log (
    task_id  bigint NOT NULL REFERENCES pepsi.setup_task (task_id) ON DELETE CASCADE,
    line_no  integer NOT NULL CHECK (line_no > 0),
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- step: the applier's own; output: a program it ran; error: what stopped the task.
    stream   text NOT NULL CHECK (stream IN ('step', 'output', 'error')),
    line     text NOT NULL CHECK (octet_length(line) <= 2000),
    PRIMARY KEY (task_id, line_no)
);
