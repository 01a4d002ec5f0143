"""The planner reproduces the seed's block-size figures exactly; bad input exits 2."""

import json
import subprocess
import sys

import pytest

from kvcheck.cli import main
from kvcheck.tools.planner import GIB, MIB, MODELS, PlanError, get_model, plan, pool_from_gpus

ENTRY = "import sys; from kvcheck.cli import main; sys.exit(main())"


def rows():
    p = plan(get_model("llama-3.3-70b"), [16, 64, 128], seqs=256, mean_len=1500, max_len=8192,
             context=131072, shared_prompt=1000, pool_tokens=431_190)
    return {r.block_size: r for r in p.rows}


def test_kv_bytes_per_token_llama_3_3_70b():
    m = MODELS["llama-3.3-70b"]
    assert (m.layers, m.kv_heads, m.head_dim, m.dtype_bytes) == (80, 8, 128, 2)
    assert m.kv_bytes_per_token == 327_680


def test_seed_waste_figures():
    r = rows()
    assert r[16].worst_waste_tokens == 15
    assert f"{r[16].worst_waste_bytes / MIB:.2f}" == "4.69"
    assert r[16].mean_waste_tokens == 7.5
    assert f"{r[16].mean_waste_bytes / MIB:.2f}" == "2.34"
    assert f"{r[128].worst_waste_bytes / MIB:.1f}" == "39.7"
    assert f"{r[128].mean_waste_bytes / MIB:.1f}" == "19.8"
    batch = {s: f"{r[s].batch_mean_waste_bytes / GIB:.2f}" for s in r}
    assert batch == {16: "0.59", 64: "2.46", 128: "4.96"}
    assert r[128].batch_mean_waste_bytes / 327_680 == 16_256  # 256 x 63.5 tokens


def test_seed_table_prefix_and_capacity_figures():
    r = rows()
    assert {s: r[s].table_entries for s in r} == {16: 8192, 64: 2048, 128: 1024}
    assert r[16].prefix_shared_tokens == 992 and r[128].prefix_shared_tokens == 896
    assert r[128].prefix_recomputed_tokens == 104
    assert r[16].contiguous_requests == 52 and r[16].paged_requests == 286


def test_pool_from_gpus_and_errors():
    m = get_model("llama-3.3-70b")
    assert pool_from_gpus(m, 4, 80, 0.92, weights_gib=0) == int(4 * 80 * GIB * 0.92 // 327_680)
    with pytest.raises(PlanError):
        pool_from_gpus(m, 1, 80, 0.92)  # 141 GB of weights do not fit on one GPU
    with pytest.raises(PlanError):
        get_model("gpt-nope")
    with pytest.raises(PlanError):
        plan(m, [0])


def test_cli_table_and_json(capsys):
    assert main(["plan", "--model", "llama-3.3-70b", "--pool-tokens", "431190"]) == 0
    out = capsys.readouterr().out
    for text in ("327,680 B", "15 tok = 4.69 MiB", "7.5 tok = 2.34 MiB", "0.59 GiB", "2.46 GiB",
                 "4.96 GiB", "8,192", "992 (8 recomputed)", "896 (104 recomputed)",
                 "= 52 requests", "286", "waste_bound"):
        assert text in out, text
    assert main(["plan", "--layers", "80", "--kv-heads", "8", "--head-dim", "128",
                 "--dtype-bytes", "2", "--block-sizes", "16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_bytes_per_token"] == 327_680 and data["rows"][0]["worst_waste_tokens"] == 15


@pytest.mark.parametrize("argv", [
    ["--model", "nope"],
    ["--model", "llama-3.3-70b", "--block-sizes", "0,16"],
    ["--model", "llama-3.3-70b", "--block-sizes", "16,x"],
    ["--model", "llama-3.3-70b", "--seqs", "-1"],
    ["--layers", "80", "--kv-heads", "0", "--head-dim", "128"],
    ["--layers", "80"],
    ["--model", "llama-3.3-70b", "--gpus", "1"],
    ["--model", "llama-3.3-70b", "--gpus", "4", "--pool-tokens", "5"],
    ["--model", "llama-3.3-70b", "--util", "1.5"],
])
def test_bad_input_one_line_exit_2(argv):
    p = subprocess.run([sys.executable, "-c", ENTRY, "plan", *argv],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stdout
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
