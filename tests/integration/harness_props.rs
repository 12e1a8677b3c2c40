//! Properties of the CPU reference ops on random inputs: algebraic identities that any correct
//! implementation keeps, and bounds checks that fire exactly when an index leaves its buffer.

use cudabisect::harness::cpu::exec;
use cudabisect::harness::model::Node;
use cudabisect::harness::ops::Op;
use cudabisect::harness::tensor::{Data, Tensor};
use proptest::prelude::*;

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

fn run(op: Op, inputs: &[&Tensor]) -> Result<Tensor, cudabisect::harness::cpu::CpuFault> {
    let names: Vec<String> = (0..inputs.len()).map(|i| format!("t{i}")).collect();
    exec(&node(op), inputs, &names)
}

fn f32s(t: &Tensor) -> Vec<f32> {
    match &t.data {
        Data::F32(v) => v.clone(),
        Data::I32(_) => panic!("f32 expected"),
    }
}

fn matrix() -> impl Strategy<Value = Tensor> {
    (1usize..8, 1usize..8).prop_flat_map(|(m, n)| {
        prop::collection::vec(-10f32..10f32, m * n).prop_map(move |v| Tensor::f32(vec![m, n], v))
    })
}

proptest! {
    #[test]
    fn transposing_twice_is_the_identity(x in matrix()) {
        let t = run(Op::Transpose, &[&x]).unwrap();
        prop_assert_eq!(run(Op::Transpose, &[&t]).unwrap(), x);
    }

    #[test]
    fn softmax_rows_are_distributions(x in matrix()) {
        let y = f32s(&run(Op::Softmax, &[&x]).unwrap());
        let n = x.shape[1];
        for row in y.chunks(n) {
            prop_assert!(row.iter().all(|&p| (0.0..=1.0).contains(&p)));
            prop_assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
    }

    #[test]
    fn multiplying_by_the_identity_changes_nothing(x in matrix()) {
        let n = x.shape[1];
        let eye = Tensor::f32(vec![n, n], (0..n * n).map(|i| if i / n == i % n { 1.0 } else { 0.0 }).collect());
        prop_assert_eq!(run(Op::Matmul, &[&x, &eye]).unwrap(), x);
    }

    #[test]
    fn layernorm_rows_have_zero_mean(x in matrix()) {
        let n = x.shape[1];
        let ones = Tensor::f32(vec![n], vec![1.0; n]);
        let zeros = Tensor::f32(vec![n], vec![0.0; n]);
        let y = f32s(&run(Op::LayerNorm, &[&x, &ones, &zeros]).unwrap());
        for (row, input) in y.chunks(n).zip(f32s(&x).chunks(n)) {
            // Rounding in the row's own mean is divided by its (small) spread: the tolerance grows with
            // the inputs' size (a row [8.2698, 8.2739] is off by about 1.3e-4).
            let scale = input.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            prop_assert!((row.iter().sum::<f32>() / n as f32).abs() < 1e-4 * scale);
        }
    }

    #[test]
    fn a_gather_faults_exactly_when_an_id_leaves_the_table(rows in 1usize..20, ids in prop::collection::vec(-3i32..25, 1..10)) {
        let table = Tensor::f32(vec![rows, 2], (0..rows * 2).map(|i| i as f32).collect());
        let idx = Tensor::i32(vec![ids.len()], ids.clone());
        let first_bad = ids.iter().position(|&i| i < 0 || i as usize >= rows);
        match (run(Op::Embedding, &[&table, &idx]), first_bad) {
            (Ok(out), None) => {
                let v = f32s(&out);
                for (k, &id) in ids.iter().enumerate() {
                    prop_assert_eq!(v[2 * k], (2 * id) as f32);
                }
            }
            (Err(f), Some(k)) => {
                prop_assert_eq!(f.row, ids[k] as i64);
                prop_assert_eq!(f.index_from, format!("t1[{k}]"));
            }
            (r, bad) => prop_assert!(false, "{:?} with first bad index {:?}", r, bad),
        }
    }

    #[test]
    fn scattered_rows_are_gathered_back(rows in 2usize..16, seed in any::<u64>()) {
        // Distinct target rows, so the scatter is deterministic.
        let mut order: Vec<i32> = (0..rows as i32).collect();
        let mut g = cudabisect::harness::tensor::SplitMix64::new(seed);
        for i in (1..order.len()).rev() {
            order.swap(i, (g.next_u64() % (i as u64 + 1)) as usize);
        }
        let k = rows / 2 + 1;
        let idx = Tensor::i32(vec![k], order[..k].to_vec());
        let src = Tensor::f32(vec![k, 3], (0..k * 3).map(|i| i as f32 + 0.5).collect());
        let base = Tensor::f32(vec![rows, 3], vec![0.0; rows * 3]);
        let out = run(Op::Scatter, &[&base, &idx, &src]).unwrap();
        prop_assert_eq!(run(Op::Embedding, &[&out, &idx]).unwrap(), src);
    }
}
