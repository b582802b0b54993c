"""drainer.settings.Settings as plain data, for start-up without pydantic. GENERATED.

Do not edit: change drainer/settings.py, then run ``python -m drainer._settings_gen``
(tests/unit/test_settings_table.py fails while this file is stale).
"""

from __future__ import annotations

from typing import Any, Literal

from drainer._settings_core import Secret, Spec, dsn_of, idle_timeout_of

#: Every settings field, in the order of drainer.settings.Settings.
FIELDS: tuple[Spec, ...] = (
    Spec(
        name='database_url',
        kind='secret',
        optional=True,
        default=None,
        env=('drainer_database_url', 'database_url'),
        flag='--database-url',
        scopes=('db',),
        metavar='DATABASE_URL',
        help=(
            'PostgreSQL connection string (URL or key=value). Falls back to '
            'DATABASE_URL. (env DRAINER_DATABASE_URL)'
        ),
    ),
    Spec(
        name='schema_name',
        kind='str',
        optional=False,
        default='drainer',
        env=('drainer_schema', 'schema_name', 'schema', 'drainer_schema_name'),
        flag='--schema',
        scopes=('db',),
        metavar='SCHEMA',
        help=(
            'Schema holding the jobs table (a name, never SQL). [default: drainer] '
            '(env DRAINER_SCHEMA)'
        ),
        min_length=1,
        max_length=63,
    ),
    Spec(
        name='table',
        kind='str',
        optional=False,
        default='jobs',
        env=('drainer_table',),
        flag='--table',
        scopes=('db',),
        metavar='TABLE',
        help='Name of the jobs table (a name, never SQL). [default: jobs] (env DRAINER_TABLE)',
        min_length=1,
        max_length=50,
    ),
    Spec(
        name='connect_timeout',
        kind='seconds',
        optional=False,
        default=10.0,
        env=('drainer_connect_timeout',),
        flag='--connect-timeout',
        scopes=('db',),
        metavar='CONNECT_TIMEOUT',
        help=(
            'Seconds to wait for one connection attempt. [default: 10.0] (env '
            'DRAINER_CONNECT_TIMEOUT)'
        ),
        gt=0,
    ),
    Spec(
        name='connect_retries',
        kind='int',
        optional=False,
        default=5,
        env=('drainer_connect_retries',),
        flag='--connect-retries',
        scopes=('db',),
        metavar='CONNECT_RETRIES',
        help=(
            'Connection attempts after the first, with exponential backoff, while a '
            'suspended compute resumes. [default: 5] (env DRAINER_CONNECT_RETRIES)'
        ),
        ge=0,
    ),
    Spec(
        name='statement_timeout',
        kind='seconds',
        optional=False,
        default=60.0,
        env=('drainer_statement_timeout',),
        flag='--statement-timeout',
        scopes=('db',),
        metavar='STATEMENT_TIMEOUT',
        help=(
            "statement_timeout of drainer's session (0 = none). [default: 60.0] (env "
            'DRAINER_STATEMENT_TIMEOUT)'
        ),
        ge=0,
    ),
    Spec(
        name='lock_timeout',
        kind='seconds',
        optional=False,
        default=10.0,
        env=('drainer_lock_timeout',),
        flag='--lock-timeout',
        scopes=('db',),
        metavar='LOCK_TIMEOUT',
        help=(
            "lock_timeout of drainer's session (0 = none). [default: 10.0] (env "
            'DRAINER_LOCK_TIMEOUT)'
        ),
        ge=0,
    ),
    Spec(
        name='idle_in_transaction_timeout',
        kind='seconds',
        optional=False,
        default=120.0,
        env=('drainer_idle_in_transaction_timeout',),
        flag='--idle-in-transaction-timeout',
        scopes=('db',),
        metavar='IDLE_IN_TRANSACTION_TIMEOUT',
        help=(
            "idle_in_transaction_session_timeout of drainer's session (0 = none). "
            '[default: 120.0] (env DRAINER_IDLE_IN_TRANSACTION_TIMEOUT)'
        ),
        ge=0,
    ),
    Spec(
        name='session_options',
        kind='bool',
        optional=False,
        default=True,
        env=('drainer_session_options',),
        flag='--session-options',
        scopes=('db',),
        metavar='SESSION_OPTIONS',
        help=(
            'Send the timeouts as startup options. Turn off for poolers that reject '
            "the 'options' startup parameter; the timeouts are then not set. "
            '[default: True] (env DRAINER_SESSION_OPTIONS)'
        ),
    ),
    Spec(
        name='prepared_statements',
        kind='bool',
        optional=False,
        default=True,
        env=('drainer_prepared_statements',),
        flag='--prepared-statements',
        scopes=('db',),
        metavar='PREPARED_STATEMENTS',
        help=(
            "Use psycopg's automatic server-side prepared statements. Turn off behind"
            ' PgBouncer < 1.21 or a pooler without max_prepared_statements. [default:'
            ' True] (env DRAINER_PREPARED_STATEMENTS)'
        ),
    ),
    Spec(
        name='application_name',
        kind='str',
        optional=False,
        default='drainer',
        env=('drainer_application_name',),
        flag='--application-name',
        scopes=('db',),
        metavar='APPLICATION',
        help=(
            "application_name of drainer's sessions in pg_stat_activity (helper "
            'connections add a suffix: -heartbeat, -listen). [default: drainer] (env '
            'DRAINER_APPLICATION_NAME)'
        ),
        min_length=1,
        max_length=48,
    ),
    Spec(
        name='log_level',
        kind='choice',
        optional=False,
        default='INFO',
        env=('drainer_log_level',),
        flag='--log-level',
        scopes=('db',),
        metavar='LOG_LEVEL',
        help='Log level of the messages on stderr. [default: INFO] (env DRAINER_LOG_LEVEL)',
        choices=('DEBUG', 'INFO', 'WARNING', 'ERROR'),
    ),
    Spec(
        name='log_format',
        kind='choice',
        optional=False,
        default='auto',
        env=('drainer_log_format',),
        flag='--log-format',
        scopes=('db',),
        metavar='LOG_FORMAT',
        help=(
            'Log format on stderr: JSON lines, text, or auto (text on a TTY). '
            '[default: auto] (env DRAINER_LOG_FORMAT)'
        ),
        choices=('auto', 'json', 'text'),
    ),
    Spec(
        name='app',
        kind='str',
        optional=True,
        default=None,
        env=('drainer_app',),
        flag='--app',
        scopes=('run',),
        metavar='APP',
        help=(
            'Python module that registers handlers with @task (e.g. myapp.jobs). (env'
            ' DRAINER_APP)'
        ),
    ),
    Spec(
        name='queues',
        kind='list',
        optional=True,
        default=None,
        env=('drainer_queues',),
        flag='--queue',
        scopes=('run',),
        metavar='QUEUE',
        help=(
            'Drain only these queues (a subset of those with handlers). Repeat the '
            'flag or separate with commas. (env DRAINER_QUEUES)'
        ),
    ),
    Spec(
        name='batch_size',
        kind='int',
        optional=False,
        default=10,
        env=('drainer_batch_size',),
        flag='--batch-size',
        scopes=('run',),
        metavar='BATCH_SIZE',
        help='Jobs claimed per statement. [default: 10] (env DRAINER_BATCH_SIZE)',
        gt=0,
        le=10000,
    ),
    Spec(
        name='concurrency',
        kind='int',
        optional=False,
        default=1,
        env=('drainer_concurrency',),
        flag='--concurrency',
        scopes=('run',),
        metavar='CONCURRENCY',
        help='Handlers running at once (threads). [default: 1] (env DRAINER_CONCURRENCY)',
        gt=0,
        le=1024,
    ),
    Spec(
        name='pipeline_depth',
        kind='int',
        optional=False,
        default=2,
        env=('drainer_pipeline_depth',),
        flag='--pipeline-depth',
        scopes=('run',),
        metavar='PIPELINE_DEPTH',
        help=(
            'Completion + claim statements in flight at once while batches run fast '
            '(libpq pipeline mode): the server runs the next while this process runs '
            'handlers. 1 sends one statement at a time. [default: 2] (env '
            'DRAINER_PIPELINE_DEPTH)'
        ),
        ge=1,
        le=8,
    ),
    Spec(
        name='lease',
        kind='seconds',
        optional=False,
        default=300.0,
        env=('drainer_lease',),
        flag='--lease',
        scopes=('run',),
        metavar='LEASE',
        help=(
            'Lease of a claimed job in seconds (locked_until = now() + lease). '
            '[default: 300.0] (env DRAINER_LEASE)'
        ),
        gt=0,
    ),
    Spec(
        name='job_timeout',
        kind='seconds',
        optional=True,
        default=None,
        env=('drainer_job_timeout',),
        flag='--job-timeout',
        scopes=('run',),
        metavar='JOB_TIMEOUT',
        help=(
            'Default time limit of one handler call in seconds (none by default). '
            '(env DRAINER_JOB_TIMEOUT)'
        ),
        gt=0,
    ),
    Spec(
        name='max_runtime',
        kind='seconds',
        optional=True,
        default=None,
        env=('drainer_max_runtime',),
        flag='--max-runtime',
        scopes=('run',),
        metavar='MAX_RUNTIME',
        help=(
            'Stop claiming after this many seconds; the report says what is left. '
            '(env DRAINER_MAX_RUNTIME)'
        ),
        gt=0,
    ),
    Spec(
        name='max_jobs',
        kind='int',
        optional=True,
        default=None,
        env=('drainer_max_jobs',),
        flag='--max-jobs',
        scopes=('run',),
        metavar='MAX_JOBS',
        help='Stop claiming after this many jobs. (env DRAINER_MAX_JOBS)',
        gt=0,
    ),
    Spec(
        name='grace',
        kind='seconds',
        optional=False,
        default=30.0,
        env=('drainer_grace',),
        flag='--grace',
        scopes=('run',),
        metavar='GRACE',
        help=(
            'On shutdown, seconds that running handlers get to finish before they are'
            ' left to their lease. [default: 30.0] (env DRAINER_GRACE)'
        ),
        ge=0,
    ),
    Spec(
        name='retry_base',
        kind='seconds',
        optional=False,
        default=10.0,
        env=('drainer_retry_base',),
        flag='--retry-base',
        scopes=('run',),
        metavar='RETRY_BASE',
        help=(
            'Retry backoff base: a failed job waits least(cap, base * 2^attempts). '
            '[default: 10.0] (env DRAINER_RETRY_BASE)'
        ),
        gt=0,
    ),
    Spec(
        name='retry_cap',
        kind='seconds',
        optional=False,
        default=3600.0,
        env=('drainer_retry_cap',),
        flag='--retry-cap',
        scopes=('run',),
        metavar='RETRY_CAP',
        help='Longest retry backoff in seconds. [default: 3600.0] (env DRAINER_RETRY_CAP)',
        gt=0,
    ),
    Spec(
        name='archive_mode',
        kind='choice',
        optional=False,
        default='delete',
        env=('drainer_archive_mode',),
        flag='--archive-mode',
        scopes=('run',),
        metavar='ARCHIVE_MODE',
        help=(
            'What the archiver does with old finished jobs: delete them, move them to'
            ' <table>_archive, or nothing. [default: delete] (env '
            'DRAINER_ARCHIVE_MODE)'
        ),
        choices=('delete', 'move', 'off'),
    ),
    Spec(
        name='archive_after',
        kind='seconds',
        optional=False,
        default=604800.0,
        env=('drainer_archive_after',),
        flag='--archive-after',
        scopes=('run',),
        metavar='ARCHIVE_AFTER',
        help=(
            'Age (since finished) after which done jobs are archived. [default: '
            '604800.0] (env DRAINER_ARCHIVE_AFTER)'
        ),
        ge=0,
    ),
    Spec(
        name='failed_retention',
        kind='seconds',
        optional=False,
        default=2592000.0,
        env=('drainer_failed_retention',),
        flag='--failed-retention',
        scopes=('run',),
        metavar='FAILED_RETENTION',
        help=(
            'Age after which failed jobs (the dead-letter queue) are archived. '
            '[default: 2592000.0] (env DRAINER_FAILED_RETENTION)'
        ),
        ge=0,
    ),
    Spec(
        name='archive_batch_size',
        kind='int',
        optional=False,
        default=10000,
        env=('drainer_archive_batch_size',),
        flag='--archive-batch-size',
        scopes=('run',),
        metavar='ARCHIVE_BATCH_SIZE',
        help=(
            'Rows deleted or moved per archive statement. [default: 10000] (env '
            'DRAINER_ARCHIVE_BATCH_SIZE)'
        ),
        gt=0,
    ),
    Spec(
        name='delete_on_complete',
        kind='bool',
        optional=False,
        default=False,
        env=('drainer_delete_on_complete',),
        flag='--delete-on-complete',
        scopes=('run',),
        metavar='DELETE_ON_COMPLETE',
        help=(
            'Delete a job when it succeeds instead of marking it done (no history). '
            '[default: False] (env DRAINER_DELETE_ON_COMPLETE)'
        ),
    ),
    Spec(
        name='vacuum_threshold',
        kind='int',
        optional=False,
        default=1000,
        env=('drainer_vacuum_threshold',),
        flag='--vacuum-threshold',
        scopes=('run',),
        metavar='VACUUM_THRESHOLD',
        help=(
            'VACUUM (ANALYZE) the table at the end of a run when n_dead_tup is at '
            'least this (0 = never). [default: 1000] (env DRAINER_VACUUM_THRESHOLD)'
        ),
        ge=0,
    ),
    Spec(
        name='vacuum_every',
        kind='int',
        optional=False,
        default=20000,
        env=('drainer_vacuum_every',),
        flag='--vacuum-every',
        scopes=('run',),
        metavar='VACUUM_EVERY',
        help=(
            'During a long drain, VACUUM the table (SKIP_LOCKED) after every this '
            'many finished jobs, so dead entries at the head of the claim index do '
            'not slow each claim down (0 = never; needs table ownership, like the '
            'end-of-run VACUUM). [default: 20000] (env DRAINER_VACUUM_EVERY)'
        ),
        ge=0,
    ),
    Spec(
        name='max_attempts',
        kind='int',
        optional=False,
        default=5,
        env=('drainer_max_attempts',),
        flag='--max-attempts',
        scopes=('enqueue',),
        metavar='MAX_ATTEMPTS',
        help='Default max_attempts of enqueued jobs. [default: 5] (env DRAINER_MAX_ATTEMPTS)',
        gt=0,
    ),
    Spec(
        name='trigger_url',
        kind='str',
        optional=True,
        default=None,
        env=('drainer_trigger_url',),
        flag='--trigger-url',
        scopes=('trigger',),
        metavar='TRIGGER_URL',
        help=(
            'URL that producers POST to after a commit to start a drain. (env '
            'DRAINER_TRIGGER_URL)'
        ),
    ),
    Spec(
        name='trigger_token',
        kind='secret',
        optional=True,
        default=None,
        env=('drainer_trigger_token',),
        flag='--trigger-token',
        scopes=('trigger',),
        metavar='TRIGGER_TOKEN',
        help='Bearer token of POST /drain. (env DRAINER_TRIGGER_TOKEN)',
    ),
    Spec(
        name='pushgateway_url',
        kind='str',
        optional=True,
        default=None,
        env=('drainer_pushgateway_url',),
        flag='--pushgateway-url',
        scopes=('run',),
        metavar='PUSHGATEWAY_URL',
        help='Prometheus Pushgateway that receives each run report. (env DRAINER_PUSHGATEWAY_URL)',
    ),
    Spec(
        name='pushgateway_instance',
        kind='str',
        optional=True,
        default=None,
        env=('drainer_pushgateway_instance',),
        flag='--pushgateway-instance',
        scopes=('run',),
        metavar='PUSHGATEWAY_INSTANCE',
        help=(
            "The 'instance' grouping key of the pushed metrics (default: the host "
            'name). Set a stable name where host names change every run (Kubernetes '
            'pods). (env DRAINER_PUSHGATEWAY_INSTANCE)'
        ),
        min_length=1,
    ),
    Spec(
        name='platform',
        kind='choice',
        optional=True,
        default=None,
        env=('drainer_platform',),
        flag='--platform',
        scopes=('wake',),
        metavar='PLATFORM',
        help='Preset idle timeout of the database platform. (env DRAINER_PLATFORM)',
        choices=('neon', 'aurora', 'relyt', 'supabase', 'always-on'),
    ),
    Spec(
        name='idle_timeout',
        kind='seconds',
        optional=True,
        default=None,
        env=('drainer_idle_timeout',),
        flag='--idle-timeout',
        scopes=('wake',),
        metavar='IDLE_TIMEOUT',
        help=(
            'Seconds of inactivity after which the compute suspends (overrides '
            '--platform). (env DRAINER_IDLE_TIMEOUT)'
        ),
        ge=0,
    ),
    Spec(
        name='wake_policy',
        kind='choice',
        optional=False,
        default='always',
        env=('drainer_wake_policy',),
        flag='--wake-policy',
        scopes=('schedule',),
        metavar='WAKE_POLICY',
        help=(
            "When a scheduled tick connects: 'always' (every tick drains) or "
            "'known-work' (only after a trigger, with due work left, when a seen "
            'retry has come due, or after --max-sleep). [default: always] (env '
            'DRAINER_WAKE_POLICY)'
        ),
        choices=('always', 'known-work'),
    ),
    Spec(
        name='max_sleep',
        kind='seconds',
        optional=False,
        default=21600.0,
        env=('drainer_max_sleep',),
        flag='--max-sleep',
        scopes=('schedule',),
        metavar='MAX_SLEEP',
        help=(
            'With --wake-policy known-work: the longest time without a run, for jobs '
            'inserted with no trigger (the safety net). [default: 21600.0] (env '
            'DRAINER_MAX_SLEEP)'
        ),
        gt=0,
    ),
    Spec(
        name='handler_margin',
        kind='seconds',
        optional=False,
        default=10.0,
        env=('drainer_handler_margin',),
        flag='--handler-margin',
        scopes=('serverless',),
        metavar='HANDLER_MARGIN',
        help=(
            "Seconds a serverless handler keeps in reserve before the platform's time"
            ' limit: it stops claiming at (time left - margin) and gives running jobs'
            ' at most half the margin to finish. [default: 10.0] (env '
            'DRAINER_HANDLER_MARGIN)'
        ),
        ge=0,
    ),
    Spec(
        name='handler_budget',
        kind='seconds',
        optional=False,
        default=60.0,
        env=('drainer_handler_budget',),
        flag='--handler-budget',
        scopes=('serverless',),
        metavar='HANDLER_BUDGET',
        help=(
            'Time limit of a Cloud Functions / HTTP function call in seconds (set it '
            "to the function's timeout); the handler drains for budget - margin. "
            '[default: 60.0] (env DRAINER_HANDLER_BUDGET)'
        ),
        gt=0,
    ),
)

