// Ethereum state read privately (morphogen/wallet/state.py and versions.py): accounts,
// storage words and code, each proven against the owner's signed root and held to one block.
//
// The three tables of a followed chain ("accounts", "storage", "code", joined in one matrix)
// are read through one page client with one KeywordClient each. A read that needs two tables
// (code: the account, then its chunks) takes both from one version, or reads again: a
// publication between the two would otherwise pair an account of one block with code of
// another. Every read answers with the block it reflects (`Served`).
//
// What the parties see does not depend on the address, the slot or the contract, and is what
// they see from the Python endpoint for the same question (tests/vectors/chain_tables.json
// holds both's shapes):
// - a balance or a nonce is one accounts lookup, or none where the account was read at the
//   version both parties still serve (two GET /epoch, which name no key);
// - a storage word is one storage lookup;
// - code is one accounts lookup, then always CODE_READ_CHUNKS code lookups in one request,
//   the chunks of the account's code hash (an account without code asks for chunks of the
//   empty code's hash, which no table holds). Only code past EIP-170's 24,576 bytes costs a
//   further request.

import { equalBytes, toHex } from "../bytes.js";
import type { PirClient } from "../client.js";
import type { ServerInfo } from "../wire.js";
import { DatasetPin, KeywordClient, TableChangingError } from "../keyword/client.js";
import { type Descriptor, KeywordIntegrityError, publicKeyOf } from "../keyword/descriptor.js";
import {
  ADDRESS_SIZE,
  type Account,
  EMPTY_CODE_HASH,
  STORAGE_KEY_SIZE,
  WORD_SIZE,
  addressBytes,
  codeChunks,
  codeKey,
  codeLength,
  decodeAccount,
  decodeStorageValue,
  joinCode,
  storageKey,
  wordBytes,
} from "./records.js";

export const CHAIN_TABLES = ["accounts", "storage", "code"] as const;
export type ChainTable = (typeof CHAIN_TABLES)[number];
// EIP-170's code size cap over the code table's 1,020-byte chunks
export const MAX_DEPLOYED_CODE = 24_576;
export const CODE_READ_CHUNKS = codeChunks(MAX_DEPLOYED_CODE);
// reads of two tables that find a new version between them: read again this many times
const TRIES = 4;
const VIEWS_KEPT = 8;
const ACCOUNTS_KEPT = 256;

type ViewPair = readonly [number, string | null];
type Clients = Record<ChainTable, KeywordClient>;

/** The block a read reflects, as the owner signed it, and the owner's version. */
export interface Served {
  chainId: number;
  number: number;
  hash: string; // 0x-hex, as the node names it
  version: number;
  time: number; // when the owner made the version, Unix seconds
}

export function servedOf(desc: Descriptor): Served {
  const a = desc.anchor;
  if (a === null) {
    throw new KeywordIntegrityError(`keyword table '${desc.name}' names no block: it is not a `
      + "chain's table (build it with morphogen chain build)");
  }
  return { chainId: a.chainId, number: a.number, hash: a.hash, version: desc.version, time: desc.time };
}

function sameVersion(a: Descriptor, b: Descriptor): boolean {
  const x = a.anchor, y = b.anchor;
  return a.version === b.version && (x === y || (x !== null && y !== null
    && x.chainId === y.chainId && x.number === y.number && x.hash === y.hash));
}

function versionKey(s: Served): string {
  return `${s.version}:${s.hash}`;
}

export interface EthStateOptions {
  /** Refuse versions the owner made more than this many seconds ago. */
  maxAge?: number;
  /** Refuse versions that reflect a block below this one. */
  minBlock?: number;
  /** Tree levels of at most this many pages are read whole once per version. */
  wholeLevelPages?: number;
  /** The chain trusted: every version must be anchored on it. Without it, the first version
   * accepted pins its chain id. */
  chainId?: number;
}

