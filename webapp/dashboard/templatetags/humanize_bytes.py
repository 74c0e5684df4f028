"""The older name of the number filters: `{% load humanize_bytes %}` still works, and
gives the same filters as the builtin numbers library (templatetags/numbers.py)."""

from webapp.dashboard.templatetags.numbers import register

__all__ = ["register"]
