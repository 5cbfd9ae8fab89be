// An in-process party for the client's tests: it answers GET /epoch and the query routes as
// PROTOCOL.md says, scanning small synthetic pages with the keys it is sent, and can be told
// to misbehave (another epoch, another identity, an HTTP error, a dropped connection).

import { decode, encode } from "@msgpack/msgpack";

import { fromHex, to0xHex } from "../src/bytes.js";
import { KEYS_PER_QUERY, PAGE_SIZE, keyLength } from "../src/constants.js";
import { DpfKey } from "../src/dpf.js";
import { PackedKey } from "../src/packed.js";

export function syntheticPage(i: number, salt = 0): Uint8Array {
  return Uint8Array.from({ length: PAGE_SIZE }, (_, j) => (31 * i + 7 * j + salt) & 0xff);
}

export interface Fault {
  status?: number;
  code?: string;
  retryAfter?: string;
  drop?: boolean;
}

export class FakeParty {
  epochId = 1;
  identity: string | null = "0x" + "ab".repeat(16);
  /** the epoch and identity answers claim, when not the advertised ones */
  answerEpoch: number | undefined;
  answerIdentity: string | null | undefined;
  keyFormats: string[] = ["v1"];
  tables: Record<string, { first_page: number; num_pages: number; domain_bits: number }> = {};
  faults: Fault[] = [];
  /** a lying party: flips a bit of every page it answers */
  lie = false;
  epochReads = 0;
  posts: { path: string; contentType: string; body: unknown }[] = [];

  constructor(public pages: Uint8Array[], public domainBits: number) {}

  epochDoc(): unknown {
    return {
      epoch_id: this.epochId,
      identity: this.identity,
      num_rows: this.pages.length,
      seeds: [1, 2, 3],
      block_number: 0,
      state_root: "0x" + "00".repeat(32),
      page_pir: {
        domain_bits: this.domainBits, num_pages: this.pages.length, rows_per_page: 1,
        key_formats: this.keyFormats,
      },
      tables: this.tables,
    };
  }

  private scan(key: Uint8Array, table?: string): Uint8Array {
    const first = table === undefined ? 0 : this.tables[table]!.first_page;
    const count = table === undefined ? this.pages.length : this.tables[table]!.num_pages;
    const acc = new Uint8Array(PAGE_SIZE);
    const v1 = key.length === keyLength(key[18]!);
    const k = v1 ? DpfKey.fromBytes(key) : PackedKey.fromBytes(key);
    for (let p = 0; p < count; p++) {
      const page = this.pages[first + p]!;
      if (v1) {
        const m = (k as DpfKey).eval(p);
        for (let j = 0; j < PAGE_SIZE; j++) acc[j]! ^= page[j]! & m[j % 16]!;
      } else if ((k as PackedKey).eval(p)) {
        for (let j = 0; j < PAGE_SIZE; j++) acc[j]! ^= page[j]!;
      }
    }
    return acc;
  }

  private error(status: number, code: string, message: string, headers: Record<string, string> = {}): Response {
    return new Response(JSON.stringify({ error: { code, message } }), {
      status, headers: { "content-type": "application/json", ...headers },
    });
  }

  async handle(path: string, init: RequestInit): Promise<Response> {
    const fault = this.faults.shift();
    if (fault?.drop) throw new TypeError("fetch failed");
    if (fault?.status) {
      return this.error(fault.status, fault.code ?? "unavailable", "told to fail",
        fault.retryAfter ? { "retry-after": fault.retryAfter } : {});
    }
    if (path === "/epoch") {
      this.epochReads += 1;
      return Response.json(this.epochDoc());
    }
    const headers = new Headers(init.headers);
    const ct = headers.get("content-type") ?? "";
    const raw = init.body as Uint8Array;
    const msgpack = ct === "application/msgpack";
    const body = (msgpack ? decode(raw) : JSON.parse(new TextDecoder().decode(raw))) as Record<string, unknown>;
    this.posts.push({ path, contentType: ct, body });
    const batch = path === "/query/page/gpu/batch";
    const queries = (batch ? (body.queries as { keys: unknown[] }[]).map((q) => q.keys) : [body.keys as unknown[]]);
    const table = body.table as string | undefined;
    const domain = table === undefined ? this.domainBits : this.tables[table]!.domain_bits;
    const results: Uint8Array[][] = [];
    for (const keys of queries) {
      if (keys.length !== KEYS_PER_QUERY) return this.error(400, "bad_key_count", "three keys a query");
      const raws = keys.map((k) => (typeof k === "string" ? fromHex(k) : (k as Uint8Array)));
      if (raws.some((k) => k[18] !== domain)) return this.error(400, "bad_domain", "wrong domain");
      if (raws.some((k) => k.length !== keyLength(domain) && !this.keyFormats.includes("packed"))) {
        return this.error(400, "bad_key", "this server does not take packed keys");
      }
      results.push(raws.map((k) => this.scan(k, table)));
    }
    if (this.lie) for (const r of results) for (const acc of r) acc[0]! ^= 1;
    const out: Record<string, unknown> = { epoch_id: this.answerEpoch ?? this.epochId };
    const identity = this.answerIdentity === undefined ? this.identity : this.answerIdentity;
    if (identity !== null) out.identity = identity;
    const page = (p: Uint8Array) => (msgpack ? p : to0xHex(p));
    if (batch) out.results = results.map((r) => ({ pages: r.map(page) }));
    else out.pages = results[0]!.map(page);
    if (msgpack) {
      return new Response(encode(out), { status: 200, headers: { "content-type": "application/msgpack" } });
    }
    return Response.json(out);
  }
}

/** The domain bits a party gives `numPages` pages (morphogen/snapshot/layout.py). */
export function domainBitsFor(numPages: number): number {
  return Math.max(1, Math.ceil(Math.log2(numPages)));
}

/** A fetch that routes http://a/... to `a` and http://b/... to `b`. */
export function fakeFetch(a: FakeParty, b: FakeParty): typeof globalThis.fetch {
  return (async (input: string | URL | Request, init: RequestInit = {}) => {
    const url = new URL(String(input));
    const party = url.host === "a" ? a : b;
    return party.handle(url.pathname, init);
  }) as typeof globalThis.fetch;
}
