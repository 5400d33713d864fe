//! Codec: segment format v2's compression and encryption on data that is not ours to tune
//! (issue 11, "Goals" and "Bench data").
//!
//! Two data sets from `spillring_benches::lineitem`, generated once from fixed seeds and
//! replayed (a pool of up to 64 MiB, written round and round until a run's logical bytes are
//! reached; blocks are compressed one by one, so the replay does not help a codec): TPC-H
//! `lineitem`-like rows as dbgen's text lines, one record per row (~130 bytes), and random
//! bytes in 4 KiB records.
//!
//! One engine per configuration, in direct mode on the disk root (`SPILLRING_BENCH_ROOT`, see
//! `scratch`), defaults otherwise, kept across rounds as an executor keeps its engine:
//! `None`, `Lz4`, `Zstd { level: 1 }` and `{ level: 3 }` (zstd's default; level 2 lies between
//! them and was left out to keep the run short), `Auto`, and `encryption(true)` with `None` and with
//! `Auto` (on random bytes: `None`, `Lz4`, `Auto` and encrypted `None`). A run is: a task
//! scope, one writer, `write_slice` of every record until the run's logical bytes are written,
//! `finish`; then a reader over every record, each compared with the record written; then the
//! state and the scope dropped and the engine settled. Per run:
//! - write GB/s: logical bytes / wall time from the first `write_slice` to `finish`'s return
//!   (every write on the device: direct mode, no page cache);
//! - read GB/s: logical bytes / wall time of the read-back (the comparison included);
//! - physical / logical: the engine's `physical_bytes_written` / `logical_bytes_written`;
//! - CPU s/GiB: `getrusage(RUSAGE_SELF)` user+sys over the write (and over the read), per
//!   logical GiB, every thread of the process included;
//! - blocks per codec and the engine's compress / encrypt time, from its metrics.
//!
//! The fixed zstd levels write a quarter of the run's bytes (they are CPU-bound at a small
//! fraction of the disk's rate here and enter no goal ratio). `SPILLRING_CODEC_PAUSE_MS` adds a
//! pause before each run (default none: a 1 s pause, meant to let the shared device drain what
//! the run before left, did not narrow the spread of the ratios in one full run).
//!
//! Rounds: in each round every configuration of a data set runs once, in one order, reversed
//! every other round (A B C / C B A), so drift hits all alike; figures are medians over rounds,
//! ratios are medians of per-round ratios with their min and max. In every round, on one
//! thread, the baselines run over the same 1 MiB blocks of lineitem rows (packed with 4-byte
//! lengths as a staging buffer holds them): lz4_flex compressing them (GB/s of input per wall
//! second), and ring AES-256-GCM sealing them (CPU s per GiB). Then allocations: per
//! compressing or encrypting configuration, one writer past a warm-up, and the heap allocations
//! (dhat, every thread) of the `write_slice` calls that follow, inside one segment.
//!
//! `SPILLRING_CODEC_BYTES` sets the logical bytes per run (default 512 MiB; quick mode 64 MiB;
//! test mode 4 MiB), `SPILLRING_CODEC_ROUNDS` the rounds (default 4, an even number so each
//! configuration runs as often in the forward order as in the reversed one; quick 2; test 1):
//! a full run took 68-139 s here, depending on the machine's load.
//! `SPILLRING_BENCH_PROFILE=<data>-<config>` (e.g. `lineitem-auto`) loops that configuration's
//! write runs for `scripts/bench-report.sh`'s profile of a missed goal.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillring::{Compression, Engine, EngineConfig, Metrics, WriteMode};
use spillring_benches::baseline::codec::{CodecRun, Sealer, lz4_compress};
use spillring_benches::lineitem::{RecordSet, lineitem_records, random_records};
use spillring_benches::{
    GIB_F, GatedDhat, HeapProfile, MIB, engine_info, median, open_engine, out_dir, process_cpu,
    profile_request, quick, scratch, test_mode, write_results,
};

