"""The engine of ``scripts/gpu_check.sh`` (issue 36): the device KV store on a real GPU, in one
command. Read the shell script's header first: it says how to run this and what comes back.

Stages, in order, each in child processes under its own time cap, each written into the one
results file as soon as it ends (so a hang or a crash in one still returns the others):

    env     the GPU (nvidia-smi, torch.cuda), driver, CUDA, torch, triton, python; what was
            missing and installed offline from carried wheels; kvcheck made importable
    tests   pytest tests/device on CUDA, Triton kernels compiled (TRITON_INTERPRET unset)
    verify  kvcheck verify-device (the registered store, and a realistic row), kvcheck verify
            device, kvcheck verify-tiers reference-tiers-data (device pool on CUDA, host pool
            on the CPU), and the data-level corpus (tests/device/device_bugs.py) on the Triton backend
    bench   benchmarks/device.py: Llama 3.3 70B's per-GPU KV cache (tp 8 and 4), and its default

This file uses the standard library only: it never imports torch itself (a wedged CUDA driver
can only hang a child, which its cap ends).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROG = "scripts/gpu_check.sh"

OK, USAGE, CHECK_FAILED, STAGE_INCOMPLETE, NO_CUDA = 0, 2, 3, 4, 5
EXIT_CODES = {
    OK: "every stage ran and every check held (bandwidth figures never change the code)",
    USAGE: "bad arguments",
    CHECK_FAILED: "every stage ran, but a check failed (a test, a violation on the correct store, "
                  "a corpus bug not caught, a benchmark step read back wrong)",
    STAGE_INCOMPLETE: "a stage did not complete: it ran past its cap, crashed or could not start",
    NO_CUDA: "no CUDA device here (and no --dry-run): nothing ran",
}

STAGES = ("env", "tests", "verify", "bench")
# Seconds. 480 in all: within the 8 minutes a device-tool call of timeout_s 540 allows.
CAPS = {"env": 60, "tests": 170, "verify": 125, "bench": 125}
DRY_CAPS = {"env": 120, "tests": 240, "verify": 240, "bench": 240}  # a loaded 2-core machine

# What kvcheck's device path imports beyond the standard library (tests/device, verify-device,
# the benchmark), with the least version kvcheck accepts. torch and triton come from the
# machine (a CUDA build cannot travel); the rest travel as wheels when missing.
# (import name, distribution, least version)
REQUIRED = [("torch", "torch", None), ("triton", "triton", None), ("numpy", "numpy", None),
            ("pytest", "pytest", "8"), ("hypothesis", "hypothesis", "6.100"),
            ("z3", "z3-solver", "4.12")]
# The wheels --fetch-wheels downloads (the versions CI runs): pure Python or manylinux, for the
# device machine's CPython 3.12 on x86-64. Neither needs anything that machine lacks.
WHEELS = {"z3-solver": "5.4.1.0", "hypothesis": "6.155.2"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
MAPPED = ("spec", "impl", "proofs")  # kvcheck.spec -> spec/ ... (pyproject's package-dir)

DRY_TESTS = ["tests/device/test_kernels.py", "tests/device/test_manager.py"]
TAIL = 6000  # characters of each step's output kept in the results file
LOG_PART = 512 * 1024  # a step's output in the log: all of it, or its first and last 512 KiB


# -- running children under a cap -----------------------------------------------------------
class Stage:
    """One stage's record: its steps (commands), status, problems and results."""

    def __init__(self, name: str, cap: float, dry: bool, log, start: float | None = None):
        self.name, self.cap, self.dry, self.log = name, cap, dry, log
        self.start = time.monotonic() if start is None else start  # env: from the CUDA probe
        self.steps: list[dict] = []
        self.problems: list[str] = []
        self.result: dict = {}
        self.incomplete = False  # ran past its cap, crashed, could not start

    def left(self) -> float:
        return self.cap - (time.monotonic() - self.start)

    def run(self, name: str, cmd: list[str], env: dict, cap: float | None = None,
            cwd: Path = ROOT) -> dict:
        """Run ``cmd`` (its own process group) for at most ``cap`` seconds and what is left of
        the stage's; its output goes to the log, its tail into the step's record."""
        limit = self.left() if cap is None else min(cap, self.left())
        step = {"name": name, "cmd": _shown(cmd), "cap_seconds": round(max(limit, 0), 1)}
        self.steps.append(step)
        if limit < 1:
            step.update(rc=None, seconds=0.0, timed_out=False, ran=False,
                        tail="not started: the stage's time was spent")
            self.incomplete = True
            self.problems.append(f"{name}: not started, the stage's cap was spent")
            return step
        self.log.write(f"\n===== {self.name} / {name}: {step['cmd']} (cap {limit:.0f} s)\n")
        self.log.flush()
        out = tempfile.TemporaryFile()
        t0 = time.monotonic()
        try:  # its own process group (ended as one at the cap), in this session (so whatever
            # ends this command, such as the device tool at its timeout, ends it too)
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=os.setpgrp)
        except OSError as exc:
            step.update(rc=None, seconds=0.0, timed_out=False, ran=False, tail=str(exc))
            self.incomplete = True
            self.problems.append(f"{name}: could not start: {exc}")
            return step
        timed_out = False
        RUNNING.append(proc)
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            _end(proc)
        finally:  # (also when SIGTERM ends this script: main's cleanup ends the child)
            if proc.returncode is not None:
                RUNNING.remove(proc)
        seconds = time.monotonic() - t0
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
        out.close()
        if len(text) > 2 * LOG_PART:  # the log must come back (16 MiB a file at most)
            self.log.write(text[:LOG_PART] + f"\n[... {len(text) - 2 * LOG_PART:,} characters "
                           f"left out ...]\n" + text[-LOG_PART:])
        else:
            self.log.write(text)
        self.log.write(f"\n----- rc {proc.returncode}{' (ran past its cap)' if timed_out else ''}"
                       f", {seconds:.1f} s\n")
        self.log.flush()
        step.update(rc=proc.returncode, seconds=round(seconds, 2), timed_out=timed_out, ran=True,
                    tail=text[-TAIL:])
        step["_output"] = text
        if timed_out:
            self.incomplete = True
            self.problems.append(f"{name}: ran past its cap of {limit:.0f} s and was ended")
        return step

    def record(self) -> dict:
        if self.incomplete:
            status = "timeout" if any(s.get("timed_out") for s in self.steps) else "error"
        else:
            status = "fail" if self.problems else "ok"
        return {"status": status, "dry": self.dry, "seconds": round(time.monotonic() - self.start, 1),
                "cap_seconds": self.cap, "problems": self.problems, "result": self.result,
                "steps": [{k: v for k, v in s.items() if not k.startswith("_")} for s in self.steps]}


