// The two-server page client over HTTP (fetch), with morphogen/client/core.py's rules: what to
// ask, what to believe, when to retry.
//
// A page is returned only when A and B answered from the same epoch and, where both name one,
// the same identity, and that data is one whose page count and key domain the client knows
// from GET /epoch, so that a page past the end of a shrunken snapshot is never mistaken for a
// page of zeros. An answer from other data makes the client re-read /epoch: it is kept when
// both parties now advertise exactly that data in the planned domain and it still holds every
// wanted page; otherwise the pages are asked again with fresh keys. Every reason to retry (a
// 5xx or 429, a dropped connection or a timeout, A and B on different epochs or identities, a
// domain refusal after a rotation) spends from one budget of `RetryPolicy.attempts` per
// request, so a call always ends; each retry sends fresh keys to both parties.

import { randomBelow } from "./bytes.js";
import {
  EPOCH_PATH,
  KEYS_PER_QUERY,
  KEY_FORMAT_V1,
  MAX_BATCH_QUERIES,
  type KeyFormat,
} from "./constants.js";
import {
  type Answer,
  type Encoding,
  type Queries,
  DataMoved,
  EpochMismatchError,
  PirError,
  PirUnavailable,
  ServerInfo,
  Transient,
  View,
  checkPages,
  decodeAnswer,
  encodeRequest,
  failureForStatus,
  infoFromEpoch,
  makeKeys,
  planTargets,
  sameTable,
  xorPages,
} from "./wire.js";

/** `attempts` tries per request, sleeping `backoffS` doubled after each failure (at most
 * `maxBackoffS`, at least a server's Retry-After within that cap), jittered down to half.
 * The defaults are the Python client's: 10.5 to 21 s of sleep in all before giving up, long
 * enough to ride out a replica's death or a publication reaching one party first. While the
 * parties disagree (different epochs, identities or shapes), a backoff reads both /epoch
 * documents every `agreementPollS` and ends once they name the same data, so the read
 * resumes within a poll of the parties agreeing; 0 sleeps every backoff whole. */
export class RetryPolicy {
  constructor(readonly attempts = 14, readonly backoffS = 0.1, readonly maxBackoffS = 2.0,
    readonly agreementPollS = 0.25) {
    if (!(attempts >= 1)) throw new RangeError("attempts must be at least 1");
  }

  delay(attempt: number, hint?: number): number {
    let base = Math.min(this.maxBackoffS, this.backoffS * 2 ** attempt);
    if (hint !== undefined) base = Math.min(this.maxBackoffS, Math.max(base, hint));
    // jitter, so that many clients retrying together do not come back in lockstep
    return base * (0.5 + randomBelow(1000) / 2000);
  }
}

export function giveUp(attempts: number, last: Transient | undefined): PirUnavailable {
  if (last?.kind === "epoch") {
    return new EpochMismatchError(`servers A and B answered from different epochs (${last.message}) `
      + `and still did after ${attempts} attempts: they do not serve the same data; both parties `
      + "must receive the same updates and rotations in the same order");
  }
  if (last?.kind === "identity") {
    return new PirUnavailable(`${last.message}, still after ${attempts} attempts: one party missed `
      + "or reordered an update, or a snapshot was rebuilt under the same epoch id");
  }
  return new PirUnavailable(`gave up after ${attempts} attempts: ${last?.message ?? "no attempt"}`,
    last?.status);
}

/** The reasons to retry that are the parties disagreeing (both answered): they end when both
 * have the same data, which their /epoch documents show. */
const DISAGREEMENT = new Set(["epoch", "identity", "matrix", "moved"]);

/** The tries of one operation, shared by every reason to retry it. */
class Budget {
  private failures = 0;

  constructor(private readonly policy: RetryPolicy, private readonly sleep: (s: number) => Promise<void>,
    private readonly readEpochs: () => Promise<[unknown, unknown]>) {}

