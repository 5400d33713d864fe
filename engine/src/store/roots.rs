//! The spill roots: this engine's locked process directory under each, and each root's health
//! (a root whose creates or writes fail with a device error is skipped for a while).
//!
//! At open (`Engine::open`, with [`crate::store::proc`]): a missing root is created with its
//! missing parents, and what was created is removed at shutdown if empty; a root that is not a
//! directory fails the open ([`SpillError::RootNotADirectory`]); a root that fails with an OS
//! error (read-only, no permission, a device error) is skipped for the engine's life with a
//! warning and the `roots_unusable` metric, as long as another root works. `Roots` holds only
//! the roots in use, indexed in configuration order among them.
//!
//! Placement: a new segment goes to the healthy root where it would finish first
//! ([`Roots::pick`]): the fewest segments being written, each root's count weighed by how fast
//! it wrote its last segments (ties in turn). A writer holds its open segment's [`RootUse`],
//! which counts it while it is written and measures the root as its writes go out: each 8 MiB
//! handed to writes over their time, times the segments written there meanwhile (started
//! ones: a segment opened ahead of need does not share the device yet), taken only when the
//! writer waited for its writes in flight for a tenth of that time (the device's rate, not a
//! slow producer's). Only a root clearly slower than the fastest
//! (under [`SLOW_SHARE`] of its rate) is weighed down, so roots of like speed (and every root
//! while the producers, not the devices, set the pace) keep placement by count. A rate is
//! forgotten [`RATE_TTL`] after its last measure, so a root weighed down gets a segment again
//! and is measured anew. With a 100 and a 25 MB/s device and 4 writers, about one writer in
//! four writes on the slow one: the other roots' bandwidth is not held back by it (issue 27,
//! point 2).

use std::io;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{Result, SpillError};
use crate::metrics::Counters;
use crate::store::proc::ProcDir;
use crate::sys::errno;
use crate::sys::fs;

/// Health of one spill root.
#[derive(Debug, Default)]
struct RootHealth {
    skip_until: Mutex<Option<Instant>>,
}

/// The roots in configuration order, with this engine's process directory under each.
#[derive(Debug)]
pub(crate) struct Roots {
    paths: Vec<PathBuf>,
    proc_dirs: Vec<Arc<ProcDir>>,
    /// Directories the open created for missing roots (top first, per root), removed at
    /// shutdown when empty.
    created: Vec<Vec<PathBuf>>,
    health: Vec<RootHealth>,
    /// How long a failed root is skipped.
    skip: Duration,
    next: AtomicUsize,
    /// Each root's segments being written and measured rate.
    load: Arc<Load>,
}

/// A root slower than this share of the fastest root's rate is weighed down in placement.
pub(crate) const SLOW_SHARE: f64 = 0.5;
/// How long a root's measured rate counts.
pub(crate) const RATE_TTL: Duration = Duration::from_secs(30);
/// Bytes of a segment per measure of its root.
const RATE_MIN_BYTES: u64 = 8 << 20;
/// The share of a window its writer must have waited for the device for the window to
/// measure the root.
const DEVICE_BOUND: f64 = 0.1;
/// Weight of a new measure in a root's rate.
const RATE_NEW: f64 = 0.5;

/// Each root's segments being written (each open segment's [`RootUse`] counts one) and its
/// measured rate; see the module docs.
#[derive(Debug)]
struct Load {
    writing: Box<[AtomicUsize]>,
    /// Of those, the ones started (a segment opened ahead of need is not written yet): what
    /// shares the device while a measure runs.
    active: Box<[AtomicUsize]>,
    /// Of those, the ones whose writer has opened its next segment ahead of need: done with
    /// by the time a segment placed now starts, so not counted in placement.
    left: Box<[AtomicUsize]>,
    /// Bytes per second times segments being written (`f64` bits), 0 when not measured.
    rate: Box<[AtomicU64]>,
    /// When each rate was measured: nanoseconds since `epoch`.
    rated_at: Box<[AtomicU64]>,
    epoch: Instant,
}

