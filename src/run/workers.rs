//! How many probes run at once and which GPUs each gets: `[search] jobs`, `devices` and `gpus-per-probe`
//! (or `start --jobs`) turned into worker slots. The planning is pure; finding the visible GPUs
//! (`CUDA_VISIBLE_DEVICES`, else `nvidia-smi`) sits at the edge.

use crate::config::{Jobs, WorkerSettings};
use crate::exec::child_env::WorkerSlot;

/// The worker slots: one per probe at once, each with its own devices when GPUs are known. `visible` is
/// what this machine shows when the config names no devices.
pub fn plan_slots(
    settings: &WorkerSettings,
    visible: &[String],
) -> Result<Vec<WorkerSlot>, String> {
    let devices: &[String] = settings.devices.as_deref().unwrap_or(visible);
    let per = settings.gpus_per_probe.max(1) as usize;
    let jobs = match settings.jobs {
        Jobs::One => 1,
        Jobs::Count(n) => n as usize,
        Jobs::Auto => (devices.len() / per).max(1),
    };
    if devices.is_empty() {
        // No GPU to pin (a CPU-only machine, or a repro that finds its own): workers share what there is.
        return Ok((1..=jobs)
            .map(|worker| WorkerSlot {
                worker,
                devices: None,
                scratch: None,
            })
            .collect());
    }
    if jobs * per > devices.len() {
        return Err(format!(
            "{jobs} probes at once with {per} GPU{} each need {} GPUs, and {} {} available ({})",
            if per == 1 { "" } else { "s" },
            jobs * per,
            devices.len(),
            if devices.len() == 1 { "is" } else { "are" },
            devices.join(",")
        ));
    }
    Ok((0..jobs)
        .map(|i| WorkerSlot {
            worker: i + 1,
            devices: Some(devices[i * per..(i + 1) * per].join(",")),
            scratch: None,
        })
        .collect())
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

    fn devices_of(slots: &[WorkerSlot]) -> Vec<Option<&str>> {
        slots.iter().map(|s| s.devices.as_deref()).collect()
    }

    #[test]
    fn auto_is_one_worker_per_visible_gpu_or_group_of_them() {
        let visible: Vec<String> = ["0", "1", "2", "3"].map(String::from).to_vec();
        let s = plan_slots(&settings(Jobs::Auto, None, 1), &visible).unwrap();
        assert_eq!(devices_of(&s), [Some("0"), Some("1"), Some("2"), Some("3")]);
        assert_eq!(s.iter().map(|s| s.worker).collect::<Vec<_>>(), [1, 2, 3, 4]);
        let s = plan_slots(&settings(Jobs::Auto, None, 2), &visible).unwrap();
        assert_eq!(devices_of(&s), [Some("0,1"), Some("2,3")]);
        // Three GPUs, two per probe: one worker, the third GPU idle.
        let s = plan_slots(&settings(Jobs::Auto, None, 2), &visible[..3]).unwrap();
        assert_eq!(devices_of(&s), [Some("0,1")]);
    }

    #[test]
    fn configured_devices_win_over_the_visible_ones() {
        let s = plan_slots(&settings(Jobs::Count(2), Some(&["GPU-a", "GPU-b"]), 1), &[]).unwrap();
        assert_eq!(devices_of(&s), [Some("GPU-a"), Some("GPU-b")]);
    }

    #[test]
    fn without_gpus_workers_are_not_pinned() {
        let s = plan_slots(&settings(Jobs::Count(3), None, 1), &[]).unwrap();
        assert_eq!(devices_of(&s), [None, None, None]);
        assert_eq!(
            plan_slots(&settings(Jobs::Auto, None, 1), &[])
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            plan_slots(&settings(Jobs::One, None, 1), &[])
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn more_probes_than_gpus_is_refused_naming_the_numbers() {
        let visible: Vec<String> = ["0", "1"].map(String::from).to_vec();
        let e = plan_slots(&settings(Jobs::Count(2), None, 2), &visible).unwrap_err();
        assert_eq!(
            e,
            "2 probes at once with 2 GPUs each need 4 GPUs, and 2 are available (0,1)"
        );
    }
}
