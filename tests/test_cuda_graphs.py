"""train.cuda_graphs (transformer/runtime/cuda_graphs.py) on the CPU: everything but the capture itself.

A CUDA graph records its step once and replays it on the tensors it recorded with. `CallingRecorder`
stands in for the capture as a graph behaves: recording runs nothing, and each replay runs the step on
the recorded inputs and writes the recorded outputs. So these tests fail if a batch is not copied into
its graph's inputs, if a warm-up's gradients stay in the parameters', or if a shape gets a second graph;
the Trainer's test checks that the gradients stay where the graphs were recorded.
tests/test_cuda.py records real graphs on a GPU.
"""

import re

import pytest
import torch
from conftest import BOS, EOS, PAD, VOCAB, make_model, metric_records, run_config, training_step

from transformer.checkpoint import load_checkpoint
from transformer.config import ConfigError
from transformer.data.batch import make_batch
from transformer.fast.loss import label_smoothed_cross_entropy
from transformer.runtime.cuda_graphs import CudaGraphRecorder, GraphedSteps
from transformer.training import train
from transformer.training.settings import check_cuda_graphs


class CallingRecorder:
    """A capture stand-in: records nothing, and replays by running the step into the recorded outputs."""

    def __init__(self) -> None:
        self.warm_ups = self.records = 0

    def warm_up(self, function):
        self.warm_ups += 1
        function()

    def record(self, function):
        self.records += 1
        outputs = (torch.zeros(()), torch.zeros(()))

        def replay() -> None:
            for output, value in zip(outputs, function()):
                output.copy_(value)

        return replay, outputs


def batches() -> list:
    """Four batches in two shapes, random ids, some rows shorter than others (padding)."""
    generator = torch.Generator().manual_seed(0)

    def words(length: int) -> list[int]:
        return torch.randint(4, VOCAB, (length,), generator=generator).tolist()

    lengths = [[5, 7, 3], [6, 2, 7], [4, 4, 4, 5, 2], [3, 7, 6, 1, 5]]  # shapes (3, 8) twice, then (5, 8) twice
    return [make_batch([words(n) for n in rows], [words(8 - n) for n in rows], range(len(rows)), PAD, BOS, EOS,
                       pad_to_multiple=8) for rows in lengths]


def test_graphed_steps_give_the_eager_losses_and_gradients():
    eager_model, graphed_model = make_model(seed=1).train(), make_model(seed=1).train()

    for parameter in graphed_model.parameters():  # a graph adds to gradients at fixed addresses
        parameter.grad = torch.zeros_like(parameter)
    recorder = CallingRecorder()
    graphed = GraphedSteps(training_step(graphed_model), lambda: [p.grad for p in graphed_model.parameters()], recorder)
    eager = training_step(eager_model)
    for batch in batches():  # no dropout: each replay computes what the eager step does
        factor = 1.0 / batch.n_tgt_tokens
        expected = [value.clone() for value in eager(batch.src, batch.tgt_in, batch.tgt_out, factor)]
        got = [value.clone() for value in graphed(batch.src, batch.tgt_in, batch.tgt_out, factor)]
        torch.testing.assert_close(got, expected)
    assert (recorder.records, recorder.warm_ups, len(graphed.graphs)) == (2, 2, 2)  # one graph a shape
    for ours, theirs in zip(graphed_model.parameters(), eager_model.parameters()):  # four batches' sum, once
        torch.testing.assert_close(ours.grad, theirs.grad)


def test_shapes_beyond_the_limit_run_eagerly_into_the_same_gradients(caplog):
    model = make_model(seed=1).train()
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    recorder = CallingRecorder()
    graphed = GraphedSteps(training_step(model), lambda: [p.grad for p in model.parameters()], recorder, max_graphs=1)
    first, _, second, _ = batches()
    losses = [graphed(b.src, b.tgt_in, b.tgt_out, 0.5)[0].clone() for b in (first, second, first, second)]
    assert recorder.records == 1 and len(graphed.graphs) == 1 and len(graphed.eager_shapes) == 1
    assert [r.message for r in caplog.records].count(  # said once, not at every eager batch
        "1 batch shapes have CUDA graphs; new shapes run without (data.pad_to_multiple=8 makes fewer)") == 1
    assert losses[0] == losses[2] and losses[1] == losses[3]  # no dropout: the same batch, the same loss
    eager_model = make_model(seed=1).train()
    for batch in (first, second, first, second):
        loss, _ = label_smoothed_cross_entropy(eager_model(batch.src, batch.tgt_in), batch.tgt_out, 0.1, PAD)
        (loss * 0.5).backward()
    for ours, theirs in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)


def test_a_graph_is_not_recorded_before_every_gradient_has_its_buffer():
    """A gradient still None would be allocated inside the capture, in the graphs' pool: refused."""
    model = make_model(seed=1).train()
    graphed = GraphedSteps(lambda *batch: None, lambda: [p.grad for p in model.parameters()], CallingRecorder())
    batch = batches()[0]
    with pytest.raises(RuntimeError, match="need every parameter's gradient allocated before recording"):
        graphed(batch.src, batch.tgt_in, batch.tgt_out, 1.0)


