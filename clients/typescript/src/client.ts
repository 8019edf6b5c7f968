/** The HTTP client: `/keys` (claim, renew, complete, release; `once`) and `/send`. Node's own fetch, nothing else. */

import { Fenced, OncegateError, Unavailable, refusal } from "./errors";

/** A claim's answer: held (`acquired`, with the lease to present) or settled before (`done`, with its result). */
export type Claim =
  | { state: "acquired"; lease: string; until_ms: number }
  | { state: "done"; result: unknown };

/** How a claim is made. */
export interface ClaimOptions {
  /** The lease in ms (default 30 000; at most the gateway's `api.max_lease`). */
  leaseMs?: number;
  /** How long to wait for another holder's result, in ms (default 5 000). */
  waitMs?: number;
  /** Any JSON value naming the request: a later claim with another one is a conflict. */
  payload?: unknown;
}

/** What `once` hands the work: the key's lease, and a signal aborted when it is lost. */
export interface Hold {
  readonly key: string;
  readonly lease: string;
  /** Aborted when a renewal finds the lease taken over: stop, the work is not this holder's. */
  readonly signal: AbortSignal;
  /** Throws `Fenced` when the lease was lost: call it before an effect that must not happen twice. */
  check(): void;
}

/** A send's answer: the platform's JSON, and whether it is the stored answer of an earlier send under the same key. */
export interface Sent {
  answer: unknown;
  replayed: boolean;
}

interface Answer {
  status: number;
  body: unknown;
  retryAfter: number | undefined;
  headers: Headers;
}

/**
 * A caller of one gateway's API (`api.listen`) with one `[[api.caller]]` token.
 *
 * ```ts
 * const gateway = new Client("http://127.0.0.1:9191", process.env.ORDERS_API_TOKEN!);
 * const order = await gateway.once(`create order ${id}`, async () => shop.createOrder(id, body), { payload: body });
 * ```
 */
export class Client {
  readonly url: string;
  readonly #token: string;

  /** @param timeoutMs the deadline of one call, beyond any `waitMs` it asks the gateway to wait */
  constructor(url: string, token: string, readonly timeoutMs: number = 30_000) {
    if (!token) throw new Error("the caller token is empty: give the [[api.caller]] token");
    this.url = url.replace(/\/+$/, "");
    this.#token = token;
  }

  /** Claims `key`. Throws `InFlight` when another holder kept it past `waitMs`, `Conflict` for another payload. */
  async claim(key: string, options: ClaimOptions = {}): Promise<Claim> {
    const waitMs = options.waitMs ?? 5_000;
    const body: Record<string, unknown> = { key, lease_ms: options.leaseMs ?? 30_000, wait_ms: waitMs };
    if (options.payload !== undefined) body.payload = options.payload;
    const answer = await this.#post("/keys/claim", body, {}, this.timeoutMs + waitMs);
    const state = this.#state(answer, ["acquired", "done"]);
    if (state.state === "done") return { state: "done", result: state.result ?? null };
    return { state: "acquired", lease: String(state.lease), until_ms: Number(state.until_ms) };
  }

