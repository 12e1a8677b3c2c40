//! The hand-off bundle: a directory a framework maintainer can use without the user's checkout or
//! cudabisect's state directory — REPORT.md to paste into an issue, the minimal model with its recorded
//! inputs and a script that reproduces it, report.json, logs, the config and the environment.

use crate::report::record::short_sha;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::classify::Signature;
use crate::config::{BuildSection, CommandLine, ReproSection};
use crate::git::CommitInfo;
use crate::protocol::torch::needs_project;
use crate::protocol::types::GraphTensor;

use super::environment::Environment;
use super::record::{CommitRef, ShrinkReport, TriageResult};

/// Why a bundle could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the bundle at {path}: {source}")]
pub struct BundleError {
    /// The path that could not be written.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// What goes into a bundle; sections that are `None` are left out of REPORT.md.
pub struct BundleInput<'a> {
    /// The bundle root (default `bundles/` in the state directory); the bundle is `<root>/<short sha>`.
    pub root: PathBuf,
    /// The commit the bundle is about (the first bad commit).
    pub commit: Option<CommitInfo>,
    /// Its good parent(s).
    pub good_parents: Vec<CommitRef>,
    /// How it was found, one line (`bisected 133 commits in 9 probes`).
    pub found_by: Option<String>,
    /// The target signature.
    pub target: Option<Signature>,
    /// The triage result.
    pub triage: Option<&'a TriageResult>,
    /// The shrink result.
    pub shrink: Option<&'a ShrinkReport>,
    /// The whole machine-readable report.
    pub report_json: serde_json::Value,
    /// The config used, as written.
    pub config_text: &'a str,
    /// Directories copied into `logs/`, each under its label (`probes`, `shrink`).
    pub log_dirs: Vec<(&'static str, PathBuf)>,
    /// Single files copied into `logs/` (sanitizer reports).
    pub extra_files: Vec<PathBuf>,
    /// The backend the reproduce script uses by default (the native harness).
    pub backend: Option<String>,
    /// Copy the cudabisect binary into `bin/` (native-harness repros on machines without it).
    pub include_binary: bool,
    /// The project's own build and repro: what `reproduce.sh` runs at the commit when there is no
    /// minimal repro.
    pub full_repro: Option<FullRepro<'a>>,
}

/// The project's own build and repro commands, with their environments.
#[derive(Clone, Copy)]
pub struct FullRepro<'a> {
    /// `[build]`, when there is one.
    pub build: Option<&'a BuildSection>,
    /// `[repro]`.
    pub repro: &'a ReproSection,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BundleError + '_ {
    move |source| BundleError {
        path: path.to_path_buf(),
        source,
    }
}

/// Copies the directory `from` to `to`, recursively (created when missing).
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// Writes the bundle and returns its directory. A bundle from an earlier run of the same commit is replaced.
pub fn write(input: &BundleInput, env: &Environment) -> Result<PathBuf, BundleError> {
    let name = input
        .commit
        .as_ref()
        .map_or("worktree", |c| short_sha(&c.commit));
    let dir = input.root.join(name);
    // Nothing is written beside the bundle: a root the user chose (even inside their checkout) gets no
    // `.gitignore` or anything else of ours.
    std::fs::create_dir_all(&input.root).map_err(io(&input.root))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    std::fs::create_dir_all(dir.join("logs")).map_err(io(&dir))?;
    let json = serde_json::to_string_pretty(&input.report_json).unwrap_or_default();
    std::fs::write(dir.join("report.json"), json + "\n").map_err(io(&dir))?;
    std::fs::write(dir.join("bisect.toml"), input.config_text).map_err(io(&dir))?;
    let env_json = serde_json::to_string_pretty(env).unwrap_or_default();
    std::fs::write(dir.join("environment.json"), env_json + "\n").map_err(io(&dir))?;
    for (label, from) in &input.log_dirs {
        if from.is_dir() && std::fs::read_dir(from).is_ok_and(|mut d| d.next().is_some()) {
            let to = dir.join("logs").join(label);
            copy_dir(from, &to).map_err(io(&to))?;
        }
    }
    for f in &input.extra_files {
        if let Some(name) = f.file_name().filter(|_| f.is_file()) {
            std::fs::copy(f, dir.join("logs").join(name)).map_err(io(f))?;
        }
    }
    let mut reproduce = None;
    if let Some(minimal) = input
        .shrink
        .and_then(|s| s.minimal_model.as_ref())
        .map(PathBuf::from)
    {
        if let Some(src) = minimal.parent().filter(|p| p.is_dir()) {
            copy_dir(src, &dir.join("minimal")).map_err(io(&dir))?;
            reproduce = Some(if minimal.extension().is_some_and(|e| e == "py") {
                let folders = input.full_repro.map_or_else(Vec::new, |f| {
                    crate::exec::child_env::relative_pythonpath(&f.repro.env)
                });
                let project =
                    needs_project(&minimal)
                        .zip(input.commit.as_ref())
                        .map(|(modules, c)| Project {
                            modules,
                            commit: c.commit.as_str(),
                            folders,
                        });
                let memcheck = input.shrink.is_some_and(|s| s.memcheck.is_some());
                write_python_script(&dir, project, memcheck)?
            } else {
                write_native_script(
                    &dir,
                    input.backend.as_deref().unwrap_or("cuda"),
                    input.include_binary,
                )?
            });
        }
    }
    let mut full = None;
    if let (None, Some(f), Some(c)) = (&reproduce, input.full_repro, &input.commit) {
        // No minimal repro: the hand-off still runs, with the project's own repro at the commit.
        write_script(&dir, &full_repro_script(&c.commit, f))?;
        full = Some(c.commit.clone());
    }
    let mut md = render(input, env, reproduce.as_deref(), full.as_deref());
    // Its size, REPORT.md's own included (this line too), where an issue tracker's attachment limit is
    // what matters.
    let size_line = |bytes: u64| {
        format!(
            "\nThe bundle is {} in all; `cudabisect bundle pack <this directory> -o issue.tar.gz` makes the one file to attach.\n",
            super::human::human_bytes(bytes)
        )
    };
    let without = dir_bytes(&dir) + md.len() as u64;
    let total = without + size_line(without).len() as u64;
    md.push_str(&size_line(total));
    std::fs::write(dir.join("REPORT.md"), md).map_err(io(&dir))?;
    Ok(dir)
}

/// The bytes of the files under `dir`, recursively (what cannot be read counts nothing).
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// The project a minimal repro imports: its modules, the commit to check out, and the folders of the
/// checkout that go on `PYTHONPATH` beside its root (the relative entries of `[repro] env`'s: `src`).
struct Project<'a> {
    modules: String,
    commit: &'a str,
    folders: Vec<String>,
}

