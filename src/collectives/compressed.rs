//! The compressed all-reduce: gradients cross the links in a smaller format, and are summed
//! in f32.
//!
//! A call is five steps on the stream, each after the last:
//! 1. every PE quantises its input (plus the error feedback, if any) into one shard per PE;
//! 2. an all-to-all brings each PE its shard of every PE's input;
//! 3. each PE dequantises those shards, sums them in f32 in PE order, and quantises the sum
//!    again (with a scale of its own per block);
//! 4. an all-gather brings every PE every quantised sum;
//! 5. every PE dequantises them into its output.
//!
//! So the values are never added in the quantised format, and every PE gets the same bits.
//! The two moves are our all-to-all and all-gather, on the quantised bytes: a call moves
//! about `2 (n - 1) / n` times the quantised input, as a two-shot all-reduce moves the plain
//! one. [`model`] computes the same bits on the CPU, with a bound on each element's error.

use super::agree::{Collective, Record};
use super::algo::{AllGatherAlgo, AllToAllAlgo};
use super::{Collectives, Planned};
use crate::element::{DataType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, SymmetricBuffer};
use crate::module::{grid, Function, KernelArgs, LaunchOptions, Module};
use cudarc::driver::CudaStream;
use half::{bf16, f16};
use std::fmt;
use std::sync::Arc;

/// How a compressed all-reduce carries values between PEs
/// ([`Collectives::all_reduce_compressed`]).
///
/// The scaled formats keep a float scale per block of `block` elements: the block's largest
/// magnitude over the format's largest value (127 for int8, 448 for fp8). A block holding
/// an infinity or a NaN has a NaN scale, so all its elements come out NaN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// IEEE half precision, rounded to nearest (values over 65504 become infinite).
    Fp16,
    /// bfloat16, rounded to nearest; for f32 inputs (a bf16 input would lose nothing).
    Bf16,
    /// Signed 8-bit integers in -127..=127, rounded to nearest, times the block's scale.
    Int8 {
        /// Elements per scale: a multiple of 4 from 4 to 65536.
        block: usize,
    },
    /// 8-bit floats with 4 exponent and 3 mantissa bits (E4M3, saturating), times the
    /// block's scale.
    Fp8E4M3 {
        /// Elements per scale: a multiple of 4 from 4 to 65536.
        block: usize,
    },
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::Fp16 => write!(f, "fp16"),
            Compression::Bf16 => write!(f, "bf16"),
            Compression::Int8 { block } => write!(f, "int8/{block}"),
            Compression::Fp8E4M3 { block } => write!(f, "fp8e4m3/{block}"),
        }
    }
}

/// The largest block of the scaled formats.
pub const MAX_BLOCK: usize = 1 << 16;

/// The unit of work of the unscaled formats (a warp's 32 x 4 elements).
const UNSCALED_BLOCK: usize = 128;

/// The formats in the kernels' order (`FORMATS[i]` names entry points).
const FORMATS: [&str; 4] = ["fp16", "bf16", "int8", "fp8"];

/// Where one PE's shard of a call sits in the quantised bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLayout {
    /// Elements per shard (PE `p` owns elements `p * shard_len ..`), a multiple of `block`.
    pub shard_len: usize,
    /// Bytes per shard: the scales, then the codes from `data_off`; a multiple of 256.
    pub shard_bytes: usize,
    /// Where the codes start in a shard (after the scales, on 16 bytes).
    pub data_off: usize,
    /// Elements per scale (the unit of work for the unscaled formats).
    pub block: usize,
}

impl Compression {
    /// The block of the scaled formats.
    fn scale_block(self) -> Option<usize> {
        match self {
            Compression::Int8 { block } | Compression::Fp8E4M3 { block } => Some(block),
            Compression::Fp16 | Compression::Bf16 => None,
        }
    }

