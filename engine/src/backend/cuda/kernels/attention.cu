// Paged attention over the f16 KV cache ([slot][kv head][HEAD_DIM] per layer; a sequence's
// positions live in 16-position blocks named by its block table).
//
// Decode, split-KV: CTA (kv head, sequence, split) of 4 warps takes `split_len` positions of one
// sequence for the `group` query heads that share the kv head (each key and value is loaded once
// for the group). Warp w takes positions start + w, start + w + 4, ...; per head an online softmax
// (running max m, sum l, unnormalized output). The CTA merges its warps and writes one partial
// (m, l, acc) per head and split; `attn_combine` merges the splits.
//
// Prefill, tiled: CTA (query head, tile of 16 query rows, sequence) of 4 warps, 4 rows per warp;
// each 16-position block of keys and values is loaded into shared memory once per tile and read
// by all 16 rows; causal within the chunk (a row at position p sees keys 0..=p).

#define DPL (HEAD_DIM / 32)
#define GROUP_MAX 8
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ size_t cache_slot(const int* table, int pos) {
    return (size_t)table[pos / KV_BLOCK] * KV_BLOCK + pos % KV_BLOCK;
}

extern "C" __global__ void attn_decode(const float* q, const int* q_rows, const u16* k_cache,
                                       const u16* v_cache, const int* block_tables,
                                       int max_blocks, const int* seq_lens, int n_heads, int n_kv,
                                       float scale, int split_len, int n_splits, float* part_acc,
                                       float* part_ml) {
    __shared__ float sm[4][GROUP_MAX], sl[4][GROUP_MAX];
    __shared__ float sacc[4][GROUP_MAX][HEAD_DIM];
    const int kvh = blockIdx.x, s = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = n_heads / n_kv;
    const int len = seq_lens[s];
    const int start = split * split_len, end = min(len, start + split_len);
    const int* table = block_tables + (size_t)s * max_blocks;
    const float* qr = q + (size_t)q_rows[s] * n_heads * HEAD_DIM;
    float qv[GROUP_MAX][DPL], acc[GROUP_MAX][DPL], m[GROUP_MAX], l[GROUP_MAX];
#pragma unroll
    for (int g = 0; g < GROUP_MAX; g++) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            acc[g][j] = 0.0f;
            qv[g][j] = g < group ? qr[(kvh * group + g) * HEAD_DIM + lane + 32 * j] : 0.0f;
        }
    }
    for (int p = start + warp; p < end; p += 4) {
        const size_t base = (cache_slot(table, p) * n_kv + kvh) * HEAD_DIM;
        float kv[DPL], vv[DPL];
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            kv[j] = h2f(k_cache[base + lane + 32 * j]);
            vv[j] = h2f(v_cache[base + lane + 32 * j]);
        }
#pragma unroll
        for (int g = 0; g < GROUP_MAX; g++) {
            if (g < group) {
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < DPL; j++) dot = fmaf(qv[g][j], kv[j], dot);
                const float score = warp_sum(dot) * scale;
                const float m_new = fmaxf(m[g], score);
                const float corr = expf(m[g] - m_new), e = expf(score - m_new);
                l[g] = l[g] * corr + e;
#pragma unroll
                for (int j = 0; j < DPL; j++) acc[g][j] = fmaf(e, vv[j], acc[g][j] * corr);
                m[g] = m_new;
            }
        }
    }
    for (int g = 0; g < group; g++) {
        if (lane == 0) {
            sm[warp][g] = m[g];
            sl[warp][g] = l[g];
        }
#pragma unroll
        for (int j = 0; j < DPL; j++) sacc[warp][g][lane + 32 * j] = acc[g][j];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * HEAD_DIM; i += blockDim.x) {
        const int g = i / HEAD_DIM, d = i % HEAD_DIM;
        float mm = NEG_INF;
        for (int w = 0; w < 4; w++) mm = fmaxf(mm, sm[w][g]);
        float ll = 0.0f, aa = 0.0f;
        if (mm != NEG_INF) {
            for (int w = 0; w < 4; w++) {
                const float f = expf(sm[w][g] - mm);
                ll = fmaf(sl[w][g], f, ll);
                aa = fmaf(sacc[w][g][d], f, aa);
            }
        }
        const size_t part = ((size_t)s * n_heads + kvh * group + g) * n_splits + split;
        part_acc[part * HEAD_DIM + d] = aa;
        if (d == 0) {
            part_ml[2 * part] = mm;
            part_ml[2 * part + 1] = ll;
        }
    }
}

