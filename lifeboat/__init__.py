"""The Lifeboat client that training jobs import.

Not written yet (issue #3): until then, jobs send v1 events to POST /api/v1/events
themselves (docs/api.md has the contract and a curl example). The client will need only
the standard library at its core.
"""

__version__ = "0.1.0"
