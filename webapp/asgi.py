"""What production serves: gunicorn with uvicorn workers (`gunicorn webapp.asgi -k
uvicorn_worker.UvicornWorker`). POST /api/v1/events is answered on each worker's event
loop; everything else is Django's WSGI application in a pool of WEB_THREADS threads
(why: webapp/api/ingest_asgi.py). This is the only entry point: there is no WSGI one."""

from __future__ import annotations

import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

from django.conf import settings  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402

django_pages = get_wsgi_application()  # sets Django up, before the models are imported
from webapp.api.ingest_asgi import IngestASGI  # noqa: E402

application = IngestASGI(django_pages, threads=settings.WEB_THREADS)

# The collector, tuned for ingest: a 1000-event batch makes about a hundred thousand
# container objects, and with the default thresholds (700, 10, 10) the collector ran many
# times per batch, each older-generation pass walking every object Django and the models
# left at import. Those are frozen (never scanned again), and collections come less often:
# 0.066-0.074 -> 0.057-0.058 ms of CPU per event of a batch, in-process (docs/benchmarks.md).
gc.freeze()
gc.set_threshold(10_000, 20, 100)
