//! Finding the external programs cudabisect runs besides the user's own: compute-sanitizer, nvidia-smi,
//! nvcc, python. PATH first, then the CUDA toolkit's usual places.

use std::path::{Path, PathBuf};

use crate::config::CommandLine;

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

/// The environment that turns the frameworks' pooling allocators off, so compute-sanitizer sees each
/// buffer as its own allocation and names the kernel and access of a small overrun: PyTorch's caching
/// allocator, and XLA's preallocated pool (one big allocation otherwise). PyTorch's is always set; the
/// XLA ones only where the run does not set them itself.
pub const POOLS_OFF: [(&str, &str, bool); 3] = [
    ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", true),
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "false", false),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "platform", false),
];

/// `env` with [`POOLS_OFF`] applied (the last setting of a name wins where the list is read in order).
pub fn pools_off(env: &[(String, String)]) -> Vec<(String, String)> {
    let mut out = env.to_vec();
    for (name, value, always) in POOLS_OFF {
        let set = out.iter().any(|(k, _)| k == name);
        if always || !set {
            out.retain(|(k, _)| k != name);
            out.push((name.into(), value.into()));
        }
    }
    out
}

/// `command` run under compute-sanitizer's memcheck (its report in the output, the program's own exit
/// status kept).
pub fn under_memcheck(sanitizer: &Path, command: &CommandLine) -> CommandLine {
    let (program, args) = command.argv();
    let mut argv = vec![
        sanitizer.display().to_string(),
        "--tool".into(),
        "memcheck".into(),
        "--print-limit".into(),
        "100".into(),
        program,
    ];
    argv.extend(args);
    CommandLine::Argv(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_off_forces_torch_and_leaves_a_set_xla_pool_alone() {
        let mine = vec![
            (
                "PYTORCH_NO_CUDA_MEMORY_CACHING".to_string(),
                "0".to_string(),
            ),
            ("XLA_PYTHON_CLIENT_ALLOCATOR".to_string(), "bfc".to_string()),
        ];
        let env = pools_off(&mine);
        let get = |k: &str| {
            env.iter()
                .filter(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(get("PYTORCH_NO_CUDA_MEMORY_CACHING"), ["1"]);
        assert_eq!(get("XLA_PYTHON_CLIENT_ALLOCATOR"), ["bfc"]);
        assert_eq!(get("XLA_PYTHON_CLIENT_PREALLOCATE"), ["false"]);
    }

    #[test]
    fn a_shell_line_runs_under_memcheck_through_sh() {
        let wrapped = under_memcheck(
            Path::new("/cs"),
            &CommandLine::Shell("python3 t.py | tee x".into()),
        );
        assert_eq!(
            wrapped.display(),
            "/cs --tool memcheck --print-limit 100 sh -c python3 t.py | tee x"
        );
    }
}
