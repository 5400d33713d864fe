//! The invariants, checked against the filesystem and the process itself rather than the
//! engine's counters: segment files and directories under the root, segment headers (which
//! engine wrote a file), the content of published files (parsed here, independently of the
//! engine's reader), open fds and mapped segments.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use spillring::segment::{self, HEADER_LEN};

use crate::data::Expect;

/// True for a segment file's name (`spill-segment-NNNNNN.bin`).
pub fn is_segment_name(name: &str) -> bool {
    name.starts_with("spill-segment-") && name.ends_with(".bin")
}

/// What a walk of a root found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Segment files (leaks, once the engine has settled).
    pub segment_files: Vec<PathBuf>,
    /// Other files.
    pub other_files: Vec<PathBuf>,
    /// Directories, deepest last.
    pub dirs: Vec<PathBuf>,
    /// Process directories of other live engines, not looked into.
    pub live_dirs: Vec<PathBuf>,
}

impl Scan {
    pub fn is_empty(&self) -> bool {
        self.segment_files.is_empty() && self.other_files.is_empty() && self.dirs.is_empty()
    }
}

/// True if another open file description holds the `flock` of directory `p` (a live engine).
pub fn is_locked(p: &Path) -> bool {
    match File::open(p) {
        Ok(f) => matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

/// Walks `root`. Top-level `spillring-*` directories locked by a live engine are skipped
/// unless listed in `ours`; paths in `exclude` are skipped.
pub fn scan_root(root: &Path, ours: &[PathBuf], exclude: &[PathBuf]) -> io::Result<Scan> {
    let mut s = Scan::default();
    let mut stack = Vec::new();
    for e in std::fs::read_dir(root)? {
        let e = e?;
        let p = e.path();
        if exclude.contains(&p) {
            continue;
        }
        let name = e.file_name();
        let name = name.to_string_lossy();
        if e.file_type()?.is_dir() {
            if name.starts_with(spillring::PROC_PREFIX) && !ours.contains(&p) && is_locked(&p) {
                s.live_dirs.push(p);
                continue;
            }
            s.dirs.push(p.clone());
            stack.push(p);
        } else if is_segment_name(&name) {
            s.segment_files.push(p);
        } else {
            s.other_files.push(p);
        }
    }
    while let Some(d) = stack.pop() {
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            // Removed while we looked (the engine is still cleaning up): nothing in it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for e in rd {
            let Ok(e) = e else { continue };
            let p = e.path();
            if exclude.contains(&p) {
                continue;
            }
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                // A live engine's directory under a sub-root (several roots in one tree).
                if e.file_name()
                    .to_string_lossy()
                    .starts_with(spillring::PROC_PREFIX)
                    && !ours.contains(&p)
                    && is_locked(&p)
                {
                    s.live_dirs.push(p);
                    continue;
                }
                s.dirs.push(p.clone());
                stack.push(p);
            } else if is_segment_name(&e.file_name().to_string_lossy()) {
                s.segment_files.push(p);
            } else {
                s.other_files.push(p);
            }
        }
    }
    s.segment_files.sort();
    s.other_files.sort();
    Ok(s)
}

/// The id of the engine that wrote segment file `p`, from its header.
pub fn segment_engine(p: &Path) -> Option<u64> {
    let mut f = File::open(p).ok()?;
    let mut h = [0u8; HEADER_LEN];
    f.read_exact(&mut h).ok()?;
    segment::parse_header(&h).ok().map(|h| h.engine)
}

/// Parses a process directory name (`spillring-<16 hex>`) into its engine id.
pub fn proc_dir_engine(p: &Path) -> Option<u64> {
    let name = p.file_name()?.to_str()?;
    u64::from_str_radix(name.strip_prefix(spillring::PROC_PREFIX)?, 16).ok()
}

/// A file's identity, to tell that a published file is still the same file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
}

pub fn file_id(p: &Path) -> io::Result<FileId> {
    let m = std::fs::symlink_metadata(p)?;
    Ok(FileId {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
    })
}

