"""An app module for ``--app``: every installed Django app's ``jobs.py``, imported.

``manage.py drainer run-once`` uses it when no app module is named (``--app``,
``DRAINER_APP`` or ``[tool.drainer] app``). Outside manage.py
(``drainer run-once --app drainer.contrib.django.autodiscover``) it sets Django up first,
from ``DJANGO_SETTINGS_MODULE``.
"""

from __future__ import annotations

import django
from django.apps import apps
from django.utils.module_loading import autodiscover_modules

#: The module each installed app may have, holding its ``@task`` handlers.
MODULE = "jobs"

if not apps.ready:
    django.setup()
autodiscover_modules(MODULE)
