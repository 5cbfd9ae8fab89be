// Records by key over the page client (morphogen/keyword/client.py): `get(key)`,
// `getMany(keys)`, `readAt(keys)`. A lookup is one query of three keys into the table's data,
// plus three into each tree level read privately; this layer adds the descriptor, the
// candidate pages and their paths, the padding, the freshness bounds and the verification.
// What a server sees never depends on the keys looked up:
//
// - Tables: where the parties serve the table's `data`, `treeN` and `descriptor` tables each
//   read costs the scan of its table only; elsewhere the same pages come from the whole matrix.
// - Shapes: a request carries a bucket of lookups (`requestSizes`); the places past the
//   caller's keys are random keys, planned, asked and verified like the real ones.
// - Table changes: the client keeps the view (epoch, identity) it read the descriptor at; an
//   answer from other data is dropped unread, the descriptor read again and the lookup asked
//   again. The page client is told not to follow a move itself (`getPinned`).
// - Freshness: never a version older than one accepted, nor a block older than one seen;
//   callers bound both and the version's age (StaleTableError).
// - Datasets: an owner may sign several builds with one key (two chains, two record sets);
//   each build has its own random dataset id. A client holds to one: the one it is given, else
//   the first it accepts, so that the parties cannot answer from another build's table.

import { equalBytes, fromHex, randomBytes, toHex } from "../bytes.js";
import type { PirClient } from "../client.js";
import { type Answer, DataMoved, PageOutOfRange, type ServerInfo, UnknownTable } from "../wire.js";
import {
  type Bounds,
  type Descriptor,
  KeywordIntegrityError,
  StaleTableError,
  descriptorOf,
  publicKeyOf,
  stale,
} from "./descriptor.js";
import { DATA_TABLE, DESCRIPTOR_TABLE, levelTable, partTable } from "./table.js";
import {
  type Proof,
  WHOLE_LEVEL_PAGES,
  check,
  plan,
  privateLevels,
  proveWhole,
  wholePagesWanted,
} from "./verify.js";

// Tries of one request when the servers move to other data each time: a table that changes
// faster than a lookup's round trip is an outage, not something to wait out here.
const MOVES = 4;
// padding keys: their candidates are as uniform as any real key's, whatever the length
const PAD_KEY_SIZE = 20;

type ViewPair = readonly [number, string | null];

/** The servers name no keyword table of that name. */
export class UnknownKeywordTable extends Error {
  override name = "UnknownKeywordTable";
}

/** The servers answered from other data at every try of one request. */
export class TableChangingError extends Error {
  override name = "TableChangingError";
}

/** Lookups per request for `n` keys when a request holds at most `limit`: full requests,
 * then the smallest power of two (or `limit`) that holds the rest. 70 at 32: [32, 32, 8]. */
export function requestSizes(n: number, limit: number): number[] {
  if (!(limit >= 1)) throw new RangeError("a request holds at least one lookup");
  const sizes: number[] = Array(Math.floor(n / limit)).fill(limit);
  const rest = n % limit;
  if (rest) sizes.push(Math.min(limit, 2 ** Math.ceil(Math.log2(rest))));
  return sizes;
}

function same(a: ViewPair, b: ViewPair): boolean {
  // identities are compared where both sides publish one: the reference server has none
  return a[0] === b[0] && (a[1] === null || b[1] === null || a[1] === b[1]);
}

function views(info: ServerInfo): ViewPair[] {
  return [[info.epochIds[0], info.identities[0]], [info.epochIds[1], info.identities[1]]];
}

function served(info: ServerInfo, name: string): [number, number] | null {
  const t = info.tables.get(name);
  return t === undefined ? null : [t.firstPage, t.numPages];
}

interface Get {
  pages: number[];
  numPages: number;
  table: string | undefined;
}

/** (first page, pages) of keyword table `table` in the servers' matrix. */
function span(info: ServerInfo, table: string): [number, number] {
  if (!table) return [0, info.numPages];
  const data = served(info, partTable(table, DATA_TABLE));
  const desc = served(info, partTable(table, DESCRIPTOR_TABLE));
  if (data === null || desc === null || desc[0] < data[0]) {
    throw new UnknownKeywordTable(`the servers serve no keyword table named '${table}'`);
  }
  return [data[0], desc[0] + 1 - data[0]];
}

/** Whether a failure of a pinned read is the servers moving (read again), as Python's
 * LookupError is: the data moved, a table vanished, a page fell past a smaller table's end. */
function moved(exc: unknown): boolean {
  return exc instanceof DataMoved || exc instanceof UnknownTable || exc instanceof PageOutOfRange;
}

type Told = number | null | undefined;

const DATASET_SIZE = 16;

