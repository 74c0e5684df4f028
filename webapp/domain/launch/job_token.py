"""The API token a launched job reports back with: made for one resume, of that resume's
project, scoped `ingest,read` only (never `operate`: a job cannot start jobs), stored
hashed like every token, and revoked when the resume reaches a final state
(webapp/domain/recovery/resume.py `_set`). The secret exists only in the job's environment."""

from __future__ import annotations

from webapp.domain.models import ApiToken

JOB_SCOPES = ["ingest", "read"]


def issue(resume) -> str:
    """A new token for the resume's job; returns its secret. A token left from an earlier
    try of the same resume is revoked first."""
    revoke(resume)
    token, secret = resume.project.issue_token(f"resume-{resume.pk} job", JOB_SCOPES)
    resume.token = token
    resume.save(update_fields=["token"])
    return secret


def revoke(resume) -> None:
    if resume.token_id is not None:
        token = ApiToken.objects.filter(pk=resume.token_id).first()
        if token is not None:
            token.revoke()
