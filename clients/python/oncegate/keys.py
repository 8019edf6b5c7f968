"""The guarded block over ``/keys``: claim on entry, renew while the work runs, complete with
the result on a normal exit, release on an exception."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional

from . import errors

if TYPE_CHECKING:  # the client imports this module: no import circle at run time
    from .client import Client


class Hold:
    """A key held (or found settled) for the length of a ``with`` block.

    - ``done``: the key was completed before this block: ``result`` is that result; the block
      should not do the work again (and nothing is completed on exit).
    - ``result``: what a normal exit completes the key with (set it in the block), or the
      earlier result when ``done``.
    - ``fenced``: a renewal found the lease taken over (it ran out while the work ran): the
      work's effect is not this holder's. The exit then raises
      :class:`~oncegate.errors.Fenced` instead of completing; :meth:`check` raises it at once.
    """

    def __init__(
        self, client: "Client", key: str, payload: Any, lease_ms: int, wait_ms: int
    ) -> None:
        self._client = client
        self.key = key
        self._payload = payload
        self._lease_ms = lease_ms
        self._wait_ms = wait_ms
        self.lease: Optional[str] = None
        self.done = False
        self.result: Any = None
        self._fenced = threading.Event()
        self._stop = threading.Event()
        self._renewer: Optional[threading.Thread] = None
        self._renew_error: Optional[BaseException] = None

    @property
    def fenced(self) -> bool:
        """Whether a renewal found the lease no longer this holder's."""
        return self._fenced.is_set()

    def check(self) -> None:
        """Raises :class:`~oncegate.errors.Fenced` when the lease was lost: call it before an
        effect that must not happen twice, in long work."""
        if self._fenced.is_set():
            raise errors.Fenced(
                f"the lease on {self.key!r} was taken over: stop, the work is not this holder's",
                409,
            )

    def __enter__(self) -> "Hold":
        claim = self._client.claim(self.key, self._lease_ms, self._wait_ms, self._payload)
        if claim["state"] == "done":
            self.done = True
            self.result = claim.get("result")
            return self
        self.lease = str(claim["lease"])
        self._renewer = threading.Thread(
            target=self._renew, name=f"oncegate-renew {self.key}", daemon=True
        )
        self._renewer.start()
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if self.done or self.lease is None:
            return False
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if kind is not None:
            # The work failed: give the key back so that a retry (here or elsewhere) runs it.
            # A release refused as fenced changes nothing: the key is not ours anyway.
            try:
                self._client.release(self.key, self.lease)
            except errors.OncegateError:
                pass
            return False
        self.check()
        self._client.complete(self.key, self.lease, self.result)
        return False

    def _renew(self) -> None:
        every = max(self._lease_ms / 3000.0, 0.05)
        while not self._stop.wait(every):
            try:
                self._client.renew(self.key, str(self.lease), self._lease_ms)
            except errors.Fenced:
                self._fenced.set()
                return
            except errors.OncegateError as failed:
                # Unreachable for a moment: try again at the next tick, while the lease lasts.
                self._renew_error = failed
