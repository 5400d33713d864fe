//! Heap profiling: a dhat allocator that is only switched on around the measured region.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

static DHAT_ON: AtomicBool = AtomicBool::new(false);

/// The global allocator of every bench binary: the system allocator, except while a
/// [`HeapProfile`] is live, when every allocation (on every thread) goes through dhat. Timed
/// runs therefore pay nothing for the profiler; dhat ignores frees of blocks it never saw.
#[derive(Debug)]
pub struct GatedDhat;

// SAFETY: both branches forward to allocators that uphold the GlobalAlloc contract, and every
// block, whichever branch made it, is finally freed by `System` (dhat::Alloc frees with System
// too and only updates its tables for blocks it recorded).
unsafe impl GlobalAlloc for GatedDhat {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if DHAT_ON.load(Ordering::Relaxed) {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { dhat::Alloc.alloc(layout) }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if DHAT_ON.load(Ordering::Relaxed) {
            // SAFETY: forwarded with the caller's guarantees; dhat frees with System.
            unsafe { dhat::Alloc.dealloc(ptr, layout) }
        } else {
            // SAFETY: forwarded with the caller's guarantees; every block came from System.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if DHAT_ON.load(Ordering::Relaxed) {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { dhat::Alloc.realloc(ptr, layout, new_size) }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }
}

/// A live dhat heap profile (needs [`GatedDhat`] as the global allocator). With a file name,
/// dropping it writes dhat's JSON (per allocation site) there.
pub struct HeapProfile {
    profiler: Option<dhat::Profiler>,
}

impl std::fmt::Debug for HeapProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeapProfile")
    }
}

impl HeapProfile {
    /// Starts profiling every thread's allocations; `save` names the JSON written at the end.
    pub fn start(save: Option<&Path>) -> Self {
        DHAT_ON.store(true, Ordering::SeqCst);
        let b = dhat::Profiler::builder().trim_backtraces(Some(24));
        let profiler = match save {
            Some(p) => b.file_name(p).build(),
            None => b.testing().build(),
        };
        HeapProfile {
            profiler: Some(profiler),
        }
    }

    /// dhat's counters now.
    pub fn stats(&self) -> dhat::HeapStats {
        dhat::HeapStats::get()
    }
}

impl Drop for HeapProfile {
    fn drop(&mut self) {
        drop(self.profiler.take());
        DHAT_ON.store(false, Ordering::SeqCst);
    }
}
