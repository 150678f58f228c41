//! Which process polls which core, across processes: an advisory lock per lcore, so that a second tool pinned to a
//! core another one already polls says so (two busy pollers on one core each run at about half speed, silently).
//!
//! Each claimed lcore is a POSIX record lock (`fcntl(F_SETLK)`, write lock on the whole file) on
//! `<dir>/lcore-N.lock`. The kernel drops it when the process ends, however it ends (SIGKILL included), so there is
//! never stale state to clean up: an unlocked file left behind means nothing. A conflicting claim asks the kernel
//! who holds the lock (`F_GETLK` reports the holder's pid). The directory is `/run/roce-dp` where this process may
//! create it (root: every user's tools see each other), else `$XDG_RUNTIME_DIR/roce-dp`, else `/tmp/roce-dp-UID`.
//!
//! A POSIX lock is released when the process closes ANY descriptor of that file, so each claimed file's descriptor
//! is kept open for the process lifetime and nothing else here opens it.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The claimed lock files' descriptors (never closed: closing one would release the lock).
static HELD: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());

/// The directory the lock files live in (see the module docs); `None` if none can be made.
pub fn claim_dir() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let mut candidates = Vec::new();
    if uid == 0 {
        candidates.push(PathBuf::from("/run/roce-dp"));
    }
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute()) {
        candidates.push(x.join("roce-dp"));
    }
    candidates.push(PathBuf::from(format!("/tmp/roce-dp-{uid}")));
    candidates.into_iter().find(|d| {
        let _ = std::fs::DirBuilder::new().mode(0o700).create(d);
        // Ours and a directory (not a symlink someone planted).
        std::fs::symlink_metadata(d).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.is_dir() && m.uid() == uid
        })
    })
}

/// Claims `lcore` for this process (in [`claim_dir`]). `None`: claimed, or nothing to say (no directory, a file that
/// cannot be opened: the claim is advisory). `Some(line)`: another process holds it: what to warn, e.g. `lcore 1 is
/// also polled by pid 4242 (roce-dpd): two pollers on one core share it (busy polling halves both); give one of
/// them another lcore`.
pub fn claim_lcore(lcore: u32) -> Option<String> {
    claim_lcore_in(&claim_dir()?, lcore)
}

/// [`claim_lcore`] with the lock files in `dir`.
pub fn claim_lcore_in(dir: &Path, lcore: u32) -> Option<String> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(format!("lcore-{lcore}.lock")))
        .ok()?;
    let fd: OwnedFd = file.into();
    let mut lock = whole_file_write_lock();
    // SAFETY: fcntl on a descriptor this function owns, with a fully initialised flock struct.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLK, &lock) } == 0 {
        HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(fd);
        return None;
    }
    // Held elsewhere: ask who. (Closing `fd` afterwards releases no lock of ours: had we held one on this file,
    // F_SETLK would have succeeded, since a process never conflicts with its own POSIX locks.)
    // SAFETY: as above; F_GETLK writes the conflicting lock's description into `lock`.
    let who = if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETLK, &mut lock) } == 0 && lock.l_type != 0 {
        let pid = lock.l_pid;
        match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
            Ok(comm) => format!("pid {pid} ({})", comm.trim()),
            Err(_) => format!("pid {pid}"),
        }
    } else {
        "another process".to_owned()
    };
    Some(format!(
        "lcore {lcore} is also polled by {who}: two pollers on one core share it (busy polling halves both); give one \
         of them another lcore"
    ))
}

fn whole_file_write_lock() -> libc::flock {
    // SAFETY: flock is a plain C struct; all-zero is valid (l_start 0, l_len 0: the whole file).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    /// The child half of [`a_second_process_on_a_claimed_lcore_is_named_and_a_killed_one_leaves_nothing`]: claim
    /// lcore 7 in the directory the parent names, say so, then wait to be killed.
    #[test]
    fn lcore_claim_child() {
        let Some(dir) = std::env::var_os("RDP_LCORE_CLAIM_CHILD") else { return };
        assert_eq!(claim_lcore_in(Path::new(&dir), 7), None);
        println!("claimed");
        std::thread::sleep(Duration::from_secs(30));
    }

    #[test]
    fn a_second_process_on_a_claimed_lcore_is_named_and_a_killed_one_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("rdp-lcore-claim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "dpdk::lcore_claim::tests::lcore_claim_child", "--nocapture", "--test-threads", "1"])
            .env("RDP_LCORE_CLAIM_CHILD", &dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // The child claims first (had this process claimed lcore 7, the child would have found it held).
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut said = String::new();
        while !said.contains("claimed") {
            let n = std::io::BufRead::read_line(&mut out, &mut said).unwrap();
            assert!(n > 0, "the child ended without claiming lcore 7: {said:?}");
        }
        let warning = claim_lcore_in(&dir, 7).expect("lcore 7 is the child's");
        let pid = child.id();
        assert!(warning.starts_with(&format!("lcore 7 is also polled by pid {pid} (")), "{warning} (child pid {pid})");
        assert!(warning.ends_with("give one of them another lcore") && !warning.contains('\n'), "{warning}");
        // Another lcore is free; claiming one twice in one process is no conflict.
        assert_eq!(claim_lcore_in(&dir, 8), None);
        assert_eq!(claim_lcore_in(&dir, 8), None);
        // SIGKILL: the kernel drops the lock; the file left behind holds nothing.
        child.kill().unwrap();
        child.wait().unwrap();
        drop(out);
        assert!(dir.join("lcore-7.lock").exists());
        assert_eq!(claim_lcore_in(&dir, 7), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
