//! The git edge: resolves revisions, lists the commit range as a DAG for the search (through `git rev-list`,
//! so replace refs, grafts, `--first-parent` and pathspecs mean what they mean to git), describes commits,
//! and manages the probe worktree through the `git` command (so the user's credentials, URL rewrites and
//! config apply to submodules). The user's checkout, branches, index and stashes are never written.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use git2::{Oid, Repository};
use serde::{Deserialize, Serialize};

/// Git problems, most of them caused by user input.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// The directory is not inside a git repository.
    #[error("{0} is not a git repository")]
    NotARepository(PathBuf),
    /// A bare repository has no checkout to bisect from.
    #[error("{0} is a bare repository: run cudabisect in a clone with a working tree")]
    Bare(PathBuf),
    /// The repository's path is not UTF-8.
    #[error("{} is at a path that is not UTF-8: move or link the repository to a UTF-8 path", .0.display())]
    NotUtf8(PathBuf),
    /// A revision does not name a commit.
    #[error("unknown revision `{0}`")]
    UnknownRevision(String),
    /// A revision names a commit this shallow clone does not have.
    #[error("unknown revision `{0}` (this clone is shallow: `git fetch --unshallow` brings the rest of the history)")]
    BeyondShallow(String),
    /// GOOD and BAD are the same commit.
    #[error("good and bad are the same commit ({0})")]
    SameCommit(String),
    /// A good commit shares no history with the bad one.
    #[error("good commit `{good}` and bad commit `{bad}` share no history (no merge base)")]
    Unrelated {
        /// The good revision as given.
        good: String,
        /// The bad revision as given.
        bad: String,
    },
    /// The bad commit is an ancestor of a good one: the range is reversed.
    #[error("bad commit `{bad}` is an ancestor of good commit `{good}`: is the range reversed?")]
    Reversed {
        /// The good revision as given.
        good: String,
        /// The bad revision as given.
        bad: String,
    },
    /// The range holds no commit to test.
    #[error("no commit in {0} is left to test")]
    EmptyRange(String),
    /// Anything libgit2 reports while reading.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    /// The `git` command failed.
    #[error("`git {args}` failed: {message}")]
    Command {
        /// Its arguments.
        args: String,
        /// What it printed on stderr (last line), or why it did not start.
        message: String,
    },
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

impl GitError {
    /// True when the user's input is at fault (a bad revision or range), not git or the disk.
    pub fn is_usage(&self) -> bool {
        !matches!(self, Self::Git(_) | Self::Command { .. } | Self::Io { .. })
    }
}

/// One commit of the search range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeCommit {
    /// The commit.
    pub oid: Oid,
    /// Indices of its parents within the range (parents outside it are dropped).
    pub parents: Vec<usize>,
}

/// How the range is walked, as `git rev-list` options.
#[derive(Clone, Debug, Default)]
pub struct RangeOptions {
    /// Follow only the first parent of merges.
    pub first_parent: bool,
    /// Only commits that touch these paths are candidates (TREESAME commits weigh nothing).
    pub pathspec: Vec<String>,
}

/// What a report says about a commit.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
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

/// A `git` command with the environment of an outer git (a hook, a script run by `git rebase -x`) removed,
/// so it talks to the repository it is pointed at.
pub(crate) fn git(dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_PREFIX",
        "GIT_COMMON_DIR",
        "GIT_OBJECT_DIRECTORY",
    ] {
        cmd.env_remove(var);
    }
    // Never start a background gc in the user's repository, never prompt on a terminal nobody watches.
    cmd.env("GIT_TERMINAL_PROMPT", "0")
        .args(["-c", "gc.auto=0", "-c", "maintenance.auto=false", "-C"])
        .arg(dir)
        .stdin(std::process::Stdio::null());
    cmd
}

