"""All of drainer's options: flags, ``DRAINER_*`` variables and ``[tool.drainer]``.

``Settings`` is the one definition of every option and the authority on what is valid:
the CLI builds its flags, their help and its errors from it (drainer/cli/_base.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from drainer._pyproject import PyprojectSource
from drainer._redact import password_of, redact, remember_secret
from drainer.errors import ConfigError
from drainer.job import DEFAULT_MAX_ATTEMPTS, DEFAULT_RESULT_MAX_BYTES
from drainer.maintenance import (
    ARCHIVE_AFTER_DEFAULT,
    ARCHIVE_BATCH_DEFAULT,
    FAILED_RETENTION_DEFAULT,
    MAINTENANCE_TIMEOUT_DEFAULT,
    VACUUM_EVERY_DEFAULT,
    VACUUM_THRESHOLD_DEFAULT,
)
from drainer.queue_limits import check_max_running, check_rate_limit, split_pairs
from drainer.waking import DEFAULT_MAX_SLEEP_S, PLATFORM_IDLE_TIMEOUTS

_DURATION = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|min|h|d|w)?\s*$", re.I)
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
#: SQLAlchemy's form of a PostgreSQL URL names the driver: ``postgresql+psycopg://``.
_SQLALCHEMY_URL = re.compile(r"^\s*postgresql\+[a-z0-9_]+://", re.I)
#: A connection string that starts like a URL: libpq reads it as one only with these
#: schemes, and anything else as key=value words (``missing "=" after ...``).
_URL_SCHEME = re.compile(r"^\s*(?P<scheme>[a-z][a-z0-9+.-]*)://", re.I)
URL_SCHEMES = ("postgresql", "postgres")


def parse_duration(value: Any) -> Any:
    """Accept ``90``, ``"90"``, ``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``; return seconds."""
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, str):
        m = _DURATION.match(value)
        if not m:
            if _DURATION.match(value.strip().removeprefix("-")):
                raise ValueError(f"not a duration: {value!r} (a duration is never negative: "
                                 "use seconds or 30s, 15m, 12h, 7d)")
            raise ValueError(f"not a duration: {value!r} (use seconds or 30s, 15m, 12h, 7d)")
        return float(m.group("n")) * _UNIT_S[(m.group("unit") or "s").lower()]
    return value


def split_list(value: Any) -> Any:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; anything else unchanged."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def plain_url(dsn: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://``, ``+asyncpg``, ``+psycopg2``) as the
    plain ``postgresql://`` URL libpq reads; anything else unchanged."""
    return _SQLALCHEMY_URL.sub("postgresql://", dsn, count=1)


def check_url_scheme(dsn: str, where: str) -> None:
    """ConfigError naming the scheme of a URL that is no PostgreSQL URL (``postgress://``),
    which libpq would read as key=value words and refuse in its own terms."""
    m = _URL_SCHEME.match(dsn)
    if m and m["scheme"].lower() not in URL_SCHEMES:
        raise ConfigError(f"{where}: the URL's scheme {m['scheme']!r} is not postgresql:// "
                          "or postgres://")


