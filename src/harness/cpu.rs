//! The CPU reference backend: plain, bounds-checked implementations of every zoo op. It is the numerical
//! reference for the GPU kernels, and on a machine without a GPU it finds out-of-range indices exactly
//! where the device would have read or written past a buffer.

use super::model::Node;
use super::ops::{rows_cols, Op};
use super::tensor::{Data, Tensor};

/// An index outside its buffer, found before the access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuFault {
    /// "reads" or "writes".
    pub access: &'static str,
    /// The buffer that would have been accessed out of bounds.
    pub buffer: String,
    /// The offending row.
    pub row: i64,
    /// The buffer's row count.
    pub rows: usize,
    /// Where the index came from: `tensor[i]`.
    pub index_from: String,
}

impl CpuFault {
    /// The line the classifier reads: class `illegal_address`, honestly labelled as found on the CPU.
    pub fn message(&self, node: &Node) -> String {
        format!(
            "cpu-reference: illegal memory access was encountered: node {} ({}) {} row {} of {} ({} rows); the index is {}",
            node.id,
            node.op.as_str(),
            self.access,
            self.row,
            self.buffer,
            self.rows,
            self.index_from
        )
    }
}

fn f32s(t: &Tensor) -> &[f32] {
    match &t.data {
        Data::F32(v) => v,
        Data::I32(_) => panic!("validated as f32"),
    }
}

fn i32s(t: &Tensor) -> &[i32] {
    match &t.data {
        Data::I32(v) => v,
        Data::F32(_) => panic!("validated as i32"),
    }
}

/// The tanh approximation of GELU, written the same way as the device kernel.
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

