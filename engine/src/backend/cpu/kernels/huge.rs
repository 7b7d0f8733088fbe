//! Zeroed buffers on transparent huge pages, for what a decode step streams: the lane-ordered
//! weights and the KV cache.
//!
//! A decode step reads ~100 MB of weights and the batch's KV blocks. On 4 KiB pages that is tens
//! of thousands of TLB misses a step, and the hardware prefetchers stop at every page boundary;
//! on 2 MiB pages the batch-8 step here took 8.0 ms instead of 9.4 (`docs/performance.md`). The
//! kernel only backs a mapping with huge pages where asked (`MADV_HUGEPAGE`, the default
//! `madvise` setting of `/sys/kernel/mm/transparent_hugepage/enabled`) and where the range is
//! 2 MiB-aligned, so the mapping is made 2 MiB longer and used from its first boundary. Where
//! huge pages are off or unavailable the buffer is an ordinary zeroed mapping.
//!
//! A huge page is backed whole once touched, so small buffers must share them: [`HugeBuf`] is
//! for one large buffer (a rank's KV cache), [`Arena`] hands out `Slab`s of shared chunks (the
//! weights, most of them a few hundred KiB).

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use memmap2::{Advice, MmapMut};

use crate::error::{Error, Result};

/// A transparent huge page (x86_64, aarch64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// Element types for which all-zero bytes, and any bytes, are a valid value.
pub trait Plain: Copy + private::Sealed {}
impl Plain for u8 {}
impl Plain for u16 {}

mod private {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
}

/// `len` zeroed elements of `T`, starting on a huge-page boundary; pages are only backed once
/// touched.
#[derive(Debug)]
pub struct HugeBuf<T: Plain> {
    map: MmapMut,
    start: usize,
    len: usize,
    elem: PhantomData<T>,
}

impl<T: Plain> HugeBuf<T> {
    pub fn zeroed(len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or_else(|| Error::InvalidRequest(format!("a buffer of {len} elements")))?;
        let (map, start) = map_huge(bytes)?;
        Ok(HugeBuf {
            map,
            start,
            len,
            elem: PhantomData,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[T] {
        let bytes = &self.map[self.start..][..self.len * size_of::<T>()];
        // SAFETY: the bytes are initialized (a zeroed mapping, then written as `T`s), any bytes
        // are a valid `T` (`Plain`), `start` is a multiple of 2 MiB past a page-aligned address,
        // hence aligned for `T`, and the slice borrows `self`.
        unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        let bytes = &mut self.map[self.start..][..self.len * size_of::<T>()];
        // SAFETY: as in `as_slice`, for a unique borrow of `self`.
        unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut T, self.len) }
    }
}

/// Huge-page chunks carved into 64-byte aligned `Slab`s, each written once as it is handed out.
#[derive(Debug, Default)]
pub struct Arena {
    /// The chunk being carved and how much of it is taken.
    current: Mutex<Option<(Arc<Chunk>, usize)>>,
}

/// Bytes of an arena chunk (a larger request gets a chunk of its own size).
const CHUNK: usize = 32 << 20;

/// One mapping of an arena, used from its first huge-page boundary.
#[derive(Debug)]
struct Chunk {
    /// Keeps the mapping alive; only reached through `base`.
    _map: MmapMut,
    base: *mut u8,
    len: usize,
}

// SAFETY: a chunk's bytes are only reached through slabs, which are disjoint: each range is
// written once, through the only pointer to it, before its slab exists, then only read.
unsafe impl Send for Chunk {}
// SAFETY: as above.
unsafe impl Sync for Chunk {}

impl Arena {
    /// A slab of `len` bytes, first written by `fill` (it starts zeroed).
    pub fn alloc(&self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<Slab> {
        let need = len.next_multiple_of(64);
        let (chunk, start) = {
            let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
            let fits = matches!(&*current, Some((c, used)) if used + need <= c.len);
            if !fits {
                let bytes = need.max(CHUNK);
                let (mut map, start) = map_huge(bytes)?;
                let base = map[start..].as_mut_ptr();
                let chunk = Chunk {
                    _map: map,
                    base,
                    len: bytes,
                };
                *current = Some((Arc::new(chunk), 0));
            }
            let (chunk, used) = current.as_mut().expect("a chunk was just made");
            let start = *used;
            *used += need;
            (Arc::clone(chunk), start)
        };
        // SAFETY: `start + len <= chunk.len` bytes past `base` lie inside the mapping, and this
        // range was handed out here only, so this is the only reference to it.
        fill(unsafe { std::slice::from_raw_parts_mut(chunk.base.add(start), len) });
        Ok(Slab { chunk, start, len })
    }
}

/// A range of an [`Arena`] chunk.
#[derive(Debug)]
pub struct Slab {
    chunk: Arc<Chunk>,
    start: usize,
    len: usize,
}

impl Slab {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the range lies inside the chunk's mapping (kept alive by the `Arc`), was
        // written before this slab existed and is only read from now on.
        unsafe { std::slice::from_raw_parts(self.chunk.base.add(self.start), self.len) }
    }
}

/// An anonymous zeroed mapping of `bytes` plus a huge page, advised for huge pages, and the
/// offset of its first huge-page boundary (where `bytes` of it start).
fn map_huge(bytes: usize) -> Result<(MmapMut, usize)> {
    let total = bytes
        .checked_add(HUGE_PAGE)
        .ok_or_else(|| Error::InvalidRequest(format!("a buffer of {bytes} bytes")))?;
    let map = MmapMut::map_anon(total)
        .map_err(|e| Error::InvalidRequest(format!("cannot map {total} bytes: {e}")))?;
    // Only advice: without huge pages the buffer works the same, slower.
    let _ = map.advise(Advice::HugePage);
    let start = map.as_ptr().align_offset(HUGE_PAGE).min(HUGE_PAGE);
    Ok((map, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_writable() {
        let mut b = HugeBuf::<u16>::zeroed(3 << 20).expect("map");
        assert_eq!(b.len(), 3 << 20);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert!((b.as_slice().as_ptr() as usize).is_multiple_of(HUGE_PAGE));
        b.as_mut_slice()[(3 << 20) - 1] = 7;
        assert_eq!(b.as_slice()[(3 << 20) - 1], 7);
        assert!(HugeBuf::<u8>::zeroed(0).expect("map").is_empty());
    }

    #[test]
    fn arena_slabs_are_aligned_disjoint_and_keep_their_bytes() {
        let arena = Arena::default();
        let slabs: Vec<Slab> = [100, 64, 1, 3 << 20, 33 << 20, 5000]
            .iter()
            .enumerate()
            .map(|(k, &len)| arena.alloc(len, |b| b.fill(k as u8 + 1)).expect("map"))
            .collect();
        for (k, s) in slabs.iter().enumerate() {
            assert!((s.bytes().as_ptr() as usize).is_multiple_of(64));
            assert!(s.bytes().iter().all(|&b| b == k as u8 + 1), "slab {k}");
        }
        // The small ones share a chunk; the 33 MiB one has its own.
        let gap = slabs[1].bytes().as_ptr() as usize - slabs[0].bytes().as_ptr() as usize;
        assert_eq!(gap, 128);
    }
}