    fn index(self) -> usize {
        match self {
            Compression::Fp16 => 0,
            Compression::Bf16 => 1,
            Compression::Int8 { .. } => 2,
            Compression::Fp8E4M3 { .. } => 3,
        }
    }

    /// Bytes per quantised element.
    fn code_bytes(self) -> usize {
        match self {
            Compression::Fp16 | Compression::Bf16 => 2,
            _ => 1,
        }
    }

    /// `Err` for a block the kernels do not take, or an input type this cannot compress.
    pub fn check(self, dtype: DataType) -> Result<()> {
        if let Some(block) = self.scale_block() {
            if block == 0 || !block.is_multiple_of(4) || block > MAX_BLOCK {
                return Err(Error::InvalidArgument(format!(
                    "Compression {self:?}: the block must be a multiple of 4 from 4 to \
                     {MAX_BLOCK} elements (128 is a common choice)"
                )));
            }
        }
        match (dtype, self) {
            (DataType::F32, _) => Ok(()),
            (DataType::BF16, Compression::Bf16) => Err(Error::InvalidArgument(
                "Compression::Bf16 of bf16 values compresses nothing: use all_reduce, or \
                 Fp16, Int8 or Fp8E4M3"
                    .into(),
            )),
            (DataType::BF16, _) => Ok(()),
            (t, _) => Err(Error::TypeMismatch {
                what: format!("the compressed all-reduce ({self})"),
                expected: "f32 or bf16",
                got: format!("{t:?}"),
            }),
        }
    }

    /// Where shards of a call of `len` elements on `n_pes` PEs sit.
    pub fn layout(self, len: usize, n_pes: usize) -> ShardLayout {
        let block = self.scale_block().unwrap_or(UNSCALED_BLOCK);
        let shard_len = len.div_ceil(n_pes.max(1)).div_ceil(block) * block;
        let data_off = match self.scale_block() {
            Some(_) => (shard_len / block * 4).div_ceil(16) * 16,
            None => 0,
        };
        ShardLayout {
            shard_len,
            shard_bytes: (data_off + shard_len * self.code_bytes()).div_ceil(256) * 256,
            data_off,
            block,
        }
    }

    /// The [`Workspace::compressed_bytes`](super::Workspace::compressed_bytes) a call of
    /// `len` elements on `n_pes` PEs needs: its quantised input, every shard.
    pub fn workspace_bytes(self, len: usize, n_pes: usize) -> usize {
        self.layout(len, n_pes).shard_bytes * n_pes
    }

    /// The length of a call's error feedback (f32): the input's quantisation error (`len`),
    /// then that of this PE's shard of the sum.
    pub fn feedback_len(self, len: usize, n_pes: usize) -> usize {
        len + self.layout(len, n_pes).shard_len
    }

    /// What identifies this compression in a call's record: the format's index, then the
    /// block in the low 32 bits.
    fn code(self) -> usize {
        (self.index() << 32) | self.scale_block().unwrap_or(0)
    }
}

/// The format a call record's row names (see `Compression::code`).
pub(super) fn format_of_row(row: usize) -> Option<&'static str> {
    FORMATS.get(row >> 32).copied()
}

/// The kernels of the compressed all-reduce, by input type (f32, bf16) and format.
pub(super) struct CompressKernels {
    quantize: Vec<Function>,
    reduce: Vec<Function>,
    expand: Vec<Function>,
}

/// The input types in the kernels' order.
const TYPES: [&str; 2] = ["f32", "bf16"];

/// The entry points of the compressed all-reduce.
pub(super) fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for f in FORMATS {
        for t in TYPES {
            names.push(format!("compress_quantize_{t}_{f}"));
            names.push(format!("compress_expand_{t}_{f}"));
        }
        names.push(format!("compress_reduce_{f}"));
    }
    names
}