/** The dataset id the clients of one table are held to: the first one accepted, pinned for
 * all of them. Clients made for concurrent readers of one table (EthState's) share one, or
 * each would trust whatever build it happened to read first. */
export class DatasetPin {
  dataset: Uint8Array | null = null;
}

function datasetOf(source: Uint8Array | string): Uint8Array {
  let raw: Uint8Array | null = null;
  try {
    raw = typeof source === "string" ? fromHex(source.trim()) : source instanceof Uint8Array ? source : null;
  } catch {
    raw = null;
  }
  if (raw === null || raw.length !== DATASET_SIZE) {
    throw new RangeError("dataset is a table's dataset id: 16 bytes, or 32 hex digits with or without 0x");
  }
  return Uint8Array.from(raw);
}

export interface KeywordClientOptions {
  /** Refuse versions below this one, even at the first read. */
  minVersion?: number;
  /** Called once per getMany: a version the caller trusts from elsewhere, or null. */
  trustedVersion?: () => Told | Promise<Told>;
  /** Refuse versions that reflect a block below this one (or none). */
  minBlock?: number;
  trustedBlock?: () => Told | Promise<Told>;
  /** Refuse versions the owner made more than this many seconds ago. */
  maxAge?: number;
  /** Tree levels of at most this many pages are read whole once per version. */
  wholeLevelPages?: number;
  /** One keyword table of a matrix that holds several (its signed name). */
  table?: string;
  /** The dataset id of the build trusted (16 bytes, or hex): every version must name it.
   * Without it, the first version accepted pins its dataset id. */
  dataset?: Uint8Array | string;
  /** Shared by the clients of one table, which then pin one dataset id between them. */
  pin?: DatasetPin;
}

function count(name: string, value: number | undefined): number {
  const v = value ?? 0;
  if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`${name} is a count (an integer, 0 or more)`);
  return v;
}

/** Lookups of records by key, verified against the data owner's Ed25519 public key (32
 * bytes or 64 hex digits), the one thing trusted. */
export class KeywordClient {
  readonly trusted: Uint8Array;
  readonly table: string;
  /** The highest version and block accepted so far: the client never goes below them. */
  seenVersion = 0;
  seenBlock = 0;
  /** The parties' (epoch id, identity) the last lookup's answers came from. */
  lastView: ViewPair | null = null;
  private state: [Proof, ViewPair] | null = null;
  private signed: [Uint8Array, Descriptor] | null = null;
  private readonly minVersion: number;
  private readonly minBlock: number;
  private readonly maxAge: number | null;
  private readonly wholeLevelPages: number;
  private readonly dataset: Uint8Array | null;
  private readonly pin: DatasetPin;

  constructor(readonly pir: PirClient, publicKey: Uint8Array | string,
    private readonly options: KeywordClientOptions = {}) {
    this.trusted = publicKeyOf(publicKey);
    this.table = options.table ?? "";
    this.minVersion = count("minVersion", options.minVersion);
    this.minBlock = count("minBlock", options.minBlock);
    if (options.maxAge !== undefined && !(options.maxAge > 0)) throw new RangeError("maxAge is a number of seconds above 0");
    this.maxAge = options.maxAge ?? null;
    this.wholeLevelPages = options.wholeLevelPages ?? WHOLE_LEVEL_PAGES;
    if (!Number.isSafeInteger(this.wholeLevelPages) || this.wholeLevelPages < 1) {
      throw new RangeError("wholeLevelPages is at least 1 (the top level is read whole)");
    }
    this.dataset = options.dataset === undefined ? null : datasetOf(options.dataset);
    this.pin = options.pin ?? new DatasetPin();
  }

  /** The value stored under `key`, or null when the table has no such key. */
  async get(key: Uint8Array): Promise<Uint8Array | null> {
    return (await this.getMany([key]))[0]!;
  }

  /** Values in key order, in requests of `requestSizes(keys.length, maxBatchQueries)`. */
  async getMany(keys: readonly Uint8Array[]): Promise<(Uint8Array | null)[]> {
    if (keys.length === 0) return [];
    const bounds = await this.bounds();
    const limit = this.limit(await this.pir.readInfo());
    const out: (Uint8Array | null)[] = [];
    for (const size of requestSizes(keys.length, limit)) {
      const [values] = await this.lookup(keys.slice(out.length, out.length + size), size, bounds);
      out.push(...values);
    }
    return out;
  }

