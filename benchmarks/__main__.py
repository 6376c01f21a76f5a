"""``python -m benchmarks``: issue #11's table in one run (benchmarks/runner.py)."""

import sys

from benchmarks.runner import main

sys.exit(main())
