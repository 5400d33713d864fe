//! The async promise: an `_async` call's poll never waits for a step that may block (a
//! syscall that can sleep, a lock an engine thread holds, a full lane). Each test holds one
//! such step in a fault-plan pause on whatever thread runs it, polls the future once on the
//! test's thread, and asserts the poll came back `Pending` within [`PROMPT`]: a poll that runs
//! the step itself sits in the pause until the watchdog releases it ([`HELD`] later).

#[macro_use]
mod common;
use common::*;

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::mpsc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use spillring::testing::{fd_stats, lane_room};
use spillring::{
    BackendKind, Bytes, Compression, Engine, FaultPlan, FaultPoint, PauseHandle, SpillError,
    SpilledState,
};

per_backend!(
    a_reopen_of_an_evicted_fd_runs_off_the_poll,
    a_compressed_blocks_seal_maps_nothing_in_the_poll,
    a_submit_to_a_full_lane_waits_off_the_poll,
    a_write_waiting_for_a_held_compression_is_pending_at_once,
);

/// How soon a poll that does not wait must return. A poll that waits for the held step takes
/// [`HELD`] (2 s). One that does not took over the 1 ms this bound was before in 15 of 60 runs
/// beside two busy loops on these 2 cores (one: 1.66 ms; the poll may start the offload pool's
/// threads, and a loaded scheduler delays it): the bound sits well between the two.
const PROMPT: Duration = Duration::from_millis(250);
/// How long the watchdog leaves a pause held before it releases it (a poll that waits for the
/// step returns only then).
const HELD: Duration = Duration::from_secs(2);
const T: Duration = Duration::from_secs(20);

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Polls `fut` once while `pauses` hold its step, and asserts it returned `Pending` within
/// [`PROMPT`]. A watchdog releases the pauses after [`HELD`] if the test has not, so a poll
/// that waits in one ends (and the assertion says how long it took).
fn assert_pending_promptly<F: Future>(fut: Pin<&mut F>, pauses: &[Arc<PauseHandle>], what: &str)
where
    F::Output: std::fmt::Debug,
{
    let (done, watch) = mpsc::channel::<()>();
    let held = pauses.to_vec();
    let watchdog = std::thread::spawn(move || {
        if watch.recv_timeout(HELD).is_err() {
            held.iter().for_each(|p| p.release());
        }
    });
    let mut cx = Context::from_waker(Waker::noop());
    let t = Instant::now();
    let p = fut.poll(&mut cx);
    let took = t.elapsed();
    let _ = done.send(());
    watchdog.join().unwrap();
    assert!(
        took < PROMPT,
        "{what}: the poll took {took:?} (it waited for the held step): {p:?}"
    );
    assert!(p.is_pending(), "{what}: {p:?}");
}

/// The records of `st`, in order.
fn read_all(st: &SpilledState) -> Vec<Bytes> {
    st.reader().unwrap().map(|r| r.unwrap()).collect()
}

/// A writer whose idle fd the bound (`max_open_files(1)`) closed for another writer: its next
/// `write_async` reopens the segment by name. The reopen (the fd permit, which may wait for
/// another writer's fd to go idle; the `openat`; a sleep on EMFILE) runs on the offload pool:
/// held there at `writer::reopen`, the poll is `Pending` at once. (It ran in the poll: the
/// poll sat in the pause for the watchdog's 2 s.)
fn a_reopen_of_an_evicted_fd_runs_off_the_poll(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(
            cfg(dir.path(), b)
                .mode(mode)
                .io_buffer_size(4096)
                .segment_size(64 << 10)
                .max_open_files(1),
        )
        .unwrap();
        let task = engine.task("reopen").unwrap();
        let other = engine.task("other").unwrap();
        let plan = FaultPlan::new(1);
        task.set_fault_plan(plan.clone());
        let mut a = task.writer().unwrap();
        a.write(Bytes::from(record(1, 100))).unwrap();
        let mut b_w = other.writer().unwrap();
        b_w.write(Bytes::from(record(2, 100))).unwrap();
        assert!(fd_stats(&engine).evictions >= 1, "A's fd was closed for B");
        let pause = plan.pause_once(FaultPoint::WriterReopen);
        let rt = current_thread();
        {
            let mut fut = pin!(a.write_async(Bytes::from(record(3, 100))));
            assert_pending_promptly(
                fut.as_mut(),
                std::slice::from_ref(&pause),
                &format!("{mode:?} reopen"),
            );
            assert!(pause.wait_reached(T), "the reopen runs");
            pause.release();
            rt.block_on(fut).unwrap();
        }
        assert_eq!(plan.fired(FaultPoint::WriterReopen), 1);
        let (sa, sb) = (a.finish().unwrap(), b_w.finish().unwrap());
        let ra = read_all(&sa);
        assert_eq!(ra.len(), 2, "{mode:?}");
        assert_eq!(&ra[1][..], &record(3, 100)[..]);
        assert_eq!(&read_all(&sb)[0][..], &record(2, 100)[..]);
        drop((ra, sa, sb));
        task.close();
        other.close();
        assert_clean(&engine, dir.path());
    }
}

