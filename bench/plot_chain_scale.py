"""What a block costs against the table's size, as a plot: bench/chain_scale.py's owner and
party bytes and apply time, and bench/chain_lag_scale.py's lag, phases and follower memory,
each against the table's records (from their results files; nothing is measured here).

    python bench/plot_chain_scale.py      # -> bench/results/chain_scale.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def plot(scale: dict, lag: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((lags, phases), (nbytes, memory)) = plt.subplots(2, 2, figsize=(11, 8))
    rows = sorted(lag["sizes"].values(), key=lambda r: r["records"])
    x = [r["records"] / 1e6 for r in rows]
    for key, label in (("lag_p50_s", "lag p50"), ("lag_p99_s", "lag p99"),
                       ("lag_max_s", "lag max")):
        lags.plot(x, [r[key] for r in rows], "o-", label=label)
    lags.axhline(3, color="grey", linestyle="--", label="p99 target, 3 s")
    lags.set_ylabel("seconds, block mined -> served by both parties")
    lags.set_title("through a real node (chain_lag_scale)")
    for phase in ("trace", "read", "apply", "publish"):
        phases.plot(x, [r["phase_s_median"][phase] for r in rows], "o-", label=phase)
    own = sorted(scale["sizes"].items(), key=lambda kv: int(kv[0]))
    xs = [int(k) / 1e6 for k, _ in own]
    phases.plot(xs, [v["now"]["apply_s_median"] for _, v in own], "s--",
                label="apply, owner in process (chain_scale)")
    phases.set_ylabel("seconds a block, median")
    phases.set_title("a block's phases")
    for key, label in (("owner_mib_per_block_steady", "owner writes (full copies' share in)"),
                       ("party_received_mib_per_block", "each party receives"),
                       ("party_log_mib_per_block", "each party's log")):
        nbytes.plot(xs, [v["now"][key] for _, v in own], "o-", label=label)
    nbytes.set_ylabel("MiB a block")
    nbytes.set_title(f"bytes of a {scale['block_records']:,}-record block (chain_scale)")
    memory.plot(x, [r["follower_own_mib_loaded"] for r in rows], "o-",
                label="follower's own, started")
    memory.plot(x, [r["follower_own_mib_after"] for r in rows], "o-",
                label="follower's own, after the blocks")
    memory.set_ylabel("MiB (resident, less mapped files)")
    memory.set_title("follower memory")
    for ax in (lags, phases, nbytes, memory):
        ax.set_xscale("log")
        ax.set_xticks(x, [f"{v:.3g}" for v in x])
        ax.minorticks_off()
        ax.set_xlabel("records in the tables (millions)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    scale = json.loads((RESULTS / "chain_scale.json").read_text())
    lag = json.loads((RESULTS / "chain_lag_scale.json").read_text())
    plot(scale, lag, RESULTS / "chain_scale.png")
    print(RESULTS / "chain_scale.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
