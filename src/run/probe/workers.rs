//! How many probes run at once and which GPUs each gets: `[search] jobs`, `devices` and `gpus-per-probe`
//! (or `start --jobs`) turned into worker slots. Several workers may share one GPU: how many of them run
//! at once is decided later, from the device memory the bad end's probe used ([`probes_at_once`]). The
//! planning is pure; finding the visible GPUs (`CUDA_VISIBLE_DEVICES`, else `nvidia-smi`) and reading
//! their memory sit at the edge.

use crate::config::{Jobs, WorkerSettings};
use crate::exec::child_env::WorkerSlot;
use crate::host::gpu_memory::MemoryReading;
use crate::report::event::PlanNote;

/// Probes at once on one GPU that `auto` allows at most: past 8, a round answers little more (log2(k+1)
/// bits) while every probe slows the others.
pub const MOST_PER_GPU: usize = 8;

/// The run's worker slots, checked before anything is written (none: probes one at a time, as with
/// `jobs = 1`, the repro seeing every GPU), with the places planned on the first worker's GPU (which the
/// runs after the search may use where that GPU holds them). `visible` asks the machine for its GPUs when
/// the config names none and no scheduler gives each job its own (`scheduled`). More workers than
/// `candidates` would only make checkouts (each worker costs a full worktree): capped, and noted.
pub fn worker_slots(
    settings: &WorkerSettings,
    (scheduled, visible): (bool, impl FnOnce() -> Vec<String>),
    (cores, candidates): (usize, usize),
    notes: &mut Vec<PlanNote>,
) -> Result<(Vec<WorkerSlot>, usize), String> {
    if settings.jobs == Jobs::One {
        return Ok((Vec::new(), 0));
    }
    let visible = if scheduled || settings.devices.is_some() {
        Vec::new()
    } else {
        visible()
    };
    let mut slots = plan_slots(settings, &visible, cores)?;
    if slots.len() < 2 {
        return Ok((Vec::new(), 0));
    }
    let first = slots[0].devices.clone();
    let places = slots.iter().filter(|s| s.devices == first).count();
    let useful = candidates.max(2);
    if slots.len() > useful {
        notes.push(PlanNote::WorkersCapped {
            asked: slots.len(),
            candidates,
            used: useful,
        });
        slots.truncate(useful);
    }
    Ok((slots, places))
}

/// The worker slots: one per probe at once, each with its own devices when GPUs are known. `visible` is
/// what this machine shows when the config names no devices; `cores` the host's. `auto` gives each GPU
/// (or group of `gpus-per-probe`) up to [`MOST_PER_GPU`] workers and at most half the cores in all; a
/// number of workers larger than the GPU groups shares them round robin. Devices a config lists twice are
/// shared the same way (`devices = [0, 0]`: two workers on GPU 0).
pub fn plan_slots(
    settings: &WorkerSettings,
    visible: &[String],
    cores: usize,
) -> Result<Vec<WorkerSlot>, String> {
    let devices: &[String] = settings.devices.as_deref().unwrap_or(visible);
    let per = settings.gpus_per_probe.max(1) as usize;
    let groups: Vec<String> = devices.chunks_exact(per).map(|g| g.join(",")).collect();
    let jobs = match settings.jobs {
        Jobs::One => 1,
        Jobs::Count(n) => n as usize,
        Jobs::Auto if groups.is_empty() => 1,
        Jobs::Auto => {
            let by_cores = (cores / 2).max(1);
            (groups.len() * MOST_PER_GPU)
                .min(by_cores)
                .max(groups.len())
        }
    };
    if devices.is_empty() {
        // No GPU to pin (a CPU-only machine, or a repro that finds its own): workers share what there is.
        return Ok((1..=jobs)
            .map(|worker| WorkerSlot {
                worker,
                devices: None,
                shares_gpu: false,
                scratch: None,
            })
            .collect());
    }
    if groups.is_empty() {
        return Err(format!(
            "one probe needs {per} GPUs, and {} {} available ({})",
            devices.len(),
            if devices.len() == 1 { "is" } else { "are" },
            devices.join(",")
        ));
    }
    let mut slots: Vec<WorkerSlot> = (0..jobs)
        .map(|i| WorkerSlot {
            worker: i + 1,
            devices: Some(groups[i % groups.len()].clone()),
            shares_gpu: false,
            scratch: None,
        })
        .collect();
    let pinned: Vec<Option<String>> = slots.iter().map(|s| s.devices.clone()).collect();
    for slot in &mut slots {
        slot.shares_gpu = pinned.iter().filter(|d| **d == slot.devices).count() > 1;
    }
    Ok(slots)
}

/// Memory taken by another process before the run that says the GPU is not ours alone, MiB.
pub const SHARED_MIB: u64 = 2048;
/// Kept free on a GPU whatever the probes need, MiB.
const HEADROOM_MIB: u64 = 4096;
/// What a probe needs beyond the peak seen (sampling misses short peaks; a CUDA context), MiB.
const PER_PROBE_MARGIN_MIB: u64 = 1024;

