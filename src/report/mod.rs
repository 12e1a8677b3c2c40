//! Records and their rendering: the typed records a run produces, the event stream, the human and JSON
//! reporters, JUnit XML, a run's log (human or `git bisect replay`), the hand-off bundle, its packed
//! archive and the environment it describes.

pub mod bundle;
pub mod environment;
pub mod event;
pub mod human;
pub mod json;
pub mod junit;
pub mod log;
pub mod pack;
pub mod record;
