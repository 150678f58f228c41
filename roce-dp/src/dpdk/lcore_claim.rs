//! Which process polls which core, across processes: an advisory lock per lcore, so that a second tool pinned to a
//! core another one already polls says so (two busy pollers on one core each run at about half speed, silently).
//!
//! Each claimed lcore is a POSIX record lock (`fcntl(F_SETLK)`, write lock on the whole file) on
//! `<dir>/lcore-N.lock`. The kernel drops it when the process ends, however it ends (SIGKILL included), so there is
//! never stale state to clean up: an unlocked file left behind means nothing. A conflicting claim asks the kernel
//! who holds the lock (`F_GETLK` reports the holder's pid). The directory is the process's own: `/run/roce-dp` for
//! root, else `$XDG_RUNTIME_DIR/roce-dp`, else `/tmp/roce-dp-UID` (made by, and owned by, that user: no other user
//! can plant files in it or take it).
//!
//! Across users: the directories are mode 0755 and the lock files 0644, so after claiming in its own directory a
//! process also opens the same lcore's file in the other users' directories read-only and asks with `F_GETLK`
//! whether a process holds it (a read-only descriptor can test for a write lock, not place one): `/run/roce-dp`,
//! each `/tmp/roce-dp-UID` and each `/run/user/UID/roce-dp` owned by that UID. Root sees every user's claims and
//! every user sees root's; two other users see each other's only in `/tmp` (a `/run/user/UID` is its owner's
//! alone). Those files are only tested, never locked, read or written: opened without following a symlink,
//! without blocking (a FIFO planted there), and only a regular file is asked. Another user may read-lock a file of
//! ours (0644 lets it); that only makes our claim warn, naming that user's process, since a claim decides nothing.
//!
//! A POSIX lock is released when the process closes ANY descriptor of that file, so each claimed file's descriptor
//! is kept open for the process lifetime, and a file found in another directory that is one of ours (a hard link
//! to it) is kept open too rather than closed.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The claimed lock files' descriptors with their (device, inode) (never closed: closing one would release the
/// lock), and descriptors of other paths to those files.
static HELD: Mutex<Vec<(OwnedFd, (u64, u64))>> = Mutex::new(Vec::new());

/// Where every user's claims live: `/run` and `/tmp`, and this process's `$XDG_RUNTIME_DIR` (other directories
/// in tests).
#[derive(Clone, Debug)]
pub(super) struct ClaimRoots {
    /// `/run`: root's claims in `roce-dp`, other users' in `user/UID/roce-dp`.
    pub(super) run: PathBuf,
    /// `/tmp`: claims of users without a runtime directory, in `roce-dp-UID`.
    pub(super) tmp: PathBuf,
    /// This process's `$XDG_RUNTIME_DIR` (absolute), if any.
    pub(super) xdg: Option<PathBuf>,
}

impl ClaimRoots {
    /// The system's: `/run`, `/tmp` and `$XDG_RUNTIME_DIR`.
    pub(super) fn system() -> ClaimRoots {
        ClaimRoots {
            run: PathBuf::from("/run"),
            tmp: PathBuf::from("/tmp"),
            xdg: std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute()),
        }
    }

    /// The directory user `uid`'s claims go to (see the module docs), made mode 0755 if it is not; `None` if none
    /// can be made.
    pub(super) fn own_dir(&self, uid: u32) -> Option<PathBuf> {
        let mut candidates = Vec::new();
        if uid == 0 {
            candidates.push(self.run.join("roce-dp"));
        }
        if let Some(x) = &self.xdg {
            candidates.push(x.join("roce-dp"));
        }
        candidates.push(self.tmp.join(format!("roce-dp-{uid}")));
        candidates.into_iter().find(|d| {
            let _ = std::fs::DirBuilder::new().mode(0o755).create(d);
            // Ours and a directory (not a symlink someone planted); others may look in (earlier versions: 0700).
            std::fs::symlink_metadata(d).is_ok_and(|m| {
                m.is_dir()
                    && m.uid() == uid
                    && (m.mode() & 0o755 == 0o755
                        || std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).is_ok())
            })
        })
    }

    /// Every user's claim directory that exists, with the user it must belong to: root's, then each
    /// `/tmp/roce-dp-UID` and `/run/user/UID/roce-dp`.
    fn all_dirs(&self) -> Vec<(PathBuf, u32)> {
        let mut dirs = vec![(self.run.join("roce-dp"), 0)];
        let numbered = |dir: &Path, prefix: &str| -> Vec<(String, u32)> {
            let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
            rd.filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let uid = name.strip_prefix(prefix)?.parse().ok()?;
                Some((name, uid))
            })
            .collect()
        };
        dirs.extend(numbered(&self.tmp, "roce-dp-").into_iter().map(|(n, uid)| (self.tmp.join(n), uid)));
        let users = self.run.join("user");
        dirs.extend(numbered(&users, "").into_iter().map(|(n, uid)| (users.join(n).join("roce-dp"), uid)));
        dirs
    }
}

