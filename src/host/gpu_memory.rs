//! The device memory a probe uses, as the driver reports it: `nvidia-smi` samples the memory in use on
//! the probe's GPUs every 100 ms while it runs. This is how the search learns how many probes one GPU
//! holds at once; the decision itself is pure (`run::probe::workers::probes_at_once`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread::JoinHandle;

/// What the device memory looked like around one probe, on the GPU of its devices where it grew most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryReading {
    /// Memory in use before the probe started (other processes), MiB.
    pub before_mib: u64,
    /// The most in use while it ran, MiB.
    pub peak_mib: u64,
    /// The GPU's memory, MiB.
    pub total_mib: u64,
}

impl MemoryReading {
    /// The GPU filled up while it was watched (less than 4 GiB left at the peak): probes ran short of
    /// memory, and the reading says nothing of what one needs.
    pub fn filled(&self) -> bool {
        self.peak_mib + 4096 > self.total_mib
    }

    /// The reading of one of `probes` that ran at once: each is taken to have used an equal part of
    /// what the GPU gained (their peaks come together when they start together).
    pub fn shared_by(self, probes: usize) -> Self {
        let gained = self.peak_mib.saturating_sub(self.before_mib);
        MemoryReading {
            peak_mib: self.before_mib + gained / probes.max(1) as u64,
            ..self
        }
    }
}

/// Reads the device memory of one probe while it runs.
pub trait MemoryGauge: Send + Sync + std::fmt::Debug {
    /// Starts watching `devices` (`CUDA_VISIBLE_DEVICES` ids): what is in use now is the baseline.
    fn start(&self, devices: &str);
    /// Stops watching; what was seen since [`MemoryGauge::start`], or `None` when nothing could be read.
    fn stop(&self) -> Option<MemoryReading>;
}

/// No gauge: nothing is ever read.
#[derive(Debug, Default)]
pub struct NoGauge;

impl MemoryGauge for NoGauge {
    fn start(&self, _: &str) {}
    fn stop(&self) -> Option<MemoryReading> {
        None
    }
}

/// Per GPU index: (first used, most used, total), MiB.
type Samples = BTreeMap<String, (u64, u64, u64)>;

/// A running sampler: the `nvidia-smi` loop and the thread reading it.
#[derive(Debug)]
struct Watch {
    before: Samples,
    child: Child,
    reader: JoinHandle<Samples>,
}

/// `nvidia-smi --query-gpu=… -lms 100`, one sampler at a time.
#[derive(Debug, Default)]
pub struct NvidiaSmiGauge {
    watch: Mutex<Option<Watch>>,
}

const QUERY: &str = "--query-gpu=index,memory.used,memory.total";

fn smi(devices: &str) -> Option<Command> {
    let smi = crate::exec::tools::find_program("nvidia-smi", &[])?;
    let mut cmd = Command::new(smi);
    cmd.args([QUERY, "--format=csv,noheader,nounits", "-i", devices])
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    Some(cmd)
}

/// Reads `index, used, total` lines into `samples`.
fn take(samples: &mut Samples, line: &str) {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    let [index, used, total] = f[..] else {
        return;
    };
    let (Ok(used), Ok(total)) = (used.parse::<u64>(), total.parse::<u64>()) else {
        return;
    };
    let e = samples
        .entry(index.to_string())
        .or_insert((used, used, total));
    e.1 = e.1.max(used);
}

/// The reading of the GPU whose use grew most between `before` and `during`.
fn reading(before: &Samples, during: &Samples) -> Option<MemoryReading> {
    during
        .iter()
        .map(|(i, &(first, peak, total))| {
            let base = before.get(i).map_or(first, |b| b.0);
            MemoryReading {
                before_mib: base,
                peak_mib: peak.max(base),
                total_mib: total,
            }
        })
        .max_by_key(|r| r.peak_mib - r.before_mib)
}

impl MemoryGauge for NvidiaSmiGauge {
    fn start(&self, devices: &str) {
        let Ok(mut slot) = self.watch.lock() else {
            return;
        };
        if let Some(old) = slot.take() {
            end(old);
        }
        let Some(out) = smi(devices).and_then(|mut c| c.output().ok()) else {
            return;
        };
        let mut before = Samples::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            take(&mut before, line);
        }
        if before.is_empty() {
            return;
        }
        let Some(mut cmd) = smi(devices) else {
            return;
        };
        cmd.arg("-lms").arg("100").stdout(Stdio::piped());
        // SAFETY: prctl in the child before exec; the sampler dies with cudabisect, even when cudabisect
        // is killed, so it never loops on alone.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let Ok(mut child) = cmd.spawn() else {
            return;
        };
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return;
        };
        let reader = std::thread::spawn(move || {
            let mut samples = Samples::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                take(&mut samples, &line);
            }
            samples
        });
        *slot = Some(Watch {
            before,
            child,
            reader,
        });
    }

    fn stop(&self) -> Option<MemoryReading> {
        let watch = self.watch.lock().ok()?.take()?;
        let before = watch.before.clone();
        let during = end(watch)?;
        reading(&before, &during)
    }
}

impl Drop for NvidiaSmiGauge {
    fn drop(&mut self) {
        if let Some(w) = self.watch.get_mut().ok().and_then(Option::take) {
            end(w);
        }
    }
}

/// Ends the sampler and collects what it read.
fn end(mut w: Watch) -> Option<Samples> {
    let _ = w.child.kill();
    let _ = w.child.wait();
    w.reader.join().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_that_grew_most_is_read_against_its_baseline() {
        let mut before = Samples::new();
        take(&mut before, "0, 512, 143771");
        take(&mut before, "1, 300, 143771");
        let mut during = Samples::new();
        for line in [
            "0, 600, 143771",
            "1, 300, 143771",
            "0, 4100, 143771",
            "1, 900, 143771",
            "0, 2000, 143771",
            "garbage",
            "0, [N/A], 143771",
        ] {
            take(&mut during, line);
        }
        assert_eq!(
            reading(&before, &during),
            Some(MemoryReading {
                before_mib: 512,
                peak_mib: 4100,
                total_mib: 143_771
            })
        );
        assert_eq!(reading(&before, &Samples::new()), None);
    }

    #[test]
    fn without_nvidia_smi_nothing_is_read_and_nothing_is_left_running() {
        let gauge = NvidiaSmiGauge::default();
        if crate::exec::tools::find_program("nvidia-smi", &[]).is_some() {
            // A GPU machine: the real reading is exercised by the GPU tests.
            return;
        }
        gauge.start("0");
        assert_eq!(gauge.stop(), None);
    }
}
