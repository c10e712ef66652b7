// The kernel of gemm_sm90.cuh under a C name, so that the crate loads it from the cubin and
// launches it like every other kernel. Its one parameter is the block that
// nvshmem_rs_gemm_sm90_prepare (gemm_sm90_params.cu) writes. This is what CUTLASS's
// device_kernel template does; an explicit instantiation of that template is refused by nvcc
// (its __grid_constant__ parameter), and its name would be mangled.
#include "gemm_sm90.cuh"

using Kernel = nvshmem_rs::gemm_sm90::Kernel;

extern "C" __global__ void __launch_bounds__(Kernel::MaxThreadsPerBlock,
                                             Kernel::MinBlocksPerMultiprocessor)
    linear_bf16_sm90(const __grid_constant__ typename Kernel::Params params) {
    extern __shared__ char shared_storage[];
    Kernel op;
    op(params, shared_storage);
}
