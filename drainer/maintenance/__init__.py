"""Maintenance services: each has a ``run_once()`` returning a small result of counts.

Their named defaults are here rather than in each service's module, so that Settings
imports them without loading psycopg (every command line builds Settings).
"""

#: Done jobs are archived this many seconds after they finished (``--archive-after``).
ARCHIVE_AFTER_DEFAULT = 7 * 86400.0
#: Failed jobs (the dead-letter queue) are kept this long (``--failed-retention``).
FAILED_RETENTION_DEFAULT = 30 * 86400.0
#: Rows one archive statement handles at most (``--archive-batch-size``).
ARCHIVE_BATCH_DEFAULT = 10_000
#: After a drain, VACUUM when the table has at least this many dead tuples (0: never).
VACUUM_THRESHOLD_DEFAULT = 1_000
#: During a drain, VACUUM between batches after every this many finished jobs (0: never).
VACUUM_EVERY_DEFAULT = 20_000
#: statement_timeout (seconds) of drainer's VACUUMs, instead of the session's statement_timeout
#: meant for job statements: the bloated table a VACUUM exists for is the one where it is slow
#: (``--maintenance-timeout``; 0: none).
MAINTENANCE_TIMEOUT_DEFAULT = 600.0
