"""dlscale/case/stacks.py: where each rank was at the time limit (faulthandler dumps, parsed and summarised)."""
from __future__ import annotations

import faulthandler
import os
import threading
import time

import pytest

from dlscale.case import launch, stacks
from dlscale.case.procs import ProcResult

DUMP = '''Thread 0x00007f1111111111 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/venv/lib/python3.11/site-packages/dlscale/inputs/source.py", line 95 in _run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f2222222222 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 647 in backward
  File "/work/dlscale/train/worker.py", line 142 in step
  File "/work/dlscale/train/worker.py", line 300 in _train_loop
  File "<frozen runpy>", line 88 in _run_code
'''


def test_parse_takes_the_main_thread_innermost_first():
    # the main thread is listed last (faulthandler goes newest first); here it is also "Current thread"
    frames = stacks.parse(DUMP)
    # a thread started without threading.py (execnet's, torch's autograd thread running a Python
    # hook) listed before the main thread is not taken for it
    other = 'Thread 0x00007f3333333333 (most recent call first):\n  File "/x/execnet/gateway_base.py", line 9 in run\n\n'
    assert stacks.parse(other + DUMP) == frames
    assert frames[0] == ("/venv/lib/python3.11/site-packages/torch/autograd/graph.py", 979, "_engine_run_backward")
    assert frames[-1] == ("<frozen runpy>", 88, "_run_code") and len(frames) == 5
    assert stacks.waiting(frames)
    assert stacks.where(frames) == ("torch/autograd/graph.py:979 in _engine_run_backward "
                                    "(from dlscale/train/worker.py:142 in step)")
    assert stacks.parse("") == [] and stacks.where([]) == "unknown"


def test_summary_names_the_rank_outside_any_collective_first():
    hung = [("/work/dlscale/train/worker.py", 108, "check"), ("/work/dlscale/train/worker.py", 300, "_train_loop")]
    text = stacks.summary({0: stacks.parse(DUMP), 1: hung}, [0, 1])
    assert text == ("stalled outside any collective: rank 1 at dlscale/train/worker.py:108 in check. "
                    "waiting in a collective or the backward: rank 0 at torch/autograd/graph.py:979 in "
                    "_engine_run_backward (from dlscale/train/worker.py:142 in step)")
    assert stacks.summary({}, [0, 1]) is None and stacks.summary({2: hung}, [0, 1]) is None
    # classify appends it to the time-limit message
    status, error = launch.classify(ProcResult(None, True, 0.0, ""), [], 2, started={0: 10, 1: 11}, rank_stacks={1: hung})
    assert status == "timeout" and error.endswith("ranks not finished: [0, 1]. stalled outside any collective: "
                                                  "rank 1 at dlscale/train/worker.py:108 in check")


@pytest.mark.skipif(not hasattr(faulthandler, "register"), reason="faulthandler.register: POSIX only")
def test_arm_request_read_in_this_process(tmp_path):
    """A real dump: this process arms itself, is asked (SIGUSR1 to its own pid), and its main thread
    is found in this test while a background thread sleeps."""
    stop = threading.Event()
    side = threading.Thread(target=stop.wait, daemon=True)
    side.start()
    try:
        stacks.arm(tmp_path, 3)
        stacks.request(tmp_path, {3: os.getpid()}, wait_s=2.0)
        got = stacks.read(tmp_path)
    finally:
        faulthandler.unregister(stacks.SIGNAL)
        stacks._armed.pop().close()
        stop.set()
    assert list(got) == [3]
    assert any(func == "test_arm_request_read_in_this_process" for _, _, func in got[3])
    assert not any(f.endswith("threading.py") and func == "_bootstrap" for f, _, func in got[3])
    # a pid that cannot answer (stopped, gone) is skipped without waiting the whole time
    t = time.monotonic()
    stacks.request(tmp_path, {4: os.getpid()}, skip={os.getpid()}, wait_s=5.0)
    assert time.monotonic() - t < 1.0
