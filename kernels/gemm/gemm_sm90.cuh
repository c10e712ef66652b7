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

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, cutlass::layout::RowMajor, kAlignment,
    Bf16, cutlass::layout::ColumnMajor, kAlignment, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel =
    cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;

}  // namespace nvshmem_rs::gemm_sm90