def test_a_run_with_cuda_graphs_trains_as_an_eager_run(copy_corpus, tmp_path, monkeypatch):
    """The Trainer's side on the CPU, the capture stood in for: gradients in zeroed buffers of their own, at the
    addresses the graphs were recorded with (a graph adds to those: new buffers would stay zero), accumulation
    over two batches, batches filled with empty rows (data.pad_rows); the run ends where the eager run of the
    same batches does."""
    from transformer.training import loop, trainer

    recorders, addresses = [], []

    def recorder(device):
        recorders.append(CallingRecorder())
        return recorders[-1]

    class StepsAtFixedGradients(GraphedSteps):
        def __call__(self, *args):
            addresses.append([gradient.data_ptr() for gradient in self.gradients()])
            assert addresses[-1] == addresses[0], "a gradient moved: the graphs would add to the old buffer"
            return super().__call__(*args)

    monkeypatch.setattr(trainer, "CudaGraphRecorder", recorder)
    monkeypatch.setattr(trainer, "GraphedSteps", StepsAtFixedGradients)
    monkeypatch.setattr(loop, "check_cuda_graphs", lambda cfg, device, distributed: None)
    settings = dict(max_steps=4, save_every=2, log_every=1, precision="fp32", accumulate=2,
                    **{"data.pad_rows": "true", "data.pad_to_multiple": 8})
    train(run_config(copy_corpus, tmp_path / "eager", **settings))
    assert not recorders
    train(run_config(copy_corpus, tmp_path / "graphs", cuda_graphs=True, **settings))
    assert len(recorders) == 1 and recorders[0].records >= 1 and len(addresses) == 8  # 4 updates of 2 batches
    eager, graphs = (metric_records(tmp_path / name, "train") for name in ("eager", "graphs"))
    assert [r["loss"] for r in graphs] == pytest.approx([r["loss"] for r in eager], rel=1e-6)
    graphed_weights = load_checkpoint(tmp_path / "graphs" / "checkpoint_last.pt")["model"]
    for name, tensor in load_checkpoint(tmp_path / "eager" / "checkpoint_last.pt")["model"].items():
        torch.testing.assert_close(graphed_weights[name], tensor)


@pytest.mark.parametrize("device, distributed, overrides, message", [
    ("cpu", False, {}, "train.cuda_graphs=true needs a GPU (the device is cpu)"),
    ("cuda", True, {}, "train.cuda_graphs=true needs one process (not torchrun's ranks); train.cuda_graphs=false "
                       "trains without CUDA graphs (the GPU configs turn them on)"),
    ("cuda", False, {"data.pad_rows": "false"}, "train.cuda_graphs=true needs data.pad_rows=true"),
    ("cuda", False, {"model.max_positions": 100},  # the copy task's max_length 64: outputs of up to 1.5 * 65 + 10
     "train.cuda_graphs=true needs model.max_positions >= 109, the longest training or validation sequence"),
])
def test_cuda_graphs_refuse_what_they_cannot_record(copy_corpus, tmp_path, device, distributed, overrides, message):
    cfg = run_config(copy_corpus, tmp_path, cuda_graphs=True, **{"data.pad_rows": "true", **overrides})
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_cuda_graphs(cfg, torch.device(device), distributed)


def test_cuda_graphs_accept_one_gpu_process_with_filled_batches_and_a_long_enough_table(copy_corpus, tmp_path):
    cfg = run_config(copy_corpus, tmp_path, cuda_graphs=True, **{"data.pad_rows": "true", "model.max_positions": 109})
    assert check_cuda_graphs(cfg, torch.device("cuda"), distributed=False) is None  # no GPU needed to check


def test_the_command_refuses_cuda_graphs_on_the_cpu_before_any_work(copy_corpus, tmp_path):
    with pytest.raises(ConfigError, match="needs a GPU"):
        train(run_config(copy_corpus, tmp_path / "run", cuda_graphs=True, **{"data.pad_rows": "true"}))
    assert not (tmp_path / "run").exists()


def test_the_recorder_takes_cuda_without_an_index_as_the_current_gpu(monkeypatch):
    """`torch.cuda.set_device` refuses a device without an index (an H200, torch 2.11: "Expected a torch.device
    with a specified index"), and ``torch.device("cuda")`` is how a user names the GPU: the recorder names the
    current one. torch.cuda's calls are stood in for, as set_device checks its argument."""
    set_to = []

    def set_device(device: torch.device) -> None:
        if device.index is None:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        set_to.append(device)

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: ("stream", device))
    recorder = CudaGraphRecorder(torch.device("cuda"))
    assert recorder.device == torch.device("cuda", 0) and set_to == [torch.device("cuda", 0)]
    assert recorder.side == ("stream", torch.device("cuda", 0))
