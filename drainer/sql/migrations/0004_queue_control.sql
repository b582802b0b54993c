-- Job control (issue 17): paused queues, and what a snooze leaves on the job.
--
-- {control} (<table>_queues): one row per queue an operator acted on. paused: no drainer
--   claims the queue's jobs (`drainer pause` / `drainer resume`); jobs keep arriving. The
--   drain reads the paused queues once per run, in the statement of its schema check.
-- snoozes / snoozed_at: how many times a handler snoozed the job (raise drainer.Snooze)
--   and when it last did; a snooze uses no attempt, so attempts alone would not show it.
CREATE TABLE IF NOT EXISTS {control} (
  queue      text PRIMARY KEY,
  paused     boolean NOT NULL DEFAULT false,
  paused_at  timestamptz,
  updated_at timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS snoozes    int NOT NULL DEFAULT 0;
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS snoozed_at timestamptz;
ALTER TABLE {archive} ADD COLUMN IF NOT EXISTS snoozes    int NOT NULL DEFAULT 0;
ALTER TABLE {archive} ADD COLUMN IF NOT EXISTS snoozed_at timestamptz;
