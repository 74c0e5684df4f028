"""Django's WSGI application, for plain WSGI servers. Production serves webapp.asgi,
which answers POST /api/v1/events on its event loop; here the ninja view does."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
application = get_wsgi_application()
