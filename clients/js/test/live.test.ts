// The client against two real parties. tests/integration/test_js_client.py starts them (the
// synthetic snapshot of the Python integration tests), writes the pages they serve to a file
// and runs this file with:
//   MORPHOGEN_JS_SERVER_A, MORPHOGEN_JS_SERVER_B  the parties' base URLs
//   MORPHOGEN_JS_PAGES                            the served pages, 4096 bytes each, in order
// Without them every test here is skipped (a plain `npm test`).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";

import { PAGE_SIZE, keyLength, packedKeyLength } from "../src/constants.js";
import { generateKeys } from "../src/dpf.js";
import { PageOutOfRange, PirClient, encodeRequest } from "../src/index.js";

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
