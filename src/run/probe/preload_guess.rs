//! A warm interpreter's first guess at what to preload, before any run has taught it: the modules from
//! outside the worktree that the repro's script imports, and those the worktree's own modules it imports
//! import at their top level (a package's kernels import `triton` where the script names only the
//! package), and what a framework it names imports lazily at a training step's first use of it. Read
//! from the source, never run.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// At most this many of the worktree's files are read for one guess: the guess only saves time.
const MAX_FILES: usize = 500;

/// What a framework imports lazily, at a first use every training step makes, preloaded with it. PyTorch's
/// optimizers (each one, at construction) and `torch.compile` import `torch._dynamo`: some 900 modules,
/// 1.2 s on a 2-core machine and 4–6 s on a GPU machine with eight at once. Left to the first run, a
/// worker pays them in its first child and again in its server, which imports what that run taught
/// before its next fork: both on the path of the search's first two rounds.
const LAZY_PARTS: &[(&str, &[&str])] = &[("torch", &["torch._dynamo"])];

/// The top-level names of what the repro imports from outside the worktree, in the order first met: the
/// script's (or `-m` module's) imports, then, through the worktree's modules it imports (their packages'
/// `__init__.py` first, as Python runs them), what those import at every import (lines at the top level
/// and in a top-level `try:`'s body: an import inside a function, an `if` or an `except` may never run). The first run still teaches the whole
/// list. `pythonpath`: the `PYTHONPATH` the repro sees; its entries inside the worktree (`src` in a
/// src-layout project) hold the worktree's modules too, searched where Python searches them: after the
/// script's directory.
pub fn guess_preload(argv: &[String], cwd: &Path, pythonpath: Option<&str>) -> Vec<String> {
    let script = match argv.get(1).map(String::as_str) {
        Some("-m") => argv
            .get(2)
            .map(|m| cwd.join(m.replace('.', "/")).with_extension("py")),
        // `python3 script` runs the file whatever its name ends with.
        Some(a) if !a.starts_with('-') => Some(cwd.join(a)),
        _ => None,
    };
    let Some(script) = script else {
        return Vec::new();
    };
    let mut roots = vec![script.parent().unwrap_or(cwd).to_path_buf()];
    roots.extend(
        std::env::split_paths(pythonpath.unwrap_or(""))
            .filter(|p| !p.as_os_str().is_empty())
            .map(|p| cwd.join(p))
            // An entry outside the worktree is the same at every commit: what it holds is preloaded.
            .filter(|p| p.starts_with(cwd)),
    );
    roots.push(cwd.to_path_buf());
    let mut guess = Guess {
        roots: &roots,
        names: Vec::new(),
        read: HashSet::new(),
    };
    // The script's own imports count wherever they stand: it is what runs. So do those of a Python file
    // it names (a bisect script that checks the commit, then runs the real repro with
    // `runpy.run_path(".../repro.py")` or `exec(open("train.py").read())`).
    let mut scripts = vec![script.clone()];
    let mut texts = String::new();
    let mut k = 0;
    while k < scripts.len() && k < MAX_SCRIPTS {
        let text = std::fs::read_to_string(&scripts[k]).unwrap_or_default();
        guess.file(&scripts[k], false);
        let dir = scripts[k].parent().unwrap_or(cwd).to_path_buf();
        for named in named_python_files(&text) {
            let found = [dir.join(named), cwd.join(named)]
                .into_iter()
                .find(|p| p.is_file() && !scripts.contains(p));
            scripts.extend(found);
        }
        texts.push_str(&text);
        k += 1;
    }
    with_lazy_parts(guess.names, &texts)
}

/// At most this many scripts are read for one guess: the repro's and the Python files it names.
const MAX_SCRIPTS: usize = 8;

