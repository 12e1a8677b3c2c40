//! Kernel sources (the built-in zoo, compiled into the binary, and a model's own `.cu` files) and the
//! on-disk cache of compiled cubins, keyed by source, options, architecture and NVRTC version.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;
use sha2::{Digest, Sha256};

/// One translation unit.
#[derive(Clone, Debug)]
pub struct Source {
    /// A short name for messages: the file name.
    pub name: String,
    /// The source text.
    pub text: String,
}

/// The built-in layer zoo, as shipped in `kernels/zoo/`.
pub fn zoo() -> Vec<Source> {
    [
        ("gather.cu", include_str!("../../kernels/zoo/gather.cu")),
        ("matmul.cu", include_str!("../../kernels/zoo/matmul.cu")),
        (
            "elementwise.cu",
            include_str!("../../kernels/zoo/elementwise.cu"),
        ),
        ("rows.cu", include_str!("../../kernels/zoo/rows.cu")),
        ("layout.cu", include_str!("../../kernels/zoo/layout.cu")),
        ("scatter.cu", include_str!("../../kernels/zoo/scatter.cu")),
    ]
    .into_iter()
    .map(|(name, text)| Source {
        name: name.into(),
        text: text.into(),
    })
    .collect()
}

/// Reads a model's own kernel files.
pub fn read_sources(paths: &[PathBuf]) -> Result<Vec<Source>, String> {
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            Ok(Source {
                name: p.file_name().map_or_else(
                    || p.display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                ),
                text,
            })
        })
        .collect()
}

/// The `extern "C" __global__` functions a source defines.
pub fn kernel_names(text: &str) -> Vec<String> {
    static GLOBAL: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r#"extern\s+"C"\s+__global__\s+void\s+([A-Za-z_]\w*)\s*\("#).expect("pattern")
    });
    GLOBAL
        .captures_iter(text)
        .map(|c| c[1].to_string())
        .collect()
}

/// Which source defines each wanted kernel: the model's own sources win over the zoo.
pub fn resolve<'a>(
    wanted: impl IntoIterator<Item = &'a str>,
    user: &'a [Source],
    builtin: &'a [Source],
) -> Result<BTreeMap<String, &'a Source>, String> {
    let mut found = BTreeMap::new();
    for name in wanted {
        let src = user
            .iter()
            .chain(builtin)
            .find(|s| kernel_names(&s.text).iter().any(|k| k == name))
            .ok_or_else(|| {
                format!("no kernel source defines `extern \"C\" __global__ void {name}(...)`")
            })?;
        found.insert(name.to_string(), src);
    }
    Ok(found)
}

/// The NVRTC options every compile uses; part of the cache key.
pub fn compile_options(arch: (i32, i32)) -> Vec<String> {
    vec![
        // A cubin for the exact device, not PTX: PTX from a newer NVRTC is refused by an older driver.
        format!("--gpu-architecture=sm_{}{}", arch.0, arch.1),
        "-lineinfo".into(),
    ]
}

/// The cache key: any change to the source, options, architecture or compiler gives a new entry.
pub fn cache_key(source: &str, options: &[String], arch: (i32, i32), nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(b"cudabisect-cubin-v1\0");
    h.update(source.as_bytes());
    h.update(b"\0");
    h.update(options.join("\x1f").as_bytes());
    h.update(format!("\0sm_{}{}\0nvrtc {}.{}", arch.0, arch.1, nvrtc.0, nvrtc.1).as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Where compiled kernels are kept: `$CUDABISECT_CACHE_DIR`, else the user's cache directory.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("CUDABISECT_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("cudabisect").join("kernels"))
}

/// A cubin from the cache, if there is one.
pub fn cache_get(dir: &Path, key: &str) -> Option<Vec<u8>> {
    std::fs::read(dir.join(format!("{key}.cubin")))
        .ok()
        .filter(|b| !b.is_empty())
}

/// Stores a cubin; a failure only costs a recompile next time, so it is not an error.
pub fn cache_put(dir: &Path, key: &str, cubin: &[u8]) -> bool {
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        // Written under a unique name, then renamed, so parallel probes never read a half-written file.
        let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, cubin)?;
        std::fs::rename(&tmp, dir.join(format!("{key}.cubin")))
    };
    write().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_has_its_kernel_in_the_zoo() {
        use crate::harness::ops::Op;
        use crate::harness::tensor::DType;
        let zoo = zoo();
        for op in Op::ALL {
            for dtype in [DType::F32, DType::I32] {
                let k = op.default_kernel(dtype);
                assert!(resolve([k], &[], &zoo).is_ok(), "{k} is missing");
            }
        }
    }

    #[test]
    fn the_models_own_source_wins() {
        let user = vec![Source {
            name: "mine.cu".into(),
            text: "extern \"C\" __global__ void relu_f32(float *o, const float *x, long long n) {}"
                .into(),
        }];
        let zoo = zoo();
        let found = resolve(["relu_f32", "matmul_f32"], &user, &zoo).unwrap();
        assert_eq!(found["relu_f32"].name, "mine.cu");
        assert_eq!(found["matmul_f32"].name, "matmul.cu");
        let e = resolve(["conv"], &user, &zoo).unwrap_err();
        assert!(e.contains("void conv("), "{e}");
    }

    #[test]
    fn the_key_changes_with_each_part() {
        let o = compile_options((9, 0));
        let base = cache_key("src", &o, (9, 0), (13, 0));
        assert_eq!(base, cache_key("src", &o, (9, 0), (13, 0)));
        assert_ne!(base, cache_key("src ", &o, (9, 0), (13, 0)));
        assert_ne!(
            base,
            cache_key("src", &compile_options((8, 0)), (9, 0), (13, 0))
        );
        assert_ne!(base, cache_key("src", &o, (10, 0), (13, 0)));
        assert_ne!(base, cache_key("src", &o, (9, 0), (13, 1)));
    }

    #[test]
    fn the_cache_stores_and_finds() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("nested");
        assert_eq!(cache_get(&d, "k"), None);
        assert!(cache_put(&d, "k", b"cubin"));
        assert_eq!(cache_get(&d, "k").as_deref(), Some(&b"cubin"[..]));
    }
}
