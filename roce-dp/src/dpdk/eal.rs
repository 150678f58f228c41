//! The EAL: initialised once per process, cleaned up when the last handle drops.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::error::{DpdkError, Result};

/// Set by the first [`Eal::init`]; DPDK allows one `rte_eal_init` per process, successful or not.
static INITIALISED: AtomicBool = AtomicBool::new(false);

/// A read-only duplicate of the DPDK log file's descriptor (-1 when DPDK logs to the terminal), kept open for the
/// process lifetime so that [`captured_log`] works even after a failed init or after cleanup.
static LOG_FD: AtomicI32 = AtomicI32::new(-1);

/// What `rdp_park_interrupt_thread` returned when the last [`Eal`] handle dropped (1: not yet called).
static PARK_RESULT: AtomicI32 = AtomicI32::new(1);

/// Where this process's part of the DPDK log file begins (its length when opened: [`Eal::init_with_log`] appends).
static LOG_BASE: AtomicU64 = AtomicU64::new(0);

/// EAL command-line arguments, built from named options (so tools and tests agree on them).
///
/// `to_vec()` gives `argv` for [`Eal::init`]: program, `-l`, memory options, `--file-prefix`, `--no-pci`, log
/// level, vdevs, then `extra` verbatim (last, so a caller can add or override anything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EalArgs {
    /// `argv[0]`.
    pub program: String,
    /// The lcore list (`-l`); the first one is the main lcore, which the calling thread is pinned to.
    pub lcores: String,
    /// `--no-huge -m <MiB>`: run without hugepages on this much ordinary memory.
    pub no_huge_mb: Option<u32>,
    /// `--in-memory`: hugepages without files (cannot be combined with `--no-huge`).
    pub in_memory: bool,
    /// `--no-shconf`: no shared config files (lets two primaries run at once).
    pub no_shconf: bool,
    /// `--file-prefix`: names this process's runtime directory and hugepage files; unique per process.
    pub file_prefix: Option<String>,
    /// `--no-pci` (default on: never probe the machine's own NICs unless asked).
    pub no_pci: bool,
    /// `--no-telemetry` (default on: no telemetry socket in the runtime directory).
    pub no_telemetry: bool,
    /// `--log-level`, e.g. `"*:error"`.
    pub log_level: Option<String>,
    /// `--vdev=<spec>` entries.
    pub vdevs: Vec<String>,
    /// Further arguments, passed verbatim after the others.
    pub extra: Vec<String>,
}

impl EalArgs {
    /// Arguments for `program` on `lcores` with `--no-pci --no-telemetry` and nothing else.
    pub fn new(program: &str, lcores: &str) -> Self {
        Self {
            program: program.to_owned(),
            lcores: lcores.to_owned(),
            no_huge_mb: None,
            in_memory: false,
            no_shconf: false,
            file_prefix: None,
            no_pci: true,
            no_telemetry: true,
            log_level: None,
            vdevs: Vec::new(),
            extra: Vec::new(),
        }
    }

    /// The argument vector, `argv[0]` first.
    pub fn to_vec(&self) -> Vec<String> {
        let mut v = vec![self.program.clone(), "-l".to_owned(), self.lcores.clone()];
        if let Some(mb) = self.no_huge_mb {
            v.extend(["--no-huge".to_owned(), "-m".to_owned(), mb.to_string()]);
        }
        if self.in_memory {
            v.push("--in-memory".to_owned());
        }
        if self.no_shconf {
            v.push("--no-shconf".to_owned());
        }
        if let Some(p) = &self.file_prefix {
            v.push(format!("--file-prefix={p}"));
        }
        if self.no_pci {
            v.push("--no-pci".to_owned());
        }
        if self.no_telemetry {
            v.push("--no-telemetry".to_owned());
        }
        if let Some(l) = &self.log_level {
            v.push(format!("--log-level={l}"));
        }
        v.extend(self.vdevs.iter().map(|d| format!("--vdev={d}")));
        v.extend(self.extra.iter().cloned());
        v
    }
}

/// Where EAL keeps a process's runtime files as root; the tools remove `<this>/<file prefix>` when they exit.
pub const RUNTIME_ROOT: &str = "/var/run/dpdk";

