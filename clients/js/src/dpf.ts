// Two-party distributed point function (BGI tree) with the key bytes of PROTOCOL.md sections
// 3-4 (the reference's "v1" format), byte for byte what morphogen/protocol/dpf.py makes from
// the same root seeds.

import { equalBytes, randomBytes, xorBytes } from "./bytes.js";
import {
  KEY_HEADER_BYTES,
  KEY_LEVEL_BYTES,
  MASK_BYTES,
  MAX_DOMAIN_BITS,
  MIN_DOMAIN_BITS,
  SEED_BYTES,
  keyLength,
} from "./constants.js";
import { expand } from "./prg.js";

/** Key bytes that are not a well-formed key. */
export class KeyFormatError extends Error {
  override name = "KeyFormatError";
}

/** A target, page or domain outside what the caller or the servers allow. */
export class DomainError extends RangeError {
  override name = "DomainError";
}

export type RootSeeds = readonly [Uint8Array, Uint8Array];

const ALL_ONES = new Uint8Array(MASK_BYTES).fill(0xff);

export function checkDomainBits(domainBits: number): void {
  if (!Number.isInteger(domainBits) || domainBits < MIN_DOMAIN_BITS || domainBits > MAX_DOMAIN_BITS) {
    throw new DomainError(`domain bits must be in ${MIN_DOMAIN_BITS}..${MAX_DOMAIN_BITS}, got ${domainBits}`);
  }
}

export function checkPage(page: number, domainBits: number): void {
  if (!Number.isInteger(page) || page < 0 || page >= 2 ** domainBits) {
    throw new DomainError(`page ${page} is outside the domain of 2^${domainBits} pages`);
  }
}

/** Bit i (0 = most significant) of a `levels`-bit path; `x` may exceed 2^31, so no shifts. */
function pathBit(x: number, levels: number, i: number): number {
  return Math.floor(x / 2 ** (levels - 1 - i)) % 2;
}

/** The tree both formats share: levels' bytes (cw, tcw_left, tcw_right each) and the two
 * parties' last seeds, from which each format makes its own final correction word. */
export interface Tree {
  levels: Uint8Array;
  last: [Uint8Array, Uint8Array];
}

/** PROTOCOL.md section 3's levels towards `x` over a tree of `levels` levels. */
export function buildTree(levels: number, x: number, roots: RootSeeds): Tree {
  const s: [Uint8Array, Uint8Array] = [roots[0], roots[1]];
  const t = [0, 1];
  const out = new Uint8Array(KEY_LEVEL_BYTES * levels);
  for (let i = 0; i < levels; i++) {
    const a = pathBit(x, levels, i);
    const e = [expand(s[0]), expand(s[1])] as const;
    const keep = (b: 0 | 1) => (a ? e[b].right : e[b].left);
    const lose = (b: 0 | 1) => (a ? e[b].left : e[b].right);
    const tKeep = (b: 0 | 1) => (a ? e[b].tRight : e[b].tLeft);
    const tLose = (b: 0 | 1) => (a ? e[b].tLeft : e[b].tRight);
    const cw = xorBytes(lose(0), lose(1));
    const tcwKeep = tKeep(0) ^ tKeep(1) ^ t[0]! ^ t[1]!;
    const tcwLose = tLose(0) ^ tLose(1) ^ t[0]! ^ t[1]! ^ 1;
    out.set(cw, KEY_LEVEL_BYTES * i);
    out[KEY_LEVEL_BYTES * i + 16] = a ? tcwLose : tcwKeep;
    out[KEY_LEVEL_BYTES * i + 17] = a ? tcwKeep : tcwLose;
    for (const b of [0, 1] as const) {
      const kept = keep(b);
      s[b] = t[b] ? xorBytes(kept, cw) : kept;
      t[b] = tKeep(b) ^ (t[b] ? tcwKeep : 0);
    }
  }
  return { levels: out, last: s };
}

/** Walks `levels` levels of a key's tree along `path`: the seed at the end, corrected by the
 * final word where the control bit says. `levelsAt` is the offset of level 0 in `key`. */
export function walk(key: Uint8Array, levelsAt: number, levels: number, path: number): Uint8Array {
  let s = key.subarray(0, SEED_BYTES);
  let t = key[16]!;
  for (let i = 0; i < levels; i++) {
    const lv = levelsAt + KEY_LEVEL_BYTES * i;
    const g = expand(s);
    const a = pathBit(path, levels, i);
    let s2 = a ? g.right : g.left;
    let t2 = a ? g.tRight : g.tLeft;
    if (t) {
      s2 = xorBytes(s2, key.subarray(lv, lv + 16));
      t2 ^= key[lv + (a ? 17 : 16)]!;
    }
    s = s2;
    t = t2;
  }
  const finalAt = levelsAt + KEY_LEVEL_BYTES * levels;
  return t ? xorBytes(s, key.subarray(finalAt, finalAt + MASK_BYTES)) : Uint8Array.from(s);
}