/// Parses published segment files, in order, with loadgen's own parser of the documented
/// format (version 3: header, then blocks of a 64-byte header (magic `SRB2`, codec, stored and
/// raw lengths, record count, padding, CRC-32C of segment, generation, engine id, the block's offset, the
/// header's first 48 bytes and the stored bytes), the stored records (`len u32 | 0 u32 |
/// payload`), then `pad` zeros), and compares every record with what was written. loadgen
/// runs without compression: a compressed block is an error here.
pub fn verify_published(paths: &[PathBuf], expect: &[Expect]) -> Result<(), String> {
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let u64_at = |b: &[u8], o: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(x)
    };
    let mut i = 0usize;
    for p in paths {
        let buf = std::fs::read(p).map_err(|e| format!("{}: read: {e}", p.display()))?;
        let header =
            segment::parse_header(&buf).map_err(|e| format!("{}: header: {e}", p.display()))?;
        let mut off = HEADER_LEN;
        while off + 64 <= buf.len() {
            let h = &buf[off..off + 64];
            if h.iter().all(|&b| b == 0) {
                // Zeros past the last block (a padded tail): zeros to the end.
                break;
            }
            if &h[0..4] != b"SRB2" {
                return Err(format!("{}: bad block magic at offset {off}", p.display()));
            }
            if h[4] != 0 {
                return Err(format!(
                    "{}: block at offset {off} has codec {} (loadgen writes raw blocks)",
                    p.display(),
                    h[4]
                ));
            }
            let stored = u64_at(h, 8) as usize;
            let count = u32_at(h, 24) as usize;
            let pad = u32_at(h, 28) as usize;
            let start = off + 64;
            let end = start + stored;
            if stored as u64 != u64_at(h, 16) || end + pad > buf.len() {
                return Err(format!(
                    "{}: block at offset {off} ({stored} bytes) passes the end of the file ({})",
                    p.display(),
                    buf.len()
                ));
            }
            let mut bind = [0u8; 24];
            bind[0..4].copy_from_slice(&header.segment.to_le_bytes());
            bind[4..8].copy_from_slice(&header.generation.to_le_bytes());
            bind[8..16].copy_from_slice(&header.engine.to_le_bytes());
            bind[16..24].copy_from_slice(&(off as u64).to_le_bytes());
            let crc = crc32c::crc32c_append(crc32c::crc32c(&bind), &h[..48]);
            let crc = crc32c::crc32c_append(crc, &buf[start..end]);
            if crc != u32_at(h, 48) {
                return Err(format!("{}: CRC mismatch at offset {off}", p.display()));
            }
            let mut r = start;
            let mut n = 0;
            while r < end {
                if end - r < 8 || u32_at(&buf, r + 4) != 0 {
                    return Err(format!("{}: bad record frame at offset {r}", p.display()));
                }
                let len = u32_at(&buf, r) as usize;
                if r + 8 + len > end {
                    return Err(format!(
                        "{}: record at offset {r} ({len} bytes) passes its block",
                        p.display()
                    ));
                }
                let payload = &buf[r + 8..r + 8 + len];
                let Some(e) = expect.get(i) else {
                    return Err(format!(
                        "{}: record {i} at offset {r} was never written (only {} were)",
                        p.display(),
                        expect.len()
                    ));
                };
                if let Some(why) = e.mismatch(payload) {
                    return Err(format!("{}: record {i} at offset {r}: {why}", p.display()));
                }
                i += 1;
                n += 1;
                r += 8 + len;
            }
            if n != count {
                return Err(format!(
                    "{}: block at offset {off} holds {n} records, its header says {count}",
                    p.display()
                ));
            }
            if buf[end..end + pad].iter().any(|&b| b != 0) {
                return Err(format!(
                    "{}: non-zero byte in the padding of the block at offset {off}",
                    p.display()
                ));
            }
            off = end + pad;
        }
        // A tail shorter than a block header, or zeros past the last block: zeros only.
        if buf[off.min(buf.len())..].iter().any(|&b| b != 0) {
            return Err(format!(
                "{}: {} trailing bytes that are not zero padding",
                p.display(),
                buf.len() - off
            ));
        }
    }
    if i != expect.len() {
        return Err(format!(
            "published files hold {i} records, {} were written",
            expect.len()
        ));
    }
    Ok(())
}

/// Where this process's open fds are listed.
pub const PROC_FDS: &str = "/proc/self/fd";
/// Where this process's mappings are listed.
pub const PROC_MAPS: &str = "/proc/self/maps";

