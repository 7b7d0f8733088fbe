// The QKV epilogue: rotary embedding (adjacent pairs, `inv_freq` from the host so that the
// angles are the CPU's) on q and k, then k and v stored as f16 in the paged KV cache at each
// row's slot (`slots[row]` = physical block * 16 + offset, from the block tables). One CTA of
// 128 threads per row. Cache layout per layer: [slot][kv head][HEAD_DIM].

extern "C" __global__ void rope_kv_store(float* q, float* k, const float* v, const int* positions,
                                         const float* inv_freq, int n_heads, int n_kv,
                                         int rope_dims, const int* slots, u16* k_cache,
                                         u16* v_cache) {
    const int row = blockIdx.x, t = threadIdx.x;
    const float pos = (float)positions[row];
    const int half = HEAD_DIM / 2, rhalf = rope_dims / 2;
    const size_t slot = (size_t)slots[row];
    float* qr = q + (size_t)row * n_heads * HEAD_DIM;
    float* kr = k + (size_t)row * n_kv * HEAD_DIM;
    const float* vr = v + (size_t)row * n_kv * HEAD_DIM;
    u16* kc = k_cache + slot * n_kv * HEAD_DIM;
    u16* vc = v_cache + slot * n_kv * HEAD_DIM;
    for (int item = t; item < (n_heads + n_kv) * half; item += blockDim.x) {
        const int h = item / half, i = item % half;
        const bool is_k = h >= n_heads;
        float* x = is_k ? kr + (h - n_heads) * HEAD_DIM : qr + h * HEAD_DIM;
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        if (i < rhalf) {
            float s, c;
            sincosf(pos * inv_freq[i], &s, &c);
            const float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
            x0 = r0;
            x1 = r1;
            x[2 * i] = x0;
            x[2 * i + 1] = x1;
        }
        if (is_k) {
            const int o = (h - n_heads) * HEAD_DIM + 2 * i;
            kc[o] = f2h(x0);
            kc[o + 1] = f2h(x1);
        }
    }
    for (int i = t; i < n_kv * HEAD_DIM; i += blockDim.x) vc[i] = f2h(vr[i]);
}

// Embedding rows of an f16 or Q8_0 table: out[row] = table[ids[row]] (one CTA per row).
extern "C" __global__ void embed_q8_0(const u8* table, const int* ids, int cols, float* out) {
    const int row = blockIdx.x;
    const int nb = cols / QK;
    const u8* tr = table + (size_t)ids[row] * nb * 34;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const u8* blk = tr + (c / QK) * 34;
        out[(size_t)row * cols + c] = h2f(load_u16(blk)) * (float)(i8)blk[2 + c % QK];
    }
}

extern "C" __global__ void embed_f16(const u16* table, const int* ids, int cols, float* out) {
    const int row = blockIdx.x;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        out[(size_t)row * cols + c] = h2f(table[(size_t)ids[row] * cols + c]);
}