FIELD_NAMES: tuple[str, ...] = tuple(spec.name for spec in FIELDS)


class SettingsValues:
    """Validated settings as plain attributes, as the CLI's fast path builds them.

    It has every field of drainer.settings.Settings with the same value pydantic would
    give (drainer/_settings_core.py), plus ``dsn`` and ``effective_idle_timeout``.
    """

    __slots__ = FIELD_NAMES

    database_url: Secret | None
    schema_name: str
    table: str
    connect_timeout: float
    connect_retries: int
    statement_timeout: float
    lock_timeout: float
    idle_in_transaction_timeout: float
    session_options: bool
    prepared_statements: bool
    application_name: str
    log_level: Literal['DEBUG', 'INFO', 'WARNING', 'ERROR']
    log_format: Literal['auto', 'json', 'text']
    app: str | None
    queues: list[str] | None
    batch_size: int
    concurrency: int
    pipeline_depth: int
    lease: float
    job_timeout: float | None
    max_runtime: float | None
    max_jobs: int | None
    grace: float
    retry_base: float
    retry_cap: float
    archive_mode: Literal['delete', 'move', 'off']
    archive_after: float
    failed_retention: float
    archive_batch_size: int
    delete_on_complete: bool
    vacuum_threshold: int
    vacuum_every: int
    max_attempts: int
    trigger_url: str | None
    trigger_token: Secret | None
    pushgateway_url: str | None
    pushgateway_instance: str | None
    platform: Literal['neon', 'aurora', 'relyt', 'supabase', 'always-on'] | None
    idle_timeout: float | None
    wake_policy: Literal['always', 'known-work']
    max_sleep: float
    handler_margin: float
    handler_budget: float

    def __init__(self, values: dict[str, Any]) -> None:
        for name in FIELD_NAMES:
            setattr(self, name, values[name])

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in FIELD_NAMES)
        return f"SettingsValues({inner})"

    @property
    def dsn(self) -> str:
        """The connection string; raises ConfigError when none is set."""
        return dsn_of(self.database_url)

    @property
    def effective_idle_timeout(self) -> float | None:
        """--idle-timeout, else the --platform preset, else None (unknown)."""
        return idle_timeout_of(self.idle_timeout, self.platform)
