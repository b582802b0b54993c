"""Django settings of the contrib tests: the test PostgreSQL, psycopg 3, drainer's app."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_URL = os.environ.get("DRAINER_TEST_DATABASE_URL",
                      "postgresql://postgres@127.0.0.1:5432/postgres")
_PARTS = conninfo_to_dict(_URL)

SECRET_KEY = "drainer-tests"
USE_TZ = True
# Django sets os.environ["TZ"] from TIME_ZONE (default America/Chicago) at setup.
TIME_ZONE = "UTC"
INSTALLED_APPS = ["drainer.contrib.django", "tests.contrib.django_project.shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _PARTS.get("dbname", "postgres"),
        "USER": _PARTS.get("user", "postgres"),
        "PASSWORD": _PARTS.get("password", ""),
        "HOST": _PARTS.get("host", "127.0.0.1"),
        "PORT": str(_PARTS.get("port", "5432")),
        "OPTIONS": {"application_name": "drainer-django-tests"},
    },
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
