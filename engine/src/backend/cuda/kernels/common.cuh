// Shared by every Sluice kernel: fixed-width types, f16 conversions and dp4a through inline PTX,
// warp reductions. No toolkit header is included: NVRTC compiles these sources as they are.
// HEAD_DIM is defined by the compile options (the model's head size, a multiple of 32).

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;

#define QK 32
#define KV_BLOCK 16
#define WARP 32
#define FULL_MASK 0xffffffffu

// f16 bits to f32 and back (round to nearest even), as the CPU's `half` crate does.
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Four i8 products summed into c: dp4a.s32.s32 (sm_61 and later).
__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// An f16 stored at any byte offset (Q8_0 blocks are 34 bytes: no alignment to rely on).
__device__ __forceinline__ u16 load_u16(const u8* p) {
    return (u16)p[0] | ((u16)p[1] << 8);
}

// Four bytes at any offset, little-endian, as one int for dp4a.
__device__ __forceinline__ int load_i32(const u8* p) {
    return (int)((u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24));
}

// Butterfly sums and maxima over a warp: every lane ends with the result. The order of the
// additions is fixed (xor 16, 8, 4, 2, 1), which the CPU twins repeat.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Q8_1 quantization of one block of 32, one value per lane: d = amax / 127, q = round(x / d)
// (ties to even), s = d * sum(q); lane 0 stores d and s.
__device__ __forceinline__ void quantize_lane(float y, i8* qs, float* ds, int lane) {
    float amax = warp_max(fabsf(y));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q = __float2int_rn(y * id);
    q = max(-127, min(127, q));
    qs[lane] = (i8)q;
    int sum = warp_sum_i(q);
    if (lane == 0) {
        ds[0] = d;
        ds[1] = d * (float)sum;
    }
}
