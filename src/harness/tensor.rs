//! Host tensors: f32 and i32 arrays with a shape, their seeded initialisers, and the `.npy` format that
//! numpy and PyTorch read, so recorded node outputs can be inspected with the tools users already have.

use std::fmt;
use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The most elements one tensor may have (16 GiB of f32): beyond it a model is refused, not allocated.
pub const MAX_ELEMENTS: usize = 1 << 32;

/// The number of elements of `shape`, or `None` when it overflows or exceeds [`MAX_ELEMENTS`].
pub fn element_count(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&c| c <= MAX_ELEMENTS)
}

/// Element types the harness knows. Both are four bytes, so device kernels can move either as words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    I32,
}

impl DType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::I32 => "i32",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" | "float32" => Some(Self::F32),
            "i32" | "int32" => Some(Self::I32),
            _ => None,
        }
    }

    fn npy_descr(self) -> &'static str {
        match self {
            Self::F32 => "<f4",
            Self::I32 => "<i4",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The elements of a tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// A host tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Tensor {
    pub fn f32(shape: Vec<usize>, values: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), values.len());
        Self {
            shape,
            data: Data::F32(values),
        }
    }

    pub fn i32(shape: Vec<usize>, values: Vec<i32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), values.len());
        Self {
            shape,
            data: Data::I32(values),
        }
    }

    pub fn dtype(&self) -> DType {
        match self.data {
            Data::F32(_) => DType::F32,
            Data::I32(_) => DType::I32,
        }
    }

    pub fn len(&self) -> usize {
        match &self.data {
            Data::F32(v) => v.len(),
            Data::I32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as little-endian 32-bit words, the layout both backends share.
    pub fn to_words(&self) -> Vec<u32> {
        match &self.data {
            Data::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            Data::I32(v) => v.iter().map(|&x| x as u32).collect(),
        }
    }

    pub fn from_words(shape: Vec<usize>, dtype: DType, words: &[u32]) -> Self {
        let data = match dtype {
            DType::F32 => Data::F32(words.iter().map(|&w| f32::from_bits(w)).collect()),
            DType::I32 => Data::I32(words.iter().map(|&w| w as i32).collect()),
        };
        Self { shape, data }
    }

    /// Writes the tensor as a version-1 `.npy` file.
    pub fn write_npy(&self, path: &Path) -> std::io::Result<()> {
        let shape = match self.shape.as_slice() {
            [one] => format!("({one},)"),
            dims => format!(
                "({})",
                dims.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut header = format!(
            "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
            self.dtype().npy_descr()
        );
        // The whole preamble (magic 6 + version 2 + length 2 + header + newline) is padded to 64 bytes.
        let unpadded = 10 + header.len() + 1;
        header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
        header.push('\n');
        let mut bytes = Vec::with_capacity(10 + header.len() + self.len() * 4);
        bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        for w in self.to_words() {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        let tmp = path.with_extension("npy.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        drop(f);
        std::fs::rename(tmp, path)
    }

    /// Reads a little-endian, C-order `.npy` file of float32 or int32 (int64 is narrowed when it fits).
    pub fn read_npy(path: &Path) -> Result<Self, String> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse_npy(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse_npy(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
            return Err("not a .npy file".into());
        }
        let (header_len, start) = match bytes[6] {
            1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
            2 | 3 if bytes.len() >= 12 => (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            ),
            v => return Err(format!("unsupported .npy version {v}")),
        };
        let header = bytes
            .get(start..start + header_len)
            .and_then(|h| std::str::from_utf8(h).ok())
            .ok_or("truncated .npy header")?;
        let field = |key: &str| -> Option<&str> {
            let at = header.find(&format!("'{key}'"))? + key.len() + 2;
            Some(header[at..].trim_start().strip_prefix(':')?.trim_start())
        };
        let descr = field("descr")
            .and_then(|s| s.strip_prefix('\''))
            .and_then(|s| s.split('\'').next())
            .ok_or("no descr in .npy header")?;
        if field("fortran_order").is_some_and(|s| s.starts_with("True")) {
            return Err(
                "Fortran-order arrays are not supported; save with np.ascontiguousarray".into(),
            );
        }
        let shape_text = field("shape")
            .and_then(|s| s.strip_prefix('('))
            .and_then(|s| s.split(')').next())
            .ok_or("no shape in .npy header")?;
        let shape = shape_text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<usize>()
                    .map_err(|_| format!("bad shape {shape_text:?}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let count = element_count(&shape)
            .ok_or_else(|| format!("shape {shape:?} has more than {MAX_ELEMENTS} elements"))?;
        let body = &bytes[start + header_len..];
        let width = match descr {
            "<f4" | "<i4" => 4,
            "<i8" => 8,
            other => {
                return Err(format!(
                    "unsupported dtype {other:?} (use float32 or int32)"
                ))
            }
        };
        if body.len() < count * width {
            return Err(format!(
                "truncated data: {} bytes for {count} elements of {descr}",
                body.len()
            ));
        }
        let word = |i: usize| {
            u32::from_le_bytes([
                body[i * 4],
                body[i * 4 + 1],
                body[i * 4 + 2],
                body[i * 4 + 3],
            ])
        };
        Ok(match descr {
            "<f4" => Self::f32(shape, (0..count).map(|i| f32::from_bits(word(i))).collect()),
            "<i4" => Self::i32(shape, (0..count).map(|i| word(i) as i32).collect()),
            _ => {
                let mut values = Vec::with_capacity(count);
                for i in 0..count {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&body[i * 8..i * 8 + 8]);
                    let v = i64::from_le_bytes(b);
                    values.push(
                        i32::try_from(v)
                            .map_err(|_| format!("int64 value {v} does not fit int32"))?,
                    );
                }
                Self::i32(shape, values)
            }
        })
    }
}

/// A small, fast, seeded generator: the same seed gives the same tensor on every machine.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trips_both_dtypes() {
        let dir = tempfile::tempdir().unwrap();
        for t in [
            Tensor::f32(vec![2, 3], vec![1.0, -2.5, 3.25, 0.0, f32::MAX, -0.0]),
            Tensor::i32(vec![4], vec![0, -1, i32::MAX, 7]),
        ] {
            let p = dir.path().join("t.npy");
            t.write_npy(&p).unwrap();
            let bytes = std::fs::read(&p).unwrap();
            assert_eq!(
                (bytes.len() - t.len() * 4) % 64,
                0,
                "preamble is 64-byte aligned"
            );
            assert_eq!(Tensor::read_npy(&p).unwrap(), t);
        }
    }

    #[test]
    fn npy_header_matches_what_numpy_writes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.npy");
        Tensor::f32(vec![3], vec![0.0; 3]).write_npy(&p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + len) % 64, 0);
        let header = std::str::from_utf8(&bytes[10..10 + len]).unwrap();
        assert!(header.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"));
        assert!(header.ends_with('\n'));
    }

    #[test]
    fn int64_arrays_are_narrowed_or_refused() {
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        let header = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }";
        let mut h = header.to_string();
        h.push_str(&" ".repeat(128 - 10 - header.len() - 1));
        h.push('\n');
        bytes.extend_from_slice(&(h.len() as u16).to_le_bytes());
        bytes.extend_from_slice(h.as_bytes());
        bytes.extend_from_slice(&5i64.to_le_bytes());
        bytes.extend_from_slice(&(-3i64).to_le_bytes());
        assert_eq!(
            Tensor::parse_npy(&bytes).unwrap(),
            Tensor::i32(vec![2], vec![5, -3])
        );
        let n = bytes.len();
        bytes[n - 8..].copy_from_slice(&(1i64 << 40).to_le_bytes());
        assert!(Tensor::parse_npy(&bytes)
            .unwrap_err()
            .contains("does not fit"));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(Tensor::parse_npy(b"hello").is_err());
        assert!(Tensor::parse_npy(b"\x93NUMPY\x01\x00\xff\xff{").is_err());
    }

    #[test]
    fn the_generator_is_deterministic() {
        let a: Vec<u64> = (0..4)
            .scan(SplitMix64::new(7), |g, _| Some(g.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .scan(SplitMix64::new(7), |g, _| Some(g.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a[0], SplitMix64::new(8).next_u64());
    }
}
