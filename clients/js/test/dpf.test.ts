import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { fromHex, toHex, xorBytes } from "../src/bytes.js";
import { keyLength } from "../src/constants.js";
import { DomainError, DpfKey, KeyFormatError, generateKeys } from "../src/dpf.js";
import { expand } from "../src/prg.js";
import { readVectors } from "./vectors.js";

interface PrgCase { seed: string; left: string; right: string; t_left: number; t_right: number }
interface KeyCase {
  domain_bits: number;
  target: number;
  seeds: [string, string];
  keys: [string, string];
  evals: { page: number; masks: [string, string] }[];
}
const V = readVectors<{ prg: PrgCase[]; keys: KeyCase[] }>("dpf_keys.json");
const name = (v: KeyCase) => `d=${v.domain_bits} target=${v.target}`;

describe("ChaCha8 PRG (PROTOCOL.md 2)", () => {
  it("matches the published ChaCha8 block of the zero key", () => {
    const g = expand(new Uint8Array(16));
    assert.equal(toHex(g.left) + toHex(g.right),
      "3e00ef2f895f40d67f5bb8e81f09a5a12c840ec3ce9a7f3b181be188ef711a1e");
  });
  for (const v of V.prg) {
    it(`G(${v.seed.slice(0, 8)}...) as tests/vectors/dpf_keys.json`, () => {
      const g = expand(fromHex(v.seed));
      assert.deepEqual([toHex(g.left), toHex(g.right), g.tLeft, g.tRight],
        [v.left, v.right, v.t_left, v.t_right]);
    });
  }
});

describe("v1 keys: tests/vectors/dpf_keys.json", () => {
  assert.ok(V.keys.length >= 10);
  for (const v of V.keys) {
    it(`${name(v)}: the same key bytes from the same seeds`, () => {
      const seeds = [fromHex(v.seeds[0]), fromHex(v.seeds[1])] as const;
      const [k0, k1] = generateKeys(v.domain_bits, v.target, seeds);
      assert.equal(toHex(k0.toBytes()), v.keys[0]);
      assert.equal(toHex(k1.toBytes()), v.keys[1]);
      assert.equal(k0.toBytes().length, keyLength(v.domain_bits));
    });
    it(`${name(v)}: the same masks at ${v.evals.length} pages`, () => {
      const keys = v.keys.map((k) => DpfKey.fromBytes(fromHex(k)));
      for (const e of v.evals) {
        const masks = keys.map((k) => toHex(k.eval(e.page)));
        assert.deepEqual(masks, e.masks, `page ${e.page}`);
        const both = toHex(xorBytes(fromHex(masks[0]!), fromHex(masks[1]!)));
        assert.equal(both, (e.page === v.target ? "ff" : "00").repeat(16));
      }
    });
  }
});

describe("v1 keys: PROTOCOL.md 4's worked example", () => {
  const s0 = Uint8Array.from({ length: 16 }, (_, i) => i);
  const s1 = Uint8Array.from({ length: 16 }, (_, i) => 16 + i);
  const [k0, k1] = generateKeys(4, 5, [s0, s1]);

  it("evaluates as the spec says", () => {
    assert.equal(toHex(k0.eval(5)), "658364a5dce3e5bdf0d5a3a240ee77df");
    assert.equal(toHex(k1.eval(5)), "9a7c9b5a231c1a420f2a5c5dbf118820");
    assert.equal(toHex(k0.eval(0)), "cf3976379ffbd09cf20a50436a562c32");
    assert.equal(toHex(k1.eval(0)), "cf3976379ffbd09cf20a50436a562c32");
  });

  it("scans 16 pages into the spec's answer", () => {
    const page = (i: number) => Uint8Array.from({ length: 4096 }, (_, j) => (31 * i + j) & 0xff);
    const answer = (k: DpfKey) => {
      const acc = new Uint8Array(4096);
      for (let i = 0; i < 16; i++) {
        const m = k.eval(i), p = page(i);
        for (let j = 0; j < 4096; j++) acc[j]! ^= p[j]! & m[j % 16]!;
      }
      return acc;
    };
    const a = answer(k0);
    assert.equal(toHex(a.subarray(0, 32)),
      "f0ba319f19a530567f651face14a6f6020ca317f09a5f0361ff50f5ce10a7f60");
    assert.deepEqual(xorBytes(a, answer(k1)), page(5));
  });
});

describe("v1 keys: generation and parsing", () => {
  it("is a point function over whole small domains, with random roots", () => {
    for (const d of [1, 2, 3, 5]) {
      for (let target = 0; target < 2 ** d; target++) {
        const [k0, k1] = generateKeys(d, target);
        for (let p = 0; p < 2 ** d; p++) {
          const both = toHex(xorBytes(k0.eval(p), k1.eval(p)));
          assert.equal(both, (p === target ? "ff" : "00").repeat(16));
        }
      }
    }
  });

  it("draws fresh roots each time", () => {
    const a = generateKeys(10, 3)[0].toBytes(), b = generateKeys(10, 3)[0].toBytes();
    assert.notEqual(toHex(a), toHex(b));
  });

  it("refuses targets and domains out of range", () => {
    assert.throws(() => generateKeys(0, 0), DomainError);
    assert.throws(() => generateKeys(33, 0), DomainError);
    assert.throws(() => generateKeys(4, 16), DomainError);
    assert.throws(() => generateKeys(4, -1), DomainError);
    assert.throws(() => generateKeys(4, 1.5), DomainError);
    assert.throws(() => generateKeys(4, 5)[0].eval(16), DomainError);
  });

  it("parses strictly", () => {
    const good = generateKeys(6, 9)[1].toBytes();
    assert.equal(DpfKey.fromBytes(good).party, 1);
    const bad = (edit: (b: Uint8Array) => void) => {
      const b = Uint8Array.from(good);
      edit(b);
      return () => DpfKey.fromBytes(b);
    };
    assert.throws(() => DpfKey.fromBytes(good.subarray(0, 10)), KeyFormatError);
    assert.throws(() => DpfKey.fromBytes(good.subarray(0, good.length - 1)), KeyFormatError);
    assert.throws(bad((b) => { b[18] = 0; }), KeyFormatError);
    assert.throws(bad((b) => { b[16] = 0; }), /does not match the party/);
    assert.throws(bad((b) => { b[17] = 2; }), /party byte/);
    assert.throws(bad((b) => { b[19 + 18 * 2 + 17] = 7; }), /level 2/);
  });

  it("never prints key bytes", () => {
    const k = generateKeys(8, 1)[0];
    assert.equal(String(k), "DpfKey(party=0, domainBits=8)");
    assert.equal(JSON.stringify({ k }), '{"k":"DpfKey(party=0, domainBits=8)"}');
  });
});
