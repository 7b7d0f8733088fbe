// Quantized weights (Q4_1, Q8_0) times Q8_1 activations for 1..8 activation rows: one warp per
// weight row, four lanes per block of 32 (8 blocks in flight per warp), dp4a for the integer
// dot products.
//
// Per block the four lanes' integer partial dots are summed exactly (shuffles xor 1, 2); lane
// 4k then adds `dot * d_w * d_x` (and Q4_1's `m_w * s_x`) to its running sums; the warp's eight
// block lanes are summed by butterfly at the end. `out[b * rows + r] = add[b * rows + r] + dot`
// when `add` is given (a residual connection as the product's epilogue; it may alias `out`).

#define MV_MAX_BATCH 8
#define MV_WARPS 4
#define Q4_1_BYTES 20
#define Q8_0_BYTES 34

__device__ __forceinline__ void mv_store(float* out, const float* add, int rows, int r, int nbatch,
                                         const float* acc, int lane) {
#pragma unroll
    for (int b = 0; b < MV_MAX_BATCH; b++) {
        if (b < nbatch) {
            float v = warp_sum(acc[b]);
            if (lane == 0) {
                size_t i = (size_t)b * rows + r;
                out[i] = add ? add[i] + v : v;
            }
        }
    }
}

extern "C" __global__ void matvec_q4_1(const u8* w, int rows, int nblocks, const i8* xq,
                                       const float* xds, int nbatch, float* out,
                                       const float* add) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int sub = lane & 3;
    const int cols = nblocks * QK;
    float acc[MV_MAX_BATCH], macc[MV_MAX_BATCH];
#pragma unroll
    for (int b = 0; b < MV_MAX_BATCH; b++) acc[b] = macc[b] = 0.0f;
    const u8* wr = w + (size_t)r * nblocks * Q4_1_BYTES;
    for (int ib = lane >> 2; ib < nblocks; ib += 8) {
        const u8* blk = wr + (size_t)ib * Q4_1_BYTES;
        const float d = h2f(load_u16(blk)), m = h2f(load_u16(blk + 2));
        const int packed = load_i32(blk + 4 + 4 * sub);
        const int lo = packed & 0x0F0F0F0F, hi = (packed >> 4) & 0x0F0F0F0F;
#pragma unroll
        for (int b = 0; b < MV_MAX_BATCH; b++) {
            if (b < nbatch) {
                const u8* xb = (const u8*)(xq + (size_t)b * cols + ib * QK);
                int dot = dp4a(lo, load_i32(xb + 4 * sub), dp4a(hi, load_i32(xb + 16 + 4 * sub), 0));
                dot += __shfl_xor_sync(FULL_MASK, dot, 1);
                dot += __shfl_xor_sync(FULL_MASK, dot, 2);
                const float* s = xds + (size_t)b * 2 * nblocks + 2 * ib;
                if (sub == 0) {
                    acc[b] = fmaf((float)dot, d * s[0], acc[b]);
                    macc[b] = fmaf(m, s[1], macc[b]);
                }
            }
        }
    }
#pragma unroll
    for (int b = 0; b < MV_MAX_BATCH; b++) acc[b] += macc[b];
    mv_store(out, add, rows, r, nbatch, acc, lane);
}

extern "C" __global__ void matvec_q8_0(const u8* w, int rows, int nblocks, const i8* xq,
                                       const float* xds, int nbatch, float* out,
                                       const float* add) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int sub = lane & 3;
    const int cols = nblocks * QK;
    float acc[MV_MAX_BATCH];
#pragma unroll
    for (int b = 0; b < MV_MAX_BATCH; b++) acc[b] = 0.0f;
    const u8* wr = w + (size_t)r * nblocks * Q8_0_BYTES;
    for (int ib = lane >> 2; ib < nblocks; ib += 8) {
        const u8* blk = wr + (size_t)ib * Q8_0_BYTES;
        const float d = h2f(load_u16(blk));
        const int w0 = load_i32(blk + 2 + 8 * sub), w1 = load_i32(blk + 6 + 8 * sub);
#pragma unroll
        for (int b = 0; b < MV_MAX_BATCH; b++) {
            if (b < nbatch) {
                const u8* xb = (const u8*)(xq + (size_t)b * cols + ib * QK);
                int dot = dp4a(w0, load_i32(xb + 8 * sub), dp4a(w1, load_i32(xb + 4 + 8 * sub), 0));
                dot += __shfl_xor_sync(FULL_MASK, dot, 1);
                dot += __shfl_xor_sync(FULL_MASK, dot, 2);
                if (sub == 0) acc[b] = fmaf((float)dot, d * xds[(size_t)b * 2 * nblocks + 2 * ib], acc[b]);
            }
        }
    }
    mv_store(out, add, rows, r, nbatch, acc, lane);
}

// The output head's greedy pick on the device: per row the index of the largest logit (the
// lowest index among equals). One CTA of 256 threads per row.
extern "C" __global__ void argmax_rows(const float* logits, int vocab, int* out) {
    __shared__ float best_v[8];
    __shared__ int best_i[8];
    const int row = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const float* x = logits + (size_t)row * vocab;
    float bv = __int_as_float(0xff800000);  // -inf
    int bi = 0x7fffffff;
    for (int i = t; i < vocab; i += 256) {
        float v = x[i];
        if (v > bv) {
            bv = v;
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, bv, o);
        int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (t == 0) {
        for (int k = 1; k < 8; k++) {
            if (best_v[k] > bv || (best_v[k] == bv && best_i[k] < bi)) {
                bv = best_v[k];
                bi = best_i[k];
            }
        }
        out[row] = bi == 0x7fffffff ? 0 : bi;
    }
}
