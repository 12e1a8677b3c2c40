//! In-process tests of the two drivers through their trait seams, with scripted fakes (as jj tests its
//! bisect): the search driver over `Probe`, the shrink driver over `HarnessClient`. No git, no processes.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cudabisect::bisect::Verdict;
use cudabisect::classify::{Exit, FaultClass, MatchPolicy, Signature};
use cudabisect::exec::process::RunOutput;
use cudabisect::git::RangeCommit;
use cudabisect::host::gpu_memory::{MemoryGauge, MemoryReading};
use cudabisect::protocol::client::{HarnessClient, ProtocolError, RunRequest};
use cudabisect::protocol::types::{Description, GraphNode, GraphTensor, PROTOCOL_VERSION};
use cudabisect::report::event::{Event, Reporter};
use cudabisect::report::record::{ParentCheck, ProbeRecord, ProbeRole, ShrinkStatus};
use cudabisect::run::probe::prober::{Probe, ProbeContext, ProbeOutcome, Sanitized};
use cudabisect::run::search::{
    search, search_with_workers, EndpointProblem, SearchEnd, SearchInput, Sharing, Worker,
};
use cudabisect::run::stages::reducer::{shrink, ParentBeside, ShrinkSettings};
use git2::Oid;

/// Collects events.
#[derive(Default)]
struct Events(Vec<Event>);

impl Reporter for Events {
    fn event(&mut self, event: &Event) {
        self.0.push(event.clone());
    }
}

fn oid(i: usize) -> Oid {
    Oid::from_str(&format!("{:040x}", i + 1)).unwrap()
}

fn index(o: Oid) -> usize {
    usize::from_str_radix(&o.to_string(), 16).unwrap() - 1
}

fn fault(kernel: &str) -> Signature {
    let mut s = Signature::new(
        FaultClass::IllegalAddress,
        "CUDA error: an illegal memory access",
    );
    s.kernel = Some(kernel.into());
    s
}

/// A prober that answers from a script: commit index → what the repro shows; interrupts at one commit.
struct Scripted {
    shows: Box<dyn Fn(usize) -> Signature + Send>,
    /// What compute-sanitizer would name as the faulting kernel at a commit (`None`: no sanitizer).
    kernels: Option<Box<dyn Fn(usize) -> Option<String> + Send>>,
    sanitized: Vec<usize>,
    interrupt_at: Option<usize>,
    cancel: &'static AtomicBool,
    asked: Vec<(usize, ProbeRole)>,
    /// A probe of a commit below this one runs until the driver stops it through `stop`.
    hang_below: Option<(usize, &'static AtomicBool)>,
    /// The worker each probe's context named.
    workers: Vec<Option<usize>>,
    /// Probes of `hang_below` that the driver's stop ended.
    hangs_stopped: usize,
}

impl Probe for Scripted {
    fn probe(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        _reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        let i = index(commit);
        self.asked.push((i, ctx.role));
        self.workers.push(ctx.worker);
        if let Some((below, stop)) = self.hang_below.filter(|(b, _)| i < *b && i > 0) {
            // Runs until stopped, as a long repro does; bounded, so a driver that never stops it fails.
            // The pool wakes this thread when it sets the flag; the deadline only bounds a driver that
            // never stops it.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::SeqCst) {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                assert!(!left.is_zero(), "probe of {i} (< {below}) never stopped");
                std::thread::park_timeout(left);
            }
            self.hangs_stopped += 1;
            let mut record = ProbeRecord {
                commit: commit.to_string(),
                role: ctx.role,
                verdict: Verdict::Skip,
                signature: Signature::new(FaultClass::Hang, "stopped by the driver"),
                matched_target: false,
                reason: None,
                exit_code: None,
                signal: None,
                duration_s: 0.0,
                build_log: None,
                log: None,
                sanitizer: None,
                attempts: 1,
                reused: false,
                job: None,
                runner: None,
                build_runner: None,
            };
            record.reason = Some("stopped".into());
            return ProbeOutcome {
                record,
                interrupted: true,
                output: String::new(),
            };
        }
        let interrupted = self.interrupt_at == Some(i);
        if interrupted {
            self.cancel.store(true, Ordering::SeqCst);
        }
        // A prober only observes: the search's judge decides the verdict.
        let _ = target;
        let signature = (self.shows)(i);
        ProbeOutcome {
            record: ProbeRecord {
                commit: commit.to_string(),
                role: ctx.role,
                verdict: Verdict::Skip,
                signature,
                matched_target: false,
                reason: None,
                exit_code: None,
                signal: None,
                duration_s: 0.0,
                build_log: None,
                log: None,
                sanitizer: None,
                attempts: 1,
                reused: false,
                job: None,
                runner: None,
                build_runner: None,
            },
            interrupted,
            output: String::new(),
        }
    }

    fn sanitize(
        &mut self,
        commit: Oid,
        _: &ProbeContext,
        _: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        let kernels = self.kernels.as_ref()?;
        let i = index(commit);
        self.sanitized.push(i);
        let finding = kernels(i).map(|k| {
            let mut s = Signature::new(FaultClass::IllegalAddress, "memcheck: OutOfBounds");
            s.kernel = Some(k);
            s
        });
        Some(Sanitized {
            finding,
            summary: "memcheck".into(),
            duration_s: 0.0,
            interrupted: false,
        })
    }
}

fn linear(n: usize) -> Vec<RangeCommit> {
    (0..n)
        .map(|i| RangeCommit {
            oid: oid(i + 1),
            parents: if i == 0 { vec![] } else { vec![i - 1] },
        })
        .collect()
}

struct Run {
    end: SearchEnd,
    asked: Vec<(usize, ProbeRole)>,
    records: Vec<ProbeRecord>,
    sanitized: Vec<usize>,
    other_bugs: Vec<cudabisect::report::record::OtherBug>,
}

/// Commit 0 is the good endpoint; the range holds commits 1..=n; `shows(i)` for each commit index.
fn run_search(
    n: usize,
    merge_bases: &[usize],
    shows: impl Fn(usize) -> Signature + Send + 'static,
    interrupt_at: Option<usize>,
) -> Run {
    run_search_with(n, merge_bases, shows, None, interrupt_at)
}

/// The input of a plain search over `range` from `goods` (its bad end the range's last commit), with
/// none of the options; callers change what they need.
fn plain_input<'a>(
    range: &'a [RangeCommit],
    goods: &'a [(String, Oid)],
    policy: &'a MatchPolicy,
) -> SearchInput<'a> {
    SearchInput {
        range,
        bad: ("main", oid(range.len())),
        goods,
        merge_bases: &[],
        policy,
        goods_may_show_other_bugs: false,
        flaky: Default::default(),
        finding_fix: false,
        steps_before: 0,
        checkout: None,
        sharing: Sharing::NONE,
    }
}

fn run_search_with(
    n: usize,
    merge_bases: &[usize],
    shows: impl Fn(usize) -> Signature + Send + 'static,
    kernels: Option<Box<dyn Fn(usize) -> Option<String> + Send>>,
    interrupt_at: Option<usize>,
) -> Run {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let range = linear(n);
    let goods = vec![("v1".to_string(), oid(0))];
    let bases: Vec<Oid> = merge_bases.iter().map(|&i| oid(i)).collect();
    let policy = MatchPolicy::parse("class+kernel").unwrap();
    let input = SearchInput {
        merge_bases: &bases,
        ..plain_input(&range, &goods, &policy)
    };
    let mut prober = Scripted {
        shows: Box::new(shows),
        kernels,
        sanitized: vec![],
        interrupt_at,
        cancel,
        asked: vec![],
        hang_below: None,
        workers: vec![],
        hangs_stopped: 0,
    };
    let outcome = search(&input, &mut prober, &mut Events::default(), cancel);
    Run {
        end: outcome.end,
        asked: prober.asked,
        records: outcome.probes,
        sanitized: prober.sanitized,
        other_bugs: outcome.other_bugs,
    }
}

fn clean() -> Signature {
    Signature::new(FaultClass::None, "exited 0")
}

/// What a host without its GPU shows.
fn no_device() -> Signature {
    Signature::new(FaultClass::Infra, "no CUDA-capable device is detected")
}

#[test]
fn the_bad_endpoint_goes_first_then_the_goods_then_the_search() {
    let run = run_search(
        16,
        &[],
        |i| if i >= 11 { fault("gather") } else { clean() },
        None,
    );
    assert_eq!(run.end, SearchEnd::Found(oid(11)));
    assert_eq!(run.asked[0], (16, ProbeRole::BadEndpoint));
    assert_eq!(run.asked[1], (0, ProbeRole::GoodEndpoint));
    assert!(run.asked[2..].iter().all(|(_, r)| *r == ProbeRole::Search));
    assert!(run.asked.len() - 2 <= 5, "{:?}", run.asked);
}

#[test]
fn endpoint_failures_end_the_search_with_their_own_result() {
    let run = run_search(8, &[], |_| clean(), None);
    assert!(
        matches!(&run.end, SearchEnd::EndpointsInvalid(m) if m.to_string().contains("bad commit main does not reproduce"))
    );
    let run = run_search(8, &[], |_| fault("gather"), None);
    assert!(
        matches!(&run.end, SearchEnd::EndpointsInvalid(m) if m.to_string().contains("good commit v1 does not pass"))
    );
    let run = run_search(8, &[], |i| if i == 8 { no_device() } else { clean() }, None);
    assert!(matches!(&run.end, SearchEnd::EndpointInfra(m) if m.contains("could not be judged")));
    let run = run_search(
        8,
        &[],
        |i| {
            if i == 0 {
                Signature::new(FaultClass::ExecFailure, "the repro could not start")
            } else {
                fault("gather")
            }
        },
        None,
    );
    assert!(
        matches!(run.end, SearchEnd::EndpointInfra(_)),
        "{:?}",
        run.end
    );
}

#[test]
fn a_merge_base_is_checked_after_the_goods_and_a_bad_one_stops_the_search() {
    // Commit 20 stands for a merge base off the range: good in one script, bad in the other.
    let run = run_search(
        8,
        &[20],
        |i| {
            if (4..=8).contains(&i) {
                fault("k")
            } else {
                clean()
            }
        },
        None,
    );
    assert_eq!(run.end, SearchEnd::Found(oid(4)));
    assert_eq!(run.asked[2], (20, ProbeRole::MergeBase));
    let run = run_search(
        8,
        &[20],
        |i| if i >= 4 { fault("k") } else { clean() },
        None,
    );
    assert!(
        matches!(&run.end, SearchEnd::EndpointsInvalid(m) if m.to_string().contains("bug was fixed")),
        "{:?}",
        run.end
    );
}

#[test]
fn another_bug_and_build_breaks_are_skipped_never_blamed() {
    // 5..=7 fault in another kernel, 9 does not build, the target starts at 12.
    let run = run_search(
        16,
        &[],
        |i| match i {
            5..=7 => fault("route"),
            9 => Signature::new(FaultClass::BuildFailure, "build exited 2"),
            i if i >= 12 => fault("gather"),
            _ => clean(),
        },
        None,
    );
    assert_eq!(run.end, SearchEnd::Found(oid(12)));
    for r in &run.records {
        if r.signature.kernel.as_deref() == Some("route")
            || r.signature.class == FaultClass::BuildFailure
        {
            assert_eq!(r.verdict, Verdict::Skip, "{r:?}");
            assert!(r.reason.is_some());
        }
    }
}

