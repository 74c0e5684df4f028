"""HTTP to the Lifeboat server with the standard library only."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.parse
import urllib.request

from lifeboat.version import __version__

USER_AGENT = f"lifeboat-client/{__version__}"


class ServerError(Exception):
    """The server answered, but not with success: `status` and its JSON `answer`;
    `reason` is the status line's phrase, and `is_json` says whether the body was JSON
    (a proxy in front of the server may answer with a page of HTML instead)."""

    def __init__(self, status: int, answer: dict, reason: str = "", is_json: bool = True):
        super().__init__(f"HTTP {status}: {answer.get('error', answer)}")
        self.status = status
        self.answer = answer
        self.reason = reason
        self.is_json = is_json

    @property
    def said(self) -> str:
        """What went wrong in a person's words: the JSON error when the server sent one,
        else the status line."""
        error = self.answer.get("error") if self.is_json else None
        if isinstance(error, str) and error:
            return error
        return f"HTTP {self.status} {self.reason}".strip()


class Unreachable(Exception):
    """No answer at all: connection refused, timeout, DNS, TLS."""


def _is_json(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw or b"{}"), dict)
    except ValueError:
        return False


def _answer(raw: bytes) -> dict:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {"error": raw[:500].decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


def request(
    method: str, url: str, token: str, body: dict | None = None, timeout: float = 30.0
) -> dict:
    headers = {"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT}
    data = None
    if body is not None:
        data = json.dumps(body, separators=(",", ":")).encode()
        headers["Content-Type"] = "application/json"
        if len(data) > 4096:
            data = gzip.compress(data, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
    # http(s) only: Config refuses any other scheme.
    req = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:  # noqa: S310
            return _answer(response.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        raise ServerError(exc.code, _answer(raw), str(exc.reason or ""), _is_json(raw)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(str(getattr(exc, "reason", exc))) from None


def api_url(base: str, path: str, **params) -> str:
    url = f"{base}/api/v1{path}"
    if params:
        url += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    return url


def quote_key(key: str) -> str:
    """A run key in a URL path; '/' stays, since the API takes keys with slashes."""
    return urllib.parse.quote(key, safe="/")
