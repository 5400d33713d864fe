#!/usr/bin/env bash
# Sanitizer and Miri runs of the engine's (`spillring`) test suite.
#
# Usage: scripts/sanitizers.sh [asan|tsan|miri|all] [--full]
#
#   asan    AddressSanitizer (+ LeakSanitizer) over the engine's unit and integration tests
#   tsan    ThreadSanitizer over the same tests
#   miri    Miri over the unit tests that make no syscalls (see SAN_MIRI_FILTERS)
#   all     the three in turn (the default)
#   --full  ASan/TSan run the whole engine suite (`-p spillring --lib --tests`) instead of
#           the short, always-on subset (the unit tests plus SAN_SHORT_TESTS); Miri adds the
#           unit tests that are pure but slow under Miri (SAN_MIRI_FULL_FILTERS: the lane
#           gate's thread race, ~2 min). Every other test needs io_uring, mmap, openat or a
#           tmpfs mount, which Miri cannot run (dir::tests and cleanup::tests call openat).
#           Miri emulates weak memory; the nightly of 2026-05 still lets some SeqCst loads
#           read values C++20 forbids (rust-lang/miri#5104), so a rare gate failure that
#           does not come back with -Zmiri-disable-weak-memory-emulation needs triage
#           before it is taken for an engine bug.
#
# Exits non-zero when a step cannot run (no rustup, no nightly, a component that cannot be
# installed, not root), when a build fails, when a test fails, when a sanitizer or Miri
# reports anything (a data race, a bad access, a leak, UB) or when a run ran no test. With
# `all`, every kind runs even after one fails; the summary at the end lists each.
#
# What it needs, and installs when missing: the nightly toolchain with rust-src (for
# -Zbuild-std) and miri (`rustup component add rust-src miri --toolchain nightly`). ASan/TSan
# need root: some tests mount a tmpfs in a private mount namespace.
#
# How the runs are made, and why:
#   * `-Zbuild-std --target <host triple>`: std is rebuilt with the sanitizer, so TSan sees
#     the synchronisation inside std, crossbeam and parking_lot, and ASan sees every
#     allocation. `--target` is required with -Zbuild-std, and it also keeps RUSTFLAGS off
#     build scripts and proc macros (serde_derive, tokio-macros, thiserror-impl), which
#     rustc must load unsanitized.
#   * Sanitizer reports go to files (`log_path`) and the script prints them, so a report
#     from a child process whose stderr a test discards (tests/crash.rs) still fails the run.
#     Exit codes are kept too: ASan exits 1 and TSan 66 on a report; cargo test turns that
#     into a failure of the binary, and `set -o pipefail` carries it through `tee`.
#   * ASan runs with detect_leaks=1: LeakSanitizer reports only memory unreachable at exit
#     (the engine's threads and statics still reach theirs), so what it reports is a leak.
#   * io_uring lets the kernel read and write user memory. Neither sanitizer sees those
#     accesses, so they are neither checked nor reported; TSan gets no false races from them
#     because every buffer hand-off between user threads goes through channels/locks it sees.
#   * cargo test runs each binary's tests as threads of one process (no nextest: nextest
#     would rerun the instrumented binary once per test, much slower).
#
# Environment knobs:
#   SAN_JOBS            cargo -j (default 2)
#   SAN_TARGET_PREFIX   target dir prefix; kind is appended (default <repo>/target/san-).
#                       Never share one between two checkouts: cargo hashes workspace
#                       members relative to the workspace root and judges freshness by mtime,
#                       so it can take the other checkout's newer build as up to date.
#   SAN_LOG_DIR         where logs and sanitizer reports go (default: a new /tmp dir)
#   SAN_SHORT_TESTS     integration test binaries of the short run
#                       (default "ownership abort cleanup roots")
#   SAN_MIRI_FILTERS    libtest filters of the Miri run (default "ledger:: segment::")
#   SAN_MIRI_FULL_FILTERS  filters added with --full (default "io::lane::gate::")
#   SAN_EXTRA_RUSTFLAGS appended to the sanitizer RUSTFLAGS
#   ASAN_OPTIONS, TSAN_OPTIONS, MIRIFLAGS are appended to the script's own (later wins).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

kind=all
full=0
for arg in "$@"; do
  case "$arg" in
    asan | tsan | miri | all) kind="$arg" ;;
    --full) full=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *)
      printf 'sanitizers.sh: unknown argument %q\n\n' "$arg" >&2
      usage >&2
      exit 2
      ;;
  esac
done

cd "$(dirname "$0")/.."
repo=$(pwd)

