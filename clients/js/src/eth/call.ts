// eth_call and eth_estimateGas over private state (morphogen/wallet/evm.py's design, in the
// browser): the EVM (@ethereumjs/evm) runs over accounts, code and storage words read through
// private, verified lookups at the block the parties serve.
//
// Runs and rounds. A run never waits on the parties: what it asks that is not known yet (an
// account, a code hash's code, a storage word) is answered with a placeholder and noted, and
// the run is thrown away. What it noted is read in the next round (`EthState.round`: one
// private request of each table whatever it holds, padded to buckets) and the call runs
// again. A run that asked nothing unknown is the answer: every value it saw was read at its
// block and verified. ERC-20 `balanceOf` is three rounds (the accounts, the token's code, the
// balance word); the same call repeated at the same block is none, and at a new block one
// (it first asks everything it read last time).
//
// Rounds are shared by the calls in flight: one goes out once every call running waits for a
// round (or GATHER_MS after it opened), carrying what all of them asked, so a wallet opening
// twenty token balances at once pays a handful of rounds, not twenty calls' worth.
//
// Padding, as the Python endpoint's. Each round asks accounts and storage once each, their
// lookups padded to the next of CALL_BUCKETS, and code where it needs code not read yet (kept
// across blocks: it is checked against its hash). A call's count of rounds is raised to the
// next of ROUND_BUCKETS with rounds of random keys, whatever it ended on (an answer, a revert,
// a limit, an error of the parties), except a round that failed: that ends the call's rounds,
// its own and the padding's alike, so a call failed at round k has sent k rounds whichever
// kind round k was. The parties learn those buckets (and how many calls share a round), not
// which contract was called nor what it read. The timing of the rounds is not padded.
//
// Not run here, and handed to the fallback provider as they came (`NotServed`): contract
// creation, calls that pay for gas, EIP-7702 authorizations, state overrides, and a run that
// reads a block hash. The block a call sees is the served block's number, with the owner's
// version time as its timestamp, the gas cap as its gas limit, and COINBASE, PREVRANDAO and
// the base fee 0.

import type { Common } from "@ethereumjs/common";

import { fromHex, toHex } from "../bytes.js";
import { CallFailed, CallLimitError, CallNotServed, CallParamsError } from "./call_errors.js";
import { type BlockEnv, type Call, type RunResult, type StateSource, Want, intrinsicGas, rulesOf, runCall, wordKey } from "./evm_run.js";
import { type Account as StateAccount, bigintBytes } from "./records.js";
import type { BlockWanted, Calls } from "./provider.js";
import type { EthState, RoundRead, Served } from "./state.js";

export const ROUND_BUCKETS = [1, 2, 4, 8, 16, 32, 64] as const;
export const MAX_ROUNDS = 64; // the last of ROUND_BUCKETS
// What one call may read, all its rounds together (morphogen/wallet/costs.py)
export const MAX_CALL_LOOKUPS = 4096;
export const CALL_GAS = 50_000_000n; // a node's default eth_call gas cap (geth's RPCGasCap)
export const MAX_ACCESS_LIST = 256;
const TRIES = 4; // runs at a new version: the served block may move during a call
const CODES_KEPT = 256;
const MEMO_KEPT = 256;
const ZERO_ADDRESS = new Uint8Array(20);

export { type Call, Want, intrinsicGas };

const HEX_DATA = /^0x([0-9a-fA-F]{2})*$/;
const QUANTITY = /^0x(0|[1-9a-fA-F][0-9a-fA-F]*)$/;
const KNOWN = new Set(["from", "to", "data", "input", "value", "gas", "gasPrice", "maxFeePerGas",
  "maxPriorityFeePerGas", "nonce", "type", "chainId", "accessList"]);

function addressParam(value: unknown, what: string): Uint8Array {
  if (typeof value !== "string" || !/^0x[0-9a-fA-F]{40}$/.test(value)) {
    throw new CallParamsError(`${what} is a 0x-hex address of 20 bytes`);
  }
  return fromHex(value.slice(2));
}

function quantityParam(value: unknown, what: string): bigint {
  if (typeof value !== "string" || !QUANTITY.test(value)) {
    throw new CallParamsError(`${what} must be a hex quantity such as 0x1a (no leading zeros)`);
  }
  return BigInt(value);
}