  /** Values in key order and the signed descriptor of the one version they were all proven
   * against (its anchor is the block they reflect). */
  async readAt(keys: readonly Uint8Array[]): Promise<[(Uint8Array | null)[], Descriptor]> {
    const bounds = await this.bounds();
    for (let attempt = 0; attempt < MOVES; attempt++) {
      if (keys.length === 0) return [[], (await this.current(bounds))[0].descriptor];
      const limit = this.limit(await this.pir.readInfo());
      let out: (Uint8Array | null)[] = [];
      let seen: Descriptor | null = null;
      let whole = true;
      for (const size of requestSizes(keys.length, limit)) {
        const [values, desc] = await this.lookup(keys.slice(out.length, out.length + size), size, bounds);
        if (seen !== null && desc.text !== seen.text) {
          whole = false;
          break;
        }
        seen = desc;
        out = out.concat(values);
      }
      if (whole) return [out, seen!];
    }
    throw new TableChangingError(`a new version was published during each of ${MOVES} tries of one batch`);
  }

  /** The signed descriptor of the version in hand (read anew when `refresh`). */
  async descriptor(refresh = false): Promise<Descriptor> {
    const bounds = await this.bounds();
    if (refresh || this.state === null) return (await this.readDescriptor(bounds))[0].descriptor;
    return this.state[0].descriptor;
  }

  // ------------------------------------------------------------------ the logic

  private async bounds(): Promise<Bounds> {
    let version = this.minVersion, block = this.minBlock;
    const o = this.options;
    if (o.trustedVersion || o.trustedBlock) {
      const [v, b] = await Promise.all([o.trustedVersion?.(), o.trustedBlock?.()]);
      version = Math.max(version, Number(v ?? 0));
      block = Math.max(block, Number(b ?? 0));
    }
    return { version, block, maxAge: this.maxAge };
  }

  private async lookup(keys: readonly Uint8Array[], size: number, bounds: Bounds): Promise<[(Uint8Array | null)[], Descriptor]> {
    const asked = [...keys];
    while (asked.length < size) asked.push(randomBytes(PAD_KEY_SIZE));
    let checkedAgain = false;
    for (let attempt = 0; attempt < MOVES; attempt++) {
      const [proof, view] = await this.current(bounds);
      const [wanted, buckets] = plan(proof, asked);
      const info = await this.pir.readInfo();
      const g = proof.descriptor.geometry;
      const base = span(info, this.table)[0];
      const gets = [this.route(info, DATA_TABLE, base, g.dataPages, wanted[0]!)];
      for (let k = 1; k <= proof.private; k++) {
        gets.push(this.route(info, levelTable(k), base + g.levelFirst(k), g.levels[k - 1]!, wanted[k]!));
      }
      let answers: Answer[];
      try {
        answers = await this.getAll(gets);
      } catch (exc) {
        if (!moved(exc)) throw exc;
        this.state = null;
        continue;
      }
      if (!answers.every((a) => same([a.epochId, a.identity], view))) {
        this.state = null;
        continue;
      }
      try {
        // padding pages are checked too: a server that corrupted only them must get the same
        // failure as any other, or it would learn which places were padding
        const values = check(proof, asked, buckets, answers.map((a) => a.pages)).slice(0, keys.length);
        this.lastView = view;
        return [values, proof.descriptor];
      } catch (exc) {
        if (!(exc instanceof KeywordIntegrityError)) throw exc;
        // servers without identities can serve a rebuilt table under the old epoch id; only
        // the descriptor tells. One re-read, the same for any key and any bad page, and the
        // error stands when the descriptor is unchanged.
        if (checkedAgain) throw exc;
        checkedAgain = true;
        let fresh: Proof;
        try {
          [fresh] = await this.readDescriptor(bounds);
        } catch (again) {
          if (again instanceof StaleTableError) throw again;
          // a server that lies about the lookup may lie about the descriptor too: the caller
          // still gets the lookup's one error
          if (again instanceof KeywordIntegrityError) throw exc;
          throw again;
        }
        if (fresh.descriptor.text === proof.descriptor.text) throw exc;
      }
    }
    throw new TableChangingError(`the servers moved to other data at each of ${MOVES} tries of one request`);
  }

  /** The version to plan with: the one kept, while /epoch still names the data it came from
   * and it meets `bounds`; otherwise read anew. */
  private async current(bounds: Bounds): Promise<[Proof, ViewPair]> {
    const state = this.state;
    const info = await this.pir.readInfo();
    if (state !== null) {
      const [proof, view] = state;
      const desc = proof.descriptor;
      if (stale(desc, bounds, this.seenVersion, this.seenBlock) === null
        && span(info, this.table)[1] === desc.geometry.numPages
        && views(info).some((v) => same(v, view))) {
        return state;
      }
    }
    return this.readDescriptor(bounds);
  }

