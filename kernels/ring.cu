// Ring put: every PE writes its block of data into the next PE's buffer, then signals it.
// The smallest kernel that exercises the pipeline end to end (nvcc -rdc, nvlink with
// libnvshmem_device.a, nvshmemx_cumodule_init, a launch from Rust).
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

extern "C" __global__ void ring_put_i32(int32_t *dst, const int32_t *src, size_t n, uint64_t *flag) {
    const int me = nvshmem_my_pe();
    const int peer = (me + 1) % nvshmem_n_pes();
    if (blockIdx.x == 0) {
        // Block-wide put, then one thread sets the flag on the peer after the data lands.
        nvshmemx_int32_put_signal_block(dst, src, n, flag, 1, NVSHMEM_SIGNAL_SET, peer);
        if (threadIdx.x == 0) {
            nvshmem_signal_wait_until(flag, NVSHMEM_CMP_EQ, 1);
        }
    }
}