jobs=${SAN_JOBS:-2}
target_prefix=${SAN_TARGET_PREFIX:-$repo/target/san-}
log_dir=${SAN_LOG_DIR:-$(mktemp -d /tmp/sanitizers.XXXXXX)}
mkdir -p "$log_dir"
read -r -a short_tests <<<"${SAN_SHORT_TESTS:-ownership abort cleanup roots}"
read -r -a miri_filters <<<"${SAN_MIRI_FILTERS:-ledger:: segment::}"
if ((full)); then
  read -r -a more <<<"${SAN_MIRI_FULL_FILTERS:-io::lane::gate::}"
  miri_filters+=("${more[@]}")
fi

log() { printf '\n== %s ==\n' "$*"; }
die() {
  printf '\nsanitizers.sh: ERROR: %s\n' "$*" >&2
  exit 1
}
# Flags the caller may have set that would override or leak into ours.
unset CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS RUSTFLAGS RUSTDOCFLAGS CARGO_TARGET_DIR
# Line tables are all a sanitizer report needs (file:line, inlined frames); full debuginfo of
# a rebuilt std and tokio mostly costs build and link time. These target dirs are built once
# per CI run, so incremental artifacts would be written for nothing.
export CARGO_PROFILE_TEST_DEBUG=line-tables-only CARGO_PROFILE_DEV_DEBUG=line-tables-only
export CARGO_PROFILE_TEST_INCREMENTAL=false CARGO_PROFILE_DEV_INCREMENTAL=false

case "$kind" in
  all) kinds=(asan tsan miri) ;;
  *) kinds=("$kind") ;;
esac

# ---------------------------------------------------------------------------------------
# Setup: nightly, rust-src, miri; root for the tmpfs tests.
log "setup"
command -v rustup >/dev/null 2>&1 ||
  die "rustup is not on PATH: install rustup (the nightly toolchain comes through it)"
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal ||
    die "cannot install the nightly toolchain (rustup toolchain install nightly failed)"
fi
components=(rust-src)
[[ " ${kinds[*]} " == *" miri "* ]] && components+=(miri)
installed=$(rustup component list --toolchain nightly --installed 2>/dev/null || true)
missing=()
for c in "${components[@]}"; do
  grep -q "^${c}\b" <<<"$installed" || missing+=("$c")
done
if ((${#missing[@]})); then
  echo "installing nightly components: ${missing[*]}"
  rustup component add "${missing[@]}" --toolchain nightly ||
    die "cannot install nightly components ${missing[*]} (rustup component add failed)"
fi
cargo +nightly --version || die "cargo +nightly does not run"
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
[[ -n "$triple" ]] || die "cannot tell the host triple from rustc +nightly -vV"
case "$triple" in
  x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu) ;;
  *) [[ " ${kinds[*]} " == *" asan "* || " ${kinds[*]} " == *" tsan "* ]] &&
    die "ASan/TSan runs are set up for x86_64/aarch64 Linux, not $triple" ;;
esac
if [[ " ${kinds[*]} " == *" asan "* || " ${kinds[*]} " == *" tsan "* ]] && (($(id -u) != 0)); then
  die "ASan/TSan run the tmpfs tests, which need root (CAP_SYS_ADMIN for unshare/mount)"
fi
echo "mode: $([[ $full == 1 ]] && echo full || echo short); kinds: ${kinds[*]}; logs: $log_dir"

# ---------------------------------------------------------------------------------------
declare -A status=() times=() counts=()

# Adds up the libtest "test result:" lines of a log: prints "passed failed ignored".
count_results() {
  awk '/^test result:/ {
         for (i = 1; i <= NF; i++) {
           if ($(i+1) ~ /^passed/) p += $i
           if ($(i+1) ~ /^failed/) f += $i
           if ($(i+1) ~ /^ignored/) g += $i
         }
       }
       END { printf "%d %d %d\n", p, f, g }' "$1"
}

# Prints the sanitizer report files of a run; returns 1 if there was any.
show_reports() {
  local dir=$1 found=0 f
  for f in "$dir"/report.*; do
    [[ -e "$f" ]] || continue
    found=1
    printf '\n---- sanitizer report %s ----\n' "$f"
    cat "$f"
  done
  return $((found ? 1 : 0))
}

