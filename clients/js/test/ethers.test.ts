// The provider as ethers' `BrowserProvider` (the other dapp library's view of an EIP-1193
// provider): ethers' own calls read the vector chain's state through it, and a lying party's
// answer reaches ethers' caller as an error.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { BrowserProvider } from "ethers";

import { fromHex, toHex } from "../src/bytes.js";
import { PAGE_SIZE } from "../src/constants.js";
import { EthState, PirClient, PrivateProvider, keccak256, wordBytes } from "../src/index.js";
import { FakeParty, domainBitsFor, fakeFetch } from "./fake.js";
import { readVectors } from "./vectors.js";

interface Chain {
  public_key: string;
  num_pages: number;
  pages: Record<string, string>;
  tables: { name: string; first_page: number; num_pages: number }[];
  accounts: { address: string; nonce: string; balance: string; code_hash: string; storage: Record<string, string> }[];
}
const CHAIN = readVectors<Chain>("chain_tables.json");

function provider() {
  const pages = Array.from({ length: CHAIN.num_pages }, () => new Uint8Array(PAGE_SIZE));
  for (const [i, h] of Object.entries(CHAIN.pages)) pages[Number(i)]!.set(fromHex(h));
  const parties = [new FakeParty(pages, domainBitsFor(pages.length)), new FakeParty(pages, domainBitsFor(pages.length))] as const;
  for (const p of parties) {
    p.keyFormats = ["v1", "packed"];
    p.tables = Object.fromEntries(CHAIN.tables.map((t) => [t.name,
      { first_page: t.first_page, num_pages: t.num_pages, domain_bits: domainBitsFor(t.num_pages) }]));
  }
  const pir = new PirClient("http://a", "http://b", { fetch: fakeFetch(...parties), encoding: "json" });
  const ethers = new BrowserProvider(new PrivateProvider(new EthState(pir, CHAIN.public_key)));
  return { ethers, liar: parties[1] };
}

describe("ethers over the provider: new BrowserProvider(provider)", () => {
  it("reads the network, the block, balances, nonces, storage and code", async () => {
    const { ethers } = provider();
    assert.equal((await ethers.getNetwork()).chainId, 31337n);
    assert.equal(await ethers.getBlockNumber(), 1234);
    for (const acc of CHAIN.accounts.slice(0, 6)) {
      const address = acc.address;
      assert.equal(await ethers.getBalance(address), BigInt(acc.balance));
      // ethers reads a nonce as a JavaScript number: the vector's 2**64 - 1 is past it
      if (BigInt(acc.nonce) < 2n ** 53n) assert.equal(BigInt(await ethers.getTransactionCount(address)), BigInt(acc.nonce));
      const code = await ethers.getCode(address);
      assert.equal("0x" + toHex(keccak256(fromHex(code))), acc.code_hash);
      for (const [slot, word] of Object.entries(acc.storage)) {
        assert.equal(await ethers.getStorage(address, slot), "0x" + toHex(wordBytes(word)));
      }
    }
  });

  it("gives ethers' caller an error, never a number, when a party lies", async () => {
    const { ethers, liar } = provider();
    await ethers.getBlockNumber();
    liar.lie = true;
    await assert.rejects(ethers.getBalance(CHAIN.accounts[0]!.address), /no verified answer/);
  });
});
