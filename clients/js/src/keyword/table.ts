// Where records sit in a keyword table's pages, and the hash tree over them
// (morphogen/keyword/layout.py, tree.py, pages.py).
//
// The matrix is the data pages (the buckets), then the tree's levels, then the signed
// descriptor. A page of level k + 1 holds the 32-byte BLAKE3 hashes of 128 pages of level k
// (level 0 is the data); the last level has one page, whose hash is the root. A slot is a
// 16-byte tag and the value; an all-zero tag marks it empty.

import { blake3 } from "@noble/hashes/blake3.js";

import { PAGE_SIZE } from "../constants.js";
import { equalBytes } from "../bytes.js";
import { TAG_SIZE } from "./hashing.js";

export const HASH_SIZE = 32;
export const FANOUT = PAGE_SIZE / HASH_SIZE; // 128 children a node
const LEAF_DOMAIN = new TextEncoder().encode("morphogen-keyword-leaf-v2\0");
const NODE_DOMAIN = new TextEncoder().encode("morphogen-keyword-node-v2\0");

export const DATA_TABLE = "data";
export const DESCRIPTOR_TABLE = "descriptor";

export function levelTable(level: number): string {
  return `tree${level}`;
}

/** The party table of part `part` (data, treeN, descriptor) of keyword table `name`. */
export function partTable(name: string, part: string): string {
  return name ? `${name}.${part}` : part;
}

/** Pages of each level above `dataPages` data pages, lowest first; the last has one page. */
export function levelSizes(dataPages: number): number[] {
  if (!(dataPages >= 1)) throw new RangeError("a table has at least one data page");
  const sizes: number[] = [];
  let n = dataPages;
  for (;;) {
    n = Math.ceil(n / FANOUT);
    sizes.push(n);
    if (n === 1) return sizes;
  }
}

function domainHash(domain: Uint8Array, page: Uint8Array): Uint8Array {
  return blake3.create().update(domain).update(page).digest();
}

export function leafHash(page: Uint8Array): Uint8Array {
  return domainHash(LEAF_DOMAIN, page);
}

export function nodeHash(page: Uint8Array): Uint8Array {
  return domainHash(NODE_DOMAIN, page);
}

/** The hash a level page holds for its child `index` (0..127 within the page). */
export function entry(page: Uint8Array, index: number): Uint8Array {
  const at = (index % FANOUT) * HASH_SIZE;
  return page.subarray(at, at + HASH_SIZE);
}

export type Layout = "page" | "row";

/** A table's shape: `page` layout (a bucket is a page, a key in any of its slots) or `row`
 * (the reference's one-row buckets, bucket b at row b % rowsPerPage of page b / rowsPerPage). */
export class Geometry {
  readonly levels: readonly number[];

  constructor(readonly layout: Layout, readonly valueSize: number, readonly numBuckets: number,
    readonly rowSize = 0) {
    const whole = (x: number) => Number.isSafeInteger(x);
    if (layout !== "page" && layout !== "row") throw new Error(`layout is 'page' or 'row', not '${layout}'`);
    if (!whole(valueSize) || valueSize < 1) throw new Error("value_size must be at least 1 byte");
    if (!whole(numBuckets) || numBuckets < 1) throw new Error("a table has at least one bucket");
    if (layout === "page") {
      if (this.slotSize > PAGE_SIZE) throw new Error(`value_size ${valueSize}: a slot does not fit in a page`);
    } else {
      if (!whole(rowSize) || rowSize < 1 || PAGE_SIZE % rowSize) throw new Error(`row_size ${rowSize} must divide ${PAGE_SIZE}`);
      if (this.slotSize > rowSize) throw new Error(`value_size ${valueSize} plus the tag does not fit in a ${rowSize}-byte row`);
    }
    this.levels = levelSizes(this.dataPages);
  }

  get slotSize(): number {
    return TAG_SIZE + this.valueSize;
  }

  get rowsPerPage(): number {
    return this.layout === "row" ? PAGE_SIZE / this.rowSize : 1;
  }

  get slotsPerBucket(): number {
    return this.layout === "page" ? Math.floor(PAGE_SIZE / this.slotSize) : 1;
  }

  get dataPages(): number {
    return Math.ceil(this.numBuckets / this.rowsPerPage);
  }

  /** The matrix index of the first page of tree level `level` (1 = just above the data). */
  levelFirst(level: number): number {
    return this.dataPages + this.levels.slice(0, level - 1).reduce((a, b) => a + b, 0);
  }

  /** Data pages, the tree levels after them, and the descriptor page last. */
  get numPages(): number {
    return this.dataPages + this.levels.reduce((a, b) => a + b, 0) + 1;
  }

  bucketPage(bucket: number): number {
    return Math.floor(bucket / this.rowsPerPage);
  }

  /** Byte offset of a slot within its page. */
  slotOffset(bucket: number, slot: number): number {
    return this.layout === "page" ? slot * this.slotSize : (bucket % this.rowsPerPage) * this.rowSize;
  }
}

/** The value stored under `tag` in `bucket` of `page`, or null: every slot of the bucket is
 * compared, whatever it finds (the same work for a hit and a miss). */
export function findValue(g: Geometry, page: Uint8Array, bucket: number, tag: Uint8Array): Uint8Array | null {
  let found: Uint8Array | null = null;
  for (let slot = 0; slot < g.slotsPerBucket; slot++) {
    const at = g.slotOffset(bucket, slot);
    const hit = equalBytes(page.subarray(at, at + TAG_SIZE), tag);
    if (hit && found === null) found = page.slice(at + TAG_SIZE, at + g.slotSize);
  }
  return found;
}
