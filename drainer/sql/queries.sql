-- Every statement drainer sends, by name. Loaded once by drainer/db/statements.py.
--
-- {jobs}, {archive}, {control} and {migrations} are identifiers composed with
-- psycopg.sql.Identifier ({{ and }} stand for a literal brace); %(name)s are parameters.
--
-- `-- name: x` heads a statement, QUERIES["x"]. `-- fragment: x` heads a piece of one that
-- several statements share, written once: a statement (or another fragment) inserts it
-- with @x. A fragment may have holes, declared in its header, `-- fragment: x(a, b)`, and
-- written $a and $b in its text; @x(a => text, b => text) fills every hole, each with the
-- text given (commas inside parentheses or quotes do not split). The loader composes the
-- statements when it reads this file and refuses an unknown fragment, one never used, one
-- that includes itself, and holes that do not match the header.
--
-- Statements that act on a claimed job are fenced on (id, status = 'running', fence): a
-- worker can only change a job it still owns, and the row count tells it whether it did.
-- fence grows by one at every claim and nothing resets it, so a token never matches a later
-- owner of the job.

-- name: schema_version
-- The latest migration applied to the jobs table (raises if the bookkeeping table is missing).
SELECT max(version) AS version FROM {migrations} WHERE table_name = %(table)s;

-- fragment: claim_next(queue, limit)
-- The jobs a claim takes: up to $limit due queued jobs of $queue, in priority then run_at
-- order, locked (others' locks skipped), as the CTE `next`. An index scan on the claim
-- index under LockRows and Limit: it touches only due queued rows and stops after the
-- batch. A materialized CTE is read back in the order it was written, which is the ORDER
-- BY's: claim_update takes "the first start_now rows" as a LIMIT over it (no window
-- function, no second sort).
--
-- The queue and the LIMIT are InitPlans, (SELECT $queue) and (SELECT $limit): no plan sees
-- their values, so the custom plan (planned with the values at every execution) is the
-- generic one, and a prepared claim keeps the generic plan after its first executions
-- instead of being planned again each time. With plain parameters the custom plan looked
-- cheaper (the generic one guesses LIMIT $n at 10% of the rows, and the queue's share of
-- the table from its number of distinct values), and the claim was planned at every
-- execution: measured under pgbench -M prepared (bench/capacity.py, LIMIT 10, one client),
-- its planning was 0.18 ms of its 0.72 ms.
next AS (
  SELECT id, suspect FROM {jobs}
  WHERE queue = (SELECT ($queue)::text) AND status = 'queued' AND run_at <= now()
  ORDER BY priority DESC, run_at, id
  LIMIT (SELECT ($limit)::bigint)
  FOR UPDATE SKIP LOCKED
)

-- fragment: claim_walk(queue, limit)
-- claim_next's jobs, found a priority at a time, highest first, for the claim that is
-- likely to come back short: the run's first (claim_first), sent when run_start found the
-- queue due, and most wakes find a few jobs. claim_next's one scan in (priority, run_at)
-- order with run_at <= now() as a filter reads every job of a priority scheduled for later
-- when the batch comes back short; here a recursive walk finds the queue's next priority
-- (one probe of the claim index, pulled only while the batch is short), and each
-- priority's due jobs are one range of it, (queue, priority, run_at <= now()), locked in a
-- LATERAL subquery (a recursive term cannot lock). Measured in instructions
-- (bench/ab_callgrind.py): a claim of 10 that finds 5 jobs beside 100,000 scheduled for
-- later, 57.9M -> 4.4M; but the second probe and the walk's executor nodes cost a full
-- claim 16% more at 10 jobs and 4% at 200, and a local drain of 20,000 ran 4-15% slower
-- with every claim walking, so the drain's own claims (prepared, nearly always full) keep
-- claim_next, and only its last claim of a queue reads the backlog, once a drain. The
-- rows come out in claim_next's order, priority then run_at.
next AS (
  WITH RECURSIVE p(p) AS (
    (SELECT j.priority FROM {jobs} j
     WHERE j.queue = (SELECT ($queue)::text) AND j.status = 'queued'
     ORDER BY j.priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM {jobs} j
            WHERE j.queue = (SELECT ($queue)::text) AND j.status = 'queued'
              AND j.priority < p.p
            ORDER BY j.priority DESC LIMIT 1)
    FROM p WHERE p.p IS NOT NULL
  )
  SELECT n.id, n.suspect FROM p CROSS JOIN LATERAL (
    SELECT id, suspect FROM {jobs}
    WHERE queue = (SELECT ($queue)::text) AND status = 'queued' AND priority = p.p
      AND run_at <= now()
    ORDER BY run_at, id
    LIMIT (SELECT ($limit)::bigint)
    FOR UPDATE SKIP LOCKED) n
  LIMIT (SELECT ($limit)::bigint)
)

-- fragment: claim_update(lease, since)
-- The claim itself, of the rows claim_next locked: each is running, one attempt more, a new
-- fence, leased for $lease seconds from $since (the transaction's now(); a rated claim's
-- window clock, read after the queue's claim lock: the instant its window counts, which a
-- wait for the lock puts after now()), returned with every column a ClaimedRow holds (in
-- its order). `id = ANY(ARRAY(...))` keeps the UPDATE on the primary key in the generic plan
-- too, whose unknown LIMIT would otherwise turn the join into a hash join over a Seq Scan
-- of the table.
--
-- The first start_now rows (in claim order) start at once; the others are claimed ahead
-- of their start. A claim proves no start (a death between its commit and the handler's
-- start leaves no trace), so an expired lease gives the claim's attempt back
-- (reap_expired) and makes the job a suspect, except for a suspect: a suspect (a job whose
-- lease expired before) is only claimed among the first start_now rows (further back it is
-- left queued for a later claim) and its attempt is charged for certain (charged), so that
-- a job that kills its drainer uses up its attempts (max_attempts + 1 runs at most).
UPDATE {jobs} j
SET status       = 'running',
    attempts     = j.attempts + 1,
    fence        = j.fence + 1,
    charged      = j.suspect,
    suspect      = false,
    run_id       = %(run_id)s,
    locked_until = $since + make_interval(secs => $lease)
WHERE j.id = ANY (ARRAY(SELECT id FROM next LIMIT %(start_now)s)
                  || ARRAY(SELECT id FROM next WHERE NOT suspect))
RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.priority, j.run_at,
          j.locked_until, j.fence, j.trace_context

-- name: claim_batch
-- Claim up to batch_size due jobs of one queue and write their lease. Committed at once
-- (lease mode).
WITH @claim_next(queue => %(queue)s, limit => %(batch_size)s)
@claim_update(lease => %(lease)s, since => now());

-- fragment: due_jobs(queue, limit)
-- The due queued jobs of $queue, up to $limit, in the claim index's order: an index scan
-- of the claim index that stops after $limit rows (a probe, with a limit of 1).
SELECT 1 FROM {jobs} j
WHERE j.queue = $queue AND j.status = 'queued' AND j.run_at <= now()
ORDER BY j.priority DESC, j.run_at, j.id
LIMIT $limit

-- fragment: due_in(queue, priority)
-- The due queued jobs of $queue at $priority: one range of the claim index (its run_at
-- order within a priority).
SELECT 1 FROM {jobs} j
WHERE j.queue = $queue AND j.status = 'queued' AND j.priority = $priority
  AND j.run_at <= now()

