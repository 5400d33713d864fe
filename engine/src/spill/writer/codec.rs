//! The writer's codec: fixed, or `Auto`'s per-block choice and the write rate the writer sees.
//!
//! `Auto` weighs space as well as time. With room to spare it keeps a codec only when the
//! device time its saved bytes free pays for its CPU (a DuckDB-style cost model). When space
//! runs short, it compresses to save space: the space pressure is how full the tighter of two
//! bounds is, the quota (`max_spill_bytes`: bytes held over the quota) and the segment's root
//! (the engine's bytes there over those plus the filesystem's free bytes, read at each
//! rotation). From [`SPACE_LOW`] on, each trial takes the smallest of lz4 and zstd level 1 (and
//! level 3 from [`SPACE_HIGH`]), a stronger codec only where it saves enough over the cheaper
//! one ([`SPACE_SAVES`]). A rise in pressure ends a back-off at once.

use std::time::Instant;

use crate::config::Compression;
use crate::format::block::{self, Codec};

/// Samples `Auto` compresses to choose a codec.
const AUTO_SAMPLE: usize = 64 << 10;
/// Blocks a chosen codec is kept for before the next trial.
const AUTO_KEEP: u32 = 8;
/// The longest back-off (in blocks) on incompressible data.
const AUTO_MAX_BACKOFF: u32 = 256;
/// The longest back-off (in blocks) on data a codec shrinks but that does not pay at the
/// writer's current device cost: that cost changes (a device that slows, other writers), so
/// the trials come back sooner than on incompressible data.
const AUTO_MAX_NOT_NOW: u32 = 32;
/// How much more gain zstd needs over lz4 to be taken for time: the model leaves out what a
/// CPU-bound writer takes from the other threads on the host.
const TIME_STRONGER: f64 = 1.1;
/// Space pressure from which `Auto` compresses to save space: an eighth of a bound in use.
pub(crate) const SPACE_LOW: f64 = 0.125;
/// Space pressure from which `Auto` also tries zstd level 3: half a bound in use.
pub(crate) const SPACE_HIGH: f64 = 0.5;
/// What a codec must save over the next cheaper one to be taken for space (raw -> lz4,
/// lz4 -> zstd 1, zstd 1 -> zstd 3): 10%, 10%, 5% of the cheaper one's output.
pub(crate) const SPACE_SAVES: [f64; 3] = [0.10, 0.10, 0.05];

/// `Auto`'s choice per block, as pure logic (the caller measures): DuckDB-style, a codec is
/// kept when the device time its saved bytes free pays for its CPU; on data that no codec
/// shrinks (or where none pays) the trials back off exponentially.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AutoPolicy {
    /// Blocks left before the next trial, and what they use meanwhile.
    skip: u32,
    sticky: Codec,
    /// The current back-off (doubles on each failed trial, from 1).
    backoff: u32,
    /// The space-pressure level of the last block: 0 (room to spare), 1 (from `SPACE_LOW`),
    /// 2 (from `SPACE_HIGH`).
    space_level: u8,
    /// The current back-off is on compressible data at a moment the device was not the
    /// writer's bottleneck: it ends as soon as the writer waits for the device again
    /// ([`AutoPolicy::device_bound_again`]), the change that can make a codec pay.
    retry_on_wait: bool,
}

/// What the writer's stages cost, as `Auto` last measured them: the device, in wall time per
/// physical byte while the writer waited for it (0 until the writer has waited: the device
/// has not been its bottleneck), and the producer, in the writer's own time per logical byte
/// without codec or waits (the copies, the framing, the caller's work between writes); the
/// time the writer would have waited per logical byte over the last window had it stored its
/// blocks raw; and whether the device was its bottleneck in that window. The third stage, the
/// codec pool that compresses the writer's blocks off its thread, is a trial's own time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DeviceCost {
    pub(crate) device_ns_per_byte: f64,
    pub(crate) producer_ns_per_byte: f64,
    pub(crate) wait_ns_per_byte: f64,
    pub(crate) device_bound: bool,
}

/// One codec's result on a sample: bytes out and nanoseconds taken (`None`: did not shrink).
pub(crate) type TrialResult = Option<(usize, u64)>;

impl AutoPolicy {
    pub(crate) fn new() -> Self {
        AutoPolicy {
            skip: 0,
            sticky: Codec::Raw,
            backoff: 0,
            space_level: 0,
            retry_on_wait: false,
        }
    }

