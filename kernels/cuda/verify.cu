// Verification kernels of devarena: they prove on hardware that every view of an arena keeps its
// alignment promise and that no two views overlap. Compiled to PTX by kernels/build-ptx.sh; the
// PTX is committed and embedded, so building the crate needs no CUDA toolkit.
//
// Every field is described by three arrays of the same length n: its device address, the
// alignment it promises and its size in bytes.

// Per field: records address % align, then performs the widest global access the promise
// permits (16-byte v4 for alignments >= 16, capped by the field's size), as a load followed by a
// store of the same value. A misaligned address makes the hardware fail the launch with
// CUDA_ERROR_MISALIGNED_ADDRESS. The explicit PTX keeps the compiler from splitting the access.
// The host runs verify_fill over each field's first min(size, 16) bytes just before this kernel
// (Verifier::alignment), so the load reads bytes that were written: compute-sanitizer's
// initcheck sees no read of uninitialised memory.
extern "C" __global__ void verify_alignment(const unsigned long long* ptrs,
                                            const unsigned long long* aligns,
                                            const unsigned long long* sizes,
                                            unsigned long long* residues,
                                            unsigned int* widths,
                                            unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long p = ptrs[i];
    unsigned long long a = aligns[i];
    unsigned long long size = sizes[i];
    residues[i] = p & (a - 1);
    unsigned int w = 16;
    while (w > 1 && (w > a || w > size)) w >>= 1;
    if (size == 0) w = 0;
    switch (w) {
    case 16: {
        unsigned int x, y, z, t;
        asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(x), "=r"(y), "=r"(z), "=r"(t) : "l"(p) : "memory");
        asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
                     :: "l"(p), "r"(x), "r"(y), "r"(z), "r"(t) : "memory");
        break;
    }
    case 8: {
        unsigned int x, y;
        asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(x), "=r"(y) : "l"(p) : "memory");
        asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(x), "r"(y) : "memory");
        break;
    }
    case 4: {
        unsigned int x;
        asm volatile("ld.global.u32 %0, [%1];" : "=r"(x) : "l"(p) : "memory");
        asm volatile("st.global.u32 [%0], %1;" :: "l"(p), "r"(x) : "memory");
        break;
    }
    case 2: {
        unsigned short x;
        asm volatile("ld.global.u16 %0, [%1];" : "=h"(x) : "l"(p) : "memory");
        asm volatile("st.global.u16 [%0], %1;" :: "l"(p), "h"(x) : "memory");
        break;
    }
    case 1: {
        unsigned short x;
        asm volatile("ld.global.u8 %0, [%1];" : "=h"(x) : "l"(p) : "memory");
        asm volatile("st.global.u8 [%0], %1;" :: "l"(p), "h"(x) : "memory");
        break;
    }
    default:
        break;
    }
    widths[i] = w;
}

// The byte a field's tag puts at offset j of field i: differs between fields at almost every
// byte, so an overlap or a stray write shows up as mismatches.
__device__ __forceinline__ unsigned char tag_byte(unsigned int i, unsigned long long j) {
    unsigned int h = (i + 1u) * 2654435761u;
    h ^= (unsigned int)(j * 0x9E3779B1ull) + (h >> 15);
    return (unsigned char)(h ^ (h >> 8) ^ (h >> 16) ^ (h >> 24));
}

// Fills every field entirely with its own tag, all fields at once: blockIdx.y picks the field,
// the x dimension strides over its bytes.
extern "C" __global__ void verify_fill(const unsigned long long* ptrs,
                                       const unsigned long long* sizes,
                                       unsigned int n) {
    for (unsigned int i = blockIdx.y; i < n; i += gridDim.y) {
        unsigned char* p = (unsigned char*)ptrs[i];
        unsigned long long size = sizes[i];
        for (unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
             j < size; j += (unsigned long long)gridDim.x * blockDim.x) {
            p[j] = tag_byte(i, j);
        }
    }
}

// Counts, per field, the bytes that no longer hold the field's tag.
extern "C" __global__ void verify_check(const unsigned long long* ptrs,
                                        const unsigned long long* sizes,
                                        unsigned long long* mismatches,
                                        unsigned int n) {
    for (unsigned int i = blockIdx.y; i < n; i += gridDim.y) {
        const unsigned char* p = (const unsigned char*)ptrs[i];
        unsigned long long size = sizes[i];
        unsigned long long bad = 0;
        for (unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
             j < size; j += (unsigned long long)gridDim.x * blockDim.x) {
            bad += (p[j] != tag_byte(i, j));
        }
        if (bad) atomicAdd(&mismatches[i], bad);
    }
}