#[global_allocator]
static ALLOC: GatedDhat = GatedDhat;

const LINEITEM_SEED: u64 = 20_261_201;
const RANDOM_SEED: u64 = 11;
const RANDOM_RECORD: usize = 4096;
/// The engine's default `io_buffer_size`: the blocks the baselines work on.
const BLOCK: usize = MIB;
const POOL_MAX: usize = 64 * MIB;

/// One engine configuration.
#[derive(Debug, Clone, Copy)]
struct Variant {
    name: &'static str,
    compression: Compression,
    encryption: bool,
    /// The run's logical bytes are the bench's divided by this: the fixed zstd levels are
    /// CPU-bound at a small fraction of the disk's rate here, enter no goal ratio, and would
    /// otherwise take most of the run's time.
    bytes_divisor: usize,
}

const fn v(name: &'static str, compression: Compression, encryption: bool) -> Variant {
    Variant {
        name,
        compression,
        encryption,
        bytes_divisor: 1,
    }
}

const fn quarter(v: Variant) -> Variant {
    Variant {
        bytes_divisor: 4,
        ..v
    }
}

const VARIANTS: [Variant; 7] = [
    v("none", Compression::None, false),
    v("lz4", Compression::Lz4, false),
    quarter(v("zstd1", Compression::Zstd { level: 1 }, false)),
    quarter(v("zstd3", Compression::Zstd { level: 3 }, false)),
    v("auto", Compression::Auto, false),
    v("enc_none", Compression::None, true),
    v("enc_auto", Compression::Auto, true),
];
/// The configurations run on random bytes (indexes into VARIANTS).
const RANDOM_VARIANTS: [usize; 4] = [0, 1, 4, 5];
/// The configurations whose allocations per write are counted (compression or encryption on).
const ALLOC_VARIANTS: [usize; 5] = [1, 2, 4, 5, 6];

/// The engine configuration of `v` (the only place the bench names the v2 options).
fn configure(cfg: EngineConfig, v: &Variant) -> EngineConfig {
    cfg.compression(v.compression).encryption(v.encryption)
}

/// The engine's v2 counters (the only place the bench reads the v2 metrics).
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    logical_written: u64,
    physical_written: u64,
    logical_read: u64,
    physical_read: u64,
    blocks: [u64; 3],
    compress_ns: u64,
    decompress_ns: u64,
    encrypt_ns: u64,
    decrypt_ns: u64,
}

impl Counters {
    fn of(m: &Metrics) -> Counters {
        Counters {
            logical_written: m.logical_bytes_written,
            physical_written: m.physical_bytes_written,
            logical_read: m.logical_bytes_read,
            physical_read: m.physical_bytes_read,
            blocks: [m.blocks_raw, m.blocks_lz4, m.blocks_zstd],
            compress_ns: m.compress_nanos,
            decompress_ns: m.decompress_nanos,
            encrypt_ns: m.encrypt_nanos,
            decrypt_ns: m.decrypt_nanos,
        }
    }

    fn minus(self, o: Counters) -> Counters {
        let b = |i: usize| self.blocks[i] - o.blocks[i];
        Counters {
            logical_written: self.logical_written - o.logical_written,
            physical_written: self.physical_written - o.physical_written,
            logical_read: self.logical_read - o.logical_read,
            physical_read: self.physical_read - o.physical_read,
            blocks: [b(0), b(1), b(2)],
            compress_ns: self.compress_ns - o.compress_ns,
            decompress_ns: self.decompress_ns - o.decompress_ns,
            encrypt_ns: self.encrypt_ns - o.encrypt_ns,
            decrypt_ns: self.decrypt_ns - o.decrypt_ns,
        }
    }
}

/// What one engine run measured.
#[derive(Debug, Clone, Copy)]
struct EngineRun {
    logical: u64,
    write: Duration,
    write_cpu: Duration,
    read: Duration,
    read_cpu: Duration,
    c: Counters,
}

