"""The jobs table of *Postgres as a job queue* (docs/sources.md), verbatim, for the tests
that adopt or race on it: the CREATE TABLE of bench/pgbench/article_schema.sql (which the
capacity benchmark runs), the table's name a hole."""

from pathlib import Path

_DDL = (Path(__file__).resolve().parent.parent / "bench" / "pgbench" /
        "article_schema.sql").read_text()
_START = _DDL.index("CREATE TABLE jobs (")

ARTICLE_CREATE_TABLE = "\n" + _DDL[_START:_DDL.index("\n);", _START) + 2].replace(
    "CREATE TABLE jobs (", "CREATE TABLE {t} (", 1)
