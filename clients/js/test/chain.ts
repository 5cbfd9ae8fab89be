// The vector chain (tests/vectors/chain_tables.json) served by two in-process fake parties
// that scan for real: what the provider tests read through a dapp library.

import type { Address } from "viem";

import { fromHex } from "../src/bytes.js";
import { PAGE_SIZE } from "../src/constants.js";
import { EthState, PirClient, PrivateProvider } from "../src/index.js";
import { PrivateCalls } from "../src/eth/call.js";
import { FakeParty, domainBitsFor, fakeFetch } from "./fake.js";
import { readVectors } from "./vectors.js";

export interface Chain {
  public_key: string;
  num_pages: number;
  pages: Record<string, string>;
  tables: { name: string; first_page: number; num_pages: number }[];
  accounts: { address: Address; nonce: string; balance: string; code_hash: string; storage: Record<string, string> }[];
  rpc: { method: string; params: unknown[]; result?: string }[];
}
export const CHAIN = readVectors<Chain>("chain_tables.json");

/** A provider over both parties (packed keys, named tables); `liar` is party B. With
 * `calls`, eth_call and eth_estimateGas run privately in the JavaScript EVM. */
export function chainProvider(encoding: "json" | "msgpack", calls = false): { provider: PrivateProvider; liar: FakeParty; parties: readonly [FakeParty, FakeParty] } {
  const pages = Array.from({ length: CHAIN.num_pages }, () => new Uint8Array(PAGE_SIZE));
  for (const [i, h] of Object.entries(CHAIN.pages)) pages[Number(i)]!.set(fromHex(h));
  const parties = [new FakeParty(pages, domainBitsFor(pages.length)), new FakeParty(pages, domainBitsFor(pages.length))] as const;
  for (const p of parties) {
    p.keyFormats = ["v1", "packed"];
    p.tables = Object.fromEntries(CHAIN.tables.map((t) => [t.name,
      { first_page: t.first_page, num_pages: t.num_pages, domain_bits: domainBitsFor(t.num_pages) }]));
  }
  const pir = new PirClient("http://a", "http://b", { fetch: fakeFetch(...parties), encoding });
  const state = new EthState(pir, CHAIN.public_key);
  const provider = new PrivateProvider(state, calls ? { calls: new PrivateCalls(state) } : {});
  return { provider, liar: parties[1], parties };
}
