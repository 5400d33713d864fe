use super::*;
use crate::format::block::{Binding, Codec, LARGE_PREFIX_LEN, record_frame};

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

/// The unregistered buffers' free lists too (the psync backend's, and io_uring's past its
/// registered slots): the first return makes room for as many buffers of each size as the
/// budget can hold (up to the retain bound), so a burst of returns (more writes in flight
/// than ever before, as on a loaded machine) never grows a list on an I/O thread. Before, the
/// lists grew by doubling, and `cycle_allocs.rs psync::a_write_in_steady_state_allocates_nothing`
/// counted their reallocations (64 -> 128, 128 -> 256 bytes on `spillring-psync`) when a
/// stall put more buffers in flight during its count than during its warm-up.
#[test]
fn a_return_never_grows_the_plain_free_lists() {
    let p = BufferPool::new(64 << 10, 0, 64, 1 << 20);
    // Buffers shrink as the budget fills: these are of several sizes.
    let held: Vec<IoBuf> = (0..24).map(|_| p.try_get(0).unwrap()).collect();
    let mut held = held.into_iter();
    drop(held.next());
    let caps = |p: &BufferPool| -> Vec<usize> {
        p.free.lock().plain.iter().map(|v| v.capacity()).collect()
    };
    let first = caps(&p);
    for (k, cap) in first.iter().enumerate() {
        let fits = ((1 << 20) / p.class_size(k)).min(64);
        assert!(
            *cap >= fits,
            "class {k}: room for {cap}, the budget holds {fits}: {first:?}"
        );
    }
    drop(held);
    assert_eq!(
        p.free.lock().plain.iter().map(Vec::len).sum::<usize>(),
        24,
        "every buffer was kept"
    );
    assert_eq!(caps(&p), first, "the returns did not grow a list");
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
            Err(NoBuffer::Exhausted { budget, held: h }) => {
                assert_eq!(budget, 4 << 20);
                assert_eq!(h, 4 << 20);
                break;
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(held[0].capacity(), 1 << 20);
    assert_eq!(held.last().map(IoBuf::capacity), Some(4096));
    let (budget, mapped, peak, out) = p.stats();
    assert_eq!(
        (mapped, peak, out),
        (budget, budget, budget),
        "every buffer is held"
    );
    // A buffer in flight turns "exhausted" into "wait", and its return ends the wait.
    let mut b = held.pop().unwrap();
    b.mark_in_flight();
    let Err(NoBuffer::Wait { epoch }) = p.try_get(0) else {
        panic!("expected a wait")
    };
    drop(b);
    p.wait_returned(epoch);
    assert!(p.try_get(0).is_ok());
}

/// Deferred copies (write-behind of a large record's copy): the bytes land where they were
/// placed once the writing thread applies them, the buffer's length counts them from the
/// start, a buffer holding `FILLS` already copies the next at once, and a buffer dropped
/// without being written lets go of the records it referenced.
#[test]
fn deferred_copies_land_in_place_and_let_go_of_their_records() {
    let p = BufferPool::new(64 << 10, 0, 4, 1 << 20);
    let mut b = p.try_get(0).unwrap();
    let rec = bytes::Bytes::from((0..40_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    b.push(b"head");
    assert!(
        !b.has_fills(),
        "an eager push leaves the writing thread nothing to do"
    );
    for k in 0..6 {
        b.push_deferred(&rec, k * 1000, 1000);
    }
    b.push(b"tail");
    assert_eq!(b.len, 4 + 6000 + 4, "deferred bytes count at once");
    assert_eq!(
        b.fills.copies(),
        FILLS,
        "the third to sixth were copied at once"
    );
    assert!(b.has_fills());
    b.apply_fills();
    assert_eq!(b.fills.copies(), 0);
    assert!(!b.has_fills(), "applied fills are gone");
    assert_eq!(&b.filled()[..4], b"head");
    assert_eq!(&b.filled()[4..6004], &rec[..6000]);
    assert_eq!(&b.filled()[6004..], b"tail");
    // Dropped unwritten (a writer that failed): its references to the record go.
    let mut c = p.try_get(0).unwrap();
    c.push_deferred(&rec, 0, 2000);
    drop(c);
    assert!(
        rec.is_unique(),
        "a dropped buffer keeps no reference to the record"
    );
}

/// A deferred block header (write-behind of a large record's checksum): the bytes pushed for
/// the header stay as they are until the writing thread applies the fills, then are the
/// header an eager seal gives; a buffer takes one, a second comes back to be sealed at once;
/// a buffer dropped unwritten lets go of the record.
#[test]
fn a_deferred_seal_writes_the_header_an_eager_one_gives() {
    let p = BufferPool::new(64 << 10, 0, 4, 1 << 20);
    let mut b = p.try_get(0).unwrap();
    let rec = bytes::Bytes::from((0..30_000u32).map(|i| (i % 241) as u8).collect::<Vec<u8>>());
    let bind = Binding {
        segment: 3,
        generation: 9,
        engine: 1,
    };
    let frame = record_frame(rec.len());
    let stored = (frame.len() + rec.len()) as u64;
    let unsealed = || {
        let mut s = BlockSeal::new(bind, 4096, Codec::Raw, stored, stored, 1, 0);
        s.update(&frame);
        s
    };
    let mut eager = unsealed();
    eager.update(&rec);
    let eager = eager.finish();
    b.push(b"head");
    let at = b.len;
    assert!(b.defer_seal(&rec, at, unsealed()).is_ok());
    assert!(b.fills.has_seal());
    assert!(
        b.has_fills(),
        "a deferred header alone is work for the writing thread"
    );
    assert!(
        b.defer_seal(&rec, at, unsealed()).is_err(),
        "one deferred header per buffer"
    );
    b.push(&[0u8; BLOCK_HEADER_LEN]);
    b.push(&frame);
    b.push_deferred(&rec, 0, rec.len());
    assert_eq!(
        &b.filled()[at..at + BLOCK_HEADER_LEN],
        &[0u8; BLOCK_HEADER_LEN][..],
        "nothing sealed on the placing thread"
    );
    b.apply_fills();
    assert!(!b.fills.has_seal());
    assert!(!b.has_fills());
    assert_eq!(&b.filled()[at..at + BLOCK_HEADER_LEN], &eager[..]);
    assert_eq!(
        &b.filled()[at + BLOCK_HEADER_LEN..at + LARGE_PREFIX_LEN],
        &frame[..]
    );
    assert_eq!(&b.filled()[at + LARGE_PREFIX_LEN..], &rec[..]);
    let mut c = p.try_get(0).unwrap();
    assert!(c.defer_seal(&rec, 0, unsealed()).is_ok());
    drop(c);
    assert!(
        rec.is_unique(),
        "a dropped buffer keeps no reference to the record"
    );
}