#[test]
fn skips_around_the_culprit_leave_an_ambiguous_set() {
    let run = run_search(
        16,
        &[],
        |i| match i {
            10 | 11 => Signature::new(FaultClass::Hang, "ran past its timeout"),
            i if i >= 11 => fault("gather"),
            _ => clean(),
        },
        None,
    );
    match run.end {
        SearchEnd::Ambiguous(c) => assert_eq!(c, vec![oid(10), oid(11), oid(12)]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_interrupt_stops_the_search_and_keeps_every_finished_probe() {
    let run = run_search(
        32,
        &[],
        |i| if i >= 20 { fault("gather") } else { clean() },
        Some(16),
    );
    assert_eq!(run.end, SearchEnd::Interrupted);
    // The stopped probe judged nothing: it is not recorded as a verdict.
    assert_eq!(run.records.len(), run.asked.len() - 1);
    assert_eq!(run.asked.last().unwrap().0, 16);
    let run = run_search(
        32,
        &[],
        |i| if i >= 20 { fault("gather") } else { clean() },
        Some(32),
    );
    assert_eq!(run.end, SearchEnd::Interrupted);
    assert_eq!(
        run.asked.len(),
        1,
        "nothing runs after an interrupted bad endpoint"
    );
}

/// Two bugs of one class that no message tells apart by kernel (both 717, as Triton faults often are).
fn anonymous(launch: &str) -> Signature {
    let mut s = Signature::new(
        FaultClass::InvalidAddressSpace,
        "torch.AcceleratorError: CUDA error: operation not supported on global/shared address space",
    );
    s.launch = Some(launch.into());
    s.exception = Some("torch.AcceleratorError".into());
    s
}

#[test]
fn another_kernels_bug_with_the_same_class_is_never_the_culprit() {
    // The other bug (commits 4..=9, later fixed) and the target (from 13) both surface as 717; their
    // tracebacks end in different functions of the user's code.
    let run = run_search(
        16,
        &[],
        |i| match i {
            4..=9 => anonymous("pkg/ops.py:bias_gelu"),
            i if i >= 13 => anonymous("pkg/embed.py:hash_embed"),
            _ => clean(),
        },
        None,
    );
    assert_eq!(run.end, SearchEnd::Found(oid(13)), "{:?}", run.records);
}

/// A fault through one shared launch wrapper (`pkg/launch.py:run`), called from `caller`'s line.
fn through_wrapper(caller: &str) -> Signature {
    let mut s = anonymous("pkg/launch.py:run");
    s.stack = vec![
        "train.py:5 in <module>: y = forward(x)".into(),
        caller.into(),
        "pkg/launch.py:3 in run: kernel[grid](*args, **kw)".into(),
    ];
    s
}

#[test]
fn a_fault_stack_the_sanitizer_settled_is_not_sanitized_again_and_a_lookalike_still_is() {
    // Both kernels go through one wrapper, so site, class and exception are alike; their callers differ.
    let gelu = "pkg/ops.py:14 in bias_gelu: run(_bias_gelu_kernel, (blocks,), x, out, n)";
    let embed = "pkg/embed.py:14 in hash_embed: run(_hash_embed_kernel, (blocks,), x, out, n)";
    let run = run_search_with(
        32,
        &[],
        move |i| match i {
            12..=20 => through_wrapper(gelu),
            i if i >= 26 => through_wrapper(embed),
            _ => clean(),
        },
        Some(Box::new(|i| match i {
            12..=20 => Some("_bias_gelu_kernel".to_string()),
            i if i >= 26 => Some("_hash_embed_kernel".to_string()),
            _ => None,
        })),
        None,
    );
    assert_eq!(run.end, SearchEnd::Found(oid(26)), "{:?}", run.records);
    // The bad endpoint's sanitizer run settled the target's stack: no search probe with that stack ran
    // the sanitizer again, and each one still names the target's kernel. Only the culprit, judged from
    // memory, is checked by a run of its own before it is named.
    assert_eq!(run.sanitized[0], 32);
    let targets_sanitized: Vec<&usize> = run.sanitized.iter().filter(|i| **i >= 26).collect();
    assert_eq!(targets_sanitized, [&32, &26], "{:?}", run.sanitized);
    assert_eq!(run.records.last().map(|r| r.role), Some(ProbeRole::Verify));
    let target_probes: Vec<&ProbeRecord> = run
        .records
        .iter()
        .filter(|r| r.role == ProbeRole::Search && index(r.commit.parse().unwrap()) >= 26)
        .collect();
    assert!(!target_probes.is_empty(), "{:?}", run.records);
    for r in &target_probes {
        assert_eq!(r.verdict, Verdict::Bad, "{r:?}");
        assert_eq!(r.signature.kernel.as_deref(), Some("_hash_embed_kernel"));
        assert!(
            r.sanitizer.as_deref().unwrap().contains("settled at"),
            "{r:?}"
        );
    }
    // The lookalike's first probe was sanitized and skipped; any later one with its stack took that
    // answer without a run: one sanitizer run per bug.
    let lookalikes: Vec<&ProbeRecord> = run
        .records
        .iter()
        .filter(|r| {
            r.role == ProbeRole::Search && (12..=20).contains(&index(r.commit.parse().unwrap()))
        })
        .collect();
    assert!(lookalikes.len() >= 2, "{:?}", run.records);
    assert!(
        lookalikes.iter().all(|r| r.verdict == Verdict::Skip),
        "{lookalikes:?}"
    );
    let sanitized_lookalikes = run
        .sanitized
        .iter()
        .filter(|i| (12..=20).contains(*i))
        .count();
    assert_eq!(sanitized_lookalikes, 1, "{:?}", run.sanitized);
}

#[test]
fn a_remembered_stack_that_launches_two_kernels_is_caught_at_the_culprit_and_searched_again() {
    // One op of an extension dispatches to two kernels from the very same lines: the lookalike's stack
    // is the target's. The memory takes the lookalike for the target, the culprit's own sanitizer run
    // says otherwise, and the search runs again with every lookalike settled afresh.
    let op = "pkg/ops.py:9 in fused: return ext.fused(x, n)";
    let run = run_search_with(
        32,
        &[],
        move |i| match i {
            12..=20 => through_wrapper(op),
            i if i >= 26 => through_wrapper(op),
            _ => clean(),
        },
        Some(Box::new(|i| match i {
            12..=20 => Some("fused_small_kernel".to_string()),
            i if i >= 26 => Some("fused_large_kernel".to_string()),
            _ => None,
        })),
        None,
    );
    assert_eq!(run.end, SearchEnd::Found(oid(26)), "{:?}", run.records);
    // The first answer's culprit was checked by the sanitizer itself, and was another kernel.
    let verify: Vec<&ProbeRecord> = run
        .records
        .iter()
        .filter(|r| r.role == ProbeRole::Verify)
        .collect();
    assert_eq!(verify.len(), 1, "{:?}", run.records);
    assert_eq!(
        verify[0].signature.kernel.as_deref(),
        Some("fused_small_kernel")
    );
    // In the search run again, no lookalike was judged from memory.
    let after = run
        .records
        .iter()
        .position(|r| r.role == ProbeRole::Verify)
        .unwrap();
    for r in &run.records[after..] {
        assert!(
            !r.sanitizer
                .as_deref()
                .is_some_and(|s| s.starts_with("not run again")),
            "{r:?}"
        );
    }
}

#[test]
fn a_sanitizer_learns_the_targets_kernel_and_settles_lookalike_faults() {
    // Same class, same launch function (one wrapper launches both kernels): only the kernel differs, and
    // only compute-sanitizer can say which.
    let run = run_search_with(
        16,
        &[],
        |i| match i {
            4..=9 => anonymous("pkg/model.py:forward"),
            i if i >= 13 => anonymous("pkg/model.py:forward"),
            _ => clean(),
        },
        Some(Box::new(|i| match i {
            4..=9 => Some("_bias_gelu_kernel".to_string()),
            i if i >= 13 => Some("_hash_embed_kernel".to_string()),
            _ => None,
        })),
        None,
    );
    assert_eq!(run.end, SearchEnd::Found(oid(13)), "{:?}", run.records);
    // The bad endpoint first (to learn the kernel), then only probes that faulted like the target.
    assert_eq!(run.sanitized[0], 16);
    assert_eq!(run.records[1].role, ProbeRole::EndpointSanitizer);
    assert!(run.sanitized.len() <= run.asked.len() + 1);
    for r in &run.records {
        if r.role == ProbeRole::Search && r.signature.kernel.as_deref() == Some("_bias_gelu_kernel")
        {
            assert_eq!(r.verdict, Verdict::Skip);
            assert!(
                r.reason.as_deref().unwrap().contains("a different bug"),
                "{r:?}"
            );
        }
    }
    // Without a sanitizer the same history would blame the other bug's first commit when it is probed
    // first; with one, any other-bug probe is recorded.
    assert!(run
        .other_bugs
        .iter()
        .all(|b| b.signature.kernel.as_deref() == Some("_bias_gelu_kernel")));
}

#[test]
fn a_host_that_breaks_mid_search_stops_it_with_the_cause() {
    let run = run_search(
        32,
        &[],
        |i| match i {
            32 => fault("gather"),
            0 => clean(),
            _ => Signature::new(
                FaultClass::ExecFailure,
                "the repro could not start: python3: not found",
            ),
        },
        None,
    );
    match &run.end {
        SearchEnd::HostFailure(m) => assert!(m.contains("could not start"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        run.asked.len(),
        3,
        "stopped at the first broken probe: {:?}",
        run.asked
    );
}

// ---- the shrink driver --------------------------------------------------------------------------------

/// A harness over a chain of nodes n0..n{len}: the model faults in `faulty` when every node of `needs` is
/// kept; a candidate holding `other` fails there with another bug.
struct FakeHarness {
    len: usize,
    faulty: usize,
    needs: Vec<usize>,
    other: Option<usize>,
    /// Non-monotone: with this node kept but not the second, the fault hides.
    hides: Option<(usize, usize)>,
    describe_fails: bool,
    extract_fails: Option<String>,
    clean_model: bool,
    runs: AtomicUsize,
    cancel_after: Option<(usize, &'static AtomicBool)>,
    /// Confirmation runs meet here: see [`Gate`].
    gate: Option<Arc<Gate>>,
    /// `extract` writes a repro.py, which run alone faults (from its own line) or runs clean.
    alone: Option<bool>,
    /// The exact repro's data is large, and a repro.py generating it is written on request; its runs
    /// alone meet here.
    generates: Option<Arc<Gate>>,
    /// Where runs of the exact repro.py alone meet.
    alone_gate: Option<Arc<Gate>>,
    /// The nodes' inputs are small though the exact repro's data is large (a loss call's arguments).
    small_inputs: bool,
}

/// Where concurrent runs of the minimal subgraph meet: after the first `skip` runs of it (the reducer's
/// own tries), each waits (bounded) until `want` are in flight, so the test sees how many ran at once
/// without timing anything; with `oom_when_shared`, a run that shared the GPU with another fails with an
/// out-of-memory.
struct Gate {
    want: usize,
    skip: usize,
    oom_when_shared: bool,
    state: Mutex<GateState>,
    met: Condvar,
}

#[derive(Default)]
struct GateState {
    entries: usize,
    in_flight: usize,
    most: usize,
    ooms: usize,
}

impl Gate {
    fn new(want: usize, skip: usize, oom_when_shared: bool) -> Self {
        Gate {
            want,
            skip,
            oom_when_shared,
            state: Mutex::new(GateState::default()),
            met: Condvar::new(),
        }
    }

    /// Enters; true when this run should fail with an out-of-memory.
    fn enter(&self) -> bool {
        let mut st = self.state.lock().unwrap();
        st.entries += 1;
        if st.entries <= self.skip {
            return false;
        }
        st.in_flight += 1;
        st.most = st.most.max(st.in_flight);
        self.met.notify_all();
        // Bounded, so a driver that runs them one by one fails the assertion instead of hanging.
        let (mut st, _) = self
            .met
            .wait_timeout_while(st, Duration::from_secs(10), |st| st.most < self.want)
            .unwrap();
        let oom = self.oom_when_shared && st.in_flight > 1 && st.ooms == 0;
        if oom {
            st.ooms += 1;
        }
        oom
    }

    fn leave(&self) {
        let mut st = self.state.lock().unwrap();
        st.in_flight = st.in_flight.saturating_sub(1);
    }
}

fn out(exit: i32, text: String) -> RunOutput {
    RunOutput {
        exit: Exit::Code(exit),
        duration: Duration::from_millis(1),
        output: text,
        total_bytes: 0,
        interrupted: false,
        lingering: Vec::new(),
        job: None,
        ended_by: None,
    }
}

fn marker(i: usize, phase: &str) -> String {
    format!("@@cudabisect node=n{i} op=gather kernel=gather_rows {phase}\n")
}

impl HarnessClient for FakeHarness {
    fn describe(&self, _: &AtomicBool) -> Result<Description, ProtocolError> {
        if self.describe_fails {
            return Err(ProtocolError::Extract(
                "describe: model.toml: no such file".into(),
            ));
        }
        let nodes = (0..self.len)
            .map(|i| GraphNode {
                id: format!("n{i}"),
                op: "gather".into(),
                kernel: Some("gather_rows".into()),
                // A harness that generates values records large inputs (9 MiB of int8 each).
                inputs: vec![GraphTensor {
                    name: format!("t{i}"),
                    shape: Some(vec![if self.generates.is_some() && !self.small_inputs {
                        9 << 20
                    } else {
                        4
                    }]),
                    dtype: self.generates.as_ref().map(|_| "int8".into()),
                    producer: (i > 0).then(|| format!("n{}", i - 1)),
                }],
                outputs: vec![],
                phase: None,
                forward: None,
                source: None,
            })
            .collect();
        Ok(Description {
            protocol: PROTOCOL_VERSION,
            harness: Some("fake".into()),
            graph: Some("fx".into()),
            nodes,
        })
    }

    fn run(&self, request: &RunRequest, _: &AtomicBool) -> Result<RunOutput, ProtocolError> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some((after, cancel)) = self.cancel_after {
            if n >= after {
                cancel.store(true, Ordering::SeqCst);
            }
        }
        let kept: Vec<usize> = match request.keep {
            None => (0..self.len).collect(),
            Some(ids) => ids.iter().map(|id| id[1..].parse().unwrap()).collect(),
        };
        let mut text = String::new();
        // Only the final check runs the minimal subgraph with nothing cut before the fault but needs.
        let confirming = request.keep.is_some() && kept.len() == self.needs.len();
        if let Some(gate) = self.gate.as_ref().filter(|_| confirming) {
            let oom = gate.enter();
            gate.leave();
            if oom {
                text += "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n";
                return Ok(out(1, text));
            }
        }
        for &i in &kept {
            text += &marker(i, "begin");
            if Some(i) == self.other {
                text += "RuntimeError: CUDA error: misaligned address\n";
                return Ok(out(1, text));
            }
            if i == self.faulty && !self.clean_model && self.needs.iter().all(|n| kept.contains(n))
            {
                text += "RuntimeError: CUDA error: an illegal memory access was encountered\n";
                return Ok(out(1, text));
            }
            text += &marker(i, "end");
        }
        Ok(out(0, text))
    }

    fn extract(
        &self,
        _: &[String],
        _: &Path,
        out: &Path,
        _: &AtomicBool,
    ) -> Result<(), ProtocolError> {
        match &self.extract_fails {
            Some(why) => Err(ProtocolError::Extract(why.clone())),
            None => {
                if self.alone.is_some() {
                    std::fs::create_dir_all(out).unwrap();
                    std::fs::write(out.join("repro.py"), "# fake\n").unwrap();
                    if self.generates.is_some() {
                        std::fs::write(out.join("repro_data.pt"), vec![0u8; 9 << 20]).unwrap();
                    }
                }
                Ok(())
            }
        }
    }

    fn generates_values(&self) -> bool {
        self.generates.is_some()
    }

    fn extract_generated(
        &self,
        _: &[String],
        _: &Path,
        out: &Path,
        _: u64,
        _: &AtomicBool,
    ) -> Result<bool, ProtocolError> {
        std::fs::create_dir_all(out).unwrap();
        std::fs::write(out.join("repro.py"), "# fake, generating\n").unwrap();
        Ok(true)
    }

    fn run_alone(&self, repro: &Path, _: &AtomicBool) -> Result<Option<RunOutput>, ProtocolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let generating = repro
            .parent()
            .is_some_and(|d| d.ends_with("minimal-generated"));
        if let Some(gate) = self.alone_gate.as_ref().filter(|_| !generating) {
            gate.enter();
            gate.leave();
        }
        if let Some(gate) = self.generates.as_ref().filter(|_| generating) {
            let oom = gate.enter();
            gate.leave();
            if oom {
                return Ok(Some(out(
                    1,
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
                        .into(),
                )));
            }
        }
        Ok(self.alone.map(|faults| match faults {
            true => out(
                1,
                "  File \"/tmp/x/minimal/repro.py\", line 40, in backward\nRuntimeError: CUDA error: an illegal memory access was encountered\n".into(),
            ),
            false => out(0, "repro: ran clean\n".into()),
        }))
    }

    fn reproduce_line(&self, _: Option<&Path>, keep: &[String], _: &Path) -> String {
        format!("fake run --keep {}", keep.join(","))
    }
}

fn harness(len: usize, faulty: usize, needs: Vec<usize>) -> FakeHarness {
    FakeHarness {
        len,
        faulty,
        needs,
        other: None,
        hides: None,
        describe_fails: false,
        extract_fails: None,
        clean_model: false,
        runs: AtomicUsize::new(0),
        cancel_after: None,
        gate: None,
        alone: None,
        generates: None,
        alone_gate: None,
        small_inputs: false,
    }
}

fn run_shrink(
    h: &FakeHarness,
    cancel: &AtomicBool,
) -> (cudabisect::report::record::ShrinkReport, Events) {
    run_shrink_jobs(h, cancel, 1)
}

fn run_shrink_jobs(
    h: &FakeHarness,
    cancel: &AtomicBool,
    confirm_jobs: u32,
) -> (cudabisect::report::record::ShrinkReport, Events) {
    let dir = tempfile::tempdir().unwrap();
    let policy = MatchPolicy::parse("class+kernel").unwrap();
    let settings = ShrinkSettings {
        policy: &policy,
        out_dir: dir.path().join("shrink"),
        target: None,
        attempts: 1,
        confirm: 3,
        confirm_jobs,
        parent_beside: None,
    };
    let mut events = Events::default();
    let report = shrink(h, &settings, &mut events, cancel);
    (report, events)
}

#[test]
fn a_shrink_keeps_exactly_the_needed_nodes_and_confirms_them() {
    let h = harness(40, 30, vec![3, 30]);
    let (r, events) = run_shrink(&h, &AtomicBool::new(false));
    assert_eq!(r.status, ShrinkStatus::Minimal, "{}", r.summary);
    let kept: Vec<&str> = r.kept.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(kept, ["n3", "n30"]);
    assert_eq!(r.located_node.as_deref(), Some("n30"));
    assert_eq!(r.confirmation.as_ref().unwrap().reproduced, 3);
    assert_eq!(r.nodes_before, 40);
    assert_eq!(r.removed.len(), 38);
    assert_eq!(r.reproduce.as_deref(), Some("fake run --keep n3,n30"));
    assert!(events
        .0
        .iter()
        .any(|e| matches!(e, Event::ShrinkLocated { node, .. } if node == "n30")));
    assert_eq!(r.harness_runs, h.runs.load(Ordering::SeqCst));
    assert_eq!(r.extract_error, None);
    assert_eq!(
        r.graph.as_deref(),
        Some("fx"),
        "the harness's word on its graph is kept"
    );
}

#[test]
fn confirmation_runs_go_together_and_one_that_ran_out_of_memory_beside_others_is_run_again_alone() {
    // One at a time (the default), they never overlap; this run also counts the reducer's own tries of
    // the minimal subgraph, which come before the final check.
    let mut h = harness(12, 7, vec![7]);
    h.gate = Some(Arc::new(Gate::new(1, 0, false)));
    let (r, _) = run_shrink(&h, &AtomicBool::new(false));
    assert_eq!(r.confirmation.as_ref().map(|c| c.reproduced), Some(3));
    let st = h.gate.as_ref().unwrap().state.lock().unwrap();
    assert_eq!(st.most, 1);
    let skip = st.entries - 3;
    drop(st);

    // Three places on the GPU: two confirmation runs at a time, and repro.py written in the third.
    let mut h = harness(12, 7, vec![7]);
    h.gate = Some(Arc::new(Gate::new(2, skip, false)));
    let (r, _) = run_shrink_jobs(&h, &AtomicBool::new(false), 3);
    assert_eq!(r.confirmation.as_ref().map(|c| c.reproduced), Some(3));
    assert_eq!(h.gate.as_ref().unwrap().state.lock().unwrap().most, 2);

    let mut h = harness(12, 7, vec![7]);
    h.gate = Some(Arc::new(Gate::new(2, skip, true)));
    let (r, _) = run_shrink_jobs(&h, &AtomicBool::new(false), 3);
    assert_eq!(
        r.confirmation.as_ref().map(|c| (c.reproduced, c.runs)),
        Some((3, 3)),
        "an out-of-memory from sharing the GPU does not count against the repro"
    );
    assert!(r
        .rejected
        .iter()
        .any(|x| x.class == FaultClass::OutOfMemory));
    assert_eq!(r.harness_runs, h.runs.load(Ordering::SeqCst));
}

/// What a check at the parent was handed: the kept nodes and the signature.
type Handed = Vec<(Vec<String>, Option<Signature>)>;

/// A shrink handed a check at the parent, with the places the GPU held; what the check was handed.
fn shrink_with_parent_beside(
    h: &FakeHarness,
    confirm_jobs: u32,
) -> (cudabisect::report::record::ShrinkReport, Handed) {
    let dir = tempfile::tempdir().unwrap();
    let policy = MatchPolicy::parse("class+kernel").unwrap();
    let handed = Mutex::new(Vec::new());
    let at_parent = |r: &cudabisect::report::record::ShrinkReport| {
        let kept = r.kept.iter().map(|n| n.id.clone()).collect();
        handed.lock().unwrap().push((kept, r.signature.clone()));
        ParentCheck::Passed
    };
    let settings = ShrinkSettings {
        policy: &policy,
        out_dir: dir.path().join("shrink"),
        target: None,
        attempts: 1,
        confirm: 3,
        confirm_jobs,
        parent_beside: Some(ParentBeside(&at_parent)),
    };
    let report = shrink(
        h,
        &settings,
        &mut Events::default(),
        &AtomicBool::new(false),
    );
    (report, handed.into_inner().unwrap())
}

#[test]
fn the_check_at_the_parent_runs_beside_the_final_check_on_the_final_subgraph_and_only_with_room() {
    let h = harness(12, 7, vec![3, 7]);
    let (r, handed) = shrink_with_parent_beside(&h, 4);
    assert_eq!(r.status, ShrinkStatus::Minimal, "{}", r.summary);
    assert_eq!(r.parent_check, Some(ParentCheck::Passed));
    // Handed once, with what the report ends with: the kept nodes and the signature.
    let kept: Vec<String> = r.kept.iter().map(|n| n.id.clone()).collect();
    assert_eq!(handed, vec![(kept, r.signature.clone())]);
    assert_eq!(r.confirmation.as_ref().map(|c| c.reproduced), Some(3));
    // Without a third place on the GPU it is not run beside: the caller runs it after the shrink.
    let h = harness(12, 7, vec![3, 7]);
    let (alone, handed) = shrink_with_parent_beside(&h, 2);
    assert!(handed.is_empty());
    assert_eq!(alone.parent_check, None);
    assert_eq!(
        (alone.kept.len(), alone.signature.clone()),
        (r.kept.len(), r.signature.clone()),
        "the same subgraph either way"
    );
}

#[test]
fn the_written_repro_is_run_alone_and_one_that_never_faults_alone_is_said_so() {
    // Faulting from repro.py's own line (not the harness's launch site) is the same fault.
    let mut h = harness(12, 7, vec![7]);
    h.alone = Some(true);
    let (r, _) = run_shrink(&h, &AtomicBool::new(false));
    assert!(r.minimal_model.is_some(), "{}", r.summary);
    let data = r.data.as_ref().unwrap();
    let alone = data.alone.as_ref().unwrap();
    assert_eq!(
        (alone.runs, alone.reproduced),
        (1, 1),
        "it stops at the first run that shows it"
    );
    assert!(!data.missed_alone());
    assert_eq!(r.harness_runs, h.runs.load(Ordering::SeqCst));

    let mut h = harness(12, 7, vec![7]);
    h.alone = Some(false);
    let (r, _) = run_shrink(&h, &AtomicBool::new(false));
    let data = r.data.as_ref().unwrap();
    let alone = data.alone.as_ref().unwrap();
    assert_eq!((alone.runs, alone.reproduced), (3, 0), "{alone:?}");
    assert!(
        alone.missed.as_deref().unwrap().contains("exited 0"),
        "{alone:?}"
    );
    assert!(data.missed_alone());
}

/// A shrink whose exact repro is large and whose generating repro's runs alone meet at `gate`, with the
/// GPU holding `jobs` runs at once.
fn generating_shrink(
    gate: Gate,
    jobs: u32,
) -> (FakeHarness, cudabisect::report::record::ShrinkReport) {
    let mut h = harness(12, 7, vec![7]);
    h.alone = Some(true);
    h.generates = Some(Arc::new(gate));
    let (r, _) = run_shrink_jobs(&h, &AtomicBool::new(false), jobs);
    (h, r)
}

#[test]
fn a_repro_generating_its_values_is_run_alone_as_many_at_once_as_the_gpu_holds() {
    // Four places: repro.py is written in one, three runs go at once in the others.
    let (h, r) = generating_shrink(Gate::new(3, 0, false), 4);
    let data = r.data.as_ref().unwrap();
    assert!(data.generated, "{data:?}");
    let alone = data.alone.as_ref().unwrap();
    assert_eq!((alone.runs, alone.reproduced), (3, 3), "{alone:?}");
    assert_eq!(h.generates.as_ref().unwrap().state.lock().unwrap().most, 3);

    // One that ran out of memory beside the others is run again by itself, and counts as it does then.
    let (h, r) = generating_shrink(Gate::new(3, 0, true), 4);
    let data = r.data.as_ref().unwrap();
    assert!(data.generated, "{data:?}");
    let alone = data.alone.as_ref().unwrap();
    assert_eq!((alone.runs, alone.reproduced), (3, 3), "{alone:?}");
    assert_eq!(r.harness_runs, h.runs.load(Ordering::SeqCst));

    // One at a time where the GPU holds one.
    let (h, r) = generating_shrink(Gate::new(1, 0, false), 1);
    assert!(r.data.as_ref().unwrap().generated);
    assert_eq!(h.generates.as_ref().unwrap().state.lock().unwrap().most, 1);
}

/// How many runs of the minimal subgraph of `harness(12, 7, vec![7])` come before its final check of 3
/// (the reducer's own tries): a gate meant for the final check skips them.
fn tries_before_the_final_check() -> usize {
    let mut h = harness(12, 7, vec![7]);
    h.gate = Some(Arc::new(Gate::new(1, 0, false)));
    run_shrink_jobs(&h, &AtomicBool::new(false), 1);
    let entries = h.gate.as_ref().unwrap().state.lock().unwrap().entries;
    entries - 3
}

/// Five places: the writer's and four runs. Three confirmations and three runs of the generating repro
/// meet at one gate that opens at four in flight: only runs of both at once reach four, and the places
/// never let a fifth in. With `small_inputs` the kept nodes' inputs look small and only what repro.py
/// ships is large.
fn generating_beside_the_final_check(small_inputs: bool) {
    let skip = tries_before_the_final_check();
    let shared = Arc::new(Gate::new(4, skip, false));
    let mut h = harness(12, 7, vec![7]);
    h.alone = Some(true);
    h.small_inputs = small_inputs;
    h.generates = Some(shared.clone());
    h.gate = Some(shared.clone());
    let (r, _) = run_shrink_jobs(&h, &AtomicBool::new(false), 5);
    assert_eq!(shared.state.lock().unwrap().most, 4);
    assert_eq!(r.confirmation.as_ref().map(|c| c.reproduced), Some(3));
    let data = r.data.as_ref().unwrap();
    assert!(data.generated, "{data:?}");
    assert_eq!(
        data.alone.as_ref().map(|a| (a.runs, a.reproduced)),
        Some((3, 3))
    );
    assert_eq!(
        r.harness_runs,
        h.runs.load(Ordering::SeqCst),
        "every run counted"
    );
}

#[test]
fn large_inputs_have_their_generating_repro_written_and_run_beside_the_final_check_within_its_places(
) {
    generating_beside_the_final_check(false);
}

#[test]
fn a_repro_shipping_large_values_behind_small_inputs_has_its_generating_repro_run_beside_the_final_check(
) {
    // What repro.py ships is large though the kept nodes' inputs looked small (a loss call's arguments,
    // the parameters): the generating repro is tried as soon as the writer says so, beside the
    // confirmations, not after them.
    generating_beside_the_final_check(true);
}

#[test]
fn a_small_repro_is_run_alone_beside_the_final_check_as_soon_as_it_is_written() {
    let skip = tries_before_the_final_check();
    // Five places: the writer's and four runs. The three confirmations and the written repro.py run
    // alone meet at one gate that opens at four in flight: only the run alone beside the confirmations
    // reaches four.
    let shared = Arc::new(Gate::new(4, skip, false));
    let mut h = harness(12, 7, vec![7]);
    h.alone = Some(true);
    h.gate = Some(shared.clone());
    h.alone_gate = Some(shared.clone());
    let (r, _) = run_shrink_jobs(&h, &AtomicBool::new(false), 5);
    assert_eq!(shared.state.lock().unwrap().most, 4);
    assert_eq!(r.confirmation.as_ref().map(|c| c.reproduced), Some(3));
    let data = r.data.as_ref().unwrap();
    assert!(!data.generated);
    assert_eq!(
        data.alone.as_ref().map(|a| (a.runs, a.reproduced)),
        Some((1, 1))
    );
    assert_eq!(
        r.harness_runs,
        h.runs.load(Ordering::SeqCst),
        "every run counted"
    );
}

#[test]
fn a_minimal_subgraph_that_cannot_be_extracted_keeps_its_result_and_says_why() {
    let mut h = harness(12, 7, vec![7]);
    h.extract_fails =
        Some("exited 2: error: extract: custom op mylib::fused: no definition".into());
    let (r, _) = run_shrink(&h, &AtomicBool::new(false));
    assert_eq!(r.status, ShrinkStatus::Minimal, "{}", r.summary);
    assert_eq!(r.located_node.as_deref(), Some("n7"));
    assert_eq!(r.minimal_model, None);
    let why = r.extract_error.as_deref().unwrap_or_default();
    assert!(why.contains("mylib::fused"), "{why}");
    assert_eq!(r.reproduce.as_deref(), Some("fake run --keep n7"));
}

#[test]
fn a_candidate_that_fails_another_way_is_rejected_not_kept() {
    // Another bug in node 12 runs before the target in node 15: with the target given, the full run
    // does not show it, and nothing is shrunk towards the other bug.
    let mut h = harness(20, 15, vec![15]);
    h.other = Some(12);
    let dir = tempfile::tempdir().unwrap();
    let policy = MatchPolicy::parse("class+kernel").unwrap();
    let mut target = Signature::new(FaultClass::IllegalAddress, "x");
    target.kernel = Some("gather_rows".into());
    let settings = ShrinkSettings {
        policy: &policy,
        out_dir: dir.path().join("shrink"),
        target: Some(target),
        attempts: 1,
        confirm: 2,
        confirm_jobs: 1,
        parent_beside: None,
    };
    let r = shrink(
        &h,
        &settings,
        &mut Events::default(),
        &AtomicBool::new(false),
    );
    // The full run dies in node 12 with a misaligned address: not the target.
    assert_eq!(r.status, ShrinkStatus::NotReproduced, "{}", r.summary);
    assert!(r.summary.contains("misaligned_address"), "{}", r.summary);

    // With the other bug after the target, candidates that include it are rejected, never kept.
    let mut h = harness(20, 8, vec![2, 8]);
    h.other = Some(17);
    let (r, _) = run_shrink(&h, &AtomicBool::new(false));
    assert_eq!(r.status, ShrinkStatus::Minimal, "{}", r.summary);
    let kept: Vec<&str> = r.kept.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(kept, ["n2", "n8"]);
    assert!(
        r.rejected
            .iter()
            .all(|x| x.class == FaultClass::MisalignedAddress),
        "{:?}",
        r.rejected
    );
}

#[test]
fn a_model_that_does_not_fault_or_cannot_be_described_says_so() {
    let mut h = harness(10, 5, vec![5]);
    h.clean_model = true;
    let (r, _) = run_shrink(&h, &AtomicBool::new(false));
    assert_eq!(r.status, ShrinkStatus::NotReproduced);
    assert!(r.summary.contains("showed none"), "{}", r.summary);
    let mut h = harness(10, 5, vec![5]);
    h.describe_fails = true;
    let (r, _) = run_shrink(&h, &AtomicBool::new(false));
    assert_eq!(r.status, ShrinkStatus::Failed);
    assert!(r.summary.starts_with("harness describe:"), "{}", r.summary);
    assert_eq!(h.runs.load(Ordering::SeqCst), 0);
}

#[test]
fn an_interrupt_during_the_reduction_ends_it_as_interrupted() {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let mut h = harness(64, 40, vec![1, 40]);
    h.cancel_after = Some((3, cancel));
    let (r, _) = run_shrink(&h, cancel);
    assert_eq!(r.status, ShrinkStatus::Interrupted);
    assert!(
        h.runs.load(Ordering::SeqCst) <= 4,
        "ran on after the interrupt: {}",
        h.runs.load(Ordering::SeqCst)
    );
}

#[test]
fn per_commit_maps_are_deterministic() {
    // Two runs of the same script ask for the same commits in the same order.
    let a = run_search(
        200,
        &[],
        |i| if i >= 77 { fault("g") } else { clean() },
        None,
    )
    .asked;
    let b = run_search(
        200,
        &[],
        |i| if i >= 77 { fault("g") } else { clean() },
        None,
    )
    .asked;
    assert_eq!(a, b);
}

#[test]
fn a_non_monotone_oracle_still_ends_on_a_subgraph_that_faults() {
    // Keeping n10 without n20 hides the fault: some candidates between "everything" and "the two needed
    // nodes" look clean although the full model and the final answer fault.
    let mut h = harness(32, 25, vec![4, 25]);
    h.hides = Some((10, 20));
    let (r, _) = run_shrink(&h, &AtomicBool::new(false));
    assert_eq!(r.status, ShrinkStatus::Minimal, "{}", r.summary);
    let c = r.confirmation.as_ref().unwrap();
    assert_eq!(c.reproduced, c.runs, "the answer faults every time");
    let kept: Vec<&str> = r.kept.iter().map(|n| n.id.as_str()).collect();
    assert!(kept.contains(&"n4") && kept.contains(&"n25"), "{kept:?}");
    assert!(!kept.contains(&"n10") || kept.contains(&"n20"), "{kept:?}");
}

/// A model `a, blk, c` whose middle node is a module the description keeps whole; the recorded run
/// descends into it (nested markers) and dies in its call `blk__emb`. With `finer_reproduces` false, the
/// finer graph run on the recording comes out clean (the fault needed the module's own code).
struct DescendingHarness {
    finer_reproduces: bool,
    runs: AtomicUsize,
}

fn node(id: &str) -> GraphNode {
    GraphNode {
        id: id.into(),
        op: "op".into(),
        kernel: Some("k".into()),
        inputs: vec![],
        outputs: vec![],
        phase: None,
        forward: None,
        source: None,
    }
}

impl HarnessClient for DescendingHarness {
    fn describe(&self, _: &AtomicBool) -> Result<Description, ProtocolError> {
        Ok(Description {
            protocol: PROTOCOL_VERSION,
            harness: Some("fake".into()),
            graph: Some("fx; kept whole: blk".into()),
            nodes: ["a", "blk", "c"].into_iter().map(node).collect(),
        })
    }

    fn describe_recorded(
        &self,
        _: &Path,
        _: &AtomicBool,
    ) -> Result<Option<Description>, ProtocolError> {
        Ok(Some(Description {
            protocol: PROTOCOL_VERSION,
            harness: Some("fake".into()),
            graph: Some("fx; descended along the fault: blk: hooks".into()),
            nodes: ["a", "blk__proj", "blk__emb", "c"]
                .into_iter()
                .map(node)
                .collect(),
        }))
    }

    fn run(&self, request: &RunRequest, _: &AtomicBool) -> Result<RunOutput, ProtocolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let m = |n: &str, phase: &str| format!("@@cudabisect node={n} op=op kernel=k {phase}\n");
        let fault = "RuntimeError: CUDA error: an illegal memory access was encountered\n";
        let finer = request.recording.is_some() && request.keep.is_none();
        let keep: Vec<String> = match (request.keep, finer) {
            (Some(k), _) => k.to_vec(),
            (None, true) => ["a", "blk__proj", "blk__emb", "c"]
                .map(String::from)
                .to_vec(),
            (None, false) => ["a", "blk", "c"].map(String::from).to_vec(),
        };
        let mut text = String::new();
        for n in &keep {
            text += &m(n, "begin");
            match n.as_str() {
                "blk" => {
                    text += &m("blk__proj", "begin");
                    text += &m("blk__proj", "end");
                    text += &m("blk__emb", "begin");
                    return Ok(out(1, text + fault));
                }
                "blk__emb" if self.finer_reproduces => return Ok(out(1, text + fault)),
                _ => {}
            }
            text += &m(n, "end");
        }
        Ok(out(0, text))
    }

    fn extract(
        &self,
        _: &[String],
        _: &Path,
        _: &Path,
        _: &AtomicBool,
    ) -> Result<(), ProtocolError> {
        Ok(())
    }

    fn reproduce_line(&self, _: Option<&Path>, keep: &[String], _: &Path) -> String {
        keep.join(",")
    }
}

fn shrink_descending(finer_reproduces: bool) -> cudabisect::report::record::ShrinkReport {
    let h = DescendingHarness {
        finer_reproduces,
        runs: AtomicUsize::new(0),
    };
    let dir = tempfile::tempdir().unwrap();
    let policy = MatchPolicy::parse("class+kernel").unwrap();
    let settings = ShrinkSettings {
        policy: &policy,
        out_dir: dir.path().join("shrink"),
        target: None,
        attempts: 1,
        confirm: 2,
        confirm_jobs: 1,
        parent_beside: None,
    };
    let r = shrink(
        &h,
        &settings,
        &mut Events::default(),
        &AtomicBool::new(false),
    );
    assert_eq!(r.harness_runs, h.runs.load(Ordering::SeqCst));
    r
}

#[test]
fn a_fault_inside_a_module_kept_whole_is_pinned_to_the_call_it_died_in() {
    let r = shrink_descending(true);
    assert_eq!(r.status, ShrinkStatus::Minimal, "{}", r.summary);
    assert_eq!(r.located_node.as_deref(), Some("blk__emb"));
    let kept: Vec<&str> = r.kept.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(kept, ["blk__emb"]);
    assert_eq!(
        r.nodes_before,
        r.kept.len() + r.removed.len(),
        "the size of the graph the reduction ran on (the descended one), as the summary counts it"
    );
    assert!(
        r.summary
            .starts_with(&format!("1 of {} nodes", r.nodes_before)),
        "{}",
        r.summary
    );
    assert_eq!(r.removed, ["a", "blk__proj", "c"]);
    assert_eq!(
        r.graph.as_deref(),
        Some("fx; descended along the fault: blk: hooks")
    );
    assert_eq!(r.confirmation.as_ref().map(|c| c.reproduced), Some(2));
}

#[test]
fn a_descent_that_does_not_reproduce_leaves_the_fault_at_the_module_kept_whole() {
    let r = shrink_descending(false);
    assert_eq!(r.status, ShrinkStatus::Minimal, "{}", r.summary);
    assert_eq!(r.located_node.as_deref(), Some("blk"));
    let kept: Vec<&str> = r.kept.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(kept, ["blk"]);
    let graph = r.graph.unwrap_or_default();
    assert!(
        graph.starts_with("fx; kept whole: blk; the descent to blk__emb did not reproduce"),
        "{graph}"
    );
}

fn scripted(
    cancel: &'static AtomicBool,
    hang_below: Option<(usize, &'static AtomicBool)>,
) -> Scripted {
    Scripted {
        shows: Box::new(|i| if i >= 11 { fault("gather") } else { clean() }),
        kernels: None,
        sanitized: vec![],
        interrupt_at: None,
        cancel,
        asked: vec![],
        hang_below,
        workers: vec![],
        hangs_stopped: 0,
    }
}

#[test]
fn a_prober_that_panics_ends_the_search_as_a_broken_host_instead_of_leaving_it_waiting() {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let stops = stop_flags(2);
    let (tx, rx) = std::sync::mpsc::channel();
    // The search runs on a thread of its own: a driver left waiting fails the test instead of hanging it.
    std::thread::spawn(move || {
        let mut probers: Vec<Scripted> = stops.iter().map(|_| scripted(cancel, None)).collect();
        // The second worker's prober has a defect: it panics on every commit (its first is the good end,
        // in the first round).
        probers[1].shows = Box::new(|i| panic!("a defect in the prober at commit {i}"));
        let (outcome, _) = search_16(&mut probers, &stops, cancel, Sharing::NONE);
        let _ = tx.send(outcome);
    });
    let outcome = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the search never ended: the driver waits on a worker that panicked");
    // The broken probe is a broken host: it ends the search, or, where it landed after the other worker
    // had settled the answer (its commit no longer a candidate), it is recorded and the answer stands.
    let broken = outcome
        .probes
        .iter()
        .find(|p| p.signature.summary.contains("the probe worker failed"));
    match &outcome.end {
        SearchEnd::HostFailure(why) => assert!(why.contains("the probe worker failed"), "{why}"),
        SearchEnd::Found(c) => {
            assert_eq!(*c, oid(11));
            assert!(broken.is_some(), "{:?}", outcome.probes);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn parallel_workers_split_the_range_and_a_probe_whose_answer_no_longer_matters_is_stopped() {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    // Four workers: the first round is the bad end, the good end and two cuts of the range.
    let stops = stop_flags(4);
    // Every worker's probe of a commit below 8 runs until stopped: once commit 8 or later is known good,
    // those answers carry no news.
    let mut probers: Vec<Scripted> = stops
        .iter()
        .map(|&stop| scripted(cancel, Some((8, stop))))
        .collect();
    let (outcome, events) = search_16(&mut probers, &stops, cancel, Sharing::NONE);
    assert_eq!(outcome.end, SearchEnd::Found(oid(11)));
    // The bad end on the first worker, the search spread over all four, each probe naming its worker.
    assert_eq!(probers[0].asked[0], (16, ProbeRole::BadEndpoint));
    for (w, p) in probers.iter().enumerate() {
        // The good end runs in the first round beside the search's first probes, on a worker of its own.
        assert!(
            p.asked
                .iter()
                .any(|(_, r)| matches!(r, ProbeRole::Search | ProbeRole::GoodEndpoint)),
            "worker {} got no probe in the first round: {:?}",
            w + 1,
            p.asked
        );
        assert!(
            p.workers.iter().all(|x| *x == Some(w + 1)),
            "{:?}",
            p.workers
        );
    }
    // The first round's probes are distinct commits.
    let first_round: Vec<usize> = probers
        .iter()
        .filter_map(|p| {
            p.asked
                .iter()
                .find(|(_, r)| *r == ProbeRole::Search)
                .map(|(i, _)| *i)
        })
        .collect();
    let mut distinct = first_round.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), first_round.len(), "{first_round:?}");
    assert!(first_round.len() >= 2, "{first_round:?}");
    // A stopped probe is neither recorded nor learned from, and the run says so.
    let stopped: Vec<&String> = events
        .iter()
        .filter_map(|e| match e {
            Event::ProbeAbandoned { commit, .. } => Some(commit),
            _ => None,
        })
        .collect();
    assert!(!stopped.is_empty(), "no probe was stopped");
    assert!(outcome
        .probes
        .iter()
        .all(|r| r.signature.summary != "stopped by the driver"));
    // Every probe's number is distinct.
    let mut steps: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            Event::ProbeFinished { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    let n = steps.len();
    steps.sort_unstable();
    steps.dedup();
    assert_eq!(steps.len(), n);
}

/// Commit 0 is the old end (the fault shows), 16 the new end; the range holds 1..=16.
fn fix_setup() -> (Vec<RangeCommit>, Vec<(String, Oid)>, MatchPolicy) {
    (
        linear(16),
        vec![("old".to_string(), oid(0))],
        MatchPolicy::parse("class+kernel").unwrap(),
    )
}

fn fix_input<'a>(
    range: &'a [RangeCommit],
    goods: &'a [(String, Oid)],
    policy: &'a MatchPolicy,
) -> SearchInput<'a> {
    SearchInput {
        bad: ("new", oid(16)),
        finding_fix: true,
        ..plain_input(range, goods, policy)
    }
}

#[test]
fn finding_a_fix_is_the_same_search_with_the_states_swapped() {
    // The fault shows from the old end (0) up to commit 9, and another bug at 12 and 13: commit 10 is
    // the fix, and the other bug never counts as the fault being back or gone.
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let (range, goods, policy) = fix_setup();
    let input = fix_input(&range, &goods, &policy);
    let mut prober = scripted(cancel, None);
    prober.shows = Box::new(|i| match i {
        0..=9 => fault("gather"),
        12 | 13 => fault("scatter"),
        _ => clean(),
    });
    let outcome = search(&input, &mut prober, &mut Events::default(), cancel);
    assert_eq!(outcome.end, SearchEnd::Found(oid(10)));
    for r in &outcome.probes {
        let i = index(Oid::from_str(&r.commit).unwrap());
        let want = match i {
            0..=9 => Verdict::Good,
            12 | 13 => Verdict::Skip,
            _ => Verdict::Bad,
        };
        assert_eq!(r.verdict, want, "commit {i}: {r:?}");
    }
    // A new end that still shows the fault says so.
    prober.shows = Box::new(|_| fault("gather"));
    let outcome = search(&input, &mut prober, &mut Events::default(), cancel);
    assert!(
        matches!(outcome.end, SearchEnd::EndpointsInvalid(_)),
        "{:?}",
        outcome.end
    );
}

#[test]
fn finding_a_fix_never_takes_a_lookalike_bug_for_the_fault_still_there() {
    // Both bugs print the same 717 through one launch wrapper; only the sanitizer tells their kernels
    // apart. The fault (kernel `embed`) is fixed at 10; another bug (kernel `bias`) shows at 12 and 13.
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let (range, goods, policy) = fix_setup();
    for lookalikes in [vec![12, 13], vec![11, 12, 13, 14]] {
        let mut prober = scripted(cancel, None);
        let shown = lookalikes.clone();
        prober.shows = Box::new(move |i| {
            if i <= 9 || shown.contains(&i) {
                anonymous("pkg/launch.py:run")
            } else {
                clean()
            }
        });
        prober.kernels = Some(Box::new(|i| {
            Some(if i <= 9 { "embed" } else { "bias" }.to_string())
        }));
        // The fault's kernel is learned at the old end, under the sanitizer.
        let input = fix_input(&range, &goods, &policy);
        let outcome = search(&input, &mut prober, &mut Events::default(), cancel);
        assert_eq!(
            outcome.end,
            SearchEnd::Found(oid(10)),
            "lookalikes at {lookalikes:?}"
        );
        for r in &outcome.probes {
            let i = index(Oid::from_str(&r.commit).unwrap());
            if lookalikes.contains(&i) {
                assert_eq!(r.verdict, Verdict::Skip, "commit {i}: {r:?}");
            }
        }
    }
}

#[test]
fn finding_a_fix_opens_the_first_round_with_the_old_end_beside_the_new_end_and_the_first_cuts() {
    // Three workers. Before, the old end ran alone before the search; now its run opens the first round,
    // beside the new end's check and a cut, and the round's answers wait for its fault: the old end's
    // probe waits (bounded) for the other two to start theirs.
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let (range, goods, policy) = fix_setup();
    let input = fix_input(&range, &goods, &policy);
    let run = |shows: fn(usize) -> Signature| {
        let started: &'static (Mutex<usize>, Condvar) =
            Box::leak(Box::new((Mutex::new(0), Condvar::new())));
        let steps: &'static Mutex<Vec<(usize, usize, usize)>> =
            Box::leak(Box::new(Mutex::new(Vec::new())));
        let met: &'static Mutex<Option<bool>> = Box::leak(Box::new(Mutex::new(None)));
        let stops = stop_flags(3);
        let mut probers: Vec<MeetsAtOpening> = (0..3)
            .map(|me| {
                let mut inner = scripted(cancel, None);
                inner.shows = Box::new(shows);
                MeetsAtOpening {
                    inner,
                    me,
                    opening: ProbeRole::GoodEndpoint,
                    started,
                    workers: 3,
                    steps,
                    met,
                }
            })
            .collect();
        let mut workers: Vec<Worker> = probers
            .iter_mut()
            .zip(&stops)
            .map(|(p, &stop)| Worker { probe: p, stop })
            .collect();
        let mut events = Events::default();
        let outcome = search_with_workers(&input, &mut workers, &mut events, cancel);
        let met = *met.lock().unwrap();
        (outcome, met)
    };
    // The fault shows up to 9; 10 fixes it.
    let (outcome, met) = run(|i| if i <= 9 { fault("gather") } else { clean() });
    assert_eq!(outcome.end, SearchEnd::Found(oid(10)));
    assert_eq!(met, Some(true), "the old end ran alone");
    let first = &outcome.probes[0];
    assert_eq!(
        (first.commit.as_str(), first.role, first.verdict),
        (
            oid(0).to_string().as_str(),
            ProbeRole::GoodEndpoint,
            Verdict::Good
        )
    );
    // A new end that still shows the fault refuses the range, checked beside the first cuts.
    let (outcome, _) = run(|_| fault("gather"));
    assert!(
        matches!(
            &outcome.end,
            SearchEnd::EndpointsInvalid(EndpointProblem::FaultNotGone { new, .. }) if new == "new"
        ),
        "{:?}",
        outcome.end
    );
    // An old end that runs clean has no fault to find the fix of, beside others or alone.
    let (outcome, _) = run(|_| clean());
    assert!(
        matches!(
            &outcome.end,
            SearchEnd::EndpointsInvalid(EndpointProblem::FaultNotAtOld { old, .. }) if old == "old"
        ),
        "{:?}",
        outcome.end
    );
}

/// `n` stop flags that live as long as the test.
fn stop_flags(n: usize) -> Vec<&'static AtomicBool> {
    (0..n)
        .map(|_| &*Box::leak(Box::new(AtomicBool::new(false))))
        .collect()
}

/// The search over commits 1..=16 (good end 0, bad end 16, `class+kernel`), one worker per prober, each
/// with its stop flag; the outcome and the events.
fn search_16<P: Probe>(
    probers: &mut [P],
    stops: &[&'static AtomicBool],
    cancel: &'static AtomicBool,
    sharing: Sharing,
) -> (cudabisect::run::search::SearchOutcome, Vec<Event>) {
    let range = linear(16);
    let goods = vec![("v1".to_string(), oid(0))];
    let policy = MatchPolicy::parse("class+kernel").unwrap();
    let input = SearchInput {
        sharing,
        ..plain_input(&range, &goods, &policy)
    };
    let mut events = Events::default();
    let mut workers: Vec<Worker> = probers
        .iter_mut()
        .zip(stops)
        .map(|(p, &stop)| Worker { probe: p, stop })
        .collect();
    let outcome = search_with_workers(&input, &mut workers, &mut events, cancel);
    (outcome, events.0)
}

/// A worker on a GPU shared with the others: it notes whether each probe was
/// crowded, and can run out of memory at one commit whenever others share the GPU.
struct OnSharedGpu {
    inner: Scripted,
    /// Every worker's probes: (probe number, commit, crowded).
    crowded: &'static Mutex<Vec<(usize, usize, bool)>>,
    oom_when_crowded: Oom,
    /// Probes started since the gauge started, and a wake-up for the bad end.
    watched: &'static (Mutex<usize>, Condvar),
    workers: usize,
    /// Whether the commit that runs out of memory (`Oom::At`) has given its first answer, and a wake-up
    /// for the probes after the first round, which wait for it: otherwise, on a loaded machine, they
    /// could settle the range before that answer came, and the run would never meet the out-of-memory
    /// the test is about.
    oom_answered: &'static (Mutex<bool>, Condvar),
}

impl Probe for OnSharedGpu {
    fn probe(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        let (lock, cv) = self.watched;
        *lock.lock().unwrap() += 1;
        cv.notify_all();
        if ctx.role == ProbeRole::BadEndpoint && ctx.crowded {
            // The first round's probes all start before the bad end ends, as real ones do (bounded: a
            // round that never comes leaves the reading short, and the test's assertions fail).
            let _ = cv
                .wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(10), |n| {
                    *n < self.workers
                })
                .unwrap();
        }
        let (answered, told) = self.oom_answered;
        if let Oom::At(i) = self.oom_when_crowded {
            if i != index(commit) && ctx.step > self.workers {
                let _ = told
                    .wait_timeout_while(answered.lock().unwrap(), Duration::from_secs(10), |a| !*a)
                    .unwrap();
            }
        }
        self.crowded
            .lock()
            .unwrap()
            .push((ctx.step, index(commit), ctx.crowded));
        let mut out = self.inner.probe(commit, ctx, target, reporter);
        let oom = match self.oom_when_crowded {
            Oom::Never => false,
            Oom::At(i) => i == index(commit),
            Oom::FirstRound => ctx.step <= self.workers,
        };
        if ctx.crowded && oom {
            out.record.signature = Signature::new(
                FaultClass::OutOfMemory,
                "torch.OutOfMemoryError: CUDA out of memory",
            );
        }
        if oom {
            *answered.lock().unwrap() = true;
            told.notify_all();
        }
        out
    }

    fn sanitize(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        self.inner.sanitize(commit, ctx, reporter)
    }

    fn shared_gpu(&self) -> Option<String> {
        Some("0".into())
    }
}

/// A stand-in for the driver's memory readings of a whole GPU: every probe uses the same memory at the
/// same time, so the reading is the baseline and one probe's use times the probes started since the
/// gauge started (no more than the workers); it counts how often it was started.
#[derive(Debug)]
struct FixedGauge {
    /// One probe alone.
    reading: Option<MemoryReading>,
    started: AtomicUsize,
    watched: &'static (Mutex<usize>, Condvar),
    /// Workers there are: no more probes than they run at once.
    workers: usize,
}

impl MemoryGauge for FixedGauge {
    fn start(&self, devices: &str) {
        assert_eq!(devices, "0");
        self.started.fetch_add(1, Ordering::SeqCst);
        *self.watched.0.lock().unwrap() = 0;
    }
    fn stop(&self) -> Option<MemoryReading> {
        // A worker whose probe ended may start another while the watched one runs: it replaces one.
        let probes = (*self.watched.0.lock().unwrap()).clamp(1, self.workers) as u64;
        // A GPU holds no more than it has.
        self.reading.map(|r| MemoryReading {
            peak_mib: (r.before_mib + (r.peak_mib - r.before_mib) * probes).min(r.total_mib),
            ..r
        })
    }
}

struct SharedRun {
    /// What the GPU holds at once for the stages after the search.
    at_once: usize,
    end: SearchEnd,
    events: Vec<Event>,
    crowded: Vec<(usize, bool)>,
    gauge_started: usize,
    probes: Vec<ProbeRecord>,
}

/// Three workers on GPU 0; the fault shows from commit 11 of 16; `peak_mib` is what the measured probe
/// used of a 140 GiB GPU.
/// Which crowded probes run out of memory.
#[derive(Clone, Copy)]
enum Oom {
    Never,
    /// Those of one commit.
    At(usize),
    /// Those of the first round (numbered up to the workers).
    FirstRound,
}

fn on_one_gpu(peak_mib: u64, oom_when_crowded: Option<usize>) -> SharedRun {
    let oom = oom_when_crowded.map_or(Oom::Never, Oom::At);
    on_one_gpu_with(peak_mib, oom, false, 3)
}

/// [`on_one_gpu`] with `workers`; with `hang_below_8`, a probe of a commit below 8 runs until the driver
/// stops it.
fn on_one_gpu_with(
    peak_mib: u64,
    oom_when_crowded: Oom,
    hang_below_8: bool,
    workers: usize,
) -> SharedRun {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let log: &'static Mutex<Vec<(usize, usize, bool)>> =
        Box::leak(Box::new(Mutex::new(Vec::new())));
    let watched: &'static (Mutex<usize>, Condvar) =
        Box::leak(Box::new((Mutex::new(0), Condvar::new())));
    let oom_answered: &'static (Mutex<bool>, Condvar) =
        Box::leak(Box::new((Mutex::new(false), Condvar::new())));
    let stops = stop_flags(workers);
    let gauge: &'static FixedGauge = Box::leak(Box::new(FixedGauge {
        watched,
        workers,
        reading: Some(MemoryReading {
            before_mib: 400,
            peak_mib,
            total_mib: 143_771,
        }),
        started: AtomicUsize::new(0),
    }));
    let mut probers: Vec<OnSharedGpu> = stops
        .iter()
        .map(|&stop| OnSharedGpu {
            inner: scripted(cancel, hang_below_8.then_some((8, stop))),
            crowded: log,
            oom_when_crowded,
            watched,
            workers,
            oom_answered,
        })
        .collect();
    // The plan had eight places; the search used three workers.
    let sharing = Sharing {
        gauge,
        asked: false,
        places: 8,
    };
    let (outcome, events) = search_16(&mut probers, &stops, cancel, sharing);
    SharedRun {
        at_once: outcome.at_once,
        end: outcome.end,
        events,
        crowded: {
            // In the order the driver handed them out (threads start them in any order).
            let mut log = log.lock().unwrap().clone();
            log.sort();
            log.into_iter().map(|(_, i, c)| (i, c)).collect()
        },
        gauge_started: gauge.started.load(Ordering::SeqCst),
        probes: outcome.probes,
    }
}

