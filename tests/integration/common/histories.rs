//! Linear test histories built with the repository builder: one commit per file set, or one per mode
//! a scripted repro reads.

use std::path::Path;

use git2::Oid;

use super::repo_builder::{put, Files, RepoBuilder};

/// A linear history at `path`: one commit per file set (`commit 0`, `commit 1`, …), with `main` at the
/// last one and checked out. Returns the commits, oldest first.
pub fn linear_history(
    path: &Path,
    commits: impl IntoIterator<Item = Files>,
) -> Result<Vec<Oid>, git2::Error> {
    let mut b = RepoBuilder::init(path)?;
    let mut oids: Vec<Oid> = Vec::new();
    for (i, files) in commits.into_iter().enumerate() {
        let parents: Vec<Oid> = oids.last().copied().into_iter().collect();
        oids.push(b.commit(&parents, &files, &format!("commit {i}"))?);
    }
    if let Some(last) = oids.last() {
        b.set_branch("main", *last)?;
        b.checkout_main()?;
    }
    Ok(oids)
}

/// A linear history of test commits: each holds the `fixed` files, its mode in `mode.txt`, its index in
/// `rev.txt`, and `config` as `bisect.toml` (what a scripted repro reads to decide how to fail).
pub fn history_of_modes(
    path: &Path,
    modes: &[&str],
    fixed: &Files,
    config: &str,
) -> Result<Vec<Oid>, git2::Error> {
    linear_history(
        path,
        modes.iter().enumerate().map(|(i, mode)| {
            let mut f = fixed.clone();
            put(&mut f, "mode.txt", *mode, false);
            put(&mut f, "rev.txt", format!("{i}\n"), false);
            put(&mut f, "bisect.toml", config, false);
            f
        }),
    )
}
