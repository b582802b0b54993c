"""``python -m bench``: run the benchmarks (see bench/cli.py and docs/performance.md)."""

from __future__ import annotations

from bench.cli import main

raise SystemExit(main())
