// eth_call and eth_estimateGas in the JavaScript EVM (src/eth/call.ts): what is refused and
// handed to the fallback, what a repeated call costs, and the gas and round arithmetic. The
// answers and the parties' view of each call are checked against the Python endpoint's in
// eth.test.ts (tests/vectors/chain_tables.json).

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { fromHex, toHex } from "../src/bytes.js";
import { PrivateProvider, type ProviderRpcError, keccak256 } from "../src/index.js";
import { intrinsicGas, roundBucket } from "../src/eth/call.js";
import { CHAIN, chainProvider } from "./chain.js";

const TOKEN = CHAIN.accounts[CHAIN.accounts.length - 2]!.address;
const HOLDER = CHAIN.accounts[0]!.address;
const BALANCE_OF = "0x70a08231" + "00".repeat(12) + HOLDER.slice(2);

function lookups(...parties: { posts: { path: string }[] }[]): number {
  return parties.reduce((n, p) => n + p.posts.filter((q) => q.path !== "/epoch").length, 0);
}

describe("eth_call in the JavaScript EVM", () => {
  it("hands what it does not run to the fallback as it came, and refuses bad params", async () => {
    const { provider } = chainProvider("msgpack", true);
    const forwarded: unknown[] = [];
    const withFallback = new PrivateProvider(provider.state, {
      calls: provider.calls, fallback: { request: async (r) => { forwarded.push(r); return "0xfa11"; } },
    });
    const notHere = [
      [{ data: "0x6000" }],                                          // contract creation
      [{ to: TOKEN, data: BALANCE_OF, gasPrice: "0x1" }],             // pays for gas
      [{ to: TOKEN, data: BALANCE_OF, authorizationList: [] }],       // EIP-7702
      [{ to: TOKEN, data: BALANCE_OF }, "latest", { [TOKEN]: { balance: "0x1" } }], // overrides
      [{ to: TOKEN, data: BALANCE_OF }, "0x1"],                       // another block
    ];
    for (const params of notHere) {
      assert.equal(await withFallback.request({ method: "eth_call", params }), "0xfa11");
    }
    assert.equal(forwarded.length, notHere.length);
    for (const params of [[{ to: "0x12", data: "0x" }], [{ to: TOKEN, data: "0x123" }], [{ to: TOKEN, oops: 1 }], [],
      [{ to: TOKEN, gas: "0x01" }]]) {
      await assert.rejects(provider.request({ method: "eth_call", params }), (e: ProviderRpcError) => e.code === -32602);
    }
    // without a fallback, not run here is refused, and nothing is sent anywhere
    await assert.rejects(provider.request({ method: "eth_call", params: notHere[0]! }), (e: ProviderRpcError) => e.code === -32001);
  });

  it("answers a call repeated at the block still served with no lookup, and one round at a new version", async () => {
    const { provider, parties } = chainProvider("msgpack", true);
    const call = { method: "eth_call", params: [{ to: TOKEN, data: BALANCE_OF }] };
    const first = await provider.request(call);
    const before = lookups(...parties);
    assert.ok(before > 0);
    assert.equal(await provider.request(call), first);
    assert.equal(lookups(...parties), before, "the second run read everything it needed already");
    // the parties move to other data (a new epoch, the same pages): the call reads again, in
    // one round padded to its bucket, everything it read last time
    for (const p of parties) p.epochId += 1;
    const posts = parties.map((p) => p.posts.length);
    assert.equal(await provider.request(call), first);
    const asked = parties[0].posts.slice(posts[0]).filter((q) => q.path !== "/epoch").map((q) => (q.body as { table: string }).table);
    assert.deepEqual(asked.filter((t) => t.endsWith(".data")).sort(), ["accounts.data", "storage.data"]);
  });

  it("shares rounds between the calls in flight: eight balances at once, a handful of rounds", async () => {
    const { provider, parties } = chainProvider("msgpack", true);
    const holders = [...CHAIN.accounts.slice(0, 6).map((a) => a.address), "0x" + "42".repeat(20), "0x" + "43".repeat(20)];
    const storage = CHAIN.accounts[CHAIN.accounts.length - 2]!.storage;
    const posts = parties[0].posts.length;
    const got = await Promise.all(holders.map((h) => provider.request({
      method: "eth_call", params: [{ to: TOKEN, data: "0x70a08231" + "00".repeat(12) + h.slice(2) }],
    })));
    holders.forEach((h, i) => {
      const slot = "0x" + BigInt("0x" + toHex(keccak256(fromHex("00".repeat(12) + h.slice(2) + "00".repeat(32))))).toString(16);
      assert.equal(BigInt(got[i] as string), BigInt(storage[slot] ?? "0x0"), h);
    });
    // alone, each would take three rounds and a fourth of padding: 32 storage requests
    const rounds = parties[0].posts.slice(posts).filter((q) => (q.body as { table: string }).table === "storage.data").length;
    assert.ok(rounds <= 8, `${rounds} rounds for eight calls`);
  });

  it("counts a transaction's intrinsic gas, Prague's calldata floor, and pads rounds to buckets", () => {
    const call = (data: number[], accessList: [Uint8Array, Uint8Array[]][] = []) => ({
      sender: new Uint8Array(20), to: new Uint8Array(20), data: Uint8Array.from(data), value: 0n, gas: 0n, accessList,
    });
    assert.deepEqual(intrinsicGas(call([])), { gas: 21_000n, floor: 21_000n });
    assert.deepEqual(intrinsicGas(call([0, 1])), { gas: 21_000n + 4n + 16n, floor: 21_000n + 10n * 5n });
    assert.equal(intrinsicGas(call([], [[new Uint8Array(20), [new Uint8Array(32), new Uint8Array(32)]]])).gas, 21_000n + 2_400n + 3_800n);
    assert.deepEqual([0, 1, 2, 3, 5, 33, 64].map(roundBucket), [0, 1, 2, 4, 8, 64, 64]);
    assert.throws(() => roundBucket(65), /more than 64 rounds/);
  });
});
