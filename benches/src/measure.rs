//! CPU time from `getrusage`.

use std::time::Duration;

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
}