/** Private, verified reads of a chain's state at the block two parties serve, checked
 * against the data owner's Ed25519 public key (32 bytes or 64 hex digits). Reads may run at
 * once: each borrows a set of clients no other read is using, and all are bound below by the
 * newest version any has accepted, so no answer goes back to an older version once another
 * has shown a newer one. Blocks are not such a bound: after a reorg to a shorter branch the
 * owner's newer version names a lower block, and that is the chain. */
export class EthState {
  readonly trusted: Uint8Array;
  /** The newest version any read accepted, and the block it names. */
  latest: Served | null = null;
  seenVersion = 0;
  private readonly free: Clients[] = [];
  // (version, block hash) -> the parties' (epoch id, identity) its reads were proven under
  private readonly views = new Map<string, ViewPair>();
  private readonly left = new Set<string>(); // views a read of /epoch showed the parties left
  // accounts read at one version, answered again without a lookup while it is still served
  private known: { key: string; accounts: Map<string, Account | null> } | null = null;
  private epochs: Promise<ServerInfo> | null = null;
  // every client of a table, whichever read made it, holds to the one build of it first read
  private readonly datasets: Record<ChainTable, DatasetPin> = {
    accounts: new DatasetPin(), storage: new DatasetPin(), code: new DatasetPin(),
  };
  private chainId: number | null;

  constructor(readonly pir: PirClient, publicKey: Uint8Array | string, readonly options: EthStateOptions = {}) {
    this.trusted = publicKeyOf(publicKey);
    if (options.maxAge !== undefined && !(options.maxAge > 0)) throw new RangeError("maxAge is a number of seconds above 0");
    if (options.chainId !== undefined && !(Number.isSafeInteger(options.chainId) && options.chainId >= 1)) {
      throw new RangeError("chainId is a chain id (an integer, 1 or more)");
    }
    this.chainId = options.chainId ?? null;
    this.free.push(this.newClients()); // a bad option fails here, not at the first read
  }

  // ------------------------------------------------------------------ reads

  /** The accounts (null: none at that address) and the block they reflect. */
  async accounts(addresses: readonly (Uint8Array | string)[]): Promise<[(Account | null)[], Served]> {
    const keys = addresses.map(addressBytes);
    const [values, desc, view] = await this.with((c) => this.readAt(c.accounts, keys));
    const out = values.map((v) => (v === null ? null : decodeAccount(v)));
    const served = this.accepted(desc, view);
    if (this.latest !== null && versionKey(served) === versionKey(this.latest)) {
      const cache = this.cache(served);
      keys.forEach((k, i) => cache.set(toHex(k), out[i]!));
      while (cache.size > ACCOUNTS_KEPT) cache.delete(cache.keys().next().value!);
    }
    return [out, served];
  }

  /** The account as read at the block served now, where both parties still serve that data
   * (two GET /epoch, no lookup); null otherwise. */
  async cachedAccount(address: Uint8Array | string): Promise<[Account | null, Served] | null> {
    const latest = this.latest;
    const key = toHex(addressBytes(address));
    if (latest === null || this.known?.key !== versionKey(latest) || !this.known.accounts.has(key)) return null;
    const account = this.known.accounts.get(key)!;
    return (await this.stillServed(latest)) ? [account, latest] : null;
  }

  /** The words of (address, slot) pairs (zero where the slot holds none). */
  async storage(pairs: readonly (readonly [Uint8Array | string, bigint | number | Uint8Array | string])[]): Promise<[bigint[], Served]> {
    const keys = pairs.map(([a, s]) => storageKey(a, s));
    const [values, desc, view] = await this.with((c) => this.readAt(c.storage, keys));
    return [values.map(decodeStorageValue), this.accepted(desc, view)];
  }

  /** The account's code (empty for none), checked against its code hash. */
  async code(address: Uint8Array | string): Promise<[Uint8Array, Served]> {
    const key = addressBytes(address);
    return this.with(async (c) => {
      for (let i = 0; i < TRIES; i++) {
        const [[value], desc] = await this.readAt(c.accounts, [key]);
        const codeHash = value === null || value === undefined ? EMPTY_CODE_HASH : decodeAccount(value).codeHash;
        const [chunks, codeDesc] = await this.chunks(c.code, codeHash);
        if (sameVersion(desc, codeDesc)) return [joined(codeHash, chunks), this.accepted(desc)];
      }
      throw new TableChangingError(`a new version was published between the account and its code at each of ${TRIES} tries`);
    });
  }

