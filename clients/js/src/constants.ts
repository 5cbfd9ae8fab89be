// The numbers of PROTOCOL.md and docs/packed-keys.md, as morphogen/constants.py defines them.

export const PAGE_SIZE = 4096;
export const KEYS_PER_QUERY = 3;
export const MAX_BATCH_QUERIES = 32;
export const MIN_DOMAIN_BITS = 1;
export const MAX_DOMAIN_BITS = 32;
export const SEED_BYTES = 16;
export const MASK_BYTES = 16;
export const KEY_HEADER_BYTES = 19; // root_seed(16) root_t(1) party(1) d(1)
export const KEY_LEVEL_BYTES = 18; // cw(16) tcw_left(1) tcw_right(1)

export const PACKED_LEAF_BITS = 7;
export const PACKED_LEAF_PAGES = 1 << PACKED_LEAF_BITS;
export const PACKED_HEADER_BYTES = 20; // the v1 header and a format tag
export const PACKED_TAG = 0x02;

export const KEY_FORMAT_V1 = "v1";
export const KEY_FORMAT_PACKED = "packed";
export type KeyFormat = typeof KEY_FORMAT_V1 | typeof KEY_FORMAT_PACKED;
export const KEY_FORMATS: readonly KeyFormat[] = [KEY_FORMAT_V1, KEY_FORMAT_PACKED];

/** Bytes of one v1 key: 35 + 18 d (d = 25 gives 485). */
export function keyLength(domainBits: number): number {
  return KEY_HEADER_BYTES + KEY_LEVEL_BYTES * domainBits + MASK_BYTES;
}

/** Tree levels of a packed key: d - 7, none for d <= 7. */
export function packedLevels(domainBits: number): number {
  return Math.max(0, domainBits - PACKED_LEAF_BITS);
}

/** Bytes of one packed key: 36 + 18 (d - 7), a multiple of 18 where a v1 key never is. */
export function packedKeyLength(domainBits: number): number {
  return PACKED_HEADER_BYTES + KEY_LEVEL_BYTES * packedLevels(domainBits) + MASK_BYTES;
}

export const QUERY_PATH = "/query/page/gpu";
export const BATCH_PATH = "/query/page/gpu/batch";
export const EPOCH_PATH = "/epoch";
export const HEALTH_PATH = "/health";
export const JSON_TYPE = "application/json";
export const MSGPACK_TYPE = "application/msgpack";
