//! The file executor against real directories: what works, and a table of
//! hostile paths, each asserting the typed error and an unchanged disk.

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::*;

const LIMITS: FileLimits = FileLimits { max_file_bytes: 1024, max_list_entries: 3 };

/// A workspace `<tmp>/ws` with some content, a directory outside it, and
/// links pointing out of and around inside it.
struct Fixture {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    root: File,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let ws = base.join("ws");
        std::fs::create_dir_all(ws.join("src/deep")).unwrap();
        std::fs::create_dir_all(ws.join(".iop/job")).unwrap();
        std::fs::create_dir(ws.join("empty")).unwrap();
        std::fs::write(ws.join("README.md"), "hello workspace").unwrap();
        std::fs::write(ws.join("src/main.rs"), "fn main() {}").unwrap();
        std::fs::write(ws.join(".iop/job/state"), "internal").unwrap();
        std::fs::create_dir(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/secret"), "do not touch").unwrap();
        symlink(base.join("outside"), ws.join("out-dir")).unwrap();
        symlink(base.join("outside/secret"), ws.join("out-file")).unwrap();
        symlink(ws.join("src"), ws.join("src-link")).unwrap();
        symlink("README.md", ws.join("readme-link")).unwrap();
        crate::workspace::tests::mkfifo(&ws.join("fifo"));
        let root = File::open(&ws).unwrap();
        Self { _tmp: tmp, base, root }
    }

    fn files(&self) -> Files<'_> {
        Files::new(&self.root, LIMITS).unwrap()
    }

    fn ws(&self) -> PathBuf {
        self.base.join("ws")
    }

    /// Every entry below the base (the workspace and outside it): kind and
    /// content or link target.
    fn disk(&self) -> BTreeMap<PathBuf, String> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let value = if meta.file_type().is_symlink() {
                    format!("link:{}", std::fs::read_link(&path).unwrap().display())
                } else if meta.is_dir() {
                    walk(&path, out);
                    "dir".to_string()
                } else if meta.is_file() {
                    format!("file:{}", std::fs::read_to_string(&path).unwrap())
                } else {
                    "special".to_string()
                };
                out.insert(path, value);
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.base, &mut out);
        out
    }
}

#[test]
fn read_list_write_delete_inside_the_workspace() {
    let f = Fixture::new();
    let files = f.files();
    let read = files.read("README.md", 0, 1024).unwrap();
    assert_eq!((read.data.as_slice(), read.truncated, read.size), (&b"hello workspace"[..], false, 15));
    let part = files.read("README.md", 6, 4).unwrap();
    assert_eq!((part.data.as_slice(), part.truncated), (&b"work"[..], true));

    let first = files.list("", None).unwrap();
    let names: Vec<_> = first.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["README.md", "empty", "fifo"], "sorted, `.iop` hidden, a batch of 3");
    let second = files.list("", first.next.as_deref()).unwrap();
    let kinds: Vec<_> = second.entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        kinds,
        [("out-dir", EntryKind::Symlink), ("out-file", EntryKind::Symlink), ("readme-link", EntryKind::Symlink)]
    );
    let last = files.list("", second.next.as_deref()).unwrap();
    assert_eq!(last.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["src", "src-link"]);
    assert_eq!(last.next, None);
    assert_eq!(files.list("src", None).unwrap().entries.len(), 2);

    files.write("src/new.txt", b"new", true).unwrap();
    assert_eq!(std::fs::read(f.ws().join("src/new.txt")).unwrap(), b"new");
    files.write("src/new.txt", b"newer", false).unwrap();
    assert_eq!(std::fs::read(f.ws().join("src/new.txt")).unwrap(), b"newer");
    assert_eq!(files.write("src/new.txt", b"again", true), Err(FileError::Exists));
    files.delete("src/new.txt").unwrap();
    files.delete("empty").unwrap();
    assert!(!f.ws().join("empty").exists());
    // No temporary file is left behind.
    assert!(
        std::fs::read_dir(f.ws().join("src")).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".iop-write"))
    );
}

