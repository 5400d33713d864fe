#!/usr/bin/env bash
# Cleanup-path figures: drain rate of the cleanup worker with 10% of deletes failing (vs none,
# same run), and Engine::open time with 10,000 orphaned files (vs an empty root, same run).
# Writes results/cleanup-rates.json.
#   scripts/cleanup-rates.sh [--records N] [--orphans N]
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/cleanup-rates.json
mkdir -p results
cargo build -q --release --example cleanup_rates
json=$(target/release/examples/cleanup_rates "$@")
python3 - "$out" <<PY
import json, subprocess, sys, platform, os
data = json.loads('''$json''')
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip() != ""
data["commit"] = commit + ("-dirty" if dirty else "")
data["machine"] = f"{platform.uname().system} {platform.uname().release} {platform.machine()}, {os.cpu_count()} cores"
data["script"] = "scripts/cleanup-rates.sh " + " ".join(sys.argv[2:])
json.dump(data, open(sys.argv[1], "w"), indent=2)
print(json.dumps(data, indent=2))
PY