fn probes_at_once(events: &[Event]) -> Vec<(usize, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ProbesAtOnce { probes, reason, .. } => Some((*probes, reason.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn workers_on_one_gpu_probe_at_once_as_far_as_the_measured_memory_allows() {
    // A 2 GiB probe on a 140 GiB GPU: all three at once after the bad end, measured once.
    let run = on_one_gpu(2_448, None);
    assert_eq!(run.end, SearchEnd::Found(oid(11)));
    assert_eq!(run.gauge_started, 1);
    let at_once = probes_at_once(&run.events);
    assert_eq!(at_once.len(), 1, "{at_once:?}");
    assert_eq!(at_once[0].0, 3);
    assert_eq!(
        run.at_once, 8,
        "the stages after the search may use every place planned that the GPU holds"
    );
    assert!(
        at_once[0].1.contains("peaked at 2.0 GiB"),
        "{}",
        at_once[0].1
    );
    // The first round, the bad end's measurement shared among its three probes: the bad end, the good
    // end and the midpoint; the rounds after it at three too, the range cut in three (a probe below 11
    // and above 8, which plain bisection towards commit 11 runs one at a time).
    let all = &run.crowded;
    let mut first_round = all[..3].to_vec();
    first_round.sort();
    assert_eq!(first_round, [(0, true), (8, true), (16, true)], "{all:?}");
    assert!(all[3..].iter().all(|&(_, c)| c), "{all:?}");
}

#[test]
fn a_probe_too_large_to_share_its_gpu_keeps_one_probe_at_a_time() {
    // A 120 GiB probe (a stand-in GPU where three fit): the first round's three at once (a clean one's
    // worker taking the next pick while the bad end runs), then one at a time, said.
    let run = on_one_gpu(120_000, None);
    assert_eq!(run.end, SearchEnd::Found(oid(11)));
    let at_once = probes_at_once(&run.events);
    assert_eq!(at_once.len(), 1, "{at_once:?}");
    assert_eq!(at_once[0].0, 1);
    assert!(at_once[0].1.contains("peaked at 116.8 GiB"), "{at_once:?}");
    assert_eq!(run.at_once, 1);
    let before_measured = run.crowded.iter().take_while(|&&(_, c)| c).count();
    assert!(before_measured >= 3, "{:?}", run.crowded);
    let after = &run.crowded[before_measured..];
    assert!(
        !after.is_empty() && after.iter().all(|&(_, c)| !c),
        "{:?}",
        run.crowded
    );
}

#[test]
fn a_crowded_probe_that_runs_out_of_memory_drops_to_one_at_a_time_and_runs_again_alone() {
    // Commit 8 runs out of memory whenever others share the GPU; alone it runs clean as its neighbours do.
    let run = on_one_gpu(2_448, Some(8));
    assert_eq!(run.end, SearchEnd::Found(oid(11)));
    // 8 ran crowded (the first round: the bad end, the good end and 8); once the fallback came, no probe
    // was crowded again, and 8, when it still mattered, ran again alone.
    let all = &run.crowded;
    assert!(all[..3].contains(&(16, true)), "{all:?}");
    assert!(all[..3].contains(&(8, true)), "{all:?}");
    if let Some(alone) = all[1..].iter().position(|&(_, c)| !c) {
        assert!(all[1 + alone..].iter().all(|&(_, c)| !c), "{all:?}");
    }
    let at_once = probes_at_once(&run.events);
    assert_eq!(at_once.last().unwrap().0, 1, "{at_once:?}");
    assert_eq!(
        run.at_once, 1,
        "no stage shares the GPU after an out-of-memory"
    );
    assert!(
        at_once.last().unwrap().1.contains("ran out of memory"),
        "{at_once:?}"
    );
    // The crowded run of 12 is no fact: not recorded; 12 is not judged out of memory.
    assert!(run
        .probes
        .iter()
        .all(|r| r.signature.class != FaultClass::OutOfMemory));
}

/// A worker that notes each probe it starts; the probe of the end that opens the first round (the bad
/// end; finding a fix, the old end) waits (bounded) until every other worker has started one, so a driver
/// that ran that end alone fails.
struct MeetsAtOpening {
    inner: Scripted,
    me: usize,
    /// The role of the end that opens the round.
    opening: ProbeRole,
    /// Probes started so far, and a wake-up for the bad end.
    started: &'static (Mutex<usize>, Condvar),
    workers: usize,
    /// Each probe's number, worker and commit; and whether the bad end met every worker.
    steps: &'static Mutex<Vec<(usize, usize, usize)>>,
    met: &'static Mutex<Option<bool>>,
}

impl Probe for MeetsAtOpening {
    fn probe(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        self.steps
            .lock()
            .unwrap()
            .push((ctx.step, self.me, index(commit)));
        let (lock, cv) = self.started;
        *lock.lock().unwrap() += 1;
        cv.notify_all();
        if ctx.role == self.opening {
            // Noted, not asserted: a panic on a worker's thread would leave the driver waiting for it.
            let (n, _) = cv
                .wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(10), |n| {
                    *n < self.workers
                })
                .unwrap();
            *self.met.lock().unwrap() = Some(*n >= self.workers);
        }
        self.inner.probe(commit, ctx, target, reporter)
    }

    fn sanitize(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        self.inner.sanitize(commit, ctx, reporter)
    }
}

/// Three workers whose first round meets at the bad end.
fn meeting_search(
    workers: usize,
    cancel: &'static AtomicBool,
) -> (
    cudabisect::run::search::SearchOutcome,
    Vec<(usize, usize, usize)>,
    Option<bool>,
) {
    let started: &'static (Mutex<usize>, Condvar) =
        Box::leak(Box::new((Mutex::new(0), Condvar::new())));
    let steps: &'static Mutex<Vec<(usize, usize, usize)>> =
        Box::leak(Box::new(Mutex::new(Vec::new())));
    let met: &'static Mutex<Option<bool>> = Box::leak(Box::new(Mutex::new(None)));
    let stops = stop_flags(workers);
    let mut probers: Vec<MeetsAtOpening> = (0..workers)
        .map(|me| MeetsAtOpening {
            inner: scripted(cancel, None),
            me,
            opening: ProbeRole::BadEndpoint,
            started,
            workers,
            steps,
            met,
        })
        .collect();
    let (outcome, _) = search_16(&mut probers, &stops, cancel, Sharing::NONE);
    let steps = steps.lock().unwrap().clone();
    let met = *met.lock().unwrap();
    (outcome, steps, met)
}

#[test]
fn the_bad_end_runs_in_the_first_round_beside_the_good_end_and_the_first_cuts() {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let (outcome, steps, met) = meeting_search(3, cancel);
    assert_eq!(outcome.end, SearchEnd::Found(oid(11)));
    // The bad end (commit 16) is probe 1, on the first worker; the others started theirs while it ran.
    let mut steps = steps;
    steps.sort();
    assert_eq!(steps[0], (1, 0, 16), "{steps:?}");
    assert_eq!(met, Some(true), "the bad end ran alone: {steps:?}");
    // The first round (probes 1 to 3) ran on all three workers: the bad end, the good end and one cut
    // of the range (not the tip: it is the bad end).
    let mut first_round: Vec<(usize, usize, usize)> =
        steps.iter().copied().filter(|s| s.0 <= 3).collect();
    first_round.sort();
    let mut workers: Vec<usize> = first_round.iter().map(|s| s.1).collect();
    workers.sort();
    assert_eq!(workers, [0, 1, 2], "{first_round:?}");
    let commits: Vec<usize> = first_round.iter().map(|s| s.2).collect();
    assert!(commits.contains(&0), "{first_round:?}");
    assert_eq!(
        commits.iter().filter(|&&c| c != 0 && c != 16).count(),
        1,
        "{first_round:?}"
    );
    // Every probe was judged once the target was known: the answer is the serial one's.
    let probes = &outcome.probes;
    let bad_first = probes.iter().position(|r| r.role == ProbeRole::BadEndpoint);
    assert_eq!(bad_first, Some(0), "the bad end's record comes first");
}

#[test]
fn one_worker_runs_the_bad_end_alone_first() {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let (outcome, mut steps, met) = meeting_search(1, cancel);
    steps.sort();
    assert_eq!(outcome.end, SearchEnd::Found(oid(11)));
    assert_eq!(steps[0], (1, 0, 16), "{steps:?}");
    assert_eq!(met, Some(true));
    // The good end next, alone, then the bisection, one probe at a time.
    assert_eq!(steps[1], (2, 0, 0), "{steps:?}");
}

/// A worker whose probe of the good end (commit 0) waits until some worker has started a search probe:
/// a driver that ran the good end before the search's first round would never let it end (the wait is
/// bounded, and fails the test).
struct GoodEndWaits {
    inner: Scripted,
    gate: &'static (Mutex<bool>, Condvar),
}

impl Probe for GoodEndWaits {
    fn probe(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        let (lock, cv) = self.gate;
        if ctx.role == ProbeRole::Search {
            *lock.lock().unwrap() = true;
            cv.notify_all();
        }
        if ctx.role == ProbeRole::GoodEndpoint {
            let started = lock.lock().unwrap();
            let (started, waited) = cv
                .wait_timeout_while(started, Duration::from_secs(20), |s| !*s)
                .unwrap();
            assert!(
                *started && !waited.timed_out(),
                "the good end ran before any search probe started"
            );
        }
        self.inner.probe(commit, ctx, target, reporter)
    }

    fn sanitize(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        self.inner.sanitize(commit, ctx, reporter)
    }
}

fn first_round_with_the_good_end(good_faults: bool) -> (SearchEnd, Vec<ProbeRecord>) {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let gate: &'static (Mutex<bool>, Condvar) =
        Box::leak(Box::new((Mutex::new(false), Condvar::new())));
    let stops = stop_flags(3);
    let mut probers: Vec<GoodEndWaits> = (0..3)
        .map(|_| {
            let mut inner = scripted(cancel, None);
            if good_faults {
                inner.shows = Box::new(|i| {
                    if i >= 11 || i == 0 {
                        fault("gather")
                    } else {
                        clean()
                    }
                });
            }
            GoodEndWaits { inner, gate }
        })
        .collect();
    let (outcome, _) = search_16(&mut probers, &stops, cancel, Sharing::NONE);
    (outcome.end, outcome.probes)
}

#[test]
fn the_good_end_runs_in_the_first_round_beside_the_search() {
    let (end, probes) = first_round_with_the_good_end(false);
    assert_eq!(end, SearchEnd::Found(oid(11)));
    assert_eq!(
        probes[0].role,
        ProbeRole::BadEndpoint,
        "the bad end is judged first"
    );
    assert!(probes
        .iter()
        .any(|p| p.role == ProbeRole::GoodEndpoint && p.verdict == Verdict::Good));
}

#[test]
fn a_good_end_that_fails_in_the_first_round_refuses_the_range_and_names_no_commit() {
    let (end, probes) = first_round_with_the_good_end(true);
    assert!(
        matches!(
            &end,
            SearchEnd::EndpointsInvalid(cudabisect::run::search::EndpointProblem::GoodDoesNotPass { what, .. })
                if what == "good commit v1"
        ),
        "{end:?}"
    );
    // The search's first probes ran beside it (the good end's probe waited for one to start); whether
    // one was judged before the refusal depends on when it landed, and no answer came of them.
    let _ = probes;
}

/// A worker whose probe of the bad end waits (bounded) until some worker has started a probe handed out
/// after the first round (or, with `or_round_in`, until every other probe of the round has returned): a
/// driver that gives no worker anything new before the bad end is settled never lets it end before the
/// bound, and the test says so.
struct BadEndWaits {
    inner: Scripted,
    workers: usize,
    or_round_in: bool,
    /// Whether a probe after the first round started, how many of the round's other probes returned; a
    /// wake-up for the bad end.
    round: &'static (Mutex<(bool, usize)>, Condvar),
    /// Whether the bad end saw a later probe start before it ended.
    met: &'static Mutex<Option<bool>>,
}

impl Probe for BadEndWaits {
    fn probe(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        let (lock, cv) = self.round;
        if ctx.step > self.workers {
            lock.lock().unwrap().0 = true;
            cv.notify_all();
        }
        let first_round = ctx.step <= self.workers;
        if ctx.role == ProbeRole::BadEndpoint && ctx.repeat.is_none() {
            let others = if self.or_round_in {
                self.workers - 1
            } else {
                usize::MAX
            };
            // Noted, not asserted: a panic on a worker's thread would leave the driver waiting for it.
            let (round, _) = cv
                .wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(10), |r| {
                    !r.0 && r.1 < others
                })
                .unwrap();
            *self.met.lock().unwrap() = Some(round.0);
        }
        let out = self.inner.probe(commit, ctx, target, reporter);
        if first_round && ctx.role != ProbeRole::BadEndpoint {
            lock.lock().unwrap().1 += 1;
            cv.notify_all();
        }
        out
    }

    fn sanitize(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        self.inner.sanitize(commit, ctx, reporter)
    }
}

/// `workers` workers over 16 commits of `history` whose bad end waits as [`BadEndWaits`] says; the
/// outcome, and whether the bad end saw a later probe start.
fn bad_end_waiting(
    (shows, kernels): History,
    workers: usize,
    or_round_in: bool,
) -> (cudabisect::run::search::SearchOutcome, Option<bool>) {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let round: &'static (Mutex<(bool, usize)>, Condvar) =
        Box::leak(Box::new((Mutex::new((false, 0)), Condvar::new())));
    let met: &'static Mutex<Option<bool>> = Box::leak(Box::new(Mutex::new(None)));
    let stops = stop_flags(workers);
    let mut probers: Vec<BadEndWaits> = (0..workers)
        .map(|_| {
            let mut inner = scripted(cancel, None);
            inner.shows = Box::new(shows);
            inner.kernels =
                kernels.map(|k| Box::new(k) as Box<dyn Fn(usize) -> Option<String> + Send>);
            BadEndWaits {
                inner,
                workers,
                or_round_in,
                round,
                met,
            }
        })
        .collect();
    let (outcome, _) = search_16(&mut probers, &stops, cancel, Sharing::NONE);
    let met = *met.lock().unwrap();
    (outcome, met)
}

#[test]
fn a_clean_probe_of_the_first_round_frees_its_worker_for_the_next_pick_while_the_bad_end_runs() {
    let (outcome, met) = bad_end_waiting(
        (|i| if i >= 11 { fault("gather") } else { clean() }, None),
        3,
        false,
    );
    assert_eq!(
        met,
        Some(true),
        "no probe started before the bad end was settled"
    );
    assert_eq!(outcome.end, SearchEnd::Found(oid(11)));
    // Records still come in the serial order: the bad end first, and every commit judged once.
    assert_eq!(outcome.probes[0].role, ProbeRole::BadEndpoint);
    let mut judged: Vec<&str> = outcome
        .probes
        .iter()
        .filter(|r| r.role == ProbeRole::Search)
        .map(|r| r.commit.as_str())
        .collect();
    let all = judged.len();
    judged.sort();
    judged.dedup();
    assert_eq!(judged.len(), all, "{:?}", outcome.probes);
}

#[test]
fn a_range_its_bad_end_refuses_judges_none_of_the_probes_that_ran_beside_it() {
    // Every commit runs clean: the round's clean probes freed their workers while the bad end ran, and
    // the bad end then refused the range.
    let (outcome, met) = bad_end_waiting((|_| clean(), None), 3, false);
    assert_eq!(met, Some(true));
    assert!(
        matches!(
            &outcome.end,
            SearchEnd::EndpointsInvalid(EndpointProblem::BadDoesNotReproduce { .. })
        ),
        "{:?}",
        outcome.end
    );
    assert!(
        outcome
            .probes
            .iter()
            .all(|p| p.role == ProbeRole::BadEndpoint),
        "{:?}",
        outcome.probes
    );
}

#[test]
fn a_crowded_probe_the_search_stopped_itself_keeps_the_gpu_shared() {
    // The first round's probe below the midpoint runs until the answers above it make it moot; the
    // driver stops it, and that kill is not the crowd's doing.
    let run = on_one_gpu_with(2_448, Oom::Never, true, 4);
    assert_eq!(run.end, SearchEnd::Found(oid(11)));
    let at_once = probes_at_once(&run.events);
    assert_eq!(at_once.len(), 1, "{at_once:?}");
    assert_eq!(at_once[0].0, 4);
    assert!(run
        .events
        .iter()
        .any(|e| matches!(e, Event::ProbeAbandoned { .. })));
}

#[test]
fn ctrl_c_during_the_good_end_in_the_first_round_ends_the_search_interrupted() {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let stops = stop_flags(3);
    // Ctrl-C comes while the good end runs: it is stopped, never run again, and no answer is given.
    let mut probers: Vec<Scripted> = (0..3)
        .map(|_| {
            let mut p = scripted(cancel, None);
            p.interrupt_at = Some(0);
            p
        })
        .collect();
    let (outcome, _) = search_16(&mut probers, &stops, cancel, Sharing::NONE);
    assert_eq!(outcome.end, SearchEnd::Interrupted);
    let good_runs: usize = probers
        .iter()
        .map(|p| p.asked.iter().filter(|(i, _)| *i == 0).count())
        .sum();
    assert_eq!(good_runs, 1);
}

/// A model `a, b, c` whose node `b` writes just past a buffer: the harness's own process maps the memory
/// there, so a plain run is clean; under memcheck (`memcheck`), `b` shows an out-of-bounds write in
/// `kernel`. `sanitizer`: whether a memchecked harness can be had.
struct OverrunHarness {
    memcheck: bool,
    sanitizer: bool,
    kernel: &'static str,
    runs: Arc<AtomicUsize>,
}

impl HarnessClient for OverrunHarness {
    fn describe(&self, _: &AtomicBool) -> Result<Description, ProtocolError> {
        Ok(Description {
            protocol: PROTOCOL_VERSION,
            harness: Some("fake".into()),
            graph: None,
            nodes: ["a", "b", "c"].into_iter().map(node).collect(),
        })
    }

    fn run(&self, request: &RunRequest, _: &AtomicBool) -> Result<RunOutput, ProtocolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let m = |n: &str, phase: &str| format!("@@cudabisect node={n} op=op kernel=k {phase}\n");
        let keep: Vec<String> = request.keep.map_or_else(
            || ["a", "b", "c"].map(String::from).to_vec(),
            <[String]>::to_vec,
        );
        let mut text = String::new();
        for n in &keep {
            text += &m(n, "begin");
            if n == "b" && self.memcheck {
                text += &format!(
                    "========= Invalid __global__ write of size 16 bytes\n=========     at {}+0x1d0\n=========     by thread (0,0,0) in block (3,0,0)\n=========     Address 0x7f0000810000 is out of bounds\n=========\nRuntimeError: CUDA error: unspecified launch failure\n========= ERROR SUMMARY: 1 error\n",
                    self.kernel
                );
                return Ok(out(1, text));
            }
            text += &m(n, "end");
        }
        Ok(out(0, text))
    }

    fn memchecked(&self, as_class: FaultClass) -> Option<Box<dyn HarnessClient + '_>> {
        assert_eq!(as_class, FaultClass::IllegalAddress, "the target's class");
        self.sanitizer.then(|| {
            Box::new(OverrunHarness {
                memcheck: true,
                sanitizer: true,
                kernel: self.kernel,
                runs: self.runs.clone(),
            }) as Box<dyn HarnessClient>
        })
    }

    fn judge(&self, run: &RunOutput) -> Option<cudabisect::classify::Signature> {
        self.memcheck.then(|| {
            cudabisect::protocol::memcheck::memcheck_signature(run, FaultClass::IllegalAddress)
        })
    }

    fn extract(
        &self,
        _: &[String],
        _: &Path,
        _: &Path,
        _: &AtomicBool,
    ) -> Result<(), ProtocolError> {
        Ok(())
    }

    fn reproduce_line(&self, _: Option<&Path>, keep: &[String], _: &Path) -> String {
        format!(
            "{}{}",
            if self.memcheck { "memcheck " } else { "" },
            keep.join(",")
        )
    }
}

