-- pepsi-0014.sql: dispatchers that take over from one another (docs/ha.md).
--
-- Every dispatcher that starts dispatching registers here and is given an epoch, a number
-- that grows with every registration. The claim stamps the row with the claiming
-- dispatcher's epoch (workqueue.claim_epoch), and every write a worker or the dispatcher
-- makes to a running row requires the row's epoch to be the writer's own and not fenced
-- (pepsi.claim_held in procedures.sql). A dispatcher taking over fences every earlier one:
-- from then on nothing the old one or its workers send can change a row.

CREATE TABLE pepsi.dispatcher (
    epoch       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Where it runs: the host name, the kernel's boot id (/proc/sys/kernel/random/boot_id),
    -- the process id and its start time in clock ticks since boot (/proc/PID/stat), so a
    -- successor on the same host can tell a dead dispatcher from a live one whose pid was
    -- not reused.
    host        text NOT NULL,
    boot_id     text NOT NULL,
    pid         integer NOT NULL,
    proc_start  bigint NOT NULL,
    -- single: the one active dispatcher (a takeover fences every other); shared: one of
    -- several, each on its own host, claiming disjoint rows (MODE in [pepsi-dispatch]).
    mode        text NOT NULL DEFAULT 'single' CHECK (mode IN ('single', 'shared')),
    started_at  timestamptz NOT NULL DEFAULT now(),
    -- Its last heartbeat on the lock session.
    seen_at     timestamptz NOT NULL DEFAULT now(),
    -- Set by the dispatcher that took over: this one may change no row any more.
    fenced_at   timestamptz,
    -- Set by the dispatcher itself when it stopped cleanly, its workers gone.
    stopped_at  timestamptz
);

-- Rows claimed before this patch carry no epoch; procedures.sql treats them as claimed by
-- whichever dispatcher runs (the one-dispatcher rule of earlier releases).
ALTER TABLE pepsi.workqueue ADD COLUMN claim_epoch bigint;
