-- A recurring occurrence is its own columns, and max_attempts is at least 1.
--
-- Occurrences are identified by (recurring_key, scheduled_for) alone (the unique index of
--   0003, every status), columns the producer role cannot insert. They used to carry a
--   dedup_key 'recurring:<key>:<fire time>' too, a namespace every producer writes: a
--   producer's job with that key suppressed the occurrence. Their dedup_key is cleared.
-- max_attempts: a job with fewer than one attempt could never run; rows below 1 get 1
--   (what the claim already gave them: one run).
UPDATE {jobs} SET dedup_key = NULL
WHERE recurring_key IS NOT NULL AND starts_with(dedup_key, 'recurring:');

UPDATE {jobs} SET max_attempts = 1 WHERE max_attempts < 1;

ALTER TABLE {jobs} ADD CONSTRAINT {max_attempts_check} CHECK (max_attempts >= 1);
