//! Places on one GPU shared by the runs of a stage: a run takes a place before it starts and gives it
//! back when it ends, so runs started from several threads never exceed what the GPU was measured to hold.

use std::sync::{Condvar, Mutex, PoisonError};

/// A fixed number of places; waiting for one blocks the thread (no spinning).
#[derive(Debug)]
pub struct Places {
    total: usize,
    free: Mutex<usize>,
    freed: Condvar,
}

/// Places held until dropped.
#[must_use = "the places are given back when this is dropped"]
#[derive(Debug)]
pub struct Held<'a> {
    places: &'a Places,
    count: usize,
}

impl Places {
    /// `total` places (at least one).
    pub fn new(total: usize) -> Self {
        let total = total.max(1);
        Self {
            total,
            free: Mutex::new(total),
            freed: Condvar::new(),
        }
    }

    /// How many places there are.
    pub fn total(&self) -> usize {
        self.total
    }

    /// One place, once one is free.
    pub fn one(&self) -> Held<'_> {
        self.take(1)
    }

    /// Every place, once all are free: a run alone on the GPU. The caller must hold none.
    pub fn all(&self) -> Held<'_> {
        self.take(self.total)
    }

    fn take(&self, count: usize) -> Held<'_> {
        let free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        let mut free = self
            .freed
            .wait_while(free, |free| *free < count)
            .unwrap_or_else(PoisonError::into_inner);
        *free -= count;
        Held {
            places: self,
            count,
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut free = self
            .places
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *free += self.count;
        self.places.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Barrier;

    #[test]
    fn never_more_runs_than_places() {
        let places = Places::new(3);
        let running = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        // Eight threads start together and each holds its place until all eight have tried: with
        // three places, three get in and the other five wait for them.
        let start = Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    start.wait();
                    let _held = places.one();
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    running.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        assert!((1..=3).contains(&most.load(Ordering::SeqCst)));
        assert_eq!(*places.free.lock().unwrap(), 3, "every place given back");
        assert_eq!(Places::new(0).total(), 1, "never none");
    }

    #[test]
    fn a_run_alone_waits_until_the_others_gave_their_places_back() {
        let places = Places::new(2);
        let one = places.one();
        let released = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _all = places.all();
                assert!(
                    released.load(Ordering::SeqCst),
                    "got every place while one was held"
                );
                assert_eq!(*places.free.lock().unwrap(), 0);
            });
            released.store(true, Ordering::SeqCst);
            drop(one);
        });
        assert_eq!(*places.free.lock().unwrap(), 2);
    }
}
