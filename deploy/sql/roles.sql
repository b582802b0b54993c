-- Least-privilege roles for drainer and for the producers that enqueue jobs.
--
-- Run it with psql as the owner of the jobs table (the role that ran `drainer migrate`),
-- after `drainer migrate`:
--
--   psql "$OWNER_DATABASE_URL" -f deploy/sql/roles.sql
--   psql "$OWNER_DATABASE_URL" -v schema=drainer -v table=jobs \
--        -v drainer_role=drainer -v producer_role=drainer_producer -f deploy/sql/roles.sql
--
-- Without psql (a web SQL console): `drainer migrate --print-grants [--drainer-role NAME]
-- [--producer-role NAME] [--maintain]` prints the same statements for the configured schema
-- and table, names filled in (a test checks both give the same privileges).
--
-- Variables (psql -v name=value), all optional:
--   schema         schema of the jobs table               [drainer]
--   table          the jobs table                         [jobs]
--   drainer_role   the role `drainer run-once/serve/...`  [drainer]
--   producer_role  the role your application enqueues as  [drainer_producer]
--   maintain       on: also GRANT MAINTAIN (PostgreSQL 17+) so drainer may VACUUM  [off]
--
-- The roles are created with LOGIN and no password when missing (set one with
-- `\password drainer`, or use your platform's console); existing roles are only granted.
-- Running the script again gives the same grants: it first revokes everything the two
-- roles hold on the four tables, then grants exactly this:
--
--   drainer role:   USAGE on the schema;
--                   SELECT, INSERT, UPDATE, DELETE on <table>   (claim is UPDATE ... FOR
--                     UPDATE SKIP LOCKED; complete/fail/extend/release/reap are UPDATEs;
--                     archive and delete-on-complete are DELETEs; INSERT lets handlers
--                     enqueue follow-up jobs);
--                   SELECT, INSERT on <table>_archive  (archive-mode=move inserts there;
--                     archived rows are never updated, pruning the archive is the owner's);
--                   SELECT on drainer_migrations  (every run checks the schema version);
--                   SELECT, INSERT, UPDATE on <table>_queues  (every run reads the paused
--                     queues; `drainer pause` / `resume` write them).
--   producer role:  USAGE on the schema;
--                   INSERT on the columns a producer sets (queue, payload, run_at,
--                     priority, max_attempts, dedup_key, trace_context): it cannot insert
--                     a job that is already 'running' or has used attempts;
--                   SELECT on (id, dedup_key, status, queue) only (queue: `drainer
--                     enqueue` warns about a queue never seen): enqueue is
--                     INSERT ... ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND
--                     status IN ('queued','running') DO NOTHING RETURNING id, and
--                     PostgreSQL checks SELECT on the conflict target's columns (dedup_key,
--                     status: "permission denied for table jobs" without it) and on the
--                     RETURNING column (id). Payloads of other jobs stay unreadable, and
--                     without UPDATE the producer cannot claim (FOR UPDATE needs UPDATE);
--                   SELECT on drainer_migrations  (`drainer enqueue` checks the version).
--   The id is GENERATED ALWAYS AS IDENTITY: inserting needs no grant on its sequence.
--   Bulk enqueue with dedup keys stages rows in a temporary table: that uses the TEMPORARY
--   privilege on the database, which PUBLIC has by default (grant it if you revoked it;
--   CONNECT likewise).
--
-- VACUUM: only the table's owner may VACUUM it (PostgreSQL 17 adds the MAINTAIN
-- privilege, granted here with -v maintain=on). Without either, drainer skips its
-- end-of-run VACUUM with a warning ("skipping VACUUM ... does not own the jobs table")
-- and reports n_dead_tup and last_autovacuum as usual; vacuum the table as its owner then
-- (e.g. a daily `drainer run-once` with the owner's DSN, or `vacuumdb -t drainer.jobs`).
--
-- Your handlers' own tables are not covered: grant the drainer role what they touch.

\set ON_ERROR_STOP on
\if :{?schema}
\else
  \set schema drainer
\endif
\if :{?table}
\else
  \set table jobs
\endif
\if :{?drainer_role}
\else
  \set drainer_role drainer
\endif
\if :{?producer_role}
\else
  \set producer_role drainer_producer
\endif
\if :{?maintain}
\else
  \set maintain off
\endif
\set archive :table _archive
\set control :table _queues
\if :maintain
  SELECT current_setting('server_version_num')::int >= 170000 AS server_has_maintain \gset
  \if :server_has_maintain
  \else
    DO $$ BEGIN RAISE EXCEPTION 'roles.sql: -v maintain=on needs PostgreSQL 17 or later'; END $$;
  \endif
\endif

BEGIN;

SELECT format('CREATE ROLE %I LOGIN', :'drainer_role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'drainer_role') \gexec
SELECT format('CREATE ROLE %I LOGIN', :'producer_role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'producer_role') \gexec

REVOKE ALL ON SCHEMA :"schema" FROM :"drainer_role", :"producer_role";
REVOKE ALL ON :"schema".:"table", :"schema".:"archive", :"schema".drainer_migrations,
  :"schema".:"control" FROM :"drainer_role", :"producer_role";

-- the drainer
GRANT USAGE ON SCHEMA :"schema" TO :"drainer_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".:"table" TO :"drainer_role";
GRANT SELECT, INSERT ON :"schema".:"archive" TO :"drainer_role";
GRANT SELECT ON :"schema".drainer_migrations TO :"drainer_role";
GRANT SELECT, INSERT, UPDATE ON :"schema".:"control" TO :"drainer_role";
\if :maintain
GRANT MAINTAIN ON :"schema".:"table" TO :"drainer_role";
\endif

-- producers
GRANT USAGE ON SCHEMA :"schema" TO :"producer_role";
GRANT INSERT (queue, payload, run_at, priority, max_attempts, dedup_key, trace_context)
  ON :"schema".:"table" TO :"producer_role";
GRANT SELECT (id, dedup_key, status, queue) ON :"schema".:"table" TO :"producer_role";
GRANT SELECT ON :"schema".drainer_migrations TO :"producer_role";

COMMIT;
