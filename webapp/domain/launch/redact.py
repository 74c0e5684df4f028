"""Redaction of known secret patterns in a launched job's output before anyone sees it.

A job's output is written by code the deployment does not control (a training script
that prints its config, `env`, a traceback with a URL): the tail shown to operators
passes through redact() first. What it hides, each replaced by `[redacted]`:
- Lifeboat tokens (`lb_` and 20+ URL-safe characters), AWS access key ids (AKIA/ASIA...),
  GitHub (ghp_ ...), Slack (xox.-) and Hugging Face (hf_) tokens;
- the value of an assignment whose name ends in a word that says secret: `…secret`,
  `…secret_key`, `…password`, `…passwd`, `…pwd`, `…token`, `…api_key`, `…access_key`,
  `…private_key`, `…credentials`, followed by `=` or `:` (env output, JSON, YAML,
  command lines); `max_tokens=512` or `token_count: 9` are left alone;
- `Authorization:` headers and `Bearer`/`Basic` credentials;
- the password of a URL (`scheme://user:password@host`);
- PEM private key blocks;
- the literal values of this process's own environment variables whose names say
  secret (at least 8 characters), wherever they appear.
It is a net for the known patterns, not a proof: jobs should not print secrets.
"""

from __future__ import annotations

import os
import re

MASK = "[redacted]"
_SECRET_NAME = "(?:secret|secret[_-]?key|passw(?:or)?d|pwd|token|api[_-]?key|access[_-]?key|private[_-]?key|credentials?)"  # noqa: E501, S105 (a pattern of names)
_PATTERNS = [
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S
        ),
        MASK,
    ),
    (re.compile(r"(?i)(authorization\s*[:=]\s*)[^\n]+"), rf"\1{MASK}"),
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]{8,}"), rf"\1\2{MASK}"),
    (re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*):[^/\s@]+@"), rf"\1:{MASK}@"),
    (
        re.compile(
            rf"(?i)([A-Za-z0-9_.-]*{_SECRET_NAME}[\"']?\s*[=:]\s*)"
            r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s,;]+)"
        ),
        rf"\1{MASK}",
    ),
    (re.compile(r"\blb_[A-Za-z0-9_-]{20,}"), f"lb_{MASK}"),
    (re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA)[A-Z0-9]{16}\b"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), MASK),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), MASK),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), MASK),
]
# This process's variables whose values are secrets (not PWD/OLDPWD: their values are
# paths that a job's output shows for good reasons).
_SECRET_ENV = re.compile(
    r"(?i)secret|passw(?:or)?d|token|api_?key|access_?key|private_?key|credential|_KEY$"
    r"|^DATABASE_URL$|^REDIS_URL$|BROKER_URL"
)


def _own_secrets() -> list[str]:
    values = {v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= 8}
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    """The text with every known secret pattern replaced by [redacted]."""
    for secret in _own_secrets():
        text = text.replace(secret, MASK)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
