"""``scripts/gpu_check.sh``, the one command a session with a GPU runs (issue 36), checked on
the CPU so that it cannot rot: its dry run (every stage, Triton interpreted, tiny shapes), its
one line and exit code without CUDA, a stage past its cap or failing, and the two ways it makes
a bare machine ready offline (wheels of missing packages, kvcheck from a checkout).

(On a GPU machine the script's own tests stage leaves this file out: it checks the script.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STAGES = ["env", "tests", "verify", "bench"]


def _gpu_check(*args, env=None, timeout=600):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _results(out: Path) -> dict:
    return json.loads((out / "gpu_check.json").read_text())


def test_dry_run_runs_every_stage(tmp_path):
    out = tmp_path / "out"
    r = _gpu_check("--dry-run", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = _results(out)
    assert res["dry_run"] is True and res["exit_code"] == 0
    assert list(res["stages"]) == STAGES
    for name, stage in res["stages"].items():
        assert stage["status"] == "ok" and stage["dry"] is True, (name, stage["problems"])
        assert stage["steps"] and all(s["ran"] and not s["timed_out"] for s in stage["steps"]), name
    env = res["stages"]["env"]["result"]
    assert env["python_torch_cuda"]["torch"] and env["python_torch_cuda"]["cuda_available"] is False
    assert env["python_torch_cuda"]["CUDA_VISIBLE_DEVICES"] == ""
    assert all("version" in env["deps"][d] for d in ("torch", "triton", "z3-solver", "hypothesis"))
    tests = res["stages"]["tests"]["result"]
    assert "interpreted" in tests["header"] and tests["junit"]["tests"] > 20
    assert tests["junit"]["failures"] == tests["junit"]["errors"] == 0
    assert tests["from_output"]["passed"] == tests["junit"]["tests"]
    verify = res["stages"]["verify"]["result"]
    assert [v["rc"] for v in verify["runs"]] == [0, 0, 0, 0]
    assert [v["verdict"] for v in verify["runs"][:2]] == ["pass", "pass"]
    tiers = verify["runs"][3]  # the tiered reference with its K/V, read back every step
    assert tiers["verdict"] == "pass" and tiers["ops"] > 50 and tiers["stats"]["store"]
    corpus = {c["target"]: c for c in verify["corpus"]["targets"]}
    assert set(corpus) == {"SwappedCopy", "OffByOneSlotKernel", "DeviceBlockManager"}
    assert all(c["backend"] == "triton" and c["problem"] is None for c in corpus.values())
    assert corpus["SwappedCopy"]["caught"] and not corpus["DeviceBlockManager"]["caught"]
    bench = res["stages"]["bench"]["result"]["runs"]
    assert [b["name"].split()[0] for b in bench] == ["llama-3.3-70b", "llama-3.3-70b", "default"]
    for b in bench:
        o = b["result"]
        assert o["step_reads_back_correctly"] and o["interpreted"] and o["backend"] == "triton"
        assert not o["gpu_figure"] and o["goal_met"] is None
        assert [k["kernel"] for k in o["kernels"]] == ["copy_blocks", "write_slots", "gather"]
        assert o["decode_step_copies"] == 2 and o["decode_step_writes"] == 4
    assert [b["result"]["preset"]["tp"] for b in bench[:2]] == [8, 4]
    text = (out / "gpu_check.txt").read_text()
    assert text.startswith("kvcheck gpu_check (DRY RUN") and text in r.stdout
    assert "===== bench / bench llama-3.3-70b tp8" in (out / "gpu_check.log").read_text()
    assert not any((ROOT / "kvcheck" / n).is_symlink() for n in ("spec", "impl", "proofs"))


def test_no_cuda_is_one_line_and_its_own_exit_code(tmp_path):
    out = tmp_path / "out"
    r = _gpu_check("--out", str(out), env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 5, r.stdout + r.stderr
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("no CUDA device here: torch ") and "--dry-run" in r.stderr
    assert not out.exists()  # nothing ran, nothing written


def test_bad_arguments_exit_2():
    r = _gpu_check("--only", "tests,nonsense")
    assert r.returncode == 2 and "unknown stage 'nonsense'" in r.stderr


def test_a_stage_past_its_cap_still_returns_the_others(tmp_path):
    hang = tmp_path / "test_hang.py"
    hang.write_text("import time\n\ndef test_hangs():\n    time.sleep(600)\n")
    out = tmp_path / "out"
    r = _gpu_check("--dry-run", "--out", str(out), "--only", "tests,bench", "--tests", str(hang),
                   "--cap", "tests=4")
    assert r.returncode == 4, r.stdout + r.stderr
    res = _results(out)
    assert res["exit_code"] == 4 and list(res["stages"]) == ["env", "tests", "bench"]
    tests = res["stages"]["tests"]
    assert tests["status"] == "timeout" and tests["steps"][0]["timed_out"]
    assert tests["seconds"] < 30 and "ran past its cap of 4 s" in tests["problems"][0]
    assert res["stages"]["bench"]["status"] == "ok"
    assert all(b["result"]["step_reads_back_correctly"]
               for b in res["stages"]["bench"]["result"]["runs"])


def test_ended_from_outside_it_leaves_nothing_running(tmp_path):
    """SIGTERM (a timeout around the whole command): the running stage's processes are ended,
    the results file says which stage was running, and the exit is 143."""
    pidfile = tmp_path / "pid"
    hang = tmp_path / "test_hang.py"
    hang.write_text(f"import os, time\n\ndef test_hangs():\n"
                    f"    open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                    f"    time.sleep(600)\n")
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", str(SCRIPT), "--dry-run", "--out", str(out), "--only",
                             "tests", "--tests", str(hang)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        pid = int(pidfile.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert _results(out)["stages"]["tests"]["status"] == "running"


def test_a_failed_check_is_exit_3(tmp_path):
    failing = tmp_path / "test_fails.py"
    failing.write_text("def test_passes():\n    pass\n\ndef test_fails():\n    assert 1 == 2\n")
    out = tmp_path / "out"
    r = _gpu_check("--dry-run", "--out", str(out), "--only", "tests", "--tests", str(failing))
    assert r.returncode == 3, r.stdout + r.stderr
    tests = _results(out)["stages"]["tests"]
    assert tests["status"] == "fail" and tests["result"]["junit"]["failures"] == 1
    assert len(tests["result"]["failed"]) == 1
    assert tests["result"]["failed"][0].endswith("test_fails.py::test_fails")
    assert "1 test(s) failed" in tests["problems"][0]


def _wheel(where: Path, name: str, version: str, value: int) -> Path:
    """A pure-Python wheel of one module ``name`` holding ``VALUE = value``."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VALUE = {value}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\n"
                                 f"Version: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def test_missing_or_old_packages_are_installed_offline_from_wheels(tmp_path):
    gc = _module()
    wheels = tmp_path / "whl"
    _wheel(wheels, "kvcheck_probe_pkg", "1.9", 9)
    _wheel(wheels, "kvcheck_probe_pkg", "1.10", 42)  # the newest (by version, not by name)
    required = [("kvcheck_probe_pkg", "kvcheck-probe-pkg", "1.5"), ("json", "json", None),
                ("kvcheck_absent_pkg", "kvcheck-absent-pkg", None)]
    with open(tmp_path / "log", "w") as log:
        stage = gc.Stage("env", 120, True, log)
        site = tmp_path / "site"
        env = {**os.environ}
        # missing: installed from its wheel; present: left alone; no wheel: said so
        deps = {"kvcheck-probe-pkg": {"error": "ModuleNotFoundError"}, "json": {"version": None}}
        origin = gc.install_missing(sys.executable, required, deps, wheels, site, env, stage)
        assert origin["kvcheck-probe-pkg"].startswith("installed offline from ")
        assert origin["json"] == "the machine's own"
        assert origin["kvcheck-absent-pkg"] == f"missing, and no wheel for it in {wheels}"
        assert stage.steps[0]["rc"] == 0 and "--no-index" in stage.steps[0]["cmd"]
        r = subprocess.run([sys.executable, "-c", "import kvcheck_probe_pkg as p; print(p.VALUE)"],
                           capture_output=True, text=True, env={**env, "PYTHONPATH": str(site)})
        assert r.stdout.strip() == "42", r.stderr
        # too old: installed too
        again = gc.install_missing(sys.executable, required[:1], {"kvcheck-probe-pkg": {
            "version": "1.4.9"}}, wheels, tmp_path / "site2", env, stage)
        assert again["kvcheck-probe-pkg"].startswith("installed offline")
        assert gc.too_old("1.4.9", "1.5") and not gc.too_old("6.155.2", "6.100")
        # no pip there (here: a "python" that fails): the wheel is unzipped instead
        unzipped = gc.install_missing("/bin/false", required[:1], {}, wheels, tmp_path / "site3",
                                      env, stage)
        assert unzipped["kvcheck-probe-pkg"].endswith("(unzipped: pip failed)")
        r = subprocess.run([sys.executable, "-c", "import kvcheck_probe_pkg as p; print(p.VALUE)"],
                           capture_output=True, text=True,
                           env={**env, "PYTHONPATH": str(tmp_path / "site3")})
        assert r.stdout.strip() == "42", r.stderr
        assert (tmp_path / "site3" / "kvcheck_probe_pkg-1.10.dist-info" / "METADATA").exists()


