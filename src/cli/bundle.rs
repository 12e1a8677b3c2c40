//! `cudabisect bundle pack`: a bundle as one archive to attach to an issue.

use std::path::Path;

use cudabisect::report::event::{Event, Reporter};
use cudabisect::report::human::human_bytes;
use cudabisect::report::json::JsonReporter;
use cudabisect::report::pack::pack as pack_bundle;

/// Above this an archive may not attach to an issue.
const ATTACHMENT_LIMIT: u64 = 25_000_000;

use super::common::print_stdout;
use super::error::{CommandError, CommandResult, ErrorKind};
use super::exit_codes;

/// Packs `dir` and prints the archive's path and size (with `json`, as a `bundle_packed` JSON line).
pub fn pack(dir: &Path, out: Option<&Path>, include_binary: bool, json: bool) -> CommandResult {
    if out == Some(Path::new("-")) {
        return Err(CommandError::usage(
            "-o -: the archive is written to a file, not to standard output; give a path",
        ));
    }
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
    if json {
        JsonReporter::new().event(&Event::BundlePacked {
            path: packed.path.display().to_string(),
            bytes: packed.bytes,
            files: packed.files,
            binary: packed.binary,
        });
        return Ok(exit_codes::OK);
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
