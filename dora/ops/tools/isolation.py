"""The operating-system half of the python sandbox: the bubblewrap (`bwrap`, Debian package
`bubblewrap`) command line that starts the sandboxed interpreter.

What the child gets (docs/architecture.md, "The tool sandbox"):
- new user, mount, PID, network, IPC, UTS and cgroup namespaces; uid/gid 65534 inside, no
  capabilities, no_new_privs, no further user namespaces (--disable-userns), its own session;
- a root of its own: a read-only tmpfs holding read-only binds of the shared-library folders
  (/usr/lib, /usr/lib64, ...), the interpreter's prefix (its standard library) with every
  site-packages / dist-packages folder hidden, copies of the child scripts at /dora, and the packages the tool
  allows at /dora/packages; its own /proc, a read-only minimal /dev, and one
  writable tmpfs of `disk_mb` at /tmp (the scratch folder and working directory). Nothing else of the
  host exists in there: no run folder, project, home folders, /etc or host processes;
- the seccomp deny-list of seccomp_bpf.base_filter().

Who runs bwrap. A non-root caller runs it directly: the user namespace maps uid 65534 inside to the
caller's own uid. A root caller must not do that: the sandbox's uid would be host root (kuid 0),
which the kernel still lets write /proc/sys and other root-owned kernel files. So as root, an outer
bwrap (a mount namespace only, still root) makes the bind sources reachable by nobody, staging
each under a fresh tmpfs at /tmp/dora-stage/<i> (an interpreter under /root, mode 0700, is not
otherwise), then `setpriv` (util-linux) drops to uid/gid 65534 with no capabilities and runs the
inner bwrap described above, whose user namespace maps 65534 to host nobody (kuid 65534).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import sys

SANDBOX_UID = 65534
CHILD_DIR = "/dora"                     # the child scripts, inside
PACKAGES_DIR = "/dora/packages"         # allowed packages, inside (on the child's sys.path)
SCRATCH = "/tmp"                        # the only writable folder, inside
STAGE = "/tmp/dora-stage"               # root callers: where the outer bwrap puts the bind sources
LIB_ROOTS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32")
TOP_LIB_LINKS = ("/lib", "/lib64", "/lib32", "/libx32")
INSTALL_HINT = ("install the Debian/Ubuntu package `bubblewrap` (apt-get install bubblewrap; bash .ci/setup does), "
                "or declare `sandbox: interpreter_only` to run without OS isolation (not a security boundary)")


@dataclasses.dataclass(frozen=True)
class View:
    """What the sandbox sees of the host: read-only binds (source, destination), symlinks
    (target, destination) and folders hidden under an empty read-only tmpfs."""
    binds: tuple[tuple[str, str], ...]
    links: tuple[tuple[str, str], ...]
    hidden: tuple[str, ...]


def tools() -> tuple[str | None, str | None]:
    """(bwrap, setpriv) on PATH, or None each."""
    return shutil.which("bwrap"), shutil.which("setpriv")


def missing_tool() -> str | None:
    """Why this machine cannot start an isolated sandbox without trying (None: the tools are there)."""
    bwrap, setpriv = tools()
    if bwrap is None:
        return f"the python sandbox needs bubblewrap (`bwrap` is not on PATH): {INSTALL_HINT}"
    if os.geteuid() == 0 and setpriv is None:
        return ("the python sandbox, run as root, drops to uid 65534 with `setpriv`, which is not on PATH: install the "
                "Debian/Ubuntu package `util-linux`")
    return None


def interpreter() -> str:
    """The base interpreter (a venv's python runs its base one: the sandbox sees no venv)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def interpreter_view(packages: list[str]) -> View:
    """The binds the child needs: shared libraries, the interpreter and its standard library and the
    allowed packages (paths as resolved by package_paths). The child scripts come as data
    (inner_args' `files`): a bind would show their host path in the sandbox's /proc/self/mountinfo."""
    binds: list[tuple[str, str]] = [(p, p) for p in LIB_ROOTS if os.path.isdir(p) and not os.path.islink(p)]
    links = []
    for p in TOP_LIB_LINKS:
        if os.path.islink(p):
            links.append((os.readlink(p), p))
        elif os.path.isdir(p):
            binds.append((p, p))
    prefix = os.path.realpath(sys.base_prefix)
    if prefix != "/usr":
        binds.append((prefix, prefix))
    exe = interpreter()
    if not any(exe.startswith(src.rstrip("/") + "/") for src, _ in binds):
        binds.append((exe, exe))
    binds += [(p, f"{PACKAGES_DIR}/{os.path.basename(p.rstrip('/'))}") for p in packages]
    hidden = sorted({h for src, dest in binds if src == dest and os.path.isdir(src) for h in _site_dirs(src)})
    return View(tuple(binds), tuple(links), tuple(hidden))


def _site_dirs(root: str) -> list[str]:
    """site-packages and dist-packages folders of every Python under `root` (hidden in the sandbox:
    the tool's packages are the only ones it sees)."""
    found = []
    for pattern in ("python3*/*-packages", "lib/python3*/*-packages", "local/lib/python3*/*-packages"):
        found += [p for p in glob.glob(os.path.join(root, pattern)) if os.path.isdir(p)]
    return [p for p in found if os.path.basename(p) in ("site-packages", "dist-packages")]


def inner_args(view: View, disk_bytes: int, seccomp_fd: int | None, stage: dict[str, str],
               files: list[tuple[int, str]] = ()) -> list[str]:
    """The inner bwrap's options (the command follows them). `stage` maps a bind source to where the
    outer bwrap staged it (root callers), else it is bound from where it is; `files` are (fd,
    destination): read-only files copied from those descriptors (the child scripts)."""
    a = ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
         "--hostname", "sandbox", "--die-with-parent", "--new-session"]
    for src, dest in view.binds:
        a += ["--ro-bind", stage.get(src, src), dest]
    for target, dest in view.links:
        a += ["--symlink", target, dest]
    for fd, dest in files:
        a += ["--ro-bind-data", str(fd), dest]
    for h in view.hidden:
        a += ["--tmpfs", h, "--remount-ro", h]
    a += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
          "--size", str(disk_bytes), "--perms", "0700", "--tmpfs", SCRATCH, "--remount-ro", "/", "--chdir", SCRATCH,
          "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", SCRATCH]
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):   # one BLAS thread: within max_threads
        a += ["--setenv", var, "1"]
    if seccomp_fd is not None:
        a += ["--seccomp", str(seccomp_fd)]
    return a


