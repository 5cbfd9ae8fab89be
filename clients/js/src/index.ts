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
export {
  DatasetPin,
  KeywordClient,
  TableChangingError,
  UnknownKeywordTable,
  requestSizes,
} from "./keyword/client.js";
export type { KeywordClientOptions } from "./keyword/client.js";
export {
  KeywordIntegrityError,
  StaleTableError,
  descriptorFromPage,
  descriptorOf,
  publicKeyOf,
  stale,
} from "./keyword/descriptor.js";
export type { Anchor, Bounds, Descriptor } from "./keyword/descriptor.js";
export { candidates, seededHash, siphash13, tagOf } from "./keyword/hashing.js";
export { Geometry, leafHash, levelSizes, nodeHash } from "./keyword/table.js";
export { check, plan, privateLevels, proveWhole, wholePagesWanted } from "./keyword/verify.js";
export type { Proof } from "./keyword/verify.js";
export {
  ACCOUNT_VALUE_SIZE,
  ADDRESS_SIZE,
  CODE_CHUNK_SIZE,
  EMPTY_CODE_HASH,
  addressBytes,
  codeChunks,
  codeKey,
  decodeAccount,
  decodeStorageValue,
  joinCode,
  keccak256,
  storageKey,
  wordBytes,
} from "./eth/records.js";
export type { Account } from "./eth/records.js";
export { CHAIN_TABLES, CODE_READ_CHUNKS, EthState, servedOf } from "./eth/state.js";
export type { EthStateOptions, Served } from "./eth/state.js";
export { CLIENT_VERSION, METHODS, PrivateProvider, ProviderRpcError } from "./eth/provider.js";
export type { BlockWanted, Calls, Eip1193Provider, PrivateProviderOptions, RequestArguments } from "./eth/provider.js";
export { KEEP_S, MAX_SENDERS, SentNonces } from "./eth/sent.js";
export type { SentNoncesOptions } from "./eth/sent.js";
export { CallFailed, CallLimitError, CallNotServed, CallParamsError } from "./eth/call_errors.js";
export type { RoundRead } from "./eth/state.js";
