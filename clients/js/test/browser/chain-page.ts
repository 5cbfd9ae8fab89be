// The page of the browser chain test (tests/integration/test_js_browser_chain.py) and of
// `morphogen demo --web`: viem, with the private provider as its transport, reads a block
// number, an account's balance and a token's balance of it (eth_call, run in the page's EVM)
// from two parties serving a chain's tables; it shows the address asked, each answer, the
// block they are proven at, and what each party was sent; everything is left in
// `window.results` (a promise) for the test. Bundled with viem (npm run bundle:pages).
//
// Query string: a, b (the parties' base URLs), owner (the data owner's public key, hex),
// holder (the address asked), token (an ERC-20's address), lie=b (party B's answers changed).

import { type Address, createPublicClient, custom, erc20Abi } from "viem";

import { PrivateCalls } from "../../src/eth/call.js";
import { EthState, PirClient, PrivateProvider, RetryPolicy } from "../../src/index.js";
import { stepper, watchedFetch } from "./watch.js";

const q = new URLSearchParams(location.search);
const A = q.get("a")!, B = q.get("b")!;
const holder = q.get("holder") as Address, token = q.get("token") as Address;

async function run() {
  document.getElementById("where")!.textContent = `page ${location.origin}; parties ${A} and ${B}`;
  document.getElementById("asked")!.textContent = holder;
  const { fetch, seen } = watchedFetch(B, q.get("lie") === "b");
  const pir = new PirClient(A, B, { fetch, encoding: "msgpack", retry: new RetryPolicy(14, 0.05, 0.5) });
  const state = new EthState(pir, q.get("owner")!);
  const provider = new PrivateProvider(state, { calls: new PrivateCalls(state) });
  const viem = createPublicClient({ transport: custom(provider) });
  const { steps, step } = stepper(seen);
  await step("block number", () => viem.getBlockNumber());
  await step("balance (wei)", () => viem.getBalance({ address: holder }));
  await step("token balance (eth_call)", () =>
    viem.readContract({ address: token, abi: erc20Abi, functionName: "balanceOf", args: [holder] }));
  await step("token symbol (eth_call)", () => viem.readContract({ address: token, abi: erc20Abi, functionName: "symbol" }));
  const at = state.latest;
  document.getElementById("proven")!.textContent = at === null ? "nothing proven"
    : `block ${at.number} (${at.hash}), the owner's version ${at.version}, signed by ${q.get("owner")!.slice(0, 16)}...`;
  return { origin: location.origin, steps, seen, served: at };
}

(window as unknown as { results: Promise<unknown> }).results = run();
