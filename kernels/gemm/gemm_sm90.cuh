// Our Hopper GEMM, y = x · wᵀ in bf16 with f32 accumulation: CUTLASS 3's TMA warp-specialised
// cooperative kernel (a producer warp group loads tiles by TMA, two consumer warp groups run
// WGMMA on them), persistent over the output tiles. One definition, read by the kernel
// (gemm_sm90.cu, built for sm_90a) and by the host code that prepares its parameters
// (gemm_sm90_params.cu), so both agree on the parameter block.
//
// In CUTLASS's terms: M = tokens, N = output features, K = input features; A = x (row-major,
// K-major), B = w (n × k row-major, so K-major: CUTLASS's ColumnMajor B), D = y (row-major,
// rows ldy apart), no C operand.
#pragma once

#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "abi.h"

namespace nvshmem_rs::gemm_sm90 {

using cute::Int;
using Bf16 = cutlass::bfloat16_t;
// Elements per 16-byte access: TMA needs every row to start on 16 bytes.
constexpr int kAlignment = 8;

// 128 × 256 tiles, 64 deep, with clusters of two along M sharing B's tiles by TMA multicast:
// the shape that measured fastest on the Llama MLP shards (tp_mlp --test gemm).
using TileShape = cute::Shape<Int<128>, Int<256>, Int<64>>;
using ClusterShape = cute::Shape<Int<2>, Int<1>, Int<1>>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor,
    kAlignment, Bf16, cutlass::layout::RowMajor, kAlignment,
    cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

using BaseMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, cutlass::layout::RowMajor, kAlignment,
    Bf16, cutlass::layout::ColumnMajor, kAlignment, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

// CUTLASS's mainloop, whose producer first waits for the rows of x that are still arriving
// (GemmWait, abi.h): the all-gather + GEMM starts on the local rows while the copy engines
// bring the others, and each tile starts as soon as its rows have landed. A plain GEMM
// (ready == 0) only tests one pointer per tile.
// A template on its base, as CUTLASS's own types are: nvcc's host pass spells a plain
// class's base out in full, which the host compiler cannot parse.
template <class BaseMainloop>
struct WaitingMainloop : BaseMainloop {
    using TileShape = typename BaseMainloop::TileShape;
    struct Arguments : BaseMainloop::Arguments {
        GemmWait wait;
    };
    struct Params : BaseMainloop::Params {
        GemmWait wait;
    };

    template <class ProblemShape>
    static Params to_underlying_arguments(ProblemShape const &problem, Arguments const &args, void *workspace) {
        Params p;
        static_cast<typename BaseMainloop::Params &>(p) = BaseMainloop::to_underlying_arguments(
            problem, static_cast<typename BaseMainloop::Arguments const &>(args), workspace);
        p.wait = args.wait;
        return p;
    }

    // Every lane of the producer warp polls (the one CUTLASS elects issues the loads), then
    // orders what it saw before the TMA loads that follow: the rows were written by other
    // agents (copy engines, peers) through the generic proxy, and TMA reads through the
    // async proxy.
    CUTLASS_DEVICE static void wait_for_rows(GemmWait const &w, int m_tile) {
        if (w.ready == 0) return;
        const long long first = w.row_offset + (long long)m_tile * cute::size<0>(TileShape{});
        long long c = first / w.rows_per_chunk;
        long long last = (first + cute::size<0>(TileShape{}) - 1) / w.rows_per_chunk;
        if (last > w.chunks - 1) last = w.chunks - 1;
        const unsigned long long want = w.want;
        const unsigned long long *ready = reinterpret_cast<const unsigned long long *>(w.ready);
        for (; c <= last; c++) {
            if (c == w.own_chunk) continue;
            unsigned long long seen;
            do {
                asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(ready + c) : "memory");
            } while (seen < want);
        }
        asm volatile("fence.proxy.async.global;" ::: "memory");
        __syncwarp();
    }

    template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
    CUTLASS_DEVICE void load(Params const &params, typename BaseMainloop::MainloopPipeline pipeline,
                             typename BaseMainloop::PipelineState smem_pipe_write,
                             cute::tuple<TensorA, TensorB> const &load_inputs, BlockCoord const &blk_coord,
                             KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                             uint32_t block_rank_in_cluster, typename BaseMainloop::TensorStorage &shared_tensors) {
        wait_for_rows(params.wait, int(cute::get<0>(blk_coord)));
        BaseMainloop::template load(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, k_tile_count,
                           thread_idx, block_rank_in_cluster, shared_tensors);
    }
};

using Kernel =
    cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, WaitingMainloop<BaseMainloop>, Epilogue>;

}  // namespace nvshmem_rs::gemm_sm90
