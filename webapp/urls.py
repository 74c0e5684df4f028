from django.contrib import admin
from django.http import HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.defaults import page_not_found, server_error

from webapp.api.errors import error_response
from webapp.api.json_everywhere import api_not_found
from webapp.api.urls import api
from webapp.ops.health import healthz
from webapp.ops.metrics import metrics_view


def favicon(request):
    """/favicon.ico, which browsers ask for on every page whatever base.html links: the
    static SVG (one file to keep)."""
    return HttpResponsePermanentRedirect(static("favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon),
    path("api/v1/", api.urls),
    re_path(r"^api/", api_not_found),
    path("metrics", metrics_view, name="metrics"),
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("accounts/", include("webapp.accounts.urls")),
    path("", include("webapp.dashboard.urls")),
]


def handler404(request, exception=None):
    # Paths under /api/ that no route matches still answer JSON.
    if request.path.startswith("/api/"):
        return error_response(404, f"no API endpoint at {request.path}")

    return page_not_found(request, exception)


handler403 = "webapp.dashboard.views.forbidden"


def handler500(request):
    if request.path.startswith("/api/"):
        return error_response(500, "internal error; the server log has the details")

    return server_error(request)
