//! CPU time from `getrusage`, and what one write run measured.

use std::time::Duration;

use crate::GIB_F;

/// User + system CPU time of `who` (`libc::RUSAGE_SELF` or `libc::RUSAGE_THREAD`).
pub fn cpu_time(who: libc::c_int) -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` into the pointer, which points to a live, zeroed
    // `MaybeUninit<rusage>` of the right size.
    let r = unsafe { libc::getrusage(who, ru.as_mut_ptr()) };
    assert_eq!(
        r,
        0,
        "getrusage failed: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: getrusage succeeded and filled the struct (and it was zeroed before anyway).
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time of the whole process (every thread, including the engine's and io_uring's workers).
pub fn process_cpu() -> Duration {
    cpu_time(libc::RUSAGE_SELF)
}

/// CPU time of the calling thread.
pub fn thread_cpu() -> Duration {
    cpu_time(libc::RUSAGE_THREAD)
}

/// What one write run measured (the throughput bench's unit, for the engine and the
/// baselines alike).
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Bytes written.
    pub bytes: u64,
    /// Wall time from the first write to the end of the run (sync included when asked for).
    pub wall: Duration,
    /// [`process_cpu`] over the same span.
    pub cpu: Duration,
    /// Wall time the calling thread spent inside the write API.
    pub in_api: Duration,
    /// [`thread_cpu`] of the calling thread over its write loop.
    pub caller_cpu: Duration,
}

impl Run {
    /// Bytes / wall time, in MB/s.
    pub fn mb_s(&self) -> f64 {
        self.bytes as f64 / self.wall.as_secs_f64() / 1e6
    }

    /// `d` in seconds per GiB written.
    pub fn per_gib(&self, d: Duration) -> f64 {
        d.as_secs_f64() / (self.bytes as f64 / GIB_F)
    }
}

/// Resident set size of this process (`/proc/self/statm`), 0 if it cannot be read.
pub fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_moves_forward() {
        let a = thread_cpu();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu() >= a);
        assert!(process_cpu() >= thread_cpu());
    }

    #[test]
    fn run_figures() {
        let r = Run {
            bytes: 1 << 30,
            wall: Duration::from_secs(2),
            cpu: Duration::from_secs(1),
            in_api: Duration::ZERO,
            caller_cpu: Duration::ZERO,
        };
        assert_eq!(r.per_gib(r.cpu), 1.0);
        assert!((r.mb_s() - 536.870912).abs() < 1e-9);
    }
}
