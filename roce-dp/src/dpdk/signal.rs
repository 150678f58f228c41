//! SIGINT / SIGTERM as a flag for polling loops: the first signal sets it (the loop stops and the tool shuts its
//! port down cleanly); a second one terminates the process as if no handler were installed.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    if STOP.swap(true, Ordering::SeqCst) {
        // SAFETY: signal() and raise() are async-signal-safe; with the default action restored, the second signal
        // terminates the process.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn stop_on_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: on_signal only touches an atomic and calls async-signal-safe functions.
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

/// The flag the handler sets: a polling loop's stop flag (e.g. [`super::Worker::run`]'s), so that SIGINT or SIGTERM
/// ends it at its next turn.
pub fn stop_flag() -> &'static AtomicBool {
    &STOP
}

/// True once SIGINT or SIGTERM arrived (after [`stop_on_signals`]).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}
