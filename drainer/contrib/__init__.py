"""Producers for the frameworks apps are written in (each an optional extra).

- :mod:`drainer.contrib.sqlalchemy`: SQLAlchemy 2 sessions and connections, sync and
  asyncio, on the psycopg driver (``pip install '/path/to/drainer[sqlalchemy]'``).
- :mod:`drainer.contrib.django`: Django 4.2+ on psycopg 3, with a ``manage.py drainer``
  command (``pip install '/path/to/drainer[django]'``).
"""
