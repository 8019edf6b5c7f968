"""The HTTP client: ``/keys`` (claim, renew, complete, release; the guarded block) and ``/send``.

Only the standard library: a bot team can drop it into any Python 3.8+ service.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, TypeVar

from . import errors
from .keys import Hold

T = TypeVar("T")

_ABSENT = object()


@dataclass
class Sent:
    """A send's answer: the platform's JSON, and whether it is the stored answer of an earlier
    send under the same idempotency key (``Idempotent-Replayed: true``)."""

    answer: Any
    replayed: bool


@dataclass
class Answer:
    """One call's answer: status, JSON body, and ``Retry-After`` in seconds when present."""

    status: int
    body: Any
    retry_after: Optional[float]
    headers: Dict[str, str]


class Client:
    """A caller of one gateway's API (``api.listen``), with one ``[[api.caller]]`` token.

    >>> client = Client("http://127.0.0.1:9191", token="...")   # doctest: +SKIP
    >>> with client.once("create order 42", payload=body) as hold:  # doctest: +SKIP
    ...     if not hold.done:
    ...         hold.result = shop.create_order(42, body)
    """

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        if not token:
            raise ValueError("the caller token is empty: give the [[api.caller]] token")
        self.url = url.rstrip("/")
        self._token = token
        self.timeout = timeout

    def __repr__(self) -> str:  # the token is a secret: never in a repr or a log line
        return f"Client({self.url!r})"

    # -- /keys -------------------------------------------------------------------------------

    def claim(
        self,
        key: str,
        lease_ms: int = 30_000,
        wait_ms: int = 5_000,
        payload: Any = _ABSENT,
    ) -> Dict[str, Any]:
        """Claims ``key``: ``{"state": "acquired", "lease", "until_ms"}`` or ``{"state": "done",
        "result"}``. Raises :class:`~oncegate.errors.InFlight` when another holder kept it past
        ``wait_ms``, :class:`~oncegate.errors.Conflict` for another payload."""
        body: Dict[str, Any] = {"key": key, "lease_ms": lease_ms, "wait_ms": wait_ms}
        if payload is not _ABSENT:
            body["payload"] = payload
        # The gateway may wait up to wait_ms before it answers.
        answer = self._post("/keys/claim", body, timeout=self.timeout + wait_ms / 1000)
        return self._state(answer, ("acquired", "done"))

    def renew(self, key: str, lease: str, lease_ms: int = 30_000) -> int:
        """Extends a held lease by ``lease_ms`` from now; answers its new end (unix ms). Raises
        :class:`~oncegate.errors.Fenced` when the lease is not the key's anymore."""
        answer = self._post("/keys/renew", {"key": key, "lease": lease, "lease_ms": lease_ms})
        return int(self._state(answer, ("renewed",))["until_ms"])

    def complete(self, key: str, lease: str, result: Any = None) -> None:
        """Marks a held key done with ``result`` (any JSON value, kept for ``dedup.retention``
        and given to every later claim). Raises :class:`~oncegate.errors.Fenced`, or
        :class:`~oncegate.errors.RateLimited` when the caller's result budget is spent (the
        lease is still held)."""
        self._state(
            self._post("/keys/complete", {"key": key, "lease": lease, "result": result}),
            ("done",),
        )

    def release(self, key: str, lease: str) -> None:
        """Gives a held key back unsettled: the next claim acquires it."""
        self._state(self._post("/keys/release", {"key": key, "lease": lease}), ("released",))

    def once(
        self,
        key: str,
        payload: Any = _ABSENT,
        lease_ms: int = 30_000,
        wait_ms: int = 5_000,
    ) -> Hold:
        """The guarded block: ``with client.once(key) as hold:``. On entry the key is claimed
        (``hold.done`` and ``hold.result`` say when it was settled before: skip the work);
        while the block runs the lease is renewed every third of ``lease_ms``; a normal exit
        completes the key with ``hold.result``, an exception releases it and goes on."""
        return Hold(self, key, payload, lease_ms, wait_ms)

    def run_once(
        self,
        key: str,
        work: Callable[[], T],
        payload: Any = _ABSENT,
        lease_ms: int = 30_000,
        wait_ms: int = 5_000,
    ) -> Any:
        """Runs ``work()`` at most once for ``key`` across every caller of the namespace and
        answers its result — or, when it ran before, the result it completed with."""
        with self.once(key, payload=payload, lease_ms=lease_ms, wait_ms=wait_ms) as hold:
            if not hold.done:
                hold.result = work()
        return hold.result

    # -- /send -------------------------------------------------------------------------------

    def send(
        self,
        source: str,
        message: Dict[str, Any],
        idempotency_key: str,
        tenant: Optional[str] = None,
    ) -> Sent:
        """Sends ``message`` as ``source`` (for a source of many tenants, as ``tenant``), once
        for ``idempotency_key``: a repeat answers the first send's stored answer."""
        if not idempotency_key:
            raise ValueError("an idempotency key is required: the same one for every retry")
        path = "/send/" + urllib.parse.quote(source, safe="")
        if tenant is not None:
            path += "/" + urllib.parse.quote(tenant, safe="")
        wait_ms = message.get("wait_ms", 10_000) if isinstance(message, dict) else 10_000
        answer = self._post(
            path,
            message,
            headers={"Idempotency-Key": idempotency_key},
            timeout=self.timeout + float(wait_ms) / 1000,
        )
        if answer.status != 200:
            raise _refusal(answer)
        replayed = answer.headers.get("idempotent-replayed", "").lower() == "true"
        return Sent(answer=answer.body, replayed=replayed)

    # -- the wire ----------------------------------------------------------------------------

    def _post(
        self,
        path: str,
        body: Any,
        headers: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Answer:
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method="POST")
        request.add_header("Authorization", "Bearer " + self._token)
        request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                return _answer(response.status, response.headers, response.read())
        except urllib.error.HTTPError as refused:
            return _answer(refused.code, refused.headers, refused.read())
        except (urllib.error.URLError, OSError) as failed:
            raise errors.Unavailable(
                f"no answer from the gateway at {self.url}: {failed}; nothing is known to be "
                "recorded: retry with the same key"
            ) from failed

    @staticmethod
    def _state(answer: Answer, expected: tuple) -> Dict[str, Any]:
        body = answer.body if isinstance(answer.body, dict) else {}
        if answer.status == 200 and body.get("state") in expected:
            return body
        raise _refusal(answer)