impl CompressKernels {
    pub(super) fn load(module: &Module) -> Result<Self> {
        let each = |stem: &str, typed: bool| -> Result<Vec<Function>> {
            let mut out = Vec::new();
            for f in FORMATS {
                match typed {
                    true => {
                        for t in TYPES {
                            out.push(module.function(&format!("{stem}_{t}_{f}"))?);
                        }
                    }
                    false => out.push(module.function(&format!("{stem}_{f}"))?),
                }
            }
            Ok(out)
        };
        Ok(CompressKernels {
            quantize: each("compress_quantize", true)?,
            reduce: each("compress_reduce", false)?,
            expand: each("compress_expand", true)?,
        })
    }
}

/// The compressed all-reduce's scratch in symmetric memory: the quantised input (the
/// all-to-all's source, later the all-gather's output), the shards received, this PE's
/// quantised sum. `slot` bytes each for the first two.
pub(super) struct CompressScratch {
    buffer: SymmetricBuffer<u8>,
    slot: usize,
}

impl CompressScratch {
    /// For quantised inputs of up to `bytes` on `n_pes` PEs; `None` for none.
    pub(super) fn new(
        shmem: &crate::runtime::Nvshmem,
        bytes: usize,
        n_pes: usize,
    ) -> Result<Option<Self>> {
        if bytes == 0 {
            return Ok(None);
        }
        let slot = bytes.div_ceil(256) * 256;
        let buffer = shmem.malloc::<u8>(2 * slot + shard_room(bytes, n_pes))?;
        Ok(Some(CompressScratch { buffer, slot }))
    }
}

/// The bytes of the quantised sum's room for `bytes` of quantised input on `n_pes` PEs.
pub(super) fn shard_room(bytes: usize, n_pes: usize) -> usize {
    if bytes == 0 {
        return 0;
    }
    bytes.div_ceil(n_pes.max(1)).div_ceil(256) * 256
}

/// A call, checked on this PE.
struct Checked {
    record: Record,
    layout: ShardLayout,
    len: usize,
    /// The kernels' type index (f32, bf16).
    t: usize,
    src: u64,
    dst: u64,
    feedback: u64,
}

