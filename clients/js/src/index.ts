export * from "./constants.js";
export { fromHex, to0xHex, toHex, xorBytes } from "./bytes.js";
export { expand } from "./prg.js";
export { DomainError, DpfKey, KeyFormatError, generateKeys } from "./dpf.js";
export type { RootSeeds } from "./dpf.js";
export { PackedKey, generatePackedKeys } from "./packed.js";
