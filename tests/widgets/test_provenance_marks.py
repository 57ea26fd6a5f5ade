"""Every figure a panel shows says what it stands on (issue 52 item 4): the planner's step and time to train, the
serving panel's latencies, each with the estimate's provenance as a small mark."""

from __future__ import annotations

from toolkit.estimate.report import estimate_result
from toolkit.specs import Job, load_catalog
from widgets.provenance import provenance_mark

CATALOG = load_catalog()


def test_the_planners_step_carries_its_mark():
    from widgets.planner_text import summary_html

    job = Job.from_dict({"model": {"preset": "llama3-8b"}, "cluster": {"accelerator": "H100-SXM", "count": 8}},
                        CATALOG)  # fmt: skip
    assert "[modelled]" in summary_html(estimate_result(job, CATALOG))


def test_marks_say_what_they_mean_on_hover():
    mark = provenance_mark("assumed")
    assert "[assumed]" in mark and "title=" in mark and "no measurement" in mark
    assert provenance_mark(None) == ""
