// The table descriptor, the one thing the data owner signs for a version
// (morphogen/keyword/descriptor.py, signing.py, freshness.py): magic, length, canonical JSON,
// zero padding, then an Ed25519 signature over a domain and the page's body.

import { ed25519 } from "@noble/curves/ed25519.js";

import { concatBytes, equalBytes, fromHex } from "../bytes.js";
import { PAGE_SIZE } from "../constants.js";
import { Geometry, type Layout } from "./table.js";

const MAGIC = new TextEncoder().encode("MGKWDSC2");
const FORMAT = "morphogen-keyword/2";
const TAG_SCHEME = "blake3-128(domain|dataset|key)";
const TREE_SCHEME = "blake3-tree-128(leaf|node domains)";
const DESCRIPTOR_DOMAIN = new TextEncoder().encode("morphogen-keyword-descriptor-v2\0");
export const SIGNATURE_SIZE = 64;
const BODY_SIZE = PAGE_SIZE - SIGNATURE_SIZE;
const DATASET_SIZE = 16;
const HASH = /^0x[0-9a-f]{64}$/;
const NAME = /^[a-z][a-z0-9_-]{0,20}$/;

/** What the servers answered is not what the data owner signed. */
export class KeywordIntegrityError extends Error {
  override name = "KeywordIntegrityError";
}

/** The servers serve an older version than this client has seen or its caller allows:
 * signed by the owner once, but no longer the table. */
export class StaleTableError extends KeywordIntegrityError {
  override name = "StaleTableError";
}

/** The chain block a version reflects. */
export interface Anchor {
  chainId: number;
  number: number;
  hash: string;
}

export interface Descriptor {
  dataset: Uint8Array;
  version: number;
  geometry: Geometry;
  seeds: [bigint, bigint, bigint];
  publicKey: Uint8Array;
  root: string; // the tree's root, hex
  records: number;
  time: number; // when the owner made the version, Unix seconds
  anchor: Anchor | null;
  name: string; // the table's name in a matrix of several; "" when alone
  /** The signed JSON text: two descriptors are the same version exactly when it is equal. */
  text: string;
}

/** An Ed25519 public key from 32 bytes or 64 hex digits. */
export function publicKeyOf(source: Uint8Array | string): Uint8Array {
  const raw = typeof source === "string" ? fromHex(source.trim()) : source;
  if (raw.length !== 32) throw new Error("an Ed25519 public key is 32 bytes (64 hex digits)");
  return Uint8Array.from(raw);
}

function int(x: unknown, what: string): number {
  if (typeof x !== "number" || !Number.isSafeInteger(x)) throw new Error(`${what} is not an integer`);
  return x;
}

function seed(x: unknown): bigint {
  if (typeof x !== "string" && typeof x !== "number") throw new Error("a seed is a decimal string");
  const s = String(x);
  if (!/^\d+$/.test(s)) throw new Error("a seed is a decimal string");
  return BigInt(s);
}

/** A descriptor from its JSON object, with descriptor.py's checks. */
export function descriptorFromDict(d: Record<string, unknown>, text: string): Descriptor {
  if (d.format !== FORMAT || d.tag !== TAG_SCHEME || d.tree !== TREE_SCHEME) {
    throw new Error(`not a ${FORMAT} descriptor (format ${JSON.stringify(d.format)})`);
  }
  const geometry = new Geometry(d.layout as Layout, int(d.value_size, "value_size"),
    int(d.num_buckets, "num_buckets"), d.row_size === undefined ? 0 : int(d.row_size, "row_size"));
  const levels = d.levels;
  if (int(d.num_pages, "num_pages") !== geometry.numPages || !Array.isArray(levels)
    || levels.length !== geometry.levels.length || levels.some((n, i) => n !== geometry.levels[i])) {
    throw new Error("the descriptor's page count does not match its geometry");
  }
  if (!Array.isArray(d.seeds) || d.seeds.length !== 3) throw new Error("a descriptor has three seeds");
  const seeds = d.seeds.map(seed) as [bigint, bigint, bigint];
  const dataset = fromHex(String(d.dataset));
  if (dataset.length !== DATASET_SIZE) throw new Error("a dataset id is 16 bytes");
  let anchor: Anchor | null = null;
  if (d.anchor !== undefined && d.anchor !== null) {
    const a = d.anchor as Record<string, unknown>;
    anchor = { chainId: int(a.chain_id, "chain_id"), number: int(a.number, "number"), hash: String(a.hash) };
    if (anchor.chainId < 1 || anchor.number < 0 || !HASH.test(anchor.hash)) {
      throw new Error("an anchor is a chain id (1 or more), a block number and a block hash");
    }
  }
  const name = d.table === undefined ? "" : String(d.table);
  if (name && !NAME.test(name)) throw new Error(`table name ${JSON.stringify(name.slice(0, 40))} is not a plain name`);
  return {
    dataset, version: int(d.version, "version"), geometry, seeds,
    publicKey: fromHex(String(d.public_key)), root: String(d.root), records: int(d.records, "records"),
    time: int(d.time, "time"), anchor, name, text,
  };
}

