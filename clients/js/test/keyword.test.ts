import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { fromHex, toHex } from "../src/bytes.js";
import { PAGE_SIZE } from "../src/constants.js";
import {
  Geometry,
  KeywordClient,
  KeywordIntegrityError,
  PirClient,
  StaleTableError,
  candidates,
  check,
  descriptorOf,
  plan,
  privateLevels,
  proveWhole,
  requestSizes,
  stale,
  seededHash,
  tagOf,
  wholePagesWanted,
  type Descriptor,
} from "../src/index.js";
import { ANSWER_FAILED } from "../src/keyword/verify.js";
import { DESCRIPTOR_TABLE, partTable } from "../src/keyword/table.js";
import { FakeParty, domainBitsFor, fakeFetch } from "./fake.js";
import { readVectors } from "./vectors.js";

interface Lookup { key: string; candidates: number[]; tag: string; value: string | null }
interface Table {
  public_key: string;
  num_pages: number;
  pages: Record<string, string>;
  descriptor: Record<string, unknown>;
  lookups: Lookup[];
}
const TABLES = readVectors<Record<string, Table>>("keyword_tables.json");
const CUCKOO = readVectors<{ key: string; seed: number; hash: string; mod: Record<string, number> }[]>("cuckoo_vectors.json");

function pagesOf(t: Table): Uint8Array[] {
  const pages = Array.from({ length: t.num_pages }, () => new Uint8Array(PAGE_SIZE));
  for (const [i, h] of Object.entries(t.pages)) pages[Number(i)]!.set(fromHex(h));
  return pages;
}

function descOf(t: Table, pages = pagesOf(t)): Descriptor {
  return descriptorOf(pages.at(-1)!, fromHex(t.public_key), t.num_pages);
}

/** A lookup straight from the pages (no servers), as tests/unit/_kw.py does. */
function lookup(pages: Uint8Array[], desc: Descriptor, keys: Uint8Array[], whole: number) {
  const g = desc.geometry;
  const priv = privateLevels(desc, whole);
  const levels = new Map<number, Uint8Array[]>();
  for (const [k, n] of wholePagesWanted(desc, priv)) {
    levels.set(k, pages.slice(g.levelFirst(k), g.levelFirst(k) + n));
  }
  const proof = proveWhole(desc, priv, levels);
  const [wanted, buckets] = plan(proof, keys);
  const firsts = [0, ...Array.from({ length: priv }, (_, i) => g.levelFirst(i + 1))];
  const answers = wanted.map((w, l) => w.map((p) => pages[firsts[l]! + p]!));
  return { values: check(proof, keys, buckets, answers), wanted };
}

describe("cuckoo addressing: tests/vectors/cuckoo_vectors.json (Rust's own hasher)", () => {
  it(`hashes and reduces ${CUCKOO.length} keys as the reference`, () => {
    for (const v of CUCKOO) {
      const h = seededHash(fromHex(v.key), BigInt(v.seed));
      assert.equal(h.toString(16).padStart(16, "0"), v.hash);
      for (const [n, want] of Object.entries(v.mod)) assert.equal(Number(h % BigInt(n)), want);
    }
  });
});

describe("keyword tables: tests/vectors/keyword_tables.json", () => {
  for (const [name, t] of Object.entries(TABLES)) {
    it(`${name}: the signed descriptor reads as the owner wrote it`, () => {
      const d = descOf(t);
      const want = t.descriptor;
      assert.deepEqual([d.version, d.records, d.root, d.time, d.name, toHex(d.dataset)],
        [want.version, want.records, want.root, want.time, want.table ?? "", want.dataset]);
      assert.deepEqual(d.geometry.levels, want.levels);
      assert.deepEqual(d.seeds.map(String), want.seeds);
      assert.equal(d.anchor?.number ?? null, (want.anchor as { number: number } | null)?.number ?? null);
    });

    it(`${name}: candidates and tags of ${t.lookups.length} keys`, () => {
      const d = descOf(t);
      for (const l of t.lookups) {
        assert.deepEqual(candidates(fromHex(l.key), d.seeds, d.geometry.numBuckets), l.candidates);
        assert.equal(toHex(tagOf(d.dataset, fromHex(l.key))), l.tag);
      }
    });

    for (const whole of [128, 1]) {
      it(`${name}: lookups prove and find the same values (levels of up to ${whole} pages read whole)`, () => {
        const pages = pagesOf(t), d = descOf(t, pages);
        const keys = t.lookups.map((l) => fromHex(l.key));
        const got = lookup(pages, d, keys, whole).values.map((v) => (v === null ? null : toHex(v)));
        assert.deepEqual(got, t.lookups.map((l) => l.value));
      });
    }

    it(`${name}: a flipped bit anywhere on a path fails every lookup with the one error`, () => {
      const d = descOf(t);
      const keys = t.lookups.map((l) => fromHex(l.key));
      const { wanted } = lookup(pagesOf(t), d, keys, 1);
      const g = d.geometry;
      const targets = [g.bucketPage(t.lookups[0]!.candidates[0]!), t.num_pages - 2];
      if (wanted.length > 1) targets.push(g.levelFirst(1) + wanted[1]![0]!);
      for (const at of targets) {
        const pages = pagesOf(t);
        pages[at]![4095 - at % 7]! ^= 0x80;
        assert.throws(() => lookup(pages, d, keys, 1), (e: Error) => e instanceof KeywordIntegrityError && e.message === ANSWER_FAILED, `page ${at}`);
      }
    });

    it(`${name}: the descriptor is refused when tampered or under another key`, () => {
      const pages = pagesOf(t);
      const page = pages.at(-1)!;
      const other = Uint8Array.from(fromHex(t.public_key));
      other[0]! ^= 1;
      assert.throws(() => descriptorOf(page, other, t.num_pages), KeywordIntegrityError);
      assert.throws(() => descriptorOf(page, fromHex(t.public_key), t.num_pages + 1), /describes/);
      for (const at of [20, 3000, 4090]) {
        const bad = Uint8Array.from(page);
        bad[at]! ^= 1;
        assert.throws(() => descriptorOf(bad, fromHex(t.public_key), t.num_pages), /not signed/);
      }
    });
  }
});

