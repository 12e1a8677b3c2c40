//! `cudabisect bundle pack`: a bundle as one archive to attach to an issue.

use std::path::Path;

use cudabisect::report::human::human_bytes;
use cudabisect::report::pack::pack as pack_bundle;

/// Above this an archive may not attach to an issue.
const ATTACHMENT_LIMIT: u64 = 25_000_000;

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
    let size = human_bytes(packed.bytes);
    if packed.bytes > ATTACHMENT_LIMIT {
        // Issue trackers refuse large attachments (GitHub: 25 MB for a file).
        eprintln!(
            "warning: {} is {size}, over the 25 MB an issue attachment may be: share it another way, or look at what in it is large (minimal/repro_data.pt holds the recorded values)",
            packed.path.display()
        );
    }
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
