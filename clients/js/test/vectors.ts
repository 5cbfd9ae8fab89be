// The known-answer files the Python side writes and checks (tests/vectors/ of the repository):
// both clients are held to the same files. MORPHOGEN_VECTORS names another folder.

import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { join } from "node:path";

// compiled to clients/js/dist/test/: four levels up is the repository root
const DEFAULT_DIR = fileURLToPath(new URL("../../../../tests/vectors/", import.meta.url));

export function vectorsDir(): string {
  return process.env.MORPHOGEN_VECTORS ?? DEFAULT_DIR;
}

export function readVectors<T>(name: string): T {
  return JSON.parse(readFileSync(join(vectorsDir(), name), "utf8")) as T;
}
