//! Parsing a GGUF file's header, metadata and tensor infos.

use std::collections::BTreeMap;
use std::path::Path;

use super::{MetaValue, DEFAULT_ALIGNMENT, MAGIC};
use crate::dtype::GgmlType;
use crate::error::{Error, Result};

/// Nesting limit for metadata arrays (GGUF arrays of arrays are legal but never deep).
const MAX_ARRAY_DEPTH: usize = 4;
/// Tensor dimension limit, as in ggml.
const MAX_DIMS: u32 = 4;

/// Where a tensor is and what it holds. `shape` is in ggml order: `shape[0]` is the row length.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: GgmlType,
    /// Absolute byte offset of the tensor's data in the file.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// An opened GGUF file: parsed metadata and tensor infos over the file's (mapped) bytes.
pub struct GgufFile {
    version: u32,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
    index: BTreeMap<String, usize>,
    bytes: Bytes,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                Error::ModelNotFound {
                    path: path.to_owned(),
                }
            } else {
                Error::Io {
                    path: path.to_owned(),
                    source,
                }
            }
        })?;
        // SAFETY: the mapping is read-only; the model file is not modified while the engine
        // runs (the fetch script writes a `.part` file and renames it into place).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(Bytes::Mapped(map))
    }

    /// Parses a GGUF image held in memory (tests, and files written by [`super::writer`]).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Bytes::Owned(bytes))
    }

    fn parse(bytes: Bytes) -> Result<Self> {
        let data: &[u8] = match &bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        };
        let mut cur = Cursor { data, pos: 0 };
        let magic: [u8; 4] = cur.take(4, "magic")?.try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(Error::BadMagic(magic));
        }
        let version = cur.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(Error::UnsupportedVersion(version));
        }
        let n_tensors = cur.u64("tensor count")?;
        let n_kv = cur.u64("metadata count")?;
        // Every entry takes at least 8 bytes, so larger counts cannot be honest.
        cur.check_count(n_tensors, 8, "tensor count")?;
        cur.check_count(n_kv, 8, "metadata count")?;

        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = cur.string("metadata key")?;
            let ty = cur.u32("metadata type")?;
            let value = cur.value(ty, 0)?;
            metadata.insert(key, value);
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => return Err(Error::Corrupt(format!("general.alignment is {v:?}"))),
            },
        };

        let mut raw = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = cur.string("tensor name")?;
            let n_dims = cur.u32("tensor dims")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(Error::Corrupt(format!(
                    "tensor {name:?} has {n_dims} dimensions"
                )));
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                shape.push(cur.u64("tensor shape")?);
            }
            let dtype = GgmlType::from_id(cur.u32("tensor type")?)?;
            let rel = cur.u64("tensor offset")?;
            raw.push((name, shape, dtype, rel));
        }

        let data_start = cur.pos.next_multiple_of(alignment as usize) as u64;
        let file_len = data.len() as u64;
        let mut tensors = Vec::with_capacity(raw.len());
        let mut index = BTreeMap::new();
        for (name, shape, dtype, rel) in raw {
            let n = shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| {
                    Error::Corrupt(format!("tensor {name:?} shape {shape:?} overflows"))
                })?;
            if !shape[0].is_multiple_of(dtype.block_size() as u64) {
                return Err(Error::Corrupt(format!(
                    "tensor {name:?} row of {} is not a whole number of {dtype} blocks",
                    shape[0]
                )));
            }
            let n_bytes = dtype
                .bytes_for(n)
                .ok_or_else(|| Error::Corrupt(format!("tensor {name:?} size overflows")))?;
            if !rel.is_multiple_of(alignment) {
                return Err(Error::Corrupt(format!(
                    "tensor {name:?} offset {rel} is not aligned to {alignment}"
                )));
            }
            let offset = data_start
                .checked_add(rel)
                .ok_or_else(|| Error::Corrupt(format!("tensor {name:?} offset overflows")))?;
            let end = offset.saturating_add(n_bytes);
            if end > file_len {
                return Err(Error::Truncated(format!(
                    "tensor {name:?} needs bytes {offset}..{end}, the file has {file_len}"
                )));
            }
            if index.insert(name.clone(), tensors.len()).is_some() {
                return Err(Error::Corrupt(format!("tensor {name:?} appears twice")));
            }
            tensors.push(TensorInfo {
                name,
                shape,
                dtype,
                offset,
                n_bytes,
            });
        }

        Ok(Self {
            version,
            metadata,
            tensors,
            index,
            bytes,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn get(&self, key: &str) -> Result<&MetaValue> {
        self.metadata
            .get(key)
            .ok_or_else(|| Error::MissingMetadata(key.to_owned()))
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.get(key)?
            .as_str()
            .ok_or_else(|| type_err(key, "string"))
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get(key)?
            .as_u64()
            .ok_or_else(|| type_err(key, "unsigned integer"))
    }

    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.get(key)?
            .as_f64()
            .map(|v| v as f32)
            .ok_or_else(|| type_err(key, "number"))
    }

    pub fn get_array(&self, key: &str) -> Result<&[MetaValue]> {
        self.get(key)?
            .as_array()
            .ok_or_else(|| type_err(key, "array"))
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.get_array(key)?
            .iter()
            .map(|v| v.as_str().ok_or_else(|| type_err(key, "array of strings")))
            .collect()
    }

    /// An array of integers (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>> {
        self.get_array(key)?
            .iter()
            .map(|v| v.as_i64().ok_or_else(|| type_err(key, "array of integers")))
            .collect()
    }

    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| Error::MissingTensor(name.to_owned()))
    }

    /// The tensor's info and its bytes (bounds were checked at open).
    pub fn tensor(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let info = self.tensor_info(name)?;
        Ok((info, self.tensor_bytes(info)))
    }

    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        &self.bytes()[info.offset as usize..(info.offset + info.n_bytes) as usize]
    }

    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

fn type_err(key: &str, expected: &'static str) -> Error {
    Error::MetadataType {
        key: key.to_owned(),
        expected,
    }
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let left = (self.data.len() - self.pos) as u64;
        if n > left {
            return Err(Error::Truncated(format!(
                "{what} needs {n} bytes at offset {}, {left} left",
                self.pos
            )));
        }
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    /// Rejects a count of items that cannot fit in what is left of the file.
    fn check_count(&self, count: u64, min_item_bytes: u64, what: &str) -> Result<()> {
        let left = (self.data.len() - self.pos) as u64;
        if count.saturating_mul(min_item_bytes) > left {
            return Err(Error::Truncated(format!(
                "{what} {count} cannot fit in the {left} bytes left at offset {}",
                self.pos
            )));
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::Corrupt(format!("{what} at offset {} is not UTF-8", self.pos)))
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<MetaValue> {
        const W: &str = "metadata value";
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>(W)?[0]),
            1 => MetaValue::I8(self.array::<1>(W)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(W)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(W)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(W)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(W)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(W)?)),
            7 => match self.array::<1>(W)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(Error::Corrupt(format!("bool metadata value {b}"))),
            },
            8 => MetaValue::String(self.string(W)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(Error::Corrupt("metadata arrays nested too deep".into()));
                }
                let elem = self.u32("array type")?;
                let n = self.u64("array length")?;
                self.check_count(n, 1, "array length")?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(W)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(W)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(W)?)),
            other => return Err(Error::Corrupt(format!("unknown metadata type {other}"))),
        })
    }
}
