-- pepsi-0005.sql: local submission (pepsi-sendmail) and the failure bouncer.
--
-- Neither needs a table of its own. Local submission goes through one SECURITY DEFINER
-- function, pepsi.sendmail_submit (procedures.sql), which the sendmail role alone may
-- execute; that role is created and its privileges (none on any table) verified by
-- pepsi-setup, like the other roles, because its name is configurable
-- ([pepsi-setup] SENDMAIL_ROLE). The failure bouncer keeps its count in
-- state.failure_bouncer.
--
-- What this patch adds is the failure bouncer's way to its rows: it looks, every INTERVAL,
-- for failed and timed-out rows unchanged for GRACE, oldest change first. Such rows are
-- few, so a partial index keeps that look from scanning the queue.
CREATE INDEX workqueue_failed_idx ON pepsi.workqueue (updated_at)
    WHERE status IN ('failed', 'timeout');