-- fragment: has_due(queue)
-- Whether $queue has a due queued job, walked on the claim index a priority at a time
-- (highest first, a loose index scan): the first job of each priority in run_at order is
-- due or none of that priority is, so one probe a priority tells, and the walk stops at the
-- first due. The index orders a queue's jobs by priority, then run_at: a scan of the queue
-- in that order with run_at <= now() as a filter reads every job of a priority scheduled
-- for later before it reaches the next priority or the end (measured: 100,000 jobs
-- scheduled for tomorrow made an empty run's statements 84 ms of server time instead of 5).
EXISTS (
  WITH RECURSIVE g(p, due) AS (
    (SELECT j.priority, j.run_at <= now() FROM {jobs} j
     WHERE j.queue = $queue AND j.status = 'queued'
     ORDER BY j.priority DESC, j.run_at LIMIT 1)
    UNION ALL
    SELECT f.priority, f.run_at <= now()
    FROM g CROSS JOIN LATERAL (
      SELECT j.priority, j.run_at FROM {jobs} j
      WHERE j.queue = $queue AND j.status = 'queued' AND j.priority < g.p
      ORDER BY j.priority DESC, j.run_at LIMIT 1) f
    WHERE NOT g.due
  )
  SELECT 1 FROM g WHERE g.due)

-- name: due_queues
-- Which of the given queues have a due queued job, in the given order: a probe of the
-- claim index per queue (has_due), so an empty or nearly empty run asks once
-- instead of sending one empty claim per queue.
SELECT q.queue
FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(queue, n)
WHERE @has_due(queue => q.queue)
ORDER BY q.n;

-- name: queue_claim_lock
-- A queue with max_running or a rate limit, step 1 of its claim transaction: one claimer
-- of the queue at a time, across every drainer (a transaction-level advisory lock, keyed by
-- table and queue, released at COMMIT). The claim that follows is a new statement, so
-- under READ COMMITTED its snapshot sees every claim committed before the lock was ours.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- fragment: running_live(only_if)
-- The CTE `live`: how many jobs of the queue run under a live lease (locked_until > now())
-- now, counted only if $only_if (else 0, nothing read).
live AS (
  SELECT count(*) AS n FROM {jobs}
  WHERE $only_if
    AND queue = %(queue)s AND status = 'running' AND locked_until > now()
)

-- name: claim_batch_capped
-- A queue with max_running, step 2: claim_batch, at most max_running minus the jobs of
-- the queue running under a live lease. Held under queue_claim_lock, so no two claims of
-- the queue count the same free slots.
WITH @running_live(only_if => true),
@claim_next(queue => %(queue)s,
            limit => (SELECT greatest(0, least(%(batch_size)s::bigint,
                                               %(max_running)s::bigint - n))
                      FROM live))
@claim_update(lease => %(lease)s, since => now());

-- name: claim_batch_rated
-- A queue with a rate limit, step 2 of its claim transaction, after queue_claim_lock (the
-- same key as max_running's: one claim of the queue at a time across every drainer):
-- claim_batch, at most rate_count minus the jobs claimed in the last rate_period seconds,
-- and, when max_running is given (NULL: no cap), at most max_running minus the jobs running
-- under a live lease, as claim_batch_capped.
--
-- The window is the queue's control row (rate_at, rate_n: when and how many, oldest first).
-- Its clock is clock_timestamp() here, read once after the lock was ours (a claim that
-- waited for the lock counts from when it got it, not from its transaction's start). The
-- statement writes the window back: the claims still in it and this one, and rate_next_at,
-- when the window is full, the instant enough of its oldest claims leave it to open a slot.
-- Each claim asks for at most the jobs it starts at once (the drainer's free handlers), so
-- a job's handler starts within the claim's round trip of the instant logged.
--
-- One row at least (a LEFT JOIN of the claimed rows onto the window's state): the claimed
-- job's columns (id NULL: nothing claimed), then rate_next_at and rate_limited, the due jobs
-- (counted up to count_limit) the rate left queued for a later slot.
WITH clock AS MATERIALIZED (
  SELECT clock_timestamp() AS t
), win AS (
  SELECT e.at, e.n
  FROM {control} c, clock, unnest(c.rate_at, c.rate_n) AS e(at, n)
  WHERE c.queue = %(queue)s AND e.at > clock.t - make_interval(secs => %(rate_period)s)
), @running_live(only_if => %(max_running)s::bigint IS NOT NULL), room AS (
  SELECT greatest(0, least(%(batch_size)s::bigint,
                           coalesce(%(max_running)s::bigint - (SELECT n FROM live),
                                    %(batch_size)s::bigint))) AS capped,
         greatest(0, %(rate_count)s::bigint - (SELECT coalesce(sum(n), 0) FROM win)) AS rate
), @claim_next(queue => %(queue)s, limit => (SELECT least(capped, rate) FROM room)),
claimed AS (
  @claim_update(lease => %(lease)s, since => (SELECT t FROM clock))
), took AS (
  SELECT count(*) AS n FROM claimed
), due AS (
  -- the statement's snapshot still sees the claimed rows queued: they are in this count
  SELECT count(*) AS n FROM (
    @due_jobs(queue => %(queue)s, limit => %(count_limit)s)) d
), log AS (
  SELECT at, n FROM win
  UNION ALL
  SELECT clock.t, took.n::int FROM clock, took WHERE took.n > 0
), slot AS (
  SELECT min(at) + make_interval(secs => %(rate_period)s) AS at
  FROM (SELECT at, sum(n) OVER (ORDER BY at ROWS UNBOUNDED PRECEDING) AS cum,
               sum(n) OVER () AS total
        FROM log) l
  WHERE total >= %(rate_count)s AND cum >= total - %(rate_count)s + 1
), written AS (
  INSERT INTO {control} (queue, rate_at, rate_n, rate_next_at)
  SELECT %(queue)s,
         coalesce((SELECT array_agg(at ORDER BY at) FROM log), '{{}}'),
         coalesce((SELECT array_agg(n ORDER BY at) FROM log), '{{}}'),
         (SELECT at FROM slot)
  ON CONFLICT (queue) DO UPDATE
  SET rate_at = EXCLUDED.rate_at, rate_n = EXCLUDED.rate_n,
      rate_next_at = EXCLUDED.rate_next_at
  RETURNING rate_next_at
)
SELECT c.*,
       (SELECT rate_next_at FROM written) AS rate_next_at,
       CASE WHEN room.rate < room.capped
            THEN greatest(0, (SELECT n FROM due) - (SELECT n FROM took)) ELSE 0 END
         AS rate_limited
FROM room LEFT JOIN claimed c ON true;

-- fragment: fenced
-- The WHERE of an outcome written to claimed jobs (the rows o(id, fence, ...) of an unnest of
-- the ids and fences): each job still running under the fence its claim returned. The
-- status is compared with (SELECT 'running'), an InitPlan whose value no plan sees (a custom
-- plan replaces a parameter with its value, and a literal is seen by both): a plan that
-- sees 'running' proves the lease index's predicate (WHERE status = 'running') and may walk
-- that index, comparing every running row with every id; with the InitPlan the rows are
-- found by primary key, one probe an id, in the custom plan and the generic one alike.
-- Measured under pgbench -M prepared (bench/capacity.py, LIMIT 10, one client): the
-- completion's custom plan, re-planned at every execution, walked the lease index; with the
-- InitPlan the generic plan is kept and probes the primary key (0.61 -> 0.44 ms).
WHERE j.id = o.id AND j.status = (SELECT 'running'::text) AND j.fence = o.fence

-- fragment: completion
-- Jobs succeeded, fenced: done, each with what its handler returned (NULL for nothing),
-- the ids written returned; an earlier attempt's error ('lease expired', 'cancelled', a
-- traceback) is cleared: it would read as this run's outcome.
UPDATE {jobs} j
SET status = 'done', locked_until = NULL, finished_at = now(), result = o.result,
    last_error = NULL
FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(results)s::jsonb[])
  AS o(id, fence, result)
@fenced
RETURNING j.id

-- fragment: dedup_skip
-- Skip a job whose dedup_key is already queued or running: the dedup index's predicate.
ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('queued', 'running')
DO NOTHING

-- fragment: follow_up_insert
-- The follow-ups of the jobs the CTE `done` returns: the jobs their handlers enqueued with
-- job.enqueue (%(followups)s, a JSON array of objects, each with the id of the job that
-- enqueued it as "parent"), inserted in the statement that completes those jobs and only for
-- the jobs it completed: a job that failed, was cancelled or whose lease was lost (its
-- fenced write matched nothing) adds none. Duplicate dedup keys are skipped as by enqueue.
INSERT INTO {jobs} (queue, payload, run_at, priority, max_attempts, dedup_key)
SELECT f.queue, f.payload, coalesce(f.run_at, now()), f.priority, f.max_attempts,
       f.dedup_key
FROM jsonb_to_recordset(%(followups)s::jsonb)
  AS f(parent bigint, queue text, payload jsonb, run_at timestamptz, priority int,
       max_attempts int, dedup_key text)
WHERE f.parent IN (SELECT id FROM done)
@dedup_skip
RETURNING 1

-- name: complete_many
-- A batch of jobs succeeded: one statement for all of them, with their follow-ups. Returns
-- the ids written. Found by primary key (see fenced): psycopg prepares a statement run
-- often, and a plan that walks the lease index compares every running row with every id
-- (measured under pgbench -M prepared: a claim of 1,000 and its completion at 2,000 jobs/s
-- where the same SQL planned by primary key did 25,000).
WITH done AS (
  @completion
), followed AS (
  @follow_up_insert
)
SELECT id FROM done;

-- name: complete_many_and_claim
-- complete_many and the next claim_batch in one statement: one round trip and one commit
-- per batch instead of two. The jobs completed are 'running', so the claim (of 'queued'
-- rows only) cannot touch them. Returns the completed ids (kind 'done') and the claimed rows
-- (kind 'claimed'); the claim is the same index scan under LockRows and Limit as claim_batch.
-- The follow-ups inserted here are not claimed by it (the same snapshot cannot see them):
-- the drain claims again when some are due.
--
-- The completion runs FIRST (the outer UNION ALL reads `done` before `claimed`): under READ
-- COMMITTED a FOR UPDATE that meets a row claimed and committed since its snapshot locks
-- the row's newest version before its recheck rejects it, and keeps that lock until its
-- transaction ends. If the claim came first, a drainer could hold such a lock on another
-- drainer's running job while its own completion waited on a third: with 8 drainers that
-- cycle was seen as "deadlock detected". Completion first, the only statement that can wait
-- is one that holds no such lock yet, and the claim part (SKIP LOCKED) never waits.
--
-- The completion finds its rows by primary key (see fenced): as a generic plan (the
-- pipelined drain asks for one) a literal 'running' let the planner use the lease index
-- and join every running row with every completed id, which costs running x batch
-- comparisons (measured: 13 ms for a batch of 200 with 400 running).
--
-- The 'done' rows carry a NULL for each column of a claimed row: a column added to
-- claim_update's RETURNING and not here fails the UNION at once.
WITH done AS (
  @completion
), followed AS (
  @follow_up_insert
), @claim_next(queue => %(queue)s, limit => %(batch_size)s),
claimed AS (
  @claim_update(lease => %(lease)s, since => now())
)
SELECT 'done' AS kind, id, NULL AS queue, NULL::jsonb AS payload, NULL::int AS attempts,
       NULL::int AS max_attempts, NULL::int AS priority, NULL::timestamptz AS run_at,
       NULL::timestamptz AS locked_until, NULL::bigint AS fence, NULL::jsonb AS trace_context
FROM done
UNION ALL
SELECT 'claimed', claimed.*
FROM claimed;

-- name: generic_plan_for_this_transaction
-- Sent just before each pipelined complete_many_and_claim, with no Sync between, so that it
-- holds for that statement's implicit transaction only (nothing leaks into the session, which
-- a pooler may hand to another client). PostgreSQL re-plans a prepared statement on every
-- execution while the custom plan looks cheaper than the generic one. The claim's queue and
-- LIMIT are hidden from both plans (claim_next), but the custom plan still sees the
-- completion's arrays (their length is the unnest's row estimate), so with the cost of the
-- batch it may or may not look cheaper; planned at every execution, planning was 0.17 ms of
-- the 0.42 ms the server spent on each execution here. The generic plan is the same index
-- scan that stops after the batch (tests/integration/test_claim_plan.py checks both).
SELECT set_config('plan_cache_mode', 'force_generic_plan', true);

-- name: delete_completed_many
-- Like complete_many, for delete-on-complete: the row goes, no history is kept (nor its
-- result); follow-ups are inserted as in complete_many.
WITH done AS (
  DELETE FROM {jobs} j
  USING unnest(%(ids)s::bigint[], %(fences)s::bigint[]) AS o(id, fence)
  @fenced
  RETURNING j.id
), followed AS (
  @follow_up_insert
)
SELECT id FROM done;

-- name: fail_many
-- Jobs failed: back to queued with run_at = now() + least(cap, base * 2^attempts)
-- (20 s, 40 s, ... with the defaults), or failed for good once attempts >= max_attempts
-- (the row's, or the task's max_attempts when it sets one; 0 fails the job at once: a
-- payload that cannot be decoded, an exception the task discards).
-- base, cap and jitter are per row (the task's retry policy, else the settings): the wait
-- is multiplied by 1 + jitter * random() (jitter 0: exactly the formula).
-- The wait is computed in float8 (2^attempts bounded) and only its least made an interval,
-- so that a large max_attempts or base (the client sends at most ~9,500 years) cannot
-- overflow the interval, and run_at stays under the table's CHECK (9999-01-01).
UPDATE {jobs} j
SET status       = CASE WHEN j.attempts >= coalesce(o.max_attempts, j.max_attempts)
                        THEN 'failed' ELSE 'queued' END,
    run_at       = CASE WHEN j.attempts >= coalesce(o.max_attempts, j.max_attempts)
                        THEN j.run_at
                        ELSE least(now() + make_interval(secs => least(
                                                 o.cap, o.base * 2 ^ least(j.attempts, 40))
                                               * (1 + o.jitter * random())),
                                   '9999-01-01 00:00:00+00'::timestamptz) END,
    locked_until = NULL,
    finished_at  = CASE WHEN j.attempts >= coalesce(o.max_attempts, j.max_attempts)
                        THEN now() END,
    last_error   = o.error,
    charged      = false,
    suspect      = false
FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(errors)s::text[],
            %(max_attempts)s::int[], %(bases)s::float8[], %(caps)s::float8[],
            %(jitters)s::float8[]) AS o(id, fence, error, max_attempts, base, cap, jitter)
@fenced
RETURNING j.id, j.status, j.run_at;

-- name: snooze_many
-- Handlers that raised drainer.Snooze(seconds): back to queued with run_at moved on by
-- each job's seconds (kept under the table's CHECK), and the attempt the claim counted
-- given back, so a snooze uses none. snoozes and snoozed_at keep the history that
-- attempts does not. Fenced like every outcome.
UPDATE {jobs} j
SET status       = 'queued',
    attempts     = greatest(j.attempts - 1, 0),
    run_at       = least(now() + make_interval(secs => o.seconds),
                         '9999-01-01 00:00:00+00'::timestamptz),
    locked_until = NULL,
    charged      = false,
    suspect      = false,
    snoozes      = j.snoozes + 1,
    snoozed_at   = now()
FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(seconds)s::float8[])
  AS o(id, fence, seconds)
@fenced
RETURNING j.id, j.run_at;

-- name: extend_many
-- Heartbeat: push the lease of jobs still running. A job missing from the result is no
-- longer ours (reaped, cancelled or finished elsewhere): its handler is told to stop.
UPDATE {jobs} j
SET locked_until = now() + make_interval(secs => o.lease)
FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(leases)s::float8[])
  AS o(id, fence, lease)
@fenced
RETURNING j.id, j.locked_until;

-- name: release_many
-- Shutdown: claimed jobs that never started go back to queued at once, and the attempt
-- the claim counted is given back.
UPDATE {jobs} j
SET status = 'queued', attempts = j.attempts - 1, locked_until = NULL, charged = false
FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[]) AS o(id, fence)
@fenced
RETURNING j.id;

-- name: lock_running
-- Transaction tasks: lock a job we still own for the handler's transaction (fenced: a job
-- reaped, cancelled or claimed again since is not ours, and is not locked).
SELECT id FROM {jobs}
WHERE id = %(id)s AND status = 'running' AND fence = %(fence)s
FOR UPDATE;

-- fragment: reap_update
-- The reap of the expired leases of the queues in %(queues)s (t.max_attempts: each queue's
-- task's max_attempts, NULL: the row's), up to its WHERE, which a statement may narrow before
-- its RETURNING. A job that was no suspect (charged = false) gets the claim's attempt back:
-- it may never have started. Every reaped job becomes a suspect, claimed next only where it
-- starts at once and is charged, so a job that kills its drainer uses up its attempts
-- wherever it was in its batch. A row locked by a live transaction (a
-- transaction=True task running past its lease) is skipped: its owner is alive and will
-- write its outcome.
UPDATE {jobs} j
SET attempts     = j.attempts - (NOT j.charged)::int,
    status       = CASE WHEN j.attempts - (NOT j.charged)::int
                             >= coalesce(t.max_attempts, j.max_attempts)
                        THEN 'failed' ELSE 'queued' END,
    locked_until = NULL,
    finished_at  = CASE WHEN j.attempts - (NOT j.charged)::int
                             >= coalesce(t.max_attempts, j.max_attempts)
                        THEN now() END,
    last_error   = coalesce(j.last_error, 'lease expired'),
    charged      = false,
    suspect      = true
FROM unnest(%(queues)s::text[], %(max_attempts)s::int[]) AS t(queue, max_attempts)
WHERE j.id = ANY (ARRAY(SELECT id FROM {jobs}
                         WHERE status = 'running' AND locked_until < now()
                           AND queue = ANY (%(queues)s::text[])
                         FOR UPDATE SKIP LOCKED))
  AND j.queue = t.queue

-- name: reap_expired
-- Expired leases (a worker died or stalled) of the given queues go back to queued, or to
-- failed once max_attempts is reached (the task's when it sets one, else the row's), so a
-- job that kills its worker cannot loop forever.
@reap_update
RETURNING j.id, j.status, j.attempts;

-- fragment: unclaimed_occurrence(alias)
-- Whether the jobs row $alias is a recurring occurrence in the served queues (%(queues)s)
-- that was never claimed (fence = 0: the fence counts claims and nothing resets it), on the
-- queued occurrences' index: the only occurrences a sync changes or deletes.
$alias.recurring_key IS NOT NULL AND $alias.status = 'queued' AND $alias.fence = 0
  AND $alias.recurring_hash IS NOT NULL AND $alias.queue = ANY (%(queues)s::text[])

-- fragment: unclaimed_occurrences
-- Those occurrences: id, key, scheduled_for.
SELECT o.id, o.recurring_key AS key, o.scheduled_for FROM {jobs} o
WHERE @unclaimed_occurrence(alias => o)

