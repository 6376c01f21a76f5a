#!/usr/bin/env bash
# Regenerates every replay figure in README.md and docs/replay/ (sweeps, run plots, the day-scale
# measurement). Each line is the command a user would type; nothing here is tuned per workload.
# Takes ~60 min on a 2-core machine (the 12-hour day sweep is most of it): run it as a benchmark,
# not in CI (CI runs the same sweeps on 21-minute slices, tests/test_replay.py).
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/replay
common=(--profile 70b-h100x4 --slo-ttft 2 --routing least-loaded --workers "${WORKERS:-2}")
day=(--trace conv --rate-curve servegen --curve-model m-small --hours 17:29 --peak-rate 140)

only="${1:-all}"  # all | conv | bursty | day | plots | dayscale | oracle (re-run only its points)
run() { [[ "$only" == all || "$only" == "$1" ]]; }

if run conv; then
  keda-llm-scaler replay --trace conv --rate-scale 12 --hpa-behavior llm --sweep --out-dir "$out/conv-llm" "${common[@]}"
  keda-llm-scaler replay --trace conv --rate-scale 12 --hpa-behavior default --sweep --out-dir "$out/conv-default" "${common[@]}"
fi
if run bursty; then
  keda-llm-scaler replay --trace bursty --rate-scale 4 --hpa-behavior llm --sweep --out-dir "$out/bursty-llm" "${common[@]}"
  keda-llm-scaler replay --trace bursty --rate-scale 4 --hpa-behavior default --sweep --out-dir "$out/bursty-default" "${common[@]}"
fi
if run day; then
  keda-llm-scaler replay "${day[@]}" --hpa-behavior llm --sweep --out-dir "$out/day-llm" "${common[@]}"
  # the composite alone with Kubernetes' default behavior (static fleets and the oracle do not use the HPA)
  keda-llm-scaler replay "${day[@]}" --hpa-behavior default --sweep --policies composite --out-dir "$out/day-default" "${common[@]}"
fi
if [[ "$only" == oracle ]]; then
  # Only the oracle's points, merged into the sweeps above (the other policies are deterministic).
  tmp=$(mktemp -d)
  for spec in "conv-llm conv 12 llm" "conv-default conv 12 default" "bursty-llm bursty 4 llm" "bursty-default bursty 4 default"; do
    read -r name trace scale behavior <<<"$spec"
    keda-llm-scaler replay --trace "$trace" --rate-scale "$scale" --hpa-behavior "$behavior" --sweep --policies oracle \
      --out-dir "$tmp/$name" --quiet "${common[@]}"
    python scripts/merge_sweep.py "$out/$name" "$tmp/$name"
  done
  keda-llm-scaler replay "${day[@]}" --hpa-behavior llm --sweep --policies oracle --out-dir "$tmp/day-llm" --quiet "${common[@]}"
  python scripts/merge_sweep.py "$out/day-llm" "$tmp/day-llm"
fi
if run plots; then
  keda-llm-scaler replay --trace conv --rate-scale 12 --hpa-behavior llm --policy composite --plot "$out/conv-composite-default.png" --quiet "${common[@]:0:6}"
  keda-llm-scaler replay --trace bursty --rate-scale 4 --hpa-behavior llm --policy composite --plot "$out/bursty-composite-default.png" --quiet "${common[@]:0:6}"
  /usr/bin/time -v keda-llm-scaler replay "${day[@]}" --hpa-behavior llm --policy composite --plot "$out/day-composite-default.png" --progress --json "${common[@]:0:6}" \
    > "$out/day-composite-default.json" 2> "$out/day-composite-default.time"
  keda-llm-scaler replay "${day[@]}" --hpa-behavior llm --policy static --knob 11 --plot "$out/day-static-11.png" --quiet "${common[@]:0:6}"
  keda-llm-scaler replay "${day[@]}" --hpa-behavior llm --policy oracle --plot "$out/day-oracle.png" --quiet "${common[@]:0:6}"
fi
if run dayscale; then
  # Day-scale limits: a 24-hour day of ~1.3 M requests (seconds per simulated 12 h, max RSS).
  /usr/bin/time -v keda-llm-scaler replay --trace conv --rate-curve servegen --curve-model m-small --hours 0:24 \
    --peak-rate 30 --hpa-behavior llm --policy composite --progress --json "${common[@]:0:6}" \
    > "$out/dayscale-24h.json" 2> "$out/dayscale-24h.time"
fi
