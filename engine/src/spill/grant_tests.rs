use super::*;

fn held(g: &Grants<u32>) -> Vec<u32> {
    g.with_entries(<[u32]>::to_vec)
}

/// `acquire` on another thread, failing the test if it is still blocked after 5 s (a
/// publish left under way blocks it for good).
fn acquire_soon(g: &std::sync::Arc<Grants<u32>>) -> Result<()> {
    let g = g.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(g.acquire()));
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .expect("acquire blocked: the publish never ended")
}

#[test]
fn the_last_release_takes_the_files_once() {
    let g = Grants::new(vec![1, 2]);
    g.acquire().unwrap();
    g.add();
    assert_eq!(g.release(), None, "two grants left");
    assert_eq!(g.release(), None, "one grant left");
    assert_eq!(held(&g), [1, 2]);
    assert_eq!(
        g.release(),
        Some(vec![1, 2]),
        "the last grant takes the files"
    );
    assert!(held(&g).is_empty());
    assert!(!g.is_aborted(), "a release is not an abort");
    assert!(
        matches!(g.acquire(), Err(SpillError::Aborted)),
        "no grant on gone files"
    );
    assert_eq!(g.close(), None, "gone files are not taken twice");
    assert!(g.is_aborted());
}

#[test]
fn the_close_takes_the_files_once_and_aborts_every_grant() {
    let g = Grants::new(vec![7]);
    g.acquire().unwrap();
    assert!(!g.is_aborted());
    assert_eq!(g.close(), Some(vec![7]));
    assert!(g.is_aborted());
    assert!(held(&g).is_empty());
    assert_eq!(g.close(), None, "a second close takes nothing");
    assert!(matches!(g.acquire(), Err(SpillError::Aborted)));
    assert_eq!(g.release(), None, "a release after the close takes nothing");
    assert_eq!(g.release(), None);
    assert!(matches!(g.begin_publish(), Err(SpillError::Aborted)));
}

#[test]
fn a_publish_needs_the_only_grant() {
    let g = Grants::new(vec![1, 2, 3]);
    g.add();
    assert!(matches!(
        g.begin_publish(),
        Err(SpillError::StateShared { grants: 2 })
    ));
    assert_eq!(held(&g), [1, 2, 3], "a refused publish takes nothing");
    assert_eq!(g.release(), None);
    assert_eq!(g.begin_publish().unwrap(), [1, 2, 3]);
    assert!(held(&g).is_empty(), "the publish holds them");
    assert!(matches!(g.begin_publish(), Err(SpillError::Closed { .. })));
    assert_eq!(
        g.close(),
        None,
        "a publish under way settles its files itself"
    );
    assert!(g.is_aborted());
}

#[test]
fn an_ended_publish_leaves_nothing_to_take() {
    let g = std::sync::Arc::new(Grants::new(vec![4]));
    let files = g.begin_publish().unwrap();
    assert_eq!(files, [4]);
    g.end_publish();
    assert!(matches!(acquire_soon(&g), Err(SpillError::Closed { .. })));
    assert!(matches!(g.begin_publish(), Err(SpillError::Closed { .. })));
    assert_eq!(g.release(), None, "published files are the caller's");
    assert_eq!(g.close(), None);
}

#[test]
fn a_publish_that_moved_nothing_rolls_back() {
    let g = Grants::new(vec![5, 6]);
    let files = g.begin_publish().unwrap();
    assert_eq!(g.roll_back_publish(files), None, "held again");
    assert_eq!(held(&g), [5, 6]);
    g.acquire().unwrap();
    assert_eq!(g.release(), None);
    assert_eq!(g.release(), Some(vec![5, 6]));
}

#[test]
fn a_roll_back_after_a_close_hands_the_files_back() {
    let g = Grants::new(vec![8]);
    let files = g.begin_publish().unwrap();
    assert_eq!(g.close(), None);
    assert_eq!(
        g.roll_back_publish(files),
        Some(vec![8]),
        "closed meanwhile: the publish deletes them"
    );
    assert!(held(&g).is_empty());
    assert_eq!(g.release(), None, "and they are gone, not taken twice");
    assert!(matches!(g.acquire(), Err(SpillError::Aborted)));
}

#[test]
fn a_grant_waits_for_a_publish_to_end() {
    for roll_back in [false, true] {
        let g = std::sync::Arc::new(Grants::new(vec![9]));
        let files = g.begin_publish().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let g = g.clone();
            std::thread::spawn(move || tx.send(g.acquire()));
        }
        let wait = std::time::Duration::from_millis(50);
        assert!(
            rx.recv_timeout(wait).is_err(),
            "a grant was taken during a publish"
        );
        let soon = std::time::Duration::from_secs(5);
        if roll_back {
            assert_eq!(g.roll_back_publish(files), None);
            rx.recv_timeout(soon)
                .expect("the waiter was not woken")
                .unwrap();
            assert_eq!(g.release(), None, "the waiter holds a grant");
            assert_eq!(g.release(), Some(vec![9]));
        } else {
            g.end_publish();
            let r = rx.recv_timeout(soon).expect("the waiter was not woken");
            assert!(matches!(r, Err(SpillError::Closed { .. })), "{r:?}");
        }
    }
}
