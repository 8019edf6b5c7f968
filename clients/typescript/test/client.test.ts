/**
 * The TypeScript client against a real gateway, which `crates/cli/tests/clients.rs` starts and
 * names in the environment (ONCEGATE_API, ONCEGATE_TOKEN, ONCEGATE_SEND_SOURCE, ONCEGATE_RUN,
 * ONCEGATE_DELIVERY: see clients/python/tests/test_client.py).
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { BadRequest, Client, Conflict, Fenced, InFlight, InvalidDelivery, Unauthorized, Unavailable, verifyDelivery } from "../src";

function env(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(
      `${name} is not set: these tests run against a gateway that crates/cli/tests/clients.rs starts (cargo test -p oncegate --test clients)`,
    );
  }
  return value;
}

const API = env("ONCEGATE_API");
const TOKEN = env("ONCEGATE_TOKEN");
const client = () => new Client(API, TOKEN);
const key = (name: string) => `${env("ONCEGATE_RUN")} typescript ${name}`;

describe("keys", () => {
  test("eight concurrent callers of one key run the work once", async () => {
    let runs = 0;
    const work = async () => {
      runs += 1;
      await sleep(300); // the others arrive while it runs: they wait for its result
      return { order: 42, run: runs };
    };
    const results = await Promise.all(
      Array.from({ length: 8 }, () => client().once(key("order 42"), work, { payload: { n: 42 }, waitMs: 10_000 })),
    );
    assert.equal(runs, 1, "the work ran once");
    assert.deepEqual(results, Array(8).fill({ order: 42, run: 1 }), "every caller got its result");
    assert.deepEqual(await client().once(key("order 42"), work, { payload: { n: 42 } }), { order: 42, run: 1 });
    assert.equal(runs, 1);
  });

  test("an exception releases the key for the next caller", async () => {
    await assert.rejects(
      client().once(key("fails"), () => {
        throw new RangeError("the work failed");
      }, { leaseMs: 60_000 }),
      RangeError,
    );
    const started = Date.now();
    assert.equal(await client().once(key("fails"), () => "second", { waitMs: 0 }), "second");
    assert.ok(Date.now() - started < 5_000, "released, not held for the minute");
  });

  test("a long work keeps its lease by renewing", async () => {
    let holding!: () => void;
    const held = new Promise<void>((resolve) => (holding = resolve));
    const long = client().once(key("long"), async () => {
      holding();
      await sleep(1_500); // over two leases of 600 ms: only renewals keep it
      return "long done";
    }, { leaseMs: 600 });
    await held;
    await sleep(1_000);
    await assert.rejects(client().claim(key("long"), { waitMs: 0 }), (error: unknown) => {
      assert.ok(error instanceof InFlight, String(error));
      assert.equal(error.status, 409);
      return true;
    });
    assert.equal(await long, "long done");
    assert.equal(await client().once(key("long"), () => "again"), "long done");
  });

  test("a lapsed lease is fenced", async () => {
    const api = client();
    const first = await api.claim(key("lapsed"), { leaseMs: 100 });
    assert.equal(first.state, "acquired");
    await sleep(400);
    const second = await api.claim(key("lapsed"), { waitMs: 0 });
    assert.equal(second.state, "acquired");
    if (first.state !== "acquired" || second.state !== "acquired") return;
    await assert.rejects(api.complete(key("lapsed"), first.lease, "not mine"), Fenced);
    await api.complete(key("lapsed"), second.lease, "mine");
    assert.equal(await api.once(key("lapsed"), () => "never"), "mine");
  });

  test("another payload is a conflict", async () => {
    await client().once(key("payload"), () => 1, { payload: { a: 1 } });
    await assert.rejects(client().once(key("payload"), () => 2, { payload: { a: 2 } }), Conflict);
  });

  test("a wrong token is unauthorized, an empty one refused, no gateway unavailable", async () => {
    await assert.rejects(new Client(API, "not-a-caller").claim(key("token")), Unauthorized);
    assert.throws(() => new Client(API, ""));
    assert.ok(!JSON.stringify(client()).includes(TOKEN), "the token stays out of JSON");
    await assert.rejects(new Client("http://127.0.0.1:9", "t", 2_000).claim(key("closed")), Unavailable);
  });
});

describe("send", () => {
  test("a send repeated under one key sends once", async () => {
    const message = { receive_id: "oc_typescript", msg_type: "text", content: { text: "hi" } };
    const source = env("ONCEGATE_SEND_SOURCE");
    const sent = await Promise.all(Array.from({ length: 8 }, () => client().send(source, message, key("send"))));
    const ids = new Set(sent.map((one) => (one.answer as { data: { message_id: string } }).data.message_id));
    assert.equal(ids.size, 1, `one message for every caller: ${[...ids]}`);
    const again = await client().send(source, message, key("send"));
    assert.equal(again.replayed, true);
    assert.ok(ids.has((again.answer as { data: { message_id: string } }).data.message_id));
    await assert.rejects(client().send(source, { ...message, content: { text: "another" } }, key("send")), Conflict);
    await assert.rejects(client().send("no-such-source", message, key("send 404")), BadRequest);
  });
});

describe("webhooks", () => {
  const delivery = JSON.parse(readFileSync(env("ONCEGATE_DELIVERY"), "utf8")) as {
    secret: string;
    headers: Record<string, string>;
    body: string;
  };

  test("a real delivery verifies and gives its envelope", () => {
    const envelope = verifyDelivery(delivery.secret, delivery.headers, new TextEncoder().encode(delivery.body));
    assert.equal(envelope.id, delivery.headers["idempotency-key"]);
  });

  test("a changed body or another secret does not verify", () => {
    assert.throws(() => verifyDelivery(delivery.secret, delivery.headers, delivery.body.replace("{", "{ ")), InvalidDelivery);
    assert.throws(
      () => verifyDelivery("whsec_QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=", delivery.headers, delivery.body),
      InvalidDelivery,
    );
  });
});
