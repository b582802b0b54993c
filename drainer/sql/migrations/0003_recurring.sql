-- Recurring jobs (drainer.recurring, @task(cron=...)): each occurrence is an ordinary job row
-- that also names its definition and fire time. Nullable columns with no default: adding
-- them rewrites nothing, and ordinary jobs (recurring_key NULL) are in neither index below.
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS recurring_key  text;
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS scheduled_for  timestamptz;
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS recurring_hash text;

-- One row per occurrence whatever its status: a sync never creates an occurrence again once
-- it ran, failed or was cancelled (until the archiver deletes the row, long after its time).
CREATE UNIQUE INDEX IF NOT EXISTS {recurring_idx} ON {jobs} (recurring_key, scheduled_for)
  WHERE recurring_key IS NOT NULL;

-- What the sync at the start of every drain reads: the queued occurrences, a few rows.
CREATE INDEX IF NOT EXISTS {recurring_queued_idx} ON {jobs} (recurring_key)
  WHERE recurring_key IS NOT NULL AND status = 'queued';
