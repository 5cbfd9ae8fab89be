// An EVM process of the Python endpoint (`morphogen rpc --evm ethereumjs`:
// morphogen/wallet/node_evm.py): runs calls one at a time, as pyrevm's processes do, their
// state read from the endpoint's loopback URL of each run (morphogen/wallet/loopback.py: the
// accounts, code and words read privately at the run's block; a placeholder where one is not
// read yet, which the endpoint notes and reads in its next round).
//
// One JSON job a line on stdin, one JSON result a line on stdout ("ready" first):
//   job    {url, block: {number, timestamp, gas_limit, chain_id, coinbase?, prevrandao?},
//           tx: {from, to, data (hex), value (decimal), gas, access_list: [[address, [slot]]]},
//           estimate, accounts: [[address, balance (decimal), nonce, code hash, code]],
//           hardfork}
//   result {ok, out (hex), reason, gas, runs}, or {crash: name}

import { createInterface } from "node:readline";

import { fromHex, toHex } from "../bytes.js";
import { type Call, type StateSource, rulesOf, runCall, wordKey } from "./evm_run.js";
import { type Account, EMPTY_CODE_HASH, bigintBytes, keccak256 } from "./records.js";

interface Job {
  url: string;
  block: { number: number; timestamp: number; gas_limit: number; chain_id: number; coinbase?: string | null; prevrandao?: string | null };
  tx: { from: string; to: string; data: string; value: string; gas: number; access_list: [string, string[]][] };
  estimate: boolean;
  accounts: [string, string, number, string, string][];
  hardfork: string;
}

const hex = (text: string) => fromHex(text.startsWith("0x") ? text.slice(2) : text);

/** The loopback's answers (JSON-RPC, the four methods pyrevm's fork mode asks), each read
 * once a run. */
class Loopback implements StateSource {
  private readonly accounts = new Map<string, Promise<Account | null>>();
  private readonly words = new Map<string, Promise<bigint>>();
  private readonly codes = new Map<string, Uint8Array>();
  private id = 0;

  constructor(private readonly url: string, private readonly tag: string, job: Job) {
    for (const [address, balance, nonce, codeHash, code] of job.accounts) {
      const a = { nonce: BigInt(nonce), balance: BigInt(balance), codeHash: hex(codeHash) };
      this.accounts.set(toHex(hex(address)), Promise.resolve(a.nonce === 0n && a.balance === 0n
        && toHex(a.codeHash) === toHex(EMPTY_CODE_HASH) ? null : a));
      this.codes.set(toHex(hex(address)), hex(code));
    }
  }

  private async rpc(calls: [string, unknown[]][]): Promise<string[]> {
    const body = calls.map(([method, params]) => ({ jsonrpc: "2.0", id: this.id++, method, params }));
    const resp = await fetch(this.url, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });
    const answers = (await resp.json()) as { id: number; result?: string; error?: { message: string } }[];
    const byId = new Map(answers.map((a) => [a.id, a]));
    return body.map((b) => {
      const a = byId.get(b.id);
      if (a === undefined || a.result === undefined) throw new Error(`the loopback refused ${b.method}: ${a?.error?.message ?? "no answer"}`);
      return a.result;
    });
  }

  account(address: Uint8Array): Promise<Account | null> {
    const key = toHex(address);
    let found = this.accounts.get(key);
    if (found === undefined) {
      const at = "0x" + key;
      found = this.rpc([["eth_getBalance", [at, this.tag]], ["eth_getTransactionCount", [at, this.tag]],
        ["eth_getCode", [at, this.tag]]]).then(([balance, nonce, code]) => {
        const bytes = hex(code!);
        this.codes.set(key, bytes);
        const a = { nonce: BigInt(nonce!), balance: BigInt(balance!), codeHash: keccak256(bytes) };
        // the loopback answers no account as all zeros: none, as a node's empty account
        return a.nonce === 0n && a.balance === 0n && bytes.length === 0 ? null : a;
      });
      this.accounts.set(key, found);
    }
    return found;
  }

  async code(address: Uint8Array): Promise<Uint8Array> {
    await this.account(address);
    return this.codes.get(toHex(address)) ?? new Uint8Array();
  }

  word(address: Uint8Array, slot: Uint8Array): Promise<bigint> {
    const key = wordKey(address, slot);
    let found = this.words.get(key);
    if (found === undefined) {
      found = this.rpc([["eth_getStorageAt", ["0x" + toHex(address), "0x" + toHex(slot), this.tag]]])
        .then(([word]) => BigInt(word!));
      this.words.set(key, found);
    }
    return found;
  }

  async blockHash(number: bigint): Promise<Uint8Array> {
    // asked of the loopback, which refuses it and records the refusal as the call's answer
    const [block] = await this.rpc([["eth_getBlockByNumber", ["0x" + number.toString(16), false]]]);
    return hex((block as unknown as { hash: string }).hash);
  }
}

async function run(job: Job): Promise<unknown> {
  const rules = rulesOf(job.block.chain_id, job.hardfork,
    { number: BigInt(job.block.number), timestamp: BigInt(job.block.timestamp) });
  const tag = "0x" + job.block.number.toString(16);
  const call: Call = {
    sender: hex(job.tx.from), to: hex(job.tx.to), data: hex(job.tx.data), value: BigInt(job.tx.value),
    gas: BigInt(job.tx.gas),
    accessList: job.tx.access_list.map(([a, slots]) => [hex(a), slots.map((s) => bigintBytes(BigInt(s), 32))]),
  };
  const block = {
    number: BigInt(job.block.number), timestamp: BigInt(job.block.timestamp), gasLimit: BigInt(job.block.gas_limit),
    coinbase: job.block.coinbase ? hex(job.block.coinbase) : new Uint8Array(20),
    prevRandao: job.block.prevrandao ? hex(job.block.prevrandao) : new Uint8Array(32),
  };
  let result;
  try {
    [result] = await runCall(rules, new Loopback(job.url, tag, job), call, block, job.estimate);
  } catch (exc) {
    // a read the loopback refused (a block hash): the endpoint has recorded why, and answers that
    return { ok: false, out: "", gas: "0", runs: 1, reason: exc instanceof Error ? exc.message.slice(0, 300) : "failed" };
  }
  return {
    ok: result.ok, out: toHex(result.out), gas: result.gas.toString(), runs: 1,
    // the Python endpoint's names: a revert's data is `out`
    reason: result.ok ? "" : result.reverted ? "Revert" : result.error,
  };
}

async function main(): Promise<void> {
  const lines = createInterface({ input: process.stdin });
  process.stdout.write(JSON.stringify("ready") + "\n");
  for await (const line of lines) {
    let out: unknown;
    try {
      out = await run(JSON.parse(line) as Job);
    } catch (exc) {
      out = { crash: exc instanceof Error ? `${exc.name}: ${exc.message.slice(0, 200)}` : "unknown" };
    }
    process.stdout.write(JSON.stringify(out) + "\n");
  }
}

void main();
