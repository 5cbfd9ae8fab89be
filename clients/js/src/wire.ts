// The page client's vocabulary, free of I/O, as morphogen/client/wire.py has it: errors, what
// the servers advertise and answer, and the coding of requests and answers (PROTOCOL.md 5).
// Identities ("0x" + hex, a digest naming the exact data an epoch serves) are optional
// everywhere: the reference server publishes none, and epoch ids are then all there is.

import { decode as decodeMsgpack, encode as encodeMsgpack } from "@msgpack/msgpack";

import { fromHex, randomBelow, to0xHex, xorBytes } from "./bytes.js";
import {
  BATCH_PATH,
  JSON_TYPE,
  KEY_FORMATS,
  KEY_FORMAT_PACKED,
  KEY_FORMAT_V1,
  KEYS_PER_QUERY,
  MAX_BATCH_QUERIES,
  MAX_DOMAIN_BITS,
  MSGPACK_TYPE,
  PAGE_SIZE,
  QUERY_PATH,
  type KeyFormat,
} from "./constants.js";
import { generateKeys } from "./dpf.js";
import { generatePackedKeys } from "./packed.js";

// What a replica's death, an overloaded party or a restart looks like from outside: retried
// with fresh keys to both parties (a read is safe to repeat). Every other 4xx is the router
// refusing the request itself, and final.
export const RETRY_STATUSES: ReadonlySet<number> = new Set([429, 500, 502, 503, 504]);

export type Encoding = "json" | "msgpack";

// --------------------------------------------------------------------------- errors

/** A request the servers refused (4xx) or a malformed answer; `code` is the server's
 * `error.code` (bad_key, bad_domain, unknown_table, ...) or the client's own. */
export class PirError extends Error {
  override name = "PirError";
  readonly status: number | undefined;
  readonly code: string | undefined;

  constructor(message: string, status?: number, code?: string) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** No consistent answer after every retry; `status` is the last HTTP status met, if any. */
export class PirUnavailable extends PirError {
  override name = "PirUnavailable";
}

/** A and B kept answering from different epochs: they do not hold the same data. */
export class EpochMismatchError extends PirUnavailable {
  override name = "EpochMismatchError";
}

/** A wanted page is not in the servers' data (at or past its end, or negative). */
export class PageOutOfRange extends PirError {
  override name = "PageOutOfRange";
  readonly page: number;
  readonly numPages: number;

  constructor(page: number, numPages: number) {
    super(`page ${page} is outside 0..${numPages - 1}: the servers hold ${numPages} pages`,
      undefined, "page_out_of_range");
    this.page = page;
    this.numPages = numPages;
  }
}

/** A table the servers do not advertise (GET /epoch's `tables`); raised before any query. */
export class UnknownTable extends PirError {
  override name = "UnknownTable";
  readonly table: string;

  constructor(table: string, known: Iterable<string>) {
    const listed = [...known].sort().join(", ") || "none";
    super(`the servers serve no table '${table}' (tables: ${listed})`, undefined, "unknown_table");
    this.table = table;
  }
}

/** The servers answered from other data than planned for, and the caller asked not to follow
 * it (`getPinned`): nothing was re-sent. /epoch has been read again. */
export class DataMoved extends PirError {
  override name = "DataMoved";
}

export type TransientKind = "other" | "epoch" | "identity" | "matrix" | "moved";

/** A failure worth retrying; `delay` is the server's Retry-After hint in seconds. */
export class Transient extends Error {
  override name = "Transient";
  readonly delay: number | undefined;
  readonly kind: TransientKind;
  readonly status: number | undefined;

  constructor(reason: string, delay?: number, kind: TransientKind = "other", status?: number) {
    super(reason);
    this.delay = delay;
    this.kind = kind;
    this.status = status;
  }
}

/** What an HTTP error status means to the client: retry it or raise it. */
export function failureForStatus(status: number, code: string | undefined, message: string,
  retryAfter?: number): Error {
  if (RETRY_STATUSES.has(status)) {
    return new Transient(`HTTP ${status} ${code ?? ""}`.trim(), retryAfter, "other", status);
  }
  return new PirError(`HTTP ${status}: ${message}`, status, code);
}

// --------------------------------------------------------------------------- data

/** The data a party serves or an answer came from; `identity` null where not published. */
export class View {
  constructor(readonly epochId: number, readonly identity: string | null) {}