-- name: run_start
-- The fixed work at the start of a drain in one statement (one round trip): the schema
-- version, reap_expired (only when the version is the one this drainer needs, so an
-- outdated table is not touched), and due_queues. Rows: ('version', version, NULL...),
-- one ('reaped', id, status, attempts, queue) per reaped lease, one ('due', ..., queue)
-- per queue with due jobs, in the given order, one ('paused', ..., queue) per served queue
-- an operator paused (`drainer pause`: the run's one lookup of them), one ('limit', ...) per
-- served queue an operator limited (`drainer limit`), one ('unscheduled', ..., n) when it
-- deleted n future occurrences (%(unschedule)s: the app has no definition left on the served
-- queues, so no recurring_sync follows to delete them). A reaped job put back
-- to queued makes its queue due (the CTE's snapshot does not see the update). A table older
-- than migration 0004 has no control table: the statement fails and the drain asks
-- schema_version alone, which tells it to migrate. Last, one ('start', ...) row: its status
-- is what the run starts with, also set as drainer.start for the rest of this transaction,
-- which the statements sent behind this one before its answer read (one round trip for
-- all): 'idle' when the run has nothing to claim (the version is `latest` and no queue that
-- is not paused is due: finish_run with if_idle does the end of the run, and is a no-op
-- otherwise); 'q:' and the first due queue that is not paused, in the given order, when the
-- version is `latest` (claim_first claims from it); '' else (an outdated table: neither
-- acts). One setting, not two: each new placeholder setting costs a fresh backend a sort
-- of its settings (PG 15), about 0.7M instructions of a 27M first Query.
WITH v AS (
  SELECT max(version) AS version FROM {migrations} WHERE table_name = %(table)s
), reaped AS (
  @reap_update
    AND (SELECT version FROM v) = %(latest)s
  RETURNING j.id, j.status, j.attempts, j.queue
), unscheduled AS (
  -- %(unschedule)s: the app has no recurring definition on the served queues, so no sync
  -- follows; the future occurrences left there are of definitions removed from the code:
  -- gone, as the sync's `gone` removes them (an occurrence already due is a job to run)
  -- (on the rows themselves, with no subquery of the jobs joined: each relation in the
  -- statement is planned, and costs catalog lookups, on a fresh backend)
  DELETE FROM {jobs} j
  WHERE %(unschedule)s AND (SELECT version FROM v) = %(latest)s AND j.scheduled_for > now()
    AND @unclaimed_occurrence(alias => j)
  RETURNING j.id
), paused AS MATERIALIZED (
  SELECT c.queue FROM {control} c WHERE c.paused AND c.queue = ANY (%(queues)s::text[])
), due AS MATERIALIZED (
  SELECT q.queue, q.n
  FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(queue, n)
  WHERE EXISTS (SELECT 1 FROM reaped r WHERE r.queue = q.queue AND r.status = 'queued')
     -- a queue a probe, only when any job is queued at all (one probe, an InitPlan): an
     -- empty wake with 300 served queues cost a fresh backend 1.8M instructions more
     OR ((SELECT EXISTS (SELECT 1 FROM {jobs} WHERE status = 'queued'))
         AND @has_due(queue => q.queue))
)
SELECT 'version' AS kind, version::bigint AS id, NULL::text AS status, NULL::int AS attempts,
       NULL::text AS queue, 0::bigint AS n
FROM v
UNION ALL
SELECT 'reaped', id, status, attempts, queue, 0 FROM reaped
UNION ALL
SELECT 'unscheduled', NULL, NULL, NULL, NULL, count(*) FROM unscheduled
HAVING count(*) > 0
UNION ALL
SELECT 'paused', NULL, NULL, NULL, queue, 0 FROM paused
UNION ALL
-- an operator's limits (`drainer limit`): id = max_running, attempts = rate_count, n =
-- rate_period in microseconds (NULLs: not set)
SELECT 'limit', c.max_running, NULL, c.rate_count, c.queue,
       round(c.rate_period_s * 1000000)::bigint
FROM {control} c
WHERE (c.max_running IS NOT NULL OR c.rate_count IS NOT NULL)
  AND c.queue = ANY (%(queues)s::text[])
UNION ALL
SELECT 'due', NULL, NULL, NULL, queue, n FROM due
UNION ALL
SELECT 'start', NULL,
       set_config('drainer.start',
                  CASE WHEN (SELECT version FROM v) IS DISTINCT FROM %(latest)s THEN ''
                       ELSE coalesce('q:' || (SELECT due.queue FROM due
                                              WHERE due.queue NOT IN (SELECT queue FROM paused)
                                              ORDER BY due.n LIMIT 1), 'idle') END,
                  true),
       NULL, NULL, 0;

-- name: claim_first
-- The run's first claim, sent behind run_start in the same Query (and transaction: it sees
-- what run_start reaped; one round trip for both, and for finish_run behind it). It claims
-- from the queue the drain loop's first claim would: the first of the served queues, in
-- their order, that is not paused and has a due job, as run_start found it
-- (drainer.start, 'q:' and the queue only when the table is at version `latest`, so the
-- version is not read again here); and only when that
-- queue may be claimed this way (`eligible`: not transaction mode, no max_running or rate
-- limit from the task or the settings; no operator limit, read here). Else it claims
-- nothing and the loop makes the run's first claim itself. The claim is claim_batch's (the
-- queue an InitPlan's value), a priority at a time (claim_walk: it is the claim most likely
-- to come back short), leased with that queue's lease.
WITH target AS MATERIALIZED (
  SELECT q.queue, q.lease
  FROM unnest(%(queues)s::text[], %(eligible)s::bool[], %(leases)s::float8[])
    AS q(queue, eligible, lease)
  WHERE 'q:' || q.queue = current_setting('drainer.start', true) AND q.eligible
    AND NOT EXISTS (SELECT 1 FROM {control} c WHERE c.queue = q.queue
                      AND (c.max_running IS NOT NULL OR c.rate_count IS NOT NULL))
  LIMIT 1
), @claim_walk(queue => (SELECT queue FROM target), limit => %(batch_size)s)
@claim_update(lease => (SELECT lease FROM target), since => now());

-- fragment: finished_before(status, older_than)
-- The jobs of status $status finished more than $older_than seconds ago: what the archiver
-- takes and what `drainer purge --dry-run` counts.
status = $status AND finished_at < now() - make_interval(secs => $older_than)

-- fragment: finished_batch(status, older_than, only_if)
-- Up to %(batch_size)s jobs of finished_before (id, status), if $only_if: an archiver's batch.
SELECT id, status FROM {jobs}
WHERE @finished_before(status => $status, older_than => $older_than)
  AND $only_if
LIMIT %(batch_size)s

-- fragment: finished_delete(status, older_than, only_if)
-- Delete the jobs of finished_batch.
DELETE FROM {jobs} j
USING (@finished_batch(status => $status, older_than => $older_than, only_if => $only_if)) doomed
WHERE j.id = doomed.id

-- name: archive_delete
-- Delete up to batch_size finished jobs of one status older than the cutoff.
@finished_delete(status => %(status)s, older_than => %(older_than)s, only_if => true);

-- name: archive_move
-- Move up to batch_size finished jobs of one status older than the cutoff to the archive.
WITH moved AS (
  @finished_delete(status => %(status)s, older_than => %(older_than)s, only_if => true)
  RETURNING j.id, j.queue, j.payload, j.status, j.run_at, j.attempts, j.max_attempts,
            j.locked_until, j.last_error, j.created_at, j.priority, j.dedup_key, j.finished_at,
            j.fence, j.charged, j.suspect, j.result, j.run_id, j.snoozes, j.snoozed_at
)
INSERT INTO {archive} (id, queue, payload, status, run_at, attempts, max_attempts,
                       locked_until, last_error, created_at, priority, dedup_key, finished_at,
                       fence, charged, suspect, result, run_id, snoozes, snoozed_at)
SELECT * FROM moved;

-- fragment: queued_queues(only_if)
-- The CTE `queued_queues` (of a WITH RECURSIVE): the distinct queues of queued jobs, walked
-- on the claim index (one probe a queue, a loose index scan), so the cost does not grow
-- with the jobs queued for later; nothing read unless $only_if.
queued_queues AS (
  (SELECT queue FROM {jobs}
   WHERE $only_if AND status = 'queued' ORDER BY queue LIMIT 1)
  UNION ALL
  SELECT (SELECT j.queue FROM {jobs} j
          WHERE j.status = 'queued' AND j.queue > qq.queue ORDER BY j.queue LIMIT 1)
  FROM queued_queues qq WHERE qq.queue IS NOT NULL
)

-- fragment: queued_groups(walked)
-- The CTEs `queued_groups` and `due_groups` (of a WITH RECURSIVE, after queued_queues), so
-- that jobs scheduled for later are not each read (see has_due). queued_groups: each queue
-- of %(queues)s (ours) and of queued_queues outside %(served)s, with each priority of its
-- queued jobs, highest first (p; a NULL ends a queue's walk), walked on the claim index:
-- one probe a priority. When $walked (queued_queues was walked) and found no queued job,
-- ours are not probed one by one (an empty wake with 300 served queues: 2.4M instructions
-- of a fresh backend for those probes, bench.ab_callgrind wake). due_groups, a row a
-- priority: its due jobs (due: a range of the index, due_in; none counted for a queue of
-- ours whose rate window is full, rate_next_at ahead), and for ours when the next is due
-- (next_at: its first job scheduled for later, one probe; with the window full, its first
-- job, due at the next slot and not before).
queued_groups(queue, ours, p) AS (
  SELECT s.queue, s.ours, (SELECT j.priority FROM {jobs} j
                           WHERE j.queue = s.queue AND j.status = 'queued'
                           ORDER BY j.priority DESC LIMIT 1)
  FROM (SELECT q, true FROM unnest(%(queues)s::text[]) AS q
        WHERE NOT $walked OR EXISTS (SELECT 1 FROM queued_queues WHERE queue IS NOT NULL)
        UNION ALL
        SELECT queue, false FROM queued_queues
        WHERE queue IS NOT NULL AND queue <> ALL(%(served)s::text[])) AS s(queue, ours)
  UNION ALL
  SELECT g.queue, g.ours, (SELECT j.priority FROM {jobs} j
                           WHERE j.queue = g.queue AND j.status = 'queued' AND j.priority < g.p
                           ORDER BY j.priority DESC LIMIT 1)
  FROM queued_groups g WHERE g.p IS NOT NULL
), due_groups AS (
  SELECT g.queue, g.ours, c.rate_next_at,
         (SELECT count(*) FROM (@due_in(queue => g.queue, priority => g.p)) d
          WHERE NOT g.ours OR c.rate_next_at IS NULL) AS due,
         CASE WHEN g.ours THEN
           greatest((SELECT j.run_at FROM {jobs} j
                     WHERE j.queue = g.queue AND j.status = 'queued' AND j.priority = g.p
                       AND j.run_at > CASE WHEN c.rate_next_at IS NULL THEN now()
                                           ELSE '-infinity' END
                     ORDER BY j.run_at LIMIT 1),
                    c.rate_next_at)
         END AS next_at
  FROM queued_groups g
  LEFT JOIN {control} c ON c.queue = g.queue AND c.rate_next_at > now()
  WHERE g.p IS NOT NULL
)

-- fragment: due_summary
-- What is left for the queues in %(queues)s, as `q`, from due_groups (see queued_groups):
-- due now (remaining_due), and the next run_at to come (next_due_at). A job left running
-- (by a run that a cut or a crash ended, or that abandoned it after the grace period) is
-- due when its lease expires, when the reaper puts it back: next_due_at is the earliest of
-- both (one probe of the lease index; a lease expired already is the reaper's at the next
-- run's start, not counted, so that a transaction-mode job running past its lease does not
-- make every run due at once). And, as `u`, the jobs due on the queued_queues outside
-- %(served)s, by queue (unserved_due).
(
  SELECT coalesce(sum(d.due) FILTER (WHERE d.ours), 0)::bigint AS remaining_due,
         least(min(d.next_at),
               (SELECT min(r.locked_until) FROM {jobs} r
                WHERE r.status = 'running' AND r.locked_until > now()
                  AND r.queue = ANY(%(queues)s))) AS next_due_at
  FROM due_groups d
) q
CROSS JOIN (
  SELECT jsonb_object_agg(queue, n) FILTER (WHERE n > 0) AS unserved_due
  FROM (SELECT d.queue, sum(d.due)::bigint AS n FROM due_groups d
        WHERE NOT d.ours GROUP BY d.queue) s
) u

-- name: queue_summary
-- What is left for the given queues after a drain: due now, and the next run_at to come
-- (a rate-limited queue's jobs: not before its next slot, rate_next_at);
-- and, when `served` (every queue with a handler) is given, the jobs due on queues outside
-- it, by queue: nothing will ever claim those (a misspelt queue name, a handler removed).
-- Without `served` (NULL) the last part is a one-time filter that reads nothing.
WITH RECURSIVE @queued_queues(only_if => %(served)s::text[] IS NOT NULL),
               @queued_groups(walked => %(served)s::text[] IS NOT NULL)
SELECT q.remaining_due, q.next_due_at, u.unserved_due
FROM @due_summary;

-- fragment: can_vacuum
-- Whether we may VACUUM the table of pg_class c: as its owner, or with the MAINTAIN
-- privilege of PostgreSQL 17+ (the CASE keeps older servers, which reject the privilege
-- name, from evaluating it).
pg_has_role(current_user, c.relowner, 'USAGE')
OR CASE WHEN current_setting('server_version_num')::int >= 170000
        THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END AS can_vacuum

-- name: table_health
-- Dead tuples and vacuum times of the jobs table, and whether we may VACUUM it.
SELECT s.n_dead_tup, s.n_live_tup, s.last_autovacuum, s.last_vacuum,
       s.n_mod_since_analyze, c.reltuples,
       @can_vacuum
FROM pg_class c
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = %(regclass)s::regclass;

-- name: finish_run
-- The end of a drain in one statement (archive-mode delete): one archive_delete batch of
-- done, one of failed and one of cancelled jobs (counted with the failed ones: the same
-- retention), table_health and queue_summary. The archiver goes on with
-- archive_delete when a batch came back full. unserved_due: as in queue_summary.
-- if_idle: sent right behind run_start (one round trip for both), only when run_start found
-- nothing to claim (drainer.start is 'idle' in that transaction); else it does nothing and
-- returns no row (a one-time filter: nothing read, nothing deleted).
-- if_drained: sent right behind the completions of a drain whose last claim came back
-- short (one round trip for both): only when no job of the drained queues is due now
-- (one probe of the claim index a queue); else nothing, and the drain claims on.
WITH RECURSIVE go AS (
  SELECT (NOT %(if_idle)s OR current_setting('drainer.start', true) = 'idle')
     AND (NOT %(if_drained)s OR NOT EXISTS (
           SELECT 1 FROM unnest(%(queues)s::text[]) AS q(queue)
           WHERE @has_due(queue => q.queue))) AS go
), gone AS (
  -- the three batches (each of batch_size at most) in one DELETE: a DELETE a status cost
  -- 0.1-0.2 ms more of planning on a fresh backend (the session is billed)
  DELETE FROM {jobs} j
  USING (
    (@finished_batch(status => 'done', older_than => %(archive_after)s,
                     only_if => (SELECT go FROM go)))
    UNION ALL
    (@finished_batch(status => 'failed', older_than => %(failed_retention)s,
                     only_if => (SELECT go FROM go)))
    UNION ALL
    (@finished_batch(status => 'cancelled', older_than => %(failed_retention)s,
                     only_if => (SELECT go FROM go)))
  ) doomed
  WHERE j.id = doomed.id
  RETURNING doomed.status
), @queued_queues(only_if => true), @queued_groups(walked => true)
SELECT (SELECT count(*) FROM gone WHERE status = 'done') AS archived_done,
       (SELECT count(*) FROM gone WHERE status <> 'done') AS archived_failed,
       -- table_health's columns, read with the functions pg_stat_user_tables is made of:
       -- the view computes all its columns (measured: 1.5-2.4 ms in a fresh session, the
       -- functions 0.5-1.2 ms; an empty run is this statement and run_start)
       pg_stat_get_dead_tuples(c.oid) AS n_dead_tup,
       pg_stat_get_live_tuples(c.oid) AS n_live_tup,
       pg_stat_get_last_autovacuum_time(c.oid) AS last_autovacuum,
       pg_stat_get_last_vacuum_time(c.oid) AS last_vacuum,
       pg_stat_get_mod_since_analyze(c.oid) AS n_mod_since_analyze, c.reltuples,
       @can_vacuum,
       q.remaining_due, q.next_due_at, u.unserved_due
FROM pg_class c
CROSS JOIN @due_summary
WHERE c.oid = %(regclass)s::regclass AND (SELECT go FROM go);

-- name: vacuum_after_drain
-- The end of a run that left n_dead_tup >= --vacuum-threshold: a compute that suspends soon
-- may never give autovacuum the time, and the next drain would walk the dead entries.
-- ANALYZE too when autovacuum would analyze (rows changed since the last ANALYZE > 50 +
-- 10% of the table): the planner's idea of how many rows are queued or running moves a lot
-- in one drain of a small table.
VACUUM (ANALYZE) {jobs};

-- name: vacuum_after_drain_keep_stats
-- As vacuum_after_drain, without ANALYZE: next to a long history a drain changes few of the
-- rows, and ANALYZE samples 30,000 rows of the whole table (measured: a drain of 20,000
-- jobs next to 1,000,000 done rows spent most of its extra time there).
VACUUM {jobs};

-- name: vacuum_during_drain
-- A plain VACUUM between batches of a long drain: it clears the dead entries that claimed
-- jobs leave at the head of the claim index (each claim walks them until a VACUUM).
-- SKIP_LOCKED: if autovacuum or another drainer is vacuuming, do not wait for it.
VACUUM (SKIP_LOCKED) {jobs};

-- name: enqueue
-- One job. ON CONFLICT skips a job whose dedup_key is already queued or running.
-- trace_context: the producer's W3C trace context, NULL without a current span.
INSERT INTO {jobs} (queue, payload, run_at, priority, max_attempts, dedup_key, trace_context)
VALUES (%(queue)s, %(payload)s, coalesce(%(run_at)s, now()), %(priority)s, %(max_attempts)s,
        %(dedup_key)s, %(trace_context)s)
@dedup_skip
RETURNING id;

-- name: queue_seen
-- `drainer enqueue` without --app: whether the queue has any job, of any status (queued
-- first: the claim index answers that at once). A queue never seen may be a misspelt name.
SELECT EXISTS (SELECT 1 FROM {jobs} WHERE queue = %(queue)s AND status = 'queued')
    OR EXISTS (SELECT 1 FROM {jobs} WHERE queue = %(queue)s) AS seen;

-- name: queues_never_seen
-- `drainer pause` and `drainer limit`, before they write: the queues named that have no job
-- of any status (as queue_seen) and no row of the operator's. A misspelt name?
SELECT q AS queue FROM unnest(%(queues)s::text[]) AS q
WHERE NOT EXISTS (SELECT 1 FROM {jobs} WHERE queue = q AND status = 'queued')
  AND NOT EXISTS (SELECT 1 FROM {jobs} WHERE queue = q)
  AND NOT EXISTS (SELECT 1 FROM {control} c WHERE c.queue = q);

-- name: enqueue_copy
-- Bulk enqueue without dedup keys: COPY straight into the table.
COPY {jobs} (queue, payload, run_at, priority, max_attempts, dedup_key) FROM STDIN;

-- name: enqueue_copy_traced
-- enqueue_copy, with the producer's trace context (the same for every job of the batch).
COPY {jobs} (queue, payload, run_at, priority, max_attempts, dedup_key, trace_context)
FROM STDIN;

-- name: enqueue_copy_now
-- Bulk enqueue of jobs due now without dedup keys: run_at takes its default, now().
COPY {jobs} (queue, payload, priority, max_attempts) FROM STDIN;

-- name: enqueue_stage
-- Bulk enqueue with dedup keys, step 1: a staging table that goes with the transaction.
CREATE TEMP TABLE drainer_enqueue_stage (
  ord bigint, queue text, payload jsonb, run_at timestamptz, priority int,
  max_attempts int, dedup_key text, trace_context jsonb
) ON COMMIT DROP;

-- name: enqueue_stage_copy
-- Bulk enqueue with dedup keys, step 2: COPY into the staging table.
COPY drainer_enqueue_stage (ord, queue, payload, run_at, priority, max_attempts, dedup_key,
                            trace_context)
FROM STDIN;

-- name: enqueue_now
-- Bulk enqueue with run_at left out on some jobs: COPY does not apply column defaults to
-- NULLs, so those jobs take the transaction's now() (what the default would give).
SELECT now();

-- name: enqueue_stage_drop
-- Bulk enqueue with dedup keys, step 4: drop the staging table before the next batch of
-- the same transaction.
DROP TABLE drainer_enqueue_stage;

-- name: enqueue_stage_insert
-- Bulk enqueue with dedup keys, step 3: insert in input order, skipping duplicates (also
-- duplicates within the batch: the first one wins).
INSERT INTO {jobs} (queue, payload, run_at, priority, max_attempts, dedup_key, trace_context)
SELECT queue, payload, coalesce(run_at, now()), priority, max_attempts, dedup_key, trace_context
FROM drainer_enqueue_stage
ORDER BY ord
@dedup_skip;

-- name: status_counts
-- Jobs by queue and status, with the oldest due job, expired leases and next due time.
SELECT queue, status, count(*) AS jobs,
       count(*) FILTER (WHERE status = 'queued' AND run_at <= now()) AS due,
       extract(epoch FROM now() - min(run_at) FILTER (WHERE status = 'queued'
                                                       AND run_at <= now()))
         AS oldest_due_age_s,
       min(run_at) FILTER (WHERE status = 'queued' AND run_at > now()) AS next_due_at,
       count(*) FILTER (WHERE status = 'running' AND locked_until < now()) AS expired_leases
FROM {jobs}
GROUP BY queue, status
ORDER BY queue, status;

-- name: queue_pause
-- `drainer pause QUEUE...`: no drainer claims these queues (from each drainer's next run:
-- a run reads the paused queues once, at its start). Jobs keep arriving.
INSERT INTO {control} (queue, paused, paused_at, updated_at)
SELECT q, true, now(), now() FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (queue) DO UPDATE
SET paused = true, paused_at = now(), updated_at = now()
  WHERE NOT {control}.paused
RETURNING queue;

-- name: queue_resume
-- `drainer resume QUEUE...`: the queues are claimed again (from each drainer's next run).
UPDATE {control} SET paused = false, paused_at = NULL, updated_at = now()
WHERE queue = ANY(%(queues)s) AND paused
RETURNING queue;

-- name: queue_limit
-- `drainer limit QUEUE... --max-running N --rate COUNT/PERIOD`: the operator's limits of
-- these queues, overriding the settings and the tasks, from each drainer's next run (a run
-- reads them once, at its start). NULL leaves a limit as it is; clear_max_running /
-- clear_rate drop the operator's (the setting's or the task's applies again). A changed
-- rate forgets rate_next_at (computed under the old rate); the window's log is kept.
INSERT INTO {control} (queue, max_running, rate_count, rate_period_s, updated_at)
SELECT q, %(max_running)s::int, %(rate_count)s::int, %(rate_period)s::float8, now()
FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (queue) DO UPDATE
SET max_running   = CASE WHEN %(clear_max_running)s THEN NULL
                         ELSE coalesce(EXCLUDED.max_running, {control}.max_running) END,
    rate_count    = CASE WHEN %(clear_rate)s THEN NULL
                         ELSE coalesce(EXCLUDED.rate_count, {control}.rate_count) END,
    rate_period_s = CASE WHEN %(clear_rate)s THEN NULL
                         ELSE coalesce(EXCLUDED.rate_period_s, {control}.rate_period_s) END,
    rate_next_at  = CASE WHEN %(clear_rate)s OR EXCLUDED.rate_count IS NOT NULL THEN NULL
                         ELSE {control}.rate_next_at END,
    updated_at    = now()
RETURNING queue, max_running, rate_count, rate_period_s;

-- name: queue_limits
-- The operator's limits, and the rate windows' next slots, of every queue that has any
-- (`drainer status`, `drainer limit` with no change).
SELECT queue, max_running, rate_count, rate_period_s,
       CASE WHEN rate_next_at > now() THEN rate_next_at END AS rate_next_at,
       updated_at
FROM {control}
WHERE max_running IS NOT NULL OR rate_count IS NOT NULL OR rate_next_at > now()
ORDER BY queue;

-- name: status_table
-- Size and vacuum state of the jobs table, and the sessions that matter for it: other
-- drainer connections now, and the oldest open transaction in this database (it holds
-- back VACUUM of every table, the jobs table first). And the recurring series (a JSON
-- array, in the same statement so status stays four): every recurring_key in the table, its
-- next occurrence (queued or running, the earliest) and its last finished one, both looked
-- up on the (recurring_key, scheduled_for) index, and the schedule the sync wrote on them;
-- the paused queues and the limits.
SELECT pg_total_relation_size(c.oid) AS total_bytes,
       pg_relation_size(c.oid) AS table_bytes,
       pg_indexes_size(c.oid) AS index_bytes,
       s.n_live_tup, s.n_dead_tup, s.last_autovacuum, s.last_vacuum, s.last_autoanalyze,
       s.autovacuum_count, s.vacuum_count,
       (SELECT count(*) FROM pg_stat_activity a
        WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
          AND a.application_name LIKE 'drainer%%') AS drainer_sessions,
       (SELECT extract(epoch FROM now() - min(a.xact_start)) FROM pg_stat_activity a
        WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
          AND a.backend_type = 'client backend') AS oldest_xact_age_s,
       (SELECT coalesce(jsonb_agg(to_jsonb(r) ORDER BY r.key), '[]'::jsonb) FROM (
          SELECT k.key, nxt.queue, nxt.scheduled_for AS next_at, nxt.status AS next_status,
                 last.status AS last_status, last.scheduled_for AS last_scheduled_for,
                 last.finished_at AS last_finished_at, last.last_error,
                 coalesce(nxt.recurring_schedule, last.recurring_schedule) AS schedule
          FROM (SELECT DISTINCT recurring_key AS key FROM {jobs}
                WHERE recurring_key IS NOT NULL) k
          LEFT JOIN LATERAL (
            SELECT queue, scheduled_for, status, recurring_schedule FROM {jobs}
            WHERE recurring_key = k.key AND status IN ('queued', 'running')
            ORDER BY scheduled_for LIMIT 1) nxt ON true
          LEFT JOIN LATERAL (
            SELECT status, scheduled_for, finished_at, last_error, recurring_schedule
            FROM {jobs}
            WHERE recurring_key = k.key AND status IN ('done', 'failed', 'cancelled')
            ORDER BY scheduled_for DESC LIMIT 1) last ON true) r) AS recurring,
       -- the paused queues (`drainer pause`), with since when: in this statement so that
       -- status stays four
       (SELECT coalesce(jsonb_agg(jsonb_build_object('queue', queue, 'paused_at', paused_at)
                                  ORDER BY queue), '[]'::jsonb)
        FROM {control} WHERE paused) AS paused_queues,
       -- the operator's limits (`drainer limit`) and the full rate windows' next slots
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                  'queue', queue, 'max_running', max_running, 'rate_count', rate_count,
                  'rate_period_s', rate_period_s,
                  'rate_next_at', CASE WHEN rate_next_at > now() THEN rate_next_at END)
                ORDER BY queue), '[]'::jsonb)
        FROM {control}
        WHERE max_running IS NOT NULL OR rate_count IS NOT NULL OR rate_next_at > now())
         AS queue_limits
