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
                && let Some((fut, at_off, rec)) = inflight.pop_front()
            {
                complete(&file, fut, at_off, rec).await?;
            }
            let rec = &recs[i % recs.len()];
            let fut = file.write_at(rec.clone(), off).submit();
            inflight.push_back((fut, off, rec.clone()));
            off += len as u64;
            in_api += b.elapsed();
        }
        let b = Instant::now();
        while let Some((fut, at_off, rec)) = inflight.pop_front() {
            complete(&file, fut, at_off, rec).await?;
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

/// Awaits one submitted write of `rec` at `off`; a short write is finished (with the rest of
/// the same record) before going on.
async fn complete(
    file: &tokio_uring::fs::File,
    fut: impl std::future::Future<Output = (io::Result<usize>, Bytes)>,
    off: u64,
    rec: Bytes,
) -> io::Result<()> {
    let (r, _) = fut.await;
    let done = r.map_err(at("tokio-uring write"))?;
    if done < rec.len() {
        let (r, _) = file
            .write_all_at(rec.slice(done..), off + done as u64)
            .await;
        r.map_err(at("tokio-uring write_all_at"))?;
    }
    Ok(())
}