# Named defaults of the options whose services take them from Settings (the table's
# location, the drain, the connection, the serverless handlers); the other defaults are
# imported above from the module that uses them.
DEFAULT_SCHEMA = "drainer"
DEFAULT_TABLE = "jobs"
DEFAULT_BATCH_SIZE = 10
DEFAULT_PIPELINE_DEPTH = 4
DEFAULT_LEASE_S = 300.0
DEFAULT_GRACE_S = 30.0
DEFAULT_RETRY_BASE_S = 10.0
DEFAULT_RETRY_CAP_S = 3600.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_CONNECT_RETRIES = 5
DEFAULT_STATEMENT_TIMEOUT_S = 60.0
DEFAULT_LOCK_TIMEOUT_S = 10.0
DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_S = 120.0
DEFAULT_APPLICATION_NAME = "drainer"
#: Within about this many seconds a connection notices a dead peer (a partition, a host that
#: went away): TCP keepalives on an idle connection, tcp_user_timeout on unacknowledged data
#: (drainer.db.connect.keepalive_options). Client-side socket options, so they work through
#: poolers too; a frozen server whose kernel still answers is the --max-runtime watchdog's.
DEFAULT_DEAD_PEER_TIMEOUT_S = 10.0
DEFAULT_HANDLER_MARGIN_S = 10.0
DEFAULT_HANDLER_BUDGET_S = 60.0  # Cloud Functions' default timeout
DEFAULT_FLEET_CONCURRENCY = 4  # drainer fleet run-once: tenants drained at once
DEFAULT_FLEET_TENANT_BUDGET_S = 60.0  # drainer fleet run-once: one tenant's turn

Seconds = Annotated[float, BeforeValidator(parse_duration)]
QueueList = Annotated[list[str] | None, BeforeValidator(split_list)]
#: Per-queue limits: QUEUE=VALUE items, from "a=3,b=1", repeated flags or a pyproject table.
QueueMaxRunning = Annotated[list[str] | None, BeforeValidator(split_pairs),
                            AfterValidator(check_max_running)]
QueueRateLimit = Annotated[list[str] | None, BeforeValidator(split_pairs),
                           AfterValidator(check_rate_limit)]
#: A log level in any case (DRAINER_LOG_LEVEL=debug, as --log-level debug).
LogLevel = Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"],
                     BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v)]


def _opt(default: Any, description: str, *scopes: str, **kw: Any) -> Any:
    """A field with its description and the CLI scopes (sets of commands) that take it."""
    extra: dict[str, Any] = {"scopes": list(scopes)}
    extra.update(kw.pop("json_schema_extra", {}))
    return Field(default, description=description, json_schema_extra=extra, **kw)