/// The directory the lock files of this process's user live in (see the module docs); `None` if none can be made.
pub fn claim_dir() -> Option<PathBuf> {
    ClaimRoots::system().own_dir(euid())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Claims `lcore` for this process (in [`claim_dir`]) and looks for a claim of it by another user's process.
/// `None`: claimed, or nothing to say (no directory, a file that cannot be opened: the claim is advisory).
/// `Some(line)`: another process holds it: what to warn, e.g. `lcore 1 is also polled by pid 4242 (roce-dpd): two
/// pollers on one core share it (busy polling halves both); give one of them another lcore`.
pub fn claim_lcore(lcore: u32) -> Option<String> {
    claim_lcore_among(&ClaimRoots::system(), lcore)
}

/// [`claim_lcore`] with every user's claim directories under `roots`.
pub(super) fn claim_lcore_among(roots: &ClaimRoots, lcore: u32) -> Option<String> {
    let own = roots.own_dir(euid());
    if let Some(w) = own.as_deref().and_then(|d| claim_lcore_in(d, lcore)) {
        return Some(w);
    }
    roots
        .all_dirs()
        .into_iter()
        .filter(|(d, _)| Some(d) != own.as_ref())
        .find_map(|(d, uid)| holder_in(&d, uid, lcore))
        .map(|pid| warning(lcore, &who(pid)))
}

/// [`claim_lcore`] with the lock files in `dir` only (this user's own directory).
pub fn claim_lcore_in(dir: &Path, lcore: u32) -> Option<String> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(lock_name(lcore)))
        .ok()?;
    let meta = file.metadata().ok()?;
    // Readable by the other users' tools (files of earlier versions: 0600); only a file of ours is changed.
    if meta.uid() == euid() && meta.mode() & 0o644 != 0o644 {
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    let fd: OwnedFd = file.into();
    // A holder that ends between the claim and the question leaves no lock to name: claim again (a few times).
    for _ in 0..3 {
        let mut lock = whole_file_write_lock();
        // SAFETY: fcntl on a descriptor this function owns, with a fully initialised flock struct.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLK, &lock) } == 0 {
            held().push((fd, (meta.dev(), meta.ino())));
            return None;
        }
        // Held elsewhere: ask who. (Closing `fd` afterwards releases no lock of ours: had we held one on this
        // file, F_SETLK would have succeeded, since a process never conflicts with its own POSIX locks.)
        // SAFETY: as above; F_GETLK writes the conflicting lock's description into `lock` (F_UNLCK: none now).
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETLK, &mut lock) } != 0 {
            break;
        }
        if lock.l_type != libc::F_UNLCK as libc::c_short {
            return Some(warning(lcore, &who(lock.l_pid)));
        }
    }
    Some(warning(lcore, "another process"))
}

fn held() -> std::sync::MutexGuard<'static, Vec<(OwnedFd, (u64, u64))>> {
    HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn lock_name(lcore: u32) -> String {
    format!("lcore-{lcore}.lock")
}

