//! The PyTorch harness shipped inside the binary, installed into the run's own directory when a shrink
//! needs it (never a shared path another user could swap between the write and the run).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The PyTorch harness's source.
pub const TORCH_HARNESS: &str = include_str!("../../harness/torch_harness.py");

/// The file name the harness is installed under.
pub const TORCH_HARNESS_FILE: &str = "torch_harness.py";

/// The capture hook: a `sitecustomize.py` that does nothing unless `CUDABISECT_CAPTURE` is set.
pub const CAPTURE_HOOK: &str = include_str!("../../harness/capture/sitecustomize.py");

/// The warm probe runner: a server that preloads a repro's imports and forks a child per run, and the
/// client that stands where the repro's command would have run.
pub const WARM_PROBE: &str = include_str!("../../harness/warm/warm_probe.py");

/// Writes the warm probe runner into `dir` and returns its path.
pub fn install_warm_probe(dir: &Path) -> std::io::Result<PathBuf> {
    write_atomically(dir, "warm_probe.py", WARM_PROBE)
}

/// The folder, inside a run directory, that goes first on `PYTHONPATH` for a capture.
pub const CAPTURE_HOOK_DIR: &str = "capture-hook";

/// Writes `text` to `dir/name` in one step (a temporary file renamed over it).
pub(crate) fn write_atomically(dir: &Path, name: &str, text: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

/// Writes the harness into `dir` (created when missing) atomically and returns its path.
pub fn install(dir: &Path) -> std::io::Result<PathBuf> {
    write_atomically(dir, TORCH_HARNESS_FILE, TORCH_HARNESS)
}

/// Writes the capture hook into `dir/capture-hook/` and returns that folder (for `PYTHONPATH`).
pub fn install_capture_hook(dir: &Path) -> std::io::Result<PathBuf> {
    let hook = dir.join(CAPTURE_HOOK_DIR);
    write_atomically(&hook, "sitecustomize.py", CAPTURE_HOOK)?;
    Ok(hook)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_harness_is_installed_in_the_given_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = install(&dir.path().join("run")).expect("installs");
        assert!(path.starts_with(dir.path()));
        assert_eq!(
            std::fs::read_to_string(&path).expect("reads"),
            TORCH_HARNESS
        );
        // A second install over the first replaces it in one step.
        assert_eq!(install(&dir.path().join("run")).expect("again"), path);
    }
}
