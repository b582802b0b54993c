"""drainer's named statements: ``sql/queries.sql`` loaded once, rendered per connection."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

#: ``-- name: x`` heads a statement; ``-- fragment: x`` or ``-- fragment: x(hole, ...)`` a
#: piece of statement that others insert with ``@x`` or ``@x(hole => text, ...)``.
_HEADER = re.compile(
    r"^-- (?P<kind>name|fragment): (?P<name>[a-z_]+)(?:\((?P<holes>[a-z_, ]*)\))?[ \t]*$",
    re.M)
#: ``@x``: not after a word character, ``@`` or ``<`` (PostgreSQL's ``@>``/``<@``/``@@``).
_USE = re.compile(r"(?<![\w@<])@(?P<name>[a-z_][a-z0-9_]*)")
#: ``$x`` inside a fragment: a hole (not ``$1``, nor a ``$tag$`` dollar quote).
_HOLE = re.compile(r"(?<![\w$])\$(?P<name>[a-z_][a-z0-9_]*)(?![\w$])")


class _Fragment:
    def __init__(self, name: str, holes: tuple[str, ...], body: str) -> None:
        self.name, self.holes, self.body = name, holes, body
        found = {m["name"] for m in _HOLE.finditer(body)}
        if found != set(holes):
            raise ValueError(f"queries.sql: fragment {name}: holes declared "
                             f"({', '.join(holes)}), holes in its text "
                             f"({', '.join(sorted(found))})")


#: What a comment must skip: a string ('...', with '' inside; E'...' with backslash escapes
#: too), a quoted identifier ("..."), a dollar-quoted string ($tag$...$tag$); and a comment
#: with the blanks before it.
_LEXEME = re.compile(r"(?<![\w$])[eE]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'"
                     r'|"(?:[^"]|"")*"'
                     r"|(?P<dollar>\$(?:[A-Za-z_]\w*)?\$)(?:.|\n)*?(?P=dollar)"
                     r"|(?P<comment>[ \t]*--[^\n]*)")


def strip_comments(text: str) -> str:
    """``text`` without its ``--`` comments (those inside strings, quoted identifiers and
    dollar quotes are text, and stay), a line left blank by one dropped: they say why to
    the reader of queries.sql, and were 6% of the run's first Query, sent over the link."""
    out = _LEXEME.sub(lambda m: "" if m["comment"] is not None else m[0], text)
    return "\n".join(ln for ln, was in zip(out.split("\n"), text.split("\n"), strict=True)
                     if ln or not was)


def _body(text: str) -> str:
    """A block's SQL: its comments (the description and the notes) and the final ``;``
    dropped."""
    return strip_comments(text.strip()).strip().rstrip(";").rstrip()


def _arguments(text: str, start: int, where: str) -> tuple[dict[str, str], int]:
    """The ``(hole => text, ...)`` that opens at ``text[start]``, and the index after it:
    commas split it only outside parentheses and quotes; each text is put on one line."""
    depth, quoted, parts, begin = 0, False, [], start + 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "'":
            quoted = not quoted
        elif quoted:
            continue
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                parts.append(text[begin:i])
                break
        elif c == "," and depth == 1:
            parts.append(text[begin:i])
            begin = i + 1
    else:
        raise ValueError(f"queries.sql: {where}: unclosed ( after a fragment's name")
    if len(parts) == 1 and not parts[0].strip():
        parts = []  # @x(): no holes
    args: dict[str, str] = {}
    for part in parts:
        hole, arrow, value = part.partition("=>")
        hole = hole.strip()
        if not arrow or not re.fullmatch(r"[a-z_][a-z0-9_]*", hole) or hole in args:
            raise ValueError(f"queries.sql: {where}: {part.strip()!r} is not `hole => text`"
                             " (each hole once)")
        args[hole] = re.sub(r"\s*\n\s*", " ", value.strip())
    return args, i + 1


def _fill(body: str, args: dict[str, str]) -> str:
    """A fragment's text with each ``$hole`` replaced by its text."""
    return _HOLE.sub(lambda h: args[h["name"]], body)


