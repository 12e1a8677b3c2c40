//! The git edge: resolves revisions, lists the commit range as a DAG for the search, describes commits, and
//! manages the probe worktree. The user's checkout (HEAD, branch, index, files, stashes) is never written.

use std::path::{Path, PathBuf};

use git2::{BranchType, Oid, Repository, Sort, WorktreeAddOptions, WorktreePruneOptions};
use serde::Serialize;

/// The name of the worktree cudabisect registers for its probes.
const WORKTREE_NAME: &str = "cudabisect-probe";

/// Git problems, most of them caused by user input.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// The directory is not inside a git repository.
    #[error("{0} is not a git repository")]
    NotARepository(PathBuf),
    /// A revision does not name a commit.
    #[error("unknown revision `{0}`")]
    UnknownRevision(String),
    /// GOOD and BAD are the same commit.
    #[error("good and bad are the same commit ({0})")]
    SameCommit(String),
    /// A good commit is not an ancestor of the bad one.
    #[error("good commit `{good}` is not an ancestor of bad commit `{bad}`")]
    NotAncestor {
        /// The good revision as given.
        good: String,
        /// The bad revision as given.
        bad: String,
    },
    /// Anything libgit2 reports while reading or writing.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    /// Filesystem trouble around the worktree.
    #[error("worktree {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// One commit of the search range.
#[derive(Clone, Debug)]
pub struct RangeCommit {
    /// The commit.
    pub oid: Oid,
    /// Indices of its parents within the range (parents outside it are dropped).
    pub parents: Vec<usize>,
}

/// What a report says about a commit.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CommitInfo {
    /// Full sha.
    pub commit: String,
    /// First line of the message.
    pub subject: String,
    /// `Name <email>`.
    pub author: String,
    /// Author date, RFC 3339 in UTC.
    pub date: String,
    /// Files changed against the first parent, as `M path`.
    pub files_changed: Vec<String>,
    /// Parent shas.
    pub parents: Vec<String>,
}

/// An opened repository.
pub struct Repo {
    repo: Repository,
}

impl Repo {
    /// Opens the repository that contains `dir`.
    pub fn open(dir: &Path) -> Result<Self, GitError> {
        let repo =
            Repository::discover(dir).map_err(|_| GitError::NotARepository(dir.to_path_buf()))?;
        if repo.is_bare() {
            return Err(GitError::NotARepository(dir.to_path_buf()));
        }
        Ok(Self { repo })
    }

    /// The top of the user's working tree.
    pub fn workdir(&self) -> PathBuf {
        self.repo
            .workdir()
            .unwrap_or_else(|| self.repo.path())
            .to_path_buf()
    }

    /// Where cudabisect keeps its state: inside the git directory, so the user's files never change.
    pub fn state_dir(&self) -> PathBuf {
        self.repo.commondir().join("cudabisect")
    }

    /// Resolves a revision to a commit.
    pub fn parents(&self, oid: Oid) -> Result<Vec<Oid>, GitError> {
        Ok(self.repo.find_commit(oid)?.parent_ids().collect())
    }

    /// Resolves a revision to a commit.
    pub fn resolve(&self, rev: &str) -> Result<Oid, GitError> {
        self.repo
            .revparse_single(rev)
            .and_then(|o| o.peel_to_commit())
            .map(|c| c.id())
            .map_err(|_| GitError::UnknownRevision(rev.to_string()))
    }

    /// Lists the commits that may be the first bad one: ancestors of `bad` that are not ancestors of any
    /// good commit, in topological order with `bad` last. Checks that every good commit is a proper ancestor.
    pub fn range(
        &self,
        goods: &[(String, Oid)],
        bad: (&str, Oid),
    ) -> Result<Vec<RangeCommit>, GitError> {
        for (name, good) in goods {
            if *good == bad.1 {
                return Err(GitError::SameCommit(name.clone()));
            }
            if !self.repo.graph_descendant_of(bad.1, *good)? {
                return Err(GitError::NotAncestor {
                    good: name.clone(),
                    bad: bad.0.to_string(),
                });
            }
        }
        let mut walk = self.repo.revwalk()?;
        walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
        walk.push(bad.1)?;
        for (_, good) in goods {
            walk.hide(*good)?;
        }
        let oids: Vec<Oid> = walk.collect::<Result<_, _>>()?;
        let index: std::collections::HashMap<Oid, usize> =
            oids.iter().enumerate().map(|(i, o)| (*o, i)).collect();
        let mut out = Vec::with_capacity(oids.len());
        for oid in &oids {
            let commit = self.repo.find_commit(*oid)?;
            let parents = commit
                .parent_ids()
                .filter_map(|p| index.get(&p).copied())
                .collect();
            out.push(RangeCommit { oid: *oid, parents });
        }
        // The walk ends with `bad` in linear histories; make it so in every history.
        if let Some(pos) = out.iter().position(|c| c.oid == bad.1) {
            if pos != out.len() - 1 {
                return Err(GitError::Git(git2::Error::from_str(
                    "bad commit is not last in topological order",
                )));
            }
        }
        Ok(out)
    }

