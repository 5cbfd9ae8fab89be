import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  DataMoved,
  EpochMismatchError,
  PageOutOfRange,
  PirClient,
  PirError,
  PirUnavailable,
  RetryPolicy,
  UnknownTable,
  type PirClientOptions,
} from "../src/index.js";
import { infoFromEpoch } from "../src/wire.js";
import { FakeParty, fakeFetch, syntheticPage } from "./fake.js";

const N = 20; // d = 5 with 12 unused domain points
const D = 5;

function world(options: PirClientOptions = {}) {
  const pages = Array.from({ length: N }, (_, i) => syntheticPage(i));
  const a = new FakeParty(pages, D);
  const b = new FakeParty(pages, D);
  const sleeps: number[] = [];
  const client = new PirClient("http://a/", "http://b", {
    fetch: fakeFetch(a, b),
    sleep: async (s) => { sleeps.push(s); },
    ...options,
  });
  return { pages, a, b, client, sleeps };
}

describe("page client against in-process parties", () => {
  it("reads pages in order, padding to whole queries, JSON by default", async () => {
    const { pages, a, client } = world();
    const got = await client.get([7, 0, 19, 7]);
    assert.deepEqual(got, [pages[7], pages[0], pages[19], pages[7]]);
    assert.equal(a.posts.length, 1);
    assert.equal(a.posts[0]!.path, "/query/page/gpu/batch"); // 4 pages: two queries
    assert.equal(a.posts[0]!.contentType, "application/json");
    const keys = (a.posts[0]!.body as { queries: { keys: string[] }[] }).queries.flatMap((q) => q.keys);
    assert.equal(keys.length, 6);
    assert.ok(keys.every((k) => /^0x[0-9a-f]+$/.test(k)));
  });

  it("sends one query to the single route, and msgpack when asked", async () => {
    const { pages, a, client } = world({ encoding: "msgpack" });
    assert.deepEqual(await client.getPage(3), pages[3]);
    assert.equal(a.posts[0]!.path, "/query/page/gpu");
    assert.equal(a.posts[0]!.contentType, "application/msgpack");
    assert.ok((a.posts[0]!.body as { keys: unknown[] }).keys[0] instanceof Uint8Array);
  });

  it("uses packed keys where both parties list them, v1 where one does not", async () => {
    const w = world();
    w.a.keyFormats = w.b.keyFormats = ["v1", "packed"];
    assert.deepEqual(await w.client.getPage(11), w.pages[11]);
    const key = (w.a.posts[0]!.body as { keys: string[] }).keys[0]!;
    assert.equal((key.length - 2) / 2, 36); // a packed key of d <= 7
    w.b.keyFormats = ["v1"];
    assert.deepEqual(await w.client.get([11], undefined), [w.pages[11]]);
    await w.client.readInfo(true);
    assert.deepEqual(await w.client.getPage(12), w.pages[12]);
    const v1 = (w.a.posts.at(-1)!.body as { keys: string[] }).keys[0]!;
    assert.equal((v1.length - 2) / 2, 35 + 18 * D);
  });

  it("splits large reads into requests of the servers' batch cap", async () => {
    const { pages, a, client } = world({ maxBatchQueries: 2 });
    const want = Array.from({ length: 14 }, (_, i) => (i * 3) % N);
    assert.deepEqual(await client.get(want), want.map((p) => pages[p]));
    assert.equal(a.posts.length, 3); // 6 + 6 + 2 pages
  });

  it("refuses pages past the end before sending anything", async () => {
    const { a, client } = world();
    await assert.rejects(client.get([N]), PageOutOfRange);
    await assert.rejects(client.get([-1]), PageOutOfRange);
    assert.equal(a.posts.length, 0);
  });

  it("retries 5xx, dropped connections and Retry-After, then answers", async () => {
    const { pages, a, b, client, sleeps } = world();
    await client.readInfo();
    a.faults.push({ status: 503, retryAfter: "1" }, { drop: true });
    b.faults.push({ status: 500 });
    assert.deepEqual(await client.getPage(5), pages[5]);
    assert.equal(sleeps.length, 2);
    assert.ok(sleeps[0]! >= 0.5 && sleeps[0]! <= 1, `Retry-After honoured: ${sleeps[0]}`);
  });

  it("gives up after the budget with PirUnavailable", async () => {
    const { a, client, sleeps } = world({ retry: new RetryPolicy(3) });
    await client.readInfo();
    a.faults.push(...Array.from({ length: 5 }, () => ({ status: 502 })));
    await assert.rejects(client.getPage(1), (e: unknown) => e instanceof PirUnavailable && e.status === 502);
    assert.equal(sleeps.length, 2);
  });

  it("raises a 4xx at once, with the server's code", async () => {
    const { a, client, sleeps } = world();
    await client.readInfo();
    a.faults.push({ status: 400, code: "bad_key_count" });
    await assert.rejects(client.getPage(1), (e: unknown) => e instanceof PirError && e.code === "bad_key_count" && e.status === 400);
    assert.equal(sleeps.length, 0);
  });

  it("retries answers from two epochs, then raises EpochMismatchError", async () => {
    const { pages, a, client } = world({ retry: new RetryPolicy(4) });
    a.answerEpoch = 2; // A answers from an epoch neither advertised
    a.answerIdentity = null;
    await assert.rejects(client.getPage(1), EpochMismatchError);
    a.answerEpoch = undefined;
    a.answerIdentity = undefined;
    assert.deepEqual(await client.getPage(1), pages[1]);
  });

  it("waits for a party behind on /epoch, not a whole backoff", async () => {
    for (const poll of [0.25, 0]) {
      const { pages, a, b, client, sleeps } = world({ retry: new RetryPolicy(4, 2.0, 2.0, poll) });
      await client.readInfo();
      const next = "0x" + "cd".repeat(16);
      a.epochId = 2; // an update reached A first
      a.identity = next;
      const doc = b.epochDoc.bind(b);
      b.epochDoc = () => { // B's lands while the client waits: at its third /epoch read
        if (b.epochReads >= 3) {
          b.epochId = 2;
          b.identity = next;
        }
        return doc();
      };
      if (poll === 0) { // backoffs slept whole: B's move is never seen
        await assert.rejects(client.getPage(5), EpochMismatchError);
        assert.ok(sleeps.every((s) => s >= 1 && s <= 2) && b.epochReads === 1);
        continue;
      }
      assert.deepEqual(await client.getWithEpoch([5]), [2, [pages[5]]]);
      assert.deepEqual(sleeps, [0.25, 0.25]);
      assert.equal(a.posts.length, 2); // one re-send, once both named epoch 2
    }
  });

  it("a pinned read waited for agreement still follows no move", async () => {
    const { pages, a, b, client } = world({ retry: new RetryPolicy(4, 2.0, 2.0, 0.25) });
    await client.readInfo(); // both at 1: the keys are planned for it
    const next = "0x" + "cd".repeat(16);
    a.epochId = 2; // then an update reaches A, and B while the client waits
    a.identity = next;
    const doc = b.epochDoc.bind(b);
    b.epochDoc = () => {
      if (b.epochReads >= 3) {
        b.epochId = 2;
        b.identity = next;
      }
      return doc();
    };
    await assert.rejects(client.getPinned([4], N), DataMoved);
    assert.deepEqual(await client.getWithEpoch([4]), [2, [pages[4]]]);
  });

  it("retries two identities under one epoch", async () => {
    const { a, client } = world({ retry: new RetryPolicy(3) });
    a.answerIdentity = "0x" + "cd".repeat(16);
    await assert.rejects(client.getPage(1), /different data under epoch 1/);
  });

  it("follows data both parties moved to, re-reading /epoch", async () => {
    const { pages, a, b, client } = world();
    await client.readInfo();
    for (const p of [a, b]) {
      p.epochId = 2;
      p.identity = "0x" + "ef".repeat(16);
    }
    const reads = a.epochReads;
    const [epoch, got] = await client.getWithEpoch([4]);
    assert.equal(epoch, 2);
    assert.deepEqual(got, [pages[4]]);
    assert.equal(a.epochReads, reads + 1);
    assert.equal(client.info!.epochId, 2);
  });

  it("pinned reads raise DataMoved instead of following", async () => {
    const { a, b, client } = world();
    await client.readInfo();
    for (const p of [a, b]) p.epochId = 2;
    await assert.rejects(client.getPinned([4]), DataMoved);
    await assert.rejects(client.getPinned([4], N + 1), DataMoved);
  });

  it("re-plans keys after a rotation changed the domain", async () => {
    const { a, b, client } = world();
    await client.readInfo();
    const bigger = Array.from({ length: 40 }, (_, i) => syntheticPage(i, 1));
    for (const p of [a, b]) {
      p.pages = bigger;
      p.domainBits = 6;
      p.epochId = 2;
    }
    // keys planned for d = 5 get bad_domain; the client re-reads /epoch and asks again
    assert.deepEqual(await client.getPage(3), bigger[3]);
    assert.deepEqual(await client.getPage(39), bigger[39]);
  });

  it("reads a named table's pages, numbered within it", async () => {
    const { pages, a, b, client } = world();
    for (const p of [a, b]) p.tables = { accounts: { first_page: 8, num_pages: 5, domain_bits: 3 } };
    assert.deepEqual(await client.get([0, 4], "accounts"), [pages[8], pages[12]]);
    await assert.rejects(client.get([5], "accounts"), PageOutOfRange);
    await assert.rejects(client.get([0], "storage"), UnknownTable);
    assert.equal((a.posts[0]!.body as { table: string }).table, "accounts");
  });
});

