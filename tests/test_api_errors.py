"""Every answer under /api/ is JSON, whatever refuses the request (a route's method
check, CSRF, an unknown path, a body too large), and every parameter has a range: a
value outside it is a 400 that names the parameter, never a 500 from the database."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from tests.support.dashboard import make_checkpoint, make_run

pytestmark = pytest.mark.django_db


def error_of(response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"] == "application/json", response.content[:300]
    return response.json()["error"]


@pytest.mark.parametrize(
    ("path", "params", "named"),
    [
        ("/runs", {"offset": -5}, "offset"),
        ("/runs", {"offset": 10**12}, "offset"),
        ("/runs", {"limit": 0}, "limit"),
        ("/runs", {"limit": 10**9}, "limit"),
        ("/runs", {"status": "sleeping"}, "status"),
        ("/runs/r/checkpoints", {"before_step": -1}, "before_step"),
        ("/runs/r/checkpoints", {"before_step": 2**63}, "before_step"),
        ("/runs/r/checkpoints", {"limit": -3}, "limit"),
        ("/runs/r/analytics", {"mtbf_hours": 0}, "mtbf_hours"),
        ("/runs/r/analytics", {"mtbf_hours": "nan"}, "mtbf_hours"),
        ("/checkpoints/0", {}, "checkpoint_id"),
        (f"/checkpoints/{2**63}", {}, "checkpoint_id"),
        ("/checkpoints/abc", {}, "checkpoint_id"),
        ("/resumes/-1", {}, "resume_id"),
        ("/runs/a%00b", {}, "key"),
        ("/retention", {"run": "a\x00b"}, "run"),
    ],
)
def test_a_parameter_out_of_range_is_a_400_naming_it(api, read_token, project, path, params, named):
    make_run(project, "r")
    error = error_of(api.get(read_token, path, **params), 400)
    assert error.startswith(f"{named}: "), error


def test_limit_and_offset_are_refused_outside_their_range_and_accepted_at_its_edges(
    api, read_token, project
):
    make_checkpoint(make_run(project, "r"), 5)
    for limit, offset in ((0, 0), (1001, 0), (1, -1), (1, 1_000_001)):
        error_of(api.get(read_token, "/runs", limit=limit, offset=offset), 400)
    assert api.get(read_token, "/runs", limit=1000, offset=1_000_000).status_code == 200
    assert api.get(read_token, "/runs", limit=1, offset=0).status_code == 200
    page = api.get(read_token, "/runs/r/checkpoints", before_step=2**63 - 1).json()
    assert [c["step"] for c in page["checkpoints"]] == [5]
    assert api.get(read_token, f"/checkpoints/{2**63 - 1}").status_code == 404


def test_a_nul_in_a_body_string_is_refused_by_name(api, token, project):
    checkpoint = make_checkpoint(make_run(project, "r"), 5)
    response = api.post(token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "a\x00"})
    assert error_of(response, 400) == "body.profile: must not contain NUL (\\u0000)"


@pytest.mark.parametrize("body", [[None, None], "AAA", 5, {"pinned": 0}])
def test_a_body_of_the_wrong_shape_is_refused_not_read_as_defaults(api, token, project, body):
    checkpoint = make_checkpoint(make_run(project, "r"), 5)
    error_of(api.post(token, f"/checkpoints/{checkpoint.pk}/pin", body), 400)
    checkpoint.refresh_from_db()
    assert not checkpoint.pinned


def test_a_bearer_post_to_a_bad_id_is_json_not_a_csrf_page(token, project):
    # A client that enforces CSRF, as a real server does: a bearer-token call has no
    # CSRF cookie and needs none.
    client = Client(enforce_csrf_checks=True)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for path in ("/api/v1/checkpoints/abc/validate", "/api/v1/checkpoints/abc/restore-test"):
        error = error_of(client.post(path, **auth), 400)
        assert error.startswith("checkpoint_id: ")
    error = error_of(client.post("/api/v1/checkpoints/999/validate", **auth), 404)
    assert error == "no checkpoint 999 in this project"


def test_an_unknown_path_under_api_is_a_404_in_json_whatever_the_method(token):
    client = Client(enforce_csrf_checks=True)
    for method in ("get", "post", "put", "patch", "delete"):
        for path in ("/api/v1/nothing-here", "/api/v2/runs", "/api/"):
            response = getattr(client, method)(path, HTTP_AUTHORIZATION=f"Bearer {token}")
            assert error_of(response, 404) == f"no API endpoint at {path}", method


def test_a_wrong_method_is_a_405_in_json_with_allow(api, token, project):
    checkpoint = make_checkpoint(make_run(project, "r"), 5)
    client = Client(enforce_csrf_checks=True)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    response = client.delete("/api/v1/runs", **auth)
    assert error_of(response, 405) == "DELETE is not allowed at /api/v1/runs; allowed: GET"
    assert response["Allow"] == "GET"
    response = client.get(f"/api/v1/checkpoints/{checkpoint.pk}/validate", **auth)
    assert "allowed: POST" in error_of(response, 405)


def test_a_body_over_the_upload_limit_is_a_413_in_json(api, token, project, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    checkpoint = make_checkpoint(make_run(project, "r"), 5)
    body = {"pinned": True, "padding": "x" * 2000}
    error = error_of(api.post(token, f"/checkpoints/{checkpoint.pk}/pin", body), 413)
    assert error.startswith("request body too large")


def test_the_document_declares_every_status_with_the_error_schema(client):
    document = client.get("/api/v1/openapi.json").json()
    assert document["components"]["securitySchemes"]["TokenAuth"] == {
        "type": "http",
        "scheme": "bearer",
    }
    error_schema = document["components"]["schemas"]["ErrorOut"]
    assert error_schema["required"] == ["error"]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            declared = set(operation["responses"])
            expected = {"401", "403"}
            if operation.get("parameters") or "requestBody" in operation:
                expected.add("400")
            if any(p["in"] == "path" for p in operation.get("parameters", [])):
                expected.add("404")
            if "requestBody" in operation:
                expected.add("413")
            assert expected <= declared, (method, path, expected - declared)
            assert operation["security"] == [{"TokenAuth": []}], (method, path)
            for status in expected:
                schema = operation["responses"][status]["content"]["application/json"]
                assert schema["schema"]["$ref"].endswith("ErrorOut"), (method, path, status)
    actions = ("validate", "restore-test", "replicate")
    for action in actions:
        responses = document["paths"][f"/api/v1/checkpoints/{{checkpoint_id}}/{action}"]["post"]
        assert {"202", "409"} <= set(responses["responses"])
    parameters = document["paths"]["/api/v1/runs"]["get"]["parameters"]
    limit = next(p for p in parameters if p["name"] == "limit")
    assert (limit["name"], limit["schema"]["minimum"], limit["schema"]["maximum"]) == (
        "limit",
        1,
        1000,
    )


def test_analytics_with_failures_far_more_frequent_than_checkpoints_is_not_a_500():
    from webapp.domain.health.analytics import expected_wall_time, waste_fraction

    # Every 3 hours a checkpoint, a failure every 3.6 s: the job never finishes.
    assert waste_fraction(10_800, 1.5, 3.6) == 1.0
    assert expected_wall_time(1.0, 10_800, 1.5, 3.6) == float("inf")
    json.dumps({"waste": waste_fraction(10_800, 1.5, 3.6)}, allow_nan=False)