/// The pid of a process holding `lcore`'s lock in user `uid`'s directory `dir`, tested through a read-only
/// descriptor (see the module docs); `None` if it is not held, or the directory is not that user's, or the file is
/// not a regular file.
fn holder_in(dir: &Path, uid: u32, lcore: u32) -> Option<libc::pid_t> {
    let d = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .ok()?;
    if d.metadata().ok()?.uid() != uid {
        return None;
    }
    let f: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(dir.join(lock_name(lcore)))
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() {
        return None;
    }
    let id = (m.dev(), m.ino());
    let mut held = held();
    if held.iter().any(|(_, h)| *h == id) {
        // One of our own lock files under another name: closing this descriptor would release our lock.
        held.push((f.into(), id));
        return None;
    }
    drop(held);
    let mut lock = whole_file_write_lock();
    // SAFETY: fcntl on a descriptor this function owns, with a fully initialised flock struct; F_GETLK only writes
    // the conflicting lock's description into `lock` (a test: no lock is placed).
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut lock) };
    (r == 0 && lock.l_type != libc::F_UNLCK as libc::c_short).then_some(lock.l_pid)
}

/// `pid P (NAME)`, or `pid P` when its name cannot be read.
fn who(pid: libc::pid_t) -> String {
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(comm) => format!("pid {pid} ({})", comm.trim()),
        Err(_) => format!("pid {pid}"),
    }
}

