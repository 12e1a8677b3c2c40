//! The integration tests, in one binary (one link of the library and libgit2 instead of one per file):
//! each file below is a module; shared helpers are in `common/`. GPU tests (`gpu`) and the Slurm tests
//! (`slurm`) are ignored unless asked for: see CONTRIBUTING.md.

mod bisect_props;
mod classify_logs;
mod cli_tools;
mod common;
mod default_shrink;
mod demo;
mod distributed;
mod drivers;
mod e2e;
mod gpu;
mod harness;
mod harness_props;
mod init_config;
mod jax_harness;
mod nightly;
mod real_logs;
mod report_snapshots;
mod shrink_e2e;
mod shrink_props;
mod slurm;
mod torch_harness;
mod torch_training;
mod trust;

/// Every test file is a module of this binary: a file left out would never run.
#[test]
fn no_test_file_is_forgotten() {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration");
    let main = std::fs::read_to_string(here.join("main.rs")).unwrap();
    for entry in std::fs::read_dir(&here).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(module) = name.strip_suffix(".rs").filter(|m| *m != "main") {
            assert!(
                main.contains(&format!("\nmod {module};")),
                "tests/integration/{name} is not a module of main.rs"
            );
        }
    }
    let stray: Vec<_> = std::fs::read_dir(here.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs"))
        .collect();
    assert!(
        stray.is_empty(),
        "test files outside tests/integration: {stray:?}"
    );
}