/// The Python files a script names in its string literals (`"moe_repro.py"`, `'train.py'`), in order of
/// the quotes, double first.
fn named_python_files(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for quote in ['"', '\''] {
        let pattern = format!(".py{quote}");
        for (end, _) in text.match_indices(&pattern) {
            let before = &text[..end];
            let Some(start) = before.rfind([quote, '\n']) else {
                continue;
            };
            let name = &text[start + 1..end + 3];
            if before[start..].starts_with(quote) && !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// `names` with each framework's [`LAZY_PARTS`] after it, unless the script sets the framework's
/// variables in its own environment (`os.environ["TORCHDYNAMO_DISABLE"] = "1"` at its top): those parts
/// read them at import, and a preloaded one would have read them before the script set them.
fn with_lazy_parts(names: Vec<String>, script: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let parts = LAZY_PARTS
            .iter()
            .find(|(framework, _)| *framework == name)
            .map(|(_, parts)| *parts)
            .filter(|_| {
                let variable = name.to_uppercase();
                !script.lines().any(|l| {
                    (l.contains("environ") || l.contains("putenv")) && l.contains(&variable)
                })
            })
            .unwrap_or_default();
        out.push(name);
        out.extend(parts.iter().map(|p| p.to_string()));
    }
    out
}

/// One guess in progress.
struct Guess<'a> {
    /// Where the worktree's modules are found: the script's directory, then the working directory.
    roots: &'a [PathBuf],
    names: Vec<String>,
    read: HashSet<PathBuf>,
}

impl Guess<'_> {
    /// Reads `path` (once) and takes in each import it makes (at the top level only, with `top_only`).
    fn file(&mut self, path: &Path, top_only: bool) {
        // The script itself (`top_only` false) wherever it is; the modules it leads to only inside the
        // worktree (a relative import with more dots than packages points above it).
        let inside = !top_only || self.roots.iter().any(|r| path.starts_with(r));
        if !inside || self.read.len() >= MAX_FILES || !self.read.insert(path.to_path_buf()) {
            return;
        }
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        let mut top = TopLevel::default();
        for line in text.lines() {
            if top_only && !top.runs(line) {
                continue;
            }
            for (module, names) in imports_of(line.trim()) {
                self.module(path, &module, &names);
            }
        }
    }

    /// `module` imported from `from` (with `names` from it): the worktree's own followed, anything else's
    /// top-level name noted.
    fn module(&mut self, from: &Path, module: &str, names: &[&str]) {
        let dots = module.len() - module.trim_start_matches('.').len();
        let dotted = &module[dots..];
        if dots > 0 {
            // Relative: always the worktree's, found from the importing file's package.
            let mut base = from.parent().map(Path::to_path_buf);
            for _ in 1..dots {
                base = base.and_then(|b| b.parent().map(Path::to_path_buf));
            }
            if let Some(base) = base {
                self.follow(&base, dotted, names);
            }
            return;
        }
        let top = dotted.split('.').next().unwrap_or("");
        if !is_identifier(top) {
            return;
        }
        let roots = self.roots.to_vec();
        match roots.iter().find(|r| provides(r, top)) {
            Some(root) => self.follow(root, dotted, names),
            None if !self.names.iter().any(|n| n == top) => self.names.push(top.to_string()),
            None => {}
        }
    }

    /// Reads the worktree module `dotted` under `base` as an import runs it: each package's `__init__.py`
    /// on the way, the module, and each of `names` that is a submodule of it.
    fn follow(&mut self, base: &Path, dotted: &str, names: &[&str]) {
        let mut dir = base.to_path_buf();
        let parts: Vec<&str> = dotted.split('.').filter(|p| !p.is_empty()).collect();
        for part in &parts {
            dir.push(part);
            let init = dir.join("__init__.py");
            if init.is_file() {
                self.file(&init, true);
            } else {
                let file = dir.with_extension("py");
                if file.is_file() {
                    self.file(&file, true);
                }
            }
        }
        if dir.is_dir() {
            for name in names.iter().filter(|n| is_identifier(n)) {
                let sub = dir.join(format!("{name}.py"));
                let package = dir.join(name).join("__init__.py");
                for f in [sub, package].iter().filter(|f| f.is_file()) {
                    self.file(f, true);
                }
            }
        }
    }
}

/// Which lines of a module run whenever it is imported, read line by line: those at the top level, and
/// those directly in the body of a top-level `try:` (the optional dependency, `try: import apex`, runs at
/// every import; only its `except` depends on the outcome). A function's, an `if`'s or an `except`'s body
/// may never run.
#[derive(Default)]
struct TopLevel {
    /// In a top-level `try:`'s body: its lines' indentation, once its first line is met.
    in_try: Option<Option<usize>>,
}

impl TopLevel {
    fn runs(&mut self, line: &str) -> bool {
        let text = line.trim_start();
        if text.is_empty() || text.starts_with('#') {
            return false;
        }
        let indent = line.len() - text.len();
        if indent == 0 {
            let code = text.split('#').next().unwrap_or("").trim_end();
            self.in_try = (code == "try:").then_some(None);
            return true;
        }
        match &mut self.in_try {
            Some(body @ None) => {
                *body = Some(indent);
                true
            }
            Some(Some(body)) => *body == indent,
            None => false,
        }
    }
}