    /// Describes a commit for reports.
    pub fn info(&self, oid: Oid) -> Result<CommitInfo, GitError> {
        let commit = self.repo.find_commit(oid)?;
        let author = commit.author();
        let when = std::time::UNIX_EPOCH
            + std::time::Duration::from_secs(author.when().seconds().max(0) as u64);
        let tree = commit.tree()?;
        let parent_tree = commit.parents().next().map(|p| p.tree()).transpose()?;
        let diff = self
            .repo
            .diff_tree_to_tree(parent_tree.as_ref(), Some(&tree), None)?;
        let files_changed = diff
            .deltas()
            .filter_map(|d| {
                let path = d.new_file().path().or_else(|| d.old_file().path())?;
                let status = match d.status() {
                    git2::Delta::Added => 'A',
                    git2::Delta::Deleted => 'D',
                    git2::Delta::Renamed => 'R',
                    _ => 'M',
                };
                Some(format!("{status} {}", path.display()))
            })
            .collect();
        Ok(CommitInfo {
            commit: oid.to_string(),
            subject: commit.summary().ok().flatten().unwrap_or("").to_string(),
            author: format!(
                "{} <{}>",
                author.name().unwrap_or("?"),
                author.email().unwrap_or("?")
            ),
            date: humantime::format_rfc3339_seconds(when).to_string(),
            files_changed,
            parents: commit.parent_ids().map(|p| p.to_string()).collect(),
        })
    }

    /// Tells whether the file `path` exists at `oid` with an executable mode.
    pub fn executable_at(&self, oid: Oid, path: &str) -> Option<bool> {
        let tree = self.repo.find_commit(oid).ok()?.tree().ok()?;
        let entry = tree
            .get_path(Path::new(path.trim_start_matches("./")))
            .ok()?;
        Some(entry.filemode() == 0o100755)
    }

    /// Opens (or creates) the probe worktree under the state directory.
    pub fn probe_worktree(&self) -> Result<ProbeWorktree, GitError> {
        let path = self.state_dir().join("worktree");
        let existing = self
            .repo
            .find_worktree(WORKTREE_NAME)
            .ok()
            .filter(|w| w.validate().is_ok());
        let worktree = match existing {
            Some(w) => w,
            None => {
                self.prune_worktree()?;
                if path.exists() {
                    std::fs::remove_dir_all(&path).map_err(|source| GitError::Io {
                        path: path.clone(),
                        source,
                    })?;
                }
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(|source| GitError::Io {
                        path: parent.to_path_buf(),
                        source,
                    })?;
                }
                self.add_worktree(&path)?
            }
        };
        let repo = Repository::open_from_worktree(&worktree)?;
        Ok(ProbeWorktree { path, repo })
    }

    /// Adds the worktree without leaving a branch behind: libgit2 wants a branch to check out, so a
    /// temporary one is made and deleted as soon as the worktree's HEAD is detached.
    fn add_worktree(&self, path: &Path) -> Result<git2::Worktree, GitError> {
        let head = self.repo.head()?.peel_to_commit()?;
        let branch_name = format!("{WORKTREE_NAME}-tmp");
        let branch = self.repo.branch(&branch_name, &head, true)?;
        let mut opts = WorktreeAddOptions::new();
        opts.reference(Some(branch.get()));
        let result = self.repo.worktree(WORKTREE_NAME, path, Some(&opts));
        let detached = result.as_ref().ok().map(|w| {
            Repository::open_from_worktree(w).and_then(|r| r.set_head_detached(head.id()))
        });
        if let Ok(mut b) = self.repo.find_branch(&branch_name, BranchType::Local) {
            b.delete()?;
        }
        if let Some(d) = detached {
            d?;
        }
        Ok(result?)
    }

    /// Unregisters the probe worktree and deletes its files.
    pub fn prune_worktree(&self) -> Result<(), GitError> {
        if let Ok(w) = self.repo.find_worktree(WORKTREE_NAME) {
            let mut opts = WorktreePruneOptions::new();
            opts.valid(true).locked(false).working_tree(true);
            w.prune(Some(&mut opts))?;
        }
        Ok(())
    }
}

/// The worktree where probes are built and run.
pub struct ProbeWorktree {
    path: PathBuf,
    repo: Repository,
}

impl ProbeWorktree {
    /// The worktree's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks out `oid` (detached) with submodules at the commit's recorded state. With `clean`, untracked
    /// and ignored files go too; otherwise build outputs stay so incremental builds stay warm.
    pub fn checkout(&self, oid: Oid, clean: bool) -> Result<(), GitError> {
        let commit = self.repo.find_commit(oid)?;
        let mut co = git2::build::CheckoutBuilder::new();
        co.force();
        if clean {
            co.remove_untracked(true).remove_ignored(true);
        }
        self.repo.checkout_tree(commit.as_object(), Some(&mut co))?;
        self.repo.set_head_detached(oid)?;
        for mut sm in self.repo.submodules()? {
            sm.update(true, None)?;
        }
        Ok(())
    }
}