impl Collectives {
    /// `dst[i] = sum over PEs of src[i]` (plus the error feedback), with the values carried
    /// between PEs in `compression`'s format and summed in f32, for `f32` and `bf16` data;
    /// see [`Compression`] and the module [`compressed`](self) for the steps and the error.
    ///
    /// `src` and `dst` are any memory of this PE's GPU (symmetric or not), of the same
    /// length, and may be the same. With `feedback`
    /// ([`Compression::feedback_len`] f32 values, zeros before the first call), this call
    /// adds it to its input and leaves in it what this call's quantisations lost, to be
    /// added to the next call's: what one call rounds off, a later call carries over.
    ///
    /// The quantised bytes go through the workspace:
    /// [`Workspace::compressed_bytes`](super::Workspace::compressed_bytes) must be at least
    /// [`Compression::workspace_bytes`] of the call (0 by default). Every PE makes the same
    /// call (the same length, compression and whether it has feedback).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::collectives::{Collectives, CollectivesConfig, Compression};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let (len, int8) = (1 << 20, Compression::Int8 { block: 128 });
    /// let mut config = CollectivesConfig::for_pes(shmem.n_pes());
    /// config.workspace.compressed_bytes = int8.workspace_bytes(len, shmem.n_pes());
    /// let coll = Collectives::with_config(&shmem, config)?;
    /// let grads = shmem.alloc_device::<f32>(len)?;
    /// let mut carry = shmem.alloc_device::<f32>(int8.feedback_len(len, shmem.n_pes()))?;
    /// carry.copy_from_host(&vec![0.0; carry.len()])?;
    /// coll.all_reduce_compressed(&grads, &grads, int8, Some(&mut carry), shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_compressed<T: Element>(
        &self,
        dst: &impl DeviceMemory<T>,
        src: &impl DeviceMemory<T>,
        compression: Compression,
        feedback: Option<&mut dyn DeviceMemory<f32>>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let checked = self
            .check()
            .and_then(|()| self.ours_only(Collective::AllReduceCompressed))
            .and_then(|()| self.check_compressed(dst, src, compression, &feedback, stream));
        let (checked, planned) = match checked {
            Ok(c) => {
                let record = c.record;
                (Some(c), Ok(Planned::agree_only(record)))
            }
            Err(e) => (None, Err(e)),
        };
        self.agree_call(planned, stream)?;
        let c = checked.expect("a call that failed its checks was not agreed");
        if c.len == 0 {
            return Ok(());
        }
        let scratch = self
            .compress_scratch
            .as_ref()
            .expect("checked: the workspace has room");
        self.order
            .run(&self.shmem, stream, "a Collectives call", || {
                self.run_compressed(&c, compression, scratch, stream)
            })
    }

    fn check_compressed<T: Element>(
        &self,
        dst: &impl DeviceMemory<T>,
        src: &impl DeviceMemory<T>,
        compression: Compression,
        feedback: &Option<&mut dyn DeviceMemory<f32>>,
        stream: &Arc<CudaStream>,
    ) -> Result<Checked> {
        compression.check(T::DTYPE)?;
        let (len, n) = (src.device_len(), self.dims.n_pes);
        crate::memory::check_len("all_reduce_compressed destination", len, dst.device_len())?;
        let need = compression.workspace_bytes(len, n);
        let have = self.dims.compressed_bytes;
        if len > 0 && need > have {
            return Err(Error::InvalidArgument(format!(
                "a compressed all-reduce of {len} elements ({compression}, {n} PEs) needs \
                 {need} bytes of workspace, this Collectives has {have}: set \
                 CollectivesConfig::workspace.compressed_bytes to \
                 Compression::workspace_bytes of the largest call"
            )));
        }
        let feedback = match feedback {
            Some(f) => {
                crate::memory::check_len(
                    "all_reduce_compressed feedback (Compression::feedback_len)",
                    compression.feedback_len(len, n),
                    f.device_len(),
                )?;
                f.device_addr(stream)
            }
            None => 0,
        };
        let t = match T::DTYPE {
            DataType::F32 => 0,
            _ => 1,
        };
        let (src, dst) = (src.device_addr(stream), dst.device_addr(stream));
        Ok(Checked {
            record: Record::Call {
                collective: Collective::AllReduceCompressed,
                dtype: T::DTYPE,
                op: Some(ReduceOp::Sum),
                row: compression.code(),
                len,
                // The buffers need not be symmetric: nothing to agree on but whether the
                // call keeps feedback.
                dst: 0,
                src: i64::from(feedback != 0),
                root: None,
            },
            layout: compression.layout(len, n),
            len,
            t,
            src,
            dst,
            feedback,
        })
    }

    /// The five steps of a checked call, on `stream`.
    fn run_compressed(
        &self,
        c: &Checked,
        compression: Compression,
        scratch: &CompressScratch,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let n = self.dims.n_pes;
        let l = c.layout;
        let quantised = n * l.shard_bytes;
        let input = scratch.buffer.view(..quantised);
        let received = scratch.buffer.view(scratch.slot..scratch.slot + quantised);
        let sum = scratch
            .buffer
            .view(2 * scratch.slot..2 * scratch.slot + l.shard_bytes);
        let options = LaunchOptions {
            cooperative: false,
            programmatic: self.programmatic_launch,
            cluster: None,
        };
        let k = &self.compress;
        let f = compression.index();
        let warps = |blocks: usize| {
            let per_block = 256 / 32;
            let cap = self.dims.sm_count.max(1) * 8;
            (blocks.div_ceil(per_block).clamp(1, cap) as u32, 256)
        };
        let (shard_len, shard_bytes, data_off, block) =
            (l.shard_len, l.shard_bytes, l.data_off, l.block as u32);

        let mut args = KernelArgs::new();
        args.device_ptr(c.src)
            .device_ptr(c.feedback)
            .device_ptr(input.addr())
            .value(c.len)
            .value(shard_len)
            .value(shard_bytes)
            .value(data_off)
            .value(block)
            .value(n as i32);
        let (b, t) = warps(n * shard_len / l.block);
        // SAFETY: the parameters of compress_quantize; the input and feedback hold `len`
        // elements (checked), the scratch `n` shards.
        unsafe { k.quantize[2 * f + c.t].launch_with(grid(b, t), options, stream, &mut args)? };

        let to_owners = self.plan_all_to_all(&received, &input, AllToAllAlgo::Auto)?;
        self.launch(to_owners, stream)?;

        // This PE's shard holds elements `me * shard_len ..` of the input, fewer at the end.
        let me = self.members.me()?;
        let valid = c.len.saturating_sub(me * shard_len).min(shard_len);
        let shard_feedback = match c.feedback {
            0 => 0,
            f => f + 4 * c.len as u64,
        };
        let mut args = KernelArgs::new();
        args.device_ptr(received.addr())
            .device_ptr(sum.addr())
            .device_ptr(shard_feedback)
            .value(shard_len)
            .value(shard_bytes)
            .value(data_off)
            .value(block)
            .value(n as i32)
            .value(valid);
        let (b, t) = warps(shard_len / l.block);
        // SAFETY: the parameters of compress_reduce; `received` holds `n` shards, `sum` one,
        // the feedback `shard_len` floats after the input's.
        unsafe { k.reduce[f].launch_with(grid(b, t), options, stream, &mut args)? };

        let to_all = self.plan_all_gather(&input, &sum, AllGatherAlgo::Auto)?;
        self.launch(to_all, stream)?;

        let mut args = KernelArgs::new();
        args.device_ptr(input.addr())
            .device_ptr(c.dst)
            .value(c.len)
            .value(shard_len)
            .value(shard_bytes)
            .value(data_off)
            .value(block);
        let threads = 256u32;
        let blocks = c
            .len
            .div_ceil(4 * threads as usize)
            .clamp(1, self.dims.sm_count.max(1) * 8) as u32;
        // SAFETY: the parameters of compress_expand; the output holds `len` elements
        // (checked), `input` every PE's quantised sum.
        unsafe {
            k.expand[2 * f + c.t].launch_with(grid(blocks, threads), options, stream, &mut args)
        }
    }
}