    /// The space pressure for the next block, and its level: a higher level than the last
    /// block's ends the current codec's run or back-off, so the next block gets a trial.
    pub(crate) fn set_space(&mut self, pressure: f64) -> u8 {
        let level = if pressure >= SPACE_HIGH {
            2
        } else if pressure >= SPACE_LOW {
            1
        } else {
            0
        };
        if level > self.space_level {
            self.skip = 0;
            self.backoff = 0;
        }
        self.space_level = level;
        level
    }

    /// Chooses for space: of lz4, zstd 1 and zstd 3 (each `None` when not tried or when it did
    /// not shrink), the smallest output, a stronger codec taken over a cheaper one only when
    /// it saves [`SPACE_SAVES`] more. Raw (and a back-off) when none saves enough.
    pub(crate) fn choose_for_space(
        &mut self,
        sample: usize,
        lz4: TrialResult,
        zstd1: TrialResult,
        zstd3: TrialResult,
    ) -> Codec {
        let mut best = (Codec::Raw, sample);
        for ((codec, t), saves) in [
            (Codec::Lz4, lz4),
            (Codec::Zstd(1), zstd1),
            (Codec::Zstd(3), zstd3),
        ]
        .into_iter()
        .zip(SPACE_SAVES)
        {
            if let Some((out, _)) = t
                && (out as f64) <= best.1 as f64 * (1.0 - saves)
            {
                best = (codec, out);
            }
        }
        self.keep(best.0)
    }

    /// Keeps `codec` for the next blocks (a back-off when it is raw).
    fn keep(&mut self, codec: Codec) -> Codec {
        if codec == Codec::Raw {
            self.failed();
        } else {
            self.backoff = 0;
            self.sticky = codec;
            self.skip = AUTO_KEEP;
            self.retry_on_wait = false;
        }
        codec
    }

    /// The writer waits for the device again: a back-off taken while it did not (on
    /// compressible data) ends, and the next block gets a trial at the new cost. Without it,
    /// a writer on a 50 MB/s device whose first blocks filled an empty queue (no wait yet)
    /// backed off 1 + 2 + ... + 16 blocks raw before its first lz4 block, and again after each
    /// run of compressed blocks (the queue they left part-empty took the next raw blocks
    /// without a wait): 102 of 276 lineitem blocks raw.
    pub(crate) fn device_bound_again(&mut self) {
        if self.retry_on_wait {
            self.retry_on_wait = false;
            self.skip = 0;
        }
    }

    /// `Some(codec)` to use without a trial for this block, `None` to run a trial.
    pub(crate) fn next_block(&mut self) -> Option<Codec> {
        if self.skip > 0 {
            self.skip -= 1;
            return Some(self.sticky);
        }
        None
    }

    /// Chooses from a trial on `sample` bytes at the costs the writer measured. The codec and
    /// the writes run behind the producer, each on threads of its own, so a sample takes the
    /// longest of its stages: raw, the longer of the producer's time and the device's for
    /// every byte; with a codec, the longest of the producer's time, the codec's and the
    /// device's for the bytes out. A codec's gain is the difference. A writer the device never
    /// held back (device cost 0) gains nothing and stores raw; one whose codec is slower than
    /// its device gains less than one that stays device-bound, and the stronger codec is taken
    /// only for [`TIME_STRONGER`] more gain. (The codec's time is one thread's: a writer's
    /// blocks may compress on several at once, but those share the host's CPUs with the
    /// producer and the other writers.) The gain is also capped by the time the writer would
    /// have waited over the sample's bytes in the last window storing them raw: a writer that
    /// stopped waiting (its CPU is short: a loaded host) gains nothing from writing less.
    /// (Without the cap, two writers on a loaded 2-core host kept zstd at 0.85-0.9x of raw's
    /// rate; with the cap alone, a writer that compressed with zstd stopped waiting and went
    /// raw, then waited and compressed again.)
    /// Raw on data a codec shrinks by a tenth backs off at most [`AUTO_MAX_NOT_NOW`] blocks;
    /// data no codec shrinks that much backs off up to [`AUTO_MAX_BACKOFF`].
    pub(crate) fn choose(
        &mut self,
        sample: usize,
        lz4: TrialResult,
        zstd: TrialResult,
        cost: DeviceCost,
    ) -> Codec {
        let mut best = (Codec::Raw, 0.0f64);
        for (codec, t, more) in [
            (Codec::Lz4, lz4, 1.0),
            (Codec::Zstd(1), zstd, TIME_STRONGER),
        ] {
            if let Some(g) = Self::gain(sample, t, cost)
                && g > 0.0
                && g > best.1 * more
            {
                best = (codec, g);
            }
        }
        let shrank = |t: TrialResult| {
            t.is_some_and(|(out, _)| out as f64 <= sample as f64 * (1.0 - SPACE_SAVES[0]))
        };
        if best.0 == Codec::Raw && (shrank(lz4) || shrank(zstd)) {
            // Compressible, but no codec pays at this cost, which changes: try again sooner,
            // and at once when the writer waits for the device if it does not now.
            self.back_off(AUTO_MAX_NOT_NOW);
            self.retry_on_wait = !cost.device_bound;
            return Codec::Raw;
        }
        self.keep(best.0)
    }

