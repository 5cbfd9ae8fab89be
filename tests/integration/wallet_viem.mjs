// A dapp's reads through `morphogen rpc` with viem (tests/integration/test_wallet_rpc.py runs
// it with node): VIEM=<viem's ESM entry, a file URL> node wallet_viem.mjs URL TOKEN ADDRESS...
// -> one JSON object on stdout. viem is where .ci/run installs it (.tools/node_modules).
const { createPublicClient, http, parseAbi } = await import(process.env.VIEM);

const [url, token, ...addresses] = process.argv.slice(2);
const client = createPublicClient({ transport: http(url) });
const abi = parseAbi(["function balanceOf(address) view returns (uint256)"]);
const out = {
  chainId: await client.getChainId(),
  blockNumber: (await client.getBlockNumber()).toString(),
  accounts: {},
};
for (const address of addresses) {
  out.accounts[address] = {
    balance: (await client.getBalance({ address })).toString(),
    nonce: await client.getTransactionCount({ address }),
    code: (await client.getCode({ address })) ?? "0x",
    slot0: await client.getStorageAt({ address: token, slot: "0x0" }),
    token: (await client.readContract({ address: token, abi, functionName: "balanceOf",
                                        args: [address] })).toString(),
  };
}
console.log(JSON.stringify(out));
