"""Connecting to Ray (engine/evaluation/ray_population.py ``connect_ray``) when a cluster is already running.

A real Ray head (``ray start --head``, 1 CPU, its own temp dir and port) runs in a fixture; the
driver must join it rather than call ``ray.init(num_cpus=...)``, which Ray refuses once it finds a
running cluster. No vLLM actors: only the connect logic. The teardown stops exactly the processes of
this head (those naming its temp dir, and their descendants) and checks that none is left; it does
not run ``ray stop``, which would also stop other users' Ray instances on a shared machine.
Integration tier: it starts Ray's daemons (about 10 s).
"""
from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from engine.evaluation.ray_population import connect_ray, running_cluster_address  # noqa: E402

pytestmark = pytest.mark.integration


def _head_processes(temp_dir: Path) -> list:
    """Processes of the head started with ``--temp-dir=temp_dir``: those naming it and their descendants."""
    found = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if str(temp_dir) in " ".join(p.info["cmdline"] or []):
                found[p.pid] = p
                found.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.Error:
            pass
    return list(found.values())


@pytest.fixture
def ray_head():
    """``ray start --head`` on a free port with 1 CPU; yields its address ``<node ip>:<port>``."""
    if ray.is_initialized():
        pytest.skip("this process is already connected to Ray")
    temp_dir = Path(tempfile.gettempdir()) / f"rt-{uuid.uuid4().hex[:8]}"  # short: Ray's socket paths are limited
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={port}", "--num-cpus=1",
           f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats"]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=180)
        yield f"{ray.util.get_node_ip_address()}:{port}"  # the head listens on the node's address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        procs = _head_processes(temp_dir)
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=15)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=10)
        left = [p.pid for p in _head_processes(temp_dir)]
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray processes of the test head still running: {left}"


def test_connects_to_the_running_cluster_named_by_ray_address(ray_head, monkeypatch, caplog):
    # issue 16: with RAY_ADDRESS set and engine.address empty, ray.init(num_cpus=...) raised
    # "When connecting to an existing cluster, num_cpus and num_gpus must not be provided"
    monkeypatch.setenv("RAY_ADDRESS", ray_head)
    assert running_cluster_address() == ray_head
    with caplog.at_level(logging.INFO, logger="essa.ray"):
        owns = connect_ray("", num_cpus=4)
    assert owns is False                                   # not ours: the run must not shut it down
    assert ray.is_initialized() and ray.get_runtime_context().gcs_address == ray_head
    assert ray.cluster_resources().get("CPU") == 1.0       # the head's 1 CPU, not a new instance with 4
    assert "connected to it at " + ray_head in caplog.text and "RAY_ADDRESS" in caplog.text
    ray.shutdown()
    # engine.address given explicitly: the same cluster, even without RAY_ADDRESS
    monkeypatch.delenv("RAY_ADDRESS")
    assert connect_ray(ray_head, num_cpus=4) is False
    assert ray.cluster_resources().get("CPU") == 1.0
    ray.shutdown()
