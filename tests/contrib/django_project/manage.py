#!/usr/bin/env python
"""The contrib tests' manage.py (run with the repository root on PYTHONPATH)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.contrib.django_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
