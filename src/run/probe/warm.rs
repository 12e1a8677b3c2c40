//! Warm probes for Python repros and builds. Each worker keeps a warm interpreter (the shipped
//! `warm_probe.py` server) for its repro, and another for its build when that is a Python command
//! (`python3 setup.py build_ext`, `python3 -m mypkg.build`): each has imported the heavy modules living
//! outside the worktree and never touched CUDA. A run is handed to it by a small client that stands where
//! the command would have run, so the process group, timeout, output capture and signals of the
//! ordinary runner still apply. What to preload is guessed from the script's imports, then learned from
//! every warm run's, submodules included (or set by `[repro] preload`), and what was learned is imported
//! into the running server as soon as the run ends; a different interpreter or environment starts another
//! server; whatever the server cannot serve runs cold, and the probe record says which.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::config::CommandLine;
use crate::exec::process::CommandSpec;
use crate::protocol::warm::{Ready, Starting, Wait, WarmError, WarmServer};

use super::warm_memory::{memory_key, merge, Taught, WarmMemory};

/// How a repro run ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Runner {
    /// In a child of the warm interpreter.
    Warm,
    /// As a fresh process, and why.
    Cold(String),
    /// In a child of the warm interpreter, which went away before the run ended: what the run did is
    /// unknown (its exit is the client's, not the run's).
    Lost(String),
}

impl Runner {
    /// For the probe record: `warm`, `cold: <why>` or `lost: <why>`.
    pub fn describe(&self) -> String {
        match self {
            Runner::Warm => "warm".into(),
            Runner::Cold(why) => format!("cold: {why}"),
            Runner::Lost(why) => format!("lost: {why}"),
        }
    }
}

/// Which of a probe's commands a warm interpreter serves. Each has one of its own per worker: a build
/// script and the repro import different modules, and one server's preload would not serve the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Serves {
    /// The repro (`[repro] command`).
    Repro,
    /// The build (`[build] command`), when it is a Python command.
    Build,
}

/// A worker's warm interpreter for one of its commands.
pub type WarmSlot = (usize, Serves);

/// A worker's warm interpreter, for a run that is not one of its probes (the shrink's capture runs the
/// repro at the first bad commit in that worker's worktree).
pub type WarmAt<'a> = (&'a WarmPool, WarmSlot);

/// The name of a file of `slot`'s server in the pool's directory: `server-2.log` for worker 2's repro,
/// `build-server-2.log` for its build.
fn slot_file((worker, serves): WarmSlot, stem: &str, ext: &str) -> String {
    let prefix = match serves {
        Serves::Repro => "",
        Serves::Build => "build-",
    };
    format!("{prefix}{stem}-{worker}{ext}")
}

/// One run handed to the warm interpreter: where the client says how it went, and where a learning run
/// lists its imports.
pub struct WarmRun {
    slot: WarmSlot,
    status: PathBuf,
    learn: Option<PathBuf>,
}

struct Slot {
    server: Option<WarmServer>,
    /// A server still importing its preloads when the probe that started it was stopped (abandoned by
    /// the search): the next run of this worker waits for it instead of paying those imports again.
    starting: Option<Starting>,
    /// The interpreter and environment the server was started for.
    key: String,
    /// What to preload, once known: module names, submodules included, in the order they were imported.
    preload: Option<Vec<String>>,
    /// Whether runs teach what to preload (not when `[repro] preload` sets it): every run does, since a
    /// probe that faults early imports less than one that runs the whole step.
    learns: bool,
    /// Why this worker's runs go cold for the rest of the run: CUDA got initialised in the server by
    /// something other than a preload that can be left out.
    off: Option<String>,
    /// Modules that started CUDA when preloaded (a library that queries the device at import): never
    /// preloaded again; each run's child imports them itself. Every server of the slot is told them, and
    /// leaves out what they rule out (the warm runner's `left_out`).
    never: Vec<String>,
    /// Under which key what this slot's runs teach is kept for later runs (`None`: not kept).
    memory_key: Option<String>,
    /// What earlier runs of the command taught, preloaded by the first server ahead of the guess.
    recalled: Vec<String>,
}

/// The module a server blames for starting CUDA, when it names one: instead of listening
/// (`harness: CUDA initialised by preloading <module>`), or in a run's cold answer (`CUDA was initialised
/// in the warm interpreter by preloading <module>`).
fn tainted_by(why: &str) -> Option<&str> {
    why.split_once("by preloading ")
        .map(|(_, m)| m.trim())
        .filter(|m| !m.is_empty())
}

