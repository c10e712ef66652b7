// The pipeline test's element-wise kernels (used by bench/src/pipeline/): its MLP stages'
// GEMMs are cuBLASLt's; these fill the weights and inputs and take the ReLU's backward.
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace

// out[i] uniform in [-scale, scale) from a hash of (key, i): the same values on every PE and
// every run for one key, so that each PE can rebuild any stage's weights for its reference.
extern "C" __global__ void pipeline_fill_bf16(__nv_bfloat16 *out, uint64_t n, uint64_t key,
                                              float scale) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t z = mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull);
        float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        out[i] = __float2bfloat16(scale * (2.0f * u - 1.0f));
    }
}

// The ReLU's backward in place: g[i] stays where the forward's output a[i] = relu(h[i]) is
// positive and becomes 0 elsewhere (the gradient at h = 0 is taken as 0).
extern "C" __global__ void pipeline_relu_backward_bf16(__nv_bfloat16 *g,
                                                       const __nv_bfloat16 *a, uint64_t n) {
    const __nv_bfloat16 zero = __float2bfloat16(0.0f);
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        if (!(__bfloat162float(a[i]) > 0.0f)) g[i] = zero;
    }
}
