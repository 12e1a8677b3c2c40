//! `cudabisect demo`: lays out a sample repository with a long, messy history (merges, build breaks, an
//! unrelated failure, a planted out-of-bounds regression) for `cudabisect demo` and the tests.

use std::path::PathBuf;

use git2::Oid;

use super::repo_builder::{put, Files, RepoBuilder};

const MODEL: &str = include_str!("../../fixtures/demo/model.toml.in");
const BISECT: &str = include_str!("../../fixtures/demo/bisect.toml.in");
const BUILD_SH: &str = include_str!("../../fixtures/demo/build.sh");
const KERNELS: &str = include_str!("../../fixtures/demo/kernels/engine_ops.cu");
const README: &str = include_str!("../../fixtures/demo/README.md");

/// Rows of the token table before the regression; token ids are drawn from all of them. The table is
/// large (128 MiB) so that the ids that reach past the shrunk table land far outside any allocation, where
/// a GPU faults without compute-sanitizer, not in pooled neighbours.
const VOCAB: u32 = 262_144;
/// Rows after the planted regression: token ids still reach past them.
const SHRUNK_VOCAB: u32 = 1000;

/// One state of the sample engine.
#[derive(Clone)]
struct Engine {
    vocab_rows: u32,
    /// The routing table holds a sentinel row: an unrelated out-of-bounds write in `route`.
    route_bug: bool,
    /// The model file does not parse: the build fails.
    broken: bool,
    notes: u32,
}

/// How the demo runs the engine; written into the sample's bisect.toml.
pub struct DemoSettings {
    /// The cudabisect binary the sample's bisect.toml runs.
    pub exe: String,
    /// The native harness backend (`cuda` or `cpu`).
    pub backend: &'static str,
    /// Whether triage is on (compute-sanitizer and a GPU are present).
    pub triage: bool,
}

impl Engine {
    fn files(&self, settings: &DemoSettings) -> Files {
        let route: Vec<String> = (0..64u32)
            .map(|i| {
                if self.route_bug && i == 40 {
                    "4194304".to_string()
                } else {
                    (i ^ 1).to_string()
                }
            })
            .collect();
        let model = MODEL
            .replace("{{VOCAB_ROWS}}", &self.vocab_rows.to_string())
            .replace("{{ROUTE_IDX}}", &format!("[{}]", route.join(", ")))
            .replace("{{NOTE}}", &format!("revision {}", self.notes))
            .replace(
                "{{BROKEN}}",
                if self.broken {
                    "outputs = [\"y\"  # unterminated while moving the head"
                } else {
                    ""
                },
            );
        let bisect = BISECT
            .replace("{{CUDABISECT}}", &settings.exe)
            .replace("{{BACKEND}}", settings.backend)
            .replace("{{TRIAGE}}", if settings.triage { "true" } else { "false" });
        let mut f = Files::new();
        put(&mut f, "model.toml", model, false);
        put(&mut f, "bisect.toml", bisect, false);
        put(&mut f, "build.sh", BUILD_SH, true);
        put(&mut f, "kernels/engine_ops.cu", KERNELS, false);
        put(&mut f, "README.md", README, false);
        put(
            &mut f,
            "CHANGES.md",
            format!("change log entries: {}\n", self.notes),
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

/// Writes the sample repository: 130+ commits, a side branch merged every 12 commits, two commits that
/// do not build, an unrelated out-of-bounds write in another kernel for five commits, and the culprit (on a
/// side branch) that shrinks the token table below the token ids.
pub fn build_sample(
    path: &std::path::Path,
    settings: &DemoSettings,
) -> Result<DemoRepo, git2::Error> {
    let mut b = RepoBuilder::init(path)?;
    let mut e = Engine {
        vocab_rows: VOCAB,
        route_bug: false,
        broken: false,
        notes: 0,
    };
    let mut head = b.commit(&[], &e.files(settings), "engine: first release")?;
    b.tag("v1.0", head)?;
    let mut culprit = None;
    let mut count = 1;
    for i in 1..=100u32 {
        e.notes += 1;
        e.broken = (61..63).contains(&i);
        e.route_bug = (49..54).contains(&i);
        let msg = match i {
            61 => "model: move the classifier head (work in progress, does not build)".to_string(),
            63 => "model: finish moving the classifier head".to_string(),
            49 => "routing: send token 40 to the overflow expert".to_string(),
            54 => "routing: drop the overflow expert again".to_string(),
            _ => format!("engine: change {i}"),
        };
        head = b.commit(&[head], &e.files(settings), &msg)?;
        count += 1;
        if i % 12 == 0 {
            // A side branch of three commits, merged back.
            let mut side = head;
            let mut side_engine = e.clone();
            for j in 0..3 {
                side_engine.notes += 100;
                let msg = if i == 72 && j == 1 {
                    side_engine.vocab_rows = SHRUNK_VOCAB;
                    format!(
                        "embedding: shrink the token table to {SHRUNK_VOCAB} rows to save memory"
                    )
                } else {
                    format!("docs: side note {i}.{j}")
                };
                side = b.commit(&[side], &side_engine.files(settings), &msg)?;
                if i == 72 && j == 1 {
                    culprit = Some(side);
                }
                count += 1;
            }
            e.vocab_rows = side_engine.vocab_rows;
            e.notes = side_engine.notes + 1;
            head = b.commit(
                &[head, side],
                &e.files(settings),
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

/// Picks the backend the way the harness's `auto` would, and triage when compute-sanitizer is there too.
pub fn settings() -> DemoSettings {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "cudabisect".into());
    let cuda = crate::harness::cuda::probe();
    let backend = if cuda.is_ok() { "cuda" } else { "cpu" };
    let triage = cuda.is_ok() && crate::exec::tools::find_sanitizer(None).is_some();
    DemoSettings {
        exe,
        backend,
        triage,
    }
}
