//! `cudabisect init`: writes a commented config that works, from a repro command and what the repository shows.
//!
//! What is detected (a Python package and its layout, a compiled extension, the framework, the GPUs) only
//! chooses between safe settings; the text is checked by the same parser `start` uses before it is written,
//! and nothing is ever overwritten.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::config::{has_tool_section, Config};
use crate::git::Repo;

use crate::run::error::RunError;

/// What `init` is asked for.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// A directory inside the repository.
    pub dir: PathBuf,
    /// The repro command: one shell string, or the words of an argv.
    pub repro: Vec<String>,
    /// The build command, when the user names one.
    pub build: Option<String>,
    /// Write `[tool.cudabisect]` into the root's `pyproject.toml` instead of a `bisect.toml`.
    pub pyproject: bool,
}

/// How a Python project is laid out, as far as `init` needs to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonProject {
    /// The distribution's name from `pyproject.toml` or the package directory's name.
    pub name: Option<String>,
    /// The importable code lives under `src/`: a probe cannot import it from the worktree root.
    pub src_layout: bool,
    /// It compiles an extension (setup.py `ext_modules`, a CUDA or C++ extension, CMake, scikit-build,
    /// meson, maturin): it must be built at every commit.
    pub compiled: bool,
    /// Its build backend is setuptools (named, or a setup.py alone), which the environment already has:
    /// it builds without fetching anything (`--no-build-isolation`, also offline, and against the
    /// installed torch a CUDA extension must match).
    pub setuptools: bool,
}

/// Everything `init` found, the input of the pure renderer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InitFacts {
    /// The repro command as it will be written.
    pub repro: String,
    /// The build command, when one is needed or was given.
    pub build: Option<String>,
    /// Why that build (a comment above it).
    pub build_why: String,
    /// The Python project, when there is one.
    pub project: Option<PythonProject>,
    /// Frameworks the repro's code imports (`PyTorch`, `JAX`, `Keras`, `TensorFlow`, `Triton`).
    pub frameworks: Vec<&'static str>,
    /// The GPUs this machine shows.
    pub gpus: Vec<String>,
    /// Things the user should know (a changed interpreter name, an uncommitted script).
    pub notes: Vec<String>,
}

/// What `init` wrote.
#[derive(Clone, Debug)]
pub struct InitResult {
    /// The file written (a new bisect.toml, or the pyproject.toml it added to).
    pub path: PathBuf,
    /// What was found, for the summary.
    pub facts: InitFacts,
}

/// Detects, renders, checks and writes the config. Refuses (usage error, nothing written) when a config
/// is already there or the repro cannot start.
pub fn init(opts: &InitOptions, cancel: &AtomicBool) -> Result<InitResult, RunError> {
    let repo = Repo::open(&opts.dir)?;
    let root = repo.workdir();
    let own = root.join("bisect.toml");
    let pyproject = root.join("pyproject.toml");
    if own.exists() {
        return Err(RunError::Usage(format!(
            "{} exists: init never overwrites a config (edit it, or move it away first)",
            own.display()
        )));
    }
    let existing = std::fs::read_to_string(&pyproject).ok();
    if existing.as_deref().is_some_and(has_tool_section) {
        return Err(RunError::Usage(format!(
            "{} already has [tool.cudabisect]: init never overwrites a config",
            pyproject.display()
        )));
    }
    if opts.pyproject && existing.is_none() {
        return Err(RunError::Usage(format!(
            "--pyproject: {} does not exist; leave --pyproject out to write bisect.toml",
            pyproject.display()
        )));
    }
    let facts = detect(&repo, &root, opts, cancel)?;
    let (path, text) = if opts.pyproject {
        let mut text = existing.unwrap_or_default();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push('\n');
        text.push_str(&render(&facts, "tool.cudabisect."));
        (pyproject, text)
    } else {
        (own, render(&facts, ""))
    };
    // The same parser `start` uses: what init writes is a config that loads.
    Config::parse(&path, &text)
        .map_err(|e| RunError::Usage(format!("init: the written config does not load: {e}")))?;
    crate::atomic_file::write_atomic(&path, text.as_bytes())
        .map_err(|e| RunError::Usage(format!("cannot write {}: {e}", path.display())))?;
    Ok(InitResult { path, facts })
}