FROM pg_class c
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = %(regclass)s::regclass;

-- name: status_failed_errors
-- The dead-letter queue: the three most common first lines of last_error of failed jobs,
-- per queue (ranked within each queue, so a quiet queue's top error is not crowded out).
SELECT queue, error, jobs FROM (
  SELECT queue, left(split_part(coalesce(last_error, ''), E'\n', 1), 200) AS error,
         count(*) AS jobs,
         row_number() OVER (PARTITION BY queue ORDER BY count(*) DESC,
                            left(split_part(coalesce(last_error, ''), E'\n', 1), 200)) AS rank
  FROM {jobs}
  WHERE status = 'failed'
  GROUP BY 1, 2
) ranked
WHERE rank <= 3
ORDER BY queue, jobs DESC, error;

-- name: job_list
-- `drainer jobs`: newest first, of the given queues and/or one status when given, with the
-- first line of last_error.
SELECT id, queue, status, attempts, max_attempts, priority, run_at, locked_until,
       created_at, finished_at, dedup_key,
       left(split_part(last_error, E'\n', 1), 200) AS error, result, run_id
FROM {jobs}
WHERE (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s))
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_get
-- `drainer show`: one job, every column, the full last_error; and, for a queued job of a
-- rate-limited queue whose window is full, until when the rate holds it (the next slot).
SELECT id, queue, status, payload, attempts, max_attempts, priority, run_at, locked_until,
       created_at, finished_at, dedup_key, last_error, result, run_id, fence, suspect,
       snoozes, snoozed_at,
       (status = 'running' AND locked_until < now()) AS lease_expired,
       (SELECT c.rate_next_at FROM {control} c
        WHERE c.queue = j.queue AND j.status = 'queued'
          AND c.rate_next_at > greatest(j.run_at, now())) AS rate_limited_until