fn shrink_overrun(
    sanitizer: bool,
    kernel: &'static str,
) -> (cudabisect::report::record::ShrinkReport, Events) {
    let h = OverrunHarness {
        memcheck: false,
        sanitizer,
        kernel,
        runs: Arc::new(AtomicUsize::new(0)),
    };
    let dir = tempfile::tempdir().unwrap();
    let policy = MatchPolicy::parse("class+kernel").unwrap();
    let mut target = fault("_overrun");
    target.launch = Some("pkg/launch.py:2".into());
    let settings = ShrinkSettings {
        policy: &policy,
        out_dir: dir.path().join("shrink"),
        target: Some(target),
        attempts: 2,
        confirm: 3,
        confirm_jobs: 1,
        parent_beside: None,
    };
    let mut events = Events::default();
    let r = shrink(&h, &settings, &mut events, &AtomicBool::new(false));
    assert_eq!(
        r.harness_runs,
        h.runs.load(Ordering::SeqCst),
        "every run counted"
    );
    (r, events)
}

#[test]
fn an_overrun_the_harness_process_hides_is_shrunk_under_memcheck_and_says_so() {
    let (r, events) = shrink_overrun(true, "_overrun");
    assert_eq!(r.status, ShrinkStatus::Minimal, "{}", r.summary);
    let kept: Vec<&str> = r.kept.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(kept, ["b"]);
    assert_eq!(r.confirmation.as_ref().map(|c| c.reproduced), Some(3));
    let why = r.memcheck.as_deref().unwrap_or_default();
    assert!(
        why.starts_with("the harness's full run showed none"),
        "{why}"
    );
    assert_eq!(
        r.reproduce.as_deref(),
        Some("memcheck b"),
        "the line runs it under memcheck"
    );
    assert!(events
        .0
        .iter()
        .any(|e| matches!(e, Event::ShrinkUnderMemcheck { .. })));
}

