// The client against two real parties. tests/integration/test_js_client.py starts them (the
// synthetic snapshot of the Python integration tests), writes the pages they serve to a file
// and runs this file with:
//   MORPHOGEN_JS_SERVER_A, MORPHOGEN_JS_SERVER_B  the parties' base URLs
//   MORPHOGEN_JS_PAGES                            the served pages, 4096 bytes each, in order
// and, for the keyword client, with two parties serving a table of
// tests/vectors/keyword_tables.json:
//   MORPHOGEN_JS_KW_A, MORPHOGEN_JS_KW_B          their base URLs
//   MORPHOGEN_JS_KW_TABLE                         the table's name in that file
// Without them the tests here are skipped (a plain `npm test`).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";

import { fromHex, to0xHex, toHex } from "../src/bytes.js";
import { PAGE_SIZE, keyLength, packedKeyLength } from "../src/constants.js";
import { generateKeys } from "../src/dpf.js";
import { KeywordClient, KeywordIntegrityError, PageOutOfRange, PirClient, encodeRequest } from "../src/index.js";
import { ANSWER_FAILED } from "../src/keyword/verify.js";
import { readVectors } from "./vectors.js";

const A = process.env.MORPHOGEN_JS_SERVER_A;
const B = process.env.MORPHOGEN_JS_SERVER_B;
const PAGES = process.env.MORPHOGEN_JS_PAGES;
const skip = !A || !B || !PAGES ? "MORPHOGEN_JS_SERVER_A/B and MORPHOGEN_JS_PAGES not set" : false;

describe("page client against two real parties", { skip }, () => {
  const served = skip ? new Uint8Array() : readFileSync(PAGES!);
  const numPages = served.length / PAGE_SIZE;
  const page = (i: number) => new Uint8Array(served.buffer, served.byteOffset + i * PAGE_SIZE, PAGE_SIZE);
  const some = [0, 5, numPages - 1, 123, 321];

  it("reads /epoch: the served page count, a domain that holds it, an identity", async () => {
    const c = new PirClient(A!, B!);
    const info = await c.readInfo();
    assert.equal(info.numPages, numPages);
    assert.ok(2 ** info.domainBits >= numPages && 2 ** (info.domainBits - 1) < numPages);
    assert.equal(info.epochIds[0], info.epochIds[1]);
    assert.match(info.identity ?? "", /^0x[0-9a-f]{32}$/);
  });

  for (const encoding of ["json", "msgpack"] as const) {
    for (const keyFormat of ["v1", "auto"] as const) {
      it(`reads pages equal to the served ones (${encoding}, keys ${keyFormat})`, async () => {
        const c = new PirClient(A!, B!, { encoding, keyFormat });
        const got = await c.get(some);
        got.forEach((p, i) => assert.deepEqual(p, page(some[i]!), `page ${some[i]}`));
        const [epoch, one] = await c.getWithEpoch([7]);
        assert.equal(epoch, c.info!.epochId);
        assert.deepEqual(one[0], page(7));
      });
    }
  }

  it("sends keys of the format both parties list (packed where they take it)", async (t) => {
    const sent: number[] = [];
    const recording: typeof fetch = async (input, init) => {
      if (init?.method === "POST") {
        const body = JSON.parse(new TextDecoder().decode(init.body as Uint8Array));
        sent.push(...body.keys.map((k: string) => (k.length - 2) / 2));
      }
      return fetch(input, init);
    };
    const c = new PirClient(A!, B!, { fetch: recording });
    assert.deepEqual(await c.getPage(9), page(9));
    const info = c.info!;
    const want = info.keyFormat() === "packed" ? packedKeyLength(info.domainBits) : keyLength(info.domainBits);
    assert.deepEqual(sent, [want, want, want, want, want, want]);
    t.diagnostic(`key format ${info.keyFormat()} (parties take ${info.keyFormats.join(",")})`);
  });

  it("reads more pages than one request holds", async () => {
    const c = new PirClient(A!, B!, { encoding: "msgpack" });
    const want = Array.from({ length: 100 }, (_, i) => (i * 37) % numPages);
    const got = await c.get(want);
    got.forEach((p, i) => assert.deepEqual(p, page(want[i]!), `page ${want[i]}`));
  });

  it("refuses a page past the end without asking", async () => {
    await assert.rejects(new PirClient(A!, B!).get([numPages]), PageOutOfRange);
  });

  it("meets the servers' refusals with their codes (the client's error vocabulary)", async () => {
    const c = new PirClient(A!, B!);
    const { domainBits } = await c.readInfo();
    const keys = [0, 1].map((t) => generateKeys(domainBits, t)[0].bytes);
    const short = encodeRequest([keys], "json");
    const resp = await fetch(A! + short.path, { method: "POST", body: short.body, headers: short.headers });
    assert.equal(resp.status, 400);
    assert.equal((await resp.json()).error.code, "bad_key_count");
    const wrong = [0, 1, 2].map((t) => generateKeys(domainBits + 1, t)[0].bytes);
    const req = encodeRequest([wrong], "msgpack");
    const r2 = await fetch(A! + req.path, { method: "POST", body: req.body, headers: req.headers });
    assert.equal(r2.status, 400);
    assert.equal((await r2.json()).error.code, "bad_domain");
  });
});