/// Looks at the repro command, the repository and the machine.
fn detect(
    repo: &Repo,
    root: &Path,
    opts: &InitOptions,
    cancel: &AtomicBool,
) -> Result<InitFacts, RunError> {
    let mut notes = Vec::new();
    let (words, program) = command_words(&opts.repro, root, &mut notes)?;
    let entry = entry_file(&words, root);
    if let Some(file) = &entry {
        check_entry(repo, root, file, &mut notes)?;
    }
    let project = python_project(root);
    let frameworks = frameworks(root, entry.as_deref());
    let (build, build_why) = choose_build(
        opts.build.as_deref(),
        project.as_ref(),
        &words,
        entry.as_deref(),
        root,
    );
    let gpus = crate::host::devices::visible_devices(cancel);
    let repro = match opts.repro.as_slice() {
        // A shell line is kept as written (pipes, `&&`), with only a swapped interpreter changed.
        [one] => match one.trim_start().strip_prefix(program.as_str()) {
            Some(rest) if words[0] != program => {
                let runs = if program == "pytest" {
                    "python3 -m pytest"
                } else {
                    words[0].as_str()
                };
                format!("{runs}{rest}")
            }
            _ => one.clone(),
        },
        _ => shell_line(&words),
    };
    Ok(InitFacts {
        repro,
        build,
        build_why,
        project,
        frameworks,
        gpus,
        notes,
    })
}