/// The longest `--file-prefix` [`check_file_prefix`] accepts (EAL appends `map_N` and more to it for its hugepage
/// files; a file name holds 255 bytes).
pub const MAX_FILE_PREFIX: usize = 64;

/// Checks an EAL `--file-prefix` given on a command line: EAL names this process's runtime directory
/// `/var/run/dpdk/<prefix>` (and its hugepage files) after it, and every tool removes that directory, recursively,
/// when it exits. So the prefix must be one plain file name: 1 to [`MAX_FILE_PREFIX`] ASCII letters, digits, `_`,
/// `-` and `.`, not starting with `.` or `-`. Anything else (`/`, `..`, an absolute path) would point the removal
/// at another directory (`--file-prefix /` joined onto the root is `/`). The error is one line's tail: what the
/// prefix may hold.
pub fn check_file_prefix(prefix: &str) -> std::result::Result<(), String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if (1..=MAX_FILE_PREFIX).contains(&prefix.len()) && prefix.chars().all(plain) && !prefix.starts_with(['.', '-']) {
        return Ok(());
    }
    Err(format!(
        "{prefix:?} is not a plain name (1-{MAX_FILE_PREFIX} letters, digits, '_', '-' or '.', not starting with '.' \
         or '-'): EAL names its runtime directory {RUNTIME_ROOT}/<prefix> after it, and that directory is removed on \
         exit"
    ))
}

/// The runtime directory EAL uses for `prefix` as root (`/var/run/dpdk/<prefix>`), or `None` if `prefix` fails
/// [`check_file_prefix`] (then there is nothing of ours to remove).
pub fn runtime_dir_of(prefix: &str) -> Option<PathBuf> {
    check_file_prefix(prefix).ok().map(|()| Path::new(RUNTIME_ROOT).join(prefix))
}

/// A handle on the initialised EAL. Cheap to clone; [`Mempool`](super::Mempool), [`Port`](super::Port) and
/// [`Ring`](super::Ring) each hold one, so `rte_eal_cleanup` runs only after all of them are gone.
#[derive(Clone)]
pub struct Eal(Arc<EalInner>);

struct EalInner {
    /// The DPDK log stream when logging goes to a file (closed after cleanup).
    log: Option<NonNull<libc::FILE>>,
    /// Whether `log` is the anonymous capture file ([`Eal::init_captured`]), which [`Eal::log_to_stderr`] may leave.
    captured: bool,
    /// EAL's runtime directory (`/var/run/dpdk/<prefix>`), removed after cleanup if EAL left it empty.
    runtime_dir: Option<PathBuf>,
}

// SAFETY: `log` is only touched in Drop (by whichever thread drops the last handle), after rte_eal_cleanup has
// stopped DPDK from writing to it; the EAL itself is process-global and thread-safe to clean up from any thread.
unsafe impl Send for EalInner {}
// SAFETY: as above; no method reads `log` through a shared reference.
unsafe impl Sync for EalInner {}

impl Eal {
    /// Initialise DPDK with `args` (`argv[0]` first), logging to stdout/stderr as DPDK does by default.
    ///
    /// One call per process, successful or not (DPDK cannot retry a failed init): later calls fail with
    /// `EALREADY`, so keep the handle and clone it. The calling thread is pinned to the main lcore. The argument strings are leaked on purpose: EAL keeps pointers into argv for the whole
    /// process lifetime.
    pub fn init(args: Vec<String>) -> Result<Eal> {
        Self::init_inner(args, None)
    }

    /// As [`Eal::init`], but everything DPDK prints (its log, and the usage text or getopt errors that
    /// `rte_eal_init` prints on bad arguments) goes to the file `log` (appended; `/dev/null` to discard).
    pub fn init_with_log(args: Vec<String>, log: &Path) -> Result<Eal> {
        Self::init_inner(args, Some(Some(log)))
    }

    /// As [`Eal::init_with_log`], into an anonymous temporary file; read it with [`captured_log`] (e.g. to show
    /// DPDK's own explanation when a step fails).
    pub fn init_captured(args: Vec<String>) -> Result<Eal> {
        Self::init_inner(args, Some(None))
    }

