-- Per-queue limits set by an operator (issue 17), and the rate limit's slot log.
--
-- {control} (<table>_queues), one row per queue an operator or a rate-limited claim acted on:
-- max_running     `drainer limit QUEUE --max-running N`: at most N jobs of the queue running
--                 under a live lease; overrides the setting and the task (NULL: theirs).
-- rate_count,     `drainer limit QUEUE --rate COUNT/PERIOD`: at most rate_count jobs claimed
-- rate_period_s   in any rate_period_s seconds; overrides the setting and the task.
-- rate_at, rate_n the claims of the queue's rate window, oldest first: when (the claim's
--                 clock_timestamp(), taken under the queue's claim lock) and how many jobs.
--                 Written only by claim_batch_rated, in the claim's transaction.
-- rate_next_at    when the window next has room, written by a claim that filled it (NULL or
--                 past: it has room). Until then the queue's due jobs count as due at
--                 rate_next_at (queue_summary, finish_run): the drain exits and the next
--                 wake is at the slot, instead of a drain waiting on an open connection.
ALTER TABLE {control} ADD COLUMN IF NOT EXISTS max_running int
  CONSTRAINT queue_max_running_positive CHECK (max_running >= 1);
ALTER TABLE {control} ADD COLUMN IF NOT EXISTS rate_count int
  CONSTRAINT queue_rate_count_positive CHECK (rate_count >= 1);
ALTER TABLE {control} ADD COLUMN IF NOT EXISTS rate_period_s double precision
  CONSTRAINT queue_rate_period_positive CHECK (rate_period_s > 0);
ALTER TABLE {control} ADD COLUMN IF NOT EXISTS rate_at timestamptz[] NOT NULL DEFAULT '{{}}';
ALTER TABLE {control} ADD COLUMN IF NOT EXISTS rate_n int[] NOT NULL DEFAULT '{{}}';
ALTER TABLE {control} ADD COLUMN IF NOT EXISTS rate_next_at timestamptz;
