// The host API's remote atomics (src/atomic.rs), performed by NVSHMEM's device-side atomics.
//
// NVSHMEM 3.4's host-initiated atomics do not act on peers reached over P2P (NVLink, PCIe):
// they return 0 and leave the target unchanged. The device-side atomics work over every
// transport, so the host launches host_amo (one block of one thread) and reads the fetched
// value back from `result`.
//
// Signed and unsigned integers and floats of one width are handled as the unsigned integer of
// that width: every operation here (fetch, set, swap, compare-and-swap, two's-complement add
// and increment, and, or, xor) gives the same bits for them, and NVSHMEM's device library has
// no int64 fetch_add/add/fetch_inc/inc.
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

#include "abi.h"  // the operation codes (AmoOp) and type tags (TypeTag)

// One operation on an unsigned integer of one width; false for an unknown operation.
#define AMO_FETCHES(CODE, CALL) \
    case CODE: *fetched = CALL; return true;
#define AMO_UPDATES(CODE, CALL) \
    case CODE: CALL; return true;
#define AMO_UNSIGNED(T, NAME)                                                                 \
    __device__ static bool amo_##NAME(int op, T *dest, T value, T cond, int pe, T *fetched) { \
        switch (op) {                                                                         \
            AMO_FETCHES(AMO_FETCH, nvshmem_##NAME##_atomic_fetch(dest, pe))                   \
            AMO_UPDATES(AMO_SET, nvshmem_##NAME##_atomic_set(dest, value, pe))                \
            AMO_FETCHES(AMO_SWAP, nvshmem_##NAME##_atomic_swap(dest, value, pe))              \
            AMO_FETCHES(AMO_COMPARE_SWAP, nvshmem_##NAME##_atomic_compare_swap(dest, cond, value, pe)) \
            AMO_FETCHES(AMO_FETCH_ADD, nvshmem_##NAME##_atomic_fetch_add(dest, value, pe))    \
            AMO_UPDATES(AMO_ADD, nvshmem_##NAME##_atomic_add(dest, value, pe))                \
            AMO_FETCHES(AMO_FETCH_INC, nvshmem_##NAME##_atomic_fetch_inc(dest, pe))           \
            AMO_UPDATES(AMO_INC, nvshmem_##NAME##_atomic_inc(dest, pe))                       \
            AMO_FETCHES(AMO_FETCH_AND, nvshmem_##NAME##_atomic_fetch_and(dest, value, pe))    \
            AMO_FETCHES(AMO_FETCH_OR, nvshmem_##NAME##_atomic_fetch_or(dest, value, pe))      \
            AMO_FETCHES(AMO_FETCH_XOR, nvshmem_##NAME##_atomic_fetch_xor(dest, value, pe))    \
        default:                                                                              \
            return false;                                                                     \
        }                                                                                     \
    }

AMO_UNSIGNED(uint32_t, uint32)
AMO_UNSIGNED(uint64_t, uint64)

// Floats have fetch, set and swap only.
__device__ static bool is_float_op(int op) {
    return op == AMO_FETCH || op == AMO_SET || op == AMO_SWAP;
}

// Perform operation `op` on the element of type `type` at symmetric address `dest` on PE `pe`.
// `value_bits` and `cond_bits` hold the operands' bits in their low bytes. Writes the fetched
// value's bits (zero-extended; 0 for operations that fetch nothing) to result[0], and
// `token` to result[1] once the operation is complete (0 if the operation or type code is
// unknown), so that the host can tell that this launch ran and succeeded.
extern "C" __global__ void host_amo(int op, int type, void *dest, uint64_t value_bits,
                                    uint64_t cond_bits, int pe, uint64_t token,
                                    uint64_t *result) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int width = 0;
    bool is_float = false;
    switch (type) {
    case TYPE_I32:
    case TYPE_U32:
        width = 4;
        break;
    case TYPE_F32:
        width = 4;
        is_float = true;
        break;
    case TYPE_I64:
    case TYPE_U64:
        width = 8;
        break;
    case TYPE_F64:
        width = 8;
        is_float = true;
        break;
    default:
        break;
    }
    bool ok = false;
    uint64_t fetched = 0;
    if (is_float && !is_float_op(op)) {
        ok = false;
    } else if (width == 4) {
        uint32_t out = 0;
        ok = amo_uint32(op, (uint32_t *)dest, (uint32_t)value_bits, (uint32_t)cond_bits, pe,
                        &out);
        fetched = out;
    } else if (width == 8) {
        uint64_t out = 0;
        ok = amo_uint64(op, (uint64_t *)dest, value_bits, cond_bits, pe, &out);
        fetched = out;
    }
    // Non-fetching operations to a remote PE over a proxied transport complete only at quiet.
    if (ok) nvshmem_quiet();
    result[0] = fetched;
    result[1] = ok ? token : 0;
}
