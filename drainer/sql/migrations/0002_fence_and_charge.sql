-- Fencing that never repeats, attempts charged only to jobs that started, results, runs.
--
-- fence: incremented by every claim and never reset (retry, cancel and reap leave it
--   alone), so the token (id, fence) that every outcome, heartbeat and release is fenced on
--   can never match a later owner of the job, whatever an operator does in between.
-- charged: whether the claim charged the running attempt for certain: true for the jobs a
--   claim starts at once, false for jobs claimed ahead of their start (pipelined claims,
--   the rest of a sequential batch). A lease that expires on an uncharged job gives its
--   attempt back: a process death charges only the jobs that had started.
-- suspect: set by the reaper; a suspect job is only claimed where it starts at once (and
--   is charged), so a job that kills its drainer uses up its attempts even when it was
--   claimed ahead of its start.
-- result: what the handler returned (JSON), kept with the job and archived with it.
-- run_id: the run (RunReport.run_id) that last claimed the job: `drainer jobs --run ID`.
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS fence   bigint  NOT NULL DEFAULT 0;
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS charged boolean NOT NULL DEFAULT false;
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS suspect boolean NOT NULL DEFAULT false;
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS result  jsonb;
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS run_id  text;

-- A run_at the client cannot represent (a plain-SQL insert of '-infinity', 'infinity' or a
-- year past 9999) is refused from now on. Rows already there are moved inside the range
-- first, keeping what they meant: '-infinity' stays due at once, 'infinity' out of reach.
UPDATE {jobs} SET run_at = '1970-01-01 00:00:00+00' WHERE run_at < '1970-01-01 00:00:00+00';
UPDATE {jobs} SET run_at = '9999-01-01 00:00:00+00' WHERE run_at > '9999-01-01 00:00:00+00';
ALTER TABLE {jobs} DROP CONSTRAINT IF EXISTS {run_at_check};
ALTER TABLE {jobs} ADD CONSTRAINT {run_at_check}
  CHECK (run_at >= '1970-01-01 00:00:00+00' AND run_at <= '9999-01-01 00:00:00+00');

ALTER TABLE {archive} ADD COLUMN IF NOT EXISTS fence   bigint  NOT NULL DEFAULT 0;
ALTER TABLE {archive} ADD COLUMN IF NOT EXISTS charged boolean NOT NULL DEFAULT false;
ALTER TABLE {archive} ADD COLUMN IF NOT EXISTS suspect boolean NOT NULL DEFAULT false;
ALTER TABLE {archive} ADD COLUMN IF NOT EXISTS result  jsonb;
ALTER TABLE {archive} ADD COLUMN IF NOT EXISTS run_id  text;
