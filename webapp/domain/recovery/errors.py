"""The error a resume stops with; its own module so that the checks a resume runs
(reshard.py) and the resume itself (resume.py) both raise it without importing each other."""


class ResumeError(Exception):
    """The resume cannot go on; the message says why, for the person who asked."""
