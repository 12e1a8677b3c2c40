//! The journal step: the journal of earlier runs that this run reuses, opened before the search, and
//! what the run says of it once it has announced itself.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::host::environment;
use crate::report::event::Event;
use crate::run::journal::{self, Journal};
use crate::run::plan::{Plan, StartOptions};

/// The journal a `start` run begins with, and what the run says of it once it has announced itself.
pub(super) struct StartJournal {
    /// The journal (the search takes it).
    pub(super) journal: Journal,
    /// Where it is.
    pub(super) path: PathBuf,
    /// The fingerprint of what judges a probe.
    pub(super) fingerprint: String,
    /// Its warnings and what it lets the run reuse, in order.
    pub(super) said: Vec<Event>,
}

/// The journal of earlier runs killed before they finished, whose probes this run reuses (none with
/// `--fresh`; one that cannot be used is said, and the run journals nothing).
pub(super) fn open_for_start(
    plan: &Plan,
    opts: &StartOptions,
    state_dir: &Path,
    cancel: &AtomicBool,
) -> StartJournal {
    let path = opts
        .journal
        .clone()
        .unwrap_or_else(|| journal::journal_path(state_dir));
    let fingerprint = journal::fingerprint(
        &plan.config.text,
        &journal::outside_programs(&plan.config, &plan.repo.workdir()),
        &environment::fingerprint(cancel),
    );
    let opened = if opts.fresh {
        Ok((Journal::empty(&path, &fingerprint), Vec::new()))
    } else {
        Journal::open(&path, &fingerprint)
    };
    let mut said = Vec::new();
    let journal = match opened {
        Ok((journal, warnings)) => {
            said.extend(
                warnings
                    .into_iter()
                    .map(|message| Event::Warning { message }),
            );
            let commits: std::collections::HashSet<String> = plan
                .range
                .iter()
                .map(|c| c.oid.to_string())
                .chain(std::iter::once(plan.bad.1.to_string()))
                .chain(plan.goods.iter().map(|g| g.1.to_string()))
                .chain(plan.merge_bases.iter().map(|o| o.to_string()))
                .collect();
            let (reusable, retried) = (journal.reusable_among(&commits), journal.retried());
            if reusable > 0 || retried > 0 {
                said.push(Event::Resumed { reusable, retried });
            }
            journal
        }
        Err(e) => {
            said.push(Event::Warning {
                message: format!(
                    "{}: the probe journal cannot be used ({e}); this run starts from scratch and journals nothing",
                    path.display()
                ),
            });
            Journal::off(&fingerprint)
        }
    };
    StartJournal {
        journal,
        path,
        fingerprint,
        said,
    }
}
