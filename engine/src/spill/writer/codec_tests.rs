//! Unit tests of `Auto`'s policy and the writer's cost window (`codec.rs`).

use super::*;

/// A device-bound writer: the device takes `ns_per_byte`, the producer next to nothing.
pub(super) fn bound(ns_per_byte: f64) -> DeviceCost {
    DeviceCost {
        device_ns_per_byte: ns_per_byte,
        producer_ns_per_byte: 0.0,
        wait_ns_per_byte: ns_per_byte,
        device_bound: true,
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
        wait_ns_per_byte: 0.0,
        device_bound: false,
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
        wait_ns_per_byte: 0.5,
        device_bound: false,
    };
    // The device is 0.5 ns/byte slower than the producer: 32.8 us over 64 KiB. lz4 (20 us,
    // beside the producer) saves it all; zstd saves no more (the producer is then the slowest
    // stage either way): lz4, the cheaper.
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
    let mut c = CodecState::new(Compression::Auto, 2);
    assert_eq!(
        c.cost(),
        DeviceCost {
            device_bound: false,
            ..tests::bound(0.0)
        },
        "the device is no bottleneck until seen"
    );
    // Three blocks of 1,000 physical bytes from 2,000 logical: 10 us each, waits for the
    // device of 0, 0 and 24 us (a burst, capped at its block's wall time), 3 us aside in all
    // (waiting for compressions, choosing codecs), and 6 us compressing on the codec pool,
    // which is not the writer's time. The writer waited a third of the time: the device
    // costs 10 ns per physical byte; the producer's own time is 30 - 10 - 3 = 17 us over
    // 6,000 bytes. Stored raw, the writer would have waited its 10 us, its 3 us aside, and
    // 10 us for each of the 3,000 bytes the codec saved: 43 us over 6,000 logical bytes.
    for wait in [0, 0, 24_000] {
        c.window
            .add(10_000, (wait, 1_000), 2_000, (1000, 2000), 1000);
    }
    let got = c.cost();
    assert_eq!(
        c.sustained_ns_per_byte, 1.0,
        "the codec's 6 us over 6,000 bytes"
    );
    assert!(got.device_bound);
    assert_eq!(got.device_ns_per_byte, 10.0);
    assert!((got.wait_ns_per_byte - 43.0 / 6.0).abs() < 1e-9, "{got:?}");
    assert!(
        (got.producer_ns_per_byte - 17.0 / 6.0).abs() < 1e-9,
        "{got:?}"
    );
    // No block since: the same costs again.
    assert_eq!(c.cost(), got);
    // A window of more blocks than the queue holds (2), with no waiting: the device kept
    // up, so it costs at most the wall time per physical byte (4 here); a slower window
    // without waits leaves it as it was.
    for _ in 0..3 {
        c.window.add(4_000, (0, 0), 0, (1000, 1000), 1000);
    }
    let got = c.cost();
    assert_eq!(got.device_ns_per_byte, 4.0);
    assert!(!got.device_bound);
    assert_eq!(got.wait_ns_per_byte, 0.0);
    for _ in 0..3 {
        c.window.add(50_000, (1_000, 0), 0, (1000, 1000), 1000);
    }
    let got = c.cost();
    assert_eq!(got.device_ns_per_byte, 4.0, "waited 2%: not device-bound");
    assert!((got.wait_ns_per_byte - 1.0).abs() < 1e-9, "{got:?}");
    c.window.add(50_000, (10_000, 0), 0, (1000, 1000), 1000);
    assert_eq!(
        c.cost().device_ns_per_byte,
        50.0,
        "waited 20%: device-bound"
    );
    // Two quick blocks without a wait (no more than the queue holds): they may have gone into
    // a queue earlier blocks left part-empty, and say nothing of the device.
    for _ in 0..2 {
        c.window.add(2_000, (0, 0), 0, (1000, 1000), 1000);
    }
    let got = c.cost();
    assert_eq!(got.device_ns_per_byte, 50.0);
    // Nor do they show that the writer would not wait: raw, the device takes 50 ns for each
    // of the 2,000 bytes, 100 us, beyond the writer's own 4 us (a writer on a loaded host
    // whose queue took a few raw blocks without a wait went raw for 32 blocks on a 50 MB/s
    // device, and for 1, 2, 4 and 8 after).
    assert!((got.wait_ns_per_byte - 48.0).abs() < 1e-9, "{got:?}");
    // Just after a switch to a codec, the writer waits for the raw blocks queued before it:
    // the device completes more bytes than the writer writes, and its cost is the wall time
    // per byte it completed (10 us for 4,000 bytes), not per byte written (10 us for 1,000).
    c.window.add(10_000, (5_000, 0), 0, (1000, 2000), 4000);
    let got = c.cost();
    assert!(got.device_bound);
    assert_eq!(got.device_ns_per_byte, 2.5);
    // Compressed and held back by its codec (6 us waiting for compressions, none for the
    // device): raw would have had the device take 2,000 bytes at 2.5 ns (5 us) beyond the
    // writer's own 4 us: 1 us over 2,000 logical bytes.
    c.window.add(10_000, (0, 6_000), 0, (1000, 2000), 1000);
    let got = c.cost();
    assert!(!got.device_bound);
    assert!((got.wait_ns_per_byte - 0.5).abs() < 1e-9, "{got:?}");
    // Raw and CPU-bound (a loaded host): its own 20 us per block is more than the device's
    // 2.5 us, and it would wait no more than it did, not at all.
    for _ in 0..3 {
        c.window.add(20_000, (0, 0), 0, (1000, 1000), 1000);
    }
    let got = c.cost();
    assert_eq!(got.device_ns_per_byte, 2.5);
    assert_eq!(got.wait_ns_per_byte, 0.0);
    // observe() feeds the window from the wall time between blocks and the waits counted.
    // A block's pick (on the writer's thread) and the waits for compressions are aside; its
    // compression (on the codec pool) is the codec's time.
    let mut d = CodecState::new(Compression::Auto, 2);
    d.observe(1000, 2000, 3, 7);
    d.waited_ns = 5;
    d.stalled_ns = 4;
    d.observe(1000, 3000, 2, 9);
    assert_eq!((d.waited_ns, d.stalled_ns), (0, 0));
    assert_eq!(
        (d.window.physical, d.window.logical, d.window.codec_ns),
        (1000, 3000, 9),
        "the first block only starts the clock"
    );
    assert_eq!(d.window.wait_ns, 5.min(d.window.ns));
    assert_eq!(d.window.aside_ns, 4 + 2);
}

