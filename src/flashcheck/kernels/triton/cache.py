"""Where Triton keeps the kernels it compiles, and how many it compiled in this process.

**The cache.** Triton writes every kernel it compiles to a cache on disk and loads it from there in
later runs, so only a campaign's first run on a machine pays for its compilations. flashcheck uses
Triton's own cache by default: ``$TRITON_CACHE_DIR`` when set, else ``~/.triton/cache`` (under
``$TRITON_HOME`` instead of ``~`` when that is set). Kernels a user's own tests compiled are then not
compiled again, and the usual Triton settings keep working. ``FLASHCHECK_TRITON_CACHE=DIR`` gives
flashcheck a cache of its own (a fast local disk, a directory a CI job keeps): it is exported as
``TRITON_CACHE_DIR``, which worker processes inherit.

**Compilations.** :func:`compilation_stats` counts the kernel variants Triton built in this process
(compiled, or loaded from the disk cache: each is a new specialisation) and the seconds that took,
through Triton's JIT hooks (``triton.knobs.runtime``: Triton 3.6 and 3.9 have them; an older Triton
counts 0). Hooks set before flashcheck's are still called. Under the interpreter nothing is compiled:
the count stays 0. Nothing here imports triton until a caller asks after triton was imported.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from ...errors import InvalidArgument

__all__ = ["CACHE_ENV", "compilation_stats", "triton_cache_dir", "use_triton_cache", "watch_compilations"]

CACHE_ENV = "FLASHCHECK_TRITON_CACHE"

_LOCK = threading.Lock()
_TOTAL = {"count": 0, "seconds": 0.0}
_STARTED: dict = {}  # compilation key -> when Triton began building it
_WATCHING: dict = {}  # "installed": whether the hooks are in place


def triton_cache_dir() -> str:
    """The directory Triton compiles into, as the environment says now."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"]
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.path.join(home, ".triton", "cache")


def use_triton_cache() -> str:
    """Export ``$FLASHCHECK_TRITON_CACHE`` (when set) as ``TRITON_CACHE_DIR``; the cache directory in use.

    Call it before Triton compiles anything: Triton reads ``TRITON_CACHE_DIR`` at each compilation,
    and worker processes started afterwards inherit it.
    """
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        path = os.path.abspath(os.path.expanduser(chosen))
        if os.path.exists(path) and not os.path.isdir(path):
            raise InvalidArgument(CACHE_ENV, chosen, "names a file, not a directory",
                                  f"Point {CACHE_ENV} at a directory (it is created if missing), or unset it to "
                                  "use Triton's own cache.")
        os.environ["TRITON_CACHE_DIR"] = path
    return triton_cache_dir()


def compilation_stats() -> tuple[int, float]:
    """``(count, seconds)``: Triton kernel variants built in this process so far, and the time it took.

    ``(0, 0.0)`` while triton is not imported; watching starts on the first call after it is.
    """
    if "triton" in sys.modules:
        watch_compilations()
    with _LOCK:
        return _TOTAL["count"], _TOTAL["seconds"]


def watch_compilations() -> bool:
    """Install the counting hooks once per process (imports triton); whether this Triton has them."""
    with _LOCK:
        if "installed" not in _WATCHING:
            import triton  # lazy: watching starts once a Triton kernel runs, never before

            runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
            _WATCHING["installed"] = runtime is not None and hasattr(runtime, "jit_post_compile_hook")
            if _WATCHING["installed"]:
                install_hooks(runtime)
        return _WATCHING["installed"]


def install_hooks(runtime) -> None:
    """Chain counting hooks in front of ``runtime``'s ``jit_cache_hook`` and ``jit_post_compile_hook``."""
    before_cache, before_post = runtime.jit_cache_hook, runtime.jit_post_compile_hook

    def cache_hook(**kwargs):
        # Called just before Triton builds a variant; a true answer from a hook skips the build.
        _STARTED[str(kwargs.get("key"))] = time.perf_counter()
        return before_cache(**kwargs) if before_cache is not None else None

    def post_compile_hook(**kwargs):
        started = _STARTED.pop(str(kwargs.get("key")), None)
        with _LOCK:
            _TOTAL["count"] += 1
            if started is not None:
                _TOTAL["seconds"] += time.perf_counter() - started
        return before_post(**kwargs) if before_post is not None else None

    runtime.jit_cache_hook = cache_hook
    runtime.jit_post_compile_hook = post_compile_hook