  /** Identities are compared only where both sides have one: the reference has none. */
  same(other: View): boolean {
    if (this.epochId !== other.epochId) return false;
    return this.identity === null || other.identity === null || this.identity === other.identity;
  }

  toString(): string {
    return `epoch ${this.epochId}` + (this.identity ? ` (${this.identity})` : "");
  }
}

/** One named table: pages [firstPage, firstPage + numPages) of the matrix, queried as pages
 * 0..numPages-1 with keys of `domainBits`. */
export interface TableInfo {
  readonly firstPage: number;
  readonly numPages: number;
  readonly domainBits: number;
}

function sameTable(a: TableInfo | undefined, b: TableInfo | undefined): boolean {
  return a !== undefined && b !== undefined && a.firstPage === b.firstPage
    && a.numPages === b.numPages && a.domainBits === b.domainBits;
}

/** What both servers advertise (GET /epoch) and the client plans against. `epochId` and
 * `identity` are A's; `epochIds` and `identities` are (A's, B's), which differ for a moment
 * while an update or a rotation reaches one party before the other. */
export class ServerInfo {
  constructor(
    readonly numPages: number,
    readonly domainBits: number,
    readonly epochIds: readonly [number, number],
    readonly identities: readonly [string | null, string | null],
    readonly maxBatchQueries: number = MAX_BATCH_QUERIES,
    readonly tables: ReadonlyMap<string, TableInfo> = new Map(),
    // the key formats both parties take (a server that names none takes v1 only)
    readonly keyFormats: readonly KeyFormat[] = [KEY_FORMAT_V1],
  ) {}

  get epochId(): number {
    return this.epochIds[0];
  }

  get identity(): string | null {
    return this.identities[0];
  }

  get views(): [View, View] {
    return [new View(this.epochIds[0], this.identities[0]), new View(this.epochIds[1], this.identities[1])];
  }

  /** Packed where both parties take it and `allowed` is "auto", v1 otherwise. */
  keyFormat(allowed: "auto" | "v1" = "auto"): KeyFormat {
    return allowed === "auto" && this.keyFormats.includes(KEY_FORMAT_PACKED) ? KEY_FORMAT_PACKED : KEY_FORMAT_V1;
  }

  /** Whether either party advertised `view`: the shape of that data is then known. */
  names(view: View): boolean {
    return this.views.some((v) => v.same(view));
  }

  /** Whether both parties advertise `view`. */
  isExactly(view: View): boolean {
    return this.views.every((v) => v.same(view));
  }

  /** [numPages, domainBits] that keys of `table` (undefined: the whole matrix) are planned
   * against; UnknownTable for a table not advertised. */
  shape(table?: string): [number, number] {
    if (table === undefined) return [this.numPages, this.domainBits];
    const t = this.tables.get(table);
    if (t === undefined) throw new UnknownTable(table, this.tables.keys());
    return [t.numPages, t.domainBits];
  }
}

/** One party's decoded answer (accumulators in key order); after combining, the pages. */
export interface Answer {
  epochId: number;
  identity: string | null;
  pages: Uint8Array[];
}

// --------------------------------------------------------------------------- pure helpers

export function checkPages(pages: readonly number[], numPages: number): number[] {
  for (const p of pages) {
    if (!Number.isInteger(p) || p < 0 || p >= numPages) throw new PageOutOfRange(p, numPages);
  }
  return [...pages];
}

/** The wanted pages padded with random dummies to a whole number of queries, so that every
 * query looks alike to a server. */
export function planTargets(pages: readonly number[], numPages: number): number[] {
  const out = checkPages(pages, numPages);
  while (out.length % KEYS_PER_QUERY) out.push(randomBelow(numPages));
  return out;
}

export type Queries = Uint8Array[][];

/** Fresh key pairs for `targets`, grouped as queries: [queries for A, queries for B]. */
export function makeKeys(targets: readonly number[], domainBits: number,
  keyFormat: KeyFormat = KEY_FORMAT_V1): [Queries, Queries] {
  if (!KEY_FORMATS.includes(keyFormat)) throw new Error(`unknown key format ${keyFormat}`);
  const gen = keyFormat === KEY_FORMAT_PACKED ? generatePackedKeys : generateKeys;
  const qa: Queries = [], qb: Queries = [];
  for (let i = 0; i < targets.length; i += KEYS_PER_QUERY) {
    const ka: Uint8Array[] = [], kb: Uint8Array[] = [];
    for (const t of targets.slice(i, i + KEYS_PER_QUERY)) {
      const [k0, k1] = gen(domainBits, t);
      ka.push(k0.bytes);
      kb.push(k1.bytes);
    }
    qa.push(ka);
    qb.push(kb);
  }
  return [qa, qb];
}

export interface EncodedRequest {
  path: string;
  body: Uint8Array<ArrayBuffer>;
  headers: Record<string, string>;
}

/** A single query (one) or a batch request (several); `table` is absent from the body for
 * the whole matrix, so that a reference server reads it. */
export function encodeRequest(queries: Queries, encoding: Encoding, table?: string): EncodedRequest {
  const batch = queries.length !== 1;
  const path = batch ? BATCH_PATH : QUERY_PATH;
  const mt = encoding === "msgpack" ? MSGPACK_TYPE : JSON_TYPE;
  const key = (k: Uint8Array): Uint8Array | string => (encoding === "msgpack" ? k : to0xHex(k));
  const obj: Record<string, unknown> = batch
    ? { queries: queries.map((q) => ({ keys: q.map(key) })) }
    : { keys: queries[0]!.map(key) };
  if (table !== undefined) obj.table = table;
  // a copy over a plain ArrayBuffer, the only kind fetch's body types take
  const body = Uint8Array.from(encoding === "msgpack" ? encodeMsgpack(obj) : new TextEncoder().encode(JSON.stringify(obj)));
  return { path, body, headers: { "Content-Type": mt, Accept: mt } };
}

function identityOf(value: unknown): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== "string" || !/^0[xX][0-9a-fA-F]+$/.test(value)) {
    throw new Error("identity is not 0x + hex digits");
  }
  return value.toLowerCase();
}