/// Words as one shell line, quoted only where the shell needs it (`--max_iters=5` stays as written).
fn shell_line(words: &[String]) -> String {
    let plain = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    };
    words
        .iter()
        .map(|w| {
            if plain(w) {
                w.clone()
            } else {
                shlex::try_quote(w).map_or_else(|_| w.clone(), |q| q.into_owned())
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The repro's words as they will run, and the program as given: refused when it cannot start;
/// `python` becomes `python3` where only that exists, `pytest` becomes `python3 -m pytest`.
fn command_words(
    repro: &[String],
    root: &Path,
    notes: &mut Vec<String>,
) -> Result<(Vec<String>, String), RunError> {
    let mut words = match repro {
        [] => {
            return Err(RunError::Usage(
                "init needs the repro command: cudabisect init -- python3 train.py --steps 20"
                    .into(),
            ))
        }
        [one] => shlex::split(one)
            .filter(|w| !w.is_empty())
            .ok_or_else(|| RunError::Usage(format!("cannot read the repro command `{one}`")))?,
        many => many.to_vec(),
    };
    let on_path = |program: &str| which::which(program).is_ok();
    let program = words[0].clone();
    if !program.contains('/') && !on_path(&program) {
        // `python` is missing on stock Debian and Ubuntu, where `python3` is what runs.
        if program == "python" && on_path("python3") {
            words[0] = "python3".into();
            notes.push(
                "`python` is not on PATH here; the config runs `python3` instead".to_string(),
            );
        } else {
            return Err(RunError::Usage(format!(
                "the repro command cannot start: `{program}` is not on PATH"
            )));
        }
    } else if program == "pytest" && on_path("python3") {
        // `pytest` puts the test file's directory first on sys.path, not the repository root: an import
        // of the project would find an installed copy (yours, editable, pointing at your checkout)
        // before the worktree's. `python3 -m pytest` puts the worktree's root first.
        words.splice(0..1, ["python3".to_string(), "-m".into(), "pytest".into()]);
        notes.push(
            "`pytest` runs as `python3 -m pytest`, so the worktree's own code is imported first"
                .to_string(),
        );
    } else if program.contains('/')
        && !root.join(&program).exists()
        && !Path::new(&program).is_absolute()
    {
        return Err(RunError::Usage(format!(
            "the repro command cannot start: `{program}` does not exist in {}",
            root.display()
        )));
    }
    Ok((words, program))
}

/// The file the repro runs must exist; one that is not committed gets a note (probes check commits out).
fn check_entry(
    repo: &Repo,
    root: &Path,
    file: &Path,
    notes: &mut Vec<String>,
) -> Result<(), RunError> {
    let shown = file
        .strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string();
    if !file.exists() {
        return Err(RunError::Usage(format!(
            "the repro command runs {shown}, which does not exist in {} (commands run from the repository root)",
            root.display()
        )));
    }
    let head = repo.resolve("HEAD").ok();
    if file.starts_with(root) && head.is_some_and(|h| repo.executable_at(h, &shown).is_none()) {
        notes.push(format!(
            "{shown} is not committed: every probe checks a commit out, where it is missing. Commit it, or keep it outside the repository and give its absolute path"
        ));
    }
    Ok(())
}

/// The build to write, and why: the one given, else a per-worktree install when the repro would not
/// import the commit's own code from the worktree's root.
fn choose_build(
    given: Option<&str>,
    project: Option<&PythonProject>,
    words: &[String],
    entry: Option<&Path>,
    root: &Path,
) -> (Option<String>, String) {
    match (given, project) {
        (Some(given), _) => (Some(given.to_string()), "the build command you gave".to_string()),
        (None, Some(p)) if p.compiled => (
            Some(pip_build(p)),
            "the package compiles an extension: it is built at every probe commit".to_string(),
        ),
        (None, Some(p)) if p.src_layout => (
            Some(pip_build(p)),
            "the package sits under src/: it is installed at every probe commit so the repro imports that commit's code".to_string(),
        ),
        // A script outside the root has its own directory first on sys.path: the project would be
        // imported from wherever it is installed, not from the worktree.
        (None, Some(p)) if entry.is_some_and(|e| !runs_from_root(words, e, root)) => (
            Some(pip_build(p)),
            "the repro's script is not at the repository root: the package is installed at every probe commit so it imports that commit's code".to_string(),
        ),
        _ => (None, String::new()),
    }
}

/// The build `init` writes for a Python package: into the virtual environment cudabisect gives each probe
/// worktree (layered over the user's, so torch and the rest stay visible), never the user's own.
pub fn pip_build(project: &PythonProject) -> String {
    let isolation = if project.setuptools || project.compiled {
        " --no-build-isolation"
    } else {
        ""
    };
    format!("python3 -m pip install -e . --no-deps{isolation} -q")
}

/// Whether the repro imports from the repository root first: `python -m …` (the current directory, the
/// root, goes first on sys.path) or a script that sits at the root (its own directory goes first).
fn runs_from_root(words: &[String], entry: &Path, root: &Path) -> bool {
    words.iter().any(|w| w == "-m") || entry.parent() == Some(root)
}

/// The Python file the repro runs: `python script.py`, `python -m pkg.mod`, `pytest path::test`.
fn entry_file(words: &[String], root: &Path) -> Option<PathBuf> {
    let python = |w: &str| {
        let name = w.rsplit('/').next().unwrap_or(w);
        name.starts_with("python")
    };
    let mut rest = words.iter().map(String::as_str);
    let first = rest.next()?;
    let rest: Vec<&str> = rest.collect();
    let pytest = first.ends_with("pytest")
        || (python(first) && rest.windows(2).next() == Some(&["-m", "pytest"][..]));
    if pytest {
        let target = rest.iter().find(|w| {
            !w.starts_with('-') && *w != &"pytest" && (w.contains(".py") || w.contains('/'))
        })?;
        return Some(root.join(target.split("::").next()?));
    }
    if python(first) {
        let mut args = rest.iter();
        while let Some(arg) = args.next() {
            match *arg {
                "-m" => {
                    let module = args.next()?;
                    let rel = module.replace('.', "/");
                    return [root.to_path_buf(), root.join("src")]
                        .iter()
                        .flat_map(|base| {
                            [
                                base.join(format!("{rel}.py")),
                                base.join(&rel).join("__main__.py"),
                            ]
                        })
                        .find(|p| p.exists());
                }
                "-c" => return None,
                a if a.starts_with('-') => {}
                script => return Some(root.join(script)),
            }
        }
        return None;
    }
    first.ends_with(".py").then(|| root.join(first))
}

/// The Python project at the root, if any.
fn python_project(root: &Path) -> Option<PythonProject> {
    let read = |name: &str| std::fs::read_to_string(root.join(name)).ok();
    let pyproject = read("pyproject.toml");
    let setup_py = read("setup.py");
    let setup_cfg = read("setup.cfg");
    if pyproject.is_none() && setup_py.is_none() && setup_cfg.is_none() {
        return None;
    }
    let table = pyproject
        .as_deref()
        .and_then(|t| t.parse::<toml::Table>().ok());
    let name = table
        .as_ref()
        .and_then(|t| t.get("project")?.get("name")?.as_str().map(str::to_string));
    let backend = table
        .as_ref()
        .and_then(|t| {
            t.get("build-system")?
                .get("build-backend")?
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_default();
    let setuptools = backend.is_empty() || backend.starts_with("setuptools");
    let compiled = ["scikit_build", "mesonpy", "maturin", "py_build_cmake"]
        .iter()
        .any(|b| backend.contains(b))
        || setup_py.as_deref().is_some_and(|s| {
            [
                "ext_modules",
                "CUDAExtension",
                "CppExtension",
                "Extension(",
                "cmake",
            ]
            .iter()
            .any(|k| s.contains(k))
        })
        || root.join("CMakeLists.txt").exists();
    let src_layout = root.join("src").is_dir()
        && std::fs::read_dir(root.join("src")).is_ok_and(|d| {
            d.flatten().any(|e| {
                e.path().join("__init__.py").exists()
                    || e.path().extension().is_some_and(|x| x == "py")
            })
        });
    Some(PythonProject {
        name,
        src_layout,
        compiled,
        setuptools,
    })
}

/// Frameworks imported by the repro's file, then by the project's other Python files (a bounded scan).
fn frameworks(root: &Path, entry: Option<&Path>) -> Vec<&'static str> {
    const KNOWN: [(&str, &str); 5] = [
        ("torch", "PyTorch"),
        ("jax", "JAX"),
        ("keras", "Keras"),
        ("tensorflow", "TensorFlow"),
        ("triton", "Triton"),
    ];
    let mut files: Vec<PathBuf> = entry.map(Path::to_path_buf).into_iter().collect();
    collect_python(root, 0, &mut files);
    let mut found = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for line in text.lines() {
            let line = line.trim_start();
            let module = line
                .strip_prefix("import ")
                .or_else(|| line.strip_prefix("from "))
                .map(|m| {
                    m.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .next()
                        .unwrap_or("")
                });
            if let Some((_, name)) = KNOWN.iter().find(|(m, _)| Some(*m) == module) {
                if !found.contains(name) {
                    found.push(*name);
                }
            }
        }
    }
    // The repro's own file first: its framework leads.
    found
}

/// Python files under `dir`, skipping hidden, virtual-environment and build directories; at most 2,000.
fn collect_python(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > 6 || out.len() >= 2000 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.')
            || [
                "node_modules",
                "build",
                "dist",
                "venv",
                "__pycache__",
                "site-packages",
            ]
            .contains(&name.as_str())
        {
            continue;
        }
        if path.is_dir() {
            collect_python(&path, depth + 1, out);
        } else if name.ends_with(".py") && out.len() < 2000 {
            out.push(path);
        }
    }
}

/// The config text: `prefix` is `""` for bisect.toml and `tool.cudabisect.` inside pyproject.toml.
pub fn render(facts: &InitFacts, prefix: &str) -> String {
    let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut out = String::new();
    let file = if prefix.is_empty() {
        "bisect.toml"
    } else {
        "[tool.cudabisect]"
    };
    out.push_str(&format!(
        "# cudabisect's config ({file}), written by `cudabisect init`; every key is explained in\n# docs/guide/config.md. Run `cudabisect start GOOD..BAD` with it.\n"
    ));
    let mut seen = Vec::new();
    if let Some(p) = &facts.project {
        let mut what = String::from("a Python package");
        if let Some(name) = &p.name {
            what.push_str(&format!(" `{name}`"));
        }
        if p.src_layout {
            what.push_str(" (src layout)");
        }
        if p.compiled {
            what.push_str(" with a compiled extension");
        }
        seen.push(what);
    }
    if !facts.frameworks.is_empty() {
        seen.push(facts.frameworks.join(", "));
    }
    seen.push(match facts.gpus.len() {
        0 => "no GPU (probes run where you run cudabisect: run it on the GPU machine)".to_string(),
        1 => "1 GPU".to_string(),
        n => format!("{n} GPUs"),
    });
    out.push_str(&format!("# Seen here: {}.\n", seen.join("; ")));
    for note in &facts.notes {
        out.push_str(&format!("# Note: {note}.\n"));
    }
    out.push('\n');
    match &facts.build {
        Some(command) => {
            out.push_str(&format!("[{prefix}build]\n# Why: {}.\n", facts.build_why));
            if command.contains("pip install") || command.contains("setup.py") {
                out.push_str("# It installs into a virtual environment cudabisect makes beside each probe worktree, layered\n# over yours (torch and the rest stay visible): your own environment is never changed.\n");
            }
            out.push_str(&format!("command = {}\ntimeout = \"20m\"\n\n", quote(command)));
        }
        None => out.push_str(&format!(
            "# [{prefix}build]        # nothing to build: the repro imports the worktree's own code\n# command = \"make -j\"\n\n"
        )),
    }
    out.push_str(&format!(
        "[{prefix}repro]\n# Runs in each probe worktree with CUDA_LAUNCH_BLOCKING=1. Exit 0 is clean; anything else is\n# classified, and a failure other than the target's (a build break, another bug) is skipped, never bad.\ncommand = {}\ntimeout = \"10m\"          # longer is a hang, never a bad commit\n",
        quote(&facts.repro)
    ));
    out.push_str("# attempts = 1            # runs before a probe counts as clean (or [search] confidence for a flaky fault)\n\n");
    let framework = facts
        .frameworks
        .iter()
        .find(|f| ["PyTorch", "JAX", "Keras"].contains(f));
    match framework {
        Some(name) => out.push_str(&format!(
            "# With no [{prefix}shrink] section, the faulting {name} step is captured from the repro command and\n# shrunk to the smallest op, layer, loss, backward or update that still faults (--no-shrink skips it).\n# [{prefix}shrink]\n# enabled = false\n\n"
        )),
        None => out.push_str(&format!(
            "# [{prefix}shrink]         # shrinking needs a PyTorch, JAX or Keras program, or a native model file\n# enabled = false\n\n"
        )),
    }
    out.push_str(&format!(
        "# [{prefix}search]\n# jobs = \"auto\"           # probes at once: as many per GPU as its memory holds, measured\n# match = \"class+kernel\"  # what makes a fault the same bug\n"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> InitFacts {
        InitFacts {
            repro: "python3 train.py --steps 20".into(),
            frameworks: vec!["PyTorch", "Triton"],
            gpus: vec!["0".into()],
            ..InitFacts::default()
        }
    }

    #[test]
    fn every_rendering_loads_in_both_files() {
        let mut variants = vec![facts()];
        let mut built = facts();
        let project = PythonProject {
            name: Some("my \"lib\"".into()),
            src_layout: true,
            compiled: true,
            setuptools: false,
        };
        built.build = Some(pip_build(&project));
        assert!(built
            .build
            .as_ref()
            .unwrap()
            .contains("--no-build-isolation"));
        built.build_why = "the package compiles an extension".into();
        built.project = Some(project);
        built.notes = vec!["`python` is not on PATH".into()];
        variants.push(built);
        let mut odd = facts();
        odd.repro = "sh -c 'echo \"a\\\\b\"; exit 3'".into();
        odd.frameworks.clear();
        odd.gpus.clear();
        variants.push(odd);
        for f in variants {
            let own = render(&f, "");
            let config = Config::parse(Path::new("bisect.toml"), &own)
                .unwrap_or_else(|e| panic!("{e}\n{own}"));
            assert_eq!(
                config.build.map(|b| format!("{:?}", b.command)),
                f.build
                    .as_ref()
                    .map(|c| format!("{:?}", crate::config::CommandLine::Shell(c.clone())))
            );
            let py = format!(
                "[project]\nname = \"x\"\n\n{}",
                render(&f, "tool.cudabisect.")
            );
            let from_py = Config::parse(Path::new("pyproject.toml"), &py)
                .unwrap_or_else(|e| panic!("{e}\n{py}"));
            assert_eq!(
                format!("{:?}", from_py.repro),
                format!(
                    "{:?}",
                    Config::parse(Path::new("bisect.toml"), &own).unwrap().repro
                )
            );
        }
    }

    #[test]
    fn the_entry_file_is_found_for_scripts_modules_and_test_ids() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src/pkg")).unwrap();
        std::fs::write(root.join("src/pkg/train.py"), "").unwrap();
        let w = |s: &str| shlex::split(s).unwrap();
        assert_eq!(
            entry_file(&w("python3 -u train.py --steps 3"), root),
            Some(root.join("train.py"))
        );
        assert_eq!(
            entry_file(&w("python -m pkg.train"), root),
            Some(root.join("src/pkg/train.py"))
        );
        assert_eq!(
            entry_file(&w("pytest -x tests/test_a.py::test_b"), root),
            Some(root.join("tests/test_a.py"))
        );
        assert_eq!(
            entry_file(&w("python3 -m pytest -q tests/t.py::T::test"), root),
            Some(root.join("tests/t.py"))
        );
        assert_eq!(entry_file(&w("python3 -c 'import x'"), root), None);
        assert_eq!(entry_file(&w("./run.sh 3"), root), None);
    }

    #[test]
    fn words_are_quoted_only_where_the_shell_needs_it() {
        let words: Vec<String> = ["python3", "train.py", "--max_iters=5", "a b", "it's", ""]
            .map(String::from)
            .to_vec();
        let line = shell_line(&words);
        assert_eq!(line, "python3 train.py --max_iters=5 'a b' \"it's\" ''");
        assert_eq!(shlex::split(&line).unwrap(), words);
    }
}
