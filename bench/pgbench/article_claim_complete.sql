-- The claim of 'Postgres as a job queue: using FOR UPDATE SKIP LOCKED correctly' (up to
-- :batch due jobs, FOR UPDATE SKIP LOCKED, the lease written, committed at once) and its fenced completion (WHERE id AND status = 'running' AND
-- attempts), the completion for the whole batch in one statement as drainer writes its
-- own: two round trips and two commits a batch, as bench/capacity.py's drainer script.
-- pgbench -D batch=N sets the claim size.
WITH next AS (
  SELECT id FROM jobs
  WHERE queue = 'default' AND status = 'queued' AND run_at <= now()
  ORDER BY run_at
  LIMIT :batch
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE jobs j
  SET status       = 'running',
      attempts     = j.attempts + 1,
      locked_until = now() + interval '5 minutes'
  FROM next
  WHERE j.id = next.id
  RETURNING j.id, j.payload, j.attempts
)
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(attempts), '{}') AS attempts
FROM claimed
\gset
UPDATE jobs j
SET status = 'done', locked_until = NULL
FROM unnest(:ids::bigint[], :attempts::int[]) AS o(id, attempts)
WHERE j.id = o.id AND j.status = 'running' AND j.attempts = o.attempts;
