"""A client of the oncegate gateway's API, for bots written in Python.

- ``Client.once(key)``: a ``with`` block that runs its work once per key across every caller of
  the namespace (claim, renew while it runs, complete with the result, release on an
  exception); ``Client.run_once(key, work)`` the same as a call.
- ``Client.send(source, message, idempotency_key)``: ``/send``, once per key.
- ``verify_delivery(secret, headers, body)``: an ``http`` sink's delivery, checked with the
  Standard Webhooks library.
"""

from .client import Client, Sent
from .errors import (
    BadRequest,
    Conflict,
    Fenced,
    InFlight,
    OncegateError,
    OutcomeUnknown,
    RateLimited,
    Refused,
    Unauthorized,
    Unavailable,
)
from .keys import Hold
from .webhooks import InvalidDelivery, verify_delivery

__all__ = [
    "BadRequest",
    "Client",
    "Conflict",
    "Fenced",
    "Hold",
    "InFlight",
    "InvalidDelivery",
    "OncegateError",
    "OutcomeUnknown",
    "RateLimited",
    "Refused",
    "Sent",
    "Unauthorized",
    "Unavailable",
    "verify_delivery",
]
