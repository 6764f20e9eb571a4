"""A worker lost before its share is done (``campaign.scheduler.shares``): where the transport can replace it, another
takes the cases and seconds left, with a seed of its own and the covering cells drawn left out; where it cannot, the
summary says so. A campaign whose driver died is resumed from its progress record by the same rules. Scripted
transports: no process, no cluster."""

from __future__ import annotations

import pytest

from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.campaign.messages import Ended, FindingSaved, Finished, Progress
from flashcheck.campaign.progress import RunRecord, campaign_key, progress_folder, read_runs
from flashcheck.campaign.result import CampaignResult
from flashcheck.campaign.scheduler import run_workers
from flashcheck.campaign.scheduler.seeds import SeedShares
from flashcheck.campaign.scheduler.shares import MAX_RUNS, job_seed, run_seed
from flashcheck.campaign.transport import Worker
from flashcheck.cli.summary import print_summary
from flashcheck.inputs.covering import PlanShare
from flashcheck.inputs.presets import load_preset


class Cluster:
    """Workers that say what a script says; a lost one is replaced (as a cluster's are) while ``room`` lasts."""

    replaces = True

    def __init__(self, script, room: int):
        self.script, self.room, self.replaced = script, room, []

    def start(self, child, payloads, name):
        self.payloads = payloads
        self.workers = [Worker(i, channel=None, gpu=None, node=f"node{i}") for i in range(len(payloads))]
        return list(self.workers)

    def replace(self, worker, payload):
        self.replaced.append(payload)
        if not self.room:
            return None
        self.room -= 1
        self.workers.append(Worker(worker.index, channel=None, gpu=None, node="spare"))
        return self.workers[-1]

    def events(self, on_tick=None):
        for slot, message in self.script:
            yield self.workers[slot], message

    def how_ended(self, worker):
        return "its actor or its node was lost (ActorDiedError)"

    def alive(self, worker):
        return False

    def send(self, worker, message):
        pass

    def exitcode(self, worker):
        return None

    def terminate(self, worker):
        pass

    def kill(self, worker):
        pass

    def end(self):
        pass


def _summary(cases, elapsed=1.0, stopped="max_examples"):
    result = CampaignResult(verdict="PASS", kernel="torch:math", device="cpu", preset="smoke", seed=1, cases=cases,
                            examples=cases, elapsed=elapsed, stopped=stopped)
    result.by_status["PASS"] = cases
    result.conclude()
    return result.summary()


def _config(tmp_path, **limits):
    target = Target("torch:math", "cpu", load_preset("smoke"))
    return CampaignConfig(target).replace(max_examples=10, seed=7, corpus=str(tmp_path), **limits)


BUG = {"status": "BUG", "cause": "numerical", "title": "t", "case": "c", "dtype": "fp16", "diagnosis": [], "path": "p"}


def test_a_lost_workers_cases_and_seconds_go_to_another_with_a_seed_of_its_own(tmp_path):
    policy = SeedShares(_config(tmp_path, keep_going=True, time_budget=100.0), 2)
    # worker 0 drew 3 of its 5 cases in 30 s and saved a bug, then its node went; worker 1 ended its share
    cluster = Cluster([(0, FindingSaved(BUG)), (0, Progress(_summary(3, elapsed=30.0))), (0, Ended()),
                       (1, Finished(_summary(5))), (1, Ended()), (2, Finished(_summary(2))), (2, Ended())], room=1)
    run_workers(policy, cluster)
    [successor] = cluster.replaced
    assert successor.run == 1 and successor.config.max_examples == 2 and successor.config.time_budget == 70.0
    assert successor.config.drawing.seed == run_seed(7, 0, 2, 1) not in (job_seed(7, 0, 2), job_seed(7, 1, 2))
    assert PlanShare(*successor.config.drawing.plan).skip == 3 and PlanShare(*successor.config.drawing.plan).run == 1
    summary = policy.summary("torch:math")
    assert [s["source"] for s in summary.sources] == ["worker0", "worker0.1", "worker1"]
    assert summary.examples == 10 and summary.verdict == "BUG" and summary.sources[1]["node"] == "spare"
    assert summary.lost == [{"worker": "worker0", "cases": 3, "drawn": 3, "ended": cluster.how_ended(None),
                             "restarted_as": "worker0.1", "left": {"cases": 2, "seconds": 70.0}, "not_restarted": None}]


