-- The jobs table and its companions as the migrations (sql/migrations/, applied by
-- `drainer migrate`) leave them at the latest version: the whole schema in one place, to
-- read. A test applies the migrations to one fresh schema and this file to another and
-- compares their catalogs (columns, defaults, constraints, indexes, triggers, storage
-- options); a migration that changes the table changes this file with it.
--
-- The identifiers are holes filled as in the migrations (psycopg.sql, with the names of
-- drainer/db/statements.py's identifiers()): the jobs table is <schema>.<table>, the others
-- are named after the table. Tables are made with `drainer migrate`, which also records the
-- versions applied in the migrations table and adopts a table that already exists;
-- `drainer migrate --notify-trigger` adds the AFTER INSERT trigger, not part of this schema.

CREATE SCHEMA IF NOT EXISTS {schema};

-- The migrations applied, by table: the drain checks the latest before it touches the table.
CREATE TABLE IF NOT EXISTS {migrations} (
  table_name text        NOT NULL,
  version    int         NOT NULL,
  name       text        NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (table_name, version)
);

-- One row a job. The columns of 'Postgres as a job queue' first (id .. created_at), then
-- drainer's:
--   priority, dedup_key, finished_at: claim order, at most one queued or running job a
--     key, the archiver's age;
--   fence: grows by one at every claim and nothing resets it: every outcome, heartbeat and
--     release is fenced on (id, fence);
--   charged: whether the claim charged the running attempt (the job started at once);
--   suspect: set by the reaper, claimed next only where it starts at once;
--   result: what the handler returned; run_id: the run that last claimed the job;
--   recurring_key, scheduled_for, recurring_hash: a recurring definition's occurrence,
--     identified by (recurring_key, scheduled_for), never by a dedup_key (its dedup_key is
--     NULL: that namespace is the producers');
--   snoozes, snoozed_at: a handler's snoozes, which use no attempt;
--   trace_context: the producer's W3C trace context (traceparent, tracestate), or NULL;
--   recurring_schedule: an occurrence's definition as the recurring sync last wrote it
--     ({{"cron", "timezone", "catch_up"}}).
-- status 'cancelled': `drainer cancel`'s, apart from 'failed' (retry --all-failed skips it).
CREATE TABLE IF NOT EXISTS {jobs} (
  id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue          text        NOT NULL DEFAULT 'default',
  payload        jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
  status         text        NOT NULL DEFAULT 'queued'
                 CONSTRAINT {status_check}
                 CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
  run_at         timestamptz NOT NULL DEFAULT now(),
  attempts       int         NOT NULL DEFAULT 0,
  max_attempts   int         NOT NULL DEFAULT 5,
  locked_until   timestamptz,
  last_error     text,
  created_at     timestamptz NOT NULL DEFAULT now(),
  priority       int         NOT NULL DEFAULT 0,
  dedup_key      text,
  finished_at    timestamptz,
  fence          bigint      NOT NULL DEFAULT 0,
  charged        boolean     NOT NULL DEFAULT false,
  suspect        boolean     NOT NULL DEFAULT false,
  result         jsonb,
  run_id         text,
  recurring_key  text,
  scheduled_for  timestamptz,
  recurring_hash text,
  snoozes        int         NOT NULL DEFAULT 0,
  snoozed_at     timestamptz,
  trace_context  jsonb,
  recurring_schedule jsonb,
  -- a run_at the client can represent
  CONSTRAINT {run_at_check}
    CHECK (run_at >= '1970-01-01 00:00:00+00' AND run_at <= '9999-01-01 00:00:00+00'),
  -- a job runs at least once
  CONSTRAINT {max_attempts_check} CHECK (max_attempts >= 1)
) WITH (
  -- 'The SKIP LOCKED work queue': a queue table needs aggressive autovacuum
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_cost_delay   = 0
);

-- The claim index: only queued rows, leading with queue, in the claim's order, so the
-- claim is an index scan that stops after the batch whatever the history holds.
CREATE INDEX IF NOT EXISTS {claim_idx} ON {jobs} (queue, priority DESC, run_at, id)
  WHERE status = 'queued';
-- The reaper looks only at running rows.
CREATE INDEX IF NOT EXISTS {lease_idx} ON {jobs} (locked_until) WHERE status = 'running';
-- The archiver looks only at finished rows, oldest first (cancelled ones on their own).
CREATE INDEX IF NOT EXISTS {finished_idx} ON {jobs} (status, finished_at)
  WHERE status IN ('done', 'failed');
CREATE INDEX IF NOT EXISTS {cancelled_idx} ON {jobs} (finished_at) WHERE status = 'cancelled';
-- At most one queued or running job per dedup_key.
CREATE UNIQUE INDEX IF NOT EXISTS {dedup_idx} ON {jobs} (dedup_key)
  WHERE dedup_key IS NOT NULL AND status IN ('queued', 'running');
-- One row per occurrence of a recurring definition, whatever its status.
CREATE UNIQUE INDEX IF NOT EXISTS {recurring_idx} ON {jobs} (recurring_key, scheduled_for)
  WHERE recurring_key IS NOT NULL;
-- What the recurring sync at the start of every drain reads: the queued occurrences.
CREATE INDEX IF NOT EXISTS {recurring_queued_idx} ON {jobs} (recurring_key)
  WHERE recurring_key IS NOT NULL AND status = 'queued';

-- Where archive-mode=move puts old jobs: the jobs' columns up to finished_at (with their
-- defaults, no identity, no key, no index), archived_at, and the later columns the archive
-- keeps (not the recurring ones, nor trace_context).
CREATE TABLE IF NOT EXISTS {archive} (
  id           bigint      NOT NULL,
  queue        text        NOT NULL DEFAULT 'default',
  payload      jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
  status       text        NOT NULL DEFAULT 'queued',
  run_at       timestamptz NOT NULL DEFAULT now(),
  attempts     int         NOT NULL DEFAULT 0,
  max_attempts int         NOT NULL DEFAULT 5,
  locked_until timestamptz,
  last_error   text,
  created_at   timestamptz NOT NULL DEFAULT now(),
  priority     int         NOT NULL DEFAULT 0,
  dedup_key    text,
  finished_at  timestamptz,
  archived_at  timestamptz NOT NULL DEFAULT now(),
  fence        bigint      NOT NULL DEFAULT 0,
  charged      boolean     NOT NULL DEFAULT false,
  suspect      boolean     NOT NULL DEFAULT false,
  result       jsonb,
  run_id       text,
  snoozes      int         NOT NULL DEFAULT 0,
  snoozed_at   timestamptz
);

-- One row per queue an operator (or a rate-limited claim) acted on (<table>_queues):
--   paused, paused_at: `drainer pause` / `drainer resume`; no drainer claims a paused queue;
--   max_running, rate_count, rate_period_s: `drainer limit`, overriding the settings and
--     the task (NULL: theirs);
--   rate_at, rate_n: the claims of the rate window, oldest first (when, how many), written
--     by claim_batch_rated under the queue's claim lock;
--   rate_next_at: when a full window next has room (NULL or past: it has room).
CREATE TABLE IF NOT EXISTS {control} (
  queue         text             PRIMARY KEY,
  paused        boolean          NOT NULL DEFAULT false,
  paused_at     timestamptz,
  updated_at    timestamptz      NOT NULL DEFAULT now(),
  max_running   int              CONSTRAINT queue_max_running_positive
                                 CHECK (max_running >= 1),
  rate_count    int              CONSTRAINT queue_rate_count_positive CHECK (rate_count >= 1),
  rate_period_s double precision CONSTRAINT queue_rate_period_positive
                                 CHECK (rate_period_s > 0),
  rate_at       timestamptz[]    NOT NULL DEFAULT '{{}}',
  rate_n        int[]            NOT NULL DEFAULT '{{}}',
  rate_next_at  timestamptz
);