fn warning(lcore: u32, who: &str) -> String {
    format!(
        "lcore {lcore} is also polled by {who}: two pollers on one core share it (busy polling halves both); give one \
         of them another lcore"
    )
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

    /// The child half of the tests across users: claims each lcore of `RDP_LCORE_USER_CHILD` (comma-separated)
    /// with [`claim_lcore`] (the system's directories), or with [`claim_lcore_in`] in `RDP_LCORE_CLAIM_IN` if
    /// set, prints `claim N: WARNING` or `claim N: ok` for each, then waits to be killed.
    #[test]
    fn lcore_claim_user_child() {
        let Some(lcores) = std::env::var_os("RDP_LCORE_USER_CHILD") else { return };
        let dir = std::env::var_os("RDP_LCORE_CLAIM_IN").map(PathBuf::from);
        for l in lcores.to_str().unwrap().split(',').map(|l| l.parse().unwrap()) {
            let w = match &dir {
                Some(d) => claim_lcore_in(d, l),
                None => claim_lcore(l),
            };
            println!("claim {l}: {}", w.as_deref().unwrap_or("ok"));
        }
        std::thread::sleep(Duration::from_secs(30));
    }

    /// Runs [`lcore_claim_user_child`] as user `uid` (nobody: 65534) on `lcores`, and returns it with its lines.
    fn user_child(uid: u32, lcores: &[u32], dir: Option<&Path>) -> (std::process::Child, Vec<String>) {
        use std::os::unix::process::CommandExt;
        let list: Vec<String> = lcores.iter().map(u32::to_string).collect();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "dpdk::lcore_claim::tests::lcore_claim_user_child", "--nocapture", "--test-threads", "1"])
            .env("RDP_LCORE_USER_CHILD", list.join(","))
            .env_remove("XDG_RUNTIME_DIR")
            .uid(uid)
            .gid(uid)
            .stdout(Stdio::piped());
        if let Some(d) = dir {
            cmd.env("RDP_LCORE_CLAIM_IN", d);
        }
        let mut child = cmd.spawn().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut lines = Vec::new();
        while lines.len() < lcores.len() {
            let mut line = String::new();
            let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
            assert!(n > 0, "the child (uid {uid}) ended after {lines:?}");
            // (libtest prints the test's name on the line before its first output)
            if let Some((_, l)) = line.split_once("claim ") {
                lines.push(l.trim_end().to_owned());
            }
        }
        (child, lines)
    }

    fn is_root() -> bool {
        euid() == 0
    }

    /// Session 17 review: each user's claims were in that user's own directory (root's in /run/roce-dp, others' in
    /// $XDG_RUNTIME_DIR/roce-dp or /tmp/roce-dp-UID), so a process of another user polling the same lcore was
    /// never warned about, either way. Here root (this test) and nobody (its child) each claim an lcore the other
    /// holds, in the system's directories (lcores far above any real one: no tool of this machine uses them).
    /// Old code: both claims silent.
    #[test]
    fn a_claim_by_another_users_process_is_seen_both_ways() {
        assert!(is_root(), "this test plays two users: run it as root (as the DPDK tiers are)");
        let base = 3000 + std::process::id() % 1000 * 2;
        let (ours, theirs) = (base, base + 1);
        assert_eq!(claim_lcore(ours), None);
        let (mut child, lines) = user_child(65534, &[theirs, ours], None);
        let me = std::process::id();
        let cpid = child.id();
        let theirs_warning = claim_lcore(theirs);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(lines[0], format!("{theirs}: ok"));
        assert!(lines[1].starts_with(&format!("{ours}: lcore {ours} is also polled by pid {me} (")), "{lines:?}");
        let w = theirs_warning.expect("nobody's claim seen by root");
        assert!(w.starts_with(&format!("lcore {theirs} is also polled by pid {cpid} (")), "{w}");
        // Gone with its process: nothing left to see.
        assert_eq!(claim_lcore(theirs), None);
        for l in [ours, theirs] {
            let _ = std::fs::remove_file(Path::new("/run/roce-dp").join(lock_name(l)));
            let _ = std::fs::remove_file(Path::new("/tmp/roce-dp-65534").join(lock_name(l)));
        }
    }

    /// What another user may plant where the look across users goes: a directory of the wrong owner, a symlink, a
    /// FIFO (an open for reading would wait for a writer), and a hard link to one of this process's own lock files
    /// (closing a descriptor of it would release our lock). None of them is taken for a claim, none blocks, and
    /// our lock outlives the look: a child claiming the lcore in our directory is told it is ours.
    #[test]
    fn planted_files_in_other_users_directories_neither_block_nor_release_our_lock() {
        use std::os::unix::fs::{chown, symlink};
        assert!(is_root(), "this test plays two users: run it as root (as the DPDK tiers are)");
        let base = std::env::temp_dir().join(format!("rdp-lcore-planted-{}", std::process::id()));
        let roots = ClaimRoots { run: base.join("run"), tmp: base.join("tmp"), xdg: None };
        std::fs::create_dir_all(&roots.run).unwrap();
        std::fs::create_dir_all(&roots.tmp).unwrap();
        assert_eq!(claim_lcore_among(&roots, 5), None);
        let ours = roots.run.join("roce-dp").join(lock_name(5));
        // /tmp/roce-dp-65534, nobody's: a FIFO for lcore 6, a symlink to our file for lcore 7, a hard link to it
        // for lcore 5. /tmp/roce-dp-4242, also nobody's (the wrong owner): a hard link for lcore 8.
        let nobody = roots.tmp.join("roce-dp-65534");
        let wrong = roots.tmp.join("roce-dp-4242");
        for d in [&nobody, &wrong] {
            std::fs::create_dir(d).unwrap();
            chown(d, Some(65534), Some(65534)).unwrap();
        }
        let fifo = std::ffi::CString::new(nobody.join(lock_name(6)).into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
        symlink(&ours, nobody.join(lock_name(7))).unwrap();
        std::fs::hard_link(&ours, nobody.join(lock_name(5))).unwrap();
        std::fs::hard_link(&ours, wrong.join(lock_name(8))).unwrap();
        for l in [5, 6, 7, 8] {
            assert_eq!(claim_lcore_among(&roots, l), None, "lcore {l}");
        }
        let (mut child, lines) = user_child(0, &[5], Some(&roots.run.join("roce-dp")));
        child.kill().unwrap();
        child.wait().unwrap();
        let me = std::process::id();
        assert!(lines[0].starts_with(&format!("5: lcore 5 is also polled by pid {me} (")), "{lines:?}");
        let _ = std::fs::remove_dir_all(&base);
    }
}