impl EngineRun {
    fn gib(&self) -> f64 {
        self.logical as f64 / GIB_F
    }
    fn write_gb_s(&self) -> f64 {
        self.logical as f64 / self.write.as_secs_f64() / 1e9
    }
    fn read_gb_s(&self) -> f64 {
        self.logical as f64 / self.read.as_secs_f64() / 1e9
    }
    fn write_cpu_per_gib(&self) -> f64 {
        self.write_cpu.as_secs_f64() / self.gib()
    }
    fn read_cpu_per_gib(&self) -> f64 {
        self.read_cpu.as_secs_f64() / self.gib()
    }
    fn physical_per_logical(&self) -> f64 {
        self.c.physical_written as f64 / self.c.logical_written.max(1) as f64
    }
    fn per_gib_ns(&self, ns: u64) -> f64 {
        ns as f64 / 1e9 / self.gib()
    }
}

/// Records of `set` from record `start` on until `bytes` logical bytes: (records, bytes).
fn plan(set: &RecordSet, bytes: usize) -> (usize, u64) {
    let (mut n, mut b, mut i) = (0usize, 0u64, 0usize);
    while (b as usize) < bytes {
        b += set.get(i).len() as u64;
        n += 1;
        i = (i + 1) % set.len();
    }
    (n, b)
}

/// Writes `n` records of `set` (cycling) through `engine`, reads them back and checks them.
fn engine_run(engine: &Engine, set: &RecordSet, n: usize, read_back: bool) -> EngineRun {
    let c0 = Counters::of(&engine.metrics());
    let task = engine.task("codec").expect("task");
    let mut w = task.writer().expect("writer");
    let (t0, cpu0) = (Instant::now(), process_cpu());
    let mut logical = 0u64;
    for i in 0..n {
        let r = set.get(i % set.len());
        w.write_slice(r).expect("engine write");
        logical += r.len() as u64;
    }
    let state = w.finish().expect("finish");
    let (write, write_cpu) = (t0.elapsed(), process_cpu() - cpu0);
    let (t1, cpu1) = (Instant::now(), process_cpu());
    if read_back {
        let mut rd = state.reader().expect("reader");
        let mut i = 0usize;
        while let Some(rec) = rd.next_record().expect("read back") {
            assert!(
                rec[..] == *set.get(i % set.len()),
                "record {i} read back differs"
            );
            i += 1;
        }
        assert_eq!(i, n, "every record read back");
    }
    let (read, read_cpu) = (t1.elapsed(), process_cpu() - cpu1);
    drop(state);
    task.close();
    assert!(engine.settle(Duration::from_secs(300)), "engine settles");
    EngineRun {
        logical,
        write,
        write_cpu,
        read,
        read_cpu,
        c: Counters::of(&engine.metrics()).minus(c0),
    }
}

/// The engines, one per configuration, each in its own directory under one scratch root. A
/// configuration this build refuses (`EngineConfig::validate`) has no engine: its runs are
/// skipped, its figures are null (the report says "not measured") and the reason is kept.
struct Engines {
    engines: Vec<Option<Engine>>,
    refused: serde_json::Map<String, Value>,
    dir: tempfile::TempDir,
}

impl Engines {
    fn open() -> Engines {
        let dir = scratch("codec").expect("create a scratch directory");
        let mut refused = serde_json::Map::new();
        let engines = VARIANTS
            .iter()
            .map(|v| {
                let cfg = configure(
                    EngineConfig::new(dir.path().join(v.name)).mode(WriteMode::Direct),
                    v,
                );
                if let Err(e) = cfg.validate() {
                    eprintln!("codec {}: refused by this build, not measured: {e}", v.name);
                    refused.insert(v.name.into(), e.to_string().into());
                    return None;
                }
                Some(open_engine(
                    cfg,
                    &format!(
                        "codec {} (direct mode needs O_DIRECT on the bench root)",
                        v.name
                    ),
                ))
            })
            .collect();
        Engines {
            engines,
            refused,
            dir,
        }
    }
}