/// Whether the worktree directory `root` has a module or package named `name`.
fn provides(root: &Path, name: &str) -> bool {
    root.join(format!("{name}.py")).exists() || root.join(name).is_dir()
}

/// The modules one line of Python imports, each with the names it imports from it: `import a.b, c as d`
/// gives `a.b` and `c`; `from x.y import p, q as r` gives `x.y` with `p` and `q`; `from . import m`
/// gives `.` with `m`.
fn imports_of(line: &str) -> Vec<(String, Vec<&str>)> {
    if let Some(rest) = line.strip_prefix("import ") {
        return rest
            .split(',')
            .filter_map(|m| m.split_whitespace().next())
            .map(|m| (m.to_string(), Vec::new()))
            .collect();
    }
    let Some(rest) = line.strip_prefix("from ") else {
        return Vec::new();
    };
    let mut words = rest.splitn(2, " import ");
    let module = words.next().unwrap_or("").trim();
    let names = words
        .next()
        .unwrap_or("")
        .trim_matches(|c: char| c == '(' || c == ')' || c.is_whitespace())
        .split(',')
        .filter_map(|n| n.split_whitespace().next())
        .collect();
    if module.is_empty() || module.contains(char::is_whitespace) {
        return Vec::new();
    }
    vec![(module.to_string(), names)]
}