RUNNING: list = []  # the child now running, if any


def _end(proc) -> None:
    """End a child's process group (the child and what it started), by its id: SIGTERM, then
    SIGKILL to whatever of the group is left 5 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _shown(cmd: list[str]) -> str:
    return " ".join(c if re.fullmatch(r"[\w./=:,+@%-]+", c) else repr(c) for c in cmd)


def _json_out(step: dict):
    """The last JSON object a step printed at the start of a line (its stdout; stderr is
    merged into the same output), or None."""
    text = step.get("_output") or ""
    found, decoder = None, json.JSONDecoder()
    for m in re.finditer(r"^\{", text, re.M):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            found = obj
    return found


def _failed(stage: Stage, step: dict, expect=(0,)) -> bool:
    """Whether a finished step's exit code is not one of ``expect``; the problem is noted
    (a code of 2 or more other than expected is an error: the step could not do its work)."""
    if not step.get("ran") or step.get("timed_out"):
        return True
    if step["rc"] in expect:
        return False
    if step["rc"] in (0, 1):
        stage.problems.append(f"{step['name']}: exit {step['rc']}, expected {'/'.join(map(str, expect))}")
    else:
        stage.incomplete = True
        stage.problems.append(f"{step['name']}: exit {step['rc']} (could not do its work): "
                              f"{_last_line(step)}")
    return True


def _last_line(step: dict) -> str:
    lines = [x for x in (step.get("_output") or "").strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else "(no output)"


# -- env: what the machine is, what was installed, kvcheck importable ------------------------
PROBE = r"""
import json, os, platform, sys
out = {"python": sys.version.split()[0], "executable": sys.executable,
       "platform": platform.platform(), "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
       "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
try:
    import torch
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out)); sys.exit(0)
out["torch"] = torch.__version__
out["torch_cuda_build"] = torch.version.cuda
out["cuda_available"] = torch.cuda.is_available()
out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
if out["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    out["gpu"] = {"name": p.name, "capability": f"{p.major}.{p.minor}",
                  "multiprocessors": p.multi_processor_count, "memory_bytes": p.total_memory,
                  "l2_cache_bytes": getattr(p, "L2_cache_size", None)}
    out["cudnn"] = torch.backends.cudnn.version()
    free, total = torch.cuda.mem_get_info()
    out["gpu"]["memory_free_bytes"] = free
try:
    import triton
    out["triton"] = triton.__version__
