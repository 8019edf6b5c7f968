/** The gateway's refusals as errors: one class per answer a caller acts on differently. */

/** An answer other than success. */
export class OncegateError extends Error {
  /**
   * @param status the HTTP status (0 when no answer came back)
   * @param body the gateway's JSON answer, or its text
   * @param retryAfter the seconds of its `Retry-After` header, when it sent one
   */
  constructor(
    message: string,
    readonly status: number = 0,
    readonly body: unknown = undefined,
    readonly retryAfter: number | undefined = undefined,
  ) {
    super(message);
    this.name = new.target.name;
  }
}

/** 401: no caller token, or one no `[[api.caller]]` has. Check the token. */
export class Unauthorized extends OncegateError {}

/** 409 `in_flight`: another holder has the key (or the first send is still out) past `waitMs`. Retry after `retryAfter`. */
export class InFlight extends OncegateError {}

/** 409 `conflict`: the key was claimed (or sent) for another payload; retrying does not help. */
export class Conflict extends OncegateError {}

/** 409 `fenced`: the lease ran out and someone else took the key; the effect is not this holder's. */
export class Fenced extends OncegateError {}

/** 429: a rate budget (or the caller's result budget) did not come in time. Retry after `retryAfter`, same key. */
export class RateLimited extends OncegateError {}

/** 504: the platform call timed out: the message may be out. Retry with the same idempotency key. */
export class OutcomeUnknown extends OncegateError {}

/** 422: the platform refused the message for good (its code is in `body`), kept for the key. */
export class Refused extends OncegateError {}

/** 502 / 503, or no answer: nothing was recorded or sent. Retry with the same key. */
export class Unavailable extends OncegateError {}

/** 400, 404, 408 or 413: the request itself is wrong; the message says what. */
export class BadRequest extends OncegateError {}

/** The error for a refused answer: by its `state` first, then by its status. */
export function refusal(status: number, body: unknown, retryAfter: number | undefined): OncegateError {
  const fields = typeof body === "object" && body !== null ? (body as Record<string, unknown>) : {};
  const state = typeof fields.state === "string" ? fields.state : undefined;
  const said = String(fields.error ?? state ?? (typeof body === "string" ? body : JSON.stringify(body)));
  const message = `${status}: ${said}`;
  let Kind: typeof OncegateError = OncegateError;
  if (status === 401) Kind = Unauthorized;
  else if (state === "fenced") Kind = Fenced;
  else if (state === "conflict") Kind = Conflict;
  else if (status === 409) Kind = InFlight;
  else if (status === 429) Kind = RateLimited;
  else if (status === 504) Kind = OutcomeUnknown;
  else if (status === 422) Kind = Refused;
  else if (status === 0 || status === 502 || status === 503) Kind = Unavailable;
  else if ([400, 404, 408, 413].includes(status)) Kind = BadRequest;
  return new Kind(message, status, body, retryAfter);
}
