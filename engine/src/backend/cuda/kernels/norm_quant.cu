// Fused residual add + RMS norm + Q8_1 activation quantization: one CTA of 256 threads per row.
//
//   x[row] += residual[row]            (when residual is given; x keeps the sum)
//   y = x[row] * (1 / sqrt(mean(x^2) + eps)) * w
//   qs, ds = q8_1(y)                   (xn[row] = y when xn is given)
//
// The sum of squares: thread t takes columns t, t+256, ...; warps reduce by butterfly; warp 0
// sums the 8 warp totals in order.

extern "C" __global__ void add_rms_norm_quant(float* x, const float* residual, const float* w,
                                              float eps, int cols, i8* qs, float* ds, float* xn) {
    __shared__ float warp_ss[8];
    __shared__ float scale_s;
    const int row = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    float* xr = x + (size_t)row * cols;
    const float* rr = residual ? residual + (size_t)row * cols : 0;
    float ss = 0.0f;
    for (int c = t; c < cols; c += 256) {
        float v = xr[c];
        if (rr) {
            v += rr[c];
            xr[c] = v;
        }
        ss = fmaf(v, v, ss);
    }
    ss = warp_sum(ss);
    if (lane == 0) warp_ss[warp] = ss;
    __syncthreads();
    if (t == 0) {
        float total = 0.0f;
        for (int i = 0; i < 8; i++) total += warp_ss[i];
        scale_s = 1.0f / sqrtf(total / (float)cols + eps);
    }
    __syncthreads();
    const float scale = scale_s;
    const int nb = cols / QK;
    i8* qr = qs + (size_t)row * cols;
    float* dr = ds + (size_t)row * 2 * nb;
    for (int b = warp; b < nb; b += 8) {
        const int c = b * QK + lane;
        float y = xr[c] * scale * w[c];
        if (xn) xn[(size_t)row * cols + c] = y;
        quantize_lane(y, qr + b * QK, dr + 2 * b, lane);
    }
}

// SwiGLU into the down projection's activations: h = silu(gate) * up, quantized to Q8_1 (one
// warp per block of 32; a CTA of 256 threads per row).
extern "C" __global__ void swiglu_quant(const float* gate, const float* up, int cols, i8* qs,
                                        float* ds) {
    const int row = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nb = cols / QK;
    const float* g = gate + (size_t)row * cols;
    const float* u = up + (size_t)row * cols;
    for (int b = warp; b < nb; b += 8) {
        const int c = b * QK + lane;
        float gv = g[c];
        float h = gv / (1.0f + expf(-gv)) * u[c];
        quantize_lane(h, qs + (size_t)row * cols + b * QK, ds + (size_t)row * 2 * nb + 2 * b,
                      lane);
    }
}

// x[i] += y[i] (a residual connection that no product epilogue took).
extern "C" __global__ void add_f32(float* x, const float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// Q8_1 quantization of rows that need no norm first (a product's input after attention): one
// warp per block of 32, a CTA of 256 threads per row.
extern "C" __global__ void quantize_q8_1(const float* x, int cols, i8* qs, float* ds) {
    const int row = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nb = cols / QK;
    for (int b = warp; b < nb; b += 8) {
        const size_t c = (size_t)row * cols + b * QK + lane;
        quantize_lane(x[c], qs + (size_t)row * cols + b * QK, ds + (size_t)row * 2 * nb + 2 * b,
                      lane);
    }
}

// gate[i] = silu(gate[i]) * up[i] (SwiGLU where no product follows at once).
extern "C" __global__ void silu_mul_f32(float* gate, const float* up, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
