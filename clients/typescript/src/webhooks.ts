/** Verifying the gateway's HTTP sink deliveries with the Standard Webhooks library itself. */

import { Webhook, WebhookVerificationError } from "standardwebhooks";

/** The delivery's signature, timestamp or headers do not verify: answer 401 and keep nothing of it. */
export class InvalidDelivery extends Error {
  constructor(message: string) {
    super(message);
    this.name = "InvalidDelivery";
  }
}

/**
 * Verifies one delivery of an `http` sink against the route's `secret` (`whsec_…`; during a
 * rotation the new or the previous one) and answers its envelope. `headers` as received (any
 * case); `body` the raw bytes or text, before any JSON parsing. The envelope's `id` (also the
 * `Idempotency-Key` header) stays the same across retries: store it with the effect.
 */
export function verifyDelivery(
  secret: string,
  headers: Record<string, string>,
  body: string | Uint8Array,
): Record<string, unknown> {
  if (!secret) throw new Error("the webhook secret is empty: give the route's whsec_… secret");
  try {
    return new Webhook(secret).verify(body, headers) as Record<string, unknown>;
  } catch (refused) {
    if (refused instanceof WebhookVerificationError) {
      throw new InvalidDelivery(`the delivery does not verify: ${refused.message}`);
    }
    throw refused;
  }
}
