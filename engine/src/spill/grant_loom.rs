use super::*;
use crate::sync::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

/// The state's files in the models.
const FILES: [u32; 2] = [0, 1];

/// Files handed back by a `Grants` method: whoever gets them gets all of them.
fn taken(v: Option<Vec<u32>>) -> Vec<u32> {
    if let Some(v) = &v {
        assert_eq!(v[..], FILES, "a taker got a partial or empty list");
    }
    v.unwrap_or_default()
}

/// Asserts that every file ended exactly once in `ended`.
fn each_once(ended: &[u32]) {
    let mut e = ended.to_vec();
    e.sort_unstable();
    assert_eq!(e[..], FILES, "files must end exactly once");
}

/// The scope's close, as `close_by_scope` runs it; sets `closed` once it returned.
fn close(g: &Grants<u32>, closed: &AtomicBool) -> Vec<u32> {
    let v = taken(g.close());
    assert!(g.is_aborted(), "readers must see the close");
    closed.store(true, Ordering::SeqCst);
    v
}

/// A reader: takes a grant (fails with `Aborted` if the close returned before), finds the
/// files there while it holds it (unless the scope closed), and releases it.
fn read(g: &Grants<u32>, closed: &AtomicBool, held: &AtomicUsize) -> Vec<u32> {
    let after_close = closed.load(Ordering::SeqCst);
    match g.acquire() {
        Ok(()) => {
            assert!(!after_close, "a grant was taken after the close");
            held.fetch_add(1, Ordering::SeqCst);
            let present = g.with_entries(|e| e.len()) == FILES.len();
            assert!(present || g.is_aborted(), "a grant holds no files");
            held.fetch_sub(1, Ordering::SeqCst);
            release(g, held)
        }
        Err(e) => {
            assert!(
                matches!(e, SpillError::Aborted | SpillError::Closed { .. }),
                "{e}"
            );
            Vec::new()
        }
    }
}

/// Releases a grant; the files go with the last one only.
fn release(g: &Grants<u32>, held: &AtomicUsize) -> Vec<u32> {
    let v = taken(g.release());
    if !v.is_empty() {
        assert_eq!(
            held.load(Ordering::SeqCst),
            0,
            "deleted while a grant held them"
        );
    }
    v
}

/// A reader takes a grant and releases it, the scope closes the state, and the first grant
/// is released, in any order. The files are deleted exactly once, by the last release
/// (only when no grant is held) or by the close; a grant taken after the close returned
/// fails with `Aborted`.
#[test]
fn loom_grants_release_against_close() {
    loom::model(|| {
        let g = Arc::new(Grants::new(FILES.to_vec()));
        // Grants held, as the model counts them (the first one not included).
        let held = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let reader = {
            let (g, held, closed) = (g.clone(), held.clone(), closed.clone());
            thread::spawn(move || read(&g, &closed, &held))
        };
        let closer = {
            let (g, closed) = (g.clone(), closed.clone());
            thread::spawn(move || close(&g, &closed))
        };
        let mut ended = release(&g, &held);
        ended.extend(reader.join().unwrap());
        ended.extend(closer.join().unwrap());
        each_once(&ended);
        assert!(g.acquire().is_err(), "a grant after the close");
    });
}

/// A publish that moves nothing (and rolls back) or everything races the scope's close and
/// a reader (which waits while the publish is under way). Every file ends exactly once:
/// deleted by the last release, the close or the roll-back, or published; a reader never
/// holds a grant without the files (unless the scope closed), never gets one after the
/// close, and is always woken (loom reports a reader left waiting as a deadlock).
fn publish_races_close(moved: bool) {
    loom::model(move || {
        let g = Arc::new(Grants::new(FILES.to_vec()));
        let held = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let reader = {
            let (g, held, closed) = (g.clone(), held.clone(), closed.clone());
            thread::spawn(move || read(&g, &closed, &held))
        };
        let closer = {
            let (g, closed) = (g.clone(), closed.clone());
            thread::spawn(move || close(&g, &closed))
        };
        // The publisher holds the first grant.
        let mut ended = Vec::new();
        match g.begin_publish() {
            Ok(entries) if moved => {
                assert_eq!(entries[..], FILES);
                ended.extend(entries); // published: the caller's now
                g.end_publish();
            }
            Ok(entries) => {
                assert_eq!(entries[..], FILES);
                ended.extend(taken(g.roll_back_publish(entries)));
            }
            Err(e) => assert!(
                matches!(e, SpillError::Aborted | SpillError::StateShared { .. }),
                "{e}"
            ),
        }
        // The publish ended: once the close returned, the state holds no files.
        if closed.load(Ordering::SeqCst) {
            assert!(
                g.with_entries(|e| e.is_empty()),
                "the close left the files held"
            );
        }
        ended.extend(release(&g, &held));
        ended.extend(reader.join().unwrap());
        ended.extend(closer.join().unwrap());
        each_once(&ended);
    });
}

#[test]
fn loom_grants_publish_rolled_back_against_close() {
    publish_races_close(false);
}

#[test]
fn loom_grants_publish_against_close() {
    publish_races_close(true);
}