  async getBalance(address: Uint8Array | string): Promise<bigint> {
    return (await this.account(address))[0]?.balance ?? 0n;
  }

  async getTransactionCount(address: Uint8Array | string): Promise<bigint> {
    return (await this.account(address))[0]?.nonce ?? 0n;
  }

  /** The 32-byte word at `slot` of `address`'s storage. */
  async getStorageAt(address: Uint8Array | string, slot: bigint | number | Uint8Array | string): Promise<Uint8Array> {
    const [[word]] = await this.storage([[address, slot]]);
    return wordBytes(word!);
  }

  async getCode(address: Uint8Array | string): Promise<Uint8Array> {
    return (await this.code(address))[0];
  }

  /** An account for a balance or a nonce: as read already at the block still served, else
   * one lookup. */
  async account(address: Uint8Array | string): Promise<[Account | null, Served]> {
    const found = await this.cachedAccount(address);
    if (found !== null) return found;
    const [[account], served] = await this.accounts([address]);
    return [account!, served];
  }

  /** One round of a call's reads (`PrivateCalls`, src/eth/call.ts), in the Python endpoint's
   * shape (morphogen/wallet/state.py `read_round`): the accounts and the storage words asked,
   * each table's lookups padded with random keys to the next of CALL_BUCKETS, and, where it
   * asks any, the code of the code hashes given (CODE_READ_CHUNKS chunks each, their count
   * padded to a power of two). Every answer is from one version; null where the tables
   * answered from different ones (a publication mid-round: read the head, then again). */
  async round(accounts: readonly Uint8Array[], words: readonly (readonly [Uint8Array, Uint8Array])[],
    codeHashes: readonly Uint8Array[]): Promise<RoundRead | null> {
    const accountKeys = padded(accounts.map(addressBytes), bucket(accounts.length), ADDRESS_SIZE);
    const wordKeys = padded(words.map(([a, s]) => storageKey(a, s)), bucket(words.length), STORAGE_KEY_SIZE);
    const hashes = padded([...codeHashes], codeBucket(codeHashes.length), WORD_SIZE);
    return this.with(async (c) => {
      const [acc, sto, code] = await Promise.all([
        this.readAt(c.accounts, accountKeys),
        this.readAt(c.storage, wordKeys),
        codeHashes.length > 0 ? this.chunksOf(c.code, hashes) : Promise.resolve(null),
      ]);
      const descs = [acc[1], sto[1], ...(code === null ? [] : [code[1]])];
      if (!descs.every((d) => sameVersion(descs[0]!, d))) return null;
      const served = this.accepted(acc[1], acc[2] !== null && acc[2][0] === sto[2]?.[0] && acc[2][1] === sto[2]?.[1] ? acc[2] : null);
      return {
        served,
        accounts: acc[0].slice(0, accounts.length).map((v) => (v === null ? null : decodeAccount(v))),
        words: sto[0].slice(0, words.length).map(decodeStorageValue),
        codes: codeHashes.map((h, k) => joined(h, code![0][k]!)),
      };
    });
  }

  // ------------------------------------------------------------------ versions

  /** The block the parties serve now (the accounts table's signed descriptor, read again). */
  async head(): Promise<Served> {
    return this.with(async (c) => {
      const desc = await c.accounts.descriptor(true);
      return this.accepted(desc, c.accounts.lastView);
    });
  }

  /** The block the parties serve now: the newest version read here where both parties
   * still serve its data, else the head read again. */
  async current(): Promise<Served> {
    const latest = this.latest;
    if (latest !== null && await this.stillServed(latest)) return latest;
    return this.head();
  }

