// The page of the browser test (tests/integration/test_js_browser.py): reads pages and
// Ethereum state from two parties with the client's ES module bundle, shows each answer and
// what each party was sent, and leaves them all in `window.results` (a promise) for the test.
//
// Query string: a, b (the parties' base URLs), owner (the data owner's public key, hex),
// pages (page numbers, comma-separated), address, slot, enc (json or msgpack), tries (the
// page client's attempts a request), lie=b (this page flips a byte of every query answer
// of party B before the client sees it: a lying party).

import { EthState, PirClient, PrivateProvider, RetryPolicy, toHex } from "./morphogen.js";

const q = new URLSearchParams(location.search);
const A = q.get("a"), B = q.get("b");
const seen = { A: { requests: 0, bytes: 0 }, B: { requests: 0, bytes: 0 } };

function flipped(obj) {
  const pages = obj.pages ?? obj.results?.[0]?.pages;
  if (pages?.length) {
    const p = pages[0];
    if (typeof p === "string") pages[0] = p.slice(0, 40) + (p[40] === "0" ? "1" : "0") + p.slice(41);
    else p[20] ^= 1;
  }
  return obj;
}

async function partyFetch(input, init = {}) {
  const url = String(input);
  const who = url.startsWith(B) ? "B" : "A";
  seen[who].requests += 1;
  seen[who].bytes += init.body?.length ?? 0;
  const resp = await fetch(input, init);
  if (who !== "B" || q.get("lie") !== "b" || init.method !== "POST" || !resp.ok) return resp;
  const type = resp.headers.get("content-type") ?? "";
  if (type.includes("json")) {
    return new Response(JSON.stringify(flipped(await resp.json())), { status: resp.status, headers: resp.headers });
  }
  const body = new Uint8Array(await resp.arrayBuffer());
  body[body.length - 100] ^= 1; // inside the last page of the msgpack answer
  return new Response(body, { status: resp.status, headers: resp.headers });
}

const rows = document.getElementById("steps");
function show(name, step) {
  const tr = document.createElement("tr");
  const answer = step.ok ? JSON.stringify(step.value) : `refused: ${step.error}`;
  tr.innerHTML = "<td></td><td class=value></td><td></td>";
  tr.children[0].textContent = name;
  tr.children[1].textContent = answer.length > 300 ? answer.slice(0, 300) + "..." : answer;
  tr.children[1].className = "value " + (step.ok ? "ok" : "refused");
  tr.children[2].textContent = step.ms.toFixed(1);
  rows.appendChild(tr);
  const table = document.getElementById("seen");
  table.innerHTML = "";
  for (const [who, s] of Object.entries(seen)) {
    const r = document.createElement("tr");
    r.innerHTML = `<td>${who}</td><td>${s.requests}</td><td>${s.bytes}</td>`;
    table.appendChild(r);
  }
}

async function run() {
  document.getElementById("where").textContent = `page ${location.origin}; parties ${A} and ${B}`;
  const tries = Number(q.get("tries") ?? 14);
  const pir = new PirClient(A, B, {
    fetch: partyFetch, encoding: q.get("enc") ?? "json", retry: new RetryPolicy(tries, 0.05, 0.5),
  });
  const provider = new PrivateProvider(new EthState(pir, q.get("owner")));
  const steps = {};
  const step = async (name, fn) => {
    const t0 = performance.now();
    try {
      steps[name] = { ok: true, value: await fn() };
    } catch (e) {
      steps[name] = { ok: false, error: `${e.name}: ${e.message}`, code: e.code ?? null };
    }
    steps[name].ms = performance.now() - t0;
    show(name, steps[name]);
  };
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
