"""The Python client against a real gateway, which `crates/cli/tests/clients.rs` starts and
names in the environment: ONCEGATE_API (its api.listen URL), ONCEGATE_TOKEN (a caller's token),
ONCEGATE_SEND_SOURCE (a Feishu source sending to a local Feishu-like API), ONCEGATE_RUN (a
prefix for this run's keys) and ONCEGATE_DELIVERY (a file with one real http-sink delivery, its
headers and the route's secret)."""

import json
import os
import threading
import time
import unittest

import oncegate
from oncegate import Client

ENV = {}


def setUpModule():
    for name in ("ONCEGATE_API", "ONCEGATE_TOKEN", "ONCEGATE_SEND_SOURCE", "ONCEGATE_RUN",
                 "ONCEGATE_DELIVERY"):
        if not os.environ.get(name):
            raise RuntimeError(
                f"{name} is not set: these tests run against a gateway that "
                "crates/cli/tests/clients.rs starts (cargo test -p oncegate --test clients)"
            )
        ENV[name] = os.environ[name]


def client():
    return Client(ENV["ONCEGATE_API"], ENV["ONCEGATE_TOKEN"])


def key(name):
    return f"{ENV['ONCEGATE_RUN']} python {name}"


def in_threads(count, call):
    """Runs `call(i)` in `count` threads started together; answers results and exceptions."""
    start = threading.Barrier(count)
    results, failures = [None] * count, [None] * count

    def one(i):
        start.wait()
        try:
            results[i] = call(i)
        except BaseException as failed:  # noqa: BLE001 - reported by the test
            failures[i] = failed

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, failures


class Keys(unittest.TestCase):
    def test_eight_concurrent_callers_of_one_key_run_the_work_once(self):
        runs = []

        def work():
            runs.append(1)
            time.sleep(0.3)  # the others arrive while it runs: they wait for its result
            return {"order": 42, "run": len(runs)}

        results, failures = in_threads(
            8, lambda i: client().run_once(key("order 42"), work, payload={"n": 42}, wait_ms=10_000)
        )
        self.assertEqual(failures, [None] * 8)
        self.assertEqual(len(runs), 1, "the work ran once")
        self.assertEqual(results, [{"order": 42, "run": 1}] * 8, "every caller got its result")
        # Later, too: the stored result, no second run.
        self.assertEqual(client().run_once(key("order 42"), work, payload={"n": 42}),
                         {"order": 42, "run": 1})
        self.assertEqual(len(runs), 1)

    def test_the_with_block_completes_with_its_result(self):
        with client().once(key("with")) as hold:
            self.assertFalse(hold.done)
            hold.result = {"created": "a"}
        with client().once(key("with")) as again:
            self.assertTrue(again.done)
            self.assertEqual(again.result, {"created": "a"})

    def test_an_exception_releases_the_key_for_the_next_caller(self):
        with self.assertRaises(ZeroDivisionError):
            with client().once(key("fails"), lease_ms=60_000) as hold:
                self.assertFalse(hold.done)
                raise ZeroDivisionError("the work failed")
        # Released, not held for the minute: the next caller acquires at once (wait_ms 0).
        started = time.monotonic()
        self.assertEqual(client().run_once(key("fails"), lambda: "second", wait_ms=0), "second")
        self.assertLess(time.monotonic() - started, 5)

    def test_a_long_work_keeps_its_lease_by_renewing(self):
        holding, finish = threading.Event(), threading.Event()

        def long_work():
            with client().once(key("long"), lease_ms=600) as hold:
                holding.set()
                finish.wait(10)
                hold.result = "long done"

        worker = threading.Thread(target=long_work)
        worker.start()
        self.assertTrue(holding.wait(10))
        time.sleep(1.5)  # over two leases of 600 ms: only renewals keep it
        with self.assertRaises(oncegate.InFlight) as raised:
            client().claim(key("long"), wait_ms=0)
        self.assertEqual(raised.exception.status, 409)
        finish.set()
        worker.join()
        self.assertEqual(client().run_once(key("long"), lambda: "again"), "long done")

    def test_a_lapsed_lease_is_fenced(self):
        api = client()
        first = api.claim(key("lapsed"), lease_ms=100)
        self.assertEqual(first["state"], "acquired")
        time.sleep(0.4)
        second = api.claim(key("lapsed"), wait_ms=0)
        self.assertEqual(second["state"], "acquired")
        with self.assertRaises(oncegate.Fenced):
            api.complete(key("lapsed"), first["lease"], "not mine")
        api.complete(key("lapsed"), second["lease"], "mine")
        self.assertEqual(api.run_once(key("lapsed"), lambda: "never"), "mine")

    def test_another_payload_is_a_conflict(self):
        client().run_once(key("payload"), lambda: 1, payload={"a": 1})
        with self.assertRaises(oncegate.Conflict):
            client().run_once(key("payload"), lambda: 2, payload={"a": 2})

    def test_a_wrong_token_is_unauthorized_and_an_empty_one_refused(self):
        with self.assertRaises(oncegate.Unauthorized):
            Client(ENV["ONCEGATE_API"], "not-a-caller").claim(key("token"))
        with self.assertRaises(ValueError):
            Client(ENV["ONCEGATE_API"], "")
        self.assertNotIn(ENV["ONCEGATE_TOKEN"], repr(client()))

    def test_no_gateway_is_unavailable(self):
        with self.assertRaises(oncegate.Unavailable):
            Client("http://127.0.0.1:9", "t", timeout=2).claim(key("closed"))


class Send(unittest.TestCase):
    def test_a_send_repeated_under_one_key_sends_once(self):
        message = {"receive_id": "oc_python", "msg_type": "text", "content": {"text": "hi"}}
        source = ENV["ONCEGATE_SEND_SOURCE"]
        results, failures = in_threads(
            8, lambda i: client().send(source, message, idempotency_key=key("send"))
        )
        self.assertEqual(failures, [None] * 8)
        ids = {sent.answer["data"]["message_id"] for sent in results}
        self.assertEqual(len(ids), 1, f"one message for every caller: {ids}")
        again = client().send(source, message, idempotency_key=key("send"))
        self.assertTrue(again.replayed)
        self.assertEqual(again.answer["data"]["message_id"], ids.pop())
        other = dict(message, content={"text": "another"})
        with self.assertRaises(oncegate.Conflict):
            client().send(source, other, idempotency_key=key("send"))
        with self.assertRaises(oncegate.BadRequest):
            client().send("no-such-source", message, idempotency_key=key("send 404"))


class Webhooks(unittest.TestCase):
    def setUp(self):
        with open(ENV["ONCEGATE_DELIVERY"], encoding="utf-8") as file:
            self.delivery = json.load(file)
        self.body = self.delivery["body"].encode()

    def test_a_real_delivery_verifies_and_gives_its_envelope(self):
        envelope = oncegate.verify_delivery(
            self.delivery["secret"], self.delivery["headers"], self.body
        )
        self.assertEqual(envelope["id"], self.delivery["headers"]["idempotency-key"])

    def test_a_changed_body_or_another_secret_does_not_verify(self):
        with self.assertRaises(oncegate.InvalidDelivery):
            oncegate.verify_delivery(
                self.delivery["secret"], self.delivery["headers"], self.body.replace(b"{", b"{ ", 1)
            )
        with self.assertRaises(oncegate.InvalidDelivery):
            oncegate.verify_delivery(
                "whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=",
                self.delivery["headers"],
                self.body,
            )


if __name__ == "__main__":
    unittest.main()
