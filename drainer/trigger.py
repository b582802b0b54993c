"""Ask for a drain after a commit: POST to the drain URL (a failed trigger loses nothing)."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from drainer._redact import redact

if TYPE_CHECKING:
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: Seconds a producer waits for the trigger's answer: short, the job is already committed.
TRIGGER_TIMEOUT_S = 2.0


def fire(settings: Settings, timeout: float = TRIGGER_TIMEOUT_S) -> bool:
    """POST to ``settings.trigger_url``; True when it answered 2xx.

    Never raises: the job is committed either way and the next scheduled drain takes it.
    """
    url = settings.trigger_url
    if not url:
        return False
    request = urllib.request.Request(url, data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    if settings.trigger_token is not None:
        request.add_header("Authorization",
                           f"Bearer {settings.trigger_token.get_secret_value()}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status: int = response.status
            ok = 200 <= status < 300
    except (urllib.error.URLError, OSError, ValueError) as exc:
        logger.warning("drain trigger to %s failed (the job is queued; the next drain takes "
                       "it): %s", redact(url), redact(str(exc)))
        return False
    if not ok:
        logger.warning("drain trigger to %s answered %s", redact(url), status)
    return ok
