//! Shared helpers for the spillring benches, one module per concern:
//!
//! - [`mode`]: how the binary was asked to run (quick mode, test mode, a profile loop);
//! - [`backend`]: the I/O backend a bench means, and an `Engine::open` that checks it ran;
//! - [`dirs`]: where results and spill files go;
//! - [`payload`]: aligned payloads the engine and the baselines share without copying;
//! - [`measure`]: CPU time from `getrusage` and what one write run measured;
//! - [`samples`]: the criterion configuration and a recorder for the samples it takes;
//! - [`heap`]: a dhat allocator that is only switched on around the measured region;
//! - [`wait`]: waiting for the engine's deletes and other conditions;
//! - [`report`]: the JSON every bench writes;
//! - [`lineitem`]: issue 11's bench data: TPC-H `lineitem`-like rows and random bytes;
//! - [`baseline`]: the `std::fs`, tokio-uring and codec baselines the engine is compared with.
//!
//! Every bench measures the engine through its public API (the same paths an embedding
//! executor uses) and a baseline in the same process, and writes its figures as JSON to
//! [`out_dir`]. `scripts/bench-report.sh` turns those files into `results/`.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod backend;
pub mod baseline;
pub mod dirs;
pub mod heap;
pub mod lineitem;
pub mod measure;
pub mod mode;
pub mod payload;
pub mod report;
pub mod samples;
pub mod wait;

pub use backend::{assert_backend, open_engine, wanted_backend};
pub use dirs::{out_dir, scratch, scratch_meta};
pub use heap::{GatedDhat, HeapProfile};
pub use measure::{Run, cpu_time, process_cpu, rss_bytes, thread_cpu};
pub use mode::{env_or, profile_request, quick, test_mode};
pub use payload::{AlignedBuf, payloads};
pub use report::{engine_info, write_json, write_results};
pub use samples::{Samples, criterion, median, spread};
pub use wait::{wait_deletes, wait_for};

/// KiB.
pub const KIB: usize = 1 << 10;
/// MiB.
pub const MIB: usize = 1 << 20;
/// GiB as a float, for per-GiB figures.
pub const GIB_F: f64 = (1u64 << 30) as f64;
