"""``selftest --jobs N --chunk K``: rows cut into chunks of cases, handed out round-robin, merged back
into the rows one process gives."""

from __future__ import annotations

import json
import math

import pytest

from flashcheck.campaign.messages import Ended, PartDone, Shutdown, WorkerReady
from flashcheck.campaign.scheduler import JobError
from flashcheck.campaign.transport import ProcessTransport, Worker
from flashcheck.cli import main
from flashcheck.selftest.parallel import SelftestParts
from flashcheck.selftest.rows import Detection, Row, combine_parts, row_parts
from flashcheck.selftest.table import format_table

ANCHOR_KEYS = ("flash-attention/randn", "flash-attention/adversarial", "triton-tutorial/randn",
               "triton-tutorial/adversarial")


def test_row_chunks_cut_correct_rows_evenly_and_give_planted_bugs_a_small_first_chunk():
    assert row_parts(True, 7, 60, 3) == [(0, 3), (3, 6), (6, 7)]
    assert row_parts(True, 600, 60) == [(i, i + 50) for i in range(0, 600, 50)]
    assert row_parts(False, 600, 60) == [(0, 12), (12, 60)]
    assert row_parts(False, 600, 60, 20) == [(0, 12), (12, 32), (32, 52), (52, 60)]
    assert row_parts(False, 60, 8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert row_parts(False, 60, 5) == [(0, 5)] and row_parts(True, 0, 60) == [(0, 0)]


def _row(cases, first=None, how="", alarms=0, ratio=0.0, caught=math.inf, susp=0, stopped=False, anchors=None):
    anchors = anchors or {}
    return Row("v", True, "correct", "fp16", cases, Detection(first, how, alarms),
               {k: anchors.get(k, Detection()) for k in ANCHOR_KEYS}, ratio, caught, susp, 1.5, stopped)


def test_merged_chunks_keep_the_first_case_sum_counts_and_keep_extremes():
    a = _row(3, ratio=0.5, anchors={"flash-attention/randn": Detection(None, "n/a", 0)})
    b = _row(3, first=5, how="lse", alarms=2, ratio=0.9, caught=4.0, susp=1,
             anchors={"flash-attention/randn": Detection(None, "n/a", 0),
                      "triton-tutorial/randn": Detection(6, "rejected", 1)})
    c = _row(2, first=8, how="over_budget", alarms=1, ratio=0.7, caught=2.0, stopped=True,
             anchors={"triton-tutorial/randn": Detection(7, "crash or wrong output", 2)})
    for order in ([a, b, c], [c, a, b]):
        row = combine_parts(order)
        assert (row.cases, row.max_ratio, row.min_caught_ratio, row.suspicious, row.seconds) == (8, 0.9, 2.0, 1, 4.5)
        assert row.flashcheck.as_dict() == {"first_case": 5, "how": "lse", "false_alarms": 3}
        assert row.anchors["flash-attention/randn"].as_dict() == {"first_case": None, "how": "n/a", "false_alarms": 0}
        assert row.anchors["triton-tutorial/randn"].as_dict() == {"first_case": 6, "how": "rejected", "false_alarms": 3}
        assert row.anchors["triton-tutorial/adversarial"].as_dict() == Detection().as_dict()
        assert row.stopped
    assert not combine_parts([a, b]).stopped
    a.gradient_max, b.gradient_max = {"dq": 0.5, "dv": 0.2}, {"dq": 0.3, "dk": 0.9}
    assert combine_parts([a, b, c]).gradient_max == {"dk": 0.9, "dq": 0.5, "dv": 0.2}


def test_merged_chunks_add_up_the_features_and_the_table_says_what_a_clean_sample_rules_out():
    a, b = _row(300), _row(200)
    a.features, b.features = {"softcap": 250, "sinks": 100}, {"softcap": 50, "window": 150}
    row = combine_parts([a, b])
    assert row.features == {"softcap": 300, "window": 150, "sinks": 100}
    assert Row.from_dict(json.loads(json.dumps(row.as_dict()))).features == row.features
    line = [x for x in format_table([row]).splitlines() if x.startswith("correct variants by feature")]
    assert line == ["correct variants by feature (judged cases): softcap 300 (rate < 0.99%), window 150 (rate < 2%), "
                    "sinks 100 (rate < 3%); none failed, so each rate is below 1 - 0.05^(1/n) (about 3/n) at 95%"]
    few = _row(2)
    few.features = {"softcap": 2}  # the exact bound, not 3/n (150% for n = 2)
    assert "softcap 2 (rate < 78%)" in format_table([few])
    row.suspicious = 1  # a failure: the sample rules nothing out
    assert "no rate is ruled out" in format_table([row]) and "rate <" not in format_table([row])
    assert "by feature" not in format_table([_row(5)])  # no variants drawn: no line


class _Channel:
    def __init__(self):
        self.sent = []

    def send(self, message):
        self.sent.append(message)


def test_chunks_go_out_round_robin_and_a_planted_bug_runs_on_only_while_not_caught():
    plan = [("good", "fp16"), ("bug", "fp16"), ("other", "fp16")]
    correct = {"good": True, "bug": False, "other": True}
    done = []
    scheduler = SelftestParts(plan, correct, lambda ok: row_parts(ok, 9, 9, 3, 2), None, done.append)
    worker = Worker(0, _Channel(), None)
    scheduler.started([worker], ProcessTransport("cpu"))
    order = []

    def step(result=None):
        if result is not None:
            scheduler.handle(worker, PartDone(worker.channel.sent[-1].task_id, result.as_dict()))
        else:
            scheduler.handle(worker, WorkerReady())
        message = worker.channel.sent[-1]
        if not isinstance(message, Shutdown):
            order.append((message.subject, (message.start, message.stop), message.fired))
        return message

    step()
    step(_row(3))                                      # good [0, 3)
    step(_row(2))                                      # bug [0, 2): not caught
    step(_row(3))                                      # other [0, 3)
    fired = {"flash-attention/randn": Detection(4, "rejected")}
    step(_row(3))                                      # good [3, 6)
    step(_row(3, first=3, how="lse", anchors=fired))   # bug [2, 5): flashcheck and one anchor fired
    step(_row(3))                                      # other [3, 6)
    step(_row(3))                                      # good [6, 9)
    caught = {k: Detection(6, "rejected") for k in ANCHOR_KEYS}
    step(_row(2, anchors=caught))                      # bug [5, 8): the rest fired, so [8, 9) never runs
    assert step(_row(3)) == Shutdown()                 # other [6, 9); then nothing is left
    assert order == [("good", (0, 3), ()), ("bug", (0, 2), ()), ("other", (0, 3), ()),
                     ("good", (3, 6), ()), ("bug", (2, 5), ()), ("other", (3, 6), ()),
                     ("good", (6, 9), ()), ("bug", (5, 8), ("flash-attention/randn", "flashcheck")),
                     ("other", (6, 9), ())]
    assert [s.row.cases for s in scheduler.rows] == [9, 7, 9] and not any(s.row.stopped for s in scheduler.rows)
    assert len(done) == 3 and scheduler.rows[1].row.flashcheck.first_case == 3


def test_a_deadline_stops_sending_later_chunks_and_marks_the_rows_stopped():
    plan = [("good", "fp16"), ("bug", "fp16")]
    done = []
    scheduler = SelftestParts(plan, {"good": True, "bug": False}, lambda ok: row_parts(ok, 9, 9, 3), 0.0,
                               done.append)
    worker = Worker(0, _Channel(), None)
    scheduler.started([worker], ProcessTransport("cpu"))
    scheduler.handle(worker, WorkerReady())  # past the deadline, a row still gets its first chunk (its first case)
    scheduler.handle(worker, PartDone(worker.channel.sent[-1].task_id, _row(1, stopped=True).as_dict()))
    task = worker.channel.sent[-1]
    assert (task.start, task.stop) == (0, 3) and (task.subject, task.dtype) == ("bug", "fp16")
    scheduler.handle(worker, PartDone(task.task_id, _row(1, stopped=True).as_dict()))
    assert worker.channel.sent[-1] == Shutdown() and len(worker.channel.sent) == 3
    assert [(r.cases, r.stopped) for r in done] == [(1, True), (1, True)]


class _Cluster(ProcessTransport):
    """A transport that replaces a lost worker, as a cluster's does: with one that says nothing until ready."""

    replaces = True

    def __init__(self):
        super().__init__("cpu")
        self.replaced = []

    def replace(self, worker, payload):
        self.replaced.append((worker.index, payload))
        return Worker(worker.index, _Channel(), None)


def test_a_part_lost_with_its_worker_goes_out_again_once_where_workers_are_replaced():
    scheduler = SelftestParts([("good", "fp16")], {"good": True}, lambda ok: row_parts(ok, 6, 6, 3), None,
                              config="the config", jobs=1)
    cluster, worker, other = _Cluster(), Worker(0, _Channel(), None), Worker(0, _Channel(), None)
    scheduler.started([worker], cluster)
    scheduler.handle(worker, WorkerReady())
    scheduler.handle(worker, Ended())  # lost with part 0: it goes out again, to a worker in its place
    assert cluster.replaced == [(0, "the config")]
    scheduler.handle(other, WorkerReady())
    assert [(t.start, t.stop) for t in other.channel.sent] == [(0, 3)]
    scheduler.handle(other, Ended())  # lost again: the row is lost, and nothing is left to run
    assert len(cluster.replaced) == 1 and scheduler.rows[0].lost
    with pytest.raises(JobError, match="ended before these rows"):
        scheduler.result()


@pytest.mark.interpreter
def test_chunked_rows_in_two_processes_are_the_rows_of_one(tmp_path, capsys):
    # exp_instead_of_exp2: flashcheck fires at case 2, the anchors at case 6 (the row runs on to there);
    # q_row_stride_packed: flashcheck fires at case 5, in a later chunk; torch:math: an anchor's false
    # alarms in two chunks add up.
    args = ["selftest", "--device", "cpu", "--dtype", "fp16", "--cases", "8", "--bug-cases", "8", "--max-n", "32",
            "--variant", "torch:math", "--variant", "exp_instead_of_exp2", "--variant", "q_row_stride_packed"]
    tables, rows = [], []
    for extra in (["--jobs", "1"], ["--jobs", "2", "--chunk", "3"]):
        path = tmp_path / f"jobs{extra[1]}.json"
        assert main(args + extra + ["--json", str(path)]) == 0
        tables.append(capsys.readouterr().out)
        rows.append([{**r, "seconds": None} for r in json.loads(path.read_text())])
    assert [r["variant"] for r in rows[0]] == ["torch:math", "exp_instead_of_exp2", "q_row_stride_packed"]
    assert rows[0][0]["cases"] == 8 and all(r["flashcheck"]["first_case"] for r in rows[0][1:])
    assert rows[0] == rows[1] and tables[0] == tables[1]
    assert main(["selftest", "--device", "cpu", "--jobs", "2", "--chunk", "0"]) == 2
    assert "--chunk=0" in capsys.readouterr().err
