// Hopper (sm_90) bulk-tensor round trip: loads one box of a view through a TMA tensor map into
// shared memory with cp.async.bulk.tensor, adds 1 to every byte, and stores the box back with
// cp.async.bulk.tensor. Encoding the tensor map (cuTensorMapEncodeTiled) already demands a
// 16-byte aligned global address; the round trip proves the copy engine accepts the view.
// Compiled for sm_90 only (kernels/build-ptx.sh); the host skips it on older GPUs.
#include <cuda.h>

#define BOX_MAX 256

extern "C" __global__ void tma_roundtrip(const __grid_constant__ CUtensorMap tmap,
                                         unsigned int box_bytes,
                                         unsigned int x0) {
    __shared__ alignas(128) unsigned char smem[BOX_MAX];
    __shared__ alignas(8) unsigned long long mbar;
    unsigned int smem_addr = (unsigned int)__cvta_generic_to_shared(smem);
    unsigned int mbar_addr = (unsigned int)__cvta_generic_to_shared(&mbar);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(mbar_addr) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(mbar_addr), "r"(box_bytes) : "memory");
        asm volatile(
            "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2}], [%3];"
            :: "r"(smem_addr), "l"(&tmap), "r"(x0), "r"(mbar_addr) : "memory");
    }
    // Wait for phase 0 of the barrier: the box has landed in shared memory.
    unsigned int done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
            : "=r"(done) : "r"(mbar_addr) : "memory");
    }
    for (unsigned int k = threadIdx.x; k < box_bytes; k += blockDim.x) smem[k] += 1;
    // Make the generic-proxy writes to shared memory visible to the async (TMA) proxy.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.tile.bulk_group [%0, {%1}], [%2];"
                     :: "l"(&tmap), "r"(x0), "r"(smem_addr) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
}