/// The error of a `/proc` listing that cannot be read: the check that needs it cannot run, and
/// a run that cannot check must not pass.
fn unreadable(p: &Path, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("cannot read {}: {e} (the leak check needs it)", p.display()),
    )
}

/// How many fds this process has open.
pub fn fd_count() -> io::Result<u64> {
    fd_count_in(Path::new(PROC_FDS))
}

/// How many entries the fd listing `dir` (`/proc/self/fd`) has.
pub fn fd_count_in(dir: &Path) -> io::Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir).map_err(|e| unreadable(dir, e))? {
        e.map_err(|e| unreadable(dir, e))?;
        n += 1;
    }
    Ok(n)
}

/// How many open fds of this process point to unlinked files.
pub fn deleted_fds() -> io::Result<usize> {
    deleted_fds_in(Path::new(PROC_FDS))
}

/// How many fds of the fd listing `dir` point to unlinked files.
pub fn deleted_fds_in(dir: &Path) -> io::Result<usize> {
    Ok(fds_in(dir)?
        .values()
        .filter(|t| t.ends_with(" (deleted)"))
        .count())
}

/// Open fds of this process and what they point to.
pub fn fds() -> io::Result<BTreeMap<i32, String>> {
    fds_in(Path::new(PROC_FDS))
}

/// The fds of the fd listing `dir` (`/proc/self/fd`) and what they point to.
pub fn fds_in(dir: &Path) -> io::Result<BTreeMap<i32, String>> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(dir).map_err(|e| unreadable(dir, e))? {
        let e = e.map_err(|e| unreadable(dir, e))?;
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // The fd of the listing itself is gone by the time we read its link (and so may be
        // any fd closed while we look): only a link that exists is an open fd.
        if let Ok(t) = std::fs::read_link(e.path()) {
            m.insert(fd, t.to_string_lossy().into_owned());
        }
    }
    Ok(m)
}

