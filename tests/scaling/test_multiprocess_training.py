"""Loss-scaled FSDP training across two processes on localhost (``jax.distributed``, gloo on CPU).

The two processes run ``_multiprocess_train.py``: 2 host CPU devices each, one global mesh of 4,
weight rows split over all 4, the batch split between the processes. A NaN in process 1's batch
and an inf in a gradient row that only process 1 holds must each be skipped by both processes
(parameters bit-identical, scale halved on both), the scales must agree at every step, the final
parameters must be bit-identical as gathered by either process, and an orbax checkpoint written by
both must restore bit for bit with the same shardings.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).with_name("_multiprocess_train.py")
ROOT = pathlib.Path(__file__).parents[2]
NAN_STEP, INF_STEP, TIMEOUT = 2, 4, 150


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pair(ckpt: pathlib.Path) -> list[list[dict]]:
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    port = _free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(SCRIPT),
                str(i),
                str(port),
                str(ckpt),
                str(NAN_STEP),
                str(INF_STEP),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, err[-4000:]
            outs.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outs


def test_two_processes_skip_together_and_checkpoint(tmp_path):
    runs = _run_pair(tmp_path / "ckpt")
    steps = [[r for r in run if "step" in r] for run in runs]
    finals = [next(r for r in run if r.get("final")) for run in runs]
    assert [len(s) for s in steps] == [6, 6]
    for a, b in zip(*steps, strict=True):
        k = a["step"]
        assert a["step"] == b["step"]
        bad = k in (NAN_STEP, INF_STEP)
        for r in (a, b):
            assert r["finite"] is (not bad), r
            assert r["skipped"] == (k >= NAN_STEP) + (k >= INF_STEP), r
            if bad:  # skipped on both: parameters bit-identical, scale halved
                assert r["unchanged"] and r["unchanged_local"], r
                assert r["scale"] == r["scale_before"] / 2, r
            else:
                assert not r["unchanged"], r
                assert r["scale"] == r["scale_before"], r
        # the NaN comes from the batch, the inf only from the gradient
        assert a["backward_finite"] is b["backward_finite"] is (k != NAN_STEP)
        assert a["scale"] == b["scale"] and a["scale_before"] == b["scale_before"]
        assert a["params_hash"] == b["params_hash"]  # the gathered parameters agree every step
        assert a["loss"] == b["loss"] or k == NAN_STEP
    assert steps[0][-1]["scale"] == 2.0**10 / 4
    fa, fb = finals
    assert fa["params_hash"] == fb["params_hash"] and fa["state_hash"] == fb["state_hash"]
    assert fa["local_params_hash"] != fb["local_params_hash"]  # each holds different rows
    for f in finals:
        assert f["restored_params_hash"] == f["params_hash"], f
        assert f["restored_state_hash"] == f["state_hash"], f
        assert f["restored_local_params_hash"] == f["local_params_hash"], f
        assert f["same_shardings"] and f["restored_scale"] == 2.0**10 / 4, f
