//! What an operator looks for first, on both backends: the latency histograms and per-root
//! usage in `Metrics` and its Prometheus text, `Engine::list_files` at each stage of a file
//! (live in a writer, held by a state, pooled, awaiting a failed delete's retry), and the
//! `tracing` spans of a spill's life.

#[macro_use]
mod common;
use common::*;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spillring::{
    BackendKind, Bytes, Engine, FaultPlan, FaultPoint, FileKind, LATENCY_BUCKETS, Metrics,
    OwnedFile, TaskSpill, latency_bucket_bound,
};

per_backend!(
    a_spill_moves_every_histogram,
    the_prometheus_text_parses_back_to_the_snapshot,
    every_snapshot_field_is_in_the_prometheus_text,
    per_root_usage_follows_the_ledger,
    list_files_shows_a_writers_files_and_then_the_held_states,
    list_files_shows_a_pooled_segment,
    list_files_shows_a_failed_delete_as_awaiting_delete,
    spans_carry_task_segments_bytes_and_outcome,
);

/// 64 KiB segments of 40 KiB records: one segment per record.
const SEG: u64 = 64 << 10;
const REC: usize = 40 << 10;

fn spill(task: &TaskSpill, n: u64) -> spillring::SpilledState {
    let mut w = task.writer().unwrap();
    for i in 0..n {
        w.write(Bytes::from(record(i, REC))).unwrap();
    }
    w.finish().unwrap()
}

/// Every histogram's count moves by what the spill did: one write latency per `write`, one
/// rotation per segment, one finish, one read open per segment, one delete per file.
fn a_spill_moves_every_histogram(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(SEG)).unwrap();
    let before = engine.metrics().latency;
    for h in [
        before.write,
        before.rotate,
        before.finish,
        before.read,
        before.delete,
    ] {
        assert_eq!(h.count, 0, "{h:?}");
    }
    let task = engine.task("histograms").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..5 {
        w.write(Bytes::from(record(i, REC))).unwrap();
    }
    w.write_slice(&record(5, 100)).unwrap();
    let mut slot = w.record(100).unwrap();
    slot.fill(7);
    slot.commit().unwrap();
    let uncommitted = w.record(100).unwrap();
    drop(uncommitted);
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 5);
    let mut r = st.reader().unwrap();
    let mut n = 0;
    while r.next_record().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 7);
    drop((r, st));
    task.close();
    assert!(engine.settle(Duration::from_secs(10)));
    let l = engine.metrics().latency;
    assert_eq!(
        l.write.count, 7,
        "one per write, write_slice and committed slot: {:?}",
        l.write
    );
    assert_eq!(l.rotate.count, 5, "one per segment: {:?}", l.rotate);
    assert_eq!(l.finish.count, 1, "{:?}", l.finish);
    assert_eq!(l.read.count, 5, "one per segment opened: {:?}", l.read);
    assert_eq!(l.delete.count, 5, "one per unlink: {:?}", l.delete);
    for h in [l.write, l.rotate, l.finish, l.read, l.delete] {
        assert!(h.sum_seconds > 0.0, "{h:?}");
        assert_eq!(h.cumulative[LATENCY_BUCKETS], h.count);
        assert!(h.cumulative.windows(2).all(|w| w[0] <= w[1]), "{h:?}");
        // Nothing here takes 8 s.
        assert!(h.quantile_bound(1.0).unwrap() <= latency_bucket_bound(LATENCY_BUCKETS - 1));
    }
    assert_clean(&engine, dir.path());
}