/// The warm interpreters of one run, one per worker; dropping it ends them all.
pub struct WarmPool {
    dir: PathBuf,
    script: PathBuf,
    configured: Option<Vec<String>>,
    memory: Option<WarmMemory>,
    slots: Mutex<HashMap<WarmSlot, Slot>>,
}

/// The argv of a command, when it is one without shell syntax (a shell line like `python3 train.py` is
/// split as the shell would; one with pipes, redirections or variables is left to the shell).
fn plain_argv(command: &CommandLine) -> Option<Vec<String>> {
    match command {
        CommandLine::Argv(v) => Some(v.clone()),
        CommandLine::Shell(s) => {
            if s.contains(['|', '&', ';', '<', '>', '$', '`', '*', '?', '(', ')', '\n']) {
                return None;
            }
            shlex::split(s)
        }
    }
}

/// Whether the warm interpreter can serve `argv`: `python… script.py`, `python… -m mod`, `pytest`.
fn servable(argv: &[String]) -> bool {
    let Some(prog) = argv.first() else {
        return false;
    };
    let name = Path::new(prog)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name == "pytest" || (name.starts_with("python") && argv.len() > 1)
}

/// The key of the server a run of `interpreter` with `env` may be forked from (a run under another key
/// needs a server of its own), and the environment that server starts with: `env` without the variables
/// that differ every run, sorted (counted, a fresh rendezvous port would start a new server, seconds of
/// imports, for every probe).
fn server_key(interpreter: &Path, env: &[(String, String)]) -> (String, Vec<(String, String)>) {
    let mut env: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| !crate::exec::child_env::differs_per_run(k))
        .cloned()
        .collect();
    env.sort();
    let mut h = Sha256::new();
    h.update(interpreter.to_string_lossy().as_bytes());
    for (k, v) in &env {
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    let key = h
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    (key, env)
}

