"""Maintenance services: each has a ``run_once()`` returning a small result of counts."""
