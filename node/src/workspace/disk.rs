//! A command's disk budget: how much its workspace root may grow while it
//! runs (`CommandLimits::max_disk_bytes`). The node measures the root
//! itself, beneath its held handle, because no process limit can: a
//! command spreads its writes over as many files and processes as it likes
//! (`RLIMIT_FSIZE` bounds one file).
//!
//! [`usage`] walks the tree without following a link (`openat` with
//! `O_NOFOLLOW` one component at a time, as the file tools do), adding up
//! allocated blocks (`st_blocks`, so a sparse file counts what it really
//! takes). The reserved `.iop` is the node's and is left out. The walk is
//! bounded: at most [`MAX_DEPTH`] directories deep (a deeper tree cannot
//! be measured, and counts as over any budget: nothing real is that deep)
//! and [`MAX_ENTRIES`] entries (past that the count stops, and the budget
//! is checked on what was counted).
//!
//! [`Watch`] measures the root once before the command starts and again
//! while it runs, each walk after ten times the last one's duration (at
//! least [`MIN_INTERVAL`]), so a large tree costs at most a tenth of a core.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

use super::files::is_reserved;

/// Deepest directory the walk enters.
pub const MAX_DEPTH: usize = 256;
/// Most entries one walk looks at.
pub const MAX_ENTRIES: u64 = 2_000_000;
/// Shortest time between two walks of a running command's root.
pub const MIN_INTERVAL: Duration = Duration::from_millis(250);

/// What one walk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    /// Bytes allocated beneath the root (its `.iop` left out).
    pub bytes: u64,
    /// The tree goes deeper than [`MAX_DEPTH`].
    pub too_deep: bool,
}

/// Walks the tree beneath `root`.
pub fn usage(root: &File) -> DiskUsage {
    let mut found = DiskUsage { bytes: 0, too_deep: false };
    let mut entries = 0;
    // Each level holds its directory's handle and the names still to
    // visit in it: the depth, not the width, bounds the handles held.
    let Ok(top) = rustix::fs::openat(root, ".", dir_flags(), Mode::empty()) else { return found };
    let mut stack: Vec<(OwnedFd, Vec<std::ffi::CString>)> = Vec::new();
    let names = children(&top, true, &mut found, &mut entries);
    stack.push((top, names));
    while let Some((dir, pending)) = stack.last_mut() {
        let Some(name) = pending.pop() else {
            stack.pop();
            continue;
        };
        let child = rustix::fs::openat(&*dir, name.as_c_str(), dir_flags(), Mode::empty());
        if stack.len() > MAX_DEPTH {
            found.too_deep = true;
            break;
        }
        let Ok(child) = child else { continue };
        let names = children(&child, false, &mut found, &mut entries);
        stack.push((child, names));
        if entries >= MAX_ENTRIES {
            break;
        }
    }
    found
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Adds up the entries of `dir` (not following links); the names of its
/// subdirectories.
fn children(dir: &impl AsFd, top: bool, found: &mut DiskUsage, entries: &mut u64) -> Vec<std::ffi::CString> {
    let mut subdirectories = Vec::new();
    let Ok(listing) = Dir::read_from(dir) else { return subdirectories };
    for entry in listing.flatten() {
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        if top && name.to_str().is_ok_and(is_reserved) {
            continue;
        }
        *entries += 1;
        if *entries > MAX_ENTRIES {
            break;
        }
        let Ok(stat) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else { continue };
        found.bytes = found.bytes.saturating_add((stat.st_blocks as u64).saturating_mul(512));
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            subdirectories.push(name.to_owned());
        }
    }
    subdirectories
}

/// A running command's root, measured against its budget.
pub struct Watch {
    root: File,
    baseline: u64,
    budget: u64,
    first: Duration,
}

impl Watch {
    /// Measures the root before the command starts.
    pub async fn start(root: &File, budget: u64) -> std::io::Result<Self> {
        let (baseline, took) = measure(root.try_clone()?).await?;
        Ok(Self { root: root.try_clone()?, baseline: baseline.bytes, budget, first: interval(took) })
    }

    /// Returns once the root has grown past the budget (never otherwise).
    pub async fn exceeded(&self) {
        let mut next = self.first;
        loop {
            tokio::time::sleep(next).await;
            let Ok(root) = self.root.try_clone() else { return std::future::pending().await };
            let Ok((now, took)) = measure(root).await else { return std::future::pending().await };
            if over(self.baseline, now, self.budget) {
                return;
            }
            next = interval(took);
        }
    }

    /// Whether the root grew past the budget by the time the command
    /// ended (its last writes may come after the last walk).
    pub async fn finally_exceeded(&self) -> bool {
        let Ok(root) = self.root.try_clone() else { return false };
        measure(root).await.is_ok_and(|(now, _)| over(self.baseline, now, self.budget))
    }
}

/// Whether `now` is past `budget` bytes more than `baseline`.
fn over(baseline: u64, now: DiskUsage, budget: u64) -> bool {
    now.too_deep || now.bytes.saturating_sub(baseline) > budget
}

fn interval(took: Duration) -> Duration {
    (took * 10).max(MIN_INTERVAL)
}

/// One walk, off the async threads.
async fn measure(root: File) -> std::io::Result<(DiskUsage, Duration)> {
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let found = usage(&root);
        (found, started.elapsed())
    })
    .await
    .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests;
