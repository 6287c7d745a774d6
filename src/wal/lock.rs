//! An exclusive hold on a data directory, so that two processes never use one.

use std::io;
use std::path::Path;

/// The file in a data directory that a running member holds locked.
pub const LOCK_FILE: &str = "LOCK";

/// A running member's exclusive hold on its data directory: an advisory lock (`flock`) on
/// `<dir>/LOCK`, taken before anything in the directory is read or written and released when
/// this is dropped or the process ends, however it ends (kill -9 included: the kernel drops
/// it). Two processes on one directory would interleave appends to one WAL and could each
/// write a different data id; the second is refused instead. The file holds the holder's
/// pid, for the message only.
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    /// Takes the lock, or says who holds it. A file system without `flock` support (some
    /// network file systems) leaves the directory unguarded, with a warning.
    pub fn acquire(data_dir: &Path) -> io::Result<DirLock> {
        use std::io::{Read, Seek, Write};
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(data_dir)?;
        let path = data_dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| {
                io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display()))
            })?;
        // SAFETY: flock(2) on a descriptor that `file` owns and keeps open; no memory is
        // passed. (`File::try_lock` does the same, but only from Rust 1.89.)
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                tracing::warn!(path = %path.display(), error = %e, "cannot lock the data directory: nothing stops a second process from using it");
                return Ok(DirLock { _file: file });
            }
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => String::new(),
                pid => format!(" (pid {pid})"),
            };
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "data directory {} is in use by another quorate process{holder}: {} is locked. Stop that process first, or give this node its own --data-dir",
                    data_dir.display(),
                    path.display()
                ),
            ));
        }
        // Best effort: the pid only makes the message above more helpful.
        let _ = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()));
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_directory_is_refused_with_its_holder_until_the_lock_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let held = DirLock::acquire(&data).unwrap();
        assert_eq!(
            std::fs::read_to_string(data.join(LOCK_FILE)).unwrap(),
            format!("{}\n", std::process::id())
        );
        // Another open file description of the same file: refused, as another process is.
        let err = DirLock::acquire(&data).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy);
        let text = err.to_string();
        assert!(
            text.contains("in use by another quorate process")
                && text.contains(&format!("(pid {})", std::process::id()))
                && text.contains("--data-dir"),
            "{text}"
        );
        drop(held);
        let again = DirLock::acquire(&data).unwrap();
        drop(again);
    }
}