impl Load {
    fn new(n: usize) -> Self {
        Load {
            writing: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            active: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            left: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            rate: (0..n).map(|_| AtomicU64::new(0)).collect(),
            rated_at: (0..n).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
        }
    }

    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Root `i`'s rate, if measured within [`RATE_TTL`] of `now`.
    fn rate(&self, i: usize, now: Instant) -> Option<f64> {
        let r = f64::from_bits(self.rate[i].load(Ordering::Relaxed));
        let at = self.rated_at[i].load(Ordering::Relaxed);
        let fresh = self.nanos(now).saturating_sub(at) < RATE_TTL.as_nanos() as u64;
        (r > 0.0 && fresh).then_some(r)
    }

    /// Folds a measure into root `i`'s rate (a stale rate is replaced).
    fn measured(&self, i: usize, sample: f64, now: Instant) {
        let old = self.rate(i, now);
        let new = old.map_or(sample, |old| old + RATE_NEW * (sample - old));
        self.rate[i].store(new.to_bits(), Ordering::Relaxed);
        self.rated_at[i].store(self.nanos(now).max(1), Ordering::Relaxed);
    }

    /// The root for a new segment, starting the ties at `start`, among the roots `usable`
    /// gives (all of them if none is).
    fn pick(&self, start: usize, now: Instant, usable: impl Fn(usize) -> bool) -> usize {
        let n = self.writing.len();
        let fastest = (0..n)
            .filter_map(|i| self.rate(i, now))
            .fold(0.0_f64, f64::max);
        let mut best: Option<(f64, usize)> = None;
        for k in 0..n {
            let i = (start + k) % n;
            if !usable(i) {
                continue;
            }
            let weight = match self.rate(i, now) {
                Some(r) if r < fastest * SLOW_SHARE => r / fastest,
                _ => 1.0,
            };
            let writing = self.writing[i].load(Ordering::Relaxed);
            let writing = writing.saturating_sub(self.left[i].load(Ordering::Relaxed));
            let score = (writing + 1) as f64 / weight;
            if best.is_none_or(|(s, _)| score < s) {
                best = Some((score, i));
            }
        }
        best.map_or(start, |(_, i)| i)
    }
}

/// See [`RootUse`]'s `window`.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// `None` in the segment's first window, which is not measured (no clock read at start).
    at: Option<Instant>,
    active: usize,
    written: u64,
    waited_ns: u64,
}

/// One segment being written on a root, counted in [`Roots::pick`]'s placement until dropped.
#[derive(Debug)]
pub(crate) struct RootUse {
    load: Arc<Load>,
    root: usize,
    /// Counted in `Load::left` ([`RootUse::leave`]).
    left: bool,
    /// Where the current measure began: when, the segments being written on the root then,
    /// the segment's bytes handed to writes then, and its writer's time waiting for the
    /// device then. `None` until the segment is started.
    window: Option<Window>,
}

