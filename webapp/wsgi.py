from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_application = get_wsgi_application()

# POST /api/v1/events is answered before Django's request cycle (why: the module's
# docstring); everything else is Django's.
from webapp.api.ingest_wsgi import IngestShortcut  # noqa: E402  (needs settings set up)

application = IngestShortcut(django_application)