describe("GET /epoch documents", () => {
  const doc = (over: Record<string, unknown> = {}, pir: Record<string, unknown> = {}) => ({
    epoch_id: 3, page_pir: { num_pages: 640, domain_bits: 10, ...pir }, ...over,
  });

  it("reads a reference server's (no identity, no formats)", () => {
    const info = infoFromEpoch(doc(), doc());
    assert.deepEqual([info.numPages, info.domainBits, info.epochId, info.identity], [640, 10, 3, null]);
    assert.equal(info.keyFormat(), "v1");
  });

  it("refuses a domain too small for the pages (aliasing)", () => {
    assert.throws(() => infoFromEpoch(doc({}, { domain_bits: 9 }), doc({}, { domain_bits: 9 })), PirError);
  });

  it("waits out two shapes (a rotation reaching one party first)", () => {
    assert.throws(() => infoFromEpoch(doc(), doc({}, { num_pages: 600 })), /different matrices/);
  });

  it("takes the formats both list", () => {
    const info = infoFromEpoch(doc({}, { key_formats: ["v1", "packed"] }), doc({}, { key_formats: ["packed", "v1"] }));
    assert.equal(info.keyFormat(), "packed");
    assert.equal(info.keyFormat("v1"), "v1");
  });
});

describe("client settings", () => {
  it("refuses URLs without a scheme or host", () => {
    assert.throws(() => new PirClient("ftp://a/", "http://b"), /needs http/);
    assert.throws(() => new PirClient("127.0.0.1:8000", "http://b"), /server URL/);
    assert.throws(() => new PirClient("not a url", "http://b"), /not a URL/);
  });
});