impl RootUse {
    /// Its writer has opened the segment that follows (ahead of need): from now on it is not
    /// counted in placement.
    pub(crate) fn leave(&mut self) {
        if !std::mem::replace(&mut self.left, true) {
            self.load.left[self.root].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The segment is the writer's current one from now on (a segment opened ahead of need
    /// waits before this).
    pub(crate) fn start(&mut self) {
        if self.window.is_some() {
            return;
        }
        let active = self.load.active[self.root].fetch_add(1, Ordering::Relaxed) + 1;
        self.window = Some(Window {
            at: None,
            active,
            written: 0,
            waited_ns: u64::MAX,
        });
    }

    /// `written` bytes of the segment are handed to writes, and its writer has waited
    /// `waited_ns` in all for its writes in flight: each [`RATE_MIN_BYTES`] measure the root,
    /// the bytes over their time times the segments written there meanwhile, if the writer
    /// waited for the device for at least [`DEVICE_BOUND`] of that time (else the producer,
    /// not the device, set the pace, and the window says nothing of the root). The first
    /// window is not measured: it fills the writer's queue of writes at once, whatever the
    /// device (after it, a write is handed over as one completes).
    pub(crate) fn progress(&mut self, written: u64, waited_ns: u64) {
        let Some(w) = self.window else {
            return;
        };
        if written < w.written + RATE_MIN_BYTES {
            return;
        }
        let now = Instant::now();
        let active = self.load.active[self.root].load(Ordering::Relaxed);
        let secs =
            w.at.map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
        let waited = waited_ns.saturating_sub(w.waited_ns) as f64 / 1e9;
        if secs > 0.0 && waited >= DEVICE_BOUND * secs {
            let sharing = ((w.active + active) as f64 / 2.0).max(1.0);
            let rate = (written - w.written) as f64 / secs * sharing;
            self.load.measured(self.root, rate, now);
        }
        self.window = Some(Window {
            at: Some(now),
            active,
            written,
            waited_ns,
        });
    }
}

impl Drop for RootUse {
    fn drop(&mut self) {
        self.load.writing[self.root].fetch_sub(1, Ordering::Relaxed);
        if self.window.is_some() {
            self.load.active[self.root].fetch_sub(1, Ordering::Relaxed);
        }
        if self.left {
            self.load.left[self.root].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Roots {
    pub(crate) fn new(
        paths: Vec<PathBuf>,
        proc_dirs: Vec<Arc<ProcDir>>,
        created: Vec<Vec<PathBuf>>,
        skip: Duration,
    ) -> Self {
        let n = proc_dirs.len();
        Roots {
            created,
            health: proc_dirs.iter().map(|_| RootHealth::default()).collect(),
            paths,
            proc_dirs,
            skip,
            next: AtomicUsize::new(0),
            load: Arc::new(Load::new(n)),
        }
    }

    /// Removes this engine's process directories and then the roots the open created, each
    /// only if it is empty (a failed open's, or the shutdown's last step; the next open on a
    /// root sweeps what stays). Returns how many process directories stay.
    pub(crate) fn remove_dirs(&self) -> u64 {
        let left = self.proc_dirs.iter();
        let left = left.filter(|pd| std::fs::remove_dir(&pd.path).is_err());
        let left = left.count() as u64;
        crate::store::proc::remove_created(self.created.iter().flatten());
        left
    }

    /// The roots in use, in configuration order (indexes as everywhere else).
    pub(crate) fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// This engine's process directories, one per root.
    pub(crate) fn proc_dirs(&self) -> &[Arc<ProcDir>] {
        &self.proc_dirs
    }

    /// The root for the next segment: of the roots not being skipped, the one where it would
    /// finish first (module docs), ties taken in turn (every root, in turn, if all are
    /// skipped). A segment whose writer has opened its next one ([`RootUse::leave`]) is not
    /// counted: else a writer on a slow root, counting itself, always moved off it, and the
    /// root idled until a segment another writer placed there started.
    pub(crate) fn pick(&self) -> usize {
        let n = self.health.len();
        if n == 1 {
            return 0;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let now = Instant::now();
        self.load.pick(start, now, |i| {
            self.health[i].skip_until.lock().is_none_or(|t| t <= now)
        })
    }

    /// Counts a segment being written on `root` until the returned [`RootUse`] drops.
    pub(crate) fn writing_on(&self, root: usize) -> RootUse {
        self.load.writing[root].fetch_add(1, Ordering::Relaxed);
        RootUse {
            load: self.load.clone(),
            root,
            left: false,
            window: None,
        }
    }

    /// Notes a failed create or write on `root`. A device error (EIO, ENOSPC, EDQUOT, EROFS)
    /// skips the root for the configured `root_skip`; returns true for those.
    pub(crate) fn failed(&self, root: usize, e: &io::Error, counters: &Counters) -> bool {
        let device = matches!(
            e.raw_os_error(),
            Some(errno::EIO) | Some(errno::ENOSPC) | Some(errno::EDQUOT) | Some(errno::EROFS)
        );
        if !device {
            return false;
        }
        let Some(h) = self.health.get(root) else {
            return true;
        };
        let now = Instant::now();
        let mut skip = h.skip_until.lock();
        if skip.is_none_or(|t| t <= now) {
            Counters::add(&counters.root_skips, 1);
            let path = self.paths.get(root).cloned().unwrap_or_default();
            tracing::warn!(root = %path.display(), error = %e,
                skip = ?self.skip, "spill root failed; skipping it");
        }
        *skip = Some(now + self.skip);
        true
    }
}

/// Checks that every root takes `O_DIRECT`, with a probe file in our directory.
pub(crate) fn probe_direct(proc_dirs: &[Arc<ProcDir>]) -> Result<()> {
    for pd in proc_dirs {
        let name = c".spillring-direct-probe";
        match fs::open_segment_at(pd.fd.as_fd(), name, true, true) {
            Ok(fd) => {
                drop(fd);
                let _ = fs::unlinkat(pd.fd.as_fd(), name, false);
            }
            Err(e) if e.raw_os_error() == Some(errno::EINVAL) => {
                return Err(SpillError::InvalidConfig {
                    field: "mode",
                    need: "Buffered on a filesystem without O_DIRECT".into(),
                    got: format!("Direct on {}", pd.path.display()),
                });
            }
            Err(e) => return Err(SpillError::io("probe O_DIRECT", pd.path.clone(), e)),
        }
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A use of `root` not counted in `load` (each test sets the counts it needs).
    fn root_use(load: &Arc<Load>, root: usize) -> RootUse {
        RootUse {
            load: load.clone(),
            root,
            left: false,
            window: None,
        }
    }

    /// Places `segments` new segments, each held until `keep` are open on the roots (oldest
    /// sealed first), and counts where they went.
    fn place(load: &Arc<Load>, segments: usize, keep: usize) -> Vec<usize> {
        let n = load.writing.len();
        let mut held: std::collections::VecDeque<RootUse> = Default::default();
        let mut count = vec![0; n];
        let now = Instant::now();
        for s in 0..segments {
            if held.len() == keep {
                held.pop_front();
            }
            let root = load.pick(s % n, now, |_| true);
            count[root] += 1;
            load.writing[root].fetch_add(1, Ordering::Relaxed);
            held.push_back(root_use(load, root));
        }
        count
    }

    /// Roots not measured, or of like rates, are placed by count, ties in turn.
    #[test]
    fn roots_of_like_rate_are_placed_by_count_in_turn() {
        let load = Arc::new(Load::new(2));
        assert_eq!(place(&load, 8, 4), vec![4, 4]);
        let now = Instant::now();
        load.measured(0, 100e6, now);
        load.measured(1, 60e6, now);
        assert_eq!(
            place(&load, 8, 4),
            vec![4, 4],
            "within SLOW_SHARE: by count"
        );
        let load = Arc::new(Load::new(3));
        assert_eq!(place(&load, 9, 1), vec![3, 3, 3], "one at a time: in turn");
    }

    /// A root at a quarter of the other's rate gets about a quarter of the other's segments
    /// while 4 are written at once (issue 27, point 2), and none while one is.
    #[test]
    fn a_slow_root_gets_its_share_of_segments() {
        let load = Arc::new(Load::new(2));
        let now = Instant::now();
        load.measured(0, 100e6, now);
        load.measured(1, 25e6, now);
        let count = place(&load, 40, 4);
        assert!(
            (6..=10).contains(&count[1]),
            "slow root got {count:?} of 40"
        );
        assert_eq!(
            place(&load, 10, 1),
            vec![10, 0],
            "one writer: the fast root only"
        );
        // A writer on the slow root, 3 on the fast one (each with a segment ahead): counted, it
        // moves off the slow root; once it left (opened its next segment ahead), its segment
        // is not counted and the next goes to the slow root.
        load.writing[0].store(6, Ordering::Relaxed);
        let mut u = root_use(&load, 1);
        load.writing[1].store(1, Ordering::Relaxed);
        assert_eq!(load.pick(0, now, |_| true), 0);
        u.leave();
        u.leave();
        assert_eq!(load.left[1].load(Ordering::Relaxed), 1, "left once");
        assert_eq!(load.pick(0, now, |_| true), 1);
        drop(u);
        assert_eq!(load.left[1].load(Ordering::Relaxed), 0);
    }

    /// A rate is forgotten after `RATE_TTL`: the root is placed by count again.
    #[test]
    fn a_stale_rate_is_forgotten() {
        let load = Arc::new(Load::new(2));
        let now = Instant::now();
        load.measured(0, 100e6, now);
        load.measured(1, 10e6, now);
        assert_eq!(load.pick(1, now, |_| true), 0);
        let later = now + RATE_TTL + Duration::from_millis(1);
        assert_eq!(load.rate(1, later), None);
        assert_eq!(load.pick(1, later, |_| true), 1, "ties in turn again");
    }

    /// A measure is a window's bytes over its time, times the segments sharing the root;
    /// the first window (the queue's fill) is not measured, nor a window under
    /// `RATE_MIN_BYTES`, nor one in which the writer hardly waited for the device (a slow
    /// producer is no slow root); the rate moves halfway to each new measure.
    #[test]
    fn a_segment_being_written_measures_its_root() {
        let load = Arc::new(Load::new(2));
        let mut u = root_use(&load, 1);
        u.progress(RATE_MIN_BYTES, 0);
        assert_eq!(
            load.rate(1, Instant::now()),
            None,
            "not started: no measure"
        );
        u.start();
        u.progress(RATE_MIN_BYTES, 0);
        assert_eq!(
            load.rate(1, Instant::now()),
            None,
            "the first window: no measure"
        );
        assert_eq!(load.active[1].load(Ordering::Relaxed), 1, "started: active");
        load.active[1].store(2, Ordering::Relaxed);
        let window = |written| Window {
            at: Some(Instant::now() - Duration::from_secs(1)),
            active: 2,
            written,
            waited_ns: 0,
        };
        u.window = Some(window(RATE_MIN_BYTES));
        u.progress(2 * RATE_MIN_BYTES - 1, 500_000_000);
        assert_eq!(load.rate(1, Instant::now()), None, "too short to measure");
        u.progress(3 * RATE_MIN_BYTES, 50_000_000);
        assert_eq!(
            load.rate(1, Instant::now()),
            None,
            "5% of the window waiting for the device: the producer's pace, no measure"
        );
        u.window = Some(window(RATE_MIN_BYTES));
        u.progress(3 * RATE_MIN_BYTES, 500_000_000);
        let r = load.rate(1, Instant::now()).unwrap_or(0.0);
        let want = (2 * RATE_MIN_BYTES) as f64 * 2.0;
        assert!((r / want - 1.0).abs() < 0.05, "{r} vs {want}");
        load.measured(1, 0.0, Instant::now());
        let half = load.rate(1, Instant::now()).unwrap_or(0.0);
        assert!(
            (half / (r / 2.0) - 1.0).abs() < 1e-9,
            "{half} vs {}",
            r / 2.0
        );
        load.writing[1].store(1, Ordering::Relaxed);
        load.active[1].store(1, Ordering::Relaxed);
        drop(u);
        assert_eq!(load.writing[1].load(Ordering::Relaxed), 0);
        assert_eq!(load.active[1].load(Ordering::Relaxed), 0);
        assert_eq!(
            load.pick(0, Instant::now(), |_| false),
            0,
            "none usable: in turn"
        );
    }
}