    /// `log`: None = terminal, Some(None) = anonymous temporary file, Some(Some(path)) = that file.
    fn init_inner(args: Vec<String>, log: Option<Option<&Path>>) -> Result<Eal> {
        if INITIALISED.swap(true, Ordering::SeqCst) {
            return Err(DpdkError::new("rte_eal_init", libc::EALREADY));
        }
        let argv = leak_argv(args)?;
        let argc = i32::try_from(argv.len() - 1).map_err(|_| DpdkError::new("rte_eal_init", libc::E2BIG))?;
        let log = match log {
            Some(path) => Some(LogRedirect::open(path)?),
            None => None,
        };
        // SAFETY: argv is a leaked, NULL-terminated array of leaked NUL-terminated strings, valid for the rest of
        // the process as EAL requires; argc counts the non-NULL entries. INITIALISED guarantees a single call.
        let ret = unsafe { dpdk_sys::rte_eal_init(argc, argv.as_ptr().cast_mut()) };
        let err = (ret < 0).then(|| DpdkError::from_rte_errno("rte_eal_init"));
        let captured = log.as_ref().is_some_and(|l| l.anonymous);
        let log = log.map(LogRedirect::finish);
        if let Some(e) = err {
            if let Some(f) = log {
                close_log(f);
            }
            return Err(e);
        }
        // SAFETY: EAL is initialised; the returned string is static EAL state.
        let dir = unsafe { dpdk_sys::rte_eal_get_runtime_dir() };
        let runtime_dir = (!dir.is_null())
            // SAFETY: checked non-null; EAL returns a NUL-terminated path that lives as long as EAL.
            .then(|| PathBuf::from(unsafe { CStr::from_ptr(dir) }.to_string_lossy().into_owned()));
        Ok(Eal(Arc::new(EalInner { log, captured, runtime_dir })))
    }

    /// The number of lcores EAL enabled (`-l`).
    pub fn lcore_count(&self) -> u32 {
        // SAFETY: EAL is initialised (self exists); reads EAL configuration.
        unsafe { dpdk_sys::rte_lcore_count() }
    }

    /// The main lcore id (the first of `-l`).
    pub fn main_lcore(&self) -> u32 {
        // SAFETY: EAL is initialised (self exists); reads EAL configuration.
        unsafe { dpdk_sys::rte_get_main_lcore() }
    }

    /// Wait until EAL's interrupt thread has finished the work it was doing when this was called, e.g. handling a
    /// memif peer's disconnect: that handler marks the link down first and unmaps and frees afterwards, and a port
    /// closed meanwhile crashes the process in `eal-intr-thread` (DPDK 22.11; README, "DPDK 22.11 behaviour").
    ///
    /// An alarm is the one thing that runs on that thread on request, and it runs after the event batch in
    /// progress. Two alarms, one after the other, so that an alarm timer that was already due in that batch cannot
    /// end the wait early. `false` if they did not run within `timeout` (the thread is stuck; the caller goes on).
    pub fn interrupt_barrier(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        (0..2).all(|_| alarm_round(&Arc::new(AtomicBool::new(false)), deadline))
    }

    /// EAL's runtime directory for this process (`/var/run/dpdk/<file-prefix>` as root).
    pub fn runtime_dir(&self) -> Option<&Path> {
        self.0.runtime_dir.as_deref()
    }

    /// Once started, after [`Eal::init_captured`]: what DPDK logs from now on goes to stderr, each line after
    /// `prefix` (e.g. `"roce-dpd: DPDK: "`), so that messages it prints while running (a link going down, a memif
    /// peer leaving) are seen; the capture file stops growing (what it holds stays readable by [`captured_log`]).
    /// The prefix of the first call stays. Does nothing when DPDK logs to the terminal or to a file the user named.
    pub fn log_to_stderr(&self, prefix: &str) {
        if !self.0.captured {
            return;
        }
        let stream = *STDERR_STREAM.get_or_init(|| {
            let _ = STDERR_PREFIX.set(prefix.as_bytes().to_vec());
            let io = CookieIo { read: None, write: Some(write_prefixed), seek: None, close: None };
            // SAFETY: a write-only stream whose write function needs no cookie; it lives for the process lifetime.
            let f = unsafe { fopencookie(std::ptr::null_mut(), c"w".as_ptr(), io) };
            if !f.is_null() {
                // SAFETY: f is a valid stream; line buffering hands DPDK's lines to write_prefixed whole.
                unsafe { libc::setvbuf(f, std::ptr::null_mut(), libc::_IOLBF, 0) };
            }
            f as usize
        });
        if stream != 0 {
            // SAFETY: the stream is never closed. The capture file stays open until the last handle drops (a thread
            // that fetched it just before this switch may still write one message to it).
            unsafe { dpdk_sys::rte_openlog_stream(stream as *mut libc::FILE as *mut _) };
        }
    }

