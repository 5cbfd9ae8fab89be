// Candidate buckets and slot tags of a key (morphogen/keyword/hashing.py, pages.py): bucket i
// is SipHash-1-3 with keys (0, 0) over seed i as 8 little-endian bytes and the key, modulo
// the bucket count (the reference's cuckoo addressing, Rust's DefaultHasher); a tag is 128
// bits of BLAKE3 over a domain, the table's dataset id and the key.

import { blake3 } from "@noble/hashes/blake3.js";

import { concatBytes } from "../bytes.js";

export const NUM_CANDIDATES = 3;
export const TAG_SIZE = 16;
const TAG_DOMAIN = new TextEncoder().encode("morphogen-keyword-tag-v1\0");
const MASK = (1n << 64n) - 1n;

function rotl(x: bigint, b: bigint): bigint {
  return ((x << b) | (x >> (64n - b))) & MASK;
}

function word(data: Uint8Array, at: number, n: number): bigint {
  let m = 0n;
  for (let j = n - 1; j >= 0; j--) m = (m << 8n) | BigInt(data[at + j]!);
  return m;
}

/** SipHash-1-3 of `data` with the all-zero key (one compression round, three final). */
export function siphash13(data: Uint8Array): bigint {
  let v0 = 0x736f6d6570736575n, v1 = 0x646f72616e646f6dn;
  let v2 = 0x6c7967656e657261n, v3 = 0x7465646279746573n;
  const round = () => {
    v0 = (v0 + v1) & MASK; v1 = rotl(v1, 13n) ^ v0; v0 = rotl(v0, 32n);
    v2 = (v2 + v3) & MASK; v3 = rotl(v3, 16n) ^ v2;
    v0 = (v0 + v3) & MASK; v3 = rotl(v3, 21n) ^ v0;
    v2 = (v2 + v1) & MASK; v1 = rotl(v1, 17n) ^ v2; v2 = rotl(v2, 32n);
  };
  const n = data.length;
  const end = n - (n % 8);
  for (let i = 0; i < end; i += 8) {
    const m = word(data, i, 8);
    v3 ^= m;
    round();
    v0 ^= m;
  }
  const last = (BigInt(n & 0xff) << 56n) | word(data, end, n - end);
  v3 ^= last;
  round();
  v0 ^= last;
  v2 ^= 0xffn;
  round();
  round();
  round();
  return v0 ^ v1 ^ v2 ^ v3;
}

/** The reference's per-candidate hash: the seed's 8 little-endian bytes, then the key. */
export function seededHash(key: Uint8Array, seed: bigint): bigint {
  if (seed < 0n || seed > MASK) throw new RangeError(`seed ${seed} is not a 64-bit unsigned integer`);
  const s = new Uint8Array(8);
  new DataView(s.buffer).setBigUint64(0, seed, true);
  return siphash13(concatBytes(s, key));
}

/** The three candidate buckets of `key` in a table of `numBuckets` buckets. */
export function candidates(key: Uint8Array, seeds: readonly bigint[], numBuckets: number): number[] {
  if (seeds.length !== NUM_CANDIDATES) throw new Error(`a cuckoo table has 3 seeds, not ${seeds.length}`);
  if (!(numBuckets >= 1)) throw new RangeError("numBuckets must be at least 1");
  return seeds.map((s) => Number(seededHash(key, s) % BigInt(numBuckets)));
}

/** The slot tag of `key` in the table of dataset id `dataset`. */
export function tagOf(dataset: Uint8Array, key: Uint8Array): Uint8Array {
  return blake3(concatBytes(TAG_DOMAIN, dataset, key), { dkLen: TAG_SIZE });
}