/// What a compressed all-reduce computes, on the CPU ([`model`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Modelled {
    /// Every PE's output, in f32 (a bf16 output is this rounded to nearest).
    pub out: Vec<f32>,
    /// The exact sum of the inputs (plus the feedback), in f64.
    pub exact: Vec<f64>,
    /// A bound on `|out - exact|` per element, from the block scales (see [`model`]).
    pub bound: Vec<f64>,
}

/// The compressed all-reduce of `inputs` (one per PE, as f32) on the CPU, bit for bit as
/// the kernels compute it, with each PE's feedback (`feedback[p]`, of
/// [`Compression::feedback_len`], updated as the call updates it) if given.
///
/// The bound of element `i` adds up what each step can lose: each PE's quantisation of its
/// input value `v`, the owner's of the sum `w`, and the f32 additions (`n` of them, each
/// within 2^-24 of its partial sum). A quantisation of `v` with scale `s` loses at most
/// `s (1/2 + 2^-16) + 2^-23 |v|` in int8 (half a step, and the rounding of `v / s` and of
/// the product), `2^-4 |v| + 2^-10 s + 2^-22 |v|` in fp8 E4M3 (half a unit in the last
/// place of 3 mantissa bits, or of the subnormals' step), `2^-8 |v|` in bf16 and
/// `2^-11 |v| + 2^-25` in fp16. A bf16 output adds `2^-8 |out|`, which the caller adds.
/// An element of a block that holds a non-finite value has no bound (infinite).
pub fn model(
    compression: Compression,
    inputs: &[Vec<f32>],
    mut feedback: Option<&mut [Vec<f32>]>,
) -> Modelled {
    let n = inputs.len();
    let len = inputs.first().map_or(0, Vec::len);
    let l = compression.layout(len, n);
    let (total, blocks) = (n * l.shard_len, n * l.shard_len / l.block);
    // Step 1: every PE's quantised value (input plus feedback), its scale, and its decoding.
    let mut quantised = vec![vec![0f32; total]; n];
    let mut scale = vec![vec![0f32; blocks]; n];
    let mut decoded = vec![vec![0f32; total]; n];
    for p in 0..n {
        for i in 0..len {
            quantised[p][i] = match feedback.as_deref() {
                Some(fb) => inputs[p][i] + fb[p][i],
                None => inputs[p][i],
            };
        }
        for b in 0..blocks {
            let block = &quantised[p][b * l.block..(b + 1) * l.block];
            let s = scale_of(compression, block);
            scale[p][b] = s;
            for (k, &v) in block.iter().enumerate() {
                let d = decode(compression, encode(compression, v, s), s);
                let i = b * l.block + k;
                decoded[p][i] = d;
                if let (Some(fb), true) = (feedback.as_deref_mut(), i < len) {
                    fb[p][i] = v - d;
                }
            }
        }
    }
    let mut exact: Vec<f64> = (0..len)
        .map(|i| quantised.iter().map(|q| q[i] as f64).sum())
        .collect();
    // Steps 3 to 5: each owner's f32 sum in PE order (plus its feedback), quantised again.
    let mut out = vec![0f32; len];
    let mut bound = vec![0f64; len];
    for owner in 0..n {
        for b in 0..l.shard_len / l.block {
            let first = owner * l.shard_len + b * l.block;
            let sums: Vec<f32> = (first..first + l.block)
                .map(|i| {
                    let w = decoded.iter().fold(0f32, |w, d| w + d[i]);
                    match (feedback.as_deref(), i < len) {
                        (Some(fb), true) => w + fb[owner][len + i - owner * l.shard_len],
                        _ => w,
                    }
                })
                .collect();
            let s2 = scale_of(compression, &sums);
            for (i, &w) in (first..first + l.block).zip(&sums) {
                if i >= len {
                    continue;
                }
                let d = decode(compression, encode(compression, w, s2), s2);
                out[i] = d;
                if let Some(fb) = feedback.as_deref_mut() {
                    let j = len + i - owner * l.shard_len;
                    exact[i] += fb[owner][j] as f64;
                    fb[owner][j] = w - d;
                }
                let inputs_lost: f64 = (0..n)
                    .map(|p| lost(compression, quantised[p][i], scale[p][i / l.block]))
                    .sum();
                let magnitude: f64 = decoded.iter().map(|d| (d[i] as f64).abs()).sum();
                bound[i] = inputs_lost
                    + lost(compression, w, s2)
                    + n as f64 * 2f64.powi(-24) * (magnitude + (w as f64).abs());
            }
        }
    }
    Modelled { out, exact, bound }
}

