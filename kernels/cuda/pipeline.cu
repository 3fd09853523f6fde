// Image pipeline stages for devarena-kernels: the device twins of kernels/src/pipeline/host.rs.
//
// Build: kernels/build-ptx.sh (nvcc -ptx -arch=compute_75 -fmad=false ...), which writes
// kernels/ptx/pipeline.ptx; the crate embeds that file, so building the crate needs no CUDA.
//
// Bit-exactness with the host: every floating-point operation is a single IEEE-754
// round-to-nearest operation (__fadd_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn and their double
// twins), which nvcc never contracts into a fused multiply-add, applied in the order the host
// code uses. The build also passes -fmad=false, -prec-div=true, -prec-sqrt=true and -ftz=false
// so nothing else in this file can be approximated. Integer stages are exact by construction.
//
// Launch shapes (the Rust wrappers in kernels/src/pipeline/cuda.rs choose them):
//   rgb_to_gray, edge_mask:        1-D, one thread per pixel
//   blur_rows, blur_columns, sobel: 2-D, one thread per pixel, blocks of 32 x 8
//   histogram:                      1-D grid-stride, blockDim.x == 256
//   otsu_threshold:                 exactly one block of 256 threads

#define HIST_BINS 256

// Blur taps [1 4 6 4 1] / 16, exact in binary floating point (pipeline::BLUR_TAPS).
#define TAP0 0.0625f
#define TAP1 0.25f
#define TAP2 0.375f

// pipeline::magnitude_bin: min(255, trunc(64 * m)); NaN and negatives give 0.
__device__ __forceinline__ unsigned int magnitude_bin(float m)
{
    float scaled = __fmul_rn(m, 64.0f);
    return scaled >= 255.0f ? 255u : __float2uint_rz(scaled);
}

// pipeline::host::rgb_to_gray: gray = (77 r + 150 g + 29 b) / 65280.
extern "C" __global__ void rgb_to_gray(const unsigned char* __restrict__ rgb,
                                       float* __restrict__ gray,
                                       unsigned int pixels)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pixels) return;
    const unsigned char* px = rgb + 3ull * i;
    unsigned int y = 77u * px[0] + 150u * px[1] + 29u * px[2];
    gray[i] = __fdiv_rn(__uint2float_rn(y), 65280.0f);
}

// pipeline::host::taps: t0*a + t1*b + t2*c + t3*d + t4*e, accumulated left to right.
__device__ __forceinline__ float taps(float a, float b, float c, float d, float e)
{
    float s = __fmul_rn(TAP0, a);
    s = __fadd_rn(s, __fmul_rn(TAP1, b));
    s = __fadd_rn(s, __fmul_rn(TAP2, c));
    s = __fadd_rn(s, __fmul_rn(TAP1, d));
    s = __fadd_rn(s, __fmul_rn(TAP0, e));
    return s;
}

__device__ __forceinline__ unsigned int clamp_index(int i, unsigned int n)
{
    return i < 0 ? 0u : (i >= (int)n ? n - 1u : (unsigned int)i);
}

// pipeline::host::blur_horizontal: 5 taps along the row, clamp-to-edge.
extern "C" __global__ void blur_rows(const float* __restrict__ src,
                                     float* __restrict__ dst,
                                     unsigned int width,
                                     unsigned int height)
{
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    const float* row = src + (size_t)y * width;
    int xi = (int)x;
    dst[(size_t)y * width + x] = taps(row[clamp_index(xi - 2, width)],
                                      row[clamp_index(xi - 1, width)],
                                      row[x],
                                      row[clamp_index(xi + 1, width)],
                                      row[clamp_index(xi + 2, width)]);
}

// pipeline::host::blur_vertical: 5 taps along the column, clamp-to-edge.
extern "C" __global__ void blur_columns(const float* __restrict__ src,
                                        float* __restrict__ dst,
                                        unsigned int width,
                                        unsigned int height)
{
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    int yi = (int)y;
    const float* col = src + x;
    dst[(size_t)y * width + x] = taps(col[(size_t)clamp_index(yi - 2, height) * width],
                                      col[(size_t)clamp_index(yi - 1, height) * width],
                                      col[(size_t)y * width],
                                      col[(size_t)clamp_index(yi + 1, height) * width],
                                      col[(size_t)clamp_index(yi + 2, height) * width]);
}

