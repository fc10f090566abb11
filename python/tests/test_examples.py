"""The training examples run end to end (tiny settings) and report speed and data stall."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import REPO_ROOT, subprocess_env

pytest.importorskip("torch")
EXAMPLES = REPO_ROOT / "examples"


def run(args, timeout=240):
    with tempfile.TemporaryDirectory() as tmp:
        env = subprocess_env(tmp)
        env["OMP_NUM_THREADS"] = "1"
        proc = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=str(REPO_ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_tabular_example_trains_and_reports_samples_per_second_and_stall(tmp_path):
    out = run([EXAMPLES / "train_tabular.py", "--data", tmp_path, "--rows", 3000, "--features", 16,
               "--epochs", 2, "--batch-size", 256, "--device", "cpu"])
    epochs = re.findall(r"epoch (\d): loss ([\d.]+) .* ([\d,]+) samples/s  data stall ([\d.]+)%", out)
    assert [e[0] for e in epochs] == ["0", "1"], out
    assert all(float(e[2].replace(",", "")) > 0 for e in epochs), out
    assert "overall:" in out and "data stall" in out


TORCHRUN = ["-m", "torch.distributed.run", "--standalone"]
DDP_COMMON = ["--rows", 2000, "--features", 8, "--batch-size", 50, "--epochs", 2, "--checkpoint-every", 4]


@pytest.fixture(scope="module")
def ddp_first_run(tmp_path_factory):
    """One fresh 2-rank run that stops after step 9 (20 steps an epoch): its output, the
    names in its checkpoint directory then, and the directory (tests read its data, which
    the checkpoint names, and copy its checkpoint; they change neither)."""
    root = tmp_path_factory.mktemp("ddp")
    out = run([*TORCHRUN, "--nproc_per_node=2", EXAMPLES / "train_ddp.py", "--data", root / "data",
               "--checkpoint-dir", root / "ckpt", *DDP_COMMON, "--stop-after-steps", 9])
    return out, sorted(p.name for p in (root / "ckpt").iterdir()), root


def test_ddp_example_runs_under_torchrun_with_two_gloo_ranks(ddp_first_run):
    out, names, _ = ddp_first_run
    assert "2 ranks, backend gloo" in out and re.search(r"epoch 0: .* samples/s .* data stall", out), out
    assert names == ["checkpoint.pt"]


def test_ddp_example_checkpoints_mid_epoch_and_resumes_on_another_number_of_ranks(tmp_path, ddp_first_run):
    out, _, first_root = ddp_first_run
    shutil.copytree(first_root / "ckpt", tmp_path / "ckpt")
    common = ["--data", first_root / "data", "--checkpoint-dir", tmp_path / "ckpt", *DDP_COMMON]
    assert "stopped after step 9 (last checkpoint: step 8)" in out, out
    first = int(re.search(r"epoch 0: .*\[(\d+) samples\]", out).group(1))
    assert first == 9 * 2 * 50
    # The same 2 ranks resume exactly: 20 batches an epoch per rank, 8 done, 12 left.
    exact = tmp_path / "exact"
    shutil.copytree(tmp_path / "ckpt", exact)
    # It runs on into epoch 1, checkpointing every 6 steps: at steps 12 and 18 and at the
    # end of epoch 0 (step 20, no multiple of 6), which must count too (it said step 18).
    out = run([*TORCHRUN, "--nproc_per_node=2", EXAMPLES / "train_ddp.py",
               *[exact if a == tmp_path / "ckpt" else a for a in common], "--resume",
               "--checkpoint-every", 6, "--stop-after-steps", 21])
    assert "resumed from step 8: epoch 0, batch 8 of a 2-rank run (batch size 50); exact" in out, out
    assert "12 batches left in epoch 0 per rank" in out, out
    assert "stopped after step 21 (last checkpoint: step 20)" in out, out
    # 3 ranks resume epoch 0 after step 8: 2000 - 2 * 8 * 50 = 1200 samples left, 400 per rank.
    out = run([*TORCHRUN, "--nproc_per_node=3", EXAMPLES / "train_ddp.py", *common, "--resume"])
    assert "resumed from step 8: epoch 0, batch 8 of a 2-rank run (batch size 50); elastic" in out, out
    assert "8 batches left in epoch 0 per rank" in out, out
    assert int(re.search(r"epoch 0: .*\[(\d+) samples\]", out).group(1)) == 1200
    assert re.search(r"epoch 1: .*\[(\d+) samples\]", out), out  # then an ordinary 3-rank epoch
    # The run is finished: resuming again says so instead of silently doing nothing.
    env = subprocess_env(tmp_path)
    proc = subprocess.run([sys.executable, *map(str, [*TORCHRUN, "--nproc_per_node=1",
                                                       EXAMPLES / "train_ddp.py", *common, "--resume"])],
                          capture_output=True, text=True, timeout=240, env=env, cwd=str(REPO_ROOT))
    assert proc.returncode != 0 and "nothing to do" in proc.stdout + proc.stderr


def test_image_classifier_example_trains_a_resnet18(tmp_path):
    pytest.importorskip("PIL")
    out = run([EXAMPLES / "train_image_classifier.py", "--data", tmp_path, "--images", 48, "--epochs", 1,
               "--batch-size", 16, "--device", "cpu"])
    assert re.search(r"epoch 0: .* samples/s  data stall [\d.]+%", out), out


def test_lm_example_trains_on_packed_blocks_and_reports_tokens_per_second_and_stall(tmp_path):
    out = run([EXAMPLES / "train_lm.py", "--data", tmp_path, "--docs", 300, "--seq-len", 64,
               "--batch-size", 4, "--dim", 32, "--layers", 1, "--heads", 2, "--epochs", 2,
               "--device", "cpu"])
    epochs = re.findall(r"epoch (\d): loss ([\d.]+)  ([\d,]+) tokens/s  data stall ([\d.]+)%", out)
    assert [e[0] for e in epochs] == ["0", "1"], out
    assert all(float(e[2].replace(",", "")) > 0 for e in epochs), out
    # Documents of a bigram model: the loss falls below that of guessing (log 256 = 5.5).
    assert float(epochs[1][1]) < 5.0, out
    assert "overall:" in out and "tokens/s" in out


def test_lm_example_attends_within_documents_only():
    """A document packed after another (and before padding) gets the logits it gets alone."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("train_lm", EXAMPLES / "train_lm.py")
    lm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lm)
    torch.manual_seed(0)
    model = lm.CausalLM(vocab=50, dim=16, layers=2, heads=2).eval()
    a, b = torch.randint(2, 50, (5,)), torch.randint(2, 50, (7,))
    block = torch.cat([a, b, torch.zeros(4, dtype=torch.long)])[None]
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 0, 0, 0, 0]])
    document_ids = torch.tensor([[0] * 5 + [1] * 7 + [-1] * 4])
    with torch.no_grad():
        packed = model(block, position_ids, document_ids)
        alone = model(b[None], torch.arange(7)[None], torch.zeros(1, 7, dtype=torch.long))
        first = model(a[None], torch.arange(5)[None], torch.zeros(1, 5, dtype=torch.long))
    torch.testing.assert_close(packed[0, 5:12], alone[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(packed[0, :5], first[0], rtol=1e-4, atol=1e-5)
    assert torch.isfinite(packed).all()  # padding rows are not empty (no NaN)
