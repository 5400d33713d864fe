//! Marks of the delete batches in flight: which batches queued before a given moment are all
//! done. A writer that failed with `StorageFull` waits for the mark taken after it queued its
//! deletes, so the space is back when its error returns (issue 25), without waiting for any
//! batch queued later.

use std::collections::VecDeque;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// Marks a burst's high-water capacity is shrunk back to (as the batches end).
const KEEP_MARKS: usize = 64;

/// Delete batches numbered in the order they are queued; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct DeleteMarks {
    inner: Mutex<Marks>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct Marks {
    /// Every batch below this number is done.
    base: u64,
    /// Batches from `base` on: done or not.
    done: VecDeque<bool>,
}

impl DeleteMarks {
    /// A batch is queued: its number (for [`DeleteMarks::end`]).
    pub(crate) fn begin(&self) -> u64 {
        let mut m = self.inner.lock();
        m.done.push_back(false);
        m.base + m.done.len() as u64 - 1
    }

    /// Batch `seq` has an outcome for each of its files (every one released, or handed to the
    /// cleanup worker).
    pub(crate) fn end(&self, seq: u64) {
        let mut m = self.inner.lock();
        let Some(i) = seq.checked_sub(m.base) else {
            return;
        };
        if let Some(d) = m.done.get_mut(i as usize) {
            *d = true;
        }
        let before = m.base;
        while m.done.front() == Some(&true) {
            m.done.pop_front();
            m.base += 1;
        }
        // Grown by a burst of batches in flight; given back as they end.
        let cap = m.done.capacity();
        if cap > KEEP_MARKS && m.done.len() < cap / 4 {
            m.done.shrink_to(cap / 2);
        }
        if m.base != before {
            self.cv.notify_all();
        }
    }

    /// The mark of now: every batch queued before this call is below it.
    pub(crate) fn mark(&self) -> u64 {
        let m = self.inner.lock();
        m.base + m.done.len() as u64
    }

    /// Waits until every batch below `mark` is done, or until `deadline`; true if they are.
    pub(crate) fn wait_reached(&self, mark: u64, deadline: Instant) -> bool {
        let mut m = self.inner.lock();
        while m.base < mark {
            if self.cv.wait_until(&mut m, deadline).timed_out() {
                return m.base >= mark;
            }
        }
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A burst of batches in flight grows the marks; their ends give the capacity back.
    #[test]
    fn the_marks_shrink_after_a_burst() {
        let marks = DeleteMarks::default();
        let seqs: Vec<u64> = (0..4096).map(|_| marks.begin()).collect();
        assert!(marks.inner.lock().done.capacity() >= 4096);
        for s in seqs {
            marks.end(s);
        }
        let cap = marks.inner.lock().done.capacity();
        assert!(cap <= 2 * KEEP_MARKS, "capacity {cap} kept after the burst");
    }

    /// A mark is reached only when every batch queued before it ended, in any order, and
    /// batches queued after it do not hold it back.
    #[test]
    fn a_mark_is_reached_when_every_batch_before_it_ended() {
        let m = DeleteMarks::default();
        let soon = || Instant::now() + Duration::from_millis(5);
        let (a, b) = (m.begin(), m.begin());
        let mark = m.mark();
        let later = m.begin();
        assert!(!m.wait_reached(mark, soon()));
        m.end(b);
        assert!(!m.wait_reached(mark, soon()), "batch a is still in flight");
        m.end(a);
        assert!(
            m.wait_reached(mark, soon()),
            "batch `later` is after the mark"
        );
        assert!(!m.wait_reached(m.mark(), soon()));
        m.end(later);
        assert!(m.wait_reached(m.mark(), soon()));
        assert_eq!(m.inner.lock().done.len(), 0);
        // Another thread's end wakes a waiter.
        let m = std::sync::Arc::new(DeleteMarks::default());
        let s = m.begin();
        let mark = m.mark();
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            m2.end(s);
        });
        assert!(m.wait_reached(mark, Instant::now() + Duration::from_secs(10)));
        t.join().unwrap();
    }
}
