//! Stage-to-stage hand-off across scopes: `TaskSpill::adopt` moves a state's registration to
//! the consuming task's scope in one step (invariant 5), on both backends.

#[macro_use]
mod common;
use common::*;

use spillring::{BackendKind, Bytes, SpillError, TaskSpill};

per_backend!(
    an_adopted_state_outlives_its_producers_scope,
    adopting_after_the_producer_closed_is_aborted,
    adopting_into_a_closed_scope_deletes_the_files,
    the_adopting_scope_is_the_backstop,
    adoption_races_the_producers_close,
);

fn produce(task: &TaskSpill, n: u64) -> spillring::SpilledState {
    let mut w = task.writer().unwrap();
    for i in 0..n {
        w.write(Bytes::from(record(i, 1000))).unwrap();
    }
    w.finish().unwrap()
}

fn an_adopted_state_outlives_its_producers_scope(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), b);
    let producer = engine.task("producer").unwrap();
    let consumer = engine.task("consumer").unwrap();
    let st = produce(&producer, 600);
    consumer.adopt(&st).unwrap();
    consumer.adopt(&st).unwrap(); // twice into the same scope: a no-op
    drop(producer);
    assert!(
        !st.is_aborted(),
        "the producer's scope closed an adopted state"
    );
    let got: Vec<Bytes> = st.reader().unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(got.len(), 600);
    assert_eq!(&got[599][..], &record(599, 1000)[..]);
    drop((got, st));
    consumer.close();
    assert_clean(&engine, dir.path());
}

fn adopting_after_the_producer_closed_is_aborted(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), b);
    let producer = engine.task("producer").unwrap();
    let consumer = engine.task("consumer").unwrap();
    let st = produce(&producer, 10);
    producer.close();
    let e = consumer.adopt(&st).unwrap_err();
    assert!(matches!(e, SpillError::Aborted), "{e}");
    assert!(st.is_aborted());
    drop(st);
    consumer.close();
    assert_clean(&engine, dir.path());
}

fn adopting_into_a_closed_scope_deletes_the_files(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), b);
    let producer = engine.task("producer").unwrap();
    let consumer = engine.task("consumer").unwrap();
    let st = produce(&producer, 10);
    consumer.close();
    let e = consumer.adopt(&st).unwrap_err();
    assert!(matches!(e, SpillError::Aborted), "{e}");
    assert!(
        st.is_aborted(),
        "a closed scope took the state without closing it"
    );
    assert!(engine.settle(std::time::Duration::from_secs(10)));
    assert_eq!(
        segment_files(dir.path()),
        0,
        "the files outlived the failed adoption"
    );
    drop((st, producer));
    assert_clean(&engine, dir.path());
}

fn the_adopting_scope_is_the_backstop(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), b);
    let producer = engine.task("producer").unwrap();
    let consumer = engine.task("consumer").unwrap();
    let st = produce(&producer, 300);
    let mut r = st.reader().unwrap();
    consumer.adopt(&st).unwrap();
    // The producer's close no longer touches it; the consumer's cancel does.
    producer.close();
    assert!(r.next_record().unwrap().is_some());
    consumer.cancel();
    assert!(st.is_aborted());
    let mut aborted = false;
    for _ in 0..400 {
        match r.next_record() {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                assert!(matches!(e, SpillError::Aborted), "{e}");
                aborted = true;
                break;
            }
        }
    }
    assert!(aborted, "a reader of a cancelled state read on to the end");
    drop((r, st));
    assert_clean(&engine, dir.path());
}

/// Stress: the producer's close races the consumer's adoption. Either the adoption wins (the
/// state lives on, and the consumer's close deletes it) or the close does (the adoption is
/// `Aborted` and the files are gone); never both, never neither.
fn adoption_races_the_producers_close(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), b);
    let (mut won, mut lost) = (0, 0);
    for _ in 0..300 {
        let producer = engine.task("producer").unwrap();
        let consumer = engine.task("consumer").unwrap();
        let st = produce(&producer, 1);
        let closer = std::thread::spawn(move || producer.close());
        let r = consumer.adopt(&st);
        closer.join().unwrap();
        match r {
            Ok(()) => {
                won += 1;
                assert!(!st.is_aborted(), "adopted, then closed by the old scope");
                assert_eq!(st.reader().unwrap().count(), 1);
            }
            Err(e) => {
                lost += 1;
                assert!(matches!(e, SpillError::Aborted), "{e}");
                assert!(st.is_aborted(), "the adoption failed but the state lives");
            }
        }
        drop(st);
        consumer.close();
    }
    eprintln!("adoptions won {won}, lost {lost}");
    assert_clean(&engine, dir.path());
}
