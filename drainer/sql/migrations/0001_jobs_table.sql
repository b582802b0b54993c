-- The jobs table of 'Postgres as a job queue', plus priority, dedup_key and finished_at.
-- Written to adopt an existing table made from its DDL: every column is
-- added only when missing, rows are kept.
CREATE TABLE IF NOT EXISTS {jobs} (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue        text        NOT NULL DEFAULT 'default',
  payload      jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
  status       text        NOT NULL DEFAULT 'queued'
               CHECK (status IN ('queued', 'running', 'done', 'failed')),
  run_at       timestamptz NOT NULL DEFAULT now(),
  attempts     int         NOT NULL DEFAULT 0,
  max_attempts int         NOT NULL DEFAULT 5,
  locked_until timestamptz,
  last_error   text,
  created_at   timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS priority    int NOT NULL DEFAULT 0;
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS dedup_key   text;
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS finished_at timestamptz;

-- Finished rows of an adopted table get a finish time, so the archiver can age them.
UPDATE {jobs} SET finished_at = created_at
WHERE status IN ('done', 'failed') AND finished_at IS NULL;

-- The claim index: only queued rows, leading with queue, in the claim's order, so the
-- claim is an index scan that stops after the batch whatever the history holds.
CREATE INDEX IF NOT EXISTS {claim_idx} ON {jobs} (queue, priority DESC, run_at, id)
  WHERE status = 'queued';
-- Its index (jobs_ready_idx) is superseded by the claim index; keeping both costs a write each.
DROP INDEX IF EXISTS {article_idx};

-- The reaper looks only at running rows.
CREATE INDEX IF NOT EXISTS {lease_idx} ON {jobs} (locked_until) WHERE status = 'running';

-- The archiver looks only at finished rows, oldest first.
CREATE INDEX IF NOT EXISTS {finished_idx} ON {jobs} (status, finished_at)
  WHERE status IN ('done', 'failed');

-- At most one queued or running job per dedup_key.
CREATE UNIQUE INDEX IF NOT EXISTS {dedup_idx} ON {jobs} (dedup_key)
  WHERE dedup_key IS NOT NULL AND status IN ('queued', 'running');

-- 'The SKIP LOCKED work queue': a queue table needs aggressive autovacuum.
ALTER TABLE {jobs} SET (
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_cost_delay   = 0
);

-- Where archive-mode=move puts old jobs: same columns, no identity, no indexes but the key.
CREATE TABLE IF NOT EXISTS {archive} (LIKE {jobs} INCLUDING DEFAULTS);
ALTER TABLE {archive} ALTER COLUMN id DROP IDENTITY IF EXISTS;
ALTER TABLE {archive} ADD COLUMN IF NOT EXISTS archived_at timestamptz NOT NULL DEFAULT now();