  /** Every table's descriptor read again, at once. */
  async refresh(): Promise<void> {
    await this.with(async (c) => {
      const descs = await Promise.all(CHAIN_TABLES.map((t) => c[t].descriptor(true)));
      for (const d of descs) this.accepted(d);
    });
  }

  /** Whether both parties serve now exactly the data `served`'s reads were proven under,
   * within the freshness bound: two GET /epoch, which name no key. False where that is not
   * known (a version read with no identity: epoch ids alone may name rebuilt data). */
  async stillServed(served: Served): Promise<boolean> {
    const key = versionKey(served);
    const view = this.views.get(key);
    if (view === undefined || view[1] === null || this.left.has(viewKey(view))) return false;
    if (this.options.maxAge !== undefined && Date.now() / 1000 - served.time > this.options.maxAge) return false;
    let now: boolean[];
    try {
      now = await this.readViews(view);
    } catch {
      return false; // the read that follows says what is wrong
    }
    if (now.every(Boolean)) return true;
    // a party names other data: its epoch id only grows, so it never serves this view again
    this.left.add(viewKey(view));
    trim(this.left, VIEWS_KEPT);
    return false;
  }

  // ------------------------------------------------------------------ the logic

  private newClients(): Clients {
    const o = this.options;
    const make = (table: ChainTable) => new KeywordClient(this.pir, this.trusted, {
      table, trustedVersion: () => this.seenVersion, minBlock: o.minBlock,
      maxAge: o.maxAge, wholeLevelPages: o.wholeLevelPages, pin: this.datasets[table],
    });
    return { accounts: make("accounts"), storage: make("storage"), code: make("code") };
  }

  private async with<T>(read: (c: Clients) => Promise<T>): Promise<T> {
    const mine = this.free.pop() ?? this.newClients();
    try {
      return await read(mine);
    } finally {
      this.free.push(mine);
    }
  }

  private async readAt(client: KeywordClient, keys: Uint8Array[]): Promise<[(Uint8Array | null)[], Descriptor, ViewPair | null]> {
    const [values, desc] = await client.readAt(keys);
    return [values, desc, client.lastView];
  }

  /** The chunks of a code hash: CODE_READ_CHUNKS in one read, then the rest of code past
   * EIP-170 in one more (a new version between the two: the second's descriptor, and the
   * caller reads again). */
  private async chunks(code: KeywordClient, codeHash: Uint8Array): Promise<[(Uint8Array | null)[], Descriptor]> {
    const n = CODE_READ_CHUNKS;
    const [values, desc] = await code.readAt(Array.from({ length: n }, (_, i) => codeKey(codeHash, i)));
    const need = values[0] ? codeChunks(codeLength(values[0])) : 0;
    if (need <= n) return [values, desc];
    const [more, moreDesc] = await code.readAt(Array.from({ length: need - n }, (_, i) => codeKey(codeHash, n + i)));
    return sameVersion(desc, moreDesc) ? [values.concat(more), desc] : [values, moreDesc];
  }

  /** The chunks of each code hash: CODE_READ_CHUNKS each in one read, then the rest of any
   * code past EIP-170 in one more (a new version between the two: the second's descriptor). */
  private async chunksOf(code: KeywordClient, hashes: readonly Uint8Array[]): Promise<[(Uint8Array | null)[][], Descriptor]> {
    const n = CODE_READ_CHUNKS;
    const [values, desc] = await code.readAt(hashes.flatMap((h) => Array.from({ length: n }, (_, i) => codeKey(h, i))));
    const out = hashes.map((_, k) => values.slice(k * n, (k + 1) * n));
    const longer = out.map((v, k) => [k, v[0] ? codeChunks(codeLength(v[0])) : 0] as const).filter(([, need]) => need > n);
    if (longer.length === 0) return [out, desc];
    const [more, moreDesc] = await code.readAt(longer.flatMap(([k, need]) =>
      Array.from({ length: need - n }, (_, i) => codeKey(hashes[k]!, n + i))));
    let at = 0;
    for (const [k, need] of longer) {
      out[k] = out[k]!.concat(more.slice(at, at + need - n));
      at += need - n;
    }
    return [out, sameVersion(desc, moreDesc) ? desc : moreDesc];
  }