run_sanitizer() {
  local k=$1 san opts rdir log_build log_run start rc
  case "$k" in
    asan)
      san=address
      opts="detect_leaks=1:detect_stack_use_after_return=1:halt_on_error=1"
      ;;
    tsan)
      san=thread
      opts="halt_on_error=0:second_deadlock_stack=1"
      ;;
  esac
  local flags="-Zsanitizer=$san -Cforce-frame-pointers=yes ${SAN_EXTRA_RUSTFLAGS:-}"
  local sel=(--lib)
  if ((full)); then
    sel+=(--tests)
  else
    for t in "${short_tests[@]}"; do sel+=(--test "$t"); done
  fi
  local cmd=(cargo +nightly test -Zbuild-std --target "$triple" -p spillring "${sel[@]}"
    -j "$jobs" --no-fail-fast)
  rdir="$log_dir/$k-reports"
  rm -rf "$rdir" && mkdir -p "$rdir"
  log_build="$log_dir/$k-build.log"
  log_run="$log_dir/$k-run.log"
  local env_opts
  if [[ $k == asan ]]; then
    env_opts=(ASAN_OPTIONS="$opts:log_path=$rdir/report:${ASAN_OPTIONS:-}")
  else
    env_opts=(TSAN_OPTIONS="$opts:log_path=$rdir/report:${TSAN_OPTIONS:-}")
  fi

  log "$k: build (RUSTFLAGS=\"$flags\")"
  echo "+ CARGO_TARGET_DIR=${target_prefix}$k ${cmd[*]} --no-run"
  start=$SECONDS
  if ! env CARGO_TARGET_DIR="${target_prefix}$k" RUSTFLAGS="$flags" RUSTDOCFLAGS="$flags" \
    "${cmd[@]}" --no-run 2>&1 | tee "$log_build"; then
    times[$k]="build failed after $((SECONDS - start)) s"
    status[$k]="FAILED (build; log $log_build)"
    return 1
  fi
  local build_s=$((SECONDS - start))

  log "$k: run"
  echo "+ ${env_opts[*]} CARGO_TARGET_DIR=${target_prefix}$k ${cmd[*]}"
  start=$SECONDS
  rc=0
  env "${env_opts[@]}" CARGO_TARGET_DIR="${target_prefix}$k" RUSTFLAGS="$flags" \
    RUSTDOCFLAGS="$flags" "${cmd[@]}" 2>&1 | tee "$log_run" || rc=$?
  local run_s=$((SECONDS - start))
  times[$k]="build ${build_s} s, run ${run_s} s"
  read -r p f g < <(count_results "$log_run")
  counts[$k]="$p passed, $f failed, $g ignored"

  local bad=()
  show_reports "$rdir" || bad+=("sanitizer reports in $rdir")
  ((rc == 0)) || bad+=("cargo test exited $rc")
  ((p > 0)) || bad+=("no test ran")
  ((f == 0)) || bad+=("$f tests failed")
  if ((${#bad[@]})); then
    status[$k]="FAILED ($(
      IFS=';'
      echo "${bad[*]}"
    ); log $log_run)"
    return 1
  fi
  status[$k]="ok"
}

run_miri() {
  local log_run="$log_dir/miri.log" start rc=0
  local cmd=(cargo +nightly miri test -p spillring --lib -j "$jobs" -- "${miri_filters[@]}")
  log "miri: pure unit tests (filters: ${miri_filters[*]})"
  echo "+ MIRIFLAGS=\"${MIRIFLAGS:-}\" CARGO_TARGET_DIR=${target_prefix}miri ${cmd[*]}"
  start=$SECONDS
  env CARGO_TARGET_DIR="${target_prefix}miri" MIRIFLAGS="${MIRIFLAGS:-}" \
    "${cmd[@]}" 2>&1 | tee "$log_run" || rc=$?
  times[miri]="build+run $((SECONDS - start)) s"
  read -r p f g < <(count_results "$log_run")
  counts[miri]="$p passed, $f failed, $g ignored"
  local bad=()
  ((rc == 0)) || bad+=("cargo miri test exited $rc")
  ((p > 0)) || bad+=("no test ran")
  ((f == 0)) || bad+=("$f tests failed")
  if ((${#bad[@]})); then
    status[miri]="FAILED ($(
      IFS=';'
      echo "${bad[*]}"
    ); log $log_run)"
    return 1
  fi
  status[miri]="ok"
}

failed=0
total_start=$SECONDS
for k in "${kinds[@]}"; do
  case "$k" in
    asan | tsan) run_sanitizer "$k" || failed=1 ;;
    miri) run_miri || failed=1 ;;
  esac
done

log "summary ($([[ $full == 1 ]] && echo full || echo short), $((SECONDS - total_start)) s)"
for k in "${kinds[@]}"; do
  printf '%-5s %s\n      %s; %s\n' "$k" "${status[$k]:-not run}" "${counts[$k]:-no count}" \
    "${times[$k]:-}"
done
echo "logs and reports: $log_dir"
exit "$failed"
