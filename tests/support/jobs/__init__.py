"""Training jobs the tests run as scripts, by path (python tests/support/jobs/<name>.py)."""
