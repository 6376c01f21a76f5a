"""Replace some policies' points in a docs sweep with a fresh partial sweep, then re-render it.

A change to one policy (the oracle, say) need not re-run the others, which are deterministic:

    keda-llm-scaler replay ... --sweep --policies oracle --out-dir /tmp/oracle-conv
    python scripts/merge_sweep.py docs/replay/conv-llm /tmp/oracle-conv

rewrites ``sweep.json``, ``sweep.md`` and ``pareto.png`` in the first directory exactly as a full sweep
with the same arguments would (the same sort, table and plot code).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from keda_llm_scaler.sim.plots import plot_pareto
from keda_llm_scaler.sim.policies import POLICIES
from keda_llm_scaler.sim.replay import _table


def main(base: Path, partial: Path, target: float = 0.99) -> None:
    fresh = json.loads((partial / "sweep.json").read_text())
    replaced = {r["policy"] for r in fresh}
    kept = [r for r in json.loads((base / "sweep.json").read_text()) if r["policy"] not in replaced]
    results = sorted(kept + fresh, key=lambda r: (list(POLICIES).index(r["policy"]), r["knob_value"]))
    title = (base / "sweep.md").read_text().splitlines()[0].removeprefix("# Sweep: ")
    (base / "sweep.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    (base / "sweep.md").write_text(f"# Sweep: {title}\n\n" + _table(results, target))
    plot_pareto(base / "pareto.png", results, title)
    print(f"{base}: {len(kept)} kept, {len(fresh)} replaced ({', '.join(sorted(replaced))})")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: merge_sweep.py BASE_SWEEP_DIR PARTIAL_SWEEP_DIR")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
