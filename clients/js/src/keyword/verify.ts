// The client's half of a lookup, without I/O (morphogen/keyword/verify.py): which pages to
// ask for, and what the answer says once every page in it is proven against the version's
// signed root. Every page is hashed up its path before any value is read, and a bad page
// anywhere gives the one error with the one message: the outcome never depends on which key
// was looked up or which of its pages was bad, so a server that corrupts an answer learns
// nothing from the failure.

import { equalBytes, toHex } from "../bytes.js";
import { PAGE_SIZE } from "../constants.js";
import { type Descriptor, KeywordIntegrityError } from "./descriptor.js";
import { candidates, tagOf } from "./hashing.js";
import { FANOUT, entry, findValue, leafHash, nodeHash } from "./table.js";

export const ANSWER_FAILED = "an answer failed verification: the pages the servers returned are "
  + "not the ones the data owner signed for this version (a server answered wrongly, or the "
  + "parties serve different versions)";

// Tree levels of at most this many pages are read whole, once per version: a table of up to
// 16 k data pages then costs a lookup its three data queries only.
export const WHOLE_LEVEL_PAGES = 128;

/** A version's checked descriptor and its tree levels read whole, each page proven up to the
 * signed root; lookups end their paths in `whole.get(private + 1)`. */
export interface Proof {
  descriptor: Descriptor;
  private: number; // levels 1..private are read a page per candidate
  whole: Map<number, Uint8Array[]>;
}

/** How many of the lowest levels a lookup reads privately: those over `wholePages` pages. */
export function privateLevels(desc: Descriptor, wholePages = WHOLE_LEVEL_PAGES): number {
  if (!(wholePages >= 1)) throw new RangeError("wholePages is at least 1 (the top level is always read whole)");
  return desc.geometry.levels.filter((n) => n > wholePages).length;
}

/** level -> its page count, for every level read whole. */
export function wholePagesWanted(desc: Descriptor, priv: number): Map<number, number> {
  const levels = desc.geometry.levels;
  const out = new Map<number, number>();
  for (let k = priv + 1; k <= levels.length; k++) out.set(k, levels[k - 1]!);
  return out;
}

/** The Proof of the levels read whole: the top page must hash to the root, each page of a
 * lower level to its entry in the level above. */
export function proveWhole(desc: Descriptor, priv: number, whole: Map<number, Uint8Array[]>): Proof {
  const levels = desc.geometry.levels;
  const top = levels.length;
  const pages = new Map<number, Uint8Array[]>();
  let ok = true;
  for (let k = priv + 1; k <= top; k++) {
    const got = whole.get(k) ?? [];
    pages.set(k, got);
    ok &&= got.length === levels[k - 1] && got.every((p) => p.length === PAGE_SIZE);
  }
  if (!ok) throw new KeywordIntegrityError(ANSWER_FAILED);
  let good = toHex(nodeHash(pages.get(top)![0]!)) === desc.root;
  for (let k = priv + 1; k < top; k++) {
    const above = pages.get(k + 1)!;
    pages.get(k)!.forEach((page, i) => {
      good = equalBytes(entry(above[Math.floor(i / FANOUT)]!, i), nodeHash(page)) && good;
    });
  }
  if (!good) throw new KeywordIntegrityError(ANSWER_FAILED);
  return { descriptor: desc, private: priv, whole: pages };
}

/** The pages to read: the data pages (three per key, in key order), then for each level read
 * privately the page on each of their paths; and each key's candidate buckets. */
export function plan(proof: Proof, keys: readonly Uint8Array[]): [number[][], number[][]] {
  const desc = proof.descriptor, g = desc.geometry;
  const buckets = keys.map((k) => candidates(k, desc.seeds, g.numBuckets));
  const wanted = [buckets.flat().map((b) => g.bucketPage(b))];
  for (let i = 0; i < proof.private; i++) wanted.push(wanted.at(-1)!.map((p) => Math.floor(p / FANOUT)));
  return [wanted, buckets];
}

/** Each key's value (null when none of its three pages holds it), after every page of
 * `answers` (as `plan` asked: data first, then each private level) is proven up to the root. */
export function check(proof: Proof, keys: readonly Uint8Array[], buckets: readonly number[][],
  answers: readonly (readonly Uint8Array[])[]): (Uint8Array | null)[] {
  const desc = proof.descriptor, g = desc.geometry;
  const n = 3 * keys.length;
  if (answers.length !== 1 + proof.private || answers.some((a) => a.length !== n)
    || answers.some((a) => a.some((p) => p.length !== PAGE_SIZE))) {
    throw new KeywordIntegrityError(ANSWER_FAILED);
  }
  const end = proof.whole.get(proof.private + 1)!;
  let ok = true;
  // every path in full, even where two share pages: skipping repeats would make the time a
  // lookup takes (which a server sees between requests) depend on where the candidates fall
  for (let i = 0; i < n; i++) {
    let index = g.bucketPage(buckets[Math.floor(i / 3)]![i % 3]!);
    let digest = leafHash(answers[0]![i]!);
    for (let level = 1; level <= proof.private; level++) {
      const page = answers[level]![i]!;
      ok = equalBytes(entry(page, index), digest) && ok;
      digest = nodeHash(page);
      index = Math.floor(index / FANOUT);
    }
    ok = equalBytes(entry(end[Math.floor(index / FANOUT)]!, index), digest) && ok;
  }
  if (!ok) throw new KeywordIntegrityError(ANSWER_FAILED);
  return keys.map((key, k) => {
    const tag = tagOf(desc.dataset, key);
    const found = [0, 1, 2].map((j) => findValue(g, answers[0]![3 * k + j]!, buckets[k]![j]!, tag));
    return found.find((v) => v !== null) ?? null;
  });
}