/// One parsed sample: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the Prometheus text format (what a scraper does): `# TYPE` lines and samples; every
/// sample's family must have a TYPE declared before it, once.
fn parse_prometheus(text: &str) -> (HashMap<String, String>, Vec<Sample>) {
    let mut types = HashMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                types.insert(name.to_owned(), kind.to_owned()).is_none(),
                "TYPE of {name} twice"
            );
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|e| panic!("{line}: {e}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let mut labels = BTreeMap::new();
                let mut chars = body.chars().peekable();
                while chars.peek().is_some() {
                    let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
                    assert_eq!(chars.next(), Some('"'), "{line}");
                    let mut val = String::new();
                    loop {
                        match chars.next().expect("unterminated label") {
                            '\\' => match chars.next() {
                                Some('n') => val.push('\n'),
                                Some(c) => val.push(c),
                                None => panic!("{line}"),
                            },
                            '"' => break,
                            c => val.push(c),
                        }
                    }
                    labels.insert(key, val);
                    if chars.peek() == Some(&',') {
                        chars.next();
                    }
                }
                (name.to_owned(), labels)
            }
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(&name)
            .to_owned();
        assert!(types.contains_key(&family), "no TYPE before {name}");
        samples.push((name, labels, value));
    }
    (types, samples)
}

/// The Prometheus text, parsed back, holds the snapshot's histograms (cumulative buckets at
/// the documented bounds, `+Inf` equal to `_count`, `_sum`) and per-root usage.
fn the_prometheus_text_parses_back_to_the_snapshot(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(SEG)).unwrap();
    let task = engine.task("prometheus").unwrap();
    let st = spill(&task, 3);
    let _ = st.reader().unwrap().count();
    let m = engine.metrics();
    let (types, samples) = parse_prometheus(&m.to_prometheus());
    let get = |name: &str, label: Option<(&str, &str)>| -> f64 {
        let hits: Vec<f64> = samples
            .iter()
            .filter(|(n, l, _)| {
                n == name && label.is_none_or(|(k, v)| l.get(k).map(String::as_str) == Some(v))
            })
            .map(|s| s.2)
            .collect();
        assert_eq!(hits.len(), 1, "{name} {label:?}: {hits:?}");
        hits[0]
    };
    assert_eq!(get("spillring_records_written_total", None), 3.0);
    let named = m.latency.named();
    assert_eq!(named.len(), 5);
    for (name, _, h) in named {
        let family = format!("spillring_{name}");
        assert_eq!(types[&family], "histogram");
        let buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|(n, _, _)| *n == format!("{family}_bucket"))
            .map(|(_, l, v)| {
                let le = &l["le"];
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, *v)
            })
            .collect();
        assert_eq!(buckets.len(), LATENCY_BUCKETS + 1);
        for (i, (le, v)) in buckets.iter().enumerate() {
            if i < LATENCY_BUCKETS {
                assert_eq!(*le, latency_bucket_bound(i));
            } else {
                assert_eq!(*le, f64::INFINITY);
            }
            assert_eq!(*v, h.cumulative[i] as f64, "{family} bucket {i}");
        }
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
        );
        let count = get(&format!("{family}_count"), None);
        assert_eq!(count, h.count as f64);
        assert_eq!(buckets[LATENCY_BUCKETS].1, count, "+Inf is the count");
        let sum = get(&format!("{family}_sum"), None);
        assert!(
            (sum - h.sum_seconds).abs() <= 1e-9 * sum.max(1.0),
            "{family}"
        );
    }
    assert_eq!(m.latency.write.count, 3);
    assert_eq!(m.latency.read.count, 3);
    assert_eq!(types["spillring_root_bytes"], "gauge");
    assert_eq!(m.roots.len(), 1);
    let root = m.roots[0].path.to_str().unwrap();
    assert_eq!(root, dir.path().to_str().unwrap());
    assert_eq!(
        get("spillring_root_bytes", Some(("root", root))),
        m.spill_bytes_in_use as f64
    );
    assert_eq!(get("spillring_root_files", Some(("root", root))), 3.0);
    drop(st);
    task.close();
    assert_clean(&engine, dir.path());
}

