import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { ed25519 } from "@noble/curves/ed25519.js";
import { sha256 } from "@noble/hashes/sha2.js";

import { concatBytes, fromHex, toHex } from "../src/bytes.js";
import { PAGE_SIZE } from "../src/constants.js";
import {
  CODE_CHUNK_SIZE,
  EMPTY_CODE_HASH,
  EthState,
  KeywordIntegrityError,
  MAX_SENDERS,
  PirClient,
  PrivateProvider,
  ProviderRpcError,
  SentNonces,
  addressBytes,
  codeKey,
  decodeAccount,
  joinCode,
  keccak256,
  storageKey,
  wordBytes,
  type EthStateOptions,
  type RequestArguments,
} from "../src/index.js";
import { PrivateCalls } from "../src/eth/call.js";
import { FakeParty, domainBitsFor, fakeFetch } from "./fake.js";
import { readVectors } from "./vectors.js";

interface Rpc {
  method: string; params: unknown[]; shape: [string, number][];
  result?: string; error?: { code: number; message: string; data?: string };
}
interface Chain {
  public_key: string;
  anchor: { chain_id: number; number: number; hash: string };
  num_pages: number;
  pages: Record<string, string>;
  tables: { name: string; first_page: number; num_pages: number }[];
  accounts: { address: string; nonce: string; balance: string; code_hash: string; storage: Record<string, string> }[];
  rpc: Rpc[];
}
const CHAIN = readVectors<Chain>("chain_tables.json");

function pagesOf(t: Chain): Uint8Array[] {
  const pages = Array.from({ length: t.num_pages }, () => new Uint8Array(PAGE_SIZE));
  for (const [i, h] of Object.entries(t.pages)) pages[Number(i)]!.set(fromHex(h));
  return pages;
}

// the vector owner's key (tests/vectors/chain_tables.py), to sign other builds with it
const OWNER = sha256(new TextEncoder().encode("morphogen chain vector owner"));
const DESCRIPTOR_DOMAIN = new TextEncoder().encode("morphogen-keyword-descriptor-v2\0");

/** The vector's pages with each table's descriptor text edited and signed again by the
 * owner: another build of the chain's tables under the same key. */
function resigned(edit: (text: string) => string): Uint8Array[] {
  const pages = pagesOf(CHAIN);
  for (const t of CHAIN.tables.filter((t) => t.name.endsWith(".descriptor"))) {
    const page = pages[t.first_page]!;
    const view = new DataView(page.buffer, page.byteOffset);
    const text = new TextDecoder().decode(page.subarray(12, 12 + view.getUint32(8, true)));
    const raw = new TextEncoder().encode(edit(text));
    page.fill(0, 8);
    view.setUint32(8, raw.length, true);
    page.set(raw, 12);
    page.set(ed25519.sign(concatBytes(DESCRIPTOR_DOMAIN, page.subarray(0, PAGE_SIZE - 64)), OWNER), PAGE_SIZE - 64);
  }
  return pages;
}

/** Two in-process parties serving the vector's joined tables as a snapshot of them does. */
function served(pages = pagesOf(CHAIN), options: EthStateOptions = {}) {
  const parties = [new FakeParty(pages, domainBitsFor(pages.length)), new FakeParty(pages, domainBitsFor(pages.length))] as const;
  for (const p of parties) {
    p.keyFormats = ["v1", "packed"]; // a packed key's scan is the cheaper one to fake
    p.tables = Object.fromEntries(CHAIN.tables.map((t) => [t.name,
      { first_page: t.first_page, num_pages: t.num_pages, domain_bits: domainBitsFor(t.num_pages) }]));
  }
  const pir = new PirClient("http://a", "http://b", { fetch: fakeFetch(...parties), sleep: async () => {}, encoding: "msgpack" });
  const state = new EthState(pir, CHAIN.public_key, options);
  return { a: parties[0], b: parties[1], pir, state, provider: new PrivateProvider(state) };
}

/** What party `p` was asked since `from`: [party table, queries], sorted. */
function shape(p: FakeParty, from = 0): [string, number][] {
  return p.posts.slice(from).map((q) => {
    const body = q.body as { table: string; queries?: unknown[] };
    return [body.table, body.queries?.length ?? 1] as [string, number];
  }).sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : x[1] - y[1]));
}

const ask = (provider: PrivateProvider, method: string, ...params: unknown[]) => provider.request({ method, params });

