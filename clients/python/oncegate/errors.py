"""The gateway's refusals as exceptions: one class per answer a caller acts on differently."""

from __future__ import annotations

from typing import Any, Optional


class OncegateError(Exception):
    """An answer other than success. ``status`` is the HTTP status (0 when none came back),
    ``body`` the gateway's JSON answer (or ``None``), ``retry_after`` the seconds of its
    ``Retry-After`` header when it sent one."""

    def __init__(
        self,
        message: str,
        status: int = 0,
        body: Any = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.retry_after = retry_after


class Unauthorized(OncegateError):
    """401: no caller token, or one no ``[[api.caller]]`` has. Check the token."""


class InFlight(OncegateError):
    """409 ``in_flight``: another holder has the key (or the first send is still out) and did
    not finish within ``wait_ms``. Retry after ``retry_after`` seconds."""


class Conflict(OncegateError):
    """409 ``conflict``: the key was claimed (or sent) for another payload. A bug in the
    caller's choice of key: retrying does not help."""


class Fenced(OncegateError):
    """409 ``fenced``: the lease ran out and someone else took the key, or it is settled. The
    work's effect must not be reported as this holder's."""


class RateLimited(OncegateError):
    """429: a rate budget did not come within ``wait_ms`` (or the caller's result budget is
    spent). Retry after ``retry_after`` seconds with the same idempotency key."""


class OutcomeUnknown(OncegateError):
    """504: the platform call timed out or its connection broke: the message may be out.
    Retry with the same idempotency key; the gateway makes sure it is sent at most once."""


class Refused(OncegateError):
    """422: the platform refused the message for good (its code is in ``body``). The answer
    is kept for the key: a repeat gets it again without another call."""


class Unavailable(OncegateError):
    """502 / 503, or no answer at all: nothing was recorded or sent. Retry with the same key."""


class BadRequest(OncegateError):
    """400, 404, 408 or 413: the request itself is wrong; ``str(error)`` says what."""