    /// The writer time a trial's codec saves over `sample` bytes in the staged model of
    /// [`AutoPolicy::choose`] (`None`: the codec did not shrink the sample).
    pub(crate) fn gain(sample: usize, t: TrialResult, cost: DeviceCost) -> Option<f64> {
        t.map(|(out, ns)| {
            let produce = sample as f64 * cost.producer_ns_per_byte;
            let raw = produce.max(sample as f64 * cost.device_ns_per_byte);
            let coded = produce
                .max(ns as f64)
                .max(out as f64 * cost.device_ns_per_byte);
            (raw - coded).min(sample as f64 * cost.wait_ns_per_byte)
        })
    }

    /// A block the codec did not shrink: raw, and the next trials further off.
    pub(crate) fn failed(&mut self) {
        self.back_off(AUTO_MAX_BACKOFF);
    }

    /// Raw for the next blocks: the back-off doubles, up to `max` blocks.
    fn back_off(&mut self, max: u32) {
        self.backoff = (self.backoff * 2).clamp(1, max);
        self.skip = self.backoff;
        self.sticky = Codec::Raw;
        self.retry_on_wait = false;
    }
}

/// A writer's codec: fixed, or `Auto` with its state and the write rate it sees.
pub(super) struct CodecState {
    pub(super) mode: Compression,
    pub(super) auto: AutoPolicy,
    /// `Auto`'s costs, updated from the blocks since the last trial ([`Window`]).
    pub(super) cost: DeviceCost,
    /// The blocks since the last trial.
    pub(super) window: Window,
    /// The codec time per logical byte over the last window (its blocks used the codec
    /// `Auto` kept for them), on the codec pool's threads.
    pub(super) sustained_ns_per_byte: f64,
    /// Waiting for writes in flight since the last block (added by `poll_until`).
    pub(super) waited_ns: u64,
    /// Waiting for writes in flight in all (never reset): placement takes a root's rate only
    /// from windows in which its writer waited for the device (`RootUse::progress`).
    pub(super) device_wait_ns: u64,
    /// Waiting for compressions (the codec stage's head) since the last block.
    pub(super) stalled_ns: u64,
    /// The bytes the device had written for this writer when `poll_until` last
    /// looked, and at the last block: their difference over a window is what the device did
    /// in it.
    pub(super) completed: u64,
    completed_at_block: u64,
    /// When an async wait returned `Pending`, and whether it waited for a compression (else
    /// for writes in flight).
    pub(super) pending_since: Option<(Instant, bool)>,
    pub(super) last_block: Option<Instant>,
    /// Where `Auto`'s trials compress to (kept: no allocation per block).
    pub(super) scratch: Vec<u8>,
    /// How full the open segment's root is of spills, read at its rotation
    /// (`Store::root_fill`): one of `Auto`'s space bounds.
    pub(super) root_fill: f64,
    /// The writer's queue depth: a window of no more blocks than this, without waits, may
    /// have gone into a queue that earlier (compressed) blocks left part-empty, so it says
    /// nothing about the device ([`Window::take_into`]).
    queue_depth: usize,
}

impl CodecState {
    pub(super) fn new(mode: Compression, queue_depth: usize) -> Self {
        CodecState {
            mode,
            auto: AutoPolicy::new(),
            // Until the writer waits, the device is not its bottleneck.
            cost: DeviceCost {
                device_ns_per_byte: 0.0,
                producer_ns_per_byte: 0.0,
                wait_ns_per_byte: 0.0,
                device_bound: false,
            },
            window: Window::default(),
            sustained_ns_per_byte: 0.0,
            waited_ns: 0,
            device_wait_ns: 0,
            stalled_ns: 0,
            completed: 0,
            completed_at_block: 0,
            pending_since: None,
            last_block: None,
            scratch: Vec::new(),
            root_fill: 0.0,
            queue_depth,
        }
    }

