"""queries.sql's loader: statements by name, fragments inserted with their holes filled,
and a clear error for a fragment that is unknown, unused, recursive or given wrong holes."""

from __future__ import annotations

import pytest

from drainer.db.statements import load_queries, strip_comments

SHARED = """\
-- fragment: due(queue, limit)
-- the due jobs of $queue (a description: not part of the text)
SELECT id FROM {jobs}
WHERE queue = $queue AND status = 'queued'
LIMIT $limit

-- fragment: stamp
now()
"""


def test_statements_get_their_fragments_with_the_holes_filled() -> None:
    queries = load_queries(SHARED + """
-- name: one
-- Its description.
WITH next AS (
  @due(queue => %(queue)s, limit => least(%(n)s, 10))
)
SELECT *, @stamp AS at FROM next;

-- name: two
SELECT count(*) FROM (@due(queue => 'a, b', limit => (SELECT 1, 2))) d;
""")
    assert queries["one"] == (
        "WITH next AS (\n"
        "  SELECT id FROM {jobs}\n"
        "  WHERE queue = %(queue)s AND status = 'queued'\n"
        "  LIMIT least(%(n)s, 10)\n"
        ")\n"
        "SELECT *, now() AS at FROM next")
    # a comma inside quotes or parentheses is part of the hole's text
    assert "WHERE queue = 'a, b' AND" in queries["two"]
    assert "LIMIT (SELECT 1, 2)) d" in queries["two"]


def test_a_fragment_may_use_another_and_psycopg_holes_pass_through() -> None:
    queries = load_queries("""
-- fragment: inner(x)
coalesce($x, '{{}}')
-- fragment: outer(y)
SELECT @inner(x => $y) FROM {jobs} WHERE a @> b
-- name: s
@outer(y => %(v)s);
""")
    assert queries["s"] == "SELECT coalesce(%(v)s, '{{}}') FROM {jobs} WHERE a @> b"


def test_a_multi_line_hole_text_is_put_on_one_line() -> None:
    queries = load_queries(SHARED + """
-- name: s
@due(queue => %(q)s,
     limit => (SELECT n
               FROM t));
-- name: t
SELECT @stamp;
""")
    assert "LIMIT (SELECT n FROM t)" in queries["s"]


@pytest.mark.parametrize(("text", "error"), [
    ("-- name: s\nSELECT @nowhere;\n", r"s: unknown fragment @nowhere"),
    (SHARED + "-- name: s\nSELECT @stamp;\n", r"fragments never used: due"),
    ("-- fragment: a\n@b\n-- fragment: b\n@a\n-- name: s\n@a;\n",
     r"s -> a -> b: fragment @a includes itself"),
    (SHARED + "-- name: s\n@due(queue => 1) @stamp;\n",
     r"@due takes \(queue, limit\), given \(queue\)"),
    (SHARED + "-- name: s\n@due(queue => 1, limit => 2, more => 3) @stamp;\n",
     r"@due takes \(queue, limit\), given \(queue, limit, more\)"),
    (SHARED + "-- name: s\n@due(queue => 1, queue => 2) @stamp;\n", r"each hole once"),
    (SHARED + "-- name: s\n@due(queue => 1, 2) @stamp;\n", r"'2' is not `hole => text`"),
    (SHARED + "-- name: s\n@due(queue => (1, limit => 2 @stamp;\n", r"unclosed \("),
    ("-- fragment: f(a, b)\nSELECT $a\n-- name: s\n@f(a => 1, b => 2);\n",
     r"fragment f: holes declared \(a, b\), holes in its text \(a\)"),
    ("-- fragment: f\nSELECT $a\n-- name: s\n@f;\n",
     r"fragment f: holes declared \(\), holes in its text \(a\)"),
    ("-- name: s(a)\nSELECT 1;\n", r"statement s: only a fragment has holes"),
    ("-- name: s\nSELECT 1;\n-- name: s\nSELECT 2;\n", r"s is defined twice"),
])
def test_a_mistake_in_the_file_is_refused_at_load(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        load_queries(text)


def test_the_shipped_file_loads_with_every_fragment_used() -> None:
    queries = load_queries()
    assert "claim_batch" in queries and "queue_summary" in queries
    assert not [name for name, text in queries.items() if "@" in text.replace("@>", "")]


def test_comments_are_dropped_from_the_text_sent_and_quoted_dashes_kept() -> None:
    queries = load_queries("""\
-- name: s
-- The description.
SELECT 'a -- b' AS "x--y",  -- a note at the end of a line
  -- a note of its own line
  E'it\\'s -- text', $f$ -- text $f$, 1

FROM t;
""")
    assert queries["s"] == (
        "SELECT 'a -- b' AS \"x--y\",\n"
        "  E'it\\'s -- text', $f$ -- text $f$, 1\n"
        "\n"
        "FROM t")


def test_no_statement_drainer_sends_carries_a_comment() -> None:
    for name, text in load_queries().items():
        assert strip_comments(text) == text, name
