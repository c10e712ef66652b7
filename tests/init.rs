//! Initialisation never exits the process: without a GPU it is an `Err` that names the cause.

use nvshmem::{Error, InitOptions, Nvshmem, UniqueId};

#[test]
fn init_without_a_gpu_is_an_error_and_with_one_a_second_init_is_refused() {
    match Nvshmem::init() {
        Err(Error::NoGpu(why)) => {
            // The message says what to install or set.
            assert!(why.contains("libcuda") || why.contains("GPU"), "{why}");
            // Still refused the same way: nothing was left half-started.
            assert!(matches!(
                Nvshmem::init_with(InitOptions::new().device(0)),
                Err(Error::NoGpu(_))
            ));
        }
        Ok(shmem) => {
            assert!(matches!(Nvshmem::init(), Err(Error::AlreadyInitialized)));
            let id = UniqueId::from_bytes(&[0; UniqueId::SIZE]).unwrap();
            assert!(matches!(
                Nvshmem::init_with_unique_id(0, 1, &id, InitOptions::new()),
                Err(Error::AlreadyInitialized)
            ));
            drop(shmem);
            assert!(matches!(Nvshmem::init(), Err(Error::Finalized)));
        }
        Err(other) => panic!("unexpected error from init: {other}"),
    }
}

#[test]
fn the_running_library_is_the_one_built_against() {
    let (major, minor, patch) = nvshmem::runtime::library_version();
    assert_eq!(
        format!("{major}.{minor}.{patch}"),
        nvshmem::sys::BUILD_VERSION
    );
}