/// Compressible bytes: `record(i, 64)` repeated.
fn compressible(i: u64, len: usize) -> Vec<u8> {
    record(i, 64).into_iter().cycle().take(len).collect()
}

/// With a codec, sealing a block compresses it. It took a second staging buffer from the pool
/// for the output, with the pool's lock taken blocking and, none free, an `mmap` in the poll
/// (seen: 4 maps of 64 KiB on the caller's thread with Lz4, none without). Here the only other
/// buffer is held in flight (the I/O thread paused at its write) and maps pause at
/// `buffer::map`: the block is compressed in place (on the codec pool) and the poll is
/// `Pending` at once, waiting for a map on the offload pool for the next record. (Before: the
/// poll sat in the map's pause.)
fn a_compressed_blocks_seal_maps_nothing_in_the_poll(b: BackendKind) {
    for mode in both_modes() {
        for codec in [Compression::Lz4, Compression::Zstd { level: 1 }] {
            let dir = tempfile::tempdir().unwrap();
            let plan = FaultPlan::new(2);
            let engine = Engine::open(
                cfg(dir.path(), b)
                    .mode(mode)
                    .io_buffer_size(64 << 10)
                    .compression(codec)
                    .fault_plan(plan.clone()),
            )
            .unwrap();
            let task = engine.task("seal").unwrap();
            let rt = current_thread();
            let mut w = task.writer().unwrap();
            rt.block_on(w.write_async(Bytes::from(compressible(0, 40_000))))
                .unwrap();
            let write = plan.pause_once(FaultPoint::IoWrite);
            let map = plan.pause_once(FaultPoint::BufferMap);
            {
                // 40 KB more does not fit the 64 KiB buffer: its block is sealed and written.
                let mut fut = pin!(w.write_async(Bytes::from(compressible(1, 40_000))));
                let what = format!("{mode:?} {codec:?} seal");
                assert_pending_promptly(fut.as_mut(), &[write.clone(), map.clone()], &what);
                write.release();
                map.release();
                rt.block_on(fut).unwrap();
            }
            let st = rt.block_on(w.finish_async()).unwrap();
            let recs = read_all(&st);
            assert_eq!(recs.len(), 2);
            assert_eq!(&recs[0][..], &compressible(0, 40_000)[..]);
            assert_eq!(&recs[1][..], &compressible(1, 40_000)[..]);
            let m = engine.metrics();
            assert!(
                m.blocks_lz4 + m.blocks_zstd >= 2,
                "{mode:?} {codec:?}: blocks compressed: {m:?}"
            );
            drop((recs, st));
            task.close();
            assert_clean(&engine, dir.path());
        }
    }
}

