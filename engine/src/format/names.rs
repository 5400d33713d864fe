//! Names on disk that are not segment files: every engine's process directory.

/// Prefix of every engine's process directory.
pub const PROC_PREFIX: &str = "spillring-";

/// The name of engine `id`'s process directory.
pub fn proc_dir_name(id: u64) -> String {
    format!("{PROC_PREFIX}{id:016x}")
}
