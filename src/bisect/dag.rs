//! The commit DAG both searches walk: parent lists in one flat array, in topological order.

/// Commits `0..n` in topological order; `parents_of(i)` are indices smaller than `i`. Parents outside
/// `0..i` are dropped when it is built: they lie outside the range.
#[derive(Clone, Debug)]
pub struct Dag {
    /// `parents[offsets[i]..offsets[i + 1]]` are the parents of commit `i`.
    offsets: Vec<u32>,
    parents: Vec<u32>,
}

impl Dag {
    /// Flattens `parents`.
    ///
    /// # Panics
    /// When `parents` is empty: a search range always holds at least its bad end.
    pub fn new(parents: &[Vec<usize>]) -> Self {
        assert!(
            !parents.is_empty(),
            "a search range holds at least the bad commit"
        );
        let mut offsets = Vec::with_capacity(parents.len() + 1);
        let mut flat = Vec::with_capacity(parents.len());
        offsets.push(0);
        for (i, ps) in parents.iter().enumerate() {
            flat.extend(ps.iter().filter(|&&p| p < i).map(|&p| p as u32));
            offsets.push(flat.len() as u32);
        }
        Self {
            offsets,
            parents: flat,
        }
    }

    /// How many commits.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Never: a DAG holds at least the bad end.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The parents of `c` within the range.
    pub fn parents_of(&self, c: usize) -> &[u32] {
        &self.parents[self.offsets[c] as usize..self.offsets[c + 1] as usize]
    }
}
