// Host code, linked into the crate: fills the parameter block of linear_bf16_sm90
// (gemm_sm90.cu) with CUTLASS's own to_underlying_arguments, which encodes the TMA
// descriptors and plans the persistent tile schedule. The crate launches the kernel itself.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstring>

#include "abi.h"

// CUTLASS encodes TMA descriptors through cuTensorMapEncodeTiled. It reaches it here through
// the driver entry point that the caller hands in (the crate loads the driver at run time, and
// must build and test on machines without one), and a failure is recorded instead of only
// printed. Both per thread: calls from several threads do not share them.
namespace {
thread_local PFN_cuTensorMapEncodeTiled_v12000 encode_entry = nullptr;
thread_local CUresult encode_failure = CUDA_SUCCESS;

CUresult encode_tiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *address,
                      const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                      const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                      CUtensorMapFloatOOBfill fill) {
    CUresult r = encode_entry(map, type, rank, address, dims, strides, box, element_strides,
                              interleave, swizzle, promotion, fill);
    if (r != CUDA_SUCCESS && encode_failure == CUDA_SUCCESS) encode_failure = r;
    return r;
}
}  // namespace

#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1
#define cuTensorMapEncodeTiled encode_tiled
#include "gemm_sm90.cuh"
#undef cuTensorMapEncodeTiled

using Kernel = nvshmem_rs::gemm_sm90::Kernel;
using nvshmem_rs::gemm_sm90::Bf16;

extern "C" size_t nvshmem_rs_gemm_sm90_params_size(void) noexcept {
    return sizeof(typename Kernel::Params);
}

// Writes the parameter block into params (params_size bytes, at least
// nvshmem_rs_gemm_sm90_params_size()) and the launch shape into launch. Touches no GPU:
// encoding a TMA descriptor only reads the addresses.
extern "C" int nvshmem_rs_gemm_sm90_prepare(const void *encode, const GemmProblem *problem,
                                            void *params, size_t params_size,
                                            GemmLaunch *launch) noexcept {
    using namespace cute;
    if (params_size < sizeof(typename Kernel::Params)) return GEMM_PARAMS_TOO_SMALL;
    encode_entry = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(const_cast<void *>(encode));
    encode_failure = CUDA_SUCCESS;
    const int m = int(problem->m), n = int(problem->n), k = int(problem->k);
    typename Kernel::StrideA stride_x{};
    get<0>(stride_x) = problem->k;
    typename Kernel::StrideB stride_w{};
    get<0>(stride_w) = problem->k;
    typename Kernel::StrideD stride_y{};
    get<0>(stride_y) = problem->ldy;
    cutlass::KernelHardwareInfo hw{};
    hw.sm_count = problem->sm_count;
    hw.max_active_clusters = problem->max_active_clusters;
    typename Kernel::TileSchedulerArguments schedule{};
    schedule.max_swizzle_size = problem->swizzle > 0 ? problem->swizzle : 1;
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
    schedule.raster_order = problem->raster == GEMM_RASTER_ALONG_M   ? Raster::AlongM
                            : problem->raster == GEMM_RASTER_ALONG_N ? Raster::AlongN
                                                                     : Raster::Heuristic;
    typename Kernel::MainloopArguments mainloop{};
    mainloop.ptr_A = reinterpret_cast<const Bf16 *>(problem->x);
    mainloop.dA = stride_x;
    mainloop.ptr_B = reinterpret_cast<const Bf16 *>(problem->w);
    mainloop.dB = stride_w;
    mainloop.wait = problem->wait;
    typename Kernel::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        mainloop,
        {{1.0f, 0.0f}, nullptr, stride_y, reinterpret_cast<Bf16 *>(problem->y), stride_y},
        hw,
        schedule};
    if (!Kernel::can_implement(args)) return GEMM_UNSUPPORTED;
    if (Kernel::get_workspace_size(args) != 0) return GEMM_NEEDS_WORKSPACE;
    const typename Kernel::Params p = Kernel::to_underlying_arguments(args, nullptr);
    if (encode_failure != CUDA_SUCCESS) {
        launch->encode_status = int(encode_failure);
        return GEMM_ENCODE_FAILED;
    }
    std::memcpy(params, &p, sizeof p);
    const dim3 grid = Kernel::get_grid_shape(p), block = Kernel::get_block_shape();
    launch->grid[0] = grid.x;
    launch->grid[1] = grid.y;
    launch->grid[2] = grid.z;
    launch->block[0] = block.x;
    launch->block[1] = block.y;
    launch->block[2] = block.z;
    launch->cluster[0] = size<0>(nvshmem_rs::gemm_sm90::ClusterShape{});
    launch->cluster[1] = size<1>(nvshmem_rs::gemm_sm90::ClusterShape{});
    launch->cluster[2] = size<2>(nvshmem_rs::gemm_sm90::ClusterShape{});
    launch->shared_mem_bytes = Kernel::SharedStorageSize;
    launch->encode_status = 0;
    return GEMM_OK;
}