except Exception as exc:
    out["triton_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""

DEPS = r"""
import importlib, importlib.metadata as md, json, sys
wanted, root = json.loads(sys.argv[1]), sys.argv[2]
out = {}
for mod, dist, least in wanted:
    try:
        m = importlib.import_module(mod)
    except Exception as exc:
        out[dist] = {"error": f"{type(exc).__name__}: {exc}"}
        continue
    try:
        version = md.version(dist)
    except md.PackageNotFoundError:
        version = getattr(m, "__version__", None)
    out[dist] = {"version": version, "path": getattr(m, "__file__", None)}
try:
    import kvcheck.spec, kvcheck.impl, kvcheck.proofs, kvcheck.cli
    files = {n: getattr(sys.modules[n], "__file__", None) for n in
             ("kvcheck", "kvcheck.spec", "kvcheck.impl", "kvcheck.proofs")}
    out["kvcheck"] = {"files": files,
                      "here": all(f and f.startswith(root) for f in files.values())}
except Exception as exc:
    out["kvcheck"] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def _version_tuple(text) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", str(text or ""))[:3])


def too_old(version, least) -> bool:
    return least is not None and _version_tuple(version) < _version_tuple(least)


def probe(py: str, env: dict, cap: float) -> tuple[dict | None, str]:
    """The torch/CUDA probe in a child: (its JSON, or None, and why not)."""
    try:
        r = subprocess.run([py, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=cap)
    except subprocess.TimeoutExpired:
        return None, f"importing torch and asking it for the GPU took over {cap:.0f} s"
    try:
        return json.loads(r.stdout.strip().splitlines()[-1]), ""
    except (IndexError, json.JSONDecodeError):
        return None, f"the probe failed (exit {r.returncode}): {(r.stderr.strip().splitlines() or ['?'])[-1]}"


def no_cuda_line(info: dict | None, why: str) -> str:
    smi = shutil.which("nvidia-smi")
    if info is None:
        what = why
    elif "torch_error" in info:
        what = f"{info['executable']} cannot import torch ({info['torch_error']})"
    else:
        build = info.get("torch_cuda_build") or "none, a CPU build"
        what = f"torch {info['torch']} (CUDA build: {build}) sees no GPU"
        if info.get("CUDA_VISIBLE_DEVICES") is not None:
            what += f" (CUDA_VISIBLE_DEVICES={info['CUDA_VISIBLE_DEVICES']!r})"
    return (f"no CUDA device here: {what}; nvidia-smi {'is at ' + smi if smi else 'not found'}; "
            f"{PROG} --dry-run checks the script on the CPU (exit {NO_CUDA})")


def wheel_for(dist: str, wheels: Path) -> Path | None:
    """``dist``'s wheel in ``wheels``: the pinned version's if there, else the newest."""
    name = re.sub(r"[-_.]+", "_", dist).lower()
    found = sorted((p for p in wheels.glob("*.whl") if p.name.lower().startswith(name + "-")),
                   key=lambda p: _version_tuple(p.name[len(name) + 1:].split("-")[0]))
    pinned = [p for p in found if p.name.lower().startswith(f"{name}-{WHEELS.get(dist)}-")]
    return (pinned or found or [None])[-1]


def install_missing(py: str, required, deps: dict, wheels: Path, site: Path, env: dict,
                    stage: Stage) -> dict:
    """Install each missing (or too old) requirement from its wheel in ``wheels``, offline,
    into ``site`` (put first on PYTHONPATH by the caller); returns {dist: where from}."""
    origin = {}
    for _, dist, least in required:
        have = deps.get(dist) or {"error": "not checked"}
        if "error" not in have and not too_old(have.get("version"), least):
            origin[dist] = "the machine's own"
            continue
        whl = wheel_for(dist, wheels) if wheels.is_dir() else None
        if whl is None:
            origin[dist] = f"missing, and no wheel for it in {wheels}"
            continue
        step = stage.run(f"install {whl.name}", [
            py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
            "--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--target", str(site),
            str(whl)], env, cap=90)
        shown = whl.relative_to(ROOT) if whl.is_relative_to(ROOT) else whl
        if step.get("rc") == 0:
            origin[dist] = f"installed offline from {shown}"
            continue
        try:  # no pip there: a wheel is a zip of what goes into site-packages
            extract_wheel(whl, site)
            origin[dist] = f"installed offline from {shown} (unzipped: pip failed)"
        except (OSError, zipfile.BadZipFile) as exc:
            origin[dist] = f"install from {whl.name} failed: pip, then unzipping it ({exc})"
    return origin


def extract_wheel(whl: Path, site: Path) -> None:
    """A wheel's packages and its .dist-info into ``site`` (its .data scripts left out)."""
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist() if not n.split("/", 1)[0].endswith(".data")]
        z.extractall(site, members=names)


def map_kvcheck(root: Path) -> list[Path]:
    """Make ``kvcheck.spec``, ``kvcheck.impl``, ``kvcheck.proofs`` importable from a bare
    checkout (pyproject maps them to spec/, impl/, proofs/): a relative symbolic link for each
    inside kvcheck/. Returns the links made (to be removed at the end)."""
    made = []
    for name in MAPPED:
        link = root / "kvcheck" / name
        if link.is_symlink() or link.exists():
            continue
        link.symlink_to(Path("..") / name, target_is_directory=True)
        made.append(link)
    return made


def unmap(links) -> None:
    for link in links:
        if link.is_symlink():
            link.unlink()