/// `reproduce.sh` for a PyTorch minimal repro: `python repro.py`. When the repro's copied code imports
/// the project under test (`project`: its modules and the culprit commit), the script checks the
/// project out at that commit in a fresh directory and puts it on `PYTHONPATH` first. With `memcheck`
/// (the fault showed only under it), repro.py runs under compute-sanitizer's memcheck.
fn write_python_script(
    dir: &Path,
    project: Option<Project>,
    memcheck: bool,
) -> Result<String, BundleError> {
    let (run, shows, line) = if memcheck {
        let env: String = crate::exec::tools::POOLS_OFF
            .iter()
            .map(|(k, v, _)| format!("export {k}={v}\n"))
            .collect();
        (
            format!("{env}exec \"${{COMPUTE_SANITIZER:-compute-sanitizer}}\" --tool memcheck \"${{PYTHON:-python3}}\" \"$here/minimal/repro.py\""),
            "# Under compute-sanitizer's memcheck (set COMPUTE_SANITIZER to pick it): the overrun lands in memory a\n# small process maps, so only memcheck shows it. Its \"Invalid ... access\" record means the fault reproduced.",
            format!(
                "CUDA_LAUNCH_BLOCKING=1 {} python minimal/repro.py",
                crate::protocol::memcheck::memcheck_prefix()
            ),
        )
    } else {
        (
            "exec \"${PYTHON:-python3}\" \"$here/minimal/repro.py\"".to_string(),
            "# Exit status 1 and the CUDA error mean the fault reproduced.",
            "CUDA_LAUNCH_BLOCKING=1 python minimal/repro.py".to_string(),
        )
    };
    let Some(Project {
        modules,
        commit,
        folders,
    }) = project
    else {
        let script = format!(
            r#"#!/bin/sh
# Reproduces the fault from this bundle alone: minimal/repro.py with its saved values (repro_data.pt, or
# repro_data.npz and the exported steps). Needs only its framework: torch (and triton when the repro's
# own kernels use it), or jax. Set PYTHON to pick the interpreter.
{shows}
here=$(cd "$(dirname "$0")" && pwd)
export CUDA_LAUNCH_BLOCKING=1
{run}
"#
        );
        write_script(dir, &script)?;
        return Ok(format!("{line}   # or: ./reproduce.sh"));
    };
    let script = format!(
        r#"#!/bin/sh
# Reproduces the fault from this bundle: minimal/repro.py with its saved values, and the
# project under test at the first bad commit {commit} (the repro's copied code imports {modules}).
# Usage: ./reproduce.sh [REPOSITORY]   Set PYTHON to pick the interpreter.
{shows}
here=$(cd "$(dirname "$0")" && pwd)
{clone}export PYTHONPATH="$work/src{folders}${{PYTHONPATH:+:$PYTHONPATH}}"
export CUDA_LAUNCH_BLOCKING=1
{run}
"#,
        clone = clone_at(commit),
        // Only plain relative paths go into the script (one with shell syntax would run there).
        folders = folders
            .iter()
            .filter(|f| f
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c)))
            .map(|f| format!(":$work/src/{f}"))
            .collect::<String>()
    );
    write_script(dir, &script)?;
    Ok(format!(
        "./reproduce.sh /path/to/the/project   # repro.py needs the project at {} on PYTHONPATH",
        short_sha(commit)
    ))
}

