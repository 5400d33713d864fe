//! Real DataFusion queries that spill through spillring, in both write modes (with a codec and
//! with encryption on in some): an `ORDER BY`
//! over 256 MiB of lineitem rows, a high-cardinality `GROUP BY`, and a repartition whose spill
//! pool is read while it is written. Each gives the same rows as the same query with unlimited
//! memory (a hash of every column's bytes), DataFusion's spill metrics say it spilled, the bytes
//! it counted are the bytes the engine took, and once the query is dropped the engine holds no
//! live file and the root is empty after the pool is trimmed.

mod common;
use common::*;

use std::sync::Arc;
use std::time::Duration;

use spillring::{Compression, Engine, FileKind, WriteMode};
use spillring_datafusion::SpillringFactory;

/// The ORDER BY's input: at least 256 MiB of Arrow memory.
const ORDER_BY_INPUT: usize = 256 << 20;
/// The other two queries': enough to spill many times under the pool.
const OTHER_INPUT: usize = 96 << 20;
/// The memory pool (a `FairSpillPool`), well below the input, and the partitions. The ORDER BY
/// runs in one partition: with two, DataFusion 55's sort and merge refuse some runs on their own
/// under a pool of half the input or less, with its default temp files as with these (seen: 2 of
/// 4 and 3 of 4 runs at 64 MiB, "Failed to allocate ... for SortPreservingMergeExec"; 1 of 8 at
/// 192 MiB); in one partition 8 of 8 ran at 64 MiB, spilling 10 files each time.
///
/// The repartition reads one input partition too: with two, DataFusion 55.2's `RepartitionExec`
/// can deadlock when both input tasks spill into one output's spill pool at once (its reader
/// waits on the older of two open files while the batch it needs is in the newer one; every
/// thread parks). That is apache/datafusion#24883, fixed upstream by #24891, which 55.2 does not
/// have. Seen here with two partitions: a CI precheck run hung for 120 s, and 4 of 30 runs of
/// both repartition tests hung past 30 s (0 of 30 with one partition); the bench's repartition
/// hung the same way at a 42 MiB pool with DataFusion's own temp files.
fn pool_and_partitions(q: Query) -> (usize, usize) {
    match q {
        Query::OrderBy => (64 << 20, 1),
        Query::Repartition => (8 << 20, 1),
        Query::GroupBy => (8 << 20, 2),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[test]
fn order_by_spills_and_matches_unlimited_buffered() {
    query_matches_unlimited(Query::OrderBy, WriteMode::Buffered, Compression::None, true);
}

#[test]
fn order_by_spills_and_matches_unlimited_direct() {
    query_matches_unlimited(Query::OrderBy, WriteMode::Direct, Compression::None, false);
}

#[test]
fn group_by_spills_and_matches_unlimited_buffered() {
    query_matches_unlimited(Query::GroupBy, WriteMode::Buffered, Compression::Lz4, false);
}

#[test]
fn group_by_spills_and_matches_unlimited_direct() {
    query_matches_unlimited(Query::GroupBy, WriteMode::Direct, Compression::None, false);
}

#[test]
fn repartition_spills_and_matches_unlimited_buffered() {
    query_matches_unlimited(
        Query::Repartition,
        WriteMode::Buffered,
        Compression::None,
        false,
    );
}

#[test]
fn repartition_spills_and_matches_unlimited_direct() {
    query_matches_unlimited(
        Query::Repartition,
        WriteMode::Direct,
        Compression::Auto,
        false,
    );
}

/// `encryption`: the engine encrypts the spills (and the run checks it did).
fn query_matches_unlimited(q: Query, mode: WriteMode, compression: Compression, encryption: bool) {
    let input = if q == Query::OrderBy {
        ORDER_BY_INPUT
    } else {
        OTHER_INPUT
    };
    let (pool, partitions) = pool_and_partitions(q);
    let parts = lineitem_batches(input, partitions);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("spill");
    let engine = Engine::open(
        SpillringFactory::config(&root)
            .mode(mode)
            .compression(compression)
            .encryption(encryption),
    )
    .unwrap();
    let factory = Arc::new(SpillringFactory::new(engine.clone()));
    runtime().block_on(async {
        let unlimited = session(&parts, None, &Spills::Default(tmp.path().join("df"))).unwrap();
        let plan = q.plan(&unlimited).await.unwrap();
        let want = run(q, &unlimited, &plan).await.unwrap();
        assert_eq!(
            spill_metrics(&plan).0,
            0,
            "{q:?}: the unlimited run spilled"
        );

        let ctx = session(&parts, Some(pool), &Spills::Factory(factory.clone())).unwrap();
        let plan = q.plan(&ctx).await.unwrap();
        let got = run(q, &ctx, &plan).await.unwrap();
        assert_eq!(got, want, "{q:?} {mode:?}: the spilled run's rows differ");
        let (files, bytes, rows) = spill_metrics(&plan);
        eprintln!(
            "{q:?} {mode:?} {compression:?}: {files} spill files, {bytes} bytes, {rows} rows"
        );
        assert!(
            files > 0 && bytes > 0 && rows > 0,
            "{q:?}: it did not spill"
        );
        let m = engine.metrics();
        assert_eq!(
            m.bytes_written, bytes as u64,
            "{q:?}: DataFusion counted the bytes the engine took"
        );
        assert_eq!(
            factory.stats().writers as usize,
            files,
            "{q:?}: DataFusion's spill file count is the writers it opened"
        );
        eprintln!(
            "engine: wrote {} B in {} records, read {} B",
            m.bytes_written, m.records_written, m.bytes_read
        );
        // What DataFusion read back (its merges may stop before a file's 8-byte end-of-stream
        // marker).
        assert!(m.records_written > 0 && m.bytes_read > m.bytes_written / 2);
        assert_eq!(
            m.encrypt_nanos > 0,
            encryption,
            "{q:?}: encrypted as configured"
        );
        if compression != Compression::None && q == Query::GroupBy {
            assert!(
                m.physical_bytes_written < m.logical_bytes_written,
                "{compression:?} stored the spills smaller"
            );
        }
    });
    // The query and its plan are gone: no live file, and nothing under the root once the pool
    // is trimmed.
    assert!(engine.settle(Duration::from_secs(10)));
    let live: Vec<_> = engine
        .list_files()
        .into_iter()
        .filter(|f| f.kind == FileKind::Live)
        .collect();
    assert!(live.is_empty(), "live files after the query: {live:?}");
    engine.trim_pool();
    assert!(engine.settle(Duration::from_secs(10)));
    let left = files_under(&root);
    assert!(left.is_empty(), "files left under the root: {left:?}");
    assert_eq!(engine.metrics().tickets_used, 0);
}