  /** One try spent and its backoff waited; while the parties disagree, the wait ends early
   * once both /epoch documents name the same data of an epoch no older than `floor` (the
   * newer of two epochs the answers named), whose info is returned then. */
  async spend(reason: Transient, floor = 0): Promise<ServerInfo | undefined> {
    this.failures += 1;
    if (this.failures >= this.policy.attempts) throw giveUp(this.policy.attempts, reason);
    const delay = this.policy.delay(this.failures - 1, reason.delay);
    const poll = this.policy.agreementPollS;
    if (!(DISAGREEMENT.has(reason.kind) && poll > 0)) {
      await this.sleep(delay);
      return undefined;
    }
    let left = delay;
    while (left > poll) {
      await this.sleep(poll);
      left -= poll;
      let info: ServerInfo;
      try {
        const docs = await this.readEpochs();
        info = infoFromEpoch(docs[0], docs[1]);
      } catch (exc) {
        if (exc instanceof Transient && DISAGREEMENT.has(exc.kind)) continue;
        if (exc instanceof Transient || exc instanceof PirError) break;
        throw exc;
      }
      // a refresh waits only for one shape (kind "matrix"); the rest for one view
      if (reason.kind === "matrix" || (info.views[0].same(info.views[1]) && info.epochId >= floor)) {
        return info;
      }
    }
    await this.sleep(left);
    return undefined;
  }
}

export interface PirClientOptions {
  /** Request bodies: "json" (hex, the reference's) or "msgpack" (raw bytes, smaller). */
  encoding?: Encoding;
  /** Per HTTP request, in seconds. */
  timeoutS?: number;
  retry?: RetryPolicy;
  /** At most this many queries (3 pages each) a request, within the servers' own cap. */
  maxBatchQueries?: number;
  /** "auto": packed keys where both parties list them in /epoch, v1 otherwise. */
  keyFormat?: "auto" | "v1";
  /** The fetch to use (default: the platform's). */
  fetch?: typeof globalThis.fetch;
  /** How to wait between tries (tests replace it). */
  sleep?: (seconds: number) => Promise<void>;
}

/** `url` as a base URL, or an Error naming it: a URL without its scheme or host is a setting
 * to fix, not a failure to retry. */
export function checkServerUrl(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error(`server URL '${url}' is not a URL`);
  }
  if ((parsed.protocol !== "http:" && parsed.protocol !== "https:") || !parsed.hostname) {
    throw new Error(`server URL '${url}' needs http:// or https:// and a host, e.g. http://127.0.0.1:8000/a`);
  }
  return url.replace(/\/+$/, "");
}

function retryAfter(resp: Response): number | undefined {
  const v = resp.headers.get("retry-after");
  if (v === null || v.trim() === "") return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? n : undefined;
}

async function errorFromResponse(resp: Response): Promise<Error> {
  const text = await resp.text().catch(() => "");
  let code: string | undefined;
  let message = text.slice(0, 200);
  try {
    const err = JSON.parse(text).error;
    if (err && typeof err === "object") {
      code = typeof err.code === "string" ? err.code : undefined;
      message = typeof err.message === "string" ? err.message : message;
    }
  } catch {
    // non-JSON error bodies (proxies) are fine
  }
  return failureForStatus(resp.status, code, message, retryAfter(resp));
}

function shapeOrNone(info: ServerInfo, table: string | undefined): [number, number] | null {
  return table === undefined || info.tables.has(table) ? info.shape(table) : null;
}

function sameShape(a: [number, number] | null, b: [number, number] | null): boolean {
  return a !== null && b !== null && a[0] === b[0] && a[1] === b[1];
}

/** Whether a bad_domain refusal is worth a retry with keys for `fresh`: the servers' domain
 * moved since the keys were made (a rotation), or it is the first refusal of this fetch (a
 * router may only now have seen a rotation that /epoch already shows). */
