//! The bindings against the real host library.

const BINDINGS: &str = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));

fn bound_functions() -> Vec<&'static str> {
    BINDINGS
        .split("pub fn ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .collect()
}

#[test]
fn every_bound_function_resolves_in_the_host_library() {
    let names = bound_functions();
    assert!(names.len() > 1000, "only {} functions bound", names.len());
    let lib = unsafe { libloading::Library::new(nvshmem_sys::BUILD_HOST_LIB) }
        .unwrap_or_else(|e| panic!("dlopen {}: {e}", nvshmem_sys::BUILD_HOST_LIB));
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| unsafe { lib.get::<*const ()>(n.as_bytes()) }.is_err())
        .collect();
    assert!(missing.is_empty(), "bound but not exported: {missing:?}");
}

#[test]
fn the_api_the_crate_needs_is_bound_and_the_inline_initialisers_are_not() {
    let names = bound_functions();
    for needed in [
        "nvshmemx_hostlib_init_attr",
        "nvshmemx_hostlib_finalize",
        "nvshmemx_get_uniqueid",
        "nvshmemx_set_attr_uniqueid_args",
        "nvshmemx_cumodule_init",
        "nvshmemx_culibrary_init",
        "nvshmem_malloc",
        "nvshmem_ptr",
        "nvshmem_team_split_strided",
        "nvshmemx_putmem_signal_on_stream",
        "nvshmemx_bfloat16_sum_reduce_on_stream",
        "nvshmem_int_atomic_fetch_add",
    ] {
        assert!(names.contains(&needed), "{needed} is not bound");
    }
    // Static inline in the headers, and they exit the process on error.
    for inline in ["nvshmem_init", "nvshmemx_init_attr", "nvshmem_init_thread"] {
        assert!(!names.contains(&inline), "{inline} must not be bound");
    }
    // Device-only functions are declared in the headers but not exported.
    assert!(!names.contains(&"nvshmemx_float_sum_reduce_block"));
}

#[test]
fn the_linked_library_is_the_release_the_bindings_came_from() {
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // Needs no initialisation: it reports constants of the library.
    unsafe { nvshmem_sys::nvshmemx_vendor_get_version_info(&mut major, &mut minor, &mut patch) };
    assert_eq!(
        format!("{major}.{minor}.{patch}"),
        nvshmem_sys::BUILD_VERSION
    );
}

#[test]
fn init_attr_has_the_layout_the_library_expects() {
    // static_assert in nvshmem_types.h; the version word encodes this size.
    assert_eq!(
        std::mem::size_of::<nvshmem_sys::nvshmemx_init_attr_t>(),
        144
    );
    assert_eq!(std::mem::size_of::<nvshmem_sys::nvshmemx_uniqueid_t>(), 128);
}
