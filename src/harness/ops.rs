//! The layer zoo's operators: their names, inputs, parameters, output shapes and default kernels. Both
//! backends and the model validator share these definitions, so a shape error is found before anything runs.

use super::tensor::DType;

/// An operator of the layer zoo.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `out[i, :] = table[ids[i], :]`.
    Embedding,
    /// `out = a @ b` for `a: [m, k]`, `b: [k, n]`.
    Matmul,
    /// `out[r, :] = x[r, :] + bias`.
    BiasAdd,
    /// `max(x, 0)`.
    Relu,
    /// The tanh approximation, as GPT-2 uses it.
    Gelu,
    /// Over the last axis, with `eps`.
    LayerNorm,
    /// Over the last axis.
    Softmax,
    /// Elementwise `x + y` (a residual connection).
    Add,
    /// `[m, n] -> [n, m]`.
    Transpose,
    /// `out = x`.
    Copy,
    /// `out = base; out[index[i], :] += src[i, :]`.
    IndexAdd,
    /// `out = base; out[index[i], ...] = src[i, ...]`.
    Scatter,
    /// Over the last axis.
    Sum,
    /// Over the last axis.
    Mean,
}

/// Per-node parameters; each op reads the ones it documents.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params {
    /// Layernorm epsilon.
    pub eps: Option<f64>,
    /// Scatter and index_add write into their `base` input instead of a new output.
    pub inplace: bool,
}

impl Op {
    /// Every op, in declaration order.
    pub const ALL: [Op; 14] = [
        Op::Embedding,
        Op::Matmul,
        Op::BiasAdd,
        Op::Relu,
        Op::Gelu,
        Op::LayerNorm,
        Op::Softmax,
        Op::Add,
        Op::Transpose,
        Op::Copy,
        Op::IndexAdd,
        Op::Scatter,
        Op::Sum,
        Op::Mean,
    ];

