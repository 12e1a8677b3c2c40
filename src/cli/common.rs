//! Helpers the subcommands share: loading the config of a repository, and where bundles go.

use std::path::{Path, PathBuf};

use cudabisect::config::Config;
use cudabisect::git::Repo;

use super::error::CommandError;

/// Opens the repository containing `dir` and its config (`--config` as given, else `bisect.toml` at the
/// repository root).
pub fn load_config(dir: &Path, config: Option<&Path>) -> Result<(Repo, Config), CommandError> {
    let repo = Repo::open(dir)?;
    let path = cudabisect::run::plan::config_path(&repo, config);
    let config = Config::load(&path)?;
    Ok((repo, config))
}

/// Where a bundle of `repo` goes: `[bundle] dir` (relative to the repository root), else `bundles/` in
/// the state directory under the git directory.
pub fn bundle_root(repo: &Repo, config: &Config) -> PathBuf {
    config
        .bundle
        .dir
        .as_ref()
        .map(|d| repo.workdir().join(d))
        .unwrap_or_else(|| repo.state_dir().join("bundles"))
}

/// Writes to stdout; a closed pipe (`cudabisect … | head -1`) ends the output quietly, never a panic.
pub fn print_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}