/// Shell lines that clone the repository (the script's argument, else the one around the current
/// directory) into a fresh directory `$work/src` and check out `commit` there, submodules included.
fn clone_at(commit: &str) -> String {
    format!(
        r#"set -eu
repo=${{1:-$(git rev-parse --show-toplevel)}}
work=$(mktemp -d "${{TMPDIR:-/tmp}}/cudabisect-repro.XXXXXX")
echo "reproduce.sh: checking out {commit} in $work/src" >&2
git clone --quiet --no-checkout "$repo" "$work/src"
git -C "$work/src" checkout --quiet --detach {commit}
git -C "$work/src" submodule update --init --recursive --quiet 2>/dev/null || true
"#
    )
}

/// `reproduce.sh` for a native-harness minimal model; with `include_binary`, the binary that found it
/// goes alongside in `bin/`.
fn write_native_script(
    dir: &Path,
    backend: &str,
    include_binary: bool,
) -> Result<String, BundleError> {
    if include_binary {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).map_err(io(&bin))?;
        if let Ok(exe) = std::env::current_exe() {
            std::fs::copy(&exe, bin.join("cudabisect")).map_err(io(&bin))?;
        }
    }
    let script = format!(
        r#"#!/bin/sh
# Reproduces the fault from this bundle: the minimal model and its recorded inputs, run by cudabisect
# (bin/cudabisect when the bundle carries it, else the one on PATH, or set CUDABISECT). Backend: cuda by default
# where the bundle was made on a GPU; override with CUDABISECT_BACKEND=cuda|cpu|auto.
# Exit status 1 and an "illegal memory access" line mean the fault reproduced.
here=$(cd "$(dirname "$0")" && pwd)
bin=${{CUDABISECT:-$here/bin/cudabisect}}
if ! "$bin" --version >/dev/null 2>&1; then bin=cudabisect; fi
export CUDA_LAUNCH_BLOCKING=1
exec "$bin" harness run "$here/minimal/model.toml" --backend "${{CUDABISECT_BACKEND:-{backend}}}"
"#
    );
    write_script(dir, &script)?;
    Ok(format!("CUDA_LAUNCH_BLOCKING=1 cudabisect harness run minimal/model.toml --backend {backend}   # or: ./reproduce.sh"))
}