/// Every field of the snapshot (as serde names them: the list does not come from the metrics
/// table) has its row in the Prometheus text with the snapshot's value: a plain field as
/// `spillring_<field>`, a counter as `spillring_<field>_total`; the others by name below.
fn every_snapshot_field_is_in_the_prometheus_text(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(SEG)).unwrap();
    let task = engine.task("every-field").unwrap();
    let st = spill(&task, 2);
    let _ = st.reader().unwrap().count();
    let m = engine.metrics();
    let (types, samples) = parse_prometheus(&m.to_prometheus());
    let value_of = |name: &str, label: Option<(&str, &str)>| -> Option<f64> {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name && label.is_none_or(|(k, v)| l.get(k).map(String::as_str) == Some(v))
            })
            .map(|s| s.2)
    };
    let json = serde_json::to_value(&m).unwrap();
    let fields = json.as_object().unwrap();
    assert!(fields.len() > 40, "{fields:?}");
    for (field, v) in fields {
        match field.as_str() {
            "backend" | "write_mode" => {
                let label = (field.as_str(), v.as_str().unwrap());
                assert_eq!(
                    value_of("spillring_info", Some(label)),
                    Some(1.0),
                    "{field}"
                );
            }
            "errors" => {
                let kinds = v.as_array().unwrap();
                assert_eq!(kinds.len(), m.errors.len());
                for (kind, n) in &m.errors {
                    let got = value_of("spillring_errors_total", Some(("kind", kind)));
                    assert_eq!(got, Some(*n as f64), "errors {kind}");
                }
            }
            "latency" => {
                let named = m.latency.named();
                assert_eq!(v.as_object().unwrap().len(), named.len());
                for (name, _, h) in named {
                    assert_eq!(types[&format!("spillring_{name}")], "histogram");
                    let count = value_of(&format!("spillring_{name}_count"), None);
                    assert_eq!(count, Some(h.count as f64), "{name}");
                }
            }
            "roots" => {
                assert_eq!(v.as_array().unwrap().len(), m.roots.len());
                for r in &m.roots {
                    let root = ("root", r.path.to_str().unwrap());
                    assert_eq!(
                        value_of("spillring_root_bytes", Some(root)),
                        Some(r.bytes as f64)
                    );
                    assert_eq!(
                        value_of("spillring_root_files", Some(root)),
                        Some(r.files as f64)
                    );
                }
            }
            _ => {
                let want = v.as_f64().unwrap_or_else(|| panic!("{field}: {v}"));
                let name = match field.as_str() {
                    "cleanup_oldest_age_secs" => "spillring_cleanup_oldest_age_seconds".to_owned(),
                    f => format!("spillring_{f}"),
                };
                let total = format!("{name}_total");
                let (name, kind) = match (types.get(&name), types.get(&total)) {
                    (Some(k), None) => (name, k.as_str()),
                    (None, Some(k)) => (total, k.as_str()),
                    other => panic!("{field}: no single row ({other:?})"),
                };
                assert_eq!(
                    kind == "counter",
                    name.ends_with("_total"),
                    "{name}: {kind}"
                );
                assert_eq!(value_of(&name, None), Some(want), "{field}");
            }
        }
    }
    drop(st);
    task.close();
    assert_clean(&engine, dir.path());
}