/** The params' transaction object as a `Call` (morphogen/wallet/call_params.py's rules). */
export function callParam(tx: unknown): Call {
  if (typeof tx !== "object" || tx === null || Array.isArray(tx)) throw new CallParamsError("a call is a transaction object");
  const o = tx as Record<string, unknown>;
  if ("authorizationList" in o) throw new CallNotServed("a call with an EIP-7702 authorization list is not run privately");
  const unknown = Object.keys(o).filter((k) => !KNOWN.has(k));
  if (unknown.length) throw new CallParamsError(`unknown fields ${JSON.stringify(unknown.sort().slice(0, 3))}`);
  if (o.to === undefined || o.to === null) throw new CallNotServed("a call without `to` (contract creation) is not run privately");
  const to = addressParam(o.to, "to");
  const sender = o.from === undefined || o.from === null ? ZERO_ADDRESS : addressParam(o.from, "from");
  const data = o.input ?? o.data ?? "0x";
  if (typeof data !== "string" || !HEX_DATA.test(data)) throw new CallParamsError("data is 0x-hex of whole bytes");
  const value = o.value === undefined || o.value === null ? 0n : quantityParam(o.value, "value");
  let gas = o.gas === undefined || o.gas === null ? CALL_GAS : quantityParam(o.gas, "gas");
  if (value >= 1n << 256n) throw new CallParamsError("value is a 256-bit quantity");
  if (gas >= 1n << 64n) throw new CallParamsError("gas is a 64-bit quantity");
  for (const fee of ["gasPrice", "maxFeePerGas", "maxPriorityFeePerGas"]) {
    if (o[fee] !== undefined && o[fee] !== null && o[fee] !== "0x0") {
      throw new CallNotServed("a call that pays for gas is not run privately (fees are computed against balances here as gas price 0)");
    }
  }
  if (gas > CALL_GAS) gas = CALL_GAS;
  return { sender, to, data: fromHex(data.slice(2)), value, gas, accessList: accessListParam(o.accessList) };
}

function accessListParam(value: unknown): [Uint8Array, Uint8Array[]][] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value) || value.length > MAX_ACCESS_LIST) {
    throw new CallParamsError(`accessList is a list of at most ${MAX_ACCESS_LIST} entries`);
  }
  return value.map((entry) => {
    if (typeof entry !== "object" || entry === null || Object.keys(entry).some((k) => k !== "address" && k !== "storageKeys")) {
      throw new CallParamsError("an accessList entry is {address, storageKeys}");
    }
    const keys = (entry as { storageKeys?: unknown }).storageKeys ?? [];
    if (!Array.isArray(keys) || keys.length > MAX_ACCESS_LIST) throw new CallParamsError("storageKeys is a list of 32-byte words");
    return [addressParam((entry as { address?: unknown }).address, "accessList: an address"), keys.map((k) => {
      if (typeof k !== "string" || !/^0x[0-9a-fA-F]{1,64}$/.test(k)) throw new CallParamsError("accessList: a storage key is 0x-hex of at most 32 bytes");
      return bigintBytes(BigInt(k), 32);
    })] as [Uint8Array, Uint8Array[]];
  });
}

/** The padded count of a call's `n` rounds (0 where it read none). */
export function roundBucket(n: number): number {
  if (n === 0) return 0;
  for (const b of ROUND_BUCKETS) if (n <= b) return b;
  throw new CallLimitError(`the call reads state over more than ${MAX_ROUNDS} rounds`);
}

/** One version's reads: what every call at that block has read. */
class VersionReads {
  readonly accounts = new Map<string, StateAccount | null>();
  readonly words = new Map<string, bigint>();

  constructor(readonly served: Served) {}
}

export interface PrivateCallsOptions {
  /** The EVM's rules: "chain" (default: a public chain's fork at the served block, by its
   * schedule; Osaka for any other chain), or a fork by name ("prague", "osaka", ...). */
  hardfork?: string;
}

/** One call's rounds and reads so far. */
interface Tally {
  rounds: number; // its rounds read (a failed one not counted)
  lookups: number;
  served: Served | null; // where its padding rounds go
  failed: boolean; // a round failed: nothing more is sent for the call, no padding either
}

/** A round taking what the calls in flight ask, until it goes out. */
interface OpenRound {
  want: Want;
  ready: () => void;
  done: Promise<RoundRead | null>;
}

// How long a round waits at most for the calls in flight to ask theirs (a few runs' time)
const GATHER_MS = 50;

/** eth_call and eth_estimateGas over `state`, for `PrivateProvider`. */
export class PrivateCalls implements Calls {
  /** Rounds read, padding included (for tests and the page's counters). */
  rounds = 0;
  private rules: [string, Common] | null = null; // the last block's
  private readonly codes = new Map<string, Uint8Array>();
  private readonly memo = new Map<string, Want>();
  private reads: VersionReads | null = null;
  private running = 0; // calls in flight not waiting on a round
  private open: OpenRound | null = null;
  private reading: Promise<void> = Promise.resolve();

  private readonly hardfork: string;

  constructor(readonly state: EthState, options: PrivateCallsOptions = {}) {
    this.hardfork = options.hardfork ?? "chain";
    rulesOf(1, this.hardfork); // an unknown hardfork fails here, not at the first call
  }

