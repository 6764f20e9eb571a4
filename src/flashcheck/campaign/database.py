"""Hypothesis example databases for campaigns: a directory, or a Redis server that campaigns on several
machines share, so a failure one of them found and shrank is the first case the others replay.

``open_database(None)`` is the corpus's own directory, ``open_database("DIR")`` another directory and
``open_database("redis://HOST:PORT[/DB]")`` a Redis server (``pip install 'flashcheck[redis]'``), checked
with a PING before the campaign starts.

One database may serve many campaigns (a corpus folder or a Redis server shared by kernels): each campaign
sees it through a :class:`KeyedDatabase` keyed by :func:`campaign_scope` and the dtype, so that it replays
only failures stored by campaigns that draw the same cases from the same choices, on the same kernel.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from urllib.parse import urlsplit

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from ..errors import InvalidArgument
from ..files import check_writable_folder
from ..kernels.origin import source_of

__all__ = ["KeyedDatabase", "PlannedDatabase", "campaign_scope", "open_database", "parse_redis_url"]

CONNECT_TIMEOUT_S = 3.0
# Bounds one database operation too: a server that stops answering mid-campaign is an error, not a hang.
SOCKET_TIMEOUT_S = 30.0
_FORM = "Pass --database redis://HOST:PORT or redis://HOST:PORT/DB (DB a number, e.g. redis://127.0.0.1:6379/0)."


def open_database(spec: str | Path | None, *, default_dir: str | Path) -> ExampleDatabase:
    """The example database ``spec`` names: None -> a directory database in ``default_dir``, a path -> a
    directory database there (a folder that can be written, created if need be), ``redis://HOST:PORT[/DB]`` ->
    a Redis database (the server must answer)."""
    if spec is None:
        return DirectoryBasedExampleDatabase(str(default_dir))
    text = str(spec)
    if "://" not in text:  # a folder that takes files, never an existing file (hypothesis would store nothing)
        return DirectoryBasedExampleDatabase(str(check_writable_folder("--database", text)))
    return _redis_database(text, **parse_redis_url(text))


def parse_redis_url(url: str) -> dict:
    """``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`` as keyword arguments of ``redis.Redis``."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when it is not a number in range
    except ValueError as exc:
        raise _refused(url, f"not a valid Redis URL ({exc})") from None
    if parts.scheme != "redis":
        raise _refused(url, f"unsupported scheme {parts.scheme!r}: a database is a directory or a Redis URL")
    db = parts.path.strip("/") or "0"
    if not parts.hostname or not db.isdigit() or parts.query or parts.fragment:
        raise _refused(url, "not a valid Redis URL (expected a host, an optional port and an optional database "
                       "number, nothing else)")
    return {"host": parts.hostname, "port": port or 6379, "db": int(db), "username": parts.username or None,
            "password": parts.password or None}


def _redis_database(url: str, **address) -> ExampleDatabase:
    try:  # an optional dependency (flashcheck[redis]): imported only for a redis:// database
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise _refused(url, "a Redis database needs the `redis` client package, which is not installed",
                       "Run pip install 'flashcheck[redis]', or pass a directory.") from None
    # The PING is not retried: a server that is down says so at once, one that is unreachable in one timeout.
    probe = redis.Redis(**address, socket_connect_timeout=CONNECT_TIMEOUT_S, retry=Retry(NoBackoff(), 0))
    try:
        probe.ping()
    except redis.RedisError as exc:
        raise _refused(url, f"the Redis server did not answer a PING (connect timeout {CONNECT_TIMEOUT_S:g} s; "
                       f"{type(exc).__name__}: {exc})", "Start the server (redis-server --port PORT), check the "
                       "host, port and database number, or pass a directory.") from None
    finally:
        probe.close()
    return RedisExampleDatabase(redis.Redis(**address, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                            socket_timeout=SOCKET_TIMEOUT_S))


def _refused(url: str, problem: str, fix: str = _FORM) -> InvalidArgument:
    # The message echoes the URL, but never its password.
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    shown = url.replace(f":{password}@", ":***@", 1) if password else url
    return InvalidArgument("--database", shown, problem, fix)


def campaign_scope(kernel, *, spec, kernel_options: dict | None, backward: bool, drawing: dict) -> str:
    """The key suffix of a campaign's entries in a shared example database: a hash of the kernel (what
    resolves back to it, else its name, and its options), the spec its cases are drawn for, the pass and the
    preset's drawing options (``Preset.strategy_options``). The test body is the same for every campaign, so
    without it one kernel would replay another's stored failure (and hypothesis, which does not shrink a
    stored failure again, would report it as shrunk); stored choices are a case only under the strategy
    that stored them. Entries stored before campaigns were keyed so are not replayed any more (nor removed)."""
    identity = {"kernel": source_of(kernel) or kernel.name, "options": kernel_options or {}, "spec": spec.as_dict(),
                "backward": backward, "drawing": drawing}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


class KeyedDatabase(ExampleDatabase):
    """``base`` seen with every key suffixed by ``suffix`` (none when it is None): one test body driven by
    engines with different strategies (campaigns of other kernels, one engine per dtype) keeps each engine's
    stored choices apart, since another strategy would read them as another case. ``failures_only`` hides the passing cases
    hypothesis keeps for its target phase (the ``.pareto`` key), so that a replay reads stored failures only."""

    def __init__(self, base: ExampleDatabase, suffix: str | None, *, failures_only: bool = False):
        super().__init__()
        self.base, self.failures_only = base, failures_only
        self.suffix = b"" if suffix is None else b"." + suffix.encode()

    def fetch(self, key: bytes):
        if not (self.failures_only and key.endswith(b".pareto")):
            yield from self.base.fetch(key + self.suffix)

    def save(self, key: bytes, value: bytes) -> None:
        self.base.save(key + self.suffix, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.base.delete(key + self.suffix, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.base.move(src + self.suffix, dest + self.suffix, value)


class PlannedDatabase(ExampleDatabase):
    """One planned case (its serialised choices, ``entry``) for hypothesis's reuse phase, over ``base``,
    where what hypothesis saves goes (a failure found from the planned case, shrunk, is stored as any).

    The case is offered as a secondary entry, a failing case not yet shrunk: hypothesis takes a primary
    entry that fails again for an already shrunk one and would not shrink it."""

    def __init__(self, base: ExampleDatabase, entry: bytes):
        super().__init__()
        self.base, self.entry = base, entry

    def fetch(self, key: bytes):
        if key.endswith(b".secondary"):
            yield self.entry

    def save(self, key: bytes, value: bytes) -> None:
        self.base.save(key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        if value != self.entry:
            self.base.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.base.save(dest, value) if value == self.entry else self.base.move(src, dest, value)
