//! The error type of the benchmark, and guards that keep collective clean-up from hanging
//! once a PE has failed.
//!
//! Freeing symmetric memory (and finalising NVSHMEM) is collective: a PE that returns early
//! with an error must not free while the other PEs are still running, or it waits forever.
//! Creating a [`BenchError`] therefore marks the process as failing; [`Guard`]s then leak their
//! contents instead of dropping them, and `main` exits without finalising.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

static FAILING: AtomicBool = AtomicBool::new(false);

/// Whether an error has been raised in this process.
pub fn failing() -> bool {
    FAILING.load(Ordering::SeqCst)
}

/// A fatal error, with a message that says what failed and what to do.
#[derive(Debug)]
pub struct BenchError {
    msg: String,
}

pub type Result<T, E = BenchError> = std::result::Result<T, E>;

impl BenchError {
    pub fn new(msg: impl Into<String>) -> Self {
        FAILING.store(true, Ordering::SeqCst);
        BenchError { msg: msg.into() }
    }

    /// A CUDA driver call failed.
    pub fn cuda(call: &str, e: cudarc::driver::DriverError) -> Self {
        Self::new(format!("{call} failed: {e}"))
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for BenchError {}

impl From<nvshmem::Error> for BenchError {
    fn from(e: nvshmem::Error) -> Self {
        BenchError::new(e.to_string())
    }
}

/// `Result<_, DriverError>` to `Result<_, BenchError>` naming the call.
pub trait CudaExt<T> {
    fn cuda(self, call: &str) -> Result<T>;
}

impl<T> CudaExt<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn cuda(self, call: &str) -> Result<T> {
        self.map_err(|e| BenchError::cuda(call, e))
    }
}

/// Owns a value whose drop is collective or may block on the GPU (symmetric buffers, kernel
/// modules, communicators): dropped normally, leaked once the process is failing.
pub struct Guard<T>(ManuallyDrop<T>);

impl<T> Guard<T> {
    pub fn new(value: T) -> Self {
        Guard(ManuallyDrop::new(value))
    }
}

impl<T> Drop for Guard<T> {
    fn drop(&mut self) {
        if !failing() && !std::thread::panicking() {
            // SAFETY: dropped once, here; never used again.
            unsafe { ManuallyDrop::drop(&mut self.0) }
        }
    }
}

impl<T> Deref for Guard<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for Guard<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    // The FAILING flag is process-wide, so one test covers both states in order.
    #[test]
    fn guards_drop_until_an_error_is_raised_then_leak() {
        let value = Rc::new(());
        let guard = Guard::new(Rc::clone(&value));
        assert_eq!(Rc::strong_count(&value), 2);
        drop(guard);
        assert_eq!(Rc::strong_count(&value), 1, "dropped while healthy");

        let guard = Guard::new(Rc::clone(&value));
        let e = BenchError::new("nvshmem_x failed with NVSHMEM status 3");
        assert!(failing());
        assert!(e.to_string().contains("nvshmem_x") && e.to_string().contains("status 3"));
        drop(guard);
        assert_eq!(Rc::strong_count(&value), 2, "leaked once failing");
    }
}