class Settings(BaseSettings):
    """Every drainer option. Precedence: flags, then environment, then pyproject, then defaults."""

    model_config = SettingsConfigDict(
        env_prefix="DRAINER_",
        populate_by_name=True,
        extra="ignore",
        hide_input_in_errors=True,
        case_sensitive=False,
    )

    # -- database -------------------------------------------------------------------------------
    database_url: SecretStr | None = _opt(
        None,
        "PostgreSQL connection string (URL or key=value). Falls back to DATABASE_URL.",
        "db",
        validation_alias=AliasChoices("DRAINER_DATABASE_URL", "DATABASE_URL", "database_url"),
    )
    schema_name: str = _opt(
        DEFAULT_SCHEMA,
        "Schema holding the jobs table (a name, never SQL).",
        "db",
        min_length=1,
        max_length=63,
        validation_alias=AliasChoices("DRAINER_SCHEMA", "schema_name", "schema"),
        json_schema_extra={"flag": "--schema"},
    )
    table: str = _opt(
        DEFAULT_TABLE, "Name of the jobs table (a name, never SQL).", "db", min_length=1,
        max_length=50,
    )
    connect_timeout: Seconds = _opt(
        DEFAULT_CONNECT_TIMEOUT_S, "Seconds to wait for one connection attempt.", "db", gt=0
    )
    connect_retries: int = _opt(
        DEFAULT_CONNECT_RETRIES,
        "Connection attempts after the first, with exponential backoff, while a suspended "
        "compute resumes. The commands a person waits for (status, jobs, show, retry, "
        "cancel, purge, pause, resume, limit, audit) make 1 unless this is set.",
        "db",
        ge=0,
    )
    statement_timeout: Seconds = _opt(
        DEFAULT_STATEMENT_TIMEOUT_S, "statement_timeout of drainer's session (0 = none).", "db",
        ge=0,
    )
    lock_timeout: Seconds = _opt(
        DEFAULT_LOCK_TIMEOUT_S, "lock_timeout of drainer's session (0 = none).", "db", ge=0
    )
    idle_in_transaction_timeout: Seconds = _opt(
        DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_S,
        "idle_in_transaction_session_timeout of drainer's session (0 = none).",
        "db",
        ge=0,
    )
    dead_peer_timeout: Seconds = _opt(
        DEFAULT_DEAD_PEER_TIMEOUT_S,
        "Notice a dead peer (a partition, a host gone) within about this many seconds: TCP "
        "keepalives and tcp_user_timeout on every connection (0 = the OS defaults, ~2 h).",
        "db",
        ge=0,
    )
    session_options: bool = _opt(
        True,
        "Send the timeouts (and jit=off) as startup options. Turn off for poolers that "
        "reject the 'options' startup parameter; the timeouts are then not set.",
        "db",
    )
    prepared_statements: bool = _opt(
        True,
        "Use psycopg's automatic server-side prepared statements. Turn off behind "
        "PgBouncer < 1.21 or a pooler without max_prepared_statements.",
        "db",
    )
    application_name: str = _opt(
        DEFAULT_APPLICATION_NAME,
        "application_name of drainer's sessions in pg_stat_activity (helper connections "
        "add a suffix: -heartbeat, -listen).",
        "db",
        min_length=1,
        max_length=48,
    )
    log_level: LogLevel = _opt(
        "INFO", "Log level of the messages on stderr.", "db"
    )
    log_format: Literal["auto", "json", "text"] = _opt(
        "auto", "Log format on stderr: JSON lines, text, or auto (text on a TTY).", "db"
    )

    # -- handlers and the drain -----------------------------------------------------------------
    app: str | None = _opt(
        None, "Python module that registers handlers with @task (e.g. myapp.jobs). For "
        "enqueue: the queue must have a handler in it. For jobs and show: attempts are shown "
        "against the task's max_attempts when it sets one.", "run", "enqueue", "app"
    )
    queues: QueueList = _opt(
        None,
        "Drain only these queues (a subset of those with handlers). Repeat the flag or "
        "separate with commas.",
        "run",
        json_schema_extra={"flag": "--queue"},
    )
    batch_size: int = _opt(
        DEFAULT_BATCH_SIZE, "Jobs claimed per statement, at least: once a few claims are "
        "timed, claims grow until a batch runs for 8 round trips (at most 1024 jobs).",
        "run", gt=0, le=10_000)
    concurrency: int = _opt(1, "Handlers running at once (threads).", "run", gt=0, le=1024)
    pipeline_depth: int = _opt(
        DEFAULT_PIPELINE_DEPTH,
        "Completion + claim statements in flight at once while batches run fast (libpq "
        "pipeline mode): the server runs the next while this process runs handlers. 1 sends "
        "one statement at a time.", "run", ge=1, le=8,
    )
    lease: Seconds = _opt(
        DEFAULT_LEASE_S, "Lease of a claimed job in seconds (locked_until = now() + lease).",
        "run", gt=0,
    )
    job_timeout: Seconds | None = _opt(
        None, "Default time limit of one handler call in seconds (none by default).", "run",
        gt=0,
    )
    max_runtime: Seconds | None = _opt(
        None, "Stop claiming after this many seconds; the report says what is left.", "run",
        gt=0,
    )
    max_jobs: int | None = _opt(None, "Stop claiming after this many jobs.", "run", gt=0)
    grace: Seconds = _opt(
        DEFAULT_GRACE_S,
        "On shutdown, seconds that running handlers get to finish before they are left to "
        "their lease.",
        "run",
        ge=0,
    )
    retry_base: Seconds = _opt(
        DEFAULT_RETRY_BASE_S,
        "Retry backoff base: a failed job waits least(cap, base * 2^attempts).",
        "run", gt=0,
    )
    retry_cap: Seconds = _opt(DEFAULT_RETRY_CAP_S, "Longest retry backoff in seconds.", "run",
                              gt=0)
    retry_linger: Seconds = _opt(
        0.0,
        "Suspend-aware retries: before exiting, a drain waits up to this many seconds for a "
        "retry or snooze of its own that is due that soon, and runs it in the same wake "
        "(0: off; the next wake runs it).",
        "run", ge=0,
    )
    max_running: QueueMaxRunning = _opt(
        None,
        "Per-queue concurrency limits across all drainers, QUEUE=N: at most N jobs of the "
        "queue running at once. Repeat the flag or separate with commas (emails=3,slow=1). "
        "Overrides the task's max_running; `drainer limit` overrides this.",
        "run",
        json_schema_extra={"metavar": "QUEUE=N"},
    )
    rate_limit: QueueRateLimit = _opt(
        None,
        "Per-queue rate limits across all drainers, QUEUE=COUNT/PERIOD: at most COUNT jobs "
        "of the queue claimed in any PERIOD (emails=10/m, api=5/s). Repeat the flag or "
        "separate with commas. Overrides the task's rate_limit; `drainer limit` overrides "
        "this.",
        "run",
        json_schema_extra={"metavar": "QUEUE=RATE"},
    )
    result_max_bytes: int = _opt(
        DEFAULT_RESULT_MAX_BYTES,
        "Largest handler return value kept in the job's result column (bytes of JSON); a "
        "larger one fails the job with a ResultError.",
        "run", ge=0,
    )
    archive_mode: Literal["delete", "move", "off"] = _opt(
        "delete",
        "What the archiver does with old finished jobs: delete them, move them to "
        "<table>_archive, or nothing.",
        "run",
    )
    archive_after: Seconds = _opt(
        ARCHIVE_AFTER_DEFAULT, "Age (since finished) after which done jobs are archived.",
        "run", ge=0,
    )
    failed_retention: Seconds = _opt(
        FAILED_RETENTION_DEFAULT,
        "Age after which failed jobs (the dead-letter queue) are archived.",
        "run", ge=0,
    )
    archive_batch_size: int = _opt(
        ARCHIVE_BATCH_DEFAULT, "Rows deleted or moved per archive statement.", "run", gt=0
    )
    delete_on_complete: bool = _opt(
        False, "Delete a job when it succeeds instead of marking it done (no history).", "run"
    )
    vacuum_threshold: int = _opt(
        VACUUM_THRESHOLD_DEFAULT,
        "VACUUM (ANALYZE) the table at the end of a run when n_dead_tup is at least this "
        "(0 = never).",
        "run",
        ge=0,
    )
    vacuum_every: int = _opt(
        VACUUM_EVERY_DEFAULT,
        "During a long drain, VACUUM the table (SKIP_LOCKED) after every this many finished "
        "jobs, so dead entries at the head of the claim index do not slow each claim down "
        "(0 = never; needs table ownership, like the end-of-run VACUUM).",
        "run",
        ge=0,
    )
    maintenance_timeout: Seconds = _opt(
        MAINTENANCE_TIMEOUT_DEFAULT,
        "statement_timeout of drainer's VACUUMs (end of run and between batches) instead of "
        "--statement-timeout (0 = none); a cancelled VACUUM is a warning, not a failed run.",
        "run",
        ge=0,
    )

    # -- producers --------------------------------------------------------------------------------
    max_attempts: int = _opt(
        DEFAULT_MAX_ATTEMPTS, "Default max_attempts of enqueued jobs.", "enqueue", gt=0
    )
    trigger_url: str | None = _opt(
        None, "URL that producers POST to after a commit to start a drain.", "trigger"
    )
    trigger_token: SecretStr | None = _opt(
        None, "Bearer token of POST /drain.", "trigger"
    )
    ui_token: SecretStr | None = _opt(
        None,
        "Token of `drainer ui`: its actions (retry, cancel, pause, limits) need it, and so "
        "does viewing when it listens on anything but loopback; at least 16 characters.",
        "ui",
    )
    pushgateway_url: str | None = _opt(
        None, "Prometheus Pushgateway that receives each run report.", "run"
    )
    otel: Literal["auto", "on", "off"] = _opt(
        "auto",
        "OpenTelemetry: each job in a span linked to its producer's, flushed at the end of "
        "the run. auto: when the app has configured a tracer provider; on; off "
        "(drainer[otel]).",
        "run",
    )
    pushgateway_instance: str | None = _opt(
        None,
        "The 'instance' grouping key of the pushed metrics (default: the host name). Set a "
        "stable name where host names change every run (Kubernetes pods).",
        "run",
        min_length=1,
    )

    # -- waking ---------------------------------------------------------------------------------
    platform: Literal["neon", "aurora", "relyt", "supabase", "always-on"] | None = _opt(
        None, "Preset idle timeout of the database platform.", "wake"
    )
    idle_timeout: Seconds | None = _opt(
        None,
        "Seconds of inactivity after which the compute suspends (overrides --platform).",
        "wake",
        ge=0,
    )
    wake_policy: Literal["always", "known-work"] = _opt(
        "always",
        "When a scheduled tick connects: 'always' (every tick drains) or 'known-work' (only "
        "after a trigger, with due work left, when a seen retry has come due, or after "
        "--max-sleep).",
        "schedule",
    )
    max_sleep: Seconds = _opt(
        DEFAULT_MAX_SLEEP_S,
        "With --wake-policy known-work: the longest time without a run, for jobs inserted "
        "with no trigger (the safety net).",
        "schedule",
        gt=0,
    )

    # -- fleets of tenant databases (drainer fleet) -----------------------------------------------
    fleet_url: SecretStr | None = _opt(
        None,
        "PostgreSQL URL of the fleet's control database: its table <schema>.fleet_tenants "
        "holds each tenant's next known due time, last run and outcome.",
        "fleet",
    )
    fleet_tenants: str | None = _opt(
        None,
        "Tenants file: one tenant a line, NAME URL; # comments; ${VAR} (environment) and "
        "${file:PATH} in a URL.",
        "fleet",
        json_schema_extra={"flag": "--tenants"},
    )
    fleet_tenants_query: str | None = _opt(
        None,
        "Tenants from the control database: a table (schema.table) with columns name and "
        "url, or a query returning them.",
        "fleet",
        json_schema_extra={"flag": "--tenants-query"},
    )
    fleet_concurrency: int = _opt(
        DEFAULT_FLEET_CONCURRENCY,
        "Tenants drained (or migrated) at once, each on a thread with its own connection.",
        "fleet", gt=0, le=256,
    )
    fleet_tenant_budget: Seconds = _opt(
        DEFAULT_FLEET_TENANT_BUDGET_S,
        "Time one turn of a tenant may drain; a tenant left with due work goes to the back "
        "of the line for another turn, within --max-runtime (the whole fleet run's).",
        "fleet", gt=0,
        json_schema_extra={"flag": "--tenant-budget"},
    )
    fleet_shard: str | None = _opt(
        None,
        "Serve only shard INDEX/COUNT of the tenants (by the SHA-256 of each name). Default: "
        "$JOB_COMPLETION_INDEX of --shard-count (a pod of a Kubernetes Indexed Job).",
        "fleet",
        json_schema_extra={"flag": "--shard"},
    )
    fleet_shard_count: int | None = _opt(
        None,
        "Shards in all (the Indexed Job's completions); with $JOB_COMPLETION_INDEX it "
        "names this pod's shard.",
        "fleet", gt=0,
        json_schema_extra={"flag": "--shard-count"},
    )
    fleet_max_sleep: Seconds | None = _opt(
        None,
        "Safety net: a tenant with no run for this long is drained though no work is known "
        "(jobs inserted without `drainer fleet due`). Unset: an idle tenant is never "
        "connected to.",
        "fleet", gt=0,
    )

    # -- serverless handlers (environment / pyproject only) ---------------------------------------
    handler_margin: Seconds = _opt(
        DEFAULT_HANDLER_MARGIN_S,
        "Seconds a serverless handler keeps in reserve before the platform's time limit: "
        "it stops claiming at (time left - margin) and gives running jobs at most half the "
        "margin to finish.",
        "serverless",
        ge=0,
    )
    handler_budget: Seconds = _opt(
        DEFAULT_HANDLER_BUDGET_S,
        "Time limit of a Cloud Functions / HTTP function call in seconds (set it to the "
        "function's timeout); the handler drains for budget - margin.",
        "serverless",
        gt=0,
    )

    @field_validator("database_url", "fleet_url", mode="before")
    @classmethod
    def _plain_database_url(cls, value: Any) -> Any:
        if isinstance(value, SecretStr):
            return SecretStr(plain_url(value.get_secret_value()))
        return plain_url(value) if isinstance(value, str) else value

    @property
    def dsn(self) -> str:
        """The connection string; raises ConfigError when none is set."""
        url = self.database_url
        if url is None or not url.get_secret_value().strip():
            raise ConfigError(
                "no database URL: set DRAINER_DATABASE_URL (or DATABASE_URL) or pass "
                "--database-url"
            )
        dsn = url.get_secret_value()
        check_url_scheme(dsn, "the database URL (DRAINER_DATABASE_URL, DATABASE_URL or "
                         "--database-url)")
        return dsn

    @property
    def effective_idle_timeout(self) -> float | None:
        """--idle-timeout, else the --platform preset, else None (unknown)."""
        if self.idle_timeout is not None:
            return self.idle_timeout
        if self.platform is not None:
            return PLATFORM_IDLE_TIMEOUTS[self.platform]
        return None


