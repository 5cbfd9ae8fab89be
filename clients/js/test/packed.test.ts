import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { fromHex, toHex } from "../src/bytes.js";
import { packedKeyLength } from "../src/constants.js";
import { KeyFormatError } from "../src/dpf.js";
import { PackedKey, generatePackedKeys } from "../src/packed.js";
import { readVectors } from "./vectors.js";

interface PackedCase {
  domain_bits: number;
  target: number;
  seeds: [string, string];
  keys: [string, string];
  leaves: [string[], string[]];
}
const V = readVectors<PackedCase[]>("packed_keys.json");

describe("packed keys: tests/vectors/packed_keys.json", () => {
  assert.ok(V.length >= 9);
  for (const v of V) {
    const label = `d=${v.domain_bits} target=${v.target}`;
    it(`${label}: the same key bytes from the same seeds`, () => {
      const [k0, k1] = generatePackedKeys(v.domain_bits, v.target,
        [fromHex(v.seeds[0]), fromHex(v.seeds[1])]);
      assert.deepEqual([toHex(k0.toBytes()), toHex(k1.toBytes())], v.keys);
      assert.equal(k0.toBytes().length, packedKeyLength(v.domain_bits));
    });
    it(`${label}: the same leaves, differing only in the target's bit`, () => {
      const keys = v.keys.map((k) => PackedKey.fromBytes(fromHex(k)));
      keys.forEach((k, b) => {
        assert.deepEqual(v.leaves[b]!.map((_, j) => toHex(k.leaf(j))), v.leaves[b]);
      });
      for (const p of new Set([0, v.target, 2 ** v.domain_bits - 1, v.target ^ 1])) {
        if (p >= 2 ** v.domain_bits) continue;
        assert.equal(keys[0]!.eval(p) ^ keys[1]!.eval(p), p === v.target ? 1 : 0, `page ${p}`);
      }
    });
  }
});

describe("packed keys: generation and parsing", () => {
  it("selects exactly the target over whole domains", () => {
    for (const [d, targets] of [[3, [0, 7]], [8, [0, 127, 128, 255]], [10, [639]]] as const) {
      for (const x of targets) {
        const [k0, k1] = generatePackedKeys(d, x);
        for (let p = 0; p < 2 ** d; p++) assert.equal(k0.eval(p) ^ k1.eval(p), p === x ? 1 : 0);
      }
    }
  });

  it("parses strictly (tag, length, flags)", () => {
    const good = generatePackedKeys(12, 100)[0].toBytes();
    assert.equal(PackedKey.fromBytes(good).levels, 5);
    const b = Uint8Array.from(good);
    b[19] = 1;
    assert.throws(() => PackedKey.fromBytes(b), /format tag/);
    assert.throws(() => PackedKey.fromBytes(good.subarray(0, good.length - 18)), KeyFormatError);
  });
});
