//! Writing the Python harnesses (and helper scripts) shipped inside the binary into a run's own
//! directory: each file atomically, never into a shared path another user could swap between the write
//! and the run.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::ShrinkFramework;

/// A Python harness shipped inside the binary for one `[shrink] framework` (all but PyTorch's, which also
/// takes captures and has a warm start of its own): one row of [`super::SHIPPED`]. Each speaks the same
/// command line: `<dir> <factory-flag> <factory> --example-inputs <factory> [--train] [--loss <fn>]
/// --device <cpu|cuda>`, then the protocol's verbs.
pub struct ShippedHarness {
    /// The `[shrink] framework` it serves.
    pub framework: ShrinkFramework,
    /// The folder it is installed as in the run's directory, and run as (`python <dir>`).
    pub dir: &'static str,
    /// Its Python package: a frame in it is the harness's own, never the user's launch site.
    pub package: &'static str,
    /// Its files: paths inside [`ShippedHarness::dir`], and their text.
    pub files: &'static [(&'static str, &'static str)],
    /// The flag that hands it the factory the framework's key names (`--function`, `--model`).
    pub factory_flag: &'static str,
}

impl ShippedHarness {
    /// Writes it into `run_dir` (each file atomically) and returns the folder to give Python.
    pub fn install(&self, run_dir: &Path) -> std::io::Result<PathBuf> {
        install_package(&run_dir.join(self.dir), self.files)
    }
}

/// Writes `text` to `dir/name` in one step (a temporary file renamed over it).
pub(crate) fn write_atomically(dir: &Path, name: &str, text: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

/// Writes a shipped Python harness's `files` (paths inside it, and their text) under `root`, each file
/// atomically, and returns `root`.
pub(crate) fn install_package(root: &Path, files: &[(&str, &str)]) -> std::io::Result<PathBuf> {
    for (path, text) in files {
        let file = root.join(path);
        let (Some(parent), Some(name)) = (file.parent(), file.file_name()) else {
            continue;
        };
        write_atomically(parent, &name.to_string_lossy(), text)?;
    }
    Ok(root.to_path_buf())
}

/// The text of `path` among a shipped package's `files` (empty when it is not there).
#[cfg(test)]
pub(crate) fn source_of(files: &[(&str, &'static str)], path: &str) -> &'static str {
    files
        .iter()
        .find(|(p, _)| *p == path)
        .map_or("", |(_, text)| text)
}

/// `install` writes every file of the package, with its text, into the folder it returns, and a second
/// install over the first works.
#[cfg(test)]
pub(crate) fn assert_installs(
    install: fn(&Path) -> std::io::Result<PathBuf>,
    folder: &str,
    files: &[(&str, &str)],
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = install(&dir.path().join("run")).expect("installs");
    assert!(path.starts_with(dir.path()) && path.ends_with(folder));
    for (file, text) in files {
        assert_eq!(
            &std::fs::read_to_string(path.join(file)).expect("reads"),
            text
        );
    }
    assert_eq!(install(&dir.path().join("run")).expect("again"), path);
}

/// Every `.py` of the package's source folder is among the files the binary ships.
#[cfg(test)]
pub(crate) fn assert_every_file_shipped(folder: &str, package: &str, files: &[(&str, &str)]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("harness")
        .join(folder)
        .join(package);
    for entry in std::fs::read_dir(dir).expect("the package") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".py") {
            let path = format!("{package}/{name}");
            assert!(
                files.iter().any(|(p, _)| *p == path),
                "{path} is not shipped"
            );
        }
    }
}