const KW_A = process.env.MORPHOGEN_JS_KW_A;
const KW_B = process.env.MORPHOGEN_JS_KW_B;
const KW_TABLE = process.env.MORPHOGEN_JS_KW_TABLE;
const skipKw = !KW_A || !KW_B || !KW_TABLE ? "MORPHOGEN_JS_KW_A/B and MORPHOGEN_JS_KW_TABLE not set" : false;

/** A fetch that flips one bit of the first page of every answer from `victim` to a JSON
 * request naming party table `table` (every request when undefined). */
function lying(victim: string, table?: string): typeof fetch {
  return async (input, init) => {
    const resp = await fetch(input, init);
    if (init?.method !== "POST" || !String(input).startsWith(victim)) return resp;
    const asked = JSON.parse(new TextDecoder().decode(init.body as Uint8Array));
    if (table !== undefined && asked.table !== table) return resp;
    const doc = await resp.json();
    const group = doc.results ? doc.results[0].pages : doc.pages;
    const first = fromHex(group[0]);
    first[1234]! ^= 0x04;
    group[0] = to0xHex(first);
    return Response.json(doc, { status: resp.status });
  };
}

describe("keyword client against two real parties", { skip: skipKw }, () => {
  interface Lookup { key: string; value: string | null }
  const table = skipKw ? undefined
    : readVectors<Record<string, { public_key: string; lookups: Lookup[] }>>("keyword_tables.json")[KW_TABLE!]!;

  for (const [whole, encoding] of [[128, "json"], [1, "msgpack"]] as const) {
    it(`finds every value and no absent key (levels of up to ${whole} pages read whole, ${encoding})`, async () => {
      const kw = new KeywordClient(new PirClient(KW_A!, KW_B!, { encoding }), table!.public_key, { wholeLevelPages: whole });
      const got = await kw.getMany(table!.lookups.map((l) => fromHex(l.key)));
      assert.deepEqual(got.map((v) => (v === null ? null : toHex(v))), table!.lookups.map((l) => l.value));
      const desc = await kw.descriptor();
      assert.equal(desc.version, 1);
      assert.deepEqual(kw.lastView?.[0], (await kw.pir.readInfo()).epochId);
    });
  }

  it("refuses a lying party's answers with the one error, never a value", async () => {
    const key = fromHex(table!.lookups[0]!.key);
    for (const [victim, part] of [[KW_B!, "data"], [KW_A!, "tree1"]] as const) {
      const kw = new KeywordClient(new PirClient(KW_A!, KW_B!, { fetch: lying(victim, part) }),
        table!.public_key, { wholeLevelPages: 1 });
      await assert.rejects(kw.get(key), (e: Error) => e instanceof KeywordIntegrityError && e.message === ANSWER_FAILED, part);
    }
    const kw = new KeywordClient(new PirClient(KW_A!, KW_B!, { fetch: lying(KW_A!) }), table!.public_key);
    await assert.rejects(kw.get(key), /not signed by the trusted owner key/);
  });
});