    /// Back to the capture file after [`Eal::log_to_stderr`] (e.g. before shutting the ports down, whose closing
    /// messages are routine). Does nothing when DPDK logs to the terminal or to a file the user named.
    pub fn log_to_capture(&self) {
        if let (true, Some(f)) = (self.0.captured, self.0.log) {
            // SAFETY: the capture stream stays open until this handle's EalInner drops.
            unsafe { dpdk_sys::rte_openlog_stream(f.as_ptr().cast()) };
        }
    }
}

/// The stream [`Eal::log_to_stderr`] makes (as an address; 0 if `fopencookie` failed), once per process.
static STDERR_STREAM: OnceLock<usize> = OnceLock::new();
/// What [`write_prefixed`] puts before each line.
static STDERR_PREFIX: OnceLock<Vec<u8>> = OnceLock::new();
/// Whether the next byte of DPDK's log starts a line (stdio calls [`write_prefixed`] under the stream's lock).
static AT_LINE_START: AtomicBool = AtomicBool::new(true);

/// glibc's `cookie_io_functions_t` (not in the libc crate): the stream's read, write, seek and close functions.
#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> isize>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, usize) -> isize>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, i32) -> i32>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> i32>,
}

extern "C" {
    /// glibc: a stream whose I/O calls the functions in `io`.
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut libc::FILE;
}

/// The write function of [`Eal::log_to_stderr`]'s stream: `size` bytes of DPDK's log to stderr, each line after the
/// prefix. Always reports every byte written (a short count would make stdio retry or fail the stream).
unsafe extern "C" fn write_prefixed(_cookie: *mut c_void, buf: *const c_char, size: usize) -> isize {
    if buf.is_null() || size == 0 {
        return 0;
    }
    // SAFETY: stdio passes `size` readable bytes at `buf`.
    let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), size) };
    let prefix = STDERR_PREFIX.get().map_or(&[][..], Vec::as_slice);
    let mut out = Vec::with_capacity(size + prefix.len());
    for piece in data.split_inclusive(|&b| b == b'\n') {
        if AT_LINE_START.load(Ordering::Relaxed) {
            out.extend_from_slice(prefix);
        }
        out.extend_from_slice(piece);
        AT_LINE_START.store(piece.ends_with(b"\n"), Ordering::Relaxed);
    }
    let _ = std::io::Write::write_all(&mut std::io::stderr(), &out);
    isize::try_from(size).unwrap_or(isize::MAX)
}