/// A block's scale (as `scale_of` in kernels/collectives/compress.cuh).
fn scale_of(compression: Compression, block: &[f32]) -> f32 {
    let largest = match compression {
        Compression::Int8 { .. } => 127.0,
        Compression::Fp8E4M3 { .. } => 448.0,
        Compression::Fp16 | Compression::Bf16 => return 1.0,
    };
    // NaN once any value is NaN (as the kernels' max_or_nan).
    let amax = block.iter().fold(0f32, |m, v| {
        if v.abs() > m || v.is_nan() {
            v.abs()
        } else {
            m
        }
    });
    match amax.is_finite() {
        true => amax / largest,
        false => f32::NAN,
    }
}

/// `v` in the format, as the f32 value of its code (before the scale is applied back).
fn encode(compression: Compression, v: f32, s: f32) -> f32 {
    match compression {
        Compression::Fp16 => f16::from_f32(v).to_f32(),
        Compression::Bf16 => bf16::from_f32(v).to_f32(),
        _ if s == 0.0 => 0.0,
        Compression::Int8 { .. } => {
            let q = (v / s).round_ties_even();
            // A NaN (from a NaN scale) decodes to NaN whatever its code; an integer has no
            // -0 (adding +0 makes it +0).
            if q.is_nan() {
                0.0
            } else {
                q.clamp(-127.0, 127.0) + 0.0
            }
        }
        Compression::Fp8E4M3 { .. } => e4m3(v / s),
    }
}