function isObject(x: unknown): x is Record<string, unknown> {
  return typeof x === "object" && x !== null && !Array.isArray(x);
}

function pageBytes(p: unknown): Uint8Array {
  if (p instanceof Uint8Array) return p;
  if (typeof p === "string") return fromHex(p);
  throw new Error("a page is neither bytes nor hex");
}

/** An Answer from a decoded single or batch response body. */
export function answerFromObj(obj: unknown, numQueries: number): Answer {
  let epoch: unknown, identity: string | null, pages: Uint8Array[];
  try {
    if (!isObject(obj)) throw new Error("not an object");
    epoch = obj.epoch_id;
    identity = identityOf(obj.identity);
    let groups: unknown[];
    if (numQueries === 1 && "pages" in obj) {
      groups = [obj.pages];
    } else {
      if (!Array.isArray(obj.results)) throw new Error("no results");
      groups = obj.results.map((r) => (isObject(r) ? r.pages : undefined));
    }
    if (groups.length !== numQueries
      || groups.some((g) => !Array.isArray(g) || g.length !== KEYS_PER_QUERY)) {
      throw new Error("wrong number of answers");
    }
    pages = (groups as unknown[][]).flat().map(pageBytes);
  } catch (exc) {
    throw new PirError(`malformed answer: ${(exc as Error).message}`);
  }
  if (typeof epoch !== "number" || !Number.isSafeInteger(epoch)) {
    throw new PirError("malformed answer: bad epoch id");
  }
  if (pages.some((p) => p.length !== PAGE_SIZE)) throw new PirError("malformed answer: bad page size");
  return { epochId: epoch, identity, pages };
}

export function isMsgpack(contentType: string | null | undefined): boolean {
  const mt = (contentType ?? "").split(";", 1)[0]!.trim().toLowerCase();
  return mt === MSGPACK_TYPE || mt === "application/x-msgpack" || mt === "application/vnd.msgpack";
}

/** The Answer in a single or batch response body. */
export function decodeAnswer(body: Uint8Array, contentType: string | null, numQueries: number): Answer {
  let obj: unknown;
  try {
    obj = isMsgpack(contentType) ? decodeMsgpack(body) : JSON.parse(new TextDecoder().decode(body));
  } catch (exc) {
    throw new PirError(`malformed answer: ${(exc as Error).message}`);
  }
  return answerFromObj(obj, numQueries);
}

export function xorPages(a: readonly Uint8Array[], b: readonly Uint8Array[]): Uint8Array[] {
  if (a.length !== b.length) throw new PirError("the parties answered different numbers of pages");
  return a.map((x, i) => xorBytes(x, b[i]!));
}

function int(x: unknown, what: string): number {
  const n = typeof x === "string" && /^-?\d+$/.test(x) ? Number(x) : x;
  if (typeof n !== "number" || !Number.isSafeInteger(n)) throw new Error(`${what} is not an integer`);
  return n;
}

