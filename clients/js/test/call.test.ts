// eth_call and eth_estimateGas in the JavaScript EVM (src/eth/call.ts): what is refused and
// handed to the fallback, what a repeated call costs, and the gas and round arithmetic. The
// answers and the parties' view of each call are checked against the Python endpoint's in
// eth.test.ts (tests/vectors/chain_tables.json).

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { fromHex, toHex } from "../src/bytes.js";
import { type EthState, PirUnavailable, PrivateProvider, type ProviderRpcError, keccak256 } from "../src/index.js";
import { PrivateCalls, intrinsicGas, roundBucket } from "../src/eth/call.js";
import type { Served } from "../src/eth/state.js";
import { CHAIN, chainProvider } from "./chain.js";

const TOKEN = CHAIN.accounts[CHAIN.accounts.length - 2]!.address;
const HOLDER = CHAIN.accounts[0]!.address;
const BALANCE_OF = "0x70a08231" + "00".repeat(12) + HOLDER.slice(2);

/** A contract that reads storage words 1..`words` in a chain (each read only once the one
 * before is known, and nonzero: a round each), then returns 0x2a. */
function chainedCode(words: number): Uint8Array {
  const end = 7 * words + 10;
  const checks = Array.from({ length: words }, (_, i) => [0x60, i + 1, 0x54, 0x15, 0x60, end, 0x57]).flat();
  // PUSH1 0x2a PUSH1 0 MSTORE8 PUSH1 1 PUSH1 0 RETURN; JUMPDEST STOP
  return Uint8Array.from([...checks, 0x60, 0x2a, 0x60, 0, 0x53, 0x60, 1, 0x60, 0, 0xf3, 0x5b, 0x00]);
}

/** The state `PrivateCalls` reads, in memory: CHAINED's code at CHAINED (its words 1..n are
 * n + 1), every other account none; `round` as `EthState.round` answers, counted in `sent`,
 * the round `failAt` failing as a party's error would make it. */
const CHAINED = "0x" + "c0".repeat(20);
function chainedState(words: number, failAt: number): { state: EthState; sent: number[] } {
  const served: Served = { chainId: 31337, number: 9, hash: "0x" + "99".repeat(32), version: 4, time: 1_700_000_000 };
  const code = chainedCode(words);
  const codeHash = keccak256(code);
  const sent: number[] = [];
  const state = {
    latest: null,
    head: async () => served,
    stillServed: async () => false,
    round: async (accounts: readonly Uint8Array[], wordsAsked: readonly (readonly [Uint8Array, Uint8Array])[], codeHashes: readonly Uint8Array[]) => {
      sent.push(sent.length + 1);
      if (sent.length === failAt) throw new PirUnavailable("party B: a round refused");
      return {
        served,
        accounts: accounts.map((a) => ("0x" + toHex(a) === CHAINED ? { nonce: 1n, balance: 0n, codeHash } : null)),
        words: wordsAsked.map(([a, s]) => {
          const slot = BigInt("0x" + toHex(s));
          return "0x" + toHex(a) === CHAINED && slot >= 1n && slot <= BigInt(words) ? slot + 1n : 0n;
        }),
        codes: codeHashes.map((h) => (toHex(h) === toHex(codeHash) ? code : new Uint8Array())),
      };
    },
  };
  return { state: state as unknown as EthState, sent };
}

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

  // a call reading n chained words reads 2 + n rounds of its own (the accounts, the code, a
  // round a word), padded to its bucket; failed at any round k, its own or padding
  const failing = [3, 4, 5, 6].flatMap((own) => Array.from({ length: roundBucket(own) }, (_, i) => [own, i + 1] as const));
  for (const [own, failAt] of failing) {
    it(`a round a party fails ends the call's rounds whichever round it was: ${own} rounds of its own, round ${failAt} failed`, async () => {
      // Padded after its own round failed, but not after a padding round, the count told
      // the two apart, and so the length of the contract's path: 4 rounds of its own failed
      // at the 4th showed 5 rounds, 3 failed at the 4th (padding) showed 4.
      const { state, sent } = chainedState(own - 2, failAt);
      const calls = new PrivateCalls(state);
      const call = calls.call([{ to: CHAINED, data: "0x00" }], { any: true, check: () => {} });
      if (failAt <= own) await assert.rejects(call, PirUnavailable);
      else assert.equal(await call, "0x2a");
      assert.equal(sent.length, failAt, `${sent.length} rounds sent`);
      assert.equal(calls.rounds, failAt);
    });
  }

  it("a call that reads n chained words reads 2 + n rounds of its own, padded to its bucket", async () => {
    for (const own of [3, 4, 5, 6]) {
      const { state, sent } = chainedState(own - 2, 0);
      const calls = new PrivateCalls(state);
      assert.equal(await calls.call([{ to: CHAINED, data: "0x00" }], { any: true, check: () => {} }), "0x2a");
      assert.equal(sent.length, roundBucket(own), `${own} rounds of its own`);
    }
  });
});