/// Runs `check` until it finds nothing or `within` has passed (the reaper may close the last
/// fds, and the engine unmap the last segment, a moment after the engine is gone): what it
/// found last, or the error that kept it from running.
pub fn poll_until_empty<T>(
    within: std::time::Duration,
    mut check: impl FnMut() -> io::Result<Vec<T>>,
) -> io::Result<Vec<T>> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let found = check()?;
        if found.is_empty() || std::time::Instant::now() > deadline {
            return Ok(found);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Fds open now that were not open (to the same target) in `before`.
pub fn leaked_fds(before: &BTreeMap<i32, String>) -> io::Result<Vec<String>> {
    leaked_fds_in(Path::new(PROC_FDS), before)
}

/// Fds of the fd listing `dir` that were not open (to the same target) in `before`.
pub fn leaked_fds_in(dir: &Path, before: &BTreeMap<i32, String>) -> io::Result<Vec<String>> {
    Ok(fds_in(dir)?
        .into_iter()
        .filter(|(fd, t)| before.get(fd) != Some(t))
        .filter(|(_, t)| !t.starts_with("/proc/") || !t.ends_with("/fd"))
        .map(|(fd, t)| format!("fd {fd} -> {t}"))
        .collect())
}

/// Mappings of this process of segment files (or anything under `root`).
pub fn spill_maps(root: &Path) -> io::Result<Vec<String>> {
    spill_maps_in(Path::new(PROC_MAPS), root)
}

/// The mappings listed in `maps` (`/proc/self/maps`) of segment files (or anything under
/// `root`).
pub fn spill_maps_in(maps: &Path, root: &Path) -> io::Result<Vec<String>> {
    let text = std::fs::read_to_string(maps).map_err(|e| unreadable(maps, e))?;
    let root = root.to_string_lossy();
    Ok(text
        .lines()
        .filter(|l| l.contains("spill-segment-") || (!root.is_empty() && l.contains(&*root)))
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names() {
        assert!(is_segment_name("spill-segment-000001.bin"));
        assert!(!is_segment_name("op3-000000.bin"));
    }

    #[test]
    fn proc_dir_ids() {
        assert_eq!(
            proc_dir_engine(Path::new("/r/spillring-00000000000000ff")),
            Some(255)
        );
        assert_eq!(proc_dir_engine(Path::new("/r/other")), None);
    }

    /// A `/proc` listing that cannot be read is an error, never an empty (passing) answer.
    #[test]
    fn unreadable_proc_listings_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-proc");
        let a_file = dir.path().join("a-file");
        std::fs::write(&a_file, b"x").unwrap();
        for p in [&missing, &a_file] {
            let e = fd_count_in(p).unwrap_err();
            assert!(e.to_string().contains(&*p.to_string_lossy()), "{e}");
            assert!(fds_in(p).is_err());
            assert!(deleted_fds_in(p).is_err());
            assert!(leaked_fds_in(p, &BTreeMap::new()).is_err());
        }
        let e = spill_maps_in(&missing, dir.path()).unwrap_err();
        assert!(e.to_string().contains("no-such-proc"), "{e}");
        // A directory is not a maps file either.
        assert!(spill_maps_in(dir.path(), dir.path()).is_err());
    }

    #[test]
    fn proc_listings_are_parsed() {
        // The real ones are readable here.
        assert!(fd_count().unwrap() >= 3);
        assert!(!fds().unwrap().is_empty());
        deleted_fds().unwrap();
        spill_maps(Path::new("/nonexistent-root")).unwrap();
        // A stand-in fd listing: links named by fd number.
        let dir = tempfile::tempdir().unwrap();
        let fd = dir.path().join("fd");
        std::fs::create_dir(&fd).unwrap();
        for (n, t) in [
            ("0", "/dev/null"),
            ("3", "/r/spill-segment-000001.bin (deleted)"),
            ("4", "/r/x"),
        ] {
            std::os::unix::fs::symlink(t, fd.join(n)).unwrap();
        }
        assert_eq!(fd_count_in(&fd).unwrap(), 3);
        assert_eq!(deleted_fds_in(&fd).unwrap(), 1);
        let before = BTreeMap::from([(0, "/dev/null".to_owned()), (4, "/r/y".to_owned())]);
        assert_eq!(
            leaked_fds_in(&fd, &before).unwrap(),
            vec![
                "fd 3 -> /r/spill-segment-000001.bin (deleted)".to_owned(),
                "fd 4 -> /r/x".to_owned()
            ]
        );
        let maps = dir.path().join("maps");
        std::fs::write(
            &maps,
            "7f00-7f01 r--s 0 08:01 12 /r/t/spill-segment-000002.bin (deleted)\n\
             7f02-7f03 r--p 0 08:01 13 /usr/lib/libc.so.6\n\
             7f04-7f05 r--s 0 08:01 14 /spill-root/other\n",
        )
        .unwrap();
        assert_eq!(
            spill_maps_in(&maps, Path::new("/spill-root"))
                .unwrap()
                .len(),
            2
        );
        assert_eq!(spill_maps_in(&maps, Path::new("")).unwrap().len(), 1);
    }

    #[test]
    fn published_parser_rejects_damage() {
        let dir = tempfile::tempdir().unwrap();
        // A header from a real engine, then two frames.
        let engine =
            spillring::Engine::open(spillring::EngineConfig::new(dir.path().join("r"))).unwrap();
        let task = engine.task("t").unwrap();
        let mut w = task.writer().unwrap();
        let recs: Vec<&[u8]> = vec![b"hello", b"", b"world!"];
        for r in &recs {
            w.write(bytes::Bytes::copy_from_slice(r)).unwrap();
        }
        let st = w.finish().unwrap();
        let pubdir = dir.path().join("pub");
        std::fs::create_dir(&pubdir).unwrap();
        let paths = st.publish(&pubdir, "x").unwrap();
        let exp: Vec<Expect> = recs.iter().map(|r| Expect::of(r)).collect();
        verify_published(&paths, &exp).unwrap();
        assert!(verify_published(&paths, &exp[..2]).is_err());
        let mut buf = std::fs::read(&paths[0]).unwrap();
        let n = buf.len();
        buf[n - 1] ^= 0x40;
        std::fs::write(&paths[0], &buf).unwrap();
        assert!(verify_published(&paths, &exp).is_err());
        std::fs::remove_file(&paths[0]).unwrap();
        task.close();
        assert!(engine.settle(std::time::Duration::from_secs(5)));
    }
}
