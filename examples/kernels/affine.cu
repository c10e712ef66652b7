// A plain CUDA kernel with no NVSHMEM in it, as a program that already uses cudarc has many:
// examples/cudarc_interop.rs loads it and launches it through cudarc.
#include <stdint.h>

// x[i] = a * x[i] + b for i < n.
extern "C" __global__ void affine(float *x, float a, float b, uint64_t n) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        x[i] = a * x[i] + b;
}