function domainRetry(exc: PirError, used: ServerInfo, fresh: ServerInfo, refusals: number,
  table?: string): boolean {
  const moved = !sameShape(fresh.shape(table), used.shape(table));
  return exc.code === "bad_domain" && (moved || refusals === 1);
}

/** The two-party client. Both parties are asked concurrently; the client keeps the /epoch
 * documents it planned against (`info`) between calls.
 *
 *     const c = new PirClient("http://127.0.0.1:8000/a", "http://127.0.0.1:8000/b");
 *     const page = await c.getPage(42);
 */
export class PirClient {
  readonly urls: readonly [string, string];
  readonly encoding: Encoding;
  readonly timeoutS: number;
  readonly retry: RetryPolicy;
  readonly maxBatchQueries: number | undefined;
  readonly keyFormat: "auto" | "v1";
  /** What both parties advertised when last read (undefined before the first call). */
  info: ServerInfo | undefined;
  private readonly fetchFn: typeof globalThis.fetch;
  private readonly sleep: (s: number) => Promise<void>;

  constructor(serverA: string, serverB: string, options: PirClientOptions = {}) {
    this.urls = [checkServerUrl(serverA), checkServerUrl(serverB)];
    this.encoding = options.encoding ?? "json";
    if (this.encoding !== "json" && this.encoding !== "msgpack") throw new Error("encoding is 'json' or 'msgpack'");
    this.timeoutS = options.timeoutS ?? 30;
    this.retry = options.retry ?? new RetryPolicy();
    this.maxBatchQueries = options.maxBatchQueries;
    this.keyFormat = options.keyFormat ?? "auto";
    if (this.keyFormat !== "auto" && this.keyFormat !== KEY_FORMAT_V1) {
      throw new Error(`keyFormat is 'auto' or 'v1', not '${this.keyFormat}'`);
    }
    this.fetchFn = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.sleep = options.sleep ?? ((s) => new Promise((ok) => setTimeout(ok, s * 1000)));
  }

  pagesPerRequest(info: ServerInfo): number {
    return Math.min(this.maxBatchQueries ?? MAX_BATCH_QUERIES, info.maxBatchQueries) * KEYS_PER_QUERY;
  }

  // ------------------------------------------------------------------ operations

  /** Both servers' GET /epoch as one ServerInfo, cached; `refresh` reads it again. */
  async readInfo(refresh = false): Promise<ServerInfo> {
    if (this.info !== undefined && !refresh) return this.info;
    return this.refresh(new Budget(this.retry, this.sleep, () => this.readEpochs()));
  }

  /** `readInfo`, making sure it advertises `table` (looked for once more in a fresh /epoch,
   * then refused with UnknownTable). */
  async readTable(table?: string): Promise<ServerInfo> {
    let info = await this.readInfo();
    if (table !== undefined && !info.tables.has(table)) {
      info = await this.readInfo(true);
      info.shape(table);
    }
    return info;
  }

  /** The wanted pages (of `table`, numbered within it), in order, 4096 bytes each; several
   * requests when they do not fit in one. */
  async get(pages: readonly number[], table?: string): Promise<Uint8Array[]> {
    if (pages.length === 0) return [];
    const info = await this.readTable(table);
    // checked against the cached info before anything is sent: refreshing first would tell
    // the servers that the client wants a page past the end it knew
    const wanted = checkPages(pages, info.shape(table)[0]);
    const out: Uint8Array[] = [];
    while (out.length < wanted.length) {
      const step = this.pagesPerRequest(this.info!);
      const got = await this.fetchPages(wanted.slice(out.length, out.length + step), false, table);
      out.push(...got.pages);
    }
    return out;
  }

  async getPage(page: number, table?: string): Promise<Uint8Array> {
    return (await this.get([page], table))[0]!;
  }

  /** [epochId, pages] of one request: every page from the same data. */
  async getWithEpoch(pages: readonly number[], table?: string): Promise<[number, Uint8Array[]]> {
    const got = await this.oneRequest(pages, table, false);
    return [got.epochId, got.pages];
  }

