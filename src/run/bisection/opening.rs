//! The run's place and its workers: the workspace, locked for the range, the command line's layer over
//! the config, how many workers and where, their scratch directories, worktrees and warm interpreters.

use crate::report::event::PlanNote;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::config::{ExecutorKind, Jobs};
use crate::exec::child_env::WorkerSlot;
use crate::host::devices::visible_devices;
use crate::run::plan::{plan, Plan, RunError, StartOptions};
use crate::run::probe::workers::plan_slots;
use crate::run::workspace::{Opening, Workspace};

/// The run's workspace, locked for this range unless the caller holds the lock, old runs pruned.
pub(super) fn open_workspace<'p>(
    (repo, config): (&'p crate::git::Repo, &'p crate::config::Config),
    opts: &StartOptions,
) -> Result<Workspace<'p>, RunError> {
    let lock_name = format!("start {}", opts.range);
    let ws = Workspace::open(
        repo,
        config,
        Opening {
            lock: (!opts.state_locked).then_some(lock_name.as_str()),
            ..Opening::default()
        },
    )?;
    ws.prune_runs();
    Ok(ws)
}

/// The workers the range needs (the plan notes a cut), each with its scratch directories; and the places
/// planned on the first worker's GPU, which the runs after the search may use where that GPU holds them.
pub(super) fn settle_slots(
    (notes, candidates): (&mut Vec<PlanNote>, usize),
    mut slots: Vec<WorkerSlot>,
    state_dir: &Path,
) -> Result<(Vec<WorkerSlot>, usize), RunError> {
    let places = slots.first().map_or(0, |first| {
        slots.iter().filter(|s| s.devices == first.devices).count()
    });
    cap_workers(notes, candidates, &mut slots);
    give_scratch_dirs(&mut slots, state_dir)?;
    Ok((slots, places))
}

/// A worktree of its own for each worker after the first.
pub(super) fn extra_worktrees(
    ws: &Workspace,
    slots: &[WorkerSlot],
) -> Result<Vec<crate::git::ProbeWorktree>, RunError> {
    slots
        .iter()
        .skip(1)
        .map(|slot| ws.worktree(&format!("worktree-{}", slot.worker)))
        .collect()
}

/// Warm interpreters for a Python repro and a Python build, per worker, ended with the run (a pool that
/// cannot be set up means cold runs, as before).
pub(super) fn warm_pool_for(
    plan: &Plan,
    run_dir: &Path,
) -> Option<crate::run::probe::warm::WarmPool> {
    let build_warm = plan.config.build.as_ref().is_some_and(|b| b.warm);
    (plan.config.repro.warm || build_warm)
        .then(|| {
            crate::run::probe::warm::WarmPool::new(
                &run_dir.join("warm"),
                plan.config.repro.preload.clone(),
            )
            .ok()
        })
        .flatten()
}

/// The command line's layer over the config: `--clean` and `--jobs`.
fn apply_options(plan: &mut Plan, opts: &StartOptions) {
    if opts.clean {
        if let Some(b) = plan.config.build.as_mut() {
            b.clean = true;
        }
    }
    if let Some(jobs) = opts.jobs {
        plan.config.workers.jobs = jobs;
    }
}

/// The parallel workers, checked before anything is written (`None`: probes one at a time).
fn worker_slots(plan: &Plan, cancel: &AtomicBool) -> Result<Option<Vec<WorkerSlot>>, RunError> {
    let slurm = matches!(plan.config.executor.kind, ExecutorKind::Slurm(_));
    if plan.config.workers.jobs == Jobs::One {
        return Ok(None);
    }
    // Slurm gives each job its GPUs itself: nothing here is pinned.
    let visible = if slurm || plan.config.workers.devices.is_some() {
        Vec::new()
    } else {
        visible_devices(cancel)
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let slots = plan_slots(&plan.config.workers, &visible, cores).map_err(RunError::Usage)?;
    // One worker is probes one at a time, as with `jobs = 1`: the repro sees every GPU.
    Ok((slots.len() > 1).then_some(slots))
}

/// More workers than candidates would only make checkouts (each worker costs a full worktree): capped,
/// and said.
fn cap_workers(notes: &mut Vec<PlanNote>, candidates: usize, slots: &mut Vec<WorkerSlot>) {
    let useful = candidates.max(2);
    if slots.len() > useful {
        notes.push(PlanNote::WorkersCapped {
            asked: slots.len(),
            candidates,
            used: useful,
        });
        slots.truncate(useful);
    }
}

/// Parallel workers each get a scratch directory of their own (temporary files, JIT caches), kept between
/// runs so a worker's caches stay warm.
fn give_scratch_dirs(slots: &mut [WorkerSlot], state_dir: &Path) -> Result<(), RunError> {
    if slots.len() < 2 {
        return Ok(());
    }
    for slot in slots {
        let dir = state_dir.join("workers").join(slot.worker.to_string());
        for (_, sub) in crate::exec::child_env::WORKER_PRIVATE_DIRS {
            std::fs::create_dir_all(dir.join(sub)).map_err(io_err(&dir))?;
        }
        slot.scratch = Some(dir);
    }
    Ok(())
}

/// The plan of the run, with the command line's layer over its config, and its parallel workers (none:
/// probes one at a time), checked before anything is written.
pub(super) fn planned(
    opts: &StartOptions,
    cancel: &AtomicBool,
) -> Result<(Plan, Vec<WorkerSlot>), RunError> {
    let mut plan = plan(opts)?;
    apply_options(&mut plan, opts);
    let slots = worker_slots(&plan, cancel)?;
    Ok((plan, slots.unwrap_or_default()))
}

/// A failure to make `path`, as the run's error.
fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io {
        path: path.to_path_buf(),
        source,
    }
}
