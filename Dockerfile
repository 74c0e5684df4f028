# One image, several commands (web, worker, beat): see docker-compose.yml.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DJANGO_SETTINGS_MODULE=webapp.settings
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY client client
COPY webapp webapp
COPY workers workers
COPY lifeboat lifeboat
# The CPU build of torch for the load checks by default; the GPU worker's image is built
# with TORCH_INDEX_URL pointing at a CUDA index (see docker-compose.yml).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# The server pins the client distribution (client/) at its own version: both from here.
RUN pip install --no-cache-dir --extra-index-url "$TORCH_INDEX_URL" ./client '.[worker]'
COPY . .
RUN SECRET_KEY=build-only python manage.py collectstatic --noinput
# The user that launched jobs and restore checks run as (LAUNCH_RUN_AS in
# docker-compose.yml): not the workers' own, who hold the secrets. setpriv (util-linux,
# in the base image) switches to it.
RUN useradd --system --no-create-home --shell /usr/sbin/nologin jobs
EXPOSE 8000
# What docker-compose.yml and `make run` serve: uvicorn workers, POST /api/v1/events on
# each worker's event loop (webapp/api/ingest_asgi.py).
CMD ["gunicorn", "webapp.asgi", "-k", "uvicorn_worker.UvicornWorker", "-b", "0.0.0.0:8000", "--workers", "2", "--reuse-port", "--access-logfile", "-"]
