export * from "./constants.js";
export { fromHex, to0xHex, toHex, xorBytes } from "./bytes.js";
export { expand } from "./prg.js";
export { DomainError, DpfKey, KeyFormatError, generateKeys } from "./dpf.js";
export type { RootSeeds } from "./dpf.js";
export { PackedKey, generatePackedKeys } from "./packed.js";
export { PirClient, RetryPolicy, checkServerUrl } from "./client.js";
export type { PirClientOptions } from "./client.js";
export {
  DataMoved,
  EpochMismatchError,
  PageOutOfRange,
  PirError,
  PirUnavailable,
  RETRY_STATUSES,
  ServerInfo,
  UnknownTable,
  View,
  decodeAnswer,
  encodeRequest,
  infoFromEpoch,
  makeKeys,
  planTargets,
  xorPages,
} from "./wire.js";
export type { Answer, Encoding, TableInfo } from "./wire.js";
