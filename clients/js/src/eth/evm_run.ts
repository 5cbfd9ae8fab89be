// One run of a call in the EVM (@ethereumjs/evm) over state it is given by a `StateSource`:
// what both the page's private calls (call.ts: state read in private rounds) and the Python
// endpoint's EVM processes (call_worker.ts: state from the endpoint's loopback) run. A run is
// a transaction's: its intrinsic gas and Prague's calldata floor (EIP-7623), its warm set
// (EIP-2929, EIP-3651, its access list), gas price 0 and no EIP-3607 check (nodes skip it for
// calls: a Safe or a 7702-delegated account may call). An estimate is the nodes' search.

import { Common, Hardfork, Holesky, Hoodi, Mainnet, Sepolia, createCustomCommon } from "@ethereumjs/common";
import { type EVM, createEVM } from "@ethereumjs/evm";
import { SimpleStateManager } from "@ethereumjs/statemanager";
import { Account, Address, bigIntToUnpaddedBytes } from "@ethereumjs/util";

import { equalBytes, toHex } from "../bytes.js";
import { CallNotServed } from "./call_errors.js";
import { type Account as StateAccount, EMPTY_CODE_HASH } from "./records.js";

const CALL_STIPEND = 2_300n;

/** A transaction object of eth_call, checked. */
export interface Call {
  sender: Uint8Array;
  to: Uint8Array;
  data: Uint8Array;
  value: bigint;
  gas: bigint;
  accessList: [Uint8Array, Uint8Array[]][];
}

/** What a call's run sees of its block. */
export interface BlockEnv {
  number: bigint;
  timestamp: bigint;
  gasLimit: bigint;
  coinbase: Uint8Array;
  prevRandao: Uint8Array;
}

/** Where a run's state comes from: `undefined` is "not known yet" (a placeholder, and the
 * run is noted to lack it); an account of null is none. */
export interface StateSource {
  account(address: Uint8Array): Promise<StateAccount | null | undefined>;
  code(address: Uint8Array, codeHash: Uint8Array): Promise<Uint8Array | undefined>;
  word(address: Uint8Array, slot: Uint8Array): Promise<bigint | undefined>;
  /** BLOCKHASH: refused unless a source says otherwise. */
  blockHash?(number: bigint): Promise<Uint8Array>;
}

/** What a run touched and nothing known answers: accounts, code hashes, storage words. */
export class Want {
  readonly accounts = new Map<string, Uint8Array>();
  readonly code = new Map<string, Uint8Array>();
  readonly words = new Map<string, readonly [Uint8Array, Uint8Array]>();

  get size(): number {
    return this.accounts.size + this.code.size + this.words.size;
  }

  merge(other: Want): void {
    for (const [k, v] of other.accounts) this.accounts.set(k, v);
    for (const [k, v] of other.code) this.code.set(k, v);
    for (const [k, v] of other.words) this.words.set(k, v);
  }
}

export const wordKey = (address: Uint8Array, slot: Uint8Array) => `${toHex(address)}:${toHex(slot)}`;

/** A run's outcome: success with its return data and gas, or a revert / halt. */
export interface RunResult {
  ok: boolean;
  reverted: boolean;
  out: Uint8Array;
  gas: bigint; // the transaction's gas: intrinsic plus execution (an estimate: the least)
  refund: bigint;
  error: string;
}

// Chains whose fork schedule the EVM knows: a run takes the fork of its block from it
const SCHEDULED = [Mainnet, Sepolia, Holesky, Hoodi];
/** The fork of any other chain (a dev chain: anvil 1.7's default is Osaka's rules). */
export const DEV_HARDFORK = Hardfork.Osaka;

/** The EVM's rules for a chain (its id is what CHAINID answers): with `hardfork` "chain", a
 * public chain's fork at the block (`at`: its number and timestamp) by the chain's schedule,
 * and DEV_HARDFORK for any other chain; else the fork named ("prague", "osaka", ...). */