FROM {jobs} j
WHERE id = %(id)s;

-- name: job_status_many
-- The status of the given jobs, to say why retry or cancel left some of them alone.
SELECT id, status, locked_until FROM {jobs} WHERE id = ANY(%(ids)s);

-- name: retry_plan
-- `drainer retry`, step 1 (in a transaction): the failed jobs named (ids, or one queue, or
-- all; cancelled jobs only by id: --queue and --all-failed leave them cancelled), locked,
-- each with a verdict. 'retry' unless: the job was cancelled while running
-- and its owner's lease has not run out yet ('lease_active': the owner may still write
-- with the attempts it holds, so attempts cannot be reset under it); its dedup_key is
-- held by a queued or running job ('dedup_taken'); or a newer failed job with the same key
-- is retried in this call ('dedup_duplicate'). So the dedup unique index is never hit.
WITH chosen AS (
  SELECT id, queue, dedup_key, locked_until FROM {jobs}
  WHERE (status = 'failed' OR (status = 'cancelled' AND %(ids)s::bigint[] IS NOT NULL))
    AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s))
    AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  FOR UPDATE SKIP LOCKED
)
SELECT c.id, c.queue, c.dedup_key,
       CASE
         WHEN c.locked_until > now() THEN 'lease_active'
         WHEN c.dedup_key IS NULL THEN 'retry'
         WHEN EXISTS (SELECT 1 FROM {jobs} o
                      WHERE o.dedup_key = c.dedup_key AND o.status IN ('queued', 'running'))
           THEN 'dedup_taken'
         WHEN row_number() OVER (PARTITION BY c.dedup_key,
                                 (c.locked_until > now()) IS TRUE
                                 ORDER BY c.id DESC) > 1
           THEN 'dedup_duplicate'
         ELSE 'retry'
       END AS verdict
