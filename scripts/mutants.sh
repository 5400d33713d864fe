#!/usr/bin/env bash
# Mutation testing of the engine with cargo-mutants (issue 14; results/MUTANTS.md).
#
#   scripts/mutants.sh                 the short shard (CI): the pure-logic protocols against
#                                      their unit tests, a few minutes; fails on a missed mutant
#   scripts/mutants.sh --full          every module below, each against the test files that
#                                      exercise it (about an hour on 2 busy vCPUs)
#   scripts/mutants.sh MODULE...       only those modules (names as in the table below)
#   options: --out DIR (default results/mutants), --jobs N (default 1), --list (the mutants,
#            no build), --iterate (re-test only what the last run into DIR did not catch)
#
# Each module runs as its own cargo-mutants invocation restricted to its files (`-f`), to its
# functions where a file is shared (`--re`), and to the tests that exercise it, under `nice`.
# Mutants in the loom-only test modules (`#[cfg(loom)]`) are left out: a normal build does not
# compile them. Each run leaves `<out>/<module>.txt` (the summary and the missed, timed-out
# and unviable mutants) and the whole cargo-mutants output in `<out>/<module>.out/` (not
# committed: results/mutants/.gitignore). Exits 1
# if any mutant was missed, 2 if cargo-mutants could not run (a timeout, a test hanging under a
# mutant, is reported but counts as noticed).
#
# cargo-mutants builds a copy of the tree in /tmp, in CARGO_TARGET_DIR (this tree's target/ if
# unset): the dependencies the tests built are reused. The engine itself is built with
# its own profile settings (below), so its artifacts never mix with a normal test build's (two
# builds of one profile from two copies of the tree would: cargo keys them by relative path).
# Do not run two of these at once on one target directory.
set -euo pipefail
cd "$(dirname "$0")/.."

# name ; cargo-mutants file and function filters (no spaces inside one) ; the test targets.
# The test targets go to every cargo call (`-C`): each mutant builds only those binaries.
MODULES=(
  "ledger;-f engine/src/store/ledger.rs;--lib --test admission"
  "cleanup;-f engine/src/cleanup/mod.rs -f engine/src/cleanup/worker.rs -f engine/src/cleanup/sweep.rs;--test cleanup --test errors --test crash --test invariants --test pool --test cleanup_outcomes"
  "grants;-f engine/src/spill/grant.rs --re Grants|StateShared::(release|acquire|is_aborted|unregister|move_to)|close_by_scope|Grant>::drop|open_error -f engine/src/spill/state.rs --re SpilledState::(register|reader|into_reader|is_aborted)|Clone;--lib --test abort --test ownership --test adopt --test invariants --test pool"
  "abort;-f engine/src/spill/writer/hook.rs --re AbortableFiles|WriterShared|Tracker -f engine/src/spill/writer/segfile.rs --re record_segment|reserve_ticket|delete_now|create_failed_after;--lib --test abort --test errors --test admission --test cleanup --test roots --test publish --test async_writers --test device --test pool_trim"
  "queue;-f engine/src/store/queue.rs -f engine/src/store/records.rs;--lib --test cleanup --test errors"
  "codec;-f engine/src/format/cursor.rs;--lib --test corrupt --test publish --test encryption"
  "planted;-f engine/src/format/block.rs --re binding_bytes -f engine/src/format/crypt.rs --re nonce -f engine/src/store/ledger.rs --re take_pages -f engine/src/format/cursor.rs --re SegmentCursor<B>::open_block -f engine/src/spill/writer/segfile.rs --re reuse_segment;--lib --test encryption --test admission --test pool"
)
# The short shard CI runs: the two loom-modelled protocols that are pure logic (a state's grants,
# the writer's abort list and write tracker) against their unit tests only (one test binary:
# a mutant builds and runs in seconds). `shard-ledger` is the ledger's unit-test run. The one
# mutant MUTANTS.md argues equivalent in `Grants` is left out.
SHARD_MODULES=(
  "shard-grants;-f engine/src/spill/grant.rs --re Grants --exclude-re guard\sself\.is_aborted\(\)\swith\sfalse\sin\sGrants<T>::begin_publish;--lib"
  "shard-hook;-f engine/src/spill/writer/hook.rs --re AbortableFiles<T>::(record|hook_ran|abort|take_for_hand_off|take_own|is_aborted)|Tracker;--lib"
)
EXTRA_MODULES=(
  "shard-ledger;-f engine/src/store/ledger.rs;--lib"
)

