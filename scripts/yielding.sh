#!/usr/bin/env bash
# The yielding bench (issue 24, point 3): a current_thread runtime, a 1 ms timer beside a task
# that spills and reads back 768 MiB with write_async / next_record_async, yielding on and
# off; prints the JSON (timer lateness against the idle run, throughput on/off, goals).
# Run it on a quiet machine: it times a timer to the millisecond.
#
#   scripts/yielding.sh                       # 768 MiB, 64 KiB records, 3 repetitions
#   SPILLRING_YIELD_MIB=128 SPILLRING_YIELD_REPS=1 scripts/yielding.sh   # a short look
#   scripts/yielding.sh --ram-device 2048     # on a 2 GiB RAM-backed ext4 (root only)
#
# SPILLRING_BENCH_ROOT picks the disk (default: the system temp directory);
# SPILLRING_YIELD_RECORD the record size; SPILLRING_YIELD_WARMUP untimed repetitions first (0);
# SPILLRING_YIELD_SETTLE=1 an untimed run of each mode before its on/off pair; the JSON also goes
# to SPILLRING_BENCH_OUT.
#
# --ram-device SIZE_MIB: a device whose speed does not swing, for the throughput on/off ratio
# (on the shared virtio disk it swings 0.80-1.54x between runs). A SIZE_MIB file on tmpfs
# (/dev/shm) as a loop device, formatted ext4 and mounted on a temporary directory, which
# becomes SPILLRING_BENCH_ROOT; ext4 on loop takes O_DIRECT, so both modes run on it. Needs
# root (losetup, mount) and SIZE_MIB of free memory beyond the page cache of the bench's
# writes; SIZE_MIB must hold one run's spill (SPILLRING_YIELD_MIB plus ext4's overhead: 2048
# for 768). The file system is filled once (and emptied) before the bench, so its tmpfs pages
# exist from the first run. The mount, the loop device and the file are always torn down on
# exit. The device takes the disk's swing away, not other processes' CPU: on this 2-vCPU
# machine the loop device's worker and the engine's I/O thread share the CPUs with whatever
# else runs, so run it on a quiet machine too (results/YIELDING.md, last section).
set -euo pipefail
cd "$(dirname "$0")/.."

ram_mib=
case "${1-}" in
    --ram-device)
        ram_mib=${2:?usage: yielding.sh [--ram-device SIZE_MIB]}
        [[ "$ram_mib" =~ ^[0-9]+$ ]] || { echo "yielding.sh: SIZE_MIB must be a number" >&2; exit 2; }
        ;;
    "") ;;
    *) echo "usage: yielding.sh [--ram-device SIZE_MIB]" >&2; exit 2 ;;
esac

cargo bench -p spillring-benches --bench yielding --no-run
if [[ -z "$ram_mib" ]]; then
    exec cargo bench -p spillring-benches --bench yielding -- --bench
fi

[[ $EUID -eq 0 ]] || { echo "yielding.sh: --ram-device needs root (losetup, mount)" >&2; exit 2; }
img= dev= mnt=
teardown() {
    if [[ -n "$mnt" ]]; then
        umount "$mnt" 2>/dev/null || umount -l "$mnt" || true
        rmdir "$mnt" || true
    fi
    [[ -z "$dev" ]] || losetup -d "$dev" || true
    [[ -z "$img" ]] || rm -f "$img"
}
trap teardown EXIT
trap 'exit 130' INT TERM
img=$(mktemp /dev/shm/spillring-ramdev-XXXXXX.img)
truncate -s "${ram_mib}M" "$img"
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$img"
dev=$(losetup --find --show "$img")
mnt=$(mktemp -d /tmp/spillring-ramdev-XXXXXX)
mount -o noatime "$dev" "$mnt"
# Fill it once and delete the fill: the tmpfs pages behind the loop device exist before the
# first run (else the first direct-mode run on it pays their allocation).
dd if=/dev/zero of="$mnt/fill" bs=1M oflag=direct status=none 2>/dev/null || true
rm -f "$mnt/fill"
sync -f "$mnt"
echo "yielding.sh: ${ram_mib} MiB ext4 on $dev (backed by $img), mounted on $mnt" >&2
SPILLRING_BENCH_ROOT=$mnt cargo bench -p spillring-benches --bench yielding -- --bench
