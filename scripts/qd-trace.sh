#!/usr/bin/env bash
# qd-trace.sh OUT LABEL -- COMMAND...: runs COMMAND with kernel tracepoints on (tracefs; root)
# and writes OUT/LABEL.trace (the raw trace, gzipped) and OUT/LABEL.json (scripts/qd_trace.py's
# summary): what the process keeps in flight in io_uring (submit -> CQE, per write), what the
# device has in flight (block request issue -> complete, on DEV), the requests' sizes, io_uring
# writes punted to io-wq, ext4 fallocate and unwritten-extent work, jbd2 commits, ftruncate
# calls and the discards ext4 issues (with -o discard a truncate waits for them). Made for the
# fio-vs-engine gap (issue 27): an off-CPU view of where the device idles.
#
# Env: QD_DEV (major:minor of the block device; default the device holding OUT), QD_EXTRA
#      (more events, "subsys/event" separated by spaces).
set -euo pipefail
out=${1:?usage: qd-trace.sh OUT LABEL -- COMMAND...}
label=${2:?usage: qd-trace.sh OUT LABEL -- COMMAND...}
shift 2
[[ ${1:-} == -- ]] && shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
t=/sys/kernel/tracing
[[ -e $t/trace ]] || mount -t tracefs nodev "$t"
dev=${QD_DEV:-}
if [[ -z $dev ]]; then
    src=$(df --output=source "$out" | tail -1)
    dev=$(cat "/sys/class/block/$(basename "$src")/dev")
fi
events=(block/block_rq_issue block/block_rq_complete block/block_split
        io_uring/io_uring_submit_req io_uring/io_uring_complete io_uring/io_uring_queue_async_work
        ext4/ext4_fallocate_enter ext4/ext4_fallocate_exit ext4/ext4_ext_handle_unwritten_extents
        jbd2/jbd2_start_commit jbd2/jbd2_end_commit sched/sched_process_fork
        ext4/ext4_discard_blocks syscalls/sys_enter_ftruncate syscalls/sys_exit_ftruncate ${QD_EXTRA:-})
echo 0 > "$t/tracing_on"
echo > "$t/set_event"
echo 16384 > "$t/buffer_size_kb"
for e in "${events[@]}"; do echo "${e/\//:}" >> "$t/set_event"; done
echo > "$t/trace"
echo 1 > "$t/tracing_on"
rc=0
"$@" > "$out/$label.stdout" &
pid=$!
wait "$pid" || rc=$?
echo 0 > "$t/tracing_on"
cat "$t/trace" | gzip > "$out/$label.trace.gz"
echo > "$t/set_event"
echo > "$t/trace"
echo 1408 > "$t/buffer_size_kb"
python3 "$here/qd_trace.py" --dev "$dev" --pid "$pid" "$out/$label.trace.gz" --stdout "$out/$label.stdout" > "$out/$label.json"
exit "$rc"