/// Two roots: each root's files and bytes are what the ledger holds there, they add up to the
/// engine-wide totals at every stage, and both go back to zero.
fn per_root_usage_follows_the_ledger(b: BackendKind) {
    let d1 = tempfile::tempdir().unwrap();
    let d2 = tempfile::tempdir().unwrap();
    // A root path with a quote and a backslash: the label must be escaped.
    let r2 = d2.path().join("odd\"name\\x");
    let engine = Engine::open(cfg(d1.path(), b).add_root(&r2).segment_size(SEG)).unwrap();
    let check = |m: &Metrics| {
        assert_eq!(m.roots.len(), 2);
        assert_eq!(m.roots[0].path, d1.path());
        assert_eq!(m.roots[1].path, r2);
        assert_eq!(m.roots.iter().map(|r| r.files).sum::<u64>(), m.tickets_used);
        assert_eq!(
            m.roots.iter().map(|r| r.bytes).sum::<u64>(),
            m.spill_bytes_in_use
        );
        for (r, path) in m.roots.iter().zip([d1.path(), r2.as_path()]) {
            assert_eq!(r.files as usize, segment_files(path), "{r:?}");
        }
    };
    let task = engine.task("roots").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..6 {
        w.write(Bytes::from(record(i, REC))).unwrap();
    }
    let m = engine.metrics();
    check(&m);
    assert!(
        m.roots.iter().all(|r| r.files > 0),
        "both roots used: {m:?}"
    );
    let st = w.finish().unwrap();
    let m = engine.metrics();
    check(&m);
    assert_eq!(m.tickets_used, 6);
    let text = m.to_prometheus();
    assert!(
        text.contains(r#"root="#) && text.contains(r#"odd\"name\\x""#),
        "{text}"
    );
    drop(st);
    task.close();
    assert!(engine.settle(Duration::from_secs(10)));
    let m = engine.metrics();
    check(&m);
    assert!(
        m.roots.iter().all(|r| r.files == 0 && r.bytes == 0),
        "{m:?}"
    );
}

/// The list agrees with the ledger (one ticket per file, the reserved bytes add up to the
/// quota's) and with the disk (exactly the segment files under the roots).
fn assert_consistent(engine: &Engine, root: &Path, files: &[OwnedFile]) {
    let m = engine.metrics();
    assert_eq!(files.len() as u64, m.tickets_used, "{files:#?}\n{m:?}");
    assert_eq!(
        files.iter().map(|f| f.reserved).sum::<u64>(),
        m.spill_bytes_in_use
    );
    let listed: BTreeSet<PathBuf> = files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(listed.len(), files.len(), "a file listed twice");
    let on_disk: BTreeSet<PathBuf> = files_under(root).into_iter().collect();
    assert_eq!(listed, on_disk);
    for f in files {
        assert_eq!(f.root, root);
        // A writer's file may still grow (its writes in flight): the size is only there.
        assert!(f.size.is_some(), "{f:?}");
        assert!(f.age < Duration::from_secs(60));
    }
}

fn list_files_shows_a_writers_files_and_then_the_held_states(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(SEG)).unwrap();
    assert!(engine.list_files().is_empty());
    let task = engine.task("t-live").unwrap();
    let other = engine.task("t-other").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..3 {
        w.write(Bytes::from(record(i, REC))).unwrap();
    }
    let mut w2 = other.writer().unwrap();
    w2.write(Bytes::from(record(9, 100))).unwrap();
    let files = engine.list_files();
    assert_consistent(&engine, dir.path(), &files);
    assert_eq!(files.len(), 4);
    assert!(files.iter().all(|f| f.kind == FileKind::Live));
    let of = |t: &str| -> Vec<&OwnedFile> {
        files
            .iter()
            .filter(|f| f.task.as_deref() == Some(t))
            .collect()
    };
    assert_eq!(of("t-live").len(), 3);
    assert_eq!(of("t-other").len(), 1);
    // The open segment reserves a whole segment in the ledger.
    assert!(of("t-other")[0].reserved >= SEG);

    let st = w.finish().unwrap();
    drop(w2);
    assert!(engine.settle(Duration::from_secs(10)));
    let held = engine.list_files();
    assert_consistent(&engine, dir.path(), &held);
    assert_eq!(held.len(), 3);
    assert!(
        held.iter()
            .all(|f| f.kind == FileKind::Live && f.task.as_deref() == Some("t-live"))
    );
    for f in &held {
        // Sealed: the size is the file's.
        assert_eq!(f.size, Some(std::fs::metadata(&f.path).unwrap().len()));
    }
    let paths: BTreeSet<PathBuf> = held.iter().map(|f| f.path.clone()).collect();
    assert_eq!(paths, st.paths().into_iter().collect());
    // Adopted by another scope: listed under that task.
    other.adopt(&st).unwrap();
    assert!(
        engine
            .list_files()
            .iter()
            .all(|f| f.task.as_deref() == Some("t-other"))
    );
    drop(st);
    task.close();
    other.close();
    assert_clean(&engine, dir.path());
    assert!(engine.list_files().is_empty());
}

fn list_files_shows_a_pooled_segment(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b).segment_size(SEG)).unwrap();
    let task = engine.task("t-pool").unwrap();
    let st = spill(&task, 2);
    let paths = st.paths();
    drop(st);
    let m = engine.metrics();
    assert_eq!(m.pool_segments, 2, "{m:?}");
    let files = engine.list_files();
    assert_consistent(&engine, dir.path(), &files);
    assert_eq!(files.len(), 2);
    for f in &files {
        assert_eq!(f.kind, FileKind::Pooled);
        assert_eq!(f.task, None, "a pooled file belongs to no task");
        assert!(paths.contains(&f.path));
    }
    // A writer takes one back: it is live again, in its task.
    let mut w = task.writer().unwrap();
    w.write(Bytes::from(record(0, 100))).unwrap();
    let files = engine.list_files();
    assert_consistent(&engine, dir.path(), &files);
    let kinds: Vec<FileKind> = files.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, vec![FileKind::Live, FileKind::Pooled]);
    drop(w);
    task.close();
    assert_clean(&engine, dir.path());
}

