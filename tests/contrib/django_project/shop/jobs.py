"""The handlers of the test app, found by drainer.contrib.django.autodiscover."""

from __future__ import annotations

from drainer import Job, task


@task("shop-emails")
def send_order_email(job: Job) -> None:
    assert "order" in job.payload
