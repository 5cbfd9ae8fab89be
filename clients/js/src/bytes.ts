// Byte helpers: hex as the wire spells it ("0x" + lowercase), XOR, randomness.

const HEX = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, "0"));

export function toHex(data: Uint8Array): string {
  let out = "";
  for (let i = 0; i < data.length; i++) out += HEX[data[i]!];
  return out;
}

/** "0x" + lowercase hex, the reference's encoding of every byte string. */
export function to0xHex(data: Uint8Array): string {
  return "0x" + toHex(data);
}

/** Strict decoding: an optional 0x, either case, even length, nothing else. The message never
 * echoes the input, which may be a key. */
export function fromHex(text: string): Uint8Array {
  const body = text.startsWith("0x") || text.startsWith("0X") ? text.slice(2) : text;
  if (body.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(body)) {
    throw new Error("not an even-length hex string");
  }
  const out = new Uint8Array(body.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(body.slice(2 * i, 2 * i + 2), 16);
  return out;
}

export function xorBytes(a: Uint8Array, b: Uint8Array): Uint8Array {
  if (a.length !== b.length) throw new Error(`xor of ${a.length} and ${b.length} bytes`);
  const out = new Uint8Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i]! ^ b[i]!;
  return out;
}

export function concatBytes(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

export function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i]! ^ b[i]!;
  return diff === 0;
}

/** Bytes from the platform's CSPRNG (Web Crypto: node and every browser have it). */
export function randomBytes(n: number): Uint8Array {
  const out = new Uint8Array(n);
  // getRandomValues fills at most 65536 bytes a call
  for (let at = 0; at < n; at += 65536) {
    globalThis.crypto.getRandomValues(out.subarray(at, Math.min(n, at + 65536)));
  }
  return out;
}

/** A uniform integer in [0, bound), bound <= 2^32, by rejection (no modulo bias). */
export function randomBelow(bound: number): number {
  if (!Number.isInteger(bound) || bound < 1 || bound > 2 ** 32) {
    throw new RangeError(`bound ${bound} is not in 1..2^32`);
  }
  const limit = 2 ** 32 - (2 ** 32 % bound);
  const word = new Uint32Array(1);
  for (;;) {
    globalThis.crypto.getRandomValues(word);
    if (word[0]! < limit) return word[0]! % bound;
  }
}