export function rulesOf(chainId: number | bigint, hardfork = "chain",
  at?: { number: bigint; timestamp: bigint }): Common {
  const known = SCHEDULED.find((c) => c.chainId === Number(chainId));
  if (hardfork === "chain" && known !== undefined) {
    const rules = new Common({ chain: known });
    if (at !== undefined) rules.setHardforkBy({ blockNumber: at.number, timestamp: at.timestamp });
    return rules;
  }
  return createCustomCommon({ chainId: Number(chainId) }, Mainnet,
    { hardfork: hardfork === "chain" ? DEV_HARDFORK : hardfork });
}

/** The state a run sees: its own writes first (the journal's layers), then `source`. */
class RunState extends SimpleStateManager {
  readonly want = new Want();
  readonly touched = new Want();

  constructor(private readonly source: StateSource, common: Common) {
    super({ common });
  }

  override async getAccount(address: Address): Promise<Account | undefined> {
    const top = this.topAccountStack();
    const key = address.toString();
    if (top.has(key)) return top.get(key);
    const hex = toHex(address.bytes);
    this.touched.accounts.set(hex, address.bytes);
    const a = await this.source.account(address.bytes);
    if (a === undefined) {
      this.want.accounts.set(hex, address.bytes);
      return undefined;
    }
    return a === null ? undefined : new Account(a.nonce, a.balance, undefined, a.codeHash);
  }

  override async getCode(address: Address): Promise<Uint8Array> {
    const top = this.topCodeStack();
    const key = address.toString();
    if (top.has(key)) return top.get(key)!;
    const account = await this.getAccount(address);
    if (account === undefined || equalBytes(account.codeHash, EMPTY_CODE_HASH)) return new Uint8Array();
    const hex = toHex(account.codeHash);
    this.touched.code.set(hex, account.codeHash);
    const code = await this.source.code(address.bytes, account.codeHash);
    if (code === undefined) {
      this.want.code.set(hex, account.codeHash);
      return new Uint8Array();
    }
    return code;
  }

  override async getCodeSize(address: Address): Promise<number> {
    return (await this.getCode(address)).length;
  }

  override async getStorage(address: Address, slot: Uint8Array): Promise<Uint8Array> {
    const top = this.topStorageStack();
    const key = `${address.toString()}_${toHex(slot)}`;
    if (top.has(key)) return top.get(key)!;
    const k = wordKey(address.bytes, slot);
    this.touched.words.set(k, [address.bytes, slot]);
    const word = await this.source.word(address.bytes, slot);
    if (word === undefined) {
      this.want.words.set(k, [address.bytes, slot]);
      return new Uint8Array();
    }
    return bigIntToUnpaddedBytes(word);
  }
}

const min = (a: bigint, b: bigint) => (a < b ? a : b);
const max = (a: bigint, b: bigint) => (a > b ? a : b);

/** A transaction's intrinsic gas (and Prague's calldata floor, EIP-7623): 21,000, its data
 * (4 a zero byte, 16 another), its access list (2,400 an address, 1,900 a key). */
export function intrinsicGas(call: Call): { gas: bigint; floor: bigint } {
  let zeros = 0n, others = 0n;
  for (const b of call.data) {
    if (b === 0) zeros++;
    else others++;
  }
  const tokens = zeros + 4n * others;
  let gas = 21_000n + 4n * tokens;
  for (const [, slots] of call.accessList) gas += 2_400n + 1_900n * BigInt(slots.length);
  return { gas, floor: 21_000n + 10n * tokens };
}

/** The call run at `block` (an estimate: the nodes' search, morphogen/wallet/workers.py,
 * every step over the same source): its result, what it lacked, what it touched. */
