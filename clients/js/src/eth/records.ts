// Ethereum state as keyword records (morphogen/chain/state.py): three tables of fixed-size
// values, so that the size of an answer never says what kind of account was read.
//
//   accounts  key: address (20)            value: nonce (8) | balance (32) | code hash (32)
//   storage   key: address (20) | slot (32) value: the word (32); a zero word has no record
//   code      key: code hash (32) | index (4) value: length (4) | code[1020 i : 1020 (i + 1)],
//             zero-padded; code is keyed by its hash, so contracts sharing code share records

import { keccak_256 } from "@noble/hashes/sha3.js";

import { concatBytes, equalBytes, fromHex } from "../bytes.js";

export const ADDRESS_SIZE = 20;
export const WORD_SIZE = 32;
export const ACCOUNT_VALUE_SIZE = 8 + WORD_SIZE + WORD_SIZE;
export const STORAGE_KEY_SIZE = ADDRESS_SIZE + WORD_SIZE;
export const CODE_KEY_SIZE = WORD_SIZE + 4;
export const CODE_VALUE_SIZE = 1024;
export const CODE_CHUNK_SIZE = CODE_VALUE_SIZE - 4;

export function keccak256(data: Uint8Array): Uint8Array {
  return keccak_256(data);
}

export const EMPTY_CODE_HASH = keccak256(new Uint8Array());

export interface Account {
  nonce: bigint;
  balance: bigint; // wei
  codeHash: Uint8Array;
}

function bytesOf(value: Uint8Array | string, size: number, what: string): Uint8Array {
  let raw: Uint8Array;
  if (typeof value === "string") {
    if (!/^0[xX]/.test(value)) throw new TypeError(`${what} is 0x-hex`);
    raw = fromHex(value);
  } else {
    raw = value;
  }
  if (raw.length !== size) throw new TypeError(`${what} is ${size} bytes, got ${raw.length}`);
  return Uint8Array.from(raw);
}

/** A 20-byte address from bytes or 0x-hex (any case, no checksum required). */
export function addressBytes(address: Uint8Array | string): Uint8Array {
  return bytesOf(address, ADDRESS_SIZE, "an address");
}

/** A 32-byte word from a bigint, a number, 32 bytes, or 0x-hex of at most 32 bytes (a
 * quantity such as "0x1" is widened). */
export function wordBytes(word: bigint | number | Uint8Array | string, what = "a word"): Uint8Array {
  let n: bigint;
  if (typeof word === "string") {
    if (!/^0[xX][0-9a-fA-F]{0,64}$/.test(word)) throw new TypeError(`${what} is 0x-hex of at most 32 bytes`);
    n = word.length === 2 ? 0n : BigInt(word);
  } else if (typeof word === "number") {
    if (!Number.isSafeInteger(word)) throw new TypeError(`${what} given as a number is a safe integer`);
    n = BigInt(word);
  } else if (typeof word === "bigint") {
    n = word;
  } else {
    return bytesOf(word, WORD_SIZE, what);
  }
  if (n < 0n || n >= 1n << 256n) throw new RangeError(`${what} must be in [0, 2**256)`);
  return bigintBytes(n, WORD_SIZE);
}

export function bigintBytes(n: bigint, size: number): Uint8Array {
  const out = new Uint8Array(size);
  for (let i = size - 1; i >= 0 && n > 0n; i--, n >>= 8n) out[i] = Number(n & 0xffn);
  return out;
}

export function bytesBigint(raw: Uint8Array): bigint {
  let n = 0n;
  for (const b of raw) n = (n << 8n) | BigInt(b);
  return n;
}

export function decodeAccount(value: Uint8Array): Account {
  if (value.length !== ACCOUNT_VALUE_SIZE) {
    throw new RangeError(`an account value is ${ACCOUNT_VALUE_SIZE} bytes, got ${value.length}`);
  }
  return {
    nonce: bytesBigint(value.subarray(0, 8)),
    balance: bytesBigint(value.subarray(8, 40)),
    codeHash: Uint8Array.from(value.subarray(40)),
  };
}

export function storageKey(address: Uint8Array | string, slot: bigint | number | Uint8Array | string): Uint8Array {
  return concatBytes(addressBytes(address), wordBytes(slot, "a slot"));
}

/** The word of a storage lookup; null (no record) is zero, as on the chain. */
export function decodeStorageValue(value: Uint8Array | null): bigint {
  if (value === null) return 0n;
  if (value.length !== WORD_SIZE) throw new RangeError(`a storage value is ${WORD_SIZE} bytes, got ${value.length}`);
  return bytesBigint(value);
}

export function codeKey(codeHash: Uint8Array, index: number): Uint8Array {
  if (codeHash.length !== WORD_SIZE) throw new RangeError(`a code hash is 32 bytes, got ${codeHash.length}`);
  if (!Number.isInteger(index) || index < 0 || index >= 2 ** 32) throw new RangeError("a chunk index is in [0, 2**32)");
  const out = new Uint8Array(CODE_KEY_SIZE);
  out.set(codeHash);
  new DataView(out.buffer).setUint32(WORD_SIZE, index, false);
  return out;
}

/** How many records code of `length` bytes takes. */
export function codeChunks(length: number): number {
  return Math.ceil(length / CODE_CHUNK_SIZE);
}

/** The total code length a chunk value states (every chunk states it). */
export function codeLength(chunk: Uint8Array): number {
  if (chunk.length !== CODE_VALUE_SIZE) throw new RangeError(`a code value is ${CODE_VALUE_SIZE} bytes, got ${chunk.length}`);
  return new DataView(chunk.buffer, chunk.byteOffset, 4).getUint32(0, false);
}

/** The code from its chunk values in index order, checked: every chunk states the same
 * length, there are as many as it needs, the padding is zero, and the code hashes to
 * `codeHash`. Error says which check failed. */
export function joinCode(codeHash: Uint8Array, chunks: readonly Uint8Array[]): Uint8Array {
  if (equalBytes(codeHash, EMPTY_CODE_HASH)) {
    if (chunks.length) throw new Error("empty code has no chunks");
    return new Uint8Array();
  }
  if (!chunks.length) throw new Error("code with a hash other than the empty code's needs its chunks");
  const length = codeLength(chunks[0]!);
  if (chunks.length !== codeChunks(length)) {
    throw new Error(`code of ${length} bytes is ${codeChunks(length)} chunks, got ${chunks.length}`);
  }
  const code = new Uint8Array(length);
  chunks.forEach((value, i) => {
    if (codeLength(value) !== length) throw new Error(`chunk ${i} states length ${codeLength(value)}, chunk 0 ${length}`);
    const used = Math.min(CODE_CHUNK_SIZE, length - i * CODE_CHUNK_SIZE);
    if (value.subarray(4 + used).some((b) => b !== 0)) throw new Error(`chunk ${i} has bytes past the code's end`);
    code.set(value.subarray(4, 4 + used), i * CODE_CHUNK_SIZE);
  });
  if (!equalBytes(keccak256(code), codeHash)) throw new Error("the joined code does not hash to its code hash");
  return code;
}