// pipeline::host::sobel_magnitude:
//   gx = ((tr + 2 mr) + br) - ((tl + 2 ml) + bl)
//   gy = ((bl + 2 bc) + br) - ((tl + 2 tc) + tr)
//   magnitude = sqrt(gx gx + gy gy)
extern "C" __global__ void sobel(const float* __restrict__ src,
                                 float* __restrict__ magnitude,
                                 unsigned int width,
                                 unsigned int height)
{
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    const float* top = src + (size_t)clamp_index((int)y - 1, height) * width;
    const float* mid = src + (size_t)y * width;
    const float* bot = src + (size_t)clamp_index((int)y + 1, height) * width;
    unsigned int l = clamp_index((int)x - 1, width);
    unsigned int r = clamp_index((int)x + 1, width);
    float tl = top[l], tc = top[x], tr = top[r];
    float ml = mid[l], mr = mid[r];
    float bl = bot[l], bc = bot[x], br = bot[r];
    float gx = __fsub_rn(__fadd_rn(__fadd_rn(tr, __fmul_rn(2.0f, mr)), br),
                         __fadd_rn(__fadd_rn(tl, __fmul_rn(2.0f, ml)), bl));
    float gy = __fsub_rn(__fadd_rn(__fadd_rn(bl, __fmul_rn(2.0f, bc)), br),
                         __fadd_rn(__fadd_rn(tl, __fmul_rn(2.0f, tc)), tr));
    magnitude[(size_t)y * width + x] =
        __fsqrt_rn(__fadd_rn(__fmul_rn(gx, gx), __fmul_rn(gy, gy)));
}

// pipeline::host::histogram: counts magnitude_bin(m) per pixel into `hist`, which the caller
// zeroes first. Each block counts into shared memory, then adds its counts to `hist`; integer
// addition in any order gives the same counts.
extern "C" __global__ void histogram(const float* __restrict__ magnitude,
                                     unsigned int* __restrict__ hist,
                                     unsigned int pixels)
{
    __shared__ unsigned int local[HIST_BINS];
    for (unsigned int b = threadIdx.x; b < HIST_BINS; b += blockDim.x) local[b] = 0;
    __syncthreads();
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < pixels; i += stride) {
        atomicAdd(&local[magnitude_bin(magnitude[i])], 1u);
    }
    __syncthreads();
    for (unsigned int b = threadIdx.x; b < HIST_BINS; b += blockDim.x) {
        unsigned int c = local[b];
        if (c != 0) atomicAdd(&hist[b], c);
    }
}

// pipeline::host::otsu_threshold, one block of 256 threads, thread t evaluating split t:
// integer prefix sums (exact), then the variance (S w0 - N s0)^2 / (w0 (N - w0)) in double,
// operation for operation as on the host, then the largest variance with ties to the smallest
// t. No split (fewer than two non-empty bins) gives 255.
extern "C" __global__ void otsu_threshold(const unsigned int* __restrict__ hist,
                                          unsigned int* __restrict__ threshold)
{
    __shared__ unsigned long long w[HIST_BINS];
    __shared__ unsigned long long s[HIST_BINS];
    __shared__ double best_var[HIST_BINS];
    __shared__ unsigned int best_t[HIST_BINS];
    unsigned int t = threadIdx.x;
    unsigned long long c = hist[t];
    w[t] = c;
    s[t] = (unsigned long long)t * c;
    __syncthreads();
    // Hillis-Steele inclusive scan.
    for (unsigned int off = 1; off < HIST_BINS; off <<= 1) {
        unsigned long long wv = t >= off ? w[t - off] : 0ull;
        unsigned long long sv = t >= off ? s[t - off] : 0ull;
        __syncthreads();
        w[t] += wv;
        s[t] += sv;
        __syncthreads();
    }
    unsigned long long n = w[HIST_BINS - 1];
    unsigned long long total = s[HIST_BINS - 1];
    unsigned long long w0 = w[t];
    unsigned long long s0 = s[t];
    unsigned long long w1 = n - w0;
    double var = -1.0;
    if (w0 != 0 && w1 != 0) {
        double num = __dsub_rn(__dmul_rn(__ull2double_rn(total), __ull2double_rn(w0)),
                               __dmul_rn(__ull2double_rn(n), __ull2double_rn(s0)));
        var = __ddiv_rn(__dmul_rn(num, num),
                        __dmul_rn(__ull2double_rn(w0), __ull2double_rn(w1)));
    }
    best_var[t] = var;
    best_t[t] = t;
    __syncthreads();
    for (unsigned int half = HIST_BINS / 2; half > 0; half >>= 1) {
        if (t < half) {
            double v = best_var[t + half];
            unsigned int u = best_t[t + half];
            if (v > best_var[t] || (v == best_var[t] && u < best_t[t])) {
                best_var[t] = v;
                best_t[t] = u;
            }
        }
        __syncthreads();
    }
    if (t == 0) threshold[0] = best_var[0] < 0.0 ? 255u : best_t[0];
}

// pipeline::host::edge_mask: 255 where magnitude_bin(m) > threshold, else 0. The threshold is
// read from device memory, where otsu_threshold left it.
extern "C" __global__ void edge_mask(const float* __restrict__ magnitude,
                                     const unsigned int* __restrict__ threshold,
                                     unsigned char* __restrict__ mask,
                                     unsigned int pixels)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pixels) return;
    mask[i] = magnitude_bin(magnitude[i]) > threshold[0] ? 255 : 0;
}