/// `{n, median, min, max, values}` of `v`; null when `v` is empty (a configuration not run).
fn stats(mut v: Vec<f64>) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    let n = v.len();
    let (min, max) = v
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    json!({ "n": n, "median": median(&mut v), "min": min, "max": max, "values": v })
}

/// The median of `v`; null when `v` is empty.
fn med(v: impl Iterator<Item = f64>) -> Value {
    let mut v: Vec<f64> = v.collect();
    if v.is_empty() {
        Value::Null
    } else {
        median(&mut v).into()
    }
}

/// Heap allocations per `write_slice` of `set` on `engine`, past a warm-up, inside one segment.
fn allocations(engine: &Engine, set: &RecordSet, name: &str, warm: usize, counted: usize) -> Value {
    let task = engine.task("codec-allocs").expect("task");
    let mut w = task.writer().expect("writer");
    let (nw, _) = plan(set, warm);
    for i in 0..nw {
        w.write_slice(set.get(i % set.len()))
            .expect("warm-up write");
    }
    let (nc, _) = plan(set, counted);
    let save = out_dir()
        .expect("bench output directory")
        .join(format!("dhat-codec-{name}.json"));
    let prof = HeapProfile::start((!test_mode()).then_some(save.as_path()));
    let b0 = prof.stats().total_blocks;
    for i in nw..nw + nc {
        w.write_slice(set.get(i % set.len())).expect("write");
    }
    // Compression or sealing may run off the caller's thread: count its work too.
    std::thread::sleep(Duration::from_millis(50));
    let blocks = prof.stats().total_blocks - b0;
    drop(prof);
    let segments = w.segments();
    drop(w.finish().expect("finish"));
    task.close();
    assert!(engine.settle(Duration::from_secs(60)), "engine settles");
    json!({
        "writes": nc, "allocations": blocks, "allocs_per_write": blocks as f64 / nc as f64,
        "segments": segments, "dhat_sites": save.display().to_string(),
    })
}

fn env_usize(k: &str) -> Option<usize> {
    std::env::var(k).ok().and_then(|s| s.parse().ok())
}

