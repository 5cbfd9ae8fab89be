// The ChaCha8 length-doubling PRG G(seed) -> (L, R, tL, tR) of PROTOCOL.md section 2: the key
// is seed||seed, the nonce zero; block 0 gives the two child seeds, block 1 their control bits.

import { SEED_BYTES } from "./constants.js";

const SIGMA: readonly number[] = [0x61707865, 0x3320646e, 0x79622d32, 0x6b206574];

export interface Expanded {
  left: Uint8Array;
  right: Uint8Array;
  tLeft: number;
  tRight: number;
}

/** One ChaCha8 block keyed by the four seed words twice, counter `counter`, into `out`. */
export function chacha8Block(w: Uint32Array, counter: number, out: Uint32Array): void {
  const i0 = SIGMA[0]!, i1 = SIGMA[1]!, i2 = SIGMA[2]!, i3 = SIGMA[3]!;
  const i4 = w[0]!, i5 = w[1]!, i6 = w[2]!, i7 = w[3]!;
  const i12 = counter >>> 0;
  let x0 = i0, x1 = i1, x2 = i2, x3 = i3, x4 = i4, x5 = i5, x6 = i6, x7 = i7;
  let x8 = i4, x9 = i5, x10 = i6, x11 = i7, x12 = i12, x13 = 0, x14 = 0, x15 = 0;
  // unrolled by hand: quarter rounds through a helper would need the state in an array
  for (let r = 0; r < 4; r++) {
    x0 = (x0 + x4) | 0; x12 ^= x0; x12 = (x12 << 16) | (x12 >>> 16);
    x8 = (x8 + x12) | 0; x4 ^= x8; x4 = (x4 << 12) | (x4 >>> 20);
    x0 = (x0 + x4) | 0; x12 ^= x0; x12 = (x12 << 8) | (x12 >>> 24);
    x8 = (x8 + x12) | 0; x4 ^= x8; x4 = (x4 << 7) | (x4 >>> 25);
    x1 = (x1 + x5) | 0; x13 ^= x1; x13 = (x13 << 16) | (x13 >>> 16);
    x9 = (x9 + x13) | 0; x5 ^= x9; x5 = (x5 << 12) | (x5 >>> 20);
    x1 = (x1 + x5) | 0; x13 ^= x1; x13 = (x13 << 8) | (x13 >>> 24);
    x9 = (x9 + x13) | 0; x5 ^= x9; x5 = (x5 << 7) | (x5 >>> 25);
    x2 = (x2 + x6) | 0; x14 ^= x2; x14 = (x14 << 16) | (x14 >>> 16);
    x10 = (x10 + x14) | 0; x6 ^= x10; x6 = (x6 << 12) | (x6 >>> 20);
    x2 = (x2 + x6) | 0; x14 ^= x2; x14 = (x14 << 8) | (x14 >>> 24);
    x10 = (x10 + x14) | 0; x6 ^= x10; x6 = (x6 << 7) | (x6 >>> 25);
    x3 = (x3 + x7) | 0; x15 ^= x3; x15 = (x15 << 16) | (x15 >>> 16);
    x11 = (x11 + x15) | 0; x7 ^= x11; x7 = (x7 << 12) | (x7 >>> 20);
    x3 = (x3 + x7) | 0; x15 ^= x3; x15 = (x15 << 8) | (x15 >>> 24);
    x11 = (x11 + x15) | 0; x7 ^= x11; x7 = (x7 << 7) | (x7 >>> 25);

    x0 = (x0 + x5) | 0; x15 ^= x0; x15 = (x15 << 16) | (x15 >>> 16);
    x10 = (x10 + x15) | 0; x5 ^= x10; x5 = (x5 << 12) | (x5 >>> 20);
    x0 = (x0 + x5) | 0; x15 ^= x0; x15 = (x15 << 8) | (x15 >>> 24);
    x10 = (x10 + x15) | 0; x5 ^= x10; x5 = (x5 << 7) | (x5 >>> 25);
    x1 = (x1 + x6) | 0; x12 ^= x1; x12 = (x12 << 16) | (x12 >>> 16);
    x11 = (x11 + x12) | 0; x6 ^= x11; x6 = (x6 << 12) | (x6 >>> 20);
    x1 = (x1 + x6) | 0; x12 ^= x1; x12 = (x12 << 8) | (x12 >>> 24);
    x11 = (x11 + x12) | 0; x6 ^= x11; x6 = (x6 << 7) | (x6 >>> 25);
    x2 = (x2 + x7) | 0; x13 ^= x2; x13 = (x13 << 16) | (x13 >>> 16);
    x8 = (x8 + x13) | 0; x7 ^= x8; x7 = (x7 << 12) | (x7 >>> 20);
    x2 = (x2 + x7) | 0; x13 ^= x2; x13 = (x13 << 8) | (x13 >>> 24);
    x8 = (x8 + x13) | 0; x7 ^= x8; x7 = (x7 << 7) | (x7 >>> 25);
    x3 = (x3 + x4) | 0; x14 ^= x3; x14 = (x14 << 16) | (x14 >>> 16);
    x9 = (x9 + x14) | 0; x4 ^= x9; x4 = (x4 << 12) | (x4 >>> 20);
    x3 = (x3 + x4) | 0; x14 ^= x3; x14 = (x14 << 8) | (x14 >>> 24);
    x9 = (x9 + x14) | 0; x4 ^= x9; x4 = (x4 << 7) | (x4 >>> 25);
  }
  out[0] = x0 + i0; out[1] = x1 + i1; out[2] = x2 + i2; out[3] = x3 + i3;
  out[4] = x4 + i4; out[5] = x5 + i5; out[6] = x6 + i6; out[7] = x7 + i7;
  out[8] = x8 + i4; out[9] = x9 + i5; out[10] = x10 + i6; out[11] = x11 + i7;
  out[12] = x12 + i12; out[13] = x13; out[14] = x14; out[15] = x15;
}

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
const block0 = new Uint32Array(16);
const block1 = new Uint32Array(16);
const words = new Uint32Array(4);

function seedWords(seed: Uint8Array): Uint32Array {
  if (seed.length !== SEED_BYTES) throw new Error(`a PRG seed is 16 bytes, got ${seed.length}`);
  const v = new DataView(seed.buffer, seed.byteOffset, 16);
  for (let i = 0; i < 4; i++) words[i] = v.getUint32(4 * i, true);
  return words;
}

function wordsToBytes(src: Uint32Array, from: number): Uint8Array {
  const out = new Uint8Array(16);
  if (LITTLE_ENDIAN) {
    out.set(new Uint8Array(src.buffer, src.byteOffset + 4 * from, 16));
  } else {
    const v = new DataView(out.buffer);
    for (let i = 0; i < 4; i++) v.setUint32(4 * i, src[from + i]!, true);
  }
  return out;
}

/** G(seed): the left and right child seeds and their control bits. */
export function expand(seed: Uint8Array): Expanded {
  const w = seedWords(seed);
  chacha8Block(w, 0, block0);
  chacha8Block(w, 1, block1);
  return {
    left: wordsToBytes(block0, 0),
    right: wordsToBytes(block0, 4),
    tLeft: block1[0]! & 1,
    tRight: block1[1]! & 1,
  };
}