impl Drop for EalInner {
    fn drop(&mut self) {
        // rte_eal_cleanup unmaps DPDK's memory while the interrupt thread still runs, and wakes that thread itself
        // (unregistering the alarm source), which then reads every source's handle to rebuild its wait list. memif
        // leaves its listening socket's source registered with the handle in that memory: the read faulted (CI,
        // session 20: a memif server died of SIGSEGV in eal-intr-thread, rte_intr_fd_get, at an address inside the
        // --no-huge memory; 34 of 40 runs once an alarm had been used). So the thread is parked first, in a callback
        // that never returns (dpdk-sys/csrc/shim.h); if that fails, cleanup runs as it did before.
        // SAFETY: no preconditions beyond an initialised EAL (this handle); nothing after this needs interrupts.
        let rc = unsafe { dpdk_sys::rdp_park_interrupt_thread(1000) };
        PARK_RESULT.store(rc, Ordering::SeqCst);
        if rc != 0 {
            eprintln!(
                "roce-dp: EAL's interrupt thread could not be parked before rte_eal_cleanup ({}); cleaning up anyway",
                std::io::Error::from_raw_os_error(-rc)
            );
        }
        // SAFETY: this is the last handle: every Mempool, Port and Ring (each holding an Eal) is gone, so no DPDK
        // object this layer created is still in use. rte_eal_cleanup is called once (EalInner drops once).
        unsafe { dpdk_sys::rte_eal_cleanup() };
        if let Some(f) = self.log.take() {
            close_log(f);
        }
        if let Some(dir) = &self.runtime_dir {
            // Only succeeds if EAL left the directory empty (--no-shconf, --in-memory); otherwise it stays.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The alarm of [`Eal::interrupt_barrier`]: sets the flag it was given.
extern "C" fn barrier_alarm(arg: *mut c_void) {
    // SAFETY: `arg` came from `Arc::into_raw` in `alarm_round`, one reference given to this alarm; an alarm runs at
    // most once, and `alarm_round` takes the reference back itself only when rte_eal_alarm_cancel removed the alarm
    // before it ran.
    let flag = unsafe { Arc::from_raw(arg as *const AtomicBool) };
    flag.store(true, Ordering::Release);
}

/// Set one [`barrier_alarm`] on `flag`, due at once, and wait until it ran (`true`) or `deadline` passed (`false`).
fn alarm_round(flag: &Arc<AtomicBool>, deadline: Instant) -> bool {
    let arg = Arc::into_raw(Arc::clone(flag)) as *mut c_void;
    // SAFETY: EAL is initialised (the caller holds an Eal); the callback matches rte_eal_alarm_callback and `arg`
    // stays valid until the callback or this function releases it.
    let set = unsafe { dpdk_sys::rte_eal_alarm_set(1, Some(barrier_alarm), arg) } == 0;
    while set && !flag.load(Ordering::Acquire) {
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    if flag.load(Ordering::Acquire) {
        return true;
    }
    // Not run (yet), or not set: rte_eal_alarm_set can fail after queueing the alarm (it returns timerfd_settime's
    // result). Cancel it: rte_eal_alarm_cancel waits for a callback that is running and counts only the alarms it
    // removed before they ran.
    // SAFETY: the same callback and argument as above.
    if unsafe { dpdk_sys::rte_eal_alarm_cancel(Some(barrier_alarm), arg) } > 0 {
        // SAFETY: the alarm was removed before it ran: its reference is this function's again.
        drop(unsafe { Arc::from_raw(arg as *const AtomicBool) });
    }
    // Nothing removed: the alarm was never queued (its reference is leaked, a few bytes) or it ran meanwhile.
    flag.load(Ordering::Acquire)
}

/// Leak `args` as a NULL-terminated C argv (EAL keeps pointers into it forever).
fn leak_argv(args: Vec<String>) -> Result<&'static [*mut c_char]> {
    let mut argv: Vec<*mut c_char> = Vec::with_capacity(args.len() + 1);
    if args.is_empty() {
        return Err(DpdkError::new("rte_eal_init", libc::EINVAL));
    }
    for a in args {
        let c = CString::new(a).map_err(|_| DpdkError::new("rte_eal_init", libc::EINVAL))?;
        argv.push(c.into_raw());
    }
    argv.push(std::ptr::null_mut());
    Ok(Vec::leak(argv))
}

/// Point DPDK's log stream at `f` (NULL restores the default), then close `f`.
fn close_log(f: NonNull<libc::FILE>) {
    // SAFETY: detaches our stream from DPDK's logger before closing it; both calls accept these arguments.
    unsafe {
        dpdk_sys::rte_openlog_stream(std::ptr::null_mut());
        libc::fclose(f.as_ptr());
    }
}

/// stdout/stderr redirected into a log file for the duration of `rte_eal_init`.
struct LogRedirect {
    file: NonNull<libc::FILE>,
    saved: [i32; 2],
    /// An anonymous temporary file (not a file the user named).
    anonymous: bool,
}

impl LogRedirect {
    /// Open `path` (or an anonymous temporary file), make it DPDK's log stream and point fds 1 and 2 at it.
    fn open(path: Option<&Path>) -> Result<Self> {
        const OP: &str = "open DPDK log file";
        let file = match path {
            Some(path) => {
                let cpath =
                    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| DpdkError::new(OP, libc::EINVAL))?;
                // SAFETY: cpath and the mode string are NUL-terminated.
                unsafe { libc::fopen(cpath.as_ptr(), c"a".as_ptr()) }
            }
            // SAFETY: no arguments; returns a new stream or NULL.
            None => unsafe { libc::tmpfile() },
        };
        let file = NonNull::new(file).ok_or_else(|| DpdkError::new(OP, errno()))?;
        // SAFETY: file is a valid open stream; line buffering keeps the log readable while the process runs.
        unsafe { libc::setvbuf(file.as_ptr(), std::ptr::null_mut(), libc::_IOLBF, 0) };
        // SAFETY: file stays open until close_log; bindgen's FILE and libc's FILE are the same C type.
        unsafe { dpdk_sys::rte_openlog_stream(file.as_ptr().cast()) };
        // SAFETY: fileno of a valid stream; fcntl/dup2 on fds this process owns. The log's own fds are
        // close-on-exec (a child such as rdp-nic's `ip` must not inherit DPDK's log); fds 1 and 2 stay as they are.
        let saved = unsafe {
            let fd = libc::fileno(file.as_ptr());
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            let copy = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3);
            LOG_BASE.store(file_len(copy), Ordering::SeqCst);
            LOG_FD.store(copy, Ordering::SeqCst);
            let saved = [libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3), libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3)];
            libc::fflush(std::ptr::null_mut());
            libc::dup2(fd, 1);
            libc::dup2(fd, 2);
            saved
        };
        Ok(Self { file, saved, anonymous: path.is_none() })
    }

    /// Flush what DPDK printed and restore fds 1 and 2; the file stays DPDK's log stream.
    fn finish(self) -> NonNull<libc::FILE> {
        // SAFETY: flushes all C streams, then restores the fds saved in open() and closes the copies.
        unsafe {
            libc::fflush(std::ptr::null_mut());
            for (fd, saved) in [1, 2].into_iter().zip(self.saved) {
                if saved >= 0 {
                    libc::dup2(saved, fd);
                    libc::close(saved);
                }
            }
        }
        self.file
    }
}

