"""What production serves: gunicorn with uvicorn workers (`gunicorn webapp.asgi -k
uvicorn_worker.UvicornWorker`). POST /api/v1/events is answered on each worker's event
loop; everything else is Django's WSGI application in a pool of WEB_THREADS threads
(why: webapp/api/ingest_asgi.py). webapp.wsgi stays for plain WSGI servers."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

from django.conf import settings  # noqa: E402

import webapp.wsgi  # noqa: E402  (sets Django up, before the models are imported)
from webapp.api.ingest_asgi import IngestASGI  # noqa: E402

application = IngestASGI(webapp.wsgi.application, threads=settings.WEB_THREADS)
