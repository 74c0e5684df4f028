from __future__ import annotations

from ninja import NinjaAPI
from pydantic import TypeAdapter

from webapp.api import actions, events, reads
from webapp.api.documented_errors import declare_errors
from webapp.api.errors import install_handlers
from webapp.api.params import ObjectBodies
from webapp.domain.ingest.event_schema import AnyEvent


class LifeboatAPI(NinjaAPI):
    def get_openapi_schema(self, *args, **kwargs):
        schema = super().get_openapi_schema(*args, **kwargs)
        # The events endpoint parses its body itself (to name the failing event's index),
        # so the event models are added to the document by hand.
        event_schema = TypeAdapter(AnyEvent).json_schema(
            ref_template="#/components/schemas/{model}"
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(event_schema.pop("$defs", {}))
        components["AnyEvent"] = event_schema
        return declare_errors(schema)


api = LifeboatAPI(
    title="Lifeboat API",
    version="1",
    description="Events from training jobs, and reads and actions on runs and checkpoints.",
    urls_namespace="api",
    openapi_url="/openapi.json",
    docs_url="/docs",
    parser=ObjectBodies(),
)
install_handlers(api)
api.add_router("/", events.router)
api.add_router("/", reads.router)
api.add_router("/", actions.router)
