//! Named fault points at the syscall boundary, driven by a seeded plan.
//!
//! A plan is installed per engine (`EngineConfig::fault_plan`), so tests running in parallel
//! never see each other's faults. All of it is behind the `fault-injection` cargo feature, as
//! raft-engine gates its failpoints: without the feature the plan API does not exist and every
//! fault point is the constant "go on" (no branch on the hot path); with it and no plan, every
//! point is one branch on an `Option`. Faults are injected where the engine meets the kernel, on both backends:
//!
//! | point | where | effect of `Fail(errno)` |
//! |---|---|---|
//! | `WriterReserve` | after the writer's abort check, before its ticket and file count | (use `pause`) |
//! | `WriterCreate` | before a segment's `openat` | the create fails, no file appears |
//! | `WriterAfterCreate` | after the create, before the abort check | (use `pause`) |
//! | `WriterHandOff` | `finish`, between taking the files and registering the state | (use `pause`) |
//! | `IoWrite` | an I/O thread about to write | the write completes with `-errno` |
//! | `IoUnlink` | an I/O thread about to unlink | the unlink completes with `-errno` |
//! | `CleanupUnlink` | the cleanup worker about to unlink | same, on the retry path |
//! | `CleanupTake` | the cleanup worker about to take a batch | (use `pause`) |
//! | `StatePublish` | `publish` took the files, before it checks the destination names | (use `pause`) |
//! | `ReaderOpen` | a reader passed its abort check, before it opens the next segment | (use `pause`) |
//! | `PublishRename` | `publish` about to rename one file: each move into the destination, then each move back of a roll-back | the rename fails, nothing moves (`FailAfter` is taken as `Fail`: a rename has no ambiguous outcome) |
//! | `WriterReopen` | a writer whose fd the bound closed passed its abort check, before it reopens its segment | (use `pause`) |
//! | `BufferMap` | the buffer pool about to map a fresh staging buffer (for an async writer: on the offload pool) | the map fails: the write fails with an I/O error |
//! | `CodecCompress` | a codec thread about to compress a staging buffer's block | (use `pause`) |
//!
//! `FailAfter(errno)` performs the operation and then reports the error: the ambiguous outcome
//! (the effect happened, the caller cannot know).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Makes [`FaultPoint`], [`FaultPoint::ALL`] and [`FaultPoint::name`] from one table: each
/// point's docs, variant and name.
macro_rules! fault_points {
    ($($(#[$doc:meta])* $point:ident = $name:literal,)*) => {
        /// A place where a fault can be injected.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
        #[non_exhaustive]
        pub enum FaultPoint {
            $($(#[$doc])* $point,)*
        }

        /// Number of fault points.
        const POINTS: usize = [$($name),*].len();

        impl FaultPoint {
            /// Every fault point.
            pub const ALL: [FaultPoint; POINTS] = [$(FaultPoint::$point),*];

            /// The point's name, as in `writer::create`.
            pub fn name(self) -> &'static str {
                match self {
                    $(FaultPoint::$point => $name,)*
                }
            }
        }
    };
}

fault_points! {
    /// `writer::reserve`: the writer passed its abort check for a new segment and has not yet
    /// reserved its ticket or counted the file in its directory. Pausing here lets a test
    /// cancel the scope in that window.
    WriterReserve = "writer::reserve",
    /// `writer::create`: just before a segment file is created.
    WriterCreate = "writer::create",
    /// `writer::after_create`: after a segment file was created, before the writer checks the
    /// abort flag. Pausing here opens the write-after-delete window on purpose.
    WriterAfterCreate = "writer::after_create",
    /// `writer::hand_off`: `finish` took the writer's files for its new state and has not yet
    /// registered the state with the scope. Pausing here lets a test close the scope in the
    /// hand-off window.
    WriterHandOff = "writer::hand_off",
    /// `io::write`: an I/O thread about to submit a write.
    IoWrite = "io::write",
    /// `io::unlink`: an I/O thread about to unlink a file on the normal delete path.
    IoUnlink = "io::unlink",
    /// `cleanup::unlink`: the cleanup worker (or a `retry_cleanup_now` caller) about to unlink
    /// a retained name.
    CleanupUnlink = "cleanup::unlink",
    /// `cleanup::take`: the cleanup worker found ready records and is about to take a batch.
    /// Pausing here lets a test queue records first and then watch whole batches.
    CleanupTake = "cleanup::take",
    /// `state::publish`: `publish` took the state's files and has not renamed any yet.
    StatePublish = "state::publish",
    /// `reader::open`: a reader passed its abort check and looked up the next segment, and has
    /// not opened it yet. Pausing here lets a test delete the file under the reader.
    ReaderOpen = "reader::open",
    /// `state::publish_rename`: `publish` is about to rename one file, into the destination or
    /// (rolling back) back into its directory. Calls count the forward renames first, then the
    /// moves back, so `Trigger::After` picks one.
    PublishRename = "state::publish_rename",
    /// `writer::reopen`: a writer whose segment fd was closed by the engine's fd bound
    /// (`max_open_files`) passed its abort check and has not reopened its segment yet. Pausing
    /// here lets a test cancel the scope (and delete the file) under the reopen.
    WriterReopen = "writer::reopen",
    /// `cleanup::sweep_unlink`: the crash sweep about to unlink one file of a dead engine's
    /// tree. `FailAfter(ENOENT)` stages the race of a file gone between the sweep's readdir
    /// and its unlink.
    SweepUnlink = "cleanup::sweep_unlink",
    /// `buffer::map`: a writer is about to map a fresh staging buffer (none free in the pool):
    /// on the offload pool for an async writer, on its own thread for a blocking one.
    /// Pausing here shows where the map runs; `Fail` is a map that fails.
    BufferMap = "buffer::map",
    /// `codec::compress`: a thread of the codec pool (`io/compress.rs`) about to compress a
    /// staging buffer's block, off its writer's thread. Pausing here holds the compression,
    /// with its buffer queued in its writer's order.
    CodecCompress = "codec::compress",
}

/// What an armed fault point does.
#[derive(Debug, Clone)]
pub enum FaultAction {
    /// Fail with this errno without performing the operation.
    Fail(i32),
    /// Perform the operation, then report this errno (an ambiguous outcome).
    FailAfter(i32),
    /// Block at the point until the handle is released.
    Pause(Arc<PauseHandle>),
    /// Block at the point until the handle is released, then fail with this errno without
    /// performing the operation (orders a failure after another event, for tests).
    PauseThenFail(Arc<PauseHandle>, i32),
    /// Report success without performing the operation (a no-op deleter, for benches).
    Skip,
    /// Sleep this long at the point, then perform the operation (a slow device).
    Delay(Duration),
}

/// When an armed fault point fires.
#[derive(Debug, Clone, Copy)]
pub enum Trigger {
    /// Every time.
    Always,
    /// The next `n` times.
    Times(u64),
    /// With this probability each time, decided by the plan's seed.
    Probability(f64),
    /// Let `skip` calls pass, then fire `times` times.
    After {
        /// Calls that pass first.
        skip: u64,
        /// Calls that fire after them.
        times: u64,
    },
}

#[derive(Debug)]
struct Rule {
    point: FaultPoint,
    action: FaultAction,
    trigger: Trigger,
}

/// A seeded set of armed fault points.
#[derive(Debug)]
pub struct FaultPlan {
    seed: u64,
    rules: Mutex<Vec<Rule>>,
    calls: [AtomicU64; POINTS],
    fired: [AtomicU64; POINTS],
}

/// What a fault point decided for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Injected {
    /// Go on normally.
    None,
    /// Fail with this errno, without doing the operation.
    Fail(i32),
    /// Do the operation, then report this errno.
    FailAfter(i32),
    /// Report success without doing the operation.
    Skip,
}

impl FaultPlan {
    /// An empty plan whose probabilistic triggers are decided by `seed`.
    pub fn new(seed: u64) -> Arc<Self> {
        Arc::new(FaultPlan {
            seed,
            rules: Mutex::new(Vec::new()),
            calls: Default::default(),
            fired: Default::default(),
        })
    }

    fn rules(&self) -> MutexGuard<'_, Vec<Rule>> {
        // A panic while holding this lock cannot leave the Vec inconsistent.
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Arms `point` with `action` under `trigger`. Rules are consulted in the order added.
    pub fn arm(&self, point: FaultPoint, action: FaultAction, trigger: Trigger) {
        self.rules().push(Rule {
            point,
            action,
            trigger,
        });
    }

    /// Arms `point` to fail with `errno` every time.
    pub fn fail_always(&self, point: FaultPoint, errno: i32) {
        self.arm(point, FaultAction::Fail(errno), Trigger::Always);
    }

    /// Arms `point` to fail with `errno` the next `n` times.
    pub fn fail_times(&self, point: FaultPoint, errno: i32, n: u64) {
        self.arm(point, FaultAction::Fail(errno), Trigger::Times(n));
    }

    /// Arms `point` to pause the next time it is reached, and returns the handle that sees it
    /// reached and releases it.
    pub fn pause_once(&self, point: FaultPoint) -> Arc<PauseHandle> {
        let h = Arc::new(PauseHandle::default());
        self.arm(point, FaultAction::Pause(h.clone()), Trigger::Times(1));
        h
    }

    /// Disarms every rule for `point`.
    pub fn clear(&self, point: FaultPoint) {
        self.rules().retain(|r| r.point != point);
    }

    /// Disarms everything.
    pub fn clear_all(&self) {
        self.rules().clear();
    }

    /// How many times `point` fired (injected a failure or paused).
    pub fn fired(&self, point: FaultPoint) -> u64 {
        self.fired[point as usize].load(Ordering::Relaxed)
    }

    /// How many times `point` was reached.
    pub fn reached(&self, point: FaultPoint) -> u64 {
        self.calls[point as usize].load(Ordering::Relaxed)
    }

    /// Decides one call at `point`. A pause blocks here (outside the plan's lock).
    pub(crate) fn check(&self, point: FaultPoint) -> Injected {
        let call = self.calls[point as usize].fetch_add(1, Ordering::Relaxed);
        let action = {
            let mut rules = self.rules();
            let mut chosen = None;
            for rule in rules.iter_mut().filter(|r| r.point == point) {
                let fire = match &mut rule.trigger {
                    Trigger::Always => true,
                    Trigger::Probability(p) => unit(self.seed, point, call) < *p,
                    Trigger::Times(times) | Trigger::After { skip: 0, times } => {
                        let left = *times > 0;
                        *times = times.saturating_sub(1);
                        left
                    }
                    Trigger::After { skip, .. } => {
                        *skip -= 1;
                        false
                    }
                };
                if fire {
                    chosen = Some(rule.action.clone());
                    break;
                }
            }
            rules.retain(|r| {
                !matches!(
                    r.trigger,
                    Trigger::Times(0) | Trigger::After { skip: 0, times: 0 }
                )
            });
            chosen
        };
        let Some(action) = action else {
            return Injected::None;
        };
        self.fired[point as usize].fetch_add(1, Ordering::Relaxed);
        match action {
            FaultAction::Fail(e) => Injected::Fail(e),
            FaultAction::FailAfter(e) => Injected::FailAfter(e),
            FaultAction::Skip => Injected::Skip,
            FaultAction::Pause(h) => {
                h.pause_here();
                Injected::None
            }
            FaultAction::PauseThenFail(h, e) => {
                h.pause_here();
                Injected::Fail(e)
            }
            FaultAction::Delay(d) => {
                std::thread::sleep(d);
                Injected::None
            }
        }
    }
}

/// A uniform number in [0, 1) from the seed, the point and the call index: the same plan with
/// the same seed makes the same decisions for the same sequence of calls at a point.
fn unit(seed: u64, point: FaultPoint, call: u64) -> f64 {
    let mut x = seed ^ (point as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ call;
    // splitmix64 finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Checks `point` against an optional plan. Without the `fault-injection` feature no plan can
/// be installed and this is the constant [`Injected::None`]: the hot path has no fault branch.
#[inline(always)]
pub(crate) fn check(plan: &Option<Arc<FaultPlan>>, point: FaultPoint) -> Injected {
    if !ENABLED {
        return Injected::None;
    }
    match plan {
        None => Injected::None,
        Some(p) => p.check(point),
    }
}

/// Checks `point` against a task's plan first (`task` is only called with the feature),
/// then the engine's: what [`fault_point!`]`(Point, plan, task: ...)` runs.
#[inline(always)]
pub(crate) fn check_task_first<P: AsRef<FaultPlan>>(
    task: impl FnOnce() -> Option<P>,
    engine: &Option<Arc<FaultPlan>>,
    point: FaultPoint,
) -> Injected {
    if !ENABLED {
        return Injected::None;
    }
    if let Some(p) = task() {
        let r = p.as_ref().check(point);
        if r != Injected::None {
            return r;
        }
    }
    check(engine, point)
}

/// A fault point, in one line: `fault_point!(Point, plan)` decides one call at
/// [`FaultPoint`]`::Point` against the engine's `plan` (an `Option<Arc<FaultPlan>>`);
/// `fault_point!(Point, plan, task: t)` asks the task's plan `t` (an `Option` of an
/// `Arc<FaultPlan>` or of a reference to one, evaluated only with the feature) first. It
/// returns the [`Injected`] decision, which a pause or delay point ignores; without the
/// `fault-injection` feature it is the constant [`Injected::None`].
macro_rules! fault_point {
    ($point:ident, $engine:expr) => {
        $crate::fault::check(&$engine, $crate::fault::FaultPoint::$point)
    };
    ($point:ident, $engine:expr, task: $task:expr) => {
        $crate::fault::check_task_first(|| $task, &$engine, $crate::fault::FaultPoint::$point)
    };
}
pub(crate) use fault_point;

impl Injected {
    /// Runs the I/O `op` as decided: not at all (`Fail`: its error; `Skip`: `Ok(skipped)`),
    /// then reporting the error (`FailAfter`), or as is (`None`).
    pub(crate) fn run<T>(self, skipped: T, op: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        match self {
            Injected::Fail(e) => Err(io::Error::from_raw_os_error(e)),
            Injected::FailAfter(e) => op().and(Err(io::Error::from_raw_os_error(e))),
            Injected::Skip => Ok(skipped),
            Injected::None => op(),
        }
    }
}

/// True when the crate is built with the `fault-injection` feature (the engine's own tests,
/// loadgen and the benches enable it): only then can a plan be installed.
pub(crate) const ENABLED: bool = cfg!(feature = "fault-injection");

/// Longest a fault-point pause lasts if nobody releases it.
pub const PAUSE_LIMIT: Duration = Duration::from_secs(30);

/// A pause at a fault point: the paused thread blocks until [`PauseHandle::release`] (or for
/// at most [`PAUSE_LIMIT`]).
#[derive(Debug, Default)]
pub struct PauseHandle {
    state: Mutex<PauseState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct PauseState {
    reached: bool,
    released: bool,
}

impl PauseHandle {
    fn lock(&self) -> MutexGuard<'_, PauseState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks until released, or for at most [`PAUSE_LIMIT`]: a pause nobody releases (a test
    /// that failed half way) must not hang the engine's threads forever.
    fn pause_here(&self) {
        let mut s = self.lock();
        s.reached = true;
        self.cv.notify_all();
        let deadline = std::time::Instant::now() + PAUSE_LIMIT;
        while !s.released {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                s.released = true;
                break;
            }
            s = self
                .cv
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Waits until a thread is paused here; false if `timeout` passed first.
    pub fn wait_reached(&self, timeout: Duration) -> bool {
        let s = self.lock();
        let (s, _) = self
            .cv
            .wait_timeout_while(s, timeout, |s| !s.reached)
            .unwrap_or_else(|p| p.into_inner());
        s.reached
    }

    /// True once a thread reached the point.
    pub fn is_reached(&self) -> bool {
        self.lock().reached
    }

    /// Lets the paused thread (and any later one) go on.
    pub fn release(&self) {
        let mut s = self.lock();
        s.released = true;
        self.cv.notify_all();
    }
}
