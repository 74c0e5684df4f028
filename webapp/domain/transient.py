"""Which failures pass on their own: the one rule that decides whether a task that died
is tried again (workers/retrying.py) rather than recorded as a failure.

Transient: the database's deadlock victims, serialization failures, lock timeouts and
lost connections (Django raises OperationalError or InterfaceError for each); a broker
that did not answer; S3 asking the client to slow down, or not answering. A task that
fails this way has done nothing it cannot do again (tasks take ids, re-read their rows
and are safe to run twice), so it is retried with a growing delay; what is still owed
after the last try is found again by the sweeper (webapp/domain/repair.py).
"""

from __future__ import annotations

import random

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from django.db import InterfaceError
from django.db import OperationalError as DatabaseOperationalError
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# S3 error codes that mean "later": throttling, and a server that is busy or restarting.
S3_LATER = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "503",
        "500",
    }
)


def _broker_errors() -> tuple[type[BaseException], ...]:
    return (KombuOperationalError, RedisConnectionError, RedisTimeoutError)


def _s3_later(exc: BaseException) -> bool:
    if isinstance(exc, EndpointConnectionError | ConnectionClosedError | ReadTimeoutError):
        return True
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "")) in S3_LATER
    return False


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, DatabaseOperationalError | InterfaceError):
        return True
    if isinstance(exc, _broker_errors()):
        return True
    return _s3_later(exc)


def backoff_s(retries: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Exponential, capped, with "equal jitter" (half fixed, half random): the tasks
    that one outage or one deadlock failed together do not all come back together."""
    delay = min(cap, base * 2**retries)
    return delay / 2 + random.uniform(0, delay / 2)  # noqa: S311 (not a secret)
