//! cudarc's memory where we take device memory, and ours where cudarc does: candle and burn
//! hold their tensors in cudarc's slices, and cudarc's launches, copies and cuBLAS calls take
//! anything that implements its `DevicePtr`/`DevicePtrMut`.

use super::{DeviceBuffer, DeviceMemory, SymmetricBuffer, SymmetricView};
use crate::element::Element;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use std::sync::Arc;

/// cudarc hands out an address with a guard: taking it makes `stream` wait for the slice's
/// pending writes, and dropping the guard notes a read on `stream`.
macro_rules! cudarc_memory {
    ($($ty:ty),*) => {$(
        // SAFETY: cudarc's slices and views are `len()` elements of device memory that live
        // while they are borrowed.
        unsafe impl<T: Element> DeviceMemory<T> for $ty {
            fn device_addr(&self, stream: &Arc<CudaStream>) -> u64 {
                let (addr, _read) = DevicePtr::device_ptr(self, stream);
                addr
            }
            fn device_len(&self) -> usize {
                DeviceSlice::len(self)
            }
        }
    )*};
}
cudarc_memory!(CudaSlice<T>, CudaView<'_, T>, CudaViewMut<'_, T>);

/// Our memory keeps no events: the address is all there is, and the guard does nothing.
/// Order the streams that use it as for our own calls (one stream, or `join`). Its stream,
/// for cudarc, is the runtime's ([`Nvshmem::stream`](crate::Nvshmem::stream)).
macro_rules! our_memory {
    ($($ty:ty),*) => {$(
        impl<T: Element> DeviceSlice<T> for $ty {
            fn len(&self) -> usize {
                DeviceMemory::device_len(self)
            }
            fn stream(&self) -> &Arc<CudaStream> {
                self.runtime().stream()
            }
        }

        impl<T: Element> DevicePtr<T> for $ty {
            fn device_ptr<'a>(&'a self, _: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
                (self.addr(), SyncOnDrop::Sync(None))
            }
        }

        impl<T: Element> DevicePtrMut<T> for $ty {
            fn device_ptr_mut<'a>(&'a mut self, _: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
                (self.addr(), SyncOnDrop::Sync(None))
            }
        }
    )*};
}
our_memory!(SymmetricBuffer<T>, SymmetricView<'_, T>, DeviceBuffer<T>);

#[cfg(test)]
mod tests {
    use super::*;

    /// Both traits are implemented for our memory, so a caller holding both sees one `len`.
    fn lengths<T: Element, M: DeviceMemory<T> + DeviceSlice<T>>(m: &M) -> (usize, usize) {
        (m.device_len(), DeviceSlice::len(m))
    }

    #[test]
    fn our_memory_satisfies_cudarcs_traits() {
        fn takes_cudarc_memory<T, M: DevicePtr<T> + DevicePtrMut<T>>() {}
        takes_cudarc_memory::<f32, SymmetricBuffer<f32>>();
        takes_cudarc_memory::<u64, SymmetricView<'_, u64>>();
        takes_cudarc_memory::<half::bf16, DeviceBuffer<half::bf16>>();
        let _ = lengths::<f32, SymmetricBuffer<f32>>;
    }
}
