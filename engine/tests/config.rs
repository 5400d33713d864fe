//! Defaults agree with each other: any valid value of one field works with the defaults of the
//! rest. A default that depends on another field follows it (found by reading: a 64 KiB
//! segment size alone failed `Engine::open` because the default 1 MiB staging buffer was
//! larger than the segment).

mod common;
use common::*;

use std::path::Path;
use std::time::Duration;

use spillring::{
    BackendKind, Bytes, Engine, EngineConfig, MAX_OPEN_FILES, MAX_SEGMENT_SIZE, MIN_SEGMENT_SIZE,
    SpillError, WriteMode,
};

/// Opens `cfg`, spills a few records (40 KiB: within the smallest quota) and reads them back.
fn opens_and_spills(name: &str, cfg: EngineConfig, root: &Path) {
    let engine = Engine::open(cfg).unwrap_or_else(|e| panic!("{name}: open failed: {e}"));
    let task = engine.task(name).unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..4 {
        w.write(Bytes::from(record(i, 10 << 10)))
            .unwrap_or_else(|e| panic!("{name}: write {i}: {e}"));
    }
    let state = w.finish().unwrap_or_else(|e| panic!("{name}: finish: {e}"));
    let mut r = state.reader().unwrap();
    for i in 0..4 {
        assert_eq!(
            r.next_record().unwrap().unwrap(),
            record(i, 10 << 10),
            "{name}"
        );
    }
    drop((r, state, task));
    assert_clean(&engine, root);
}

#[test]
fn a_small_segment_size_alone_opens() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig::new(dir.path()).segment_size(64 << 10);
    assert!(cfg.validate().is_ok(), "{:?}", cfg.validate());
    opens_and_spills("segment_size", cfg, dir.path());
}

#[test]
fn a_small_quota_alone_opens() {
    for quota in [MIN_SEGMENT_SIZE, 1 << 20, (10 << 20) + 123] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = EngineConfig::new(dir.path()).max_spill_bytes(quota);
        assert!(cfg.validate().is_ok(), "{quota}: {:?}", cfg.validate());
        opens_and_spills("max_spill_bytes", cfg, dir.path());
    }
}

/// Issue 25: the refusal carries the field, its bounds and the value as fields, not only in
/// a message.
#[test]
fn invalid_config_names_the_field_its_bounds_and_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let err = EngineConfig::new(dir.path())
        .queue_depth(0)
        .validate()
        .unwrap_err();
    match &err {
        SpillError::InvalidConfig { field, need, got } => {
            assert_eq!(
                (*field, need.as_str(), got.as_str()),
                ("queue_depth", "1..=1024", "0")
            );
        }
        other => panic!("want InvalidConfig, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "invalid configuration: queue_depth: need 1..=1024, got 0"
    );
}

