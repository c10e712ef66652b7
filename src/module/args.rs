//! Kernel arguments: values copied in order, checked against the kernel's parameter layout
//! before a launch.

use crate::element::Element;
use crate::error::{Error, Result};
use crate::memory::{SymmetricBuffer, SymmetricView};
use std::ffi::c_void;
use std::marker::PhantomData;

/// Kernel arguments, in order. Each value is copied when added and kept until the launch;
/// buffers and views stay borrowed for as long as the arguments live.
///
/// ```
/// use nvshmem::module::KernelArgs;
/// let mut args = KernelArgs::new();
/// args.value(1024usize).value(0.5f32).value(7u64);
/// assert_eq!(args.sizes(), [8, 4, 8]);
/// ```
#[derive(Default)]
pub struct KernelArgs<'a> {
    /// Every value, each from a word boundary (one allocation for all of them).
    words: Vec<u64>,
    /// Where each value starts in `words`.
    starts: Vec<usize>,
    sizes: Vec<usize>,
    _borrows: PhantomData<&'a ()>,
}

impl<'a> KernelArgs<'a> {
    /// No arguments yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// No arguments yet, with room for `n` of up to 8 bytes without reallocating.
    pub fn with_capacity(n: usize) -> Self {
        KernelArgs {
            words: Vec::with_capacity(n),
            starts: Vec::with_capacity(n),
            sizes: Vec::with_capacity(n),
            _borrows: PhantomData,
        }
    }

    /// Append a plain value: an integer, a float, a device address, or a `#[repr(C)]` struct
    /// laid out as the kernel's parameter type.
    pub fn value<T: Copy + 'static>(&mut self, v: T) -> &mut Self {
        let size = std::mem::size_of::<T>();
        let start = self.words.len();
        // Zero-sized values still get a word to point at.
        self.words.resize(start + size.div_ceil(8).max(1), 0);
        // SAFETY: the words from `start` hold at least `size` bytes; unaligned writes need no
        // alignment.
        unsafe { std::ptr::write_unaligned(self.words.as_mut_ptr().add(start) as *mut T, v) };
        self.starts.push(start);
        self.sizes.push(size);
        self
    }

    /// Append the device address of this PE's copy of `buf` (a `T*` parameter).
    pub fn buffer<T: Element>(&mut self, buf: &'a SymmetricBuffer<T>) -> &mut Self {
        self.value(buf.as_ptr() as u64)
    }

    /// Append the device address of the first element of `view` (a `T*` parameter).
    pub fn view<T: Element>(&mut self, view: SymmetricView<'a, T>) -> &mut Self {
        self.value(view.as_ptr() as u64)
    }

    /// Append `buf`'s address and its number of elements (`T*, size_t` parameters).
    pub fn buffer_and_len<T: Element>(&mut self, buf: &'a SymmetricBuffer<T>) -> &mut Self {
        self.buffer(buf).value(buf.len())
    }

    /// Append a raw device address.
    pub fn device_ptr(&mut self, address: u64) -> &mut Self {
        self.value(address)
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// The size in bytes of each argument.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The address of each value, as the driver takes them; valid until `self` changes.
    pub(super) fn pointers(&mut self) -> Vec<*mut c_void> {
        let base = self.words.as_mut_ptr();
        self.starts
            .iter()
            // SAFETY: every start is inside `words`.
            .map(|&s| unsafe { base.add(s) } as *mut c_void)
            .collect()
    }
}

/// Check arguments against the kernel's parameter sizes (when the driver reports them): a
/// wrong count or size would make the driver read past an argument.
pub(super) fn check_args(kernel: &str, params: Option<&[usize]>, args: &[usize]) -> Result<()> {
    let Some(params) = params else { return Ok(()) };
    if params.len() != args.len() {
        return Err(Error::InvalidArgument(format!(
            "kernel {kernel} takes {} parameters, but {} arguments were given",
            params.len(),
            args.len()
        )));
    }
    if let Some(i) = (0..params.len()).find(|&i| params[i] != args[i]) {
        return Err(Error::InvalidArgument(format!(
            "argument {i} of kernel {kernel} is {} bytes, but the parameter is {} bytes (pass u64 or \
             usize for pointers and size_t, i32/u32 for int, f32 for float)",
            args[i], params[i]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_args_keep_values_in_order() {
        let mut a = KernelArgs::new();
        #[derive(Clone, Copy)]
        #[repr(C)]
        struct Big {
            x: [u32; 5],
        }
        a.value(7u32)
            .value(-1i64)
            .value(2.5f32)
            .value(Big { x: [1, 2, 3, 4, 5] });
        assert_eq!(a.len(), 4);
        assert_eq!(a.sizes(), [4, 8, 4, 20]);
        let p = a.pointers();
        unsafe {
            assert_eq!(*(p[0] as *const u32), 7);
            assert_eq!(*(p[1] as *const i64), -1);
            assert_eq!(*(p[2] as *const f32), 2.5);
            assert_eq!((*(p[3] as *const Big)).x, [1, 2, 3, 4, 5]);
        }
        // Zero-sized values still get a slot to point at.
        a.value(());
        assert_eq!(a.sizes()[4], 0);
        assert!(!a.pointers()[4].is_null());
        // Values added after pointers were taken do not disturb the earlier ones.
        let mut b = KernelArgs::with_capacity(1);
        for i in 0..100u64 {
            b.value(i);
        }
        let p = b.pointers();
        assert!((0..100).all(|i| unsafe { *(p[i] as *const u64) } == i as u64));
    }

    #[test]
    fn arguments_are_checked_against_the_parameter_layout() {
        assert!(check_args("k", None, &[4, 8]).is_ok());
        assert!(check_args("k", Some(&[8, 8, 4]), &[8, 8, 4]).is_ok());
        let e = check_args("k", Some(&[8, 8]), &[8])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("takes 2 parameters") && e.contains("1 arguments"),
            "{e}"
        );
        let e = check_args("k", Some(&[8, 8]), &[8, 4])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("argument 1") && e.contains("4 bytes") && e.contains("8 bytes"),
            "{e}"
        );
    }
}