export function checkRoots(seeds: RootSeeds | undefined): RootSeeds {
  const roots = seeds ?? [randomBytes(SEED_BYTES), randomBytes(SEED_BYTES)];
  if (roots.length !== 2 || roots.some((r) => r.length !== SEED_BYTES)) {
    throw new Error("two 16-byte root seeds are needed");
  }
  return roots;
}

/** One party's v1 key: its bytes, parsed and checked. Keys are secrets: nothing here prints them. */
export class DpfKey {
  readonly bytes: Uint8Array;

  private constructor(bytes: Uint8Array) {
    this.bytes = bytes;
  }

  get party(): number {
    return this.bytes[17]!;
  }

  get domainBits(): number {
    return this.bytes[18]!;
  }

  /** Parse and fully validate key bytes (PROTOCOL.md section 4's rules); KeyFormatError. */
  static fromBytes(data: Uint8Array): DpfKey {
    if (data.length < KEY_HEADER_BYTES) throw new KeyFormatError(`key too short: ${data.length} bytes`);
    const d = data[18]!;
    if (d < MIN_DOMAIN_BITS || d > MAX_DOMAIN_BITS) {
      throw new KeyFormatError(`key domain bits must be in 1..32, got ${d}`);
    }
    if (data.length !== keyLength(d)) {
      throw new KeyFormatError(`a key of domain bits ${d} is ${keyLength(d)} bytes, got ${data.length}`);
    }
    checkFlags(data, KEY_HEADER_BYTES, d);
    return new DpfKey(Uint8Array.from(data));
  }

  toBytes(): Uint8Array {
    return Uint8Array.from(this.bytes);
  }

  /** This party's 16-byte mask at `page` (a d-level path walk). */
  eval(page: number): Uint8Array {
    checkPage(page, this.domainBits);
    return walk(this.bytes, KEY_HEADER_BYTES, this.domainBits, page);
  }

  toString(): string {
    return `DpfKey(party=${this.party}, domainBits=${this.domainBits})`;
  }

  toJSON(): string {
    return this.toString();
  }
}

/** The flag rules both formats share: root_t and party bits and equal, every tcw a bit. */
export function checkFlags(data: Uint8Array, levelsAt: number, levels: number): void {
  const rootT = data[16]!, party = data[17]!;
  if (party > 1) throw new KeyFormatError(`party byte must be 0 or 1, got ${party}`);
  if (rootT > 1) throw new KeyFormatError(`root control bit must be 0 or 1, got ${rootT}`);
  if (rootT !== party) throw new KeyFormatError("root control bit does not match the party");
  for (let i = 0; i < levels; i++) {
    const at = levelsAt + KEY_LEVEL_BYTES * i + 16;
    if (data[at]! > 1 || data[at + 1]! > 1) {
      throw new KeyFormatError(`control-bit correction at level ${i} is not 0 or 1`);
    }
  }
}

function header(root: Uint8Array, party: number, d: number, extra: number[] = []): Uint8Array {
  const out = new Uint8Array(SEED_BYTES + 3 + extra.length);
  out.set(root);
  out.set([party, party, d, ...extra], SEED_BYTES);
  return out;
}

/** Keys [for server A, for server B] whose masks XOR to ff*16 at `target` and to zero
 * elsewhere. `seeds` fixes the two root seeds (known-answer tests); normal use draws them
 * from the platform's CSPRNG. */
export function generateKeys(domainBits: number, target: number, seeds?: RootSeeds): [DpfKey, DpfKey] {
  checkDomainBits(domainBits);
  checkPage(target, domainBits);
  const roots = checkRoots(seeds);
  const tree = buildTree(domainBits, target, roots);
  const finalCw = xorBytes(xorBytes(tree.last[0], tree.last[1]), ALL_ONES);
  const make = (b: 0 | 1) => {
    const out = new Uint8Array(keyLength(domainBits));
    out.set(header(roots[b], b, domainBits));
    out.set(tree.levels, KEY_HEADER_BYTES);
    out.set(finalCw, KEY_HEADER_BYTES + tree.levels.length);
    return DpfKey.fromBytes(out);
  };
  return [make(0), make(1)];
}

/** Masks of a key pair at `page` XOR to ff*16 exactly at the target: a self-check for tests. */
export function isTargetOf(k0: DpfKey, k1: DpfKey, page: number): boolean {
  return equalBytes(xorBytes(k0.eval(page), k1.eval(page)), ALL_ONES);
}

export { header as keyHeader };