    /// The name model files use.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Embedding => "embedding",
            Op::Matmul => "matmul",
            Op::BiasAdd => "bias_add",
            Op::Relu => "relu",
            Op::Gelu => "gelu",
            Op::LayerNorm => "layernorm",
            Op::Softmax => "softmax",
            Op::Add => "add",
            Op::Transpose => "transpose",
            Op::Copy => "copy",
            Op::IndexAdd => "index_add",
            Op::Scatter => "scatter",
            Op::Sum => "sum",
            Op::Mean => "mean",
        }
    }

    /// Parses a model file's op name.
    pub fn parse(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.as_str() == name)
    }

    /// The names of the inputs, in order, for messages and the graph description.
    pub fn input_roles(self) -> &'static [&'static str] {
        match self {
            Op::Embedding => &["table", "ids"],
            Op::Matmul => &["a", "b"],
            Op::BiasAdd => &["x", "bias"],
            Op::LayerNorm => &["x", "gamma", "beta"],
            Op::Add => &["x", "y"],
            Op::IndexAdd | Op::Scatter => &["base", "index", "src"],
            Op::Relu | Op::Gelu | Op::Softmax | Op::Transpose | Op::Copy | Op::Sum | Op::Mean => {
                &["x"]
            }
        }
    }

    /// Ops that may write into their first input.
    pub fn can_be_inplace(self) -> bool {
        matches!(self, Op::IndexAdd | Op::Scatter)
    }

    /// The built-in kernel for this op and element type.
    pub fn default_kernel(self, dtype: DType) -> &'static str {
        match self {
            Op::Embedding => "embedding_gather",
            Op::Matmul => "matmul_f32",
            Op::BiasAdd => "bias_add_f32",
            Op::Relu => "relu_f32",
            Op::Gelu => "gelu_f32",
            Op::LayerNorm => "layernorm_f32",
            Op::Softmax => "softmax_f32",
            Op::Add => "add_f32",
            Op::Transpose => "transpose_32",
            Op::Copy => "copy_32",
            Op::IndexAdd => "index_add_f32",
            Op::Scatter => match dtype {
                DType::F32 | DType::I32 => "scatter_32",
            },
            Op::Sum => "sum_lastdim_f32",
            Op::Mean => "mean_lastdim_f32",
        }
    }

    /// Checks the inputs and parameters and gives the output's shape and type (`None` when in place).
    pub fn infer(
        self,
        inputs: &[(&[usize], DType)],
        params: &Params,
    ) -> Result<Option<(Vec<usize>, DType)>, String> {
        let roles = self.input_roles();
        if inputs.len() != roles.len() {
            return Err(format!(
                "{} takes {} inputs ({}), got {}",
                self.as_str(),
                roles.len(),
                roles.join(", "),
                inputs.len()
            ));
        }
        if params.inplace && !self.can_be_inplace() {
            return Err(format!(
                "{} cannot run in place (only scatter and index_add can)",
                self.as_str()
            ));
        }
        if params.eps.is_some() && self != Op::LayerNorm {
            return Err(format!(
                "{} takes no eps (only layernorm does)",
                self.as_str()
            ));
        }
        let want = |i: usize, dtype: DType| -> Result<(), String> {
            if inputs[i].1 == dtype {
                Ok(())
            } else {
                Err(format!(
                    "input {} ({}) must be {dtype}, is {}",
                    i, roles[i], inputs[i].1
                ))
            }
        };
        let rank = |i: usize, r: usize| -> Result<(), String> {
            if inputs[i].0.len() == r {
                Ok(())
            } else {
                Err(format!(
                    "input {} ({}) must have rank {r}, has shape {:?}",
                    i, roles[i], inputs[i].0
                ))
            }
        };
        let last = |i: usize| *inputs[i].0.last().unwrap_or(&1);
        let x = inputs[0].0;
        let out = match self {
            Op::Embedding => {
                want(0, DType::F32)?;
                want(1, DType::I32)?;
                rank(0, 2)?;
                rank(1, 1)?;
                (vec![inputs[1].0[0], x[1]], DType::F32)
            }
            Op::Matmul => {
                want(0, DType::F32)?;
                want(1, DType::F32)?;
                rank(0, 2)?;
                rank(1, 2)?;
                let b = inputs[1].0;
                if x[1] != b[0] {
                    return Err(format!(
                        "matmul of {x:?} by {b:?}: inner dimensions {} and {} differ",
                        x[1], b[0]
                    ));
                }
                (vec![x[0], b[1]], DType::F32)
            }
            Op::BiasAdd => {
                want(0, DType::F32)?;
                want(1, DType::F32)?;
                rank(1, 1)?;
                if last(0) != inputs[1].0[0] {
                    return Err(format!(
                        "bias of {:?} does not match the last axis of {x:?}",
                        inputs[1].0
                    ));
                }
                (x.to_vec(), DType::F32)
            }
            Op::Relu | Op::Gelu | Op::Softmax => {
                want(0, DType::F32)?;
                (x.to_vec(), DType::F32)
            }
            Op::LayerNorm => {
                for i in 0..3 {
                    want(i, DType::F32)?;
                }
                rank(1, 1)?;
                rank(2, 1)?;
                if inputs[1].0[0] != last(0) || inputs[2].0[0] != last(0) {
                    return Err(format!(
                        "gamma {:?} and beta {:?} must match the last axis of {x:?}",
                        inputs[1].0, inputs[2].0
                    ));
                }
                (x.to_vec(), DType::F32)
            }
            Op::Add => {
                want(0, DType::F32)?;
                want(1, DType::F32)?;
                if inputs[0].0 != inputs[1].0 {
                    return Err(format!(
                        "add of shapes {:?} and {:?}: they must be equal",
                        inputs[0].0, inputs[1].0
                    ));
                }
                (x.to_vec(), DType::F32)
            }
            Op::Transpose => {
                rank(0, 2)?;
                (vec![x[1], x[0]], inputs[0].1)
            }
            Op::Copy => (x.to_vec(), inputs[0].1),
            Op::IndexAdd | Op::Scatter => {
                if self == Op::IndexAdd {
                    want(0, DType::F32)?;
                }
                want(1, DType::I32)?;
                rank(1, 1)?;
                let (base, src) = (inputs[0].0, inputs[2].0);
                if inputs[2].1 != inputs[0].1 {
                    return Err(format!(
                        "src is {} but base is {}",
                        inputs[2].1, inputs[0].1
                    ));
                }
                if base.is_empty()
                    || src.len() != base.len()
                    || src[1..] != base[1..]
                    || src[0] != inputs[1].0[0]
                {
                    return Err(format!(
                        "src {src:?} must be [len(index)={}] + base {base:?} without its first axis",
                        inputs[1].0[0]
                    ));
                }
                if params.inplace {
                    return Ok(None);
                }
                (base.to_vec(), inputs[0].1)
            }
            Op::Sum | Op::Mean => {
                want(0, DType::F32)?;
                let mut s = x.to_vec();
                s.pop();
                if s.is_empty() {
                    s.push(1);
                }
                (s, DType::F32)
            }
        };
        Ok(Some(out))
    }
}