/// Runs one node on host tensors (already checked against the model's shapes and types). `names` are the
/// input tensors' names, for fault messages. Returns the output, or for an in-place node the new base.
pub fn exec(node: &Node, inputs: &[&Tensor], names: &[String]) -> Result<Tensor, CpuFault> {
    let x = inputs[0];
    let shape = x.shape.clone();
    let map = |f: &dyn Fn(f32) -> f32| {
        Tensor::f32(shape.clone(), f32s(x).iter().map(|&v| f(v)).collect())
    };
    let row_check = |access: &'static str,
                     buffer: usize,
                     rows: usize,
                     index: usize,
                     i: usize|
     -> Result<usize, CpuFault> {
        let row = i32s(inputs[index])[i] as i64;
        if row < 0 || row as usize >= rows {
            return Err(CpuFault {
                access,
                buffer: names[buffer].clone(),
                row,
                rows,
                index_from: format!("{}[{i}]", names[index]),
            });
        }
        Ok(row as usize)
    };
    Ok(match node.op {
        Op::Embedding => {
            let (rows, d) = (x.shape[0], x.shape[1]);
            let table = f32s(x);
            let n = inputs[1].shape[0];
            let mut out = Vec::with_capacity(n * d);
            for i in 0..n {
                let r = row_check("reads", 0, rows, 1, i)?;
                out.extend_from_slice(&table[r * d..(r + 1) * d]);
            }
            Tensor::f32(vec![n, d], out)
        }
        Op::Matmul => {
            let (m, k) = (x.shape[0], x.shape[1]);
            let n = inputs[1].shape[1];
            let (a, b) = (f32s(x), f32s(inputs[1]));
            let mut out = vec![0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0f32;
                    for p in 0..k {
                        acc += a[i * k + p] * b[p * n + j];
                    }
                    out[i * n + j] = acc;
                }
            }
            Tensor::f32(vec![m, n], out)
        }
        Op::BiasAdd => {
            let bias = f32s(inputs[1]);
            let n = bias.len();
            Tensor::f32(
                shape.clone(),
                f32s(x)
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v + bias[i % n])
                    .collect(),
            )
        }
        Op::Relu => map(&|v| v.max(0.0)),
        Op::Gelu => map(&gelu),
        Op::Add => {
            let y = f32s(inputs[1]);
            Tensor::f32(
                shape.clone(),
                f32s(x).iter().zip(y).map(|(a, b)| a + b).collect(),
            )
        }
        Op::LayerNorm => {
            let (rows, n) = rows_cols(&shape);
            let (xs, g, b) = (f32s(x), f32s(inputs[1]), f32s(inputs[2]));
            let mut out = vec![0f32; rows * n];
            for r in 0..rows {
                let row = &xs[r * n..(r + 1) * n];
                let mean = row.iter().sum::<f32>() / n as f32;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
                let inv = 1.0 / (var + node.eps).sqrt();
                for c in 0..n {
                    out[r * n + c] = (row[c] - mean) * inv * g[c] + b[c];
                }
            }
            Tensor::f32(shape.clone(), out)
        }
        Op::Softmax => {
            let (rows, n) = rows_cols(&shape);
            let xs = f32s(x);
            let mut out = vec![0f32; rows * n];
            for r in 0..rows {
                let row = &xs[r * n..(r + 1) * n];
                let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
                for c in 0..n {
                    out[r * n + c] = (row[c] - max).exp() / sum;
                }
            }
            Tensor::f32(shape.clone(), out)
        }
        Op::Sum | Op::Mean => {
            let (rows, n) = rows_cols(&shape);
            let xs = f32s(x);
            let mut out_shape = shape.clone();
            out_shape.pop();
            if out_shape.is_empty() {
                out_shape.push(1);
            }
            let scale = if node.op == Op::Mean {
                1.0 / n as f32
            } else {
                1.0
            };
            Tensor::f32(
                out_shape,
                (0..rows)
                    .map(|r| xs[r * n..(r + 1) * n].iter().sum::<f32>() * scale)
                    .collect(),
            )
        }
        Op::Transpose => {
            let (m, n) = (shape[0], shape[1]);
            let words = x.to_words();
            let mut out = vec![0u32; m * n];
            for i in 0..m {
                for j in 0..n {
                    out[j * m + i] = words[i * n + j];
                }
            }
            Tensor::from_words(vec![n, m], x.dtype(), &out)
        }
        Op::Copy => x.clone(),
        Op::Scatter | Op::IndexAdd => {
            let rows = shape[0];
            let inner: usize = shape[1..].iter().product();
            let k = inputs[1].shape[0];
            let mut out = x.to_words();
            let src = inputs[2].to_words();
            for i in 0..k {
                let r = row_check("writes", 0, rows, 1, i)?;
                for c in 0..inner {
                    let (o, s) = (r * inner + c, i * inner + c);
                    out[o] = if node.op == Op::Scatter {
                        src[s]
                    } else {
                        (f32::from_bits(out[o]) + f32::from_bits(src[s])).to_bits()
                    };
                }
            }
            Tensor::from_words(shape.clone(), x.dtype(), &out)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: Op) -> Node {
        Node {
            id: "n".into(),
            op,
            inputs: vec![],
            outputs: vec![],
            kernel: String::new(),
            eps: 1e-5,
            inplace: false,
        }
    }

    fn names(k: usize) -> Vec<String> {
        ["a", "b", "c"][..k].iter().map(|s| s.to_string()).collect()
    }

    fn run(op: Op, inputs: &[&Tensor]) -> Result<Tensor, CpuFault> {
        exec(&node(op), inputs, &names(inputs.len()))
    }

    fn close(a: &Tensor, want: &[f32]) {
        let Data::F32(v) = &a.data else { panic!("f32") };
        assert_eq!(v.len(), want.len());
        for (x, y) in v.iter().zip(want) {
            assert!((x - y).abs() < 1e-5, "{v:?} vs {want:?}");
        }
    }

    #[test]
    fn hand_computed_cases() {
        let a = Tensor::f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let b = Tensor::f32(vec![3, 2], vec![1., 0., 0., 1., 1., 1.]);
        close(&run(Op::Matmul, &[&a, &b]).unwrap(), &[4., 5., 10., 11.]);
        let bias = Tensor::f32(vec![3], vec![10., 20., 30.]);
        close(
            &run(Op::BiasAdd, &[&a, &bias]).unwrap(),
            &[11., 22., 33., 14., 25., 36.],
        );
        close(&run(Op::Sum, &[&a]).unwrap(), &[6., 15.]);
        close(&run(Op::Mean, &[&a]).unwrap(), &[2., 5.]);
        close(
            &run(Op::Add, &[&a, &a]).unwrap(),
            &[2., 4., 6., 8., 10., 12.],
        );
        let t = run(Op::Transpose, &[&a]).unwrap();
        assert_eq!(t.shape, vec![3, 2]);
        close(&t, &[1., 4., 2., 5., 3., 6.]);
        let neg = Tensor::f32(vec![3], vec![-1., 0., 2.]);
        close(&run(Op::Relu, &[&neg]).unwrap(), &[0., 0., 2.]);
        close(
            &run(Op::Gelu, &[&neg]).unwrap(),
            &[-0.158_808, 0., 1.954_598],
        );
        let sm = run(Op::Softmax, &[&Tensor::f32(vec![1, 2], vec![0., 0.])]).unwrap();
        close(&sm, &[0.5, 0.5]);
        let ln = run(
            Op::LayerNorm,
            &[
                &Tensor::f32(vec![1, 2], vec![1., 3.]),
                &Tensor::f32(vec![2], vec![1., 1.]),
                &Tensor::f32(vec![2], vec![0., 0.]),
            ],
        )
        .unwrap();
        close(&ln, &[-0.999_995, 0.999_995]);
    }

    #[test]
    fn gather_scatter_and_index_add() {
        let table = Tensor::f32(vec![3, 2], vec![0., 1., 10., 11., 20., 21.]);
        let ids = Tensor::i32(vec![2], vec![2, 0]);
        close(
            &run(Op::Embedding, &[&table, &ids]).unwrap(),
            &[20., 21., 0., 1.],
        );
        let src = Tensor::f32(vec![2, 2], vec![1., 1., 2., 2.]);
        close(
            &run(Op::IndexAdd, &[&table, &ids, &src]).unwrap(),
            &[2., 3., 10., 11., 21., 22.],
        );
        let base = Tensor::i32(vec![4], vec![0, 1, 2, 3]);
        let pos = Tensor::i32(vec![1], vec![3]);
        let val = Tensor::i32(vec![1], vec![99]);
        assert_eq!(
            run(Op::Scatter, &[&base, &pos, &val]).unwrap(),
            Tensor::i32(vec![4], vec![0, 1, 2, 99])
        );
    }

    #[test]
    fn out_of_range_indices_are_faults_that_name_buffer_and_index() {
        let table = Tensor::f32(vec![3, 2], vec![0.; 6]);
        let ids = Tensor::i32(vec![3], vec![0, 3, 1]);
        let f = run(Op::Embedding, &[&table, &ids]).unwrap_err();
        assert_eq!(
            (f.access, f.buffer.as_str(), f.row, f.rows),
            ("reads", "a", 3, 3)
        );
        assert_eq!(f.index_from, "b[1]");
        let mut n = node(Op::Embedding);
        n.id = "emb".into();
        let line = f.message(&n);
        assert!(line.starts_with("cpu-reference: illegal memory access was encountered: node emb (embedding) reads row 3 of a"));
        let sig = crate::classify::classify(crate::classify::Exit::Code(1), &line);
        assert_eq!(sig.class, crate::classify::FaultClass::IllegalAddress);
        let neg = Tensor::i32(vec![1], vec![-1]);
        let src = Tensor::f32(vec![1, 2], vec![0.; 2]);
        let f = run(Op::Scatter, &[&table, &neg, &src]).unwrap_err();
        assert_eq!((f.access, f.row), ("writes", -1));
    }
}
