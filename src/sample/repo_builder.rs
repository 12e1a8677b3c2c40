//! Builds git repositories from in-memory file maps: the demo's sample history (and, compiled into the
//! integration tests by path, their repositories; it is not part of the library's API). Commits get
//! fixed, increasing timestamps so that histories are reproducible.

use std::collections::BTreeMap;
use std::path::Path;

use git2::{IndexEntry, IndexTime, Oid, Repository, Signature, Time};

/// The files of one commit: path → (content, executable).
pub type Files = BTreeMap<String, (String, bool)>;

/// A repository being written commit by commit.
pub struct RepoBuilder {
    repo: Repository,
    clock: i64,
}

impl RepoBuilder {
    /// Initialises a repository at `path` with `main` as its branch.
    pub fn init(path: &Path) -> Result<Self, git2::Error> {
        let mut opts = git2::RepositoryInitOptions::new();
        opts.initial_head("main");
        let repo = Repository::init_opts(path, &opts)?;
        Ok(Self {
            repo,
            clock: 1_700_000_000,
        })
    }

    /// Writes a commit with exactly `files` and the given parents, without moving any ref.
    pub fn commit(
        &mut self,
        parents: &[Oid],
        files: &Files,
        message: &str,
    ) -> Result<Oid, git2::Error> {
        let mut index = git2::Index::new()?;
        for (path, (content, exec)) in files {
            let id = self.repo.blob(content.as_bytes())?;
            index.add(&IndexEntry {
                ctime: IndexTime::new(0, 0),
                mtime: IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: if *exec { 0o100755 } else { 0o100644 },
                uid: 0,
                gid: 0,
                file_size: content.len() as u32,
                id,
                flags: path.len().min(0xfff) as u16,
                flags_extended: 0,
                path: path.as_bytes().to_vec(),
            })?;
        }
        let tree = self.repo.find_tree(index.write_tree_to(&self.repo)?)?;
        self.clock += 3600;
        let sig = Signature::new("Demo Dev", "dev@example.com", &Time::new(self.clock, 0))?;
        let parents: Vec<git2::Commit> = parents
            .iter()
            .map(|p| self.repo.find_commit(*p))
            .collect::<Result<_, _>>()?;
        let parent_refs: Vec<&git2::Commit> = parents.iter().collect();
        self.repo
            .commit(None, &sig, &sig, message, &tree, &parent_refs)
    }

    /// Points `refs/heads/<branch>` at `oid`.
    pub fn set_branch(&self, branch: &str, oid: Oid) -> Result<(), git2::Error> {
        self.repo
            .reference(&format!("refs/heads/{branch}"), oid, true, "builder")?;
        Ok(())
    }

    /// Creates a lightweight tag.
    pub fn tag(&self, name: &str, oid: Oid) -> Result<(), git2::Error> {
        self.repo
            .reference(&format!("refs/tags/{name}"), oid, true, "builder")?;
        Ok(())
    }

    /// Makes `main` the checked-out branch and writes its files into the working tree.
    pub fn checkout_main(&self) -> Result<(), git2::Error> {
        self.repo.set_head("refs/heads/main")?;
        self.repo
            .checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
    }
}

/// Adds a file to a commit's file set.
pub fn put(files: &mut Files, path: &str, content: impl Into<String>, exec: bool) {
    files.insert(path.to_string(), (content.into(), exec));
}