def stage_env(st: Stage, py: str, env: dict, info: dict | None, why: str, wheels: Path,
              work: Path, links: list) -> dict:
    """Probe (again, in a dry run) and make everything importable; returns the env the later
    stages run in."""
    if info is None:
        info, why = probe(py, env, max(10, st.left() - 20))
    st.result["python_torch_cuda"] = info if info is not None else {"error": why}
    if info is None or "torch_error" in (info or {}):
        st.incomplete = True
        st.problems.append(f"probe: {why or info.get('torch_error')}")
    elif not st.dry and not info.get("cuda_available"):
        st.problems.append("torch sees no GPU")

    site = work / "site"
    site.mkdir(exist_ok=True)
    env = dict(env)
    wanted = json.dumps(REQUIRED)

    def deps_now() -> dict:
        step = st.run("import check", [py, "-c", DEPS, wanted, str(ROOT)], env, cap=60)
        return _json_out(step) or {}

    deps = deps_now()
    origin = install_missing(py, REQUIRED, deps, wheels, site, env, st)
    if any(o.startswith("installed") for o in origin.values()):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    kv = deps.get("kvcheck", {})
    if "error" in kv or not kv.get("here"):
        links.extend(map_kvcheck(ROOT))
        # the checkout on the path for children started elsewhere (pytest in a temp dir)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)]))
        origin["kvcheck"] = (f"this checkout ({ROOT}), not installed: kvcheck.spec/impl/proofs "
                             f"mapped by links kvcheck/{{{','.join(MAPPED)}}} -> ../ (removed at the "
                             f"end), the checkout on PYTHONPATH")
    else:
        origin["kvcheck"] = f"already importable from this checkout ({kv['files']['kvcheck']})"
    if any(o.startswith("installed") for o in origin.values()) or links:
        deps = deps_now()
    for _, dist, least in REQUIRED:
        d = deps.get(dist, {"error": "not checked"})
        if "error" in d:
            st.incomplete = True
            st.problems.append(f"{dist}: {d['error']} ({origin.get(dist)})")
        elif too_old(d.get("version"), least):
            st.problems.append(f"{dist} {d['version']} is older than kvcheck's least, {least}")
    if "error" in deps.get("kvcheck", {"error": "not checked"}) or not deps["kvcheck"].get("here"):
        st.incomplete = True
        st.problems.append(f"kvcheck not importable from this checkout: {deps.get('kvcheck')}")
    st.result["deps"] = {dist: {**deps.get(dist, {}), "from": origin.get(dist)}
                         for _, dist, _ in REQUIRED}
    st.result["kvcheck"] = {**deps.get("kvcheck", {}), "from": origin.get("kvcheck")}
    st.result["nvidia_smi"] = nvidia_smi(st, env)
    st.result["repo"] = repo_state()
    if not st.dry and info and info.get("cuda_available") and "TRITON_INTERPRET" in env:
        st.problems.append("TRITON_INTERPRET is set: the kernels would run interpreted")
    return env