    /// Records a block sealed now: `physical` bytes out of `logical` in, `pick_ns` spent
    /// choosing its codec (on the writer's thread), `codec_ns` compressing it (on the codec
    /// pool's).
    pub(super) fn observe(&mut self, physical: usize, logical: usize, pick_ns: u64, codec_ns: u64) {
        let now = Instant::now();
        let done = self.completed.saturating_sub(self.completed_at_block);
        self.completed_at_block = self.completed;
        if let Some(t) = self.last_block.replace(now)
            && physical > 0
        {
            let ns = now.duration_since(t).as_nanos() as u64;
            let aside = self.stalled_ns + pick_ns;
            let waits = (self.waited_ns, aside);
            self.window
                .add(ns, waits, codec_ns, (physical, logical), done);
            if self.window.device_bound() {
                self.auto.device_bound_again();
            }
        }
        self.waited_ns = 0;
        self.stalled_ns = 0;
    }

    /// The costs `Auto` weighs a trial against, updated from the window since the last trial
    /// (then a new window starts).
    pub(super) fn cost(&mut self) -> DeviceCost {
        self.sustained_ns_per_byte = self.window.take_into(&mut self.cost, self.queue_depth);
        self.cost
    }

    /// `t`, a trial of `codec`, with its CPU no less than the window's blocks sustained when
    /// they used that codec: a 64 KiB trial runs in a burst, while a writer that shares its
    /// CPU with other threads (the host's, the engine's) compresses slower over a window, and
    /// its trials alone made it keep zstd at 0.69x of raw's rate on a loaded host.
    fn sustained(&self, codec: Codec, t: TrialResult, sample: usize) -> TrialResult {
        t.map(|(out, ns)| {
            if codec == self.auto.sticky {
                (
                    out,
                    ns.max((self.sustained_ns_per_byte * sample as f64) as u64),
                )
            } else {
                (out, ns)
            }
        })
    }

    /// The codec for a block of `raw` bytes, and the nanoseconds its choice took: fixed, or
    /// `Auto`'s (a trial on a sample). `quota_fill` (asked only by `Auto`): bytes the ledger
    /// holds over `max_spill_bytes` (0 without a quota); with `root_fill`, `Auto`'s space pressure.
    pub(super) fn pick(&mut self, raw: &[u8], quota_fill: impl FnOnce() -> f64) -> (Codec, u64) {
        match self.mode {
            Compression::None => (Codec::Raw, 0),
            Compression::Lz4 => (Codec::Lz4, 0),
            Compression::Zstd { level } => (Codec::Zstd(level), 0),
            Compression::Auto => {
                let level = self.auto.set_space(quota_fill().max(self.root_fill));
                if let Some(c) = self.auto.next_block() {
                    return (c, 0);
                }
                let t0 = Instant::now();
                let sample = &raw[..raw.len().min(AUTO_SAMPLE)];
                self.scratch.resize(sample.len(), 0);
                let cost = self.cost();
                let n = sample.len();
                let lz4 = trial(Codec::Lz4, sample, &mut self.scratch);
                let lz4 = self.sustained(Codec::Lz4, lz4, n);
                // zstd (slower, smaller) is tried for time only when lz4 pays: where lz4's
                // CPU costs more than the device time it frees, zstd's far larger CPU does too.
                let lz4_pays = AutoPolicy::gain(sample.len(), lz4, cost).is_some_and(|g| g > 0.0);
                let zstd = if lz4.is_some() && (level >= 1 || lz4_pays) {
                    let t = trial(Codec::Zstd(1), sample, &mut self.scratch);
                    self.sustained(Codec::Zstd(1), t, n)
                } else {
                    None
                };
                let zstd3 = if level >= 2 && zstd.is_some() {
                    trial(Codec::Zstd(3), sample, &mut self.scratch)
                } else {
                    None
                };
                let c = if level >= 1 {
                    self.auto.choose_for_space(sample.len(), lz4, zstd, zstd3)
                } else {
                    self.auto.choose(sample.len(), lz4, zstd, cost)
                };
                (c, t0.elapsed().as_nanos() as u64)
            }
        }
    }

    /// The codec chosen for a block did not shrink it: it is stored raw (and `Auto` tries
    /// again further off).
    pub(super) fn shrank_nothing(&mut self) {
        if matches!(self.mode, Compression::Auto) {
            self.auto.failed();
        }
    }

    /// Counts time the writer spent waiting: for a compression (`stalled`: the codec stage
    /// held it back), or for its writes in flight.
    pub(super) fn waited(&mut self, since: Instant, stalled: bool) {
        let ns = since.elapsed().as_nanos() as u64;
        if stalled {
            self.stalled_ns += ns;
        } else {
            self.waited_ns += ns;
            self.device_wait_ns += ns;
        }
    }
}

