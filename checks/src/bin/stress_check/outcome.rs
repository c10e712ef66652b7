//! Outcomes: why a checked operation failed, and the comparison of what it got.

use nvshmem::cudarc::driver::DriverError;

/// Why a checked operation failed: an error of a call, or data that is not what it must be.
pub(crate) struct Fail(pub(crate) String);

impl From<nvshmem::Error> for Fail {
    fn from(e: nvshmem::Error) -> Self {
        Fail(e.to_string())
    }
}

impl From<DriverError> for Fail {
    fn from(e: DriverError) -> Self {
        Fail(format!("CUDA: {e}"))
    }
}

pub(crate) type Outcome<T = ()> = Result<T, Fail>;

pub(crate) fn fail<T>(why: String) -> Outcome<T> {
    Err(Fail(why))
}

/// `got` must be `want`; otherwise how many elements differ, and the first.
pub(crate) fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> Outcome {
    if got.len() != want.len() {
        return fail(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    let mut bad = (0..got.len()).filter(|&i| got[i] != want[i]);
    match bad.next() {
        None => Ok(()),
        Some(i) => fail(format!(
            "{what}: {} of {} elements wrong; the first, {i}: {:?}, expected {:?}",
            1 + bad.count(),
            got.len(),
            got[i],
            want[i]
        )),
    }
}

pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<String>(), panic.downcast_ref::<&str>()) {
        (Some(s), _) => format!("panicked: {s}"),
        (None, Some(s)) => format!("panicked: {s}"),
        _ => "panicked".into(),
    }
}