#[test]
fn under_memcheck_another_kernels_overrun_is_another_bug_and_no_sanitizer_means_no_fallback() {
    let (r, _) = shrink_overrun(true, "_other");
    assert_eq!(r.status, ShrinkStatus::NotReproduced, "{}", r.summary);
    assert!(r.kept.is_empty() && r.memcheck.is_none());
    assert!(
        r.summary
            .contains("under compute-sanitizer's memcheck too: illegal_address"),
        "{}",
        r.summary
    );
    assert!(r.summary.contains("_other"), "{}", r.summary);
    let (r, events) = shrink_overrun(false, "_overrun");
    assert_eq!(r.status, ShrinkStatus::NotReproduced, "{}", r.summary);
    assert!(
        r.summary.starts_with("the harness's full run showed none"),
        "{}",
        r.summary
    );
    assert!(!events
        .0
        .iter()
        .any(|e| matches!(e, Event::ShrinkUnderMemcheck { .. })));
}

/// A scripted history: what the repro shows at each commit, and what the sanitizer names there.
type History = (fn(usize) -> Signature, Option<fn(usize) -> Option<String>>);

/// The search's end over 16 commits with `workers` workers, each a scripted prober of `history`; with
/// `hang`, each probe of a commit below 8 runs until the driver stops it. Also whether every worker that
/// probed a hanging commit was told to stop.
fn search_with(
    history: History,
    workers: usize,
    hang: bool,
) -> (SearchEnd, Vec<ProbeRecord>, bool) {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let stops = stop_flags(workers);
    let (shows, kernels) = history;
    let mut probers: Vec<Scripted> = stops
        .iter()
        .map(|&stop| Scripted {
            shows: Box::new(shows),
            kernels: kernels.map(|k| Box::new(k) as Box<dyn Fn(usize) -> Option<String> + Send>),
            sanitized: vec![],
            interrupt_at: None,
            cancel,
            asked: vec![],
            hang_below: hang.then_some((8, stop)),
            workers: vec![],
            hangs_stopped: 0,
        })
        .collect();
    let (outcome, _) = search_16(&mut probers, &stops, cancel, Sharing::NONE);
    // Every probe of a commit below 8 ended by a stop (the worker may have taken another probe since).
    let hung_stopped = probers.iter().all(|p| {
        p.hangs_stopped
            == p.asked
                .iter()
                .filter(|&&(i, _)| (1..8).contains(&i))
                .count()
    });
    (outcome.end, outcome.probes, hung_stopped)
}

