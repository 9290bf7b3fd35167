"""The escape battery of tests/test_tools_sandbox.py: attempts a model's code could make to get out of
the python sandbox, as code that runs inside it.

Each attempt is a function body (`go()`) that returns evidence when the attempt got through (a
non-empty value) and returns None or raises when it was held. BATCH_SCRIPT runs every attempt in one
sandbox call and prints {name: "held: ..." | "GOT THROUGH: ..."} as its last line. An attempt that
replaces or kills the process (execve, a fork child running on) leaves no verdict line, which the
test also counts as getting through. Names of the host's canaries come in as HOST (a dict literal).
"""

PROCESS_ATTEMPTS = {
    "os.system": "return os.system('true') == 0 or None",
    "subprocess.run": "return subprocess.run(['/usr/bin/true']).returncode == 0 or None",
    "os.fork": "pid = os.fork()\nif pid == 0:\n    os._exit(0)\nreturn pid",
    "os.execv": "os.execv('/usr/bin/true', ['true'])",
    "os.posix_spawn": "return os.posix_spawn('/usr/bin/true', ['true'], {})",
    "os.spawnv": "return os.spawnv(os.P_WAIT, '/usr/bin/true', ['true']) == 0 or None",
    "pty.spawn": "import pty\nreturn pty.spawn('/usr/bin/true') == 0 or None",
    "multiprocessing fork": ("import multiprocessing\np = multiprocessing.get_context('fork').Process(target=print)\n"
                             "p.start()\np.join()\nreturn p.exitcode == 0 or None"),
    "_posixsubprocess.fork_exec": (
        # the real call's arguments, captured from subprocess itself (the arity differs by Python version)
        "import _posixsubprocess\nseen = []\nreal = subprocess._fork_exec\n"
        "def capture(*a):\n    seen.append(a)\n    raise OSError('captured')\n"
        "subprocess._fork_exec = capture\ntry:\n    subprocess.Popen(['/usr/bin/true'])\nexcept OSError:\n    pass\n"
        "finally:\n    subprocess._fork_exec = real\nreturn _posixsubprocess.fork_exec(*seen[0])"),
    "ctypes libc.system": "return libc.system(b'true') == 0 or None",
    "_ctypes.dlopen and system": ("import _ctypes\naddr = _ctypes.dlsym(_ctypes.dlopen('libc.so.6'), 'system')\n"
                                  "return ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p)(addr)(b'true') == 0 or None"),
    "ctypes libc.fork": "pid = check(libc.fork())\nif pid == 0:\n    libc._exit(0)\nreturn pid",
    "ctypes libc.execve": ("argv = (ctypes.c_char_p * 2)(b'/usr/bin/true', None)\n"
                           "check(libc.execve(b'/usr/bin/true', argv, None))"),
    "raw clone syscall": "pid = check(libc.syscall(SYS['clone'], 17, 0, 0, 0, 0))\nif pid == 0:\n    libc._exit(0)\nreturn pid",
}
FILE_ATTEMPTS = {
    "write the interpreter": "open(sys.executable, 'ab').write(b'x')\nreturn 'appended'",
    "write /usr/lib": "open('/usr/lib/dora-escape', 'w').write('x')\nreturn 'written'",
    "write the sandbox root": "open('/dora-escape', 'w').write('x')\nreturn 'written'",
    "write through a symlink": "os.symlink('/usr/lib/dora-link', '/tmp/link')\nopen('/tmp/link', 'w').write('x')\nreturn 'written'",
    "rename out of scratch": "open('/tmp/a', 'w').write('x')\nos.rename('/tmp/a', '/usr/lib/dora-a')\nreturn 'moved'",
    "hard link out of scratch": "open('/tmp/b', 'w').write('x')\nos.link('/tmp/b', '/usr/lib/dora-b')\nreturn 'linked'",
    "write the host run folder": "open(HOST['run_dir'] + '/written.txt', 'w').write('x')\nreturn 'written'",
    "write /dev/shm": "open('/dev/shm/x', 'w').write('x')\nreturn 'written'",
    # opened for writing, never written: a hole here must not change the host
    "open /proc/sys (core_pattern) for writing": "return os.open('/proc/sys/kernel/core_pattern', os.O_WRONLY) >= 0",
    "open /proc/sysrq-trigger for writing": "return os.open('/proc/sysrq-trigger', os.O_WRONLY) >= 0",
}
SECRET_ATTEMPTS = {
    "read the secret beside the run": "return open(HOST['secret']).read()",
    "read /etc/shadow": "return open('/etc/shadow').read()",
    "read /etc/passwd": "return open('/etc/passwd').read()",
    "list home folders": ("seen = [p for p in ('/root', '/home') if os.path.isdir(p)]\n"
                          "found = {p: os.listdir(p) for p in seen}\n"
                          "return {p: v for p, v in found.items() if v not in ([], ['.pyenv'])} or None"),
    "read a file in root's home": "return open('/root/.bashrc').read()",
    "see the project": "return os.listdir(HOST['project'])",
    "find the host's environment": ("hits = [p for p in os.listdir('/proc') if p.isdigit() and HOST['canary'] in\n"
                                    "        readable(f'/proc/{p}/environ')]\n"
                                    "return hits or (HOST['canary'] in str(os.environ) and 'own environ') or None"),
}
NETWORK_ATTEMPTS = {
    "tcp to a host listener on loopback": "socket.create_connection(('127.0.0.1', HOST['port']), timeout=2)\nreturn 'connected'",
    "udp out": "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('192.0.2.1', 53))\nreturn 'sent'",
    "ipv6 socket": "return socket.socket(socket.AF_INET6)",
    "netlink socket": "return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)",
    "packet socket": "return socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)",
    "abstract unix socket of the host": ("s = socket.socket(socket.AF_UNIX)\ns.connect('\\0' + HOST['abstract'])\n"
                                         "return 'connected'"),
}
PROCESS_CONTROL_ATTEMPTS = {
    "signal a host process": "os.kill(HOST['sleeper'], signal.SIGKILL)\nreturn 'signalled'",
    "signal the parent (the dora process)": "os.kill(HOST['parent'], signal.SIGCONT)\nreturn 'signalled'",
    "ptrace attach": "return refused(libc.ptrace(16, 1, 0, 0))",
    "ptrace traceme": "return refused(libc.ptrace(0, 0, 0, 0))",
    "process_vm_readv": "return refused(libc.syscall(SYS['process_vm_readv'], 1, 0, 0, 0, 0, 0))",
    "see host processes": ("pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
                           "return (len(pids) > 3 or HOST['sleeper'] in pids) and pids or None"),
    "host paths in /proc cmdlines": ("lines = [readable(f'/proc/{p}/cmdline') for p in os.listdir('/proc') if p.isdigit()]\n"
                                     "return [h for h in (HOST['run_dir'], HOST['project']) if h in str(lines)] or None"),
    "host paths in the mount table": ("text = open('/proc/self/mountinfo').read()\n"
                                      "return [h for h in (HOST['run_dir'], HOST['project']) if h in text] or None"),
    "see /sys": "return os.listdir('/sys')",
    "setuid 0": "os.setuid(0)\nreturn os.getuid() == 0 or None",
    "chroot": "os.chroot('/tmp')\nreturn 'chrooted'",
}
SYSCALL_ATTEMPTS = {   # kernel interfaces the base seccomp filter refuses: anything but EPERM / ENOSYS gets through
    f"syscall {name}": f"return refused(libc.syscall(SYS[{name!r}], {args}))"
    for name, args in (("unshare", "0x10000000"), ("setns", "0, 0"), ("mount", "0, 0, 0, 0, 0"),
                       ("keyctl", "0, 0, 0, 0"), ("bpf", "0, 0, 0"), ("perf_event_open", "0, 0, 0, 0, 0"),
                       ("userfaultfd", "0"), ("io_uring_setup", "1, 0"), ("personality", "0x0040000"),
                       ("open_by_handle_at", "0, 0, 0"), ("kexec_load", "0, 0, 0, 0"))
}
ATTEMPTS = {**PROCESS_ATTEMPTS, **FILE_ATTEMPTS, **SECRET_ATTEMPTS, **NETWORK_ATTEMPTS, **PROCESS_CONTROL_ATTEMPTS,
            **SYSCALL_ATTEMPTS}