#[test]
fn a_writer_that_compresses_until_cpu_bound_keeps_the_codec_that_stays_fastest() {
    let mut p = AutoPolicy::new();
    // A 100 MB/s device (10 ns/byte), a producer at 1 ns/byte: raw takes 655 us per 64 KiB.
    // lz4: 200 us to 30 KiB (device 307 us): gain 348 us. zstd: 700 us to 18 KiB: the
    // codec is the slowest stage at 700 us, slower than raw: no gain. lz4.
    let cost = DeviceCost {
        device_ns_per_byte: 10.0,
        producer_ns_per_byte: 1.0,
        wait_ns_per_byte: 9.0,
        device_bound: true,
    };
    assert_eq!(
        p.choose(65536, Some((30720, 200_000)), Some((18432, 700_000)), cost),
        Codec::Lz4
    );
    // zstd within 10% of lz4's gain (290 us to 18 KiB: gain 365 us): lz4, the cheaper one.
    while p.next_block().is_some() {}
    let g = |out, ns| AutoPolicy::gain(65536, Some((out, ns)), cost).unwrap();
    assert!(g(18432, 290_000) > g(30720, 200_000));
    assert!(g(18432, 290_000) < 1.1 * g(30720, 200_000));
    assert_eq!(
        p.choose(65536, Some((30720, 200_000)), Some((18432, 290_000)), cost),
        Codec::Lz4
    );
    // The codec runs beside the producer, not on its time: a producer at 8 ns/byte waits
    // 2 ns/byte for the device, and lz4 at 6 ns/byte saves that wait (131 us). Counted on the
    // producer's thread (8 + 6 ns/byte), it would have made the writer slower than raw.
    while p.next_block().is_some() {}
    let near = DeviceCost {
        producer_ns_per_byte: 8.0,
        wait_ns_per_byte: 2.0,
        ..cost
    };
    let gain = AutoPolicy::gain(65536, Some((30720, 400_000)), near).unwrap();
    assert_eq!(gain, 131_072.0);
    assert_eq!(
        p.choose(65536, Some((30720, 400_000)), None, near),
        Codec::Lz4
    );
    // Much slower device (100 ns/byte): zstd's smaller output wins by far.
    while p.next_block().is_some() {}
    let slow = DeviceCost {
        device_ns_per_byte: 100.0,
        producer_ns_per_byte: 1.0,
        wait_ns_per_byte: 99.0,
        device_bound: true,
    };
    assert_eq!(
        p.choose(65536, Some((30720, 200_000)), Some((18432, 700_000)), slow),
        Codec::Zstd(1)
    );
    // The writer stopped waiting (a loaded host took its CPU): however slow the device was
    // when last measured, writing less frees no time. Raw.
    while p.next_block().is_some() {}
    let stopped = DeviceCost {
        wait_ns_per_byte: 0.0,
        device_bound: false,
        ..slow
    };
    assert_eq!(
        p.choose(
            65536,
            Some((30720, 200_000)),
            Some((18432, 700_000)),
            stopped
        ),
        Codec::Raw
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

#[test]
fn a_kept_codecs_trial_costs_no_less_than_the_window_sustained() {
    let mut c = CodecState::new(Compression::Auto, 2);
    // Eight blocks with zstd kept: 8 MiB logical, 24 ms compressing (3 ns per byte, as a
    // writer sharing its CPU saw); its 64 KiB trial took 50 us in a burst.
    c.auto.keep(Codec::Zstd(1));
    c.window.add(
        40_000_000,
        (0, 0),
        3 * (8 << 20),
        (2 << 20, 8 << 20),
        2 << 20,
    );
    c.cost();
    let z = c.sustained(Codec::Zstd(1), Some((18_000, 50_000)), 65536);
    assert_eq!(z, Some((18_000, 196_608)), "3 ns/byte over the sample");
    // Another codec's trial stands as measured; a slower trial than the window stands too.
    assert_eq!(
        c.sustained(Codec::Lz4, Some((30_000, 40_000)), 65536),
        Some((30_000, 40_000))
    );
    assert_eq!(
        c.sustained(Codec::Zstd(1), Some((18_000, 900_000)), 65536),
        Some((18_000, 900_000))
    );
    assert_eq!(c.sustained(Codec::Zstd(1), None, 65536), None);
    // An empty window sustains nothing.
    c.cost();
    assert_eq!(
        c.sustained(Codec::Zstd(1), Some((18_000, 50_000)), 65536),
        Some((18_000, 50_000))
    );
}

#[test]
fn a_back_off_taken_while_the_writer_did_not_wait_ends_when_it_waits() {
    let mut c = CodecState::new(Compression::Auto, 8);
    // The first trial: the writer has not waited (its queue is filling), lz4 halves the
    // sample but frees no writer time. Raw, backing off.
    let not_yet = c.cost();
    assert!(!not_yet.device_bound);
    assert_eq!(
        c.auto.choose(65536, Some((32768, 20_000)), None, not_yet),
        Codec::Raw
    );
    assert_eq!(c.auto.next_block(), Some(Codec::Raw));
    for _ in 0..5 {
        c.auto.choose(65536, Some((32768, 20_000)), None, not_yet);
        while c.auto.next_block().is_some() {}
    }
    c.auto.choose(65536, Some((32768, 20_000)), None, not_yet);
    assert_eq!(c.auto.backoff, AUTO_MAX_NOT_NOW);
    // Blocks that did not wait keep the back-off; the first one after which the writer has
    // waited a tenth of the window's time ends it: the next block gets a trial.
    c.observe(1 << 20, 1 << 20, 0, 0);
    c.observe(1 << 20, 1 << 20, 0, 0);
    assert_eq!(c.auto.next_block(), Some(Codec::Raw));
    std::thread::sleep(std::time::Duration::from_millis(2));
    c.waited_ns = 1_900_000;
    c.observe(1 << 20, 1 << 20, 0, 0);
    assert_eq!(
        c.auto.next_block(),
        None,
        "a trial, at the cost the wait measured"
    );
    let cost = c.cost();
    assert!(
        cost.device_bound && cost.device_ns_per_byte > 0.0,
        "{cost:?}"
    );

    // A back-off taken while the writer waited (its CPU is short, not its device) is not
    // ended by more waiting: the trials stay backed off.
    let mut p = AutoPolicy::new();
    let cpu_short = DeviceCost {
        device_ns_per_byte: 1.0,
        producer_ns_per_byte: 2.0,
        wait_ns_per_byte: 0.2,
        device_bound: true,
    };
    p.choose(65536, Some((32768, 200_000)), None, cpu_short);
    p.choose(65536, Some((32768, 200_000)), None, cpu_short);
    assert_eq!(p.backoff, 2);
    p.device_bound_again();
    assert_eq!(p.next_block(), Some(Codec::Raw));
    // Nor one on incompressible data.
    let mut q = AutoPolicy::new();
    q.choose(65536, Some((64000, 20_000)), None, not_yet);
    q.device_bound_again();
    assert_eq!(q.next_block(), Some(Codec::Raw));
}