/// Histories the one-worker and the four-worker search must answer alike: the fault from 11 of 16;
/// another bug below it; a build break; a target whose kernel only the sanitizer names, with a
/// lookalike of another kernel below it; a bad end that does not reproduce; a good end that faults; a
/// bad end the host cannot judge.
fn histories() -> Vec<(&'static str, History)> {
    vec![
        (
            "plain",
            (|i| if i >= 11 { fault("gather") } else { clean() }, None),
        ),
        (
            "another bug below",
            (
                |i| match i {
                    4..=6 => fault("scatter"),
                    i if i >= 11 => fault("gather"),
                    _ => clean(),
                },
                None,
            ),
        ),
        (
            "a build break",
            (
                |i| match i {
                    9..=12 => Signature::new(FaultClass::BuildFailure, "build failed"),
                    i if i >= 11 => fault("gather"),
                    _ => clean(),
                },
                None,
            ),
        ),
        (
            "kernel named by the sanitizer only",
            (
                |i| match i {
                    4..=9 => anonymous("pkg/model.py:forward"),
                    i if i >= 13 => anonymous("pkg/model.py:forward"),
                    _ => clean(),
                },
                Some(|i| match i {
                    4..=9 => Some("_bias_gelu_kernel".to_string()),
                    i if i >= 13 => Some("_hash_embed_kernel".to_string()),
                    _ => None,
                }),
            ),
        ),
        ("bad end clean", (|_| clean(), None)),
        ("good end faults", (|_| fault("gather"), None)),
        (
            "bad end unjudgeable",
            (|i| if i == 16 { no_device() } else { clean() }, None),
        ),
    ]
}

