// The provider as viem's `custom(provider)` transport (a dapp library's view of it): viem's
// own actions read the vector chain's state through it, and a lying party's answer reaches
// viem's caller as an error.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { createPublicClient, custom, type Hex } from "viem";

import { fromHex, toHex } from "../src/bytes.js";
import { keccak256, wordBytes } from "../src/index.js";
import { CHAIN, chainProvider } from "./chain.js";

function client() {
  const { provider, liar } = chainProvider("msgpack");
  return { viem: createPublicClient({ transport: custom(provider) }), liar };
}

describe("viem over the provider: createPublicClient({ transport: custom(provider) })", () => {
  it("reads the chain id, the block, balances, nonces, storage and code", async () => {
    const { viem } = client();
    assert.equal(await viem.getChainId(), 31337);
    assert.equal(await viem.getBlockNumber(), 1234n);
    for (const acc of CHAIN.accounts.slice(0, 6)) {
      const address = acc.address;
      assert.equal(await viem.getBalance({ address }), BigInt(acc.balance));
      // viem reads a nonce as a safe integer: the vector's 2**64 - 1 is past it
      if (BigInt(acc.nonce) < 2n ** 53n) assert.equal(BigInt(await viem.getTransactionCount({ address })), BigInt(acc.nonce));
      const code = await viem.getCode({ address });
      assert.equal("0x" + toHex(keccak256(fromHex(code ?? "0x"))), acc.code_hash);
      for (const [slot, word] of Object.entries(acc.storage)) {
        assert.equal(await viem.getStorageAt({ address, slot: slot as Hex }), "0x" + toHex(wordBytes(word)));
      }
    }
  });

  it("gives viem's caller an error, never a number, when a party lies", async () => {
    const { viem, liar } = client();
    await viem.getBlockNumber();
    liar.lie = true;
    await assert.rejects(viem.getBalance({ address: CHAIN.accounts[0]!.address }), /no verified answer/);
  });
});
