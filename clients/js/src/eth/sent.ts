// The nonces of the transactions this provider sent to its fallback, for `pending`
// (morphogen/wallet/sent.py, the Python endpoint's).
//
// A node answers eth_getTransactionCount(address, "pending") with its pool's transactions
// counted, and wallet libraries ask it for the nonce of the next transaction (ethers' and
// viem's `sendTransaction`): two sent one after the other get consecutive nonces. The parties
// serve the signed block only, which a transaction sent a moment ago is not in, so answered as
// `latest` the second of two would reuse the first's nonce and the node would refuse it.
//
// So the provider keeps, for the sender of each transaction it handed to the fallback and the
// fallback took, the nonce after it, and answers `pending` with the larger of that and the
// signed block's nonce. The sender and the nonce are the fallback's own answer for the
// transaction's hash (eth_getTransactionByHash), asked once right after the send: the node
// holds that transaction already, so the question tells it nothing new, and nothing is asked
// for an address that only reads. An entry goes once the signed block's nonce reaches it, or
// after `KEEP_S` (a transaction the pool dropped); at most `MAX_SENDERS` are kept, the oldest
// sent going first. Transactions sent to the node some other way are not counted.

import { toHex } from "../bytes.js";
import { addressBytes } from "./records.js";
import type { Eip1193Provider } from "./provider.js";

export const KEEP_S = 600;
export const MAX_SENDERS = 4096;

const HASH = /^0x[0-9a-fA-F]{64}$/;
const HEX = /^0x[0-9a-fA-F]+$/;

/** Seconds, monotonic. */
const monotonic = () => performance.now() / 1000;

export interface SentNoncesOptions {
  /** How long an entry is kept without the signed block reaching it, in seconds. */
  keepS?: number;
  /** How many senders are kept at most; the oldest sent goes first. */
  maxSenders?: number;
  /** The time in seconds (monotonic): `performance.now() / 1000` unless given. */
  clock?: () => number;
}

export class SentNonces {
  readonly keepS: number;
  readonly maxSenders: number;
  private readonly clock: () => number;
  /** lowercase hex address -> [the next nonce, when sent]; in the order last sent */
  private readonly next = new Map<string, [bigint, number]>();

  constructor(options: SentNoncesOptions = {}) {
    this.keepS = options.keepS ?? KEEP_S;
    this.maxSenders = options.maxSenders ?? MAX_SENDERS;
    this.clock = options.clock ?? monotonic;
  }

  /** The node took a transaction of `address` with `nonce`. */
  sent(address: Uint8Array | string, nonce: bigint): void {
    const key = toHex(addressBytes(address));
    const was = this.next.get(key)?.[0] ?? 0n;
    this.next.delete(key);
    this.next.set(key, [was > nonce + 1n ? was : nonce + 1n, this.clock()]);
    for (const oldest of this.next.keys()) {
      if (this.next.size <= this.maxSenders) break;
      this.next.delete(oldest);
    }
  }

  /** The nonce of `address`'s next transaction, given its nonce at the signed block. */
  pending(address: Uint8Array | string, signed: bigint): bigint {
    const key = toHex(addressBytes(address));
    const entry = this.next.get(key);
    if (entry === undefined) return signed;
    const [nonce, when] = entry;
    if (nonce <= signed || this.clock() - when > this.keepS) {
      this.next.delete(key);
      return signed;
    }
    return nonce;
  }

  /** How many senders are kept. */
  get size(): number {
    return this.next.size;
  }
}

/** Note the sender and nonce of the transaction the fallback took as `txHash`, as the
 * fallback gives them; nothing where it does not (an answer of another shape is left alone,
 * and a failure of the lookup never changes the send's answer). */
export async function learn(sent: SentNonces, fallback: Eip1193Provider, txHash: unknown): Promise<void> {
  if (typeof txHash !== "string" || !HASH.test(txHash)) return;
  try {
    const tx = await fallback.request({ method: "eth_getTransactionByHash", params: [txHash] });
    if (typeof tx !== "object" || tx === null) return;
    const { from, nonce } = tx as Record<string, unknown>;
    if (typeof from !== "string" || typeof nonce !== "string" || !HEX.test(nonce)) return;
    sent.sent(addressBytes(from), BigInt(nonce));
  } catch {
    return; // the send stands; `pending` is the signed block's
  }
}
