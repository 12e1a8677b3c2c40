//! After a run, before the next: waits until no process of this cudabisect is left on the probe's GPUs
//! (a killed rank can linger while the driver tears its context down), so a probe never starts on a device
//! its predecessor still holds. Past the wait, the probe is an infrastructure failure, never good or bad.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::exec::process::{env_of, is_alive as alive, RUN_TAG};

/// Asks which processes hold the GPUs.
pub trait GpuProcesses {
    /// The pids of compute processes on `devices` (all GPUs when `None`); `None` when it cannot tell
    /// (no `nvidia-smi`, no driver).
    fn compute_pids(&self, devices: Option<&str>) -> Option<Vec<i32>>;
}

/// `nvidia-smi --query-compute-apps=pid`.
pub struct NvidiaSmi;

impl GpuProcesses for NvidiaSmi {
    fn compute_pids(&self, devices: Option<&str>) -> Option<Vec<i32>> {
        let smi = crate::exec::tools::find_program("nvidia-smi", &[])?;
        let mut cmd = std::process::Command::new(smi);
        cmd.args(["--query-compute-apps=pid", "--format=csv,noheader"]);
        if let Some(d) = devices {
            cmd.args(["-i", d]);
        }
        let out = cmd
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect(),
        )
    }
}

/// The devices still held when the wait gave up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the GPU{} still held by the previous run's processes {pids:?} after {waited_s:.0} s", .devices.as_deref().map(|d| format!("s {d} were")).unwrap_or_else(|| "s were".into()))]
pub struct StillBusy {
    /// The probe's devices, when pinned.
    pub devices: Option<String>,
    /// The processes of this cudabisect still alive or still listed on the devices.
    pub pids: Vec<i32>,
    /// How long it waited.
    pub waited_s: f64,
}

/// Whether a listed pid is one to wait for: one of `ours`, or, on devices this prober has to itself, any
/// process tagged by a run of this cudabisect (on shared devices that is another worker's live run).
fn is_ours(pid: i32, ours: &[i32], exclusive: bool) -> bool {
    let prefix = format!("{}.", std::process::id());
    ours.contains(&pid)
        || (exclusive && env_of(pid, RUN_TAG).is_some_and(|t| t.starts_with(&prefix)))
}

/// Where to look and what to wait for.
#[derive(Clone, Copy, Debug)]
pub struct Devices<'a> {
    /// The probe's devices (`CUDA_VISIBLE_DEVICES` ids), when pinned.
    pub ids: Option<&'a str>,
    /// True when no other worker runs on them (pinned, or probes one at a time).
    pub exclusive: bool,
}

/// Waits until none of `ours` (the previous run's processes killed after it ended) is alive and the GPUs
/// list none of them (nor, on exclusive devices, any process of this cudabisect), for at most `timeout`.
/// Other users' processes are not waited for.
pub fn wait_idle(
    gpus: &dyn GpuProcesses,
    devices: Devices,
    ours: &[i32],
    timeout: Duration,
    cancel: &AtomicBool,
) -> Result<(), StillBusy> {
    const POLL: Duration = Duration::from_millis(100);
    let started = Instant::now();
    loop {
        reap_zombies(ours);
        let mut held: Vec<i32> = ours.iter().copied().filter(|&p| alive(p)).collect();
        if let Some(listed) = gpus.compute_pids(devices.ids) {
            held.extend(
                listed
                    .into_iter()
                    .filter(|&p| is_ours(p, ours, devices.exclusive)),
            );
        }
        held.sort_unstable();
        held.dedup();
        if held.is_empty() || cancel.load(Ordering::SeqCst) {
            return Ok(());
        }
        if started.elapsed() >= timeout {
            return Err(StillBusy {
                devices: devices.ids.map(str::to_string),
                pids: held,
                waited_s: started.elapsed().as_secs_f64(),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Reaps those of `pids` that are this process's children and have exited (killed escapees re-parented
/// here), so they neither linger as zombies nor count as alive.
fn reap_zombies(pids: &[i32]) {
    for &pid in pids {
        // SAFETY: a non-blocking waitpid on a specific pid; ECHILD for a process that is not ours is fine.
        unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const PINNED: Devices = Devices {
        ids: Some("1"),
        exclusive: true,
    };

    /// Lists `pid` on the GPU for the first `busy_for` questions.
    struct Scripted {
        pid: i32,
        busy_for: u32,
        asked: Cell<u32>,
    }

    impl GpuProcesses for Scripted {
        fn compute_pids(&self, _: Option<&str>) -> Option<Vec<i32>> {
            let n = self.asked.get();
            self.asked.set(n + 1);
            Some(if n < self.busy_for {
                vec![self.pid]
            } else {
                vec![]
            })
        }
    }

    #[test]
    fn waits_for_this_runs_process_to_leave_the_gpu() {
        // A process of the run, gone from /proc but still listed on the GPU for two looks (as while the
        // driver tears its context down).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        let gpus = Scripted {
            pid,
            busy_for: 2,
            asked: Cell::new(0),
        };
        let cancel = AtomicBool::new(false);
        assert_eq!(
            wait_idle(&gpus, PINNED, &[pid], Duration::from_secs(60), &cancel),
            Ok(())
        );
        assert_eq!(gpus.asked.get(), 3);
    }

    #[test]
    fn a_device_still_held_past_the_timeout_is_an_error_naming_it() {
        let me = std::process::id() as i32;
        let gpus = Scripted {
            pid: me,
            busy_for: u32::MAX,
            asked: Cell::new(0),
        };
        let cancel = AtomicBool::new(false);
        let err = wait_idle(&gpus, PINNED, &[me], Duration::ZERO, &cancel).unwrap_err();
        assert_eq!(err.pids, vec![me]);
        assert!(err.to_string().contains("GPUs 1 were still held"), "{err}");
    }

    #[test]
    fn other_users_processes_are_not_waited_for() {
        let gpus = Scripted {
            pid: 1,
            busy_for: u32::MAX,
            asked: Cell::new(0),
        };
        let cancel = AtomicBool::new(false);
        assert!(wait_idle(&gpus, PINNED, &[], Duration::ZERO, &cancel).is_ok());
    }
}
