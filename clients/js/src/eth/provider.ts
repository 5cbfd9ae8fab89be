// An EIP-1193 provider over private state: the methods morphogen/wallet/methods.py answers
// privately, in a node's exact formats and with its JSON-RPC error codes
// (morphogen/wallet/jsonrpc.py), and every other request handed to a fallback provider the
// application names, as it came. Without a fallback, those are refused (4200 / -32601 for a
// method, -32001 for a block other than the one served): nothing is ever sent anywhere the
// application did not name.
//
// Answered privately: eth_chainId, net_version, web3_clientVersion, eth_blockNumber,
// eth_getBalance, eth_getTransactionCount, eth_getStorageAt, eth_getCode, at `latest`,
// `pending`, or the served block's number or hash (EIP-1898 objects too). eth_call and
// eth_estimateGas are answered privately where the application gives the provider `calls`
// (`PrivateCalls`, from "@morphogen/client/call": an EVM in JavaScript, its every state read a
// private lookup; kept out of the main bundle), and go to the fallback otherwise.
// eth_getTransactionCount at `pending` counts, as a node's pool does, the transactions sent
// through this provider that the fallback took and the signed block does not hold yet (sent.ts).

import { to0xHex } from "../bytes.js";
import { PirError } from "../wire.js";
import { KeywordIntegrityError, StaleTableError } from "../keyword/descriptor.js";
import { TableChangingError } from "../keyword/client.js";
import type { CallFailed } from "./call_errors.js";
import { addressBytes, bigintBytes, wordBytes } from "./records.js";
import { SentNonces, learn } from "./sent.js";
import type { EthState, Served } from "./state.js";

export const INVALID_PARAMS = -32602;
export const METHOD_NOT_FOUND = -32601;
export const INTERNAL_ERROR = -32603;
export const NOT_SERVED = -32001;
export const UNAVAILABLE = -32002;
export const UNSUPPORTED_METHOD = 4200; // EIP-1193's code for a method the provider lacks
export const EXECUTION_REVERTED = 3; // a node's code for a reverted eth_call / eth_estimateGas
export const CALL_HALTED = -32000;
export const LIMIT_EXCEEDED = -32005;
export const CLIENT_VERSION = "morphogen-js/1 (private state reads over two PIR parties)";

const QUANTITY = /^0x(0|[1-9a-fA-F][0-9a-fA-F]*)$/;
const HASH = /^0x[0-9a-fA-F]{64}$/;
const SERVED_TAGS = ["latest", "pending"];
const OTHER_TAGS = ["earliest", "safe", "finalized"];

export interface RequestArguments {
  readonly method: string;
  readonly params?: readonly unknown[] | object;
}

/** What EIP-1193 asks of a provider, and all this one asks of its fallback. */
export interface Eip1193Provider {
  request(args: RequestArguments): Promise<unknown>;
}

/** A failed request, as EIP-1193 has it: a JSON-RPC error code and a message. */
export class ProviderRpcError extends Error {
  override name = "ProviderRpcError";

  constructor(readonly code: number, message: string, readonly data?: unknown) {
    super(message);
  }
}

/** Not answerable privately here: another block, or a method not served here. */
class NotServed extends Error {}

class InvalidParams extends Error {}

/** A block parameter: any served block, or one number or hash. */
class Wanted {
  constructor(readonly number: bigint | null = null, readonly hash: string | null = null) {}

  check(served: Served): void {
    if (this.number !== null && this.number !== BigInt(served.number)) {
      throw new NotServed(`block 0x${this.number.toString(16)} is not the block served here (0x${served.number.toString(16)})`);
    }
    if (this.hash !== null && this.hash.toLowerCase() !== served.hash.toLowerCase()) {
      throw new NotServed(`block ${this.hash} is not the block served here (${served.hash})`);
    }
  }

  get any(): boolean {
    return this.number === null && this.hash === null;
  }
}

function quantity(value: unknown, what: string): bigint {
  if (typeof value !== "string" || !QUANTITY.test(value)) {
    throw new InvalidParams(`${what} must be a hex quantity such as 0x1a (no leading zeros)`);
  }
  return BigInt(value);
}

function blockParam(value: unknown): Wanted {
  if (value === undefined || value === null || SERVED_TAGS.includes(value as string)) return new Wanted();
  if (OTHER_TAGS.includes(value as string)) {
    throw new NotServed(`block '${value}' is not served privately (only the latest block is)`);
  }
  if (typeof value === "string") {
    return HASH.test(value) ? new Wanted(null, value) : new Wanted(quantity(value, "the block"));
  }
  if (typeof value === "object" && !Array.isArray(value)) {
    const o = value as Record<string, unknown>;
    const keys = Object.keys(o);
    if (keys.some((k) => !["blockHash", "blockNumber", "requireCanonical"].includes(k))) {
      throw new InvalidParams("a block object has blockHash or blockNumber");
    }
    if ("blockHash" in o && !("blockNumber" in o)) {
      if (typeof o.blockHash !== "string" || !HASH.test(o.blockHash)) throw new InvalidParams("blockHash must be 0x and 64 hex digits");
      return new Wanted(null, o.blockHash);
    }
    if ("blockNumber" in o && !("blockHash" in o)) return blockParam(o.blockNumber);
    throw new InvalidParams("a block object has one of blockHash and blockNumber");
  }
  throw new InvalidParams("the block must be a tag, a hex number or a block object");
}