#[test]
fn the_first_round_beside_the_bad_end_gives_the_serial_answer_in_every_history() {
    for (name, history) in histories() {
        let (serial, serial_probes, _) = search_with(history, 1, false);
        let (parallel, probes, _) = search_with(history, 4, false);
        assert_eq!(parallel, serial, "{name}: {probes:?}");
        // The bad end is judged before any other probe, whatever order the round landed in.
        assert_eq!(probes[0].role, ProbeRole::BadEndpoint, "{name}");
        assert_eq!(serial_probes[0].role, ProbeRole::BadEndpoint, "{name}");
        // A range its bad end refuses keeps no probe judged against a target it never had.
        if matches!(&serial, SearchEnd::EndpointsInvalid(m) if m.to_string().contains("bad commit"))
            || matches!(serial, SearchEnd::EndpointInfra(_))
        {
            assert!(
                probes.iter().all(|p| p.role == ProbeRole::BadEndpoint),
                "{name}: {probes:?}"
            );
        }
    }
}

#[test]
fn a_bad_end_that_lands_after_its_round_gives_the_serial_answer_in_every_history() {
    for (name, history) in histories() {
        let (serial, _, _) = search_with(history, 1, false);
        let (outcome, _) = bad_end_waiting(history, 4, true);
        assert_eq!(outcome.end, serial, "{name}: {:?}", outcome.probes);
        assert_eq!(outcome.probes[0].role, ProbeRole::BadEndpoint, "{name}");
        if matches!(&serial, SearchEnd::EndpointsInvalid(m) if m.to_string().contains("bad commit"))
            || matches!(serial, SearchEnd::EndpointInfra(_))
        {
            assert!(
                outcome
                    .probes
                    .iter()
                    .all(|p| p.role == ProbeRole::BadEndpoint),
                "{name}: {:?}",
                outcome.probes
            );
        }
    }
}

#[test]
fn a_range_refused_by_its_bad_end_stops_the_first_round_and_judges_none_of_it() {
    let history: History = (|_| clean(), None);
    let (end, probes, hung_stopped) = search_with(history, 4, true);
    assert!(
        matches!(&end, SearchEnd::EndpointsInvalid(m) if m.to_string().contains("bad commit main does not reproduce")),
        "{end:?}"
    );
    // The round's probes below 8 ran until stopped: the refusal stopped them, and judged none.
    assert!(hung_stopped, "a probe of the first round was left running");
    assert!(
        probes.iter().all(|p| p.role == ProbeRole::BadEndpoint),
        "{probes:?}"
    );
}

#[test]
fn a_bad_end_crowded_out_of_memory_in_the_first_round_runs_again_alone_once_the_round_is_in() {
    let run = on_one_gpu(2_448, Some(16));
    assert_eq!(run.end, SearchEnd::Found(oid(11)), "{:?}", run.probes);
    let all = &run.crowded;
    assert_eq!(all[0], (16, true), "{all:?}");
    // Run again alone, after the round's other probes (the good end, the midpoint, and what a clean
    // one's worker took next) were in: every probe handed out before it ran crowded.
    let again = all[1..]
        .iter()
        .position(|&c| c == (16, false))
        .map(|p| p + 1);
    let again = again.unwrap_or_else(|| panic!("{all:?}"));
    assert!(again >= 3, "{all:?}");
    assert!(all[..again].iter().all(|&(_, c)| c), "{all:?}");
    // The round was measured (2 GiB a probe, the GPU far from full): a probe crowded out in the first
    // round, sent before any limit was known, leaves the measured limit as it is.
    assert_eq!(probes_at_once(&run.events).last().unwrap().0, 3);
    // The out-of-memory run is no fact: the bad end's record is the run alone.
    let bad: Vec<&ProbeRecord> = run
        .probes
        .iter()
        .filter(|r| r.role == ProbeRole::BadEndpoint)
        .collect();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].verdict, Verdict::Bad);
}

