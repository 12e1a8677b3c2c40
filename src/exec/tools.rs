//! Finding the external programs cudabisect runs besides the user's own: compute-sanitizer, nvidia-smi,
//! nvcc, python. PATH first, then the CUDA toolkit's usual places.

use std::path::PathBuf;

/// Finds `program` on PATH, else at the first of `usual` that exists.
pub fn find_program(program: &str, usual: &[&str]) -> Option<PathBuf> {
    which::which(program)
        .ok()
        .or_else(|| usual.iter().map(PathBuf::from).find(|p| p.is_file()))
}

/// Where to find compute-sanitizer: the configured path (which must exist), else PATH, else the CUDA
/// toolkit's usual places.
pub fn find_sanitizer(configured: Option<&str>) -> Option<PathBuf> {
    match configured {
        Some(path) => Some(PathBuf::from(path)).filter(|p| p.is_file()),
        None => find_program(
            "compute-sanitizer",
            &[
                "/usr/local/cuda/bin/compute-sanitizer",
                "/opt/cuda/bin/compute-sanitizer",
            ],
        ),
    }
}
