//! `cudabisect bundle pack`: a bundle as one archive to attach to an issue.

use std::path::Path;

use cudabisect::report::pack::pack as pack_bundle;

use super::common::print_stdout;
use super::error::{CommandError, CommandResult, ErrorKind};
use super::exit_codes;

/// Packs `dir` and prints the archive's path and size.
pub fn pack(dir: &Path, out: Option<&Path>, include_binary: bool) -> CommandResult {
    let packed = pack_bundle(dir, out, include_binary).map_err(|e| {
        let kind = if e.is_usage() {
            ErrorKind::Usage
        } else {
            ErrorKind::Internal
        };
        CommandError::new(kind, e)
    })?;
    let size = if packed.bytes >= 1 << 20 {
        format!("{:.1} MiB", packed.bytes as f64 / f64::from(1u32 << 20))
    } else {
        format!("{:.1} KiB", packed.bytes as f64 / 1024.0)
    };
    print_stdout(&format!(
        "{} ({size}, {} files{})\n",
        packed.path.display(),
        packed.files,
        if packed.binary {
            ", with the binary"
        } else {
            ""
        }
    ));
    Ok(exit_codes::OK)
}