fn list_files_shows_a_failed_delete_as_awaiting_delete(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(3);
    let engine = Engine::open(
        cfg(dir.path(), b)
            .segment_size(SEG)
            .cleanup_retry_delay(Duration::from_secs(3600))
            .fault_plan(plan.clone()),
    )
    .unwrap();
    let task = engine.task("t-fail").unwrap();
    let st = spill(&task, 3);
    let paths = st.paths();
    plan.fail_always(FaultPoint::IoUnlink, libc::EIO);
    plan.fail_always(FaultPoint::CleanupUnlink, libc::EIO);
    drop(st);
    wait_for("records retained", || {
        let m = engine.metrics();
        m.deletes_in_flight == 0 && m.cleanup_pending == 3
    });
    // The worker's first retry (no delay before it) may be under way, its batch out of the
    // queue: wait until a batch failed and went back (then nothing runs for an hour).
    wait_for("the worker's first retry", || {
        engine.metrics().cleanup_retries >= 1
    });
    let files = engine.list_files();
    assert_consistent(&engine, dir.path(), &files);
    for f in &files {
        assert_eq!(f.kind, FileKind::AwaitingDelete, "{f:?}");
        assert_eq!(f.task, None);
        assert!(paths.contains(&f.path));
        assert!(f.reserved > 0);
    }
    plan.clear_all();
    engine.retry_cleanup_now();
    task.close();
    assert_clean(&engine, dir.path());
    assert!(engine.list_files().is_empty());
}

// ---- A tiny capturing subscriber: every span with its parent and fields, as strings.

#[derive(Debug, Clone, Default)]
struct SpanRec {
    name: String,
    parent: Option<u64>,
    fields: BTreeMap<String, String>,
}

#[derive(Default)]
struct Capture {
    next: AtomicU64,
    spans: Mutex<HashMap<u64, SpanRec>>,
    stack: Mutex<Vec<u64>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().to_owned(), format!("{v:?}"));
    }
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        self.0.insert(f.name().to_owned(), v.to_owned());
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.target().starts_with("spillring")
    }
    fn new_span(&self, a: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let parent = if a.is_root() {
            None
        } else if let Some(p) = a.parent() {
            Some(p.into_u64())
        } else {
            self.stack.lock().unwrap().last().copied()
        };
        let mut rec = SpanRec {
            name: a.metadata().name().to_owned(),
            parent,
            fields: BTreeMap::new(),
        };
        a.record(&mut Fields(&mut rec.fields));
        self.spans.lock().unwrap().insert(id, rec);
        tracing::span::Id::from_u64(id)
    }
    fn record(&self, id: &tracing::span::Id, v: &tracing::span::Record<'_>) {
        if let Some(rec) = self.spans.lock().unwrap().get_mut(&id.into_u64()) {
            v.record(&mut Fields(&mut rec.fields));
        }
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, id: &tracing::span::Id) {
        self.stack.lock().unwrap().push(id.into_u64());
    }
    fn exit(&self, _: &tracing::span::Id) {
        self.stack.lock().unwrap().pop();
    }
}

/// Shares the capture between the dispatcher and the test.
struct Shared(Arc<Capture>);

impl tracing::Subscriber for Shared {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        self.0.enabled(m)
    }
    fn new_span(&self, a: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        self.0.new_span(a)
    }
    fn record(&self, id: &tracing::span::Id, v: &tracing::span::Record<'_>) {
        self.0.record(id, v)
    }
    fn record_follows_from(&self, a: &tracing::span::Id, b: &tracing::span::Id) {
        self.0.record_follows_from(a, b)
    }
    fn event(&self, e: &tracing::Event<'_>) {
        self.0.event(e)
    }
    fn enter(&self, id: &tracing::span::Id) {
        self.0.enter(id)
    }
    fn exit(&self, id: &tracing::span::Id) {
        self.0.exit(id)
    }
}

