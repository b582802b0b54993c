"""``python -m drainer``."""

from drainer.cli import entrypoint

entrypoint()