FROM chosen c
ORDER BY c.id;

-- name: retry_many
-- `drainer retry`, step 2: failed (or cancelled) -> queued, attempts reset, due now.
-- last_error is kept until the job runs again (it is the history of the failure).
UPDATE {jobs}
SET status = 'queued', attempts = 0, run_at = now(), locked_until = NULL, finished_at = NULL
WHERE id = ANY(%(ids)s) AND status IN ('failed', 'cancelled')
RETURNING id;

-- name: cancel_many
-- `drainer cancel`: queued or running -> cancelled, last_error 'cancelled'. A running job
-- keeps its locked_until: its owner's next heartbeat (extend_many, fenced on status =
-- 'running') updates 0 rows and tells the handler to stop, its outcome write is fenced the
-- same way, and retry_plan waits for that lease to run out. Rows locked by a transaction
-- (a transaction-mode job in flight, a claim in progress) are skipped, not waited for.
WITH target AS (
  SELECT id, status FROM {jobs}
  WHERE id = ANY(%(ids)s) AND status IN ('queued', 'running')
  FOR UPDATE SKIP LOCKED
)
UPDATE {jobs} j
SET status       = 'cancelled',
    last_error   = 'cancelled',
    locked_until = CASE WHEN target.status = 'running' THEN j.locked_until END,
    finished_at  = now()
FROM target
WHERE j.id = target.id
RETURNING j.id, target.status AS was;

-- name: purge_count
-- `drainer purge --dry-run`: how many finished jobs of one status are older than the cutoff.
SELECT count(*) FROM {jobs}
WHERE @finished_before(status => %(status)s, older_than => %(older_than)s);

-- name: audit_sample
-- `drainer audit`: one sample of pg_stat_activity, every session but the audit's own
-- (client backends, autovacuum workers, walsenders), narrowed by the filters given (NULL:
-- all). clock_timestamp() is the sample's time on the server's clock, the clock of
-- state_change and the other timestamps. Not about the jobs table: no identifiers.
SELECT clock_timestamp() AS sampled_at, pid, backend_start,
       coalesce(backend_type, 'unknown') AS backend_type, datname, usename,
       application_name, host(client_addr) AS client_addr, state, state_change,
       query_start, xact_start, left(query, %(query_chars)s) AS query
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND (backend_type IN ('client backend', 'autovacuum worker', 'walsender')
       -- another role's session, hidden without pg_read_all_stats: reported as such
       OR (backend_type IS NULL AND datname IS NOT NULL))
  AND (%(databases)s::text[] IS NULL OR datname = ANY(%(databases)s::text[]))
  AND (%(users)s::text[] IS NULL OR usename = ANY(%(users)s::text[]))
  AND (%(applications)s::text[] IS NULL OR application_name LIKE ANY(%(applications)s::text[]))
  AND (%(pids)s::int[] IS NULL OR pid = ANY(%(pids)s::int[]))
ORDER BY pid;

