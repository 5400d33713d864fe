//! The tokio-uring baseline.

use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use spillring::WriteMode;

use super::{at, std_fs};
use crate::measure::{Run, process_cpu, thread_cpu};

/// The throughput baseline: `n` records (cycling through `recs`, all of one length) written with
/// tokio-uring's `write_at` into `<dir>/tokio-uring.bin`, keeping `in_flight` writes (at least
/// one) submitted; a short write is finished before going on. Then `sync_data` if `sync`, then
/// close; the file is removed afterwards, outside the figures. `in_api` is the time spent
/// submitting and awaiting the writes and closing.
pub fn write_run(
    dir: &Path,
    mode: WriteMode,
    recs: &[Bytes],
    n: usize,
    sync: bool,
    in_flight: usize,
) -> io::Result<Run> {
    let in_flight = in_flight.max(1);
    let path = dir.join("tokio-uring.bin");
    let len = recs[0].len();
    let bytes = (n * len) as u64;
    let std_file = std_fs::create(&path, mode)?;
    let run = tokio_uring::start(async {
        let file = tokio_uring::fs::File::from_std(std_file);
        let (t0, c0, tc0) = (Instant::now(), process_cpu(), thread_cpu());
        let mut in_api = Duration::ZERO;
        let mut inflight = VecDeque::with_capacity(in_flight);
        let mut off = 0u64;
        for i in 0..n {
            let b = Instant::now();
            if inflight.len() == in_flight
                && let Some((fut, at_off)) = inflight.pop_front()
            {
                let (r, _): (io::Result<usize>, Bytes) = fut.await;
                let done = r.map_err(at("tokio-uring write"))?;
                if done < len {
                    // A short write: finish it before going on.
                    let (r, _) = file
                        .write_all_at(recs[0].slice(done..), at_off + done as u64)
                        .await;
                    r.map_err(at("tokio-uring write_all_at"))?;
                }
            }
            let fut = file.write_at(recs[i % recs.len()].clone(), off).submit();
            inflight.push_back((fut, off));
            off += len as u64;
            in_api += b.elapsed();
        }
        let b = Instant::now();
        while let Some((fut, at_off)) = inflight.pop_front() {
            let (r, _): (io::Result<usize>, Bytes) = fut.await;
            let done = r.map_err(at("tokio-uring write"))?;
            if done < len {
                let (r, _) = file
                    .write_all_at(recs[0].slice(done..), at_off + done as u64)
                    .await;
                r.map_err(at("tokio-uring write_all_at"))?;
            }
        }
        in_api += b.elapsed();
        let caller_cpu = thread_cpu() - tc0;
        if sync {
            file.sync_data().await.map_err(at("sync"))?;
        }
        let b = Instant::now();
        file.close().await.map_err(at("close"))?;
        in_api += b.elapsed();
        Ok::<_, io::Error>(Run {
            bytes,
            wall: t0.elapsed(),
            cpu: process_cpu() - c0,
            in_api,
            caller_cpu,
        })
    })?;
    std::fs::remove_file(&path).map_err(at("remove the baseline file"))?;
    Ok(run)
}
