#!/usr/bin/env python3
"""Memory of the e2e control plane, idle after start-up, by component (docs/e2e.md):

    ./scripts/controlplane run -- python -m benchmarks.controlplane_memory

Run as ``scripts/controlplane run``'s CMD: its parent is the runner inside the namespace, so every
process of the run (etcd, API server, controller manager, KEDA, the pod stand-in, the scaler) is a
descendant of it; this process is left out.
"""

from __future__ import annotations

import collections
import os
import sys
import time

from benchmarks.soak import _tree


def main() -> int:
    settle_s = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    time.sleep(settle_s)
    by_name: collections.Counter[str] = collections.Counter()
    for pid in _tree(os.getppid())[1:]:  # the runner itself is not part of what a cluster runs
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/status") as f:
                by_name[name] += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    for name, kb in by_name.most_common():
        print(f"{name:24s} {kb / 1024:6.0f} MB")
    print(f"{'total':24s} {sum(by_name.values()) / 1024:6.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