function args(params: readonly unknown[], least: number, most: number, method: string): unknown[] {
  if (params.length < least || params.length > most) {
    const want = least === most ? String(least) : `${least} to ${most}`;
    throw new InvalidParams(`${method} takes ${want} params, got ${params.length}`);
  }
  return [...params, ...Array(most - params.length).fill(null)];
}

function address(value: unknown): Uint8Array {
  if (typeof value !== "string") throw new InvalidParams("an address is a 0x-hex string of 20 bytes");
  try {
    return addressBytes(value);
  } catch (exc) {
    throw new InvalidParams((exc as Error).message);
  }
}

function slot(value: unknown): Uint8Array {
  if (typeof value !== "string") throw new InvalidParams("a storage slot is a 0x-hex string of at most 32 bytes");
  try {
    return wordBytes(value, "a storage slot");
  } catch (exc) {
    throw new InvalidParams((exc as Error).message);
  }
}

const hex = (n: bigint | number) => "0x" + n.toString(16);

type Method = (state: EthState, params: readonly unknown[]) => Promise<unknown>;

async function accountOf(state: EthState, params: readonly unknown[], method: string) {
  const [a, b] = args(params, 1, 2, method);
  const key = address(a), wanted = blockParam(b);
  if (wanted.any) return (await state.account(key))[0];
  const [[account], served] = await state.accounts([key]);
  wanted.check(served);
  return account!;
}

/** The methods answered privately, in a node's formats (morphogen/wallet/methods.py). */
export const METHODS: Readonly<Record<string, Method>> = {
  eth_chainId: async (state, params) => {
    args(params, 0, 0, "eth_chainId");
    return hex((await state.current()).chainId);
  },
  net_version: async (state, params) => {
    args(params, 0, 0, "net_version");
    return String((await state.current()).chainId);
  },
  web3_clientVersion: async (_, params) => {
    args(params, 0, 0, "web3_clientVersion");
    return CLIENT_VERSION;
  },
  eth_blockNumber: async (state, params) => {
    args(params, 0, 0, "eth_blockNumber");
    return hex((await state.current()).number);
  },
  eth_getBalance: async (state, params) => hex((await accountOf(state, params, "eth_getBalance"))?.balance ?? 0n),
  eth_getTransactionCount: async (state, params) =>
    hex((await accountOf(state, params, "eth_getTransactionCount"))?.nonce ?? 0n),
  eth_getStorageAt: async (state, params) => {
    const [a, s, b] = args(params, 2, 3, "eth_getStorageAt");
    const key = address(a), index = slot(s), wanted = blockParam(b);
    const [[word], served] = await state.storage([[key, index]]);
    wanted.check(served);
    return to0xHex(bigintBytes(word!, 32));
  },
  eth_getCode: async (state, params) => {
    const [a, b] = args(params, 1, 2, "eth_getCode");
    const key = address(a), wanted = blockParam(b);
    const [code, served] = await state.code(key);
    wanted.check(served);
    return to0xHex(code);
  },
};

/** The block a request's params name: `any` served block, or one that `check(served)`
 * throws NotServed for where it is not the block served. */
export interface BlockWanted {
  readonly any: boolean;
  check(served: Served): void;
}

/** eth_call and eth_estimateGas run privately (`PrivateCalls`), at `block`. */
export interface Calls {
  call(params: readonly unknown[], block: BlockWanted): Promise<string>;
  estimateGas(params: readonly unknown[], block: BlockWanted): Promise<string>;
}

export interface PrivateProviderOptions {
  /** eth_call and eth_estimateGas, run privately: `new PrivateCalls(state)` from
   * "@morphogen/client/call". None: they go to the fallback. */
  calls?: Calls;
  /** Where requests not answered privately go (other methods, other blocks), as they came:
   * e.g. a wallet's own provider or a node's. None: they are refused. */
  fallback?: Eip1193Provider;
  /** The nonces of the transactions sent through this provider, for `pending` (sent.ts):
   * a fresh `SentNonces` unless given. */
  sent?: SentNonces;
}

type Listener = (...args: unknown[]) => void;

/** `request({method, params})` over private, verified state (`EthState`), for viem's
 * `custom(provider)` transport, ethers' `BrowserProvider`, or any EIP-1193 consumer.
 *
 *     const provider = new PrivateProvider(new EthState(pir, ownerKey), { fallback: window.ethereum });
 *     const client = createPublicClient({ transport: custom(provider) });
 */
export class PrivateProvider implements Eip1193Provider {
  readonly fallback: Eip1193Provider | undefined;
  readonly calls: Calls | undefined;
  /** eth_getTransactionCount at `pending`: the transactions sent through here counted. */
  readonly sent: SentNonces;
  private readonly listeners = new Map<string, Set<Listener>>();

