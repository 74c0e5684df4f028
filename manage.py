#!/usr/bin/env python
"""Django's command line: `.venv/bin/python manage.py COMMAND` from the checkout.

Settings come from the environment, else from var/lifeboat.env, which `make run` writes.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        sys.exit(
            f"manage.py: Django cannot be imported by {sys.executable} ({exc}).\n"
            "Run it with the checkout's virtualenv, which `make run` creates: "
            ".venv/bin/python manage.py ..."
        )
    from django.core.exceptions import ImproperlyConfigured

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        sys.exit(f"manage.py: {exc}")  # what is missing, without a traceback around it
