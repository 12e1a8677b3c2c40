//! `cudabisect classify LOG`: the classifier on a saved log.

use std::io::Read;

use cudabisect::classify::trailer::{exit_from_code, split_exit_trailer};
use cudabisect::classify::{classify, Exit, FaultClass};
use cudabisect::exec::process::BoundedCapture;

use super::common::print_stdout;
use super::error::{CommandError, CommandResult};
use super::exit_codes;

/// How the logged process ended, as the command line says it.
pub struct GivenExit {
    /// `--exit-code`.
    pub code: Option<i32>,
    /// `--signal`.
    pub signal: Option<i32>,
    /// `--timed-out`.
    pub timed_out: bool,
}

/// The log as text, however it was saved: a gzip'd log is unpacked, and one with a UTF-16 byte-order
/// mark (PowerShell's `>`) is turned into UTF-8, both while streaming; anything else is read as it is.
fn decoded(raw: Box<dyn Read>) -> std::io::Result<Box<dyn Read>> {
    let mut buffered = std::io::BufReader::new(raw);
    let gzip = std::io::BufRead::fill_buf(&mut buffered)?.starts_with(&[0x1f, 0x8b]);
    let bytes: Box<dyn Read> = if gzip {
        Box::new(flate2::read::MultiGzDecoder::new(buffered))
    } else {
        Box::new(buffered)
    };
    // Sniffs a byte-order mark: UTF-16 (either order) becomes UTF-8; without one, bytes pass through.
    Ok(Box::new(
        encoding_rs_io::DecodeReaderBytesBuilder::new()
            .bom_sniffing(true)
            .utf8_passthru(true)
            .build(bytes),
    ))
}

/// Classifies the log: exit 0 when it shows no failure, 5 when it does.
pub fn run(log: &str, given: GivenExit, json: bool) -> CommandResult {
    // Streamed in bounded memory, as a run's output is: the head, the tail and every fault line between
    // (a gigabyte piped into `classify -` must not take gigabytes).
    let raw: Box<dyn Read> = if log == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(
            std::fs::File::open(log)
                .map_err(|e| CommandError::usage(format!("cannot read {log}: {e}")))?,
        )
    };
    let mut reader =
        decoded(raw).map_err(|e| CommandError::usage(format!("cannot read {log}: {e}")))?;
    let mut capture = BoundedCapture::default();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => capture.push(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CommandError::usage(format!("cannot read {log}: {e}"))),
        }
    }
    let text = capture.render();
    let (exit, body) = match given {
        GivenExit {
            timed_out: true, ..
        } => (Exit::Timeout, text.as_ref()),
        GivenExit {
            signal: Some(s), ..
        } => (Exit::Signal(s), text.as_ref()),
        GivenExit { code: Some(c), .. } => (exit_from_code(c), text.as_ref()),
        _ => split_exit_trailer(&text),
    };
    let signature = classify(exit, body);
    let mut out = String::new();
    if json {
        out.push_str(&format!("{}\n", signature.to_classify_json()));
    } else {
        out.push_str(&format!("{}\n{}\n", signature.short(), signature.summary));
        for (k, v) in [
            ("framework", &signature.framework),
            ("detail", &signature.detail),
        ] {
            if let Some(v) = v {
                out.push_str(&format!("{k}: {v}\n"));
            }
        }
    }
    print_stdout(&out);
    Ok(if signature.class == FaultClass::None {
        exit_codes::OK
    } else {
        exit_codes::FAULT_FOUND
    })
}
