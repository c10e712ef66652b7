//! The kernel pipeline with the real CUDA compiler and NVSHMEM, found the way build scripts
//! find them (`make setup` installs both into the checkout's .venv). No GPU is needed: the
//! cubins are only inspected.

mod common;

use common::{write, Scratch};
use nvshmem_build::{Cubin, Error, KernelBuilder, Probe, DEVICE_STATE_SYMBOL};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

/// A builder on the real toolchain, or `None` (with a note) when there is none here.
fn real_builder(tmp: &Scratch) -> Option<KernelBuilder> {
    let probe = Probe::from_env();
    let found = probe
        .find_cuda()
        .and_then(|cuda| Ok((cuda, probe.find_nvshmem()?)));
    let (cuda, nvshmem) = match found {
        Ok(t) => t,
        Err(e @ (Error::NvccNotFound { .. } | Error::NvshmemNotFound { .. })) => {
            eprintln!("note: skipped, no CUDA toolchain with NVSHMEM here (run `make setup`): {e}");
            return None;
        }
        Err(e) => panic!("the toolchain here is broken: {e}"),
    };
    let builder = KernelBuilder::new(cuda, nvshmem)
        .unwrap()
        .archs(["sm_90"])
        .unwrap()
        .out_dir(tmp.join("out"));
    Some(builder)
}

const GOOD: &str = r#"// Puts a block of ints to the next PE with a signal, then waits for our own.
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

extern "C" __global__ void probe_put(int *dst, const int *src, size_t n, uint64_t *sig) {
    const int peer = (nvshmem_my_pe() + 1) % nvshmem_n_pes();
    nvshmemx_int_put_signal_nbi_block(dst, src, n, sig, 1, NVSHMEM_SIGNAL_SET, peer);
    if (threadIdx.x == 0) {
        nvshmem_signal_wait_until(sig, NVSHMEM_CMP_EQ, 1);
    }
}
"#;

const BAD: &str = r#"#include <nvshmem.h>

extern "C" __global__ void broken(int *p) {
    p[threadIdx.x] = undeclared_thing;
}
"#;

#[test]
fn a_kernel_calling_nvshmem_links_into_a_cubin_with_the_device_state() {
    let tmp = Scratch::new("real-good");
    let Some(builder) = real_builder(&tmp) else {
        return;
    };
    let src = tmp.join("kernels/probe.cu");
    write(&src, GOOD);
    let built = builder
        .source(&src)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let linked = built
        .get("probe")
        .unwrap()
        .cubin("sm_90")
        .unwrap()
        .to_path_buf();
    let bytes = std::fs::read(&linked).unwrap();

    // Read with the `object` crate: an ELF file with the kernel as a defined function and
    // NVSHMEM's device state as defined data.
    let file = object::File::parse(&*bytes).unwrap();
    assert_eq!(file.format(), object::BinaryFormat::Elf);
    let kernel = file
        .symbols()
        .find(|s| s.name() == Ok("probe_put"))
        .expect("kernel symbol");
    assert_eq!(kernel.kind(), SymbolKind::Text);
    assert!(kernel.is_definition() && kernel.is_global());
    let section = file
        .section_by_index(kernel.section_index().unwrap())
        .unwrap();
    assert_eq!(section.name().unwrap(), ".text.probe_put");
    let state = file
        .symbols()
        .find(|s| s.name() == Ok(DEVICE_STATE_SYMBOL))
        .expect("NVSHMEM device state symbol");
    assert_eq!(state.kind(), SymbolKind::Data);
    assert!(
        !state.is_undefined(),
        "{DEVICE_STATE_SYMBOL} left undefined: nvlink did not link the device library"
    );

    // Our own reader agrees with `object` on every named symbol.
    let cubin = Cubin::parse(&bytes).unwrap();
    assert!(cubin.is_cuda());
    assert_eq!(cubin.entry_points().collect::<Vec<_>>(), ["probe_put"]);
    assert!(cubin.links_nvshmem());
    let mut ours: Vec<(String, bool)> = cubin
        .symbols()
        .iter()
        .filter(|s| !s.name.is_empty())
        .map(|s| (s.name.clone(), s.defined))
        .collect();
    let mut theirs: Vec<(String, bool)> = file
        .symbols()
        .filter_map(|s| Some((s.name().ok()?.to_string(), !s.is_undefined())))
        .filter(|(n, _)| !n.is_empty())
        .collect();
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs);

    // Before nvlink the state is only referenced.
    let object_file = std::fs::read(tmp.join("out/cubins/probe.sm_90.cubin")).unwrap();
    let unlinked = Cubin::parse(&object_file).unwrap();
    assert!(unlinked.needs(DEVICE_STATE_SYMBOL) && !unlinked.links_nvshmem());

    // The generated module embeds the linked cubin.
    let text = built.rust_module();
    assert!(
        text.contains("pub const PROBE: ::nvshmem::module::CubinSet"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "include_bytes!({:?})",
            linked.display().to_string()
        )),
        "{text}"
    );
    assert!(text.contains("capability: 90"), "{text}");
}

#[test]
fn a_compile_error_names_the_file_and_line() {
    let tmp = Scratch::new("real-bad");
    let Some(builder) = real_builder(&tmp) else {
        return;
    };
    let src = tmp.join("kernels/bad_kernel.cu");
    write(&src, BAD);
    let e = builder.source(&src).build().unwrap_err();
    let Error::Compile { what, output, .. } = &e else {
        panic!("expected Error::Compile, got {e:?}");
    };
    assert!(what.contains("bad_kernel.cu"), "{what}");
    // nvcc reports `path/bad_kernel.cu(4): error: identifier "undeclared_thing" is undefined`.
    assert!(output.contains("bad_kernel.cu(4)"), "{output}");
    assert!(output.contains("undeclared_thing"), "{output}");
    let text = e.to_string();
    assert!(text.contains("bad_kernel.cu(4)"), "{text}");
}
