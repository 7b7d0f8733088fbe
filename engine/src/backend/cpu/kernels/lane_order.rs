//! Quantized weights in lane order: the layout the lane kernels ([`super::lanes`]) read.
//!
//! The kernel computes 16 weight rows side by side, one per 32-bit lane. In the GGUF layout each
//! row's blocks lie apart, so every block of every call had to be gathered from 16 rows and
//! transposed in registers (16 loads, 8 shuffles and a gather per block). [`LaneMatrix`] does that
//! once, when the model loads: rows go in groups of 16, and per group and block the scales are one
//! 64-byte line and the values whole 64-byte lines in the order the kernel's lanes want them. The
//! kernel then loads them as they are. The bytes are the stored ones, only moved, so the results
//! are bit for bit those of the stored layout.
//!
//! A group of 16 rows (`nb` blocks each) holds, 64-byte aligned:
//! - the scale section, `nb` entries of [`LaneMatrix::scale_bytes`]: Q4_1 `d` of the 16 rows as
//!   f16, then their `m`; Q8_0 `d` of the 16 rows (the section padded to whole lines);
//! - the value section, `nb` entries of [`LaneMatrix::value_bytes`], one 64-byte line per four
//!   elements of the block: lane `r` of line `v` holds the bytes of elements `4v..4v + 4` of row
//!   `r` — Q4_1's 16 nibble bytes as stored (line `v < 4`: bytes `4v..4v + 4`, whose low nibbles
//!   are elements `4v..` and high nibbles elements `16 + 4v..`), Q8_0's values as unsigned bytes
//!   (`q + 128`).
//!
//! A last group of fewer than 16 rows repeats its last row in the spare lanes.

use super::huge::{Arena, Slab};
use super::scalar::{Q4_1_BYTES, Q8_0_BYTES, QK};
use super::QMatrix;
use crate::dtype::GgmlType;
use crate::error::Result;

/// Weight rows per group: one per lane of a 512-bit register.
pub const LANES: usize = 16;

/// A quantized matrix rearranged for the lane kernel (see the module documentation).
#[derive(Debug)]
pub struct LaneMatrix {
    layout: Layout,
    rows: usize,
    buf: Slab,
}

/// The sizes of a lane-ordered matrix's parts.
#[derive(Clone, Copy, Debug)]
struct Layout {
    dtype: GgmlType,
    /// Blocks per row.
    nb: usize,
}

impl LaneMatrix {
    /// `w` in lane order, in memory of its own, or `None` if it is not Q4_1 or Q8_0.
    pub fn new(w: &QMatrix) -> Result<Option<Self>> {
        Self::new_in(&Arena::default(), w)
    }

    /// `w` in lane order, in `arena` (huge pages shared with the model's other weights), or
    /// `None` if it is not Q4_1 or Q8_0.
    pub fn new_in(arena: &Arena, w: &QMatrix) -> Result<Option<Self>> {
        if !matches!(w.dtype, GgmlType::Q4_1 | GgmlType::Q8_0) || w.rows == 0 {
            return Ok(None);
        }
        let layout = Layout {
            dtype: w.dtype,
            nb: w.cols / QK,
        };
        let (groups, bytes) = (w.rows.div_ceil(LANES), layout.group_bytes());
        let buf = arena.alloc(groups * bytes, |buf| {
            for (g, dst) in buf.chunks_exact_mut(bytes).enumerate() {
                for lane in 0..LANES {
                    layout.place_row(lane, w.row((g * LANES + lane).min(w.rows - 1)), dst);
                }
            }
        })?;
        Ok(Some(LaneMatrix {
            layout,
            rows: w.rows,
            buf,
        }))
    }

    pub fn dtype(&self) -> GgmlType {
        self.layout.dtype
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Blocks per row.
    pub fn nb(&self) -> usize {
        self.layout.nb
    }

    /// Bytes of one block's scales for the 16 rows of a group.
    pub fn scale_bytes(&self) -> usize {
        self.layout.scale_bytes()
    }

    /// Bytes of one block's values for the 16 rows of a group.
    pub fn value_bytes(&self) -> usize {
        self.layout.value_bytes()
    }

    /// Bytes of a group's scale section (whole lines).
    pub fn scale_section(&self) -> usize {
        self.layout.scale_section()
    }

    /// Bytes of one group of 16 rows.
    pub fn group_bytes(&self) -> usize {
        self.layout.group_bytes()
    }

    /// The bytes of all groups (64-byte aligned).
    pub fn bytes(&self) -> &[u8] {
        self.buf.bytes()
    }
}

impl Layout {
    /// Writes row `src` (stored layout) into lane `lane` of one group's bytes `dst`.
    fn place_row(&self, lane: usize, src: &[u8], dst: &mut [u8]) {
        let (scales, values) = dst.split_at_mut(self.scale_section());
        let (sb, vb) = (self.scale_bytes(), self.value_bytes());
        for b in 0..self.nb {
            let (s, v) = (&mut scales[b * sb..][..sb], &mut values[b * vb..][..vb]);
            match self.dtype {
                GgmlType::Q4_1 => {
                    let blk = &src[b * Q4_1_BYTES..][..Q4_1_BYTES];
                    s[2 * lane..][..2].copy_from_slice(&blk[0..2]);
                    s[32 + 2 * lane..][..2].copy_from_slice(&blk[2..4]);
                    for line in 0..4 {
                        v[64 * line + 4 * lane..][..4].copy_from_slice(&blk[4 + 4 * line..][..4]);
                    }
                }
                GgmlType::Q8_0 => {
                    let blk = &src[b * Q8_0_BYTES..][..Q8_0_BYTES];
                    s[2 * lane..][..2].copy_from_slice(&blk[0..2]);
                    for line in 0..8 {
                        for k in 0..4 {
                            v[64 * line + 4 * lane + k] = blk[2 + 4 * line + k] ^ 0x80;
                        }
                    }
                }
                other => unreachable!("{other} is not a quantized type"),
            }
        }
    }