  private async readDescriptor(bounds: Bounds): Promise<[Proof, ViewPair]> {
    for (let attempt = 0; attempt < MOVES; attempt++) {
      const info = await this.pir.readInfo(true);
      const [base, size] = span(info, this.table);
      let answer: Answer;
      try {
        answer = await this.fetch(this.route(info, DESCRIPTOR_TABLE, base + size - 1, 1, [0]));
      } catch (exc) {
        if (moved(exc)) continue;
        throw exc;
      }
      const desc = this.signedDescriptor(answer.pages[0]!, size);
      if (desc.name !== this.table) {
        throw new KeywordIntegrityError(`the servers answered the descriptor of keyword table `
          + `'${desc.name}' for '${this.table}'`);
      }
      this.admit(desc, bounds);
      const view: ViewPair = [answer.epochId, answer.identity];
      const priv = privateLevels(desc, this.wholeLevelPages);
      const wanted = wholePagesWanted(desc, priv);
      const g = desc.geometry, limit = this.limit(info);
      const gets: Get[] = [];
      for (const [k, n] of wanted) {
        for (let at = 0; at < n; at += limit) {
          const pages = Array.from({ length: Math.min(n, at + limit) - at }, (_, i) => at + i);
          gets.push(this.route(info, levelTable(k), base + g.levelFirst(k), n, pages));
        }
      }
      let answers: Answer[];
      try {
        answers = await this.getAll(gets);
      } catch (exc) {
        if (moved(exc)) continue;
        throw exc;
      }
      if (!answers.every((a) => same([a.epochId, a.identity], view))) continue;
      const whole = new Map<number, Uint8Array[]>();
      let i = 0;
      for (const [k, n] of wanted) {
        const pages: Uint8Array[] = [];
        for (let at = 0; at < n; at += limit) pages.push(...answers[i++]!.pages);
        whole.set(k, pages);
      }
      this.state = [proveWhole(desc, priv, whole), view];
      this.lastView = view;
      return this.state;
    }
    throw new TableChangingError(`the servers moved to other data at each of ${MOVES} reads of the table's descriptor`);
  }

  /** Pages of the keyword table's part `name` (`size` pages from matrix page `first`): from
   * the party table of that name when the servers serve it as such, else from the whole
   * matrix. Chosen by what the servers serve, never by the key. */
  private route(info: ServerInfo, name: string, first: number, size: number, pages: number[]): Get {
    const table = partTable(this.table, name);
    const s = served(info, table);
    if (s !== null && s[0] === first && s[1] === size) return { pages, numPages: size, table };
    return { pages: pages.map((p) => first + p), numPages: info.numPages, table: undefined };
  }

  private fetch(get: Get): Promise<Answer> {
    return this.pir.getPinned(get.pages, get.numPages, get.table);
  }

  /** The tables of one lookup asked at once: one round trip, not one a level. */
  private getAll(gets: Get[]): Promise<Answer[]> {
    return Promise.all(gets.map((g) => this.fetch(g)));
  }

  private signedDescriptor(page: Uint8Array, numPages: number): Descriptor {
    if (this.signed !== null && this.signed[0].length === page.length
      && this.signed[0].every((b, i) => b === page[i])) {
      const desc = this.signed[1];
      if (desc.geometry.numPages === numPages) return desc;
    }
    const desc = descriptorOf(page, this.trusted, numPages);
    this.signed = [Uint8Array.from(page), desc];
    return desc;
  }

  private admit(desc: Descriptor, bounds: Bounds): void {
    // before freshness: another build's version numbers say nothing about this one's
    const want = this.dataset ?? this.pin.dataset;
    if (want !== null && !equalBytes(desc.dataset, want)) {
      this.state = null;
      throw new KeywordIntegrityError(`the servers serve keyword table "${desc.name}" of dataset `
        + `${toHex(desc.dataset)}; this client ${this.dataset !== null ? "was given" : "has read"} `
        + `dataset ${toHex(want)}: another table signed with the same key, refused`);
    }
    const why = stale(desc, bounds, this.seenVersion, this.seenBlock);
    if (why !== null) {
      this.state = null;
      throw new StaleTableError(`${why}: refusing it (a restored backup, parties restarted behind `
        + "the owner, both parties serving an old table, or an owner that stopped publishing)");
    }
    if (desc.anchor !== null) {
      // the block of the newest version accepted: a newer version may name a lower block (a
      // reorg to a shorter branch), and reading it again must not be refused as going back
      this.seenBlock = desc.version > this.seenVersion ? desc.anchor.number
        : Math.max(this.seenBlock, desc.anchor.number);
    }
    this.seenVersion = Math.max(this.seenVersion, desc.version);
    this.pin.dataset ??= desc.dataset;
  }

  private limit(info: ServerInfo): number {
    return Math.min(this.pir.maxBatchQueries ?? info.maxBatchQueries, info.maxBatchQueries);
  }
}
