"""The Django app of drainer: add ``"drainer.contrib.django"`` to INSTALLED_APPS."""

from __future__ import annotations

from django.apps import AppConfig


class DrainerConfig(AppConfig):  # type: ignore[misc]
    name = "drainer.contrib.django"
    label = "drainer"
    verbose_name = "drainer"
