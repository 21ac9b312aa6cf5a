//! How the process's allocator treats the engine's large, short-lived buffers.

/// The largest buffer glibc's `mallopt` lets the heap serve (half its
/// 64 MiB heap size on 64-bit systems); larger ones are still mapped.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const HEAP_BUFFER_LIMIT: i32 = 32 << 20;

/// Freed memory at the top of the heap kept for reuse before the rest goes
/// back to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const KEPT_FREE_BYTES: i32 = 256 << 20;

/// Let freed engine buffers be reused instead of mapped afresh. A process
/// setting: the `prism` binary calls it once at start; a program embedding
/// the library may. It does nothing where the C library is not glibc.
pub fn reuse_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only changes tuning parameters; glibc refuses
    // values out of range and the defaults then stay.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, HEAP_BUFFER_LIMIT);
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEPT_FREE_BYTES);
    }
}
