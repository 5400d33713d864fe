//! The `SpillFile` contract of DataFusion's default file, kept by `SpillringFile`, through the
//! traits alone: bytes written come back in order from `read_stream`, in chunks of about a
//! staging buffer whatever the size of the writes; a second `open_writer` appends; a second
//! `read_stream` reads from the start; `size` is the bytes written; a flush makes what was
//! written readable while the writer goes on (the repartition spill pool reads so); a failed
//! write or a writer dropped with bytes it never flushed makes reading an error, never a stream
//! with a hole; the last `Arc` dropped deletes the files.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use datafusion_execution::spill_file::{SpillFile, TempFileFactory};
use futures::StreamExt;
use spillring::{Engine, EngineConfig, WriteMode};
use spillring_datafusion::SpillringFactory;

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn read(file: &Arc<dyn SpillFile>) -> datafusion_common::Result<(Vec<u8>, Vec<usize>)> {
    block_on(async {
        let mut s = file.read_stream()?;
        let (mut out, mut chunks) = (Vec::new(), Vec::new());
        while let Some(c) = s.next().await {
            let c = c?;
            chunks.push(c.len());
            out.extend_from_slice(&c);
        }
        Ok((out, chunks))
    })
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn engine(root: &std::path::Path, mode: WriteMode) -> Engine {
    Engine::open(EngineConfig::new(root).mode(mode).pool_max_segments(0)).unwrap()
}

#[test]
fn bytes_come_back_in_order_in_large_chunks_and_the_file_keeps_the_defaults_contract() {
    for mode in [WriteMode::Buffered, WriteMode::Direct] {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path(), mode);
        let factory = SpillringFactory::new(engine.clone());
        let file = factory.create_temp_file("contract").unwrap();
        assert_eq!(file.size(), Some(0));
        assert_eq!(file.path(), None, "no single OS path");
        let mut want = Vec::new();
        let mut w = file.open_writer().unwrap();
        // IPC-like: headers of a few bytes, bodies of some KB.
        for i in 0..3000u64 {
            let part = bytes(
                i,
                if i % 3 == 0 {
                    8
                } else {
                    700 + (i as usize % 5000)
                },
            );
            w.write_all(&part).unwrap();
            want.extend_from_slice(&part);
        }
        w.finish().unwrap();
        drop(w);
        assert_eq!(file.size(), Some(want.len() as u64));
        let (got, chunks) = read(&file).unwrap();
        assert!(got == want, "{mode:?}: the bytes differ");
        // One chunk per staging buffer (1 MiB), not one per write.
        assert!(
            chunks.len() <= want.len() / (1 << 20) + 2,
            "{} chunks",
            chunks.len()
        );

        // A second writer appends; a second stream reads from the start.
        let mut w = file.open_writer().unwrap();
        w.write_all(b"and more").unwrap();
        w.finish().unwrap();
        drop(w);
        want.extend_from_slice(b"and more");
        assert!(read(&file).unwrap().0 == want);
        assert!(read(&file).unwrap().0 == want);
        assert_eq!(file.size(), Some(want.len() as u64));

        // The last Arc deletes the files.
        assert!(engine.metrics().tickets_used > 0);
        drop(file);
        assert!(engine.settle(Duration::from_secs(10)));
        assert_eq!(engine.metrics().tickets_used, 0);
        assert_eq!(factory.stats().files, 1);
        assert_eq!(factory.stats().writers, 2);
    }
}

#[test]
fn a_flush_makes_what_was_written_readable_while_the_writer_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path(), WriteMode::Buffered);
    let file = SpillringFactory::new(engine)
        .create_temp_file("tail")
        .unwrap();
    let mut w = file.open_writer().unwrap();
    w.write_all(b"batch one").unwrap();
    w.flush().unwrap();
    // A reader made now reads what was flushed, like a reader of a file reads up to its end.
    let reader_file = file.clone();
    let mut s = reader_file.read_stream().unwrap();
    let first = block_on(s.next()).unwrap().unwrap();
    assert_eq!(&first[..], b"batch one");
    // More written and flushed after the stream began: the stream sees it at the chunk's end.
    w.write_all(b"batch two").unwrap();
    w.flush().unwrap();
    let second = block_on(s.next()).unwrap().unwrap();
    assert_eq!(&second[..], b"batch two");
    // Nothing more flushed: the stream ends there (an unflushed write is not seen).
    w.write_all(b"unflushed").unwrap();
    assert!(block_on(s.next()).is_none());
    w.finish().unwrap();
    let all = read(&file).unwrap().0;
    assert_eq!(&all[..], b"batch onebatch twounflushed");
}

#[test]
fn a_failed_write_or_an_unflushed_drop_makes_reading_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let seg = 1u64 << 20;
    let engine = Engine::open(
        EngineConfig::new(dir.path())
            .segment_size(seg)
            .max_spill_bytes(2 * seg)
            .pool_max_segments(0),
    )
    .unwrap();
    let factory = SpillringFactory::new(engine.clone());

    // A write the quota refuses: the stream would have a hole, so reading is refused.
    let file = factory.create_temp_file("refused").unwrap();
    let mut w = file.open_writer().unwrap();
    let big = bytes(1, 8 << 20);
    let err = w.write_all(&big).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::QuotaExceeded, "{err}");
    assert!(err.to_string().contains("spillring"), "{err}");
    drop(w);
    let e = match file.read_stream() {
        Ok(_) => panic!("a file with a failed write read"),
        Err(e) => e,
    };
    assert!(e.to_string().contains("a write failed"), "{e}");
    drop(file);
    // Its files are deleted (on an engine thread): the quota is back.
    assert!(engine.settle(Duration::from_secs(10)));
    assert_eq!(engine.metrics().tickets_used, 0);

    // A writer dropped with bytes it never flushed: they are deleted with it, and the file
    // says so when read.
    let file = factory.create_temp_file("dropped").unwrap();
    let mut w = file.open_writer().unwrap();
    w.write_all(b"flushed").unwrap();
    w.flush().unwrap();
    w.write_all(b"never flushed").unwrap();
    drop(w);
    let e = read(&file).unwrap_err();
    assert!(e.to_string().contains("never flushed"), "{e}");
    drop(file);
    assert!(engine.settle(Duration::from_secs(10)));
    assert_eq!(engine.metrics().tickets_used, 0);
}

#[test]
fn stored_bytes_are_the_compressed_files_and_size_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let engine =
        Engine::open(EngineConfig::new(dir.path()).compression(spillring::Compression::Lz4))
            .unwrap();
    let factory = SpillringFactory::new(engine);
    let concrete = factory.create_file("lz4").unwrap();
    let file: Arc<dyn SpillFile> = concrete.clone();
    let mut w = file.open_writer().unwrap();
    let text: Vec<u8> = b"1|155190|7706|1|17|21168.23|0.04|0.02|N|O|1996-03-13|\n"
        .iter()
        .copied()
        .cycle()
        .take(4 << 20)
        .collect();
    w.write_all(&text).unwrap();
    w.finish().unwrap();
    drop(w);
    assert_eq!(file.size(), Some(4 << 20));
    assert!(
        concrete.stored_bytes() < (4 << 20) / 2,
        "{}",
        concrete.stored_bytes()
    );
    assert!(read(&file).unwrap().0 == text);
}