fn decode(compression: Compression, code: f32, s: f32) -> f32 {
    match compression {
        Compression::Fp16 | Compression::Bf16 => code,
        _ => code * s,
    }
}

/// `x` rounded to nearest (ties to even) in FP8 E4M3, saturating at ±448 (NaN stays NaN).
fn e4m3(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    // The step in a's binade: 3 mantissa bits, and the subnormals' 2^-9 below 2^-6 (a is a
    // normal f32 there, so its exponent field is its binade).
    let step = if a < 2f32.powi(-6) {
        2f32.powi(-9)
    } else {
        2f32.powi(((a.to_bits() >> 23) & 0xff) as i32 - 127 - 3)
    };
    ((a / step).round_ties_even() * step).min(448.0).copysign(x)
}

/// The most a quantisation of `v` with scale `s` loses (see [`model`]).
fn lost(compression: Compression, v: f32, s: f32) -> f64 {
    let (v, s) = ((v as f64).abs(), s as f64);
    if !v.is_finite() || !s.is_finite() {
        return f64::INFINITY;
    }
    match compression {
        Compression::Fp16 => 2f64.powi(-11) * v + 2f64.powi(-25),
        Compression::Bf16 => 2f64.powi(-8) * v,
        Compression::Int8 { .. } => s * (0.5 + 2f64.powi(-16)) + 2f64.powi(-23) * v,
        Compression::Fp8E4M3 { .. } => 2f64.powi(-4) * v + 2f64.powi(-10) * s + 2f64.powi(-22) * v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splitmix(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn inputs(n: usize, len: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut s = seed;
        (0..n)
            .map(|_| (0..len).map(|_| splitmix(&mut s) * 3.0).collect())
            .collect()
    }

    const ALL: [Compression; 4] = [
        Compression::Fp16,
        Compression::Bf16,
        Compression::Int8 { block: 128 },
        Compression::Fp8E4M3 { block: 32 },
    ];

    #[test]
    fn every_element_is_within_its_bound() {
        for c in ALL {
            for (n, len) in [(1, 1), (2, 1001), (3, 4099), (4, 77), (8, 10_000)] {
                let m = model(c, &inputs(n, len, 7 + len as u64), None);
                for i in 0..len {
                    let err = (m.out[i] as f64 - m.exact[i]).abs();
                    assert!(err <= m.bound[i], "{c} n={n} i={i}: {err} > {}", m.bound[i]);
                }
            }
        }
    }

    #[test]
    fn the_bound_is_not_loose_by_orders_of_magnitude() {
        // The largest error seen must be a fair part of the bound, or the check proves little.
        for c in ALL {
            let m = model(c, &inputs(4, 50_000, 3), None);
            let ratio = (0..m.out.len())
                .map(|i| (m.out[i] as f64 - m.exact[i]).abs() / m.bound[i])
                .fold(0f64, f64::max);
            assert!(ratio > 0.05, "{c}: largest error / bound = {ratio}");
        }
    }

    #[test]
    fn feedback_carries_the_error_to_the_next_call() {
        // The same small input every call: without feedback the int8 rounding repeats each
        // time; with it, the total of the outputs stays within one call's bound of the total
        // of the inputs.
        let c = Compression::Int8 { block: 64 };
        let (n, len, calls) = (2, 256, 16);
        let x: Vec<Vec<f32>> = (0..n)
            .map(|p| {
                (0..len)
                    .map(|i| if i == 0 { 100.0 } else { 0.3 + p as f32 * 0.01 })
                    .collect()
            })
            .collect();
        let mut fb = vec![vec![0f32; c.feedback_len(len, n)]; n];
        let (mut with, mut without) = (vec![0f64; len], vec![0f64; len]);
        let mut last_bound = vec![0f64; len];
        for _ in 0..calls {
            let m = model(c, &x, Some(&mut fb));
            let plain = model(c, &x, None);
            for i in 0..len {
                with[i] += m.out[i] as f64;
                without[i] += plain.out[i] as f64;
            }
            last_bound = m.bound;
        }
        let truth = |i: usize| calls as f64 * x.iter().map(|v| v[i] as f64).sum::<f64>();
        let worst = |got: &[f64]| {
            (1..len)
                .map(|i| (got[i] - truth(i)).abs())
                .fold(0f64, f64::max)
        };
        assert!(
            worst(&with) <= 2.0 * last_bound[1],
            "{} > {}",
            worst(&with),
            last_bound[1]
        );
        assert!(
            worst(&without) > 4.0 * worst(&with),
            "{} vs {}",
            worst(&without),
            worst(&with)
        );
    }

    #[test]
    fn e4m3_rounds_to_its_grid() {
        assert_eq!(e4m3(448.0), 448.0);
        assert_eq!(e4m3(1000.0), 448.0);
        assert_eq!(e4m3(-1.0), -1.0);
        assert_eq!(e4m3(1.0625), 1.0); // a tie: to the even mantissa
        assert_eq!(e4m3(1.1875), 1.25); // a tie: to the even mantissa
        assert_eq!(e4m3(2f32.powi(-10)), 0.0); // half the smallest subnormal: to even (0)
        assert_eq!(e4m3(3.0 * 2f32.powi(-10)), 2.0 * 2f32.powi(-9));
        assert!(e4m3(f32::NAN).is_nan());
    }

    #[test]
    fn a_non_finite_value_spoils_its_block_only() {
        let c = Compression::Int8 { block: 8 };
        let mut x = inputs(2, 32, 1);
        x[1][3] = f32::INFINITY;
        let m = model(c, &x, None);
        assert!(m.out[..8].iter().all(|v| v.is_nan()));
        assert!(m.out[8..].iter().all(|v| v.is_finite()));
    }

    #[test]
    fn layouts_hold_whole_blocks_and_aligned_shards() {
        for c in ALL {
            for (len, n) in [(1, 1), (1001, 3), (1 << 20, 4), (5, 8)] {
                let l = c.layout(len, n);
                assert!(l.shard_len * n >= len && l.shard_len.is_multiple_of(l.block));
                assert!(l.shard_bytes.is_multiple_of(256) && l.data_off.is_multiple_of(16));
                assert!(l.data_off + l.shard_len * c.code_bytes() <= l.shard_bytes);
                assert_eq!(c.workspace_bytes(len, n), n * l.shard_bytes);
            }
        }
    }

    #[test]
    fn bad_blocks_and_types_are_refused() {
        for block in [0, 3, 6, MAX_BLOCK + 4] {
            assert!(Compression::Int8 { block }.check(DataType::F32).is_err());
        }
        assert!(Compression::Bf16.check(DataType::BF16).is_err());
        assert!(Compression::Fp16.check(DataType::I32).is_err());
        assert!(Compression::Fp8E4M3 { block: 128 }
            .check(DataType::BF16)
            .is_ok());
    }

    #[test]
    fn every_entry_point_is_named_once() {
        let names = kernel_names();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!((names.len(), unique.len()), (4 * 5, 20));
    }
}