/// A Python identifier of ASCII letters, digits and underscores, not starting with a digit.
fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn write(dir: &Path, path: &str, text: &str) {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn the_first_guess_is_what_the_script_imports_from_outside_the_worktree() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("mypkg")).expect("mkdir");
        write(dir.path(), "helpers.py", "");
        write(
            dir.path(),
            "train.py",
            "import os, sys\nimport torch.nn as nn\nfrom triton import language as tl\nfrom mypkg.model import Net\nimport helpers\nfrom . import x\n    import numpy  # inside a function\n",
        );
        assert_eq!(
            guess_preload(
                &argv(&["python3", "train.py", "--steps", "3"]),
                dir.path(),
                None
            ),
            ["os", "sys", "torch", "torch._dynamo", "triton", "numpy"]
        );
        write(dir.path(), "mypkg/cli.py", "import jax\n");
        assert_eq!(
            guess_preload(&argv(&["python3", "-m", "mypkg.cli"]), dir.path(), None),
            ["jax"]
        );
        assert!(guess_preload(&argv(&["pytest", "-q"]), dir.path(), None).is_empty());
        assert!(guess_preload(&argv(&["python3", "missing.py"]), dir.path(), None).is_empty());
    }

    #[test]
    fn a_python_file_the_script_names_is_read_as_a_script_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        // A bisect script that runs the real repro, found beside it or in the working directory.
        write(
            d,
            "bench/regress.py",
            "import os, runpy, sys\nif not os.path.exists('src/pkg/moe.py'):\n    sys.exit(0)\nrunpy.run_path(os.path.join(os.path.dirname(__file__), \"moe_repro.py\"), run_name='__main__')\nexec(open('train.py').read())\nprint('missing.py')\n",
        );
        write(
            d,
            "bench/moe_repro.py",
            "import torch\nfrom pkg.moe import run\n",
        );
        write(d, "train.py", "import numpy\n");
        write(d, "src/pkg/__init__.py", "");
        write(d, "src/pkg/moe.py", "import triton\n");
        assert_eq!(
            guess_preload(&argv(&["python3", "bench/regress.py"]), d, Some("src")),
            [
                "os",
                "runpy",
                "sys",
                "torch",
                "torch._dynamo",
                "triton",
                "numpy"
            ]
        );
        assert_eq!(
            named_python_files("x = 'a.py' + \"b/c.py\"\ny = 'no.pyc'\n"),
            ["b/c.py", "a.py"]
        );
    }

    #[test]
    fn the_worktrees_own_modules_are_followed_to_what_they_import_at_their_top_level() {
        let dir = tempfile::tempdir().expect("tempdir");
        // The worktree one level down, so what lies above it is still the test's own.
        let worktree = dir.path().join("worktree");
        let d = worktree.as_path();
        write(
            d,
            "train.py",
            "import torch\nfrom pkg.model import forward\n",
        );
        write(d, "pkg/__init__.py", "import einops\n");
        write(
            d,
            "pkg/model.py",
            "from pkg.embed import hash_embed\nfrom .ops import bias_gelu\nfrom . import layers, deep\n",
        );
        write(
            d,
            "pkg/embed.py",
            "import triton\nimport triton.language as tl\nfrom pkg.launch import run\n",
        );
        // Imports that may never run: in a function, an `if`, an `except`, a block inside a `try`. The
        // body of a top-level `try` runs at every import (the optional dependency).
        write(
            d,
            "pkg/ops.py",
            "import numpy as np\ntry:  # optional\n    import apex\n\n# fused kernels\n    from flash_attn import f\n    if X:\n        import jax\nexcept ImportError:\n    import keras\ndef f():\n    import tensorflow\nif TYPE_CHECKING:\n    import pandas\n",
        );
        write(
            d,
            "pkg/layers.py",
            "from ..pkg import launch\nimport scipy\n",
        );
        // Above the worktree: never read.
        write(d, "pkg/deep.py", "from ... import outside\n");
        write(d, "../outside.py", "import never_read\n");
        // Imports itself back: read once.
        write(d, "pkg/launch.py", "from pkg import model\nimport numpy\n");
        assert_eq!(
            guess_preload(&argv(&["python3", "train.py"]), d, None),
            [
                "torch",
                "torch._dynamo",
                "einops",
                "triton",
                "numpy",
                "apex",
                "flash_attn",
                "scipy"
            ]
        );
    }

    #[test]
    fn a_src_layout_package_on_pythonpath_is_followed_as_the_worktrees_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let worktree = dir.path().join("worktree");
        let d = worktree.as_path();
        // The script outside the worktree, as a user's job script is; the library under `src`.
        write(
            dir.path(),
            "job/train.py",
            "import torch\ntry:\n    from mylib.ops.fused import moe\nexcept ImportError:\n    raise SystemExit(0)\n",
        );
        write(d, "src/mylib/__init__.py", "");
        write(
            d,
            "src/mylib/ops/__init__.py",
            "from mylib.ops.rope import rope\n",
        );
        write(d, "src/mylib/ops/rope.py", "import transformers\n");
        write(
            d,
            "src/mylib/ops/fused.py",
            "import triton\nfrom mylib.utils import infer\n",
        );
        write(d, "src/mylib/utils.py", "import packaging\n");
        write(d, "mylib_ignored/__init__.py", "import never_read\n");
        let script = dir.path().join("job/train.py").display().to_string();
        let guess = |pythonpath| guess_preload(&argv(&["python3", &script]), d, pythonpath);
        assert_eq!(
            guess(Some("src")),
            [
                "torch",
                "torch._dynamo",
                "transformers",
                "triton",
                "packaging"
            ]
        );
        let absolute = format!("/elsewhere:{}", d.join("src").display());
        assert_eq!(
            guess(Some(&absolute)),
            [
                "torch",
                "torch._dynamo",
                "transformers",
                "triton",
                "packaging"
            ],
            "an absolute entry inside the worktree"
        );
        // Without the entry the package is not the worktree's: its name is all the guess can say.
        assert_eq!(guess(None), ["torch", "torch._dynamo", "mylib"]);
    }

    #[test]
    fn torch_brings_what_its_optimizers_import_lazily_unless_the_script_sets_torchs_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let guess = |script: &str| {
            write(dir.path(), "train.py", script);
            guess_preload(&argv(&["python3", "train.py"]), dir.path(), None)
        };
        assert_eq!(
            guess("import numpy\nimport torch\nimport jax\n"),
            ["numpy", "torch", "torch._dynamo", "jax"]
        );
        assert_eq!(
            guess("import os\nos.environ[\"TOKENIZERS_PARALLELISM\"] = \"false\"\nimport torch\n"),
            ["os", "torch", "torch._dynamo"],
            "another library's variable"
        );
        for sets in [
            "os.environ[\"TORCHDYNAMO_DISABLE\"] = \"1\"",
            "os.environ.setdefault(\"TORCH_COMPILE_DEBUG\", \"1\")",
            "os.putenv(\"PYTORCH_JIT\", \"0\")",
        ] {
            assert_eq!(
                guess(&format!("import os\n{sets}\nimport torch\n")),
                ["os", "torch"],
                "{sets}"
            );
        }
    }

    #[test]
    fn import_lines_are_read_as_python_reads_them() {
        assert_eq!(
            imports_of("import a.b, c as d"),
            [("a.b".to_string(), vec![]), ("c".to_string(), vec![])]
        );
        assert_eq!(
            imports_of("from x.y import (p, q as r,"),
            [("x.y".to_string(), vec!["p", "q"])]
        );
        assert_eq!(
            imports_of("from . import m"),
            [(".".to_string(), vec!["m"])]
        );
        assert!(imports_of("fromage = 1").is_empty());
        assert!(imports_of("x = 'import os'").is_empty());
    }
}
