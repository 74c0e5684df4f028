"""Following an automatic or manual resume until it is done (`follow_until_done`)."""

from __future__ import annotations

import time

from webapp.domain.models import Resume
from webapp.domain.recovery import resume as resumes


def follow_until_done(resume_id: int, timeout: float = 180) -> Resume:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resume = Resume.objects.select_related("checkpoint", "run", "profile").get(pk=resume_id)
        if resume.status in ("succeeded", "failed", "cancelled"):
            return resume
        resumes.follow(resume)
        time.sleep(0.5)
    raise AssertionError(f"resume {resume_id} did not end: {resume.status}")