  constructor(readonly state: EthState, options: PrivateProviderOptions = {}) {
    this.fallback = options.fallback;
    this.calls = options.calls;
    this.sent = options.sent ?? new SentNonces();
  }

  async request(request: RequestArguments): Promise<unknown> {
    if (typeof request !== "object" || request === null || typeof request.method !== "string") {
      throw new ProviderRpcError(-32600, "a request is an object with a method");
    }
    const { method } = request;
    const params = request.params ?? [];
    const handler = method === "eth_getTransactionCount" ? this.transactionCount
      : Object.hasOwn(METHODS, method) ? METHODS[method] : this.callMethod(method);
    try {
      if (handler === undefined) throw new NotServed(`${method.slice(0, 64)} is not answered privately`);
      if (!Array.isArray(params)) throw new InvalidParams(`${method} takes positional params (an array)`);
      return await handler(this.state, params);
    } catch (exc) {
      if (exc instanceof NotServed || named(exc, "CallNotServed")) {
        if (this.fallback !== undefined) return this.forwarded(this.fallback, request);
        const code = handler === undefined ? UNSUPPORTED_METHOD : NOT_SERVED;
        throw new ProviderRpcError(code, `${exc.message}, and no fallback provider is set to send it to`);
      }
      throw rpcError(method, exc);
    }
  }

  /** As the fallback answers; after a send it took, its sender's next nonce is noted. */
  private async forwarded(fallback: Eip1193Provider, request: RequestArguments): Promise<unknown> {
    const answer = await fallback.request(request);
    if (request.method === "eth_sendRawTransaction") await learn(this.sent, fallback, answer);
    return answer;
  }

  /** The signed block's nonce; at `pending`, the transactions sent through here counted. */
  private readonly transactionCount: Method = async (state, params) => {
    const signed = await METHODS.eth_getTransactionCount!(state, params);
    if (params.length < 2 || params[1] !== "pending") return signed;
    return hex(this.sent.pending(address(params[0]), BigInt(signed as string)));
  };

  private callMethod(method: string): Method | undefined {
    const calls = this.calls;
    if (calls === undefined || (method !== "eth_call" && method !== "eth_estimateGas")) return undefined;
    return async (_state, params) => {
      const wanted = blockParam(params.length > 1 ? params[1] : undefined);
      return method === "eth_call" ? calls.call(params, wanted) : calls.estimateGas(params, wanted);
    };
  }

  /** EIP-1193's events: this provider emits none (it follows no chain itself), but keeps
   * listeners so that libraries that subscribe can. */
  on(event: string, listener: Listener): this {
    let set = this.listeners.get(event);
    if (set === undefined) this.listeners.set(event, set = new Set());
    set.add(listener);
    return this;
  }

  removeListener(event: string, listener: Listener): this {
    this.listeners.get(event)?.delete(listener);
    return this;
  }
}

/** Whether `exc` is one of the call errors, by name: the EVM's bundle
 * (dist/browser/morphogen-call.js) carries classes of its own, equal but not identical. */
function named(exc: unknown, name: string): exc is Error {
  return exc instanceof Error && exc.name === name; // set by each class, kept by minifiers
}

/** The JSON-RPC error of a failed private read (morphogen/wallet/jsonrpc.py's codes): never
 * a guess, never a number that was not proven. */
function rpcError(method: string, exc: unknown): ProviderRpcError {
  if (exc instanceof ProviderRpcError) return exc;
  if (named(exc, "CallFailed")) {
    const failed = exc as CallFailed;
    return failed.reverted
      ? new ProviderRpcError(EXECUTION_REVERTED, "execution reverted", to0xHex(failed.data))
      : new ProviderRpcError(CALL_HALTED, `${method}: the call failed: ${exc.message.slice(0, 200)}`);
  }
  if (named(exc, "CallLimitError")) return new ProviderRpcError(LIMIT_EXCEEDED, `${method}: over this provider's limits: ${exc.message}`);
  if (named(exc, "CallParamsError")) return new ProviderRpcError(INVALID_PARAMS, `${method}: ${exc.message}`);
  if (exc instanceof InvalidParams) return new ProviderRpcError(INVALID_PARAMS, `${method}: ${exc.message}`);
  if (exc instanceof StaleTableError) return new ProviderRpcError(UNAVAILABLE, `${method}: stale state: ${exc.message}`);
  if (exc instanceof KeywordIntegrityError || exc instanceof TableChangingError) {
    return new ProviderRpcError(UNAVAILABLE, `${method}: no verified answer: ${exc.message}`);
  }
  if (exc instanceof PirError) return new ProviderRpcError(UNAVAILABLE, `${method}: the parties did not answer: ${exc.message}`);
  // a bug: named, without the request's contents
  const name = exc instanceof Error ? exc.name : typeof exc;
  return new ProviderRpcError(INTERNAL_ERROR, `${method}: internal error (${name})`);
}
