import { Client } from "oncegate";

const API = process.env.ONCEGATE_API ?? "http://127.0.0.1:9191"; // the gateway's api.listen
const gateway = new Client(API, process.env.ORDERS_API_TOKEN ?? "");

export interface Shop {
  createOrder(orderId: number, body: object): Promise<{ id: string }>;
}

/** Creates order `orderId` once, however often and from however many processes asked. */
export async function createOrderOnce(shop: Shop, orderId: number, body: object) {
  // Done before: its stored result, without running the function. A throw releases the key.
  return gateway.once(`create order ${orderId}`, async () => {
    const created = await shop.createOrder(orderId, body); // the side effect, once
    return { order: created.id };
  }, { payload: body });
}
