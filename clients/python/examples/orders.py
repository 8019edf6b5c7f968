import os

from oncegate import Client

API = os.environ.get("ONCEGATE_API", "http://127.0.0.1:9191")  # the gateway's api.listen
gateway = Client(API, os.environ["ORDERS_API_TOKEN"])


def create_order_once(shop, order_id, body):
    """Creates order `order_id` once, however often and from however many processes asked."""
    with gateway.once(f"create order {order_id}", payload=body) as hold:
        if not hold.done:  # done: created before, and hold.result is what it answered
            created = shop.create_order(order_id, body)  # the side effect, once
            hold.result = {"order": created["id"]}
    # An exception in the block releases the key (the next call runs it) and goes on.
    return hold.result
