"""--keep-going: past the first bug, each distinct bug shrunk and saved once, the others counted."""

from __future__ import annotations

from flashcheck import AttentionCase

from ._run import fuzz


def test_each_distinct_bug_is_shrunk_once_and_the_campaign_runs_to_max_examples(tmp_path, capsys):
    # two_bugs crashes on more than 16 query rows and is over budget on rows past 8 of the others
    code, summary = fuzz(tmp_path, "two_bugs", "--keep-going", "--max-examples", "40")
    assert code == 1 and summary["verdict"] == "BUG" and summary["keep_going"]
    assert summary["stopped"] == "max_examples" and summary["examples"] == 40
    shrunk = {f["kinds"][0]: f for f in summary["findings"] if f["shrunk"]}
    found = [f["kinds"] for f in summary["findings"] if not f["shrunk"]]
    assert sorted(shrunk) == ["crash", "over_budget"] and sorted(found) == [["crash"], ["over_budget"]]
    assert len(summary["findings"]) == 4, "one case as found and one shrunk per bug, however many cases hit it"
    assert AttentionCase.load(shrunk["crash"]["path"]).shapes.n_q == 17
    assert 8 < AttentionCase.load(shrunk["over_budget"]["path"]).shapes.n_q <= 16
    counts = summary["bug_signatures"]
    assert set(counts) == {"crash:IndexError", "numerical:out"} and max(counts.values()) > 1, counts
    assert [b["cause"] for b in summary["bugs"]] == sorted(counts, key=lambda c: -counts[c])
    assert "distinct bugs: 2" in capsys.readouterr().out


def test_without_keep_going_the_first_bug_ends_the_campaign(tmp_path):
    code, summary = fuzz(tmp_path, "two_bugs", "--max-examples", "40")
    assert code == 1 and summary["stopped"] == "bug_found" and summary["examples"] < 40
    assert len([f for f in summary["findings"] if f["shrunk"]]) == 1
    assert sum(summary["bug_signatures"].values()) == 1


def test_a_replay_that_meets_the_time_budget_is_the_stop_not_a_flaky_kernel(tmp_path, monkeypatch):
    # hypothesis re-runs a case that passed; the time is out by then, so the body stops it, and hypothesis
    # reports the different outcome as Flaky: no bug was being shrunk, so the campaign just ends
    from hypothesis.errors import Flaky

    from flashcheck.campaign import rounds

    def make_test(self, strategy, **settings):
        def test():
            self.host.stop_reason = "time_budget"
            raise Flaky("Inconsistent results from replaying a test case!")
        return test

    monkeypatch.setattr(rounds.Schedule, "_make_test", make_test)
    code, summary = fuzz(tmp_path, "correct", "--keep-going")
    assert summary["stopped"] == "time_budget" and code == 3  # no case judged: NO_CASES, not PASS
    assert not [n for n in summary["notes"] if "flaky" in n], summary["notes"]