  /** eth_call's result at `block` (the params' second). */
  async call(params: readonly unknown[], block: BlockWanted): Promise<string> {
    const result = await this.execute(params, "eth_call", false, block);
    return "0x" + toHex(result.out);
  }

  async estimateGas(params: readonly unknown[], block: BlockWanted): Promise<string> {
    const result = await this.execute(params, "eth_estimateGas", true, block);
    return "0x" + result.gas.toString(16);
  }

  private async execute(params: readonly unknown[], method: string, estimate: boolean,
    block: BlockWanted): Promise<RunResult> {
    if (params.length < 1 || params.length > 3) throw new CallParamsError(`${method} takes 1 to 3 params, got ${params.length}`);
    const call = callParam(params[0]);
    if (params.length > 2 && params[2] !== null && !(typeof params[2] === "object" && Object.keys(params[2] as object).length === 0)) {
      throw new CallNotServed("state overrides are not run privately");
    }
    const tally: Tally = { rounds: 0, lookups: 0, served: null, failed: false };
    this.running++;
    try {
      const result = await this.executeAt(call, block, estimate, tally);
      if (!result.ok) throw new CallFailed(result.error, result.reverted, result.out);
      return result;
    } finally {
      // whatever the call ended on, its rounds are raised to the same buckets (but for a
      // round that failed: `pad`)
      await this.pad(tally);
      this.running--;
      this.release();
    }
  }

  private async executeAt(call: Call, block: BlockWanted, estimate: boolean,
    tally: Tally): Promise<RunResult> {
    const memoKey = callKey(call, estimate);
    // A call starts at the newest version read here, unconfirmed: its first round is read at
    // the version the parties serve now and names it where it is newer; a run that needed no
    // round stands where both parties still serve that version's data (GET /epoch), and is
    // otherwise confirmed by reading what it read again (morphogen/wallet/evm.py).
    let served: Served | null = block.any ? this.state.latest : null;
    let confirmed = false;
    for (let i = 0; i < TRIES; i++) {
      if (served === null) {
        served = await this.state.head();
        confirmed = true;
      }
      try {
        block.check(served);
      } catch (exc) {
        if (confirmed) throw exc;
        served = null; // the block asked may be newer than the one read last: the head says
        continue;
      }
      const reads = this.readsAt(served);
      // what the same call read last time, where this version's reads lack it: its first
      // round, before any run
      let want = this.lacking(this.memo.get(memoKey) ?? new Want(), reads);
      let moved = false;
      for (;;) {
        if (want.size > 0) {
          const at = await this.read(want, served, tally);
          if (at === null || !same(at, served)) {
            [served, confirmed, moved] = [at, at !== null, true];
            break;
          }
          confirmed = true;
        }
        const [result, runWant, touched] = await runCall(this.rulesFor(served), this.source(reads), call,
          blockOf(served), estimate);
        if (runWant.size === 0 && !confirmed && !(await this.state.stillServed(served))) {
          // nothing unknown, at a version not confirmed: what the run read, read again
          const at = await this.read(touched, served, tally);
          if (at === null || !same(at, served)) {
            [served, confirmed, moved] = [at, at !== null, true];
            break;
          }
          confirmed = true;
        }
        if (runWant.size === 0) {
          this.remember(memoKey, touched);
          return result;
        }
        want = runWant;
      }
      if (!moved) break;
    }
    throw new CallNotServed(`the served block moved during each of ${TRIES} runs of the call`);
  }

  /** One of the call's rounds, within its limits; the version it was read at (null: the
   * tables answered from two). */
  private async read(want: Want, served: Served, tally: Tally): Promise<Served | null> {
    if (tally.rounds >= MAX_ROUNDS) throw new CallLimitError(`the call reads state over more than ${MAX_ROUNDS} rounds`);
    tally.lookups += want.size;
    if (tally.lookups > MAX_CALL_LOOKUPS) {
      throw new CallLimitError(`the call reads more than ${MAX_CALL_LOOKUPS} accounts, storage words and codes`);
    }
    let read: RoundRead | null;
    try {
      read = await this.round(want);
    } catch (exc) {
      tally.failed = true; // nothing more is sent for the call, no padding either (`pad`)
      throw exc;
    }
    tally.rounds++;
    tally.served = served;
    return read === null ? null : read.served;
  }

  /** The round `want` goes in, shared with the calls in flight (morphogen/wallet/rounds.py):
   * a round goes out once every call running waits for one, or GATHER_MS after it opened,
   * after the round before it, and carries what all of them asked. Twenty balances asked at
   * once cost a handful of rounds, not twenty calls' worth. */
  private async round(want: Want): Promise<RoundRead | null> {
    const open = this.open ?? (this.open = this.openRound());
    open.want.merge(want);
    this.running--;
    this.release();
    try {
      return await open.done;
    } finally {
      this.running++;
    }
  }

