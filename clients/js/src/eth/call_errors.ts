// How an eth_call or eth_estimateGas ends without a result (src/eth/call.ts), apart from the
// EVM so that the provider answers them with their JSON-RPC codes without loading it.

/** Not run privately here: the provider hands the request to its fallback. */
export class CallNotServed extends Error {
  override name = "CallNotServed";
}

/** Bad params: JSON-RPC -32602. */
export class CallParamsError extends Error {
  override name = "CallParamsError";
}

/** Past a call's limits (rounds, lookups): -32005, as the Python endpoint answers. */
export class CallLimitError extends Error {
  override name = "CallLimitError";
}

/** The call ran and did not succeed: reverted (a node's code 3, with its data) or halted. */
export class CallFailed extends Error {
  override name = "CallFailed";

  constructor(message: string, readonly reverted: boolean, readonly data: Uint8Array) {
    super(message);
  }
}