// Merges the splits of each (sequence, head): out = sum(acc_i e^(m_i - M)) / sum(l_i e^(m_i - M)).
extern "C" __global__ void attn_combine(const float* part_acc, const float* part_ml,
                                        const int* q_rows, int n_heads, int n_splits, float* out) {
    const int h = blockIdx.x, s = blockIdx.y, d = threadIdx.x;
    const size_t first = ((size_t)s * n_heads + h) * n_splits;
    float mm = NEG_INF;
    for (int i = 0; i < n_splits; i++) mm = fmaxf(mm, part_ml[2 * (first + i)]);
    float ll = 0.0f, aa = 0.0f;
    for (int i = 0; i < n_splits; i++) {
        const float mi = part_ml[2 * (first + i)];
        if (mi == NEG_INF) continue;
        const float f = expf(mi - mm);
        ll = fmaf(part_ml[2 * (first + i) + 1], f, ll);
        aa = fmaf(part_acc[(first + i) * HEAD_DIM + d], f, aa);
    }
    out[((size_t)q_rows[s] * n_heads + h) * HEAD_DIM + d] = ll > 0.0f ? aa / ll : 0.0f;
}

extern "C" __global__ void attn_prefill(const float* q, const int* q_first, const int* q_count,
                                        const int* pos_first, const u16* k_cache,
                                        const u16* v_cache, const int* block_tables,
                                        int max_blocks, int n_heads, int n_kv, float scale,
                                        float* out) {
    __shared__ float ks[KV_BLOCK][HEAD_DIM], vs[KV_BLOCK][HEAD_DIM];
    const int h = blockIdx.x, tile = blockIdx.y, s = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nq = q_count[s];
    if (tile * 16 >= nq) return;
    const int kvh = h / (n_heads / n_kv);
    const int* table = block_tables + (size_t)s * max_blocks;
    const int p0 = pos_first[s];
    float qv[4][DPL], acc[4][DPL], m[4], l[4];
    int qpos[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int i = tile * 16 + warp * 4 + r;
        qpos[r] = i < nq ? p0 + i : -1;
        m[r] = NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            acc[r][j] = 0.0f;
            qv[r][j] = i < nq
                ? q[((size_t)(q_first[s] + i) * n_heads + h) * HEAD_DIM + lane + 32 * j]
                : 0.0f;
        }
    }
    const int last = p0 + min(nq, tile * 16 + 16) - 1;
    for (int kb = 0; kb * KV_BLOCK <= last; kb++) {
        __syncthreads();
        for (int i = threadIdx.x; i < KV_BLOCK * HEAD_DIM; i += blockDim.x) {
            const int j = i / HEAD_DIM, d = i % HEAD_DIM, p = kb * KV_BLOCK + j;
            float kval = 0.0f, vval = 0.0f;
            if (p <= last) {
                const size_t at = ((size_t)table[kb] * KV_BLOCK + j) * n_kv + kvh;
                kval = h2f(k_cache[at * HEAD_DIM + d]);
                vval = h2f(v_cache[at * HEAD_DIM + d]);
            }
            ks[j][d] = kval;
            vs[j][d] = vval;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < 4; r++) {
            for (int j = 0; j < KV_BLOCK; j++) {
                const int p = kb * KV_BLOCK + j;
                if (p > qpos[r]) break;
                float dot = 0.0f;
#pragma unroll
                for (int jj = 0; jj < DPL; jj++) dot = fmaf(qv[r][jj], ks[j][lane + 32 * jj], dot);
                const float score = warp_sum(dot) * scale;
                const float m_new = fmaxf(m[r], score);
                const float corr = expf(m[r] - m_new), e = expf(score - m_new);
                l[r] = l[r] * corr + e;
#pragma unroll
                for (int jj = 0; jj < DPL; jj++)
                    acc[r][jj] = fmaf(e, vs[j][lane + 32 * jj], acc[r][jj] * corr);
                m[r] = m_new;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        if (qpos[r] < 0) continue;
        const int i = tile * 16 + warp * 4 + r;
#pragma unroll
        for (int j = 0; j < DPL; j++)
            out[((size_t)(q_first[s] + i) * n_heads + h) * HEAD_DIM + lane + 32 * j] =
                acc[r][j] / l[r];
    }
}