export async function runCall(common: Common, source: StateSource, call: Call, block: BlockEnv,
  estimate: boolean): Promise<[RunResult, Want, Want]> {
  const intrinsic = intrinsicGas(call);
  const want = new Want(), touched = new Want();
  const attempt = async (gas: bigint): Promise<RunResult> => {
    const [result, lacked, read] = await runOnce(common, source, call, block, gas, intrinsic);
    want.merge(lacked);
    touched.merge(read);
    return result;
  };
  const first = await attempt(call.gas);
  if (!estimate || !first.ok || want.size > 0) return [first, want, touched];
  let lo = first.gas - 1n > 0n ? first.gas - 1n : 0n;
  let hi = call.gas;
  const optimistic = ((first.gas + first.refund + CALL_STIPEND) * 64n) / 63n;
  if (optimistic < hi) {
    if ((await attempt(optimistic)).ok) hi = optimistic;
    else lo = optimistic;
  }
  while (lo + 1n < hi && want.size === 0) {
    let mid = (lo + hi) / 2n;
    if (mid > 2n * lo) mid = 2n * lo;
    if ((await attempt(mid)).ok) hi = mid;
    else lo = mid;
  }
  return [{ ...first, gas: hi }, want, touched];
}

async function runOnce(common: Common, source: StateSource, call: Call, block: BlockEnv, gas: bigint,
  intrinsic: { gas: bigint; floor: bigint }): Promise<[RunResult, Want, Want]> {
  const state = new RunState(source, common);
  let blockHashRefused: unknown = null;
  const blockchain = {
    getBlock: async (number: bigint | number) => {
      try {
        if (source.blockHash === undefined) throw new CallNotServed("a call that reads a block hash is not run privately");
        const hash = await source.blockHash(BigInt(number));
        return { hash: () => hash };
      } catch (exc) {
        blockHashRefused = exc;
        throw exc;
      }
    },
    putBlock: async () => {},
    shallowCopy: () => blockchain,
  };
  const evm: EVM = await createEVM({ common, stateManager: state, blockchain: blockchain as never });
  const caller = new Address(call.sender), to = new Address(call.to);
  // a transaction's warm set (EIP-2929, EIP-3651): its sender, its recipient, the coinbase,
  // and its access list (the precompiles are warm in the EVM itself)
  for (const a of [caller, to, new Address(block.coinbase)]) evm.journal.addAlwaysWarmAddress(a.toString());
  for (const [address, slots] of call.accessList) {
    evm.journal.addAlwaysWarmAddress(toHex(address), true);
    for (const s of slots) evm.journal.addAlwaysWarmSlot(toHex(address), toHex(s), true);
  }
  const failed = (error: string): [RunResult, Want, Want] =>
    [{ ok: false, reverted: false, out: new Uint8Array(), gas: 0n, refund: 0n, error }, state.want, state.touched];
  if (gas < intrinsic.gas || gas < intrinsic.floor) {
    return failed(`intrinsic gas too low: have ${gas}, want ${max(intrinsic.gas, intrinsic.floor)}`);
  }
  let result;
  try {
    result = await evm.runCall({
      caller, origin: caller, to, data: call.data, value: call.value, gasLimit: gas - intrinsic.gas, gasPrice: 0n,
      block: { header: { ...block, coinbase: new Address(block.coinbase), difficulty: 0n, baseFeePerGas: 0n,
        slotNumber: 0n, getBlobGasPrice: () => 1n } } as never,
    });
  } catch (exc) {
    if (state.want.size > 0) return failed("a placeholder");
    if (blockHashRefused !== null) throw blockHashRefused;
    const message = exc instanceof Error ? exc.message : String(exc);
    if (/insufficient balance/i.test(message)) return failed("insufficient funds for transfer");
    throw exc;
  }
  if (blockHashRefused !== null && state.want.size === 0) throw blockHashRefused;
  const exec = result.execResult;
  const used = intrinsic.gas + exec.executionGasUsed;
  const refund = exec.gasRefund ?? 0n;
  const charged = max(used - min(refund, used / 5n), intrinsic.floor);
  if (exec.exceptionError !== undefined) {
    const reverted = exec.exceptionError.error === "revert";
    return [{ ok: false, reverted, out: exec.returnValue, gas: charged, refund,
      error: reverted ? "execution reverted" : exec.exceptionError.error }, state.want, state.touched];
  }
  return [{ ok: true, reverted: false, out: exec.returnValue, gas: charged, refund, error: "" }, state.want, state.touched];
}
