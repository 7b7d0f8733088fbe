//! Sixteen f32 lanes as one value (a KV block's 16 positions), for kernels written once for
//! several instruction sets (`flash`'s tiled attention): the trait names no instruction set; each
//! implementation sits in a file of its own, two ymm registers on AVX2 (`ymm2.rs`), a NEON twin
//! four `float32x4_t` (a `neon4.rs` beside `ymm2.rs`). AVX-512 does not go through it: with 32
//! registers and broadcasts from memory its tiled attention is register-blocked in `flash512`.
//!
//! Every method is `#[inline(always)]` and `unsafe`: it may only run inside a function compiled
//! with its implementation's features (AVX2, FMA and F16C for `Ymm2`), into which it inlines.

/// Sixteen f32 lanes.
pub(super) trait F16x16: Copy {
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    /// Sixteen f16 values (bits) at `p`, widened.
    unsafe fn load_f16(p: *const u16) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// `self * b + c`.
    unsafe fn fmadd(self, b: Self, c: Self) -> Self;
    unsafe fn mul(self, b: Self) -> Self;
    unsafe fn add(self, b: Self) -> Self;
    unsafe fn sub(self, b: Self) -> Self;
    unsafe fn div(self, b: Self) -> Self;
    /// The lanes from `live` on replaced by `fill`.
    unsafe fn keep(self, live: usize, fill: f32) -> Self;
    /// `exp` per lane for lanes `<= 0` (softmax weights), within 2 ulps of `f32::exp`, exactly 0
    /// below -150.
    unsafe fn exp(self) -> Self;
    /// The largest lane.
    unsafe fn max_lane(self) -> f32;
    /// Whether any lane is greater than `x`.
    unsafe fn any_gt(self, x: f32) -> bool;
    /// The sum of the lanes, in a fixed order.
    unsafe fn sum_lanes(self) -> f32;
}
