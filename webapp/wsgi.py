"""Not a way to serve Lifeboat: it is an ASGI application (webapp/asgi.py), whose event
loop answers POST /api/v1/events, the route every training job depends on. A WSGI server
pointed here would serve every page but drop every event, so it is refused with the
command to use instead (Django's runserver reads WSGI_APPLICATION, which names this)."""

from django.core.exceptions import ImproperlyConfigured

raise ImproperlyConfigured(
    "Lifeboat is served as an ASGI application: `gunicorn webapp.asgi -k "
    "uvicorn_worker.UvicornWorker` (what `make run` starts; docs/deployment.md). "
    "webapp.wsgi is not an entry point: POST /api/v1/events is answered only there."
)