def staged(view: View) -> dict[str, str]:
    """Root callers: each bind source outside the shared-library folders -> its place in the outer
    bwrap's view, where uid 65534 can reach it."""
    return {src: f"{STAGE}/{i}" for i, (src, _) in enumerate(view.binds) if src not in LIB_ROOTS + TOP_LIB_LINKS}


def outer_args(stage: dict[str, str], setpriv: str) -> list[str]:
    """Root callers: the outer bwrap (the host's filesystem, a fresh /tmp holding the staged sources)
    and the drop to uid/gid 65534; the inner bwrap command follows."""
    a = ["--dev-bind", "/", "/", "--tmpfs", "/tmp", "--perms", "0755", "--dir", STAGE, "--die-with-parent"]
    for src, dest in stage.items():
        a += ["--ro-bind", src, dest]
    return a + ["--", setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all"]


def command(view: View, child_argv: list[str], disk_bytes: int, arg_fd: int, seccomp_fd: int | None,
            files: list[tuple[int, str]] = ()) -> tuple[list[str], bytes]:
    """(argv to start, the inner bwrap's options to write to `arg_fd`, NUL-separated): passing them
    through a file descriptor keeps them out of the sandbox's /proc/1/cmdline."""
    bwrap, setpriv = tools()
    if bwrap is None or (os.geteuid() == 0 and setpriv is None):
        raise RuntimeError(missing_tool())
    root = os.geteuid() == 0
    stage = staged(view) if root else {}
    options = inner_args(view, disk_bytes, seccomp_fd, stage, files)
    inner = [bwrap, "--args", str(arg_fd), "--"] + child_argv
    argv = [bwrap] + outer_args(stage, setpriv) + inner if root else inner
    return argv, b"".join(o.encode() + b"\0" for o in options)


def package_problems(entries) -> list[tuple[int, str]]:
    """What is wrong with a tool's `packages` list, entry by entry (index, message)."""
    if not isinstance(entries, list):
        return [(0, f"packages must be a list of package names or paths, got {entries!r}")]
    problems, seen = [], {}
    for i, entry in enumerate(entries):
        try:
            paths = _package_entry(entry)
        except ValueError as e:
            problems.append((i, str(e)))
            continue
        for p in paths:
            name = os.path.basename(p.rstrip("/"))
            if name in seen:
                problems.append((i, f"package {entry!r} and {seen[name]!r} both bind {name!r} into the sandbox"))
            seen[name] = entry
    return problems


def package_paths(entries: list[str]) -> list[str]:
    """The host paths to bind for a checked `packages` list (a name's folder, plus its wheel's
    bundled-libraries folder `<name>.libs` when there is one)."""
    return [p for e in entries for p in _package_entry(e)]


def _package_entry(entry) -> list[str]:
    if not isinstance(entry, str) or not entry:
        raise ValueError(f"a package is an installed top-level name or a path, got {entry!r}")
    if os.sep not in entry:
        return _installed(entry)
    path = os.path.realpath(entry)
    if not os.path.exists(path):
        raise ValueError(f"package path {entry!r} does not exist")
    is_package = os.path.isfile(os.path.join(path, "__init__.py"))
    is_module = os.path.isfile(path) and (path.endswith(".py") or ".so" in os.path.basename(path))
    if not (is_package or is_module):
        raise ValueError(f"package path {entry!r} is neither a package folder (with __init__.py) nor a module file "
                         "(.py, .so)")
    return [path]


def _installed(name: str) -> list[str]:
    import importlib.util

    if not name.isidentifier():
        raise ValueError(f"package name {name!r} is not a top-level module name (a path needs a '/')")
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ValueError(f"package {name!r} is not installed for {sys.executable}")
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin in (None, "built-in", "frozen"):
        raise ValueError(f"{name!r} is part of the interpreter: the sandbox has it without listing it")
    if len(locations) > 1:
        raise ValueError(f"package {name!r} is a namespace package spread over {locations}: list its folders as paths")
    path = os.path.realpath(locations[0] if locations else spec.origin)
    if path.startswith(os.path.realpath(sys.base_prefix) + "/lib/python") and "-packages" not in path:
        raise ValueError(f"{name!r} is part of the standard library: the sandbox has it without listing it")
    libs = os.path.join(os.path.dirname(path), f"{name}.libs")
    return [path] + ([libs] if os.path.isdir(libs) else [])