/// Everything DPDK printed so far when it logs to a file ([`Eal::init_captured`], [`Eal::init_with_log`]); empty
/// when it logs to the terminal.
pub fn captured_log() -> String {
    captured_log_since(0)
}

/// A mark in the captured DPDK log: its length now (0 before [`Eal::init_captured`] or [`Eal::init_with_log`] opened
/// it). Take one before a step, then [`captured_log_since`] gives what DPDK printed during the step.
pub fn captured_log_mark() -> u64 {
    file_len(LOG_FD.load(Ordering::SeqCst))
}

/// What DPDK printed to its captured log after `mark` ([`captured_log_mark`]); empty when it logs to the terminal.
/// Never anything from before this process opened the file.
pub fn captured_log_since(mark: u64) -> String {
    let fd = LOG_FD.load(Ordering::SeqCst);
    let start = mark.max(LOG_BASE.load(Ordering::SeqCst));
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    if fd < 0 {
        return String::new();
    }
    loop {
        let at = start.saturating_add(out.len() as u64);
        let Ok(at) = libc::off_t::try_from(at) else { break };
        // SAFETY: fd is a descriptor this module keeps open for the process lifetime; buf is writable.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), at) };
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The length of the file open on `fd` (0 for -1 or on error).
fn file_len(fd: i32) -> u64 {
    if fd < 0 {
        return 0;
    }
    // SAFETY: fstat on a descriptor this module owns, into a zeroed stat it may overwrite.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return 0;
        }
        u64::try_from(st.st_size).unwrap_or(0)
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_in_documented_order() {
        let mut a = EalArgs::new("rdp", "1");
        a.no_huge_mb = Some(256);
        a.no_shconf = true;
        a.file_prefix = Some("rdp_t2".into());
        a.log_level = Some("*:error".into());
        a.vdevs.push("net_memif0,role=server,socket=/tmp/m.sock".into());
        a.extra.push("--single-file-segments".into());
        assert_eq!(
            a.to_vec(),
            [
                "rdp",
                "-l",
                "1",
                "--no-huge",
                "-m",
                "256",
                "--no-shconf",
                "--file-prefix=rdp_t2",
                "--no-pci",
                "--no-telemetry",
                "--log-level=*:error",
                "--vdev=net_memif0,role=server,socket=/tmp/m.sock",
                "--single-file-segments"
            ]
        );
    }

    #[test]
    fn minimal_args() {
        let mut a = EalArgs::new("p", "0-1");
        assert_eq!(a.to_vec(), ["p", "-l", "0-1", "--no-pci", "--no-telemetry"]);
        a.no_pci = false;
        a.no_telemetry = false;
        a.in_memory = true;
        assert_eq!(a.to_vec(), ["p", "-l", "0-1", "--in-memory"]);
    }

    #[test]
    fn file_prefix_is_one_plain_name() {
        for ok in ["rdpn_ring_123", "a", "x.y-z_0", &"p".repeat(MAX_FILE_PREFIX)] {
            assert_eq!(check_file_prefix(ok), Ok(()), "{ok}");
            assert_eq!(runtime_dir_of(ok), Some(Path::new("/var/run/dpdk").join(ok)));
        }
        // Each of these joined onto /var/run/dpdk names another directory (or the root itself), or is no name.
        for bad in ["", "/", "/tmp/x", "..", "../..", ".", ".hidden", "-l", "a/b", "a b", "a\0b", "a\nb", "é", "a,b"] {
            let e = check_file_prefix(bad).unwrap_err();
            assert!(e.starts_with(&format!("{bad:?} is not a plain name")) && !e.contains('\n'), "{e}");
            assert_eq!(runtime_dir_of(bad), None, "{bad:?}");
        }
        assert!(check_file_prefix(&"p".repeat(MAX_FILE_PREFIX + 1)).is_err());
    }

    #[test]
    fn argv_is_null_terminated() {
        let argv = leak_argv(vec!["a".into(), "bc".into()]).unwrap();
        assert_eq!(argv.len(), 3);
        assert!(argv[2].is_null());
        // SAFETY: entries 0 and 1 are leaked CStrings.
        assert_eq!(unsafe { CStr::from_ptr(argv[1]) }, c"bc");
        assert!(leak_argv(vec![]).is_err());
        assert!(leak_argv(vec!["a\0b".into()]).is_err());
    }

    static SLOW_STARTED: AtomicBool = AtomicBool::new(false);
    static SLOW_DONE: AtomicBool = AtomicBool::new(false);

    /// Work on EAL's interrupt thread (as a memif disconnect is): 1 s.
    extern "C" fn slow_alarm(_: *mut c_void) {
        SLOW_STARTED.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(1));
        SLOW_DONE.store(true, Ordering::SeqCst);
    }

    /// Start [`slow_alarm`] and return once it runs.
    fn start_slow_work() {
        SLOW_STARTED.store(false, Ordering::SeqCst);
        SLOW_DONE.store(false, Ordering::SeqCst);
        // SAFETY: EAL is initialised; the callback takes no argument.
        assert_eq!(unsafe { dpdk_sys::rte_eal_alarm_set(1, Some(slow_alarm), std::ptr::null_mut()) }, 0);
        let until = Instant::now() + Duration::from_secs(5);
        while !SLOW_STARTED.load(Ordering::SeqCst) {
            assert!(Instant::now() < until, "the interrupt thread never ran the alarm");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Runs test `name` of this binary again in a child with RDP_EAL_CHILD set (the test's child half: a real EAL,
    /// which initialises once per process; needs root for its runtime directory, no hugepages), removes the child's
    /// runtime directory, and returns its exit status and output.
    fn run_eal_child(name: &str) -> Option<(std::process::ExitStatus, String)> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 && std::env::var_os("CI").is_none() {
            eprintln!("{name}: needs root (EAL's runtime directory); not run (under CI it fails instead)");
            return None;
        }
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &format!("dpdk::eal::tests::{name}"), "--test-threads", "1", "--nocapture"])
            .env("RDP_EAL_CHILD", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let prefix = format!("rdp-eal-test-{}", child.id());
        let out = child.wait_with_output().unwrap();
        if let Some(dir) = runtime_dir_of(&prefix) {
            let _ = std::fs::remove_dir_all(dir);
        }
        Some((out.status, format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))))
    }

    /// The child half's EAL: no hugepages, its own prefix, on the first CPU this process may use.
    fn child_eal() -> Eal {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most its size.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; pid 0 is this thread.
        assert_eq!(unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }, 0);
        // SAFETY: CPU_ISSET reads the set within its size.
        let cpu = (0..libc::CPU_SETSIZE as usize).find(|&c| unsafe { libc::CPU_ISSET(c, &set) }).unwrap();
        let mut a = EalArgs::new("eal-test", &cpu.to_string());
        a.no_huge_mb = Some(64);
        a.no_shconf = true;
        a.file_prefix = Some(format!("rdp-eal-test-{}", std::process::id()));
        a.log_level = Some("*:error".into());
        Eal::init(a.to_vec()).expect("rte_eal_init (run as root; no hugepages needed)")
    }

    #[test]
    fn interrupt_barrier_waits_for_the_work_in_progress() {
        if std::env::var_os("RDP_EAL_CHILD").is_none() {
            let Some((status, said)) = run_eal_child("interrupt_barrier_waits_for_the_work_in_progress") else {
                return;
            };
            assert!(status.success() && said.contains("barrier checks passed"), "{status:?}: {said}");
            return;
        }
        let eal = child_eal();
        // Nothing in progress: at once (the bound only tells that from the 5 s timeout on a loaded machine).
        let t = Instant::now();
        assert!(eal.interrupt_barrier(Duration::from_secs(5)));
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // Work in progress on the interrupt thread: the barrier returns only once it is done.
        start_slow_work();
        assert!(eal.interrupt_barrier(Duration::from_secs(5)));
        assert!(SLOW_DONE.load(Ordering::SeqCst), "the barrier returned while the interrupt thread was busy");
        // A round that times out says so, and its alarm is cancelled: the reference it held is taken back (no
        // callback runs later); then the next barrier works.
        start_slow_work();
        let flag = Arc::new(AtomicBool::new(false));
        let t = Instant::now();
        assert!(!alarm_round(&flag, Instant::now() + Duration::from_millis(50)));
        assert!(t.elapsed() < Duration::from_millis(950), "{:?}", t.elapsed());
        assert_eq!(Arc::strong_count(&flag), 1, "the cancelled alarm's reference was not taken back");
        assert!(!SLOW_DONE.load(Ordering::SeqCst));
        assert!(eal.interrupt_barrier(Duration::from_secs(5)));
        assert!(SLOW_DONE.load(Ordering::SeqCst));
        println!("barrier checks passed");
    }

    /// Session 20's CI failure, at the EAL level: a source left registered with its handle in DPDK memory (as memif
    /// leaves its listening socket's), an alarm used (so rte_eal_cleanup wakes the interrupt thread), then cleanup.
    /// Without the interrupt thread parked first the child died of SIGSEGV in eal-intr-thread most of the time.
    #[test]
    fn eal_cleanup_survives_a_source_left_in_dpdk_memory() {
        if std::env::var_os("RDP_EAL_CHILD").is_none() {
            for round in 0..6 {
                let Some((status, said)) = run_eal_child("eal_cleanup_survives_a_source_left_in_dpdk_memory") else {
                    return;
                };
                assert!(status.success() && said.contains("cleanup done"), "round {round}: {status:?}: {said}");
            }
            return;
        }
        let eal = child_eal();
        // SAFETY: EAL is initialised; the test aid registers a source that is never fired.
        assert_eq!(unsafe { dpdk_sys::rdp_test_register_shared_source_() }, 0);
        assert!(eal.interrupt_barrier(Duration::from_secs(5)));
        // SAFETY: reads a flag.
        assert_eq!(unsafe { dpdk_sys::rdp_interrupt_thread_parked() }, 0);
        drop(eal);
        assert_eq!(PARK_RESULT.load(Ordering::SeqCst), 0, "the thread was not parked before cleanup");
        // SAFETY: reads a flag.
        assert_eq!(unsafe { dpdk_sys::rdp_interrupt_thread_parked() }, 1);
        // Give a thread that was not parked time to run into the unmapped memory.
        std::thread::sleep(Duration::from_millis(100));
        println!("cleanup done");
    }
}