    /// Bytes of one block's scales for the 16 rows of a group.
    fn scale_bytes(&self) -> usize {
        match self.dtype {
            GgmlType::Q8_0 => 2 * LANES,
            _ => 4 * LANES,
        }
    }

    /// Bytes of one block's values for the 16 rows of a group.
    fn value_bytes(&self) -> usize {
        QK * LANES / if self.dtype == GgmlType::Q8_0 { 1 } else { 2 }
    }

    /// Bytes of a group's scale section (whole lines).
    fn scale_section(&self) -> usize {
        (self.nb * self.scale_bytes()).next_multiple_of(64)
    }

    /// Bytes of one group of 16 rows.
    fn group_bytes(&self) -> usize {
        self.scale_section() + self.nb * self.value_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows whose bytes are their row number and position, so every byte names its origin.
    fn labelled(dtype: GgmlType, rows: usize, nb: usize) -> Vec<u8> {
        let bb = dtype.type_size();
        (0..rows * nb * bb)
            .map(|i| {
                let (r, at) = (i / (nb * bb), i % (nb * bb));
                (r * 8 + at) as u8
            })
            .collect()
    }

    #[test]
    fn q4_1_groups_hold_scales_then_nibble_lines() {
        let (rows, nb) = (19, 3);
        let data = labelled(GgmlType::Q4_1, rows, nb);
        let w = QMatrix::new(GgmlType::Q4_1, rows, nb * QK, &data).expect("valid");
        let l = LaneMatrix::new(&w).expect("mapped").expect("quantized");
        assert_eq!((l.scale_section(), l.group_bytes()), (192, 192 + 3 * 256));
        assert_eq!(l.bytes().len(), 2 * l.group_bytes());
        assert!((l.bytes().as_ptr() as usize).is_multiple_of(64));
        for g in 0..2 {
            let group = &l.bytes()[g * l.group_bytes()..][..l.group_bytes()];
            for lane in 0..LANES {
                let row = w.row((g * LANES + lane).min(rows - 1));
                for b in 0..nb {
                    let blk = &row[b * Q4_1_BYTES..][..Q4_1_BYTES];
                    let s = &group[b * 64..];
                    assert_eq!(&s[2 * lane..][..2], &blk[0..2], "d");
                    assert_eq!(&s[32 + 2 * lane..][..2], &blk[2..4], "m");
                    let v = &group[192 + b * 256..];
                    for line in 0..4 {
                        assert_eq!(&v[64 * line + 4 * lane..][..4], &blk[4 + 4 * line..][..4]);
                    }
                }
            }
        }
    }

    #[test]
    fn q8_0_groups_hold_padded_scales_then_unsigned_lines() {
        let (rows, nb) = (16, 3);
        let data = labelled(GgmlType::Q8_0, rows, nb);
        let w = QMatrix::new(GgmlType::Q8_0, rows, nb * QK, &data).expect("valid");
        let l = LaneMatrix::new(&w).expect("mapped").expect("quantized");
        // 3 blocks of 32 scale bytes, padded to two lines.
        assert_eq!((l.scale_section(), l.group_bytes()), (128, 128 + 3 * 512));
        let group = l.bytes();
        for lane in 0..LANES {
            for b in 0..nb {
                let blk = &w.row(lane)[b * Q8_0_BYTES..][..Q8_0_BYTES];
                assert_eq!(&group[b * 32 + 2 * lane..][..2], &blk[0..2]);
                for e in 0..QK {
                    let (line, k) = (e / 4, e % 4);
                    let got = group[128 + b * 512 + 64 * line + 4 * lane + k];
                    assert_eq!(
                        got as i32 - 128,
                        blk[2 + e] as i8 as i32,
                        "row {lane} elem {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_quantized_matrices_have_a_lane_order() {
        let data = vec![0u8; 4 * 32 * 2];
        let w = QMatrix::new(GgmlType::F16, 4, 32, &data).expect("valid");
        assert!(LaneMatrix::new(&w).expect("mapped").is_none());
    }
}
