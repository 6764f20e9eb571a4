"""The files flashcheck writes, and the paths it prints.

Every JSON summary, report page, plot and saved case is written atomically by the one writer here: a
temporary file in the same folder (so the rename cannot cross file systems), flushed and fsynced, then
renamed over the target. A reader, a second worker or a crash never sees half a file.

Output paths are checked before any work starts: a campaign that runs for an hour and then cannot write
its summary has lost its result. Each check creates the folder and a probe file in it (then removes the
probe), so what it accepts can really be written, whoever runs it. :func:`replay_command` is the one
command every summary, report and failing test prints for a saved case."""

from __future__ import annotations

import errno
import json
import os
import shlex
import tempfile
from pathlib import Path

from .errors import InvalidArgument

__all__ = ["check_writable_file", "check_writable_folder", "remove_quietly", "replay_command", "write_bytes",
           "write_json", "write_temporary", "write_text"]


def write_temporary(path, write) -> str:
    """A hidden temporary file next to ``path``, filled by ``write(binary_file)``, flushed and fsynced; the
    caller renames it over ``path`` with ``os.replace`` (several files can then be committed in order)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make shared corpora and reports unreadable to others
    except BaseException:
        remove_quietly(tmp)
        raise
    return tmp


def remove_quietly(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    tmp = write_temporary(path, lambda f: f.write(data))
    try:
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def write_text(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path, data) -> None:
    """Write ``data`` as indented JSON atomically (values JSON cannot hold are written as strings)."""
    write_text(path, json.dumps(data, indent=2, default=str))


def _probe(option: str, value, folder: Path) -> None:
    """Create ``folder`` if need be and a file in it (removed again): only that says whether this user may
    write there (``os.access`` answers for root as if every folder were writable)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".flashcheck-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InvalidArgument(option, str(value), _why(folder, exc),
                              f"Pass a {option} path in a folder you can write to.") from None


def _why(folder: Path, exc: OSError) -> str:
    """What is wrong, in words, named by the folder that refused: the nearest one that exists. A folder that
    exists and refuses a new file is not missing, whatever the error's words say (``/proc`` answers "No such
    file or directory")."""
    reason = f" ({exc.strerror})" if exc.strerror and exc.errno != errno.ENOENT else ""
    existing = next((f for f in (folder, *folder.parents) if os.path.exists(f)), None)
    if existing == folder:
        return f"cannot write in {str(folder)!r}: the folder does not accept new files{reason}"
    if existing is None:
        return f"cannot create the folder {str(folder)!r}{reason}"
    if not os.path.isdir(existing):
        return f"cannot write below {str(existing)!r}: it is a file, not a folder"
    return f"cannot write in {str(existing)!r}: the folder {str(folder)!r} cannot be created there{reason}"


# os.path's tests, not pathlib's: in a folder this user cannot enter, Path.exists() and Path.is_dir() raise
# PermissionError (Python 3.11) before the probe could say what is wrong; os.path's answer False, then the probe.

def check_writable_folder(option: str, path) -> Path:
    """``path`` as a folder that exists (created if need be) and can be written, else a usage error."""
    folder = Path(path)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise InvalidArgument(option, str(path), "is an existing file, not a folder",
                              f"Pass a new or existing folder to {option}.")
    _probe(option, path, folder)
    return folder


def check_writable_file(option: str, path) -> Path | None:
    """``path`` as a file that can be written (its folder created if need be), else a usage error;
    None passes through (the option was not given)."""
    if path is None:
        return None
    file = Path(path)
    if os.path.isdir(file):
        raise InvalidArgument(option, str(path), "is a folder, not a file",
                              f"Pass a file name to {option}, e.g. {file / 'summary.json'}.")
    _probe(option, path, file.parent)
    if os.path.exists(file) and not os.access(file, os.W_OK):
        raise InvalidArgument(option, str(path), "exists and cannot be written",
                              f"Pass another {option} path, or make that file writable.")
    return file


def replay_command(path, *, device: str | None = None) -> str:
    """The shell command that replays the case saved at ``path`` (as seen from where it is run) on the
    device it was found on; the case itself records how to reach its kernel."""
    on = ["--device", device.split(":")[0]] if isinstance(device, str) and device else []  # merged: a list
    words = ["flashcheck", "replay", str(path)] + on
    return " ".join(shlex.quote(w) for w in words)
