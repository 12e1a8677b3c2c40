//! Host tensors: f32 and i32 arrays with a shape, their seeded initialisers, and the `.npy` format that
//! numpy and PyTorch read, so recorded node outputs can be inspected with the tools users already have.

use std::fmt;
use std::io::Read;
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
    /// 32-bit float.
    F32,
    /// 32-bit signed integer.
    I32,
}

impl DType {
    /// The name model files use (`f32`, `i32`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::I32 => "i32",
        }
    }

    /// Parses a model file's dtype (`f32`/`float32`, `i32`/`int32`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" | "float32" => Some(Self::F32),
            "i32" | "int32" => Some(Self::I32),
            _ => None,
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
    /// Float elements.
    F32(Vec<f32>),
    /// Integer elements.
    I32(Vec<i32>),
}

/// A host tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its elements, row-major.
    pub data: Data,
}

impl Tensor {
    /// A float tensor.
    pub fn f32(shape: Vec<usize>, values: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), values.len());
        Self {
            shape,
            data: Data::F32(values),
        }
    }

    /// An integer tensor.
    pub fn i32(shape: Vec<usize>, values: Vec<i32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), values.len());
        Self {
            shape,
            data: Data::I32(values),
        }
    }

    /// Its element type.
    pub fn dtype(&self) -> DType {
        match self.data {
            Data::F32(_) => DType::F32,
            Data::I32(_) => DType::I32,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::F32(v) => v.len(),
            Data::I32(v) => v.len(),
        }
    }

    /// True when it has no elements.
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

    /// A tensor from 32-bit words as the device holds them.
    pub fn from_words(shape: Vec<usize>, dtype: DType, words: &[u32]) -> Self {
        let data = match dtype {
            DType::F32 => Data::F32(words.iter().map(|&w| f32::from_bits(w)).collect()),
            DType::I32 => Data::I32(words.iter().map(|&w| w as i32).collect()),
        };
        Self { shape, data }
    }

    /// Writes the tensor as a `.npy` file (through a temp file, so a reader never sees half of one).
    pub fn write_npy(&self, path: &Path) -> std::io::Result<()> {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        let shape: Vec<u64> = self.shape.iter().map(|&d| d as u64).collect();
        {
            let file = std::io::BufWriter::new(tmp.as_file_mut());
            match &self.data {
                Data::F32(v) => write_values(file, &shape, v)?,
                Data::I32(v) => write_values(file, &shape, v)?,
            }
        }
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }

    /// Reads a little-endian, C-order `.npy` file of float32 or int32 (int64 is narrowed when it fits).
    pub fn read_npy(path: &Path) -> Result<Self, String> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse_npy(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses `.npy` bytes; the header's claims (shape, size) are checked against the data before any
    /// allocation, so a hostile file is an error, never a huge allocation.
    pub fn parse_npy(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
            return Err("not a .npy file".into());
        }
        let mut body: &[u8] = bytes;
        let (shape, descr, order) = {
            let npy = npyz::NpyFile::new(&mut body).map_err(|e| format!("bad .npy header: {e}"))?;
            let descr = match npy.dtype() {
                npyz::DType::Plain(ts) => ts.to_string(),
                other => {
                    return Err(format!(
                        "unsupported dtype {} (use float32 or int32)",
                        other.descr()
                    ))
                }
            };
            (npy.shape().to_vec(), descr, npy.order())
        };
        if order == npyz::Order::Fortran {
            return Err(
                "Fortran-order arrays are not supported; save with np.ascontiguousarray".into(),
            );
        }
        let shape: Vec<usize> = shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("bad shape {shape:?}")))
            .collect::<Result<_, _>>()?;
        let count = element_count(&shape)
            .ok_or_else(|| format!("shape {shape:?} has more than {MAX_ELEMENTS} elements"))?;
        let width = match descr.as_str() {
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
        let npy = npyz::NpyFile::new(bytes).map_err(|e| format!("bad .npy header: {e}"))?;
        let bad = |e: std::io::Error| format!("bad .npy data: {e}");
        Ok(match descr.as_str() {
            "<f4" => Self::f32(shape, npy.into_vec::<f32>().map_err(bad)?),
            "<i4" => Self::i32(shape, npy.into_vec::<i32>().map_err(bad)?),
            _ => {
                let wide = npy.into_vec::<i64>().map_err(bad)?;
                let values = wide
                    .into_iter()
                    .map(|v| {
                        i32::try_from(v).map_err(|_| format!("int64 value {v} does not fit int32"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Self::i32(shape, values)
            }
        })
    }
}

/// Writes `values` as one `.npy` array of `shape` in the element type's default dtype.
fn write_values<T: npyz::AutoSerialize + Copy>(
    file: impl std::io::Write,
    shape: &[u64],
    values: &[T],
) -> std::io::Result<()> {
    use npyz::WriterBuilder;
    let mut w = npyz::WriteOptions::<T>::new()
        .default_dtype()
        .shape(shape)
        .writer(file)
        .begin_nd()?;
    w.extend(values.iter().copied())?;
    w.finish()
}

/// A small, fast, seeded generator: the same seed gives the same tensor on every machine.
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
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
        // A Python dict literal numpy's header parser accepts: `(3, )` is the tuple `(3,)`.
        assert!(
            header.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (3, ), }"),
            "{header:?}"
        );
        assert_eq!(
            Tensor::read_npy(&p).unwrap(),
            Tensor::f32(vec![3], vec![0.0; 3])
        );
        let ints = Tensor::i32(vec![2, 3], vec![1, -2, 3, -4, 5, i32::MAX]);
        ints.write_npy(&p).unwrap();
        assert_eq!(Tensor::read_npy(&p).unwrap(), ints);
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
