#!/usr/bin/env bash
# bench-exe.sh NAME [SRC]: builds the spillring-benches bench NAME (`cargo bench --no-run`) of
# the source tree SRC (default: this repository) and prints its executable's path; prints
# nothing (and fails) when it could not be built. Used by the scripts that run one bench binary
# themselves (fio-baseline.sh, devices-bench.sh, ab-pairs.sh's builds at another commit).
set -euo pipefail
name=${1:?usage: bench-exe.sh NAME [SRC]}
cd "${2:-$(dirname "${BASH_SOURCE[0]}")/..}"
exe=$(cargo bench -p spillring-benches --bench "$name" --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == sys.argv[1] and m.get("executable"):
        print(m["executable"])
' "$name")
[[ -n "$exe" ]] || exit 1
echo "$exe"