function tablesOf(doc: Record<string, unknown>): Map<string, TableInfo> {
  const out = new Map<string, TableInfo>();
  const tables = doc.tables;
  if (tables === undefined || tables === null) return out;
  if (!isObject(tables)) throw new Error("tables is not an object");
  for (const [name, t] of Object.entries(tables)) {
    if (!isObject(t)) throw new Error(`table ${name} is not an object`);
    out.set(name, {
      firstPage: int(t.first_page, "first_page"),
      numPages: int(t.num_pages, "num_pages"),
      domainBits: int(t.domain_bits, "domain_bits"),
    });
  }
  return out;
}

function sameTables(a: Map<string, TableInfo>, b: Map<string, TableInfo>): boolean {
  return a.size === b.size && [...a].every(([name, t]) => sameTable(t, b.get(name)));
}

/** Both parties' GET /epoch documents as one ServerInfo; Transient while they disagree on the
 * matrix's shape (one party may finish a snapshot rotation before the other). */
export function infoFromEpoch(docA: unknown, docB: unknown): ServerInfo {
  let shapeA: [number, number], shapeB: [number, number], maxBatch: number;
  let epochs: [number, number], idents: [string | null, string | null];
  let tablesA: Map<string, TableInfo>, tablesB: Map<string, TableInfo>;
  let formats: Set<string>[];
  try {
    if (!isObject(docA) || !isObject(docB)) throw new Error("not an object");
    const pa = docA.page_pir, pb = docB.page_pir;
    if (!isObject(pa) || !isObject(pb)) throw new Error("no page_pir");
    shapeA = [int(pa.num_pages, "num_pages"), int(pa.domain_bits, "domain_bits")];
    shapeB = [int(pb.num_pages, "num_pages"), int(pb.domain_bits, "domain_bits")];
    maxBatch = Math.min(int(pa.max_batch_queries ?? MAX_BATCH_QUERIES, "max_batch_queries"),
      int(pb.max_batch_queries ?? MAX_BATCH_QUERIES, "max_batch_queries"));
    epochs = [int(docA.epoch_id, "epoch_id"), int(docB.epoch_id, "epoch_id")];
    idents = [identityOf(docA.identity), identityOf(docB.identity)];
    tablesA = tablesOf(docA);
    tablesB = tablesOf(docB);
    formats = [pa, pb].map((p) => {
      const f = p.key_formats;
      if (f === undefined || f === null || (Array.isArray(f) && f.length === 0)) return new Set([KEY_FORMAT_V1]);
      if (!Array.isArray(f)) throw new Error("key_formats is not a list");
      return new Set(f.map(String));
    });
  } catch (exc) {
    throw new PirError(`malformed /epoch document: ${(exc as Error).message}`);
  }
  if (shapeA[0] !== shapeB[0] || shapeA[1] !== shapeB[1]) {
    throw new Transient(`the two servers serve different matrices (A: ${shapeA[0]} pages, domain `
      + `${shapeA[1]}; B: ${shapeB[0]} pages, domain ${shapeB[1]})`, undefined, "matrix");
  }
  if (!sameTables(tablesA, tablesB)) {
    throw new Transient(`the two servers serve different tables (A: ${[...tablesA.keys()].sort()}; `
      + `B: ${[...tablesB.keys()].sort()})`, undefined, "matrix");
  }
  const [numPages, domainBits] = shapeA;
  if (!(domainBits >= 1 && domainBits <= MAX_DOMAIN_BITS && numPages >= 1
    && numPages <= 2 ** domainBits && maxBatch >= 1)) {
    throw new PirError(`malformed /epoch document: ${numPages} pages in domain ${domainBits}`);
  }
  for (const [name, t] of tablesA) {
    // keys in a smaller domain would alias the table's pages (PROTOCOL.md's rule)
    if (!(t.numPages >= 1 && t.domainBits <= MAX_DOMAIN_BITS && t.numPages <= 2 ** t.domainBits
      && t.firstPage >= 0 && t.firstPage + t.numPages <= numPages)) {
      throw new PirError(`malformed /epoch document: table '${name}' is ${JSON.stringify(t)}`);
    }
  }
  const both = KEY_FORMATS.filter((f) => formats[0]!.has(f) && formats[1]!.has(f));
  return new ServerInfo(numPages, domainBits, epochs, idents, maxBatch, tablesA,
    both.length ? both : [KEY_FORMAT_V1]);
}

export { sameTable };
