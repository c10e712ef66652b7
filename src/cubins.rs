//! The linked cubins of this crate's own kernels, compiled from `kernels/*.cu` by `build.rs`
//! and embedded: [`COLLECTIVES`] (our collectives) and [`ATOMICS`] (the host atomics'
//! helper). Load them with [`Module::load`](crate::module::Module::load).

include!(concat!(env!("OUT_DIR"), "/cubins.rs"));
