-- procedures.sql: stored functions and triggers of the pepsi schema.
--
-- Re-created on every `pepsi-setup db` run: everything here is CREATE OR REPLACE, so this
-- file may change between releases without a numbered patch.
--
-- THE NOTIFY CONTRACT
--
-- The dispatcher LISTENs on the channel `workqueue` (new pending work) and `config_changed`
-- (the configuration overlay or the DKIM signing keys changed). A `workqueue` payload names
-- the stage the announced rows wait at (the dispatcher then claims for that stage alone), or
-- is empty when they may wait at any stage.
--
-- * Admission never notifies. workqueue_add does not call pg_notify: a transaction that
--   queues a notification holds a database-wide lock from then until it commits, which would
--   serialise every concurrent SMTP session's commit. pepsi-ingress instead wakes the
--   dispatcher out of band, after its rows have committed, through
--   pepsi_contract::db::wake_dispatcher: at once when no wake-up is in flight, else once right
--   after the one in flight (requests collapse), each in a transaction of its own with
--   synchronous_commit off (the rows it announces are durable already; the wake-up itself
--   needs no durability, so it does not wait for a WAL flush).
-- * Writers outside the dispatcher's loop notify explicitly, from Rust, through
--   pepsi_contract::db::notify_workqueue, after their transaction commits: operator tools
--   resuming or retrying rows (workqueue_resume, and pepsi-queue's workqueue_retry,
--   workqueue_release, workqueue_bounce … below), and any program that injects mail without
--   being a stage worker (workqueue_inject called outside a stage).
-- * Writers inside the loop stay silent: a stage worker's status line already brings the
--   dispatcher round to the next claim, so advance/pause/split/inject from within a stage
--   need no notification.
-- * The dispatcher's own functions (dispatch_claim, dispatch_requeue_due,
--   dispatch_take_over, dispatch_reconcile, dispatch_hand_back, dispatch_force, under THE
--   DISPATCHER below) never notify: the dispatcher is the listener and claims again after
--   each of them.
-- * No function in this file calls pg_notify on `workqueue`. The only NOTIFYs here are the
--   statement-level config_changed triggers on config_override and signing_key, and
--   setup_task_notify (channel `setup_task`), which wakes `pepsi-setup apply --follow`.
--
-- RECIPIENT INDICES
--
-- Functions that take recipient indices use 0-based indices into rcpt_to as the stage saw
-- it (the Rust side's Vec indices). Whenever a recipient subset is taken, the parallel array
-- state.dsn.rcpt (one RFC 3461 entry per recipient) is subset in lockstep.
--
-- BODIES
--
-- The invariant raw = headers || CRLF || body holds for every row. One workqueue_body row is
-- shared by every row split or cloned off a message; a stage that rewrites the body gets a
-- fresh body row (copy-on-write, done by the stage scaffolding), and the trigger below
-- releases a body when its last row goes. workqueue_body_gc sweeps what a race between two
-- concurrent last deletions leaves behind.

-- state with state.dsn.rcpt reduced to the given 0-based indices (unchanged when absent).
CREATE OR REPLACE FUNCTION pepsi.state_rcpt_subset(p_state jsonb, p_idx integer[])
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN jsonb_typeof(p_state #> '{dsn,rcpt}') = 'array' THEN
            jsonb_set(p_state, '{dsn,rcpt}', COALESCE((
                SELECT jsonb_agg(COALESCE(p_state #> ARRAY['dsn', 'rcpt', i::text], 'null'::jsonb) ORDER BY o)
                FROM unnest(p_idx) WITH ORDINALITY AS u(i, o)
            ), '[]'::jsonb))
        ELSE p_state
    END
$$;

-- rcpt_to reduced to the given 0-based indices, refusing an index out of range.
CREATE OR REPLACE FUNCTION pepsi.rcpt_subset(p_rcpt text[], p_idx integer[])
RETURNS text[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    i integer;
    result text[] := '{}';
BEGIN
    FOREACH i IN ARRAY COALESCE(p_idx, '{}') LOOP
        IF i < 0 OR i >= cardinality(p_rcpt) THEN
            RAISE EXCEPTION 'recipient index % out of range (message has % recipients)', i, cardinality(p_rcpt)
                USING ERRCODE = '22023';
        END IF;
        result := result || p_rcpt[i + 1];
    END LOOP;
    RETURN result;
END
$$;

-- FENCING (docs/ha.md)
--
-- A dispatcher and the workers it starts name its epoch on every session (the custom
-- setting pepsi.epoch, given at connection time); the claim stamps it on the row
-- (workqueue.claim_epoch). A running row may be changed only by a session of the epoch that
-- claimed it, and only while that epoch is not fenced: a dispatcher that takes over fences
-- every earlier one, so nothing a stale dispatcher or its workers send can change a row from
-- then on. A session naming no epoch (a worker run by hand, a test) changes only rows no
-- epoch claimed; rows claimed before pepsi-0014 carry none and are anyone's.

-- This session's dispatcher epoch, NULL when it names none.
CREATE OR REPLACE FUNCTION pepsi.session_epoch()
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT NULLIF(current_setting('pepsi.epoch', true), '')::bigint
$$;

-- Whether epoch p_epoch has been fenced by a dispatcher that took over. PL/pgSQL, so that
-- its query is planned once per session: a SQL function with a subquery is not inlined, and
-- is parsed and planned again in every statement that calls it.
CREATE OR REPLACE FUNCTION pepsi.epoch_fenced(p_epoch bigint)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM pepsi.dispatcher d WHERE d.epoch = p_epoch AND d.fenced_at IS NOT NULL);
END
$$;

-- Whether this session may change a running row that epoch p_claim claimed.
CREATE OR REPLACE FUNCTION pepsi.claim_held(p_claim bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_claim IS NULL THEN true
        ELSE p_claim IS NOT DISTINCT FROM pepsi.session_epoch() AND NOT pepsi.epoch_fenced(p_claim)
    END
$$;

-- The same rule for a statement over many rows: p_live is whether this session's epoch is
-- unfenced, which the caller computes once for the statement, as the uncorrelated subquery
-- `(SELECT NOT pepsi.epoch_fenced(pepsi.session_epoch()))` (planned as an InitPlan), instead
-- of once per row looked at. A row claimed by this session's epoch is held exactly when that
-- epoch is unfenced, so the two forms agree on every row.
CREATE OR REPLACE FUNCTION pepsi.claim_held(p_claim bigint, p_live boolean)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_claim IS NULL THEN true
        ELSE p_claim IS NOT DISTINCT FROM pepsi.session_epoch() AND p_live
    END
$$;

-- The running row p_id, locked; raises when it is missing, not running, or claimed by an
-- epoch other than this session's or a fenced one.
CREATE OR REPLACE FUNCTION pepsi.workqueue_running_row(p_id bigint)
RETURNS pepsi.workqueue LANGUAGE plpgsql AS $$
DECLARE
    r pepsi.workqueue;
BEGIN
    SELECT * INTO r FROM pepsi.workqueue WHERE workqueue_id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'workqueue row % does not exist', p_id USING ERRCODE = 'P0002';
    END IF;
    IF r.status <> 'running' THEN
        RAISE EXCEPTION 'workqueue row % is %, not running', p_id, r.status USING ERRCODE = '55000';
    END IF;
    IF NOT pepsi.claim_held(r.claim_epoch) THEN
        RAISE EXCEPTION 'workqueue row % was claimed by dispatcher epoch %, not this session''s (%), or that epoch has been fenced',
            p_id, r.claim_epoch, COALESCE(pepsi.session_epoch()::text, 'none') USING ERRCODE = '55000';
    END IF;
    RETURN r;
END
$$;

-- Admission: store a new message at stage init, pending. Never notifies (see the contract).
CREATE OR REPLACE FUNCTION pepsi.workqueue_add(
    p_mail_from text, p_rcpt_to text[], p_headers bytea, p_body bytea,
    p_state jsonb DEFAULT '{}', p_auth_user text DEFAULT NULL, p_client_addr inet DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_body bigint;
    v_id bigint;
BEGIN
    INSERT INTO pepsi.workqueue_body (body) VALUES (p_body) RETURNING body_id INTO v_body;
    INSERT INTO pepsi.workqueue (mail_from, rcpt_to, headers, body_id, state, auth_user, client_addr)
    VALUES (p_mail_from, p_rcpt_to, p_headers, v_body, COALESCE(p_state, '{}'), p_auth_user, p_client_addr)
    RETURNING workqueue_id INTO v_id;
    RETURN v_id;
END
$$;

-- Admission of several messages in one statement and one transaction (the ingress's group
-- admission): message i is p_mail_from[i], the next p_rcpt_count[i] entries of the flat
-- p_rcpt_to, p_headers[i], p_body[i], p_state[i], p_auth_user[i], p_client_addr[i]. Returns
-- the new ids in the order given; all commit together or none does. Never notifies.
CREATE OR REPLACE FUNCTION pepsi.workqueue_add_batch(
    p_mail_from text[], p_rcpt_to text[], p_rcpt_count integer[], p_headers bytea[],
    p_body bytea[], p_state jsonb[], p_auth_user text[], p_client_addr inet[])
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    n integer := coalesce(cardinality(p_mail_from), 0);
    v_ids bigint[] := '{}';
    v_at integer := 0;
BEGIN
    IF coalesce(cardinality(p_rcpt_count), 0) <> n OR coalesce(cardinality(p_headers), 0) <> n
       OR coalesce(cardinality(p_body), 0) <> n OR coalesce(cardinality(p_state), 0) <> n
       OR coalesce(cardinality(p_auth_user), 0) <> n OR coalesce(cardinality(p_client_addr), 0) <> n THEN
        RAISE EXCEPTION 'workqueue_add_batch: the arrays describe different numbers of messages'
            USING ERRCODE = '22023';
    END IF;
    IF (SELECT coalesce(sum(c), 0) FROM unnest(p_rcpt_count) c) <> coalesce(cardinality(p_rcpt_to), 0)
       OR EXISTS (SELECT 1 FROM unnest(p_rcpt_count) c WHERE c IS NULL OR c < 0) THEN
        RAISE EXCEPTION 'workqueue_add_batch: p_rcpt_count does not partition p_rcpt_to'
            USING ERRCODE = '22023';
    END IF;
    FOR i IN 1 .. n LOOP
        v_ids := v_ids || pepsi.workqueue_add(p_mail_from[i], p_rcpt_to[v_at + 1 : v_at + p_rcpt_count[i]],
            p_headers[i], p_body[i], p_state[i], p_auth_user[i], p_client_addr[i]);
        v_at := v_at + p_rcpt_count[i];
    END LOOP;
    RETURN v_ids;
END
$$;

-- A brand-new side message (an auto-reply, a notice) at a named stage, pending. With a
-- token, at most once: a token already used returns NULL and creates nothing.
CREATE OR REPLACE FUNCTION pepsi.workqueue_inject(
    p_stage text, p_mail_from text, p_rcpt_to text[], p_headers bytea, p_body bytea,
    p_state jsonb DEFAULT '{}', p_token text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_body bigint;
    v_id bigint;
BEGIN
    IF p_token IS NOT NULL THEN
        INSERT INTO pepsi.clone_token (token) VALUES (p_token) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO pepsi.workqueue_body (body) VALUES (p_body) RETURNING body_id INTO v_body;
    INSERT INTO pepsi.workqueue (stage, mail_from, rcpt_to, headers, body_id, state)
    VALUES (p_stage, p_mail_from, p_rcpt_to, p_headers, v_body, COALESCE(p_state, '{}'))
    RETURNING workqueue_id INTO v_id;
    RETURN v_id;
END
$$;

-- Spawn clones of row r, sharing its headers and body. p_clones is a JSON array of
--   {"token": text, "stage": text, "state": object merged onto r.state,
--    "rcpt_indices": [0-based indices of r.rcpt_to] (default: all), "mail_from": text}
-- A clone whose token was used before is skipped: clones are at-most-once.
CREATE OR REPLACE FUNCTION pepsi.workqueue_spawn_clones(r pepsi.workqueue, p_clones jsonb)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    c jsonb;
    v_idx integer[];
    v_id bigint;
    ids bigint[] := '{}';
BEGIN
    FOR c IN SELECT * FROM jsonb_array_elements(COALESCE(p_clones, '[]')) LOOP
        IF c ->> 'stage' IS NULL THEN
            RAISE EXCEPTION 'clone of workqueue row % has no stage: %', r.workqueue_id, c USING ERRCODE = '22023';
        END IF;
        IF c ->> 'token' IS NOT NULL THEN
            INSERT INTO pepsi.clone_token (token) VALUES (c ->> 'token') ON CONFLICT DO NOTHING;
            CONTINUE WHEN NOT FOUND;
        END IF;
        IF jsonb_typeof(c -> 'rcpt_indices') = 'array' THEN
            SELECT array_agg(x::integer ORDER BY o) INTO v_idx
            FROM jsonb_array_elements_text(c -> 'rcpt_indices') WITH ORDINALITY AS e(x, o);
        ELSE
            SELECT array_agg(g) INTO v_idx FROM generate_series(0, cardinality(r.rcpt_to) - 1) AS g;
        END IF;
        INSERT INTO pepsi.workqueue (stage, mail_from, rcpt_to, headers, body_id, state, auth_user, client_addr)
        VALUES (c ->> 'stage',
                COALESCE(c ->> 'mail_from', r.mail_from),
                pepsi.rcpt_subset(r.rcpt_to, v_idx),
                r.headers,
                r.body_id,
                pepsi.state_rcpt_subset(r.state, v_idx) || COALESCE(c -> 'state', '{}'),
                r.auth_user,
                r.client_addr)
        RETURNING workqueue_id INTO v_id;
        ids := ids || v_id;
    END LOOP;
    RETURN ids;
END
$$;

-- Pause the running row p_id until now() + p_secs, merging p_merge into its state, keeping
-- only the recipients p_keep (NULL: all), and spawning p_clones, all in one transaction.
-- Clones are taken from the row as the stage saw it (indices refer to its recipient list).
CREATE OR REPLACE FUNCTION pepsi.workqueue_pause(
    p_id bigint, p_merge jsonb, p_secs double precision,
    p_keep integer[] DEFAULT NULL, p_clones jsonb DEFAULT '[]')
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    r pepsi.workqueue := pepsi.workqueue_running_row(p_id);
    ids bigint[];
BEGIN
    ids := pepsi.workqueue_spawn_clones(r, p_clones);
    IF p_keep IS NOT NULL AND cardinality(p_keep) = 0 THEN
        RAISE EXCEPTION 'workqueue_pause would leave row % without recipients', p_id USING ERRCODE = '22023';
    END IF;
    UPDATE pepsi.workqueue SET
        status = 'paused',
        timeout = now() + make_interval(secs => GREATEST(p_secs, 0)),
        rcpt_to = CASE WHEN p_keep IS NULL THEN rcpt_to ELSE pepsi.rcpt_subset(rcpt_to, p_keep) END,
        state = CASE WHEN p_keep IS NULL THEN state ELSE pepsi.state_rcpt_subset(state, p_keep) END
                || COALESCE(p_merge, '{}'),
        updated_at = now()
    WHERE workqueue_id = p_id;
    RETURN ids;
END
$$;

-- Delete the running row p_id (delivered or dropped) and spawn p_clones in one transaction.
CREATE OR REPLACE FUNCTION pepsi.workqueue_finish_with_clones(p_id bigint, p_clones jsonb)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    r pepsi.workqueue := pepsi.workqueue_running_row(p_id);
    ids bigint[];
BEGIN
    ids := pepsi.workqueue_spawn_clones(r, p_clones);
    DELETE FROM pepsi.workqueue WHERE workqueue_id = p_id;
    RETURN ids;
END
$$;

-- Fan the running row p_id out: it keeps the recipients p_keep, and each group of p_groups
-- becomes a sibling row sharing headers and body:
--   {"stage": text,
--    "status": "pending" | "paused" | "failed",
--    "retry_secs": number (paused groups: due time from now),
--    "rcpt_indices": [0-based indices]        -- recipients taken from this row, or
--    "rcpt_to": [addresses], "dsn_rcpt": [..] -- brand-new recipients (a rewrite),
--    "state": object merged onto the row's state,
--    "mail_from": text (optional),
--    "keep_received_at": bool (default true)}
-- Returns the new rows' ids in group order. Never notifies (see the contract).
CREATE OR REPLACE FUNCTION pepsi.workqueue_split(p_id bigint, p_keep integer[], p_groups jsonb)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    r pepsi.workqueue := pepsi.workqueue_running_row(p_id);
    g jsonb;
    v_idx integer[];
    v_rcpt text[];
    v_state jsonb;
    v_status pepsi.workqueue_status;
    v_id bigint;
    ids bigint[] := '{}';
BEGIN
    IF p_keep IS NULL OR cardinality(p_keep) = 0 THEN
        RAISE EXCEPTION 'workqueue_split would leave row % without recipients', p_id USING ERRCODE = '22023';
    END IF;
    FOR g IN SELECT * FROM jsonb_array_elements(COALESCE(p_groups, '[]')) LOOP
        IF g ->> 'stage' IS NULL THEN
            RAISE EXCEPTION 'split group of workqueue row % has no stage: %', p_id, g USING ERRCODE = '22023';
        END IF;
        v_status := COALESCE(g ->> 'status', 'pending')::pepsi.workqueue_status;
        IF v_status NOT IN ('pending', 'paused', 'failed') THEN
            RAISE EXCEPTION 'split group status must be pending, paused or failed, not %', v_status USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(g -> 'rcpt_to') = 'array' THEN
            SELECT array_agg(x ORDER BY o) INTO v_rcpt FROM jsonb_array_elements_text(g -> 'rcpt_to') WITH ORDINALITY AS e(x, o);
            v_state := CASE
                WHEN jsonb_typeof(g -> 'dsn_rcpt') = 'array' THEN
                    jsonb_set(r.state || jsonb_build_object('dsn', COALESCE(r.state -> 'dsn', '{}')), '{dsn,rcpt}', g -> 'dsn_rcpt')
                WHEN r.state ? 'dsn' THEN r.state #- '{dsn,rcpt}'
                ELSE r.state
            END;
        ELSE
            SELECT array_agg(x::integer ORDER BY o) INTO v_idx FROM jsonb_array_elements_text(g -> 'rcpt_indices') WITH ORDINALITY AS e(x, o);
            v_rcpt := pepsi.rcpt_subset(r.rcpt_to, v_idx);
            v_state := pepsi.state_rcpt_subset(r.state, v_idx);
        END IF;
        IF v_rcpt IS NULL OR cardinality(v_rcpt) = 0 THEN
            RAISE EXCEPTION 'split group of workqueue row % has no recipients: %', p_id, g USING ERRCODE = '22023';
        END IF;
        INSERT INTO pepsi.workqueue (stage, status, mail_from, rcpt_to, headers, body_id, state, timeout,
                                     received_at, auth_user, client_addr)
        VALUES (g ->> 'stage',
                v_status,
                COALESCE(g ->> 'mail_from', r.mail_from),
                v_rcpt,
                r.headers,
                r.body_id,
                v_state || COALESCE(g -> 'state', '{}'),
                CASE WHEN v_status = 'paused'
                     THEN now() + make_interval(secs => GREATEST(COALESCE((g ->> 'retry_secs')::double precision, 0), 0))
                END,
                CASE WHEN COALESCE((g ->> 'keep_received_at')::boolean, true) THEN r.received_at ELSE now() END,
                r.auth_user,
                r.client_addr)
        RETURNING workqueue_id INTO v_id;
        ids := ids || v_id;
    END LOOP;
    UPDATE pepsi.workqueue SET
        rcpt_to = pepsi.rcpt_subset(rcpt_to, p_keep),
        state = pepsi.state_rcpt_subset(state, p_keep),
        updated_at = now()
    WHERE workqueue_id = p_id;
    RETURN ids;
END
$$;

-- Make a paused, failed or timed-out row pending again now. A held row (see workqueue_hold)
-- is left alone: only workqueue_release lifts a hold. Returns whether a row changed. The caller notifies after commit (see the contract).
CREATE OR REPLACE FUNCTION pepsi.workqueue_resume(p_id bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pepsi.workqueue SET status = 'pending', timeout = NULL, updated_at = now()
    WHERE workqueue_id = p_id AND status IN ('paused', 'failed', 'timeout')
      AND NOT (status = 'paused' AND state ? 'held');
    RETURN FOUND;
END
$$;

-- THE AUDIT LOG
--
-- One row per administrative action, written in the same transaction as the action. Every
-- surface (operator tools, the API) writes through pepsi_contract::audit::record, which calls
-- this function; the actor defaults to the database role (current_user).
CREATE OR REPLACE FUNCTION pepsi.event_log_add(
    p_action text, p_workqueue_id bigint, p_detail jsonb, p_actor text DEFAULT NULL)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO pepsi.event_log (actor, action, workqueue_id, detail)
    VALUES (COALESCE(p_actor, current_user), p_action, p_workqueue_id, COALESCE(p_detail, '{}'))
$$;

-- OPERATOR ACTIONS (pepsi-queue and pepsi-httpd's queue API, through pepsi_admin::queue)
--
-- workqueue_retry, _hold, _release, _delete and _bounce are SECURITY DEFINER: pepsi-httpd
-- faces the internet, so its role only reads the queue (no UPDATE or DELETE, which would let
-- it rewrite a row's envelope, headers, state or body and so queue anything), and changes a
-- row through these five alone, each of which makes one kind of change. pepsi-setup revokes
-- them from PUBLIC below and grants EXECUTE to the httpd and pipeline roles (pepsi-queue and
-- pepsi-failure-bouncer run as the latter) alone (schema::FUNCTION_GRANTS), then verifies
-- that. Who acted (state.held.by, dispatch_error_history's cleared_by) is the calling role
-- (workqueue_caller), not the functions' owner.
--
-- Each takes one row id, locks the row, changes it and returns a JSON object:
-- {"changed": true, ...what changed...} or {"changed": false, "note": "..."} when there was
-- nothing to do. The caller writes the event_log row in the same transaction and notifies
-- the dispatcher after commit (see the contract above). Refusals raise:
--   P0002  the row does not exist
--   55006  the row is running (a worker holds it) and p_force is false
--   55000  the action does not apply to the row (held, null sender, moved meanwhile)
--
-- A HOLD is status 'paused' with timeout = workqueue_hold_until() (a far-future time that
-- every timestamp decoder can represent, unlike 'infinity') and state.held set. The
-- dispatcher needs no knowledge of it: a paused row is requeued only once its timeout has
-- passed. workqueue_resume leaves held rows alone; workqueue_release lifts the hold.

-- The timeout of a held row: far enough never to come, finite so that chrono, sqlx and the
-- dispatcher's interval arithmetic (infinity - now() raises before PostgreSQL 17) all cope.
CREATE OR REPLACE FUNCTION pepsi.workqueue_hold_until()
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT timestamptz '9999-12-31 00:00:00+00'
$$;

-- The role that called an operator action: the SET ROLE in force, else the session's role
-- (current_user is the owner inside a SECURITY DEFINER function).
CREATE OR REPLACE FUNCTION pepsi.workqueue_caller()
RETURNS text LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT COALESCE(NULLIF(current_setting('role'), 'none'), session_user::text)
$$;

-- Row p_id, locked for an operator action; raises when it is missing, or running and not
-- forced.
CREATE OR REPLACE FUNCTION pepsi.workqueue_admin_row(p_id bigint, p_force boolean)
RETURNS pepsi.workqueue LANGUAGE plpgsql AS $$
DECLARE
    r pepsi.workqueue;
BEGIN
    SELECT * INTO r FROM pepsi.workqueue WHERE workqueue_id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'workqueue row % does not exist', p_id USING ERRCODE = 'P0002';
    END IF;
    IF r.status = 'running' AND NOT COALESCE(p_force, false) THEN
        RAISE EXCEPTION 'workqueue row % is running at stage %: a worker holds it', p_id, r.stage
            USING ERRCODE = '55006';
    END IF;
    RETURN r;
END
$$;

-- Whether p_reason (of a hold or a bounce) is NULL or at most 1000 characters.
CREATE OR REPLACE FUNCTION pepsi.workqueue_reason_ok(p_reason text)
RETURNS boolean LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT p_reason IS NULL OR char_length(p_reason) <= 1000
$$;

-- Retry: the row becomes pending now at its stage. A paused row is simply due now; a failed
-- or timed-out row's state.dispatch_error moves to the end of state.dispatch_error_history.
CREATE OR REPLACE FUNCTION pepsi.workqueue_retry(p_id bigint, p_force boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    r pepsi.workqueue := pepsi.workqueue_admin_row(p_id, p_force);
BEGIN
    IF r.status = 'pending' THEN
        RETURN jsonb_build_object('changed', false,
            'note', format('row %s is already pending at stage %s', p_id, r.stage));
    END IF;
    IF r.status = 'paused' AND r.state ? 'held' THEN
        RAISE EXCEPTION 'workqueue row % is held: release it instead', p_id USING ERRCODE = '55000';
    END IF;
    UPDATE pepsi.workqueue SET
        status = 'pending',
        timeout = NULL,
        state = CASE WHEN state ? 'dispatch_error' THEN
                    (state - 'dispatch_error') || jsonb_build_object('dispatch_error_history',
                        COALESCE(CASE WHEN jsonb_typeof(state -> 'dispatch_error_history') = 'array'
                                      THEN state -> 'dispatch_error_history' END, '[]'::jsonb)
                        || jsonb_build_array(jsonb_build_object(
                               'error', state -> 'dispatch_error', 'status', r.status,
                               'cleared_at', now(), 'cleared_by', pepsi.workqueue_caller())))
                ELSE state END,
        updated_at = now()
    WHERE workqueue_id = p_id;
    RETURN jsonb_build_object('changed', true, 'stage', r.stage,
        'from_status', r.status, 'to_status', 'pending', 'timeout', r.timeout,
        'dispatch_error', r.state -> 'dispatch_error');
END
$$;
REVOKE ALL ON FUNCTION pepsi.workqueue_retry(bigint, boolean) FROM PUBLIC;

-- Hold: the row is parked (see HOLD above) until workqueue_release. state.held records who,
-- when, why and the status and timeout it had.
CREATE OR REPLACE FUNCTION pepsi.workqueue_hold(
    p_id bigint, p_force boolean DEFAULT false, p_reason text DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    r pepsi.workqueue;
BEGIN
    IF NOT pepsi.workqueue_reason_ok(p_reason) THEN
        RAISE EXCEPTION 'reason: at most 1000 characters' USING ERRCODE = '22023';
    END IF;
    r := pepsi.workqueue_admin_row(p_id, p_force);
    IF r.status = 'paused' AND r.state ? 'held' THEN
        RETURN jsonb_build_object('changed', false, 'note', format('row %s is already held', p_id));
    END IF;
    UPDATE pepsi.workqueue SET
        status = 'paused',
        timeout = pepsi.workqueue_hold_until(),
        state = state || jsonb_build_object('held', jsonb_build_object(
            'at', now(), 'by', pepsi.workqueue_caller(), 'reason', p_reason,
            'status', r.status, 'timeout', r.timeout)),
        updated_at = now()
    WHERE workqueue_id = p_id;
    RETURN jsonb_build_object('changed', true, 'stage', r.stage,
        'from_status', r.status, 'to_status', 'held', 'timeout', r.timeout, 'reason', p_reason);
END
$$;
REVOKE ALL ON FUNCTION pepsi.workqueue_hold(bigint, boolean, text) FROM PUBLIC;

-- Release: a held row becomes pending now at its stage, and state.held goes.
CREATE OR REPLACE FUNCTION pepsi.workqueue_release(p_id bigint)
RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    r pepsi.workqueue := pepsi.workqueue_admin_row(p_id, true);
BEGIN
    IF NOT (r.status = 'paused' AND r.state ? 'held') THEN
        RETURN jsonb_build_object('changed', false,
            'note', format('row %s is not held (it is %s at stage %s)', p_id, r.status, r.stage));
    END IF;
    UPDATE pepsi.workqueue SET
        status = 'pending', timeout = NULL, state = state - 'held', updated_at = now()
    WHERE workqueue_id = p_id;
    RETURN jsonb_build_object('changed', true, 'stage', r.stage,
        'from_status', 'held', 'to_status', 'pending', 'held', r.state -> 'held');
END
$$;
REVOKE ALL ON FUNCTION pepsi.workqueue_release(bigint) FROM PUBLIC;

-- Delete: the row goes (its body with its last row, by the trigger). Returns the envelope,
-- since the row itself is gone afterwards.
CREATE OR REPLACE FUNCTION pepsi.workqueue_delete(p_id bigint, p_force boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    r pepsi.workqueue := pepsi.workqueue_admin_row(p_id, p_force);
BEGIN
    DELETE FROM pepsi.workqueue WHERE workqueue_id = p_id;
    RETURN jsonb_build_object('changed', true, 'stage', r.stage, 'status', r.status,
        'held', r.status = 'paused' AND r.state ? 'held',
        'mail_from', r.mail_from, 'rcpt_to', to_jsonb(r.rcpt_to), 'received_at', r.received_at);
END
$$;
REVOKE ALL ON FUNCTION pepsi.workqueue_delete(bigint, boolean) FROM PUBLIC;

-- Bounce: the row goes pending to p_bounce_stage (the BOUNCE_STAGE of its current stage,
-- which the caller read from the configuration for stage p_stage) with state.bounce set for
-- a permanent failure; the bounce stage builds the DSN to the sender. Refused for the null
-- sender (a bounce is never bounced) and when the row is no longer at p_stage. Which stages
-- exist is the configuration's: p_bounce_stage is checked to be a stage name only.
CREATE OR REPLACE FUNCTION pepsi.workqueue_bounce(
    p_id bigint, p_stage text, p_bounce_stage text, p_reason text, p_force boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    r pepsi.workqueue;
    v_bounce jsonb;
BEGIN
    IF NOT pepsi.stage_name_ok(p_bounce_stage) THEN
        RAISE EXCEPTION 'bounce stage % is not a stage name', quote_nullable(p_bounce_stage)
            USING ERRCODE = '22023';
    END IF;
    IF NOT pepsi.workqueue_reason_ok(p_reason) THEN
        RAISE EXCEPTION 'reason: at most 1000 characters' USING ERRCODE = '22023';
    END IF;
    r := pepsi.workqueue_admin_row(p_id, p_force);
    IF r.stage <> p_stage THEN
        RAISE EXCEPTION 'workqueue row % moved to stage % meanwhile (was %): run the command again',
            p_id, r.stage, p_stage USING ERRCODE = '55000';
    END IF;
    IF r.mail_from = '' THEN
        RAISE EXCEPTION 'workqueue row % has the null sender (it is itself a bounce or a notice): there is nobody to return it to; delete it instead',
            p_id USING ERRCODE = '55000';
    END IF;
    v_bounce := jsonb_build_object('kind', 'permanent', 'diagnostic', p_reason,
        'enhanced_status', '5.0.0', 'stage', r.stage);
    UPDATE pepsi.workqueue SET
        stage = p_bounce_stage,
        status = 'pending',
        timeout = NULL,
        state = (state - 'held') || jsonb_build_object('bounce', v_bounce),
        updated_at = now()
    WHERE workqueue_id = p_id;
    RETURN jsonb_build_object('changed', true, 'from_stage', r.stage, 'from_status', r.status,
        'to_stage', p_bounce_stage, 'to_status', 'pending', 'bounce', v_bounce);
END
$$;
REVOKE ALL ON FUNCTION pepsi.workqueue_bounce(bigint, text, text, text, boolean) FROM PUBLIC;

-- Signatures earlier releases had (a changed signature is a new function beside the old
-- one): dropped, quietly when they are not there.
SET client_min_messages = warning;
DROP FUNCTION IF EXISTS pepsi.dispatch_reset_orphans();
DROP FUNCTION IF EXISTS pepsi.dispatch_reconcile(bigint[], double precision);
DROP FUNCTION IF EXISTS pepsi.dispatch_heartbeat(bigint);
RESET client_min_messages;

-- THE DISPATCHER (pepsi-dispatch, through its claim module)
--
-- The dispatcher's queue writes: the claim (its only forward-progress write, pending ->
-- running, of which it is the sole writer), and its repairs: paused rows that are due,
-- orphans at start-up, rows handed back, rows ended by force. Each is one statement and one
-- round trip, whatever the number of stages or rows. None notifies: the dispatcher is the
-- listener, and it claims again on its own after each of them.

-- One claim for every stage with spare capacity. The stage arrays run in parallel: for stage
-- p_stages[i], p_fifo[i] oldest rows, then p_fair[i] rows ranked by the sender's lead
-- (p_lead_* run in parallel too; a sender absent from them leads by 0) where a sender's k-th
-- row ranks at lead + (k-1) * p_cost[i], walking at most p_max_senders distinct senders by
-- skip-scan. Returns the claimed rows (with an id), then every (stage, sender) seen waiting
-- (id NULL), so the dispatcher's accounting learns of senders it has not served yet.
--
-- PL/pgSQL rather than SQL: the query's plan is cached per session like a prepared
-- statement's (a non-inlined SQL function is planned on every call before PostgreSQL 18).
-- The generic plan is forced: under plan_cache_mode = auto the planner keeps choosing a
-- custom plan for this query, and planning it costs about three times running it (1.1 ms
-- against 0.35 ms a claim, measured with pg_stat_statements; the dispatcher claims after
-- nearly every status line). Every access path is an index probe per stage either way.
--
-- The claimed rows carry this session's epoch; a fenced epoch may claim nothing.
CREATE OR REPLACE FUNCTION pepsi.dispatch_claim(
    p_stages text[], p_fifo integer[], p_fair integer[], p_cost double precision[],
    p_lead_stages text[], p_lead_senders text[], p_leads double precision[],
    p_max_senders bigint)
RETURNS TABLE (workqueue_id bigint, stage text, sender_key text) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_id_stages text[];
    v_stages text[];
    v_senders text[];
    v_epoch bigint := pepsi.session_epoch();
BEGIN
    PERFORM pepsi.dispatch_refuse_fenced();
    -- First the choice, into arrays; then the update, one statement of its own. Joined with
    -- the choice in one statement, the generic plan's guess of how many rows were chosen
    -- (the queue's size) turned the update into a hash join over a scan of the whole queue
    -- once the table had statistics; over unnest(v_ids) it probes the primary key per row.
    WITH want AS (
        SELECT * FROM unnest(p_stages, p_fifo, p_fair, p_cost) AS w(stage, n_fifo, n_fair, cost)
    ),
    lead AS (
        SELECT * FROM unnest(p_lead_stages, p_lead_senders, p_leads) AS l(stage, sender_key, lead)
    ),
    fifo AS (
        SELECT w.stage, c.workqueue_id FROM want w CROSS JOIN LATERAL (
            SELECT q.workqueue_id FROM pepsi.workqueue q
            WHERE q.stage = w.stage AND q.status = 'pending'
            ORDER BY q.workqueue_id LIMIT w.n_fifo) c
    ),
    senders AS (
        SELECT w.stage, s.sender_key FROM want w CROSS JOIN LATERAL (
            WITH RECURSIVE k(sender_key) AS (
                (SELECT q.sender_key FROM pepsi.workqueue q
                 WHERE q.stage = w.stage AND q.status = 'pending' ORDER BY q.sender_key LIMIT 1)
                UNION ALL
                SELECT (SELECT q.sender_key FROM pepsi.workqueue q
                        WHERE q.stage = w.stage AND q.status = 'pending' AND q.sender_key > k.sender_key
                        ORDER BY q.sender_key LIMIT 1)
                FROM k WHERE k.sender_key IS NOT NULL
            )
            SELECT k.sender_key FROM k WHERE k.sender_key IS NOT NULL LIMIT p_max_senders
        ) s
        WHERE w.n_fair > 0
    ),
    cand AS (
        SELECT s.stage, c.workqueue_id, COALESCE(l.lead, 0) + (c.rn - 1) * w.cost AS vkey
        FROM senders s
        JOIN want w ON w.stage = s.stage
        LEFT JOIN lead l ON l.stage = s.stage AND l.sender_key = s.sender_key
        CROSS JOIN LATERAL (
            SELECT q.workqueue_id, row_number() OVER (ORDER BY q.workqueue_id) AS rn
            FROM pepsi.workqueue q
            WHERE q.stage = s.stage AND q.sender_key = s.sender_key AND q.status = 'pending'
            ORDER BY q.workqueue_id LIMIT w.n_fair + w.n_fifo) c
    ),
    fair AS (
        SELECT x.stage, x.workqueue_id FROM (
            SELECT c.stage, c.workqueue_id,
                   row_number() OVER (PARTITION BY c.stage ORDER BY c.vkey, c.workqueue_id) AS r
            FROM cand c WHERE c.workqueue_id NOT IN (SELECT f.workqueue_id FROM fifo f)
        ) x JOIN want w ON w.stage = x.stage
        WHERE x.r <= w.n_fair
    ),
    chosen AS (
        SELECT f.stage, f.workqueue_id FROM fifo f UNION SELECT f.stage, f.workqueue_id FROM fair f
    )
    SELECT ARRAY(SELECT c.workqueue_id FROM chosen c ORDER BY c.workqueue_id),
           ARRAY(SELECT c.stage FROM chosen c ORDER BY c.workqueue_id),
           ARRAY(SELECT s.stage FROM senders s),
           ARRAY(SELECT s.sender_key FROM senders s)
    INTO v_ids, v_id_stages, v_stages, v_senders;

    -- Rows another dispatcher (MODE shared) is claiming at this moment are skipped, not
    -- waited for; one that claimed them since this choice was made is seen by the re-check
    -- of the status and stage under the row lock. Each stage where a chosen row was lost this way
    -- comes back once more with no id and no sender: more may be pending there.
    RETURN QUERY
    -- The stage is checked again too: another dispatcher may have claimed, run and advanced
    -- a chosen row since, leaving it pending at its next stage.
    WITH free AS (
        SELECT f.workqueue_id FROM pepsi.workqueue f
        WHERE f.workqueue_id = ANY (v_ids) AND f.status = 'pending'
          AND f.stage = v_id_stages[array_position(v_ids, f.workqueue_id)]
        FOR UPDATE SKIP LOCKED
    ),
    claimed AS (
        UPDATE pepsi.workqueue q SET status = 'running', updated_at = now(), claim_epoch = v_epoch
        FROM free p
        WHERE q.workqueue_id = p.workqueue_id
        RETURNING q.workqueue_id, q.stage, q.sender_key
    )
    SELECT c.workqueue_id, c.stage, c.sender_key FROM claimed c
    UNION ALL
    SELECT NULL::bigint, w.stage, w.sender_key FROM unnest(v_stages, v_senders) AS w(stage, sender_key)
    UNION ALL
    SELECT DISTINCT NULL::bigint, x.stage, NULL::text
    FROM unnest(v_ids, v_id_stages) AS x(id, stage)
    WHERE x.id NOT IN (SELECT c.workqueue_id FROM claimed c);
END
$$;

-- Paused rows whose timeout has passed become pending; returns how many.
CREATE OR REPLACE FUNCTION pepsi.dispatch_requeue_due()
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    UPDATE pepsi.workqueue SET status = 'pending', timeout = NULL, updated_at = now()
    WHERE status = 'paused' AND timeout <= now();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Seconds until the earliest paused row is due (negative when one is overdue; NULL when
-- nothing is paused). Held rows (workqueue_hold_until) count like any other and simply never
-- come due. A timeout of 'infinity' written by hand is skipped: infinity - now() raises
-- before PostgreSQL 17 and would blind the dispatcher to every other paused row.
CREATE OR REPLACE FUNCTION pepsi.dispatch_next_due()
RETURNS double precision LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT extract(epoch FROM min(timeout) - now())::double precision
            FROM pepsi.workqueue WHERE status = 'paused' AND isfinite(timeout));
END
$$;

-- At start-up, before any worker runs: rows left running by dispatchers known to be gone
-- (p_gone: the epochs of dispatchers on this host whose process no longer exists, so
-- neither do their workers) or claimed with no epoch become pending again, and those
-- dispatchers are marked stopped; returns how many rows. Rows of an earlier dispatcher that
-- may still live (another host, a stopped process) wait for dispatch_reconcile.
CREATE OR REPLACE FUNCTION pepsi.dispatch_take_over(p_gone bigint[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    PERFORM pepsi.dispatch_refuse_fenced();
    UPDATE pepsi.dispatcher SET fenced_at = COALESCE(fenced_at, now()), stopped_at = now()
    WHERE epoch = ANY (p_gone) AND stopped_at IS NULL;
    UPDATE pepsi.workqueue SET status = 'pending', updated_at = now()
    WHERE status = 'running' AND (claim_epoch IS NULL OR claim_epoch = ANY (p_gone));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Raises when this session's epoch has been fenced: a dispatcher that was taken over from
-- does no more repairs.
CREATE OR REPLACE FUNCTION pepsi.dispatch_refuse_fenced()
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint := pepsi.session_epoch();
BEGIN
    IF v_epoch IS NOT NULL AND pepsi.epoch_fenced(v_epoch) THEN
        RAISE EXCEPTION 'dispatcher epoch % has been fenced: another dispatcher took over', v_epoch
            USING ERRCODE = '55000';
    END IF;
END
$$;

-- The advisory lock key of epoch p_epoch's membership (class 1885696116): the epoch folded
-- into 31 bits.
CREATE OR REPLACE FUNCTION pepsi.epoch_lock_key(p_epoch bigint)
RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_epoch & 2147483647)::integer
$$;

-- While the dispatcher runs, on every heartbeat, running rows become pending again when
-- none of its workers holds them (p_held) and either
--  * they are its own (or carry no epoch) and unchanged for p_grace_secs seconds: a
--    hand-back or failure report the dispatcher could not write, a claim whose reply was
--    lost across a PostgreSQL restart; or
--  * an earlier, fenced or stopped, dispatcher claimed them and p_fenced_secs seconds (the
--    longest MAX_RUNTIME plus TAKEOVER_MARGIN) have passed since the later of their last
--    change and that fence: a worker of that dispatcher starts no pass on such a row after
--    the fence (the row loads as not running), so by then it has ended any pass it began or
--    killed itself (its own MAX_RUNTIME watch), and the message runs once more at most for a
--    pass that never committed. Fenced dispatchers with no running row left are then marked
--    stopped.
-- Returns how many rows.
CREATE OR REPLACE FUNCTION pepsi.dispatch_reconcile(
    p_held bigint[], p_grace_secs double precision, p_fenced_secs double precision)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    PERFORM pepsi.dispatch_refuse_fenced();
    UPDATE pepsi.workqueue q SET status = 'pending', updated_at = now()
    WHERE q.status = 'running' AND q.workqueue_id <> ALL (p_held)
      AND ((COALESCE(pepsi.claim_held(q.claim_epoch), false)
            AND q.updated_at < now() - make_interval(secs => p_grace_secs))
        OR (q.claim_epoch IS DISTINCT FROM pepsi.session_epoch()
            AND EXISTS (SELECT 1 FROM pepsi.dispatcher d WHERE d.epoch = q.claim_epoch
                        AND (d.fenced_at IS NOT NULL OR d.stopped_at IS NOT NULL)
                        AND GREATEST(q.updated_at, d.fenced_at, d.stopped_at)
                            < now() - make_interval(secs => p_fenced_secs))));
    GET DIAGNOSTICS n = ROW_COUNT;
    IF p_fenced_secs IS NOT NULL THEN
        UPDATE pepsi.dispatcher d SET stopped_at = now()
        WHERE d.fenced_at IS NOT NULL AND d.stopped_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM pepsi.workqueue q
                          WHERE q.status = 'running' AND q.claim_epoch = d.epoch);
    END IF;
    RETURN n;
END
$$;

-- A dispatcher registers: a new epoch, recorded with where it runs, and a session-level
-- advisory lock (class 1885696116, the epoch) taken on the calling session, whose presence
-- tells the others it lives. MODE single (called while holding the dispatcher lock): every
-- earlier epoch not yet fenced is fenced now. MODE shared: nothing is fenced; the leader
-- fences members whose session is gone (dispatch_fence_lost). Returns the new epoch.
CREATE OR REPLACE FUNCTION pepsi.dispatch_register(
    p_host text, p_boot_id text, p_pid integer, p_proc_start bigint, p_mode text DEFAULT 'single')
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
BEGIN
    INSERT INTO pepsi.dispatcher (host, boot_id, pid, proc_start, mode)
    VALUES (p_host, p_boot_id, p_pid, p_proc_start, p_mode)
    RETURNING epoch INTO v_epoch;
    PERFORM pg_advisory_lock(1885696116, pepsi.epoch_lock_key(v_epoch));
    IF p_mode = 'single' THEN
        UPDATE pepsi.dispatcher SET fenced_at = now()
        WHERE epoch < v_epoch AND fenced_at IS NULL;
    END IF;
    RETURN v_epoch;
END
$$;

-- The heartbeat of epoch p_epoch on its own session: members 0 once it has been fenced,
-- else how many dispatchers of its mode are live (1 in MODE single), and rank, how many of
-- those registered before it.
CREATE OR REPLACE FUNCTION pepsi.dispatch_heartbeat(p_epoch bigint, OUT members integer, OUT rank integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_mode text;
BEGIN
    members := 0;
    rank := 0;
    UPDATE pepsi.dispatcher SET seen_at = now() WHERE epoch = p_epoch AND fenced_at IS NULL
    RETURNING mode INTO v_mode;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_mode = 'single' THEN
        members := 1;
        RETURN;
    END IF;
    SELECT count(*), count(*) FILTER (WHERE d.epoch < p_epoch) INTO members, rank
    FROM pepsi.dispatcher d
    WHERE d.mode = 'shared' AND d.fenced_at IS NULL AND d.stopped_at IS NULL;
END
$$;

-- MODE shared, on the leader's heartbeat: members whose session is gone (their advisory
-- lock of dispatch_register is held by nobody: the process died, or the server ended its
-- session after LOCK_SESSION_TIMEOUT without a heartbeat) are fenced; returns them, with
-- where they ran, so the leader can tell which are known dead.
CREATE OR REPLACE FUNCTION pepsi.dispatch_fence_lost()
RETURNS TABLE (epoch bigint, boot_id text, pid integer, proc_start bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE pepsi.dispatcher d SET fenced_at = now()
    WHERE d.fenced_at IS NULL AND d.stopped_at IS NULL AND d.mode = 'shared'
      AND NOT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 1885696116::oid
          AND l.objid = pepsi.epoch_lock_key(d.epoch)::oid AND l.objsubid = 2
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
    RETURNING d.epoch, d.boot_id, d.pid, d.proc_start;
END
$$;

-- Epoch p_epoch stopped cleanly: its workers are gone and its rows handed back.
CREATE OR REPLACE FUNCTION pepsi.dispatch_stopped(p_epoch bigint)
RETURNS void LANGUAGE sql AS $$
    UPDATE pepsi.dispatcher SET stopped_at = now() WHERE epoch = p_epoch AND stopped_at IS NULL
$$;

-- Rows handed back untouched (never started by a worker, or held by one that stopped)
-- become pending again, as long as they are still running (at p_stage unless it is NULL);
-- returns how many.
CREATE OR REPLACE FUNCTION pepsi.dispatch_hand_back(p_ids bigint[], p_stage text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    UPDATE pepsi.workqueue SET status = 'pending', updated_at = now()
    WHERE workqueue_id = ANY (p_ids) AND (p_stage IS NULL OR stage = p_stage) AND status = 'running'
      AND pepsi.claim_held(claim_epoch);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Rows a worker could not conclude, still running (at p_stage unless it is NULL: a fused
-- pass moves its row's stage as it goes), end as p_status: 'failed' (a
-- crash, an error), 'timeout' (no answer within MAX_RUNTIME) or 'paused' for p_retry_secs (a
-- temporary error), with p_reason in state.dispatch_error; returns how many changed.
CREATE OR REPLACE FUNCTION pepsi.dispatch_force(
    p_ids bigint[], p_stage text, p_status pepsi.workqueue_status, p_reason text,
    p_retry_secs double precision DEFAULT 0)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    IF p_status NOT IN ('failed', 'timeout', 'paused') THEN
        RAISE EXCEPTION 'dispatch_force cannot end a row as %: failed, timeout or paused expected', p_status
            USING ERRCODE = '22023';
    END IF;
    UPDATE pepsi.workqueue SET
        status = p_status,
        timeout = CASE WHEN p_status = 'paused' THEN now() + make_interval(secs => GREATEST(p_retry_secs, 0)) END,
        state = state || jsonb_build_object('dispatch_error', p_reason),
        updated_at = now()
    WHERE workqueue_id = ANY (p_ids) AND (p_stage IS NULL OR stage = p_stage) AND status = 'running'
      AND pepsi.claim_held(claim_epoch);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Delete bodies no row references any more and older than p_grace; returns how many.
CREATE OR REPLACE FUNCTION pepsi.workqueue_body_gc(p_grace interval DEFAULT '1 minute')
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pepsi.workqueue_body b
    WHERE b.created_at < now() - p_grace
      AND NOT EXISTS (SELECT 1 FROM pepsi.workqueue w WHERE w.body_id = b.body_id);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Forget clone tokens older than p_age (longer than any message can stay queued).
CREATE OR REPLACE FUNCTION pepsi.clone_token_gc(p_age interval DEFAULT '30 days')
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pepsi.clone_token WHERE created_at < now() - p_age;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Release a body when the last row referencing it is deleted or moved to another body.
CREATE OR REPLACE FUNCTION pepsi.workqueue_release_body()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.body_id = NEW.body_id THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pepsi.workqueue WHERE body_id = OLD.body_id) THEN
        BEGIN
            DELETE FROM pepsi.workqueue_body WHERE body_id = OLD.body_id;
        EXCEPTION WHEN foreign_key_violation THEN
            -- A concurrent transaction committed a new reference meanwhile: the body lives on.
            NULL;
        END;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER workqueue_release_body
    AFTER DELETE OR UPDATE OF body_id ON pepsi.workqueue
    FOR EACH ROW EXECUTE FUNCTION pepsi.workqueue_release_body();

-- Tell every listener that the configuration overlay (or, below, the signing keys) changed.
CREATE OR REPLACE FUNCTION pepsi.config_override_notify()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('config_changed', TG_OP);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER config_override_notify
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pepsi.config_override
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi.config_override_notify();

-- A signing stage loads the keys of pepsi.signing_key once per worker; the same notification
-- makes the dispatcher retire its workers, so the replacements sign with the changed keys.
CREATE OR REPLACE TRIGGER signing_key_notify
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pepsi.signing_key
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi.config_override_notify();

-- THE SETTINGS LAYER AND LOCAL RECIPIENTS
--
-- pepsi.settings rows are keyed by a lower-case address (`alice@example.org`) or a domain
-- key (`@example.org`) that applies to every address of the domain. Lookups go through the
-- two functions below (pepsi_contract::settings and pepsi_contract::local), which lower-case the
-- keys they are given, so a lookup is an index probe on the primary key.

-- Every row whose address is one of p_keys (lower-cased here) and whose name is one of
-- p_names. The caller picks the most specific key per name.
CREATE OR REPLACE FUNCTION pepsi.settings_get(p_keys text[], p_names text[])
RETURNS TABLE (address text, name text, value jsonb) LANGUAGE sql STABLE AS $$
    SELECT s.address, s.name, s.value
    FROM pepsi.settings s
    WHERE s.address = ANY (ARRAY(SELECT lower(k) FROM unnest(p_keys) AS k))
      AND s.name = ANY (p_names)
$$;

-- The addresses among p_addresses (lower-cased here) that are enabled mailboxes.
CREATE OR REPLACE FUNCTION pepsi.mailboxes_among(p_addresses text[])
RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT a.address
    FROM pepsi.mailbox_account a
    WHERE a.address = ANY (ARRAY(SELECT lower(k) FROM unnest(p_addresses) AS k))
      AND a.enabled
$$;

-- What the alias expansion needs to know about a set of addresses, in one round trip: the
-- settings_get rows for (p_keys, p_names), then one row per enabled mailbox among
-- p_mailboxes with name and value NULL.
CREATE OR REPLACE FUNCTION pepsi.recipient_facts(
    p_keys text[], p_names text[], p_mailboxes text[])
RETURNS TABLE (address text, name text, value jsonb) LANGUAGE sql STABLE AS $$
    SELECT s.address, s.name, s.value FROM pepsi.settings_get(p_keys, p_names) s
    UNION ALL
    SELECT m.address, NULL, NULL FROM pepsi.mailboxes_among(p_mailboxes) AS m(address)
$$;

-- THE MX ADDRESS CACHE (pepsi.dns_address)
--
-- pepsi-stage-relay-to-internet keeps the A/AAAA addresses of the MX hosts it resolved,
-- each with its connect health. A host's addresses are listed in the order they should be
-- tried: working ones (the last connect succeeded) first, then untried ones, then failed
-- ones (oldest failure first); within a class IPv6 before IPv4 when p_ipv6 is true, and
-- only IPv4 when it is false; then by address, so the order is stable. Health survives a
-- re-resolution: an address that is still in the DNS keeps its history. `failures` counts
-- consecutive failed connects and is reset by a success.

-- One row of the cache as the stage reads it: the address and its health class.
CREATE OR REPLACE FUNCTION pepsi.dns_address_health(p_success timestamptz, p_failure timestamptz)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_success IS NOT NULL AND (p_failure IS NULL OR p_success >= p_failure) THEN 'working'
        WHEN p_success IS NULL AND p_failure IS NULL THEN 'untried'
        ELSE 'failed'
    END
$$;

-- The unexpired addresses of p_host, in the order to try them.
CREATE OR REPLACE FUNCTION pepsi.dns_address_candidates(p_host text, p_ipv6 boolean)
RETURNS TABLE (address text, health text) LANGUAGE sql STABLE AS $$
    SELECT host(d.address), pepsi.dns_address_health(d.last_success, d.last_failure)
    FROM pepsi.dns_address d
    -- `>=`: an address stored with TTL 0 (expires_at = now() of the storing statement) is
    -- returned by dns_address_store, which runs in that statement, and by nothing later.
    WHERE d.host = lower(p_host) AND d.expires_at >= now()
      AND (p_ipv6 OR family(d.address) = 4)
    ORDER BY array_position(ARRAY['working', 'untried', 'failed'],
                            pepsi.dns_address_health(d.last_success, d.last_failure)),
             d.last_failure NULLS FIRST,
             CASE WHEN p_ipv6 THEN -family(d.address) ELSE family(d.address) END,
             d.address
$$;

-- Records a fresh resolution of p_host: its addresses now are p_addresses, valid for
-- p_ttl seconds; addresses no longer published are forgotten (only IPv4 ones when p_ipv6 is
-- false: AAAA was not asked), the others keep their health. Returns the host's addresses in the order to try them, as
-- dns_address_candidates does.
CREATE OR REPLACE FUNCTION pepsi.dns_address_store(
    p_host text, p_addresses text[], p_ttl integer, p_ipv6 boolean
) RETURNS TABLE (address text, health text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- An IPv4-only resolution says nothing about the host's IPv6 addresses.
    DELETE FROM pepsi.dns_address d
    WHERE d.host = lower(p_host) AND NOT (d.address = ANY (p_addresses::inet[]))
      AND (p_ipv6 OR family(d.address) = 4);
    INSERT INTO pepsi.dns_address AS d (host, address, expires_at)
    SELECT DISTINCT lower(p_host), a::inet, now() + make_interval(secs => greatest(p_ttl, 0))
    FROM unnest(p_addresses) AS a
    ON CONFLICT (host, address) DO UPDATE SET expires_at = EXCLUDED.expires_at;
    RETURN QUERY SELECT c.address, c.health FROM pepsi.dns_address_candidates(p_host, p_ipv6) c;
END
$$;

-- Records the outcome of one connect to p_address of p_host.
CREATE OR REPLACE FUNCTION pepsi.dns_address_report(p_host text, p_address text, p_ok boolean)
RETURNS void LANGUAGE sql AS $$
    UPDATE pepsi.dns_address d SET
        last_success = CASE WHEN p_ok THEN now() ELSE d.last_success END,
        last_failure = CASE WHEN p_ok THEN d.last_failure ELSE now() END,
        failures = CASE WHEN p_ok THEN 0 ELSE d.failures + 1 END
    WHERE d.host = lower(p_host) AND d.address = p_address::inet
$$;

-- Forgets addresses expired for longer than p_age (hosts no longer mailed to); returns how
-- many.
CREATE OR REPLACE FUNCTION pepsi.dns_address_gc(p_age interval DEFAULT '1 day')
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pepsi.dns_address WHERE expires_at < now() - p_age;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- MTA-STS POLICIES AND TLS RESULTS (pepsi.mta_sts_policy, pepsi.tls_report_result)
--
-- pepsi-stage-relay-to-internet keeps each recipient domain's MTA-STS policy until its
-- max_age runs out, and counts its TLS sessions for the daily TLS reports.

-- The cached policy of p_domain while it lasts.
CREATE OR REPLACE FUNCTION pepsi.mta_sts_cached(p_domain text)
RETURNS TABLE (policy_id text, body text, fetched_at timestamptz, expires_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT p.policy_id, p.body, p.fetched_at, p.expires_at
    FROM pepsi.mta_sts_policy p
    WHERE p.domain = lower(p_domain) AND p.expires_at > now()
$$;

-- Records a freshly fetched policy of p_domain (its mode and mx patterns parsed by the
-- caller), good for p_max_age seconds.
CREATE OR REPLACE FUNCTION pepsi.mta_sts_store(
    p_domain text, p_id text, p_mode text, p_mx text[], p_max_age integer, p_body text
) RETURNS void LANGUAGE sql AS $$
    INSERT INTO pepsi.mta_sts_policy AS p
        (domain, policy_id, mode, mx, max_age, body, fetched_at, expires_at)
    VALUES (lower(p_domain), p_id, p_mode, p_mx, p_max_age, p_body, now(),
            now() + make_interval(secs => p_max_age))
    ON CONFLICT (domain) DO UPDATE SET
        policy_id = EXCLUDED.policy_id, mode = EXCLUDED.mode, mx = EXCLUDED.mx,
        max_age = EXCLUDED.max_age, body = EXCLUDED.body, fetched_at = EXCLUDED.fetched_at,
        expires_at = EXCLUDED.expires_at, refresh_error = NULL, refresh_failed_at = NULL
$$;

-- Notes that refreshing the cached policy of p_domain failed (it stays in force).
CREATE OR REPLACE FUNCTION pepsi.mta_sts_refresh_failed(p_domain text, p_error text)
RETURNS void LANGUAGE sql AS $$
    UPDATE pepsi.mta_sts_policy SET refresh_error = left(p_error, 2000),
        refresh_failed_at = now()
    WHERE domain = lower(p_domain)
$$;

-- Counts one TLS session (or policy failure) for today's report to p_domain.
CREATE OR REPLACE FUNCTION pepsi.tls_result_add(
    p_domain text, p_policy_type text, p_policy_string text[], p_mx_host text,
    p_receiving_ip text, p_result_type text, p_detail text
) RETURNS void LANGUAGE sql AS $$
    INSERT INTO pepsi.tls_report_result AS r (day, domain, policy_type, policy_string,
        mx_host, receiving_ip, result_type, sessions, detail)
    VALUES ((now() AT TIME ZONE 'UTC')::date, lower(p_domain), p_policy_type,
            COALESCE(p_policy_string, '{}'), COALESCE(lower(p_mx_host), ''),
            COALESCE(p_receiving_ip, ''), p_result_type, 1, left(COALESCE(p_detail, ''), 1000))
    ON CONFLICT (day, domain, policy_type, policy_string, mx_host, receiving_ip, result_type)
    DO UPDATE SET sessions = r.sessions + 1,
        detail = CASE WHEN EXCLUDED.detail = '' THEN r.detail ELSE EXCLUDED.detail END
$$;

-- Forgets policies expired for longer than p_age; returns how many.
CREATE OR REPLACE FUNCTION pepsi.mta_sts_gc(p_age interval DEFAULT '7 days')
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pepsi.mta_sts_policy WHERE expires_at < now() - p_age;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- LOCAL SUBMISSION (pepsi-sendmail)
--
-- The privilege boundary of the sendmail(1) interface, in the manner of Postfix's postdrop:
-- any local user may run pepsi-sendmail, which connects as the sendmail role
-- ([pepsi-setup] SENDMAIL_ROLE, default pepsi-sendmail). That role holds no privilege on
-- any table or sequence; it may execute this one SECURITY DEFINER function, and nothing else
-- in the schema can serve it (every other function here runs with its caller's rights).
-- pepsi-setup revokes EXECUTE from PUBLIC, grants it to the sendmail role alone and
-- verifies both on every run. It also keeps the sendmail role from every other SECURITY
-- DEFINER function of the schema, so such a function must revoke EXECUTE from PUBLIC (and
-- grant it to the roles meant to call it): one PUBLIC may execute would reach the sendmail
-- role too, and pepsi-setup refuses to finish, naming it.
--
-- So whatever a local user sends over that connection, the most it can do is what this
-- function allows: store one well-formed message at stage init, pending, marked as a local
-- submission. It validates everything it is given, since the caller is untrusted:
--   * the envelope: the sender is '' or an address, 1..1000 recipients, each an address
--     (no spaces, control characters or angle brackets; at most 320 octets);
--   * the message: header block empty or whole CRLF-terminated fields without an empty
--     line; header block plus body at most 100 MiB (the program enforces the configured
--     [pepsi-sendmail] MAX_MESSAGE_SIZE, which is smaller; this is the ceiling a direct
--     caller meets);
--   * p_dsn: RET, ENVID and one NOTIFY/ORCPT entry per recipient, in the shape of
--     state.dsn (docs/state.md);
--   * who: the uid and login name pepsi-sendmail read from the system (a claim: PostgreSQL
--     15 cannot tell the function who connected; from version 16 on, system_user, the
--     identity peer authentication established, is recorded beside it as authn_id);
--   * p_via: 'direct' (pepsi-sendmail reached the database) or 'spool' (the pickup inserted
--     a file of the drop directory; the uid is then the file's owner).
-- The state written is the ingress's shape: state.origin with every field (null where an
-- SMTP session would have had a value) plus origin.local, and state.dsn.
-- With p_token, at most once (pepsi.clone_token): the pickup passes the spool file's name,
-- so a file inserted before a crash and not yet removed is not queued twice; a used token
-- returns NULL and stores nothing. Never notifies (see the contract): the caller wakes the
-- dispatcher after commit.
CREATE OR REPLACE FUNCTION pepsi.sendmail_address_ok(p_address text)
RETURNS boolean LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT p_address IS NOT NULL
       AND octet_length(p_address) BETWEEN 3 AND 320
       AND p_address ~ '^[^[:space:][:cntrl:]<>]+@[^[:space:][:cntrl:]<>@]+$'
$$;

-- Whether p_headers is a header block as the queue keeps it: empty, or whole CRLF-terminated
-- fields without an empty line (the message's headers || CRLF || body split).
CREATE OR REPLACE FUNCTION pepsi.header_block_ok(p_headers bytea)
RETURNS boolean LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT p_headers IS NOT NULL
       AND (octet_length(p_headers) = 0
            OR (substring(p_headers FROM octet_length(p_headers) - 1) = '\x0d0a'::bytea
                AND position('\x0d0a0d0a'::bytea IN p_headers) = 0
                AND substring(p_headers FROM 1 FOR 2) <> '\x0d0a'::bytea))
$$;

CREATE OR REPLACE FUNCTION pepsi.sendmail_submit(
    p_mail_from text, p_rcpt_to text[], p_headers bytea, p_body bytea, p_dsn jsonb,
    p_uid bigint, p_login text, p_via text, p_token text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rcpt text;
    v_dsn jsonb := COALESCE(p_dsn, '{}'::jsonb);
    v_entry jsonb;
    v_entries jsonb := '[]'::jsonb;
    v_notify jsonb;
    v_authn text;
    v_state jsonb;
    v_utf8 boolean;
    i integer;
BEGIN
    IF p_mail_from IS NULL OR (p_mail_from <> '' AND NOT pepsi.sendmail_address_ok(p_mail_from)) THEN
        RAISE EXCEPTION 'sender % is not an address', quote_nullable(p_mail_from) USING ERRCODE = '22023';
    END IF;
    IF p_rcpt_to IS NULL OR cardinality(p_rcpt_to) = 0 THEN
        RAISE EXCEPTION 'no recipients' USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_rcpt_to) > 1000 THEN
        RAISE EXCEPTION '% recipients: at most 1000', cardinality(p_rcpt_to) USING ERRCODE = '22023';
    END IF;
    FOREACH v_rcpt IN ARRAY p_rcpt_to LOOP
        IF NOT pepsi.sendmail_address_ok(v_rcpt) THEN
            RAISE EXCEPTION 'recipient % is not an address', quote_nullable(v_rcpt) USING ERRCODE = '22023';
        END IF;
    END LOOP;
    IF p_headers IS NULL OR p_body IS NULL THEN
        RAISE EXCEPTION 'the message is missing' USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_headers) + octet_length(p_body) > 100 * 1024 * 1024 THEN
        RAISE EXCEPTION 'message of % octets: at most 104857600', octet_length(p_headers) + octet_length(p_body)
            USING ERRCODE = '54000';
    END IF;
    IF NOT pepsi.header_block_ok(p_headers) THEN
        RAISE EXCEPTION 'the header block must be whole CRLF-terminated fields without an empty line'
            USING ERRCODE = '22023';
    END IF;
    IF p_uid IS NULL OR p_uid < 0 OR p_uid > 4294967295 THEN
        RAISE EXCEPTION 'uid % is not a user id', quote_nullable(p_uid) USING ERRCODE = '22023';
    END IF;
    IF p_login IS NOT NULL AND (octet_length(p_login) > 256 OR p_login ~ '[[:cntrl:]]') THEN
        RAISE EXCEPTION 'login name % is not a user name', quote_literal(p_login) USING ERRCODE = '22023';
    END IF;
    IF p_via IS NULL OR p_via NOT IN ('direct', 'spool') THEN
        RAISE EXCEPTION 'via % must be direct or spool', quote_nullable(p_via) USING ERRCODE = '22023';
    END IF;
    IF p_token IS NOT NULL AND (octet_length(p_token) > 256 OR p_token !~ '^sendmail:') THEN
        RAISE EXCEPTION 'token % must be sendmail:<name>', quote_literal(p_token) USING ERRCODE = '22023';
    END IF;
    -- state.dsn, rebuilt from the validated parts only.
    IF jsonb_typeof(v_dsn) <> 'object' THEN
        RAISE EXCEPTION 'dsn must be an object' USING ERRCODE = '22023';
    END IF;
    IF NOT (v_dsn -> 'ret' IS NULL OR v_dsn -> 'ret' = 'null'::jsonb OR v_dsn ->> 'ret' IN ('FULL', 'HDRS')) THEN
        RAISE EXCEPTION 'dsn.ret must be FULL, HDRS or null, not %', v_dsn -> 'ret' USING ERRCODE = '22023';
    END IF;
    IF NOT (v_dsn -> 'envid' IS NULL OR v_dsn -> 'envid' = 'null'::jsonb
            OR (jsonb_typeof(v_dsn -> 'envid') = 'string' AND octet_length(v_dsn ->> 'envid') <= 100
                AND v_dsn ->> 'envid' !~ '[[:cntrl:]]')) THEN
        RAISE EXCEPTION 'dsn.envid must be a string of at most 100 octets' USING ERRCODE = '22023';
    END IF;
    IF v_dsn -> 'rcpt' IS NOT NULL AND v_dsn -> 'rcpt' <> 'null'::jsonb
       AND (jsonb_typeof(v_dsn -> 'rcpt') <> 'array' OR jsonb_array_length(v_dsn -> 'rcpt') <> cardinality(p_rcpt_to)) THEN
        RAISE EXCEPTION 'dsn.rcpt must have one entry per recipient' USING ERRCODE = '22023';
    END IF;
    FOR i IN 0 .. cardinality(p_rcpt_to) - 1 LOOP
        v_entry := COALESCE(v_dsn #> ARRAY['rcpt', i::text], 'null'::jsonb);
        IF v_entry = 'null'::jsonb THEN
            v_entry := '{}'::jsonb;
        END IF;
        v_notify := COALESCE(v_entry -> 'notify', 'null'::jsonb);
        IF jsonb_typeof(v_entry) <> 'object'
           OR NOT (v_notify = 'null'::jsonb
                   OR (jsonb_typeof(v_notify) = 'array' AND jsonb_array_length(v_notify) BETWEEN 1 AND 3
                       AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(v_notify) AS k
                                       WHERE k NOT IN ('"SUCCESS"', '"FAILURE"', '"DELAY"', '"NEVER"'))
                       AND (NOT v_notify ? 'NEVER' OR jsonb_array_length(v_notify) = 1)))
           OR NOT (COALESCE(v_entry -> 'orcpt', 'null'::jsonb) = 'null'::jsonb
                   OR (jsonb_typeof(v_entry -> 'orcpt') = 'string' AND octet_length(v_entry ->> 'orcpt') <= 500
                       AND v_entry ->> 'orcpt' ~ '^[A-Za-z0-9-]+;[^[:cntrl:]]+$')) THEN
            RAISE EXCEPTION 'dsn.rcpt[%] must be {"notify": [SUCCESS|FAILURE|DELAY] or [NEVER] or null, "orcpt": "type;address" or null}', i
                USING ERRCODE = '22023';
        END IF;
        v_entries := v_entries || jsonb_build_array(jsonb_build_object(
            'notify', v_notify, 'orcpt', COALESCE(v_entry -> 'orcpt', 'null'::jsonb)));
    END LOOP;
    IF current_setting('server_version_num')::integer >= 160000 THEN
        EXECUTE 'SELECT system_user' INTO v_authn;
    END IF;
    v_utf8 := p_mail_from ~ '[^\x01-\x7F]'
              OR EXISTS (SELECT 1 FROM unnest(p_rcpt_to) AS r(a) WHERE r.a ~ '[^\x01-\x7F]');
    v_state := jsonb_build_object(
        'origin', jsonb_build_object(
            'client_addr', NULL, 'helo', NULL, 'esmtp', false, 'smtputf8', v_utf8, 'body', NULL,
            'tls', NULL, 'listener', NULL, 'iprev', NULL, 'authserv_id', NULL, 'auth_user', NULL,
            'local', jsonb_build_object('program', 'pepsi-sendmail', 'uid', p_uid,
                                        'user', p_login, 'via', p_via, 'authn_id', v_authn)),
        'dsn', jsonb_build_object(
            'ret', COALESCE(v_dsn -> 'ret', 'null'::jsonb),
            'envid', COALESCE(v_dsn -> 'envid', 'null'::jsonb),
            'rcpt', v_entries));
    IF p_token IS NOT NULL THEN
        INSERT INTO pepsi.clone_token (token) VALUES (p_token) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN pepsi.workqueue_add(p_mail_from, p_rcpt_to, pepsi.strip_decrypt_result(p_headers), p_body,
                               v_state, NULL, NULL);
END
$$;

-- A header block without its X-Pepsi-Decrypted fields (continuation lines included): only
-- pepsi-stage-decrypt writes that field, and a message entering other than through the
-- ingress (which strips it with STRIP_FIELDS) must not carry a forged one to a mailbox on a
-- path without the decrypt stage (security review 2026-12-04 #12). The block is handled as
-- the escape encoding's ASCII text, so any bytes survive unchanged; the loop takes adjacent
-- fields one per round, as each match consumes the line end the next one starts after.
CREATE OR REPLACE FUNCTION pepsi.strip_decrypt_result(p_headers bytea)
RETURNS bytea LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_field constant text := '(^|\n)x-pepsi-decrypted[ \t]*:[^\n]*\n([ \t][^\n]*\n)*';
    v_text text;
BEGIN
    IF p_headers IS NULL THEN
        RETURN NULL;
    END IF;
    v_text := encode(p_headers, 'escape');
    IF v_text !~* v_field THEN
        RETURN p_headers;
    END IF;
    WHILE v_text ~* v_field LOOP
        v_text := regexp_replace(v_text, v_field, '\1', 'gi');
    END LOOP;
    RETURN decode(v_text, 'escape');
END
$$;

-- A new function is executable by PUBLIC until this revoke; pepsi-setup then grants the
-- sendmail role (and no other) EXECUTE, and verifies it.
REVOKE ALL ON FUNCTION pepsi.sendmail_submit(text, text[], bytea, bytea, jsonb, bigint, text, text, text) FROM PUBLIC;

-- THE FAILURE BOUNCER (pepsi-failure-bouncer, through pepsi_admin::queue)
--
-- Rows the dispatcher ended failed (a worker error or crash) or timeout (no answer within
-- MAX_RUNTIME) stay so until someone acts. pepsi-failure-bouncer acts: after GRACE it
-- retries a row, a bounded number of times, and then returns it to its sender through the
-- bounce path pepsi-queue's `bounce` uses (pepsi.workqueue_bounce), drops it when it has
-- the null sender, or, when it cannot be returned (it failed at the bounce stage, or was
-- returned once already), leaves it failed and marks it given up. Its count lives in
-- state.failure_bouncer, written with each step, so it survives restarts and a message
-- whose worker crashes every time (a poison message) is bounced, not retried forever.
--
-- Each step below takes the row id and the stage and status the bouncer saw, locks the
-- row, and acts only when the row is still failed or timed out at that stage (otherwise
-- {"changed": false, "note": …}: someone else acted meanwhile). The caller writes the
-- event_log row in the same transaction and notifies the dispatcher after commit.

-- Failed and timed-out rows unchanged for p_grace_secs, not given up, oldest change first.
CREATE OR REPLACE FUNCTION pepsi.failure_candidates(p_grace_secs double precision, p_limit integer)
RETURNS TABLE (workqueue_id bigint, stage text, status text, mail_from text, state jsonb)
LANGUAGE sql STABLE AS $$
    SELECT w.workqueue_id, w.stage, w.status::text, w.mail_from, w.state
    FROM pepsi.workqueue w
    WHERE w.status IN ('failed', 'timeout')
      AND w.updated_at <= now() - make_interval(secs => GREATEST(p_grace_secs, 0))
      AND NOT COALESCE(w.state #> '{failure_bouncer,given_up}' IS NOT NULL
                       AND w.state #> '{failure_bouncer,given_up}' <> 'null'::jsonb, false)
    ORDER BY w.updated_at, w.workqueue_id
    LIMIT p_limit
$$;

-- Row p_id locked, when it is still p_status at p_stage; NULL otherwise.
CREATE OR REPLACE FUNCTION pepsi.failure_row(p_id bigint, p_stage text, p_status text)
RETURNS pepsi.workqueue LANGUAGE plpgsql AS $$
DECLARE
    r pepsi.workqueue;
BEGIN
    SELECT * INTO r FROM pepsi.workqueue WHERE workqueue_id = p_id FOR UPDATE;
    IF NOT FOUND OR r.stage <> p_stage OR r.status::text <> p_status
       OR r.status NOT IN ('failed', 'timeout') THEN
        RETURN NULL;
    END IF;
    RETURN r;
END
$$;

CREATE OR REPLACE FUNCTION pepsi.failure_moved(p_id bigint, p_stage text, p_status text)
RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_build_object('changed', false,
        'note', format('row %s is no longer %s at stage %s', p_id, p_status, p_stage))
$$;

-- Retry: pending now at its stage (pepsi.workqueue_retry: the dispatch_error goes to the
-- history), with state.failure_bouncer = p_record.
CREATE OR REPLACE FUNCTION pepsi.failure_retry(p_id bigint, p_stage text, p_status text, p_record jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r pepsi.workqueue := pepsi.failure_row(p_id, p_stage, p_status);
    v_report jsonb;
BEGIN
    IF r.workqueue_id IS NULL THEN
        RETURN pepsi.failure_moved(p_id, p_stage, p_status);
    END IF;
    v_report := pepsi.workqueue_retry(p_id, false);
    UPDATE pepsi.workqueue SET state = state || jsonb_build_object('failure_bouncer', p_record)
    WHERE workqueue_id = p_id;
    RETURN v_report;
END
$$;

-- Bounce: through pepsi.workqueue_bounce, to p_bounce_stage with p_reason as the
-- diagnostic, with state.failure_bouncer = p_record.
CREATE OR REPLACE FUNCTION pepsi.failure_bounce(
    p_id bigint, p_stage text, p_status text, p_bounce_stage text, p_reason text, p_record jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r pepsi.workqueue := pepsi.failure_row(p_id, p_stage, p_status);
    v_report jsonb;
BEGIN
    IF r.workqueue_id IS NULL THEN
        RETURN pepsi.failure_moved(p_id, p_stage, p_status);
    END IF;
    v_report := pepsi.workqueue_bounce(p_id, p_stage, p_bounce_stage, p_reason, false);
    UPDATE pepsi.workqueue SET state = state || jsonb_build_object('failure_bouncer', p_record)
    WHERE workqueue_id = p_id;
    RETURN v_report;
END
$$;

-- Drop: a null-sender row is deleted (pepsi.workqueue_delete); a DSN is never sent to <>.
CREATE OR REPLACE FUNCTION pepsi.failure_drop(p_id bigint, p_stage text, p_status text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r pepsi.workqueue := pepsi.failure_row(p_id, p_stage, p_status);
BEGIN
    IF r.workqueue_id IS NULL THEN
        RETURN pepsi.failure_moved(p_id, p_stage, p_status);
    END IF;
    IF r.mail_from <> '' THEN
        RAISE EXCEPTION 'workqueue row % has a sender (%): bounce it, do not drop it', p_id, r.mail_from
            USING ERRCODE = '55000';
    END IF;
    RETURN pepsi.workqueue_delete(p_id, false);
END
$$;

-- Give up: the row stays as it is for an operator, with state.failure_bouncer = p_record
-- (which says given_up), so it is not considered again.
CREATE OR REPLACE FUNCTION pepsi.failure_give_up(p_id bigint, p_stage text, p_status text, p_record jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r pepsi.workqueue := pepsi.failure_row(p_id, p_stage, p_status);
BEGIN
    IF r.workqueue_id IS NULL THEN
        RETURN pepsi.failure_moved(p_id, p_stage, p_status);
    END IF;
    UPDATE pepsi.workqueue SET
        state = state || jsonb_build_object('failure_bouncer', p_record), updated_at = now()
    WHERE workqueue_id = p_id;
    RETURN jsonb_build_object('changed', true, 'stage', r.stage, 'status', r.status,
        'dispatch_error', r.state -> 'dispatch_error');
END
$$;

-- AUTOMATIC REPLIES (pepsi-0009): whether `p_owner` may answer `p_sender` now, for queue row
-- `p_workqueue_id`, at most once per `p_period`. True claims the reply: the row records this
-- answer, so a concurrent claim for the same pair waits for the row and then finds it taken.
-- A claim by the same queue row again (its pass run again after a crash) is granted again.
-- NULL (no row) when the pair was answered within the period for another message. Both
-- addresses compare without letter case.
CREATE OR REPLACE FUNCTION pepsi.autoreply_claim(
    p_owner text, p_sender text, p_workqueue_id bigint, p_period interval)
RETURNS boolean LANGUAGE sql AS $$
    INSERT INTO pepsi.autoreply_sent AS s (owner, sender, sent_at, workqueue_id)
    VALUES (lower(p_owner), lower(p_sender), now(), p_workqueue_id)
    ON CONFLICT (owner, sender) DO UPDATE
        SET sent_at = now(), workqueue_id = EXCLUDED.workqueue_id
        WHERE s.sent_at <= now() - p_period OR s.workqueue_id = EXCLUDED.workqueue_id
    RETURNING true
$$;

-- Forgets replies older than the longest period a setting may ask for (365 days,
-- pepsi_stage_vacation::autoreply::MAX_DAYS): such a row can no longer refuse a claim. The
-- dispatcher's GC calls it; returns how many rows went.
CREATE OR REPLACE FUNCTION pepsi.autoreply_gc(p_age interval DEFAULT '366 days')
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pepsi.autoreply_sent WHERE sent_at < now() - p_age;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- THE MAIL LOG (pepsi.mail_log)
--
-- The stage scaffolding appends one row per final outcome of a message (delivered, bounced,
-- expired, dropped) inside the commit of the pass that decided it (pepsi_contract::stage,
-- `[pepsi] MAIL_LOG`). The table is append-only for every role that processes mail, so the
-- retention the dispatcher enforces goes through this one function, which runs with its
-- owner's rights and can do nothing but delete rows older than the retention it is given
-- (at least one hour). pepsi-setup revokes it from PUBLIC below and grants EXECUTE to the
-- pipeline role alone (schema::FUNCTION_GRANTS), then verifies that.
CREATE OR REPLACE FUNCTION pepsi.mail_log_expire(p_keep interval)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    IF p_keep IS NULL OR p_keep < interval '1 hour' THEN
        RAISE EXCEPTION 'mail log retention % is shorter than one hour', p_keep
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM pepsi.mail_log WHERE at < now() - p_keep;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION pepsi.mail_log_expire(interval) FROM PUBLIC;

-- END-TO-END CRYPTOGRAPHY (pepsi-0013.sql, docs/crypto.md)
--
-- A message that must leave encrypted and lacks a recipient's key is parked by the encrypt
-- stage: paused, with the addresses it waits for in state.keydisc.waiting, and a
-- key_request row per address (crypto_request_key). pepsi-keydisc answers the requests and
-- settles each one; keydisc_release then sends the rows waiting on the address back to
-- their stage, which encrypts or bounces. Like every writer outside the dispatcher's loop,
-- the caller notifies `workqueue` after its transaction commits.

-- Ask for discovery of p_address's key unless a request is in flight or settled recently.
-- Returns the request's status: 'pending' (new or in flight), 'none' (settled without a key
-- and the negative answer still cached) or 'found' (settled with a discovered key that
-- peer_key still holds, valid, within its cache time: the caller reads it again). A negative
-- answer whose cache has run out (or that has none), or a found key since expired or judged
-- unusable, starts a new lookup; keys from other sources (an import, Autocrypt) do not keep
-- a request settled.
CREATE OR REPLACE FUNCTION pepsi.crypto_request_key(p_address text, p_methods text[])
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text;
BEGIN
    INSERT INTO pepsi.key_request (address, methods_asked)
    VALUES (lower(p_address), p_methods)
    ON CONFLICT (address) DO UPDATE SET
        methods_asked = EXCLUDED.methods_asked,
        methods_replied = '{}',
        status = 'pending',
        requested_at = now(),
        attempts = 0,
        next_attempt_at = now(),
        settled_at = NULL,
        negative_until = NULL
    WHERE (pepsi.key_request.status = 'none'
           AND (pepsi.key_request.negative_until IS NULL
                OR pepsi.key_request.negative_until <= now()))
       OR (pepsi.key_request.status = 'found'
           AND NOT EXISTS (SELECT 1 FROM pepsi.peer_key k
                           WHERE k.address = lower(p_address)
                             AND k.source IN ('wkd', 'openpgpkey', 'smimea', 'keyserver')
                             AND k.verdict = 'valid'
                             AND k.cache_until > now()));
    SELECT status INTO st FROM pepsi.key_request WHERE address = lower(p_address);
    RETURN st;
END
$$;

-- Send the rows parked at their stage for p_address's key back to that stage. Returns how
-- many. A row that parks after this ran is not missed for long: the stage parks for at most
-- DISCOVERY_RECHECK before it looks again.
CREATE OR REPLACE FUNCTION pepsi.keydisc_release(p_address text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    UPDATE pepsi.workqueue SET status = 'pending', timeout = NULL, updated_at = now()
    WHERE status = 'paused'
      AND (state -> 'keydisc' -> 'waiting') ? lower(p_address)
      AND stage = state -> 'keydisc' ->> 'stage'
      AND NOT state ? 'held';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- ---------------------------------------------------------------------------------------
-- MAILING LISTS (pepsi-0016.sql, docs/lists.md)
-- ---------------------------------------------------------------------------------------

-- Tell the list stage's workers (pepsi_contract::list_directory) that the set of lists may
-- have changed: they keep every list's address in memory and read them again on this.
CREATE OR REPLACE FUNCTION pepsi.mailing_list_notify()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('list_changed', TG_OP);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER mailing_list_notify
    AFTER INSERT OR UPDATE OF address OR DELETE OR TRUNCATE ON pepsi.mailing_list
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi.mailing_list_notify();

-- Fans one list message out: a new queue row for each of the list's people with role
-- p_role (members: those whose delivery is enabled), at p_stage, each with one recipient and
-- all sharing one new body row and the header block p_headers. The envelope sender is each
-- person's VERP address (`<list>+bounces-<local>=<domain>@<list domain>`, what
-- pepsi_contract::list::verp_address writes) when p_verp and that local part fits in 64
-- octets (RFC 5321; else `<list>-bounces@`), otherwise p_mail_from. Addresses in
-- p_skip get no row. With p_token, at most once: a token used before (pepsi.clone_token)
-- makes nothing and returns -1. Returns the number of rows made. Called from within a stage
-- pass, so it never notifies (see the contract above).
DROP FUNCTION IF EXISTS pepsi.list_fanout(bigint, text, text, bytea, bytea, text, boolean, text[], jsonb);
DROP FUNCTION IF EXISTS pepsi.list_fanout(bigint, text, text, bytea, bytea, text, boolean, text[], jsonb, text);
DROP FUNCTION IF EXISTS pepsi.list_fanout(bigint, text, text, bytea, bytea, text, boolean, text[], jsonb, text, text, text, text);
-- p_mode: only members whose delivery_mode (list_member_preference, 'regular' without a
-- row) is p_mode get a row ('regular' posts; the digests pass 'mime_digest' or
-- 'plain_digest'); people of other roles are not filtered by it.
-- p_member_fields: header fields appended to each member's copy (CRLF lines); p_footer:
-- text appended to each member's own body, which then is one body per member instead of
-- one shared by all. In both, `{token}` becomes the member's one-click unsubscribe token
-- (docs/lists.md: the lower-case hex of the first 16 bytes of sha256(list secret ||
-- int8send(member_id)), the secret made on first use and the token's sha256 stored in
-- list_unsubscribe_token), and in p_footer `{member}` the member: their display name and
-- address when the name is short printable ASCII, else the address. NULL: nothing added.
-- p_only: when not NULL, only the members among these addresses get a row, whatever their
-- delivery mode (a digest's share of a member who changed mode while it was open:
-- pepsi_list_digest::store::send).
CREATE OR REPLACE FUNCTION pepsi.list_fanout(
    p_list_id bigint, p_role text, p_stage text, p_headers bytea, p_body bytea,
    p_mail_from text, p_verp boolean, p_skip text[], p_state jsonb DEFAULT '{}',
    p_token text DEFAULT NULL, p_mode text DEFAULT 'regular',
    p_member_fields text DEFAULT NULL, p_footer text DEFAULT NULL, p_only text[] DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_list text;
    v_body bigint;
    v_secret bytea;
    v_headers bytea := p_headers;
    v_fields text := p_member_fields;
    v_digests boolean;
    n integer;
BEGIN
    IF p_token IS NOT NULL THEN
        INSERT INTO pepsi.clone_token (token) VALUES (p_token) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN -1;
        END IF;
    END IF;
    SELECT address, digests_enabled INTO v_list, v_digests
    FROM pepsi.mailing_list WHERE list_id = p_list_id;
    IF v_list IS NULL THEN
        RAISE EXCEPTION 'no mailing list with id %', p_list_id USING ERRCODE = '22023';
    END IF;
    IF p_role = 'member'
       AND strpos(COALESCE(p_member_fields, '') || COALESCE(p_footer, ''), '{token}') > 0 THEN
        -- Two random UUIDs (pg_strong_random): 244 random bits in 32 bytes.
        INSERT INTO pepsi.list_secret (list_id, secret)
        VALUES (p_list_id, uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()))
        ON CONFLICT (list_id) DO NOTHING;
        SELECT secret INTO v_secret FROM pepsi.list_secret WHERE list_id = p_list_id;
    END IF;
    IF p_footer IS NULL THEN
        INSERT INTO pepsi.workqueue_body (body) VALUES (p_body) RETURNING body_id INTO v_body;
    END IF;
    -- Fields without a token are the same for everyone: joined to the header block once.
    IF strpos(v_fields, '{token}') = 0 THEN
        v_headers := p_headers || convert_to(v_fields, 'UTF8');
        v_fields := NULL;
    END IF;
    WITH m AS MATERIALIZED (
        SELECT m.member_id, m.address,
               CASE WHEN m.display_name ~ '^[ -~]{1,100}$' AND m.display_name !~ '[<>"\\]'
                    THEN m.display_name || ' <' || m.address || '>'
                    ELSE m.address END AS who,
               CASE WHEN v_secret IS NOT NULL
                    THEN encode(substr(sha256(v_secret || int8send(m.member_id)), 1, 16), 'hex')
                    END AS token,
               CASE WHEN p_footer IS NOT NULL
                    THEN nextval(pg_get_serial_sequence('pepsi.workqueue_body', 'body_id'))
                    END AS body_id
        FROM pepsi.list_member m
        LEFT JOIN pepsi.list_member_preference p USING (member_id)
        WHERE m.list_id = p_list_id AND m.role = p_role
          AND (p_role <> 'member' OR m.delivery_status = 'enabled')
          -- A list whose digests are off sends every member each post as it comes.
          AND (p_role <> 'member' OR COALESCE(p.delivery_mode, 'regular') = p_mode
               OR (p_mode = 'regular' AND NOT v_digests) OR p_only IS NOT NULL)
          AND (p_only IS NULL OR m.address = ANY (p_only))
          AND m.address <> ALL (COALESCE(p_skip, '{}'))
    ), tokens AS (
        INSERT INTO pepsi.list_unsubscribe_token (member_id, token_hash)
        SELECT member_id, sha256(convert_to(token, 'UTF8')) FROM m WHERE token IS NOT NULL
        ON CONFLICT DO NOTHING
    ), bodies AS (
        INSERT INTO pepsi.workqueue_body (body_id, body) OVERRIDING SYSTEM VALUE
        SELECT body_id, p_body || convert_to(
                   replace(replace(p_footer, '{token}', COALESCE(token, '')), '{member}', who),
                   'UTF8')
        FROM m WHERE body_id IS NOT NULL
    )
    INSERT INTO pepsi.workqueue (stage, mail_from, rcpt_to, headers, body_id, state)
    SELECT p_stage,
           CASE WHEN p_verp
                     AND octet_length(split_part(v_list, '@', 1) || '+bounces-'
                                      || regexp_replace(m.address, '@([^@]*)$', '=\1')) <= 64
                THEN split_part(v_list, '@', 1) || '+bounces-'
                     || regexp_replace(m.address, '@([^@]*)$', '=\1') || '@'
                     || split_part(v_list, '@', 2)
                WHEN p_verp
                THEN split_part(v_list, '@', 1) || '-bounces@' || split_part(v_list, '@', 2)
                ELSE p_mail_from END,
           ARRAY[m.address],
           CASE WHEN v_fields IS NULL THEN v_headers
                ELSE v_headers || convert_to(
                         replace(v_fields, '{token}', COALESCE(m.token, '')), 'UTF8')
                END,
           COALESCE(m.body_id, v_body), COALESCE(p_state, '{}')
    FROM m
    ORDER BY m.member_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- THE LISTS' OWN MAIL FROM OUTSIDE THE PIPELINE (pepsi-httpd, pepsi-list)
--
-- pepsi-httpd faces the internet, so its role may not write the queue: it holds no INSERT on
-- workqueue, workqueue_body or clone_token, so workqueue_inject (its caller's rights) fails for it.
-- What its list pages and the moderation code it shares with pepsi-list queue goes through
-- these three SECURITY DEFINER functions, each of which can make one kind of row and
-- nothing else. pepsi-setup revokes them from PUBLIC below and grants EXECUTE to the httpd
-- and pipeline roles (pepsi-list runs as the latter) alone (schema::FUNCTION_GRANTS), then
-- verifies that. Like every writer outside the dispatcher's loop, the caller notifies
-- `workqueue` after its transaction commits.

-- Whether p_stage can be a stage's name (pepsi_conf::config::StageName: not empty, no [ or ],
-- no line break, no white space at either end), and at most 200 octets without control
-- characters. Which stages exist is the configuration's, which the database does not see.
CREATE OR REPLACE FUNCTION pepsi.stage_name_ok(p_stage text)
RETURNS boolean LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT p_stage IS NOT NULL
       AND octet_length(p_stage) BETWEEN 1 AND 200
       AND p_stage !~ '[][]'
       AND p_stage !~ '[[:cntrl:]]'
       AND p_stage !~ '^[[:space:]]|[[:space:]]$'
$$;

-- A message of list p_list (its address) to one person: a confirmation request, what became
-- of a request, a member's or moderator's link, a welcome, a bounce warning. The envelope
-- sender must be the list's `<name>-bounces@<domain>` (p_mail_from is checked, not chosen),
-- there is exactly one recipient, the state is empty, the stage is a stage name (the caller
-- passes the list stage's DELIVER_STAGE), the header block is whole fields of at most 64 KiB
-- (any X-Pepsi-Decrypted field dropped, as for local submission) and the message at most
-- 1 MiB. p_token, at most once: only `list-warn:` tokens (pepsi-list maintain's bounce
-- warnings); a used one returns NULL and queues nothing.
CREATE OR REPLACE FUNCTION pepsi.list_queue_mail(
    p_list text, p_stage text, p_mail_from text, p_rcpt_to text[], p_headers bytea,
    p_body bytea, p_token text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    v_list text;
    v_bounces text;
BEGIN
    SELECT address INTO v_list FROM pepsi.mailing_list WHERE address = lower(p_list);
    IF v_list IS NULL THEN
        RAISE EXCEPTION 'there is no list %', quote_nullable(p_list) USING ERRCODE = '22023';
    END IF;
    v_bounces := split_part(v_list, '@', 1) || '-bounces@' || split_part(v_list, '@', 2);
    IF p_mail_from IS DISTINCT FROM v_bounces THEN
        RAISE EXCEPTION 'sender % is not %: the mail of list % is sent from its -bounces address',
            quote_nullable(p_mail_from), v_bounces, v_list USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_rcpt_to), 0) <> 1 THEN
        RAISE EXCEPTION '% recipients: the mail of list % goes to exactly one',
            coalesce(cardinality(p_rcpt_to), 0), v_list USING ERRCODE = '22023';
    END IF;
    IF NOT pepsi.sendmail_address_ok(p_rcpt_to[1]) THEN
        RAISE EXCEPTION 'recipient % is not an address', quote_nullable(p_rcpt_to[1])
            USING ERRCODE = '22023';
    END IF;
    IF NOT pepsi.stage_name_ok(p_stage) THEN
        RAISE EXCEPTION 'stage % is not a stage name', quote_nullable(p_stage)
            USING ERRCODE = '22023';
    END IF;
    IF p_body IS NULL OR NOT pepsi.header_block_ok(p_headers) THEN
        RAISE EXCEPTION 'the header block must be whole CRLF-terminated fields without an empty line, and a body must follow'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_headers) > 65536 OR octet_length(p_headers) + octet_length(p_body) > 1048576 THEN
        RAISE EXCEPTION 'message of % octets (% in the header block): at most 1048576 (65536)',
            octet_length(p_headers) + octet_length(p_body), octet_length(p_headers)
            USING ERRCODE = '54000';
    END IF;
    IF p_token IS NOT NULL AND (octet_length(p_token) > 400 OR p_token !~ '^list-warn:[^[:cntrl:]]+$') THEN
        RAISE EXCEPTION 'token % must be list-warn:<...> of at most 400 octets', quote_literal(p_token)
            USING ERRCODE = '22023';
    END IF;
    RETURN pepsi.workqueue_inject(p_stage, v_bounces, ARRAY[p_rcpt_to[1]],
                                  pepsi.strip_decrypt_result(p_headers), p_body, '{}', p_token);
END
$$;
REVOKE ALL ON FUNCTION pepsi.list_queue_mail(text, text, text, text[], bytea, bytea, text) FROM PUBLIC;

-- Whether p_who can name a moderator in state.list_approval (list_moderation_decision's
-- moderator): one line of 1 to 320 octets.
CREATE OR REPLACE FUNCTION pepsi.list_moderator_ok(p_who text)
RETURNS boolean LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT p_who IS NOT NULL AND octet_length(p_who) BETWEEN 1 AND 320 AND p_who !~ '[[:cntrl:]]'
$$;

-- A held post (pepsi.list_held_message) a moderator approved, queued again as it was held:
-- its envelope sender, the list's address as the one recipient, its header block and body,
-- at p_stage (the list stage), with state.list_approval (docs/state.md) naming the list, the
-- held post and p_moderator, and the token `list-approve:<held_id>`: at most once, a second
-- call returns NULL and queues nothing. The held row stays; the caller deletes it with its
-- decision. An unknown p_held_id is refused.
CREATE OR REPLACE FUNCTION pepsi.list_held_approve(p_held_id bigint, p_stage text, p_moderator text)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    h record;
BEGIN
    IF NOT pepsi.stage_name_ok(p_stage) THEN
        RAISE EXCEPTION 'stage % is not a stage name', quote_nullable(p_stage)
            USING ERRCODE = '22023';
    END IF;
    IF NOT pepsi.list_moderator_ok(p_moderator) THEN
        RAISE EXCEPTION 'moderator % must be one line of 1 to 320 octets', quote_nullable(p_moderator)
            USING ERRCODE = '22023';
    END IF;
    SELECT m.held_id, m.mail_from, m.headers, m.body, l.list_id, l.address AS list INTO h
    FROM pepsi.list_held_message m JOIN pepsi.mailing_list l USING (list_id)
    WHERE m.held_id = p_held_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no held post %', quote_nullable(p_held_id) USING ERRCODE = '22023';
    END IF;
    RETURN pepsi.workqueue_inject(p_stage, h.mail_from, ARRAY[h.list], h.headers, h.body,
        jsonb_build_object('list_approval', jsonb_build_object(
            'list', h.list, 'list_id', h.list_id, 'held_id', h.held_id, 'moderator', p_moderator)),
        'list-approve:' || h.held_id);
END
$$;
REVOKE ALL ON FUNCTION pepsi.list_held_approve(bigint, text, text) FROM PUBLIC;

-- A held post a moderator rejected, returned to its sender: queued as it was held at
-- p_stage (the bounce stage), with state.bounce a permanent 5.7.1 failure for the list's
-- address, "rejected by the list's moderator" and p_reason (one line, at most 300
-- characters; '' for none), naming p_list_stage (the list stage) as the stage that routed
-- it, and the token `list-reject:<held_id>`: at most once, a second call returns NULL. The
-- held row stays; an unknown p_held_id is refused.
CREATE OR REPLACE FUNCTION pepsi.list_held_reject(
    p_held_id bigint, p_stage text, p_list_stage text, p_reason text)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    h record;
    v_detail jsonb;
BEGIN
    IF NOT pepsi.stage_name_ok(p_stage) OR NOT pepsi.stage_name_ok(p_list_stage) THEN
        RAISE EXCEPTION 'stage % or % is not a stage name', quote_nullable(p_stage), quote_nullable(p_list_stage)
            USING ERRCODE = '22023';
    END IF;
    IF p_reason IS NULL OR char_length(p_reason) > 300 OR p_reason ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'reason % must be one line of at most 300 characters', quote_nullable(p_reason)
            USING ERRCODE = '22023';
    END IF;
    SELECT m.held_id, m.mail_from, m.headers, m.body, l.address AS list INTO h
    FROM pepsi.list_held_message m JOIN pepsi.mailing_list l USING (list_id)
    WHERE m.held_id = p_held_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no held post %', quote_nullable(p_held_id) USING ERRCODE = '22023';
    END IF;
    v_detail := jsonb_build_object(
        'diagnostic', 'rejected by the list''s moderator'
                      || CASE WHEN p_reason = '' THEN '' ELSE ': ' || p_reason END,
        'enhanced_status', '5.7.1');
    RETURN pepsi.workqueue_inject(p_stage, h.mail_from, ARRAY[h.list], h.headers, h.body,
        jsonb_build_object('bounce', jsonb_build_object('kind', 'permanent', 'stage', p_list_stage)
                                     || v_detail
                                     || jsonb_build_object('recipients', jsonb_build_object(h.list, v_detail))),
        'list-reject:' || h.held_id);
END
$$;
REVOKE ALL ON FUNCTION pepsi.list_held_reject(bigint, text, text, text) FROM PUBLIC;

-- THE SECURE-LINK PORTAL'S MAIL
--
-- The mail pepsi-httpd's secure-link portal sends (docs/secure-link.md, "The portal"), for
-- the link p_link_id, each only between the link's two parties and only with what proves
-- the portal's reason to send it, in the caller's transaction:
--   code    a one-time code to the link's recipient, from the null sender; a code for the
--           message must have been recorded in this transaction (store::send_code).
--   notice  a new link to the recipient, from the link's sender; the message must have been
--           re-sealed in this transaction (store::resend, which logs `resent`).
--   reply   the recipient's answer to the link's sender, from the recipient; the link must
--           be usable and p_session_hash the digest of an open session of its generation.
-- A code and a notice carry state.secure_link = {"made": "notice"} (docs/state.md), as the
-- stage's own notices do, so that no stage secures them again or holds them to required
-- encryption. The stage is a stage name (the secure-link stage's NOTICE_STAGE for code and
-- notice, its RECEIPT_STAGE for a reply), the header block whole fields of at most 64 KiB (any
-- X-Pepsi-Decrypted field dropped) and the message at most 1 MiB.
CREATE OR REPLACE FUNCTION pepsi.secure_link_queue_mail(
    p_link_id text, p_kind text, p_stage text, p_headers bytea, p_body bytea,
    p_session_hash bytea DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    m record;
BEGIN
    SELECT message_id, sender, recipient, generation,
           revoked_at IS NULL AND purged_at IS NULL AND expires_at > now() AS usable
      INTO m FROM pepsi.secure_link_message WHERE link_id = p_link_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'there is no secure link %', quote_nullable(p_link_id) USING ERRCODE = '22023';
    END IF;
    IF NOT pepsi.stage_name_ok(p_stage) THEN
        RAISE EXCEPTION 'stage % is not a stage name', quote_nullable(p_stage) USING ERRCODE = '22023';
    END IF;
    IF p_body IS NULL OR NOT pepsi.header_block_ok(p_headers) THEN
        RAISE EXCEPTION 'the header block must be whole CRLF-terminated fields without an empty line, and a body must follow'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_headers) > 65536 OR octet_length(p_headers) + octet_length(p_body) > 1048576 THEN
        RAISE EXCEPTION 'message of % octets (% in the header block): at most 1048576 (65536)',
            octet_length(p_headers) + octet_length(p_body), octet_length(p_headers)
            USING ERRCODE = '54000';
    END IF;
    IF p_kind = 'code' THEN
        IF NOT EXISTS (SELECT 1 FROM pepsi.secure_link_code
                        WHERE message_id = m.message_id AND created_at = now()) THEN
            RAISE EXCEPTION 'no code was recorded for secure link % in this transaction', p_link_id
                USING ERRCODE = '55000';
        END IF;
        RETURN pepsi.workqueue_inject(p_stage, '', ARRAY[m.recipient],
                                      pepsi.strip_decrypt_result(p_headers), p_body,
                                      '{"secure_link": {"made": "notice"}}');
    ELSIF p_kind = 'notice' THEN
        IF NOT EXISTS (SELECT 1 FROM pepsi.secure_link_access
                        WHERE message_id = m.message_id AND event = 'resent' AND at = now()) THEN
            RAISE EXCEPTION 'secure link % was not sent anew in this transaction', p_link_id
                USING ERRCODE = '55000';
        END IF;
        RETURN pepsi.workqueue_inject(p_stage, m.sender, ARRAY[m.recipient],
                                      pepsi.strip_decrypt_result(p_headers), p_body,
                                      '{"secure_link": {"made": "notice"}}');
    ELSIF p_kind = 'reply' THEN
        IF NOT m.usable THEN
            RAISE EXCEPTION 'secure link % is expired, revoked or purged', p_link_id
                USING ERRCODE = '55000';
        END IF;
        IF p_session_hash IS NULL OR NOT EXISTS (
               SELECT 1 FROM pepsi.secure_link_session
                WHERE message_id = m.message_id AND token_hash = p_session_hash
                  AND generation = m.generation AND expires_at > now()) THEN
            RAISE EXCEPTION 'no open session of secure link %', p_link_id USING ERRCODE = '55000';
        END IF;
        RETURN pepsi.workqueue_inject(p_stage, m.recipient, ARRAY[m.sender],
                                      pepsi.strip_decrypt_result(p_headers), p_body);
    END IF;
    RAISE EXCEPTION 'kind % is not code, notice or reply', quote_nullable(p_kind) USING ERRCODE = '22023';
END
$$;
REVOKE ALL ON FUNCTION pepsi.secure_link_queue_mail(text, text, text, bytea, bytea, bytea) FROM PUBLIC;

-- THE ARCHIVE'S LOCK
--
-- The writes of one list's archive (pepsi_archive::store: archiving a post, purging) are
-- serialised by a transaction-scoped advisory lock on the list. pepsi-httpd purges for the
-- admin API (docs/archive.md, "The admin API"), but its role may not call the advisory lock
-- functions (schema::ADVISORY_LOCK_ROLES: with them it could hold the dispatcher's key): it
-- takes this one key through this function, only for a list that exists and only until its
-- transaction ends. pepsi-setup revokes it from PUBLIC and grants EXECUTE to the pipeline
-- and httpd roles alone (schema::FUNCTION_GRANTS).
CREATE OR REPLACE FUNCTION pepsi.archive_lock(p_list_id bigint)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('pepsi.archive', l.list_id))
       FROM pepsi.mailing_list l WHERE l.list_id = p_list_id;
END
$$;
REVOKE ALL ON FUNCTION pepsi.archive_lock(bigint) FROM PUBLIC;

-- Fresh planner statistics of the archive after a bulk change (an import, a reindex): until
-- autovacuum gets to it, the planner takes a list that just grew by 100,000 posts for a
-- few hundred and searches it by date instead of through the search index (735 ms instead of
-- 11 ms a search, docs/perf.md). ANALYZE needs the tables' owner, hence SECURITY DEFINER;
-- it reads and writes statistics only. EXECUTE for the pipeline role alone
-- (schema::FUNCTION_GRANTS), which runs pepsi-archive.
CREATE OR REPLACE FUNCTION pepsi.archive_analyze()
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    ANALYZE pepsi.archive_message;
    ANALYZE pepsi.archive_thread;
END
$$;
REVOKE ALL ON FUNCTION pepsi.archive_analyze() FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- THE SECRETARY'S DECISIONS (docs/secretary.md)
--
-- Mail the secretary holds waits as a queue row paused at the secretary stage, with
-- state.secretary and a secretary_held row. A decision marks the held rows and makes their
-- queue rows pending again at once: the stage, passing them again, reads the decision
-- (released: on to NEXT_STAGE; discarded: gone). A row that is running at that moment keeps
-- its pause, and the stage reads the decision at its next pass (RECHECK at the latest).
-- pepsi-httpd may not write the queue, so the decisions are these SECURITY DEFINER
-- functions, each of which makes one kind of change only; setup revokes them from PUBLIC
-- and grants EXECUTE to the httpd and pipeline roles alone (schema::FUNCTION_GRANTS).

-- Wakes the paused queue rows of the secretary_held rows p_held_ids. Internal.
CREATE OR REPLACE FUNCTION pepsi.secretary_wake(p_held_ids bigint[])
RETURNS integer LANGUAGE sql AS $$
    WITH w AS (
        UPDATE pepsi.workqueue q SET status = 'pending', timeout = NULL, updated_at = now()
          FROM pepsi.secretary_held h
         WHERE h.held_id = ANY(p_held_ids) AND q.workqueue_id = h.queue_id
           AND q.status = 'paused' AND q.state ? 'secretary' AND NOT q.state ? 'held'
        RETURNING 1)
    SELECT count(*)::integer FROM w
$$;
REVOKE ALL ON FUNCTION pepsi.secretary_wake(bigint[]) FROM PUBLIC;

-- A sender confirmed, by the challenge's link (p_how 'link'), a reply to it ('reply') or a
-- paid postage order ('postage'): the challenge is marked, the sender joins the mailbox's
-- whitelist (origin confirmed, or paid), and every message the secretary holds from that
-- sender for that mailbox on which the sender would have been asked is released (reason
-- challenged or limited: their domain vouched for them). Mail held as unauthenticated or
-- automated may have been forged in the sender's name: it stays for the owner to decide. Only an unexpired, unconfirmed challenge confirms;
-- the answer says what was found. p_token_hash is sha256 of the challenge's token.
CREATE OR REPLACE FUNCTION pepsi.secretary_confirm(p_token_hash bytea, p_how text)
RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    c pepsi.secretary_challenge;
    v_ids bigint[];
    v_woken integer;
BEGIN
    IF p_how IS NULL OR p_how NOT IN ('link', 'reply', 'postage') THEN
        RAISE EXCEPTION 'confirmation by % is not one of link, reply, postage',
            quote_nullable(p_how) USING ERRCODE = '22023';
    END IF;
    SELECT * INTO c FROM pepsi.secretary_challenge WHERE token_hash = p_token_hash FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('found', false, 'changed', false);
    END IF;
    IF c.confirmed_at IS NOT NULL OR c.expires_at <= now() THEN
        RETURN jsonb_build_object('found', true, 'changed', false,
            'mailbox', c.mailbox, 'sender', c.sender,
            'confirmed_by', c.confirmed_by, 'expired', c.expires_at <= now());
    END IF;
    UPDATE pepsi.secretary_challenge SET confirmed_at = now(), confirmed_by = p_how,
           paid_at = CASE WHEN p_how = 'postage' THEN now() END
     WHERE challenge_id = c.challenge_id;
    INSERT INTO pepsi.whitelist (mailbox, sender, origin)
    VALUES (c.mailbox, c.sender, CASE WHEN p_how = 'postage' THEN 'paid' ELSE 'confirmed' END)
    ON CONFLICT (mailbox, sender) DO UPDATE SET seen_at = now();
    WITH r AS (
        UPDATE pepsi.secretary_held SET status = 'released', decided_at = now(), decided_by = p_how
         WHERE mailbox = c.mailbox AND sender = c.sender AND status = 'held'
           AND reason IN ('challenged', 'limited')
        RETURNING held_id)
    SELECT COALESCE(array_agg(held_id), '{}') INTO v_ids FROM r;
    v_woken := pepsi.secretary_wake(v_ids);
    RETURN jsonb_build_object('found', true, 'changed', true,
        'mailbox', c.mailbox, 'sender', c.sender, 'confirmed_by', p_how,
        'released', cardinality(v_ids), 'woken', v_woken);
END
$$;
REVOKE ALL ON FUNCTION pepsi.secretary_confirm(bytea, text) FROM PUBLIC;

-- The owner's decision on one held message: 'released' (delivered, the sender is not
-- whitelisted) or 'discarded' (dropped without a word to the sender). p_mailbox, when not
-- NULL, must be the held message's mailbox: a caller acting for one owner cannot decide
-- another's mail. p_by says who decided (owner:<login>, or the operator's role).
CREATE OR REPLACE FUNCTION pepsi.secretary_decide(
    p_held_id bigint, p_mailbox text, p_decision text, p_by text)
RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    h pepsi.secretary_held;
    v_woken integer;
BEGIN
    IF p_decision IS NULL OR p_decision NOT IN ('released', 'discarded') THEN
        RAISE EXCEPTION 'decision % is not one of released, discarded',
            quote_nullable(p_decision) USING ERRCODE = '22023';
    END IF;
    IF p_by IS NULL OR octet_length(p_by) NOT BETWEEN 1 AND 400 THEN
        RAISE EXCEPTION 'who decided: 1 to 400 bytes' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO h FROM pepsi.secretary_held WHERE held_id = p_held_id FOR UPDATE;
    IF NOT FOUND OR (p_mailbox IS NOT NULL AND h.mailbox <> lower(p_mailbox)) THEN
        RAISE EXCEPTION 'no held message % for %', p_held_id, COALESCE(p_mailbox, 'any mailbox')
            USING ERRCODE = 'P0002';
    END IF;
    IF h.status <> 'held' THEN
        RETURN jsonb_build_object('changed', false, 'held_id', h.held_id,
            'status', h.status, 'mailbox', h.mailbox, 'sender', h.sender);
    END IF;
    UPDATE pepsi.secretary_held SET status = p_decision, decided_at = now(), decided_by = p_by
     WHERE held_id = h.held_id;
    v_woken := pepsi.secretary_wake(ARRAY[h.held_id]);
    RETURN jsonb_build_object('changed', true, 'held_id', h.held_id, 'status', p_decision,
        'mailbox', h.mailbox, 'sender', h.sender, 'woken', v_woken);
END
$$;
REVOKE ALL ON FUNCTION pepsi.secretary_decide(bigint, text, text, text) FROM PUBLIC;

-- THE ONLINE SETUP'S TASKS
--
-- A pepsi.setup_task row is a request to a program running as root (`pepsi-setup apply`),
-- so nothing in it is taken from its writer but the kind and the parameters: the trigger
-- sets written_by from current_user (a fact about the connection, which the applier checks
-- against the configuration role) and starts every row pending, unattempted and without an
-- outcome, whatever the INSERT said.
CREATE OR REPLACE FUNCTION pepsi.setup_task_stamp()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.written_by := current_user;
    NEW.created_at := now();
    NEW.status := 'pending';
    NEW.attempts := 0;
    NEW.started_at := NULL;
    NEW.finished_at := NULL;
    NEW.outcome := '';
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER setup_task_stamp
    BEFORE INSERT ON pepsi.setup_task
    FOR EACH ROW EXECUTE FUNCTION pepsi.setup_task_stamp();

-- Wakes a following applier once per statement that added tasks.
CREATE OR REPLACE FUNCTION pepsi.setup_task_notify()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('setup_task', '');
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER setup_task_notify
    AFTER INSERT ON pepsi.setup_task
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi.setup_task_notify();
