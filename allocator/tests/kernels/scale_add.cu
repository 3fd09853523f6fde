// The kernel of allocator/tests/pool_gpu.rs: y[i] = a * x[i] + b (u32, wrapping).
//
// Regenerate the PTX (committed next to this file, embedded with include_str!):
//   nvcc -ptx -arch=compute_75 allocator/tests/kernels/scale_add.cu -o allocator/tests/kernels/scale_add.ptx
extern "C" __global__ void scale_add_u32(const unsigned int* x, unsigned int* y, unsigned int a,
                                         unsigned int b, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + b;
    }
}