def _expand(text: str, fragments: dict[str, _Fragment], used: set[str],
            stack: tuple[str, ...]) -> str:
    """``text`` with every ``@fragment`` replaced by its text, holes filled, fragments in
    fragments too; the inserted lines take the indentation of the line of the ``@``."""
    out: list[str] = []
    pos = 0
    while m := _USE.search(text, pos):
        name, where = m["name"], " -> ".join(stack)
        fragment = fragments.get(name)
        if fragment is None:
            raise ValueError(f"queries.sql: {where}: unknown fragment @{name}")
        if name in stack:
            raise ValueError(f"queries.sql: {where}: fragment @{name} includes itself")
        args: dict[str, str] = {}
        end = m.end()
        if end < len(text) and text[end] == "(":
            args, end = _arguments(text, end, where)
        if set(args) != set(fragment.holes):
            raise ValueError(f"queries.sql: {where}: @{name} takes "
                             f"({', '.join(fragment.holes)}), given ({', '.join(args)})")
        used.add(name)
        body = _fill(fragment.body, args)
        body = _expand(body, fragments, used, (*stack, name))
        line_start = text.rfind("\n", 0, m.start()) + 1
        indent = re.match(r"[ \t]*", text[line_start:])
        out += [text[pos:m.start()], body.replace("\n", "\n" + (indent[0] if indent else ""))]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def load_queries(text: str | None = None, file: str = "queries.sql") -> dict[str, str]:
    """The statements of ``drainer/sql/<file>`` (or of ``text``) by name, their fragments
    inserted: text with psycopg's ``{identifier}`` holes and ``%(name)s`` parameters.
    ValueError names what is wrong: an unknown, unused or recursive fragment, holes that
    do not match, a name defined twice."""
    if text is None:
        text = resources.files("drainer").joinpath(f"sql/{file}").read_text("utf-8")
    statements: dict[str, str] = {}
    fragments: dict[str, _Fragment] = {}
    heads = list(_HEADER.finditer(text))
    for head, after in zip(heads, [*heads[1:], None], strict=True):
        name = head["name"]
        if name in statements or name in fragments:
            raise ValueError(f"queries.sql: {name} is defined twice")
        body = _body(text[head.end():after.start() if after else len(text)])
        if head["kind"] == "name":
            if head["holes"] is not None:
                raise ValueError(f"queries.sql: statement {name}: only a fragment has holes")
            statements[name] = body
        else:
            holes = tuple(h.strip() for h in (head["holes"] or "").split(",") if h.strip())
            fragments[name] = _Fragment(name, holes, body)
    used: set[str] = set()
    out = {name: _expand(body, fragments, used, (name,)) for name, body in statements.items()}
    unused = sorted(set(fragments) - used)
    if unused:
        raise ValueError(f"queries.sql: fragments never used: {', '.join(unused)}")
    return out


QUERIES = load_queries()


def identifiers(schema: str, table: str) -> dict[str, sql.Composable]:
    """The identifiers that fill the ``{holes}`` of drainer's SQL, always quoted."""
    return {
        "schema": sql.Identifier(schema),
        "jobs": sql.Identifier(schema, table),
        "archive": sql.Identifier(schema, f"{table}_archive"),
        "migrations": sql.Identifier(schema, "drainer_migrations"),
        "claim_idx": sql.Identifier(f"{table}_claim_idx"),
        "lease_idx": sql.Identifier(f"{table}_lease_idx"),
        "finished_idx": sql.Identifier(f"{table}_finished_idx"),
        "dedup_idx": sql.Identifier(f"{table}_dedup_idx"),
        "run_at_check": sql.Identifier(f"{table}_run_at_check"),
        "status_check": sql.Identifier(f"{table}_status_check"),
        "max_attempts_check": sql.Identifier(f"{table}_max_attempts_check"),
        "cancelled_idx": sql.Identifier(f"{table}_cancelled_idx"),
        # the jobs table as a regclass literal, for a migration's DO block
        "jobs_regclass": sql.Literal(regclass_literal(schema, table)),
        "recurring_idx": sql.Identifier(f"{table}_recurring_idx"),
        "recurring_queued_idx": sql.Identifier(f"{table}_recurring_queued_idx"),
        "article_idx": sql.Identifier(schema, f"{table}_ready_idx"),
        "notify_fn": sql.Identifier(schema, f"{table}_notify"),
        "notify_trigger": sql.Identifier(f"{table}_notify"),
        "control": sql.Identifier(schema, f"{table}_queues"),
    }


def regclass_literal(schema: str, table: str) -> str:
    """A quoted ``schema.table`` string to cast to regclass as a *parameter*."""
    return '"{}"."{}"'.format(schema.replace('"', '""'), table.replace('"', '""'))


class Rendered(dict[str, str]):
    """The named statements of one connection, each rendered (its identifiers quoted) when
    it is first used: an empty run sends two of them, and rendering them all took about a
    millisecond while the session was open (and billed)."""

    def __init__(self, conn: psycopg.Connection[Any], ids: dict[str, sql.Composable]) -> None:
        super().__init__()
        self.conn = conn
        self.ids = ids

    def __missing__(self, name: str) -> str:
        text = sql.SQL(QUERIES[name]).format(**self.ids).as_string(self.conn)
        self[name] = text
        return text