#[test]
fn a_first_round_too_wide_for_the_gpu_falls_back_to_what_one_probe_alone_measures_not_to_one() {
    // 48 GiB a probe: the first round's three fill the 140 GiB GPU and run out of memory; that reading
    // says nothing of one probe. The bad end runs again alone and is measured: two fit at once.
    let run = on_one_gpu_with(400 + 49_152, Oom::FirstRound, false, 3);
    assert_eq!(run.end, SearchEnd::Found(oid(11)), "{:?}", run.probes);
    let at_once = probes_at_once(&run.events);
    assert_eq!(at_once.len(), 1, "{at_once:?}");
    assert_eq!(at_once[0].0, 2, "{at_once:?}");
    assert!(
        at_once[0]
            .1
            .contains("a probe run alone peaked at 48.0 GiB"),
        "{at_once:?}"
    );
    assert_eq!(run.gauge_started, 2, "the round, then the bad end alone");
    // The first round all crowded; the bad end next, alone; then the search two at a time.
    let all = &run.crowded;
    assert!(all[..3].iter().all(|&(_, c)| c), "{all:?}");
    assert_eq!(all[3], (16, false), "{all:?}");
    assert!(all[4..].iter().any(|&(_, c)| c), "{all:?}");
    assert!(run
        .probes
        .iter()
        .all(|r| r.signature.class != FaultClass::OutOfMemory));
}

/// A scripted worker over two kernels launched through one wrapper: the other bug's lookalikes at
/// `lookalikes`, the target from `target_from` on; the sanitizer names the kernel of each.
fn two_stacks(
    cancel: &'static AtomicBool,
    lookalikes: std::ops::RangeInclusive<usize>,
    target_from: usize,
) -> Scripted {
    let gelu = "pkg/ops.py:14 in bias_gelu: run(_bias_gelu_kernel, (blocks,), x, out, n)";
    let embed = "pkg/embed.py:14 in hash_embed: run(_hash_embed_kernel, (blocks,), x, out, n)";
    let mut inner = scripted(cancel, None);
    let other = lookalikes.clone();
    inner.shows = Box::new(move |i| {
        if lookalikes.contains(&i) {
            through_wrapper(gelu)
        } else if i >= target_from {
            through_wrapper(embed)
        } else {
            clean()
        }
    });
    inner.kernels = Some(Box::new(move |i| {
        if other.contains(&i) {
            Some("_bias_gelu_kernel".to_string())
        } else {
            (i >= target_from).then(|| "_hash_embed_kernel".to_string())
        }
    }));
    inner
}

/// A scripted worker whose bad end ends only once the round's other probes have (bounded), so the whole
/// first round lands before the bad end is settled and is judged at once.
struct RoundFirst {
    inner: Scripted,
    done: &'static (Mutex<usize>, Condvar),
    others: usize,
}

impl Probe for RoundFirst {
    fn probe(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        let (lock, cv) = self.done;
        if ctx.role == ProbeRole::BadEndpoint {
            // Noted, not asserted: a panic on a worker's thread would leave the driver waiting for it.
            let _ = cv
                .wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(10), |n| {
                    *n < self.others
                })
                .unwrap();
            return self.inner.probe(commit, ctx, target, reporter);
        }
        let out = self.inner.probe(commit, ctx, target, reporter);
        *lock.lock().unwrap() += 1;
        cv.notify_all();
        out
    }

    fn sanitize(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        self.inner.sanitize(commit, ctx, reporter)
    }
}

#[test]
fn lookalikes_that_land_together_wait_for_one_sanitizer_run_of_their_stack() {
    // Eight workers: the first round's cuts meet lookalikes of one stack (commits 4..=9, the other
    // kernel), all judged together once the bad end is settled. One sanitizer run settles their stack;
    // the others wait for it, on their workers, instead of each paying its own.
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let done: &'static (Mutex<usize>, Condvar) =
        Box::leak(Box::new((Mutex::new(0), Condvar::new())));
    let stops = stop_flags(8);
    let mut probers: Vec<RoundFirst> = (0..8)
        .map(|_| RoundFirst {
            inner: two_stacks(cancel, 4..=9, 13),
            done,
            others: 7,
        })
        .collect();
    let (outcome, _) = search_16(&mut probers, &stops, cancel, Sharing::NONE);
    assert_eq!(
        outcome.end,
        SearchEnd::Found(oid(13)),
        "{:?}",
        outcome.probes
    );
    // The round held at least two lookalikes (its cuts split 16 commits in seven).
    let asked: Vec<usize> = probers
        .iter()
        .flat_map(|p| p.inner.asked.iter().map(|&(i, _)| i))
        .collect();
    assert!(
        asked.iter().filter(|i| (4..=9).contains(*i)).count() >= 2,
        "{asked:?}"
    );
    let gelu_runs: usize = probers
        .iter()
        .map(|p| {
            p.inner
                .sanitized
                .iter()
                .filter(|i| (4..=9).contains(*i))
                .count()
        })
        .sum();
    assert_eq!(gelu_runs, 1, "{:#?}", outcome.probes);
}

/// A scripted worker whose sanitizer runs of the lookalike commits (3..=6) last until the driver stops
/// them, and then say so.
struct SanitizerRunsLong {
    inner: Scripted,
    stop: &'static AtomicBool,
}

impl Probe for SanitizerRunsLong {
    fn probe(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        self.inner.probe(commit, ctx, target, reporter)
    }

    fn sanitize(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        let i = index(commit);
        if !(3..=6).contains(&i) {
            return self.inner.sanitize(commit, ctx, reporter);
        }
        self.inner.sanitized.push(i);
        // Bounded, so a driver that never stops it fails the test instead of hanging it.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !self.stop.load(Ordering::SeqCst) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(
                !left.is_zero(),
                "the sanitizer run of {i} was never stopped"
            );
            std::thread::park_timeout(left);
        }
        Some(Sanitized {
            finding: None,
            summary: "interrupted".into(),
            duration_s: 0.0,
            interrupted: true,
        })
    }
}

#[test]
fn a_probe_whose_sanitizer_run_was_stopped_is_abandoned_never_judged_without_its_kernel() {
    // Lookalikes of another stack at 3..=6 need a sanitizer run (one for their stack, the others wait
    // for it); it outlasts the search, which answers with the workers left and stops it. Such a probe
    // says nothing: it is not recorded.
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let stops = stop_flags(4);
    let mut probers: Vec<SanitizerRunsLong> = stops
        .iter()
        .map(|&stop| SanitizerRunsLong {
            inner: two_stacks(cancel, 3..=6, 11),
            stop,
        })
        .collect();
    let (outcome, events) = search_16(&mut probers, &stops, cancel, Sharing::NONE);
    assert_eq!(
        outcome.end,
        SearchEnd::Found(oid(11)),
        "{:?}",
        outcome.probes
    );
    let stopped: Vec<usize> = probers
        .iter()
        .flat_map(|p| p.inner.sanitized.iter().copied())
        .filter(|i| (3..=6).contains(i))
        .collect();
    assert!(!stopped.is_empty(), "no lookalike needed a sanitizer run");
    for i in &stopped {
        let commit = oid(*i).to_string();
        assert!(
            outcome.probes.iter().all(|r| r.commit != commit),
            "{i} was judged: {:?}",
            outcome.probes
        );
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Event::ProbeAbandoned { commit: c, .. } if *c == commit)),
            "{i} was not said to be abandoned"
        );
    }
}

/// A worker whose cross-check runs wait (bounded) until as many as `meet` are in flight at once, and note
/// the most they saw.
struct Meeting {
    inner: Scripted,
    in_flight: &'static (Mutex<(usize, usize)>, Condvar),
    meet: usize,
}

impl Probe for Meeting {
    fn probe(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        let (lock, cv) = self.in_flight;
        {
            let mut seen = lock.lock().unwrap();
            seen.0 += 1;
            seen.1 = seen.1.max(seen.0);
            cv.notify_all();
            // Bounded: runs made one after another never meet, and the assertions on the count fail.
            let (mut seen, _) = cv
                .wait_timeout_while(seen, Duration::from_secs(10), |s| s.1 < self.meet)
                .unwrap();
            seen.0 -= 1;
        }
        self.inner.probe(commit, ctx, target, reporter)
    }

    fn sanitize(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        self.inner.sanitize(commit, ctx, reporter)
    }
}

/// The cross-check of an answer at commit 11 (its parent 10 clean) on `probers`, numbered from `step`:
/// what it said, its records and its events.
fn cross_check_of_11(
    probers: Vec<&mut dyn Probe>,
    step: usize,
) -> (
    cudabisect::run::cross_check::CrossCheck,
    Vec<ProbeRecord>,
    Vec<Event>,
) {
    use cudabisect::run::cross_check::{cross_check, Expect};
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let stops = stop_flags(probers.len());
    let mut workers: Vec<Worker> = probers
        .into_iter()
        .zip(stops)
        .map(|(probe, stop)| Worker { probe, stop })
        .collect();
    let policy = MatchPolicy::parse("class+kernel").unwrap();
    let range = linear(12);
    let goods = vec![("v1".to_string(), oid(0))];
    let input = SearchInput {
        steps_before: step - 1,
        ..plain_input(&range, &goods, &policy)
    };
    let runs = [
        Expect {
            oid: oid(11),
            verdict: Verdict::Bad,
            what: "the first bad commit",
        },
        Expect {
            oid: oid(10),
            verdict: Verdict::Good,
            what: "its parent",
        },
    ];
    let mut events = Events::default();
    let checked = cross_check(
        &mut workers,
        &runs,
        &fault("gather"),
        &input,
        &mut events,
        cancel,
    );
    (checked.said, checked.probes, events.0)
}

#[test]
fn the_cross_check_runs_the_first_bad_commit_and_its_parent_side_by_side_on_two_workers() {
    use cudabisect::run::cross_check::CrossCheck;
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let check = |meet: usize, two: bool| {
        let in_flight: &'static _ = Box::leak(Box::new((Mutex::new((0, 0)), Condvar::new())));
        let worker = || Meeting {
            inner: scripted(cancel, None),
            in_flight,
            meet,
        };
        let (mut first, mut second) = (worker(), worker());
        let mut probers: Vec<&mut dyn Probe> = vec![&mut first];
        if two {
            probers.push(&mut second);
        }
        let (said, probes, events) = cross_check_of_11(probers, 7);
        let most = in_flight.0.lock().unwrap().1;
        (said, probes, events, most)
    };
    let (said, probes, events, most) = check(2, true);
    assert_eq!(said, CrossCheck::Agrees);
    assert_eq!(most, 2, "the two runs were not in flight together");
    // Recorded in the order of the runs, numbered on from the search, whichever ended first.
    let recorded: Vec<_> = probes
        .iter()
        .map(|p| (index(Oid::from_str(&p.commit).unwrap()), p.role, p.verdict))
        .collect();
    assert_eq!(
        recorded,
        [
            (11, ProbeRole::Verify, Verdict::Bad),
            (10, ProbeRole::Verify, Verdict::Good)
        ]
    );
    // Said as they land.
    let mut finished: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            Event::ProbeFinished { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    finished.sort();
    assert_eq!(finished, [7, 8]);
    // One worker: one run after the other, the same records.
    let (said, alone, _, most) = check(1, false);
    assert_eq!((said, most), (CrossCheck::Agrees, 1));
    let verdicts = |p: &[ProbeRecord]| {
        p.iter()
            .map(|r| (r.commit.clone(), r.verdict))
            .collect::<Vec<_>>()
    };
    assert_eq!(verdicts(&alone), verdicts(&probes));
}

/// A prober on GPU 0, which another worker shares: commit 10 runs out of memory when it runs beside
/// another probe there. Each run's commit and whether it ran crowded are noted.
struct TightGpu {
    inner: Scripted,
    runs: &'static Mutex<Vec<(usize, bool)>>,
}

impl Probe for TightGpu {
    fn probe(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        self.runs.lock().unwrap().push((index(commit), ctx.crowded));
        let mut out = self.inner.probe(commit, ctx, target, reporter);
        if ctx.crowded && index(commit) == 10 {
            out.record.signature = Signature::new(
                FaultClass::OutOfMemory,
                "torch.OutOfMemoryError: CUDA out of memory",
            );
        }
        out
    }

    fn sanitize(
        &mut self,
        commit: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        self.inner.sanitize(commit, ctx, reporter)
    }

    fn shared_gpu(&self) -> Option<String> {
        Some("0".into())
    }
}

#[test]
fn a_cross_check_run_crowded_out_beside_the_other_runs_again_alone_instead_of_disagreeing() {
    use cudabisect::run::cross_check::CrossCheck;
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let runs: &'static _ = Box::leak(Box::new(Mutex::new(Vec::new())));
    let mut workers: Vec<TightGpu> = (0..2)
        .map(|_| TightGpu {
            inner: scripted(cancel, None),
            runs,
        })
        .collect();
    let probers: Vec<&mut dyn Probe> = workers.iter_mut().map(|w| w as &mut dyn Probe).collect();
    let (said, probes, events) = cross_check_of_11(probers, 5);
    assert_eq!(said, CrossCheck::Agrees);
    let mut ran = runs.lock().unwrap().clone();
    ran[..2].sort();
    // Side by side first; the parent, out of memory there, again alone.
    assert_eq!(ran, [(10, true), (11, true), (10, false)]);
    let recorded: Vec<_> = probes
        .iter()
        .map(|p| (index(Oid::from_str(&p.commit).unwrap()), p.verdict))
        .collect();
    assert_eq!(recorded, [(11, Verdict::Bad), (10, Verdict::Good)]);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::ProbesAtOnce { probes: 1, .. })));
}

#[test]
fn a_parent_that_faults_beside_the_first_bad_commit_is_a_disagreement_named_after_it() {
    use cudabisect::run::cross_check::CrossCheck;
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    // The search said 11 (its parent 10 clean); run again, 10 faults too.
    let mut workers: Vec<Scripted> = (0..2)
        .map(|_| Scripted {
            shows: Box::new(|i| if i >= 10 { fault("gather") } else { clean() }),
            ..scripted(cancel, None)
        })
        .collect();
    let probers: Vec<&mut dyn Probe> = workers.iter_mut().map(|w| w as &mut dyn Probe).collect();
    let (said, probes, _) = cross_check_of_11(probers, 3);
    let CrossCheck::Disagrees(why) = said else {
        panic!("{said:?}")
    };
    assert!(why.starts_with("its parent 000000000000"), "{why}");
    assert!(why.contains("shows the fault"), "{why}");
    assert_eq!(probes.len(), 2);
}
