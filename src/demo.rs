//! `cudabisect demo`: lays out a sample repository with a long, messy history (merges, build breaks, an
//! unrelated failure, a planted out-of-bounds regression) and bisects it end to end.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use git2::Oid;

use crate::cli::cmd_start;
use crate::fixture_repo::{put, Files, RepoBuilder};
use crate::reporter::HumanReporter;
use crate::start::StartOptions;

/// The sample engine's build: fails on commits whose source has a syntax error.
const BUILD_SH: &str = r#"#!/bin/sh
# Demo engine build: "compiles" kernels/embedding.cu.
if grep -q 'SYNTAX ERROR' kernels/embedding.cu; then
  echo "kernels/embedding.cu(12): error: expected a \";\"" >&2
  exit 2
fi
mkdir -p build && cp engine.conf build/engine.conf && echo "built"
"#;

/// The sample engine's repro: one forward step, with the embedding gather bounds-checked on the CPU.
const RUN_SH: &str = r#"#!/bin/sh
# Demo engine repro: one forward step of the sample model on the CPU reference.
. ./build/engine.conf
echo "@@cudabisect node=embed op=gather kernel=embedding_gather begin"
if [ "$max_token_id" -ge "$vocab_rows" ]; then
  echo "CPU reference: gather reads row $max_token_id of a $vocab_rows-row table (buffer embed.weight)"
  echo "error: an illegal memory access was encountered (CUDA_ERROR_ILLEGAL_ADDRESS, detected by the CPU reference)"
  exit 1
fi
echo "@@cudabisect node=embed op=gather kernel=embedding_gather end"
if [ "$workspace_gib" -gt 140 ]; then
  echo "RuntimeError: CUDA out of memory. Tried to allocate $workspace_gib.00 GiB"
  exit 1
fi
echo "step ok"
"#;

struct Engine {
    vocab_rows: u32,
    max_token_id: u32,
    workspace_gib: u32,
    broken: bool,
    notes: u32,
}

impl Engine {
    fn files(&self) -> Files {
        let mut f = Files::new();
        put(&mut f, "build.sh", BUILD_SH, true);
        put(&mut f, "run.sh", RUN_SH, true);
        put(&mut f, ".gitignore", "build/\n", false);
        put(
            &mut f,
            "engine.conf",
            format!(
                "vocab_rows={}\nmax_token_id={}\nworkspace_gib={}\n",
                self.vocab_rows, self.max_token_id, self.workspace_gib
            ),
            false,
        );
        let body = if self.broken {
            "  out[i] = table[idx[i]] SYNTAX ERROR\n"
        } else {
            "  out[i] = table[idx[i]];\n"
        };
        put(
            &mut f,
            "kernels/embedding.cu",
            format!("__global__ void embedding_gather(...) {{\n{body}}}\n"),
            false,
        );
        put(
            &mut f,
            "NOTES.md",
            format!("change log entries: {}\n", self.notes),
            false,
        );
        put(
            &mut f,
            "bisect.toml",
            "[build]\ncommand = [\"./build.sh\"]\ntimeout = \"60s\"\n\n[repro]\ncommand = [\"./run.sh\"]\ntimeout = \"60s\"\n\n[triage]\nenabled = false\n",
            false,
        );
        f
    }
}

/// What the demo history contains, for tests and the closing message.
pub struct DemoRepo {
    /// Where it is.
    pub path: PathBuf,
    /// The planted culprit.
    pub culprit: Oid,
    /// Commits in main's history.
    pub commits: usize,
}

/// Writes the sample repository: 120+ commits, merges every 12 commits, a build break, an unrelated
/// OOM stretch, and the culprit (on a side branch) that shrinks the embedding table below the token ids.
pub fn build_sample(path: &std::path::Path) -> Result<DemoRepo, git2::Error> {
    let mut b = RepoBuilder::init(path)?;
    let mut e = Engine {
        vocab_rows: 1024,
        max_token_id: 1000,
        workspace_gib: 40,
        broken: false,
        notes: 0,
    };
    let mut head = b.commit(&[], &e.files(), "engine: first release")?;
    b.tag("v1.0", head)?;
    let mut culprit = None;
    let mut count = 1;
    for i in 1..=100u32 {
        e.notes += 1;
        e.broken = (30..34).contains(&i);
        e.workspace_gib = if (50..58).contains(&i) { 200 } else { 40 };
        let msg = match i {
            30 => "kernels: start vectorising the gather (does not build yet)".to_string(),
            34 => "kernels: finish vectorising the gather".to_string(),
            50 => "allocator: reserve a 200 GiB workspace".to_string(),
            58 => "allocator: back to a 40 GiB workspace".to_string(),
            _ => format!("engine: change {i}"),
        };
        head = b.commit(&[head], &e.files(), &msg)?;
        count += 1;
        if i % 12 == 0 {
            // A side branch of three commits, merged back.
            let mut side = head;
            let mut side_engine = Engine { ..e };
            for j in 0..3 {
                side_engine.notes += 100;
                let msg = if i == 72 && j == 1 {
                    side_engine.vocab_rows = 960;
                    "embedding: shrink the table to 960 rows to save memory".to_string()
                } else {
                    format!("docs: side note {i}.{j}")
                };
                side = b.commit(&[side], &side_engine.files(), &msg)?;
                if i == 72 && j == 1 {
                    culprit = Some(side);
                }
                count += 1;
            }
            e.vocab_rows = side_engine.vocab_rows;
            e.notes = side_engine.notes + 1;
            head = b.commit(
                &[head, side],
                &e.files(),
                &format!("Merge branch 'side-{i}'"),
            )?;
            count += 1;
        }
    }
    b.set_branch("main", head)?;
    b.checkout_main()?;
    let culprit = culprit.ok_or_else(|| git2::Error::from_str("culprit not planted"))?;
    Ok(DemoRepo {
        path: path.to_path_buf(),
        culprit,
        commits: count,
    })
}

/// Runs the demo; returns the exit code.
pub fn run(dir: Option<PathBuf>, cancel: &AtomicBool) -> i32 {
    let path = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("cudabisect-demo-{}", std::process::id()))
    });
    if path.exists()
        && std::fs::read_dir(&path)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        eprintln!("error: {} exists and is not empty", path.display());
        return crate::exit_codes::USAGE;
    }
    let sample = match build_sample(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot write the sample repository: {e}");
            return crate::exit_codes::INTERNAL;
        }
    };
    eprintln!(
        "demo: sample repository with {} commits at {} (planted culprit {})",
        sample.commits,
        sample.path.display(),
        &sample.culprit.to_string()[..12]
    );
    eprintln!("demo: the engine runs on the CPU reference here; no GPU is used");
    let opts = StartOptions {
        dir: path.clone(),
        range: "v1.0..main".into(),
        ..StartOptions::default()
    };
    let code = cmd_start(&opts, &mut HumanReporter::new(), cancel);
    eprintln!("demo: the sample repository stays at {}", path.display());
    code
}