  private accepted(desc: Descriptor, view: ViewPair | null = null): Served {
    const served = servedOf(desc);
    // one key may sign several chains' tables: a version of another chain is no answer here,
    // whatever its version number
    if (this.chainId !== null && served.chainId !== this.chainId) {
      throw new KeywordIntegrityError(`the servers serve chain ${served.chainId} (keyword table `
        + `"${desc.name}", version ${desc.version}); this client `
        + `${this.options.chainId !== undefined ? "was given" : "has read"} chain ${this.chainId}: `
        + "tables of another chain signed with the same key, refused");
    }
    this.chainId = served.chainId;
    this.seenVersion = Math.max(this.seenVersion, served.version);
    if (this.latest === null || served.version >= this.latest.version) this.latest = served;
    if (view !== null) {
      const key = versionKey(served);
      this.views.delete(key);
      this.views.set(key, view);
      trim(this.views, VIEWS_KEPT);
    }
    return served;
  }

  private cache(served: Served): Map<string, Account | null> {
    const key = versionKey(served);
    if (this.known?.key !== key) this.known = { key, accounts: new Map() };
    return this.known.accounts;
  }

  /** Whether each party's /epoch names `view` now: one read shared by the reads waiting. */
  private async readViews(view: ViewPair): Promise<boolean[]> {
    if (this.epochs === null) {
      const clear = () => { this.epochs = null; };
      this.epochs = this.pir.readInfo(true);
      this.epochs.then(clear, clear);
    }
    const info = await this.epochs;
    return [0, 1].map((i) => info.epochIds[i] === view[0] && info.identities[i] === view[1]);
  }
}

/** A round's answers (`EthState.round`), in the order asked, and the block they reflect. */
export interface RoundRead {
  served: Served;
  accounts: (Account | null)[];
  words: bigint[];
  codes: Uint8Array[];
}

// a round's lookups of one table are padded to the next of these (morphogen/wallet/state.py)
export const CALL_BUCKETS = [4, 8, 16, 32, 64, 128, 256, 512, 1024] as const;

export function bucket(n: number): number {
  for (const b of CALL_BUCKETS) if (n <= b) return b;
  const top = 1024; // the last of CALL_BUCKETS
  return Math.ceil(n / top) * top;
}

/** The padded count of `n` code hashes in one round: a power of two, at least 1. */
export function codeBucket(n: number): number {
  let b = 1;
  while (b < n) b *= 2;
  return b;
}

function padded(keys: Uint8Array[], size: number, width: number): Uint8Array[] {
  const out = [...keys];
  while (out.length < size) out.push(globalThis.crypto.getRandomValues(new Uint8Array(width)));
  return out;
}

function viewKey(view: ViewPair): string {
  return `${view[0]}:${view[1]}`;
}

function trim<K>(kept: Map<K, unknown> | Set<K>, most: number): void {
  while (kept.size > most) kept.delete(kept.keys().next().value!);
}

function joined(codeHash: Uint8Array, values: readonly (Uint8Array | null)[]): Uint8Array {
  if (equalBytes(codeHash, EMPTY_CODE_HASH)) return new Uint8Array();
  if (values[0] === null || values[0] === undefined) {
    throw new KeywordIntegrityError("the account names code that the code table lacks");
  }
  const need = codeChunks(codeLength(values[0]));
  const chunks = values.slice(0, need);
  if (chunks.length < need || chunks.some((c) => c === null) || values.slice(need).some((v) => v !== null)) {
    throw new KeywordIntegrityError("the code table's chunks of a code hash do not match the length they state");
  }
  try {
    return joinCode(codeHash, chunks as Uint8Array[]);
  } catch (exc) {
    throw new KeywordIntegrityError(`code read from the table: ${(exc as Error).message}`);
  }
}