/// A submit to a lane whose channel is full waited for room in the poll (`IoHandle::submit`'s
/// `send_timeout` loop: seen, with a 40 ms device delay, every poll of the other writers
/// blocked about 40 ms). Here the lane's I/O thread is paused at its first write and two
/// blocking writers fill its channel; an async writer's next buffer then waits for room on the
/// offload pool and the poll is `Pending` at once. (Before: the poll sat in the loop until the
/// watchdog released the I/O thread.)
fn a_submit_to_a_full_lane_waits_off_the_poll(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(3);
        let engine = Engine::open(
            cfg(dir.path(), b)
                .mode(mode)
                .io_buffer_size(4096)
                .segment_size(16 << 20)
                .queue_depth(1024)
                .ring_threads(1)
                .fault_plan(plan.clone()),
        )
        .unwrap();
        let task = engine.task("full").unwrap();
        let rt = current_thread();
        let mut c = task.writer().unwrap();
        // 3000 bytes: one record per 4 KiB buffer, so each write submits the one before.
        rt.block_on(c.write_async(Bytes::from(record(0, 3000))))
            .unwrap();
        let held = plan.pause_once(FaultPoint::IoWrite);
        let fillers: Vec<_> = (0..2u64)
            .map(|t| {
                let task = task.clone();
                std::thread::spawn(move || {
                    let mut w = task.writer().unwrap();
                    for i in 0..1500 {
                        w.write(Bytes::from(record(t * 10_000 + i, 3000)))?;
                    }
                    w.finish()
                })
            })
            .collect();
        wait_for("the lane's channel to fill", || lane_room(&engine) == 0);
        {
            let mut fut = pin!(c.write_async(Bytes::from(record(1, 3000))));
            assert_pending_promptly(
                fut.as_mut(),
                std::slice::from_ref(&held),
                &format!("{mode:?} submit"),
            );
            held.release();
            rt.block_on(fut).unwrap();
        }
        let st = rt.block_on(c.finish_async()).unwrap();
        let recs = read_all(&st);
        assert_eq!(recs.len(), 2);
        assert_eq!(&recs[1][..], &record(1, 3000)[..]);
        for (t, f) in fillers.into_iter().enumerate() {
            let s = f
                .join()
                .unwrap()
                .unwrap_or_else(|e: SpillError| panic!("filler: {e}"));
            let r = read_all(&s);
            assert_eq!(r.len(), 1500);
            assert_eq!(&r[1499][..], &record(t as u64 * 10_000 + 1499, 3000)[..]);
        }
        drop((recs, st));
        task.close();
        assert_clean(&engine, dir.path());
    }
}

/// A writer with a codec queues its full buffers for the codec pool (`stage.rs`); with
/// `queue_depth(1)` the next full buffer waits for the queued one, whose compression is held
/// at `codec::compress`. The poll parks its waker and is `Pending` at once (the codec thread
/// wakes it); released, the write completes and every record reads back in order.
fn a_write_waiting_for_a_held_compression_is_pending_at_once(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(4);
        let engine = Engine::open(
            cfg(dir.path(), b)
                .mode(mode)
                .io_buffer_size(64 << 10)
                .queue_depth(1)
                .compression(Compression::Lz4)
                .fault_plan(plan.clone()),
        )
        .unwrap();
        let task = engine.task("held").unwrap();
        let rt = current_thread();
        let mut w = task.writer().unwrap();
        rt.block_on(w.write_async(Bytes::from(compressible(0, 40_000))))
            .unwrap();
        let held = plan.pause_once(FaultPoint::CodecCompress);
        // The first buffer goes to the codec pool, the record into the next.
        rt.block_on(w.write_async(Bytes::from(compressible(1, 40_000))))
            .unwrap();
        assert!(held.wait_reached(T), "{mode:?}: the compression is held");
        {
            // The second buffer is full: it waits for the first one, queued and held.
            let mut fut = pin!(w.write_async(Bytes::from(compressible(2, 40_000))));
            let what = format!("{mode:?} held compression");
            assert_pending_promptly(fut.as_mut(), std::slice::from_ref(&held), &what);
            held.release();
            rt.block_on(fut).unwrap();
        }
        let st = rt.block_on(w.finish_async()).unwrap();
        let recs = read_all(&st);
        assert_eq!(recs.len(), 3, "{mode:?}");
        for (i, r) in recs.iter().enumerate() {
            assert_eq!(&r[..], &compressible(i as u64, 40_000)[..], "{mode:?}");
        }
        assert_eq!(plan.fired(FaultPoint::CodecCompress), 1);
        drop((recs, st));
        task.close();
        assert_clean(&engine, dir.path());
    }
}