async function rejectsWith(p: Promise<unknown>, code: number, says?: RegExp): Promise<void> {
  await assert.rejects(p, (e: Error) => {
    assert.ok(e instanceof ProviderRpcError, String(e));
    assert.equal(e.code, code, e.message);
    if (says) assert.match(e.message, says);
    return true;
  });
}

describe("chain records (morphogen/chain/state.py)", () => {
  it("encodes keys and decodes values as the Python side", () => {
    assert.equal(toHex(EMPTY_CODE_HASH), "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470");
    const addr = "0x" + "11".repeat(20);
    assert.equal(toHex(storageKey(addr, "0x1")), "11".repeat(20) + "00".repeat(31) + "01");
    assert.equal(toHex(codeKey(EMPTY_CODE_HASH, 258)).slice(-8), "00000102");
    assert.deepEqual(wordBytes(2n ** 255n)[0], 0x80);
    const value = fromHex("00".repeat(7) + "07" + "00".repeat(31) + "05" + "ab".repeat(32));
    assert.deepEqual(decodeAccount(value), { nonce: 7n, balance: 5n, codeHash: fromHex("ab".repeat(32)) });
    assert.throws(() => addressBytes("0x1234"), /20 bytes/);
    assert.throws(() => addressBytes("11".repeat(20)), /0x-hex/);
    assert.throws(() => wordBytes("0x" + "1".repeat(65)), /at most 32 bytes/);
  });

  it("joins code only when its chunks say one length, are zero past it and hash to it", () => {
    const code = Uint8Array.from({ length: CODE_CHUNK_SIZE + 5 }, (_, i) => i & 0xff);
    const chunk = (i: number, length = code.length) => {
      const v = new Uint8Array(1024);
      new DataView(v.buffer).setUint32(0, length);
      v.set(code.subarray(i * CODE_CHUNK_SIZE, (i + 1) * CODE_CHUNK_SIZE), 4);
      return v;
    };
    const hash = keccak256(code);
    assert.deepEqual(joinCode(hash, [chunk(0), chunk(1)]), code);
    assert.throws(() => joinCode(hash, [chunk(0)]), /2 chunks, got 1/);
    assert.throws(() => joinCode(hash, [chunk(0), chunk(1, code.length + 1)]), /states length/);
    const padded = chunk(1);
    padded[1000] = 1;
    assert.throws(() => joinCode(hash, [chunk(0), padded]), /past the code's end/);
    assert.throws(() => joinCode(keccak256(new Uint8Array(1)), [chunk(0), chunk(1)]), /does not hash/);
  });
});

describe("Ethereum state reads: tests/vectors/chain_tables.json", () => {
  it(`answers the Python endpoint's ${CHAIN.rpc.length} requests alike, asking the parties the same`, async () => {
    // as the vector was recorded: parties without identities (so that no read is answered
    // from a version confirmed still served) and every descriptor read first
    const { a, b, provider, state } = served();
    a.identity = b.identity = null;
    await state.refresh();
    for (const r of CHAIN.rpc) {
      const [fromA, fromB] = [a.posts.length, b.posts.length];
      // a call as the Python endpoint recorded it: run by calls that have read nothing yet
      const calling = r.method === "eth_call" || r.method === "eth_estimateGas"
        ? new PrivateProvider(state, { calls: new PrivateCalls(state) }) : provider;
      const what = `${r.method} ${JSON.stringify(r.params).slice(0, 80)}`;
      if (r.error !== undefined) {
        await assert.rejects(calling.request({ method: r.method, params: r.params }), (e: ProviderRpcError) => {
          assert.equal(e.code, r.error!.code, what);
          assert.equal(e.message, r.error!.message, what);
          assert.equal(e.data, r.error!.data, what);
          return true;
        });
      } else {
        assert.equal(await calling.request({ method: r.method, params: r.params }), r.result, what);
      }
      assert.deepEqual(shape(a, fromA), r.shape, what);
      assert.deepEqual(shape(b, fromB), r.shape, what);
    }
  });

  it("reads balances, nonces, words and code as bigints and bytes, with the block", async () => {
    const { state } = served();
    for (const acc of CHAIN.accounts) {
      assert.equal(await state.getBalance(acc.address), BigInt(acc.balance));
      assert.equal(await state.getTransactionCount(fromHex(acc.address)), BigInt(acc.nonce));
      for (const [s, w] of Object.entries(acc.storage)) {
        assert.equal(toHex(await state.getStorageAt(acc.address, BigInt(s))), toHex(wordBytes(w)));
      }
      assert.equal("0x" + toHex(keccak256(await state.getCode(acc.address))), acc.code_hash);
    }
    const [[none], at] = await state.accounts(["0x" + "00".repeat(20)]);
    assert.equal(none, null);
    assert.deepEqual(at, { chainId: CHAIN.anchor.chain_id, number: CHAIN.anchor.number, hash: CHAIN.anchor.hash, version: 1, time: at.time });
  });

  it("answers a balance read at the block still served with no lookup, and looks up once the parties move", async () => {
    const { a, b, provider } = served();
    const who = CHAIN.accounts[0]!.address;
    const want = "0x" + BigInt(CHAIN.accounts[0]!.balance).toString(16);
    assert.equal(await ask(provider, "eth_getBalance", who, "latest"), want);
    const asked = a.posts.length;
    assert.equal(await ask(provider, "eth_getBalance", who), want);
    assert.equal(await ask(provider, "eth_getTransactionCount", who), "0x7");
    assert.equal(a.posts.length, asked, "no lookup for an account read at the block still served");
    for (const p of [a, b]) p.epochId += 1;  // the same pages under a new epoch: data left
    assert.equal(await ask(provider, "eth_getBalance", who), want);
    assert.ok(a.posts.length > asked);
  });

  it("refuses a lying party's answers with an error, never a number", async () => {
    const { b, provider } = served();
    const who = CHAIN.accounts[5]!.address;
    await ask(provider, "eth_blockNumber");
    b.lie = true;
    for (const [method, params] of [["eth_getBalance", [who]], ["eth_getCode", [who]],
      ["eth_getStorageAt", [who, "0x0"]], ["eth_getTransactionCount", ["0x" + "00".repeat(20)]]] as const) {
      await rejectsWith(ask(provider, method, ...params), -32002, /no verified answer/);
    }
  });

  it("reads code past EIP-170 in a second request, and refuses code a party lied about", async () => {
    const { state, b } = served();
    const long = CHAIN.accounts[6]!;
    const code = await state.getCode(long.address);
    assert.equal(code.length, 25 * CODE_CHUNK_SIZE + 100);
    assert.equal("0x" + toHex(keccak256(code)), long.code_hash);
    b.lie = true;
    await assert.rejects(state.getCode(CHAIN.accounts[5]!.address), KeywordIntegrityError);
  });
});

describe("one owner key, several builds", () => {
  const who = CHAIN.accounts[0]!.address;
  const chainRefused = (how: string, want: number) => (e: Error) => e instanceof KeywordIntegrityError
    && e.message === `the servers serve chain 1 (keyword table "accounts", version 2); this client ${how} chain ${want}: `
    + "tables of another chain signed with the same key, refused";
  const otherChain = () => resigned((t) => t.replace('"chain_id":31337,', '"chain_id":1,').replace(/"version":1}$/, '"version":2}'));

  it("refuses a version anchored on another chain once one was read, and any answer from it", async () => {
    const { a, b, state, provider } = served();
    const other = otherChain();
    assert.ok(ed25519.getPublicKey(OWNER).every((x, i) => x === fromHex(CHAIN.public_key)[i]));
    assert.equal(await ask(provider, "eth_chainId"), "0x7a69");
    assert.equal(await state.getBalance(who), BigInt(CHAIN.accounts[0]!.balance));
    for (const p of [a, b]) {
      p.pages = other;
      p.epochId += 1;
    }
    await assert.rejects(state.getBalance(who), chainRefused("has read", 31337));
    await assert.rejects(state.head(), chainRefused("has read", 31337));
    await rejectsWith(ask(provider, "eth_chainId"), -32002, /no verified answer/);
    assert.equal(state.latest?.chainId, 31337);
  });

  it("holds to the chain id it is given, and refuses one that is not a chain id", async () => {
    await assert.rejects(served(otherChain(), { chainId: 31337 }).state.getBalance(who), chainRefused("was given", 31337));
    await assert.rejects(served(pagesOf(CHAIN), { chainId: 1 }).state.getBalance(who),
      /the servers serve chain 31337 \(keyword table "accounts", version 1\); this client was given chain 1: tables of another chain signed with the same key, refused$/);
    const { state, provider } = served(pagesOf(CHAIN), { chainId: 31337 });
    assert.equal(await state.getBalance(who), BigInt(CHAIN.accounts[0]!.balance));
    assert.equal(await ask(provider, "eth_chainId"), "0x7a69");
    for (const chainId of [0, -1, 1.5, Number.NaN]) {
      assert.throws(() => served(pagesOf(CHAIN), { chainId }), (e: Error) => e instanceof RangeError && /chainId/.test(e.message));
    }
  });

  it("refuses another build of the same chain (other dataset ids) in every reader, never a balance", async () => {
    const { a, b, state } = served();
    const ids = new Map<string, string>();
    const other = resigned((t) => t.replace(/"dataset":"([0-9a-f]{32})"/, (_, id: string) => {
      const next = [...id].reverse().join("");
      ids.set(next, id);
      return `"dataset":"${next}"`;
    }));
    await state.getBalance(who);
    for (const p of [a, b]) {
      p.pages = other;
      p.epochId += 1;
    }
    // two reads at once: the second makes clients of its own, held to the same dataset ids
    const got = await Promise.allSettled([state.getBalance(who), state.getBalance(who)]);
    for (const r of got) {
      assert.equal(r.status, "rejected");
      const m = /of dataset ([0-9a-f]{32}); this client has read dataset ([0-9a-f]{32}): another table signed with the same key, refused$/
        .exec((r as PromiseRejectedResult).reason.message);
      assert.ok((r as PromiseRejectedResult).reason instanceof KeywordIntegrityError && m !== null && ids.get(m[1]!) === m[2]);
    }
  });
});