PRELUDE = '''
import ctypes, json, os, signal, socket, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
SYS = SYSCALLS
HOST = HOST_VALUES

def check(ret):
    if ret == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret

def refused(ret):
    """None when the call was refused by the sandbox (EPERM, or ENOSYS from the filter), else evidence."""
    err = ctypes.get_errno()
    return None if ret == -1 and err in (1, 38) else f"returned {ret}, errno {err}"

def readable(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""

VERDICT = {}
def attempt(name, go):
    try:
        evidence = go()
        VERDICT[name] = "GOT THROUGH: " + repr(evidence)[:200] if evidence else "held: returned " + repr(evidence)
    except BaseException as e:
        VERDICT[name] = "held: " + type(e).__name__ + ": " + str(e)[:200]
'''


def batch_script(host: dict, syscalls: dict) -> str:
    parts = [PRELUDE.replace("SYSCALLS", repr(syscalls)).replace("HOST_VALUES", repr(host))]
    for i, (name, body) in enumerate(ATTEMPTS.items()):
        indented = "\n".join("    " + ln for ln in body.splitlines())
        parts.append(f"def go_{i}():\n{indented}\nattempt({name!r}, go_{i})\n")
    parts.append("print(json.dumps(VERDICT))\n")
    return "\n".join(parts)
