//! The file executor: `read`, `list`, `write` and `delete` beneath an
//! accepted workspace's held root handle, never outside it.
//!
//! Every path is relative to the root and checked before anything is
//! touched ([`RelPath`]): not absolute, no NUL, no empty, `.` or `..`
//! component, no over-long name, not the reserved `.iop` at the root. It is
//! then resolved one component at a time from the root handle with
//! `O_NOFOLLOW | O_DIRECTORY` (a symlink anywhere on the path fails with
//! `ELOOP`), checking each directory's device (no mount point is crossed).
//! On Linux `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`
//! does the same in the kernel first; the walk is the portable path and the
//! fallback where `openat2` is unavailable. The final entry is opened or
//! changed relative to its parent's handle with `O_NOFOLLOW`; FIFOs,
//! sockets and devices are refused (opened `O_NONBLOCK`, so a FIFO cannot
//! block the executor). Before an operation takes effect the parent is
//! resolved again and must still be the same directory, so a parent
//! swapped for a symlink (or moved away) meanwhile is refused.

// `st_dev`/`st_ino` are u64 on Linux but not on every Unix (macOS: i32 dev).
#![allow(clippy::unnecessary_cast)]

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Longest relative path and component accepted.
pub const MAX_PATH_BYTES: usize = 4096;
pub const MAX_NAME_BYTES: usize = 255;
/// The node's own state lives under `<root>/.iop`; no tool may touch it.
pub const RESERVED: &str = ".iop";

/// Whether a root entry's name is the reserved `.iop`, in any letter case:
/// on a case-insensitive file system (APFS by default) `.IOP` is `.iop`.
pub fn is_reserved(name: &str) -> bool {
    name.eq_ignore_ascii_case(RESERVED)
}

/// Why a file operation was refused or failed (closed; on the wire as a
/// `WorkspaceToolErrorCode`, whose label metrics and logs use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    #[error("invalid path: {0}")]
    InvalidPath(&'static str),
    #[error("the path is reserved for the node")]
    Reserved,
    #[error("not found")]
    NotFound,
    #[error("a symbolic link is on the path")]
    Symlink,
    #[error("the path crosses into another filesystem")]
    CrossDevice,
    #[error("a component of the path is not a directory")]
    NotADirectory,
    #[error("is a directory")]
    IsADirectory,
    #[error("not a regular file or directory")]
    SpecialFile,
    #[error("already exists")]
    Exists,
    #[error("the directory is not empty")]
    NotEmpty,
    #[error("the file is larger than the workspace allows")]
    TooLarge,
    #[error("a directory on the path changed during the operation")]
    ParentChanged,
    #[error("the operation failed")]
    Io,
}

impl FileError {
    fn of(errno: Errno) -> Self {
        match errno {
            Errno::NOENT => Self::NotFound,
            Errno::LOOP => Self::Symlink,
            Errno::XDEV => Self::CrossDevice,
            Errno::NOTDIR => Self::NotADirectory,
            Errno::ISDIR => Self::IsADirectory,
            Errno::EXIST => Self::Exists,
            Errno::NOTEMPTY => Self::NotEmpty,
            Errno::NAMETOOLONG => Self::InvalidPath("a name is too long"),
            _ => Self::Io,
        }
    }
}

/// A checked relative path: its directory components and final name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelPath {
    parents: Vec<String>,
    name: Option<String>,
}

impl RelPath {
    /// `""` is the root itself (for `list`).
    pub fn parse(path: &str) -> Result<Self, FileError> {
        if path.is_empty() {
            return Ok(Self { parents: Vec::new(), name: None });
        }
        if path.len() > MAX_PATH_BYTES {
            return Err(FileError::InvalidPath("the path is too long"));
        }
        if path.starts_with('/') {
            return Err(FileError::InvalidPath("the path must be relative to the workspace"));
        }
        if path.contains('\0') {
            return Err(FileError::InvalidPath("the path contains NUL"));
        }
        let mut parts: Vec<String> = Vec::new();
        for part in path.split('/') {
            match part {
                "" => return Err(FileError::InvalidPath("the path has an empty component")),
                "." | ".." => return Err(FileError::InvalidPath("the path has a `.` or `..` component")),
                p if p.len() > MAX_NAME_BYTES => return Err(FileError::InvalidPath("a name is too long")),
                p => parts.push(p.to_string()),
            }
        }
        if is_reserved(&parts[0]) {
            return Err(FileError::Reserved);
        }
        let name = parts.pop();
        Ok(Self { parents: parts, name })
    }
}

