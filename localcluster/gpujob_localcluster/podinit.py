"""The first program of every isolated container: set up its mounts, then exec its command.

It runs inside the pod's fresh mount and UTS namespaces (``unshare --mount --uts``), with
the interpreter in isolated mode and only the standard library, so it starts in
milliseconds. Usage: ``python -I -S podinit.py SPEC_JSON COMMAND [ARG...]`` where SPEC_JSON
is ``{"hosts": path, "hostname": name, "mounts": [{"source", "target", "readOnly"}],
"image": [path]}``.

Every source is opened (``O_PATH``) before anything is mounted and bound through
``/proc/self/fd/N``: a volume mounted over ``/tmp`` would otherwise hide the other volumes'
folders when they live under ``/tmp`` too. Parents are mounted before children.

``image`` lists what stands in for the container image here (the venv, the checkout): a
volume mounted over a folder that holds them (the chart's emptyDir on ``/tmp`` with the
venv under ``/tmp``) would hide the very program the container runs, which a real image
never suffers. Those paths are bound back on top, as they were, after the volumes.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384


def _mount(libc: ctypes.CDLL, source: str, target: str, flags: int) -> None:
    if libc.mount(source.encode(), target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _mount_point(target: str, is_dir: bool) -> None:
    """Create a missing mount point (on the shared filesystem, or inside a parent volume)."""
    if is_dir:
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
        with open(target, "a"):
            pass


def hidden(image: list[str], targets: list[str]) -> list[str]:
    """The image paths that a volume mounted at one of `targets` would hide (strictly below
    the target: a volume mounted exactly on an image path is the user's choice)."""
    tops = [os.path.normpath(t).rstrip("/") + "/" for t in targets]
    return [p for p in image if any(os.path.normpath(p).startswith(t) for t in tops)]


def setup(spec: dict) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    mounts = spec.get("mounts") or []
    image = hidden(
        [p for p in spec.get("image") or [] if os.path.isdir(p)], [m["target"] for m in mounts]
    )
    kept = [(p, os.open(p, os.O_PATH)) for p in image]
    opened = [(m, os.open(m["source"], os.O_PATH), os.path.isdir(m["source"])) for m in mounts]
    hosts = os.open(spec["hosts"], os.O_PATH)
    _mount(libc, f"/proc/self/fd/{hosts}", "/etc/hosts", MS_BIND)
    socket.sethostname(spec["hostname"])
    for m, fd, is_dir in sorted(opened, key=lambda o: os.path.normpath(o[0]["target"]).count("/")):
        target = os.path.normpath(m["target"])
        _mount_point(target, is_dir)
        _mount(libc, f"/proc/self/fd/{fd}", target, MS_BIND | MS_REC)
        if m.get("readOnly"):
            _mount(libc, "none", target, MS_BIND | MS_REMOUNT | MS_RDONLY)
    for path, fd in kept:
        _mount_point(path, True)
        _mount(libc, f"/proc/self/fd/{fd}", path, MS_BIND | MS_REC)
        os.close(fd)
    for _, fd, _ in opened:
        os.close(fd)
    os.close(hosts)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: podinit.py SPEC_JSON COMMAND [ARG...]", file=sys.stderr)
        return 127
    try:
        setup(json.loads(argv[0]))
    except OSError as e:
        print(f"gpujob node agent: setting up the pod's mounts failed: {e}", file=sys.stderr)
        return 126
    try:
        os.execvp(argv[1], argv[1:])
    except OSError as e:
        print(f"gpujob node agent: cannot run {argv[1]!r}: {e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