out=results/mutants
jobs=1
full=0
list=0
want=()
extra=()
while (($#)); do
  case "$1" in
    --full) full=1 ;;
    --out) out="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    --list) list=1 ;;
    # Re-test only what the last run into --out did not catch (cargo-mutants --iterate).
    --iterate) extra+=(--iterate) ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) want+=("$1") ;;
  esac
  shift
done

if ! cargo mutants --version >/dev/null 2>&1; then
  echo "cargo-mutants is not installed: cargo install --locked cargo-mutants" >&2
  exit 2
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

rows=()
if ((${#want[@]})); then
  for w in "${want[@]}"; do
    found=0
    for m in "${MODULES[@]}" "${SHARD_MODULES[@]}" "${EXTRA_MODULES[@]}"; do
      [[ "${m%%;*}" == "$w" ]] && rows+=("$m") && found=1
    done
    ((found)) || { echo "no module $w" >&2; exit 2; }
  done
elif ((full)); then
  rows=("${MODULES[@]}")
else
  rows=("${SHARD_MODULES[@]}")
fi

mkdir -p "$out"
status=0
summary=()
for m in "${rows[@]}"; do
  IFS=';' read -r name filters tests <<<"$m"
  read -ra fargs <<<"$filters"
  read -ra tlist <<<"$tests"
  # The engine itself is built without optimisation or debug info (its dependencies keep
  # theirs): a mutant builds about 4x faster here, and the tests take as long.
  targs=(-C=--config=profile.test.package.spillring.opt-level=0
    -C=--config=profile.test.package.spillring.debug=false)
  for t in "${tlist[@]}"; do targs+=("-C=$t"); done
  if ((list)); then
    cargo mutants --list "${fargs[@]}" --exclude-re 'loom_tests::'
    continue
  fi
  echo "== $name: cargo mutants ${fargs[*]} ${targs[*]}"
  start=$(date +%s)
  rc=0
  # MUTANTS_EXCLUDE_RE: mutants to leave out (e.g. the ones MUTANTS.md argues equivalent, on a
  # re-run with --iterate).
  ex=("${extra[@]}")
  [[ -n "${MUTANTS_EXCLUDE_RE:-}" ]] && ex+=(--exclude-re "$MUTANTS_EXCLUDE_RE")
  nice -n 10 cargo mutants "${fargs[@]}" --exclude-re 'loom_tests::' "${ex[@]}" \
    --jobs "$jobs" --timeout 120 --test-tool nextest -o "$out/$name.out" "${targs[@]}" || rc=$?
  secs=$(($(date +%s) - start))
  mo="$out/$name.out/mutants.out"
  count() { if [[ -f "$mo/$1.txt" ]]; then grep -c . "$mo/$1.txt" || true; else echo 0; fi; }
  line="$name: caught $(count caught), missed $(count missed), unviable $(count unviable), timeout $(count timeout) (${secs} s, cargo-mutants exit $rc)"
  {
    echo "$line"
    echo "command: cargo mutants ${fargs[*]} --exclude-re 'loom_tests::' ${ex[*]} --jobs $jobs --timeout 120 --test-tool nextest ${targs[*]}"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    for k in missed timeout unviable; do
      [[ -s "$mo/$k.txt" ]] && { echo "$k:"; sed 's/^/  /' "$mo/$k.txt"; }
    done
  } >"$out/$name.txt"
  summary+=("$line")
  # cargo-mutants exits 2 for a missed mutant, 3 for a timeout (a test hung under the mutant:
  # the suite noticed it), 4 when the baseline fails. Only a missed mutant fails this script.
  if [[ -s "$mo/missed.txt" ]]; then
    status=1
  elif [[ "$rc" != 0 && "$rc" != 3 ]]; then
    status=2
  fi
done

((list)) && exit 0
echo
echo "== summary (details in $out/)"
printf '%s\n' "${summary[@]}"
exit "$status"
