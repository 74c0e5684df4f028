"""The operator commands' view of the v1 API: one call per endpoint they use, and every
way a call can fail turned into a CommandFailed that carries the exit code a script can
rely on (EXIT_CODES, shown by `lifeboat --help` and docs/cli.md)."""

from __future__ import annotations

from urllib.parse import urlencode

from lifeboat.config import Config
from lifeboat.ops_format import clean
from lifeboat.transport import ServerError, Unreachable, api_url, quote_key, request

OK = 0
FAILED = 1  # the server refused or failed (409, 400, 5xx); a download did not verify
USAGE = 2  # bad arguments; no server or token configured (argparse's own code)
NOT_FOUND = 3  # no such run, checkpoint or launch profile; no verified checkpoint yet
UNREACHABLE = 4  # no answer from the server (refused, timed out, DNS, TLS)
NOT_VERIFIED = 5  # the check ended, and not with "passed" (failed, warning, error)
AUTH = 6  # the token is missing, unknown or revoked (401) or lacks a scope (403)
STILL_RUNNING = 7  # --timeout ran out while the check was queued or running

EXIT_CODES = """exit status:
  0  done; with --wait, the check passed (the checkpoint is verified)
  1  the server refused or failed the request, or a download did not verify
  2  usage: bad arguments, or no server URL or token configured
  3  not found: no such run, checkpoint or launch profile, or no verified checkpoint
  4  the server is unreachable
  5  the check finished and did not pass (failed, warning or could not run)
  6  authentication: the token is unknown or revoked, or lacks the needed scope
  7  --timeout ran out while the check was still queued or running"""


class CommandFailed(Exception):
    """A command cannot do what it was asked; `exit_code` says how a script sees it."""

    def __init__(self, message: str, exit_code: int = FAILED):
        super().__init__(message)
        self.exit_code = exit_code


def _exit_code_for(status: int) -> int:
    if status in (401, 403):
        return AUTH
    if status == 404:
        return NOT_FOUND
    return FAILED


class OpsClient:
    """Calls of the v1 API with a Config's server and token; each returns the answer's
    JSON as the server sent it, or raises CommandFailed naming what was asked."""

    def __init__(self, config: Config):
        self.config = config

    def _call(self, what: str, method: str, path: str, body: dict | None = None, **params):
        url = api_url(self.config.url, path, **params)
        try:
            return request(method, url, self.config.token, body, timeout=self.config.timeout_s)
        except ServerError as exc:
            raise CommandFailed(
                f"{what}: {clean(exc.said)} (HTTP {exc.status})", _exit_code_for(exc.status)
            ) from None
        except Unreachable as exc:
            raise CommandFailed(
                f"{what}: the server at {self.config.url} is unreachable: {clean(exc)}",
                UNREACHABLE,
            ) from None

    def runs(self, status: str | None, limit: int, offset: int) -> dict:
        return self._call(
            "cannot list the runs", "GET", "/runs", status=status, limit=limit, offset=offset
        )

    def checkpoints(
        self, run: str, status: str | None, limit: int, before_step: int | None
    ) -> dict:
        return self._call(
            f"cannot list the checkpoints of run {run!r}",
            "GET",
            f"/runs/{quote_key(run)}/checkpoints",
            status=status,
            limit=limit,
            before_step=before_step,
        )

    def checkpoint(self, checkpoint_id: int) -> dict:
        return self._call(f"checkpoint {checkpoint_id}", "GET", f"/checkpoints/{checkpoint_id}")

    def latest(self, run: str, checkpoint: int | None = None) -> dict:
        query = f"?checkpoint={int(checkpoint)}" if checkpoint is not None else ""
        return self._call(
            f"nothing to resume run {run!r} from", "GET", f"/runs/{quote_key(run)}/latest{query}"
        )

    def goodput(self, run: str) -> dict:
        return self._call(f"run {run!r}", "GET", f"/runs/{quote_key(run)}/goodput")

    def storage(self, limit: int) -> dict:
        limit = max(1, min(int(limit), 1000))
        return self._call("the storage ledger", "GET", f"/storage?{urlencode({'limit': limit})}")

    def storage_audits(self) -> list:
        # A JSON list comes back as {"value": [...]} (transport._answer).
        return self._call("the storage audits", "GET", "/storage/audits").get("value", [])

    def audit_storage(self, target: str) -> dict:
        return self._call(f"target {target!r}", "POST", "/storage/audits", {"target": target})

    def clean_storage(self, audit_id: int) -> dict:
        return self._call(f"audit {audit_id}", "POST", f"/storage/audits/{int(audit_id)}/clean")

    def project_goodput(self, since: str | None, group_by: str, limit: int) -> dict:
        query = {"group_by": group_by, "limit": max(1, min(int(limit), 1000))}
        if since:
            query["since"] = since
        return self._call("the project's goodput", "GET", f"/goodput?{urlencode(query)}")

    def validate(self, checkpoint_id: int) -> dict:
        return self._call(
            f"cannot check checkpoint {checkpoint_id}",
            "POST",
            f"/checkpoints/{checkpoint_id}/validate",
        )

    def restore_test(self, checkpoint_id: int) -> dict:
        return self._call(
            f"cannot restore-test checkpoint {checkpoint_id}",
            "POST",
            f"/checkpoints/{checkpoint_id}/restore-test",
        )

    def resume(self, checkpoint_id: int, profile: str, world_size: int | None = None) -> dict:
        body: dict = {"profile": profile}
        if world_size is not None:
            body["world_size"] = world_size
        return self._call(
            f"cannot resume from checkpoint {checkpoint_id}",
            "POST",
            f"/checkpoints/{checkpoint_id}/resume",
            body,
        )
