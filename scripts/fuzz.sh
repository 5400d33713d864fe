#!/usr/bin/env bash
# Fuzzes the engine with cargo-fuzz (libFuzzer): the targets under fuzz/fuzz_targets/, one at a
# time, each for a fixed time. Run from anywhere; it works from the repository root.
#
#   scripts/fuzz.sh                      # every target, 60 s each (plus the build)
#   scripts/fuzz.sh --seconds 300        # every target, 5 minutes each
#   scripts/fuzz.sh --full               # every target, 600 s each
#   scripts/fuzz.sh state_machine        # one target (names as in fuzz/fuzz_targets/)
#
# Needs the nightly toolchain (`rustup toolchain install nightly`); installs cargo-fuzz with
# `cargo install --locked --debug cargo-fuzz` if `cargo fuzz` is missing (a debug build of the
# tool: it only drives cargo, and builds in a minute instead of several). Builds with
# `cargo +nightly fuzz build` (release, debug assertions, AddressSanitizer) into
# $CARGO_TARGET_DIR, or fuzz/target if unset.
#
# Corpora: fuzz/corpus/<target>/ (kept between runs, git-ignored), seeded from the checked-in
# fuzz/seeds/<target>/. libFuzzer first runs every corpus input once, and that pass is not
# bounded by --seconds: state_machine takes ~50-70 ms an input, so a corpus of 1,000 adds about
# a minute (shrink it with `cargo +nightly fuzz cmin state_machine`). Before fuzzing, each
# target replays fuzz/regressions/<target>/ (saved reproducers of past findings; see the
# README there).
#
# Exits non-zero if a target crashed, failed an assertion, leaked, hung (-timeout=120 s per
# input) or could not run; each failure's reproducer is in fuzz/artifacts/<target>/ and its path
# is printed. Replay one with `cargo +nightly fuzz run <target> <path>`.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
targets=()
while (($#)); do
  case "$1" in
    --seconds)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ && "$2" -gt 0 ]] || {
        echo "fuzz.sh: --seconds needs a positive number of seconds" >&2
        exit 2
      }
      seconds="$2"
      shift 2
      ;;
    --full)
      seconds=600
      shift
      ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    -*)
      echo "fuzz.sh: unknown option $1 (see --help)" >&2
      exit 2
      ;;
    *)
      targets+=("$1")
      shift
      ;;
  esac
done

die() {
  echo "fuzz.sh: $*" >&2
  exit 1
}

# The toolchain and cargo-fuzz.
if ! command -v cargo >/dev/null 2>&1; then
  die "cargo is not installed"
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
  die "the nightly toolchain is missing (cargo-fuzz needs it): rustup toolchain install nightly"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz (cargo install --locked --debug cargo-fuzz)"
  cargo install --locked --debug cargo-fuzz || die "could not install cargo-fuzz"
fi
[[ -f fuzz/Cargo.toml ]] || die "fuzz/Cargo.toml not found: run from a spillring checkout"

all_targets=()
for f in fuzz/fuzz_targets/*.rs; do
  all_targets+=("$(basename "$f" .rs)")
done
if ((${#targets[@]} == 0)); then
  targets=("${all_targets[@]}")
fi
for t in "${targets[@]}"; do
  [[ -f "fuzz/fuzz_targets/$t.rs" ]] || die "no target '$t' (have: ${all_targets[*]})"
done

start=$(date +%s)
echo "== build: cargo +nightly fuzz build (${targets[*]})"
if ((${#targets[@]} == ${#all_targets[@]})); then
  cargo +nightly fuzz build || die "the build failed"
else
  for t in "${targets[@]}"; do
    cargo +nightly fuzz build "$t" || die "the build of $t failed"
  done
fi
build_secs=$(($(date +%s) - start))

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

status=0
summary=()
for t in "${targets[@]}"; do
  corpus="fuzz/corpus/$t"
  artifacts="fuzz/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  dirs=("$corpus")
  [[ -d "fuzz/seeds/$t" ]] && dirs+=("fuzz/seeds/$t")

  # Past findings first: each saved reproducer, run repeatedly (some are races).
  regressions=()
  if [[ -d "fuzz/regressions/$t" ]]; then
    while IFS= read -r -d '' f; do
      regressions+=("$f")
    done < <(find "fuzz/regressions/$t" -type f ! -name '*.md' -print0 | sort -z)
  fi
  if ((${#regressions[@]})); then
    echo
    echo "== $t: replaying ${#regressions[@]} regression input(s) from fuzz/regressions/$t"
    if ! cargo +nightly fuzz run "$t" "${regressions[@]}" -- -runs=200 \
      -artifact_prefix="$artifacts/" >"$logs/$t-regressions.log" 2>&1; then
      tail -n 60 "$logs/$t-regressions.log"
      echo "== $t: a regression input FAILED (log above)"
      summary+=("$t: FAILED a regression input in fuzz/regressions/$t")
      status=1
      continue
    fi
  fi

  echo
  echo "== $t: fuzzing for ${seconds}s (corpus $corpus, seeds fuzz/seeds/$t)"
  log="$logs/$t.log"
  t0=$(date +%s)
  set +e
  cargo +nightly fuzz run "$t" "${dirs[@]}" -- \
    -max_total_time="$seconds" -timeout=120 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" 2>&1 | tee "$log" |
    grep -E --line-buffered '^#[0-9]+ *(pulse|DONE)|INITED|panicked|ERROR|SUMMARY|Test unit written|stats:'
  rc=${PIPESTATUS[0]}
  set -e
  took=$(($(date +%s) - t0))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  size=$(find "$corpus" -type f | wc -l)
  if ((rc != 0)); then
    status=1
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    echo "== $t: FAILED (exit $rc)"
    grep -A 12 -m 1 'panicked at' "$log" || tail -n 40 "$log"
    if [[ -n "$artifact" ]]; then
      echo "== $t: reproducer: $artifact"
      echo "==     replay: cargo +nightly fuzz run $t $artifact"
      summary+=("$t: FAILED after ${took}s, ${execs:-?} execs; reproducer $artifact")
    else
      summary+=("$t: FAILED (exit $rc) after ${took}s, no reproducer written (see output above)")
    fi
  else
    summary+=("$t: ok, ${took}s, ${execs:-?} execs (${rate:-?}/s), corpus $size inputs")
  fi
done

echo
echo "== summary (build ${build_secs}s, total $(($(date +%s) - start))s)"
printf '   %s\n' "${summary[@]}"
exit "$status"
