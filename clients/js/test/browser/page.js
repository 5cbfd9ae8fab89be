// The page of the browser test (tests/integration/test_js_browser.py): reads pages and
// Ethereum state from two parties with the client's ES module bundle, shows each answer and
// what each party was sent, and leaves them all in `window.results` (a promise) for the test.
//
// Query string: a, b (the parties' base URLs), owner (the data owner's public key, hex),
// pages (page numbers, comma-separated), address, slot, enc (json or msgpack), tries (the
// page client's attempts a request), lie=b (this page flips a byte of every query answer
// of party B before the client sees it: a lying party).

import { EthState, PirClient, PrivateProvider, RetryPolicy, toHex } from "./morphogen.js";
import { stepper, watchedFetch } from "./watch.js";

const q = new URLSearchParams(location.search);
const A = q.get("a"), B = q.get("b");

async function run() {
  document.getElementById("where").textContent = `page ${location.origin}; parties ${A} and ${B}`;
  const tries = Number(q.get("tries") ?? 14);
  const { fetch, seen } = watchedFetch(B, q.get("lie") === "b");
  const pir = new PirClient(A, B, {
    fetch, encoding: q.get("enc") ?? "json", retry: new RetryPolicy(tries, 0.05, 0.5),
  });
  const provider = new PrivateProvider(new EthState(pir, q.get("owner")));
  const { steps, step } = stepper(seen);
  const ask = (method, ...params) => provider.request({ method, params });
  const address = q.get("address");
  await step("pages", async () => (await pir.get(q.get("pages").split(",").map(Number))).map(toHex));
  await step("eth_chainId", () => ask("eth_chainId"));
  await step("eth_blockNumber", () => ask("eth_blockNumber"));
  await step("eth_getBalance", () => ask("eth_getBalance", address, "latest"));
  await step("eth_getTransactionCount", () => ask("eth_getTransactionCount", address, "latest"));
  await step("eth_getStorageAt", () => ask("eth_getStorageAt", address, q.get("slot"), "latest"));
  await step("eth_getCode", () => ask("eth_getCode", address, "latest"));
  // the same balance with every descriptor in hand: one lookup, or none while still served
  await step("eth_getBalance again", () => ask("eth_getBalance", address));
  return { origin: location.origin, steps, seen };
}

window.results = run();
