//! The codec pool: a few engine threads that compress staging buffers' blocks off the
//! producer's thread, in parallel with it, as the I/O threads copy and checksum a large
//! record's parts (`buf.rs`'s `Fills`). A job is a buffer and where its block's records
//! start; the pool compresses them in place and hands the buffer back to the job's
//! [`CompressSink`] (the writer that queued it, which seals and writes its buffers in order: a
//! block's seal binds its file offset, known only once the buffers before it are compressed).
//!
//! Its threads start on first use (an engine that never compresses never has them). Jobs go
//! through a [`Handoff`], whose push never sleeps: an async writer hands a job over in its
//! poll. A job moves by value through the queue's preallocated array and keeps nothing of its
//! own (the compressors' tables and scratch are per thread: `format/block.rs`): no allocation
//! per job. A job that cannot be handed over (no thread could start; the pool was shut down)
//! runs on the caller's thread.

use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::Mutex;

use super::IoBuf;
use super::handoff::{Handoff, spawn_consumers, stop_consumers};
use crate::fault::{FaultPlan, fault_point};
use crate::format::block::{self, Codec};

/// Threads of the pool at most: one per CPU up to this. Each compresses one block at a time;
/// a writer keeps up to `queue_depth` blocks queued, so several writers (or one writer's
/// several blocks) compress in parallel.
const MAX_THREADS: usize = 4;

/// A buffer whose block's records, `buf[from..buf.len]`, are to be compressed with `codec`.
pub(crate) struct Compress {
    pub(crate) buf: IoBuf,
    pub(crate) from: usize,
    /// The codec asked for; `Raw` once run if it did not shrink the records (then left as
    /// they were).
    pub(crate) codec: Codec,
    /// Nanoseconds the compression took, once run.
    pub(crate) nanos: u64,
    /// The queuing writer's number for the buffer: its place in the writer's order.
    pub(crate) seq: u64,
}

impl Compress {
    /// Compresses the records in place (through the thread's scratch buffer), on this thread.
    fn run(&mut self, fault: &Option<Arc<FaultPlan>>) {
        // Pausing here holds a compression where it runs (tests of the windows it opens).
        fault_point!(CodecCompress, fault);
        let t = Instant::now();
        let end = self.buf.len;
        match block::compress_in_place(self.codec, &mut self.buf.space()[self.from..end]) {
            Some(n) => self.buf.len = self.from + n,
            None => self.codec = Codec::Raw,
        }
        self.nanos = t.elapsed().as_nanos() as u64;
    }
}

/// Where a compressed buffer goes: the writer that queued it.
pub(crate) trait CompressSink: Send + Sync {
    fn compressed(&self, job: Compress);
}

/// A job in the pool's queue. One dropped without running (left in the queue as it closed)
/// hands its buffer back uncompressed: its writer stores the block raw, and never waits for
/// it in vain.
struct Job {
    job: Option<Compress>,
    sink: Arc<dyn CompressSink>,
}

impl Job {
    fn run(mut self, fault: &Option<Arc<FaultPlan>>) {
        if let Some(mut job) = self.job.take() {
            job.run(fault);
            self.sink.compressed(job);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(mut job) = self.job.take() {
            job.codec = Codec::Raw;
            self.sink.compressed(job);
        }
    }
}

/// The pool. Its threads leave when it is shut down or dropped (the queue closes; they run
/// what is queued first).
pub(crate) struct CompressPool {
    q: OnceLock<Arc<Handoff<Job>>>,
    /// The threads, joined at shutdown; the lock also serialises their start.
    threads: Mutex<Vec<JoinHandle<()>>>,
    fault: Option<Arc<FaultPlan>>,
}

impl std::fmt::Debug for CompressPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompressPool")
            .field("started", &self.q.get().is_some())
            .finish()
    }
}

impl Drop for CompressPool {
    fn drop(&mut self) {
        if let Some(q) = self.q.get() {
            q.close();
            q.wake_all();
        }
    }
}

impl CompressPool {
    pub(crate) fn new(fault: Option<Arc<FaultPlan>>) -> Self {
        CompressPool {
            q: OnceLock::new(),
            threads: Mutex::new(Vec::new()),
            fault,
        }
    }

