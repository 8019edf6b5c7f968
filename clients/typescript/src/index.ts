/**
 * A client of the oncegate gateway's API, for bots written in TypeScript or JavaScript on Node.
 *
 * - `client.once(key, work)`: runs `work` once per key across every caller of the namespace.
 * - `client.send(source, message, idempotencyKey)`: `/send`, once per key.
 * - `verifyDelivery(secret, headers, body)`: an `http` sink's delivery, checked with the Standard Webhooks library.
 */
export { Client } from "./client";
export type { Claim, ClaimOptions, Hold, Sent } from "./client";
export {
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
} from "./errors";
export { InvalidDelivery, verifyDelivery } from "./webhooks";
