"""The code blocks of the Markdown docs, as the tests that run them need them.

Conventions the docs follow (see docs/tutorial.md):

- in a tutorial (docs/tutorial.md, the README's "Five-minute tutorial" section) every
  ```` ```sh ```` block runs, in order, in one shell, and every
  ```` ```python title="FILE" ```` block is written to FILE first; ```` ```json ````
  blocks are output and are not run;
- on any page, a ```` ```python ```` block right after a ``<!-- runnable -->`` line is a
  script that runs as it is (with a migrated database in ``DRAINER_DATABASE_URL``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^```(\w+)?(.*)$")
_TITLE = re.compile(r'title="([^"]+)"')


@dataclass(frozen=True)
class Block:
    lang: str
    title: str | None
    code: str
    runnable: bool
    line: int


def blocks(markdown: str) -> list[Block]:
    """Every fenced code block of a page, in order."""
    out: list[Block] = []
    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        lang, info = m.group(1) or "", m.group(2)
        title = _TITLE.search(info)
        previous = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        out.append(Block(lang, title.group(1) if title else None, "\n".join(body) + "\n",
                         previous.strip() == "<!-- runnable -->", start + 1))
        i += 1
    return out


def section(markdown: str, heading: str) -> str:
    """The text of one ``## heading`` section, up to the next heading of that level."""
    start = markdown.index(f"\n{heading}\n")
    level = heading.split(" ", 1)[0]
    end = markdown.find(f"\n{level} ", start + 1)
    return markdown[start:end if end != -1 else None]


def tutorial_script(markdown: str) -> str:
    """One bash script: the files written and the shell blocks run, in the page's order."""
    parts = ["set -euo pipefail"]
    for b in blocks(markdown):
        if b.lang == "python" and b.title:
            parts.append(f"cat > '{b.title}' <<'DRAINER_DOC_EOF'\n{b.code}DRAINER_DOC_EOF")
        elif b.lang == "sh":
            parts.append(f"# line {b.line}\n{b.code}")
    return "\n".join(parts) + "\n"