describe("request sizes", () => {
  it("pads to buckets a server cannot tell apart", () => {
    assert.deepEqual(requestSizes(70, 32), [32, 32, 8]);
    assert.deepEqual(requestSizes(1, 32), [1]);
    assert.deepEqual(requestSizes(3, 32), [4]);
    assert.deepEqual(requestSizes(17, 32), [32]);
    assert.deepEqual(requestSizes(5, 3), [3, 2]);
    assert.deepEqual(requestSizes(0, 32), []);
  });
});

/** The party tables of a keyword table's parts, as a snapshot of it names them. */
function partTables(d: Descriptor): FakeParty["tables"] {
  const g: Geometry = d.geometry;
  const parts: [string, number, number][] = [["data", 0, g.dataPages]];
  g.levels.forEach((n, i) => parts.push([`tree${i + 1}`, g.levelFirst(i + 1), n]));
  parts.push([DESCRIPTOR_TABLE, g.numPages - 1, 1]);
  return Object.fromEntries(parts.map(([part, first, n]) => [partTable(d.name, part),
    { first_page: first, num_pages: n, domain_bits: domainBitsFor(n) }]));
}

/** Two in-process parties serving a vector table, with its parts as party tables or not. */
function served(name: string, tables: boolean) {
  const t = TABLES[name]!;
  const pages = pagesOf(t);
  const d = descOf(t, pages);
  const a = new FakeParty(pages, domainBitsFor(pages.length));
  const b = new FakeParty(pages, domainBitsFor(pages.length));
  if (tables) for (const p of [a, b]) p.tables = partTables(d);
  const pir = new PirClient("http://a", "http://b", { fetch: fakeFetch(a, b), sleep: async () => {} });
  return { t, a, b, pir, desc: d };
}

