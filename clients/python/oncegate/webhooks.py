"""Verifying the gateway's HTTP sink deliveries: Standard Webhooks signatures, checked by the
Standard Webhooks library itself (``pip install oncegate[webhooks]``), not by a copy of it."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Union


class InvalidDelivery(Exception):
    """The delivery's signature, timestamp or headers do not verify: answer 401 and keep
    nothing of it."""


def verify_delivery(
    secret: str, headers: Mapping[str, str], body: Union[bytes, str]
) -> Dict[str, Any]:
    """Verifies one delivery of an ``http`` sink against the route's ``secret``
    (``whsec_…``; during a rotation either the new or the previous one) and answers its
    envelope. ``headers`` as received (``webhook-id``, ``webhook-timestamp``,
    ``webhook-signature``; any case); ``body`` the raw bytes, before any JSON parsing.

    The envelope's ``id`` (also the ``Idempotency-Key`` header) stays the same
    across retries: store it with the effect to apply each event once.
    """
    try:
        from standardwebhooks.webhooks import Webhook, WebhookVerificationError
    except ImportError as missing:
        raise ImportError(
            "verifying deliveries needs the Standard Webhooks library: "
            "pip install 'oncegate[webhooks]' (or standardwebhooks)"
        ) from missing
    if not secret:
        raise ValueError("the webhook secret is empty: give the route's whsec_… secret")
    lowered = {name.lower(): value for name, value in headers.items()}
    try:
        # The raw bytes as received: a body parsed and dumped again would not verify.
        return Webhook(secret).verify(body, lowered)
    except WebhookVerificationError as refused:
        raise InvalidDelivery(f"the delivery does not verify: {refused}") from refused
