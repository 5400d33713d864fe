//! `std::fs` baselines.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use spillring::WriteMode;

use super::at;
use crate::measure::{Run, process_cpu, thread_cpu};

/// Creates `path` (it must not exist) for writing; with `O_DIRECT` in direct mode.
pub fn create(path: &Path, mode: WriteMode) -> io::Result<File> {
    let flags = match mode {
        WriteMode::Direct => libc::O_DIRECT,
        WriteMode::Buffered => 0,
    };
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(flags)
        .open(path)
        .map_err(at("create the baseline file"))
}

/// The throughput baseline: `n` records (cycling through `recs`, all of one length) written
/// with `write_all` into `<dir>/std-fs.bin`, then `sync_data` if `sync`, then close; the file is
/// removed afterwards, outside the figures. `in_api` is the time inside `write_all` and `close`.
pub fn write_run(
    dir: &Path,
    mode: WriteMode,
    recs: &[Bytes],
    n: usize,
    sync: bool,
) -> io::Result<Run> {
    let path = dir.join("std-fs.bin");
    let bytes = (n * recs[0].len()) as u64;
    let mut f = create(&path, mode)?;
    let (t0, c0, tc0) = (Instant::now(), process_cpu(), thread_cpu());
    let mut in_api = Duration::ZERO;
    for i in 0..n {
        let b = Instant::now();
        f.write_all(&recs[i % recs.len()])
            .map_err(at("std write_all"))?;
        in_api += b.elapsed();
    }
    let caller_cpu = thread_cpu() - tc0;
    if sync {
        f.sync_data().map_err(at("sync"))?;
    }
    let b = Instant::now();
    drop(f);
    in_api += b.elapsed();
    let (wall, cpu) = (t0.elapsed(), process_cpu() - c0);
    std::fs::remove_file(&path).map_err(at("remove the baseline file"))?;
    Ok(Run {
        bytes,
        wall,
        cpu,
        in_api,
        caller_cpu,
    })
}

/// The overlap baseline: a producer that calls `produce(i)` (its own work for record `i`) and
/// then `write_all`s record `i` into `<dir>/std-fs-overlap.bin`, in sequence, for `n` records
/// (cycling through `recs`); with `O_DIRECT` in direct mode, no sync (an `O_DIRECT` write
/// returns once the device has the bytes). Returns the wall time from the first `produce` to
/// the close; the file is removed afterwards, outside the figure.
pub fn produce_and_write(
    dir: &Path,
    mode: WriteMode,
    recs: &[Bytes],
    n: usize,
    mut produce: impl FnMut(usize),
) -> io::Result<Duration> {
    let path = dir.join("std-fs-overlap.bin");
    let mut f = create(&path, mode)?;
    let t0 = Instant::now();
    for i in 0..n {
        produce(i);
        f.write_all(&recs[i % recs.len()])
            .map_err(at("std write_all"))?;
    }
    drop(f);
    let wall = t0.elapsed();
    std::fs::remove_file(&path).map_err(at("remove the baseline file"))?;
    Ok(wall)
}

/// The hot-path baseline: create + write + close + unlink of `payload` at `path`.
pub fn cycle(path: &Path, payload: &[u8]) -> io::Result<()> {
    let mut f = File::create(path).map_err(at("create"))?;
    f.write_all(payload).map_err(at("write"))?;
    drop(f);
    std::fs::remove_file(path).map_err(at("unlink"))
}

/// [`cycle`] with the read-back the engine's cycle also does (into `buf`).
pub fn cycle_read(path: &Path, payload: &[u8], buf: &mut Vec<u8>) -> io::Result<()> {
    let mut f = File::create(path).map_err(at("create"))?;
    f.write_all(payload).map_err(at("write"))?;
    drop(f);
    buf.clear();
    File::open(path)
        .and_then(|mut f| f.read_to_end(buf))
        .map_err(at("read back"))?;
    black_box(&buf);
    std::fs::remove_file(path).map_err(at("unlink"))
}

/// `n` files of `size` bytes (`file-000000.bin`, ...) in `dir`: what [`remove_each`] deletes.
pub fn files(dir: &Path, n: usize, size: usize) -> io::Result<Vec<PathBuf>> {
    let data = vec![0x33u8; size];
    (0..n)
        .map(|i| {
            let p = dir.join(format!("file-{i:06}.bin"));
            std::fs::write(&p, &data).map_err(at("create a baseline file"))?;
            Ok(p)
        })
        .collect()
}

/// The cleanup baseline: `remove_file` of every path, one by one, on the calling thread.
pub fn remove_each(files: &[PathBuf]) -> io::Result<()> {
    for f in files {
        std::fs::remove_file(f).map_err(at("unlink"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_leave_nothing_behind() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("cycle.bin");
        let mut buf = Vec::new();
        cycle(&path, b"abc")?;
        cycle_read(&path, b"defg", &mut buf)?;
        assert_eq!(buf, b"defg");
        assert!(!path.exists());
        let fs = files(dir.path(), 3, 10)?;
        assert_eq!(std::fs::metadata(&fs[2])?.len(), 10);
        remove_each(&fs)?;
        assert_eq!(std::fs::read_dir(dir.path())?.count(), 0);
        Ok(())
    }

    #[test]
    fn produce_and_write_calls_the_producer_once_per_record() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let recs = crate::payloads(4096, 2);
        let mut seen = Vec::new();
        produce_and_write(dir.path(), WriteMode::Buffered, &recs, 3, |i| seen.push(i))?;
        assert_eq!(seen, [0, 1, 2]);
        assert_eq!(std::fs::read_dir(dir.path())?.count(), 0);
        Ok(())
    }

    #[test]
    fn write_run_counts_and_removes() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let recs = crate::payloads(4096, 2);
        let r = write_run(dir.path(), WriteMode::Buffered, &recs, 5, true)?;
        assert_eq!(r.bytes, 5 * 4096);
        assert!(r.in_api <= r.wall);
        assert_eq!(std::fs::read_dir(dir.path())?.count(), 0);
        Ok(())
    }
}
