#!/usr/bin/env bash
# flush-path.sh: the engine source files whose code runs in one buffer flush (issue 24: "a
# buffer flush's path touches <= 12 files"), counted, not read off the code: callgrind runs
# engine/examples/flush_path.rs (a debug build, so no function is inlined away) and collects
# only inside the writer's `flush_staging_with` and the psync I/O thread's `run` of an op
# (the psync backend: callgrind cannot follow io_uring's ring thread); every function of the
# engine that ran there is listed with its file. The example's writes are 4 KiB records into
# 1 MiB staging buffers, its last write inline at `finish`; it exits without deleting, so no
# unlink is counted.
#
#   scripts/flush-path.sh [buffered|direct]     # default buffered; prints the files and their count
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-buffered}
command -v valgrind >/dev/null || { echo "flush-path.sh: valgrind is missing" >&2; exit 1; }
cargo build -q -p spillring --example flush_path
out=$(mktemp /tmp/spillring-flush-path-XXXXXX)
trap 'rm -f "$out"' EXIT
printed=$(valgrind --tool=callgrind --callgrind-out-file="$out" \
    --toggle-collect='*flush_staging_with*' --toggle-collect='spillring::io::psync::run' \
    target/debug/examples/flush_path "$mode" psync 2>/dev/null)
root=${printed##* under }
[[ -d $root ]] && rm -rf "$root"
callgrind_annotate --inclusive=no "$out" 2>/dev/null | python3 -c '
import re, sys
files = {}
for line in sys.stdin:
    m = re.search(r"(engine/src/[\w/]+\.rs):(<?spillring::[^\s\[]+)", line)
    if m:
        files.setdefault(m.group(1), set()).add(m.group(2))
for f in sorted(files):
    print(f"{f}: {len(files[f])} functions: " + ", ".join(sorted(files[f]))[:300])
# fault.rs is there only because the example, like every test, builds with the
# fault-injection feature; an embedder build compiles its points to nothing.
n = len(files) - ("engine/src/fault.rs" in files)
print(f"{len(files)} files; {n} without fault.rs (compiled out of an embedder build)")
'
