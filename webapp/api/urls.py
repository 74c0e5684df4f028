from __future__ import annotations

from ninja import NinjaAPI
from pydantic import TypeAdapter

from webapp.api import (
    actions,
    cluster_reads,
    events,
    reads,
    settings_access,
    settings_places,
    settings_project,
    storage,
)
from webapp.api.documented_errors import declare_errors
from webapp.api.errors import install_handlers
from webapp.api.params import ObjectBodies
from webapp.domain.ingest.event_schema import AnyEvent


class LifeboatAPI(NinjaAPI):
    def get_openapi_schema(self, *args, **kwargs):
        schema = super().get_openapi_schema(*args, **kwargs)
        # POST /api/v1/events is answered before Django (webapp/api/ingest_asgi.py), so
        # no ninja operation describes it: its description and its models (the event
        # models, which it parses itself to name a failing event's index) are added here.
        event_schema = TypeAdapter(AnyEvent).json_schema(
            ref_template="#/components/schemas/{model}"
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(event_schema.pop("$defs", {}))
        components["AnyEvent"] = event_schema
        return declare_errors(events.describe(schema))


api = LifeboatAPI(
    title="Lifeboat API",
    version="1",
    description="Events from training jobs, reads and actions on runs and checkpoints, and "
    "a project's settings (scope admin).",
    urls_namespace="api",
    openapi_url="/openapi.json",
    docs_url="/docs",
    parser=ObjectBodies(),
)
install_handlers(api)
api.add_router("/", reads.router)
api.add_router("/", actions.router)
api.add_router("/", cluster_reads.router)
api.add_router("/", storage.router)
api.add_router("/", settings_access.router)
api.add_router("/", settings_places.router)
api.add_router("/", settings_project.router)