fn main() {
    if let Some(f) = std::env::args().skip(1).find(|a| !a.starts_with('-'))
        && !"codec".contains(f.as_str())
    {
        return;
    }
    let (smoke, quick) = (test_mode(), quick());
    let bytes = env_usize("SPILLRING_CODEC_BYTES").unwrap_or(match (smoke, quick) {
        (true, _) => 4 * MIB,
        (false, true) => 64 * MIB,
        (false, false) => 512 * MIB,
    });
    let rounds = env_usize("SPILLRING_CODEC_ROUNDS").unwrap_or(match (smoke, quick) {
        (true, _) => 1,
        (false, true) => 2,
        (false, false) => 4,
    });
    let pause = Duration::from_millis(env_usize("SPILLRING_CODEC_PAUSE_MS").unwrap_or(0) as u64);
    let started = Instant::now();
    let profiling = profile_request();
    // A profile loop replays a smaller pool, so that generating it is not what the profile shows.
    let pool = bytes.min(if profiling.is_some() {
        16 * MIB
    } else {
        POOL_MAX
    });
    let sets = [
        ("lineitem", lineitem_records(LINEITEM_SEED, pool)),
        ("random", random_records(RANDOM_SEED, pool, RANDOM_RECORD)),
    ];
    let generated = started.elapsed();
    let engines = Engines::open();

    if let Some((what, dur)) = profiling {
        let (ds, name) = what.split_once('-').unwrap_or(("lineitem", "auto"));
        let set = &sets.iter().find(|s| s.0 == ds).unwrap_or(&sets[0]).1;
        let vi = VARIANTS.iter().position(|v| v.name == name).unwrap_or(4);
        let engine = engines.engines[vi].as_ref().unwrap_or_else(|| {
            panic!(
                "profile {what}: {} is refused by this build",
                VARIANTS[vi].name
            )
        });
        let (n, _) = plan(set, bytes.min(256 * MIB));
        let t = Instant::now();
        while t.elapsed() < dur {
            engine_run(engine, set, n, false);
        }
        return;
    }

    let lists: [Vec<usize>; 2] = [(0..VARIANTS.len()).collect(), RANDOM_VARIANTS.to_vec()];
    // runs[data set][variant] = one run per round
    let mut runs: Vec<Vec<Vec<EngineRun>>> = vec![vec![Vec::new(); VARIANTS.len()]; 2];
    let blocks = sets[0].1.blocks(BLOCK);
    let mut sealed = blocks.clone();
    let mut sealer = Sealer::new();
    let mut lz4_out = Vec::new();
    let base_passes = (bytes.min(256 * MIB) / sets[0].1.bytes()).max(1);
    let (mut lz4_runs, mut aes_runs): (Vec<CodecRun>, Vec<CodecRun>) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for (di, (ds, set)) in sets.iter().enumerate() {
            let mut order = lists[di].clone();
            if round % 2 == 1 {
                order.reverse();
            }
            for vi in order {
                let Some(engine) = &engines.engines[vi] else {
                    continue;
                };
                std::thread::sleep(pause);
                let (n, _) = plan(set, bytes / VARIANTS[vi].bytes_divisor);
                let r = engine_run(engine, set, n, true);
                eprintln!(
                    "codec round {round} {ds:<8} {:<8} write {:.3} GB/s  read {:.3} GB/s  phys/logical {:.3}  cpu {:.3} s/GiB  blocks raw/lz4/zstd {}/{}/{}",
                    VARIANTS[vi].name,
                    r.write_gb_s(),
                    r.read_gb_s(),
                    r.physical_per_logical(),
                    r.write_cpu_per_gib(),
                    r.c.blocks[0],
                    r.c.blocks[1],
                    r.c.blocks[2],
                );
                runs[di][vi].push(r);
            }
        }
        let l = lz4_compress(&blocks, &mut lz4_out, base_passes);
        let a = sealer.seal(&mut sealed, base_passes);
        eprintln!(
            "codec round {round} baselines: lz4_flex {:.3} GB/s ({:.3} s/GiB, ratio {:.3}); aes-256-gcm {:.3} GB/s ({:.3} s/GiB)",
            l.gb_s(),
            l.cpu_s_per_gib(),
            l.ratio(),
            a.gb_s(),
            a.cpu_s_per_gib()
        );
        lz4_runs.push(l);
        aes_runs.push(a);
    }

    // Allocations per write, each compressing or encrypting configuration, lineitem rows.
    let (warm, counted) = if smoke {
        (MIB, MIB)
    } else {
        (8 * MIB, 16 * MIB)
    };
    let mut allocs = serde_json::Map::new();
    for vi in ALLOC_VARIANTS {
        let Some(engine) = &engines.engines[vi] else {
            continue;
        };
        let a = allocations(engine, &sets[0].1, VARIANTS[vi].name, warm, counted);
        eprintln!("codec allocations {}: {a}", VARIANTS[vi].name);
        allocs.insert(VARIANTS[vi].name.into(), a);
    }

    let mut datasets = serde_json::Map::new();
    for (di, (ds, set)) in sets.iter().enumerate() {
        let mut configs = serde_json::Map::new();
        for &vi in &lists[di] {
            let rs = &runs[di][vi];
            if rs.is_empty() {
                continue;
            }
            let sum = |f: &dyn Fn(&EngineRun) -> u64| rs.iter().map(f).sum::<u64>();
            let (lw, pw) = (
                sum(&|r| r.c.logical_written),
                sum(&|r| r.c.physical_written),
            );
            let payload = sum(&|r| r.logical);
            configs.insert(
                VARIANTS[vi].name.into(),
                json!({
                    "runs": rs.len(),
                    "logical_bytes": rs.first().map_or(0, |r| r.logical),
                    "physical_bytes": rs.first().map_or(0, |r| r.c.physical_written),
                    "write_gb_s": med(rs.iter().map(EngineRun::write_gb_s)),
                    "read_gb_s": med(rs.iter().map(EngineRun::read_gb_s)),
                    "physical_per_logical": pw as f64 / lw.max(1) as f64,
                    "physical_per_payload": pw as f64 / payload.max(1) as f64,
                    "physical_per_logical_read": sum(&|r| r.c.physical_read) as f64 / sum(&|r| r.c.logical_read).max(1) as f64,
                    "cpu_s_per_gib_write": med(rs.iter().map(EngineRun::write_cpu_per_gib)),
                    "cpu_s_per_gib_read": med(rs.iter().map(EngineRun::read_cpu_per_gib)),
                    "blocks": { "raw": sum(&|r| r.c.blocks[0]), "lz4": sum(&|r| r.c.blocks[1]), "zstd": sum(&|r| r.c.blocks[2]) },
                    "compress_s_per_gib": med(rs.iter().map(|r| r.per_gib_ns(r.c.compress_ns))),
                    "decompress_s_per_gib": med(rs.iter().map(|r| r.per_gib_ns(r.c.decompress_ns))),
                    "encrypt_s_per_gib": med(rs.iter().map(|r| r.per_gib_ns(r.c.encrypt_ns))),
                    "decrypt_s_per_gib": med(rs.iter().map(|r| r.per_gib_ns(r.c.decrypt_ns))),
                    "write_gb_s_runs": rs.iter().map(EngineRun::write_gb_s).collect::<Vec<_>>(),
                }),
            );
        }
        let what = if *ds == "lineitem" {
            format!(
                "TPC-H lineitem-like rows as dbgen's text lines, one record per row, {:.0} bytes on average",
                set.bytes() as f64 / set.len() as f64
            )
        } else {
            format!("random bytes in {RANDOM_RECORD}-byte records")
        };
        datasets.insert(
            (*ds).into(),
            json!({ "what": what, "pool_bytes": set.bytes(), "configs": configs }),
        );
    }

    let idx = |name: &str| {
        VARIANTS
            .iter()
            .position(|v| v.name == name)
            .expect("a variant")
    };
    let pair = |di: usize, a: &str, b: &str, f: &dyn Fn(&EngineRun) -> f64| {
        let (ra, rb) = (&runs[di][idx(a)], &runs[di][idx(b)]);
        stats(ra.iter().zip(rb).map(|(x, y)| f(x) / f(y)).collect())
    };
    let gb = |r: &EngineRun| r.write_gb_s();
    let cpu = |r: &EngineRun| r.write_cpu_per_gib();
    let lz4_vs_crate = stats(
        runs[0][idx("lz4")]
            .iter()
            .zip(&lz4_runs)
            .map(|(e, l)| e.write_gb_s() / l.gb_s())
            .collect(),
    );
    let extra = |di: usize| {
        med(runs[di][idx("enc_none")]
            .iter()
            .zip(&runs[di][idx("none")])
            .map(|(e, p)| e.write_cpu_per_gib() - p.write_cpu_per_gib()))
    };
    let aes_cpu = med(aes_runs.iter().map(CodecRun::cpu_s_per_gib));
    let baseline = |rs: &[CodecRun]| {
        json!({
            "gb_s": med(rs.iter().map(CodecRun::gb_s)),
            "gb_per_cpu_s": med(rs.iter().map(CodecRun::gb_per_cpu_s)),
            "cpu_s_per_gib": med(rs.iter().map(CodecRun::cpu_s_per_gib)),
            "ratio": med(rs.iter().map(CodecRun::ratio)),
            "bytes_per_round": rs.first().map_or(0, |r| r.bytes_in),
            "gb_s_runs": rs.iter().map(CodecRun::gb_s).collect::<Vec<_>>(),
        })
    };
    let engine = engines.engines[0]
        .as_ref()
        .expect("the default configuration (None, no encryption) opens");
    write_results(
        "codec",
        &json!({
            "bench": "codec",
            "what": "Segment format v2: one writer per run spills a data set in direct mode on the disk root with each compression / encryption configuration, then reads it back",
            "engine": engine_info(engine),
            "root": engines.dir.path().display().to_string(),
            "quick": quick,
            "bytes_per_run": bytes,
            "pause_between_runs_s": pause.as_secs_f64(),
            "rounds": rounds,
            "block_bytes": BLOCK,
            "generate_seconds": generated.as_secs_f64(),
            "seconds": started.elapsed().as_secs_f64(),
            "refused": engines.refused,
            "variants": VARIANTS.iter().map(|v| json!({"name": v.name, "compression": format!("{:?}", v.compression), "encryption": v.encryption, "bytes_per_run": bytes / v.bytes_divisor})).collect::<Vec<_>>(),
            "datasets": datasets,
            "ratios": {
                "lineitem_auto_vs_none_gb_s": pair(0, "auto", "none", &gb),
                "lineitem_lz4_vs_none_gb_s": pair(0, "lz4", "none", &gb),
                "lineitem_zstd1_vs_none_gb_s": pair(0, "zstd1", "none", &gb),
                "lineitem_zstd3_vs_none_gb_s": pair(0, "zstd3", "none", &gb),
                "random_auto_vs_none_gb_s": pair(1, "auto", "none", &gb),
                "random_auto_vs_none_cpu": pair(1, "auto", "none", &cpu),
                "random_lz4_vs_none_gb_s": pair(1, "lz4", "none", &gb),
                "lineitem_lz4_vs_crate": lz4_vs_crate,
                "lineitem_enc_none_vs_none_gb_s": pair(0, "enc_none", "none", &gb),
                "lineitem_enc_auto_vs_auto_gb_s": pair(0, "enc_auto", "auto", &gb),
                "random_enc_none_vs_none_gb_s": pair(1, "enc_none", "none", &gb),
                "lineitem_enc_none_vs_none_cpu": pair(0, "enc_none", "none", &cpu),
            },
            "baselines": { "lz4_flex": baseline(&lz4_runs), "aes_gcm": baseline(&aes_runs) },
            "encryption_cpu": {
                "engine_extra_cpu_s_per_gib": extra(0),
                "engine_extra_cpu_s_per_gib_random": extra(1),
                "engine_encrypt_s_per_gib": med(runs[0][idx("enc_none")].iter().map(|r| r.per_gib_ns(r.c.encrypt_ns))),
                "crate_cpu_s_per_gib": aes_cpu,
            },
            "allocs": { "warm_bytes": warm, "counted_bytes": counted, "configs": allocs },
            "definitions": {
                "write_gb_s": "logical bytes / wall time from the first write_slice to finish's return",
                "read_gb_s": "logical bytes / wall time of reading every record back and comparing it",
                "physical_per_logical": "engine metrics physical_bytes_written / logical_bytes_written (records with their frames), summed over runs",
                "physical_per_payload": "physical_bytes_written / the record bytes the writer was given",
                "cpu_s_per_gib_write": "getrusage(RUSAGE_SELF) user+sys over the write, per logical GiB",
                "lz4_vs_crate": "engine Lz4 write GB/s / lz4_flex block compression GB/s (one thread, no I/O) of the same round",
                "engine_extra_cpu_s_per_gib": "CPU s/GiB of enc_none minus none, paired per round (lineitem)",
            },
        }),
    )
    .expect("write the bench results");
}
