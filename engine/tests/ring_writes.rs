//! The io_uring backend makes page-cache writes (buffered mode) on its ring thread: io_uring
//! cannot make them without blocking and would hand each to an io-wq worker (a thread named
//! `iou-wrk-*`), two more thread wake-ups per write. One test in this binary: it counts the
//! process's threads.

use spillring::{BackendKind, Bytes, Engine, EngineConfig, WriteMode};

fn io_wq_workers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("list /proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with("iou-wrk"))
        .count()
}

#[test]
fn buffered_writes_on_io_uring_wake_no_io_wq_worker() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let engine = Engine::open(
        EngineConfig::new(dir.path())
            .backend(BackendKind::Uring)
            .mode(WriteMode::Buffered),
    )
    .unwrap();
    let task = engine.task("ring-writes").unwrap();
    let mut w = task.writer().unwrap();
    // Large records (vectored writes) and small ones (staging buffers).
    for i in 0..16u8 {
        w.write(Bytes::from(vec![i; 1 << 20])).unwrap();
        for _ in 0..64 {
            w.write_slice(&[i; 1000]).unwrap();
        }
    }
    let st = w.finish().unwrap();
    assert_eq!(
        io_wq_workers(),
        0,
        "a page-cache write went to an io-wq worker"
    );
    let n = st.reader().unwrap().count();
    assert_eq!(n, 16 * 65);
    drop(st);
    task.close();
    assert!(engine.settle(std::time::Duration::from_secs(10)));
}