#[test]
fn a_quota_below_the_smallest_segment_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let err = Engine::open(EngineConfig::new(dir.path()).max_spill_bytes(MIN_SEGMENT_SIZE - 1))
        .unwrap_err();
    assert!(
        matches!(
            &err,
            SpillError::InvalidConfig {
                field: "max_spill_bytes",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn explicit_values_are_still_checked_against_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let err = EngineConfig::new(dir.path())
        .segment_size(64 << 10)
        .io_buffer_size(1 << 20)
        .validate()
        .unwrap_err();
    assert!(
        matches!(
            &err,
            SpillError::InvalidConfig {
                field: "io_buffer_size",
                ..
            }
        ),
        "{err}"
    );
    let err = EngineConfig::new(dir.path())
        .segment_size(2 << 20)
        .max_spill_bytes(1 << 20)
        .validate()
        .unwrap_err();
    assert!(
        matches!(
            &err,
            SpillError::InvalidConfig {
                field: "max_spill_bytes",
                ..
            }
        ),
        "{err}"
    );
}

/// Every field at the ends of its documented bounds, with the defaults of every other field.
#[test]
fn every_field_at_its_bounds_works_with_the_defaults_of_the_rest() {
    let _s = serial();
    type Set = fn(EngineConfig) -> EngineConfig;
    let cases: Vec<(&str, Set)> = vec![
        ("segment_size min", |c| c.segment_size(MIN_SEGMENT_SIZE)),
        ("segment_size max", |c| c.segment_size(MAX_SEGMENT_SIZE)),
        ("ticket_capacity min", |c| c.ticket_capacity(1)),
        ("ticket_capacity max", |c| c.ticket_capacity(1 << 24)),
        ("max_spill_bytes min", |c| {
            c.max_spill_bytes(MIN_SEGMENT_SIZE)
        }),
        ("max_spill_bytes max", |c| c.max_spill_bytes(u64::MAX)),
        ("mode direct", |c| c.mode(WriteMode::Direct)),
        ("backend psync", |c| c.backend(BackendKind::Psync)),
        ("ring_threads min", |c| c.ring_threads(1)),
        ("ring_threads max", |c| c.ring_threads(64)),
        ("ring_entries min", |c| c.ring_entries(8)),
        ("ring_entries max", |c| c.ring_entries(32_768)),
        ("io_buffer_size min", |c| c.io_buffer_size(4096)),
        ("io_buffer_size max", |c| c.io_buffer_size(64 << 20)),
        ("queue_depth min", |c| c.queue_depth(1)),
        ("queue_depth max", |c| c.queue_depth(1024)),
        ("registered_buffers min", |c| c.registered_buffers(0)),
        ("registered_buffers max", |c| c.registered_buffers(16_384)),
        ("large_record_threshold min", |c| {
            c.large_record_threshold(1)
        }),
        ("large_record_threshold max", |c| {
            c.large_record_threshold(u32::MAX as u64)
        }),
        ("preallocate", |c| c.preallocate(true)),
        ("cleanup_retry_delay min", |c| {
            c.cleanup_retry_delay(Duration::from_millis(1))
        }),
        ("cleanup_retry_delay max", |c| {
            c.cleanup_retry_delay(Duration::from_secs(3600))
        }),
        ("read_buffer_max 0", |c| c.read_buffer_max(0)),
        ("read_buffer_max max", |c| c.read_buffer_max(64 << 20)),
        ("max_read_memory 0", |c| c.max_read_memory(0)),
        ("max_read_memory max", |c| c.max_read_memory(1 << 40)),
        ("max_open_files min", |c| c.max_open_files(1)),
        ("max_open_files max", |c| c.max_open_files(MAX_OPEN_FILES)),
        ("pool off", |c| c.pool_max_segments(0)),
        ("pool_max_segments max", |c| c.pool_max_segments(65_536)),
        ("pool_max_bytes 0", |c| c.pool_max_bytes(0)),
        ("pool_max_bytes max", |c| c.pool_max_bytes(u64::MAX)),
        ("cleanup_batch min", |c| c.cleanup_batch(1)),
        ("cleanup_batch max", |c| c.cleanup_batch(65_536)),
        ("root_skip min", |c| c.root_skip(Duration::ZERO)),
        ("root_skip max", |c| c.root_skip(Duration::from_secs(3600))),
        ("shutdown_budget min", |c| c.shutdown_budget(Duration::ZERO)),
        ("shutdown_budget max", |c| {
            c.shutdown_budget(Duration::from_secs(3600))
        }),
    ];
    for (name, set) in cases {
        let dir = tempfile::tempdir().unwrap();
        let cfg = set(EngineConfig::new(dir.path()));
        assert!(cfg.validate().is_ok(), "{name}: {:?}", cfg.validate());
        opens_and_spills(name, cfg, dir.path());
    }
}

#[test]
fn max_read_memory_past_its_bound_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let err =
        Engine::open(EngineConfig::new(dir.path()).max_read_memory((1 << 40) + 1)).unwrap_err();
    assert!(
        matches!(
            &err,
            SpillError::InvalidConfig {
                field: "max_read_memory",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn max_open_files_out_of_bounds_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for n in [0, MAX_OPEN_FILES + 1] {
        let err = Engine::open(EngineConfig::new(dir.path()).max_open_files(n)).unwrap_err();
        assert!(
            matches!(
                &err,
                SpillError::InvalidConfig {
                    field: "max_open_files",
                    ..
                }
            ),
            "{n}: {err}"
        );
    }
}