/// At least 30 hostile paths: each refused with its typed error, the disk
/// (inside and outside the workspace) unchanged.
#[test]
fn hostile_paths_are_refused_before_any_effect() {
    let long = "a".repeat(MAX_NAME_BYTES + 1);
    let very_long = "a/".repeat(MAX_PATH_BYTES / 2 + 1);
    type Op = fn(&Files<'_>, &str) -> Result<(), FileError>;
    let read: Op = |f, p| f.read(p, 0, 100).map(drop);
    let list: Op = |f, p| f.list(p, None).map(drop);
    let write: Op = |f, p| f.write(p, b"pwned", false);
    let create: Op = |f, p| f.write(p, b"pwned", true);
    let delete: Op = |f, p| f.delete(p);
    let invalid = FileError::InvalidPath("");
    let cases: Vec<(&str, Op, &str, FileError)> = vec![
        ("absolute read", read, "/etc/passwd", invalid),
        ("absolute write", write, "/tmp/x", invalid),
        ("dotdot read", read, "../outside/secret", invalid),
        ("dotdot inner", read, "src/../../outside/secret", invalid),
        ("dotdot write", write, "../outside/new", invalid),
        ("dot component", read, "./README.md", invalid),
        ("empty component", read, "src//main.rs", invalid),
        ("trailing slash", read, "src/", invalid),
        ("NUL", read, "READ\0ME.md", invalid),
        ("long name", write, &long, invalid),
        ("long path", read, &very_long, invalid),
        ("reserved read", read, ".iop/job/state", FileError::Reserved),
        ("reserved list", list, ".iop", FileError::Reserved),
        ("reserved write", write, ".iop/job/x", FileError::Reserved),
        ("reserved delete", delete, ".iop/job/state", FileError::Reserved),
        ("reserved itself", delete, ".iop", FileError::Reserved),
        // `.IOP` is `.iop` on a case-insensitive file system (APFS).
        ("reserved upper case", write, ".IOP/job/x", FileError::Reserved),
        ("reserved mixed case", read, ".Iop/job/state", FileError::Reserved),
        ("symlink file out", read, "out-file", FileError::Symlink),
        ("symlink file in", read, "readme-link", FileError::Symlink),
        ("symlink dir out read", read, "out-dir/secret", FileError::Symlink),
        ("symlink dir out list", list, "out-dir", FileError::Symlink),
        ("symlink dir out write", write, "out-dir/new", FileError::Symlink),
        ("symlink dir out create", create, "out-dir/new", FileError::Symlink),
        ("symlink dir in", read, "src-link/main.rs", FileError::Symlink),
        ("overwrite a symlink", write, "out-file", FileError::Symlink),
        ("create over a symlink", create, "out-file", FileError::Exists),
        ("delete a symlink", delete, "out-dir", FileError::Symlink),
        ("delete through a symlink", delete, "out-dir/secret", FileError::Symlink),
        ("fifo read", read, "fifo", FileError::SpecialFile),
        ("fifo overwrite", write, "fifo", FileError::SpecialFile),
        ("fifo delete", delete, "fifo", FileError::SpecialFile),
        ("directory read", read, "src", FileError::IsADirectory),
        ("directory overwrite", write, "src", FileError::IsADirectory),
        ("non-empty directory delete", delete, "src", FileError::NotEmpty),
        ("file as a directory", read, "README.md/x", FileError::NotADirectory),
        ("missing parent write", write, "nope/new.txt", FileError::NotFound),
        ("missing read", read, "nope.txt", FileError::NotFound),
        ("root delete", delete, "", invalid),
        ("root read", read, "", FileError::IsADirectory),
    ];
    assert!(cases.len() >= 30);
    let f = Fixture::new();
    let files = f.files();
    let before = f.disk();
    for (what, op, path, expected) in cases {
        let got = op(&files, path);
        match (got, expected) {
            (Err(FileError::InvalidPath(_)), FileError::InvalidPath(_)) => {}
            (got, expected) => assert_eq!(got, Err(expected), "{what}"),
        }
        assert_eq!(f.disk(), before, "{what}: the disk changed");
    }
    assert_eq!(files.write("big", &[b'x'; 1025], false), Err(FileError::TooLarge));
    assert_eq!(f.disk(), before);
}

/// The portable walk refuses the same links as the kernel's resolution.
#[test]
fn the_portable_walk_refuses_links_too() {
    let f = Fixture::new();
    let files = f.files();
    let part = |p: &str| p.split('/').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(files.walk(&part("out-dir")).err(), Some(FileError::Symlink));
    assert_eq!(files.walk(&part("src-link/deep")).err(), Some(FileError::Symlink));
    assert_eq!(files.walk(&part("README.md")).err(), Some(FileError::NotADirectory));
    assert!(files.walk(&part("src/deep")).is_ok());
}

/// A parent directory swapped for a symlink while a write is under way:
/// the write is refused and nothing lands outside (or inside).
#[test]
fn a_parent_swapped_for_a_symlink_during_a_write_is_refused() {
    let f = Fixture::new();
    let files = f.files();
    let ws = f.ws();
    let outside = f.base.join("outside");
    let swap = || {
        std::fs::rename(ws.join("src"), f.base.join("moved-src")).unwrap();
        symlink(&outside, ws.join("src")).unwrap();
    };
    assert_eq!(files.write_with("src/new.txt", b"pwned", false, &swap), Err(FileError::ParentChanged));
    assert!(!outside.join("new.txt").exists());
    assert!(!f.base.join("moved-src/new.txt").exists(), "not in the moved directory either");
    let leftovers: Vec<_> =
        std::fs::read_dir(f.base.join("moved-src")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(leftovers.iter().all(|n| !n.to_string_lossy().starts_with(".iop-write")), "{leftovers:?}");
}

/// A write replaces content, not permissions: a private file stays 0600, a
/// script stays executable, set-id bits are dropped; a new file is 0644
/// (less the umask).
#[test]
fn a_write_keeps_the_existing_files_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new();
    let mode = |name: &str| std::fs::metadata(f.ws().join(name)).unwrap().permissions().mode() & 0o7777;
    let set = |name: &str, mode: u32| {
        std::fs::write(f.ws().join(name), "old").unwrap();
        std::fs::set_permissions(f.ws().join(name), std::fs::Permissions::from_mode(mode)).unwrap();
    };
    set("secret.env", 0o600);
    set("run.sh", 0o755);
    set("setid", 0o4755);
    for name in ["secret.env", "run.sh", "setid", "fresh.txt"] {
        f.files().write(name, b"new", false).unwrap();
        assert_eq!(std::fs::read(f.ws().join(name)).unwrap(), b"new");
    }
    assert_eq!((mode("secret.env"), mode("run.sh"), mode("setid")), (0o600, 0o755, 0o755));
    assert_eq!(mode("fresh.txt") & !0o022, 0o644 & !0o022);
    assert!(mode("fresh.txt") & 0o111 == 0, "a new file is not executable");
}

/// A node run as root writes files that belong to the directory's owner,
/// so the commands it runs as `workspaces.command_user` can change them;
/// any other node writes its own files (it cannot give one away).
#[test]
fn a_new_file_belongs_to_its_directorys_owner_where_the_node_may_give_it_away() {
    use std::os::unix::fs::MetadataExt;
    let f = Fixture::new();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let (uid, gid) = if root { (65_534, 65_534) } else { (unsafe { libc::geteuid() }, unsafe { libc::getegid() }) };
    if root {
        std::os::unix::fs::chown(f.ws().join("src"), Some(uid), Some(gid)).unwrap();
    }
    f.files().write("src/new.rs", b"fn new() {}", true).unwrap();
    let meta = std::fs::metadata(f.ws().join("src/new.rs")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (uid, gid));
}
