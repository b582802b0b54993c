-- Every statement a fleet sends to its control database, by name. Loaded once by
-- drainer/fleet/_sql.py.
--
-- {schema}, {tenants} and {due_idx} are identifiers composed with psycopg.sql.Identifier; %(name)s are
-- parameters. The control table holds one row a tenant: what a fleet wake reads to decide
-- whom to connect to (it never connects to a tenant to find out). A fleet run leases the
-- tenants it drains (leased_by = its run id, leased_until): every write of a run's outcome
-- is fenced on leased_by, so two fleet runs never drain one tenant at once, and a run that
-- died leaves its tenants to the next run once their lease has passed.

-- name: fleet_create
-- The control table, idempotent (drainer fleet migrate). next_due_at: when the tenant next
-- has known work (retries, delayed jobs, recurring occurrences from its last run report; a
-- producer's due mark), NULL when none is known. finished_at NULL: never drained, so due.
-- due_at / due_marked_at: a producer's mark that came while a run was draining the tenant
-- (started_at) survives that run's write-back. The name check is the one of drainer's
-- tenant files, for producers that insert rows in plain SQL.
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {tenants} (
  name           text PRIMARY KEY
                 CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' AND length(name) <= 63),
  next_due_at    timestamptz,
  due_at         timestamptz,
  due_marked_at  timestamptz,
  started_at     timestamptz,
  finished_at    timestamptz,
  outcome        text,
  error          text,
  failures       integer NOT NULL DEFAULT 0,
  schema_version integer,
  migrated_at    timestamptz,
  run_id         text,
  report         jsonb,
  leased_by      text,
  leased_until   timestamptz
);
CREATE INDEX IF NOT EXISTS {due_idx} ON {tenants} (next_due_at);

-- name: fleet_exists
-- Whether the control table exists (a fleet command before `drainer fleet migrate`).
SELECT to_regclass(%(regclass)s) IS NOT NULL AS present;

-- name: fleet_due
-- A producer says the tenants have work from `at` on (now() by default), without touching
-- them: their next_due_at comes forward to it. A tenant not seen yet gets its row (it is
-- due anyway: never drained). A tenant already due by then is not written again (no dead
-- row a call) unless a run is draining it now: then the mark is kept beside the row, so
-- that run's write-back, which saw only what was committed when it started, keeps it.
INSERT INTO {tenants} AS t (name, next_due_at, due_at, due_marked_at)
SELECT n, coalesce(%(at)s::timestamptz, now()), coalesce(%(at)s::timestamptz, now()), now()
FROM unnest(%(names)s::text[]) AS n
ON CONFLICT (name) DO UPDATE
SET next_due_at   = least(t.next_due_at, excluded.next_due_at),
    due_at        = least(t.due_at, excluded.due_at),
    due_marked_at = excluded.due_marked_at
WHERE t.next_due_at IS NULL OR t.next_due_at > excluded.next_due_at
   OR t.leased_until > now();

-- name: fleet_claim
-- The start of a fleet run: lease the listed tenants that are due (next_due_at passed,
-- never drained, or past the safety net max_sleep since their last run, when given) and
-- free (no live lease), and insert-and-lease the listed ones with no row yet. Rows another
-- run is leasing now are skipped (SKIP LOCKED while its claim commits; leased_until after),
-- and counted in `busy`. `claimed`: name, never_seen, next_due_at, in the order a run
-- should serve them (never seen first, then the longest overdue).
WITH listed AS (
  SELECT DISTINCT unnest(%(names)s::text[]) AS name
), new AS (
  INSERT INTO {tenants} (name, started_at, leased_by, leased_until)
  SELECT l.name, now(), %(run_id)s, now() + make_interval(secs => %(lease)s)
  FROM listed l
  WHERE NOT EXISTS (SELECT 1 FROM {tenants} t WHERE t.name = l.name)
  ON CONFLICT (name) DO NOTHING
  RETURNING name, NULL::timestamptz AS next_due_at
), due AS (
  SELECT t.name FROM {tenants} t
  WHERE t.name = ANY (%(names)s::text[])
    AND (t.finished_at IS NULL OR t.next_due_at <= now()
         OR t.finished_at <= now() - make_interval(secs => %(max_sleep)s::float8))
    AND (t.leased_until IS NULL OR t.leased_until <= now())
  FOR UPDATE SKIP LOCKED
), leased AS (
  UPDATE {tenants} t
  SET leased_by = %(run_id)s, leased_until = now() + make_interval(secs => %(lease)s),
      started_at = now()
  FROM due WHERE t.name = due.name
  RETURNING t.name, t.finished_at IS NULL AS never_seen, t.next_due_at
), busy AS (
  SELECT t.name FROM {tenants} t
  WHERE t.name = ANY (%(names)s::text[]) AND t.leased_until > now()
    AND t.leased_by IS DISTINCT FROM %(run_id)s
    AND (t.finished_at IS NULL OR t.next_due_at <= now()
         OR t.finished_at <= now() - make_interval(secs => %(max_sleep)s::float8))
)
SELECT (SELECT coalesce(jsonb_agg(jsonb_build_array(c.name, c.never_seen, c.next_due_at)
                                  ORDER BY c.never_seen DESC, c.next_due_at, c.name), '[]')
        FROM (SELECT name, true AS never_seen, next_due_at FROM new
              UNION ALL SELECT name, never_seen, next_due_at FROM leased) c) AS claimed,
       (SELECT coalesce(jsonb_agg(name ORDER BY name), '[]') FROM busy) AS busy;

-- name: fleet_renew
-- Before each turn of a leased tenant: the lease again from now, fenced on the run. No row:
-- another run took the tenant after this run's lease passed (it waited in line that long),
-- and this run must not drain it. started_at marks what a due mark must come after to
-- survive the turn's write-back.
UPDATE {tenants}
SET leased_until = now() + make_interval(secs => %(lease)s), started_at = now()
WHERE name = %(name)s AND leased_by = %(run_id)s
RETURNING name;

-- name: fleet_record
-- A tenant's run is over: what its run report says comes next, its outcome, and the lease
-- let go, fenced on the run. next_due_at: the report's next due job, now when it left due
-- work (work_left), or, when the run failed, a backoff (base * 2^failures, at most cap)
-- so a tenant that is down is not tried on every wake; a producer's mark that came during
-- the turn (due_marked_at >= started_at) is kept over all three.
UPDATE {tenants} t
SET next_due_at = least(
      CASE WHEN %(failed)s THEN now() + make_interval(secs => least(
             %(backoff_cap)s::float8, %(backoff_base)s::float8 * 2 ^ least(t.failures, 30)))
           WHEN %(work_left)s THEN now()
           ELSE %(next_due_at)s::timestamptz END,
      CASE WHEN t.due_marked_at >= t.started_at THEN t.due_at END),
    due_at = CASE WHEN t.due_marked_at >= t.started_at THEN t.due_at END,
    finished_at = now(),
    outcome = %(outcome)s,
    error = %(error)s,
    failures = CASE WHEN %(failed)s THEN t.failures + 1 ELSE 0 END,
    schema_version = coalesce(%(schema_version)s, t.schema_version),
    run_id = %(run_id)s,
    report = %(report)s,
    leased_by = NULL,
    leased_until = NULL
WHERE t.name = %(name)s AND t.leased_by = %(run_id)s
RETURNING t.next_due_at;

-- name: fleet_release
-- Tenants a run leased and did not reach (its --max-runtime passed, or it was stopped): the
-- lease let go, nothing else changed, so they are due for the next run.
UPDATE {tenants} SET leased_by = NULL, leased_until = NULL
WHERE name = ANY (%(names)s::text[]) AND leased_by = %(run_id)s;

-- name: fleet_versions
-- The recorded schema version of the listed tenants (drainer fleet migrate skips those
-- at the latest version).
SELECT name, schema_version FROM {tenants} WHERE name = ANY (%(names)s::text[]);

-- name: fleet_record_version
-- A tenant's jobs table was migrated (drainer fleet migrate): its version, or the error.
INSERT INTO {tenants} AS t (name, schema_version, migrated_at, error)
VALUES (%(name)s, %(schema_version)s, now(), %(error)s)
ON CONFLICT (name) DO UPDATE
SET schema_version = coalesce(excluded.schema_version, t.schema_version),
    migrated_at = CASE WHEN excluded.schema_version IS NULL THEN t.migrated_at
                       ELSE excluded.migrated_at END,
    error = coalesce(excluded.error, t.error);

-- name: fleet_status
-- Every tenant's row (of the listed ones, when names is not NULL), by name.
SELECT name, next_due_at, started_at, finished_at, outcome, error, failures, schema_version,
       migrated_at, run_id, report, leased_by, leased_until, leased_until > now() AS leased,
       now() AS now
FROM {tenants}
WHERE %(names)s::text[] IS NULL OR name = ANY (%(names)s::text[])
ORDER BY name;

-- name: fleet_next_wake
-- When the next fleet wake has known work: the listed tenants (all, when names is NULL)
-- due now, never drained, the earliest known due time, and the earliest safety net
-- (finished_at + max_sleep, when given); `unknown`: listed names with no row (never seen).
WITH listed AS (
  SELECT t.* FROM {tenants} t
  WHERE %(names)s::text[] IS NULL OR t.name = ANY (%(names)s::text[])
)
SELECT now() AS now,
       count(*) AS tenants,
       count(*) FILTER (WHERE finished_at IS NULL) AS never_drained,
       count(*) FILTER (WHERE next_due_at <= now()) AS due_now,
       count(*) FILTER (WHERE leased_until > now()) AS leased,
       min(next_due_at) AS next_due_at,
       (array_agg(name ORDER BY next_due_at) FILTER (WHERE next_due_at IS NOT NULL))[1]
         AS next_tenant,
       min(finished_at) + make_interval(secs => %(max_sleep)s::float8) AS safety_net_at,
       coalesce(cardinality(%(names)s::text[]), 0)
         - (SELECT count(DISTINCT name) FROM listed) AS unknown
FROM listed;