describe("EIP-1193 provider", () => {
  it("answers chain id, net version and the block served, in a node's formats", async () => {
    const { provider } = served();
    assert.equal(await ask(provider, "eth_chainId"), "0x7a69");
    assert.equal(await ask(provider, "net_version"), "31337");
    assert.equal(await ask(provider, "eth_blockNumber"), "0x4d2");
    assert.match(String(await ask(provider, "web3_clientVersion")), /^morphogen-js\//);
  });

  it("serves the block served by tag, number, hash or EIP-1898 object, and no other block", async () => {
    const { provider } = served();
    const who = CHAIN.accounts[0]!.address;
    for (const block of ["latest", "pending", "0x4d2", CHAIN.anchor.hash, { blockNumber: "0x4d2" }, { blockHash: CHAIN.anchor.hash }]) {
      assert.equal(await ask(provider, "eth_getTransactionCount", who, block), "0x7", JSON.stringify(block));
    }
    for (const block of ["0x4d1", "earliest", "safe", "0x" + "ee".repeat(32)]) {
      await rejectsWith(ask(provider, "eth_getBalance", who, block), -32001, /not (the block )?served/);
    }
  });

  it("refuses params that do not fit, naming the method", async () => {
    const { provider } = served();
    const who = CHAIN.accounts[0]!.address;
    for (const [method, params, says] of [
      ["eth_getBalance", [], /takes 1 to 2 params/],
      ["eth_getBalance", ["0x1234"], /20 bytes/],
      ["eth_getBalance", [who, "0x01"], /no leading zeros/],
      ["eth_getStorageAt", [who, "0x" + "1".repeat(65)], /at most 32 bytes/],
      ["eth_getCode", [who, { blockHash: "0x12" }], /64 hex digits/],
      ["eth_chainId", [1], /takes 0 params/],
    ] as const) {
      await rejectsWith(ask(provider, method, ...params), -32602, new RegExp(`^${method}: .*${says.source}`));
    }
    await rejectsWith(provider.request({ method: "eth_getBalance", params: { address: who } }), -32602, /positional/);
  });

  it("hands other methods and other blocks to the fallback as they came, and only those", async () => {
    const seen: RequestArguments[] = [];
    const fallback = { request: async (r: RequestArguments) => { seen.push(r); return "from the fallback"; } };
    const { state } = served();
    const provider = new PrivateProvider(state, { fallback });
    const who = CHAIN.accounts[0]!.address;
    assert.equal(await ask(provider, "eth_sendRawTransaction", "0x12"), "from the fallback");
    assert.equal(await ask(provider, "eth_call", { to: who }, "latest"), "from the fallback");
    assert.equal(await ask(provider, "eth_getBalance", who, "0x1"), "from the fallback");
    assert.equal(await ask(provider, "eth_getBalance", who), "0x" + BigInt(CHAIN.accounts[0]!.balance).toString(16));
    assert.deepEqual(seen.map((r) => r.method), ["eth_sendRawTransaction", "eth_call", "eth_getBalance"]);
    assert.deepEqual(seen[2]!.params, [who, "0x1"]);
    await rejectsWith(ask(new PrivateProvider(state), "eth_sendRawTransaction", "0x12"), 4200, /no fallback/);
  });
});

/** A fallback as a node answers it: a send taken (its hash) or refused, the transaction's
 * sender and nonce for its hash (or null, or a failure), and every request noted. */
function fakeNode(from: string, nonce: string) {
  const node = {
    seen: [] as RequestArguments[],
    accepts: true, // the send is taken
    shows: "tx" as "tx" | "null" | "throws" | "odd", // the answer to eth_getTransactionByHash
    hash: "0x" + "cd".repeat(32),
    request: async (r: RequestArguments): Promise<unknown> => {
      node.seen.push(r);
      if (r.method === "eth_sendRawTransaction") {
        if (!node.accepts) throw new ProviderRpcError(-32000, "nonce too low");
        return node.hash;
      }
      assert.equal(r.method, "eth_getTransactionByHash");
      assert.deepEqual(r.params, [node.hash]);
      if (node.shows === "throws") throw new ProviderRpcError(-32002, "the node is gone");
      if (node.shows === "null") return null;
      if (node.shows === "odd") return { from, nonce: 7 };
      return { hash: node.hash, from, nonce, to: null, value: "0x0" };
    },
  };
  return node;
}

describe("pending: the transactions sent through the provider (morphogen/wallet/sent.py)", () => {
  const who = CHAIN.accounts[0]!.address; // nonce 7 at the signed block
  const other = CHAIN.accounts[3]!.address; // nonce 1

  it("counts a send the fallback took at `pending`, and `latest` stays the signed nonce", async () => {
    const node = fakeNode(who.toUpperCase().replace("0X", "0x"), "0x7");
    const { state } = served();
    const provider = new PrivateProvider(state, { fallback: node });
    assert.equal(await ask(provider, "eth_getTransactionCount", who, "pending"), "0x7");
    assert.equal(await ask(provider, "eth_sendRawTransaction", "0x02"), node.hash);
    assert.deepEqual(node.seen.map((r) => r.method), ["eth_sendRawTransaction", "eth_getTransactionByHash"]);
    assert.equal(await ask(provider, "eth_getTransactionCount", who, "pending"), "0x8");
    assert.equal(await ask(provider, "eth_getTransactionCount", who, "latest"), "0x7");
    assert.equal(await ask(provider, "eth_getTransactionCount", who), "0x7");
    assert.equal(await ask(provider, "eth_getTransactionCount", who, "0x4d2"), "0x7");
    // the next one sent: consecutive nonces, as a node's pool has them
    const next = fakeNode(who, "0x8");
    const provider2 = new PrivateProvider(state, { fallback: next, sent: provider.sent });
    await ask(provider2, "eth_sendRawTransaction", "0x03");
    assert.equal(await ask(provider, "eth_getTransactionCount", who, "pending"), "0x9");
    // an address that only reads: its signed nonce, and the fallback asked nothing for it
    const before = node.seen.length + next.seen.length;
    assert.equal(await ask(provider, "eth_getTransactionCount", other, "pending"), "0x1");
    assert.equal(await ask(provider, "eth_getBalance", who, "pending"), "0x" + BigInt(CHAIN.accounts[0]!.balance).toString(16));
    assert.equal(node.seen.length + next.seen.length, before);
  });

  it("asks the fallback nothing for reads, and only the sent hash after a send", async () => {
    const node = fakeNode(who, "0x7");
    const { state } = served();
    const provider = new PrivateProvider(state, { fallback: node });
    for (const block of ["pending", "latest", undefined]) {
      await ask(provider, "eth_getTransactionCount", who, ...(block === undefined ? [] : [block]));
      await ask(provider, "eth_getTransactionCount", other, ...(block === undefined ? [] : [block]));
    }
    assert.deepEqual(node.seen, []);
    await ask(provider, "eth_sendRawTransaction", "0x02");
    assert.deepEqual(node.seen, [
      { method: "eth_sendRawTransaction", params: ["0x02"] },
      { method: "eth_getTransactionByHash", params: [node.hash] },
    ]);
  });

  it("a refused send, or one whose transaction the fallback does not show, changes nothing", async () => {
    const node = fakeNode(who, "0x7");
    const { state } = served();
    const provider = new PrivateProvider(state, { fallback: node });
    node.accepts = false;
    await rejectsWith(ask(provider, "eth_sendRawTransaction", "0x02"), -32000, /nonce too low/);
    assert.deepEqual(node.seen.map((r) => r.method), ["eth_sendRawTransaction"]);
    node.accepts = true;
    for (const shows of ["null", "throws", "odd"] as const) {
      node.shows = shows;
      assert.equal(await ask(provider, "eth_sendRawTransaction", "0x02"), node.hash, shows);
      assert.equal(await ask(provider, "eth_getTransactionCount", who, "pending"), "0x7", shows);
    }
    assert.equal(provider.sent.size, 0);
    // an answer that is not a transaction hash: nothing asked about it
    node.seen.length = 0;
    node.hash = "not a hash";
    assert.equal(await ask(provider, "eth_sendRawTransaction", "0x02"), "not a hash");
    assert.deepEqual(node.seen.map((r) => r.method), ["eth_sendRawTransaction"]);
    assert.equal(await ask(provider, "eth_getTransactionCount", who, "pending"), "0x7");
  });

  it("an entry goes after KEEP_S, or once the signed nonce reaches it", async () => {
    const now = [0];
    const sent = new SentNonces({ clock: () => now[0]! });
    assert.equal(sent.keepS, 600);
    assert.equal(sent.maxSenders, 4096);
    const node = fakeNode(who, "0x7");
    const { state } = served();
    const provider = new PrivateProvider(state, { fallback: node, sent });
    await ask(provider, "eth_sendRawTransaction", "0x02");
    now[0] = 600;
    assert.equal(await ask(provider, "eth_getTransactionCount", who, "pending"), "0x8");
    now[0] = 600.5; // dropped from the pool, as far as anyone can tell
    assert.equal(await ask(provider, "eth_getTransactionCount", who, "pending"), "0x7");
    assert.equal(sent.size, 0);
    // the block with it signed: the signed nonce, and the entry gone
    sent.sent(who, 7n);
    assert.equal(sent.pending(who, 8n), 8n);
    assert.equal(sent.size, 0);
    assert.equal(sent.pending(who, 0n), 0n);
  });

  it("keeps at most maxSenders, the oldest sent going first; an older nonce resent keeps the next", () => {
    const now = [0];
    const sent = new SentNonces({ keepS: 10, maxSenders: 2, clock: () => now[0]! });
    const [a, b, c] = ["0a", "0b", "0c"].map((x) => "0x" + x.repeat(20)) as [string, string, string];
    sent.sent(a, 3n);
    sent.sent(a, 1n); // an older one resent: the next nonce stays
    assert.equal(sent.pending(a, 2n), 4n);
    now[0] = 11; // past keepS
    assert.equal(sent.pending(a, 2n), 2n);
    for (const w of [a, b, c]) sent.sent(w, 9n);
    assert.deepEqual([a, b, c].map((w) => sent.pending(w, 0n)), [0n, 10n, 10n]); // the oldest went
    // sending again makes a sender the newest
    sent.sent(b, 10n);
    sent.sent(a, 1n);
    assert.deepEqual([a, b, c].map((w) => sent.pending(w, 0n)), [2n, 11n, 0n]);
    assert.equal(sent.pending(a.toUpperCase().replace("0X", "0x"), 0n), 2n); // any case
  });

  it("a provider's own SentNonces caps at MAX_SENDERS senders", async () => {
    const { state } = served();
    let i = 0;
    const fallback = {
      request: async (r: RequestArguments) => r.method === "eth_sendRawTransaction"
        ? "0x" + "ab".repeat(32)
        : { from: "0x" + (i++).toString(16).padStart(40, "0"), nonce: "0x0" },
    };
    const provider = new PrivateProvider(state, { fallback });
    for (let k = 0; k < MAX_SENDERS + 3; k++) await ask(provider, "eth_sendRawTransaction", "0x02");
    assert.equal(provider.sent.size, MAX_SENDERS);
    assert.equal(provider.sent.pending("0x" + "0".repeat(40), 0n), 0n); // the first went
    assert.equal(provider.sent.pending("0x" + (MAX_SENDERS + 2).toString(16).padStart(40, "0"), 0n), 1n);
  });
});