/// A command as one shell line: an argv array quoted word by word, a shell line as written.
fn shell_line(command: &CommandLine) -> String {
    match command {
        CommandLine::Argv(v) => v
            .iter()
            .map(|a| {
                shlex::try_quote(a)
                    .map(|q| q.into_owned())
                    .unwrap_or_else(|_| format!("'{}'", a.replace('\0', "").replace('\'', r"'\''")))
            })
            .collect::<Vec<_>>()
            .join(" "),
        CommandLine::Shell(s) => s.clone(),
    }
}

/// `export K=V` lines for an environment.
fn exports(env: &std::collections::BTreeMap<String, String>) -> String {
    env.iter()
        .map(|(k, v)| {
            let v = shlex::try_quote(v).map_or_else(|_| "''".into(), |q| q.into_owned());
            format!("export {k}={v}\n")
        })
        .collect()
}

/// `reproduce.sh` when there is no minimal repro: the project's own build and repro at `commit`, in a
/// fresh clone of the repository (the argument, else the one around the current directory), with the
/// environment the probes had.
fn full_repro_script(commit: &str, full: FullRepro) -> String {
    let build = full.build.map_or(String::new(), |b| {
        format!(
            "echo \"reproduce.sh: building\" >&2\n(\n{}{}\n)\n",
            exports(&b.env),
            shell_line(&b.command)
        )
    });
    let blocking = if full.repro.launch_blocking { 1 } else { 0 };
    format!(
        r#"#!/bin/sh
# Reproduces the fault with the project's own repro at the first bad commit {commit}: no smaller repro
# could be made (REPORT.md says why). Usage: ./reproduce.sh [REPOSITORY]
# REPOSITORY: a clone or URL of the project (default: the git repository around the current directory).
# The checkout is made in a fresh directory, which is kept and printed; your own checkout is not touched.
# Exit status non-zero and the CUDA error mean the fault reproduced.
{clone}cd "$work/src"
{build}export CUDA_LAUNCH_BLOCKING={blocking}
{env}echo "reproduce.sh: running the repro" >&2
exec {repro}
"#,
        env = exports(&full.repro.env),
        clone = clone_at(commit),
        repro = match &full.repro.command {
            CommandLine::Shell(s) => format!(
                "sh -c {}",
                shlex::try_quote(s).map_or_else(|_| "''".into(), |q| q.into_owned())
            ),
            argv => shell_line(argv),
        }
    )
}

/// Writes `reproduce.sh`, executable.
fn write_script(dir: &Path, script: &str) -> Result<(), BundleError> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("reproduce.sh");
    std::fs::write(&path, script).map_err(io(&path))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).map_err(io(&path))
}

/// Why a shrink left no minimal repro, in a maintainer's words.
fn no_minimal_reason(s: &ShrinkReport) -> String {
    use super::record::ShrinkStatus;
    let captured = s.captured.as_ref().map_or(String::new(), |c| {
        format!(
            " (the fault was captured at step {} of the training script, in the {} phase)",
            c.step, c.phase
        )
    });
    match s.status {
        ShrinkStatus::NotReproduced => format!(
            "the shrink harness did not reproduce the fault{captured}: {}",
            s.summary
        ),
        ShrinkStatus::Interrupted => "the shrink was interrupted".to_string(),
        ShrinkStatus::NotApplicable => s.summary.clone(),
        _ => format!("the shrink stopped{captured}: {}", s.summary),
    }
}

/// A PyTorch repro that had to pickle the user's own module classes says so in its docstring.
fn needs_user_package(input: &BundleInput) -> bool {
    input
        .shrink
        .and_then(|s| s.minimal_model.as_deref())
        .filter(|m| m.ends_with(".py"))
        .and_then(|m| std::fs::read_to_string(m).ok())
        .is_some_and(|text| text.contains("NOT STANDALONE"))
}

fn dir_has_repro_py(input: &BundleInput) -> bool {
    input
        .shrink
        .and_then(|s| s.minimal_model.as_deref())
        .is_some_and(|m| m.ends_with(".py"))
}