/// The blocks a writer wrote since `Auto`'s last trial: their wall time, the parts of it spent
/// waiting for writes in flight and aside (waiting for compressions, choosing codecs), the
/// codec pool's time compressing them, and their physical and logical bytes. Summed
/// over the window, not smoothed per block: a writer waits in bursts (a full queue, then none
/// while it fills again), and a per-block average swung from 21 to 0.4 ns per byte between
/// trials on a steadily slow device.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct Window {
    ns: u64,
    wait_ns: u64,
    aside_ns: u64,
    codec_ns: u64,
    physical: u64,
    logical: u64,
    /// Bytes the device completed for the writer meanwhile.
    completed: u64,
    blocks: usize,
}

/// The share of a window's wall time spent waiting from which the device counts as the
/// writer's bottleneck (its wall time per physical byte is then the device's).
const DEVICE_BOUND: f64 = 0.1;

impl Window {
    /// Adds a block: the wall time since the last one, the time in it waiting for writes and
    /// aside (`waits`), its compression's time, its (physical, logical) bytes, and the bytes
    /// the device completed meanwhile.
    fn add(&mut self, ns: u64, waits: (u64, u64), codec_ns: u64, bytes: (usize, usize), done: u64) {
        self.ns += ns;
        self.wait_ns += waits.0.min(ns);
        self.aside_ns += waits.1;
        self.codec_ns += codec_ns;
        self.physical += bytes.0 as u64;
        self.logical += bytes.1 as u64;
        self.completed += done;
        self.blocks += 1;
    }

    /// The writer waited [`DEVICE_BOUND`] of the window's time or more.
    fn device_bound(&self) -> bool {
        self.blocks > 0 && self.wait_ns as f64 >= DEVICE_BOUND * self.ns as f64
    }

    /// Updates `cost` from the window, and starts a new one; returns the window's codec time
    /// per logical byte (0 when empty).
    ///
    /// A window in which the writer waited [`DEVICE_BOUND`] of its time measures the device:
    /// its wall time per byte the device completed in it (per physical byte written, as
    /// before, with no completion seen). The bytes written in it would overstate the device's
    /// cost after a switch to a codec: the writer then waits for the raw blocks queued before
    /// the switch while writing fewer bytes, and a 50 MB/s device (20 ns per byte) seemed to
    /// cost 47-57 ns, enough for zstd to look faster than lz4.
    /// A window of more than `queue_depth` blocks in which the writer did not wait shows the
    /// device kept up, so the cost is at most that; a shorter one may have gone into a queue
    /// its earlier blocks left part-empty, and leaves the cost as it was (one raw block after
    /// a run of lz4 blocks went out without a wait: the device seemed to run at 400 MB/s).
    ///
    /// The wait is what the writer would have waited storing the window's blocks raw: what
    /// the device takes for its logical bytes beyond the writer's own time, or the waits
    /// measured, when more. A writer whose CPU is short (a loaded host) and whose own time
    /// exceeds the device's gains nothing from writing less. Measured alone, the waits misled
    /// twice: a codec that left the writer waiting less, or not at all, does not show that raw
    /// would have (a writer that zstd made CPU-bound on a 50 MB/s device went raw, at a third
    /// of the rate); nor does a short raw window whose blocks went into a part-empty queue (on
    /// a loaded host, 78-112 of 277 lineitem blocks raw).
    fn take_into(&mut self, cost: &mut DeviceCost, queue_depth: usize) -> f64 {
        let w = std::mem::take(self);
        if w.physical == 0 || w.logical == 0 {
            return 0.0;
        }
        let done = if w.completed > 0 {
            w.completed
        } else {
            w.physical
        };
        let wall = w.ns as f64 / done as f64;
        let bound = w.device_bound();
        if bound {
            cost.device_ns_per_byte = wall;
        } else if w.blocks > queue_depth {
            cost.device_ns_per_byte = cost.device_ns_per_byte.min(wall);
        }
        cost.device_bound = bound;
        let own = w.ns.saturating_sub(w.wait_ns).saturating_sub(w.aside_ns);
        cost.producer_ns_per_byte = own as f64 / w.logical as f64;
        let device = w.logical as f64 * cost.device_ns_per_byte;
        let raw_wait = (device - own as f64).max(w.wait_ns as f64);
        cost.wait_ns_per_byte = raw_wait / w.logical as f64;
        w.codec_ns as f64 / w.logical as f64
    }
}

/// Compresses a sample with `codec`, timed: `None` if it does not shrink.
fn trial(codec: Codec, sample: &[u8], scratch: &mut [u8]) -> Option<(usize, u64)> {
    let t = Instant::now();
    let n = block::compress(codec, sample, scratch)?;
    Some((n, t.elapsed().as_nanos() as u64))
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