def _answer(status: int, headers: Any, raw: bytes) -> Answer:
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode("utf-8", "replace")
    retry_after: Optional[float] = None
    value = headers.get("Retry-After") if headers is not None else None
    if value:
        try:
            retry_after = float(value)
        except ValueError:
            retry_after = None
    lowered = {name.lower(): value for name, value in (headers or {}).items()}
    return Answer(status, body, retry_after, lowered)


def _refusal(answer: Answer) -> errors.OncegateError:
    body = answer.body if isinstance(answer.body, dict) else {}
    state = body.get("state")
    said = body.get("error") or state or answer.body
    message = f"{answer.status}: {said}"
    kind: type = errors.OncegateError
    if answer.status == 401:
        kind = errors.Unauthorized
    elif state == "fenced":
        kind = errors.Fenced
    elif state == "conflict":
        kind = errors.Conflict
    elif answer.status == 409:
        kind = errors.InFlight
    elif answer.status == 429:
        kind = errors.RateLimited
    elif answer.status == 504:
        kind = errors.OutcomeUnknown
    elif answer.status == 422:
        kind = errors.Refused
    elif answer.status in (0, 502, 503):
        kind = errors.Unavailable
    elif answer.status in (400, 404, 408, 413):
        kind = errors.BadRequest
    return kind(message, answer.status, answer.body, answer.retry_after)
