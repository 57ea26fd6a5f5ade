"""The launcher's record of which rank died first (toolkit.launch.ranks.ExitOrder), on plain processes whose
exit order is set by construction: the first to die is named, not the lowest rank that failed."""

import json
import signal
import subprocess
import sys

from toolkit.launch.ranks import ExitOrder


def _sleeper(seconds: float, code: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time, sys; time.sleep({seconds}); sys.exit({code})"])


def test_exits_are_recorded_in_the_order_they_happen(tmp_path):
    workers = [_sleeper(1.2), _sleeper(30), _sleeper(0.4, code=7)]  # rank 2 dies first, then rank 0
    exits = ExitOrder(workers)
    try:
        while len(exits.order) < 2:
            exits.wait(0.2)
        workers[1].send_signal(signal.SIGKILL)
        while len(exits.order) < 3:
            exits.wait(0.2)
    finally:
        exits.close()
    assert [e["rank"] for e in exits.order] == [2, 0, 1]
    assert [e["code"] for e in exits.order] == [7, 0, -signal.SIGKILL]
    assert exits.order[1]["at_s"] - exits.order[0]["at_s"] > 0.5  # stamped as each exits, not per poll
    exits.write(tmp_path / "exits.json")
    assert json.loads((tmp_path / "exits.json").read_text())[2]["signal"] == "SIGKILL"