def test_a_lost_worker_that_no_node_takes_ends_the_share_and_the_summary_says_so(tmp_path, capsys):
    policy = SeedShares(_config(tmp_path, keep_going=True), 1)
    run_workers(policy, Cluster([(0, Progress(_summary(4))), (0, Ended())], room=0))
    summary = policy.summary("torch:math")
    assert summary.lost[0]["restarted_as"] is None and summary.lost[0]["not_restarted"] == \
        "no node had the resources free for it"
    print_summary(summary.as_dict())
    assert "lost: worker0 after 4 cases (4 drawn): its actor or its node was lost (ActorDiedError); not restarted: " \
        "no node had the resources free for it" in capsys.readouterr().out.replace("\n      ", " ")


@pytest.mark.parametrize("keep_going, findings, replaced", [(False, [BUG], 0), (True, [BUG], 1), (False, [], 1)])
def test_without_keep_going_a_share_that_found_a_bug_is_done(tmp_path, keep_going, findings, replaced):
    policy = SeedShares(_config(tmp_path, keep_going=keep_going), 1)
    cluster = Cluster([(0, FindingSaved(f)) for f in findings] + [(0, Progress(_summary(2))), (0, Ended())], room=0)
    run_workers(policy, cluster)
    assert len(cluster.replaced) == replaced


def test_a_campaign_whose_driver_died_goes_on_where_its_record_ends(tmp_path):
    config = _config(tmp_path, keep_going=True)
    folder = progress_folder(tmp_path, campaign_key(config, 2))
    lost = RunRecord(folder, 0, 0)  # worker 0 drew 3 cases, saved a bug, then the driver died
    for line in ("case a", "case b", "case c"):
        lost.drawn(line)
    lost.finding(BUG)
    lost.snapshot(_summary(3, elapsed=5.0))
    done = RunRecord(folder, 1, 0)  # worker 1 had ended its share
    done.snapshot(_summary(5), final=True)
    assert [(r.index, r.generation, len(r.drawn), r.final) for r in read_runs(folder)] == [(0, 0, 3, False),
                                                                                          (1, 0, 0, True)]
    policy = SeedShares(config, 2)
    [order] = policy.payloads()  # worker 1's share is done; worker 0's goes on
    assert order.run == 1 and order.config.max_examples == 2 and order.record == str(folder)
    run_workers(policy, Cluster([(0, Finished(_summary(2))), (0, Ended())], room=0))
    summary = policy.summary("torch:math")
    assert [s["source"] for s in summary.sources] == ["worker0", "worker0.1", "worker1"]
    assert summary.verdict == "BUG" and summary.examples == 10 and [f["path"] for f in summary.findings] == ["p"]
    assert summary.lost[0]["restarted_as"] == "worker0.1" and "earlier run" in summary.lost[0]["ended"]
    policy.end_record()
    assert SeedShares(config, 2).payloads()[0].run == 0  # done: the same command starts afresh


def test_a_share_lost_again_and_again_ends_after_its_last_worker(tmp_path):
    policy = SeedShares(_config(tmp_path), 1)
    cluster = Cluster([(slot, Ended()) for slot in range(MAX_RUNS)], room=MAX_RUNS)
    run_workers(policy, cluster)
    summary = policy.summary("torch:math")
    assert len(cluster.replaced) == MAX_RUNS - 1 and len(summary.lost) == MAX_RUNS
    assert summary.lost[-1]["not_restarted"] == f"its share was taken on by {MAX_RUNS} workers, each lost"
