-- Cancelled jobs apart from failed ones, and the schedule of each recurring occurrence.
--
-- status 'cancelled': `drainer cancel` gives a queued or running job this status (its
--   last_error 'cancelled', its finished_at the cancel's time), so that `retry --all-failed`
--   and `retry --queue` leave it alone while `retry ID` still takes it back. The archiver
--   ages cancelled jobs as failed ones (--failed-retention), on an index of their own.
--   Jobs cancelled before this version (failed, last_error 'cancelled') take the status.
-- recurring_schedule: the definition's cron, time zone and catch-up policy as the
--   recurring sync last wrote them ({{"cron", "timezone", "catch_up"}}), so that
--   `drainer status` and `drainer ui` show a series' schedule without loading the app.

-- The CHECK of the status column, whatever its name (an adopted table's may have its own).
DO $drainer$
DECLARE
  c record;
BEGIN
  FOR c IN
    SELECT k.conname FROM pg_constraint k
    JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attname = 'status'
    WHERE k.conrelid = {jobs_regclass}::regclass AND k.contype = 'c'
      AND k.conkey = ARRAY[a.attnum]
  LOOP
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', {jobs_regclass}::regclass, c.conname);
  END LOOP;
END
$drainer$;

UPDATE {jobs} SET status = 'cancelled'
WHERE status = 'failed' AND last_error = 'cancelled';

ALTER TABLE {jobs} ADD CONSTRAINT {status_check}
  CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled'));

CREATE INDEX IF NOT EXISTS {cancelled_idx} ON {jobs} (finished_at) WHERE status = 'cancelled';

ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS recurring_schedule jsonb;
