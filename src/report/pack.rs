//! Packs a hand-off bundle into one `.tar.gz` to attach to an issue: the bundle's files under one top-level
//! folder, the copied binary left out unless asked for, written atomically.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;

/// What `pack` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    /// The archive.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Files in it.
    pub files: usize,
    /// Whether `bin/` went in.
    pub binary: bool,
}

/// Why a bundle cannot be packed.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The directory is not a bundle.
    #[error("{0}: not a cudabisect bundle (no REPORT.md)")]
    NotABundle(PathBuf),
    /// `-o` names a place the archive cannot go: inside the bundle, or a directory.
    #[error("-o {0}")]
    BadOutput(String),
    /// Reading the bundle or writing the archive failed.
    #[error("{path}: {source}")]
    Io {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl PackError {
    /// True for bad input (not a bundle), as opposed to a failing disk.
    pub fn is_usage(&self) -> bool {
        matches!(self, PackError::NotABundle(_) | PackError::BadOutput(_))
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PackError + '_ {
    move |source| PackError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Packs `dir` into `out` (default: `<dir>.tar.gz` beside it). `bin/` (the binary a native-harness bundle may
/// carry) goes in only with `include_binary`: an attachment should be small and hold no executable a
/// stranger must trust.
pub fn pack(dir: &Path, out: Option<&Path>, include_binary: bool) -> Result<Packed, PackError> {
    // A regular REPORT.md: a link to some other file would pass the check and then be left out.
    let report_is_file =
        std::fs::symlink_metadata(dir.join("REPORT.md")).is_ok_and(|m| m.is_file());
    if !report_is_file {
        return Err(PackError::NotABundle(dir.to_path_buf()));
    }
    let dir = dir.canonicalize().map_err(io(dir))?;
    // The directory's own name, bytes and all (a name that is not UTF-8 stays as it is).
    let name: std::ffi::OsString = dir
        .file_name()
        .map_or_else(|| "bundle".into(), |n| n.to_os_string());
    let out = match out {
        Some(p) => p.to_path_buf(),
        None => {
            let mut file = name.clone();
            file.push(".tar.gz");
            dir.with_file_name(file)
        }
    };
    let parent = usable_output(&out, &dir)?;
    let mut files = Vec::new();
    walk(&dir, &dir, include_binary, &mut files)?;
    files.sort();
    // Written beside its destination and renamed into place: a killed pack leaves no torn archive.
    // A place that takes no file (/proc, a read-only mount) is the user's `-o` to fix: exit 2.
    let tmp = tempfile::NamedTempFile::new_in(parent).map_err(|e| {
        PackError::BadOutput(format!("{}: cannot write there ({e})", out.display()))
    })?;
    {
        let gz = GzEncoder::new(BufWriter::new(tmp.as_file()), Compression::default());
        let mut tar = tar::Builder::new(gz);
        tar.mode(tar::HeaderMode::Deterministic);
        for rel in &files {
            let path = dir.join(rel);
            // A failure to write (a full disk) is the archive's, not the file being read: blamed on
            // the file only when it cannot be read.
            tar.append_path_with_name(&path, Path::new(&name).join(rel))
                .map_err(|e| match File::open(&path) {
                    Ok(_) => io(&out)(e),
                    Err(_) => io(&path)(e),
                })?;
        }
        let gz = tar.into_inner().map_err(io(&out))?;
        let mut w = gz.finish().map_err(io(&out))?;
        w.flush().map_err(io(&out))?;
    }
    tmp.as_file().sync_all().map_err(io(&out))?;
    tmp.persist(&out).map_err(|e| PackError::Io {
        path: out.clone(),
        source: e.error,
    })?;
    let bytes = File::open(&out)
        .and_then(|f| f.metadata())
        .map_err(io(&out))?
        .len();
    let binary = files.iter().any(|f| f.starts_with("bin"));
    Ok(Packed {
        path: out,
        bytes,
        files: files.len(),
        binary,
    })
}

/// The directory `out` goes in, when the archive can be written there: not a directory itself, and not
/// inside the bundle (where it would overwrite its files or pack an earlier archive).
fn usable_output<'o>(out: &'o Path, dir: &Path) -> Result<&'o Path, PackError> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if out.is_dir() {
        return Err(PackError::BadOutput(format!(
            "{} is a directory: name the archive file",
            out.display()
        )));
    }
    match parent.canonicalize() {
        Ok(p) if p.starts_with(dir) => Err(PackError::BadOutput(format!(
            "{} is inside the bundle: write the archive elsewhere",
            out.display()
        ))),
        Ok(_) => Ok(parent),
        Err(e) => Err(PackError::BadOutput(format!(
            "{}: its directory {} cannot be used ({e})",
            out.display(),
            parent.display()
        ))),
    }
}

fn walk(
    root: &Path,
    dir: &Path,
    include_binary: bool,
    files: &mut Vec<PathBuf>,
) -> Result<(), PackError> {
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        if !include_binary && rel == Path::new("bin") {
            continue;
        }
        let kind = entry.file_type().map_err(io(&path))?;
        if kind.is_dir() {
            walk(root, &path, include_binary, files)?;
        } else if kind.is_file() {
            files.push(rel);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn entries(archive: &Path) -> Vec<(String, Vec<u8>)> {
        let f = File::open(archive).expect("archive");
        let mut t = tar::Archive::new(flate2::read::GzDecoder::new(f));
        let mut out: Vec<(String, Vec<u8>)> = t
            .entries()
            .expect("entries")
            .map(|e| {
                let mut e = e.expect("entry");
                let name = e.path().expect("path").display().to_string();
                let mut body = Vec::new();
                e.read_to_end(&mut body).expect("read");
                (name, body)
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_bundle_packs_under_its_own_name_without_the_binary_unless_asked() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let b = tmp.path().join("abc1234");
        std::fs::create_dir_all(b.join("minimal/inputs")).expect("mkdir");
        std::fs::create_dir_all(b.join("bin")).expect("mkdir");
        std::fs::write(b.join("REPORT.md"), "# report\n").expect("write");
        std::fs::write(b.join("minimal/inputs/x.npy"), [1u8, 2, 3]).expect("write");
        std::fs::write(b.join("bin/cudabisect"), "binary").expect("write");
        let p = pack(&b, None, false).expect("pack");
        assert_eq!(p.path, tmp.path().join("abc1234.tar.gz"));
        assert_eq!(p.files, 2);
        assert!(!p.binary);
        assert_eq!(p.bytes, std::fs::metadata(&p.path).expect("meta").len());
        assert_eq!(
            entries(&p.path),
            vec![
                ("abc1234/REPORT.md".to_string(), b"# report\n".to_vec()),
                ("abc1234/minimal/inputs/x.npy".to_string(), vec![1, 2, 3]),
            ]
        );
        let out = tmp.path().join("with-bin.tar.gz");
        let p = pack(&b, Some(&out), true).expect("pack");
        assert!(p.binary && p.files == 3);
        assert!(entries(&out)
            .iter()
            .any(|(n, body)| n == "abc1234/bin/cudabisect" && body == b"binary"));
    }

    #[test]
    fn a_directory_that_is_not_a_bundle_is_refused_and_nothing_is_written() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = tmp.path().join("notes");
        std::fs::create_dir_all(&d).expect("mkdir");
        let e = pack(&d, None, false).expect_err("not a bundle");
        assert!(e.is_usage(), "{e}");
        assert!(e.to_string().contains("no REPORT.md"), "{e}");
        assert_eq!(std::fs::read_dir(tmp.path()).expect("ls").count(), 1);
    }
}