impl WarmPool {
    /// A pool whose servers live in `dir` (their logs, the installed runner). `configured`: `[repro]
    /// preload`. `memory`: where what the runs teach is kept for later runs (the state directory's), and
    /// what earlier runs taught is found.
    pub fn new(
        dir: &Path,
        configured: Option<Vec<String>>,
        memory: Option<&Path>,
    ) -> std::io::Result<WarmPool> {
        std::fs::create_dir_all(dir)?;
        let script = crate::protocol::torch::install_warm_probe(dir)?;
        Ok(WarmPool {
            dir: dir.to_path_buf(),
            script,
            configured,
            memory: memory.map(WarmMemory::new),
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// Turns `spec` into a run through the warm interpreter of `at` (a worker, for its repro or its build;
    /// starting it when needed), or leaves it alone (`None`) when the command is not one the warm
    /// interpreter serves or no server would start.
    pub fn prepare(
        &self,
        at: WarmSlot,
        spec: &mut CommandSpec,
        cancel: &AtomicBool,
    ) -> Option<WarmRun> {
        let argv = plain_argv(&spec.command).filter(|a| servable(a))?;
        let interpreter = if argv[0].ends_with("pytest") {
            "python3".to_string()
        } else {
            argv[0].clone()
        };
        let path = crate::exec::child_env::seen_value(&spec.env, "PATH").unwrap_or_default();
        let resolved = which::which_in(&interpreter, Some(&path), &spec.cwd).ok()?;
        let (key, env) = server_key(&resolved, &spec.env);
        // The worker's slot is taken out while its server starts (seconds of imports), so the other
        // workers' servers start at the same time instead of one after another; only this worker's
        // thread ever touches it.
        let taken = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&at);
        let mut slot = taken.unwrap_or_else(|| {
            let learns = at.1 == Serves::Build || self.configured.is_none();
            // What is learned is kept; a configured list is the user's, and kept in the config.
            let memory_key = learns.then(|| memory_key(&key, at.1, &argv));
            let recalled = match (&self.memory, &memory_key) {
                (Some(memory), Some(k)) => memory.recall(k),
                _ => Taught::default(),
            };
            Slot {
                server: None,
                starting: None,
                key: key.clone(),
                // `[repro] preload` names the repro's imports; a build's are learned from its runs.
                preload: match at.1 {
                    Serves::Repro => self.configured.clone(),
                    Serves::Build => None,
                },
                learns,
                off: None,
                never: recalled.never,
                memory_key,
                recalled: recalled.preload,
            }
        });
        let out = self.prepare_slot(&mut slot, (at, key, cancel), argv, resolved, env, spec);
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(at, slot);
        out
    }

    /// Starts `slot`'s warm server, preloading what the runs taught (else what the script imports by
    /// name), listed in a file (a learned list runs to thousands of names), or goes on waiting for the
    /// one a stopped run left starting. A preload that starts CUDA is left out and the server started
    /// again without it, so a library that queries the device at import costs its own import, not the
    /// warm runner. A server that does not start leaves the slot without one: its runs go cold. One still
    /// starting when `cancel` is set (the search abandoned this probe) stays in the slot, still starting.
    fn start_server(
        &self,
        slot: &mut Slot,
        at: WarmSlot,
        (argv, resolved, env): (&[String], &Path, &[(String, String)]),
        spec: &CommandSpec,
        cancel: &AtomicBool,
    ) {
        let mut pending = slot.starting.take();
        let preload = slot.preload.clone().unwrap_or_else(|| {
            let pythonpath = crate::exec::child_env::seen_value(&spec.env, "PYTHONPATH");
            let guess = super::preload_guess::guess_preload(argv, &spec.cwd, pythonpath.as_deref());
            let mut preload = slot.recalled.clone();
            merge(&mut preload, guess);
            preload
        });
        let log = self.dir.join(slot_file(at, "server", ".log"));
        let listed = self.dir.join(slot_file(at, "preload", ".json"));
        if pending.is_none() && write_names(&listed, &preload).is_err() {
            return;
        }
        for _ in 0..=preload.len() + 1 {
            let starting = match pending.take() {
                Some(starting) => starting,
                None => {
                    let mut argv = vec![
                        resolved.display().to_string(),
                        self.script.display().to_string(),
                        "--preload-file".into(),
                        listed.display().to_string(),
                    ];
                    if !slot.never.is_empty() {
                        // The server leaves out what these rule out, from this list and from what the
                        // runs teach it.
                        argv.extend(["--never".into(), slot.never.join(",")]);
                    }
                    // The server runs where no worktree module can shadow what it preloads.
                    match WarmServer::spawn(&argv, &self.dir, env, &log) {
                        Ok(starting) => starting,
                        Err(_) => return,
                    }
                }
            };
            // It may take as long as a run of the repro may, and no longer.
            let wait = Wait {
                limit: spec.timeout,
                cancel: Some(cancel),
            };
            match starting.ready(wait) {
                Ready::Listening(server) => {
                    slot.server = Some(server);
                    return;
                }
                Ready::Stopped(still) => {
                    slot.starting = Some(still);
                    return;
                }
                Ready::Failed(WarmError::NotReady(line)) if tainted_by(&line).is_some() => {
                    slot.never.extend(tainted_by(&line).map(str::to_string));
                }
                Ready::Failed(_) => return,
            }
        }
    }

    /// [`WarmPool::prepare`] on the worker's own slot (the parts of one request, split only to drop the
    /// lock: who asks, under which key, and the flag that stops a server's start).
    fn prepare_slot(
        &self,
        slot: &mut Slot,
        (at, key, cancel): (WarmSlot, String, &AtomicBool),
        argv: Vec<String>,
        resolved: PathBuf,
        env: Vec<(String, String)>,
        spec: &mut CommandSpec,
    ) -> Option<WarmRun> {
        if slot.off.is_some() {
            return None;
        }
        if slot.key != key {
            // Another interpreter or environment: what was preloaded may not be what this run imports.
            slot.server = None;
            slot.starting = None;
            slot.key = key;
        }
        let learning = slot.learns || slot.preload.is_none();
        if slot.server.is_none() {
            self.start_server(slot, at, (&argv, &resolved, &env), spec, cancel);
        }
        let socket = slot.server.as_ref()?.socket().to_path_buf();
        let preload_now = slot.preload.clone();
        let status = self.dir.join(slot_file(at, "status", ""));
        let _ = std::fs::remove_file(&status);
        let learn = learning.then(|| self.dir.join(slot_file(at, "learned", ".json")));
        if let Some(l) = &learn {
            let _ = std::fs::remove_file(l);
            spec.env
                .push(("CUDABISECT_WARM_LEARN".into(), l.display().to_string()));
        }
        if let Some(names) = preload_now.filter(|n| !n.is_empty()) {
            // What the runs taught: the server imported it when each run ended; what it lacks still (a
            // run it never saw end), it imports before it forks.
            let listed = self.dir.join(slot_file(at, "request-preload", ".json"));
            if write_names(&listed, &names).is_ok() {
                spec.env.push((
                    "CUDABISECT_WARM_PRELOAD".into(),
                    listed.display().to_string(),
                ));
            }
        }
        let mut client = vec![
            resolved.display().to_string(),
            "-S".into(),
            "-E".into(),
            self.script.display().to_string(),
            "client".into(),
            socket.display().to_string(),
            status.display().to_string(),
            "--".into(),
        ];
        client.extend(argv);
        spec.command = CommandLine::Argv(client);
        Some(WarmRun {
            slot: at,
            status,
            learn,
        })
    }

    /// Why the runs of `at` go cold for the rest of the run, when they do.
    pub fn off(&self, at: WarmSlot) -> Option<String> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.get(&at).and_then(|s| s.off.clone())
    }

    /// How the run went, and what it taught: a learning run's imports join what a server preloads (the
    /// running one imported them as the run ended); a server that could not serve is replaced.
    pub fn finish(&self, run: WarmRun) -> Runner {
        let runner = match std::fs::read_to_string(&run.status) {
            Ok(text) if text.trim() == "warm" => Runner::Warm,
            Ok(text) if text.starts_with("lost: ") => Runner::Lost(text.trim()[6..].to_string()),
            Ok(text) => Runner::Cold(
                text.trim()
                    .strip_prefix("cold: ")
                    .unwrap_or(text.trim())
                    .to_string(),
            ),
            Err(_) => Runner::Cold("the warm client did not report".into()),
        };
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = slots.get_mut(&run.slot) {
            let learned: Option<Vec<String>> = run
                .learn
                .as_ref()
                .and_then(|l| std::fs::read_to_string(l).ok())
                .and_then(|t| serde_json::from_str(&t).ok());
            let taught = learned.is_some();
            if let Some(names) = learned {
                // The running server keeps serving, instead of a new one preloading everything again.
                merge(slot.preload.get_or_insert_with(Vec::new), names);
            }
            if let Runner::Lost(_) = &runner {
                slot.server = None;
            }
            if let Runner::Cold(why) = &runner {
                // It exits when it can serve no one any more (CUDA touched, a preloaded file changed).
                if why.contains("changed since") || server_lost(why) {
                    slot.server = None;
                }
                if let Some(module) = tainted_by(why) {
                    // That module is imported by each child from now on; the next server leaves it out.
                    slot.never.push(module.to_string());
                    slot.server = None;
                } else if why.contains("CUDA was initialised") {
                    // Started by nothing that can be left out: it would happen in every new server.
                    slot.server = None;
                    slot.off = Some(why.clone());
                }
            }
            if let (Some(memory), Some(key)) = (&self.memory, &slot.memory_key) {
                if taught || !slot.never.is_empty() {
                    let lesson = Taught {
                        preload: slot.preload.clone().unwrap_or_default(),
                        never: slot.never.clone(),
                    };
                    memory.keep(key, &lesson);
                }
            }
        }
        runner
    }
}

/// Whether the warm client found the server gone (no socket, no answer): its runs would all go cold, so
/// the next run starts another.
fn server_lost(why: &str) -> bool {
    [
        "no warm server listening",
        "the warm server did not answer",
        "the warm server went away",
    ]
    .iter()
    .any(|lost| why.starts_with(lost))
}

/// Writes module names as the JSON list the warm runner reads.
fn write_names(path: &Path, names: &[String]) -> std::io::Result<()> {
    std::fs::write(path, serde_json::to_vec(names)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `python3 train.py` in `work`, with `PATH` and `env` (and as long to run as `timeout_s`).
    fn train_spec(work: &Path, env: &[(&str, String)], timeout_s: u64) -> CommandSpec {
        let mut vars = vec![(
            "PATH".to_string(),
            std::env::var("PATH").unwrap_or_default(),
        )];
        vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
        CommandSpec {
            command: CommandLine::Argv(vec!["python3".into(), "train.py".into()]),
            cwd: work.to_path_buf(),
            env: vars,
            timeout: std::time::Duration::from_secs(timeout_s),
            grace: std::time::Duration::from_secs(1),
            stack_dump: None,
        }
    }

    /// Runs a spec the pool prepared (the warm client) as the prober would, to its end: whether it
    /// exited 0.
    fn run_client(spec: &CommandSpec) -> bool {
        let CommandLine::Argv(argv) = &spec.command else {
            panic!("the warm client runs as argv");
        };
        std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(&spec.cwd)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .status()
            .expect("client")
            .success()
    }

    #[test]
    fn a_server_serves_every_run_of_its_worker_whatever_port_or_probe_the_run_is_given() {
        let python = Path::new("/usr/bin/python3");
        let run = |port: &str, step: &str, path: &str| {
            let env = [
                ("PYTHONPATH", path),
                ("MASTER_PORT", port),
                ("PET_MASTER_PORT", port),
                ("CUDABISECT_STEP", step),
            ];
            let env: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            server_key(python, &env)
        };
        let (first, started_with) = run("40001", "1", "src");
        assert_eq!(first, run("40777", "2", "src").0);
        assert_ne!(first, run("40001", "1", "lib").0);
        assert_eq!(
            started_with,
            [("PYTHONPATH".to_string(), "src".to_string())]
        );
    }

    #[test]
    fn a_server_still_importing_when_its_probe_is_stopped_serves_the_next_run_of_its_worker() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (site, work) = (dir.path().join("site"), dir.path().join("work"));
        std::fs::create_dir_all(&site).expect("mkdir");
        std::fs::create_dir_all(&work).expect("mkdir");
        let (gate, log) = (dir.path().join("gate"), dir.path().join("imports.log"));
        let c_gate = std::ffi::CString::new(gate.display().to_string()).expect("path");
        // SAFETY: a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::mkfifo(c_gate.as_ptr(), 0o600) }, 0);
        // A preload whose import is held open by the test: it says who imported it, then reads the
        // gate until the test closes it.
        std::fs::write(
            site.join("slowmod.py"),
            format!(
                "import os\nwith open({log:?}, 'a') as f:\n    f.write(str(os.getpid()) + '\\n')\nopen({gate:?}).read()\n",
                log = log.display().to_string(),
                gate = gate.display().to_string()
            ),
        )
        .expect("write");
        std::fs::write(work.join("train.py"), "import slowmod\n").expect("write");
        let pool = WarmPool::new(&dir.path().join("warm"), None, None).expect("pool");
        let spec = || train_spec(&work, &[("PYTHONPATH", site.display().to_string())], 10);
        let (stop, at) = (AtomicBool::new(false), (1, Serves::Repro));
        std::thread::scope(|s| {
            let first = s.spawn(|| pool.prepare(at, &mut spec(), &stop).is_some());
            // Opening the gate to write returns once the server's import has opened it to read: the
            // server is importing its preloads. Then the search abandons the probe.
            let held = std::fs::OpenOptions::new()
                .write(true)
                .open(&gate)
                .expect("gate");
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            assert!(
                !first.join().expect("thread"),
                "a stopped probe is not served"
            );
            drop(held);
        });
        stop.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(
            pool.prepare(at, &mut spec(), &stop).is_some(),
            "the next run is served by the server the stopped one started"
        );
        let imports = std::fs::read_to_string(&log).expect("log");
        assert_eq!(
            imports.lines().count(),
            1,
            "imported once, by one server: {imports}"
        );
    }

    #[test]
    fn a_server_whose_socket_is_gone_is_replaced_for_the_next_run_of_its_worker() {
        let dir = tempfile::tempdir().expect("tempdir");
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).expect("mkdir");
        std::fs::write(work.join("train.py"), "import json\n").expect("write");
        let pool =
            WarmPool::new(&dir.path().join("warm"), Some(vec!["json".into()]), None).expect("pool");
        let stop = AtomicBool::new(false);
        let at = (1, Serves::Repro);
        let run = || {
            let mut spec = train_spec(&work, &[], 30);
            let warm = pool.prepare(at, &mut spec, &stop).expect("served");
            let CommandLine::Argv(argv) = &spec.command else {
                panic!("the warm client runs as argv");
            };
            let socket = PathBuf::from(&argv[5]);
            (socket, spec, warm)
        };
        let exec = |spec: &CommandSpec| assert!(run_client(spec));
        let (socket, spec, warm) = run();
        // What a server is left with once something removed its socket: it runs, and nobody reaches it.
        std::fs::remove_file(&socket).expect("socket");
        exec(&spec);
        let Runner::Cold(why) = pool.finish(warm) else {
            panic!("a run that reached no server is cold");
        };
        assert!(why.starts_with("no warm server listening"), "{why}");
        let (again, spec, warm) = run();
        assert_ne!(again, socket, "another server");
        exec(&spec);
        assert!(matches!(pool.finish(warm), Runner::Warm));
        // A client whose server went away during the run says so in its status (as the runner's own
        // test shows): the run is lost, and the worker's next run has another server.
        let (_, _, warm) = run();
        std::fs::write(
            &warm.status,
            "lost: the warm server went away during the run\n",
        )
        .expect("status");
        assert_eq!(
            pool.finish(warm),
            Runner::Lost("the warm server went away during the run".into())
        );
        assert_ne!(run().0, again, "another server after a lost run");
    }