  /** Extends a held lease by `leaseMs` from now; answers its new end (unix ms). Throws `Fenced`. */
  async renew(key: string, lease: string, leaseMs = 30_000): Promise<number> {
    const answer = await this.#post("/keys/renew", { key, lease, lease_ms: leaseMs });
    return Number(this.#state(answer, ["renewed"]).until_ms);
  }

  /** Marks a held key done with `result` (given to every later claim). Throws `Fenced`, or `RateLimited` (lease still held). */
  async complete(key: string, lease: string, result: unknown = null): Promise<void> {
    this.#state(await this.#post("/keys/complete", { key, lease, result: result ?? null }), ["done"]);
  }

  /** Gives a held key back unsettled: the next claim acquires it. */
  async release(key: string, lease: string): Promise<void> {
    this.#state(await this.#post("/keys/release", { key, lease }), ["released"]);
  }

  /**
   * Runs `work` at most once for `key` across every caller of the namespace and answers its
   * result — or, when it ran before, the result it completed with. The lease is renewed every
   * third of `leaseMs` while `work` runs; when `work` throws, the key is released and the error
   * goes on; when the lease was lost meanwhile, `Fenced` is thrown instead of completing.
   */
  async once<T>(key: string, work: (hold: Hold) => Promise<T> | T, options: ClaimOptions = {}): Promise<T> {
    const claim = await this.claim(key, options);
    if (claim.state === "done") return claim.result as T;
    const leaseMs = options.leaseMs ?? 30_000;
    const fenced = new AbortController();
    const hold: Hold = {
      key,
      lease: claim.lease,
      signal: fenced.signal,
      check() {
        if (fenced.signal.aborted) {
          throw new Fenced(`the lease on ${JSON.stringify(key)} was taken over: stop, the work is not this holder's`, 409);
        }
      },
    };
    let renewing: Promise<void> = Promise.resolve();
    const timer = setInterval(() => {
      renewing = renewing.then(async () => {
        if (fenced.signal.aborted) return;
        try {
          await this.renew(key, claim.lease, leaseMs);
        } catch (failed) {
          if (failed instanceof Fenced) fenced.abort(failed);
          // Unreachable for a moment: the next tick tries again while the lease lasts.
        }
      });
    }, Math.max(leaseMs / 3, 50));
    timer.unref?.();
    let result: T;
    try {
      result = await work(hold);
    } catch (failed) {
      clearInterval(timer);
      await renewing;
      // A release refused as fenced changes nothing: the key is not ours anyway.
      await this.release(key, claim.lease).catch((error: unknown) => {
        if (!(error instanceof OncegateError)) throw error;
      });
      throw failed;
    }
    clearInterval(timer);
    await renewing;
    hold.check();
    await this.complete(key, claim.lease, result);
    return result;
  }

  /**
   * Sends `message` as `source` (for a source of many tenants, as `tenant`), once for
   * `idempotencyKey`: a repeat answers the first send's stored answer.
   */
  async send(source: string, message: Record<string, unknown>, idempotencyKey: string, tenant?: string): Promise<Sent> {
    if (!idempotencyKey) throw new Error("an idempotency key is required: the same one for every retry");
    let path = `/send/${encodeURIComponent(source)}`;
    if (tenant !== undefined) path += `/${encodeURIComponent(tenant)}`;
    const waitMs = typeof message.wait_ms === "number" ? message.wait_ms : 10_000;
    const answer = await this.#post(path, message, { "Idempotency-Key": idempotencyKey }, this.timeoutMs + waitMs);
    if (answer.status !== 200) throw refusal(answer.status, answer.body, answer.retryAfter);
    return { answer: answer.body, replayed: answer.headers.get("idempotent-replayed") === "true" };
  }

  /** The token is a secret: never in a log line. */
  toJSON(): { url: string } {
    return { url: this.url };
  }

  async #post(path: string, body: unknown, headers: Record<string, string> = {}, timeoutMs = this.timeoutMs): Promise<Answer> {
    let response: Response;
    try {
      response = await fetch(this.url + path, {
        method: "POST",
        headers: { authorization: `Bearer ${this.#token}`, "content-type": "application/json", ...headers },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      });
    } catch (failed) {
      throw new Unavailable(
        `no answer from the gateway at ${this.url}: ${String(failed)}; nothing is known to be recorded: retry with the same key`,
      );
    }
    const text = await response.text();
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      // Not JSON: kept as text for the error's message.
    }
    const after = Number(response.headers.get("retry-after"));
    return {
      status: response.status,
      body: parsed,
      retryAfter: response.headers.has("retry-after") && Number.isFinite(after) ? after : undefined,
      headers: response.headers,
    };
  }

  #state(answer: Answer, expected: string[]): Record<string, unknown> {
    const body = typeof answer.body === "object" && answer.body !== null ? (answer.body as Record<string, unknown>) : {};
    if (answer.status === 200 && typeof body.state === "string" && expected.includes(body.state)) return body;
    throw refusal(answer.status, answer.body, answer.retryAfter);
  }
}