  /** One request's pages with the epoch and identity they are from, only from data /epoch
   * named when the keys were planned: DataMoved otherwise, nothing re-sent. For callers whose
   * page numbers mean something only in one table (a keyword table's candidates).
   * `numPages`, the size the caller planned for, raises DataMoved before anything is sent
   * when the cached /epoch names another. */
  async getPinned(pages: readonly number[], numPages?: number, table?: string): Promise<Answer> {
    return this.oneRequest(pages, table, true, numPages);
  }

  private async oneRequest(pages: readonly number[], table: string | undefined, pinned: boolean,
    numPages?: number): Promise<Answer> {
    if (pages.length === 0) throw new Error("no pages asked");
    const info = await this.readTable(table);
    const size = info.shape(table)[0];
    if (numPages !== undefined && size !== numPages) {
      const what = table === undefined ? "pages" : `pages in table '${table}'`;
      throw new DataMoved(`the servers serve ${size} ${what}, not ${numPages}`);
    }
    const wanted = checkPages(pages, size);
    const cap = this.pagesPerRequest(info);
    if (wanted.length > cap) throw new RangeError(`one request takes at most ${cap} pages`);
    return this.fetchPages(wanted, pinned, table);
  }

  // ------------------------------------------------------------------ steps

  private async refresh(budget: Budget): Promise<ServerInfo> {
    for (;;) {
      try {
        const docs = await this.readEpochs();
        this.info = infoFromEpoch(docs[0], docs[1]);
        return this.info;
      } catch (exc) {
        if (!(exc instanceof Transient)) throw exc;
        const agreed = await budget.spend(exc);
        if (agreed !== undefined) {
          this.info = agreed;
          return agreed;
        }
      }
    }
  }

  /** The info to plan the next try with: what both parties were just seen to agree on (kept
   * as the client's), else the cached one. A pinned read keeps planning with the cached one:
   * data it was not planned for must end it in `DataMoved`, not answer it. */
  private agreed(info: ServerInfo | undefined, pinned = false): ServerInfo {
    if (info !== undefined && !pinned) this.info = info;
    return this.info!;
  }