/// A task's span (task id, outcome), its writers' (segments, records, bytes, outcome:
/// finished, failed, aborted) and its states' (segments, bytes, outcome: released,
/// published, aborted), each under its task's.
fn spans_carry_task_segments_bytes_and_outcome(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("published");
    std::fs::create_dir(&dest).unwrap();
    let root = dir.path().join("spill");
    let cap = Arc::new(Capture::default());
    tracing::subscriber::with_default(Shared(cap.clone()), || {
        let engine = Engine::open(cfg(&root, b).segment_size(SEG)).unwrap();
        let task = engine.task("span-task").unwrap();
        let st = spill(&task, 3); // finished; its state released below
        assert_eq!(st.reader().unwrap().count(), 3);
        drop(st);
        let mut w = task.writer().unwrap(); // dropped unfinished: failed
        w.write(Bytes::from(record(0, 10))).unwrap();
        drop(w);
        let st = spill(&task, 1); // published
        st.publish(&dest, "out").unwrap();
        drop(st);
        task.close();
        let cancelled = engine.task("span-cancel").unwrap();
        let held = spill(&cancelled, 2); // aborted by the cancel
        let mut w = cancelled.writer().unwrap(); // aborted by the cancel
        w.write(Bytes::from(record(1, 10))).unwrap();
        cancelled.cancel();
        assert!(w.write(Bytes::from(record(2, 10))).is_err());
        drop((w, held, cancelled));
        engine.shutdown(Duration::from_secs(5));
    });
    let spans = cap.spans.lock().unwrap().clone();
    let named = |n: &str| -> Vec<(u64, SpanRec)> {
        let mut v: Vec<(u64, SpanRec)> = spans
            .iter()
            .filter(|(_, s)| s.name == n)
            .map(|(i, s)| (*i, s.clone()))
            .collect();
        v.sort_by_key(|(i, _)| *i);
        v
    };
    let tasks = named("spillring.task");
    assert_eq!(tasks.len(), 2, "{spans:#?}");
    let (t1, t1s) = &tasks[0];
    let (t2, t2s) = &tasks[1];
    assert_eq!(t1s.fields["task"], "span-task");
    assert_eq!(t1s.fields["outcome"], "closed");
    assert_eq!(t2s.fields["task"], "span-cancel");
    assert_eq!(t2s.fields["outcome"], "cancelled");

    let writers = named("spillring.writer");
    let w: Vec<(Option<u64>, &str, &str, &str, &str)> = writers
        .iter()
        .map(|(_, s)| {
            (
                s.parent,
                s.fields["segments"].as_str(),
                s.fields["records"].as_str(),
                s.fields["bytes"].as_str(),
                s.fields["outcome"].as_str(),
            )
        })
        .collect();
    let rec = REC.to_string();
    let three = (3 * REC).to_string();
    let two = (2 * REC).to_string();
    assert_eq!(
        w,
        vec![
            (Some(*t1), "3", "3", three.as_str(), "finished"),
            (Some(*t1), "1", "1", "10", "failed"),
            (Some(*t1), "1", "1", rec.as_str(), "finished"),
            (Some(*t2), "2", "2", two.as_str(), "finished"),
            (Some(*t2), "1", "1", "10", "aborted"),
        ],
        "{writers:#?}"
    );
    let states = named("spillring.state");
    let s: Vec<(Option<u64>, &str, &str)> = states
        .iter()
        .map(|(_, s)| {
            (
                s.parent,
                s.fields["segments"].as_str(),
                s.fields["outcome"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        s,
        vec![
            (Some(*t1), "3", "released"),
            (Some(*t1), "1", "published"),
            (Some(*t2), "2", "aborted"),
        ],
        "{states:#?}"
    );
    for (_, st) in &states {
        let bytes: u64 = st.fields["bytes"].parse().unwrap();
        assert!(bytes > 0, "{st:?}");
    }
}