/// Splits a shape into (rows, last axis), the view every last-axis op works on.
pub fn rows_cols(shape: &[usize]) -> (usize, usize) {
    let cols = *shape.last().unwrap_or(&1);
    let rows = shape.iter().product::<usize>() / cols.max(1);
    (rows, cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> Params {
        Params::default()
    }

    #[test]
    fn names_round_trip() {
        for op in Op::ALL {
            assert_eq!(Op::parse(op.as_str()), Some(op));
        }
        assert_eq!(Op::parse("conv2d"), None);
    }

    #[test]
    fn shapes_are_inferred() {
        use DType::*;
        let f = |s: &'static [usize]| (s, F32);
        assert_eq!(
            Op::Matmul.infer(&[f(&[4, 8]), f(&[8, 3])], &p()).unwrap(),
            Some((vec![4, 3], F32))
        );
        assert_eq!(
            Op::Embedding
                .infer(&[f(&[100, 16]), (&[7], I32)], &p())
                .unwrap(),
            Some((vec![7, 16], F32))
        );
        assert_eq!(
            Op::Transpose.infer(&[(&[2, 5], I32)], &p()).unwrap(),
            Some((vec![5, 2], I32))
        );
        assert_eq!(
            Op::Sum.infer(&[f(&[3, 4])], &p()).unwrap(),
            Some((vec![3], F32))
        );
        let inplace = Params {
            inplace: true,
            ..p()
        };
        assert_eq!(
            Op::Scatter
                .infer(&[(&[10], I32), (&[2], I32), (&[2], I32)], &inplace)
                .unwrap(),
            None
        );
    }

    #[test]
    fn mismatches_are_explained() {
        use DType::*;
        let f = |s: &'static [usize]| (s, F32);
        let e = Op::Matmul
            .infer(&[f(&[4, 8]), f(&[7, 3])], &p())
            .unwrap_err();
        assert!(e.contains("inner dimensions 8 and 7"), "{e}");
        let e = Op::Embedding
            .infer(&[f(&[100, 16]), f(&[7])], &p())
            .unwrap_err();
        assert!(e.contains("ids") && e.contains("must be i32"), "{e}");
        let e = Op::Add.infer(&[f(&[2, 3])], &p()).unwrap_err();
        assert!(e.contains("takes 2 inputs"), "{e}");
        let e = Op::Relu
            .infer(
                &[f(&[2])],
                &Params {
                    inplace: true,
                    ..p()
                },
            )
            .unwrap_err();
        assert!(e.contains("in place"), "{e}");
        let e = Op::Scatter
            .infer(&[(&[10, 4], I32), (&[2], I32), (&[2, 3], I32)], &p())
            .unwrap_err();
        assert!(e.contains("src"), "{e}");
    }
}
