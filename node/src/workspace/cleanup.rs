//! Request-owned cleanup: the node's only state in a workspace is
//! `<root>/.iop/job/<request_id>`; cleaning a request removes that tree and
//! nothing else. User files are never touched.
//!
//! The tree is first inventoried without following anything (every entry
//! `lstat`-ed relative to its parent's handle). Symlinks, special files and
//! entries on another device are refused and left in place (counted, never
//! named). The rest is removed deepest-first, without recursion: before each
//! removal the entry is looked up again and must still be the one the
//! inventory saw (an entry replaced meanwhile is refused). A directory that
//! still holds a refused entry stays. Concurrent and later callers for the
//! same request get the same cached outcome ([`CleanupCache`]).

// `st_dev`/`st_ino` are u64 on Linux but not on every Unix (macOS: i32 dev).
#![allow(clippy::unnecessary_cast)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;

use super::files::open_dir;

/// Where the node keeps per-request state, below the workspace root.
pub const JOB_DIR: [&str; 2] = [".iop", "job"];
/// Outcomes kept for late callers.
pub const CACHE_CAPACITY: usize = 1024;

/// Why an entry was left in place (closed; counted, never named).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refused {
    Symlink,
    SpecialFile,
    ForeignDevice,
    /// Not what the inventory saw by the time it was to be removed.
    Replaced,
    /// A directory that still holds a refused entry.
    NotEmpty,
}

impl Refused {
    pub fn label(self) -> &'static str {
        match self {
            Self::Symlink => "symlink",
            Self::SpecialFile => "special_file",
            Self::ForeignDevice => "foreign_device",
            Self::Replaced => "replaced",
            Self::NotEmpty => "not_empty",
        }
    }
}

/// What a cleanup did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CleanupOutcome {
    /// The request had no state.
    NothingToClean,
    /// Everything removed.
    Cleaned { removed: u64 },
    /// Some entries refused and left in place.
    Partial { removed: u64, refused: BTreeMap<Refused, u64> },
    /// The request id is not one the node could have created.
    InvalidRequestId,
    /// The state directory itself could not be opened safely (a link where
    /// `.iop`, `job` or the request's directory should be, or an I/O error).
    Failed,
}

impl CleanupOutcome {
    pub fn label(&self) -> &'static str {
        match self {
            Self::NothingToClean => "nothing_to_clean",
            Self::Cleaned { .. } => "cleaned",
            Self::Partial { .. } => "partial",
            Self::InvalidRequestId => "invalid_request_id",
            Self::Failed => "failed",
        }
    }
}

fn valid_request_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// One inventoried entry: its parent's index (`None`: the request's
/// directory), name, identity and whether it is a directory.
struct Entry {
    parent: Option<usize>,
    name: String,
    identity: Identity,
    dir: bool,
}

/// What "the same entry" means: device and inode, and for a file its
/// change time too, because a file replaced under the same name often gets
/// the inode number just freed. (A directory's change time moves as its own
/// entries are removed, so it is not part of a directory's identity.)
type Identity = (u64, u64, i64, i64);

fn identity(stat: &rustix::fs::Stat) -> Identity {
    let (dev, ino) = (stat.st_dev as u64, stat.st_ino as u64);
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => (dev, ino, 0, 0),
        _ => (dev, ino, stat.st_ctime as i64, stat.st_ctime_nsec as i64),
    }
}

/// Creates `<root>/.iop/job/<request_id>` (and the two directories above it
/// when missing), each relative to its parent's handle and never through a
/// link: a request's state exists only where [`clean`] will find it.
pub fn create(root: &File, request_id: &str) -> Result<(), Errno> {
    if !valid_request_id(request_id) {
        return Err(Errno::INVAL);
    }
    let root_dev = rustix::fs::fstat(root)?.st_dev;
    let mut dir = open_dir(root, ".")?;
    for name in JOB_DIR.iter().copied().chain([request_id]) {
        match rustix::fs::mkdirat(&dir, name, rustix::fs::Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e),
        }
        dir = open_dir(&dir, name)?;
        if rustix::fs::fstat(&dir)?.st_dev != root_dev {
            return Err(Errno::XDEV);
        }
    }
    Ok(())
}

/// Removes `<root>/.iop/job/<request_id>`.
pub fn clean(root: &File, request_id: &str) -> CleanupOutcome {
    clean_with(root, request_id, &|| {})
}