-- name: audit_session_counts
-- `drainer audit`: sessions ever opened per database. Connections opened and closed between
-- two samples never show in pg_stat_activity; this count does (PostgreSQL 15+:
-- pg_stat_force_next_flush() makes the audit's own counts exact, so they can be told apart).
SELECT clock_timestamp() AS sampled_at, datname, sessions,
       pg_stat_force_next_flush() IS NULL AS flushed
FROM pg_stat_database
WHERE datname IS NOT NULL
  AND (%(databases)s::text[] IS NULL OR datname = ANY(%(databases)s::text[]));

-- name: audit_flush_counters
-- `drainer audit`, before the first sample: count the audit's own connection now.
SELECT pg_stat_force_next_flush();

-- name: audit_clock
-- `drainer audit`: the server's clock, for a sample that saw no row to take it from.
SELECT clock_timestamp();

-- name: notify_trigger_installed
-- `drainer worker` at start: is the AFTER INSERT trigger of `drainer migrate
-- --notify-trigger` on the jobs table? Without it the worker hears nothing and only polls.
SELECT EXISTS (
  SELECT 1 FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = %(schema)s AND c.relname = %(table)s AND t.tgname = %(trigger)s
    AND NOT t.tgisinternal AND t.tgenabled <> 'D'
) AS installed;
-- name: recurring_sync
-- After run_start, when the app has recurring definitions on the queues the drain serves:
-- the sync of those definitions (drainer/recurring.py). It touches only queued occurrences
-- that were never claimed (fence = 0: the fence counts claims and nothing resets it).
--
-- The sync makes the definitions rows, whatever their number. %(definitions)s is a JSON
-- array, one object per definition: its key, queue, hash, catch_up policy, priority and
-- max_attempts, its schedule (cron, time zone, catch_up: what `drainer status` shows
-- without the app), its next fire time after %(now)s (next_at, with the payload of that
-- occurrence) and its latest fire time at or before %(now)s (latest_at, likewise).
-- %(missed)s lists, for the `all` policy, the latest fire times at or before %(now)s (at
-- most catch_up_max of each definition).
-- "Mine" are the occurrences in the served queues that were never claimed: only they are
-- touched, so another deployment's queues, running jobs and retries are left alone.
--   gone:       future occurrences of definitions deleted from the code, or no longer at
--               their definition's next fire time (its cron or time zone changed);
--   changed:    the next occurrence, rewritten when the definition's hash or its schedule
--               changed;
--   superseded: latest/skip: occurrences whose next fire time has passed too (nothing ran
--               them in time); `latest` replaces them with one run for the latest fire time;
--   caught_up:  all: the newest such occurrence is marked (recurring_hash NULL) and every
--               missed fire time after it is inserted;
--   inserted:   the next occurrence of each definition, and the catch-up runs.
-- Concurrent syncs never create an occurrence twice: the unique index on (recurring_key,
-- scheduled_for) covers every status, and the catch-up inserts hang on a DELETE or UPDATE that
-- only one sync can win (the loser's recheck of the row's newest version fails).
WITH d AS MATERIALIZED (
  SELECT * FROM jsonb_to_recordset(%(definitions)s::jsonb) AS d(
    key text, queue text, hash text, catch_up text, priority int, max_attempts int,
    schedule jsonb, next_at timestamptz, next_payload jsonb,
    latest_at timestamptz, latest_payload jsonb)
), missed AS MATERIALIZED (
  SELECT * FROM jsonb_to_recordset(%(missed)s::jsonb) AS m(
    key text, at timestamptz, payload jsonb)
), mine AS MATERIALIZED (
  @unclaimed_occurrences
), gone AS (
  DELETE FROM {jobs} j
  USING mine LEFT JOIN d ON d.key = mine.key
  WHERE j.id = mine.id AND mine.scheduled_for > %(now)s::timestamptz
    AND (d.key IS NULL OR mine.scheduled_for <> d.next_at)
    AND j.status = 'queued' AND j.fence = 0
  RETURNING j.id, d.key IS NULL AS removed
), changed AS (
  UPDATE {jobs} j
  SET queue = d.queue, payload = d.next_payload, priority = d.priority,
      max_attempts = d.max_attempts, recurring_hash = d.hash, recurring_schedule = d.schedule
  FROM mine JOIN d ON d.key = mine.key
  WHERE j.id = mine.id AND mine.scheduled_for = d.next_at
    AND (j.recurring_hash <> d.hash OR j.recurring_schedule IS DISTINCT FROM d.schedule)
    AND j.status = 'queued' AND j.fence = 0
  RETURNING j.id
), superseded AS (
  DELETE FROM {jobs} j
  USING mine JOIN d ON d.key = mine.key
  WHERE j.id = mine.id AND d.catch_up IN ('latest', 'skip') AND mine.scheduled_for < d.latest_at
    AND j.status = 'queued' AND j.fence = 0 AND j.recurring_hash IS NOT NULL
  RETURNING mine.key
), caught_up AS (
  UPDATE {jobs} j
  SET recurring_hash = NULL
  FROM (SELECT DISTINCT ON (mine.key) mine.id, mine.key, mine.scheduled_for
        FROM mine JOIN d ON d.key = mine.key
        WHERE d.catch_up = 'all' AND mine.scheduled_for <= %(now)s::timestamptz
        ORDER BY mine.key, mine.scheduled_for DESC) t
  JOIN d ON d.key = t.key
  WHERE j.id = t.id AND t.scheduled_for < d.latest_at
    AND j.status = 'queued' AND j.fence = 0 AND j.recurring_hash IS NOT NULL
  RETURNING t.key, t.scheduled_for AS since
), inserted AS (
  INSERT INTO {jobs} (queue, payload, run_at, priority, max_attempts,
                      recurring_key, scheduled_for, recurring_hash, recurring_schedule)
  SELECT d.queue, d.next_payload, d.next_at, d.priority, d.max_attempts,
         d.key, d.next_at, d.hash, d.schedule
  FROM d WHERE d.next_at IS NOT NULL
  UNION ALL
  SELECT d.queue, d.latest_payload, d.latest_at, d.priority, d.max_attempts,
         d.key, d.latest_at, d.hash, d.schedule
  FROM d WHERE d.catch_up = 'latest' AND d.key IN (SELECT key FROM superseded)
  UNION ALL
  SELECT d.queue, m.payload, m.at, d.priority, d.max_attempts, d.key, m.at, d.hash,
         d.schedule
  FROM missed m JOIN d ON d.key = m.key JOIN caught_up c ON c.key = m.key
  WHERE m.at > c.since
  -- an occurrence is (recurring_key, scheduled_for), columns the producer role cannot
  -- write: no producer's job (whatever its dedup_key) stands in for one
  ON CONFLICT (recurring_key, scheduled_for) WHERE recurring_key IS NOT NULL DO NOTHING
  RETURNING id
)
-- one row of sync counts (kind 'synced'; its id is the count of occurrences inserted)
SELECT 'synced' AS kind, (SELECT count(*) FROM inserted) AS id, NULL::text AS status,
       NULL::int AS attempts,
       (SELECT count(*) FROM changed) AS changed,
       (SELECT count(*) FROM gone WHERE removed) AS removed,
       (SELECT count(*) FROM gone WHERE NOT removed) AS rescheduled,
       (SELECT count(*) FROM superseded) AS superseded,
       (SELECT count(*) FROM caught_up) AS caught_up;


-- ---------------------------------------------------------------------------------------------
-- drainer ui (drainer/ui/data.py): what the dashboard's pages read, one connection a page.
-- Read-only; the pages' actions go through the statements of retry, cancel, pause and limit.
-- ---------------------------------------------------------------------------------------------

-- name: ui_jobs_older
-- The jobs page: newest first, older than %(before)s (NULL: from the newest), filtered by
-- queue, status, the run that last claimed them and text in last_error (NULL: any;
-- case-insensitive, no pattern characters). One row more than the page holds says that an
-- older page exists. Walks the primary key backwards, so a page costs its rows when no filter
-- is given.
SELECT id, queue, status, attempts, max_attempts, priority, run_at, locked_until, created_at,
       finished_at, run_id, recurring_key,
       left(split_part(last_error, E'\n', 1), 200) AS error,
       (status = 'queued' AND run_at <= now()) AS due
FROM {jobs}
WHERE (%(before)s::bigint IS NULL OR id < %(before)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s)
  AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s)) > 0)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: ui_jobs_newer
-- The jobs page, the page before: the %(limit)s jobs just newer than %(after)s, oldest first
-- (the page shows them newest first), with the filters of ui_jobs_older.
SELECT id, queue, status, attempts, max_attempts, priority, run_at, locked_until, created_at,
       finished_at, run_id, recurring_key,
       left(split_part(last_error, E'\n', 1), 200) AS error,
       (status = 'queued' AND run_at <= now()) AS due
FROM {jobs}
WHERE id > %(after)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s)
  AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s)) > 0)
ORDER BY id
LIMIT %(limit)s;

-- name: ui_job
-- One job whole: every column (the producer's trace context and the recurring series'
-- columns too), whether its lease has run out, and until when a full rate window holds it.
SELECT j.id, j.queue, j.status, j.payload, j.result, j.last_error, j.attempts, j.max_attempts,
       j.priority, j.run_at, j.locked_until, j.created_at, j.finished_at, j.dedup_key,
       j.run_id, j.fence, j.charged, j.suspect, j.snoozes, j.snoozed_at, j.trace_context,
       j.recurring_key, j.scheduled_for,
       (j.status = 'running' AND j.locked_until < now()) AS lease_expired,
       (SELECT c.rate_next_at FROM {control} c
        WHERE c.queue = j.queue AND j.status = 'queued'
          AND c.rate_next_at > greatest(j.run_at, now())) AS rate_limited_until
FROM {jobs} j
WHERE j.id = %(id)s;

-- name: ui_job_followups
-- What is known of a done job's follow-ups: no column names the job that enqueued one, but
-- a follow-up is inserted by the statement that completes its parent, so its created_at is
-- that transaction's now(), the parent's finished_at. Looked for among the next
-- %(window)s ids (follow-ups come after their parent), with the number of jobs completed
-- by that same statement (1: they are this job's; more: this job's or its batch's).
SELECT f.id, f.queue, f.status, f.created_at,
       (SELECT count(*) FROM {jobs} s
        WHERE s.status = 'done' AND s.finished_at = %(finished_at)s) AS completed_with
FROM (SELECT id, queue, status, created_at FROM {jobs}
      WHERE id > %(id)s ORDER BY id LIMIT %(window)s) f
WHERE f.created_at = %(finished_at)s
ORDER BY f.id
LIMIT %(limit)s;

-- name: ui_runs
-- The runs page: the jobs table by run_id (the run that last claimed each job), what each run
-- claimed (its jobs), did (done, failed, cancelled) and left (queued again: a retry's backoff,
-- a snooze or a release; running: a live lease, or an expired one the reaper will return),
-- newest activity first. A job claimed again by a later run counts for the later one only.
-- A scan of the table (run_id has no index: it is read here and by `drainer jobs --run`).
SELECT run_id, count(*) AS claimed,
       count(*) FILTER (WHERE status = 'done') AS done,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE status = 'queued') AS left_queued,
       count(*) FILTER (WHERE status = 'running' AND locked_until >= now()) AS left_running,
       count(*) FILTER (WHERE status = 'running' AND locked_until < now()) AS left_expired,
       sum(attempts) AS attempts,
       min(finished_at) AS first_finished_at, max(finished_at) AS last_finished_at,
       array_agg(DISTINCT queue ORDER BY queue) AS queues
FROM {jobs}
WHERE run_id IS NOT NULL AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s)
GROUP BY run_id
ORDER BY bool_or(status = 'running') DESC, max(finished_at) DESC NULLS LAST, run_id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: ui_recurring
-- The recurring series page: every recurring_key in the table with its next occurrence
-- (queued or running, the earliest), its last finished one (with its error and run), and
-- how many of its occurrences the table still holds by outcome, and the schedule the sync
-- wrote on them. The column names of status_table's recurring array, so
-- recurring.series_status reads these rows too.
SELECT k.key, nxt.queue, nxt.id AS next_id, nxt.scheduled_for AS next_at,
       nxt.status AS next_status, last.id AS last_id, last.status AS last_status,
       last.scheduled_for AS last_scheduled_for, last.finished_at AS last_finished_at,
       last.last_error, last.run_id AS last_run_id, k.done, k.failed, k.occurrences,
       coalesce(nxt.recurring_schedule, last.recurring_schedule) AS schedule
FROM (SELECT recurring_key AS key, count(*) AS occurrences,
             count(*) FILTER (WHERE status = 'done') AS done,
             count(*) FILTER (WHERE status = 'failed') AS failed
      FROM {jobs} WHERE recurring_key IS NOT NULL GROUP BY recurring_key) k
LEFT JOIN LATERAL (
  SELECT id, queue, scheduled_for, status, recurring_schedule FROM {jobs}
  WHERE recurring_key = k.key AND status IN ('queued', 'running')
  ORDER BY scheduled_for LIMIT 1) nxt ON true
LEFT JOIN LATERAL (
  SELECT id, status, scheduled_for, finished_at, last_error, run_id, recurring_schedule
  FROM {jobs}
  WHERE recurring_key = k.key AND status IN ('done', 'failed', 'cancelled')
  ORDER BY scheduled_for DESC LIMIT 1) last ON true
ORDER BY k.key;