/// Runs `git args…` in `dir` and returns its stdout.
fn run_git(dir: &Path, args: &[&str]) -> Result<String, GitError> {
    let out = git(dir)
        .args(args)
        .output()
        .map_err(|e| GitError::Command {
            args: args.join(" "),
            message: format!("cannot run git: {e}"),
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let message = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty() && !l.starts_with("hint:"))
            .unwrap_or("no message")
            .trim()
            .to_string();
        return Err(GitError::Command {
            args: args.join(" "),
            message,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Repo {
    /// Opens the repository that contains `dir`.
    pub fn open(dir: &Path) -> Result<Self, GitError> {
        let repo =
            Repository::discover(dir).map_err(|_| GitError::NotARepository(dir.to_path_buf()))?;
        if repo.is_bare() {
            return Err(GitError::Bare(dir.to_path_buf()));
        }
        // git paths (worktrees, the state directory) go through libgit2 as UTF-8: a repository at a
        // path that is not would get worktrees at a mangled path beside it.
        if repo.workdir().is_some_and(|w| w.to_str().is_none()) || repo.path().to_str().is_none() {
            return Err(GitError::NotUtf8(dir.to_path_buf()));
        }
        Ok(Self { repo })
    }

    /// The branch the checkout is on, when it is on one.
    pub fn current_branch(&self) -> Option<String> {
        let head = self.repo.head().ok()?;
        if !head.is_branch() {
            return None;
        }
        head.shorthand().ok().map(str::to_string)
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

    /// What the user owns in this repository, to compare before and after a run: every ref (branches,
    /// tags, remotes, the stash; refs are shared with the probe worktrees), `HEAD`, and the checkout's
    /// changed and untracked files with their sizes and modification times. A repro that writes through
    /// its worktree into the user's repository changes it.
    pub fn user_state(&self, skip: &[PathBuf]) -> UserState {
        let mut refs = std::collections::BTreeMap::new();
        if let Ok(all) = self.repo.references() {
            for r in all.flatten() {
                if let (Ok(name), Some(oid)) = (r.name(), r.target()) {
                    refs.insert(name.to_string(), oid);
                }
            }
        }
        let head = self
            .repo
            .head()
            .ok()
            .and_then(|h| h.name().ok().map(String::from));
        let root = self.workdir();
        let mut files = std::collections::BTreeMap::new();
        let mut options = git2::StatusOptions::new();
        options.include_untracked(true).recurse_untracked_dirs(true);
        if let Ok(statuses) = self.repo.statuses(Some(&mut options)) {
            for entry in statuses.iter() {
                let Ok(path) = entry.path().map(|p| root.join(p)) else {
                    continue;
                };
                if skip.iter().any(|s| path.starts_with(s)) {
                    continue;
                }
                let stamp = std::fs::symlink_metadata(&path)
                    .ok()
                    .map(|m| (m.len(), m.modified().ok()));
                files.insert(path, (entry.status().bits(), stamp));
            }
        }
        UserState { refs, head, files }
    }

    /// What `refs/stash` points at (`None` without a stash): refs are shared with the probe worktrees, so
    /// a repro's `git stash` there lands on the user's stash.
    pub fn stash_tip(&self) -> Option<Oid> {
        self.repo.refname_to_id("refs/stash").ok()
    }

    /// The parents of a commit.
    pub fn parents(&self, oid: Oid) -> Result<Vec<Oid>, GitError> {
        Ok(self.repo.find_commit(oid)?.parent_ids().collect())
    }

    /// A branch by name: a local branch (`main`, `refs/heads/main`) or a remote-tracking one
    /// (`origin/main`, `refs/remotes/origin/main`), never a revision (`main~2`) or a tag. Returns its
    /// short name (the state's key) and the commit it points at.
    pub fn branch(&self, name: &str) -> Option<(String, Oid)> {
        let short = name
            .strip_prefix("refs/heads/")
            .or_else(|| name.strip_prefix("refs/remotes/"))
            .unwrap_or(name);
        let full = if name.starts_with("refs/") {
            vec![name.to_string()]
        } else {
            vec![format!("refs/heads/{name}"), format!("refs/remotes/{name}")]
        };
        full.iter()
            .filter(|r| r.starts_with("refs/heads/") || r.starts_with("refs/remotes/"))
            .find_map(|r| {
                let reference = self.repo.find_reference(r).ok()?;
                let oid = reference.peel_to_commit().ok()?.id();
                Some((short.to_string(), oid))
            })
    }

    /// Resolves a revision to a commit.
    pub fn resolve(&self, rev: &str) -> Result<Oid, GitError> {
        self.repo
            .revparse_single(rev)
            .and_then(|o| o.peel_to_commit())
            .map(|c| c.id())
            .map_err(|_| {
                if self.repo.is_shallow() {
                    GitError::BeyondShallow(rev.to_string())
                } else {
                    GitError::UnknownRevision(rev.to_string())
                }
            })
    }

    /// True when `ancestor` is `descendant` or one of its ancestors (as git sees the graph).
    pub fn is_ancestor(&self, ancestor: Oid, descendant: Oid) -> Result<bool, GitError> {
        let status = git(&self.workdir())
            .args(["merge-base", "--is-ancestor"])
            .arg(ancestor.to_string())
            .arg(descendant.to_string())
            .stderr(std::process::Stdio::null())
            .status()
            .map_err(|e| GitError::Command {
                args: "merge-base --is-ancestor".into(),
                message: e.to_string(),
            })?;
        Ok(status.success())
    }

    /// Every merge base of `a` and `b` (empty for unrelated histories).
    pub fn merge_bases(&self, a: Oid, b: Oid) -> Result<Vec<Oid>, GitError> {
        let out = git(&self.workdir())
            .args(["merge-base", "--all"])
            .arg(a.to_string())
            .arg(b.to_string())
            .output()
            .map_err(|e| GitError::Command {
                args: "merge-base --all".into(),
                message: e.to_string(),
            })?;
        // Exit 1 with no output: no common ancestor.
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| Oid::from_str(l.trim()).ok())
            .collect())
    }

    /// Lists the commits that may be the first bad one: ancestors of `bad` not reachable from any good
    /// commit, in topological order with `bad` last, as `git rev-list` sees them.
    pub fn range(
        &self,
        goods: &[Oid],
        bad: Oid,
        opts: &RangeOptions,
    ) -> Result<Vec<RangeCommit>, GitError> {
        let mut args: Vec<String> = vec![
            "rev-list".into(),
            "--topo-order".into(),
            "--reverse".into(),
            "--parents".into(),
        ];
        if opts.first_parent {
            args.push("--first-parent".into());
        }
        args.push(bad.to_string());
        args.extend(goods.iter().map(|g| format!("^{g}")));
        if !opts.pathspec.is_empty() {
            args.push("--".into());
            args.extend(opts.pathspec.iter().cloned());
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let text = run_git(&self.workdir(), &argv)?;
        let mut listed: Vec<(Oid, Vec<Oid>)> = Vec::new();
        for line in text.lines() {
            let mut words = line
                .split_whitespace()
                .filter_map(|w| Oid::from_str(w).ok());
            if let Some(oid) = words.next() {
                listed.push((oid, words.collect()));
            }
        }
        // With a pathspec the bad commit may not touch it; it is still the known-bad endpoint, with the
        // listed commits that nothing else in the list descends from as its parents.
        if !listed.iter().any(|(o, _)| *o == bad) {
            let mut has_child = std::collections::HashSet::new();
            for (_, ps) in &listed {
                has_child.extend(ps.iter().copied());
            }
            let tips: Vec<Oid> = listed
                .iter()
                .map(|(o, _)| *o)
                .filter(|o| !has_child.contains(o))
                .collect();
            listed.push((bad, tips));
        }
        let index: HashMap<Oid, usize> = listed
            .iter()
            .enumerate()
            .map(|(i, (o, _))| (*o, i))
            .collect();
        let out: Vec<RangeCommit> = listed
            .iter()
            .map(|(oid, ps)| RangeCommit {
                oid: *oid,
                parents: ps.iter().filter_map(|p| index.get(p).copied()).collect(),
            })
            .collect();
        if out.last().map(|c| c.oid) != Some(bad) {
            return Err(GitError::Command {
                args: argv.join(" "),
                message: "the bad commit is not last in topological order".into(),
            });
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
            subject: self.subject(oid),
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

    /// The subject line of a commit (empty when it cannot be read); no diff is computed.
    pub fn subject(&self, oid: Oid) -> String {
        self.repo
            .find_commit(oid)
            .ok()
            .and_then(|c| c.summary().ok().flatten().map(str::to_string))
            .unwrap_or_default()
    }

    /// Tells whether the file `path` exists at `oid` (`None` when not) and whether it is executable.
    pub fn executable_at(&self, oid: Oid, path: &str) -> Option<bool> {
        let tree = self.repo.find_commit(oid).ok()?.tree().ok()?;
        let entry = tree
            .get_path(Path::new(path.trim_start_matches("./")))
            .ok()?;
        Some(entry.filemode() == 0o100755)
    }

    /// Opens the probe worktree at `path` (under the state directory), creating it when it is missing or
    /// broken. It is detached: no branch is made, in the user's refs or anywhere.
    pub fn probe_worktree(&self, path: &Path) -> Result<ProbeWorktree, GitError> {
        let usable = path.join(".git").is_file()
            && run_git(path, &["rev-parse", "--is-inside-work-tree"]).is_ok()
            && run_git(path, &["rev-parse", "--git-common-dir"])
                .ok()
                .and_then(|d| std::fs::canonicalize(path.join(d.trim())).ok())
                == std::fs::canonicalize(self.repo.commondir()).ok();
        if !usable {
            self.remove_worktree(path)?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|source| GitError::Io {
                    path: parent.to_path_buf(),
                    source,
                })?;
            }
            let head = self.repo.head().ok().and_then(|h| h.target());
            let start = match head {
                Some(oid) => oid.to_string(),
                // An unborn HEAD has no commit to start from; any commit will do, the probe moves it.
                None => run_git(&self.workdir(), &["rev-list", "-n1", "--all"])?
                    .trim()
                    .to_string(),
            };
            let p = path.display().to_string();
            run_git(
                &self.workdir(),
                &[
                    "worktree",
                    "add",
                    "--detach",
                    "--force",
                    "--no-checkout",
                    &p,
                    &start,
                ],
            )?;
        }
        let repo = Repository::open(path)?;
        Ok(ProbeWorktree {
            path: path.to_path_buf(),
            repo: std::sync::Mutex::new(repo),
        })
    }

    /// Unregisters the worktree at `path` and deletes its files; nothing to do when it is not there. A
    /// worktree the user locked (`git worktree lock`) is left alone, and that is an error to report.
    pub fn remove_worktree(&self, path: &Path) -> Result<(), GitError> {
        let p = path.display().to_string();
        let listed = run_git(&self.workdir(), &["worktree", "list", "--porcelain"])?;
        let canonical = std::fs::canonicalize(path).ok();
        let registered = listed
            .lines()
            .filter_map(|l| l.strip_prefix("worktree "))
            .any(|w| {
                Path::new(w) == path
                    || std::fs::canonicalize(w)
                        .ok()
                        .is_some_and(|c| Some(c) == canonical)
            });
        if registered {
            run_git(&self.workdir(), &["worktree", "remove", "--force", &p])?;
        } else if path.exists() {
            // A leftover directory that git no longer knows (a run killed mid-way): ours to delete.
            std::fs::remove_dir_all(path).map_err(|source| GitError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        }
        run_git(&self.workdir(), &["worktree", "prune"])?;
        Ok(())
    }
}

/// The worktree where probes are built and run.
pub struct ProbeWorktree {
    path: PathBuf,
    // Behind a lock so that a worktree can be lent to a worker thread (a repository handle is not shared
    // between threads); each worker has a worktree of its own, so the lock is never contended.
    repo: std::sync::Mutex<Repository>,
}

/// Why a checkout failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    /// The commit's tree (or a blob in it) is not in this clone.
    #[error("the objects of {0} are missing from this clone")]
    MissingObject(Oid),
    /// Anything else.
    #[error(transparent)]
    Git(#[from] GitError),
}

impl ProbeWorktree {
    /// The worktree's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks out `oid` (detached) with submodules at the commit's recorded state. The tree is checked out
    /// in-process (libgit2: no process per probe); submodules go through `git submodule update`, so the
    /// user's credentials, URL rewrites and config apply to them. With `clean`, untracked and ignored files
    /// go too; otherwise build outputs stay so incremental builds stay warm.
    pub fn checkout(&self, oid: Oid, clean: bool) -> Result<(), CheckoutError> {
        let repo = self
            .repo
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let missing = |e: git2::Error| {
            // Is it the clone (objects missing), or something else?
            let tree_there = repo.find_commit(oid).and_then(|c| c.tree()).is_ok();
            if tree_there && e.class() != git2::ErrorClass::Odb {
                CheckoutError::Git(GitError::Git(e))
            } else {
                CheckoutError::MissingObject(oid)
            }
        };
        let commit = repo.find_commit(oid).map_err(missing)?;
        let mut co = git2::build::CheckoutBuilder::new();
        co.force();
        if clean {
            co.remove_untracked(true).remove_ignored(true);
        }
        repo.checkout_tree(commit.as_object(), Some(&mut co))
            .map_err(missing)?;
        repo.set_head_detached(oid)
            .map_err(|e| CheckoutError::Git(e.into()))?;
        if self.path.join(".gitmodules").is_file() {
            run_git(
                &self.path,
                &[
                    "submodule",
                    "update",
                    "--init",
                    "--recursive",
                    "--force",
                    "--quiet",
                ],
            )?;
        }
        Ok(())
    }
}

/// The user's refs, `HEAD` and changed files at one moment ([`Repo::user_state`]).
#[derive(Clone, Debug, PartialEq)]
pub struct UserState {
    refs: std::collections::BTreeMap<String, Oid>,
    head: Option<String>,
    files: std::collections::BTreeMap<PathBuf, FileStamp>,
}

/// A changed or untracked file as the status saw it: its status bits, size and modification time.
type FileStamp = (u32, Option<(u64, Option<std::time::SystemTime>)>);

impl UserState {
    /// What changed from `before` to `self`, in words: the refs, `HEAD`, the files (a few named).
    pub fn changes_since(&self, before: &UserState) -> Vec<String> {
        let mut out = Vec::new();
        let refs: Vec<&str> = before
            .refs
            .keys()
            .chain(self.refs.keys())
            .filter(|k| before.refs.get(*k) != self.refs.get(*k))
            .map(String::as_str)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !refs.is_empty() {
            out.push(format!("refs {}", name_some(&refs)));
        }
        if before.head != self.head {
            out.push("HEAD".to_string());
        }
        let files: Vec<String> = before
            .files
            .keys()
            .chain(self.files.keys())
            .filter(|k| before.files.get(*k) != self.files.get(*k))
            .map(|p| p.display().to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !files.is_empty() {
            let names: Vec<&str> = files.iter().map(String::as_str).collect();
            out.push(format!("files {}", name_some(&names)));
        }
        out
    }
}

/// Up to three names, then how many more.
fn name_some(names: &[&str]) -> String {
    let shown = names.iter().take(3).copied().collect::<Vec<_>>().join(", ");
    match names.len() {
        n if n > 3 => format!("{shown} and {} more", n - 3),
        _ => shown,
    }
}
/// A commit's first 12 hex digits, as people write it (the whole string when it is shorter).
pub fn short_sha(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}
