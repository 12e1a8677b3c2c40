//! Ctrl-C passed on to the stop flags of the workers and the stages, which each watch only their own (a
//! worker stopped because its answer no longer mattered must not stop the run).

use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `f` while Ctrl-C (`cancel`) is passed on to every worker's own stop flag, so a probe on any
/// worker (the endpoints too, before the parallel search starts) stops at once.
pub fn with_cancel_passed_on<T>(
    cancel: &AtomicBool,
    stops: &[AtomicBool],
    f: impl FnOnce() -> T,
) -> T {
    if stops.is_empty() {
        return f();
    }
    let finished = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !finished.load(Ordering::SeqCst) {
                if cancel.load(Ordering::SeqCst) {
                    stops.iter().for_each(|s| s.store(true, Ordering::SeqCst));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
        let out = f();
        finished.store(true, Ordering::SeqCst);
        out
    })
}
