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
    /// Every value, each from a word boundary.
    words: Small<u64, INLINE_WORDS>,
    /// Where each value starts in `words`.
    starts: Small<usize, INLINE_ARGS>,
    sizes: Small<usize, INLINE_ARGS>,
    _borrows: PhantomData<&'a ()>,
}

/// Words and arguments kept without allocating: a launch of our collectives (8 arguments, a
/// 136-byte table among them) builds its arguments on the stack, as it did before every
/// launch went through `KernelArgs`.
const INLINE_WORDS: usize = 32;
const INLINE_ARGS: usize = 16;

/// A vector of up to `N` elements in place, on the heap beyond.
#[derive(Clone)]
struct Small<T: Copy + Default, const N: usize> {
    inline: [T; N],
    len: usize,
    /// Everything, once more than `N` (then never empty).
    heap: Vec<T>,
}

impl<T: Copy + Default, const N: usize> Default for Small<T, N> {
    fn default() -> Self {
        Small {
            inline: [T::default(); N],
            len: 0,
            heap: Vec::new(),
        }
    }
}

impl<T: Copy + Default, const N: usize> Small<T, N> {
    fn len(&self) -> usize {
        self.len
    }

    /// Grow to `len` elements, the new ones `T::default()`.
    fn resize(&mut self, len: usize) {
        if self.heap.is_empty() && len <= N {
            self.inline[self.len..len.max(self.len)].fill(T::default());
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.inline[..self.len]);
            }
            self.heap.resize(len, T::default());
        }
        self.len = len;
    }

    fn push(&mut self, v: T) {
        let at = self.len;
        self.resize(at + 1);
        self.as_mut_slice()[at] = v;
    }

    fn as_slice(&self) -> &[T] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        if self.heap.is_empty() {
            &mut self.inline[..self.len]
        } else {
            &mut self.heap
        }
    }
}

impl<'a> KernelArgs<'a> {
    /// No arguments yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a plain value: an integer, a float, a device address, or a `#[repr(C)]` struct
    /// laid out as the kernel's parameter type.
    pub fn value<T: Copy + 'static>(&mut self, v: T) -> &mut Self {
        let size = std::mem::size_of::<T>();
        let start = self.words.len();
        // Zero-sized values still get a word to point at.
        self.words.resize(start + size.div_ceil(8).max(1));
        let words = &mut self.words.as_mut_slice()[start..];
        // SAFETY: the words from `start` hold at least `size` bytes; unaligned writes need no
        // alignment.
        unsafe { std::ptr::write_unaligned(words.as_mut_ptr() as *mut T, v) };
        self.starts.push(start);
        self.sizes.push(size);
        self
    }

    /// Append a parameter given as its bytes: a parameter block whose layout C++ host code
    /// defines (the `Params` of a CUTLASS kernel). Checked against the kernel's parameter
    /// size like every argument.
    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        let start = self.words.len();
        self.words.resize(start + bytes.len().div_ceil(8).max(1));
        let words = &mut self.words.as_mut_slice()[start..];
        // SAFETY: the words from `start` hold at least `bytes.len()` bytes, and do not overlap
        // `bytes`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                words.as_mut_ptr() as *mut u8,
                bytes.len(),
            )
        };
        self.starts.push(start);
        self.sizes.push(bytes.len());
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
        self.sizes.len() == 0
    }

    /// The size in bytes of each argument.
    pub fn sizes(&self) -> &[usize] {
        self.sizes.as_slice()
    }

    /// Call `f` with the address of each value, as the driver takes them.
    pub(super) fn with_pointers<R>(&mut self, f: impl FnOnce(&mut [*mut c_void]) -> R) -> R {
        let mut pointers = [std::ptr::null_mut::<c_void>(); INLINE_ARGS];
        let mut spilled = Vec::new();
        let all: &mut [*mut c_void] = if self.len() <= INLINE_ARGS {
            &mut pointers[..self.len()]
        } else {
            spilled.resize(self.len(), std::ptr::null_mut());
            &mut spilled
        };
        let base = self.words.as_mut_slice().as_mut_ptr();
        for (p, &start) in all.iter_mut().zip(self.starts.as_slice()) {
            // SAFETY: every start is inside `words`.
            *p = unsafe { base.add(start) } as *mut c_void;
        }
        f(all)
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
        a.with_pointers(|p| unsafe {
            assert_eq!(*(p[0] as *const u32), 7);
            assert_eq!(*(p[1] as *const i64), -1);
            assert_eq!(*(p[2] as *const f32), 2.5);
            assert_eq!((*(p[3] as *const Big)).x, [1, 2, 3, 4, 5]);
        });
        // Zero-sized values still get a slot to point at.
        a.value(());
        assert_eq!(a.sizes()[4], 0);
        // A parameter block given as bytes keeps them, whatever its length.
        let block: Vec<u8> = (0..=200u8).collect();
        a.bytes(&block).value(9u16);
        assert_eq!(&a.sizes()[5..], [201, 2]);
        a.with_pointers(|p| unsafe {
            assert_eq!(
                std::slice::from_raw_parts(p[5] as *const u8, 201),
                &block[..]
            );
            assert_eq!(*(p[6] as *const u16), 9);
        });
        assert!(a.with_pointers(|p| !p[4].is_null()));
        // Beyond what fits in place (words and arguments), the values move to the heap
        // intact, and every pointer still reads its value.
        let mut b = KernelArgs::new();
        for i in 0..100u64 {
            b.value(i).value([i as u32; 9]);
        }
        assert_eq!(b.len(), 200);
        b.with_pointers(|p| {
            assert_eq!(p.len(), 200);
            for i in 0..100 {
                assert_eq!(unsafe { *(p[2 * i] as *const u64) }, i as u64);
                assert_eq!(unsafe { *(p[2 * i + 1] as *const [u32; 9]) }, [i as u32; 9]);
            }
        });
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
