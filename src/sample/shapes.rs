//! Commit-graph shapes and a seeded generator for the search benchmarks and tests: the pure search runs
//! on parent lists, without git.

/// Parent lists of `n` commits: `"linear"`, or a main line merging a 3-commit side branch every 8 commits
/// (as the git comparison benchmark builds with git).
pub fn history(shape: &str, n: usize) -> Vec<Vec<usize>> {
    let mut parents: Vec<Vec<usize>> = vec![vec![]];
    if shape == "linear" {
        for i in 1..n {
            parents.push(vec![i - 1]);
        }
        return parents;
    }
    let mut head = 0;
    while parents.len() < n {
        let mut side = head;
        for _ in 0..3 {
            parents.push(vec![side]);
            side = parents.len() - 1;
        }
        for _ in 0..4 {
            parents.push(vec![head]);
            head = parents.len() - 1;
        }
        parents.push(vec![head, side]);
        head = parents.len() - 1;
    }
    parents
}

/// xorshift64*: a small seeded generator, so a simulated flaky fault is the same run after run.
#[derive(Clone, Debug)]
pub struct SeededRng(pub u64);

impl SeededRng {
    /// A uniform number in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_topological_and_merge_heavy_merges() {
        for shape in ["linear", "merge-heavy"] {
            let h = history(shape, 100);
            assert!(h.len() >= 100);
            assert!(h
                .iter()
                .enumerate()
                .all(|(i, ps)| ps.iter().all(|&p| p < i)));
        }
        assert!(history("merge-heavy", 100).iter().any(|ps| ps.len() == 2));
        let mut r = SeededRng(7);
        let xs: Vec<f64> = (0..1000).map(|_| r.unit()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
    }
}