def test_a_bare_checkout_gets_kvcheck_importable(tmp_path):
    """Where kvcheck is not installed (the device machine: the files only, no network), the
    script links kvcheck/spec, impl, proofs to spec/, impl/, proofs/ (pyproject's package-dir)
    for the run, and removes the links after."""
    gc = _module()
    for d in ("kvcheck", "spec", "impl", "proofs"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import kvcheck.spec.invariants, kvcheck.impl.block_manager, kvcheck.proofs; "
            "print(kvcheck.spec.invariants.__file__)")

    def bare(cwd):  # no site-packages (-S): no installed kvcheck, no editable finder
        return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                              cwd=cwd, env={**os.environ, "PYTHONPATH": str(tmp_path)})

    assert "No module named 'kvcheck.spec'" in bare(tmp_path).stderr
    links = gc.map_kvcheck(tmp_path)
    assert sorted(p.name for p in links) == ["impl", "proofs", "spec"]
    assert gc.map_kvcheck(tmp_path) == []  # already there: nothing more
    for cwd in (tmp_path, tmp_path / "spec"):
        r = bare(cwd)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(tmp_path / "kvcheck" / "spec" / "invariants.py")
    gc.unmap(links)
    assert not any((tmp_path / "kvcheck" / n).exists() for n in ("spec", "impl", "proofs"))
    assert (tmp_path / "spec" / "invariants.py").exists()


def test_the_gpu_plan_fits_eight_minutes():
    """The GPU run's stage caps sum to 8 minutes at most (the device tool's call allows 540 s),
    and each stage's commands fit in their stage's cap, so none is cut for want of time alone."""
    gc = _module()
    caps = gc.parse([]).caps
    assert set(caps) == set(STAGES) and sum(caps.values()) <= 480
    assert sum(c for *_, c in gc.verify_plan(False)) + gc.CORPUS_CAP <= caps["verify"]
    assert sum(c for *_, c in gc.bench_plan(False)) <= caps["bench"]