    /// Compresses `job` on a pool thread, then hands it to `sink`; on this thread if no pool
    /// thread takes it (none could start, or the pool was shut down).
    pub(crate) fn compress(&self, job: Compress, sink: Arc<dyn CompressSink>) {
        let job = Job {
            job: Some(job),
            sink,
        };
        let job = match self.queue() {
            Some(q) => match q.push(job, None) {
                Ok(()) => return,
                Err(job) => job,
            },
            None => job,
        };
        job.run(&self.fault);
    }

    /// Closes the queue (a job handed over from now on runs on its caller's thread) and joins
    /// the threads, which leave once they ran what was queued, waiting for them until
    /// `deadline`: a thread still compressing then is left to end on its own.
    pub(crate) fn shutdown(&self, deadline: Instant) {
        if let Some(q) = self.q.get() {
            stop_consumers(q, std::mem::take(&mut *self.threads.lock()), deadline);
        }
    }

    /// The queue, its threads started on the first call; `None` if none could start.
    fn queue(&self) -> Option<&Arc<Handoff<Job>>> {
        if let Some(q) = self.q.get() {
            return Some(q);
        }
        let mut threads = self.threads.lock();
        if let Some(q) = self.q.get() {
            return Some(q);
        }
        let n = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS));
        let q = Arc::new(Handoff::<Job>::new(n, None));
        let fault = self.fault.clone();
        match spawn_consumers(&q, "spillring-codec", move |job: Job| job.run(&fault)) {
            Ok(t) => *threads = t,
            Err(e) => {
                tracing::warn!(error = %e, "starting a codec thread failed; compressing inline");
                return None;
            }
        }
        Some(self.q.get_or_init(|| q))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::io::BufferPool;
    use std::thread::ThreadId;

    /// Where each compression came back: its codec, length and thread.
    #[derive(Default)]
    struct Sink(Mutex<Vec<(Codec, usize, ThreadId)>>);

    impl CompressSink for Sink {
        fn compressed(&self, job: Compress) {
            let me = std::thread::current().id();
            self.0.lock().push((job.codec, job.buf.len, me));
        }
    }

    const ROW: &[u8] = b"lineitem|1996-03-13|DELIVER IN PERSON|TRUCK|";

    fn job(pool: &Arc<BufferPool>, seq: u64) -> Compress {
        let mut buf = pool.try_get(0).unwrap();
        buf.push(&ROW.repeat(90));
        Compress {
            buf,
            from: 0,
            codec: Codec::Lz4,
            nanos: 0,
            seq,
        }
    }

    /// A job compresses on a codec thread; after the pool's shutdown (its threads joined), one
    /// runs on its caller's thread; a job dropped from the queue unrun comes back raw, whole.
    #[test]
    fn jobs_compress_on_the_pool_then_on_the_caller_after_shutdown_and_unrun_ones_come_back_raw() {
        let pool = BufferPool::new(4096, 0, 4, 1 << 20);
        let codec = CompressPool::new(None);
        let sink = Arc::new(Sink::default());
        let me = std::thread::current().id();
        codec.compress(job(&pool, 0), sink.clone());
        let t0 = Instant::now();
        while sink.0.lock().is_empty() {
            assert!(t0.elapsed().as_secs() < 20, "the pool compressed it");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        codec.shutdown(Instant::now() + std::time::Duration::from_secs(20));
        assert!(codec.threads.lock().is_empty(), "joined");
        codec.compress(job(&pool, 1), sink.clone());
        let unrun = Job {
            job: Some(job(&pool, 2)),
            sink: sink.clone(),
        };
        drop(unrun);
        let got = sink.0.lock();
        assert_eq!(got.len(), 3);
        let raw = ROW.len() * 90;
        assert!(
            got[0].0 == Codec::Lz4 && got[0].1 < raw && got[0].2 != me,
            "on the pool"
        );
        assert!(
            got[1].0 == Codec::Lz4 && got[1].1 < raw && got[1].2 == me,
            "inline"
        );
        assert_eq!((got[2].0, got[2].1), (Codec::Raw, raw), "unrun: raw, whole");
    }
}