/** The JSON text a descriptor page's body holds after its magic and length, or null. */
function textOf(body: Uint8Array): Uint8Array | null {
  if (!equalBytes(body.subarray(0, MAGIC.length), MAGIC)) return null;
  const size = new DataView(body.buffer, body.byteOffset + MAGIC.length, 4).getUint32(0, true);
  const at = MAGIC.length + 4;
  if (at + size > body.length) return null;
  return body.subarray(at, at + size);
}

/** The descriptor in `page`, or KeywordIntegrityError when the owner did not sign it. */
export function descriptorFromPage(page: Uint8Array, trusted: Uint8Array): Descriptor {
  if (page.length !== PAGE_SIZE) throw new KeywordIntegrityError("the descriptor page is not 4096 bytes");
  const body = page.subarray(0, BODY_SIZE), sig = page.subarray(BODY_SIZE);
  let ok = false;
  try {
    // RFC 8032's strict rules, as the owner's side (OpenSSL) checks them
    ok = ed25519.verify(sig, concatBytes(DESCRIPTOR_DOMAIN, body), trusted, { zip215: false });
  } catch {
    ok = false;
  }
  if (!ok) {
    throw new KeywordIntegrityError("the table descriptor is not signed by the trusted owner key "
      + "(wrong key, not a keyword table, or a server answered wrongly)");
  }
  const raw = textOf(body);
  if (raw === null) throw new KeywordIntegrityError("the signed descriptor page has no descriptor");
  let desc: Descriptor;
  try {
    const text = new TextDecoder("utf-8", { fatal: true }).decode(raw);
    desc = descriptorFromDict(JSON.parse(text), text);
  } catch (exc) {
    throw new KeywordIntegrityError(`the signed descriptor is malformed: ${(exc as Error).message}`);
  }
  if (!equalBytes(desc.publicKey, trusted)) throw new KeywordIntegrityError("the descriptor names another owner key");
  return desc;
}

/** The descriptor read from a table's last page, checked against what the servers serve. */
export function descriptorOf(page: Uint8Array, trusted: Uint8Array, numPages: number): Descriptor {
  const desc = descriptorFromPage(page, trusted);
  if (desc.geometry.numPages !== numPages) {
    throw new KeywordIntegrityError(`the signed descriptor describes ${desc.geometry.numPages} pages; `
      + `the servers serve ${numPages}`);
  }
  return desc;
}

/** What the caller allows: versions and blocks from, and an age up to (seconds). */
export interface Bounds {
  version: number;
  block: number;
  maxAge: number | null;
}

/** Why `desc` is too old for a client that has seen `seenVersion` and `seenBlock` under
 * `bounds`, or null when it is not (freshness.py). */
export function stale(desc: Descriptor, bounds: Bounds, seenVersion: number, seenBlock: number,
  now?: number): string | null {
  const floor = Math.max(bounds.version, seenVersion);
  if (desc.version < floor) {
    const who = seenVersion >= bounds.version ? "this client has already read version" : "its caller trusts version";
    return `the servers serve version ${desc.version} of the table and ${who} ${floor}`;
  }
  // a newer version may name an older block than one seen (the owner signed a reorg's new
  // branch); at the same version the block cannot differ, so one that does is a replay
  const block = desc.version <= seenVersion ? Math.max(bounds.block, seenBlock) : bounds.block;
  if (Math.max(block, seenBlock) && desc.anchor === null) {
    return `the servers serve version ${desc.version}, which names no chain block, and block `
      + `${Math.max(block, seenBlock)} or later is wanted`;
  }
  if (desc.anchor !== null && desc.anchor.number < block) {
    const who = seenBlock >= bounds.block ? "this client has already read block" : "its caller trusts block";
    return `the servers serve block ${desc.anchor.number} (version ${desc.version}) and ${who} ${block}`;
  }
  if (bounds.maxAge !== null) {
    const age = (now ?? Date.now() / 1000) - desc.time;
    if (age > bounds.maxAge) {
      return `the servers serve version ${desc.version}, made ${age.toFixed(0)} s ago; the caller `
        + `accepts ${bounds.maxAge} s at most`;
    }
  }
  return null;
}