  /** One request's worth of pages (of `table`), verified; re-planned across rotations unless
   * `pinned`. */
  private async fetchPages(wanted: number[], pinned: boolean, table?: string): Promise<Answer> {
    const budget = new Budget(this.retry, this.sleep, () => this.readEpochs());
    let refusals = 0;
    let info = this.info!;
    for (;;) {
      const [size, domain] = info.shape(table);
      const fmt: KeyFormat = info.keyFormat(this.keyFormat);
      const [qa, qb] = makeKeys(planTargets(wanted, size), domain, fmt);
      let a: Answer, b: Answer;
      try {
        [a, b] = await this.both((url, i) => this.post(url, i === 0 ? qa : qb, table));
      } catch (exc) {
        if (exc instanceof Transient) {
          await budget.spend(exc);
          info = this.info!;
          continue;
        }
        if (!(exc instanceof PirError)) throw exc;
        if (exc.code === "bad_key" && fmt !== KEY_FORMAT_V1) {
          // a party that stopped taking packed keys: re-read /epoch once; refused again under
          // the same formats, raise
          refusals += 1;
          const fresh = await this.refresh(budget);
          if (fresh.keyFormat(this.keyFormat) === fmt || refusals > 1) throw exc;
          info = fresh;
          continue;
        }
        if (exc.code !== "bad_domain") throw exc;
        refusals += 1;
        const fresh = await this.refresh(budget);
        if (pinned && !sameShape(shapeOrNone(fresh, table), [size, domain])) {
          throw new DataMoved(`the servers now serve ${JSON.stringify(shapeOrNone(fresh, table))} (pages, domain)`);
        }
        if (!domainRetry(exc, info, fresh, refusals, table)) throw exc;
        await budget.spend(new Transient("the servers' key domain changed (rotation)"));
        info = this.info!;
        continue;
      }
      if (a.epochId !== b.epochId) {
        info = this.agreed(await budget.spend(new Transient(`epochs differ (A ${a.epochId}, B ${b.epochId})`,
          undefined, "epoch"), Math.max(a.epochId, b.epochId)), pinned);
        continue;
      }
      if (a.identity !== null && b.identity !== null && a.identity !== b.identity) {
        info = this.agreed(await budget.spend(new Transient(`the parties serve different data under epoch `
          + `${a.epochId} (A ${a.identity}, B ${b.identity})`, undefined, "identity"), a.epochId), pinned);
        continue;
      }
      const view = new View(a.epochId, b.identity !== null ? a.identity : null);
      if (!info.names(view)) {
        // computed on data the keys were not planned for: its page count is unknown until
        // /epoch names it (a page past the end of a smaller snapshot XORs to zeros)
        const fresh = await this.refresh(budget);
        if (pinned) throw new DataMoved(`answered from ${view}, not from data planned for`);
        const [freshSize, freshDomain] = fresh.shape(table);
        checkPages(wanted, freshSize);
        if (!(fresh.isExactly(view) && freshDomain === domain
          && (table === undefined || sameTable(fresh.tables.get(table), info.tables.get(table))))) {
          const agreed = await budget.spend(new Transient(`answered from ${view}, now /epoch names A `
            + `${fresh.views[0]}, B ${fresh.views[1]}`, undefined, "moved"), view.epochId);
          info = agreed === undefined ? fresh : this.agreed(agreed);
          continue;
        }
      }
      return { epochId: view.epochId, identity: view.identity, pages: xorPages(a.pages, b.pages).slice(0, wanted.length) };
    }
  }

  /** Both parties' GET /epoch documents, (A's, B's). */
  private readEpochs(): Promise<[unknown, unknown]> {
    return this.both((url) => this.getEpoch(url));
  }

  /** Both calls in flight at once; A's failure is reported before B's. */
  private async both<T>(call: (url: string, index: number) => Promise<T>): Promise<[T, T]> {
    const [ra, rb] = await Promise.allSettled([call(this.urls[0], 0), call(this.urls[1], 1)]);
    if (ra.status === "rejected") throw ra.reason;
    if (rb.status === "rejected") throw rb.reason;
    return [ra.value, rb.value];
  }

  private async request(url: string, init: RequestInit): Promise<Response> {
    try {
      return await this.fetchFn(url, { ...init, signal: AbortSignal.timeout(this.timeoutS * 1000) });
    } catch (exc) {
      // fetch rejects only for what never became an HTTP answer: refused, reset, timed out
      const why = (exc as Error)?.name === "TimeoutError" ? "timed out" : (exc as Error)?.name ?? "error";
      throw new Transient(`cannot reach ${url} (${why})`);
    }
  }

  private async getEpoch(base: string): Promise<unknown> {
    const resp = await this.request(base + EPOCH_PATH, { method: "GET", headers: { Accept: "application/json" } });
    if (resp.status !== 200) throw await errorFromResponse(resp);
    try {
      return await resp.json();
    } catch {
      throw new PirError("malformed /epoch document: not JSON");
    }
  }

  private async post(base: string, queries: Queries, table?: string): Promise<Answer> {
    const req = encodeRequest(queries, this.encoding, table);
    const resp = await this.request(base + req.path, { method: "POST", body: req.body, headers: req.headers });
    if (resp.status !== 200) throw await errorFromResponse(resp);
    let body: Uint8Array;
    try {
      body = new Uint8Array(await resp.arrayBuffer());
    } catch {
      throw new Transient(`the answer from ${base} broke off`);
    }
    return decodeAnswer(body, resp.headers.get("content-type"), queries.length);
  }
}