  private openRound(): OpenRound {
    let ready!: () => void;
    const gathered = new Promise<void>((resolve) => { ready = resolve; });
    const round: OpenRound = { want: new Want(), ready, done: Promise.resolve(null) };
    round.done = (async () => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([gathered, new Promise<void>((resolve) => { timer = setTimeout(resolve, GATHER_MS); })]);
      clearTimeout(timer);
      await this.reading;
      if (this.open === round) this.open = null; // closed: what is asked now goes in the next
      const read = this.readRound(round.want);
      this.reading = read.then(() => {}, () => {});
      return read;
    })();
    return round;
  }

  /** Sends the open round where every call in flight is waiting on it. */
  private release(): void {
    if (this.open !== null && this.running <= 0) this.open.ready();
  }

  /** One round: `want` read, into `reads` where the parties still serve its version (into
   * the new version's reads otherwise: the call then runs there). */
  private async readRound(want: Want): Promise<RoundRead | null> {
    this.rounds++;
    // code once read is kept across versions: a round asks only code not read yet
    const code = [...want.code].filter(([k]) => !this.codes.has(k));
    const read = await this.state.round([...want.accounts.values()], [...want.words.values()], code.map(([, h]) => h));
    if (read === null) return null;
    const into = this.readsAt(read.served);
    [...want.accounts.keys()].forEach((k, i) => into.accounts.set(k, read.accounts[i]!));
    [...want.words.keys()].forEach((k, i) => into.words.set(k, read.words[i]!));
    code.forEach(([k], i) => {
      this.codes.set(k, read.codes[i]!);
      while (this.codes.size > CODES_KEPT) this.codes.delete(this.codes.keys().next().value!);
    });
    return read;
  }

  private async pad(tally: Tally): Promise<void> {
    // A round that failed ends the call's rounds, its own and the padding's alike. A party can
    // make any round fail: padded after its own round k failed but not after a padding round
    // k, the call's count of rounds would tell which round k was, and so how long the
    // contract's path was; ended at the failure, a call sends k rounds either way.
    if (tally.served === null || tally.failed) return;
    let extra: number;
    try {
      extra = roundBucket(tally.rounds) - tally.rounds;
    } catch {
      return;
    }
    for (let i = 0; i < extra; i++) {
      try {
        await this.round(new Want()); // with other calls' rounds, where there are any
      } catch {
        return; // the call's own outcome stands
      }
    }
  }

  private readsAt(served: Served): VersionReads {
    if (this.reads === null || this.reads.served.version !== served.version || this.reads.served.hash !== served.hash) {
      if (this.reads !== null && this.reads.served.version > served.version) return new VersionReads(served);
      this.reads = new VersionReads(served);
    }
    return this.reads;
  }

  private lacking(want: Want, reads: VersionReads): Want {
    const out = new Want();
    for (const [k, v] of want.accounts) if (!reads.accounts.has(k)) out.accounts.set(k, v);
    for (const [k, v] of want.code) if (!this.codes.has(k)) out.code.set(k, v);
    for (const [k, v] of want.words) if (!reads.words.has(k)) out.words.set(k, v);
    return out;
  }

  private remember(key: string, touched: Want): void {
    this.memo.delete(key);
    this.memo.set(key, touched);
    while (this.memo.size > MEMO_KEPT) this.memo.delete(this.memo.keys().next().value!);
  }

  private rulesFor(served: Served): Common {
    const key = `${served.chainId}:${served.number}:${served.time}`;
    if (this.rules?.[0] !== key) {
      this.rules = [key, rulesOf(served.chainId, this.hardfork, { number: BigInt(served.number), timestamp: BigInt(served.time) })];
    }
    return this.rules[1];
  }

  /** A run's state: what the calls at its version have read (undefined: not yet). */
  private source(reads: VersionReads): StateSource {
    return {
      account: async (address) => reads.accounts.get(toHex(address)),
      code: async (_, codeHash) => this.codes.get(toHex(codeHash)),
      word: async (address, slot) => {
        const word = reads.words.get(wordKey(address, slot));
        // no account has no storage
        return word === undefined && reads.accounts.get(toHex(address)) === null ? 0n : word;
      },
    };
  }
}

function blockOf(served: Served): BlockEnv {
  return {
    number: BigInt(served.number), timestamp: BigInt(served.time), gasLimit: CALL_GAS,
    coinbase: ZERO_ADDRESS, prevRandao: new Uint8Array(32),
  };
}

const same = (a: Served, b: Served) => a.version === b.version && a.hash === b.hash;
function callKey(call: Call, estimate: boolean): string {
  return [estimate ? "e" : "c", toHex(call.sender), toHex(call.to), toHex(call.data), call.value, call.gas,
    call.accessList.map(([a, s]) => toHex(a) + s.map(toHex).join(",")).join(";")].join("|");
}
