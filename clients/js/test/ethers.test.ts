// The provider as ethers' `BrowserProvider` (the other dapp library's view of an EIP-1193
// provider): ethers' own calls read the vector chain's state through it, and a lying party's
// answer reaches ethers' caller as an error.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { BrowserProvider, Contract } from "ethers";

import { fromHex, toHex } from "../src/bytes.js";
import { keccak256, wordBytes } from "../src/index.js";
import { CHAIN, chainProvider } from "./chain.js";

function provider(calls = false) {
  const { provider, liar } = chainProvider("json", calls);
  return { ethers: new BrowserProvider(provider), liar };
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

  it("runs a token's reads through ethers' Contract in the JavaScript EVM", async () => {
    const { ethers } = provider(true);
    const token = CHAIN.accounts[CHAIN.accounts.length - 2]!;
    const contract = new Contract(token.address, ["function balanceOf(address) view returns (uint256)",
      "function totalSupply() view returns (uint256)", "function symbol() view returns (string)"], ethers);
    const holder = CHAIN.accounts[0]!.address;
    const recorded = CHAIN.rpc.find((r) => r.method === "eth_call")!;
    assert.equal(await contract.getFunction("balanceOf")(holder), BigInt(recorded.result!));
    assert.equal(await contract.getFunction("totalSupply")(), BigInt(token.storage["0x2"]!));
    assert.equal(await contract.getFunction("symbol")(), "DEMO");
  });

  it("gives ethers' caller an error, never a number, when a party lies", async () => {
    const { ethers, liar } = provider();
    await ethers.getBlockNumber();
    liar.lie = true;
    await assert.rejects(ethers.getBalance(CHAIN.accounts[0]!.address), /no verified answer/);
  });
});
