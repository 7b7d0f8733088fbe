//! CPU twins of the CUDA kernels: the same algorithm in the same order where the order changes
//! rounding (each thread's strided partial sums, the warps' butterfly reductions, the four lanes
//! of a block, the online softmax per warp and the merge of warps and splits). The tests hold
//! each twin to the CPU backend's kernels (or, for attention, a plain softmax in f64 over the
//! same f16 cache), with tolerances a wrong index cannot pass.

pub mod attention;
pub mod inputs;
pub mod matvec;
pub mod norm_quant;
#[cfg(test)]
mod tests;

/// A warp of 32 lanes.
pub const WARP: usize = 32;

/// `warp_sum` of common.cuh: the butterfly xor 16, 8, 4, 2, 1; every lane ends with the same
/// value, lane 0's is returned.
pub fn warp_sum(mut lanes: [f32; WARP]) -> f32 {
    let mut o = 16;
    while o > 0 {
        let before = lanes;
        for (l, v) in lanes.iter_mut().enumerate() {
            *v += before[l ^ o];
        }
        o >>= 1;
    }
    lanes[0]
}

/// f16 bits as the kernels' `cvt.rn.f16.f32` writes them.
pub fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}
