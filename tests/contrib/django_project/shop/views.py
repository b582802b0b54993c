"""A view as a Django user writes one: the order and its job in one transaction."""

from __future__ import annotations

from django.db import connection, transaction

from drainer.contrib.django import enqueue
from drainer.settings import Settings


def place_order(order_id: int, *, schema: str, trigger: Settings | None = None,
                fail: bool = False) -> int | None:
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f'INSERT INTO "{schema}".orders (id) VALUES (%s)', [order_id])
        job_id = enqueue("shop-emails", {"order": order_id}, schema=schema, trigger=trigger)
        if fail:
            raise RuntimeError("payment declined")
    return job_id
