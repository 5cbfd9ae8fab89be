// The packed key format (docs/packed-keys.md): the tree stops 7 levels early and each 128-bit
// leaf holds the selection bits of 128 pages; the same ChaCha8 tree as v1, another final word.

import { xorBytes } from "./bytes.js";
import {
  KEY_LEVEL_BYTES,
  MASK_BYTES,
  MAX_DOMAIN_BITS,
  MIN_DOMAIN_BITS,
  PACKED_HEADER_BYTES,
  PACKED_LEAF_BITS,
  PACKED_LEAF_PAGES,
  PACKED_TAG,
  packedKeyLength,
  packedLevels,
} from "./constants.js";
import {
  type RootSeeds,
  DomainError,
  KeyFormatError,
  buildTree,
  checkDomainBits,
  checkFlags,
  checkPage,
  checkRoots,
  keyHeader,
  walk,
} from "./dpf.js";

/** 16 bytes with only bit `bit` set, bits LSB first within little-endian bytes. */
function unit(bit: number): Uint8Array {
  const out = new Uint8Array(MASK_BYTES);
  out[bit >>> 3] = 1 << (bit & 7);
  return out;
}

/** One party's packed key, parsed and checked. */
export class PackedKey {
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

  get levels(): number {
    return packedLevels(this.domainBits);
  }

  static fromBytes(data: Uint8Array): PackedKey {
    if (data.length < PACKED_HEADER_BYTES) throw new KeyFormatError(`key too short: ${data.length} bytes`);
    const d = data[18]!;
    if (d < MIN_DOMAIN_BITS || d > MAX_DOMAIN_BITS) {
      throw new KeyFormatError(`key domain bits must be in 1..32, got ${d}`);
    }
    if (data.length !== packedKeyLength(d)) {
      throw new KeyFormatError(`a packed key of domain bits ${d} is ${packedKeyLength(d)} bytes, got ${data.length}`);
    }
    if (data[19] !== PACKED_TAG) throw new KeyFormatError(`format tag must be ${PACKED_TAG}, got ${data[19]}`);
    checkFlags(data, PACKED_HEADER_BYTES, packedLevels(d));
    return new PackedKey(Uint8Array.from(data));
  }

  toBytes(): Uint8Array {
    return Uint8Array.from(this.bytes);
  }

  /** Leaf `index` (the selection bits of pages 128 index .. 128 index + 127). */
  leaf(index: number): Uint8Array {
    const n = this.levels;
    if (!Number.isInteger(index) || index < 0 || index >= 2 ** n) {
      throw new DomainError(`leaf ${index} is outside 0..${2 ** n - 1}`);
    }
    return walk(this.bytes, PACKED_HEADER_BYTES, n, index);
  }

  /** The selection bit of `page`. */
  eval(page: number): number {
    checkPage(page, this.domainBits);
    const leaf = this.leaf(Math.floor(page / PACKED_LEAF_PAGES));
    const bit = page % PACKED_LEAF_PAGES;
    return (leaf[bit >>> 3]! >> (bit & 7)) & 1;
  }

  toString(): string {
    return `PackedKey(party=${this.party}, domainBits=${this.domainBits})`;
  }

  toJSON(): string {
    return this.toString();
  }
}

/** Packed keys [for A, for B] whose selection bits differ exactly at `target`. */
export function generatePackedKeys(domainBits: number, target: number, seeds?: RootSeeds): [PackedKey, PackedKey] {
  checkDomainBits(domainBits);
  checkPage(target, domainBits);
  const roots = checkRoots(seeds);
  const n = packedLevels(domainBits);
  const tree = buildTree(n, Math.floor(target / 2 ** PACKED_LEAF_BITS), roots);
  const finalCw = xorBytes(xorBytes(tree.last[0], tree.last[1]), unit(target % PACKED_LEAF_PAGES));
  const make = (b: 0 | 1) => {
    const out = new Uint8Array(packedKeyLength(domainBits));
    out.set(keyHeader(roots[b], b, domainBits, [PACKED_TAG]));
    out.set(tree.levels, PACKED_HEADER_BYTES);
    out.set(finalCw, PACKED_HEADER_BYTES + KEY_LEVEL_BYTES * n);
    return PackedKey.fromBytes(out);
  };
  return [make(0), make(1)];
}