    #[test]
    fn what_one_run_taught_is_preloaded_by_the_first_server_of_the_next() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (site, work) = (dir.path().join("site"), dir.path().join("work"));
        std::fs::create_dir_all(&site).expect("mkdir");
        std::fs::create_dir_all(&work).expect("mkdir");
        std::fs::write(site.join("hiddenlib.py"), "VALUE = 1\n").expect("write");
        // Imported inside a function of the worktree's module: the first guess cannot see it.
        std::fs::write(
            work.join("helper.py"),
            "def load():\n    import hiddenlib\n",
        )
        .expect("write");
        std::fs::write(work.join("train.py"), "import helper\nhelper.load()\n").expect("write");
        let memory = dir.path().join("state-warm");
        let stop = AtomicBool::new(false);
        let at = (1, Serves::Repro);
        let spec = || train_spec(&work, &[("PYTHONPATH", site.display().to_string())], 30);
        let preloaded = |run: &str| {
            let listed = dir.path().join(run).join(slot_file(at, "preload", ".json"));
            let text = std::fs::read_to_string(listed).expect("preload list");
            serde_json::from_str::<Vec<String>>(&text).expect("names")
        };
        {
            let pool = WarmPool::new(&dir.path().join("run1"), None, Some(&memory)).expect("pool");
            let mut spec = spec();
            let warm = pool.prepare(at, &mut spec, &stop).expect("served");
            assert!(run_client(&spec));
            assert_eq!(pool.finish(warm), Runner::Warm);
            assert!(!preloaded("run1").contains(&"hiddenlib".to_string()));
        }
        let pool = WarmPool::new(&dir.path().join("run2"), None, Some(&memory)).expect("pool");
        assert!(pool.prepare(at, &mut spec(), &stop).is_some());
        assert!(
            preloaded("run2").contains(&"hiddenlib".to_string()),
            "{:?}",
            preloaded("run2")
        );
    }

    #[test]
    fn what_runs_teach_is_added_in_order_each_name_once() {
        let mut known = vec!["torch".to_string(), "numpy.linalg".to_string()];
        merge(
            &mut known,
            vec![
                "numpy.linalg".into(),
                "torch._dynamo".into(),
                "sympy".into(),
            ],
        );
        assert_eq!(known, ["torch", "numpy.linalg", "torch._dynamo", "sympy"]);
    }

    #[test]
    fn the_runner_says_which_preload_started_cuda_the_way_the_pool_reads_it() {
        let runner = crate::protocol::torch::WARM_PROBE;
        assert!(runner.contains("TAINTED = \"harness: CUDA initialised by preloading \""));
        assert!(
            runner.contains("CUDA was initialised in the warm interpreter by preloading {tainted}")
        );
        assert_eq!(
            tainted_by("harness: CUDA initialised by preloading devlib"),
            Some("devlib")
        );
        assert_eq!(
            tainted_by("CUDA was initialised in the warm interpreter by preloading devlib"),
            Some("devlib")
        );
        assert_eq!(
            tainted_by("CUDA was initialised in the warm interpreter (torch)"),
            None
        );
    }

    #[test]
    fn python_commands_are_served_and_shell_syntax_is_left_to_the_shell() {
        let argv = |s: &str| plain_argv(&CommandLine::Shell(s.into()));
        assert!(servable(&argv("python3 train.py --steps 3").unwrap()));
        assert!(servable(&argv("pytest -q tests/test_x.py").unwrap()));
        assert!(servable(
            &argv("/usr/bin/python3.11 -m pkg.cli run").unwrap()
        ));
        assert!(argv("python3 train.py | tee log").is_none());
        assert!(argv("CUDA_HOME=$X python3 t.py").is_none());
        assert!(!servable(&argv("./run.sh").unwrap()));
        assert!(!servable(&argv("python3").unwrap()));
    }
}
