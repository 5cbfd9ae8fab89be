"""Compiles wallet_contracts.sol with solc-js into wallet_contracts.json (ABI and creation
bytecode of each contract), so the tests need no compiler:

    npm install --prefix /tmp/solc solc@0.8.28
    python tests/vectors/wallet_contracts.py /tmp/solc/node_modules/solc/solc.js
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    solcjs = sys.argv[1]
    standard = {
        "language": "Solidity",
        "sources": {"wallet_contracts.sol": {
            "content": (HERE / "wallet_contracts.sol").read_text()}},
        "settings": {"optimizer": {"enabled": True, "runs": 200}, "evmVersion": "cancun",
                     "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object"]}}},
    }
    proc = subprocess.run(["node", solcjs, "--standard-json"], input=json.dumps(standard),
                          capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout[proc.stdout.index("{"):])  # solc-js may print a note first
    errors = [e for e in out.get("errors", []) if e["severity"] == "error"]
    if errors:
        print("\n".join(e["formattedMessage"] for e in errors), file=sys.stderr)
        return 1
    contracts = out["contracts"]["wallet_contracts.sol"]
    result = {name: {"abi": c["abi"], "bytecode": "0x" + c["evm"]["bytecode"]["object"]}
              for name, c in sorted(contracts.items())}
    (HERE / "wallet_contracts.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {HERE / 'wallet_contracts.json'}: {', '.join(result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