/// REPORT.md: ready to paste into an issue.
pub fn render(
    input: &BundleInput,
    env: &Environment,
    reproduce: Option<&str>,
    full_repro: Option<&str>,
) -> String {
    let mut md = String::new();
    let title = match (&input.target, &input.commit) {
        (Some(t), Some(c)) => format!("{} since {}", t.short(), short_sha(&c.commit)),
        (Some(t), None) => t.short(),
        (None, Some(c)) => format!("Repro bundle for {}", short_sha(&c.commit)),
        (None, None) => "Repro bundle".into(),
    };
    let _ = writeln!(md, "# {title}\n");
    if let Some(c) = &input.commit {
        let heading = if input.good_parents.is_empty() {
            "## Commit"
        } else {
            "## First bad commit"
        };
        let _ = writeln!(md, "{heading}\n");
        let _ = writeln!(md, "- commit `{}`: {}", c.commit, c.subject);
        let _ = writeln!(md, "- author: {}", c.author);
        let _ = writeln!(md, "- date: {}", c.date);
        for p in &input.good_parents {
            let _ = writeln!(md, "- good parent: `{}` {}", p.commit, p.subject);
        }
        if let Some(how) = &input.found_by {
            let _ = writeln!(md, "- found by: {how}");
        }
        if !c.files_changed.is_empty() {
            let _ = writeln!(
                md,
                "\nFiles changed:\n\n```\n{}\n```",
                c.files_changed.join("\n")
            );
        }
        md.push('\n');
    }
    if let Some(t) = &input.target {
        let _ = writeln!(md, "## The fault\n");
        let _ = writeln!(
            md,
            "- class: `{}`{}",
            t.class.as_str(),
            t.code
                .map(|c| format!(" (CUDA error {c})"))
                .unwrap_or_default()
        );
        if let Some(k) = &t.kernel {
            let _ = writeln!(md, "- kernel: `{k}`");
        }
        if let Some(s) = &t.site {
            let _ = writeln!(md, "- site: {s}");
        }
        if let Some(r) = t.rank {
            let _ = writeln!(
                md,
                "- rank: {r} faulted first. The run launches every rank (the repro command in `bisect.toml`); \
                 each rank's own lines are in `logs/probes/*.rank<N>.log` beside the whole run's log."
            );
        }
        let _ = writeln!(md, "\n```\n{}\n```\n", t.summary);
        if !t.stack.is_empty() {
            // The traceback as the project's own code saw it: its frames, outermost first, paths relative
            // to the repository (the whole log is in `logs/probes/`).
            let _ = writeln!(md, "Traceback of the faulting run (the project's own frames, most recent call last):\n\n```");
            for frame in &t.stack {
                let _ = writeln!(md, "  {frame}");
            }
            let _ = writeln!(md, "{}\n```\n", t.summary);
        }
    }
    if let Some(tr) = &input.triage {
        let _ = writeln!(
            md,
            "## compute-sanitizer (caching allocator off, launches synchronous)\n"
        );
        let _ = writeln!(md, "{}\n", tr.summary);
        if !tr.findings.is_empty() {
            md.push_str("```\n");
            for l in tr.findings.iter().take(20) {
                let _ = writeln!(md, "{}", l.line);
            }
            md.push_str("```\n\nFull sanitizer logs and XML: `logs/`.\n\n");
        }
    }
    if let Some(s) = input.shrink {
        let _ = writeln!(md, "## Minimal repro\n");
        let _ = writeln!(md, "{}\n", s.summary);
        let ways = s.way_lines();
        for line in &ways {
            let _ = writeln!(md, "{line}.");
        }
        if !ways.is_empty() {
            md.push('\n');
        }
        if !s.kept.is_empty() {
            md.push_str("| node | op | kernel | inputs | outputs |\n|---|---|---|---|---|\n");
            for n in &s.kept {
                let tensors = |ts: &[GraphTensor]| {
                    ts.iter()
                        .map(|t| format!("`{}` {}", t.name, t.shape_text()))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                // The node the fault was located in names the kernel that faulted there (a captured
                // call's label is its function's name, not the kernel it launched).
                let faulted = s
                    .signature
                    .as_ref()
                    .and_then(|sig| sig.kernel.as_deref())
                    .filter(|_| s.located_node.as_deref() == Some(n.id.as_str()));
                let _ = writeln!(
                    md,
                    "| `{}` | {} | {} | {} | {} |",
                    n.id,
                    n.op,
                    faulted
                        .or(n.kernel.as_deref())
                        .filter(|k| crate::marker::names_a_kernel(&n.op, k))
                        .unwrap_or("—"),
                    tensors(&n.inputs),
                    tensors(&n.outputs)
                );
            }
            let cut: Vec<String> = s
                .removed
                .iter()
                .take(30)
                .map(|r| format!("`{r}`"))
                .collect();
            let more = s.removed.len().saturating_sub(30);
            let _ = writeln!(
                md,
                "\nCut: {} of {} nodes ({}{}).",
                s.removed.len(),
                s.nodes_before,
                cut.join(", "),
                if more > 0 {
                    format!(", and {more} more")
                } else {
                    String::new()
                }
            );
            if let Some(g) = &s.graph {
                let _ = writeln!(
                    md,
                    "\nHow the model was split into nodes: {}.",
                    super::human::graph_words(g)
                );
            }
            if let Some(why) = &s.memcheck {
                let _ = writeln!(
                    md,
                    "\n**The minimal repro shows the fault under compute-sanitizer's memcheck** (`reproduce.sh` runs it so). Outside memcheck, {why}: the access lands just past a buffer, in memory that a process with other buffers there maps, while the repro's own process faulted because nothing was mapped there. memcheck sees the access wherever it lands."
                );
            }
            if let Some(d) = &s.data {
                use super::human::human_bytes;
                let how = if d.generated {
                    format!(
                        ": its large recorded values are generated from their shape, dtype and range (the fault was checked to show that way), {} with them exact",
                        human_bytes(d.exact_bytes)
                    )
                } else {
                    d.note
                        .as_deref()
                        .map_or(String::new(), |n| format!(" ({n})"))
                };
                let _ = writeln!(md, "\nThe minimal repro is {}{how}.", human_bytes(d.bytes));
                if let Some(a) = &d.alone {
                    let _ = if a.reproduced > 0 {
                        writeln!(md, "\nRun by itself in a fresh process (`python minimal/repro.py`{}), it showed the fault in {} of {} run{}.", if s.memcheck.is_some() { " under memcheck" } else { "" }, a.reproduced, a.runs, if a.runs == 1 { "" } else { "s" })
                    } else {
                        writeln!(md, "\n**Run by itself in a fresh process, `minimal/repro.py` did not show the fault** ({} run{}; the last ended: {}): use the harness's reproduce line instead.", a.runs, if a.runs == 1 { "" } else { "s" }, a.missed.as_deref().unwrap_or("no output"))
                    };
                }
            }
            if let Some(c) = &s.captured {
                let _ = writeln!(
                    md,
                    "\nCaptured from the training script: step {}, in the {} phase (model call {} of the step){}.",
                    c.step,
                    c.phase,
                    c.call,
                    c.kernel
                        .as_deref()
                        .map_or(String::new(), |k| format!(", Triton kernel `{k}` launched last"))
                );
                if let Some(line) = c.forward_line() {
                    let _ = writeln!(
                        md,
                        "The failing backward node was created by the forward call at `{line}`."
                    );
                }
            }
            for n in s
                .kept
                .iter()
                .filter(|n| n.phase.as_deref() != Some("backward"))
            {
                if let Some(src) = &n.source {
                    let _ = writeln!(md, "`{}` is called at `{src}`.", n.id);
                }
            }
            for n in s
                .kept
                .iter()
                .filter(|n| n.phase.as_deref() == Some("backward"))
            {
                let _ = writeln!(
                    md,
                    "`{}` is the backward of `{}`{}.",
                    n.id,
                    n.forward.as_deref().unwrap_or("?"),
                    n.source.as_deref().map_or(String::new(), |src| format!(
                        ", whose forward call is at `{src}`"
                    ))
                );
            }
            let kept: Vec<&str> = s.kept.iter().map(|n| n.id.as_str()).collect();
            let boundary: Vec<String> = s
                .kept
                .iter()
                .flat_map(|n| &n.inputs)
                .filter(|t| t.producer.as_deref().is_some_and(|p| !kept.contains(&p)))
                .map(|t| {
                    format!(
                        "`{}` (from `{}`)",
                        t.name,
                        t.producer.as_deref().unwrap_or("")
                    )
                })
                .collect();
            if !boundary.is_empty() {
                let place = if s
                    .minimal_model
                    .as_deref()
                    .is_some_and(|m| m.ends_with(".py"))
                {
                    "minimal/repro_data.pt"
                } else {
                    "minimal/inputs/"
                };
                // Where the large values were generated, the sentence says so rather than "exact".
                let what = if s.data.as_ref().is_some_and(|d| d.generated) {
                    "the tensors the full model produced at this commit, the large ones generated from their recorded shape, dtype and range (see above) and the rest exact"
                } else {
                    "the exact tensors the full model produced at this commit"
                };
                let _ = writeln!(
                    md,
                    "The kept nodes read {} from cut nodes: {what}, recorded in `{place}` (not random stand-ins).",
                    boundary.join(", "),
                );
            }
            md.push('\n');
        }
        if let Some(c) = &s.confirmation {
            let _ = writeln!(
                md,
                "- reproduction rate: {}/{} runs of the minimal repro show the same signature",
                c.reproduced, c.runs
            );
        }
        if let Some(p) = &s.parent_check {
            let _ = writeln!(md, "- at the good parent: {p}");
        }
        let _ = writeln!(
            md,
            "- shrinking took {} harness run{} to the minimal subgraph ({} in all), {:.1} s",
            s.runs_to_minimal,
            if s.runs_to_minimal == 1 { "" } else { "s" },
            s.harness_runs,
            s.duration_s
        );
        if !s.rejected.is_empty() {
            let _ = writeln!(
                md,
                "- {} candidates failed differently and were rejected (not the same bug)",
                s.rejected.len()
            );
        }
        md.push('\n');
    }
    let _ = writeln!(md, "## Reproduce\n");
    match (reproduce, input.shrink.and_then(|s| s.reproduce.as_deref())) {
        (Some(line), _) if needs_user_package(input) => {
            let _ = writeln!(
                md,
                "From this directory:\n\n```\n{line}\n```\n\nNot standalone: `repro.py` unpickles the model's own module classes from `minimal/repro_modules.pt` (a full pickle: opening it runs code, so open it only from a source you trust), and their package must be importable (see the top of `repro.py`). Everything else (`minimal/repro_data.pt`) loads with `weights_only=True`.\n"
            );
        }
        (Some(line), _) => match input
            .shrink
            .and_then(|s| s.minimal_model.as_deref())
            .and_then(|m| needs_project(Path::new(m)))
        {
            Some(modules) => {
                let _ = writeln!(
                    md,
                    "From this directory, with a clone of the project (its own code is not copied into the bundle: `repro.py` imports {modules}); the script checks the first bad commit out in a fresh directory and puts it on `PYTHONPATH`:\n\n```\n{line}\n```\n"
                );
            }
            None => {
                let _ = writeln!(
                    md,
                    "From this directory, with nothing else:\n\n```\n{line}\n```\n"
                );
            }
        },
        (None, Some(line)) => {
            let why = input
                .shrink
                .and_then(|s| s.extract_error.as_deref())
                .map(|e| format!(" ({e})"))
                .unwrap_or_default();
            let _ = writeln!(md, "The harness could not write a standalone model{why}; from the repository at the first bad commit:\n\n```\n{line}\n```\n");
        }
        (None, None) if full_repro.is_none() => {
            let _ = writeln!(md, "No minimal repro was made; the repro command is in `bisect.toml`, the failing run's log in `logs/`.\n");
        }
        (None, _) => {}
    }
    if let Some(commit) = full_repro {
        let why = match input.shrink {
            None => "the shrink was turned off (`--no-shrink`, or `enabled = false` under `[shrink]` in `bisect.toml`)".to_string(),
            Some(s) => match &s.extract_error {
                Some(e) if s.minimal_model.is_none() && !s.kept.is_empty() => {
                    format!("the minimal subgraph was found, but no standalone repro could be written: {e}")
                }
                _ => no_minimal_reason(s),
            },
        };
        let _ = writeln!(
            md,
            "No minimal repro: {why}.\n\n`reproduce.sh` runs the project's own repro at the first bad commit instead: it clones the repository (its argument, default the one around the current directory) into a fresh directory, checks out `{commit}`, builds it as the bisection did and runs the repro command of `bisect.toml` with the same environment (`CUDA_LAUNCH_BLOCKING=1`):\n\n```\n./reproduce.sh /path/to/the/project\n```\n"
        );
    }
    if let (Some(c), Some(parent)) = (&input.commit, input.good_parents.first()) {
        // The conclusion checked in two probes, with the config of this run.
        let _ = writeln!(
            md,
            "To check the first bad commit from a clone of the project, with this bundle's `bisect.toml`:\n\n```\ncudabisect start {}..{} --config <this directory>/bisect.toml\n```\n",
            short_sha(&parent.commit),
            short_sha(&c.commit)
        );
    }
    let _ = writeln!(md, "## Environment\n\n{}", env.markdown());
    let _ = writeln!(md, "\n## Files\n\n- `report.json`: the whole run, machine-readable\n- `bisect.toml`: the config used\n- `logs/`: probe, shrink and sanitizer logs\n- `environment.json`: the environment above");
    if full_repro.is_some() {
        let _ = writeln!(
            md,
            "- `reproduce.sh`: the project's own repro at the first bad commit, in a fresh clone"
        );
    }
    if reproduce.is_some() {
        if dir_has_repro_py(input) {
            let _ = writeln!(md, "- `minimal/repro.py`, `minimal/repro_data.pt`: the standalone PyTorch repro, and its saved tensors and module state dicts (loads with `weights_only=True`: opening it runs no code)\n- `reproduce.sh`: runs it");
        } else {
            let _ = writeln!(md, "- `minimal/`: the minimal model and its recorded inputs (`.npy`, loadable with numpy)\n- `reproduce.sh`: the reproduce script (it runs `bin/cudabisect` when the bundle carries one, else cudabisect from PATH)");
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the written `reproduce.sh` with a stand-in compute-sanitizer that prints what it was asked to
    /// run and with which pool settings.
    fn ran(memcheck: bool) -> (String, String) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("minimal")).unwrap();
        std::fs::write(dir.path().join("minimal/repro.py"), "print('hi')\n").unwrap();
        let line = write_python_script(dir.path(), None, memcheck).unwrap();
        let fake = dir.path().join("fake-sanitizer");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho \"sanitizer $* pool=$PYTORCH_NO_CUDA_MEMORY_CACHING xla=$XLA_PYTHON_CLIENT_ALLOCATOR\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = std::process::Command::new(dir.path().join("reproduce.sh"))
            .env("COMPUTE_SANITIZER", &fake)
            .env("PYTHON", "echo")
            .env_remove("PYTORCH_NO_CUDA_MEMORY_CACHING")
            .output()
            .unwrap();
        (line, String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    fn a_repro_that_shows_only_under_memcheck_is_run_under_it_with_the_pools_off() {
        let (line, said) = ran(true);
        assert!(
            said.starts_with("sanitizer --tool memcheck echo ")
                && said.contains("minimal/repro.py"),
            "{said}"
        );
        assert!(said.contains("pool=1 xla=platform"), "{said}");
        assert!(
            line.contains("compute-sanitizer --tool memcheck python minimal/repro.py"),
            "{line}"
        );
        let (line, said) = ran(false);
        assert!(
            said.trim_end().ends_with("minimal/repro.py") && !said.contains("sanitizer"),
            "{said}"
        );
        assert!(
            line.starts_with("CUDA_LAUNCH_BLOCKING=1 python minimal/repro.py"),
            "{line}"
        );
    }
}
