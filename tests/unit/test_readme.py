"""README stays in step with the code: every setting and every command is documented."""

from __future__ import annotations

from drainer.cli import _SCOPES
from drainer.settings import Settings, env_of
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_every_setting_is_in_the_configuration_table() -> None:
    missing = [env_of(name) for name in Settings.model_fields if f"`{env_of(name)}`" not in README]
    assert not missing, missing


def test_every_command_is_documented() -> None:
    missing = [name for name in _SCOPES if f"drainer {name}" not in README]
    assert not missing, missing


def test_required_sections() -> None:
    for heading in ("## Quick start", "Keeping the compute asleep", "## Guarantees",
                    "## Deploy", "## Performance", "Running on Neon",
                    "Running on Aurora Serverless v2", "Behind PgBouncer or Supavisor",
                    "Adopting the article's jobs table", "Writing idempotent handlers",
                    "Operator's FAQ", "## Configuration"):
        assert heading in README, heading
