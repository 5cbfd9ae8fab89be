// The provider as viem's `custom(provider)` transport (a dapp library's view of it): viem's
// own actions read the vector chain's state through it, and a lying party's answer reaches
// viem's caller as an error.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { createPublicClient, custom, erc20Abi, type Hex } from "viem";

import { fromHex, toHex } from "../src/bytes.js";
import { keccak256, wordBytes } from "../src/index.js";
import { CHAIN, chainProvider } from "./chain.js";

function client(calls = false) {
  const { provider, liar } = chainProvider("msgpack", calls);
  return { viem: createPublicClient({ transport: custom(provider) }), liar };
}

// the vector chain's token and the contract that calls it (tests/vectors/chain_tables.py)
const TOKEN = CHAIN.accounts[CHAIN.accounts.length - 2]!.address;
const READER = CHAIN.accounts[CHAIN.accounts.length - 1]!.address;
const HOLDERS = [CHAIN.accounts[0]!.address, CHAIN.accounts[1]!.address] as const;
const balanceSlot = (holder: string) => "0x" + BigInt("0x" + toHex(keccak256(fromHex("00".repeat(12) + holder.slice(2) + "00".repeat(32))))).toString(16);

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

  it("runs contract reads in the JavaScript EVM: readContract, a contract calling another, estimateGas", async () => {
    const { viem } = client(true);
    const storage = CHAIN.accounts[CHAIN.accounts.length - 2]!.storage;
    for (const holder of HOLDERS) {
      const balance = await viem.readContract({ address: TOKEN, abi: erc20Abi, functionName: "balanceOf", args: [holder] });
      assert.equal(balance, BigInt(storage[balanceSlot(holder)]!));
    }
    assert.equal(await viem.readContract({ address: TOKEN, abi: erc20Abi, functionName: "totalSupply" }), BigInt(storage["0x2"]!));
    const twice = await viem.call({ to: READER, data: ("0x12345678" + "00".repeat(12) + HOLDERS[1].slice(2)) as Hex });
    assert.equal(BigInt(twice.data!), 2n * BigInt(storage[balanceSlot(HOLDERS[1])]!));
    const recorded = CHAIN.rpc.find((r) => r.method === "eth_estimateGas")!;
    const gas = await viem.estimateGas({ ...(recorded.params[0] as { from: Hex; to: Hex; data: Hex }), account: (recorded.params[0] as { from: Hex }).from });
    assert.equal(gas, BigInt(recorded.result!));
    await assert.rejects(viem.call({ to: TOKEN, data: "0xdeadbeef" }), /revert/i);
  });

  it("gives viem's caller an error, never a number, when a party lies to a contract read", async () => {
    const { viem, liar } = client(true);
    await viem.getBlockNumber();
    liar.lie = true;
    await assert.rejects(viem.readContract({ address: TOKEN, abi: erc20Abi, functionName: "totalSupply" }), /no verified answer/);
  });

  it("gives viem's caller an error, never a number, when a party lies", async () => {
    const { viem, liar } = client();
    await viem.getBlockNumber();
    liar.lie = true;
    await assert.rejects(viem.getBalance({ address: CHAIN.accounts[0]!.address }), /no verified answer/);
  });
});
