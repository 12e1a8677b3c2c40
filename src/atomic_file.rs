//! Writing a file so that a kill at any moment leaves either the old content or the new, never a torn one:
//! reports, state files, JUnit and journals all go through here.

use std::path::Path;

/// Writes a file atomically (a temp file in the same directory, renamed over the target).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    // On disk before the rename, so a power loss cannot leave the new name on empty content.
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