def _customise(
    cls: type[BaseSettings],
    settings_cls: type[BaseSettings],
    init_settings: PydanticBaseSettingsSource,
    env_settings: PydanticBaseSettingsSource,
    dotenv_settings: PydanticBaseSettingsSource,
    file_secret_settings: PydanticBaseSettingsSource,
) -> tuple[PydanticBaseSettingsSource, ...]:
    return (init_settings, env_settings, PyprojectSource(settings_cls))


Settings.settings_customise_sources = classmethod(_customise)  # type: ignore[assignment,method-assign]


def flag_of(name: str) -> str:
    """The CLI flag of a settings field."""
    field = Settings.model_fields[name]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    flag = extra.get("flag")
    return str(flag) if flag else "--" + name.replace("_", "-")


def env_of(name: str) -> str:
    """The environment variable of a settings field."""
    if name == "schema_name":
        return "DRAINER_SCHEMA"
    return "DRAINER_" + name.upper()


def load_settings(**overrides: Any) -> Settings:
    """Build Settings from flags (``overrides``), environment and pyproject.

    A missing or invalid value raises ConfigError with one line naming the flag and
    the variable; no input value (the DSN may hold a password) is echoed.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = str(err["loc"][0]) if err["loc"] else "?"
        name = _field_for_loc(loc)
        where = f"{flag_of(name)} / {env_of(name)}" if name else loc
        raise ConfigError(redact(f"invalid setting {where}: {err['msg']}")) from None
    # the DSN's password and the tokens: no output ever shows them
    if settings.database_url is not None:
        remember_secret(password_of(settings.database_url.get_secret_value()))
    for token in (settings.trigger_token, settings.ui_token):
        if token is not None:
            remember_secret(token.get_secret_value())
    return settings


def _field_for_loc(loc: str) -> str | None:
    fields = Settings.model_fields
    if loc in fields:
        return loc
    for name, field in fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices) and loc.lower() in {
            str(c).lower() for c in alias.choices
        }:
            return name
    return None