def nvidia_smi(st: Stage, env: dict) -> dict:
    if not shutil.which("nvidia-smi"):
        return {"error": "nvidia-smi not found"}
    fields = ("name,driver_version,memory.total,memory.used,pci.bus_id,compute_mode,pstate,"
              "temperature.gpu,power.draw,power.limit,clocks.sm,clocks.max.sm,clocks.mem,"
              "clocks.max.mem")
    q = st.run("nvidia-smi --query-gpu", ["nvidia-smi", f"--query-gpu={fields}",
                                          "--format=csv,noheader"], env, cap=20)
    if q.get("rc") != 0:  # a field this driver does not know: the essentials alone
        fields = "name,driver_version,memory.total"
        q = st.run("nvidia-smi --query-gpu (essentials)", [
            "nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], env, cap=20)
    banner = st.run("nvidia-smi", ["nvidia-smi"], env, cap=20)
    out = {}
    if q.get("rc") == 0:
        rows = [[x.strip() for x in line.split(",")] for line in q["_output"].strip().splitlines()]
        out["gpus"] = [dict(zip(fields.split(","), r, strict=False)) for r in rows]
    m = re.search(r"CUDA Version:\s*([\d.]+)", banner.get("_output") or "")
    out["cuda_driver_version"] = m.group(1) if m else None
    return out


def repo_state() -> dict:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"commit": None, "why": str(exc)}
    if head.returncode:
        return {"commit": None, "why": "not a git checkout (the device tool sends the files only)"}
    return {"commit": head.stdout.strip(), "modified_files": len(dirty.stdout.splitlines())}


# -- tests --------------------------------------------------------------------------------
# (a test's id may hold spaces: its parameters')
RESULT_LINE = re.compile(r"^(\S+\.py::.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)


def stage_tests(st: Stage, py: str, env: dict, work: Path, targets: list[str], pytest_timeout: bool):
    junit = work / "junit.xml"
    env = {**env, "KVCHECK_NO_SKIPS": "1"}  # nothing skips (tests/no_skips.py)
    cmd = [py, "-m", "pytest", *targets, "-vv", "-rfE", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "--ignore=tests/device/test_gpu_check.py"]
    if pytest_timeout:
        cmd.append("--timeout=150")  # one test wedged in CUDA still lets the rest report
    step = st.run("pytest", cmd, env)
    text = step.get("_output") or ""
    header = re.search(r"^kvcheck device tests: (.*)$", text, re.M)
    st.result["header"] = header.group(1) if header else None
    lines = RESULT_LINE.findall(text)
    counts: dict[str, int] = {}
    for _, outcome in lines:
        counts[outcome.lower()] = counts.get(outcome.lower(), 0) + 1
    st.result["from_output"] = counts
    if junit.exists():
        try:
            suite = ET.parse(junit).getroot()
            suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
            st.result["junit"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors",
                                                                     "skipped")}
            st.result["junit"]["seconds"] = float(suite.get("time", 0))
        except (ET.ParseError, AttributeError, ValueError) as exc:
            st.result["junit"] = {"error": str(exc)}
    st.result["failed"] = [n for n, o in lines if o in ("FAILED", "ERROR")][:50]
    st.result["targets"] = targets
    if not step.get("ran") or step.get("timed_out"):
        return
    if step["rc"] not in (0, 1):
        _failed(st, step)
        return
    if step["rc"] == 1 or st.result["failed"]:
        st.problems.append(f"{len(st.result['failed'])} test(s) failed: "
                           f"{', '.join(st.result['failed'][:5])}")
    if not lines:
        st.problems.append("pytest printed no test results")
    if header is None:
        st.problems.append("the device tests' header (which device, compiled or interpreted) is "
                           "missing")
    elif not st.dry and ("device cuda" not in header.group(1) or "compiled" not in header.group(1)):
        st.problems.append(f"not on the GPU with compiled kernels: {header.group(1)}")


# -- verify -------------------------------------------------------------------------------
def verify_plan(dry: bool) -> list[tuple[str, list[str], float]]:
    """(name, arguments of ``python -m kvcheck.cli``, cap seconds)."""
    if dry:
        return [("verify-device (registered store)", ["verify-device", "--ops", "40", "--json"], 60),
                ("verify-device (wider rows, more layers)",
                 ["verify-device", "--layers", "2", "--kv-heads", "2", "--head-dim", "8",
                  "--batch-prob", "0.5", "--ops", "30", "--json"], 60),
                ("verify device (structure)", ["verify", "device", "--ops", "40"], 60),
                ("verify-tiers (reference-tiers-data: K/V copied between pools)",
                 ["verify-tiers", "reference-tiers-data", "--ops", "100", "--json"], 60)]
    # (on the 2-core development machine, torch backend on the CPU, loaded: 1000 operations of
    # the first in 6 s, 400 of the second in 9 s; every operation reads every live sequence back, through
    # the device, so a GPU's launches and copies back do not make them faster)
    return [("verify-device (registered store)", ["verify-device", "--ops", "1000", "--json"], 30),
            ("verify-device (a 70B row: 8 KV heads x 128, 4 layers)",
             ["verify-device", "--layers", "4", "--kv-heads", "8", "--head-dim", "128",
              "--batch-prob", "0.5", "--ops", "400", "--json"], 25),
            ("verify device (structure)", ["verify", "device", "--ops", "5000"], 15),
            # the tiered reference's device pool on CUDA, its host pool on the CPU: every
            # store, load and swap a real copy across the bus, every block read back each step
            # (on the development machine's CPU, loaded: 500 operations in about 2 s)
            ("verify-tiers (reference-tiers-data: K/V copied between pools)",
             ["verify-tiers", "reference-tiers-data", "--ops", "500", "--json"], 10)]


CORPUS_CAP = 45  # the GPU run's; a dry run's is 80


def stage_verify(st: Stage, py: str, env: dict):
    runs = []
    for name, args, cap in verify_plan(st.dry):
        step = st.run(name, [py, "-m", "kvcheck.cli", *args], env, cap=cap)
        row = {"name": name, "args": args, "rc": step.get("rc"), "seconds": step.get("seconds")}
        out = _json_out(step) if "--json" in args else None
        if out:
            row.update(verdict=out.get("verdict"), ops=out.get("ops"), stats=out.get("stats"))
        else:
            lines = (step.get("_output") or "").strip().splitlines()
            row["said"] = lines[0][:400] if lines else None
        runs.append(row)
        if not _failed(st, step) and out is not None and out.get("verdict") != "pass":
            st.problems.append(f"{name}: verdict {out.get('verdict')}")
    st.result["runs"] = runs
    corpus = st.run("corpus (tests/device/device_bugs.py, Triton backend)",
                    [py, str(ROOT / "scripts" / "gpu_check.py"), "_corpus",
                     *(["--dry"] if st.dry else [])], env, cap=80 if st.dry else CORPUS_CAP)
    rows = _json_out(corpus)
    st.result["corpus"] = rows
    if _failed(st, corpus):
        return
    if not isinstance(rows, dict):
        st.incomplete = True
        st.problems.append("corpus: no result printed")
        return
    for r in rows["targets"]:
        if r["problem"]:
            st.problems.append(f"corpus {r['target']}: {r['problem']}")


def corpus_main(argv) -> int:
    """``gpu_check.py _corpus [--dry]``: each device bug (and the correct store) through the
    device model on this machine's device, backend auto (Triton where it runs); one JSON line."""
    from functools import partial

    sys.path.insert(0, str(ROOT / "tests" / "device"))
    sys.path.insert(1, str(ROOT))  # kvcheck from this checkout (run as a script from scripts/)
    import device_bugs as bugs

    from kvcheck.impl.device import DeviceBlockManager
    from kvcheck.verify import verify

    shape = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 3, "dtype": "float16"}
    chosen = [bugs.SwappedCopy, bugs.OffByOneSlotKernel] if "--dry" in argv else bugs.BUGS
    rows = []
    for target in [*chosen, DeviceBlockManager]:
        factory = partial(target, **shape)
        t0 = time.perf_counter()
        ops = 100 if "--dry" in argv and target is DeviceBlockManager else 400
        r = verify(factory, 12, 4, ops=ops, seed=0, model="device")
        row = {"target": target.__name__, "backend": factory(12, 4).backend, "ops": ops,
               "seconds": round(time.perf_counter() - t0, 2), "caught": not r.ok, "problem": None}
        if target is DeviceBlockManager:
            if not r.ok:
                row["problem"] = f"the correct store failed: {r.violation.key}"
        elif r.ok:
            row["problem"] = f"escaped: no violation in {ops} operations"
        else:
            key = tuple(r.violation.key)
            row.update(violation=list(key), steps=len(r.trace.ops),
                       minimality=r.trace.minimality[:80])
            if key not in bugs.EXPECTED[target]:
                row["problem"] = f"reported as {key}, expected one of {sorted(bugs.EXPECTED[target])}"
            elif len(r.trace.ops) > bugs.LENGTH_BEFORE[target]:
                row["problem"] = (f"shrunk to {len(r.trace.ops)} steps, at most "
                                  f"{bugs.LENGTH_BEFORE[target]} before")
        rows.append(row)
    import torch

    print(json.dumps({"device": str(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
                      "subset": "--dry" in argv, "targets": rows}))
    return 0


# -- bench --------------------------------------------------------------------------------
TINY = ["--seqs", "4", "--context", "5", "--block-size", "4", "--layers", "2", "--head-dim", "8",
        "--reps", "2"]


def bench_plan(dry: bool) -> list[tuple[str, list[str], float]]:
    """(name, arguments of benchmarks/device.py, cap seconds). The Llama shapes first: they are
    the figures the issue asks for."""
    plan = [("llama-3.3-70b tp8", ["--model", "llama-3.3-70b", "--tp", "8"], 45),
            ("llama-3.3-70b tp4", ["--model", "llama-3.3-70b", "--tp", "4"], 45),
            ("default (4,096 seqs x 250, 8 heads, 1 layer)", [], 30)]
    if dry:
        plan = [(n, a + TINY + ([] if a else ["--heads", "1"]), 60) for n, a, _ in plan]
    return [(n, [*a, "--backend", "triton", "--json"], c) for n, a, c in plan]


def stage_bench(st: Stage, py: str, env: dict):
    runs = []
    for name, args, cap in bench_plan(st.dry):
        step = st.run(f"bench {name}", [py, str(ROOT / "benchmarks" / "device.py"), *args], env,
                      cap=cap)
        out = _json_out(step)
        runs.append({"name": name, "args": args, "rc": step.get("rc"), "result": out})
        if _failed(st, step):
            continue
        if not out:
            st.incomplete = True
            st.problems.append(f"bench {name}: printed no result")
        elif not out.get("step_reads_back_correctly"):
            st.problems.append(f"bench {name}: the decode step read back wrong data")
        elif not st.dry and not out.get("gpu_figure"):
            st.problems.append(f"bench {name}: ran on {out.get('device')}, not the GPU")
    st.result["runs"] = runs


# -- the results file ---------------------------------------------------------------------
def summary(res: dict) -> str:
    dry = " (DRY RUN: the CPU, Triton interpreted, tiny shapes; NOT GPU figures)"
    lines = [f"kvcheck gpu_check{dry if res['dry_run'] else ''}",
             f"started {res['started']}, {res['seconds']:.0f} s, exit {res['exit_code']}: "
             f"{EXIT_CODES.get(res['exit_code'], '')}"]
    env = res["stages"].get("env", {}).get("result", {})
    p = env.get("python_torch_cuda") or {}
    gpu = p.get("gpu") or {}
    smi = (env.get("nvidia_smi") or {}).get("gpus") or [{}]
    lines.append((f"GPU {gpu['name']} (capability {gpu.get('capability')}, "
                  f"{gpu.get('multiprocessors')} SMs)" if gpu else "GPU: none seen") +
                 f", driver {smi[0].get('driver_version')}, "
                 f"CUDA {(env.get('nvidia_smi') or {}).get('cuda_driver_version')} (driver) / "
                 f"{p.get('torch_cuda_build')} (torch); torch {p.get('torch')}, triton "
                 f"{p.get('triton')}, python {p.get('python')}")
    deps = env.get("deps") or {}
    lines.append("deps: " + "; ".join(f"{d} {v.get('version')} ({v.get('from')})"
                                      for d, v in deps.items() if d not in ("torch", "triton")))
    lines.append(f"kvcheck: {(env.get('kvcheck') or {}).get('from')}; repo {env.get('repo')}")
    for name in STAGES:
        s = res["stages"].get(name)
        if s is None:
            continue
        lines.append(f"[{name}] {s['status']}{' (dry)' if s.get('dry') else ''}, "
                     f"{s.get('seconds', 0):.0f} s of {s.get('cap_seconds')}"
                     + (": " + "; ".join(s["problems"][:6]) if s.get("problems") else ""))
        r = s.get("result") or {}
        if name == "tests":
            lines.append(f"    {r.get('header')}; junit {r.get('junit')}")
        if name == "verify":
            for v in r.get("runs", []):
                lines.append(f"    {v['name']}: exit {v['rc']}, {v.get('verdict') or v.get('said')}, "
                             f"{v.get('seconds')} s")
            for c in (r.get("corpus") or {}).get("targets", []):
                what = (f"caught {c.get('violation')} in {c.get('steps')} steps" if c["caught"]
                        else "passed")
                lines.append(f"    corpus {c['target']} [{c['backend']}]: {what}, {c['seconds']} s"
                             f"{' PROBLEM: ' + c['problem'] if c['problem'] else ''}")
        if name == "bench":
            for b in r.get("runs", []):
                o = b.get("result")
                if not o:
                    lines.append(f"    {b['name']}: exit {b['rc']}, no result")
                    continue
                lines.append(f"    {b['name']}: {o['sequences']} seqs x {o['context']} tokens, "
                             f"{o['layers']} layers x {o['kv_heads']} KV heads x {o['head_dim']}, "
                             f"block {o['block_size']}, {o['dtype']}, cache {o['cache_bytes'] / 1e9:.2f} GB; "
                             f"decode step {o['decode_step_seconds'] * 1e3:.2f} ms median "
                             f"({o['decode_step_writes']} seqs, {o['decode_step_copies']} copies), "
                             f"first {o['decode_step_first_seconds'] * 1e3:.1f} ms; "
                             f"{'1 GiB' if o['gpu_figure'] else '64 MiB'} copy "
                             f"{o['peak_copy_gbps']:.0f} GB/s; goal met: {o['goal_met']}")
                for k in o["kernels"]:
                    lines.append(f"      {k['kernel']:<12} {k['bytes'] / 1e6:10.1f} MB "
                                 f"{k['seconds'] * 1e6:10.1f} us {k['gbps']:9.1f} GB/s, same-size "
                                 f"copy {k['copy_gbps']:9.1f} GB/s, ratio {k['ratio']:.2f}")
    return "\n".join(lines) + "\n"


def write_results(out: Path, res: dict) -> None:
    for name, text in (("gpu_check.json", json.dumps(res, indent=1) + "\n"),
                       ("gpu_check.txt", summary(res))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text)
        tmp.replace(out / name)


def exit_code(res: dict) -> int:
    statuses = [s["status"] for s in res["stages"].values()]
    if any(s in ("timeout", "error", "running") for s in statuses):
        return STAGE_INCOMPLETE
    if any(s == "fail" for s in statuses):
        return CHECK_FAILED
    return OK


# -- the command line ---------------------------------------------------------------------
def parse(argv):
    p = argparse.ArgumentParser(prog=PROG, description=(
        "The device KV store on a real GPU: the device tests with compiled Triton kernels, "
        "kvcheck verify-device and the data-level corpus, the kernels' bandwidth against a "
        "same-size copy at Llama 3.3 70B's per-GPU shape; every figure into one results file. "
        "Exit codes: " + "; ".join(f"{c}: {w}" for c, w in EXIT_CODES.items())))
    p.add_argument("--dry-run", action="store_true",
                   help="every stage on the CPU, Triton interpreted (TRITON_INTERPRET=1, "
                        "CUDA_VISIBLE_DEVICES=''), tiny shapes: checks the script, no GPU figure")
    p.add_argument("--out", type=Path,
                   help="the folder for gpu_check.json, gpu_check.txt, gpu_check.log (default: "
                        "$OUT, else a new temporary folder)")
    p.add_argument("--wheels", type=Path, default=ROOT / ".whl",
                   help="wheels of missing packages, installed offline (default: .whl, which "
                        "--fetch-wheels fills)")
    p.add_argument("--fetch-wheels", type=Path, nargs="?", const=ROOT / ".whl", metavar="DIR",
                   help="on a machine with a registry: download the wheels the device machine "
                        "lacks (z3-solver, hypothesis; CPython 3.12, x86-64) into DIR (default "
                        ".whl) and exit")
    p.add_argument("--only", help="run these stages (comma-separated; env always runs): "
                                  f"{', '.join(STAGES)}")
    p.add_argument("--cap", action="append", default=[], metavar="STAGE=SECONDS",
                   help=f"a stage's time cap (default {', '.join(f'{k}={v}' for k, v in CAPS.items())}; "
                        "dry run: larger)")
    p.add_argument("--tests", nargs="+", metavar="PATH",
                   help="what the tests stage runs (default: tests/device; dry run: "
                        f"{' '.join(DRY_TESTS)})")
    args = p.parse_args(argv)
    caps = dict(DRY_CAPS if args.dry_run else CAPS)
    for item in args.cap:
        name, _, value = item.partition("=")
        try:
            if name not in STAGES:
                raise ValueError
            caps[name] = float(value)
        except ValueError:
            p.error(f"--cap expects STAGE=SECONDS with STAGE one of {', '.join(STAGES)}, got {item!r}")
    args.caps = caps
    only = [s.strip() for s in args.only.split(",")] if args.only else list(STAGES)
    bad = [s for s in only if s not in STAGES]
    if bad:
        p.error(f"--only: unknown stage {bad[0]!r} (stages: {', '.join(STAGES)})")
    args.stages = [s for s in STAGES if s == "env" or s in only]
    return args


def fetch_wheels(dest: Path) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp",
           *[x for plat in PLATFORMS for x in ("--platform", plat)], "-d", str(dest),
           *[f"{d}=={v}" for d, v in WHEELS.items()]]
    print(_shown(cmd))
    r = subprocess.run(cmd)
    if r.returncode:
        return r.returncode
    missing = 0
    for d in WHEELS:
        whl = wheel_for(d, dest)
        print(f"{whl.name}: {whl.stat().st_size / 1e6:.1f} MB" if whl else f"{d}: NOT FOUND")
        missing += whl is None
    return 1 if missing else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_corpus"]:
        return corpus_main(argv[1:])
    args = parse(argv)
    if args.fetch_wheels is not None:
        return fetch_wheels(args.fetch_wheels)
    py = sys.executable
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.dry_run:
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    else:
        env.pop("TRITON_INTERPRET", None)
    info, why = None, ""
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.monotonic()
    if not args.dry_run:  # before anything else: no CUDA is one line, nothing written
        info, why = probe(py, env, args.caps["env"])
        if info is None or not info.get("cuda_available"):
            print(no_cuda_line(info, why), file=sys.stderr)
            return NO_CUDA
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    out = out or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_check-work-"))
    res = {"schema": "kvcheck-gpu-check/1", "dry_run": args.dry_run,
           "started": started.isoformat(timespec="seconds"), "host": platform.node(),
           "command": _shown([PROG, *argv]), "stages": {}, "seconds": 0.0, "exit_code": None,
           "exit_codes": {str(k): v for k, v in EXIT_CODES.items()}}
    links: list[Path] = []
    # SIGTERM (a timeout around this command): the cleanup below still runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    print(f"{PROG}: {'DRY RUN, ' if args.dry_run else ''}stages {', '.join(args.stages)}; "
          f"results in {out}", flush=True)
    pytest_timeout = False
    try:
        with open(out / "gpu_check.log", "w") as log:
            for name in args.stages:
                st = Stage(name, args.caps[name], args.dry_run, log,
                           start=t0 if name == "env" else None)
                res["stages"][name] = {"status": "running", "dry": args.dry_run}
                write_results(out, res)
                try:
                    if name == "env":
                        env = stage_env(st, py, env, info, why, args.wheels, work, links)
                        pytest_timeout = _has(py, env, "pytest_timeout")
                    elif name == "tests":
                        stage_tests(st, py, env, work, args.tests or (
                            DRY_TESTS if args.dry_run else ["tests/device"]), pytest_timeout)
                    elif name == "verify":
                        stage_verify(st, py, env)
                    else:
                        stage_bench(st, py, env)
                except Exception as exc:  # a bug of this script: the stage says so, the rest run
                    st.incomplete = True
                    st.problems.append(f"internal error of gpu_check: {type(exc).__name__}: {exc}")
                res["stages"][name] = st.record()
                res["seconds"] = round(time.monotonic() - t0, 1)
                write_results(out, res)
                print(f"[{name}] {res['stages'][name]['status']} in "
                      f"{res['stages'][name]['seconds']:.0f} s", flush=True)
    finally:
        for proc in RUNNING:
            _end(proc)
        unmap(links)
        shutil.rmtree(work, ignore_errors=True)
    res["exit_code"] = exit_code(res)
    res["seconds"] = round(time.monotonic() - t0, 1)
    res["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    write_results(out, res)
    print(summary(res), end="")
    print(f"results: {out / 'gpu_check.json'}, {out / 'gpu_check.txt'}, {out / 'gpu_check.log'}")
    return res["exit_code"]


def _has(py: str, env: dict, module: str) -> bool:
    try:
        return subprocess.run([py, "-c", f"import {module}"], env=env, cwd=ROOT,
                              capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


if __name__ == "__main__":
    sys.exit(main())
