"""The seam between ``--jobs`` and its workers: a policy (``campaign.scheduler.seeds``) sees workers and typed
messages through a transport, never processes or pipes, so that another transport (a cluster's) could carry
the same campaign."""

from __future__ import annotations

from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.campaign.messages import Ended, FindingSaved, Finished, Progress
from flashcheck.campaign.result import CampaignResult
from flashcheck.campaign.scheduler import run_workers
from flashcheck.campaign.scheduler.seeds import SeedShares
from flashcheck.campaign.transport import Worker
from flashcheck.campaign.worker_deaths import exit_text
from flashcheck.inputs.presets import load_preset


class ScriptedTransport:
    """Workers that say what a script says: what a transport owes a policy, and nothing more."""

    replaces = False

    def __init__(self, script):
        self.script, self.started, self.ended = script, None, False

    def start(self, child, payloads, name):
        self.started = (child, payloads, name)
        self.workers = [Worker(i, channel=None, gpu=None) for i in range(len(payloads))]
        return self.workers

    def events(self, on_tick=None):
        for index, message in self.script:
            if on_tick is not None:
                on_tick()
            yield self.workers[index], message

    def alive(self, worker):
        return False

    def send(self, worker, message):
        pass

    def replace(self, worker, payload):
        return None

    def exitcode(self, worker):
        return -9

    def how_ended(self, worker):
        return exit_text(self.exitcode(worker))

    def terminate(self, worker):
        pass

    def kill(self, worker):
        pass

    def end(self):
        self.ended = True


def _summary(seed, cases, findings=()):
    result = CampaignResult(verdict="PASS", kernel="torch:math", device="cpu", preset="smoke", seed=seed,
                            cases=cases, examples=cases, elapsed=1.0)
    result.by_status["PASS"] = cases
    result.findings.extend(findings)
    result.conclude()
    return result.summary()


def test_the_seed_policy_runs_over_any_transport():
    config = CampaignConfig(Target("torch:math", "cpu", load_preset("smoke"))).replace(max_examples=5, seed=7)
    finding = {"status": "BUG", "cause": "numerical", "title": "t", "case": "c", "dtype": "fp16", "diagnosis": []}
    totals = []
    policy = SeedShares(config, 2, totals.append)
    transport = ScriptedTransport([(0, Finished(_summary(1, 3))), (1, FindingSaved(finding)),
                                   (1, Progress(_summary(2, 1))), (0, Ended()), (1, Ended())])
    run_workers(policy, transport)
    child, payloads, name = transport.started
    assert name == "flashcheck-fuzz" and child is SeedShares.child and transport.ended
    assert [p.config.limits.max_examples for p in payloads] == [3, 2]
    assert len({p.config.drawing.seed for p in payloads}) == 2
    assert [(t.cases, len(t.findings)) for t in totals] == [(3, 0), (3, 1), (4, 1)]
    combined = policy.summary("torch:math")
    assert combined.verdict == "BUG" and combined.cases == 4 and combined.jobs == 2 and combined.seed == 7
    assert [s["stopped"] for s in combined.sources] == ["max_examples", "worker_died"]
    assert combined.sources[1]["exit"] == "killed by signal SIGKILL, maybe by the system's out-of-memory killer"