/// The bounds an operation runs with (the workspace's limits).
#[derive(Debug, Clone, Copy)]
pub struct FileLimits {
    pub max_file_bytes: u64,
    pub max_list_entries: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    pub data: Vec<u8>,
    /// The file goes on past what was returned.
    pub truncated: bool,
    pub size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    pub name: String,
    pub kind: EntryKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListResult {
    /// Sorted by name (bytewise).
    pub entries: Vec<ListEntry>,
    /// Pass as `after` for the next batch; `None` when this was the last.
    pub next: Option<String>,
}

/// The file operations of one accepted workspace.
pub struct Files<'a> {
    root: &'a File,
    /// The root's device: no entry an operation touches may be on another.
    dev: u64,
    limits: FileLimits,
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Opens directory `name` of `parent`, never through a link (`ELOOP`, or
/// `ENOTDIR` for a link with `O_DIRECTORY`).
pub(crate) fn open_dir(parent: &impl AsFd, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(parent, name, dir_flags(), Mode::empty())
}

impl<'a> Files<'a> {
    pub fn new(root: &'a File, limits: FileLimits) -> Result<Self, FileError> {
        let dev = rustix::fs::fstat(root).map_err(FileError::of)?.st_dev as u64;
        Ok(Self { root, dev, limits })
    }

    /// Up to `max` bytes (at most the file limit) from `offset`.
    pub fn read(&self, path: &str, offset: u64, max: u64) -> Result<ReadResult, FileError> {
        let rel = RelPath::parse(path)?;
        let name = rel.name.as_deref().ok_or(FileError::IsADirectory)?;
        let parent = self.resolve(&rel.parents)?;
        let fd = rustix::fs::openat(
            &parent,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(FileError::of)?;
        let stat = self.regular(&fd)?;
        self.unchanged(&rel.parents, &parent)?;
        let size = stat.st_size as u64;
        let max = max.min(self.limits.max_file_bytes);
        let mut file = File::from(fd);
        file.seek(SeekFrom::Start(offset)).map_err(|_| FileError::Io)?;
        let mut data = Vec::new();
        file.take(max).read_to_end(&mut data).map_err(|_| FileError::Io)?;
        let truncated = offset.saturating_add(data.len() as u64) < size;
        Ok(ReadResult { data, truncated, size })
    }

    /// The entries of directory `path` after `after`, at most the list limit.
    pub fn list(&self, path: &str, after: Option<&str>) -> Result<ListResult, FileError> {
        let rel = RelPath::parse(path)?;
        let mut parts = rel.parents.clone();
        parts.extend(rel.name.clone());
        let dir = self.resolve(&parts)?;
        let at_root = parts.is_empty();
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&dir).map_err(FileError::of)? {
            let entry = entry.map_err(FileError::of)?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            let Some(name) = name.to_str() else { continue };
            if name == "." || name == ".." || (at_root && is_reserved(name)) {
                continue;
            }
            if after.is_some_and(|a| name <= a) {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::RegularFile => EntryKind::File,
                FileType::Directory => EntryKind::Directory,
                FileType::Symlink => EntryKind::Symlink,
                _ => EntryKind::Other,
            };
            names.push(ListEntry { name: name.to_string(), kind });
        }
        names.sort_by(|a, b| a.name.cmp(&b.name));
        let max = self.limits.max_list_entries as usize;
        let next = (names.len() > max).then(|| names[max - 1].name.clone());
        names.truncate(max);
        Ok(ListResult { entries: names, next })
    }

    /// Writes `content` to `path` through a temporary file in the same
    /// directory and a rename; the parents must exist. With `create_only`,
    /// an existing entry is an error.
    pub fn write(&self, path: &str, content: &[u8], create_only: bool) -> Result<(), FileError> {
        self.write_with(path, content, create_only, &|| {})
    }

    pub(crate) fn write_with(
        &self,
        path: &str,
        content: &[u8],
        create_only: bool,
        before_commit: &dyn Fn(),
    ) -> Result<(), FileError> {
        if content.len() as u64 > self.limits.max_file_bytes {
            return Err(FileError::TooLarge);
        }
        let rel = RelPath::parse(path)?;
        let name = rel.name.as_deref().ok_or(FileError::IsADirectory)?;
        let parent = self.resolve(&rel.parents)?;
        // The file being replaced keeps its permission bits and owner: a
        // 0600 secret stays private, a script stays executable. Set-id and
        // sticky bits are not carried over to content the model wrote.
        let existing = match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) if create_only => return Err(FileError::Exists),
            Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                FileType::RegularFile => Some(stat),
                FileType::Directory => return Err(FileError::IsADirectory),
                FileType::Symlink => return Err(FileError::Symlink),
                _ => return Err(FileError::SpecialFile),
            },
            Err(Errno::NOENT) => None,
            Err(e) => return Err(FileError::of(e)),
        };
        let temp = format!(".iop-write-{:016x}", fastrand::u64(..));
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd =
            rustix::fs::openat(&parent, temp.as_str(), flags, Mode::from_raw_mode(0o644)).map_err(FileError::of)?;
        let discard = |e: FileError| {
            let _ = rustix::fs::unlinkat(&parent, temp.as_str(), AtFlags::empty());
            e
        };
        // The owner: the replaced file's, or a new file's directory's (a
        // node run as root writes files its commands, run as
        // `workspaces.command_user`, can change). Only root may give a file
        // away; for anyone else the owner is theirs already, so a refusal
        // changes nothing.
        if let Ok(owner) = existing.map_or_else(|| rustix::fs::fstat(&parent), Ok) {
            let _ = rustix::fs::fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(owner.st_uid)),
                Some(rustix::fs::Gid::from_raw(owner.st_gid)),
            );
        }
        if let Some(stat) = &existing {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode((stat.st_mode as u32 & 0o777) as _))
                .map_err(|_| discard(FileError::Io))?;
        }
        let mut file = File::from(fd);
        file.write_all(content).and_then(|()| file.sync_all()).map_err(|_| discard(FileError::Io))?;
        before_commit();
        self.unchanged(&rel.parents, &parent).map_err(discard)?;
        let renamed = if create_only {
            rustix::fs::renameat_with(&parent, temp.as_str(), &parent, name, rustix::fs::RenameFlags::NOREPLACE)
        } else {
            rustix::fs::renameat(&parent, temp.as_str(), &parent, name)
        };
        renamed.map_err(|e| discard(FileError::of(e)))
    }

    /// Removes a file or an empty directory; never recursive, never a link.
    pub fn delete(&self, path: &str) -> Result<(), FileError> {
        let rel = RelPath::parse(path)?;
        let name = rel.name.as_deref().ok_or(FileError::InvalidPath("the workspace root cannot be deleted"))?;
        let parent = self.resolve(&rel.parents)?;
        let stat = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW).map_err(FileError::of)?;
        let flags = match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => AtFlags::empty(),
            FileType::Directory => AtFlags::REMOVEDIR,
            FileType::Symlink => return Err(FileError::Symlink),
            _ => return Err(FileError::SpecialFile),
        };
        if stat.st_dev as u64 != self.dev {
            return Err(FileError::CrossDevice);
        }
        self.unchanged(&rel.parents, &parent)?;
        rustix::fs::unlinkat(&parent, name, flags).map_err(FileError::of)
    }

    /// The directory `parts` beneath the root, without following any link
    /// or crossing a mount.
    fn resolve(&self, parts: &[String]) -> Result<OwnedFd, FileError> {
        #[cfg(target_os = "linux")]
        if !parts.is_empty() {
            use rustix::fs::ResolveFlags;
            let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV;
            match rustix::fs::openat2(self.root, parts.join("/").as_str(), dir_flags(), Mode::empty(), resolve) {
                Ok(fd) => return Ok(fd),
                // No openat2 (old kernel, seccomp): the walk below. A
                // trailing link with O_DIRECTORY is ENOTDIR: the walk tells
                // a link from a file.
                Err(Errno::NOSYS | Errno::PERM | Errno::NOTDIR) => {}
                Err(e) => return Err(FileError::of(e)),
            }
        }
        self.walk(parts)
    }

    /// The portable resolution: one `O_NOFOLLOW | O_DIRECTORY` open per
    /// component, each on the same device as the root.
    pub(crate) fn walk(&self, parts: &[String]) -> Result<OwnedFd, FileError> {
        let mut current = open_dir(self.root, ".").map_err(FileError::of)?;
        for part in parts {
            let next = match open_dir(&current, part) {
                Ok(next) => next,
                // O_DIRECTORY on a link gives ENOTDIR rather than ELOOP.
                Err(Errno::NOTDIR) => {
                    let stat = rustix::fs::statat(&current, part.as_str(), AtFlags::SYMLINK_NOFOLLOW);
                    return Err(match stat.map(|s| FileType::from_raw_mode(s.st_mode)) {
                        Ok(FileType::Symlink) => FileError::Symlink,
                        _ => FileError::NotADirectory,
                    });
                }
                Err(e) => return Err(FileError::of(e)),
            };
            if rustix::fs::fstat(&next).map_err(FileError::of)?.st_dev as u64 != self.dev {
                return Err(FileError::CrossDevice);
            }
            current = next;
        }
        Ok(current)
    }

    /// The final entry must be a regular file on the root's device.
    fn regular(&self, fd: &OwnedFd) -> Result<rustix::fs::Stat, FileError> {
        let stat = rustix::fs::fstat(fd).map_err(FileError::of)?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => return Err(FileError::IsADirectory),
            _ => return Err(FileError::SpecialFile),
        }
        if stat.st_dev as u64 != self.dev {
            return Err(FileError::CrossDevice);
        }
        Ok(stat)
    }

    /// `parent` is still what `parts` resolves to.
    fn unchanged(&self, parts: &[String], parent: &OwnedFd) -> Result<(), FileError> {
        let again = self.walk(parts).map_err(|_| FileError::ParentChanged)?;
        let (a, b) =
            (rustix::fs::fstat(parent).map_err(FileError::of)?, rustix::fs::fstat(&again).map_err(FileError::of)?);
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
            return Err(FileError::ParentChanged);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