/// How many probes run at once on one GPU, and why: as many as its free memory holds at the peak of one
/// probe (with a margin), at most `workers` (what the plan gave the GPU, capped by `--jobs`); the reading
/// was taken while `beside` probes ran (the first round), each taken to have used an equal part. One
/// when the GPU was in use by others before the run. When nothing could be read, the workers `asked`
/// for (a number, devices listed) all run; those `auto` chose do not.
pub fn probes_at_once(
    reading: Option<MemoryReading>,
    beside: usize,
    workers: usize,
    asked: bool,
) -> (usize, String) {
    let Some(r) = reading else {
        return if asked {
            (
                workers.max(1),
                "as asked; the GPU's memory could not be read".into(),
            )
        } else {
            (1, "the GPU's memory could not be read".into())
        };
    };
    let gib = |mib: u64| format!("{:.1} GiB", mib as f64 / 1024.0);
    if r.before_mib > SHARED_MIB {
        return (
            1,
            format!(
                "the GPU had {} in use by other processes before the run",
                gib(r.before_mib)
            ),
        );
    }
    let r = r.shared_by(beside);
    let used = r.peak_mib.saturating_sub(r.before_mib);
    let need = used + used / 4 + PER_PROBE_MARGIN_MIB;
    let free = r.total_mib.saturating_sub(r.before_mib + HEADROOM_MIB);
    let fit = (free / need.max(1)) as usize;
    let k = fit.clamp(1, workers.max(1));
    let why = if beside > 1 {
        format!(
            "the first round's {beside} probes peaked at {} each, of the GPU's {}",
            gib(used),
            gib(r.total_mib)
        )
    } else {
        format!(
            "a probe run alone peaked at {} of the GPU's {}",
            gib(used),
            gib(r.total_mib)
        )
    };
    (k, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(jobs: Jobs, devices: Option<&[&str]>, per: u32) -> WorkerSettings {
        WorkerSettings {
            jobs,
            devices: devices.map(|d| d.iter().map(|s| s.to_string()).collect()),
            gpus_per_probe: per,
        }
    }

    #[test]
    fn the_runs_slots_are_capped_at_its_candidates_and_count_the_first_gpus_places() {
        let none =
            || -> Vec<String> { panic!("the machine is asked only when the config names no GPU") };
        let mut notes = Vec::new();
        // Four workers, two on each of two GPUs, for three candidates: capped at three, and said.
        let four = settings(Jobs::Count(4), Some(&["0", "1"]), 1);
        let (slots, places) = worker_slots(&four, (false, none), (16, 3), &mut notes).unwrap();
        assert_eq!((slots.len(), places), (3, 2));
        assert!(matches!(
            notes.as_slice(),
            [PlanNote::WorkersCapped {
                asked: 4,
                candidates: 3,
                used: 3
            }]
        ));
        // One candidate still gets two workers (its ends); one at a time is no slots at all.
        let (slots, _) = worker_slots(&four, (false, none), (16, 1), &mut notes).unwrap();
        assert_eq!(slots.len(), 2);
        let one = settings(Jobs::One, None, 1);
        assert!(worker_slots(&one, (false, none), (16, 9), &mut notes)
            .unwrap()
            .0
            .is_empty());
        // A scheduler gives each job its GPUs: the machine here is not asked, and nothing is pinned.
        let auto = settings(Jobs::Count(2), None, 1);
        let (slots, _) = worker_slots(&auto, (true, none), (16, 9), &mut notes).unwrap();
        assert!(slots.iter().all(|s| s.devices.is_none()), "{slots:?}");
        // Otherwise the machine's GPUs are what the workers share.
        let seen = || vec!["3".to_string()];
        let (slots, places) = worker_slots(&auto, (false, seen), (16, 9), &mut notes).unwrap();
        assert_eq!(places, 2);
        assert!(
            slots.iter().all(|s| s.devices.as_deref() == Some("3")),
            "{slots:?}"
        );
    }

    fn devices_of(slots: &[WorkerSlot]) -> Vec<Option<&str>> {
        slots.iter().map(|s| s.devices.as_deref()).collect()
    }

    #[test]
    fn auto_shares_each_gpu_or_group_of_them_within_half_the_cores() {
        let visible: Vec<String> = ["0", "1", "2", "3"].map(String::from).to_vec();
        // Two cores: one worker per GPU all the same.
        let s = plan_slots(&settings(Jobs::Auto, None, 1), &visible, 2).unwrap();
        assert_eq!(devices_of(&s), [Some("0"), Some("1"), Some("2"), Some("3")]);
        assert_eq!(s.iter().map(|s| s.worker).collect::<Vec<_>>(), [1, 2, 3, 4]);
        // Sixteen cores: eight workers, two on each GPU, round robin.
        let s = plan_slots(&settings(Jobs::Auto, None, 1), &visible, 16).unwrap();
        assert_eq!(
            devices_of(&s),
            [
                Some("0"),
                Some("1"),
                Some("2"),
                Some("3"),
                Some("0"),
                Some("1"),
                Some("2"),
                Some("3")
            ]
        );
        let s = plan_slots(&settings(Jobs::Auto, None, 2), &visible, 4).unwrap();
        assert_eq!(devices_of(&s), [Some("0,1"), Some("2,3")]);
        // Three GPUs, two per probe: the third GPU idle.
        let s = plan_slots(&settings(Jobs::Auto, None, 2), &visible[..3], 2).unwrap();
        assert_eq!(devices_of(&s), [Some("0,1")]);
        // One GPU and many cores: at most eight on it.
        let s = plan_slots(&settings(Jobs::Auto, None, 1), &visible[..1], 64).unwrap();
        assert_eq!(s.len(), MOST_PER_GPU);
        assert!(s.iter().all(|s| s.devices.as_deref() == Some("0")));
    }

    #[test]
    fn more_workers_than_gpus_share_them_and_listed_twice_is_shared() {
        let s = plan_slots(&settings(Jobs::Count(3), None, 1), &["0".into()], 2).unwrap();
        assert_eq!(devices_of(&s), [Some("0"), Some("0"), Some("0")]);
        let s = plan_slots(&settings(Jobs::Count(2), Some(&["0", "0"]), 1), &[], 2).unwrap();
        assert_eq!(devices_of(&s), [Some("0"), Some("0")]);
    }

    #[test]
    fn probes_at_once_follow_free_memory_and_the_peak() {
        let r = |before, peak, total| {
            Some(MemoryReading {
                before_mib: before,
                peak_mib: peak,
                total_mib: total,
            })
        };
        // 3 GiB peak on a 140 GiB GPU: as many as the plan gave.
        assert_eq!(probes_at_once(r(500, 3572, 143_771), 1, 8, false).0, 8);
        // 40 GiB peak: (140 - 4.5) / (40 * 1.25 + 1) = 2.
        assert_eq!(probes_at_once(r(500, 41_460, 143_771), 1, 8, true).0, 2);
        // A repro that takes most of the GPU: one.
        let (k, why) = probes_at_once(r(0, 120_000, 143_771), 1, 8, true);
        assert_eq!(k, 1);
        assert!(why.contains("peaked at 117.2 GiB"), "{why}");
        // Someone else is on the GPU: one, and said.
        let (k, why) = probes_at_once(r(30_000, 33_000, 143_771), 1, 8, true);
        assert_eq!(k, 1);
        assert!(why.contains("29.3 GiB in use by other processes"), "{why}");
        // Unreadable: one, unless the workers were asked for.
        assert_eq!(probes_at_once(None, 1, 8, false).0, 1);
        assert_eq!(probes_at_once(None, 1, 3, true).0, 3);
        // Never more than the workers.
        assert_eq!(probes_at_once(r(0, 100, 143_771), 1, 3, false).0, 3);
        // The first round's 8 probes gained 24 GiB together: 3 GiB each, so 8 still fit, said.
        let (k, why) = probes_at_once(r(500, 25_076, 143_771), 8, 8, false);
        assert_eq!(k, 8);
        assert!(why.contains("8 probes peaked at 3.0 GiB each"), "{why}");
        // 8 gained 120 GiB together: 15 GiB each, so (140 - 4.5) / (15 * 1.25 + 1) = 6.
        assert_eq!(probes_at_once(r(500, 123_380, 143_771), 8, 8, false).0, 6);
    }

    #[test]
    fn configured_devices_win_over_the_visible_ones() {
        let s = plan_slots(
            &settings(Jobs::Count(2), Some(&["GPU-a", "GPU-b"]), 1),
            &[],
            2,
        )
        .unwrap();
        assert_eq!(devices_of(&s), [Some("GPU-a"), Some("GPU-b")]);
    }

    #[test]
    fn without_gpus_workers_are_not_pinned() {
        let s = plan_slots(&settings(Jobs::Count(3), None, 1), &[], 2).unwrap();
        assert_eq!(devices_of(&s), [None, None, None]);
        assert_eq!(
            plan_slots(&settings(Jobs::Auto, None, 1), &[], 2)
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            plan_slots(&settings(Jobs::One, None, 1), &[], 2)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn a_probe_needing_more_gpus_than_there_are_is_refused_naming_the_numbers() {
        let visible: Vec<String> = ["0", "1"].map(String::from).to_vec();
        let e = plan_slots(&settings(Jobs::Count(2), None, 4), &visible, 2).unwrap_err();
        assert_eq!(e, "one probe needs 4 GPUs, and 2 are available (0,1)");
    }
}
