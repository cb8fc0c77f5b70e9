//! One line of `iop-node doctor`'s report ([`Check`], its [`Level`]) and the
//! fix text every check that needs a fresh bundle names. A module of its
//! own, below the report and the checks (`cert`, `edge`) that make lines.

use std::fmt;

pub use crate::transport::refusal::BUNDLE_SOURCES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    Warn,
    Fail,
    /// Not checked: it needs something an earlier check found missing.
    Skip,
}

impl Level {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub name: String,
    pub level: Level,
    pub detail: String,
    /// What to do about a WARN or FAIL.
    pub fix: Option<String>,
}

impl Check {
    pub(super) fn ok(name: &str, detail: impl Into<String>) -> Self {
        Self { name: name.into(), level: Level::Ok, detail: detail.into(), fix: None }
    }
    pub(super) fn warn(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name: name.into(), level: Level::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }
    pub(super) fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name: name.into(), level: Level::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
    pub(super) fn skip(name: &str, detail: impl Into<String>) -> Self {
        Self { name: name.into(), level: Level::Skip, detail: detail.into(), fix: None }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<4}  {:<15} {}", self.level.label(), self.name, self.detail)?;
        match &self.fix {
            Some(fix) => write!(f, ". Fix: {fix}"),
            None => Ok(()),
        }
    }
}