/// [`clean`] with `between` called after the inventory, before removal
/// (tests race it there).
pub(crate) fn clean_with(root: &File, request_id: &str, between: &dyn Fn()) -> CleanupOutcome {
    if !valid_request_id(request_id) {
        return CleanupOutcome::InvalidRequestId;
    }
    let Ok(root_stat) = rustix::fs::fstat(root) else { return CleanupOutcome::Failed };
    let mut dir = match open_dir(root, ".") {
        Ok(dir) => dir,
        Err(_) => return CleanupOutcome::Failed,
    };
    for name in JOB_DIR.iter().copied().chain([request_id]) {
        dir = match open_dir(&dir, name) {
            Ok(next) => next,
            Err(Errno::NOENT) => return CleanupOutcome::NothingToClean,
            Err(_) => return CleanupOutcome::Failed,
        };
        match rustix::fs::fstat(&dir) {
            Ok(stat) if stat.st_dev == root_stat.st_dev => {}
            _ => return CleanupOutcome::Failed,
        }
    }
    let request_dir = dir;

    // Inventory, breadth-first over handles (no recursion, no following).
    let mut entries: Vec<Entry> = Vec::new();
    let mut refused: BTreeMap<Refused, u64> = BTreeMap::new();
    let mut queue: VecDeque<(Option<usize>, OwnedFd)> = VecDeque::from([(None, request_dir)]);
    let mut handles: HashMap<Option<usize>, OwnedFd> = HashMap::new();
    while let Some((index, fd)) = queue.pop_front() {
        let Ok(listing) = rustix::fs::Dir::read_from(&fd) else {
            *refused.entry(Refused::NotEmpty).or_default() += 1;
            continue;
        };
        for item in listing.flatten() {
            let Ok(name) = item.file_name().to_str().map(str::to_string) else {
                *refused.entry(Refused::SpecialFile).or_default() += 1;
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let Ok(stat) = rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) else { continue };
            let kind = FileType::from_raw_mode(stat.st_mode);
            let why = match kind {
                _ if stat.st_dev != root_stat.st_dev => Some(Refused::ForeignDevice),
                FileType::Symlink => Some(Refused::Symlink),
                FileType::RegularFile | FileType::Directory => None,
                _ => Some(Refused::SpecialFile),
            };
            if let Some(why) = why {
                *refused.entry(why).or_default() += 1;
                continue;
            }
            let dir = kind == FileType::Directory;
            entries.push(Entry { parent: index, name: name.clone(), identity: identity(&stat), dir });
            if dir {
                match open_dir(&fd, &name) {
                    Ok(child) => queue.push_back((Some(entries.len() - 1), child)),
                    Err(_) => *refused.entry(Refused::Replaced).or_default() += 1,
                }
            }
        }
        handles.insert(index, fd);
    }

    between();
    // Deepest first: entries were found breadth-first, so reverse order
    // removes every child before its parent.
    let mut removed = 0u64;
    for entry in entries.iter().rev() {
        let Some(parent) = handles.get(&entry.parent) else { continue };
        let same = rustix::fs::statat(parent, entry.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| identity(&s) == entry.identity);
        if !same {
            *refused.entry(Refused::Replaced).or_default() += 1;
            continue;
        }
        let flags = if entry.dir { AtFlags::REMOVEDIR } else { AtFlags::empty() };
        match rustix::fs::unlinkat(parent, entry.name.as_str(), flags) {
            Ok(()) => removed += 1,
            Err(Errno::NOTEMPTY) => *refused.entry(Refused::NotEmpty).or_default() += 1,
            Err(_) => *refused.entry(Refused::Replaced).or_default() += 1,
        }
    }
    // Finally the request's own directory, when nothing was left in it.
    drop(handles);
    let Ok(job) = open_dir(root, ".").and_then(|d| open_dir(&d, JOB_DIR[0])).and_then(|d| open_dir(&d, JOB_DIR[1]))
    else {
        return CleanupOutcome::Failed;
    };
    if refused.is_empty() {
        match rustix::fs::unlinkat(&job, request_id, AtFlags::REMOVEDIR) {
            Ok(()) => return CleanupOutcome::Cleaned { removed: removed + 1 },
            Err(Errno::NOTEMPTY) => *refused.entry(Refused::NotEmpty).or_default() += 1,
            Err(_) => *refused.entry(Refused::Replaced).or_default() += 1,
        }
    }
    CleanupOutcome::Partial { removed, refused }
}

/// One outcome per request for concurrent and late callers, bounded to the
/// [`CACHE_CAPACITY`] most recent requests.
#[derive(Default)]
pub struct CleanupCache {
    state: Mutex<CacheState>,
}

/// The outcome cell of each request, and the requests oldest first.
#[derive(Default)]
struct CacheState {
    cells: HashMap<String, Arc<tokio::sync::OnceCell<CleanupOutcome>>>,
    order: VecDeque<String>,
}

impl CleanupCache {
    /// Whether `request_id` was cleaned (or is being cleaned).
    pub fn seen(&self, request_id: &str) -> bool {
        self.state.lock().unwrap().cells.contains_key(request_id)
    }

    /// Cleans `request_id` once (on a blocking thread); every caller gets
    /// that cleanup's outcome.
    pub async fn clean(&self, root: &File, request_id: &str) -> CleanupOutcome {
        let cell = {
            let mut guard = self.state.lock().unwrap();
            let CacheState { cells, order } = &mut *guard;
            if !cells.contains_key(request_id) {
                if order.len() >= CACHE_CAPACITY
                    && let Some(oldest) = order.pop_front()
                {
                    cells.remove(&oldest);
                }
                order.push_back(request_id.to_string());
            }
            cells.entry(request_id.to_string()).or_default().clone()
        };
        cell.get_or_init(|| async {
            let Ok(root) = root.try_clone() else { return CleanupOutcome::Failed };
            let id = request_id.to_string();
            tokio::task::spawn_blocking(move || clean(&root, &id)).await.unwrap_or(CleanupOutcome::Failed)
        })
        .await
        .clone()
    }
}

#[cfg(test)]
mod tests;