describe("keyword client through the page client and two in-process parties", () => {
  for (const [name, tables] of [["small", true], ["row", true], ["deep", true], ["small", false]] as const) {
    it(`${name}, ${tables ? "parts as party tables" : "one matrix"}: every value, and null for absent keys`, async () => {
      const { t, pir, desc } = served(name, tables);
      const kw = new KeywordClient(pir, t.public_key, { table: desc.name, wholeLevelPages: name === "deep" ? 1 : 128 });
      const got = await kw.getMany(t.lookups.map((l) => fromHex(l.key)));
      assert.deepEqual(got.map((v) => (v === null ? null : toHex(v))), t.lookups.map((l) => l.value));
      assert.equal(kw.seenVersion, 1);
      const [one, signed] = await kw.readAt([fromHex(t.lookups[0]!.key)]);
      assert.equal(toHex(one[0]!), t.lookups[0]!.value);
      assert.equal(signed.root, t.descriptor.root);
    });
  }

  it("pads a batch to a power of two of lookups, and reads private levels with the data", async () => {
    const { t, a, pir } = served("deep", true);
    const kw = new KeywordClient(pir, t.public_key, { wholeLevelPages: 1 });
    await kw.get(fromHex(t.lookups[0]!.key));
    a.posts.length = 0;
    await kw.getMany(t.lookups.slice(0, 3).map((l) => fromHex(l.key)));
    const tables = a.posts.map((p) => (p.body as { table: string }).table).sort();
    assert.deepEqual(tables, ["data", "tree1"]);
    for (const p of a.posts) {
      assert.equal((p.body as { queries: unknown[] }).queries.length, 4); // 3 keys padded to 4 lookups
    }
  });

  it("refuses a lying party's answers with the one error", async () => {
    const { t, b, pir } = served("small", true);
    const kw = new KeywordClient(pir, t.public_key);
    await kw.get(fromHex(t.lookups[0]!.key));
    b.lie = true;
    await assert.rejects(kw.get(fromHex(t.lookups[1]!.key)), (e: Error) => e instanceof KeywordIntegrityError && e.message === ANSWER_FAILED);
  });

  it("refuses the descriptor under another owner key", async () => {
    const { t, pir } = served("small", true);
    const key = fromHex(t.public_key);
    key[5]! ^= 1;
    await assert.rejects(new KeywordClient(pir, key).get(new Uint8Array(4)), /not signed by the trusted owner key/);
  });

  it("refuses versions below the caller's bounds", async () => {
    const { t, pir } = served("row", true);
    const fresh = { table: "accounts" };
    await assert.rejects(new KeywordClient(pir, t.public_key, { ...fresh, minVersion: 2 }).get(new Uint8Array(4)), StaleTableError);
    await assert.rejects(new KeywordClient(pir, t.public_key, { ...fresh, trustedBlock: async () => 21_000_001 }).get(new Uint8Array(4)), /block 21000000/);
    // the vector's version is made at a fixed time: its age is judged at fixed clocks
    const d = descOf(t);
    const bounds = { version: 0, block: 0, maxAge: 60 };
    assert.equal(stale(d, bounds, 0, 0, d.time + 60), null);
    assert.match(stale(d, bounds, 0, 0, d.time + 61) ?? "", /made 61 s ago/);
    assert.match(stale(d, { ...bounds, maxAge: null }, 2, 0) ?? "", /already read version 2/);
    assert.match(stale(d, { ...bounds, maxAge: null }, 1, 21_000_001) ?? "", /already read block 21000001/);
    assert.equal(await new KeywordClient(pir, t.public_key, { ...fresh, minBlock: 21_000_000 }).get(new Uint8Array(4)), null);
  });

  it("reads the descriptor again after the parties moved to other data", async () => {
    const { t, a, b, pir } = served("small", true);
    const kw = new KeywordClient(pir, t.public_key);
    await kw.get(fromHex(t.lookups[0]!.key));
    for (const p of [a, b]) {
      p.epochId = 2;
      p.identity = "0x" + "77".repeat(16);
    }
    const got = await kw.get(fromHex(t.lookups[1]!.key));
    assert.equal(toHex(got!), t.lookups[1]!.value);
    assert.deepEqual(kw.lastView, [2, "0x" + "77".repeat(16)]);
  });

  // "small" and "deep" are two builds the one vector key signed, each with its own dataset id
  const refused = (got: Uint8Array, how: string, want: Uint8Array) => (e: Error) =>
    e instanceof KeywordIntegrityError && e.message === `the servers serve keyword table "" of dataset `
      + `${toHex(got)}; this client ${how} dataset ${toHex(want)}: another table signed with the same key, refused`;

  it("refuses another table signed with the same key once it has read one, never its values", async () => {
    const { t, a, b, pir, desc } = served("small", true);
    const other = TABLES.deep!, otherDesc = descOf(other);
    assert.equal(other.public_key, t.public_key);
    const kw = new KeywordClient(pir, t.public_key);
    assert.equal(toHex((await kw.get(fromHex(t.lookups[0]!.key)))!), t.lookups[0]!.value);
    for (const p of [a, b]) {
      p.pages = pagesOf(other);
      p.domainBits = domainBitsFor(other.num_pages);
      p.tables = partTables(otherDesc);
      p.epochId += 1;
    }
    const key = fromHex(other.lookups[0]!.key); // a key "deep" holds
    for (let i = 0; i < 2; i++) {
      await assert.rejects(kw.get(key), refused(otherDesc.dataset, "has read", desc.dataset));
    }
    assert.equal(kw.seenVersion, 1);
    // a client of its own reads it: the refusal is of a change of table, not of the table
    assert.equal(toHex((await new KeywordClient(pir, t.public_key).get(key))!), other.lookups[0]!.value);
  });

  it("holds to the dataset id it is given (bytes or hex), and refuses a malformed one", async () => {
    const { t, pir, desc } = served("small", true);
    const key = fromHex(t.lookups[0]!.key);
    const deep = descOf(TABLES.deep!).dataset;
    for (const dataset of [deep, "0x" + toHex(deep)]) {
      await assert.rejects(new KeywordClient(pir, t.public_key, { dataset }).get(key), refused(desc.dataset, "was given", deep));
    }
    for (const dataset of [desc.dataset, toHex(desc.dataset), "0X" + toHex(desc.dataset).toUpperCase()]) {
      assert.equal(toHex((await new KeywordClient(pir, t.public_key, { dataset }).get(key))!), t.lookups[0]!.value);
    }
    for (const dataset of [desc.dataset.subarray(1), toHex(desc.dataset) + "00", "zz".repeat(16), "", 7 as unknown as string]) {
      assert.throws(() => new KeywordClient(pir, t.public_key, { dataset }), (e: Error) => e instanceof RangeError && /16 bytes/.test(e.message));
    }
  });
});
