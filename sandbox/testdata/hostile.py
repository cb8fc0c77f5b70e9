"""What a hostile workspace command tries, one attack per run (IOP's
sandbox tests: node/src/workspace/command.rs and e2e/tests/containment.rs).

    python3 hostile.py ATTACK [ARG]

Exits 0 when the attack got through, 1 when it was refused, 2 on a usage
error, 3 when the attack itself failed to run (never read as refused). Each attack is harmless when it gets through: a privileged call is
made with an argument the kernel rejects only after its privilege check
(so EINVAL or EFAULT means "allowed", EPERM or EACCES "refused"), a limit
or priority is read or set to the value it already has.
"""

import ctypes
import errno
import fcntl
import os
import platform
import sys
import termios

LIBC = ctypes.CDLL(None, use_errno=True)
NUMBERS = {
    "x86_64": {"reboot": 169, "sethostname": 170, "bpf": 321, "perf_event_open": 298, "keyctl": 250,
               "finit_module": 313, "mknodat": 259, "prlimit64": 302, "unshare": 272},
    "aarch64": {"reboot": 142, "sethostname": 161, "bpf": 280, "perf_event_open": 241, "keyctl": 219,
                "finit_module": 273, "mknodat": 33, "prlimit64": 261, "unshare": 97},
}.get(platform.machine(), {})
REFUSED = (errno.EPERM, errno.EACCES)


def syscall(name, *args):
    """The call's errno (0 when it succeeded)."""
    result = LIBC.syscall(ctypes.c_long(NUMBERS[name]), *[ctypes.c_long(a) for a in args])
    return 0 if result >= 0 else ctypes.get_errno()


def refused_by(err):
    return err in REFUSED


def raises(call):
    """Whether `call` raised OSError with EPERM or EACCES."""
    try:
        call()
    except OSError as e:
        return e.errno in REFUSED
    return False


def fails(call):
    """Whether `call` raised any OSError."""
    try:
        call()
    except OSError:
        return True
    return False


def status_capabilities():
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name.startswith("Cap"):
                fields[name] = int(value.strip(), 16)
    return fields


def terminals():
    """Every terminal the command can get at: its descriptors that are
    terminals, its controlling terminal, every pseudo-terminal by path;
    and stdin, whatever it is (the filter answers before the driver)."""
    found = [fd for fd in range(256) if os.isatty(fd)]
    paths = ["/dev/tty", "/dev/console"]
    try:
        paths += [os.path.join("/dev/pts", n) for n in os.listdir("/dev/pts") if n != "ptmx"]
    except OSError:
        pass
    for path in paths:
        try:
            found.append(os.open(path, os.O_RDWR | os.O_NOCTTY))
        except OSError:
            pass
    return found + [0]


def attack(name, arg):
    """True when the attack was refused."""
    if name == "reboot":
        # Magic numbers the kernel checks after CAP_SYS_BOOT.
        return refused_by(syscall("reboot", 0, 0, 0, 0))
    if name == "sethostname":
        # Longer than a host name may be: EINVAL after CAP_SYS_ADMIN.
        buf = ctypes.create_string_buffer(1000)
        return refused_by(LIBC.sethostname(buf, 1000) and ctypes.get_errno())
    if name == "bpf":
        return refused_by(syscall("bpf", 5, 0, 0))  # BPF_PROG_LOAD, no program
    if name == "perf_event_open":
        return refused_by(syscall("perf_event_open", 0, -1, 0, -1, 0))  # no attributes: EFAULT
    if name == "finit_module":
        return refused_by(syscall("finit_module", -1, 0, 0))  # EBADF after CAP_SYS_MODULE
    if name == "keyring":
        return refused_by(syscall("keyctl", 0, -4, 0))  # KEYCTL_GET_KEYRING_ID of the user's keyring
    if name == "mknod":
        device = (1 << 8) | 11  # /dev/kmsg, char 1:11
        path = ctypes.c_char_p(b"kmsg")
        return refused_by(syscall("mknodat", -100, ctypes.cast(path, ctypes.c_void_p).value, 0o20600, device))
    if name == "unshare":
        return refused_by(syscall("unshare", 0x10000000))  # CLONE_NEWUSER
    if name == "realtime":
        return raises(lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)))
    if name == "tiocsti":
        # Types into a terminal's input: refused only if every try was.
        return all(raises(lambda fd=fd: fcntl.ioctl(fd, termios.TIOCSTI, b"x")) for fd in terminals())
    if name == "tiocsti_high_bits":
        # The request is an int: bits above 32 must not slip past a filter.
        byte = ctypes.c_char(b"x")
        LIBC.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
        tries = [LIBC.ioctl(fd, (1 << 32) | termios.TIOCSTI, ctypes.byref(byte)) for fd in terminals()]
        return all(result != 0 for result in tries) and ctypes.get_errno() in REFUSED
    if name == "tty":
        return fails(lambda: os.close(os.open("/dev/tty", os.O_RDWR)))
    if name == "prlimit":
        # Read only: a NULL new limit, the old one into a buffer.
        old = ctypes.create_string_buffer(16)
        return refused_by(syscall("prlimit64", int(arg), 7, 0, ctypes.cast(old, ctypes.c_void_p).value))
    if name == "prlimit_cpu":
        # What the attacker did: the node's RLIMIT_CPU to 1 s.
        import resource
        return raises(lambda: resource.prlimit(int(arg), resource.RLIMIT_CPU, (1, 1)))
    if name == "setpriority":
        pid = int(arg)
        return raises(lambda: os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, pid)))
    if name == "affinity":
        pid = int(arg)
        return raises(lambda: os.sched_setaffinity(pid, os.sched_getaffinity(pid)))
    if name == "descriptors":
        # 0-2, and the one listing the directory.
        listing = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
        return sorted(os.listdir(listing), key=int) == ["0", "1", "2", "3"]
    if name == "capabilities":
        caps = status_capabilities()
        held = [n for n in ("CapInh", "CapPrm", "CapEff", "CapAmb") if caps.get(n)]
        if arg == "bounding" and caps.get("CapBnd"):
            held.append("CapBnd")
        return not held
    if name == "net_table":
        return fails(lambda: open("/proc/self/net/tcp").read())
    if name == "read":
        return fails(lambda: open(arg, "rb").read(1))
    raise ValueError(f"unknown attack {name}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(2)
    try:
        refused = attack(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None)
    except Exception as e:  # noqa: BLE001 - any failure of the probe itself
        print(f"{sys.argv[1]}: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(3)
    sys.exit(1 if refused else 0)
