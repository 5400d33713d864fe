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
}

/// What the writer's two stages cost, as `Auto` last measured them: the device, in wall time
/// per physical byte while the writer waited for it (0 until the writer has waited: the device
/// has not been its bottleneck), and the producer, in the writer's own time per logical byte
/// without codec or waits (the copies, the framing, the caller's work between writes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DeviceCost {
    pub(crate) device_ns_per_byte: f64,
    pub(crate) producer_ns_per_byte: f64,
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
        }
        codec
    }

    /// `Some(codec)` to use without a trial for this block, `None` to run a trial.
    pub(crate) fn next_block(&mut self) -> Option<Codec> {
        if self.skip > 0 {
            self.skip -= 1;
            return Some(self.sticky);
        }
        None
    }

    /// Chooses from a trial on `sample` bytes at the costs the writer measured. Writes run
    /// behind the producer, so a sample takes the longer of its two stages: raw, the longer of
    /// the producer's time and the device's for every byte; with a codec, the longer of the
    /// producer's time plus the codec's and the device's for the bytes out. A codec's gain is
    /// the difference. A writer the device never held back (device cost 0) gains nothing and
    /// stores raw; one that compresses until it is CPU-bound gains less than one that stays
    /// device-bound, and the stronger codec is taken only for [`TIME_STRONGER`] more gain.
    /// (Capping the gain by the time the writer waited, as before, made a writer that
    /// compressed with zstd stop waiting and fall back to raw, then wait and compress again.)
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
            // Compressible, but no codec pays at this cost, which changes: try again sooner.
            self.back_off(AUTO_MAX_NOT_NOW);
            return Codec::Raw;
        }
        self.keep(best.0)
    }

    /// The writer time a trial's codec saves over `sample` bytes in the two-stage model of
    /// [`AutoPolicy::choose`] (`None`: the codec did not shrink the sample).
    pub(crate) fn gain(sample: usize, t: TrialResult, cost: DeviceCost) -> Option<f64> {
        t.map(|(out, ns)| {
            let produce = sample as f64 * cost.producer_ns_per_byte;
            let raw = produce.max(sample as f64 * cost.device_ns_per_byte);
            let coded = (produce + ns as f64).max(out as f64 * cost.device_ns_per_byte);
            raw - coded
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
    /// Waiting since the last block (added by `poll_inflight_below`).
    pub(super) waited_ns: u64,
    /// When an async wait for writes in flight returned `Pending`.
    pub(super) pending_since: Option<Instant>,
    pub(super) last_block: Option<Instant>,
    /// Where `Auto`'s trials compress to (kept: no allocation per block).
    pub(super) scratch: Vec<u8>,
    /// How full the open segment's root is of spills, read at its rotation
    /// (`Store::root_fill`): one of `Auto`'s space bounds.
    pub(super) root_fill: f64,
}

impl CodecState {
    pub(super) fn new(mode: Compression) -> Self {
        CodecState {
            mode,
            auto: AutoPolicy::new(),
            // Until the writer waits, the device is not its bottleneck.
            cost: DeviceCost {
                device_ns_per_byte: 0.0,
                producer_ns_per_byte: 0.0,
            },
            window: Window::default(),
            waited_ns: 0,
            pending_since: None,
            last_block: None,
            scratch: Vec::new(),
            root_fill: 0.0,
        }
    }

    /// Records a block sealed now: `physical` bytes out of `logical` in, `codec_ns` spent
    /// compressing it (and choosing its codec).
    pub(super) fn observe(&mut self, physical: usize, logical: usize, codec_ns: u64) {
        let now = Instant::now();
        if let Some(t) = self.last_block.replace(now)
            && physical > 0
        {
            let ns = now.duration_since(t).as_nanos() as u64;
            self.window
                .add(ns, self.waited_ns, codec_ns, physical, logical);
        }
        self.waited_ns = 0;
    }

    /// The costs `Auto` weighs a trial against, updated from the window since the last trial
    /// (then a new window starts).
    pub(super) fn cost(&mut self) -> DeviceCost {
        self.window.take_into(&mut self.cost);
        self.cost
    }

    /// The codec for a block of `raw` bytes, and the nanoseconds its choice took: fixed, or
    /// `Auto`'s (a trial on a sample). `quota_fill`: bytes the ledger holds over
    /// `max_spill_bytes` (0 without a quota); with `root_fill`, `Auto`'s space pressure.
    pub(super) fn pick(&mut self, raw: &[u8], quota_fill: f64) -> (Codec, u64) {
        match self.mode {
            Compression::None => (Codec::Raw, 0),
            Compression::Lz4 => (Codec::Lz4, 0),
            Compression::Zstd { level } => (Codec::Zstd(level), 0),
            Compression::Auto => {
                let level = self.auto.set_space(quota_fill.max(self.root_fill));
                if let Some(c) = self.auto.next_block() {
                    return (c, 0);
                }
                let t0 = Instant::now();
                let sample = &raw[..raw.len().min(AUTO_SAMPLE)];
                self.scratch.resize(sample.len(), 0);
                let lz4 = trial(Codec::Lz4, sample, &mut self.scratch);
                // zstd (slower, smaller) is tried for time only when lz4 pays: where lz4's
                // CPU costs more than the device time it frees, zstd's far larger CPU does too.
                let cost = self.cost();
                let lz4_pays = AutoPolicy::gain(sample.len(), lz4, cost).is_some_and(|g| g > 0.0);
                let zstd = if lz4.is_some() && (level >= 1 || lz4_pays) {
                    trial(Codec::Zstd(1), sample, &mut self.scratch)
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

    /// Counts time the writer spent waiting for its writes in flight.
    pub(super) fn waited(&mut self, since: Instant) {
        self.waited_ns += since.elapsed().as_nanos() as u64;
    }
}

/// The blocks a writer wrote since `Auto`'s last trial: their wall time, the part of it spent
/// waiting for writes in flight and compressing, and their physical and logical bytes. Summed
/// over the window, not smoothed per block: a writer waits in bursts (a full queue, then none
/// while it fills again), and a per-block average swung from 21 to 0.4 ns per byte between
/// trials on a steadily slow device.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct Window {
    ns: u64,
    wait_ns: u64,
    codec_ns: u64,
    physical: u64,
    logical: u64,
}

/// The share of a window's wall time spent waiting from which the device counts as the
/// writer's bottleneck (its wall time per physical byte is then the device's).
const DEVICE_BOUND: f64 = 0.1;

impl Window {
    fn add(&mut self, ns: u64, wait_ns: u64, codec_ns: u64, physical: usize, logical: usize) {
        self.ns += ns;
        self.wait_ns += wait_ns.min(ns);
        self.codec_ns += codec_ns;
        self.physical += physical as u64;
        self.logical += logical as u64;
    }

    /// Updates `cost` from the window, and starts a new one. A window in which the writer
    /// waited [`DEVICE_BOUND`] of its time measures the device; one in which it did not shows
    /// the device kept up with the writer's output, so the device cost is at most that.
    fn take_into(&mut self, cost: &mut DeviceCost) {
        let w = std::mem::take(self);
        if w.physical == 0 || w.logical == 0 {
            return;
        }
        let wall = w.ns as f64 / w.physical as f64;
        cost.device_ns_per_byte = if w.wait_ns as f64 >= DEVICE_BOUND * w.ns as f64 {
            wall
        } else {
            cost.device_ns_per_byte.min(wall)
        };
        let own = w.ns.saturating_sub(w.wait_ns).saturating_sub(w.codec_ns);
        cost.producer_ns_per_byte = own as f64 / w.logical as f64;
    }
}

/// Compresses a sample with `codec`, timed: `None` if it does not shrink.
fn trial(codec: Codec, sample: &[u8], scratch: &mut [u8]) -> Option<(usize, u64)> {
    let t = Instant::now();
    let n = block::compress(codec, sample, scratch)?;
    Some((n, t.elapsed().as_nanos() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device-bound writer: the device takes `ns_per_byte`, the producer next to nothing.
    pub(super) fn bound(ns_per_byte: f64) -> DeviceCost {
        DeviceCost {
            device_ns_per_byte: ns_per_byte,
            producer_ns_per_byte: 0.0,
        }
    }

    #[test]
    fn auto_stores_raw_when_the_writer_never_waits_for_the_device() {
        let mut p = AutoPolicy::new();
        // The wall time between blocks is long (10 MB/s) because the writer itself is slow
        // (its producer, or its own compression): writes never make it wait, so fewer bytes
        // free no writer time and any codec only adds CPU.
        let cpu_bound = DeviceCost {
            device_ns_per_byte: 0.0,
            producer_ns_per_byte: 100.0,
        };
        assert_eq!(
            p.choose(
                65536,
                Some((16384, 20_000)),
                Some((8000, 200_000)),
                cpu_bound
            ),
            Codec::Raw
        );
        // Waiting a little: a codec pays only up to the wait it removes.
        while p.next_block().is_some() {}
        let some_wait = DeviceCost {
            device_ns_per_byte: 100.0,
            producer_ns_per_byte: 99.5,
        };
        // The device is 0.5 ns/byte slower than the producer: 32.8 us over 64 KiB. lz4 (20 us)
        // pays, zstd (200 us) makes the writer slower than the device by more than that.
        assert_eq!(
            p.choose(
                65536,
                Some((16384, 20_000)),
                Some((8000, 200_000)),
                some_wait
            ),
            Codec::Lz4
        );
    }

    #[test]
    fn auto_keeps_a_codec_that_pays_and_retries_after_a_while() {
        let mut p = AutoPolicy::new();
        assert_eq!(p.next_block(), None);
        // 64 KiB -> 16 KiB in 20 us at 1 ns/byte: 48 us of device time saved.
        let c = p.choose(
            65536,
            Some((16384, 20_000)),
            Some((12000, 200_000)),
            bound(1.0),
        );
        assert_eq!(c, Codec::Lz4);
        for _ in 0..AUTO_KEEP {
            assert_eq!(p.next_block(), Some(Codec::Lz4));
        }
        assert_eq!(p.next_block(), None);
        // On a slow device (10 MB/s) zstd's better ratio pays for its extra CPU.
        assert_eq!(
            p.choose(
                65536,
                Some((16384, 20_000)),
                Some((8000, 200_000)),
                bound(100.0)
            ),
            Codec::Zstd(1)
        );
    }

    #[test]
    fn auto_stores_raw_when_the_cpu_costs_more_than_the_device_time_saved() {
        let mut p = AutoPolicy::new();
        // A fast device (0.1 ns/byte): 48 KiB saved is 4.9 us, the codec took 20 us.
        assert_eq!(
            p.choose(65536, Some((16384, 20_000)), None, bound(0.1)),
            Codec::Raw
        );
        assert_eq!(p.next_block(), Some(Codec::Raw));
        assert_eq!(p.next_block(), None);
    }

    #[test]
    fn under_space_pressure_auto_takes_the_smallest_codec_that_saves_enough() {
        let mut p = AutoPolicy::new();
        assert_eq!(p.set_space(0.01), 0, "room to spare");
        assert_eq!(p.set_space(0.2), 1);
        // zstd 1 saves 35% over lz4: taken (no device cost at all in the choice).
        assert_eq!(
            p.choose_for_space(65536, Some((34000, 20_000)), Some((22000, 400_000)), None),
            Codec::Zstd(1)
        );
        // zstd 1 saves 6% over lz4 (less than 10%): lz4.
        assert_eq!(
            p.choose_for_space(65536, Some((34000, 20_000)), Some((32000, 400_000)), None),
            Codec::Lz4
        );
        // lz4 saves 8% of raw (not enough), zstd 1 24%: zstd 1.
        assert_eq!(
            p.choose_for_space(65536, Some((60000, 20_000)), Some((50000, 400_000)), None),
            Codec::Zstd(1)
        );
        // zstd 3 saves 7% over zstd 1 (more than 5%): zstd 3.
        assert_eq!(
            p.choose_for_space(65536, Some((34000, 1)), Some((22000, 1)), Some((20400, 1))),
            Codec::Zstd(3)
        );
        // Nothing saves 10%: raw, and a back-off.
        assert_eq!(
            p.choose_for_space(65536, Some((62000, 1)), Some((61000, 1)), None),
            Codec::Raw
        );
        assert_eq!(p.next_block(), Some(Codec::Raw));
    }

    #[test]
    fn a_rise_in_space_pressure_ends_a_back_off() {
        let mut p = AutoPolicy::new();
        for _ in 0..600 {
            if p.next_block().is_none() {
                p.choose(65536, None, None, bound(1.0));
            }
        }
        assert!(p.backoff >= 64, "backed off: {}", p.backoff);
        assert_eq!(p.set_space(0.3), 1);
        assert_eq!(p.next_block(), None, "the next block gets a trial");
        p.choose_for_space(65536, Some((30000, 1)), None, None);
        // The same level again does not: the codec is kept.
        assert_eq!(p.set_space(0.4), 1);
        assert_eq!(p.next_block(), Some(Codec::Lz4));
        assert_eq!(p.set_space(0.7), 2);
        assert_eq!(p.next_block(), None);
    }

    #[test]
    fn auto_backs_off_exponentially_on_incompressible_data() {
        let mut p = AutoPolicy::new();
        let mut trials = 0;
        for _ in 0..2000 {
            if p.next_block().is_none() {
                trials += 1;
                assert_eq!(p.choose(65536, None, None, bound(1.0)), Codec::Raw);
            }
        }
        // 1 + 2 + 4 + ... + 256, then every 257 blocks: 9 trials for the first 511 blocks,
        // 2000 blocks take 9 + ceil((2000 - 520) / 257) trials.
        assert!(trials <= 16, "{trials} trials in 2000 blocks");
        // Then one block that pays resets the back-off.
        while p.next_block().is_some() {}
        assert_eq!(
            p.choose(65536, Some((1000, 1000)), None, bound(1.0)),
            Codec::Lz4
        );
        assert_eq!(p.backoff, 0);
    }

    #[test]
    fn the_costs_are_measured_over_the_blocks_since_the_last_trial() {
        let mut c = CodecState::new(Compression::Auto);
        assert_eq!(
            c.cost(),
            tests::bound(0.0),
            "the device is no bottleneck until seen"
        );
        // Three blocks of 1,000 physical bytes from 2,000 logical: 10 us each, waits of 0, 0
        // and 24 us (a burst, capped at its block's wall time), 3 us of codec in all. The
        // writer waited a third of the time: the device costs 10 ns per physical byte; the
        // producer's own time is 30 - 10 - 3 = 17 us over 6,000 bytes.
        for wait in [0, 0, 24_000] {
            c.window.add(10_000, wait, 1_000, 1000, 2000);
        }
        c.window.add(0, 0, 0, 0, 0);
        let got = c.cost();
        assert_eq!(got.device_ns_per_byte, 10.0);
        assert!(
            (got.producer_ns_per_byte - 17.0 / 6.0).abs() < 1e-9,
            "{got:?}"
        );
        // No block since: the same costs again.
        assert_eq!(c.cost(), got);
        // A window with no waiting: the device kept up, so it costs at most the wall time per
        // physical byte (4 here); a slower window without waits leaves it as it was.
        c.window.add(4_000, 0, 0, 1000, 1000);
        assert_eq!(c.cost().device_ns_per_byte, 4.0);
        c.window.add(50_000, 1_000, 0, 1000, 1000);
        assert_eq!(
            c.cost().device_ns_per_byte,
            4.0,
            "waited 2%: not device-bound"
        );
        c.window.add(50_000, 10_000, 0, 1000, 1000);
        assert_eq!(
            c.cost().device_ns_per_byte,
            50.0,
            "waited 20%: device-bound"
        );
        // observe() feeds the window from the wall time between blocks and the waits counted.
        let mut d = CodecState::new(Compression::Auto);
        d.observe(1000, 2000, 7);
        d.waited_ns = 5;
        d.observe(1000, 3000, 9);
        assert_eq!(d.waited_ns, 0);
        assert_eq!(
            (d.window.physical, d.window.logical, d.window.codec_ns),
            (1000, 3000, 9),
            "the first block only starts the clock"
        );
        assert_eq!(d.window.wait_ns, 5.min(d.window.ns));
    }

    #[test]
    fn a_writer_that_compresses_until_cpu_bound_keeps_the_codec_that_stays_fastest() {
        let mut p = AutoPolicy::new();
        // A 100 MB/s device (10 ns/byte), a producer at 1 ns/byte: raw takes 655 us per 64 KiB.
        // lz4: 200 us to 30 KiB (device 307 us): gain 348 us. zstd: 700 us to 18 KiB: the
        // writer is CPU-bound at 765 us, slower than raw: no gain. lz4.
        let cost = DeviceCost {
            device_ns_per_byte: 10.0,
            producer_ns_per_byte: 1.0,
        };
        assert_eq!(
            p.choose(65536, Some((30720, 200_000)), Some((18432, 700_000)), cost),
            Codec::Lz4
        );
        // zstd within 10% of lz4's gain: lz4, the cheaper one.
        while p.next_block().is_some() {}
        let g = |out, ns| AutoPolicy::gain(65536, Some((out, ns)), cost).unwrap();
        assert!(g(18432, 230_000) > g(30720, 200_000));
        assert!(g(18432, 230_000) < 1.1 * g(30720, 200_000));
        assert_eq!(
            p.choose(65536, Some((30720, 200_000)), Some((18432, 230_000)), cost),
            Codec::Lz4
        );
        // Much slower device (100 ns/byte): zstd's smaller output wins by far.
        while p.next_block().is_some() {}
        let slow = DeviceCost {
            device_ns_per_byte: 100.0,
            producer_ns_per_byte: 1.0,
        };
        assert_eq!(
            p.choose(65536, Some((30720, 200_000)), Some((18432, 700_000)), slow),
            Codec::Zstd(1)
        );
    }

    #[test]
    fn compressible_data_that_does_not_pay_now_gets_trials_again_sooner() {
        let mut p = AutoPolicy::new();
        // A fast device: lz4 halves the sample but its CPU costs more than the time it frees.
        let mut trials = 0;
        for _ in 0..2000 {
            if p.next_block().is_none() {
                trials += 1;
                assert_eq!(
                    p.choose(65536, Some((32768, 20_000)), None, bound(0.1)),
                    Codec::Raw
                );
            }
        }
        // 1 + 2 + ... + 32, then every 33 blocks: at least 2000 / 33 trials; incompressible
        // data gets at most 16 in as many blocks (the test above).
        assert!(trials >= 60, "{trials} trials in 2000 blocks");
        assert_eq!(p.backoff, AUTO_MAX_NOT_NOW);
        // The device slows: the next trial keeps lz4 and ends the back-off.
        while p.next_block().is_some() {}
        assert_eq!(
            p.choose(65536, Some((32768, 20_000)), None, bound(5.0)),
            Codec::Lz4
        );
        assert_eq!(p.backoff, 0);
        // A sample shrunk by less than a tenth counts as incompressible: the long back-off.
        let mut q = AutoPolicy::new();
        for _ in 0..2000 {
            if q.next_block().is_none() {
                q.choose(65536, Some((63000, 20_000)), None, bound(0.1));
            }
        }
        assert_eq!(q.backoff, AUTO_MAX_BACKOFF);
    }
}
