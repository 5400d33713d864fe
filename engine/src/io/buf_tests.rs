use super::*;

/// Issue 10: a write allocates nothing; a registered buffer's return used to grow the
/// free list now and then (dhat: `put <- drop`, once per ~10,000 4 KiB writes).
#[test]
fn a_return_never_grows_the_free_list() {
    let p = BufferPool::new(64 << 10, 8, 4, 1 << 20);
    let held: Vec<IoBuf> = (0..8).map(|_| p.try_get(0).unwrap()).collect();
    let cap = p.free.lock().slotted.capacity();
    assert!(cap >= 8, "room for every slot up front: {cap}");
    drop(held);
    assert_eq!(p.free.lock().slotted.len(), 8);
    assert_eq!(
        p.free.lock().slotted.capacity(),
        cap,
        "the returns did not grow it"
    );
}

#[test]
fn classes_cover_4k_to_the_full_size() {
    let p = BufferPool::new(1 << 20, 0, 4, 64 << 20);
    assert_eq!(p.classes(), 9);
    assert_eq!(p.class_size(0), 4096);
    assert_eq!(p.class_size(8), 1 << 20);
    assert_eq!(p.class(4096), 0);
    assert_eq!(p.class(1 << 20), 8);
    let odd = BufferPool::new(12 << 10, 0, 4, 1 << 20);
    assert_eq!(odd.class_size(odd.classes() - 1), 12 << 10);
    let one = BufferPool::new(4096, 0, 4, 1 << 20);
    assert_eq!(one.classes(), 1);
}

#[test]
fn buffers_shrink_as_the_budget_fills_and_never_pass_it() {
    let p = BufferPool::new(1 << 20, 0, 4, 4 << 20);
    let mut held = Vec::new();
    loop {
        match p.try_get(0) {
            Ok(b) => held.push(b),
            Err(Short::Exhausted { budget, held: h }) => {
                assert_eq!(budget, 4 << 20);
                assert_eq!(h, 4 << 20);
                break;
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(held[0].capacity(), 1 << 20);
    assert_eq!(held.last().map(IoBuf::capacity), Some(4096));
    let (budget, mapped, peak) = p.stats();
    assert_eq!((mapped, peak), (budget, budget));
    // A buffer in flight turns "exhausted" into "wait", and its return ends the wait.
    let mut b = held.pop().unwrap();
    b.mark_in_flight();
    let Err(Short::Wait { epoch }) = p.try_get(0) else {
        panic!("expected a wait")
    };
    drop(b);
    p.wait_returned(epoch);
    assert!(p.try_get(0).is_ok());
}
