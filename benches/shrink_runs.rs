//! Shrink benchmark: harness runs and wall time to reach the minimal subgraph, for chain models of
//! n = 10, 50, 200, 1000 nodes with a one-node and a two-node fault, for cudabisect's located reduction
//! against plain delta debugging without fault location. Every candidate is a real run of the release
//! binary's native harness on the CPU reference. Run: `cargo bench --bench shrink_runs`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use cudabisect::classify::{classify, Exit, FaultClass};
use cudabisect::shrink::{PlainDdmin, Reducer, Reduction, Step};

fn binary() -> PathBuf {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/cudabisect");
    assert!(target.exists(), "build first: cargo build --release");
    target
}

/// A chain of n nodes (relu/add alternating on a [4, 8] activation). One-node fault: node ~0.7n is a
/// gather through ids holding a sentinel. Two-node fault: node ~0.3n writes the sentinel into the ids in
/// place, node ~0.7n gathers with them.
fn model(n: usize, two: bool) -> String {
    let mut t = String::from("[[tensor]]\nname = \"x0\"\nshape = [4, 8]\ninit = \"random\"\n\n[[tensor]]\nname = \"table\"\nshape = [16, 8]\ninit = \"random\"\n\n");
    let ids = if two {
        "[0, 1, 2, 3]"
    } else {
        "[0, 1, 4194304, 3]"
    };
    let _ = write!(t, "[[tensor]]\nname = \"ids\"\nshape = [4]\ndtype = \"i32\"\ninit = \"values\"\nvalues = {ids}\n\n");
    t.push_str("[[tensor]]\nname = \"pos\"\nshape = [1]\ndtype = \"i32\"\ninit = \"values\"\nvalues = [2]\n\n[[tensor]]\nname = \"val\"\nshape = [1]\ndtype = \"i32\"\ninit = \"values\"\nvalues = [4194304]\n\n");
    let (writer, reader) = ((n * 3) / 10, (n * 7) / 10);
    let mut x = "x0".to_string();
    for i in 0..n {
        if two && i == writer {
            let _ = write!(t, "[[node]]\nid = \"n{i}\"\nop = \"scatter\"\ninputs = [\"ids\", \"pos\", \"val\"]\ninplace = true\n\n");
        } else if i == reader {
            let _ = write!(t, "[[node]]\nid = \"n{i}\"\nop = \"embedding\"\ninputs = [\"table\", \"ids\"]\noutputs = [\"g{i}\"]\n\n");
        } else {
            let (op, ins) = if i % 2 == 0 {
                ("relu", format!("[\"{x}\"]"))
            } else {
                ("add", format!("[\"{x}\", \"x0\"]"))
            };
            let _ = write!(
                t,
                "[[node]]\nid = \"n{i}\"\nop = \"{op}\"\ninputs = {ins}\noutputs = [\"h{i}\"]\n\n"
            );
            x = format!("h{i}");
        }
    }
    t
}

struct Run {
    runs: usize,
    secs: f64,
    size: usize,
}

fn harness(bin: &Path, model: &Path, args: &[String]) -> (Exit, String) {
    let out = Command::new(bin)
        .arg("harness")
        .arg("--model")
        .arg(model)
        .args(["--backend", "cpu"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (Exit::Code(out.status.code().unwrap_or(-1)), text)
}

fn shrink(bin: &Path, model: &Path, rec: &Path, mut r: impl Reduction) -> Run {
    let start = Instant::now();
    // Both strategies start from the same recorded run of the whole model; only ours uses its location.
    let (exit, out) = harness(
        bin,
        model,
        &["run".into(), "--record".into(), rec.display().to_string()],
    );
    let target = classify(exit, &out);
    assert_eq!(target.class, FaultClass::IllegalAddress, "{out}");
    let mut runs = 1;
    let result = loop {
        match r.next_step() {
            Step::Done(result) => break result,
            Step::Run(c) => {
                let keep: Vec<String> = c.iter().map(|i| format!("n{i}")).collect();
                let (exit, out) = harness(
                    bin,
                    model,
                    &[
                        "run".into(),
                        "--keep".into(),
                        keep.join(","),
                        "--inputs".into(),
                        rec.display().to_string(),
                    ],
                );
                runs += 1;
                let sig = classify(exit, &out);
                r.mark(&c, sig.class == target.class && sig.kernel == target.kernel);
            }
        }
    };
    Run {
        runs,
        secs: start.elapsed().as_secs_f64(),
        size: result.len(),
    }
}

fn main() {
    let bin = binary();
    let tmp = std::env::temp_dir().join(format!("cudabisect-shrink-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    println!("| n | fault | ⌈log2 n⌉+3 | cudabisect runs | cudabisect wall | plain ddmin runs | plain ddmin wall | result size (ours / ddmin) |");
    println!("|---|---|---|---|---|---|---|---|");
    for n in [10usize, 50, 200, 1000] {
        for two in [false, true] {
            let path = tmp.join(format!("m{n}{two}.toml"));
            std::fs::write(&path, model(n, two)).unwrap();
            let rec = tmp.join(format!("rec{n}{two}"));
            let fault = (n * 7) / 10;
            let ours = shrink(&bin, &path, &rec, Reducer::new(n, fault));
            let plain = shrink(&bin, &path, &rec, PlainDdmin::new(n));
            let bound = (usize::BITS - (n - 1).leading_zeros()) as usize + 3;
            println!(
                "| {n} | {} | {bound} | {} | {:.2} s | {} | {:.2} s | {} / {} |",
                if two { "two nodes" } else { "one node" },
                ours.runs,
                ours.secs,
                plain.runs,
                plain.secs,
                ours.size,
                plain.size
            );
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
